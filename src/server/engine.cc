// kvq serve's engine (see engine.h): admission, batched steps and sampling; the rules that end a
// completion are each job's Generator's (kvq/generator.h).
#include "server/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "kvq/kv_memory.h"
#include "kvq/kv_spec.h"
#include "kvq/log.h"

namespace kvq::server {
namespace {

using Clock = std::chrono::steady_clock;

ApiError Refused(int status, std::string type, std::string code, std::string message) {
  return {.status = status, .type = std::move(type), .message = std::move(message), .param = "", .code = std::move(code)};
}

}  // namespace

Result<std::vector<LayerFormats>> FormatsOf(const KvOptions& kv) {
  std::vector<LayerFormats> out;
  for (const KvLayerSpec& l :
       kv.layers.empty() ? std::vector<KvLayerSpec>{{kv.key_format, kv.value_format}} : kv.layers) {
    Result<KvSpec> k = ParseKvSpec(l.key), v = ParseKvSpec(l.value);
    if (!k.ok()) return k.status();
    if (!v.ok()) return v.status();
    out.push_back(LayerFormats::Of(*k, *v));
  }
  return out;
}

namespace {

// Exact bytes a session of `info`'s model holding `positions` in `formats` takes: K and V of every
// attention layer and the model's fixed recurrent state. INT64_MAX when it cannot be counted.
int64_t BytesFor(const ModelInfo& info, std::span<const LayerFormats> formats, int64_t positions) {
  Result<int64_t> bytes = KvBytesForContext(
      formats, {.n_layers = info.n_attention_layers, .n_kv_heads = info.n_kv_heads, .head_dim = info.head_dim},
      std::max<int64_t>(1, positions));
  return bytes.ok() ? *bytes + info.state_bytes : INT64_MAX;
}

}  // namespace

// ---- Job ----

Job::News Job::Wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu);
  cv.wait_for(lock, timeout, [&] { return finished || !unread.empty() || !unread_logprobs.empty(); });
  News news;
  news.text = std::move(unread);
  unread.clear();
  news.logprobs = std::move(unread_logprobs);
  unread_logprobs.clear();
  news.finished = finished && unread.empty();
  news.finish = finish;
  news.usage = usage;
  news.error = error;
  return news;
}

void Job::Cancel() {
  std::lock_guard<std::mutex> lock(mu);
  cancelled = true;
}

double Job::ttft_seconds() const {
  std::lock_guard<std::mutex> lock(mu);
  return ttft;
}

void Job::Publish(std::string piece, bool done, FinishReason reason, std::optional<ApiError> err,
                  std::optional<LogprobEntry> logprob) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (logprob) unread_logprobs.push_back(std::move(*logprob));
    if (!piece.empty() && ttft == 0) ttft = std::chrono::duration<double>(Clock::now() - submitted).count();
    unread += piece;
    if (done) {
      finished = true;
      finish = reason;
      error = std::move(err);
    }
    usage.completion_tokens = generator ? static_cast<int64_t>(generator->tokens().size()) : 0;
  }
  cv.notify_all();
}

// ---- Engine ----

Engine::Engine(const Model& model, const EngineOptions& options, Metrics* metrics)
    : model_(model), options_(options), metrics_(metrics), context_(model.info().context) {}

