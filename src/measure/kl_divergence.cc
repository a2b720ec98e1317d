// kvq against a llama.cpp logits file (see kl_divergence.h): the per-position comparison, the
// summary statistics, and the chunked run. Everything is accumulated in double; the statistics
// are computed from the kept per-position values, so they do not depend on the order of a sum.
#include "measure/kl_divergence.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "kvq/kv_cache.h"
#include "model/cache_config.h"

namespace kvq {
namespace {

// Mean and llama.cpp's uncertainty of the mean: sqrt(var / (n − 1)), 0 for n ≤ 10 or var ≤ 0.
ValueWithError MeanAndError(double sum, double sum2, int64_t n) {
  if (n < 1) return {};
  const double mean = sum / static_cast<double>(n);
  const double var = sum2 / static_cast<double>(n) - mean * mean;
  return {mean, var > 0 && n > 10 ? std::sqrt(var / static_cast<double>(n - 1)) : 0.0};
}

// The covariance of the two means (llama.cpp's, used in the ratio's uncertainty); 0 below 10.
double CovarianceOfMeans(double sum_a, double sum_b, double sum_ab, int64_t n) {
  if (n < 10) return 0;
  const double dn = static_cast<double>(n);
  return (sum_ab / dn - (sum_a / dn) * (sum_b / dn)) / (dn - 1);
}

double At(const std::vector<double>& sorted, double fraction) {
  if (fraction <= 0) return sorted.front();
  if (fraction >= 1) return sorted.back();
  const double x = fraction * static_cast<double>(sorted.size() - 1);
  const size_t i = static_cast<size_t>(x);
  const double t = x - static_cast<double>(i);
  return (1 - t) * sorted[i] + t * sorted[std::min(i + 1, sorted.size() - 1)];
}

std::vector<Quantile> Quantiles(std::vector<double> values, bool quartiles) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  const double median = n % 2 == 0 ? 0.5 * (values[n / 2 - 1] + values[n / 2]) : values[n / 2];
  std::vector<Quantile> q = {{"max", 1.0, values.back()}};
  for (double f : {0.999, 0.99, 0.95, 0.90}) q.push_back({fmt::format("{:.1f}%", 100 * f), f, At(values, f)});
  if (quartiles) q.push_back({"75.0%", 0.75, At(values, 0.75)});
  q.push_back({"median", 0.5, median});
  if (quartiles) q.push_back({"25.0%", 0.25, At(values, 0.25)});
  for (double f : {0.10, 0.05, 0.01, 0.001}) q.push_back({fmt::format("{:.1f}%", 100 * f), f, At(values, f)});
  q.push_back({"min", 0.0, values.front()});
  return q;
}

}  // namespace

KlPosition CompareWithBase(const float* logits, int32_t n_vocab, const LlamaLogProbs& base, int32_t target) {
  int32_t top = 0;
  for (int32_t i = 1; i < n_vocab; ++i) {
    if (logits[i] > logits[top]) top = i;
  }
  const double max_logit = logits[top];
  double sum = 0;
  for (int32_t i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max_logit);
  const double lse = max_logit + std::log(sum);  // log p_i = logit_i − lse

  KlPosition r;
  int32_t top_base = 0;
  for (int32_t i = 0; i < n_vocab; ++i) {
    if (base.code(i) > base.code(top_base)) top_base = i;
    const double lp_base = base.LogProb(i);
    if (lp_base > -16.0) r.kl += std::exp(lp_base) * (lp_base - (static_cast<double>(logits[i]) - lse));
  }
  r.nll = lse - static_cast<double>(logits[target]);
  r.nll_base = -base.LogProb(target);
  r.p_diff = std::exp(-r.nll) - std::exp(-r.nll_base);
  r.same_top = top == top_base;
  return r;
}

