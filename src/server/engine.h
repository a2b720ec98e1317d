// The engine under kvq serve: a fixed number of session slots (--parallel), a queue of requests
// beyond them, and one scheduler thread that advances every active session by one batched
// forward pass per step (Session::RunBatch: each weight matrix read once per step for all of them).
// A request's prompt is prefilled in blocks of 64 tokens — the blocks `kvq run` and
// Session::Generate cut — interleaved with the other sessions' decode tokens, so a greedy request
// gives the same tokens whether it runs alone or among others.
//
// Prefix reuse: an idle slot keeps its session's cache; a new request goes to the idle slot whose
// tokens share the longest prefix with its prompt, which is truncated to that prefix in place
// (KvCache::Truncate) and only the rest is prefilled. When a busy slot shares more of the prompt
// than any idle one (a request still running with the same system prompt), its session is forked
// instead (Session::Fork: pages shared copy-on-write). With a prefix-cache folder, prompts are also
// saved as verified snapshots (PrefixStore) that survive restarts.
//
// Threads: Submit and Job's methods are called from HTTP threads; everything touching sessions
// runs on the scheduler thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "kvq/generator.h"
#include "kvq/kv_spec.h"
#include "kvq/model.h"
#include "kvq/session.h"
#include "server/metrics.h"
#include "server/kv_blocks.h"
#include "server/kv_events.h"
#include "server/openai_protocol.h"
#include "server/prefix_store.h"
#include "server/remote_prefix_store.h"
#include "server/suffix_index.h"

namespace kvq::server {

struct EngineOptions {
  int32_t parallel = 4;      ///< sessions that generate at once (slots)
  int32_t max_queue = 64;    ///< requests waiting for a slot at most; beyond: 429
  KvOptions kv;              ///< every session's cache (formats, tier budgets)
  int64_t kv_budget_per_session_bytes = 0;  ///< 0: none. A request needing more KV: 413
  int64_t kv_budget_bytes = 0;  ///< all sessions' KV together; 0: none. Waits for room; alone too big: 413
  std::string prefix_cache_dir;  ///< "": no snapshots on disk
  int64_t prefix_cache_max_bytes = int64_t{4} << 30;
  int32_t min_prefix_tokens = 32;      ///< shorter prompts are not saved as snapshots
  int32_t max_prefill_tokens_per_step = 256;  ///< keeps decode steps short while prompts prefill
  std::string prefix_store_url;  ///< "": none; "redis://HOST:PORT[/DB]": the shared prefix store
  KvBlockOptions kv_blocks;      ///< the blocks the shared store and the KV events name
  KvEventsOptions kv_events;     ///< endpoint "": no KV events
  /// Requests' speculative decoding unless they ask otherwise (kvq serve --spec); source kNone:
  /// none. Its draft_model (not owned; kvq serve --draft-model), when set, is what requests with
  /// `spec` "draft" draft with: each slot keeps a session of it (draft_kv), in step with its own.
  SpeculationOptions speculation;
  /// > 0: a server-wide suffix index over recent requests' tokens, at most this many
  /// (server/suffix_index.h), which requests drafting with "suffix" consult besides their own
  /// tree; its trees' depth is speculation's max_ngram + max_draft. 0: none.
  int64_t spec_index_tokens = 0;
};

/// What to generate, already tokenized and checked by the HTTP layer.
struct JobSpec {
  std::vector<int32_t> prompt;  ///< ids, BOS included when the model wants it
  int32_t max_tokens = 16;      ///< ≥ 1
  std::vector<std::string> stop;
  SamplerOptions sampling;
  bool ignore_eos = false;      ///< generate max_tokens even past end tokens (benchmarks)
  /// GBNF the reply follows (from the request's grammar, json_schema or response_format); empty:
  /// none.
  std::string grammar;
  /// Control tokens kept as text (GeneratorOptions::preserved_tokens): the tool-call format's.
  std::vector<std::string> preserved_tokens;
  /// ≥ 0: each kept token's logprob and this many alternatives are published with its text.
  int32_t top_logprobs = -1;
  /// Speculative decoding (kNone: none): a decode step runs the sampled token and its draft as
  /// the session's segment of the batch, and the draft's tokens are kept while they equal the
  /// tokens drawn at their positions, each drawn with the penalties over the tokens before it (the
  /// output is unchanged). A hybrid's recurrent state is restored from a copy taken before the
  /// pass when a draft is rejected (Session::Truncate(n, state)).
  SpeculationOptions speculation;
  /// Drafts shorter than this are not run (llama.cpp's speculative.n_min).
  int32_t min_draft = 0;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
};

/// The speculation a request runs with: the server's default (EngineOptions::speculation) with
/// the request's fields over it (GenerationRequest::spec, spec_n_max, spec_p_min).
/// speculative.n_max 0 turns speculation off; above 0 with no source in force, it drafts by
/// prompt lookup (ngram).
SpeculationOptions SpeculationOf(const GenerationRequest& request, const SpeculationOptions& server_default);

/// A KV option's formats, one per layer spec (one for every layer when it gives none per layer),
/// for exact byte counts (kvq/kv_memory.h). Errors: a spec that does not parse.
Result<std::vector<LayerFormats>> FormatsOf(const KvOptions& kv);

/// One request's progress, shared by its HTTP thread (Wait, Cancel) and the scheduler.
class Job {
 public:
  struct News {
    std::string text;      ///< text produced since the last Wait
    bool finished = false;
    FinishReason finish = FinishReason::kStop;
    Usage usage;
    std::optional<ApiError> error;  ///< set when it failed (finished is then true too)
    std::vector<LogprobEntry> logprobs;  ///< kept tokens since the last Wait (JobSpec::top_logprobs)
  };
  /// Waits up to `timeout` for new text or the end, and takes what arrived.
  News Wait(std::chrono::milliseconds timeout);
  /// The client went away: the scheduler frees the slot at its next step.
  void Cancel();
  /// Seconds from Submit to the first generated token's text (0 until then).
  double ttft_seconds() const;

