// The decoder-only transformer's forward pass, for every architecture kvq runs (gguf/architectures.h):
// llama2.c run.c's transformer, top to bottom, with what the others add behind DecoderConfig's
// fields. The KV path goes through a kvq KvCache: each layer appends its K and V rows and attends
// over the cache's pages.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "base/thread_pool.h"
#include "kvq/kv_cache.h"
#include "kvq/status.h"
#include "model/decoder_weights.h"
#include "model/delta_net.h"
#include "model/moe.h"
#include "weights/ops.h"

namespace kvq {

/// Observation points for measurements (kvq eval), called for every token of every forward
/// block (a decode step is a block of one; in a batch, every segment's tokens in segment order),
/// at the attention layers only (a hybrid's recurrent layers have no q/k/v rows). `layer` is the
/// model's layer index. Either may be empty.
struct ForwardHooks {
  /// After RoPE, before the cache: q [n_heads·head_dim], k and v [kv_dim] of the token at `pos`.
  std::function<void(int32_t layer, int64_t pos, const float* q, const float* k, const float* v)> on_qkv;
  /// After attention, before a gated model's σ(gate) and the output projection: out
  /// [n_heads·head_dim] as the cache's FinishAttention gave it, which the hook may overwrite (to
  /// see what replacing one layer's attention does to the logits).
  std::function<void(int32_t layer, int64_t pos, float* attention_out)> on_attention_out;
};

/// Seconds the forward pass spends in each phase, added to by every call while set (kvq bench
/// prefill). The phases tile the call: each clock read ends one phase and starts the next, so the
/// three sum to the call's time less a few clock reads.
struct ForwardProfile {
  double weights_s = 0;    ///< MatMul and MatVec: the layer matrices and the classifier
  double attention_s = 0;  ///< cache.Append, cache.Attend and FinishAttention; a hybrid's recurrent
                           ///< layers whole (their projections included)
  double rest_s = 0;       ///< the embedding, norms, biases, RoPE, SwiGLU, residual adds, hooks
};

/// One sequence's block in a batched forward pass: `n` tokens at positions pos .. pos + n − 1 of
/// its own cache (pos = the cache's current length), and where its logits go.
struct ForwardSegment {
  const int32_t* tokens = nullptr;  ///< [n] ids in [0, vocab_size)
  int32_t n = 0;                    ///< ≥ 1
  int64_t pos = 0;                  ///< position of tokens[0]: the cache's length
  KvCache& cache;                   ///< the segment's own: no two segments of a batch share one
  float* logits = nullptr;          ///< [vocab_size] after the last token; null: not computed
  /// Rows whose logits are wanted too (a speculative verifier's drafts): [n_logit_rows] indices
  /// into tokens, in [0, n), increasing; null when none. The classifier runs over these rows and
  /// every segment's last row together; each row's logits are those a block of its own gives.
  const int32_t* logit_rows = nullptr;
  int32_t n_logit_rows = 0;
  float* row_logits = nullptr;  ///< [n_logit_rows][vocab_size], in logit_rows' order
};

/// The forward pass: one body, ForwardBatch, over segments; a block is a batch of one segment and
/// a decode step a block of one token. Hybrid models (DecoderConfig::layer_kinds) run their
/// recurrent layers through DeltaNetBlock on the state each segment's cache carries
/// (KvCacheConfig::state_floats = DecoderConfig::state_floats(), n_layers = n_attention_layers()),
/// token by token, so a block gives the bits of decoding its tokens one at a time.
class DecoderModel {
 public:
  DecoderModel(DecoderWeights weights, int32_t threads);
  const DecoderConfig& config() const { return w_.config; }
  const DecoderWeights& weights() const { return w_; }

  /// Runs `n` tokens at positions pos .. pos + n − 1 (pos = the cache's current length) as one
  /// block through every layer — weights read once per block, K and V appended as a block, causal
  /// attention for the whole block — and writes the logits [vocab_size] after the last token.
  /// The bits (logits, cache) do not depend on how a sequence is cut into blocks, for every
  /// format and transform: each query reads the cache as it was when its own row was appended
  /// (KvCache::Attend), and every row of a matrix product is computed alone.
  Status ForwardBlock(const int32_t* tokens, int32_t n, int64_t pos, KvCache& cache, float* logits);

  /// Runs several sequences' blocks as one pass: per layer the norms, projections and feed-forward
  /// over the rows of every segment together (each weight matrix read once for the whole batch),
  /// then per segment its own Append, Attend and FinishAttention (its cache, its positions); the
  /// logits of each segment that asks for them. Each segment gets exactly the bits (logits, cache)
  /// that ForwardBlock of it alone gives: every row of a matrix product, norm and SwiGLU is
  /// computed by the same operations whatever the other rows (weights/matvec.h: MatMul is MatVec
  /// per token, bit for bit). Errors, before anything runs: no segments, a segment without
  /// tokens, an id outside the vocabulary, two segments on one cache, a "prerope" cache without
  /// this model's RoPE. A cache error while running leaves the caches holding parts of the batch.
  Status ForwardBatch(std::span<const ForwardSegment> segments);

