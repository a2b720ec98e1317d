// kvq's public C++ API, part 2: a session — one token sequence, its KV cache and its logits.
//
//   std::unique_ptr<kvq::Session> s = ...;              // Model::NewSession()
//   kvq::Result<kvq::Completion> c = s->Generate("Once upon a time", {.max_tokens = 64},
//       [](int32_t id, const std::string& piece) { std::cout << piece; return true; });
//
// Two ways to drive it. Generate(prompt) does what `kvq run` does (and gives the same tokens):
// tokenize, prefill, then sample, hand each token to a Generator (kvq/generator.h: end tokens,
// max_tokens, stop strings, the context) and decode it, until the Generator says it is finished.
// Or step by hand: Prefill(ids), then read logits(), pick a token (Sample() or your own rule),
// ask a Generator about it and Decode(it).
// A session is used by one thread at a time; separate sessions may run concurrently.
//
// A server steps many sessions at once with Session::RunBatch: every active session's next
// token (and new requests' prompt chunks) in one forward pass, each weight matrix read once per
// step for all of them, and each session's bits exactly those of running it alone.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvq/generator.h"
#include "kvq/kv_cache.h"
#include "kvq/sampling.h"
#include "kvq/speculation.h"
#include "kvq/status.h"

namespace kvq {

/// Receives each generated token and the text that may be shown now (GeneratorStep::text: text
/// that could begin a stop string, or an incomplete UTF-8 character, is held back and arrives with
/// a later token); return false to stop there (the token is kept in the completion). Called once
/// per kept token, and once more with the end token's id when an end token releases held text.
using TokenCallback = std::function<bool(int32_t token, const std::string& piece)>;

struct GenerateRequest {
  int32_t max_tokens = 256;  ///< new tokens at most; < 0: until an end token or the context is full
  SamplerOptions sampling;   ///< temperature 0 for greedy
  std::vector<std::string> stop;  ///< the text ends before the first of these (non-empty strings)
  bool ignore_eos = false;   ///< end tokens do not end the completion (kept, their text "")
  /// GBNF the completion follows (GeneratorOptions::grammar: logits Constrained before each
  /// sample); empty: none.
  std::string grammar;
  /// Control tokens kept as text (GeneratorOptions::preserved_tokens: a tool-call format's
  /// opening, ToolCallFormat::preserved).
  std::vector<std::string> preserved_tokens;
  /// Non-empty: a prompt cache. Once the session holds every prompt token but the last, when some
  /// of them were computed by this call (not all reused), they are saved there with SavePrefix: a
  /// later run of a prompt that starts with them LoadPrefix-es the file and Generate reuses it (the
  /// prompt's last token always runs again, for its logits). A failed save fails the call.
  std::string save_prefix;
  /// Drafted tokens checked in one pass (kvq/speculation.h): the same tokens, fewer passes when
  /// drafts are kept. Needs a cache that can drop a rejected draft (CheckDropsDrafts: not a disk
  /// master; a hybrid's KV rows one at a time, its recurrent state restored from a copy). Refused
  /// with an error otherwise.
  SpeculationOptions speculation;
  /// Called on the calling thread as the prompt runs, after each block of kPrefillBlock tokens:
  /// (prompt tokens the session holds now, the prompt's tokens). Reused tokens count as held, so
  /// the first call's `held` may start past 0; the last call says held == total. A caller shows
  /// progress with it (`kvq run` draws a bar when a prompt takes over a second); it must not use
  /// the session. Empty: none.
  std::function<void(int64_t held, int64_t total)> on_prompt_progress;
};

struct Completion {
  std::string text;              ///< the generated text only, cut before a stop string
  std::vector<int32_t> tokens;   ///< the generated ids only (an end token is not kept)
  int32_t n_prompt = 0;          ///< prompt tokens (with BOS)
  int32_t n_reused = 0;          ///< prompt tokens already in the session's cache, not recomputed
  double prompt_seconds = 0;     ///< prefill time
  double decode_seconds = 0;     ///< decode time
  FinishReason finish = FinishReason::kStop;
  SpeculationStats speculation;  ///< passes, drafted and kept tokens (passes counted without too)
};

class Session;

/// Tokens per forward pass when a session runs many at once (Prefill, RunBatch): each weight matrix
/// is read once per block of this many rows. How a sequence is cut into blocks changes no bit of
/// the logits or the cache (KvCache::Attend), so this is a speed setting only.
inline constexpr int32_t kPrefillBlock = 64;

/// One session's part of a batched step: `tokens` run after what the session holds.
struct BatchItem {
  Session* session = nullptr;
  std::span<const int32_t> tokens;  ///< ids in [0, vocab_size); at least one
  /// Indices into `tokens` (in [0, tokens.size()), increasing) whose logits are wanted, besides
  /// those after the last token that logits() always gives: what a speculative-decoding verifier
  /// reads for its draft. Session::chosen_logits() holds them after the call. Empty: none.
  std::span<const int32_t> logits_at;
};

class Session {
 public:
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  /// Runs `tokens` after what the session holds (in blocks: weights read once per block) and
  /// leaves the logits after the last one. Errors: an id outside the vocabulary, more positions
  /// than context() (nothing is appended then); a cache error while running (the session is
  /// cleared, as the layers may hold different lengths).
  Status Prefill(std::span<const int32_t> tokens);
  /// The same, also keeping the logits after each token tokens[i] for i in `logits_at` (increasing
  /// indices into tokens), in chosen_logits(): each row bit for bit the logits() that running the
  /// tokens one Decode at a time gives after that token. Errors also: an index out of range or not
  /// after the one before it (the message names it; nothing runs).
  Status Prefill(std::span<const int32_t> tokens, std::span<const int32_t> logits_at);
  /// One decode step: Prefill of the single token `token`.
  Status Decode(int32_t token);

