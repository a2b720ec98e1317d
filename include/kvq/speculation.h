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
// Drafts come from the sequence itself. Prompt lookup ("ngram"): the longest recent n-gram that
// ends the sequence is found earlier in it, and the tokens that followed it then are the draft.
// Suffix drafts ("suffix", SuffixDecoding's idea): a tree of every short substring of the sequence
// with how often each occurred; the longest suffix of the sequence found in it is continued by the
// most frequent next token, token by token, while the continuation stays likely — so a draft
// follows what usually came next rather than what came last, and stops where the text branched. A gate
// chooses the draft length each step from what it has measured — the share of drafted tokens kept
// and the time of a pass per number of tokens in it — and drafts nothing when a longer pass would
// not pay (at long context a pass also reads the whole cache, so a rejected draft costs time).
//
// A draft model ("draft"): a second, smaller model sharing the target's vocabulary (the same
// tokens with the same texts and types: CheckDraftVocabulary) drafts greedily, token by token,
// from its own session (its own KV cache and formats, draft_kv). That session is kept in step with
// the tokens the target keeps: a rejected draft is dropped from its cache (Session::Truncate) and
// only the tokens it has not seen run, so a long completion runs each kept token through the
// draft once. A draft stops early where the draft model's most likely token falls below
// min_draft_probability (it is then unsure, and a rejection likely).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvq/model.h"
#include "kvq/status.h"

