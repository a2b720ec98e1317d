// What an attention-error measurement (measure/attention_error.h, `kvq eval attention`) is given and
// reports, over include/ alone, so measure/ and its clients (the CLI, through
// attention_eval/attention_eval.h) share one definition.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kvq/kv_spec.h"

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

/// The token ids model rows run on: `text` encoded (BOS first when the vocabulary asks for one),
/// cut to `n`; when it gives fewer than n ids, the text's ids (without BOS) follow again until
/// there are n, and `repeats` says how many copies of the text were used.
struct AttentionTextInput {
  std::vector<int32_t> tokens;  ///< n ids, or fewer when the text encodes to nothing
  int64_t text_tokens = 0;      ///< ids of one encoding of the text, BOS included
  int64_t repeats = 1;
};
}  // namespace kvq
