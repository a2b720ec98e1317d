// Per-target SIMD bodies shared by every codec's kernels (include after foreach_target.h).
//
// A codec supplies a Reader that dequantises a chunk of one head row into a vector, in registers:
//   struct Row;                                            per-row pointers and scales
//   static Row At(const RowTile&, int32_t i, int32_t kv_head, const CodecArgs&);
//   template <class D> static Vec<D> Load(D, const Row&, int32_t j, const CodecArgs&);
//       elements j .. j+N-1 of the head row, N = Lanes(D) ∈ {4, 8, 16}, j a multiple of N
//       (4: the 128-bit targets — WASM SIMD128, SSE4, NEON — where an 8-lane tag is capped to 4)
//   static float Scalar(const Row&, int32_t j, const CodecArgs&);   element j (1-lane vectors)
//   static float RowScale(const Row&, const CodecArgs&);
//       Load and Scalar return x'/RowScale: a per-row factor (int formats' f16 scale) is applied
//       once per row and head — to the finished dot, and to e before the acc update — instead of
//       once per chunk. Formats without one return 1 (a multiply by 1 changes no bit).
// and MakeKernels<Reader>() builds its CodecKernels: score (q·k for a tile of rows and a group
// of query heads) and accumulate (the online-softmax acc update). Each row is dequantised once
// per chunk for all heads of the group; every lane sees the same sequence of operations whatever
// the tile length, which is what keeps windowed attention bit-identical.
#if defined(KVQ_FORMAT_ROW_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVQ_FORMAT_ROW_KERNELS_INL_H_
#undef KVQ_FORMAT_ROW_KERNELS_INL_H_
#else
#define KVQ_FORMAT_ROW_KERNELS_INL_H_
#endif

#include <hwy/highway.h>

#include <cstring>

#include "kvq/format.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class Reader, class D>
HWY_INLINE hn::Vec<D> LoadChunk(D d, const typename Reader::Row& row, int32_t j,
                                const CodecArgs& a) {
  if constexpr (hn::MaxLanes(D()) >= 4) {
    return Reader::Load(d, row, j, a);
  } else {
    return hn::Set(d, Reader::Scalar(row, j, a));
  }
}

/// N packed b-bit codes (b = 8, 4 or 2; layout of codec_helpers.h) starting at `p`, as N u8
/// lanes, for a float tag D of N ∈ {4, 8, 16} lanes.
template <int kBits, class D>
HWY_INLINE hn::Vec<hn::Rebind<uint8_t, D>> UnpackCodes(D, const uint8_t* p) {
  const hn::Rebind<uint8_t, D> du8;
  if constexpr (kBits == 8) {
    return hn::LoadU(du8, p);
  } else if constexpr (kBits == 4) {
    // N/2 bytes -> u16 lanes lo | hi << 8, which as bytes are lo0 hi0 lo1 hi1 ... = elements
    // 0, 1, 2, 3 ... in order.
    const hn::Rebind<uint8_t, hn::Half<D>> du8h;
    const hn::Rebind<uint16_t, hn::Half<D>> du16h;
    const auto w = hn::PromoteTo(du16h, hn::LoadU(du8h, p));
    const auto lo = hn::And(w, hn::Set(du16h, 0x0F));
    const auto hi = hn::ShiftRight<4>(w);
    return hn::BitCast(du8, hn::Or(lo, hn::ShiftLeft<8>(hi)));
  } else {
    static_assert(kBits == 2);
    const hn::Rebind<uint8_t, hn::Half<hn::Half<D>>> du8q;
    const hn::Rebind<uint32_t, hn::Half<hn::Half<D>>> du32q;
    const auto w = hn::PromoteTo(du32q, hn::LoadU(du8q, p));
    const auto m = hn::Set(du32q, 3);
    const auto c0 = hn::And(w, m);
    const auto c1 = hn::ShiftLeft<8>(hn::And(hn::ShiftRight<2>(w), m));
    const auto c2 = hn::ShiftLeft<16>(hn::And(hn::ShiftRight<4>(w), m));
    const auto c3 = hn::ShiftLeft<24>(hn::ShiftRight<6>(w));
    return hn::BitCast(du8, hn::Or(hn::Or(c0, c1), hn::Or(c2, c3)));
  }
}