Result<std::unique_ptr<Engine>> Engine::Create(const Model& model, const EngineOptions& options, Metrics* metrics) {
  if (options.parallel < 1 || options.parallel > 256) {
    return Status::Error(fmt::format("--parallel must be in 1..256 (got {})", options.parallel));
  }
  std::unique_ptr<Engine> e(new Engine(model, options, metrics));
  // The specs, for exact byte counts (kvq/kv_memory.h), and one session made now so a bad spec or
  // budget is refused at start, not at the first request.
  Result<std::vector<LayerFormats>> formats = FormatsOf(options.kv);
  if (!formats.ok()) return formats.status();
  e->layer_formats_ = std::move(formats).value();
  for (int32_t i = 0; i < options.parallel; ++i) {
    Result<std::unique_ptr<Session>> s = model.NewSession(options.kv);
    if (!s.ok()) return s.status();
    e->slots_.push_back(Slot{.session = std::move(s).value()});
  }
  e->context_ = e->slots_[0].session->context();  // KvOptions::context may hold less than the model's
  if (Status s = e->CheckSpeculationSetup(); !s.ok()) return s;
  // The smallest request, with its draft session when requests draft with the draft model by default.
  const bool draft_default = options.speculation.source == DraftSource::kModel;
  const int64_t smallest = e->KvBytesFor(2) + (draft_default ? e->DraftKvBytesFor(2) : 0);
  if (options.kv_budget_per_session_bytes > 0 && smallest > options.kv_budget_per_session_bytes) {
    return Status::Error(fmt::format("--kv-budget-per-session {} B holds no request: 2 positions take {} B{}",
                                     options.kv_budget_per_session_bytes, smallest,
                                     draft_default ? " (the draft model's session for --spec draft included)" : ""));
  }
  if (!options.prefix_cache_dir.empty()) {
    Result<std::unique_ptr<PrefixStore>> store = PrefixStore::Open(
        options.prefix_cache_dir, KvFolderName(options.kv),
        options.prefix_cache_max_bytes);
    if (!store.ok()) return store.status();
    e->prefix_store_ = std::move(store).value();
    metrics->prefix_snapshots_refused += e->prefix_store_->refused();
    Log(LogLevel::kInfo, fmt::format("prefix cache: {} snapshots in {}", e->prefix_store_->size(),
                                     e->prefix_store_->folder()));
    e->Preload();
  }
  if (Status s = e->OpenScaleOut(); !s.ok()) return s;
  e->PublishMetrics();  // the slots as they start (idle, or holding preloaded snapshots)
  e->thread_ = std::thread([raw = e.get()] { raw->Loop(); });
  return e;
}

Engine::~Engine() { StopAndFailRemaining(); }

void Engine::StopAndFailRemaining() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  // The scheduler has stopped: whoever still waits gets an answer rather than waiting forever.
  const ApiError gone = Refused(503, "server_error", "shutting_down", "the server is shutting down");
  auto fail = [&](const std::shared_ptr<Job>& job) {
    job->Publish("", true, FinishReason::kStop, gone);
    for (const auto& f : job->followers) f->Publish("", true, FinishReason::kStop, gone);
  };
  for (Slot& s : slots_) {
    if (s.job) fail(s.job);
    s.job.reset();
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& job : queue_) fail(job);
  queue_.clear();
}

void Engine::Preload() {
  // The newest snapshots go into the idle sessions before the server takes requests, so a prompt
  // that extends one starts as soon after a restart as it would have before (loading a snapshot
  // on demand costs its file read and fresh pages). Within the total budget; refused ones are
  // deleted and counted, as on demand.
  std::vector<std::string> snapshots;
  for (const PrefixStore::Entry* e : prefix_store_->Newest(slots_.size())) snapshots.push_back(e->snapshot);
  size_t slot = 0;
  int64_t bytes = 0;
  for (const std::string& path : snapshots) {
    const PrefixStore::Entry* entry = prefix_store_->Find(path);
    if (entry == nullptr || slot == slots_.size()) continue;
    const int64_t need = KvBytesFor(static_cast<int64_t>(entry->ids.size()));
    if (options_.kv_budget_bytes > 0 && bytes + need > options_.kv_budget_bytes) continue;
    Session& session = *slots_[slot].session;
    if (!prefix_store_->Load(*entry, session).ok()) {
      metrics_->prefix_snapshots_refused++;
      continue;
    }
    bytes += SessionBytes(session);
    slots_[slot++].from_disk = true;
  }
  if (slot > 0) Log(LogLevel::kInfo, fmt::format("prefix cache: {} snapshots loaded into idle sessions", slot));
}

int64_t Engine::KvBytesFor(int64_t positions) const { return BytesFor(model_.info(), layer_formats_, positions); }

int64_t Engine::DraftKvBytesFor(int64_t positions) const {
  const Model* draft = options_.speculation.draft_model;
  if (draft == nullptr || draft_layer_formats_.empty()) return 0;
  return BytesFor(draft->info(), draft_layer_formats_, std::min(positions, draft_context_));
}

int64_t Engine::KvCapacityBytes() const {
  // Without a budget: every slot at full context, with its draft session when requests may draft.
  return options_.kv_budget_bytes > 0 ? options_.kv_budget_bytes
                                      : options_.parallel * (KvBytesFor(context_) + DraftKvBytesFor(context_));
}

std::vector<SlotState> Engine::Slots() const {
  std::lock_guard<std::mutex> lock(slot_states_mu_);
  return slot_states_;
}

