// Encode and decode throughput of every registered format (reference scalar codecs), at a
// realistic row shape (8 KV heads x head_dim 128). Prints numbers; asserts nothing.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "kvq/format.h"

namespace {

constexpr kvq::RowShape kShape{.n_kv_heads = 8, .head_dim = 128};

std::vector<float> RandomRows(int64_t n) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n * kShape.elems());
  for (float& v : x) v = dist(rng);
  return x;
}

void BM_Encode(benchmark::State& state, const kvq::Codec* codec) {
  const int64_t rows = codec->rows_per_block;
  const std::vector<float> x = RandomRows(rows);
  std::vector<uint8_t> block(codec->block_bytes(kShape));
  kvq::CodecArgs args{.shape = kShape};
  if (codec->calibrated) args.tensor_scale = codec->calibrate(x.data(), x.size());
  for (auto _ : state) {
    codec->encode_block(x.data(), block.data(), args);
    benchmark::DoNotOptimize(block.data());
  }
  state.SetItemsProcessed(state.iterations() * rows * kShape.elems());
}

void BM_DecodeRow(benchmark::State& state, const kvq::Codec* codec) {
  const std::vector<float> x = RandomRows(codec->rows_per_block);
  std::vector<uint8_t> block(codec->block_bytes(kShape));
  kvq::CodecArgs args{.shape = kShape};
  if (codec->calibrated) args.tensor_scale = codec->calibrate(x.data(), x.size());
  codec->encode_block(x.data(), block.data(), args);
  std::vector<float> out(kShape.elems());
  for (auto _ : state) {
    codec->decode_row(block.data(), 0, out.data(), args);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * kShape.elems());
}

[[maybe_unused]] const bool kRegistered = [] {
  for (const kvq::FormatDesc* f : kvq::Formats()) {
    benchmark::RegisterBenchmark((std::string("Encode/K/") + f->name).c_str(), BM_Encode, &f->key);
    benchmark::RegisterBenchmark((std::string("DecodeRow/K/") + f->name).c_str(), BM_DecodeRow,
                                 &f->key);
  }
  return true;
}();

}  // namespace
