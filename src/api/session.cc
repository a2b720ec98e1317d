// Session (see include/kvq/session.h): Prefill/Decode/RunBatch over DecoderModel::ForwardBatch and
// the caches, Generate (Prefill, then sample, Generator, Decode: the loop `kvq run` runs too), and
// the cache operations (truncate, clear, snapshots).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <climits>

#include "api/api_internal.h"
#include "kvq/format.h"
#include "kvq/prefix_reuse.h"

namespace kvq {
namespace {

void DropCheckpoint(Session::Impl& s) {
  s.checkpoint.clear();
  s.checkpoint.shrink_to_fit();
  s.checkpoint_at = -1;
}

}  // namespace

Session::Impl::Impl(std::shared_ptr<const Model::Impl> m, KvCacheConfig config, std::unique_ptr<KvCache> c)
    : model(std::move(m)), llama(model->weights, model->options.threads), cache_config(std::move(config)),
      cache(std::move(c)), sampler(sampler_options) {}

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::~Session() = default;

Status Session::Decode(int32_t token) { return Prefill(std::span<const int32_t>(&token, 1)); }

std::span<const float> Session::logits() const { return impl_->logits; }
std::span<const float> Session::chosen_logits() const { return impl_->chosen_logits; }
std::span<const int32_t> Session::tokens() const { return impl_->tokens; }
int64_t Session::positions() const { return static_cast<int64_t>(impl_->tokens.size()); }
int64_t Session::context() const { return impl_->cache_config.max_positions; }

int64_t Session::kv_bytes() const { return impl_->cache->bytes(); }

const KvTierPlan& Session::kv_plan() const { return impl_->cache->plan(); }

Status Session::SetThreads(int32_t threads) {
  if (threads < 1 || threads > 1024) {
    return Status::Error(fmt::format("SetThreads: threads must be in 1..1024 (got {})", threads));
  }
  impl_->llama.set_threads(threads);
  return Status::Ok();
}

int32_t Session::threads() const { return impl_->llama.threads(); }

void Session::SetSampler(const SamplerOptions& options) {
  impl_->sampler_options = options;
  impl_->sampler = Sampler(options);
}

Result<int32_t> Session::Sample() {
  Impl& s = *impl_;
  if (s.logits.empty()) return Status::Error("Sample: no logits yet (run a token with Prefill or Decode first)");
  return s.sampler.Sample(s.logits.data(), static_cast<int32_t>(s.logits.size()), s.tokens);
}

Result<int32_t> Session::Sample(std::span<const float> logits) {
  Impl& s = *impl_;
  if (logits.size() != static_cast<size_t>(s.model->info.vocab_size)) {
    return Status::Error(fmt::format("Sample: {} logits given but the vocabulary has {} tokens", logits.size(),
                                     s.model->info.vocab_size));
  }
  return s.sampler.Sample(logits.data(), static_cast<int32_t>(logits.size()), s.tokens);
}

Result<int32_t> Session::Sample(std::span<const float> logits, int64_t unrun) {
  Impl& s = *impl_;
  if (unrun < 0 || unrun > positions()) {
    return Status::Error(fmt::format("Sample: {} unrun tokens given but the session holds {}", unrun, positions()));
  }
  if (logits.size() != static_cast<size_t>(s.model->info.vocab_size)) {
    return Status::Error(fmt::format("Sample: {} logits given but the vocabulary has {} tokens", logits.size(),
                                     s.model->info.vocab_size));
  }
  return s.sampler.Sample(logits.data(), static_cast<int32_t>(logits.size()),
                          std::span<const int32_t>(s.tokens).first(s.tokens.size() - static_cast<size_t>(unrun)));
}

Status Session::CheckDropsDrafts() const {
  const Impl& s = *impl_;
  if (!s.cache_config.budgets.disk_dir.empty()) {
    return Status::Error(
        "speculative decoding needs a cache that can drop rejected drafts; this one keeps its master on disk "
        "(--kv-disk)");
  }
  if (s.cache_config.state_floats == 0) return Status::Ok();
  for (const LayerFormats& f : s.cache_config.layers) {
    const std::pair<const Codec*, const KvTransforms*> tensors[] = {{&f.key->key, &f.key_transforms},
                                                                     {&f.value->value, &f.value_transforms}};
    for (const auto& [codec, transforms] : tensors) {
      if (codec->rows_per_block > 1 || codec->calibrated || transforms->sinks > 0 || transforms->residual > 0) {
        return Status::Error(fmt::format(
            "speculative decoding on a hybrid model needs KV specs that drop rows one at a time (a rejected "
            "draft is dropped and the recurrent state restored); {}/{} stores rows in groups or keeps sink or "
            "residual rows: use a per-token format such as f16, int8 or int4",
            KvSpecName(f.Key()), KvSpecName(f.Value())));
      }
    }
  }
  return Status::Ok();
}

std::span<const float> Session::recurrent_state() const {
  const KvCache& cache = *impl_->cache;
  if (cache.state_floats() == 0) return {};
  return {cache.state(), static_cast<size_t>(cache.state_floats())};
}

Status Session::Truncate(int64_t n_positions, std::span<const float> state) {
  Impl& s = *impl_;
  if (n_positions < 1 || n_positions > positions()) {
    return Status::Error(fmt::format("Truncate: {} positions asked; the session holds {} (1 at least)", n_positions,
                                     positions()));
  }
  if (Status st = s.cache->Truncate(n_positions, state); !st.ok()) return Status::Error("Truncate: " + st.message());
  s.tokens.resize(n_positions);
  if (s.checkpoint_at > n_positions) DropCheckpoint(s);
  s.logits.clear();
  s.chosen_logits.clear();
  return Status::Ok();
}

Status Session::Clear() {
  Impl& s = *impl_;
  Result<std::unique_ptr<KvCache>> cache = KvCache::Create(s.cache_config);
  if (!cache.ok()) return cache.status();
  s.cache = std::move(cache).value();
  s.tokens.clear();
  DropCheckpoint(s);
  s.logits.clear();
  s.chosen_logits.clear();
  return Status::Ok();
}

int64_t PositionsToKeep(std::span<const int32_t> held, std::span<const int32_t> prompt) {
  const size_t common = std::mismatch(held.begin(), held.end(), prompt.begin(), prompt.end()).first - held.begin();
  return static_cast<int64_t>(std::min(common, prompt.empty() ? 0 : prompt.size() - 1));
}

Result<int64_t> Session::KeepCommonPrefix(std::span<const int32_t> prompt) {
  const std::span<const int32_t> held = tokens();
  const int64_t keep = PositionsToKeep(held, prompt);
  if (keep == static_cast<int64_t>(held.size())) return keep;
  if (Status st = Truncate(keep); !st.ok()) {
    // A cache that cannot be cut (e.g. a recurrent state) is recomputed from the start.
    if (Status c = Clear(); !c.ok()) return c;
  }
  return positions();
}

void Session::SaveCheckpoint() {
  Impl& s = *impl_;
  const std::span<const float> state = recurrent_state();
  if (state.empty() || s.tokens.empty()) return;
  s.checkpoint.assign(state.begin(), state.end());
  s.checkpoint_at = positions();
}

int64_t Session::checkpoint_positions() const { return impl_->checkpoint_at; }
int64_t Session::positions_run() const { return impl_->positions_run; }

Status Session::Truncate(int64_t n_positions) {
  if (n_positions < 0 || n_positions > positions()) {
    return Status::Error(fmt::format("Truncate: {} positions asked; the session holds {}", n_positions, positions()));
  }
  if (n_positions == positions()) return Status::Ok();
  Impl& s = *impl_;
  if (s.checkpoint_at > n_positions) DropCheckpoint(s);
  // Drop positions in place up to the nearest exact point (per-token formats: n_positions itself;
  // a recurrent state: its checkpoint, else nothing), then recompute the rest from their ids.
  int64_t kept = s.cache->TruncationPoint(n_positions);
  const std::vector<int32_t> held(s.tokens.begin(), s.tokens.begin() + n_positions);  // Clear drops s.tokens
  Status st = Status::Ok();
  // A recurrent state's checkpoint: the state as it was there and the KV rows cut there. A cache
  // whose rows cannot be cut there (grouped formats past their last append) recomputes from the
  // start as without one.
  if (kept < s.checkpoint_at && s.cache->Truncate(s.checkpoint_at, s.checkpoint).ok()) {
    kept = s.checkpoint_at;
  } else {
    st = kept > 0 ? s.cache->Truncate(kept) : Clear();
  }
  const std::span<const int32_t> redo = std::span(held).subspan(static_cast<size_t>(kept));
  if (!st.ok()) {
    (void)Clear();
    return st;
  }
  s.tokens.assign(held.begin(), held.begin() + kept);
  s.logits.clear();
  if (redo.empty()) return Status::Ok();
  // Not abortable: a cache operation ends holding what was asked for.
  const BatchItem item{.session = this, .tokens = redo};
  return RunItems(std::span<const BatchItem>(&item, 1), "Truncate", Abortable::kNo);
}

Result<Completion> Session::Generate(std::string_view prompt, const GenerateRequest& request,
                                     const TokenCallback& on_token) {
  const Tokenizer& tokenizer = impl_->model->tokenizer;
  const std::vector<int32_t> ids = tokenizer.Encode(prompt, tokenizer.add_bos());
  if (ids.empty()) return Status::Error("Generate: the prompt is empty and this vocabulary adds no BOS token");
  return Generate(std::span<const int32_t>(ids), request, on_token);
}

Result<Completion> Session::Generate(std::span<const int32_t> prompt_ids, const GenerateRequest& request,
                                     const TokenCallback& on_token) {
  using Clock = std::chrono::steady_clock;
  Impl& s = *impl_;
  // A copy: the caller's span may be this session's own tokens(), which Clear and Prefill change.
  const std::vector<int32_t> copy(prompt_ids.begin(), prompt_ids.end());
  const std::span<const int32_t> prompt(copy);
  // Refused before the cache is touched.
  if (prompt.empty()) return Status::Error("Generate: the prompt has no tokens");
  if (static_cast<int64_t>(prompt.size()) > context()) {
    return Status::Error(fmt::format("Generate: the prompt is {} tokens but the session's context is {}",
                                     prompt.size(), context()));
  }
  const int32_t vocab = s.model->info.vocab_size;
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= vocab) {
      return Status::Error(fmt::format("Generate: prompt token {} at index {} is outside the vocabulary [0, {})",
                                       prompt[i], i, vocab));
    }
  }
  const GeneratorOptions rules{.max_tokens = request.max_tokens, .stop = request.stop,
                               .ignore_eos = request.ignore_eos, .grammar = request.grammar,
                               .preserved_tokens = request.preserved_tokens};
  if (Status st = Generator::Check(rules); !st.ok()) return Status::Error("Generate: " + st.message());
  if (request.speculation.source != DraftSource::kNone) {
    if (Status st = CheckSpeculation(request.speculation); !st.ok()) return Status::Error("Generate: " + st.message());
    // A rejected draft is dropped from the cache: positions must be droppable in place (a hybrid
    // restores its state saved before the pass).
    if (Status st = CheckDropsDrafts(); !st.ok()) return Status::Error("Generate: " + st.message());
    if (request.speculation.source == DraftSource::kModel) {
      if (Status st = PrepareDraftSession(request.speculation, s); !st.ok()) return Status::Error("Generate: " + st.message());
    }
  }
  // Reuse what the session holds when it is a prefix of the prompt (never all of the prompt: the
  // last prompt token is run again, for its logits); otherwise start from an empty cache.
  const size_t held = s.tokens.size();
  const bool reuse = held < prompt.size() && std::equal(s.tokens.begin(), s.tokens.end(), prompt.begin());
  if (!reuse && held > 0) {
    if (Status st = Clear(); !st.ok()) return st;
  }
  Completion c;
  c.n_prompt = static_cast<int32_t>(prompt.size());
  c.n_reused = static_cast<int32_t>(s.tokens.size());
  // Any error from here on: the cache may have grown; start over rather than guess what it holds.
  auto failed = [&](const Status& st) -> Result<Completion> {
    (void)Clear();
    return st;
  };
  const auto t0 = Clock::now();
  // Progress through the prompt, block by block, while it runs (the last token's Decode included).
  struct ProgressScope {
    Impl& s;
    ~ProgressScope() { s.after_block = nullptr; }
  } progress_scope{s};
  if (request.on_prompt_progress) {
    s.after_block = [&request, total = static_cast<int64_t>(prompt.size())](int64_t done) {
      request.on_prompt_progress(std::min(done, total), total);
    };
  }
  // Everything but the last token, then the last: the prompt cache below saves exactly the prefix
  // that a later prompt reuses (its last token always runs again, for the logits). The cut
  // changes no bit (KvCache::Attend).
  if (Status st = Prefill(prompt.subspan(s.tokens.size(), prompt.size() - 1 - s.tokens.size())); !st.ok()) {
    if (!s.aborted) return failed(st);
    // Cancelled during the prompt: the session keeps the blocks that ran, which a later Generate
    // of the same prompt reuses.
    c.prompt_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    c.finish = FinishReason::kCancelled;
    return c;
  }
  if (!request.save_prefix.empty() && s.tokens.size() > static_cast<size_t>(c.n_reused)) {
    if (Status st = SavePrefix(request.save_prefix); !st.ok()) {
      return failed(Status::Error("Generate: saving the prompt's prefix: " + st.message()));
    }
  }
  if (Status st = Decode(prompt.back()); !st.ok()) return failed(st);
  s.after_block = nullptr;  // generation's passes are not the prompt's
  if (request.speculation.source == DraftSource::kModel) {  // the draft model reads the prompt too
    if (static_cast<int64_t>(prompt.size()) <= s.draft->context()) {  // else SyncDraft runs nothing
      c.speculation.draft_prompt_tokens = DraftCatchUpTokens(*s.draft, prompt);
    }
    if (Status st = SyncDraft(*s.draft, prompt); !st.ok()) {
      return failed(Status::Error("Generate: the draft model: " + st.message()));
    }
  }
  const auto t1 = Clock::now();
  c.prompt_seconds = std::chrono::duration<double>(t1 - t0).count();

  Result<Generator> generator = Generator::Create(*this, rules);
  if (!generator.ok()) return failed(generator.status());
  Generator& g = generator.value();
  Sampler sampler(request.sampling);
  const SpeculationOptions& spec = request.speculation;
  // The gate the session's last completion left, when its options shape the gate alike.
  const std::string gate_key = spec.source == DraftSource::kNone ? std::string() : SpeculationGateKey(spec);
  c.speculation.gate_resumed = !gate_key.empty() && s.gate.has_value() && s.gate_key == gate_key;
  Drafter drafter(spec, c.speculation.gate_resumed ? &*s.gate : nullptr);
  // A hybrid's recurrent state cannot drop a rejected draft's tokens: it is copied before each pass
  // with a draft, to go back to (KeepDraftedPrefix). checkpoint: [state_floats] the state before the pass.
  std::vector<float> checkpoint;
  std::vector<int32_t> pass;       // [1 + drafted] the next pass: a drawn token, then its draft
  std::vector<int32_t> rows;       // [drafted] logits_at: the rows that judge the draft
  int32_t pending = -1;            // drawn where a draft was rejected: the next pass's first token
  std::vector<float> constrained;  // [vocab] logits as the grammar leaves them (only with one)
  // Draws a token from logits [vocab] after what the generator has kept, as the grammar allows;
  // `unrun` of the tokens the session holds come after those logits (a draft being judged), so
  // the penalties' window ends before them.
  auto draw = [&](const float* logits, size_t unrun) {
    if (g.has_grammar()) {
      constrained.assign(logits, logits + vocab);
      g.Constrain(constrained);
      logits = constrained.data();
    }
    return sampler.Sample(logits, vocab, std::span<const int32_t>(s.tokens).first(s.tokens.size() - unrun));
  };
  while (!g.finished()) {
    if (s.should_abort && s.should_abort()) {  // every token drawn so far has run
      g.Cancel();
      break;
    }
    const int32_t token = pending >= 0 ? pending : draw(s.logits.data(), 0);
    pending = -1;
    // Hands a drawn token to the generator and the caller; whether it is to run.
    auto keep = [&](int32_t id) {
      GeneratorStep step = g.Next(id);
      if (on_token && (step.kept || !step.text.empty()) && !on_token(id, step.text)) {
        if (!step.finished) step = g.Cancel();
      }
      return step.run;
    };
    if (!keep(token)) break;
    pass.assign(1, token);
    int32_t drafted = 0;
    bool gated = false;
    if (spec.source != DraftSource::kNone) {
      // A draft fits what the generator can still keep and the context can still hold.
      const int64_t room = std::min<int64_t>(context() - positions() - 1,
                                             request.max_tokens < 0 ? INT32_MAX : request.max_tokens - g.tokens().size());
      const int32_t most = static_cast<int32_t>(std::clamp<int64_t>(room, 0, spec.max_draft));
      s.tokens.push_back(token);  // the sequence the draft continues (popped at once)
      Result<Drafter::Draft> draft = drafter.Next(s.tokens, most, s.draft.get());
      s.tokens.pop_back();
      if (!draft.ok()) return failed(Status::Error("Generate: the draft model: " + draft.status().message()));
      drafted = static_cast<int32_t>(draft->tokens.size());
      gated = draft->gated;
      pass.insert(pass.end(), draft->tokens.begin(), draft->tokens.end());
    }
    rows.resize(drafted);
    for (int32_t i = 0; i < drafted; ++i) rows[i] = i;
    // The verify pass alone: a draft model's passes are timed by the drafter
    // (SpeculationGate::RecordDraftSeconds). Timed with them, every pass the gate saw carried the
    // draft's cost, and so did the 1-token pass it estimates from them before it has run one.
    const auto pass_start = Clock::now();
    const int64_t before = positions();
    if (drafted > 0 && s.cache->state_floats() > 0) {
      checkpoint.assign(s.cache->state(), s.cache->state() + s.cache->state_floats());
    }
    if (Status st = Prefill(pass, rows); !st.ok()) return failed(st);
    // Kept while the drawn tokens agree with the draft; the first that differs runs next.
    const Result<DraftJudgement> judged = JudgeDraft(
        pass, s.chosen_logits, vocab,
        [&](std::span<const float> row, int64_t unrun) -> Result<int32_t> {
          return draw(row.data(), static_cast<size_t>(unrun));
        },
        [&](int32_t id, std::span<const float>, int32_t) { return keep(id); });
    if (!judged.ok()) return failed(judged.status());
    pending = judged->drawn;
    const int32_t ran = 1 + judged->accepted;
    if (Status st = KeepDraftedPrefix(*this, before, pass, ran, checkpoint); !st.ok()) return failed(st);
    drafter.Record(drafted, judged->matched(), std::chrono::duration<double>(Clock::now() - pass_start).count(), gated,
                   judged->ended);
    c.speculation.passes += 1;
    c.speculation.drafted += drafted;
    c.speculation.accepted += judged->matched();
    c.speculation.gated += gated ? 1 : 0;
  }
  c.decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  if (!gate_key.empty()) {
    s.gate = drafter.gate();
    s.gate_key = gate_key;
  }
  c.tokens.assign(g.tokens().begin(), g.tokens().end());
  c.text = g.text();
  c.finish = g.finish_reason();
  return c;
}