KlSummary Summarize(std::span<const KlPosition> positions) {
  KlSummary s;
  const int64_t n = static_cast<int64_t>(positions.size());
  s.count = n;
  if (n == 0) return s;
  double nll = 0, nll2 = 0, base = 0, base2 = 0, cross = 0, kl = 0, kl2 = 0, dp = 0, dp2 = 0, dp4 = 0;
  std::vector<double> kls, dps;
  kls.reserve(positions.size());
  dps.reserve(positions.size());
  for (const KlPosition& p : positions) {
    nll += p.nll, nll2 += p.nll * p.nll;
    base += p.nll_base, base2 += p.nll_base * p.nll_base;
    cross += p.nll * p.nll_base;
    kl += p.kl, kl2 += p.kl * p.kl;
    dp += p.p_diff, dp2 += p.p_diff * p.p_diff, dp4 += p.p_diff * p.p_diff * p.p_diff * p.p_diff;
    s.same_top_count += p.same_top ? 1 : 0;
    kls.push_back(p.kl);
    dps.push_back(p.p_diff);
  }
  const ValueWithError log_ppl = MeanAndError(nll, nll2, n), log_base = MeanAndError(base, base2, n);
  s.ppl = {std::exp(log_ppl.value), std::exp(log_ppl.value) * log_ppl.error};
  s.ppl_base = {std::exp(log_base.value), std::exp(log_base.value) * log_base.error};
  const double cov = CovarianceOfMeans(nll, base, cross, n);
  const double ratio_var = log_ppl.error * log_ppl.error + log_base.error * log_base.error - 2 * cov;
  s.ln_ppl_ratio = {log_ppl.value - log_base.value, ratio_var > 0 ? std::sqrt(ratio_var) : 0.0};
  s.ppl_ratio = {std::exp(s.ln_ppl_ratio.value), std::exp(s.ln_ppl_ratio.value) * s.ln_ppl_ratio.error};
  const double diff_var = s.ppl.error * s.ppl.error + s.ppl_base.error * s.ppl_base.error -
                          2 * s.ppl.value * s.ppl_base.value * cov;
  s.ppl_diff = {s.ppl.value - s.ppl_base.value, diff_var > 0 ? std::sqrt(diff_var) : 0.0};
  const double err_product = log_ppl.error * log_base.error;
  s.ln_ppl_correlation = err_product > 0 ? cov / err_product : 0.0;
  s.kl = MeanAndError(kl, kl2, n);
  s.kl_quantiles = Quantiles(std::move(kls), false);
  s.p_diff = MeanAndError(dp, dp2, n);
  s.p_diff_quantiles = Quantiles(std::move(dps), true);
  const ValueWithError mse = MeanAndError(dp2, dp4, n);
  const double rms = std::sqrt(mse.value);
  s.p_diff_rms = {rms, rms > 0 ? 0.5 / rms * mse.error : 0.0};
  const double top = static_cast<double>(s.same_top_count) / static_cast<double>(n);
  s.same_top = {top, n > 1 ? std::sqrt(top * (1 - top) / static_cast<double>(n - 1)) : 0.0};
  return s;
}

std::vector<int32_t> LlamaChunkTokens(std::span<const int32_t> tokens, int32_t n_ctx) {
  const size_t n = n_ctx > 0 ? tokens.size() / static_cast<size_t>(n_ctx) * static_cast<size_t>(n_ctx) : 0;
  return {tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n)};
}

Status CheckBaseMatches(const LlamaLogitsReader& base, int32_t vocab_size, int64_t seq_len,
                        std::span<const int32_t> text_tokens) {
  const LlamaLogitsLayout& l = base.layout();
  if (l.n_vocab != vocab_size) {
    return Status::Error(fmt::format("{}: written for a vocabulary of {} tokens, but this model's has {} "
                                     "(the file comes from another model)", base.path(), l.n_vocab, vocab_size));
  }
  if (l.n_ctx > seq_len) {
    return Status::Error(fmt::format("{}: written with chunks of n_ctx {} tokens, more than this model's context "
                                     "of {} positions", base.path(), l.n_ctx, seq_len));
  }
  const std::span<const int32_t> ids = base.tokens();
  if (text_tokens.size() < ids.size()) {
    return Status::Error(fmt::format("{}: holds {} chunks of {} tokens ({} ids), but the text gives only {} tokens "
                                     "here (expected the text llama-perplexity was given)", base.path(), l.n_chunk,
                                     l.n_ctx, ids.size(), text_tokens.size()));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] != text_tokens[i]) {
      return Status::Error(fmt::format(
          "{}: token {} (chunk {}, position {}) is {}, but kvq's tokenization of the text gives {} there "
          "(expected the same ids: the file was made from another text or another tokenizer)",
          base.path(), i, i / l.n_ctx, i % l.n_ctx, ids[i], text_tokens[i]));
    }
  }
  return Status::Ok();
}