namespace kvq {

enum class DraftSource {
  kNone,   ///< no speculation
  kNgram,   ///< prompt lookup: what followed the sequence's last n-gram the last time it occurred
  kSuffix,  ///< suffix tree: the most frequent continuation of the sequence's longest known suffix
  kModel,   ///< a draft model's greedy continuation (SpeculationOptions::draft_model)
};

/// Every draft source, kNone first (the registry flags and tests iterate).
std::span<const DraftSource> DraftSources();
/// "none", "ngram", "suffix" or "draft".
const char* DraftSourceName(DraftSource source);
/// Parses a DraftSourceName; the error names the value and the choices.
Result<DraftSource> ParseDraftSource(const std::string& name);

struct SpeculationOptions {
  DraftSource source = DraftSource::kNone;
  int32_t max_draft = 8;  ///< drafted tokens per pass at most, 1..64
  int32_t min_ngram = 1;  ///< shortest n-gram (or suffix) matched, 1..max_ngram
  int32_t max_ngram = 4;  ///< longest n-gram (or suffix) matched (longer matches are tried first), ≤ 16
  /// Suffix drafts: a draft goes on while the product of its tokens' shares of the continuations
  /// seen after their contexts stays at least this, in (0, 1]. (1: only continuations that never
  /// varied.) Draft-model drafts: a draft goes on while the draft model's probability of its most
  /// likely next token is at least this.
  double min_draft_probability = 0.1;
  /// Draft whenever a draft exists, max_draft tokens (no gate): for measuring what the gate saves.
  bool ungated = false;
  /// DraftSource::kModel: the draft model (not owned; it must outlive the Generate calls that use
  /// it, and may be shared by sessions on different threads, as any Model). Its vocabulary must be
  /// the target's (CheckDraftVocabulary). Ignored by the other sources.
  const Model* draft_model = nullptr;
  /// DraftSource::kModel: the draft session's KV cache (f16 by default; context 0: the draft
  /// model's). A session keeps its draft session between Generate calls while the draft model
  /// and these formats stay the same, so a chat runs each turn's new tokens through the draft once.
  KvOptions draft_kv;
};

/// Checks options; errors name the field (a kModel source without a draft_model included).
Status CheckSpeculation(const SpeculationOptions& options);

/// Whether `draft` can draft for `target`: the same number of tokens, and every token the same
/// text and type. The error names both files (ModelInfo::path) and the first id that differs
/// (the first id one of them lacks when the counts differ).
Status CheckDraftVocabulary(const Model& target, const Model& draft);

/// What speculation did in one completion.
struct SpeculationStats {
  int64_t passes = 0;    ///< forward passes during decode (with or without a draft)
  int64_t drafted = 0;   ///< drafted tokens run
  /// Of those, the ones equal to the token the target drew there: kept, or — the last of a
  /// completion — ending it (an end token or a stop string; it does not run, but the draft was right).
  int64_t accepted = 0;
  int64_t gated = 0;     ///< passes the gate ran without a draft that existed (skipped lookups: at the rate lookups found one)
  /// DraftSource::kModel: prompt tokens the draft model ran before generation began — the whole
  /// prompt, or fewer where its session held them already (an earlier turn, Session::PrefillDraft).
  int64_t draft_prompt_tokens = 0;
  /// The gate began with what the session's earlier completions learnt (SpeculationGateKey the
  /// same): its timed passes and acceptance, so it did not time a plain pass and probe again.
  bool gate_resumed = false;
};

/// What a gate learnt is kept for (Session::Generate, kvq serve's slots): the options that shape
/// it — the source, max_draft, ungated and, for a draft model, the model and its KV formats. A
/// completion whose key differs starts a fresh gate.
std::string SpeculationGateKey(const SpeculationOptions& options);

/// Prompt lookup: the `max_tokens` ids that followed, at its latest earlier occurrence, the
/// longest n-gram (min_ngram ≤ n ≤ max_ngram) that ends `sequence`; empty when none occurs. Where
/// what followed reaches the end of `sequence` (the occurrence is p tokens back) the draft goes on
/// repeating those p tokens, the period the match says the text has.
std::vector<int32_t> DraftByLookup(std::span<const int32_t> sequence, int32_t max_tokens,
                                   const SpeculationOptions& options);

/// A draft model's draft: up to `max_tokens` ids continuing `sequence`, drawn greedily by `draft`
/// (a session of the draft model, kept between calls): first brought in step with `sequence` (the
/// longest prefix of it that it holds kept, Session::Truncate, and the rest run), then each most
/// likely token is taken while its probability is at least `min_probability`, and run when another
/// is wanted. Fewer when the draft's context runs out. Session::Generate drafts with it; kvq serve
/// with DraftByModels, its slots' drafts together.
Result<std::vector<int32_t>> DraftByModel(Session& draft, std::span<const int32_t> sequence, int32_t max_tokens,
                                          double min_probability);

/// Tokens `draft` (a session of the draft model) runs before it can draft after `sequence`: those
/// after the longest prefix of `sequence` it holds (at least the last token, for the logits after
/// it); 0 when it is in step. While the gate runs passes without a draft, the draft model does not
/// see their tokens, so this grows with every such pass; a draft after them pays for all of them.
int64_t DraftCatchUpTokens(const Session& draft, std::span<const int32_t> sequence);

/// One session's draft in DraftByModels.
struct ModelDraft {
  Session* draft = nullptr;           ///< a session of the draft model, kept between calls
  std::span<const int32_t> sequence;  ///< what the draft continues
  int32_t max_tokens = 0;             ///< drafted tokens at most
  double min_probability = 0.1;       ///< a draft stops where its most likely token's is below
  std::vector<int32_t> tokens;        ///< out: the draft (DraftByModel's for the same arguments)
  /// out: tokens its catch-up ran (DraftCatchUpTokens before the call; 0 when it drafted nothing
  /// or was in step): the catch-up pass, before its first drafted token.
  int64_t caught_up = 0;
};

/// DraftByModel for several sessions of one draft model at once (no session twice): their
/// catch-up runs are one Session::RunBatch, and so is each round of drafted tokens, so the draft
/// model's weights are read once per pass for all of them. Each draft is the one DraftByModel
/// gives alone (RunBatch leaves each session the bits of running its tokens alone). Returns the
/// passes run. Errors: a session that cannot drop a rejected draft's tokens, or a failed pass
/// (which clears every session of it). `catch_up_seconds` (optional, out): the seconds of the
/// catch-up pass (0 when none ran), which a caller times apart from the drafted tokens' passes
/// (SpeculationGate::RecordCatchUpSeconds and RecordDraftSeconds), as Drafter::Next does.
Result<int32_t> DraftByModels(std::span<ModelDraft> drafts, double* catch_up_seconds = nullptr);

/// The suffix drafter's tree: every substring of up to `depth` tokens of the sequences appended
/// (each token's node counts the substring's occurrences and how many of them something followed),
/// built a token at a time in O(depth). Memory: at most depth nodes per token appended, fewer
/// where the text repeats.
class SuffixTree {
 public:
  explicit SuffixTree(int32_t depth);
  /// Continues the current sequence by `token`.
  void Append(int32_t token);
  void Append(std::span<const int32_t> tokens) {
    for (const int32_t t : tokens) Append(t);
  }
  /// The next Append starts a new sequence (no substring spans the two).
  void EndSequence();
  /// Up to `max_tokens` ids continuing `sequence`: its longest suffix of min_ngram..max_ngram
  /// tokens (and below depth) that occurred followed by something, then, one token at a time, the
  /// most frequent continuation (the smaller id on a tie) while the product of their shares stays
  /// ≥ min_draft_probability and the tree is deep enough. Empty when no suffix matches.
  std::vector<int32_t> Draft(std::span<const int32_t> sequence, int32_t max_tokens,
                             const SpeculationOptions& options) const;
  int64_t nodes() const { return static_cast<int64_t>(nodes_.size()); }

