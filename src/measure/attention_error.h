// `kvq eval attention` (seed 000's measurement one, docs/design.md §5): one query's attention output
// over a cache of n positions, computed over the reference f32 rows and over a KV format's round
// trip, for several n. Same query, same cache: the query sits at position n − 1, so causal
// attention covers all n positions. Seed 000's first table was fake because its query sat at
// position 0 and attended to one position whatever the cache held (identical digits at every n);
// this harness counts the positions each query attended and refuses a table whose numbers do not
// change with n (CheckFixture).
//
// The candidate goes through kvq's own KvCache of a KV spec (a format and its transforms: rot,
// sinkN, resN), filled as kvq fills it when it decodes the token at n − 1 after a prefill: rows
// 0..n−2 appended as one block (fp8 calibrates on them, KIVI groups complete, the incomplete group
// stays f32), then row n − 1 appended alone; the output is finished through the cache (which
// undoes V's rotation).
//
// A spec whose K and V elements are f32 loses nothing but rounding: without rotation it must
// match the reference bit for bit (sinks and the residual only change where f32 rows are read);
// with rotation (orthonormal, computed in f32) its error must stay within a first-order rounding
// bound derived from the rows (RoundingBound in attention_error.cc). CheckFixture refuses a table
// where either fails.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvq/format.h"
#include "kvq/kv_spec.h"
#include "kvq/status.h"
#include "model/decoder.h"
#include "text/tokenizer.h"

namespace kvq {

struct AttentionErrorConfig {
  /// Candidates, each for K and V; f32 must give error 0, f32 with transforms at most its
  /// rounding bound (0 without rotation).
  std::vector<KvSpec> formats;
  std::vector<int64_t> contexts;           ///< strictly ascending, each ≥ 1
  /// Only this layer (model rows: the model's layer index, which must be one that attends; a
  /// hybrid's recurrent layers have no KV); −1: every layer with KV (averaged, worst named).
  int32_t layer = -1;
  int32_t head = -1;                       ///< only this query head; −1: every query head
  /// Test only: seed 000's fixture bug — the query at position 0 whatever the context. The
  /// harness must refuse what it produces.
  bool inject_query_at_position_zero = false;
};

/// Shape of synthetic rows (Gaussian q, K, V); layers are independent draws.
struct SyntheticShape {
  int32_t n_layers = 1;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
};

/// One (format, context). Errors are |candidate − reference| over the attention output
/// [n_heads][head_dim] (or the chosen head's head_dim numbers) of the query at context − 1.
struct AttentionErrorRow {
  std::string format;  ///< KvSpecName of the spec
  int64_t context = 0;
  double mean_abs_error = 0;   ///< per-layer mean abs error, averaged over the measured layers
  double max_abs_error = 0;    ///< largest abs error in any measured layer
  int32_t worst_layer = 0;     ///< the measured layer with the largest mean abs error (the model's index)
  double worst_layer_mean_abs_error = 0;
  /// Mean |reference| over the same numbers, averaged over layers like mean_abs_error: the size
  /// the errors are read against.
  double reference_mean_abs = 0;
  /// 1 / Σ_p w_p² of the reference softmax weights (f32 scores, computed in double), averaged over
  /// the measured heads and layers: how many positions the query's attention is spread over — n
  /// for uniform weights, 1 for one position. Averaging per-position errors only helps as this grows.
  double effective_positions = 0;
  /// Positions the candidate's query attended (AttentionState::attended; the smallest over the
  /// measured layers). CheckFixture requires it to equal `context`.
  int64_t positions_attended = 0;
  /// Model rows: whether the next token's top-1 changes when the measured layers' attention
  /// output at context − 1 (the chosen head's part with AttentionErrorConfig::head) is replaced by
  /// the candidate's, everything else f32. Empty for synthetic rows.
  std::optional<bool> top1_changed;
  /// Specs whose K and V elements are f32: a bound on max_abs_error from f32 rounding alone —
  /// exactly 0 without rotation; with rotation first order in u = 2⁻²⁴, computed from these rows
  /// (see RoundingBound in attention_error.cc). Empty for lossy formats.
  std::optional<double> rounding_bound;
};

struct AttentionErrorReport {
  std::vector<AttentionErrorRow> rows;  ///< per format in config order, contexts ascending
  /// Per format: the least-squares slope of ln(mean abs error) against ln(context); empty when
  /// fewer than two contexts or an error is 0 (f32).
  std::vector<std::pair<std::string, std::optional<double>>> slopes;
};

using ProgressFn = std::function<void(const std::string&)>;

/// The token ids model rows run on: `text` encoded (BOS first when the vocabulary asks for one),
/// cut to `n`; when it gives fewer than n ids, the text's ids (without BOS) follow again until
/// there are n, and `repeats` says how many copies of the text were used.
struct AttentionTextInput {
  std::vector<int32_t> tokens;  ///< n ids, or fewer when the text encodes to nothing
  int64_t text_tokens = 0;      ///< ids of one encoding of the text, BOS included
  int64_t repeats = 1;
};
AttentionTextInput MakeAttentionTextInput(const Tokenizer& tokenizer, std::string_view text, int64_t n);

/// Model rows. Runs tokens[0 .. largest context − 1] through `model` with an f32 cache, capturing
/// q, k and v after RoPE and the attention output at every attention layer (ForwardHooks; a
/// hybrid's recurrent state is kept at each query position for the reruns), then measures each
/// format at each context on the captured rows; the reference is the model's own attention output.
/// top1_changed reruns position context − 1 on an f32 cache of the captured prefix with the
/// candidate substituted (ForwardHooks::on_attention_out). Requires tokens.size() ≥ the largest
/// context ≤ seq_len. Clears the model's hooks when done. `progress` (may be empty) gets a line per
/// stage.
Result<AttentionErrorReport> MeasureModelAttentionError(DecoderModel& model, std::span<const int32_t> tokens,
                                                        const AttentionErrorConfig& config,
                                                        const ProgressFn& progress);

/// Synthetic rows: q, K, V drawn N(0, 1) from `seed` (K and V of position p and q of a query
/// position do not depend on which contexts are asked for), scale 1/sqrt(head_dim), the reference
/// over an f32 KvCache filled the same way. top1_changed stays empty.
Result<AttentionErrorReport> MeasureSyntheticAttentionError(const SyntheticShape& shape, uint64_t seed,
                                                            const AttentionErrorConfig& config,
                                                            const ProgressFn& progress);

/// The fixture checks, strict: every row attended exactly `context` positions, no row with a
/// rounding bound has a larger max abs error (0 for f32 without rotation: equality), and no
/// format with a non-zero error has the same mean and max abs error at every context (two or more
/// contexts). The error names the format and what was seen.
Status CheckFixture(std::span<const AttentionErrorRow> rows);

/// Least-squares slope of ln(errors) on ln(contexts); empty with fewer than two points or an
/// error ≤ 0.
std::optional<double> LogLogSlope(std::span<const int64_t> contexts, std::span<const double> errors);

}  // namespace kvq