int64_t Engine::SessionBytes(const Session& session) const {
  return session.kv_bytes() + model_.info().state_bytes;
}

int64_t Engine::DraftBytes(const Slot& slot) const {
  return slot.draft ? slot.draft->kv_bytes() + options_.speculation.draft_model->info().state_bytes : 0;
}

void Engine::FitDraftSession(Slot& slot, const Job& job) {
  if (!slot.draft) return;
  if (!DraftsByModel(job)) {
    slot.draft.reset();
    return;
  }
  Session& draft = *slot.draft;
  const size_t common = std::min(CommonPrefix(draft.tokens(), job.spec.prompt), job.spec.prompt.size() - 1);
  if (static_cast<size_t>(draft.positions()) <= common) return;
  // A draft model with recurrent state cannot go back without a copy: it starts empty.
  const Status st = options_.speculation.draft_model->info().state_bytes > 0
                        ? draft.Clear()
                        : draft.Truncate(static_cast<int64_t>(common));
  if (!st.ok()) slot.draft.reset();  // what it holds is unknown: a new one at the first draft
}

std::variant<std::shared_ptr<Job>, ApiError> Engine::Submit(JobSpec spec) { return SubmitWith(std::move(spec), {}); }

std::variant<std::shared_ptr<Job>, ApiError> Engine::SubmitWith(JobSpec spec, std::vector<std::shared_ptr<Job>> followers) {
  const int64_t n_prompt = static_cast<int64_t>(spec.prompt.size());
  if (n_prompt == 0) return Refused(400, "invalid_request_error", "", "the prompt has no tokens");
  if (n_prompt >= context_) {
    return Refused(400, "invalid_request_error", "context_length_exceeded",
                   fmt::format("the prompt is {} tokens; this server's context is {} (room is needed for at least "
                               "one new token)", n_prompt, context_));
  }
  if (Status rules = Generator::Check({.max_tokens = spec.max_tokens, .stop = spec.stop, .grammar = spec.grammar});
      !rules.ok()) {
    ApiError e = Refused(400, "invalid_request_error", "", rules.message());
    e.param = rules.message().rfind("GeneratorOptions::grammar", 0) == 0 ? "grammar" : "stop";
    return e;
  }
  const int64_t positions = std::min<int64_t>(context_, n_prompt + spec.max_tokens);
  // A request drafting with the draft model holds a session of it too, as many positions as its
  // own at most (DraftByModels runs the kept tokens and the draft but its last): counted with it.
  const bool drafts = spec.speculation.source == DraftSource::kModel && spec.speculation.draft_model != nullptr;
  const int64_t target = KvBytesFor(positions);
  const int64_t draft = drafts ? DraftKvBytesFor(positions) : 0;
  const int64_t need = target > INT64_MAX - draft ? INT64_MAX : target + draft;
  auto too_big = [&](const char* budget, int64_t bytes) {
    std::string what = fmt::format("the prompt ({} tokens) and max_tokens ({}) need {} B of KV cache", n_prompt,
                                   spec.max_tokens, target);
    if (drafts) {
      what += fmt::format(" and the draft model's session (spec \"draft\") {} B more, {} B in all", draft, need);
    }
    what += fmt::format("; {} is {} B", budget, bytes);
    if (drafts && target <= bytes) what += " (without the draft model, spec \"none\" or \"ngram\", it fits)";
    return Refused(413, "invalid_request_error", "kv_budget_exceeded", std::move(what));
  };
  if (options_.kv_budget_per_session_bytes > 0 && need > options_.kv_budget_per_session_bytes) {
    return too_big("the per-session budget (--kv-budget-per-session)", options_.kv_budget_per_session_bytes);
  }
  if (options_.kv_budget_bytes > 0 && need > options_.kv_budget_bytes) {
    return too_big("the server's whole budget (--kv-budget)", options_.kv_budget_bytes);
  }
  std::shared_ptr<Job> job(new Job(std::move(spec)));
  job->kv_reserved_bytes = need;
  job->kv_reserved_draft_bytes = draft;
  job->followers = std::move(followers);
  job->usage.prompt_tokens = n_prompt;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_ || stop_) return Refused(503, "server_error", "shutting_down", "the server is shutting down");
    if (static_cast<int32_t>(queue_.size()) >= options_.max_queue) {
      return Refused(429, "rate_limit_exceeded", "queue_full",
                     fmt::format("{} requests are waiting for a session already (--parallel {}, queue {}); retry "
                                 "later", queue_.size(), options_.parallel, options_.max_queue));
    }
    queue_.push_back(job);
    metrics_->queued_requests = static_cast<int64_t>(queue_.size());
  }
  wake_.notify_all();
  return job;
}

