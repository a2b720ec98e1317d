// Speculative decoding's drafting (see include/kvq/speculation.h): the prompt-lookup and
// suffix-tree drafters, the gate, the Drafter that chooses a sequence's next draft with them, and
// dropping a pass's rejected tokens. Session::Generate and kvq serve run the passes.
#include "kvq/speculation.h"

#include "kvq/session.h"

#include "api/api_internal.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

namespace kvq {

namespace {
// Weight of a new measurement in the smoothed acceptance and pass times.
constexpr double kSmoothing = 0.25;
// Before a pass of b tokens has been timed and only the 1-token pass has: T(b) = T(1)·(1 + s·(b−1)).
// A decode step reads every weight once whatever b is small, so a short pass costs little more.
constexpr double kPriorSlope = 0.1;
// How far a pass without a draft that existed moves the acceptance back toward its prior. For a
// draft model each try costs a pass of the draft model, drafted or not (lookups cost nothing to
// try): it comes back 4x slower, so that one that is never confident enough is asked about once
// in a dozen steps, not once in four (measured: bench spec's draft arm, 0.76x plain decoding
// while asked at every step).
constexpr double kRecovery = 0.02;
constexpr double kModelRecovery = 0.005;
constexpr double kPriorAcceptance = 0.5;
}  // namespace

std::span<const DraftSource> DraftSources() {
  static constexpr DraftSource kAll[] = {DraftSource::kNone, DraftSource::kNgram, DraftSource::kSuffix,
                                         DraftSource::kModel};
  return kAll;
}

const char* DraftSourceName(DraftSource source) {
  switch (source) {
    case DraftSource::kNone: return "none";
    case DraftSource::kNgram: return "ngram";
    case DraftSource::kSuffix: return "suffix";
    case DraftSource::kModel: return "draft";
  }
  return "none";
}

Result<DraftSource> ParseDraftSource(const std::string& name) {
  std::string choices;
  for (const DraftSource s : DraftSources()) {
    if (name == DraftSourceName(s)) return s;
    choices += fmt::format("{}{}", choices.empty() ? "" : ", ", DraftSourceName(s));
  }
  return Status::Error(fmt::format("unknown draft source '{}' (expected one of {})", name, choices));
}

Status CheckSpeculation(const SpeculationOptions& o) {
  if (o.max_draft < 1 || o.max_draft > 64) {
    return Status::Error(fmt::format("SpeculationOptions::max_draft must be in 1..64 (got {})", o.max_draft));
  }
  if (o.max_ngram < 1 || o.max_ngram > 16) {
    return Status::Error(fmt::format("SpeculationOptions::max_ngram must be in 1..16 (got {})", o.max_ngram));
  }
  if (o.min_ngram < 1 || o.min_ngram > o.max_ngram) {
    return Status::Error(fmt::format("SpeculationOptions::min_ngram must be in 1..max_ngram ({}) (got {})",
                                     o.max_ngram, o.min_ngram));
  }
  if (!(o.min_draft_probability > 0 && o.min_draft_probability <= 1)) {
    return Status::Error(fmt::format("SpeculationOptions::min_draft_probability must be in (0, 1] (got {})",
                                     o.min_draft_probability));
  }
  if (o.source == DraftSource::kModel && o.draft_model == nullptr) {
    return Status::Error("SpeculationOptions::draft_model is null (the \"draft\" source drafts with a draft model)");
  }
  return Status::Ok();
}

std::vector<int32_t> DraftByLookup(std::span<const int32_t> seq, int32_t max_tokens,
                                   const SpeculationOptions& o) {
  const int64_t size = static_cast<int64_t>(seq.size());
  if (max_tokens <= 0) return {};
  for (int64_t n = std::min<int64_t>(o.max_ngram, size - 1); n >= o.min_ngram; --n) {
    const std::span<const int32_t> tail = seq.subspan(size - n);
    // The latest earlier occurrence: it starts at i < size − n, so something follows it.
    for (int64_t i = size - n - 1; i >= 0; --i) {
      if (!std::equal(tail.begin(), tail.end(), seq.begin() + i)) continue;
      // What followed the match, read on through the draft itself where it reaches the end: a
      // match `period` tokens back says the text repeats with that period, and without reading on
      // a loop of period 1 (one token again and again, as greedy decoding falls into) would only
      // ever draft 1 token a pass.
      const int64_t from = i + n, period = size - from;
      std::vector<int32_t> draft(max_tokens);
      for (int64_t j = 0; j < max_tokens; ++j) draft[j] = j < period ? seq[from + j] : draft[j - period];
      return draft;
    }
  }
  return {};
}

SuffixTree::SuffixTree(int32_t depth) : depth_(depth), nodes_(1), open_{0} {}

int32_t SuffixTree::Child(int32_t node, int32_t token) const {
  const auto it = edges_.find(static_cast<uint64_t>(node) << 32 | static_cast<uint32_t>(token));
  return it == edges_.end() ? -1 : it->second;
}

int32_t SuffixTree::ChildOrNew(int32_t node, int32_t token) {
  const auto [it, added] = edges_.try_emplace(static_cast<uint64_t>(node) << 32 | static_cast<uint32_t>(token),
                                              static_cast<int32_t>(nodes_.size()));
  if (added) {
    Node child{.token = token, .next_sibling = nodes_[node].first_child};
    nodes_[node].first_child = it->second;
    nodes_.push_back(child);
  }
  return it->second;
}

void SuffixTree::Append(int32_t token) {
  // open_[i] is the suffix of i tokens: each grows by the token; the longest falls off at depth.
  std::vector<int32_t> grown{0};
  grown.reserve(open_.size() + 1);
  for (const int32_t node : open_) {
    const int32_t child = ChildOrNew(node, token);
    nodes_[node].continued += 1;
    nodes_[child].count += 1;
    if (static_cast<int32_t>(grown.size()) < depth_) grown.push_back(child);
  }
  nodes_[0].count += 1;
  open_ = std::move(grown);
}

void SuffixTree::EndSequence() { open_.assign(1, 0); }

std::vector<int32_t> SuffixTree::Draft(std::span<const int32_t> seq, int32_t max_tokens,
                                       const SpeculationOptions& o) const {
  const int64_t size = static_cast<int64_t>(seq.size());
  if (max_tokens <= 0) return {};
  for (int64_t n = std::min<int64_t>({o.max_ngram, size, depth_ - 1}); n >= o.min_ngram; --n) {
    int32_t node = 0;
    for (int64_t i = size - n; i < size && node >= 0; ++i) node = Child(node, seq[i]);
    if (node < 0 || nodes_[node].continued == 0) continue;
    std::vector<int32_t> draft;
    double probability = 1.0;
    for (int64_t length = n; static_cast<int32_t>(draft.size()) < max_tokens && length < depth_; ++length) {
      const Node& at = nodes_[node];
      int32_t best = -1;
      for (int32_t c = at.first_child; c >= 0; c = nodes_[c].next_sibling) {
        if (best < 0 || nodes_[c].count > nodes_[best].count ||
            (nodes_[c].count == nodes_[best].count && nodes_[c].token < nodes_[best].token)) {
          best = c;
        }
      }
      if (best < 0) break;
      probability *= static_cast<double>(nodes_[best].count) / static_cast<double>(at.continued);
      if (probability < o.min_draft_probability) break;
      draft.push_back(nodes_[best].token);
      node = best;
    }
    return draft;
  }
  return {};
}

SpeculationGate::SpeculationGate(int32_t max_draft, bool drafts_by_model)
    : max_draft_(max_draft), recovery_(drafts_by_model ? kModelRecovery : kRecovery), seconds_(max_draft + 1, 0.0) {}

double SpeculationGate::PassSeconds(int32_t tokens) const {
  if (seconds_[tokens - 1] > 0) return seconds_[tokens - 1];
  // Timed counts (the 1-token pass always: Choose asks only after it ran), increasing tokens.
  std::vector<std::pair<int32_t, double>> timed;  // (tokens, seconds)
  for (int32_t b = 1; b <= max_draft_ + 1; ++b) {
    if (seconds_[b - 1] > 0) timed.emplace_back(b, seconds_[b - 1]);
  }
  // Between the nearest timed counts, linearly; past the largest, along the line from the 1-token
  // pass to it (the prior's slope when only the 1-token pass is known).
  for (size_t i = 1; i < timed.size(); ++i) {
    if (timed[i].first > tokens) {
      const auto [b0, t0] = timed[i - 1];
      const auto [b1, t1] = timed[i];
      return t0 + (t1 - t0) * (tokens - b0) / (b1 - b0);
    }
  }
  const auto [b, t] = timed.back();
  const double t1 = timed.front().second;
  const double slope = b > 1 ? std::max(0.0, (t - t1) / (b - 1)) : kPriorSlope * t1;
  return t + slope * (tokens - b);
}

int32_t SpeculationGate::Choose(int32_t available, int64_t catch_up_tokens) const {
  // Every draft is weighed against the 1-token pass, so it is timed before any draft. Estimated
  // from a drafted pass through the prior's slope instead, a verify pass dearer per drafted token
  // than the prior says made the 1-token pass look dearer than it is and drafting cheaper, and a
  // gate that kept drafting never ran the pass that would have said otherwise.
  if (seconds_[0] <= 0) return 0;
  const int32_t most = std::min(available, max_draft_);
  // Tokens a pass of k drafts yields on average: 1 + a + a² + … + a^k (a draft stops at its first
  // rejected token), per second of such a pass.
  // A draft model's k tokens cost k of its passes first, and the token it has not seen (the drawn
  // one) a run before them.
  const double per_drafted = draft_token_seconds_;
  const double per_pass = CatchUpSeconds(std::min<int64_t>(catch_up_tokens, 1));
  int32_t best = 0;
  double best_rate = 1.0 / PassSeconds(1), yield = 1.0, term = 1.0;
  for (int32_t k = 1; k <= most; ++k) {
    term *= acceptance_;
    yield += term;
    const double rate = yield / (PassSeconds(k + 1) + k * per_drafted + per_pass);
    if (rate > best_rate) {
      best = k;
      best_rate = rate;
    }
  }
  // A draft model behind by many tokens (the passes the gate ran without it) pays for all of them
  // first. Unweighed, each try after a stop paid a catch-up over every skipped token (a qwen3.5-
  // 35b-a3b-shaped hybrid at 32K with int4 KV: the gated run at 0.86x plain decoding).
  const double one_off = CatchUpSeconds(catch_up_tokens - 1);
  if (best > 0 && one_off > 0 && kCatchUpHorizon * (PassSeconds(1) - 1.0 / best_rate) <= one_off) return 0;
  return best;
}

void SpeculationGate::Record(int32_t drafted, int32_t accepted, double seconds, bool gated, bool ended) {
  double& t = seconds_[drafted];
  t = t > 0 ? t + kSmoothing * (seconds - t) : seconds;
  if (drafted > 0) {
    // A draft's tokens after its first rejection, or after the token that ended the completion,
    // were never judged: count those judged.
    const int32_t judged = ended ? std::max(accepted, 1) : std::min(drafted, accepted + 1);
    const double share = static_cast<double>(accepted) / judged;
    acceptance_ += kSmoothing * (share - acceptance_);
  } else if (gated) {
    acceptance_ += recovery_ * (kPriorAcceptance - acceptance_);
  }
}

void SpeculationGate::RecordEmptyDraft() { acceptance_ += kSmoothing * (0.0 - acceptance_); }

void SpeculationGate::RecordDraftSeconds(int32_t asked, double seconds) {
  if (asked <= 0 || !(seconds >= 0)) return;
  const double per = seconds / asked;
  draft_token_seconds_ = draft_token_seconds_ > 0 ? draft_token_seconds_ + kSmoothing * (per - draft_token_seconds_) : per;
}

void SpeculationGate::RecordCatchUpSeconds(int64_t tokens, double seconds) {
  if (tokens <= 0 || !(seconds >= 0)) return;
  const double per = seconds / static_cast<double>(tokens);
  double& t = catch_up_token_seconds_;
  t = t > 0 ? t + kSmoothing * (per - t) : per;
}

double SpeculationGate::CatchUpSeconds(int64_t tokens) const {
  if (tokens <= 0) return 0;
  return static_cast<double>(tokens) * (catch_up_token_seconds_ > 0 ? catch_up_token_seconds_ : draft_token_seconds_);
}

std::string SpeculationGateKey(const SpeculationOptions& o) {
  std::string key = fmt::format("{} max_draft {}{}", DraftSourceName(o.source), o.max_draft, o.ungated ? " ungated" : "");
  if (o.source == DraftSource::kModel) {
    // A model at this address while the key is held: the holder keeps the model alive (Session::Impl's draft).
    key += fmt::format(" model {} kv {}/{} context {}", static_cast<const void*>(o.draft_model), o.draft_kv.key_format,
                       o.draft_kv.value_format, o.draft_kv.context);
  }
  return key;
}

Drafter::Drafter(const SpeculationOptions& options, const SpeculationGate* learnt)
    : options_(options), gate_(learnt != nullptr ? *learnt : SpeculationGate(options.max_draft, options.source == DraftSource::kModel)) {
  if (options.source == DraftSource::kSuffix) tree_.emplace(options.max_ngram + options.max_draft);
}

int32_t Drafter::ModelDraftLength(int32_t most, bool* gated, int64_t catch_up_tokens) const {
  // A model's draft costs a pass of the draft per token: the gate chooses the length first.
  const int32_t want = options_.ungated || most <= 0 ? std::max(most, 0)
                                                     : gate_.Choose(most, catch_up_tokens);
  *gated = want < most;
  return want;
}

Result<Drafter::Draft> Drafter::Next(std::span<const int32_t> sequence, int32_t most, Session* draft_session,
                                     const ExtraDrafter& extra) {
  Draft d;
  const SpeculationOptions& o = options_;
  if (o.source == DraftSource::kNone || most <= 0) return d;
  if (o.source == DraftSource::kModel) {
    if (draft_session == nullptr) return Status::Error("Drafter: a draft model's source needs the draft session");
    const int64_t behind = DraftCatchUpTokens(*draft_session, sequence);
    const int32_t want = ModelDraftLength(most, &d.gated, behind);
    if (want == 0) return d;  // the draft session stays behind: a later draft catches it up
    // The catch-up is timed apart from the drafted tokens: its cost is per token missed, once.
    if (behind > 0) {
      const auto start = std::chrono::steady_clock::now();
      if (Status st = SyncDraft(*draft_session, sequence); !st.ok()) return st;
      if (draft_session->positions() == static_cast<int64_t>(sequence.size())) {
        RecordCatchUp(behind, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
    }
    const auto start = std::chrono::steady_clock::now();
    Result<std::vector<int32_t>> tokens = DraftByModel(*draft_session, sequence, want, o.min_draft_probability);
    if (!tokens.ok()) return tokens.status();
    d.tokens = std::move(tokens).value();
    RecordModelDraft(want, static_cast<int32_t>(d.tokens.size()),
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return d;
  }
  // The gate's choice depends on the acceptance and the pass times, not on the draft: when it
  // would run no draft of any length, nothing is looked up, and the suffix tree takes the tokens
  // since its last draft when it drafts next (the same tree). That time was then the whole cost of
  // speculation (3-6% of a step on the 260K-parameter stories model, whose drafts it rejected).
  // Where every pass looked, a closed gate recovered only on passes whose lookup found a draft;
  // a skipped pass is gated at the rate the lookups made found one (found_share_).
  if (!o.ungated && gate_.Choose(most) == 0) {
    owed_gated_ += found_share_;
    d.gated = owed_gated_ >= 1.0;
    if (d.gated) owed_gated_ -= 1.0;
    return d;
  }
  if (o.source == DraftSource::kSuffix) {
    for (; in_tree_ < sequence.size(); ++in_tree_) tree_->Append(sequence[in_tree_]);
    d.tokens = tree_->Draft(sequence, most, o);
  } else {
    d.tokens = DraftByLookup(sequence, most, o);
  }
  if (extra && static_cast<int32_t>(d.tokens.size()) < most) {  // the longer draft of the two
    std::vector<int32_t> other = extra(sequence, most);
    if (other.size() > d.tokens.size()) {
      d.tokens = std::move(other);
      d.from_extra = true;
    }
  }
  const int32_t available = static_cast<int32_t>(d.tokens.size());
  found_share_ += kSmoothing * ((available > 0 ? 1.0 : 0.0) - found_share_);
  const int32_t run = o.ungated ? available : gate_.Choose(available);
  d.gated = run < available;
  d.tokens.resize(run);
  return d;
}

Status KeepDraftedPrefix(Session& session, int64_t before, std::span<const int32_t> pass, int32_t kept,
                         std::span<const float> checkpoint) {
  const int64_t keep_to = before + kept;
  if (session.positions() == keep_to) return Status::Ok();
  if (session.recurrent_state().empty()) return session.Truncate(keep_to);
  if (checkpoint.empty()) return Status::Error("dropping a rejected draft: no recurrent state saved before the pass");
  if (Status st = session.Truncate(before, checkpoint); !st.ok()) return st;
  return session.Prefill(pass.first(kept));
}

Result<DraftJudgement> JudgeDraft(std::span<const int32_t> pass, std::span<const float> logits,
                                  int32_t vocab, const DrawToken& draw, const TakeToken& take) {
  const int32_t drafted = static_cast<int32_t>(pass.size()) - 1;
  if (drafted < 0 || logits.size() < static_cast<size_t>(drafted) * static_cast<size_t>(vocab)) {
    return Status::Error(
        fmt::format("JudgeDraft: {} logits for a pass of {} tokens (vocabulary {})", logits.size(),
                    pass.size(), vocab));
  }
  DraftJudgement j;
  for (int32_t i = 0; i < drafted; ++i) {
    const std::span<const float> row = logits.subspan(static_cast<size_t>(i) * vocab, vocab);
    const Result<int32_t> token = draw(row, drafted - i);
    if (!token.ok()) return token.status();
    if (*token != pass[i + 1]) {
      j.drawn = *token;
      return j;
    }
    if (!take(*token, row, pass[i])) {
      j.ended = true;
      return j;
    }
    ++j.accepted;
  }
  return j;
}

}  // namespace kvq
