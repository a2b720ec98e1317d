// The KV transforms (kvq/kv_spec.h) keep the cache's contract (docs/design.md §3, §4): for every
// format and every combination of rotation, sinks and residual, attention through the cache —
// every tier, every page size, scalar and SIMD kernels — gives the same bits as one window over
// an oracle built here from the transform's rules (rows rotated; sink rows and the newest rows
// read in f32; aged rows encoded, sink slots holding the stand-in); that one window split
// anywhere gives the same bits again, and seed 000's three windowing bugs are caught. Snapshots
// restore the transforms and continue bit for bit; a spec that cannot apply is refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>

#include "formats/row_sequence.h"
#include "formats/transforms/hadamard.h"
#include "kvq/kv_cache.h"
#include "kvq/kv_spec.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

constexpr AttentionShape kShape{.n_heads = 8, .n_kv_heads = 2, .head_dim = 16};
constexpr RowShape kRow{.n_kv_heads = 2, .head_dim = 16};
constexpr int64_t kElems = 2 * 16;

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  // An outlier channel, as real keys have: what rotation and sinks are for.
  for (int64_t i = 3; i < n; i += kElems) x[i] *= 12.0f;
  return x;
}

AttentionOptions Options(AttentionKernel kernel) { return {.scale = 0.25f, .kernel = kernel, .threads = 1}; }

KvSpec Spec(const std::string& text) {
  Result<KvSpec> s = ParseKvSpec(text);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? *s : KvSpec{FindFormat(FormatId::kF32), {}};
}

// Uneven append blocks, as a prefill and then decode steps would write.
template <class Fn>
void InBlocks(int64_t n, Fn append) {
  for (int64_t done = 0, step = 5; done < n; done += step, step = step * 3 % 97 + 1) {
    append(done, std::min(step, n - done));
  }
}

// One tensor as the transform's rules say it is read: [0, S) f32 (rotated) sinks, then the
// encoded rows, then f32 (rotated) rows from max(encoded, S) on.
struct OracleTensor {
  std::vector<float> rows;     // [n][elems], rotated when the spec rotates
  RowSequence encoded;         // rows [0, EncodedRows(n)), sink slots holding the stand-in
  int64_t n_encoded = 0;
  int64_t n_head = 0;

  OracleTensor(const KvSpec& spec, bool key, const std::vector<float>& x, int64_t n, uint64_t seed)
      : rows(x.begin(), x.begin() + n * kElems), encoded(key ? spec.format->key : spec.format->value, kRow) {
    const Codec& codec = key ? spec.format->key : spec.format->value;
    const KvTransforms& t = spec.transforms;
    if (t.rotate) {
      const std::vector<float> signs = RotationSigns(seed, kRow.head_dim);
      RotateHeads(signs.data(), kRow.head_dim, n * kRow.n_kv_heads, rows.data());
    }
    n_encoded = EncodedRows(codec, t, n);
    n_head = std::min<int64_t>(n, t.sinks);
    std::vector<float> stored(rows.begin(), rows.begin() + n_encoded * kElems);
    const int32_t G = codec.rows_per_block;
    for (int64_t p = 0; p < std::min<int64_t>(n_encoded, t.sinks); ++p) {
      const int64_t block_end = (p / G + 1) * G;
      float* dst = stored.data() + p * kElems;
      if (t.sinks < block_end) {
        std::memcpy(dst, rows.data() + t.sinks * kElems, kElems * sizeof(float));
      } else {
        std::fill(dst, dst + kElems, 0.0f);
      }
    }
    encoded.Append(stored.data(), n_encoded);
  }

  RowsView View() const {
    RowsView v = encoded.View(0, n_encoded);
    const int64_t n = static_cast<int64_t>(rows.size()) / kElems;
    v.head = rows.data();
    v.n_head_rows = n_head;
    v.n_block_rows = std::max(n_encoded, n_head);
    v.residual = rows.data() + v.n_block_rows * kElems;
    v.n_rows = n;
    return v;
  }
};

// Rows [a, b) of a view, as a window over them would see them.
RowsView SubView(const RowsView& v, int64_t a, int64_t b) {
  RowsView s = v;
  s.head = v.head + a * kElems;
  s.n_head_rows = std::clamp<int64_t>(v.n_head_rows - a, 0, b - a);
  s.first_row = v.first_row + a;
  s.n_block_rows = std::clamp<int64_t>(v.n_block_rows - a, s.n_head_rows, b - a);
  s.residual = v.residual + std::max<int64_t>(0, a - v.n_block_rows) * kElems;
  s.n_rows = b - a;
  return s;
}