Status Session::SavePrefix(const std::string& path) const {
  return impl_->cache->Save(path, impl_->model->fingerprint(), impl_->tokens);
}

Result<int64_t> Session::LoadPrefix(const std::string& path) {
  Impl& s = *impl_;
  Result<std::vector<int32_t>> ids = s.cache->Load(path, s.model->fingerprint());
  if (!ids.ok()) return ids.status();
  if (static_cast<int64_t>(ids->size()) != s.cache->positions(0)) {
    // A snapshot saved without its ids (not by SavePrefix): the cache holds positions we cannot name.
    const int64_t held = s.cache->positions(0);
    (void)Clear();
    return Status::Error(fmt::format("{}: the snapshot holds {} positions but {} token ids; it was not saved by "
                                     "SavePrefix", path, held, ids->size()));
  }
  s.tokens = std::move(ids).value();
  DropCheckpoint(s);
  s.logits.clear();
  s.chosen_logits.clear();
  return positions();
}

Result<std::unique_ptr<Session>> Session::Fork() const {
  const Impl& s = *impl_;
  Result<std::unique_ptr<KvCache>> cache = s.cache->Fork();
  if (!cache.ok()) return cache.status();
  auto impl = std::make_unique<Impl>(s.model, s.cache_config, std::move(cache).value());
  impl->tokens = s.tokens;
  impl->logits = s.logits;
  impl->sampler_options = s.sampler_options;
  impl->sampler = s.sampler;
  impl->gate = s.gate;  // the fork goes on from the same sequence: its gate too
  impl->gate_key = s.gate_key;
  // The draft model's session, so the fork drafts without running the prompt again. One that
  // cannot be forked is left out: the fork's first Generate then runs the prompt through the draft.
  Result<std::unique_ptr<Session>> draft =
      s.draft != nullptr ? s.draft->Fork() : Result<std::unique_ptr<Session>>(Status::Error("no draft session"));
  if (draft.ok()) {
    impl->draft = std::move(draft).value();
    impl->draft_model = s.draft_model;
    impl->draft_kv_key = s.draft_kv_key;
    impl->draft_kv_value = s.draft_kv_value;
    impl->draft_kv_context = s.draft_kv_context;
  }
  return std::unique_ptr<Session>(new Session(std::move(impl)));
}

int64_t Session::kv_page_bytes_held() const { return impl_->cache->page_bytes_held(); }
int64_t Session::kv_page_bytes_unshared() const { return impl_->cache->page_bytes_unshared(); }

}  // namespace kvq