 private:
  friend class Engine;
  explicit Job(JobSpec s) : spec(std::move(s)) {}
  void Publish(std::string piece, bool finished, FinishReason finish, std::optional<ApiError> error,
               std::optional<LogprobEntry> logprob = std::nullopt);

  JobSpec spec;
  std::chrono::steady_clock::time_point submitted = std::chrono::steady_clock::now();
  mutable std::mutex mu;
  std::condition_variable cv;
  std::string unread;     // text not yet taken by Wait
  std::vector<LogprobEntry> unread_logprobs;
  bool finished = false;
  bool cancelled = false;
  FinishReason finish = FinishReason::kStop;
  std::optional<ApiError> error;
  Usage usage;
  double ttft = 0;
  // The rules rendered into spec (end tokens, max_tokens, stop strings, the context).
  GeneratorOptions Rules() const {
    return {.max_tokens = spec.max_tokens, .stop = spec.stop, .ignore_eos = spec.ignore_eos, .grammar = spec.grammar,
            .preserved_tokens = spec.preserved_tokens};
  }

  // Scheduler-side state (only the scheduler thread touches these).
  std::optional<Generator> generator;  // made when the prompt has run; decides every sampled token
  std::vector<float> constrained;      // [vocab] the logits as the grammar leaves them (with one)
  // Speculation (spec.speculation): the request's drafter (source, gate, suffix tree), made at
  // the first decode step; row: [vocab] the logits where a draft was rejected (a copy: dropping
  // the draft may replace the session's).
  std::optional<Drafter> drafter;
  std::vector<int32_t> history;  // [positions + 1] scratch: the session's tokens and the next one
  std::vector<float> row;
  std::vector<float> checkpoint;  // [state floats] a hybrid's recurrent state before a drafted pass
  bool gated = false;             // the gate shortened or dropped this step's draft
  int32_t model_draft_want = 0;   // draft-model drafts: this step's length at most (PrepareDraft)
  int64_t kv_reserved_bytes = 0;       // what admission counted for it, its draft session's included
  int64_t kv_reserved_draft_bytes = 0; // of which its draft-model session's (0: it drafts no other way)
  // A request's other choices (SubmitChoices), started from forks of this job's session once its
  // prompt has run; they are in no queue until then.
  std::vector<std::shared_ptr<Job>> followers;
};

/// One session slot as /slots shows it: a snapshot the scheduler takes after each step.
struct SlotState {
  int32_t id = 0;
  const char* state = "idle";    ///< "idle", "prompt" (prefilling) or "generating"
  int64_t positions = 0;         ///< tokens the session's cache holds
  int64_t context = 0;           ///< positions it may hold at most
  int64_t prompt_tokens = 0;     ///< the running request's prompt (0 when idle)
  int64_t prompt_tokens_left = 0;  ///< of which still to prefill
  int64_t reused_tokens = 0;     ///< of which a cached prefix skipped
  int64_t generated_tokens = 0;  ///< kept so far by the running request
  int64_t kv_bytes = 0;          ///< exact bytes of the session's KV cache now
  int64_t draft_kv_bytes = 0;    ///< the same for the slot's draft-model session (0: none)
  int64_t kv_reserved_bytes = 0; ///< what it counts against --kv-budget, its draft's included
};

class Engine {
 public:
  /// Starts the scheduler thread. Errors: options out of range, a KV spec or budget the model's
  /// sessions cannot have, a prefix-cache folder that cannot be made.
  static Result<std::unique_ptr<Engine>> Create(const Model& model, const EngineOptions& options, Metrics* metrics);
  ~Engine();  ///< cancels what runs and waits for the scheduler thread