class Windows final : public KvWindowSource {
 public:
  Windows(const RowsView& k, const RowsView& v, std::vector<std::pair<int64_t, int64_t>> ranges)
      : k_(k), v_(v), ranges_(std::move(ranges)) {}
  int64_t n_windows() const override { return static_cast<int64_t>(ranges_.size()); }
  Result<KvWindow> Acquire(int64_t i) override {
    const auto [a, b] = ranges_[i];
    return KvWindow{.first_position = a, .k = SubView(k_, a, b), .v = SubView(v_, a, b)};
  }

 private:
  RowsView k_, v_;
  std::vector<std::pair<int64_t, int64_t>> ranges_;
};

// Each query token t (at p = n − n_tokens + t) reads the rows as a cache holding p + 1 of them
// holds them (KvCache::Attend): its own tensors of p + 1 rows, the windows cut at p + 1.
struct Oracle {
  LayerFormats f;
  std::vector<float> kx, vx;  // [n][elems] the rows appended
  int64_t n;
  std::vector<float> signs;
  Oracle(const LayerFormats& formats, const std::vector<float>& k, const std::vector<float>& v, int64_t rows)
      : f(formats), kx(k), vx(v), n(rows), signs(RotationSigns(kDefaultRotationSeed, kRow.head_dim)) {}

  // Attention for the last n_tokens positions over `ranges`; `between` may damage the state
  // between windows (seed 000's third bug).
  std::vector<float> Run(std::vector<float> q, int32_t n_tokens, AttentionKernel kernel,
                         const std::vector<std::pair<int64_t, int64_t>>& ranges, bool normalise_between = false) {
    if (f.key_transforms.rotate) RotateHeads(signs.data(), kShape.head_dim, int64_t{n_tokens} * kShape.n_heads, q.data());
    const int64_t q_row = int64_t{kShape.n_heads} * kShape.head_dim;
    std::vector<float> out(q.size());
    for (int32_t t = 0; t < n_tokens; ++t) {
      const int64_t p = n - n_tokens + t;
      const OracleTensor k(f.Key(), true, kx, p + 1, kDefaultRotationSeed);
      const OracleTensor v(f.Value(), false, vx, p + 1, kDefaultRotationSeed);
      AttentionState state(kShape, 1);
      for (size_t w = 0; w < ranges.size(); ++w) {
        const int64_t a = ranges[w].first, b = std::min(ranges[w].second, p + 1);
        if (a < b) {
          Windows one(k.View(), v.View(), {{a, b}});
          EXPECT_TRUE(AttendWindows(Options(kernel), q.data() + t * q_row, p, one, state).ok());
        }
        if (normalise_between && w == 0) {
          for (size_t h = 0; h < state.l.size(); ++h) {
            if (state.l[h] == 0.0f) continue;
            for (int32_t i = 0; i < kShape.head_dim; ++i) state.acc[h * kShape.head_dim + i] /= state.l[h];
            state.l[h] = 1.0f;
          }
        }
      }
      FinishAttention(state, out.data() + t * q_row);
    }
    if (f.value_transforms.rotate) {
      UnrotateHeads(signs.data(), kShape.head_dim, int64_t{n_tokens} * kShape.n_heads, out.data());
    }
    return out;
  }
};

std::unique_ptr<KvCache> MakeCache(const LayerFormats& f, int64_t max_positions, int32_t page, KvBudgets budgets) {
  Result<std::unique_ptr<KvCache>> c = KvCache::Create({.n_layers = 1, .n_kv_heads = kRow.n_kv_heads,
                                                        .head_dim = kRow.head_dim, .layers = {f},
                                                        .max_positions = max_positions, .page_positions = page,
                                                        .budgets = budgets});
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? std::move(c).value() : nullptr;
}

std::vector<float> AttendCache(KvCache& cache, const std::vector<float>& q, int32_t n_tokens, AttentionKernel kernel) {
  AttentionState state(kShape, n_tokens);
  const Status s = cache.Attend(0, Options(kernel), q.data(), cache.positions(0) - n_tokens, state);
  EXPECT_TRUE(s.ok()) << s.message();
  std::vector<float> out(q.size());
  cache.FinishAttention(0, state, out.data());
  return out;
}

const char* const kTransformSets[] = {"", "+rot", "+sink4", "+res40", "+sink3+res70", "+rot+sink4+res40", "+sink40"};

