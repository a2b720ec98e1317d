// The WebAssembly module's weight kernels timed in Node (built by the Emscripten build beside the
// module: build/wasm/kvq-matvec-bench.js): per weight type, the row-major layout against the
// 16-row groups (MatrixLayout::kInterleaved16) that RepackMatrix writes, arms alternated round by
// round in one process, one thread (a type without groups: its rows alone). It answers what `kvq bench matvec` answers natively — which
// layout LoadModel should give a type on this target — for the target the page's CPU path runs
// (WASM, SIMD128), where kvq bench cannot run.
//
//   node build/wasm/kvq-matvec-bench.js [--type q4_0,q4_k,...] [--rows R] [--cols C]
//                                       [--matrices M] [--tokens T] [--rounds N]
//
// Each arm runs M matrices [R][C] (random weights through the type's reference quantiser) times
// T tokens (MatVec for 1, MatMul above) 4 times per round; a round's time per matrix and token is
// kept, the best and the mean over N rounds printed with GB/s of weight bytes. Not a test: speed
// here depends on the engine (V8's tiers) and the host.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "base/thread_pool.h"
#include "weights/matvec.h"
#include "weights/repack.h"
#include "weights/weight_type.h"

namespace {

// Whether the type's kernels read 16-row groups here (WeightKernels::interleaved_rows): the types
// RepackMatrix writes.
bool HasGroups(const kvq::WeightTypeDesc& type) { return type.kernels().interleaved_rows != nullptr; }

struct Options {
  std::vector<std::string> types;  // empty: every registered type with groups
  int64_t rows = 2048, cols = 2048, matrices = 4, tokens = 1, rounds = 5;
};

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr,
               "%s\nusage: node kvq-matvec-bench.js [--type q4_0,q4_k,...] [--rows R] [--cols C] [--matrices M] "
               "[--tokens T] [--rounds N]\n",
               why.c_str());
  std::exit(2);
}

int64_t Whole(std::string_view flag, const char* value, int64_t least) {
  char* end = nullptr;
  const long long v = std::strtoll(value, &end, 10);
  if (end == value || *end != '\0' || v < least) {
    Usage(std::string(flag) + " " + value + ": expected a whole number ≥ " + std::to_string(least));
  }
  return v;
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") Usage("The WebAssembly module's matvec kernels, rows vs 16-row groups.");
    if (i + 1 >= argc) Usage(std::string(flag) + ": expected a value");
    const char* value = argv[++i];
    if (flag == "--type") {
      o.types.clear();
      for (std::string_view rest = value; !rest.empty();) {
        const size_t comma = rest.find(',');
        o.types.emplace_back(rest.substr(0, comma));
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      }
    } else if (flag == "--rows") {
      o.rows = Whole(flag, value, 1);
    } else if (flag == "--cols") {
      o.cols = Whole(flag, value, 1);
    } else if (flag == "--matrices") {
      o.matrices = Whole(flag, value, 1);
    } else if (flag == "--tokens") {
      o.tokens = Whole(flag, value, 1);
    } else if (flag == "--rounds") {
      o.rounds = Whole(flag, value, 1);
    } else {
      Usage("unknown flag " + std::string(flag));
    }
  }
  if (o.types.empty()) {
    for (const kvq::WeightTypeDesc& type : kvq::WeightTypes()) {
      if (HasGroups(type)) o.types.emplace_back(type.name);
    }
  }
  if (o.rows < 16) Usage("--rows " + std::to_string(o.rows) + ": at least one group of 16 rows");
  for (const std::string& name : o.types) {  // every type checked before anything runs
    kvq::Result<const kvq::WeightTypeDesc*> found = kvq::FindWeightTypeByName(name);
    if (!found.ok()) Usage("--type " + name + ": " + found.status().message());
    const kvq::WeightTypeDesc& type = **found;
    if (o.cols % type.block_elems != 0) {
      Usage("--cols " + std::to_string(o.cols) + ": not whole blocks of " + type.label + " (" +
            std::to_string(type.block_elems) + ")");
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  kvq::ThreadPool pool(1);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(o.cols * o.tokens), y(o.rows * o.tokens), row(o.cols);  // x [T][C], y [T][R]
  for (float& v : x) v = normal(rng);
  std::printf("target %s, %lld x %lld, %lld matrices, %lld token(s), %lld rounds (time per matrix and token)\n",
              kvq::MatVecTargetName(), static_cast<long long>(o.rows), static_cast<long long>(o.cols),
              static_cast<long long>(o.matrices), static_cast<long long>(o.tokens), static_cast<long long>(o.rounds));
  std::printf("%-6s %11s %11s %9s %11s %11s %9s %13s %13s\n", "type", "rows us", "(mean)", "GB/s", "groups us", "(mean)",
              "GB/s", "groups/rows", "(of means)");
  for (const std::string& name : o.types) {
    const kvq::WeightTypeDesc& type = **kvq::FindWeightTypeByName(name);  // checked by Parse
    const int64_t row_bytes = kvq::MatrixRowBytes(type.type, o.cols);
    std::vector<std::vector<uint8_t>> plain(o.matrices), grouped(o.matrices);  // [M][R · row_bytes]
    std::vector<kvq::Matrix> arm[2];                                         // [rows, groups][M]
    for (int64_t m = 0; m < o.matrices; ++m) {
      plain[m].resize(o.rows * row_bytes);
      for (int64_t r = 0; r < o.rows; ++r) {
        for (float& v : row) v = normal(rng);
        kvq::QuantizeRowRef(type, row.data(), o.cols, plain[m].data() + r * row_bytes);
      }
      const kvq::Matrix rows{.type = type.type, .data = plain[m].data(), .rows = o.rows, .cols = o.cols};
      arm[0].push_back(rows);
      if (!HasGroups(type)) continue;
      grouped[m].resize(plain[m].size());
      // RepackMatrix writes the groups on any target (CanRepack also asks whether they pay here).
      arm[1].push_back(kvq::RepackMatrix(rows, grouped[m].data()));
    }
    const int n_arms = HasGroups(type) ? 2 : 1;
    double best[2] = {1e30, 1e30}, sum[2] = {0, 0};
    for (int64_t round = 0; round < o.rounds; ++round) {
      for (int a = 0; a < n_arms; ++a) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int rep = 0; rep < 4; ++rep) {
          for (const kvq::Matrix& w : arm[a]) kvq::MatMul(w, x.data(), o.tokens, y.data(), pool);
        }
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                         static_cast<double>(4 * o.matrices * o.tokens);
        best[a] = std::min(best[a], s);
        sum[a] += s;
      }
    }
    const double bytes = static_cast<double>(o.rows * row_bytes);
    std::printf("%-6s %11.1f %11.1f %9.2f", type.label, best[0] * 1e6, sum[0] / o.rounds * 1e6, bytes / best[0] / 1e9);
    if (n_arms == 1) {
      std::printf(" %11s %11s %9s %13s %13s\n", "-", "-", "-", "-", "-");  // no groups
      continue;
    }
    std::printf(" %11.1f %11.1f %9.2f %13.2f %13.2f\n", best[1] * 1e6, sum[1] / o.rounds * 1e6, bytes / best[1] / 1e9,
                best[0] / best[1], sum[0] / sum[1]);
  }
  return 0;
}