void Engine::StopAccepting() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
}

void Engine::Drain(std::chrono::milliseconds grace) {
  StopAccepting();
  const auto until = Clock::now() + grace;
  while (Clock::now() < until) {
    bool busy = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy = !queue_.empty() || metrics_->active_sessions.load() > 0;
    }
    if (!busy) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  StopAndFailRemaining();  // past the grace: what is left ends with a 503
}

void Engine::Loop() {
  for (;;) {
    bool reset = false;  // ResetPrefixCache was called
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] {
        return stop_ || reset_requested_ || !queue_.empty() || std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) {
                 return s.job != nullptr;
               });
      });
      if (stop_) return;
      reset = std::exchange(reset_requested_, false);
    }
    if (reset) ClearIdleSessions();
    Admit();
    PublishMetrics();  // reservations peak right after admission
    Step();
    PublishMetrics();
  }
}

int64_t Engine::ReservedBytes() const {
  int64_t total = 0;
  for (const Slot& s : slots_) total += SlotReservedBytes(s);
  return total;
}

void Engine::Admit() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Jobs cancelled or past their deadline while queued leave without a slot.
      while (!queue_.empty()) {
        std::shared_ptr<Job>& front = queue_.front();
        bool cancelled = false;
        {
          std::lock_guard<std::mutex> jl(front->mu);
          cancelled = front->cancelled;
        }
        if (cancelled || Clock::now() > front->spec.deadline) {
          front->Publish("", true, FinishReason::kStop,
                         cancelled ? std::nullopt
                                   : std::optional<ApiError>(Refused(504, "server_error", "timeout",
                                                                     "the request waited past its timeout")));
          queue_.pop_front();
          continue;
        }
        break;
      }
      if (queue_.empty()) break;
      job = queue_.front();
    }
    if (!AdmitOne(job)) break;  // no slot or no room: it keeps its place at the head
    std::lock_guard<std::mutex> lock(mu_);
    queue_.pop_front();
    metrics_->queued_requests = static_cast<int64_t>(queue_.size());
  }
}