// Every format (a calibrated one excepted: its scale comes from the cache's first encoded rows,
// which the oracle's single append does not reproduce; none is registered now) with every
// transform set, and pairs whose K and V differ.
std::vector<LayerFormats> OraclePairs() {
  std::vector<LayerFormats> pairs;
  for (const FormatDesc* f : Formats()) {
    if (f->key.calibrated || f->value.calibrated) continue;
    for (const char* t : kTransformSets) {
      const KvSpec s = Spec(std::string(f->name) + t);
      pairs.push_back(LayerFormats::Of(s, s));
    }
  }
  pairs.push_back(LayerFormats::Of(Spec("int4-kivi+sink4+res40"), Spec("int8+rot")));
  pairs.push_back(LayerFormats::Of(Spec("int2+rot+res64"), Spec("int2-kivi+sink2")));
  return pairs;
}

TEST(KvTransforms, CacheEqualsTheOracleInOneWindowAndSplitAnywhere) {
  const int64_t n = 300;
  const std::vector<float> k = Random(n * kElems, 1), v = Random(n * kElems, 2);
  for (const LayerFormats& f : OraclePairs()) {
    Oracle oracle(f, k, v, n);
    for (int32_t tokens : {1, 3}) {
      const std::vector<float> q = Random(int64_t{tokens} * kShape.n_heads * kShape.head_dim, 3);
      for (AttentionKernel kernel : {AttentionKernel::kScalar, AttentionKernel::kSimd}) {
        SCOPED_TRACE(::testing::Message() << LayerFormatsName(f) << " tokens " << tokens
                                          << (kernel == AttentionKernel::kSimd ? " simd" : " scalar"));
        const std::vector<float> whole = oracle.Run(q, tokens, kernel, {{0, n}});
        for (int64_t split : {int64_t{2}, int64_t{4}, int64_t{40}, int64_t{229}, int64_t{250}}) {
          ASSERT_EQ(oracle.Run(q, tokens, kernel, {{0, split}, {split, n}}), whole) << "split " << split;
          EXPECT_NE(oracle.Run(q, tokens, kernel, {{0, split}, {split + 1, n}}), whole) << "drop @" << split;
          EXPECT_NE(oracle.Run(q, tokens, kernel, {{0, split + 1}, {split, n}}), whole) << "overlap @" << split;
          EXPECT_NE(oracle.Run(q, tokens, kernel, {{0, split}, {split, n}}, true), whole) << "normalise @" << split;
        }
        for (int32_t page : {32, 64}) {
          auto resident = MakeCache(f, 1000, page, {});
          ASSERT_NE(resident, nullptr);
          InBlocks(n, [&](int64_t at, int64_t m) {
            ASSERT_TRUE(resident->Append(0, k.data() + at * kElems, v.data() + at * kElems, m).ok());
          });
          ASSERT_EQ(AttendCache(*resident, q, tokens, kernel), whole) << "page " << page;
        }
      }
    }
  }
}

// Every format including fp8, every transform set: resident, host-streamed and disk-streamed
// caches at two page sizes all give the same bits.
TEST(KvTransforms, EveryTierAndPageSizeGivesTheSameBits) {
  const int64_t n = 300;
  const std::vector<float> k = Random(n * kElems, 4), v = Random(n * kElems, 5);
  std::vector<LayerFormats> pairs;
  for (const FormatDesc* f : Formats()) {
    for (const char* t : kTransformSets) {
      const KvSpec s = Spec(std::string(f->name) + t);
      pairs.push_back(LayerFormats::Of(s, s));
    }
  }
  pairs.push_back(LayerFormats::Of(Spec("fp8-e4m3+sink4"), Spec("int4-kivi+res100")));
  const std::vector<float> q = Random(3 * kShape.n_heads * kShape.head_dim, 6);
  for (const LayerFormats& f : pairs) {
    SCOPED_TRACE(LayerFormatsName(f));
    std::vector<float> want;
    for (int32_t page : {32, 64}) {
      const fs::path dir = fs::path(::testing::TempDir()) / ("kvq_transforms_" + std::to_string(getpid()));
      fs::create_directories(dir);
      auto resident = MakeCache(f, 1000, page, {});
      ASSERT_NE(resident, nullptr);
      const int64_t three = 3 * resident->plan().slot_bytes;
      auto host = MakeCache(f, 1000, page, {.device_bytes = three});
      auto disk = MakeCache(f, 1000, page, {.device_bytes = three, .disk_dir = dir.string()});
      ASSERT_NE(host, nullptr);
      ASSERT_NE(disk, nullptr);
      for (KvCache* c : {resident.get(), host.get(), disk.get()}) {
        InBlocks(n, [&](int64_t at, int64_t m) {
          ASSERT_TRUE(c->Append(0, k.data() + at * kElems, v.data() + at * kElems, m).ok());
        });
        const std::vector<float> got = AttendCache(*c, q, 3, AttentionKernel::kSimd);
        if (want.empty()) want = got;
        ASSERT_EQ(got, want) << "page " << page;
      }
      EXPECT_GE(host->plan().device_slots, 2);
      fs::remove_all(dir);
    }
  }
}

