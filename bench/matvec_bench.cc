// MatVec throughput per weight type at a decode-step shape (2048 × 2048, like a 2k-wide model's
// attention projection), 1 and 2 threads. The "weights" counter is weight bytes read per second
// (base 1000: "10G/s" = 10 GB/s), for every registered weight type. The matrix stays in the caches between iterations on machines
// with large caches (2048² Q4_0 is 2.4 MB, F32 16 MB), so this measures the kernels more than DRAM
// (`kvq bench matvec` sweeps a working set larger than the caches). Q8_0 and Q4_0 time the whole
// quantised-activation path: x quantised once per call, then the integer-dot kernels; the
// quantisation alone is timed by QuantizeActivation/cols.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "weights/matvec.h"
#include "weights/weight_type.h"

namespace {

constexpr int64_t kRows = 2048;
constexpr int64_t kCols = 2048;

// N(0, 1) values encoded by the type's reference quantiser (the values do not change the time).
std::vector<uint8_t> RandomWeights(kvq::WeightType type) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(kRows * kCols);  // [rows][cols]
  for (float& v : x) v = normal(rng);
  std::vector<uint8_t> w(kRows * kvq::MatrixRowBytes(type, kCols));
  kvq::QuantizeRowRef(*kvq::FindWeightType(type), x.data(), kRows * kCols, w.data());  // rows are whole blocks
  return w;
}

void BM_MatVec(benchmark::State& state, kvq::WeightType type) {
  const auto threads = static_cast<int32_t>(state.range(0));
  const std::vector<uint8_t> bytes = RandomWeights(type);
  const kvq::Matrix w{.type = type, .data = bytes.data(), .rows = kRows, .cols = kCols};
  if (!kvq::CheckMatrix(w).ok()) {
    state.SkipWithError(kvq::CheckMatrix(w).message().c_str());
    return;
  }
  std::vector<float> x(kCols), y(kRows);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  kvq::ThreadPool pool(threads);
  for (auto _ : state) {
    kvq::MatVec(w, x.data(), y.data(), pool);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double bytes_read = static_cast<double>(state.iterations()) * static_cast<double>(bytes.size());
  state.counters["weights"] = benchmark::Counter(bytes_read, benchmark::Counter::kIsRate);
  state.SetLabel(kvq::MatVecTargetName());
}

void BM_QuantizeActivation(benchmark::State& state) {
  const int64_t cols = state.range(0);
  std::vector<float> x(cols);
  std::vector<int8_t> q(cols);
  std::vector<float> d(cols / 32);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  for (auto _ : state) {
    kvq::QuantizeActivation(x.data(), cols, q.data(), d.data());
    benchmark::DoNotOptimize(q.data());
    benchmark::ClobberMemory();
  }
  state.counters["elements"] = benchmark::Counter(static_cast<double>(state.iterations() * cols),
                                                  benchmark::Counter::kIsRate);
  state.SetLabel(kvq::MatVecTargetName());
}
BENCHMARK(BM_QuantizeActivation)->Name("QuantizeActivation")->ArgName("cols")->Arg(2048)->Arg(8192);

[[maybe_unused]] const bool kRegistered = [] {
  for (const kvq::WeightTypeDesc& type : kvq::WeightTypes()) {
    const std::string name = std::string("MatVec/") + type.label;
    benchmark::RegisterBenchmark(name.c_str(), BM_MatVec, type.type)
        ->ArgName("threads")
        ->Arg(1)
        ->Arg(2)
        ->UseRealTime();
  }
  return true;
}();

}  // namespace
