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
#include "measure_report/attention_error_report.h"
#include "model/decoder.h"
#include "text/tokenizer.h"

namespace kvq {

using ProgressFn = std::function<void(const std::string&)>;

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