// Restore-then-continue equals the uninterrupted cache, token for token (attention outputs bit
// for bit after every later append), with transforms on K and V; other transforms are refused.
TEST(KvTransforms, SnapshotsRestoreTransformsAndContinueBitIdentically) {
  const int64_t n = 200, more = 90;
  const std::vector<float> k = Random((n + more) * kElems, 7), v = Random((n + more) * kElems, 8);
  const std::vector<float> q = Random(kShape.n_heads * kShape.head_dim, 9);
  const ModelFingerprint model{.n_layers = 1, .n_kv_heads = 2, .head_dim = 16, .weights_hash = 42};
  const fs::path path = fs::path(::testing::TempDir()) / ("kvq_transforms_snap_" + std::to_string(getpid()));
  for (const LayerFormats& f : {LayerFormats::Of(Spec("int4+rot+sink4+res40"), Spec("int2-kivi+rot+res70")),
                                LayerFormats::Of(Spec("fp8-e4m3+sink3"), Spec("int8+res33"))}) {
    SCOPED_TRACE(LayerFormatsName(f));
    auto straight = MakeCache(f, 1000, 64, {});
    auto saved = MakeCache(f, 1000, 64, {});
    ASSERT_NE(straight, nullptr);
    ASSERT_NE(saved, nullptr);
    for (KvCache* c : {straight.get(), saved.get()}) {
      InBlocks(n, [&](int64_t at, int64_t m) { ASSERT_TRUE(c->Append(0, k.data() + at * kElems, v.data() + at * kElems, m).ok()); });
    }
    ASSERT_TRUE(saved->Save(path.string(), model).ok());
    auto restored = MakeCache(f, 1000, 64, {});
    ASSERT_NE(restored, nullptr);
    ASSERT_TRUE(restored->Load(path.string(), model).ok());
    for (int64_t p = n; p < n + more; ++p) {
      ASSERT_TRUE(straight->Append(0, k.data() + p * kElems, v.data() + p * kElems, 1).ok());
      ASSERT_TRUE(restored->Append(0, k.data() + p * kElems, v.data() + p * kElems, 1).ok());
      ASSERT_EQ(AttendCache(*restored, q, 1, AttentionKernel::kSimd), AttendCache(*straight, q, 1, AttentionKernel::kSimd))
          << "position " << p;
    }
    // The same formats with other transforms: refused, nothing loaded.
    LayerFormats other = f;
    other.key_transforms.sinks += 1;
    auto wrong = MakeCache(other, 1000, 64, {});
    ASSERT_NE(wrong, nullptr);
    const Result<std::vector<int32_t>> loaded = wrong->Load(path.string(), model);
    EXPECT_FALSE(loaded.ok());
    EXPECT_EQ(wrong->positions(0), 0);
  }
  fs::remove(path);
}

TEST(KvTransforms, RotationIsOrthonormalAndItsInverseExactToTheBound) {
  for (int32_t d : {1, 2, 8, 16, 64, 128, 256}) {
    SCOPED_TRACE(d);
    const std::vector<float> signs = RotationSigns(kDefaultRotationSeed, d);
    // Columns R e_j; the Gram matrix of an orthonormal map is I. Each entry is ±1/√d rounded
    // once, so |(RᵀR)_ij − δ_ij| ≤ d · (2u · 1/d) = 2u, with room for the sum: 4u.
    std::vector<float> cols(static_cast<size_t>(d) * d, 0.0f);  // [d][d]
    for (int32_t j = 0; j < d; ++j) cols[j * d + j] = 1.0f;
    RotateHeads(signs.data(), d, d, cols.data());
    const double u = std::ldexp(1.0, -24);
    for (int32_t i = 0; i < d; ++i) {
      for (int32_t j = 0; j < d; ++j) {
        double dot = 0;
        for (int32_t r = 0; r < d; ++r) dot += double{cols[i * d + r]} * cols[j * d + r];
        EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 4 * u) << i << "," << j;
      }
    }
    std::mt19937 rng(d);
    std::normal_distribution<float> dist;
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<float> x(d);
      for (float& e : x) e = dist(rng);
      std::vector<float> y = x;
      RotateHeads(signs.data(), d, 1, y.data());
      UnrotateHeads(signs.data(), d, 1, y.data());
      double err = 0, norm = 0;
      for (int32_t i = 0; i < d; ++i) {
        err += (double{y[i]} - x[i]) * (double{y[i]} - x[i]);
        norm += double{x[i]} * x[i];
      }
      EXPECT_LE(std::sqrt(err), RotationRoundTripBound(d) * std::sqrt(norm));
    }
  }
  // The signs are a fixed function of the seed: reproducible, and another seed gives others.
  EXPECT_EQ(RotationSigns(1, 64), RotationSigns(1, 64));
  EXPECT_NE(RotationSigns(1, 64), RotationSigns(2, 64));
}

