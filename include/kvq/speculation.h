// kvq's public C++ API: speculative decoding — draft tokens cheaply, run them through the model in
// one pass, keep those the model itself would have produced.
//
// Decode reads every weight and the whole KV cache to make one token. A pass over the current
// token and k drafted ones reads them once for up to k + 1 tokens. kvq's verification changes no
// output: each position's token is still drawn by the request's sampler from that position's
// logits, in order, with the same random draws — the draft only decides how many positions one
// pass computes. A drafted token is kept while it equals the token drawn at its position; the first
// that differs is dropped (the cache goes back to the positions before it, exactly, for every KV
// format: KvCache::Truncate) and the drawn token is the next one run. So greedy output is the
// output without speculation, token for token, and sampled output too for the same seed.
//
// Drafts come from the sequence itself (prompt lookup): the longest recent n-gram that ends the
// sequence is found earlier in it, and the tokens that followed it then are the draft. A gate
// chooses the draft length each step from what it has measured — the share of drafted tokens kept
// and the time of a pass per number of tokens in it — and drafts nothing when a longer pass would
// not pay (at long context a pass also reads the whole cache, so a rejected draft costs time).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvq/status.h"

namespace kvq {

enum class DraftSource {
  kNone,   ///< no speculation
  kNgram,  ///< prompt lookup: what followed the sequence's last n-gram the last time it occurred
};

/// "none" or "ngram".
const char* DraftSourceName(DraftSource source);
/// Parses "none" or "ngram"; the error names the value and the choices.
Result<DraftSource> ParseDraftSource(const std::string& name);

struct SpeculationOptions {
  DraftSource source = DraftSource::kNone;
  int32_t max_draft = 8;  ///< drafted tokens per pass at most, 1..64
  int32_t min_ngram = 1;  ///< shortest n-gram matched, 1..max_ngram
  int32_t max_ngram = 4;  ///< longest n-gram matched (longer matches are tried first), ≤ 16
  /// Draft whenever a draft exists, max_draft tokens (no gate): for measuring what the gate saves.
  bool ungated = false;
};

/// Checks options; errors name the field.
Status CheckSpeculation(const SpeculationOptions& options);

/// What speculation did in one completion.
struct SpeculationStats {
  int64_t passes = 0;    ///< forward passes during decode (with or without a draft)
  int64_t drafted = 0;   ///< drafted tokens run
  int64_t accepted = 0;  ///< of those, kept
  int64_t gated = 0;     ///< passes where a draft existed but the gate ran without it
};

/// Prompt lookup: up to `max_tokens` ids that followed, at its latest earlier occurrence, the
/// longest n-gram (min_ngram ≤ n ≤ max_ngram) that ends `sequence`; empty when none occurs.
std::vector<int32_t> DraftByLookup(std::span<const int32_t> sequence, int32_t max_tokens,
                                   const SpeculationOptions& options);

/// The gate: chooses how many of the drafted tokens to run in the next pass from the share of
/// drafted tokens kept so far and the measured seconds of a pass per token count. Before a count
/// has been timed, its time is estimated from the counts that have (linearly in the token count,
/// from the 1-token pass), so it tries longer passes until their cost is known.
class SpeculationGate {
 public:
  explicit SpeculationGate(int32_t max_draft);
  /// Tokens of a draft of `available` tokens worth running in the next pass (0: none).
  int32_t Choose(int32_t available) const;
  /// Records a pass of 1 + drafted tokens that took `seconds` and kept `accepted` drafted tokens.
  /// A pass run without a draft that existed (`gated`) moves the acceptance a little back toward
  /// its prior, so a gate that stopped drafting tries again later.
  void Record(int32_t drafted, int32_t accepted, double seconds, bool gated);
  double acceptance() const { return acceptance_; }  ///< kept / drafted, smoothed

 private:
  double PassSeconds(int32_t tokens) const;  // measured or estimated
  int32_t max_draft_;
  double acceptance_ = 0.5;             // prior until drafts are seen
  std::vector<double> seconds_;         // [max_draft + 1]: smoothed seconds of a pass of i + 1 tokens; 0 unknown
};

}  // namespace kvq