  /// Queues a job. Errors: the queue is full (429), the request can never fit a budget (413),
  /// the engine is draining (503).
  std::variant<std::shared_ptr<Job>, ApiError> Submit(JobSpec spec);
  /// Queues the n choices of one request (n ≥ 1): choice i is `spec` sampled with seed + i. The
  /// first runs the prompt; when its prompt has run, each other choice takes an idle slot with a
  /// fork of its session (Session::Fork: the prompt's pages shared, not prefilled again) and
  /// draws its own tokens; one that finds no idle slot (or a total KV budget, which forks would
  /// bypass) is queued as a request of its own. Errors: Submit's.
  std::variant<std::vector<std::shared_ptr<Job>>, ApiError> SubmitChoices(JobSpec spec, int32_t n);
  /// Drops every idle session's cache (running ones keep theirs) and announces AllBlocksCleared
  /// (then the blocks of running sessions again) at the scheduler's next turn. Snapshots in the
  /// prefix folder and the shared store stay.
  void ResetPrefixCache();
  /// Refuses new jobs (503) from now on; queued and running ones go on.
  void StopAccepting();
  /// Refuses new jobs and waits up to `grace` for queued and running ones to finish; the rest are
  /// cancelled.
  void Drain(std::chrono::milliseconds grace);

  int64_t context() const { return context_; }
  /// Why this engine's sessions cannot speculate ("" when they can): their KV cache cannot drop a
  /// rejected draft (Session::CheckDropsDrafts). A request asking for speculation then gets a 400.
  const std::string& speculation_refusal() const { return speculation_refusal_; }
  const EngineOptions& options() const { return options_; }
  /// Every slot as of the scheduler's last step.
  std::vector<SlotState> Slots() const;
  /// The KV bytes the sessions may hold together: --kv-budget, or every slot at full context.
  int64_t KvCapacityBytes() const;
  /// Exact bytes a session of `positions` holds: K and V of every attention layer, plus a hybrid
  /// model's fixed recurrent state (held whatever the length: budgets count it too).
  int64_t KvBytesFor(int64_t positions) const;
  /// The same for a session of the draft model (EngineOptions::speculation.draft_model, its
  /// draft_kv formats) holding `positions`, capped at its context: what a request drafting with
  /// "draft" reserves besides KvBytesFor. 0 without a draft model.
  int64_t DraftKvBytesFor(int64_t positions) const;

