// RunPrefillBench and the multiply-add counts behind its ceilings (see prefill_bench.h).
#include "measure/prefill_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "kvq/kv_cache.h"
#include "model/cache_config.h"
#include "weights/weight_type.h"

namespace kvq {
namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

bool QuantizesActivation(const Matrix& m) {
  const WeightTypeDesc* d = FindWeightType(m.type);
  return d != nullptr && d->quantized_activation;
}

// One prefill of tokens [0, n) into a fresh cache of `format`, in kPrefillBenchBlock blocks, the
// profile added to `profile`; returns its seconds. `progress` gets a line about every 10 s with an
// ETA from the rates so far: the weights and the rest per token, the attention per multiply-add
// (which grows with the position, so a per-token rate would promise too early an end).
Result<double> PrefillOnce(DecoderModel& model, const KvSpec& format, const std::vector<int32_t>& prompt,
                           int64_t n, float* logits, ForwardProfile& profile, const std::string& name,
                           const std::function<void(const std::string&)>& progress) {
  const DecoderConfig& c = model.config();
  Result<std::unique_ptr<KvCache>> cache =
      CreateModelCache(c, n, {.layers = {LayerFormats::Both(format)}, .page_positions = 256});
  if (!cache.ok()) return cache.status();
  ForwardProfile mine;
  model.set_profile(&mine);
  const int64_t total_attention = PrefillAttentionMacs(c, n);
  const auto t0 = Clock::now();
  auto last_report = t0;
  Status status = Status::Ok();
  for (int64_t pos = 0; pos < n && status.ok();) {
    const int32_t m = static_cast<int32_t>(std::min<int64_t>(kPrefillBenchBlock, n - pos));
    status = model.ForwardBlock(prompt.data() + pos, m, pos, **cache, logits);
    pos += m;
    const auto now = Clock::now();
    if (progress && pos < n && now - last_report > std::chrono::seconds(10)) {
      last_report = now;
      const double done_attention = static_cast<double>(PrefillAttentionMacs(c, pos));
      const double eta = (mine.weights_s + mine.rest_s) / pos * (n - pos) +
                         mine.attention_s / done_attention * (total_attention - done_attention);
      const double so_far = mine.weights_s + mine.attention_s + mine.rest_s;
      progress(fmt::format("{}: {} of {} tokens, {:.0f} s (weights {:.0f}%, attention {:.0f}%, rest {:.0f}%), "
                           "about {:.0f} s to go", name, pos, n, std::chrono::duration<double>(now - t0).count(),
                           100 * mine.weights_s / so_far, 100 * mine.attention_s / so_far,
                           100 * mine.rest_s / so_far, eta));
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  model.set_profile(nullptr);
  if (!status.ok()) return status;
  profile.weights_s += mine.weights_s;
  profile.attention_s += mine.attention_s;
  profile.rest_s += mine.rest_s;
  return seconds;
}

}  // namespace

WeightMacs CountWeightMacs(const DecoderWeights& w) {
  WeightMacs macs;
  const MoeConfig& moe = w.config.moe;
  auto add = [&macs](const Matrix& m, int64_t per_token) {
    (QuantizesActivation(m) ? macs.int8_per_token : macs.f32_per_token) += per_token;
  };
  for (const LayerWeights& L : w.layers) {
    // A recurrent layer's projections are empty here (its own are timed with the attention phase).
    for (const Matrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w1, &L.w2, &L.w3, &L.router, &L.shared_gate}) {
      add(*m, m->rows * m->cols);
    }
    // Routed experts: each token runs n_experts_used of the n_experts stacked in each matrix.
    for (const Matrix* m : {&L.gate_exps, &L.up_exps, &L.down_exps}) {
      if (moe.n_experts > 0) add(*m, m->rows * m->cols / moe.n_experts * moe.n_experts_used);
    }
  }
  (QuantizesActivation(w.classifier) ? macs.int8_classifier : macs.f32_classifier) =
      w.classifier.rows * w.classifier.cols;
  return macs;
}

int64_t PrefillAttentionMacs(const DecoderConfig& c, int64_t n) {
  // Σ_{p<n} (p + 1) = n (n + 1) / 2 positions attended.
  return int64_t{c.n_attention_layers()} * (n * (n + 1) / 2) * 2 * c.n_heads * c.head_dim();
}

double WeightsCeilingSeconds(const WeightMacs& macs, const ComputeRoofline& r, int64_t n) {
  const double int8 = static_cast<double>(n * macs.int8_per_token + macs.int8_classifier);
  const double f32 = static_cast<double>(n * macs.f32_per_token + macs.f32_classifier);
  return (int8 > 0 ? int8 / (r.best_int8_gmacs * 1e9) : 0.0) + (f32 > 0 ? f32 / (r.best_f32_gmacs * 1e9) : 0.0);
}

std::string WeightsCeilingInstruction(const WeightMacs& macs, const ComputeRoofline& r) {
  const bool int8 = macs.int8_per_token + macs.int8_classifier > 0;
  const bool f32 = macs.f32_per_token + macs.f32_classifier > 0;
  if (int8 && f32) return r.best_int8_instruction + " + " + r.best_f32_instruction;
  return int8 ? r.best_int8_instruction : r.best_f32_instruction;
}

std::vector<int32_t> RepeatPrompt(int32_t bos, const std::vector<int32_t>& text, int64_t n) {
  std::vector<int32_t> prompt;
  prompt.reserve(n);
  if (n > 0) prompt.push_back(bos);
  for (size_t i = 0; static_cast<int64_t>(prompt.size()) < n && !text.empty(); i = (i + 1) % text.size()) {
    prompt.push_back(text[i]);
  }
  return prompt;
}

Result<std::vector<PrefillBenchRow>> RunPrefillBench(DecoderModel& model, const PrefillBenchConfig& config,
                                                     const std::function<void(const std::string&)>& progress) {
  const DecoderConfig& c = model.config();
  if (config.formats.empty()) return Status::Error("prefill bench: no formats");
  if (config.lengths.empty()) return Status::Error("prefill bench: no prompt lengths");
  if (config.reps < 1) {
    return Status::Error(fmt::format("prefill bench: reps must be at least 1 (got {})", config.reps));
  }
  for (int64_t n : config.lengths) {
    if (n < 1 || n > c.seq_len) {
      return Status::Error(fmt::format("prompt length {} is outside 1..{}, the model's context", n, c.seq_len));
    }
    if (n > static_cast<int64_t>(config.prompt.size())) {
      return Status::Error(fmt::format("prompt length {} is longer than the {} prompt tokens given", n,
                                       config.prompt.size()));
    }
  }
  for (int32_t t : config.prompt) {
    if (t < 0 || t >= c.vocab_size) {
      return Status::Error(fmt::format("prompt token {} is outside the vocabulary of {}", t, c.vocab_size));
    }
  }
  const WeightMacs weight_macs = CountWeightMacs(model.weights());
  const ComputeRoofline& roof = config.roofline;
  const size_t arms = config.formats.size();
  std::vector<float> logits(c.vocab_size);  // [vocab]
  // One untimed block per arm first: it warms the thread pool, the pages of the weights and the
  // attention state the timed runs reuse.
  for (const KvSpec& f : config.formats) {
    ForwardProfile ignored;
    const int64_t n = std::min<int64_t>(kPrefillBenchBlock, config.lengths.front());
    if (Result<double> s = PrefillOnce(model, f, config.prompt, n, logits.data(), ignored, "", {}); !s.ok()) {
      return s.status();
    }
  }
  std::vector<PrefillBenchRow> rows;
  for (int64_t n : config.lengths) {
    std::vector<std::vector<double>> seconds(arms);
    std::vector<ForwardProfile> profiles(arms);
    std::vector<std::vector<float>> last_logits(arms);
    for (int32_t rep = 0; rep < config.reps; ++rep) {
      for (size_t i = 0; i < arms; ++i) {
        // The order rotates each repetition (A B C, B C A, ...), as bench decode's steps do: no arm
        // always runs right after the same neighbour (whose caches and page state it would inherit).
        const size_t a = (i + static_cast<size_t>(rep)) % arms;
        const std::string name =
            fmt::format("{} at {} (rep {} of {})", KvSpecName(config.formats[a]), n, rep + 1, config.reps);
        Result<double> s = PrefillOnce(model, config.formats[a], config.prompt, n, logits.data(), profiles[a],
                                       name, progress);
        if (!s.ok()) return s.status();
        seconds[a].push_back(*s);
        if (progress) progress(fmt::format("{}: {:.1f} s, {:.1f} tok/s", name, *s, n / *s));
        if (rep + 1 == config.reps) last_logits[a] = logits;
      }
    }
    for (size_t a = 0; a < arms; ++a) {
      PrefillBenchRow r;
      r.format = KvSpecName(config.formats[a]);
      r.length = n;
      r.s_median = Median(seconds[a]);
      r.s_min = *std::min_element(seconds[a].begin(), seconds[a].end());
      r.s_max = *std::max_element(seconds[a].begin(), seconds[a].end());
      r.tokens_per_second = n / r.s_median;
      r.tps_min = n / r.s_max;
      r.tps_max = n / r.s_min;
      r.weights_s = profiles[a].weights_s;
      r.attention_s = profiles[a].attention_s;
      r.rest_s = profiles[a].rest_s;
      for (double s : seconds[a]) r.total_s += s;
      r.weights_share = r.weights_s / r.total_s;
      r.attention_share = r.attention_s / r.total_s;
      r.rest_share = r.rest_s / r.total_s;
      r.weight_macs = weight_macs.ForPrompt(n);
      r.attention_macs = PrefillAttentionMacs(c, n);
      const double weights_ceiling_s = WeightsCeilingSeconds(weight_macs, roof, n);
      r.weights_ceiling_tps = n / weights_ceiling_s;
      r.pct_of_weights_ceiling = 100 * r.tokens_per_second / r.weights_ceiling_tps;
      r.weights_phase_pct = 100 * weights_ceiling_s * config.reps / r.weights_s;
      r.attention_ceiling_s = static_cast<double>(r.attention_macs) / (roof.best_f32_gmacs * 1e9);
      r.attention_phase_pct = 100 * r.attention_ceiling_s * config.reps / r.attention_s;
      r.logits = std::move(last_logits[a]);
      rows.push_back(std::move(r));
    }
  }
  return rows;
}

}  // namespace kvq