bool Engine::AdmitOne(const std::shared_ptr<Job>& job) {
  const std::vector<int32_t>& prompt = job->spec.prompt;
  // The idle slot whose cache shares the longest prefix with the prompt (ties: least recently used).
  Slot* best = nullptr;
  size_t best_common = 0;
  for (Slot& s : slots_) {
    if (s.job) continue;
    const size_t common = CommonPrefix(s.session->tokens(), prompt);
    if (best == nullptr || common > best_common || (common == best_common && s.last_used < best->last_used)) {
      best = &s;
      best_common = common;
    }
  }
  if (best == nullptr) return false;
  // A hybrid model's recurrent state cannot roll back: only a cache that is wholly a prefix of the
  // prompt is reused (a shorter cut would recompute everything before it, so counts as a miss).
  const bool fixed_state = model_.info().state_bytes > 0;
  // A running request still prefilling a prompt that shares more with this one: wait for its
  // prefix (this job keeps the queue's head), then fork it, rather than compute it twice.
  if (WaitsForRunningPrefix(prompt, best_common, fixed_state)) return false;
  const Donor donor = FindDonor(*best, prompt, fixed_state);
  // A fork holds the donor's pages of the shared prefix once: its reservation is what it adds.
  const int64_t borrowed = donor.slot != nullptr ? KvBytesFor(static_cast<int64_t>(donor.shared)) -
                                                       model_.info().state_bytes
                                                 : 0;
  const int64_t need = job->kv_reserved_bytes - borrowed;  // what a fork adds
  // Room in the total budget: idle sessions' caches are evicted, least recently used first. A
  // cache sharing pages with another session frees less than it holds, so it is left alone.
  if (options_.kv_budget_bytes > 0) {
    int64_t reserved = ReservedBytes() - SlotReservedBytes(*best);
    std::vector<Slot*> idle;
    for (Slot& s : slots_) {
      if (!s.job && &s != best && (s.session->positions() > 0 || s.draft) &&
          s.session->kv_page_bytes_held() == s.session->kv_page_bytes_unshared()) {
        idle.push_back(&s);
      }
    }
    std::sort(idle.begin(), idle.end(), [](const Slot* a, const Slot* b) { return a->last_used < b->last_used; });
    for (Slot* s : idle) {
      if (reserved + need <= options_.kv_budget_bytes) break;
      // Its KV only (a session always holds the model's state), and its draft session whole.
      reserved -= s->session->kv_bytes() + DraftBytes(*s);
      (void)s->session->Clear();
      s->draft.reset();
    }
    if (reserved + need > options_.kv_budget_bytes) return false;
  }
  FitDraftSession(*best, *job);
  // Never reuse all of the prompt: its last token runs again, for the logits.
  size_t reuse = std::min(best_common, prompt.size() - 1);
  bool from_disk = false;
  if (donor.slot != nullptr && ForkFrom(*best, *donor.slot, donor.shared)) {
    reuse = static_cast<size_t>(best->session->positions());
    best->from_disk = false;
  }
  Session& session = *best->session;
  // A snapshot that shares at least a prefill block more than the session does is loaded (loading
  // reads the whole snapshot, so a few tokens more are cheaper to recompute); one refused
  // (damaged) is gone from the store after Load, so the next best is tried.
  while (prefix_store_) {
    auto match = prefix_store_->Find(prompt);
    if (!match || std::min(match->second, prompt.size() - 1) < reuse + kPrefillBlock) break;
    const size_t shared = std::min(match->second, prompt.size() - 1);
    if (fixed_state && match->first->ids.size() > shared) break;
    if (prefix_store_->Load(*match->first, session).ok()) {
      metrics_->prefix_store_bytes_read_disk += match->first->bytes;
      reuse = shared;
      from_disk = true;
      break;
    }
    metrics_->prefix_snapshots_refused++;
    reuse = 0;  // Load cleared the session
  }
  if (prefix_store_ && !from_disk) metrics_->prefix_misses_disk++;
  const bool from_shared = shared_store_ && RestoreSharedPrefix(session, prompt, fixed_state, reuse);
  if (shared_store_ && !from_shared) metrics_->prefix_misses_remote++;
  if (fixed_state && static_cast<size_t>(session.positions()) > reuse) {
    (void)session.Clear();
    reuse = 0;
  } else if (static_cast<size_t>(session.positions()) > reuse) {
    if (Status s = session.Truncate(static_cast<int64_t>(reuse)); !s.ok()) {
      Log(LogLevel::kWarning, "serve: truncating a cached prefix failed (" + s.message() + "); starting empty");
      (void)session.Clear();
      reuse = 0;
    }
  }
  reuse = static_cast<size_t>(session.positions());  // what the cache holds now
  from_disk = from_disk || (best->from_disk && reuse > 0);
  best->from_disk = false;
  if (reuse > 0) {
    (from_shared ? metrics_->prefix_hits_remote : from_disk ? metrics_->prefix_hits_disk : metrics_->prefix_hits_live)++;
  } else {
    metrics_->prefix_misses++;
  }
  metrics_->prompt_tokens += static_cast<int64_t>(prompt.size());
  metrics_->prompt_tokens_reused += static_cast<int64_t>(reuse);
  {
    std::lock_guard<std::mutex> lock(job->mu);
    job->usage.cached_tokens = static_cast<int64_t>(reuse);
  }
  session.SetSampler(job->spec.sampling);
  best->job = job;
  best->pending.assign(prompt.begin() + static_cast<ptrdiff_t>(reuse), prompt.end());
  best->next_token = -1;
  best->last_used = step_;
  return true;
}

