// Session (see include/kvq/session.h): Prefill/Decode/RunBatch over LlamaModel::ForwardBatch and
// the caches, Generate through generate/Generate (the loop `kvq run` uses, so their outputs agree),
// and the cache operations (truncate, clear, snapshots).
#include <fmt/format.h>

#include <algorithm>

#include "api/api_internal.h"
#include "generate/generate.h"
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
  Impl& s = *impl_;
  const Tokenizer& tokenizer = s.model->tokenizer;
  std::vector<int32_t> prompt_ids = tokenizer.Encode(prompt, tokenizer.add_bos());
  if (prompt_ids.empty()) {
    return Status::Error("Generate: the prompt is empty and this vocabulary adds no BOS token");
  }
  if (static_cast<int64_t>(prompt_ids.size()) > context()) {  // refused before the cache is touched
    return Status::Error(fmt::format("Generate: the prompt is {} tokens but the session's context is {}",
                                     prompt_ids.size(), context()));
  }
  // Reuse what the session holds when it is a prefix of the prompt (never all of the prompt: the
  // last prompt token is run again, for its logits); otherwise start from an empty cache, so the
  // prefill is cut into blocks exactly as `kvq run` cuts it.
  const size_t held = s.tokens.size();
  const bool reuse = held < prompt_ids.size() && std::equal(s.tokens.begin(), s.tokens.end(), prompt_ids.begin());
  if (!reuse && held > 0) {
    if (Status st = Clear(); !st.ok()) return st;
  }
  GenerateOptions options{.prompt = std::string(prompt), .prompt_tokens = std::move(prompt_ids),
                          .n_new = request.max_tokens, .sampling = request.sampling, .on_token = on_token};
  Result<GenerateResult> r = kvq::Generate(s.llama, tokenizer, *s.cache, options, {}, s.tokens);
  if (!r.ok()) {
    // The cache may have grown before the error: start over rather than guess what it holds.
    (void)Clear();
    return r.status();
  }
  Completion c;
  c.tokens.assign(r->tokens.begin() + r->n_prompt, r->tokens.end());
  c.text = r->completion;
  c.n_prompt = r->n_prompt;
  c.n_reused = r->n_reused;
  c.prompt_seconds = r->prompt_seconds;
  c.decode_seconds = r->decode_seconds;
  const int32_t generated = static_cast<int32_t>(c.tokens.size());
  if (r->cancelled) {
    c.stop = StopReason::kCancelled;
  } else if (request.max_tokens >= 0 && generated >= request.max_tokens) {
    c.stop = StopReason::kMaxTokens;
  } else if (static_cast<int64_t>(r->tokens.size()) > context()) {
    c.stop = StopReason::kContextFull;
  } else {
    c.stop = StopReason::kEndOfGeneration;
  }
  s.tokens.assign(r->tokens.begin(), r->tokens.begin() + r->n_cached);
  s.logits = std::move(r.value().logits);
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