/// u8 codes -> f32 lanes (exact).
template <class D>
HWY_INLINE hn::Vec<D> CodesToFloat(D d, hn::Vec<hn::Rebind<uint8_t, D>> codes) {
  const hn::Rebind<int32_t, D> di32;
  return hn::ConvertTo(d, hn::PromoteTo(di32, codes));
}

/// Stores the 4 lanes left after halving v down to 4 lanes (adding the halves).
#if HWY_TARGET != HWY_SCALAR  // the portable target has 1-lane vectors and no interleaves
template <class D>
HWY_INLINE void StoreFoldedTo4(D d, hn::Vec<D> v, float* out) {
  if constexpr (hn::MaxLanes(D()) > 4) {
    const hn::Half<D> dh;
    StoreFoldedTo4(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)), out);
  } else {
    hn::StoreU(v, d, out);
  }
}

/// out[h] = Σ lanes of s[h] for four vectors at once: two rounds of interleave-and-add leave each
/// 128-bit block holding one partial sum per vector, then the blocks are added. About a third of
/// the shuffles of four separate reductions.
template <class D>
HWY_INLINE void SumOfLanes4(D d, const hn::Vec<D>* s, float* out) {
  if constexpr (hn::MaxLanes(D()) >= 4) {
    const hn::Repartition<double, D> dd;
    const auto a01 = hn::Add(hn::InterleaveLower(d, s[0], s[1]), hn::InterleaveUpper(d, s[0], s[1]));
    const auto a23 = hn::Add(hn::InterleaveLower(d, s[2], s[3]), hn::InterleaveUpper(d, s[2], s[3]));
    const auto x = hn::BitCast(dd, a01), y = hn::BitCast(dd, a23);
    StoreFoldedTo4(d, hn::Add(hn::BitCast(d, hn::InterleaveLower(dd, x, y)),
                              hn::BitCast(d, hn::InterleaveUpper(dd, x, y))),
                   out);
  } else {
    for (int h = 0; h < 4; ++h) out[h] = hn::GetLane(hn::SumOfLanes(d, s[h]));
  }
}
#else
template <class D>
HWY_INLINE void SumOfLanes4(D d, const hn::Vec<D>* s, float* out) {
  for (int h = 0; h < 4; ++h) out[h] = hn::GetLane(hn::SumOfLanes(d, s[h]));
}
#endif

/// Scores for G query heads at once (G ≤ 8, fixed so the sums stay in registers).
template <class Reader, int G, class D>
void ScoreGroup(D d, const float* q, const RowTile& tile, int32_t kv_head, const CodecArgs& a,
                float* scores) {
  const int32_t hd = a.shape.head_dim;
  const int32_t n = static_cast<int32_t>(hn::Lanes(d));
  for (int32_t i = 0; i < tile.n_rows; ++i) {
    const typename Reader::Row row = Reader::At(tile, i, kv_head, a);
    // Two partial sums per head (even and odd chunks) halve the dependency chain of FMAs.
    hn::Vec<D> sum[G], odd[G];
    for (int h = 0; h < G; ++h) sum[h] = odd[h] = hn::Zero(d);
    int32_t j = 0;
    for (; j + 2 * n <= hd; j += 2 * n) {
      const hn::Vec<D> x0 = LoadChunk<Reader>(d, row, j, a);
      const hn::Vec<D> x1 = LoadChunk<Reader>(d, row, j + n, a);
      for (int h = 0; h < G; ++h) {
        sum[h] = hn::MulAdd(hn::LoadU(d, q + h * hd + j), x0, sum[h]);
        odd[h] = hn::MulAdd(hn::LoadU(d, q + h * hd + j + n), x1, odd[h]);
      }
    }
    if (j < hd) {
      const hn::Vec<D> x0 = LoadChunk<Reader>(d, row, j, a);
      for (int h = 0; h < G; ++h) sum[h] = hn::MulAdd(hn::LoadU(d, q + h * hd + j), x0, sum[h]);
    }
    for (int h = 0; h < G; ++h) sum[h] = hn::Add(sum[h], odd[h]);
    int h = 0;
    for (; h + 4 <= G; h += 4) {
      float four[4];
      SumOfLanes4(d, sum + h, four);
      for (int k = 0; k < 4; ++k) scores[(h + k) * kMaxTileRows + i] = four[k];
    }
    for (; h < G; ++h) scores[h * kMaxTileRows + i] = hn::GetLane(hn::SumOfLanes(d, sum[h]));
    const float scale = Reader::RowScale(row, a);
    for (int h2 = 0; h2 < G; ++h2) scores[h2 * kMaxTileRows + i] *= scale;
  }
}