 private:
  // Submit, with the choices that follow the job (SubmitChoices).
  std::variant<std::shared_ptr<Job>, ApiError> SubmitWith(JobSpec spec, std::vector<std::shared_ptr<Job>> followers);
  // What a session holds now: its KV bytes and the model's fixed state.
  int64_t SessionBytes(const Session& session) const;
  // Whether the job drafts with the draft model (it then holds a draft session besides its own).
  static bool DraftsByModel(const Job& job) {
    return job.spec.speculation.source == DraftSource::kModel && job.spec.speculation.draft_model != nullptr;
  }
  struct Slot {
    std::unique_ptr<Session> session;
    std::shared_ptr<Job> job;          // null: idle
    std::vector<int32_t> pending;      // prompt tokens still to prefill
    int32_t next_token = -1;           // sampled, to run next step
    // The next decode step's segment: next_token, then its draft; rows: logits_at, the positions
    // whose logits judge the draft (0..drafted-1). pass: [1 + drafted]; rows: [drafted].
    std::vector<int32_t> pass;
    std::vector<int32_t> rows;
    // A session of EngineOptions::speculation.draft_model, made at the first draft it makes; kept
    // between requests and brought in step with the slot's tokens before each draft (DraftByModels).
    std::unique_ptr<Session> draft;
    // What the last request's speculation gate learnt here, for the next request with the same
    // SpeculationGateKey (a conversation's next turn lands on the slot holding its prefix).
    std::optional<SpeculationGate> gate;
    std::string gate_key;
    int64_t last_used = 0;             // step of last use (LRU eviction)
    bool from_disk = false;            // holds a snapshot preloaded at start, not yet reused
    // A session forked from another slot's shares that slot's pages of its first borrowed_tokens
    // tokens (borrowed_bytes of KV), counted once: by the slot it came from, while that one still
    // holds them (BorrowStillHeld).
    const Slot* borrowed_from = nullptr;
    size_t borrowed_tokens = 0;
    int64_t borrowed_bytes = 0;
  };

  Engine(const Model& model, const EngineOptions& options, Metrics* metrics);
  void Loop();
  // Loads the newest prefix snapshots into the idle sessions (at start).
  void Preload();
  // Ends the scheduler thread and answers every job still running or queued with a 503.
  void StopAndFailRemaining();
  void Admit();
  bool AdmitOne(const std::shared_ptr<Job>& job);
  void Step();
  // Another slot whose session shares more of `prompt` than `slot`'s own cache does (one running a
  // request with the same system prompt, say), and how many tokens it shares (never the prompt's
  // last, which runs for its logits). `fixed_state` (a hybrid): only a session wholly a prefix of
  // the prompt qualifies. No donor with a disk master (Session::Fork refuses it).
  struct Donor {
    Slot* slot = nullptr;
    size_t shared = 0;
  };
  Donor FindDonor(const Slot& slot, const std::vector<int32_t>& prompt, bool fixed_state);
  // Replaces slot's session with a Fork of donor's cut to `shared` tokens: its pages shared, copied
  // only where either writes, so the prefix is neither recomputed nor read back from a snapshot,
  // and the bits are those of a session that ran the tokens alone. Returns whether it forked.
  bool ForkFrom(Slot& slot, const Slot& donor, size_t shared);
  // Whether a running job is still prefilling a prompt that shares at least a prefill block more
  // of `prompt` than `have` tokens (what an idle cache offers): then the job waits and forks it.
  bool WaitsForRunningPrefix(const std::vector<int32_t>& prompt, size_t have, bool fixed_state) const;
  // Notes that slot's session is now a fork of donor's sharing its first `tokens` tokens; sessions
  // that borrowed from slot's previous session are counted whole from now on.
  void RecordBorrow(Slot& slot, const Slot* donor, size_t tokens);
  bool BorrowStillHeld(const Slot& slot) const;
  // What a slot counts against the total budget: its job's reservation, or its idle session's
  // bytes, less the borrowed prefix its donor still holds; its draft session's included.
  int64_t SlotReservedBytes(const Slot& slot) const;
  // What the slot's draft-model session holds now (KV and the draft model's fixed state; 0: none).
  int64_t DraftBytes(const Slot& slot) const;
  // Before `job` runs in `slot`: a job that does not draft by model frees the slot's draft
  // session; one that does keeps only the part of it that is a prefix of its prompt, so the
  // session holds no more than the job reserved for it.
  void FitDraftSession(Slot& slot, const Job& job);
  // Replaces `session` with the shared store's snapshot holding the most full blocks of `prompt`
  // when that beats the `reuse` tokens the session holds by a block; updates reuse. A hybrid
  // (`fixed_state`) takes only a snapshot whose tokens are all a prefix of the prompt.
  bool RestoreSharedPrefix(Session& session, const std::vector<int32_t>& prompt, bool fixed_state, size_t& reuse);
  // Opens the shared prefix store and the KV event publisher the options ask for.
  Status OpenScaleOut();
  // Saves the slot's session to the shared store and announces the blocks it stored.
  void SaveShared(Slot& slot);
  // ResetPrefixCache's work, on the scheduler thread.
  void ClearIdleSessions();
  // Announces the blocks the sessions hold now (KV events), as one batch.
  void PublishBlocks();
  // Saves the slot's cache (prompt and reply) to the prefix store, if there is one.
  void SavePrefix(Slot& slot);
  // After the session's logits are those after its last token: sample, hand the token to the
  // job's Generator, publish the text it releases, and finish or queue the token to run.
  void Advance(Slot& slot);
  // Hands `token`, drawn from `logits` [vocab] after `previous`, to the job's Generator and
  // publishes what it releases (with its logprobs when asked); the caller finishes or runs it.
  GeneratorStep Take(Slot& slot, int32_t token, std::span<const float> logits, int32_t previous);
  // A token drawn by the session's sampler from `logits` [vocab], as the job's grammar allows;
  // the session holds `unrun` tokens after their position (a draft being judged), which the
  // penalties do not read.
  Result<int32_t> Draw(Slot& slot, std::span<const float> logits, int64_t unrun = 0);
  // Create: fills speculation_refusal_; errors when the server's default speculation cannot run
  // (a cache that cannot drop drafts, "draft" without a draft model or with another vocabulary).
  Status CheckSpeculationSetup();
  // Speculation (engine_speculation.cc): fills slot.pass and slot.rows for the next decode step;
  // true when its draft is the draft model's, which DraftWithModel then makes with the step's
  // other slots' (their draft sessions' passes batched: Session::RunBatch through DraftByModels).
  bool PrepareDraft(Slot& slot);
  void DraftWithModel(std::span<Slot* const> slots);
  // Adds `draft` (unless shorter than the request's min_draft) to the slot's pass and its rows,
  // and copies a hybrid's recurrent state to restore on a rejection.
  void FinishDraft(Slot& slot, std::span<const int32_t> draft);
  // After a decode step that took `seconds`: judges the slot's draft row by row, keeps the
  // tokens drawn while they equal it, drops the rest from the cache (Session::Truncate) and
  // queues the first that differs; without a draft, Advance. Returns the drafted tokens kept.
  int32_t AdvanceDrafted(Slot& slot, double seconds);
  // Ends the slot's job: publishes the end (with `error`, if it failed) and frees the slot.
  void Finish(Slot& slot, FinishReason reason, std::optional<ApiError> error = std::nullopt);
  // Starts `leader`'s followers in idle slots from forks of its session (whose prompt has just
  // run); the rest are queued.
  void StartFollowers(Slot& leader);
  // Queues jobs at the head of the queue (followers that could not fork).
  void QueueFront(std::vector<std::shared_ptr<Job>> jobs);
  int64_t ReservedBytes() const;  // active reservations + idle sessions' bytes
  void PublishMetrics();

