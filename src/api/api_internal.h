// What the public Model and Session (include/kvq/model.h, session.h) hold: the model layer's
// weights and tokenizer, and per session a forward pass, a cache and the sequence it holds.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "generate/sampler.h"
#include "grammar/grammar_matcher.h"
#include "jinja/chat_template.h"
#include "kvq/model.h"
#include "kvq/session.h"
#include "model/cache_config.h"
#include "model/decoder.h"
#include "text/tokenizer.h"

namespace kvq {

/// The cache choice `kv` names for model `c`: its formats parsed by name (an error names the
/// KvOptions field), its budgets and page size; a one-entry `layers` is refused unless the model
/// has one layer that attends. ModelFile::CacheConfig and CacheConfigFor both start here.
Result<CacheChoice> CacheChoiceFor(const DecoderConfig& c, const KvOptions& kv);

/// The cache a session of a model with config `c` and context `model_context` (ModelInfo::context)
/// gets from `kv` (whose context, when set, is at most model_context): the formats parsed by name,
/// then ModelCacheConfig (model/cache_config.h), which owns the rest; checked but not allocated.
Result<KvCacheConfig> CacheConfigFor(const DecoderConfig& c, int64_t model_context, const KvOptions& kv);

struct Model::Impl {
  ModelInfo info;
  ModelOptions options;
  DecoderWeights weights;
  Tokenizer tokenizer;
  /// Loaded from a GGUF file's header alone (LoadHeaderOnly): no matrix or vector has bytes, so
  /// NewSession refuses; the shape, vocabulary and chat template are the file's.
  bool header_only = false;
  /// Model::Load; header_only_file_bytes > 0: `path` holds only the first bytes (at least the
  /// header) of a GGUF file of that many bytes (LoadModel's header-only load): for a runtime that
  /// reads the weights from the file itself (the page's GPU path, src/web/web_load.cc).
  static Result<std::unique_ptr<Model>> Load(const std::string& path, const ModelOptions& options,
                                             int64_t header_only_file_bytes);
  /// The snapshot fingerprint, hashed on first use (SavePrefix/LoadPrefix), once per model.
  const ModelFingerprint& fingerprint() const;
  /// The vocabulary as grammars see it (every token's text as it follows a token other than BOS;
  /// end tokens aside), built on first use (a Generator with a grammar), once per model.
  const TokenTrie& token_trie() const;
  /// [end tokens] ids IsEndOfGeneration says end a completion, ascending; built with token_trie().
  const std::vector<int32_t>& end_tokens() const;
  /// The control token (text "": Tokenizer::Decode) whose piece is `text`, or -1; for
  /// GeneratorOptions::preserved_tokens. Indexed on first use, once per model.
  int32_t ControlToken(std::string_view text) const;
  /// The template ApplyChatTemplate renders with (info.chat_template, or ChatML), parsed on first
  /// use, and which one it is (api/chat.cc).
  const ChatTemplate& chat_template() const;
  const ChatTemplateChoice& chat_template_choice() const;

  /// A forward pass of its own (activations, thread pool, segment list) for Session::RunBatch.
  struct BatchPass {
    DecoderModel llama;
    std::vector<ForwardSegment> segments;  // [items] of the pass running now
  };
  /// The pass lent for one RunBatch call, handed back when it goes out of scope.
  class LentPass {
   public:
    LentPass(const Impl& owner, std::unique_ptr<BatchPass> pass) : owner_(owner), pass_(std::move(pass)) {}
    ~LentPass() {
      if (pass_ != nullptr) owner_.ReturnBatchPass(std::move(pass_));
    }
    LentPass(LentPass&& other) noexcept : owner_(other.owner_), pass_(std::move(other.pass_)) {}
    LentPass(const LentPass&) = delete;
    LentPass& operator=(const LentPass&) = delete;
    BatchPass& operator*() const { return *pass_; }
    BatchPass* operator->() const { return pass_.get(); }

   private:
    const Impl& owner_;
    std::unique_ptr<BatchPass> pass_;
  };
  /// A batch pass set to `threads` threads: a kept one when one is free, else a new one. RunBatch
  /// runs on these rather than on its first item's session, so a server that steps its sessions
  /// through RunBatch holds one set of batch activations and one pool of workers per concurrent
  /// call, whichever session comes first — not one per session that was ever first.
  LentPass LendBatchPass(int32_t threads) const;
  /// Batch passes made so far (lent or kept), for tests.
  size_t batch_passes_made() const;