  /// One decode step: ForwardBlock of the single token `token` at `pos`.
  Status Forward(int32_t token, int64_t pos, KvCache& cache, float* logits) {
    return ForwardBlock(&token, 1, pos, cache, logits);
  }

  /// Threads of the matrix products, attention and recurrent layers from the next call on
  /// (1..1024, checked by the caller). No count changes a bit: work is split across rows, (query
  /// block, KV head) pairs and value heads, never inside a sum.
  void set_threads(int32_t threads) { threads_ = threads; }
  int32_t threads() const { return threads_; }

  /// The model's own pool of threads() threads, made on first use (and remade after set_threads
  /// changes the count): every product, attention and recurrent layer of a pass runs on it, so
  /// passes of separate DecoderModels (separate sessions) share no workers and no lock.
  ThreadPool& pool() const;

  /// Hooks the forward pass calls from now on (nullptr: none). Not owned; must outlive their use.
  void set_hooks(const ForwardHooks* hooks) { hooks_ = hooks; }
  /// The profile the forward pass adds its phase times to from now on (nullptr: none, and no clock
  /// is read). Not owned.
  void set_profile(ForwardProfile* profile) { profile_ = profile; }

  /// Bytes of routed expert weights the forward pass has read since the model was made (MoE
  /// models; 0 otherwise): each layer's chosen experts, each once per call (MoeRows).
  int64_t expert_bytes_read() const { return expert_bytes_read_; }

  /// Attention options the model uses (scale 1/sqrt(head_dim), the SIMD kernel, its threads).
  AttentionOptions attention_options() const;

 private:
  // Grows the activations to hold n_rows tokens of n_segments segments, n_classified of whose
  // rows go through the classifier (kept between calls: a decode step allocates nothing).
  void Reserve(int64_t n_rows, size_t n_segments, int64_t n_classified);
  // A recurrent layer over the batch's normed rows (xb_): its projections, each segment's tokens
  // through DeltaNetBlock on its cache's state slot `slot`, then ssm_out into xb2_ [n][dim].
  void RecurrentMixer(const LayerWeights& L, int32_t slot, std::span<const ForwardSegment> segments,
                      int64_t n);
  // Points states_of_[i] at a pooled attention state sized for segment i, reusing states of the
  // right size (a steady batch shape builds none).
  void AssignStates(std::span<const ForwardSegment> segments);

  DecoderWeights w_;
  int32_t threads_;
  mutable std::unique_ptr<ThreadPool> pool_;  // of threads_ threads once used; null before
  const ForwardHooks* hooks_ = nullptr;
  ForwardProfile* profile_ = nullptr;
  int64_t expert_bytes_read_ = 0;
  int64_t row_capacity_ = 0;
  // Activations of the batch's rows, token-major, segment after segment (n = all segments' tokens).
  std::vector<float> x_, xb_, xb2_;  // [n][dim] residual stream, normed input, projection output
  std::vector<float> q_;             // [n][n_heads·head_dim]
  std::vector<float> k_, v_;         // [n][kv_dim]
  std::vector<float> k_pre_rope_;    // [n][kv_dim]: k before RoPE, for "prerope" key specs
  std::vector<float> hb_, hb2_;      // [n][hidden_dim] gate and up projections
  std::vector<float> qg_;            // [n][2·n_heads·head_dim] gated attention: per head q, gate
  std::vector<float> gate_;          // [n][n_heads·head_dim] the gates, de-interleaved
  // Recurrent layers (Hv value heads, C conv channels, Cv = Hv·dv):
  std::vector<float> ssm_qkv_;  // [n][C] raw q, k, v channels
  std::vector<float> ssm_z_;    // [n][Cv] output gate
  std::vector<float> ssm_ba_;   // [n][2·Hv] qwen3next's fused b, a (grouped per key head)
  std::vector<float> ssm_beta_, ssm_alpha_;  // [n][Hv]
  std::vector<float> ssm_out_;               // [n][Cv] gated-normed value heads, ssm_out's input
  DeltaNetScratch delta_scratch_;
  MoeScratch moe_scratch_;
  // The rows the classifier runs on: per segment its logit_rows, then its last row if it has
  // `logits`.
  std::vector<float> last_;          // [classified rows][dim] final-normed
  std::vector<float> logits_;        // [classified rows][vocab_size] the classifier's output
  // Attention states (m, l, acc and their scratch), kept between calls so that a decode step
  // reuses them rather than building one per token; states_of_[i] is segment i's this call.
  std::vector<std::unique_ptr<AttentionState>> states_;
  std::vector<AttentionState*> states_of_;  // [segments]
  std::vector<uint8_t> state_taken_;        // [states_.size()] scratch of AssignStates
};

/// The model's rotary parameters (pairing, scaling; `config` must outlive them: they point at
/// its frequency factors).
RopeParams ModelRopeParams(const DecoderConfig& config);
/// The same parameters, owned: what KvCacheConfig::key_rope needs for "prerope" key specs.
RopeConfig ModelRopeConfig(const DecoderConfig& config);

}  // namespace kvq