 private:
  struct Node {
    int32_t token = -1;
    int32_t first_child = -1;   // children form a list through next_sibling
    int32_t next_sibling = -1;
    int64_t count = 0;          // occurrences of the substring ending here
    int64_t continued = 0;      // of those, followed by a token (the sum of the children's counts)
  };
  int32_t Child(int32_t node, int32_t token) const;  // -1 when absent
  int32_t ChildOrNew(int32_t node, int32_t token);
  int32_t depth_;
  std::vector<Node> nodes_;                          // [0] the root: the empty substring
  std::unordered_map<uint64_t, int32_t> edges_;      // (parent << 32 | token) → child
  std::vector<int32_t> open_;                        // nodes of the current sequence's suffixes shorter than depth
};

/// The gate: chooses how many of the drafted tokens to run in the next pass from the share of
/// drafted tokens kept so far and the measured seconds of a pass per token count. Before a count
/// has been timed, its time is estimated from the counts that have (linearly in the token count,
/// from the 1-token pass), so it tries longer passes until their cost is known. A draft model runs
/// the tokens it has not seen before it drafts: one or two after a drafted pass (the drawn token,
/// and the last drafted one, which a draft does not run), a cost every drafted pass pays; the rest
/// (the passes the gate ran without a draft) is a one-off cost that a draft is chosen over only
/// when the time it saves over the next kCatchUpHorizon tokens exceeds it.
class SpeculationGate {
 public:
  /// `drafts_by_model`: the drafts come from a draft model, whose every try costs a pass of it
  /// (drafted or not), so after stopping it tries again more slowly than for lookups.
  explicit SpeculationGate(int32_t max_draft, bool drafts_by_model = false);
  /// Tokens over which a draft must save a catch-up's seconds beyond its first token (Choose).
  static constexpr int32_t kCatchUpHorizon = 32;
  /// Tokens of a draft of `available` tokens worth running in the next pass (0: none). None until
  /// a pass without a draft has been recorded: that pass is what every draft is weighed against.
  /// `catch_up_tokens`: what a draft model runs before it drafts (DraftCatchUpTokens; 0 for
  /// lookups). The first costs every drafted pass CatchUpSeconds(1); the others are paid once: a
  /// draft is chosen only when, at the rate it gives, kCatchUpHorizon tokens take at least
  /// CatchUpSeconds(catch_up_tokens - 1) less time than without drafts.
  int32_t Choose(int32_t available, int64_t catch_up_tokens = 0) const;
  /// Records a pass of 1 + drafted tokens that took `seconds` and kept `accepted` drafted tokens.
  /// A pass run without a draft that existed (`gated`) moves the acceptance a little back toward
  /// its prior, so a gate that stopped drafting tries again later. `ended`: the completion ended
  /// at the last of the `accepted` (DraftJudgement::ended; `accepted` its matched()), so the
  /// drafted tokens after it were never judged and do not count as rejected.
  void Record(int32_t drafted, int32_t accepted, double seconds, bool gated, bool ended = false);
  /// A draft model was asked for tokens and offered none (its most likely token was below the
  /// least probability): its pass cost time and drafted nothing, so it counts as a draft whose
  /// first token was rejected. Without this a draft model that is never confident enough would
  /// run a pass at every step for nothing (measured: 0.76x plain decoding at context 0), as the
  /// acceptance would stay at its prior.
  void RecordEmptyDraft();
  /// A draft model drafted (asked for) `asked` tokens in `seconds`: its passes are paid before
  /// every verify pass with a draft, so Choose weighs a draft of k tokens by the verify pass of
  /// k + 1 tokens plus k times the smoothed seconds per asked token. Without it a draft model that
  /// agrees often but costs half the target per token ran decode at 0.47-0.68x with the gate on
  /// (a qwen3.5-35b-a3b-shaped hybrid at 4K: 4 of 8 layers as the draft).
  void RecordDraftSeconds(int32_t asked, double seconds);
  /// A draft model ran `tokens` it had missed (DraftCatchUpTokens) in `seconds` before drafting.
  void RecordCatchUpSeconds(int64_t tokens, double seconds);
  /// The seconds a draft model's catch-up over `tokens` is expected to take: the smoothed seconds
  /// per token of the catch-ups timed so far, else its seconds per drafted token (a pass per token:
  /// a catch-up runs them in one pass, so no dearer), else 0 (nothing timed yet).
  double CatchUpSeconds(int64_t tokens) const;
  double acceptance() const { return acceptance_; }  ///< kept / drafted, smoothed
  double draft_token_seconds() const { return draft_token_seconds_; }  ///< 0: no draft model timed