 private:
  void ReturnBatchPass(std::unique_ptr<BatchPass> pass) const;
  mutable std::mutex batch_passes_mutex_;
  mutable std::vector<std::unique_ptr<BatchPass>> free_batch_passes_;  // kept for the next call
  mutable size_t batch_passes_made_ = 0;

  void BuildGrammarVocabulary() const;
  void ChooseChatTemplate() const;
  mutable std::once_flag chat_once_;
  mutable std::optional<ChatTemplate> chat_template_;
  mutable ChatTemplateChoice chat_choice_;
  mutable std::once_flag fingerprint_once_;
  mutable ModelFingerprint fingerprint_;
  mutable std::once_flag grammar_once_;
  mutable std::unique_ptr<TokenTrie> token_trie_;
  mutable std::vector<int32_t> end_tokens_;
  mutable std::once_flag control_once_;
  mutable std::unordered_map<std::string, int32_t> control_tokens_;  // piece -> id; first id wins
};

/// Model::TokenText and Model::IsEndOfGeneration, for the API's own users (Generator) that hold a
/// Model::Impl: one definition of each fact.
std::string TokenText(const Model::Impl& model, int32_t previous, int32_t token);
bool IsEndOfGeneration(const Model::Impl& model, int32_t id);

struct Session::Impl {
  Impl(std::shared_ptr<const Model::Impl> m, KvCacheConfig config, std::unique_ptr<KvCache> c);

  std::shared_ptr<const Model::Impl> model;
  DecoderModel llama;                // Prefill's: its own copy of the weight views and activations
  KvCacheConfig cache_config;        // to make an empty cache again (Clear, Truncate)
  std::unique_ptr<KvCache> cache;
  std::vector<int32_t> tokens;       // [positions] the ids the cache holds
  std::vector<float> logits;         // [vocab_size] after tokens.back(); empty when unknown
  std::vector<float> chosen_logits;  // [logits_at.size()][vocab_size] of the last run's BatchItem
  std::vector<int32_t> block_rows;   // [≤ kPrefillBlock] scratch: logits_at within one block
  // SaveCheckpoint's: [state_floats] the recurrent state after the first checkpoint_at ids
  // (-1: none). Valid while those ids are held: whatever drops one of them drops it too.
  std::vector<float> checkpoint;
  int64_t checkpoint_at = -1;
  int64_t positions_run = 0;  // positions run through the model since the session was made
  SamplerOptions sampler_options;
  Sampler sampler;
  std::function<bool()> should_abort;  // Session::SetAbortCallback's; empty: never
  bool aborted = false;                // the last Prefill/RunBatch stopped for should_abort
  // Set by Generate while its prompt runs: called with positions() after each block.
  std::function<void(int64_t positions)> after_block;
  // [items] the segments of a Prefill run on `llama`, kept so that a decode step allocates nothing.
  std::vector<ForwardSegment> segments;
  // DraftSource::kModel: the draft model's session, kept between Generate calls while the draft
  // model and its KV formats stay the same (PrepareDraftSession); null until first needed.
  std::unique_ptr<Session> draft;
  const Model::Impl* draft_model = nullptr;  // the model of `draft`
  std::string draft_kv_key, draft_kv_value;  // the formats `draft` was made with
  int64_t draft_kv_context = 0;
  // What the last completion's speculation gate learnt, for the next one with the same key
  // (SpeculationGateKey): a chat's turns time a plain pass and probe drafts once, not every turn.
  std::optional<SpeculationGate> gate;
  std::string gate_key;
};

/// Makes s.draft for `spec`'s draft model unless the one it holds fits: checks the vocabulary
/// (CheckDraftVocabulary) and creates the session with spec.draft_kv.
Status PrepareDraftSession(const SpeculationOptions& spec, Session::Impl& s);
/// CheckDraftVocabulary (kvq/speculation.h) for the loaded state a session holds.
Status CheckDraftVocabulary(const Model::Impl& target, const Model::Impl& draft);

/// Brings the draft session in step with `sequence`: its longest prefix of it kept
/// (Session::Truncate) and the rest run, at least the last token, for the logits after it.
/// Nothing when `sequence` does not fit the draft's context.
Status SyncDraft(Session& draft, std::span<const int32_t> sequence);

}  // namespace kvq