void Engine::Step() {
  ++step_;
  std::vector<BatchItem> items;
  std::vector<Slot*> in_batch;
  std::vector<int32_t> chunk_sizes;
  std::vector<Slot*> model_drafts;  // decoding slots whose draft is the draft model's
  int32_t prefill_budget = options_.max_prefill_tokens_per_step;
  for (Slot& s : slots_) {
    if (!s.job) continue;
    bool cancelled = false;
    {
      std::lock_guard<std::mutex> lock(s.job->mu);
      cancelled = s.job->cancelled;
    }
    if (cancelled) {
      const kvq::FinishReason reason =
          s.job->generator ? s.job->generator->Cancel().finish : kvq::FinishReason::kCancelled;
      Finish(s, OpenAiFinishReason(reason));
      continue;
    }
    if (Clock::now() > s.job->spec.deadline) {
      Finish(s, FinishReason::kLength, Refused(504, "server_error", "timeout", "the request ran past its timeout"));
      continue;
    }
    if (!s.pending.empty()) {
      // A chunk of the prompt per step (any cut gives the bits of running the prompt alone).
      const int32_t n = std::min<int32_t>(kPrefillBlock, static_cast<int32_t>(s.pending.size()));
      if (n > prefill_budget && !items.empty()) continue;  // next step: decodes stay short
      prefill_budget -= n;
      items.push_back({.session = s.session.get(), .tokens = std::span<const int32_t>(s.pending.data(), n)});
      chunk_sizes.push_back(n);
    } else if (s.next_token >= 0) {
      // The token, and its draft when the request speculates; draft-model drafts below.
      if (PrepareDraft(s)) model_drafts.push_back(&s);
      items.push_back({.session = s.session.get()});  // its pass, once drafted
      chunk_sizes.push_back(0);
    } else {
      continue;
    }
    in_batch.push_back(&s);
  }
  if (items.empty()) return;
  DraftWithModel(model_drafts);  // every slot's draft-model draft in the same passes of it
  for (size_t i = 0; i < in_batch.size(); ++i) {
    if (chunk_sizes[i] == 0) items[i] = {.session = in_batch[i]->session.get(), .tokens = in_batch[i]->pass,
                                         .logits_at = in_batch[i]->rows};
  }
  const auto t0 = Clock::now();
  const Status st = Session::RunBatch(items);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  metrics_->steps++;
  metrics_->step_seconds_total = metrics_->step_seconds_total.load() + seconds;
  if (!st.ok()) {
    Log(LogLevel::kError, "serve: a batched step failed: " + st.message());
    for (Slot* s : in_batch) {
      Finish(*s, FinishReason::kStop, Refused(500, "server_error", "", "generation failed: " + st.message()));
    }
    return;
  }
  int64_t decoded = 0;
  for (size_t i = 0; i < in_batch.size(); ++i) {
    Slot& s = *in_batch[i];
    s.last_used = step_;
    if (chunk_sizes[i] > 0) {
      s.pending.erase(s.pending.begin(), s.pending.begin() + chunk_sizes[i]);
      if (!s.pending.empty()) continue;
      Advance(s);
    } else {
      decoded += 1 + AdvanceDrafted(s, seconds);  // the token run, and the drafted ones kept
    }
  }
  // tokens per second over this step, smoothed (a gauge for dashboards, not a benchmark)
  if (decoded > 0 && seconds > 0) {
    const double rate = static_cast<double>(decoded) / seconds;
    const double old = metrics_->decode_tokens_per_second.load();
    metrics_->decode_tokens_per_second = old == 0 ? rate : 0.9 * old + 0.1 * rate;
  }
}

void Engine::SavePrefix(Slot& slot) {
  // The prompt and the reply but its last token (sampled, not run); a later prompt that extends
  // any prefix of it is truncated to what it shares, less its own last token, which runs again.
  if (slot.session->positions() < options_.min_prefix_tokens) return;
  if (prefix_store_) {
    Result<bool> saved = prefix_store_->Save(*slot.session);
    if (!saved.ok()) {
      Log(LogLevel::kWarning, "serve: " + saved.status().message());
    } else if (*saved) {
      metrics_->prefix_snapshots_saved++;
      for (const PrefixStore::Entry* e : prefix_store_->Newest(1)) metrics_->prefix_store_bytes_written_disk += e->bytes;
    }
  }
  if (shared_store_) SaveShared(slot);
}


void Engine::Advance(Slot& slot) {
  Job& job = *slot.job;
  if (!job.generator) {  // the prompt has just run: the completion starts after it
    Result<Generator> made = Generator::Create(*slot.session, job.Rules());
    if (!made.ok()) {
      Finish(slot, FinishReason::kStop, Refused(500, "server_error", "", made.status().message()));
      return;
    }
    job.generator = std::move(made).value();
    if (!job.followers.empty()) StartFollowers(slot);
  }
  const Result<int32_t> token = Draw(slot, slot.session->logits());
  if (!token.ok()) {
    Finish(slot, FinishReason::kStop, Refused(500, "server_error", "", token.status().message()));
    return;
  }
  const std::span<const int32_t> held = slot.session->tokens();
  const GeneratorStep step = Take(slot, *token, slot.session->logits(), held.empty() ? -1 : held.back());
  if (step.finished) {
    Finish(slot, OpenAiFinishReason(step.finish));
    return;
  }
  slot.next_token = *token;  // step.run: the next step runs it
}