Result<KlReport> RunKlDivergence(DecoderModel& model, std::span<const int32_t> tokens, const KlRunConfig& run,
                                 const std::function<void(const std::string&)>& progress) {
  const DecoderConfig& c = model.config();
  const int32_t vocab = c.vocab_size, n_ctx = run.n_ctx;
  if (run.key == nullptr || run.value == nullptr) return Status::Error("no KV format given");
  if (n_ctx < 3 || n_ctx > c.seq_len) {
    return Status::Error(fmt::format("the chunk length {} must be in 3..{} (the model's context)", n_ctx, c.seq_len));
  }
  if (tokens.empty() || tokens.size() % static_cast<size_t>(n_ctx) != 0) {
    return Status::Error(fmt::format("{} tokens are not a whole number (>= 1) of chunks of {}", tokens.size(), n_ctx));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab) {
      return Status::Error(fmt::format("token {} is {}, outside the vocabulary (0..{})", i, tokens[i], vocab - 1));
    }
  }
  if (run.bos >= vocab) return Status::Error(fmt::format("BOS id {} is outside the vocabulary", run.bos));
  const RowShape row{.n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim()};
  for (const KvSpec& spec : {KvSpec{run.key, run.key_transforms}, KvSpec{run.value, run.value_transforms}}) {
    if (Status s = CheckKvSpec(spec, row); !s.ok()) return s;
  }
  const LlamaLogitsLayout layout{.n_ctx = n_ctx, .n_vocab = vocab,
                                 .n_chunk = static_cast<int32_t>(tokens.size() / n_ctx)};
  if (run.base != nullptr) {
    const LlamaLogitsLayout& b = run.base->layout();
    if (b.n_ctx != n_ctx || b.n_vocab != vocab || b.n_chunk != layout.n_chunk ||
        !std::equal(tokens.begin(), tokens.end(), run.base->tokens().begin(), run.base->tokens().end())) {
      return Status::Error(fmt::format("{}: its chunks and ids are not the ones run (CheckBaseMatches first)",
                                       run.base->path()));
    }
  }
  if (run.out != nullptr && (run.out->layout().n_ctx != n_ctx || run.out->layout().n_vocab != vocab ||
                             run.out->layout().n_chunk != layout.n_chunk)) {
    return Status::Error("the output file was created for other chunks");
  }

  const int32_t first = layout.first();
  KlReport report{.n_ctx = n_ctx, .n_chunk = layout.n_chunk,
                  .positions = static_cast<int64_t>(layout.n_chunk) * layout.scored_per_chunk()};
  std::vector<KlPosition> compared;
  std::vector<float> logits(vocab);   // [vocab]
  std::vector<int32_t> chunk(n_ctx);  // [n_ctx] the ids fed, BOS first when asked
  double nll = 0;
  for (int32_t ci = 0; ci < layout.n_chunk; ++ci) {
    const auto t0 = std::chrono::steady_clock::now();
    std::copy_n(tokens.begin() + static_cast<std::ptrdiff_t>(ci) * n_ctx, n_ctx, chunk.begin());
    if (run.bos >= 0) chunk[0] = run.bos;
    // A fresh cache per chunk (a hybrid's recurrent state starts from zero too), as llama.cpp runs one.
    Result<std::unique_ptr<KvCache>> cache =
        CreateModelCache(c, n_ctx, {.layers = {{run.key, run.value, run.key_transforms, run.value_transforms}}});
    if (!cache.ok()) return cache.status();
    if (Status s = model.ForwardBlock(chunk.data(), first, 0, **cache, logits.data()); !s.ok()) {
      return Status::Error(fmt::format("chunk {} positions 0..{}: {}", ci, first - 1, s.message()));
    }
    double chunk_nll = 0, chunk_kl = 0;
    int64_t chunk_top = 0;
    for (int32_t j = first; j <= n_ctx - 2; ++j) {
      if (Status s = model.Forward(chunk[j], j, **cache, logits.data()); !s.ok()) {
        return Status::Error(fmt::format("chunk {} position {}: {}", ci, j, s.message()));
      }
      const int32_t target = chunk[j + 1];
      if (run.out != nullptr) {
        if (Status s = run.out->Append(logits.data()); !s.ok()) return s;
      }
      double m = logits[0];
      for (int32_t i = 1; i < vocab; ++i) m = std::max(m, static_cast<double>(logits[i]));
      double sum = 0;
      for (int32_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - m);
      chunk_nll += m + std::log(sum) - static_cast<double>(logits[target]);
      if (run.base != nullptr) {
        Result<LlamaLogProbs> record = run.base->Record(ci, j);
        if (!record.ok()) return record.status();
        compared.push_back(CompareWithBase(logits.data(), vocab, *record, target));
        chunk_kl += compared.back().kl;
        chunk_top += compared.back().same_top ? 1 : 0;
      }
    }
    nll += chunk_nll;
    if (progress) {
      const double per = static_cast<double>(layout.scored_per_chunk());
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      progress(run.base == nullptr
                   ? fmt::format("chunk {}/{}: PPL {:.4f} ({:.2f} s)", ci + 1, layout.n_chunk,
                                 std::exp(chunk_nll / per), secs)
                   : fmt::format("chunk {}/{}: PPL {:.4f}, KL {:.6f}, same top {:.2f}% ({:.2f} s)", ci + 1,
                                 layout.n_chunk, std::exp(chunk_nll / per), chunk_kl / per,
                                 100.0 * static_cast<double>(chunk_top) / per, secs));
    }
  }
  report.ppl = std::exp(nll / static_cast<double>(report.positions));
  if (run.base != nullptr) {
    report.compared = true;
    report.summary = Summarize(compared);
  }
  return report;
}

}  // namespace kvq