 private:
  double PassSeconds(int32_t tokens) const;  // measured or estimated
  int32_t max_draft_;
  double recovery_;                     // share of the way back to the prior per gated pass
  double acceptance_ = 0.5;             // prior until drafts are seen
  std::vector<double> seconds_;         // [max_draft + 1]: smoothed seconds of a pass of i + 1 tokens; 0 unknown
  double draft_token_seconds_ = 0;      // a draft model's smoothed seconds per asked token; 0 unknown
  double catch_up_token_seconds_ = 0;   // its smoothed seconds per token caught up; 0 unknown
};


/// One sequence's drafting, as Session::Generate and kvq serve both draft: the source chosen by the
/// options (prompt lookup, the sequence's suffix tree, or a draft model's session), the gate that
/// decides how many drafted tokens a pass runs, and what the gate has learnt. One per sequence
/// being generated; a draft model's session is the caller's (it outlives a completion).
class Drafter {
 public:
  /// `learnt`: the gate an earlier completion of the same sequence left (Drafter::gate; same
  /// SpeculationGateKey), to start from instead of a fresh one; null: fresh.
  explicit Drafter(const SpeculationOptions& options, const SpeculationGate* learnt = nullptr);
  struct Draft {
    std::vector<int32_t> tokens;  ///< to run after the sequence's last token, in order
    bool gated = false;           ///< the gate ran fewer than were drafted (a skipped lookup: see Next)
    bool from_extra = false;      ///< the tokens are the `extra` drafter's
  };
  /// Another suffix drafter consulted after the sequence's own (kvq serve's index over recent
  /// requests): its draft of (sequence, most) replaces the own one when longer.
  using ExtraDrafter = std::function<std::vector<int32_t>(std::span<const int32_t>, int32_t)>;
  /// The next pass's draft after `sequence` (every token the session holds, then the token about
  /// to run): at most `most` tokens. A draft model's draft is as long as the gate chooses before
  /// it is drafted (each of its tokens costs a pass of the draft model); the others are drafted
  /// first and then cut by the gate, and not looked up at all when the gate wants no draft of any
  /// length (Choose weighs the acceptance and the pass times, not the draft); such a pass is
  /// gated at the rate the lookups made found a draft, so the gate recovers as it did when every
  /// pass looked. `draft_session`: the draft model's session (DraftSource::kModel
  /// only); errors are the draft model's.
  Result<Draft> Next(std::span<const int32_t> sequence, int32_t most, Session* draft_session,
                     const ExtraDrafter& extra = {});
  /// A draft model's draft length for the next pass, chosen before it is drafted (Next does this;
  /// kvq serve drafts every slot's draft in one batched pass of the draft model, DraftByModels):
  /// at most `most`; *gated: fewer than `most`. `catch_up_tokens`: what the draft session must run
  /// first (DraftCatchUpTokens), weighed by SpeculationGate::Choose.
  int32_t ModelDraftLength(int32_t most, bool* gated, int64_t catch_up_tokens = 0) const;
  /// Records a pass (SpeculationGate::Record).
  void Record(int32_t drafted, int32_t accepted, double seconds, bool gated, bool ended = false) {
    gate_.Record(drafted, accepted, seconds, gated, ended);
  }
  /// A draft model asked for `wanted` tokens drafted `drafted` in `seconds` (Next records this
  /// itself; kvq serve, which drafts with DraftByModels, calls it): none of `wanted` > 0 is
  /// SpeculationGate::RecordEmptyDraft; the time is SpeculationGate::RecordDraftSeconds.
  void RecordModelDraft(int32_t wanted, int32_t drafted, double seconds) {
    if (wanted > 0 && drafted == 0) gate_.RecordEmptyDraft();
    gate_.RecordDraftSeconds(wanted, seconds);
  }
  /// A draft model caught up over `tokens` in `seconds` (SpeculationGate::RecordCatchUpSeconds;
  /// Next records this itself).
  void RecordCatchUp(int64_t tokens, double seconds) { gate_.RecordCatchUpSeconds(tokens, seconds); }
  const SpeculationOptions& options() const { return options_; }
  /// What the gate has learnt (kept by the session for its next completion).
  const SpeculationGate& gate() const { return gate_; }