/// kChunks chunks of acc (G heads each) starting at element j, updated over a tile's rows in
/// order: acc = acc·c + w·x. kChunks is a template argument so the G·kChunks accumulators are
/// registers (a chunk count known only at run time made the compiler keep them on the stack, a
/// store and a reload per row).
template <int kChunks, class Reader, int G, class D>
HWY_INLINE void AccumulateChunks(D d, const float* c, const typename Reader::Row* rows,
                                 const bool* rescale, const float* w, int32_t n_rows, int32_t j,
                                 const CodecArgs& a, float* acc) {
  const int32_t hd = a.shape.head_dim;
  const int32_t n = static_cast<int32_t>(hn::Lanes(d));
  hn::Vec<D> v[kChunks][G];
  for (int k = 0; k < kChunks; ++k) {
    for (int h = 0; h < G; ++h) v[k][h] = hn::LoadU(d, acc + h * hd + j + k * n);
  }
  for (int32_t i = 0; i < n_rows; ++i) {
    for (int k = 0; k < kChunks; ++k) {
      const hn::Vec<D> x = LoadChunk<Reader>(d, rows[i], j + k * n, a);
      if (rescale[i]) {  // a multiply by exactly 1 is the identity: skipping it changes no bit
        for (int h = 0; h < G; ++h) v[k][h] = hn::Mul(v[k][h], hn::Set(d, c[h * kMaxTileRows + i]));
      }
      // A multiply then an add, not MulAdd: fused on AVX2/AVX3 only (WebAssembly SIMD128 and
      // HWY_SCALAR round twice), and each lane's acc is its own sum, so this way acc has the
      // same bits on every target.
      for (int h = 0; h < G; ++h) v[k][h] = hn::Add(hn::Mul(hn::Set(d, w[h * kMaxTileRows + i]), x), v[k][h]);
    }
  }
  for (int k = 0; k < kChunks; ++k) {
    for (int h = 0; h < G; ++h) hn::StoreU(v[k][h], d, acc + h * hd + j + k * n);
  }
}

/// acc[h] = acc[h]·c + e·x_i for rows in order, G heads at once; chunk-outer so each head's
/// chunk of acc stays in a register across the tile's rows.
template <class Reader, int G, class D>
void AccumulateGroup(D d, const float* c, const float* e, const RowTile& tile, int32_t kv_head,
                     const CodecArgs& a, float* acc) {
  const int32_t hd = a.shape.head_dim;
  const int32_t n = static_cast<int32_t>(hn::Lanes(d));
  typename Reader::Row rows[kMaxTileRows];
  bool rescale[kMaxTileRows];
  float w[G * kMaxTileRows];  // e · RowScale: the weight of the row's undecoded chunk values
  for (int32_t i = 0; i < tile.n_rows; ++i) {
    rows[i] = Reader::At(tile, i, kv_head, a);
    rescale[i] = false;
    const float scale = Reader::RowScale(rows[i], a);
    for (int h = 0; h < G; ++h) {
      rescale[i] = rescale[i] || c[h * kMaxTileRows + i] != 1.0f;
      w[h * kMaxTileRows + i] = e[h * kMaxTileRows + i] * scale;
    }
  }
  // Two chunks of acc per pass while registers allow, so consecutive rows' dependent adds into one
  // register are not the only work in flight; each lane's operations are the same either way.
  int32_t j = 0;
  if constexpr (G <= 4) {
    for (; j + 2 * n <= hd; j += 2 * n) AccumulateChunks<2, Reader, G>(d, c, rows, rescale, w, tile.n_rows, j, a, acc);
  }
  for (; j < hd; j += n) AccumulateChunks<1, Reader, G>(d, c, rows, rescale, w, tile.n_rows, j, a, acc);
}