void Engine::Finish(Slot& slot, FinishReason reason, std::optional<ApiError> error) {
  const bool failed = error.has_value();
  // Followers whose leader ended before its prompt ran start on their own.
  if (!slot.job->followers.empty()) {
    QueueFront(std::move(slot.job->followers));
    slot.job->followers.clear();
  }
  const std::shared_ptr<Job> job = std::move(slot.job);
  slot.pending.clear();
  slot.next_token = -1;
  if (failed) (void)slot.session->Clear();  // what it holds is not known to be whole
  // The slot is idle before the answer goes out, so /slots and /metrics read right after a reply
  // already say so.
  PublishMetrics();
  job->Publish("", true, reason, std::move(error));
  // The answer is out: now the session's cache (prompt and reply) goes to the prefix store, where a
  // request extending it — the same prompt, or the next turn of the conversation — finds it.
  if (!failed) SavePrefix(slot);
  if (!failed && job->drafter) {  // what its gate learnt, for the slot's next request
    slot.gate = job->drafter->gate();
    slot.gate_key = SpeculationGateKey(job->drafter->options());
  }
  if (!failed && suffix_index_) {  // later requests' suffix drafts may continue what this one wrote
    suffix_index_->Add(slot.session->tokens());
    metrics_->spec_index_tokens = suffix_index_->tokens();
  }
}

void Engine::PublishMetrics() {
  int64_t active = 0, bytes = 0, device = 0, draft_bytes = 0, draft_device = 0, draft_reserved = 0;
  std::vector<SlotState> states;
  for (const Slot& s : slots_) {
    active += s.job ? 1 : 0;
    bytes += s.session->kv_bytes();
    device += s.session->kv_plan().device_bytes;
    if (s.draft) {
      draft_bytes += s.draft->kv_bytes();
      draft_device += s.draft->kv_plan().device_bytes;
    }
    draft_reserved += s.job ? s.job->kv_reserved_draft_bytes : DraftBytes(s);
    SlotState& state = states.emplace_back(SlotState{.id = static_cast<int32_t>(states.size()),
                                                     .positions = s.session->positions(),
                                                     .context = s.session->context(),
                                                     .kv_bytes = s.session->kv_bytes(),
                                                     .draft_kv_bytes = s.draft ? s.draft->kv_bytes() : 0,
                                                     .kv_reserved_bytes = SlotReservedBytes(s)});
    if (s.job) {
      state.state = s.pending.empty() ? "generating" : "prompt";
      state.prompt_tokens = static_cast<int64_t>(s.job->spec.prompt.size());
      state.prompt_tokens_left = static_cast<int64_t>(s.pending.size());
      std::lock_guard<std::mutex> lock(s.job->mu);
      state.reused_tokens = s.job->usage.cached_tokens;
      state.generated_tokens = s.job->generator ? static_cast<int64_t>(s.job->generator->tokens().size()) : 0;
    }
  }
  {
    std::lock_guard<std::mutex> lock(slot_states_mu_);
    slot_states_ = std::move(states);
  }
  metrics_->active_sessions = active;
  // Draft sessions' KV under their own tiers' names.
  const bool draft_on_disk = !options_.speculation.draft_kv.budgets.disk_dir.empty();
  const bool on_disk = !options_.kv.budgets.disk_dir.empty();
  metrics_->kv_bytes_host = (on_disk ? 0 : bytes) + (draft_on_disk ? 0 : draft_bytes);
  metrics_->kv_bytes_disk = (on_disk ? bytes : 0) + (draft_on_disk ? draft_bytes : 0);
  metrics_->kv_bytes_device = device + draft_device;
  metrics_->kv_bytes_draft = draft_bytes;
  metrics_->kv_bytes_reserved_draft = draft_reserved;
  const int64_t reserved = ReservedBytes();
  metrics_->kv_bytes_reserved = reserved;
  metrics_->kv_bytes_capacity = KvCapacityBytes();
  if (prefix_store_) {
    metrics_->kv_bytes_folder = prefix_store_->bytes();
    metrics_->kv_bytes_folder_capacity = prefix_store_->max_bytes();
  }
  if (reserved > metrics_->kv_bytes_reserved_peak.load()) metrics_->kv_bytes_reserved_peak = reserved;
  PublishBlocks();
}

}  // namespace kvq::server
