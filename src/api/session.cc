// Session (see include/kvq/session.h): Prefill/Decode over LlamaModel::ForwardBlock and the cache,
// Generate through generate/Generate (the loop `kvq run` uses, so their outputs agree), and the
// cache operations (truncate, clear, snapshots).
#include <fmt/format.h>

#include <algorithm>

#include "api/api_internal.h"
#include "generate/generate.h"
#include "kvq/format.h"

namespace kvq {
namespace {
constexpr int32_t kPrefillBlock = 64;  // tokens per ForwardBlock, as generate.cc's prefill
}  // namespace

Session::Impl::Impl(std::shared_ptr<const Model::Impl> m, KvCacheConfig config, std::unique_ptr<KvCache> c)
    : model(std::move(m)), llama(model->weights, model->options.threads), cache_config(std::move(config)),
      cache(std::move(c)), sampler(sampler_options) {}

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::~Session() = default;

Status Session::Prefill(std::span<const int32_t> ids) {
  Impl& s = *impl_;
  const int32_t vocab = s.model->info.vocab_size;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return Status::Error(fmt::format("Prefill: token {} at index {} is outside the vocabulary [0, {})", ids[i],
                                       i, vocab));
    }
  }
  const int64_t pos0 = positions();
  if (pos0 + static_cast<int64_t>(ids.size()) > context()) {
    return Status::Error(fmt::format("Prefill: the session holds {} positions and its context is {}; {} more "
                                     "tokens do not fit", pos0, context(), ids.size()));
  }
  if (ids.empty()) return Status::Ok();
  s.logits.resize(vocab);
  for (size_t done = 0; done < ids.size();) {
    const int32_t n = static_cast<int32_t>(std::min<size_t>(kPrefillBlock, ids.size() - done));
    const int64_t pos = pos0 + static_cast<int64_t>(done);
    if (Status st = s.llama.ForwardBlock(ids.data() + done, n, pos, *s.cache, s.logits.data()); !st.ok()) {
      // Some layers may hold part of the block: start over rather than guess what the cache holds.
      (void)Clear();
      return Status::Error(st.message() + " (the session was cleared)");
    }
    s.tokens.insert(s.tokens.end(), ids.begin() + done, ids.begin() + done + n);
    done += n;
  }
  return Status::Ok();
}

Status Session::Decode(int32_t token) { return Prefill(std::span<const int32_t>(&token, 1)); }

std::span<const float> Session::logits() const { return impl_->logits; }
std::span<const int32_t> Session::tokens() const { return impl_->tokens; }
int64_t Session::positions() const { return static_cast<int64_t>(impl_->tokens.size()); }
int64_t Session::context() const { return impl_->cache_config.max_positions; }

int64_t Session::kv_bytes() const {
  const Impl& s = *impl_;
  const KvCacheConfig& c = s.cache_config;
  int64_t bytes = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerFormats& f = c.layers.size() == 1 ? c.layers[0] : c.layers[l];
    bytes += SpecBytesForRows(f.key->key, f.key_transforms, {c.n_kv_heads, c.head_dim}, s.cache->positions(l)) +
             SpecBytesForRows(f.value->value, f.value_transforms, {c.n_kv_heads, c.head_dim}, s.cache->positions(l));
  }
  return bytes;
}

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

}  // namespace kvq
