// Weight matvec benchmark (see matvec_bench.h). Each arm holds its own working set: one random
// matrix per shape, copied to fill the set (the values do not change the time; distinct addresses
// are what defeat the caches). Arms are interleaved per repetition so drift on a shared machine
// hits every type alike; repetition 0 warms page tables and is dropped. Q4_0 and Q8_0 run twice:
// row-major (the file's layout, the row kernels) and repacked ("/il16", weights/repack.h), as the
// model runs them after load.
#include "measure/matvec_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "base/huge_pages.h"
#include "kvq/units.h"
#include "weights/matvec.h"
#include "weights/repack.h"
#include "weights/weight_type.h"

namespace kvq {
namespace {

// N(0, 1) values encoded by the type's reference quantiser, row by row (a block type's codes
// then cover its whole range, and its scales are those of real data; the values do not change
// the time).
void FillRandom(const WeightTypeDesc& type, int64_t rows, int64_t cols, uint32_t seed, uint8_t* out) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> row(cols);  // [cols]
  const int64_t row_bytes = MatrixRowBytes(type.type, cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : row) v = normal(rng);
    QuantizeRowRef(type, row.data(), cols, out + r * row_bytes);
  }
}

struct Arm {
  WeightType type;
  bool repacked = false;  // MatrixLayout::kInterleaved16
  PageBuffer storage;  // [matrices] back to back, shapes alternating
  std::vector<Matrix> matrices;
  int64_t sweep_bytes = 0;
  std::vector<double> ns;  // per timed sweep
};

Arm MakeArm(WeightType type, bool repacked, const MatVecBenchConfig& c) {
  Arm arm{.type = type, .repacked = repacked};
  const int64_t bytes = c.rows * MatrixRowBytes(type, c.cols);  // either shape: same element count
  // An even count (both shapes equally often), at least one pair, covering the working set.
  const int64_t pairs = std::max<int64_t>(1, (c.working_set_bytes + 2 * bytes - 1) / (2 * bytes));
  const int64_t n = 2 * pairs;
  // Row-major arms on ordinary pages, as the model reads a file's mapping; repacked arms on huge
  // pages, as the model reads its repacked copy (model/decoder_weights.cc). Left uninitialised:
  // every byte is copied below.
  arm.storage = AllocatePageBuffer(n * bytes, PageSize::kOrdinary);
  const WeightTypeDesc& desc = *FindWeightType(type);  // CheckMatVecBenchConfig checked it is there
  FillRandom(desc, c.rows, c.cols, 1, arm.storage.get());
  FillRandom(desc, c.cols, c.rows, 2, arm.storage.get() + bytes);
  for (int64_t i = 0; i < n; ++i) {
    uint8_t* at = arm.storage.get() + i * bytes;
    if (i >= 2) std::memcpy(at, arm.storage.get() + (i % 2) * bytes, bytes);
    const bool first_shape = i % 2 == 0;
    arm.matrices.push_back(Matrix{.type = type, .data = at, .rows = first_shape ? c.rows : c.cols,
                                  .cols = first_shape ? c.cols : c.rows});
  }
  arm.sweep_bytes = n * bytes;
  if (repacked) {
    PageBuffer packed = AllocatePageBuffer(n * bytes, PageSize::kHuge);  // [matrices] repacked, same offsets
    for (int64_t i = 0; i < n; ++i) arm.matrices[i] = RepackMatrix(arm.matrices[i], packed.get() + i * bytes);
    arm.storage = std::move(packed);
  }
  return arm;
}

}  // namespace

Result<WeightType> ParseWeightTypeName(const std::string& name) {
  Result<const WeightTypeDesc*> d = FindWeightTypeByName(name);
  if (!d.ok()) return d.status();
  return (*d)->type;
}