  /// Threads this session's forward passes use from now on (matrix products, attention, recurrent
  /// layers), 1..1024; sessions start with ModelInfo::threads. No count changes a bit of the
  /// logits or the cache (work is split across rows and heads, never inside a sum), so a server may
  /// change it between calls. RunBatch runs with its first item's session's thread count, on
  /// workers the model lends for the call (one set per concurrent RunBatch, not one per session).
  /// Errors: a count outside 1..1024 (the session is unchanged).
  Status SetThreads(int32_t threads);
  int32_t threads() const;  ///< what SetThreads set, or ModelInfo::threads

  /// A function Prefill, RunBatch and Generate ask whether to stop (true: stop), e.g. one reading a
  /// flag that a Ctrl-C handler or a client disconnect sets; empty (the default) never stops.
  /// Prefill and RunBatch ask it before each block of kPrefillBlock tokens after the first, so a
  /// long prompt stops within one block; Generate also asks it before sampling each token. It is
  /// called on the thread running the session (and, in RunBatch, for every session of the batch
  /// with a block left); it must not use the session.
  /// When it fires, Prefill and RunBatch return an error saying it was aborted and how many
  /// positions each session now holds: every session stays valid and holds the blocks that ran
  /// (tokens() and the cache agree, bit for bit a session that ran only those tokens), and logits()
  /// of a session whose last block did not run are empty; running the remaining tokens later gives
  /// exactly the bits of an uninterrupted run. RunBatch stops every session of the batch when any
  /// one's callback fires. Generate finishes with FinishReason::kCancelled (not an error).
  void SetAbortCallback(std::function<bool()> should_abort);

  /// Runs every item's tokens after what its session holds, all items in one forward pass per
  /// block of kPrefillBlock tokens: the rows of all items go through each weight matrix together
  /// (each matrix read once for the whole batch — the point when many sessions decode at once),
  /// and each item attends over its own session's cache. Each session ends exactly as if it had
  /// run its tokens alone, cut in any way: the same bits in logits() and in the cache, for every KV
  /// format (an item of more than kPrefillBlock tokens takes part in one pass per block; a pass
  /// holds the items with a block left), since every row of the shared products is computed by
  /// the same operations whatever the other rows. So a decode step of N
  /// sessions is RunBatch of N one-token items, and a new request's prompt chunk can ride along
  /// with them. The sessions must belong to one Model; they may hold different positions and KV
  /// formats. The pass runs on the first item's session's activations and threads (the model's).
  /// Threads: no session of the batch may be used by another thread during the call.
  /// Errors, before anything runs (every session unchanged; the message names the item index):
  /// no items, a null session, an item without tokens, a session given twice, sessions of
  /// different models, an id outside the vocabulary, more positions than a session's context(), a
  /// bad logits_at index. The abort callbacks (SetAbortCallback) may stop it between passes.
  /// A cache error while running clears every session of the batch (their layers may hold
  /// different lengths) and says so.
  static Status RunBatch(std::span<const BatchItem> items);