TEST(KvTransforms, SpecsParsePrintAndRefuseClearly) {
  for (const char* text : {"int4", "int4+rot", "int2-kivi+sink4+res64", "f16+rot+sink1+res65536"}) {
    EXPECT_EQ(KvSpecName(Spec(text)), text);
  }
  EXPECT_EQ(KvSpecName(Spec("int4+res8+rot+sink2")), "int4+rot+sink2+res8");  // canonical order
  const auto error = [](const char* text) {
    Result<KvSpec> s = ParseKvSpec(text);
    EXPECT_FALSE(s.ok()) << text;
    return s.ok() ? std::string() : s.status().message();
  };
  EXPECT_NE(error("int5").find("unknown KV format 'int5'"), std::string::npos);
  EXPECT_NE(error("int4+rotate").find("unknown transform 'rotate' (known: rot, sinkN, resN, prerope)"), std::string::npos);
  EXPECT_NE(error("int4+rot+rot").find("'rot' is given twice"), std::string::npos);
  EXPECT_NE(error("int4+sink").find("'sink' needs a whole number"), std::string::npos);
  EXPECT_NE(error("int4+sink0").find("from 1 to 65536"), std::string::npos);
  EXPECT_NE(error("int4+res65537").find("from 1 to 65536"), std::string::npos);
  EXPECT_NE(error("int4+res1x").find("'res1x'"), std::string::npos);
  EXPECT_NE(error("int4+").find("unknown transform ''"), std::string::npos);
  // Rotation needs a power-of-two head_dim: refused when the cache is made, naming the spec.
  Result<std::unique_ptr<KvCache>> c = KvCache::Create(
      {.n_layers = 1, .n_kv_heads = 1, .head_dim = 12, .layers = {LayerFormats::Of(Spec("int8+rot"), Spec("int8"))},
       .max_positions = 64, .page_positions = 64});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("int8+rot: rot needs head_dim a power of two"), std::string::npos)
      << c.status().message();
}

TEST(KvTransforms, BytesAreCountedExactly) {
  const RowShape row{.n_kv_heads = 2, .head_dim = 16};
  const FormatDesc& int4 = *FindFormat(FormatId::kInt4);
  const FormatDesc& kivi = *FindFormat(FormatId::kInt4Kivi);
  // int4 per token: 2 heads x (8 bytes of nibbles + 2 bytes f16 scale) = 20 bytes a row; f32: 128.
  EXPECT_EQ(SpecBytesForRows(int4.key, {}, row, 100), 100 * 20);
  EXPECT_EQ(SpecBytesForRows(int4.key, {.sinks = 4}, row, 100), 100 * 20 + 4 * 128);
  EXPECT_EQ(SpecBytesForRows(int4.key, {.residual = 30}, row, 100), 70 * 20 + 30 * 128);
  EXPECT_EQ(SpecBytesForRows(int4.key, {.sinks = 4, .residual = 30}, row, 3), 3 * 128 + 3 * 128);
  // KIVI keys: groups of 32; 100 positions with res40 encode ⌊60/32⌋·32 = 32 rows.
  EXPECT_EQ(EncodedRows(kivi.key, {.residual = 40}, 100), 32);
  EXPECT_EQ(SpecBytesForRows(kivi.key, {.residual = 40}, row, 100), kivi.key.block_bytes(row) + 68 * 128);
  EXPECT_EQ(SpecBytesForRows(kivi.key, {}, row, 100), BytesForRows(kivi.key, row, 100));
}

}  // namespace
}  // namespace kvq
