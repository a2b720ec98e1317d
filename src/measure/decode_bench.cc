// RunDecodeBench (see decode_bench.h).
#include "measure/decode_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <memory>
#include <random>

#include "kvq/kv_cache.h"
#include "kvq/kv_memory.h"
#include "model/cache_config.h"
#include "weights/matvec.h"

namespace kvq {
namespace {

int64_t MatrixBytes(const Matrix& m) { return m.rows * MatrixRowBytes(m.type, m.cols); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Appends `n` positions of random rows to every layer, in chunks from a pool of random rows (the
// values repeat every chunk; only their encoding's cost and size matter here).
Status FillRandom(KvCache& cache, const DecoderConfig& c, int64_t n, uint64_t seed,
                  const std::function<void(const std::string&)>& progress, const std::string& name) {
  constexpr int64_t kChunk = 256;
  const int64_t row = c.kv_dim();
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> k(kChunk * row), v(kChunk * row);
  for (float& x : k) x = dist(rng);
  for (float& x : v) x = dist(rng);
  const auto start = std::chrono::steady_clock::now();
  for (int64_t done = 0; done < n; done += kChunk) {
    const int64_t m = std::min(kChunk, n - done);
    for (int32_t l = 0; l < c.n_attention_layers(); ++l) {
      if (Status s = cache.Append(l, k.data(), v.data(), m); !s.ok()) return s;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (progress && (done / kChunk) % 64 == 63) {
      progress(fmt::format("{}: filled {} of {} positions ({:.0f} s)", name, done + m, n, seconds));
    }
  }
  return Status::Ok();
}

// A layer's matrices a decode step reads whole (empty ones, of the other layer kind, count 0):
// attention's or the recurrent mixer's projections, the dense FFN or the shared expert, the router
// and its gate. A MoE layer's stacked experts (of which a step reads a few) are StackedExperts'.
std::array<const Matrix*, 15> DenseMatrices(const LayerWeights& L) {
  return {&L.wq, &L.wk, &L.wv, &L.wo, &L.w1, &L.w2, &L.w3, &L.ssm_qkv, &L.ssm_gate, &L.ssm_beta,
          &L.ssm_alpha, &L.ssm_ba, &L.ssm_out, &L.router, &L.shared_gate};
}
std::array<const Matrix*, 3> StackedExperts(const LayerWeights& L) { return {&L.gate_exps, &L.up_exps, &L.down_exps}; }

// Reads one byte of every 4 KiB page of every weight matrix (the stacked experts included), so a
// mapped file's pages are in memory before the timed steps: otherwise a MoE model's step pays a
// page fault for each expert not chosen before, and whichever arm runs first after the routing
// changes pays it for the others (the reads are volatile: not optimised away).
void TouchWeights(const DecoderWeights& w) {
  uint8_t sum = 0;
  auto touch = [&](const Matrix& m) {
    const auto* bytes = static_cast<const volatile uint8_t*>(m.data);
    const int64_t n = m.data != nullptr ? MatrixBytes(m) : 0;
    for (int64_t i = 0; i < n; i += 4096) sum += bytes[i];
  };
  touch(w.token_embedding);
  touch(w.classifier);
  for (const LayerWeights& L : w.layers) {
    for (const Matrix* m : DenseMatrices(L)) touch(*m);
    for (const Matrix* m : StackedExperts(L)) touch(*m);
  }
  (void)sum;
}

}  // namespace

int64_t WeightBytesPerStep(const DecoderWeights& w) {
  const DecoderConfig& c = w.config;
  const DeltaNetConfig& d = c.delta_net;
  int64_t bytes = MatrixRowBytes(w.token_embedding.type, w.token_embedding.cols) + MatrixBytes(w.classifier) +
                  int64_t{c.dim} * 4;  // one embedding row, the classifier, the final norm
  for (int32_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = w.layers[l];
    for (const Matrix* m : DenseMatrices(L)) bytes += MatrixBytes(*m);
    bytes += int64_t{2} * c.dim * 4;                                        // the two norms
    if (L.bq != nullptr) bytes += (int64_t{c.q_dim()} + 2 * c.kv_dim()) * 4;  // q, k, v biases
    if (L.q_norm != nullptr) bytes += int64_t{2} * c.head_dim() * 4;       // q, k head norms
    if (c.is_recurrent(l)) {  // conv taps [C][K], dt bias and A [Hv], the gated norm [dv]
      bytes += (d.conv_channels() * d.conv_kernel + 2 * int64_t{d.n_v_heads} + d.value_dim) * 4;
    }
  }
  return bytes;
}

const KvSpec* DecodeBenchReference(const DecodeBenchConfig& config) {
  for (const KvSpec& f : config.formats) {
    if (KvSpecName(f) == "f16") return &f;
  }
  return &config.formats.front();
}

Result<int64_t> DecodeKvBytes(const DecoderConfig& c, const KvSpec& spec, int64_t context) {
  if (context == 0) return int64_t{0};
  // A hybrid's recurrent layers hold no KV: only its attention layers count.
  const KvShape shape = ModelKvShape(c);
  if (!spec.transforms.any()) return KvBytesForContext(*spec.format, shape, context);
  // Transforms: the exact rule of kvq/kv_spec.h per tensor, plus per-tensor state, every layer.
  const Result<int64_t> plain = KvBytesForContext(*spec.format, shape, context);  // shape checks
  if (!plain.ok()) return plain.status();
  const int64_t per_layer =
      SpecBytesForRows(spec.format->key, spec.transforms, shape.row(), context) +
      SpecBytesForRows(spec.format->value, spec.transforms, shape.row(), context) +
      TensorStateBytes(spec.format->key) + TensorStateBytes(spec.format->value);
  return per_layer * shape.n_layers;
}

Result<std::vector<DecodeBenchRow>> RunDecodeBench(DecoderModel& model, const DecodeBenchConfig& config,
                                                   const std::function<void(const std::string&)>& progress) {
  const DecoderConfig& c = model.config();
  const int64_t weight_bytes = WeightBytesPerStep(model.weights());
  const int64_t state_bytes = c.state_floats() * 4;
  const KvSpec* reference = DecodeBenchReference(config);
  std::vector<DecodeBenchRow> rows;
  std::vector<float> logits(c.vocab_size);
  const auto touch_start = std::chrono::steady_clock::now();
  TouchWeights(model.weights());
  if (progress) {
    progress(fmt::format("every weight page read once, into memory ({:.1f} s)",
                         std::chrono::duration<double>(std::chrono::steady_clock::now() - touch_start).count()));
  }
  for (int64_t n : config.contexts) {
    const int64_t positions = n + 1 + config.reps;  // the fill, the warm-up step, the timed steps
    if (n < 0 || positions > c.seq_len) {
      return Status::Error(fmt::format("context {} plus {} decode steps is past the model's context of {} positions",
                                       n, 1 + config.reps, c.seq_len));
    }
    // Every arm's cache is alive at once, so the arms take turns step by step.
    std::vector<std::unique_ptr<KvCache>> caches;
    for (const KvSpec& f : config.formats) {
      // A hybrid's cache: its attention layers, and the recurrent layers' state (zeros: a step's
      // cost does not depend on the values).
      Result<std::unique_ptr<KvCache>> cache =
          CreateModelCache(c, positions, {.layers = {LayerFormats::Both(f)}, .page_positions = 256});
      if (!cache.ok()) return cache.status();
      if (Status s = FillRandom(**cache, c, n, config.seed, progress, fmt::format("{} at {}", KvSpecName(f), n)); !s.ok()) {
        return s;
      }
      caches.push_back(std::move(cache.value()));
    }
    const size_t arms = config.formats.size();
    std::vector<std::vector<double>> ms(arms);
    std::vector<int64_t> expert_bytes(arms, 0);  // routed experts read over the timed steps
    for (int32_t step = 0; step <= config.reps; ++step) {
      for (size_t i = 0; i < arms; ++i) {
        // The order rotates each step (A B C, B C A, C A B, ...): no arm always runs first after
        // the others, where it would pay for what changed (cold caches, newly routed experts).
        const size_t a = (i + static_cast<size_t>(step)) % arms;
        const int64_t experts_before = model.expert_bytes_read();
        const auto t0 = std::chrono::steady_clock::now();
        // Any token will do: the step's cost does not depend on which one (a MoE model's experts
        // do depend on it and on the cache: they are counted per step).
        if (Status s = model.Forward(1 % c.vocab_size, n + step, *caches[a], logits.data()); !s.ok()) return s;
        const double elapsed = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (step > 0) {  // step 0 warms caches and the thread pool
          ms[a].push_back(elapsed);
          expert_bytes[a] += model.expert_bytes_read() - experts_before;
        }
      }
    }
    if (progress) progress(fmt::format("context {}: {} steps per arm timed", n, config.reps));
    Result<int64_t> ref_kv = DecodeKvBytes(c, *reference, n);
    if (!ref_kv.ok()) return ref_kv.status();
    size_t ref_arm = 0;
    for (size_t a = 0; a < arms; ++a) ref_arm = &config.formats[a] == reference ? a : ref_arm;
    const double ref_ms = Median(ms[ref_arm]);
    // The reference arm's step: its KV, the dense weights, the experts it read, the state.
    const int64_t ref_other = weight_bytes + expert_bytes[ref_arm] / config.reps + state_bytes;
    const double share = static_cast<double>(*ref_kv) / static_cast<double>(*ref_kv + ref_other);
    for (size_t a = 0; a < arms; ++a) {
      DecodeBenchRow r;
      r.format = KvSpecName(config.formats[a]);
      r.context = n;
      r.ms_median = Median(ms[a]);
      r.ms_min = *std::min_element(ms[a].begin(), ms[a].end());
      r.ms_max = *std::max_element(ms[a].begin(), ms[a].end());
      r.tokens_per_second = 1000.0 / r.ms_median;
      Result<int64_t> kv = DecodeKvBytes(c, config.formats[a], n);
      if (!kv.ok()) return kv.status();
      r.kv_bytes = *kv;
      r.expert_bytes = expert_bytes[a] / config.reps;
      r.weight_bytes = weight_bytes + r.expert_bytes;
      r.state_bytes = state_bytes;
      r.kv_share = share;
      r.ceiling = *ref_kv == 0 ? 1.0 : SpeedupCeiling(share, static_cast<double>(*kv) / static_cast<double>(*ref_kv));
      r.speedup = ref_ms / r.ms_median;
      rows.push_back(r);
    }
  }
  return rows;
}

}  // namespace kvq
