// Teacher-forced fidelity (see fidelity.h): the reference arm's logits are kept (n × vocab floats
// and their log-softmax in double, a few MB for a 512-token context), then each candidate arm is
// compared with them position by position as it runs, so a candidate's logits are never stored.
#include "measure/fidelity.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "kvq/kv_cache.h"
#include "kvq/kv_memory.h"
#include "model/cache_config.h"

namespace kvq {
namespace {

// log softmax(x) in double: x_i − (max + log Σ exp(x_j − max)). Identical inputs give identical
// outputs, so a candidate equal to the reference has KL exactly 0.
void LogSoftmax(const float* x, int32_t n, double* out) {
  double m = x[0];
  for (int32_t i = 1; i < n; ++i) m = std::max(m, static_cast<double>(x[i]));
  double sum = 0;
  for (int32_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - m);
  const double lse = m + std::log(sum);
  for (int32_t i = 0; i < n; ++i) out[i] = static_cast<double>(x[i]) - lse;
}

// The first index of the largest logit (both arms use the same rule, so ties agree).
int32_t Argmax(const float* x, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

// One arm: every token through a fresh cache of the arm's specs, one decode step each (so fp8
// calibrates on the first token's rows, KIVI completes its key groups and residual rows age out as
// decoding would); `visit` gets position p's logits.
Status RunArm(DecoderModel& model, std::span<const int32_t> tokens, const FidelityArm& arm,
              const std::function<void(int64_t, const float*)>& visit) {
  const DecoderConfig& c = model.config();
  // The model's cache (a hybrid's attention layers and recurrent state); one page when n is small.
  Result<std::unique_ptr<KvCache>> cache =
      CreateModelCache(c, static_cast<int64_t>(tokens.size()), {.layers = arm.layers});
  if (!cache.ok()) return Status::Error(fmt::format("{}: {}", arm.name, cache.status().message()));
  std::vector<float> logits(c.vocab_size);  // [vocab]
  for (size_t p = 0; p < tokens.size(); ++p) {
    const int64_t pos = static_cast<int64_t>(p);
    if (Status s = model.Forward(tokens[p], pos, **cache, logits.data()); !s.ok()) {
      return Status::Error(fmt::format("{} at position {}: {}", arm.name, pos, s.message()));
    }
    visit(pos, logits.data());
  }
  return Status::Ok();
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

FidelityInput MakeFidelityInput(const Tokenizer& tokenizer, std::string_view text, int64_t context) {
  FidelityInput in;
  in.tokens = tokenizer.Encode(text, tokenizer.add_bos());
  in.full_count = static_cast<int64_t>(in.tokens.size());
  if (context >= 0 && in.full_count > context) in.tokens.resize(static_cast<size_t>(context));
  return in;
}

Result<FidelityReport> RunFidelity(DecoderModel& model, std::span<const int32_t> tokens,
                                   const FidelityConfig& config,
                                   const std::function<void(const std::string&)>& progress) {
  const DecoderConfig& c = model.config();
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int32_t vocab = c.vocab_size;
  if (n < 2) return Status::Error(fmt::format("fidelity needs at least 2 tokens (got {})", n));
  if (n > c.seq_len) {
    return Status::Error(fmt::format("{} tokens exceed the model's context of {} positions", n, c.seq_len));
  }
  for (int64_t p = 0; p < n; ++p) {
    if (tokens[p] < 0 || tokens[p] >= vocab) {
      return Status::Error(fmt::format("token {} at position {} is outside the vocabulary (0..{})",
                                       tokens[p], p, vocab - 1));
    }
  }
  const KvShape shape = ModelKvShape(c);  // a hybrid's KV is in its attention layers only
  // Every arm's specs are checked (and its bytes counted) before the first token runs.
  std::vector<int64_t> arm_bytes;
  for (const FidelityArm& arm : config.arms) {
    const Result<int64_t> bytes = KvBytesForContext(arm.layers, shape, n);
    if (!bytes.ok()) return Status::Error(fmt::format("{}: {}", arm.name, bytes.status().message()));
    arm_bytes.push_back(*bytes);
  }
  const FormatDesc* f32 = FindFormat(FormatId::kF32);
  const FormatDesc* f16 = FindFormat(FormatId::kF16);
  const Result<int64_t> f16_bytes = KvBytesForContext(*f16, shape, n);
  if (!f16_bytes.ok()) return f16_bytes.status();
  const int total_arms = static_cast<int>(config.arms.size()) + 1;
  auto say = [&](const std::string& line) {
    if (progress) progress(line);
  };

  // Reference arm: keep the log-softmax (for KL and perplexity), the raw logits (for drift) and
  // the argmax of every position.
  FidelityReport report;
  report.positions = n;
  std::vector<float> ref_logits(static_cast<size_t>(n) * vocab);
  std::vector<double> ref_lsm(static_cast<size_t>(n) * vocab);
  std::vector<int32_t> ref_top(n);
  double ref_nll = 0;
  auto t0 = std::chrono::steady_clock::now();
  Status s = RunArm(model, tokens, FidelityArm::Uniform(f32), [&](int64_t p, const float* logits) {
    std::copy(logits, logits + vocab, ref_logits.begin() + p * vocab);
    LogSoftmax(logits, vocab, ref_lsm.data() + p * vocab);
    ref_top[p] = Argmax(logits, vocab);
    if (p + 1 < n) ref_nll -= ref_lsm[p * vocab + tokens[p + 1]];
  });
  if (!s.ok()) return s;
  report.reference_ppl = std::exp(ref_nll / static_cast<double>(n - 1));
  say(fmt::format("[1/{}] reference (f32 cache): {} positions, perplexity {:.4f} ({:.2f} s)", total_arms, n,
                  report.reference_ppl, Seconds(t0)));

  std::vector<double> lsm(vocab);
  const double numbers = 2.0 * static_cast<double>(shape.n_layers) * static_cast<double>(n) *
                         static_cast<double>(shape.row().elems());
  for (size_t a = 0; a < config.arms.size(); ++a) {
    const FidelityArm& arm = config.arms[a];
    FidelityRow row;
    row.format = arm.name;
    row.positions = n;
    row.kv_bytes = arm_bytes[a];
    row.bits_per_number = 8.0 * static_cast<double>(row.kv_bytes) / numbers;  // = KvBitsPerNumber
    row.memory_vs_f16 = static_cast<double>(row.kv_bytes) / static_cast<double>(*f16_bytes);
    double drift = 0, kl = 0, nll = 0;
    t0 = std::chrono::steady_clock::now();
    s = RunArm(model, tokens, arm, [&](int64_t p, const float* logits) {
      const float* ref = ref_logits.data() + p * vocab;
      const double* ref_l = ref_lsm.data() + p * vocab;
      LogSoftmax(logits, vocab, lsm.data());
      double kl_p = 0;
      for (int32_t i = 0; i < vocab; ++i) {
        drift += std::abs(static_cast<double>(logits[i]) - static_cast<double>(ref[i]));
        kl_p += std::exp(ref_l[i]) * (ref_l[i] - lsm[i]);
      }
      kl += kl_p;
      row.top1_agree += Argmax(logits, vocab) == ref_top[p] ? 1 : 0;
      if (p + 1 < n) nll -= lsm[tokens[p + 1]];
    });
    if (!s.ok()) return s;
    row.logit_drift = drift / (static_cast<double>(n) * vocab);
    row.kl = kl / static_cast<double>(n);
    row.ppl = std::exp(nll / static_cast<double>(n - 1));
    say(fmt::format("[{}/{}] {}: logit drift {:.4g}, KL {:.4g}, top-1 {}/{} ({:.2f} s)", a + 2, total_arms,
                    row.format, row.logit_drift, row.kl, row.top1_agree, n, Seconds(t0)));
    report.formats.push_back(std::move(row));
  }
  return report;
}

}  // namespace kvq