Status CheckMatVecBenchConfig(const MatVecBenchConfig& c) {
  if (c.types.empty()) return Status::Error("--type: give at least one weight type");
  constexpr int64_t kMaxDim = int64_t{1} << 20;
  if (c.rows < 1 || c.rows > kMaxDim) {
    return Status::Error(fmt::format("--rows must be in 1..{} (got {})", kMaxDim, c.rows));
  }
  if (c.cols < 1 || c.cols > kMaxDim) {
    return Status::Error(fmt::format("--cols must be in 1..{} (got {})", kMaxDim, c.cols));
  }
  for (WeightType type : c.types) {
    const WeightTypeDesc* d = FindWeightType(type);
    if (d == nullptr) {
      return Status::Error(fmt::format("--type: weight type id {} is not registered (registered: {})",
                                       static_cast<int>(type), WeightTypeLabelList()));
    }
    if (d->block_elems == 1) continue;
    // The second matrix of each pair is [cols][rows]: both dimensions are row lengths somewhere.
    if (c.rows % d->block_elems != 0) {
      return Status::Error(fmt::format("--rows must be a multiple of {} for {} (got {}): the benchmark "
                                       "also runs the transposed [cols][rows] shape, whose rows are blocks "
                                       "of {}", d->block_elems, d->label, c.rows, d->block_elems));
    }
    if (c.cols % d->block_elems != 0) {
      return Status::Error(fmt::format("--cols must be a multiple of {} for {} (got {}): {} stores each "
                                       "row as blocks of {}", d->block_elems, d->label, c.cols, d->label,
                                       d->block_elems));
    }
  }
  if (c.threads < 1 || c.threads > 1024) {
    return Status::Error(fmt::format("--threads must be in 1..1024 (got {})", c.threads));
  }
  if (c.tokens < 1 || c.tokens > 4096) {
    return Status::Error(fmt::format("--tokens must be in 1..4096 (got {})", c.tokens));
  }
  if (c.reps < 1 || c.reps > 10000) {
    return Status::Error(fmt::format("--reps must be in 1..10000 (got {})", c.reps));
  }
  constexpr int64_t kMaxSet = int64_t{16} << 30;
  if (c.working_set_bytes < 1 || c.working_set_bytes > kMaxSet) {
    return Status::Error(
        fmt::format("--working-set must be in 1 B..16 GiB (got {})", FormatBytesIec(c.working_set_bytes)));
  }
  // Each arm rounds its set up to a whole pair of matrices; all arms are alive at once.
  int64_t total = 0;
  for (WeightType type : c.types) {
    const int64_t pair = 2 * c.rows * MatrixRowBytes(type, c.cols);
    const bool repacked_arm = CanRepack(Matrix{.type = type, .rows = std::min(c.rows, c.cols), .cols = c.cols});
    total += (repacked_arm ? 2 : 1) * (c.working_set_bytes + pair);
  }
  if (total > (int64_t{32} << 30)) {
    return Status::Error(fmt::format("the arms would hold about {} of weights: use fewer types, a smaller "
                                     "--working-set or smaller --rows/--cols", FormatBytesIec(total)));
  }
  return Status::Ok();
}

std::vector<MatVecBenchRow> RunMatVecBench(const MatVecBenchConfig& c,
                                           const std::function<void(const std::string&)>& progress) {
  std::vector<Arm> arms;
  for (WeightType type : c.types) {
    for (const bool repacked : {false, true}) {
      if (repacked && !CanRepack(Matrix{.type = type, .rows = std::min(c.rows, c.cols), .cols = c.cols})) continue;
      arms.push_back(MakeArm(type, repacked, c));
      if (progress) {
        progress(fmt::format("{}{}: {} matrices, {} of weights", WeightTypeName(type), repacked ? "/il16" : "",
                             arms.back().matrices.size(), FormatBytesIec(arms.back().sweep_bytes)));
      }
    }
  }
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // [tokens][cols] and [tokens][rows]; y [tokens][max(rows, cols)].
  std::vector<float> x_first(c.tokens * c.cols), x_second(c.tokens * c.rows),
      y(c.tokens * std::max(c.rows, c.cols));
  for (float& v : x_first) v = normal(rng);
  for (float& v : x_second) v = normal(rng);
  ThreadPool pool(c.threads);  // the benchmark's own, as a session owns one
  for (int32_t rep = 0; rep <= c.reps; ++rep) {
    for (Arm& a : arms) {
      const auto t0 = std::chrono::steady_clock::now();
      for (const Matrix& m : a.matrices) {
        const float* x = m.rows == c.rows && m.cols == c.cols ? x_first.data() : x_second.data();
        if (c.tokens == 1) {
          MatVec(m, x, y.data(), pool);
        } else {
          MatMul(m, x, c.tokens, y.data(), pool);
        }
      }
      const auto t1 = std::chrono::steady_clock::now();
      const double ns = std::chrono::duration<double, std::nano>(t1 - t0).count();
      if (rep > 0) a.ns.push_back(ns);
    }
    if (progress && rep > 0 && (rep % 4 == 0 || rep == c.reps)) {
      progress(fmt::format("repetition {}/{}", rep, c.reps));
    }
  }
  std::vector<MatVecBenchRow> rows;
  for (Arm& a : arms) {
    std::sort(a.ns.begin(), a.ns.end());
    const double median = a.ns[a.ns.size() / 2];
    const auto bytes = static_cast<double>(a.sweep_bytes);
    rows.push_back({.type = std::string(WeightTypeName(a.type)) + (a.repacked ? "/il16" : ""),
                    .matrices = static_cast<int64_t>(a.matrices.size()),
                    .sweep_bytes = a.sweep_bytes, .gbps = bytes / median, .gbps_min = bytes / a.ns.back(),
                    .gbps_max = bytes / a.ns.front(),
                    .us_per_matvec = median / 1e3 / static_cast<double>(a.matrices.size()),
                    .gmacs = static_cast<double>(a.matrices.size()) * static_cast<double>(c.rows * c.cols) *
                             c.tokens / median});
  }
  return rows;
}

}  // namespace kvq