 private:
  SpeculationOptions options_;
  SpeculationGate gate_;
  std::optional<SuffixTree> tree_;  // DraftSource::kSuffix: over the sequence's tokens
  size_t in_tree_ = 0;              // how many of the sequence's tokens tree_ holds
  // Lookups (ngram, suffix) skipped while the gate wants no draft: the smoothed share of the
  // lookups made that found a draft (prior: all), and the skipped passes' share not yet counted
  // as gated. A skipped pass counts as gated (the gate's recovery) at the rate lookups found
  // drafts, as when every pass looked and only those with a draft were gated.
  double found_share_ = 1.0;
  double owed_gated_ = 0.0;
};

/// After a pass of `pass` tokens run from position `before` (a token, then its draft), keeps the
/// first `kept` of them in `session` and drops the rest, exactly: KV rows by Session::Truncate; a
/// hybrid's recurrent state, which cannot drop tokens, goes back to `checkpoint` (the state before
/// the pass, [state floats]; required when the session has a recurrent state) and the kept tokens
/// run again (alone: a session's bits do not depend on the pass they ran in).
Status KeepDraftedPrefix(Session& session, int64_t before, std::span<const int32_t> pass, int32_t kept,
                         std::span<const float> checkpoint);

/// How a pass's draft fared (JudgeDraft).
struct DraftJudgement {
  /// Drafted tokens kept: each equalled the token drawn at its position, and runs.
  int32_t accepted = 0;
  /// The token drawn at the first drafted position whose token differs from it (logits row
  /// `accepted`), not handed to `take`: the next token to run. -1: no drafted token differed.
  int32_t drawn = -1;
  bool ended = false;  ///< `take` ended the completion at a drafted token (which does not run)
  /// Drafted tokens the target agreed with: those kept, and the one that ended the completion.
  /// What acceptance rates and the gate count; `accepted` is what stays in the cache.
  int32_t matched() const { return accepted + (ended ? 1 : 0); }
};

/// Judges the draft of a pass (`pass`: a token, then its draft) as decoding one token at a time
/// would: for each drafted token pass[i + 1], in order, the token at its position is drawn by
/// `draw(row, unrun)` from that position's logits (row i of `logits`, [drafted, vocab]; the last
/// `unrun` = drafted - i tokens the session holds come after them, so the penalties' window ends
/// before them); while it equals the drafted one it is handed to `take(token, row, previous
/// token)`, which says whether it runs (false: the completion ended at it). Session::Generate and
/// kvq serve both judge with it, then drop what was not kept (KeepDraftedPrefix: 1 + accepted
/// tokens of the pass). Errors are `draw`'s.
using DrawToken = std::function<Result<int32_t>(std::span<const float> row, int64_t unrun)>;
using TakeToken = std::function<bool(int32_t token, std::span<const float> row, int32_t previous)>;
Result<DraftJudgement> JudgeDraft(std::span<const int32_t> pass, std::span<const float> logits,
                                  int32_t vocab, const DrawToken& draw, const TakeToken& take);

}  // namespace kvq
