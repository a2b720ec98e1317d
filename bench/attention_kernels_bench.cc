// Per-row cost of the SIMD codec kernels at a real shape (head_dim 128, 4 query heads per KV
// head), one tile of 32 rows in cache: where decode attention spends its compute.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "kvq/format.h"

namespace {

constexpr kvq::RowShape kShape{.n_kv_heads = 8, .head_dim = 128};
constexpr int32_t kGroup = 4;

struct Tile {
  std::vector<uint8_t> blocks;
  kvq::CodecArgs args{.shape = kShape};
  kvq::RowTile tile{};
};

Tile MakeTile(const kvq::Codec& codec) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Tile t;
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
void BM_Score(benchmark::State& state, const kvq::Codec* codec, bool f32) {
  Tile t = MakeTile(*codec);
  std::vector<float> q(kGroup * kShape.head_dim, 0.5f), scores(kGroup * kvq::kMaxTileRows);
  const kvq::CodecKernels& k = codec->kernels();
  const auto score = f32 ? k.score_f32 : k.score;
  for (auto _ : state) {
    score(q.data(), kGroup, t.tile, 3, t.args, scores.data());
    benchmark::DoNotOptimize(scores.data());
  }
  state.SetItemsProcessed(state.iterations() * kvq::kMaxTileRows);  // rows
}

void BM_Accumulate(benchmark::State& state, const kvq::Codec* codec) {
  Tile t = MakeTile(*codec);
  std::vector<float> c(kGroup * kvq::kMaxTileRows, 1.0f), e(c.size(), 0.01f), acc(kGroup * kShape.head_dim);
  const kvq::CodecKernels& k = codec->kernels();
  for (auto _ : state) {
    k.accumulate(c.data(), e.data(), kGroup, t.tile, 3, t.args, acc.data());
    benchmark::DoNotOptimize(acc.data());
  }
  state.SetItemsProcessed(state.iterations() * kvq::kMaxTileRows);
}

[[maybe_unused]] const bool kRegistered = [] {
  for (const kvq::FormatDesc* f : kvq::Formats()) {
    benchmark::RegisterBenchmark((std::string("Score/") + f->name).c_str(), BM_Score, &f->key, false);
    if (f->key.kernels().score_int != nullptr) {
      benchmark::RegisterBenchmark((std::string("ScoreF32/") + f->name).c_str(), BM_Score, &f->key, true);
    }
    benchmark::RegisterBenchmark((std::string("Accumulate/") + f->name).c_str(), BM_Accumulate, &f->value);
  }
  return true;
}();

}  // namespace
