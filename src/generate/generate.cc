// Generate (see generate.h). Prefill runs the prompt in blocks (weights read once per block,
// K and V appended as blocks); decoding is one token per forward pass.
#include "generate/generate.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

namespace kvq {

Result<GenerateResult> Generate(LlamaModel& model, const Tokenizer& tokenizer, KvCache& cache,
                                const GenerateOptions& o,
                                const std::function<void(const std::string&)>& on_piece,
                                const std::vector<int32_t>& cached_tokens) {
  using Clock = std::chrono::steady_clock;
  GenerateResult r;
  r.tokens = o.prompt_tokens.empty() ? tokenizer.Encode(o.prompt, tokenizer.add_bos()) : o.prompt_tokens;
  r.n_prompt = static_cast<int32_t>(r.tokens.size());
  if (r.n_prompt == 0) {
    return Status::Error("the prompt is empty and this vocabulary adds no BOS token: give a prompt (-p)");
  }
  const int64_t context = cache.config().max_positions;
  if (r.n_prompt > context) {
    return Status::Error(fmt::format("the prompt is {} tokens but the context is {} (-c)", r.n_prompt, context));
  }
  r.n_reused = static_cast<int32_t>(cache.positions(0));
  if (r.n_reused >= r.n_prompt || static_cast<int32_t>(cached_tokens.size()) != r.n_reused ||
      !std::equal(cached_tokens.begin(), cached_tokens.end(), r.tokens.begin())) {
    if (r.n_reused > 0) {
      return Status::Error(fmt::format("the cache holds {} positions that are not a proper prefix of "
                                       "the prompt's {} tokens", r.n_reused, r.n_prompt));
    }
  }
  std::vector<float> logits(model.config().vocab_size);
  Sampler sampler(o.sampling);
  const auto t0 = Clock::now();
  // Prefill in blocks of up to kPrefillBlock tokens; a block always ends before the last prompt
  // token, so the cache holds exactly the prompt-cache prefix when on_prefix runs.
  constexpr int32_t kPrefillBlock = 64;
  for (int32_t pos = r.n_reused; pos < r.n_prompt;) {
    const int32_t end = pos < r.n_prompt - 1 ? std::min(r.n_prompt - 1, pos + kPrefillBlock) : r.n_prompt;
    if (pos == r.n_prompt - 1 && o.on_prefix && pos > r.n_reused) {
      const std::vector<int32_t> prefix(r.tokens.begin(), r.tokens.begin() + pos);
      if (Status s = o.on_prefix(prefix); !s.ok()) return s;
    }
    if (Status s = model.ForwardBlock(r.tokens.data() + pos, end - pos, pos, cache, logits.data()); !s.ok()) {
      return s;
    }
    pos = end;
  }
  const auto t1 = Clock::now();
  r.prompt_seconds = std::chrono::duration<double>(t1 - t0).count();
  int64_t pos = r.n_prompt;
  for (int32_t produced = 0; o.n_new < 0 || produced < o.n_new; ++produced) {
    const int32_t next = sampler.Sample(logits.data(), model.config().vocab_size);
    if (tokenizer.IsEndOfGeneration(next) || next == tokenizer.bos()) break;
    const std::string piece = tokenizer.Decode(r.tokens.back(), next);
    r.tokens.push_back(next);
    r.completion += piece;
    if (on_piece) on_piece(piece);
    if (o.on_token && !o.on_token(next, piece)) {
      r.cancelled = true;
      break;
    }
    if (pos >= context || (o.n_new >= 0 && produced + 1 >= o.n_new)) break;  // no forward needed
    if (Status s = model.Forward(next, pos, cache, logits.data()); !s.ok()) return s;
    ++pos;
    ++r.n_decoded;
  }
  r.decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  r.n_cached = cache.positions(0);
  r.logits = std::move(logits);
  return r;
}

}  // namespace kvq
