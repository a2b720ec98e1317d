// Session (see include/kvq/session.h): Prefill/Decode/RunBatch over LlamaModel::ForwardBatch and
// the caches, Generate (Prefill, then sample, Generator, Decode: the loop `kvq run` runs too), and
// the cache operations (truncate, clear, snapshots).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "api/api_internal.h"
#include "kvq/format.h"

namespace kvq {

Session::Impl::Impl(std::shared_ptr<const Model::Impl> m, KvCacheConfig config, std::unique_ptr<KvCache> c)
    : model(std::move(m)), llama(model->weights, model->options.threads), cache_config(std::move(config)),
      cache(std::move(c)), sampler(sampler_options) {}

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::~Session() = default;

Status Session::Prefill(std::span<const int32_t> ids) {
  if (ids.empty()) return Status::Ok();
  const BatchItem one{.session = this, .tokens = ids};
  return RunItems(std::span<const BatchItem>(&one, 1), "Prefill");
}

Status Session::RunBatch(std::span<const BatchItem> items) { return RunItems(items, "RunBatch"); }

Status Session::RunItems(std::span<const BatchItem> items, std::string_view caller) {
  const bool batch = caller == "RunBatch";
  // "Prefill: " or "RunBatch: item 3: ", before what is wrong with the item.
  auto where = [&](size_t i) {
    return batch ? fmt::format("{}: item {}: ", caller, i) : fmt::format("{}: ", caller);
  };
  if (items.empty()) return Status::Error(fmt::format("{}: no items", caller));
  for (size_t i = 0; i < items.size(); ++i) {
    const BatchItem& item = items[i];
    if (item.session == nullptr) return Status::Error(where(i) + "the session is null");
    if (item.tokens.empty()) {
      return Status::Error(where(i) + "no tokens (an item runs at least one)");
    }
    for (size_t j = 0; j < i; ++j) {
      if (items[j].session == item.session) {
        return Status::Error(fmt::format("{}: items {} and {} are the same session", caller, j, i));
      }
    }
    const Impl& s = *item.session->impl_;
    if (s.model.get() != items[0].session->impl_->model.get()) {
      return Status::Error(where(i) + "the session belongs to another model than item 0's");
    }
    const int32_t vocab = s.model->info.vocab_size;
    for (size_t t = 0; t < item.tokens.size(); ++t) {
      if (item.tokens[t] < 0 || item.tokens[t] >= vocab) {
        return Status::Error(where(i) +
                             fmt::format("token {} at index {} is outside the vocabulary [0, {})",
                                         item.tokens[t], t, vocab));
      }
    }
    const int64_t held = item.session->positions();
    if (held + static_cast<int64_t>(item.tokens.size()) > item.session->context()) {
      return Status::Error(
          where(i) + fmt::format("the session holds {} positions and its context is {}; {} more "
                                 "tokens do not fit",
                                 held, item.session->context(), item.tokens.size()));
    }
  }
  // The pass runs on the first session's activations; each segment attends over its own cache.
  LlamaModel& llama = items[0].session->impl_->llama;
  std::vector<ForwardSegment>& segments = items[0].session->impl_->segments;
  constexpr size_t kBlock = kPrefillBlock;
  for (size_t done = 0;; done += kBlock) {  // pass p runs block p of every item that has one
    segments.clear();
    for (const BatchItem& item : items) {
      if (item.tokens.size() <= done) continue;
      Impl& s = *item.session->impl_;
      const int32_t n =
          static_cast<int32_t>(std::min<size_t>(kBlock, item.tokens.size() - done));
      const bool last = done + n == item.tokens.size();  // only the last block's logits are kept
      if (last) s.logits.resize(s.model->info.vocab_size);
      segments.push_back({.tokens = item.tokens.data() + done,
                          .n = n,
                          .pos = static_cast<int64_t>(s.tokens.size()),
                          .cache = *s.cache,
                          .logits = last ? s.logits.data() : nullptr});
    }
    if (segments.empty()) return Status::Ok();
    if (Status st = llama.ForwardBatch(segments); !st.ok()) {
      // Some layers may hold part of a block: start over rather than guess what the caches hold.
      for (const BatchItem& item : items) (void)item.session->Clear();
      return Status::Error(st.message() + (batch ? " (every session of the batch was cleared)"
                                                 : " (the session was cleared)"));
    }
    for (const BatchItem& item : items) {
      if (item.tokens.size() <= done) continue;
      const auto first = item.tokens.begin() + static_cast<std::ptrdiff_t>(done);
      const size_t n = std::min<size_t>(kBlock, item.tokens.size() - done);
      item.session->impl_->tokens.insert(item.session->impl_->tokens.end(), first, first + n);
    }
  }
}

Status Session::Decode(int32_t token) { return Prefill(std::span<const int32_t>(&token, 1)); }

std::span<const float> Session::logits() const { return impl_->logits; }
std::span<const int32_t> Session::tokens() const { return impl_->tokens; }
int64_t Session::positions() const { return static_cast<int64_t>(impl_->tokens.size()); }
int64_t Session::context() const { return impl_->cache_config.max_positions; }

int64_t Session::kv_bytes() const { return impl_->cache->bytes(); }

const KvTierPlan& Session::kv_plan() const { return impl_->cache->plan(); }

void Session::SetSampler(const SamplerOptions& options) {
  impl_->sampler_options = options;
  impl_->sampler = Sampler(options);
}

Result<int32_t> Session::Sample() {
  Impl& s = *impl_;
  if (s.logits.empty()) return Status::Error("Sample: no logits yet (run a token with Prefill or Decode first)");
  return s.sampler.Sample(s.logits.data(), static_cast<int32_t>(s.logits.size()));
}

Status Session::Clear() {
  Impl& s = *impl_;
  Result<std::unique_ptr<KvCache>> cache = KvCache::Create(s.cache_config);
  if (!cache.ok()) return cache.status();
  s.cache = std::move(cache).value();
  s.tokens.clear();
  s.logits.clear();
  return Status::Ok();
}

Status Session::Truncate(int64_t n_positions) {
  if (n_positions < 0 || n_positions > positions()) {
    return Status::Error(fmt::format("Truncate: {} positions asked; the session holds {}", n_positions, positions()));
  }
  if (n_positions == positions()) return Status::Ok();
  Impl& s = *impl_;
  // Drop positions in place up to the nearest exact point (per-token formats: n_positions itself),
  // then recompute the rest from their ids.
  const int64_t kept = s.cache->TruncationPoint(n_positions);
  const std::vector<int32_t> redo(s.tokens.begin() + kept, s.tokens.begin() + n_positions);
  if (Status st = kept > 0 ? s.cache->Truncate(kept) : Clear(); !st.ok()) {
    (void)Clear();
    return st;
  }
  s.tokens.resize(kept);
  s.logits.clear();
  return Prefill(redo);
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
                               .ignore_eos = request.ignore_eos};
  if (Status st = Generator::Check(rules); !st.ok()) return Status::Error("Generate: " + st.message());
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
  // Everything but the last token, then the last: the prompt cache below saves exactly the prefix
  // that a later prompt reuses (its last token always runs again, for the logits). The cut
  // changes no bit (KvCache::Attend).
  if (Status st = Prefill(prompt.subspan(s.tokens.size(), prompt.size() - 1 - s.tokens.size())); !st.ok()) {
    return failed(st);
  }
  if (!request.save_prefix.empty() && s.tokens.size() > static_cast<size_t>(c.n_reused)) {
    if (Status st = SavePrefix(request.save_prefix); !st.ok()) {
      return failed(Status::Error("Generate: saving the prompt's prefix: " + st.message()));
    }
  }
  if (Status st = Decode(prompt.back()); !st.ok()) return failed(st);
  const auto t1 = Clock::now();
  c.prompt_seconds = std::chrono::duration<double>(t1 - t0).count();

  Result<Generator> generator = Generator::Create(*this, rules);
  if (!generator.ok()) return failed(generator.status());
  Generator& g = generator.value();
  Sampler sampler(request.sampling);
  while (!g.finished()) {
    const int32_t token = sampler.Sample(s.logits.data(), vocab);
    GeneratorStep step = g.Next(token);
    if (on_token && (step.kept || !step.text.empty()) && !on_token(token, step.text)) {
      if (!step.finished) step = g.Cancel();
    }
    if (step.run) {
      if (Status st = Decode(token); !st.ok()) return failed(st);
    }
  }
  c.decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
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
  s.logits.clear();
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
  return std::unique_ptr<Session>(new Session(std::move(impl)));
}

int64_t Session::kv_page_bytes_held() const { return impl_->cache->page_bytes_held(); }
int64_t Session::kv_page_bytes_unshared() const { return impl_->cache->page_bytes_unshared(); }

}  // namespace kvq