  const Model& model_;
  EngineOptions options_;
  Metrics* metrics_;
  int64_t context_ = 0;
  std::vector<LayerFormats> layer_formats_;  // for KvBytesFor
  std::vector<LayerFormats> draft_layer_formats_;  // for DraftKvBytesFor (empty: no draft model)
  int64_t draft_context_ = 0;                      // a draft session's positions at most
  std::unique_ptr<PrefixStore> prefix_store_;
  std::unique_ptr<RemotePrefixStore> shared_store_;
  std::unique_ptr<KvEventPublisher> events_;
  std::optional<KvBlockLedger> ledger_;  // with events_: the sessions' blocks
  // With events_ and prefix_store_: the --prefix-cache folder's blocks (medium DISK), one ledger
  // holder per snapshot file; holder numbers of removed snapshots are reused.
  std::optional<KvBlockLedger> folder_ledger_;
  std::map<std::string, size_t> folder_holders_;  // snapshot path → holder
  std::vector<size_t> free_folder_holders_;
  int64_t folder_version_ = -1;                   // prefix_store_->version() last announced
  void PublishFolderBlocks();
  std::vector<Slot> slots_;
  int64_t step_ = 0;
  std::string speculation_refusal_;
  std::unique_ptr<SuffixIndex> suffix_index_;  // EngineOptions::spec_index_tokens > 0

  mutable std::mutex slot_states_mu_;  // guards slot_states_
  std::vector<SlotState> slot_states_;  // [parallel] PublishMetrics' snapshot, for Slots()

  std::mutex mu_;  // guards queue_, draining_, stop_
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool draining_ = false;
  bool stop_ = false;
  bool reset_requested_ = false;
  std::thread thread_;
};

}  // namespace kvq::server
