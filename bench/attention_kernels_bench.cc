// Per-row cost of the SIMD codec kernels at real shapes (head_dim 128 and 64 — the llama-3.2-1b
// shape —, 4 query heads per KV head), one tile of 32 rows in cache: where decode attention
// spends its compute. IntScorePath/…: the integer score of int8/int4 keys on each path this CPU
// supports (every path gives the same bits), so one run compares them.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "formats/int_score.h"
#include "kvq/format.h"

namespace {

constexpr int32_t kGroup = 4;

struct Tile {
  std::vector<uint8_t> blocks;
  kvq::CodecArgs args;
  kvq::RowTile tile{};
};

Tile MakeTile(const kvq::Codec& codec, kvq::RowShape kShape) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Tile t;
  t.args.shape = kShape;
  const int64_t bb = codec.block_bytes(kShape);
  const int64_t n_blocks = codec.rows_per_block == 1 ? kvq::kMaxTileRows : 1;
  t.blocks.resize(n_blocks * bb);
  std::vector<float> rows(codec.rows_per_block * kShape.elems());
  for (int64_t b = 0; b < n_blocks; ++b) {
    for (float& x : rows) x = dist(rng);
    if (codec.calibrated) t.args.tensor_scale = codec.calibrate(rows.data(), rows.size());
    codec.encode_block(rows.data(), t.blocks.data() + b * bb, t.args);
  }
  t.tile = {t.blocks.data(), bb, 0, kvq::kMaxTileRows};
  return t;
}

// `f32`: the f32-arithmetic score even where the codec's default is integer arithmetic.
void BM_Score(benchmark::State& state, const kvq::Codec* codec, bool f32, kvq::RowShape kShape) {
  Tile t = MakeTile(*codec, kShape);
  std::vector<float> q(kGroup * kShape.head_dim, 0.5f), scores(kGroup * kvq::kMaxTileRows);
  const kvq::CodecKernels& k = codec->kernels();
  const auto score = f32 ? k.score_f32 : k.score;
  for (auto _ : state) {
    score(q.data(), kGroup, t.tile, 3, t.args, scores.data());
    benchmark::DoNotOptimize(scores.data());
  }
  state.SetItemsProcessed(state.iterations() * kvq::kMaxTileRows);  // rows
}

// The integer score of int8 / int4 keys (`bits`) on one path.
void BM_IntScorePath(benchmark::State& state, int bits, kvq::int_score::Path path, kvq::RowShape kShape) {
  Tile t = MakeTile(kvq::FindFormat(bits == 8 ? kvq::FormatId::kInt8 : kvq::FormatId::kInt4)->key, kShape);
  std::vector<float> q(kGroup * kShape.head_dim, 0.5f), scores(kGroup * kvq::kMaxTileRows);
  for (auto _ : state) {
    kvq::int_score::IntTokenScore(path, bits, q.data(), kGroup, t.tile, 3, t.args, scores.data());
    benchmark::DoNotOptimize(scores.data());
  }
  state.SetItemsProcessed(state.iterations() * kvq::kMaxTileRows);  // rows
}

void BM_Accumulate(benchmark::State& state, const kvq::Codec* codec, kvq::RowShape kShape) {
  Tile t = MakeTile(*codec, kShape);
  std::vector<float> c(kGroup * kvq::kMaxTileRows, 1.0f), e(c.size(), 0.01f), acc(kGroup * kShape.head_dim);
  const kvq::CodecKernels& k = codec->kernels();
  for (auto _ : state) {
    k.accumulate(c.data(), e.data(), kGroup, t.tile, 3, t.args, acc.data());
    benchmark::DoNotOptimize(acc.data());
  }
  state.SetItemsProcessed(state.iterations() * kvq::kMaxTileRows);
}

[[maybe_unused]] const bool kRegistered = [] {
  for (const int32_t hd : {128, 64}) {
    const kvq::RowShape shape{.n_kv_heads = 8, .head_dim = hd};
    const std::string at = "/hd" + std::to_string(hd);
    for (const kvq::FormatDesc* f : kvq::Formats()) {
      if (!kvq::CheckShape(*f, shape).ok()) continue;
      benchmark::RegisterBenchmark((std::string("Score/") + f->name + at).c_str(), BM_Score, &f->key, false, shape);
      if (f->key.kernels().score_int != nullptr) {
        benchmark::RegisterBenchmark((std::string("ScoreF32/") + f->name + at).c_str(), BM_Score, &f->key, true, shape);
      }
      benchmark::RegisterBenchmark((std::string("Accumulate/") + f->name + at).c_str(), BM_Accumulate, &f->value, shape);
    }
    for (const int bits : {8, 4}) {
      for (const kvq::int_score::Path path :
           {kvq::int_score::Path::kPortable, kvq::int_score::Path::kAvx2, kvq::int_score::Path::kAvx512Vnni}) {
        if (!kvq::int_score::Supported(path)) continue;
        benchmark::RegisterBenchmark(
            ("IntScorePath/int" + std::to_string(bits) + at + "/" + kvq::int_score::PathName(path)).c_str(),
            BM_IntScorePath, bits, path, shape);
      }
    }
  }
  return true;
}();

}  // namespace