  /// [vocab_size] the logits after the last token run; empty before any token has run and right
  /// after LoadPrefix (the snapshot holds the cache, not the logits: run a token first).
  std::span<const float> logits() const;
  /// [logits_at.size()][vocab_size] the logits after each token the last Prefill or RunBatch item
  /// of this session named in logits_at, in its order; empty when it named none, after any other
  /// call that runs tokens, and after an error (an abort included).
  std::span<const float> chosen_logits() const;
  /// The ids the cache holds, in order.
  std::span<const int32_t> tokens() const;
  int64_t positions() const;  ///< = tokens().size()
  int64_t context() const;    ///< positions the session holds at most
  int64_t kv_bytes() const;   ///< exact bytes of the KV cache's contents now, every layer
  /// The cache's tiers as created (device working set, host and disk bytes at full context).
  const KvTierPlan& kv_plan() const;

  /// The sampler chain Sample() uses (its generator is re-seeded with options.seed).
  void SetSampler(const SamplerOptions& options);
  /// A token drawn from logits() by the chain. Errors: no logits yet.
  Result<int32_t> Sample();
  /// A token drawn by the same chain (and generator) from `logits` [vocab_size] instead: logits()
  /// as Generator::Constrain left them, say. Errors: a size other than the vocabulary's.
  Result<int32_t> Sample(std::span<const float> logits);
  /// The same, where the session holds `unrun` tokens after the position of `logits` (a draft
  /// being judged): the penalties read the tokens held but those, as decoding one token at a time
  /// would. Errors also: `unrun` past positions().
  Result<int32_t> Sample(std::span<const float> logits, int64_t unrun);

  /// Generates a completion of `prompt`, which is the whole text (BOS added as the vocabulary
  /// says). If what the session holds is a prefix of the prompt's tokens it is reused (a chat that
  /// resends its history recomputes only the new turn, when the history tokenizes as it was
  /// generated); otherwise the cache is cleared first. The prompt not yet held runs as
  /// Prefill(all of it but its last token), then Decode(its last token): the cut `kvq run` makes,
  /// so greedy output equals `kvq run`'s for the same model, prompt and formats. Then: sample with
  /// request.sampling (its own sampler chain: Sample()'s is untouched), ask a Generator, Decode.
  /// Afterwards the session holds the prompt and the completion except, when generation stopped
  /// for a stop string, max_tokens, on_token's cancellation or a full context, the last generated
  /// token (sampled, not run): logits() are those before it, so a caller continuing by hand Decodes
  /// it first. When the abort callback (SetAbortCallback) fires, the completion finishes as
  /// kCancelled: during the prompt, with no tokens and the session holding the prompt's blocks
  /// that ran (no logits); later, with every generated token run.
  /// Errors: an empty or too long prompt, a bad stop string (the session is untouched); cache
  /// errors (the session is cleared).
  Result<Completion> Generate(std::string_view prompt, const GenerateRequest& request = {},
                              const TokenCallback& on_token = {});
  /// The same for a prompt already tokenized (BOS included when wanted). Errors also: an id
  /// outside the vocabulary.
  Result<Completion> Generate(std::span<const int32_t> prompt_ids, const GenerateRequest& request = {},
                              const TokenCallback& on_token = {});
  /// Runs the draft model that `speculation` names (DraftSource::kModel) over the tokens the
  /// session holds now, so that a Generate with the same options drafts at once instead of first
  /// running them through the draft model, and so that Fork carries it: a long prompt prefilled
  /// once serves every fork's drafts. Errors: the options' (CheckSpeculation), a draft model of
  /// another vocabulary, the draft's cache errors (its session is dropped then, not this one).
  Status PrefillDraft(const SpeculationOptions& speculation);

