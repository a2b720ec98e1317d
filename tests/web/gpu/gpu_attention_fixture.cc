// Writes the WebGPU attention test's inputs (tests/web/gpu/gpu_attention_test.mjs) with kvq's own
// codecs, so the WGSL kernels are checked against the bytes kvq's cache really holds: per case
// (format × GQA shape × positions) random q, k, v rows, the K and V rows encoded block by block
// (one position per block, or groups of 32 keys with the newest incomplete group kept as f32
// residual rows, as the cache stores them), and kvq's scalar decode of every row
// (Codec::decode_row), which the shader's in-register dequantisation must reproduce bit for bit;
// and per format whose V is one row per block (K one row or a group of 32), rows with edge values
// and kvq's encoding of them, which the WGSL encoders must reproduce
// (tests/web/gpu/gpu_kv_encode_page.js).
// Output: DIR/manifest.json and one DIR/<case>.bin per case (little-endian, sections back to back
// at the offsets the manifest gives). Usage: gpu_attention_fixture DIR
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <hwy/targets.h>
#include <nlohmann/json.hpp>

#include "kvq/format.h"
#include "weights/matvec.h"
#include "weights/repack.h"
#include "weights/weight_type.h"

namespace {

struct Shape {
  int32_t n_kv_heads, q_per_kv, head_dim;
};

// GQA shapes (one query head per KV head up to eight; head_dim 8 to 128; each format gets at least
// four: fp4-e2m1 refuses rows of 8 numbers), and every format (none needs a calibrated tensor scale).
constexpr Shape kShapes[] = {{1, 1, 8}, {2, 2, 16}, {2, 4, 32}, {4, 2, 64}, {1, 8, 128}};
constexpr const char* kFormats[] = {"f32",       "f16",      "bf16", "int8", "int4", "int2", "fp4-e2m1",
                                    "int4-kivi", "int2-kivi", "fp8-e4m3"};

struct Section {
  std::string name;
  std::vector<uint8_t> bytes;
};

template <typename T>
Section Bytes(const std::string& name, const std::vector<T>& v) {
  Section s{name, std::vector<uint8_t>(v.size() * sizeof(T))};
  std::memcpy(s.bytes.data(), v.data(), s.bytes.size());
  return s;
}

// Query positions per case: a prefill block of 8 at positions n − 8 .. n − 1 (the decode test
// takes the last).
constexpr int64_t kQueries = 8;

// One case: q [kQueries][n_q][d], k and v [n][n_kv][d] encoded per position, and their decoded rows.
int WriteCase(const std::filesystem::path& dir, const kvq::FormatDesc& f, const Shape& shape, int64_t n,
              uint64_t seed, nlohmann::json* manifest) {
  const kvq::RowShape row{.n_kv_heads = shape.n_kv_heads, .head_dim = shape.head_dim};
  const kvq::CodecArgs args{.shape = row};
  const int64_t elems = row.elems(), n_q = int64_t{shape.n_kv_heads} * shape.q_per_kv;
  std::mt19937_64 rng(seed);
  // Keys with a per-channel offset (as real keys have) and values N(0, 1); q scaled so scores
  // spread over a few units, and softmax weights are neither uniform nor one-hot.
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> channel(elems);
  for (float& c : channel) c = 2.0f * normal(rng);
  std::vector<float> q(kQueries * n_q * shape.head_dim), k(n * elems), v(n * elems);
  for (float& x : q) x = normal(rng) * 1.5f / std::sqrt(static_cast<float>(shape.head_dim));
  for (int64_t i = 0; i < n * elems; ++i) k[i] = channel[i % elems] + normal(rng);
  for (float& x : v) x = normal(rng);
  std::vector<Section> sections = {Bytes("q", q)};
  for (int which = 0; which < 2; ++which) {
    const kvq::Codec& codec = which == 0 ? f.key : f.value;
    if (codec.calibrated) {
      fmt::print(stderr, "gpu_attention_fixture: {} needs a calibrated tensor scale\n", f.name);
      return 1;
    }
    // Complete blocks of g rows; the rows after the last one stay f32 (the residual), which
    // "decode" to themselves.
    const int64_t g = codec.rows_per_block, block = codec.block_bytes(row), blocks = n / g;
    std::vector<uint8_t> encoded(blocks * block);
    std::vector<float> decoded(n * elems);
    const std::vector<float>& x = which == 0 ? k : v;
    for (int64_t b = 0; b < blocks; ++b) {
      codec.encode_block(x.data() + b * g * elems, encoded.data() + b * block, args);
      for (int32_t r = 0; r < g; ++r) {
        codec.decode_row(encoded.data() + b * block, r, decoded.data() + (b * g + r) * elems, args);
      }
    }
    const std::vector<float> residual(x.begin() + blocks * g * elems, x.end());
    std::copy(residual.begin(), residual.end(), decoded.begin() + blocks * g * elems);
    if (which == 1 && !residual.empty()) {
      fmt::print(stderr, "gpu_attention_fixture: {} values come in groups; the test expects one row per block\n",
                 f.name);
      return 1;
    }
    sections.push_back(Bytes(which == 0 ? "k_blocks" : "v_blocks", encoded));
    sections.push_back(Bytes(which == 0 ? "k_decoded" : "v_decoded", decoded));
    if (which == 0) sections.push_back(Bytes("k_residual", residual));
    (*manifest)[which == 0 ? "k_block_bytes" : "v_block_bytes"] = block;
    if (which == 0) (*manifest)["k_rows_per_block"] = g;
  }
  const std::string name = fmt::format("{}_kv{}_q{}_d{}_n{}", f.name, shape.n_kv_heads, shape.q_per_kv,
                                        shape.head_dim, n);
  std::ofstream out(dir / (name + ".bin"), std::ios::binary | std::ios::trunc);
  nlohmann::json offsets = nlohmann::json::object();
  int64_t at = 0;
  for (const Section& s : sections) {
    out.write(reinterpret_cast<const char*>(s.bytes.data()), static_cast<std::streamsize>(s.bytes.size()));
    offsets[s.name] = {{"offset", at}, {"bytes", s.bytes.size()}};
    at += static_cast<int64_t>(s.bytes.size());
  }
  if (!out.flush()) {
    fmt::print(stderr, "gpu_attention_fixture: cannot write {}\n", (dir / (name + ".bin")).string());
    return 1;
  }
  (*manifest)["name"] = name;
  (*manifest)["file"] = name + ".bin";
  (*manifest)["format"] = f.name;
  (*manifest)["n_kv_heads"] = shape.n_kv_heads;
  (*manifest)["q_per_kv"] = shape.q_per_kv;
  (*manifest)["head_dim"] = shape.head_dim;
  (*manifest)["positions"] = n;
  (*manifest)["queries"] = kQueries;
  (*manifest)["sections"] = offsets;
  return 0;
}

// One weight matrix per type (web/gpu/weight_types.js): rows × cols random weights quantised with
// kvq's reference quantiser (QuantizeRowRef), every weight decoded by the type's reference decoder
// (dequantize_block_ref), and an activation x. Section "w" holds the bytes as a GGUF would.
int WriteMatvecCase(const std::filesystem::path& dir, const std::string& type_name, int64_t rows, int64_t cols,
                    uint64_t seed, nlohmann::json* manifest) {
  const kvq::Result<const kvq::WeightTypeDesc*> t = kvq::FindWeightTypeByName(type_name);
  if (!t.ok()) {
    fmt::print(stderr, "gpu_attention_fixture: {}\n", t.status().message());
    return 1;
  }
  const kvq::WeightTypeDesc& type = **t;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(rows * cols), x(cols), decoded(rows * cols);
  for (float& v : w) v = normal(rng) / std::sqrt(static_cast<float>(cols));
  for (float& v : x) v = normal(rng);
  const int64_t blocks = cols / type.block_elems, row_bytes = blocks * type.block_bytes;
  std::vector<uint8_t> bytes(rows * row_bytes);
  for (int64_t r = 0; r < rows; ++r) {
    kvq::QuantizeRowRef(type, w.data() + r * cols, cols, bytes.data() + r * row_bytes);
    for (int64_t b = 0; b < blocks; ++b) {
      type.dequantize_block_ref(bytes.data() + r * row_bytes + b * type.block_bytes,
                                decoded.data() + r * cols + b * type.block_elems);
    }
  }
  const std::string name = fmt::format("matvec_{}_{}x{}", type.name, rows, cols);
  std::vector<Section> sections = {Bytes("w", bytes), Bytes("decoded", decoded), Bytes("x", x)};
  if (type.quantized_activation) {
    // kvq's MatVec on its SCALAR target (x quantised per 32, integer block dots, f32 block sums
    // in order): the arithmetic the GPU's quantised matvec runs, for a bit-for-bit check. Q4_0's
    // and Q8_0's rows there round as their groups do, acc = fma(s, I, acc) per block
    // (quant_rows-inl.h), which WGSL cannot do exactly: the GPU rounds s·I and the sum apart, so
    // their expected bits are that arithmetic, here in plain C++ (built with -ffp-contract=off).
    std::vector<float> y(rows);
    const kvq::Matrix plain{.type = type.type, .data = bytes.data(), .rows = rows, .cols = cols};
    if (type.type == kvq::WeightType::kQ4_0 || type.type == kvq::WeightType::kQ8_0) {
      std::vector<int8_t> q(cols);
      std::vector<float> dx(cols / 32);
      kvq::QuantizeActivationReference(x.data(), cols, q.data(), dx.data());
      for (int64_t r = 0; r < rows; ++r) {
        float acc = 0.0f;
        for (int64_t b = 0; b < cols / 32; ++b) {
          const float s = type.scale_ref(bytes.data() + r * row_bytes + b * type.block_bytes) * dx[b];
          const float product = s * static_cast<float>(kvq::BlockDotReference(plain, r, b, q.data()));
          acc += product;
        }
        y[r] = acc;
      }
    } else {
      hwy::SetSupportedTargetsForTest(HWY_SCALAR);
      kvq::MatVec(plain, x.data(), y.data(), kvq::ThreadPool::Shared(1));
      hwy::SetSupportedTargetsForTest(0);
    }
    sections.push_back(Bytes("y_scalar", y));
    // The same matrix as LoadModel repacks it (16-row groups, the last rows % 16 row-major): the
    // GPU reads it there with the same arithmetic, so it must give y_scalar's bits again.
    // Q1_0 and Q2_0 are repacked only where this host's SIMD target runs their AVX3_DL kernels, the
    // K-quants, Q4_0 and Q8_0 only where their x86 ones, never in the WebAssembly module. Q2_K
    // and Q3_K have no WGSL for the groups; Q4_K, Q5_K and Q6_K keep theirs (kquant_weights.js),
    // checked here though the module holds their rows.
    if (kvq::CanRepack(plain) && type.type != kvq::WeightType::kQ1_0 && type.type != kvq::WeightType::kQ2_0 &&
        type.type != kvq::WeightType::kQ2_K && type.type != kvq::WeightType::kQ3_K) {
      std::vector<uint8_t> repacked(bytes.size());
      kvq::RepackMatrix(plain, repacked.data());
      sections.push_back(Bytes("w_interleaved", repacked));
    }
  }
  std::ofstream out(dir / (name + ".bin"), std::ios::binary | std::ios::trunc);
  nlohmann::json offsets = nlohmann::json::object();
  int64_t at = 0;
  for (const Section& s : sections) {
    out.write(reinterpret_cast<const char*>(s.bytes.data()), static_cast<std::streamsize>(s.bytes.size()));
    offsets[s.name] = {{"offset", at}, {"bytes", s.bytes.size()}};
    at += static_cast<int64_t>(s.bytes.size());
  }
  if (!out.flush()) return 1;
  *manifest = {{"name", name}, {"file", name + ".bin"}, {"type", type.name}, {"rows", rows}, {"cols", cols},
               {"sections", offsets}};
  return 0;
}

// Rows for the GPU encoders (web/gpu/kv_formats.js) and kvq's bytes for them, per format whose
// V is one row per block and K one row or a group of 32: random rows, then rows of edge values
// per head (zeros and −0; f32 subnormals; f16's subnormal range, its rounding ties and overflow;
// huge numbers; ±inf; NaNs, one with a payload; an int8 scale of 0.25 with x / s ties; a head too
// small for a nonzero f16 scale; a head whose max overflows f16). For a grouped K (KIVI), whose
// scales are per channel over a group, the rows are padded to a group with heads of one repeated
// value (max − z = 0: s = 0; 1 + 3·2^-11, whose f16 z rounds above the max: s < 0; −inf: s < 0
// and x = −inf) or of 0, −0, 0, …, −0 (of equal numbers glibc's std::fmin and std::fmax keep the
// first: z = +0) or of NaNs of both signs (min and max the last NaN: z and s ±65504, its sign),
// then a second group whose channels hold the edge lists down their 32 rows, and the last three
// channels those repeated ±0, −inf and NaNs, then a third group of finite numbers (fp8-e4m3's ties
// at e = 0 and a head of f32 subnormals). The edge heads also hold E4M3 and E2M1 rounding ties
// and saturation (fp8-e4m3, fp4-e2m1) and an int4 scale that is an f16 tie. x: [rows][n_kv_heads][head_dim];
// k_blocks, v_blocks: the codecs' encode_block of each block (k_rows_per_block rows).
int WriteEncodeCase(const std::filesystem::path& dir, const kvq::FormatDesc& f, uint64_t seed,
                    nlohmann::json* manifest) {
  const kvq::RowShape row{.n_kv_heads = 2, .head_dim = 16};
  const kvq::CodecArgs args{.shape = row};
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float payload_nan = std::bit_cast<float>(0xffc12345u);
  // A head of f32 subnormals, bits first + i · step, signs alternating.
  const auto Subnormals = [&](uint32_t first, uint32_t step) {
    std::vector<float> head(row.head_dim);
    for (uint32_t i = 0; i < head.size(); ++i) head[i] = std::bit_cast<float>(((i % 2) << 31) | (first + i * step));
    return head;
  };
  // fp8-e4m3 at e = 0 (amax 448): E4M3 ties (1.0625 → 1, 1.1875 → 1.25, 248 → 256, 432 → 448;
  // subnormal 2^-10 → 0, 3·2^-10 → 2^-8, 15·2^-10 → 2^-6), beside them, 448 itself.
  const std::vector<float> fp8_ties = {448.0f, -448.0f, 1.0625f, 1.1875f, -1.0625f, 0x1p-10f, 0x3p-10f, 0xfp-10f,
                                       248.0f, 432.0f, std::nextafter(1.0625f, 2.0f), std::nextafter(0x1p-10f, 1.0f),
                                       -0x1p-11f, 447.0f, 0.0f, -0.0f};
  const std::vector<std::vector<float>> edge_heads = {
      {0.0f, -0.0f},
      {1e-45f, -1e-40f, 1.17e-38f, 1.0f, -1.0f},
      {0x1p-25f, -0x1p-25f, 0x3p-25f, 0x1p-24f, 0x1.8p-24f, 3e-8f, 6e-8f, 6.1e-5f, 0x1.ffcp-15f, 0x1p-14f},
      {1.0f + 0x1p-11f, 1.0f + 0x3p-11f, -(1.0f + 0x1p-11f), 65504.0f, 65519.0f, 65520.0f, -65520.0f, 1e5f},
      {1e30f, -3.4e38f, 2.0f},
      {inf, 1.0f, -2.0f, 0.5f},
      {-inf, 3.0f},
      {nan, 1.0f, -4.0f, payload_nan, -nan},
      {31.75f, 0.125f, 0.375f, -0.125f, -0.375f, 0.625f, -0.625f, 31.625f, -31.75f},
      {1e-9f, -2e-9f, 5e-10f},
      {1e38f, -2e38f, 1e30f, 65504.0f},
      // fp4-e2m1: amax / 6 = 1.0625, an E4M3 tie (s = 1, the even code), then x / s at every E2M1
      // tie (0.25 → 0, 0.75 → 1, 1.25 → 1, 1.75 → 2, 2.5 → 2, 3.5 → 4, 5 → 4), beside them, past 6.
      {6.375f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -0.75f, -2.5f, -5.0f, -0.25f,
       std::nextafter(0.75f, 0.0f), std::nextafter(2.5f, 3.0f), -0.0f, 1e-3f},
      // fp4-e2m1 at s = 1.125 (amax 6.75): the E2M1 ties x / s are quotients, not x itself.
      {6.75f, 0.28125f, 0.84375f, 1.40625f, 1.96875f, 2.8125f, 3.9375f, 5.625f, -0.84375f, -2.8125f,
       -5.625f, std::nextafter(0.84375f, 0.0f), std::nextafter(2.8125f, 3.0f), 0.5625f, -6.75f, 0.0f},
      fp8_ties,
      // Two heads of f32 subnormals only (one row): fp8-e4m3's row exponent is its least, 2^-126,
      // and x · 2^126 is E4M3's normal and subnormal range.
      Subnormals(0x000fffffu, 0x00070000u), Subnormals(1u, 0x00051000u),
      // int4: max|x| / 7 = 1.35400390625, an f16 tie (kvq's scale rounds to even: 0x3d6a; a
      // division off by an ulp gives 0x3d6b).
      {9.47802734375f, -1.0f, 4.0f},
  };
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t g = f.key.rows_per_block;
  const int64_t elems = row.elems(), d = row.head_dim;
  const int64_t edge_rows = (static_cast<int64_t>(edge_heads.size()) + row.n_kv_heads - 1) / row.n_kv_heads;
  const int64_t kRandomRows = g == 1 ? 24 : g - 3 - edge_rows;  // a group: room for 3 rows of repeated values
  const int64_t rows = g == 1 ? kRandomRows + edge_rows : 3 * g;
  std::vector<float> x(rows * elems);
  for (int64_t i = 0; i < kRandomRows * elems; ++i) x[i] = normal(rng) * (i % 7 == 3 ? 40.0f : 1.0f);
  for (size_t h = 0; h < edge_heads.size(); ++h) {  // each edge head padded with small random numbers
    float* head = x.data() + kRandomRows * elems + static_cast<int64_t>(h) * d;
    for (int64_t i = 0; i < d; ++i) {
      head[i] = i < static_cast<int64_t>(edge_heads[h].size()) ? edge_heads[h][i] : 0.01f * normal(rng);
    }
  }
  if (g > 1) {
    // Repeated value kind k at index i: 1.5, 1 + 3·2^-11, ±0 alternating (from +0), −inf, NaNs
    // alternating (from +NaN to a −NaN), 1.5.
    const auto repeated = [&](int64_t k, int64_t i) {
      const float values[] = {1.5f, 1.0f + 0x3p-11f, i % 2 == 0 ? 0.0f : -0.0f, -inf, i % 2 == 0 ? nan : payload_nan};
      return values[k % 5];
    };
    for (int64_t r = kRandomRows + edge_rows, k = 0; r < g; ++r) {
      for (int64_t h = 0; h < row.n_kv_heads; ++h, ++k) {
        for (int64_t i = 0; i < d; ++i) x[r * elems + h * d + i] = repeated(k, i);
      }
    }
    for (int64_t c = 0; c < elems; ++c) {  // channel c of the second group: an edge list down its rows
      const std::vector<float>& edges = edge_heads[c % edge_heads.size()];
      for (int64_t r = 0; r < g; ++r) {
        x[(g + r) * elems + c] = c >= elems - 3                          ? repeated(c - elems + 5, r)
                                 : r < static_cast<int64_t>(edges.size()) ? edges[r]
                                                                         : 0.01f * normal(rng);
      }
    }
    // A third group of finite numbers (the first two hold infinities: fp8-e4m3's key exponents
    // there are the largest): head 0 random with the fp8-e4m3 edge head as a row (e = 0),
    // head 1 random f32 subnormals (e = −126). The edge row is the group's last: an exponent left
    // short of the group's last row is seen.
    for (int64_t r = 0; r < g; ++r) {
      for (int64_t i = 0; i < d; ++i) {
        x[(2 * g + r) * elems + i] = r == g - 1 ? fp8_ties[i] : 0.5f * normal(rng);
        x[(2 * g + r) * elems + d + i] = std::bit_cast<float>(static_cast<uint32_t>(rng()) & 0x807fffffu);
      }
    }
  }
  std::vector<Section> sections = {Bytes("x", x)};
  for (int which = 0; which < 2; ++which) {
    const kvq::Codec& codec = which == 0 ? f.key : f.value;
    const int64_t block = codec.block_bytes(row), rows_per_block = codec.rows_per_block;
    std::vector<uint8_t> encoded(rows / rows_per_block * block);
    for (int64_t b = 0; b < rows / rows_per_block; ++b) {
      codec.encode_block(x.data() + b * rows_per_block * elems, encoded.data() + b * block, args);
    }
    sections.push_back(Bytes(which == 0 ? "k_blocks" : "v_blocks", encoded));
    (*manifest)[which == 0 ? "k_block_bytes" : "v_block_bytes"] = block;
  }
  (*manifest)["k_rows_per_block"] = g;
  const std::string name = fmt::format("encode_{}", f.name);
  std::ofstream out(dir / (name + ".bin"), std::ios::binary | std::ios::trunc);
  nlohmann::json offsets = nlohmann::json::object();
  int64_t at = 0;
  for (const Section& sec : sections) {
    out.write(reinterpret_cast<const char*>(sec.bytes.data()), static_cast<std::streamsize>(sec.bytes.size()));
    offsets[sec.name] = {{"offset", at}, {"bytes", sec.bytes.size()}};
    at += static_cast<int64_t>(sec.bytes.size());
  }
  if (!out.flush()) return 1;
  (*manifest)["name"] = name;
  (*manifest)["file"] = name + ".bin";
  (*manifest)["format"] = f.name;
  (*manifest)["n_kv_heads"] = row.n_kv_heads;
  (*manifest)["head_dim"] = row.head_dim;
  (*manifest)["rows"] = rows;
  (*manifest)["sections"] = offsets;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fmt::print(stderr, "usage: gpu_attention_fixture DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  nlohmann::json cases = nlohmann::json::array();
  uint64_t seed = 1;
  for (const char* name : kFormats) {
    const kvq::Result<const kvq::FormatDesc*> f = kvq::FindFormat(name);
    if (!f.ok()) {
      fmt::print(stderr, "gpu_attention_fixture: {}\n", f.status().message());
      return 1;
    }
    // 100 positions in every shape (every window size 1..100 is tried), and 4,100 in one: a
    // 32-row group codec then holds 4 residual keys.
    for (const Shape& shape : kShapes) {
      if (!(*f)->key.check_shape({.n_kv_heads = shape.n_kv_heads, .head_dim = shape.head_dim}).empty()) continue;
      nlohmann::json c;
      if (WriteCase(dir, **f, shape, 100, seed++, &c) != 0) return 1;
      cases.push_back(c);
    }
    nlohmann::json c;
    if (WriteCase(dir, **f, {1, 2, 16}, 4100, seed++, &c) != 0) return 1;  // small: SwiftShader is a CPU
    cases.push_back(c);
  }
  nlohmann::json matvec = nlohmann::json::array();
  // Every registered weight type (the page checks that the GPU reads each one): 512 columns are
  // whole blocks of every type (1 .. 256 elements).
  for (const kvq::WeightTypeDesc& type : kvq::WeightTypes()) {
    nlohmann::json c;
    if (WriteMatvecCase(dir, type.name, 72, 512, seed++, &c) != 0) return 1;
    matvec.push_back(c);
  }
  // Every registered format whose V is one row per block and K one row or a group of 32: the
  // encoder cases.
  nlohmann::json encode = nlohmann::json::array();
  for (const kvq::FormatDesc* f : kvq::Formats()) {
    if ((f->key.rows_per_block != 1 && f->key.rows_per_block != 32) || f->value.rows_per_block != 1 ||
        f->key.calibrated || f->value.calibrated) {
      continue;
    }
    nlohmann::json c;
    if (WriteEncodeCase(dir, *f, seed++, &c) != 0) return 1;
    encode.push_back(c);
  }
  std::ofstream(dir / "manifest.json", std::ios::trunc)
      << nlohmann::json{{"cases", cases}, {"matvec", matvec}, {"encode", encode}}.dump(1) << "\n";
  fmt::print("gpu_attention_fixture: {} attention cases and {} matvec cases in {}\n", cases.size(), matvec.size(),
             dir.string());
  return 0;
}