// Splits n_q heads into register-sized groups (8, 4, 2, 1) and picks the widest lane count that
// divides head_dim (16, 8, else 1) — once per call, never per row.
template <class Reader, class D>
void ScoreWith(D d, const float* q, int32_t n_q, const RowTile& tile, int32_t kv_head,
               const CodecArgs& a, float* scores) {
  const int32_t hd = a.shape.head_dim;
  int32_t h = 0;
  for (; h + 8 <= n_q; h += 8) ScoreGroup<Reader, 8>(d, q + h * hd, tile, kv_head, a, scores + h * kMaxTileRows);
  if (h + 4 <= n_q) { ScoreGroup<Reader, 4>(d, q + h * hd, tile, kv_head, a, scores + h * kMaxTileRows); h += 4; }
  if (h + 2 <= n_q) { ScoreGroup<Reader, 2>(d, q + h * hd, tile, kv_head, a, scores + h * kMaxTileRows); h += 2; }
  if (h < n_q) ScoreGroup<Reader, 1>(d, q + h * hd, tile, kv_head, a, scores + h * kMaxTileRows);
}

template <class Reader, class D>
void AccumulateWith(D d, const float* c, const float* e, int32_t n_q, const RowTile& tile,
                    int32_t kv_head, const CodecArgs& a, float* acc) {
  const int32_t hd = a.shape.head_dim;
  const int32_t k = kMaxTileRows;
  int32_t h = 0;
  for (; h + 8 <= n_q; h += 8) AccumulateGroup<Reader, 8>(d, c + h * k, e + h * k, tile, kv_head, a, acc + h * hd);
  if (h + 4 <= n_q) { AccumulateGroup<Reader, 4>(d, c + h * k, e + h * k, tile, kv_head, a, acc + h * hd); h += 4; }
  if (h + 2 <= n_q) { AccumulateGroup<Reader, 2>(d, c + h * k, e + h * k, tile, kv_head, a, acc + h * hd); h += 2; }
  if (h < n_q) AccumulateGroup<Reader, 1>(d, c + h * k, e + h * k, tile, kv_head, a, acc + h * hd);
}

template <class Reader>
void Score(const float* q, int32_t n_q, const RowTile& tile, int32_t kv_head, const CodecArgs& a,
           float* scores) {
  if (a.shape.head_dim % 16 == 0) {
    ScoreWith<Reader>(hn::CappedTag<float, 16>(), q, n_q, tile, kv_head, a, scores);
  } else if (a.shape.head_dim % 8 == 0) {
    ScoreWith<Reader>(hn::CappedTag<float, 8>(), q, n_q, tile, kv_head, a, scores);
  } else {
    ScoreWith<Reader>(hn::CappedTag<float, 1>(), q, n_q, tile, kv_head, a, scores);
  }
}

template <class Reader>
void Accumulate(const float* c, const float* e, int32_t n_q, const RowTile& tile, int32_t kv_head,
                const CodecArgs& a, float* acc) {
  if (a.shape.head_dim % 16 == 0) {
    AccumulateWith<Reader>(hn::CappedTag<float, 16>(), c, e, n_q, tile, kv_head, a, acc);
  } else if (a.shape.head_dim % 8 == 0) {
    AccumulateWith<Reader>(hn::CappedTag<float, 8>(), c, e, n_q, tile, kv_head, a, acc);
  } else {
    AccumulateWith<Reader>(hn::CappedTag<float, 1>(), c, e, n_q, tile, kv_head, a, acc);
  }
}

template <class Reader>
const CodecKernels& MakeKernels() {
  static const CodecKernels kKernels = {
      .target = hwy::TargetName(HWY_TARGET),
      .score = &Score<Reader>,
      .score_f32 = &Score<Reader>,
      .score_int = nullptr,
      .accumulate = &Accumulate<Reader>,
  };
  return kKernels;
}

/// Row pointer of row i of a tile for one-row-block codecs.
HWY_INLINE const uint8_t* TileRow(const RowTile& tile, int32_t i) {
  return tile.block + static_cast<int64_t>(i) * tile.stride_bytes;
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#endif  // KVQ_FORMAT_ROW_KERNELS_INL_H_