  /// Keeps the first `n_positions` positions and drops the rest. Positions are dropped in place
  /// where the formats allow it (KvCache::TruncationPoint: per-token formats exactly, grouped
  /// ones down to a group boundary) and the few after that point are recomputed from their ids;
  /// specs with sinks or a residual recompute all n_positions. Either way the cache holds the
  /// same bits as a session that ran only those tokens, except that the logits are those after
  /// the last recomputed token (none when nothing was recomputed: run a token first).
  /// A hybrid's recurrent state cannot be cut: without a checkpoint (SaveCheckpoint) at or below
  /// n_positions it recomputes all n_positions; with one it restores the checkpoint's state and
  /// recomputes only the positions after it (the same bits either way).
  /// Errors: n_positions < 0 or > positions().
  Status Truncate(int64_t n_positions);
  /// Makes what the session holds a prefix of `prompt` that Generate then reuses: the positions up
  /// to where the held ids and `prompt` first differ are kept (never all of `prompt`: its last
  /// token runs again, for the logits), the rest truncated; a cache that cannot be cut there (a
  /// recurrent state) is cleared. The one rule kvq chat and the page's chat in a tab follow, so
  /// a turn prefills only what the history did not already hold. Returns the positions kept.
  /// Errors: those of Truncate and Clear (the session is then cleared or unusable).
  Result<int64_t> KeepCommonPrefix(std::span<const int32_t> prompt);
  /// Whether a speculative verifier can drop a rejected draft from this session: not with a disk
  /// master (--kv-disk); a hybrid's KV rows must drop one at a time (per-token codecs, no sinks or
  /// residual), as its recurrent state is restored from a checkpoint (recurrent_state) rather than
  /// recomputed. The error says why, naming the formats.
  Status CheckDropsDrafts() const;
  /// A hybrid model's recurrent state now, [state floats] (empty without one): a verifier copies
  /// it before a pass with a draft, to roll back to with Truncate(n, state).
  std::span<const float> recurrent_state() const;
  /// For a hybrid: keeps the first n positions (1 ≤ n ≤ positions(), within the last pass's tokens)
  /// and sets the recurrent state to `state`, which recurrent_state() held when the session held
  /// exactly n positions. The logits are then empty (run a token first). Errors: no recurrent
  /// state, a state of another size, n out of range (the session is unchanged).
  Status Truncate(int64_t n_positions, std::span<const float> state);
  /// For a hybrid (recurrent_state() not empty): keeps a copy of the recurrent state now, at
  /// positions(), so that a later Truncate(n) with checkpoint_positions() ≤ n restores it and
  /// recomputes only the positions after it. One checkpoint at a time (a new one replaces it);
  /// dropped when its positions are (Truncate below it, Clear, LoadPrefix). A draft model's
  /// session takes one before each draft (DraftByModels), so a rejected draft is dropped without
  /// running its history again. Nothing for a model without a recurrent state.
  void SaveCheckpoint();
  /// The positions SaveCheckpoint's copy was taken at; -1 when there is none.
  int64_t checkpoint_positions() const;
  /// Positions this session has run through the model since it was made (prompts, decoded and
  /// drafted tokens, recomputation after Truncate): the work it cost, in tokens.
  int64_t positions_run() const;
  /// Drops everything (an empty cache of the same formats and budgets). Fails only if the new
  /// cache cannot be made (e.g. its disk folder went away); the session is then unusable.
  Status Clear();

  /// Saves the cache and its ids to a verified snapshot file (kvq/kv_cache.h: checksummed,
  /// written to a temporary file and renamed).
  Status SavePrefix(const std::string& path) const;
  /// Replaces the session's contents with a snapshot saved by SavePrefix for this model and
  /// these formats; returns the positions loaded. A snapshot of another model or format, or a
  /// damaged file, is refused and the session is unchanged.
  Result<int64_t> LoadPrefix(const std::string& path);

  /// A new session holding what this one holds — its ids, logits and sampler — whose KV cache
  /// shares this session's pages until either writes them (KvCache::Fork): N sessions forked after
  /// a long system prompt hold its pages once, and each then generates exactly what a session that
  /// ran the same tokens alone generates. A draft model's session (kept between Generate calls,
  /// PrefillDraft) is forked with it where it can be (else the fork's first Generate runs the
  /// prompt through the draft model again). Errors: a cache with a disk master (--kv-disk).
  Result<std::unique_ptr<Session>> Fork() const;
  /// Host RAM this session's KV pages hold now, and of it the pages it shares with no other
  /// session (KvCache::page_bytes_held / page_bytes_unshared).
  int64_t kv_page_bytes_held() const;
  int64_t kv_page_bytes_unshared() const;

  struct Impl;  ///< internal

 private:
  friend class Model;
  friend class Generator;  // reads the session's model
  explicit Session(std::unique_ptr<Impl> impl);
  enum class Abortable { kNo, kYes };
  // Prefill and RunBatch: checks every item, then runs them in blocks of 64 tokens per item,
  // asking the abort callbacks between blocks when `abortable`. `caller` ("Prefill", "RunBatch",
  // "Truncate") prefixes the messages; RunBatch's name the item index.
  static Status RunItems(std::span<const BatchItem> items, std::string_view caller, Abortable abortable);
  // Before the block starting at token `done` of every item: asks the abort callbacks of the
  // sessions with a block left; when one fires, marks every session aborted and says so.
  static Status CheckAbort(std::span<const BatchItem> items, size_t done, std::string_view caller);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvq
