// Per-target bodies of the quantised-activation path (include after foreach_target.h, inside
// nothing: this file opens its own namespaces). See matvec.h for the numerics contract.
//
//   QuantizeActivationHere  x -> int8 codes and a scale per block of 32 (Highway ops, every target;
//                           equal bit for bit to QuantizeActivationReference)
//   MatVecQ8Rows/Q4Rows     rows [r0, r1) of y = W x from the quantised x:
//     x86 AVX2 / AVX3       256-bit integer dot per block: maddubs (u8 × s8 -> i16 pairs) + madd
//                           (-> i32 lanes of 4 elements)
//     x86 AVX3_DL           the same with vpdpbusd (AVX-512 VNNI, EVEX encoded): one instruction
//                           from bytes to i32 lanes, started from the activation's offset
//     other targets         plain C++ integer loops (scalar and non-x86 builds)
//   Every integer step is exact; per block the i32 lanes are converted to f32 (exact) and
//   accumulated with one FMA by s = d_w·d_x, so the f32 rounding is the same handful of steps
//   whatever the path.
#if defined(KVQ_MODEL_MATVEC_QUANT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVQ_MODEL_MATVEC_QUANT_INL_H_
#undef KVQ_MODEL_MATVEC_QUANT_INL_H_
#else
#define KVQ_MODEL_MATVEC_QUANT_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "base/float_codes.h"
#include "weights/matvec_internal.h"
#include "weights/matrix.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---- Activation quantisation ----
// Per block of 32: amax = max |x|; d = amax / 127 (f32 division); q = RNE(clamp(x / d, ±127)).
// RNE without a conversion instruction: for |t| ≤ 127, t + 1.5·2^23 lands in [2^23, 2^24) where
// the f32 spacing is 1, so the IEEE addition itself rounds t to the nearest integer, ties to even,
// and the low bits of the sum are that integer (bits − 0x4B400000). Every step is a correctly
// rounded IEEE operation, so each target gives the reference's bits.
// A block holding inf or NaN gets d = NaN and q = 0 (x·0 is NaN exactly for those); a block whose
// d is 0 (all zeros, or amax/127 below the smallest subnormal) gets q = 0.
void QuantizeActivationHere(const float* x, int64_t cols, int8_t* q, float* dx) {
  // At most 8 lanes: 512-bit instructions would cost the 256-bit row kernels that follow vector
  // port 1 (and, on some cores, clock speed). N ∈ {1, 2, 4, 8} divides 32.
  using D = hn::CappedTag<float, 8>;
  const D d;
  const hn::Rebind<int32_t, D> di32;
  const hn::Rebind<int8_t, D> di8;
  constexpr int64_t kN = static_cast<int64_t>(hn::MaxLanes(D()));
  constexpr int64_t kK = matvec_internal::kBlockElems / kN;
  const auto zero = hn::Zero(d);
  const auto hi = hn::Set(d, 127.0f);
  const auto lo = hn::Set(d, -127.0f);
  const auto magic = hn::Set(d, 12582912.0f);  // 1.5·2^23, bits 0x4B400000
  const auto magic_bits = hn::Set(di32, 0x4B400000);
  const int64_t n_blocks = cols / matvec_internal::kBlockElems;
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float* xb = x + b * matvec_internal::kBlockElems;
    int8_t* qb = q + b * matvec_internal::kBlockElems;
    hn::Vec<D> v[kK];
    auto amax = zero;
    auto nonfinite = zero;
    for (int64_t k = 0; k < kK; ++k) {
      v[k] = hn::LoadU(d, xb + k * kN);
      amax = hn::Max(amax, hn::Abs(v[k]));
      nonfinite = hn::Add(nonfinite, hn::Mul(v[k], zero));
    }
    if (hn::GetLane(hn::SumOfLanes(d, nonfinite)) != 0.0f) {  // NaN: an inf or a NaN in the block
      dx[b] = std::numeric_limits<float>::quiet_NaN();
      std::memset(qb, 0, matvec_internal::kBlockElems);
      continue;
    }
    const float scale = hn::GetLane(hn::MaxOfLanes(d, amax)) / 127.0f;
    dx[b] = scale;
    if (scale == 0.0f) {
      std::memset(qb, 0, matvec_internal::kBlockElems);
      continue;
    }
    const auto vs = hn::Set(d, scale);
    for (int64_t k = 0; k < kK; ++k) {
      const auto t = hn::Min(hn::Max(hn::Div(v[k], vs), lo), hi);
      const auto r = hn::Sub(hn::BitCast(di32, hn::Add(t, magic)), magic_bits);  // exact, in ±127
      hn::StoreU(hn::DemoteTo(di8, r), di8, qb + k * kN);
    }
  }
}

// x quantised (QuantizeActivationHere), then QuantizedX::offset as this target's kernels start
// their int32 lanes: lane j covers elements 4j .. 4j+3; −k·Σ_lane q with k the bias of the unsigned
// bytes the kernel multiplies (Q8_0 VNNI: w ^ 0x80 = w + 128, k = 128; Q4_0: n = code + 8, k = 8,
// and on VNNI the high half's bytes are 16·n, k = 128). Targets without x86 kernels skip it.
void PrepareActivationHere(const float* x, int64_t cols, WeightType type, int8_t* q, float* dx,
                           int32_t* offset) {
  QuantizeActivationHere(x, cols, q, dx);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  const bool vnni = HWY_TARGET <= HWY_AVX3_DL;
  for (int64_t j = 0; j < cols / matvec_internal::kLaneElems; ++j) {
    const bool high_half = j % 8 >= 4;  // elements 16..31 of a block
    const int32_t k = type == WeightType::kQ8_0 ? 128 : (vnni && high_half ? 128 : 8);
    offset[j] = -k * (q[4 * j] + q[4 * j + 1] + q[4 * j + 2] + q[4 * j + 3]);
  }
#else
  (void)type, (void)offset;
#endif
}

// ---- Row kernels ----
// Scales are converted a chunk of kScaleChunk blocks at a time per row: s[j] = d_w·d_x for the
// chunk's blocks, so the block loop reads each with a broadcast from memory.
constexpr int64_t kScaleChunk = 16;

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2

// Highway 1.0.3 compiles AVX3_DL with "avxvnni" (the VEX-encoded AVX-VNNI of newer cores) and
// not "avx512vnni", so GCC would encode vpdpbusd as VEX, which faults on a CPU with AVX-512 VNNI
// but without AVX-VNNI (Ice Lake), although Highway's runtime check for AVX3_DL is AVX-512 VNNI.
// These functions therefore enable avx512vnni and drop avxvnni: vpdpbusd is then EVEX, as the
// CPU check promises. They call intrinsics only (a Highway op compiled with "avxvnni" cannot be
// inlined into them).
#undef KVQ_MATVEC_X86_ATTR
#undef KVQ_MATVEC_VNNI
#if HWY_TARGET <= HWY_AVX3_DL
#define KVQ_MATVEC_X86_ATTR __attribute__((target("avx512vnni,no-avxvnni")))
#define KVQ_MATVEC_VNNI 1
#else
#define KVQ_MATVEC_X86_ATTR
#define KVQ_MATVEC_VNNI 0
#endif

constexpr int64_t kPrefetchBytes = 16384;

// s[i][j] = d_w·d_x for blocks b0 .. b0+nb−1 of row i. The scales are copied into an array and
// converted 8 at a time (F16C). Measured slower: a table lookup per scale (more loads than the
// shuffles it saves), and AVX-512 word permutes over the chunk (512-bit instructions take vector
// port 1 away from the 256-bit block loop).
template <int R, int64_t kBytes>
KVQ_MATVEC_X86_ATTR inline void ChunkScalesX86(const uint8_t* const* rows, const float* dx, int64_t b0,
                                               int64_t nb, float (*s)[kScaleChunk]) {
  alignas(16) uint16_t half[kScaleChunk] = {};
  float padded[kScaleChunk] = {};  // a partial chunk's d_x, zero past the row's end
  const float* dxc = dx + b0;
  if (nb < kScaleChunk) {
    std::memcpy(padded, dxc, nb * sizeof(float));
    dxc = padded;
  }
  for (int i = 0; i < R; ++i) {
    for (int64_t j = 0; j < nb; ++j) std::memcpy(&half[j], rows[i] + (b0 + j) * kBytes, 2);
    for (int64_t h = 0; h < kScaleChunk; h += 8) {
      const __m256 dw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(half + h)));
      _mm256_store_ps(&s[i][h], _mm256_mul_ps(dw, _mm256_loadu_ps(dxc + h)));
    }
  }
}

KVQ_MATVEC_X86_ATTR inline float HorizontalSumX86(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// R consecutive rows from r, sharing each load of the activation block. A block's 32 weights map
// onto the 32 bytes of one 256-bit vector in element order (Q4_0: the 16 low nibbles, then the 16
// high nibbles, from one 16-byte load broadcast to both halves), so int32 lane l sums elements
// 4l .. 4l+3 — the grouping of QuantizedX::offset.
template <int R, bool kQ4>
KVQ_MATVEC_X86_ATTR void QuantRowGroupX86(const uint8_t* w, const matvec_internal::QuantizedX& x, float* y,
                                          int64_t cols, int64_t r) {
  constexpr int64_t kBytes = kQ4 ? matvec_internal::kQ4Bytes : matvec_internal::kQ8Bytes;
  const int64_t n_blocks = cols / matvec_internal::kBlockElems;
  const int64_t row_bytes = n_blocks * kBytes;
  const uint8_t* a[R];
  __m256 acc[R];
  for (int i = 0; i < R; ++i) {
    a[i] = w + (r + i) * row_bytes;
    acc[i] = _mm256_setzero_ps();
  }
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i high_half_by_4 = _mm256_set_epi64x(4, 4, 0, 0);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i ones16 = _mm256_set1_epi16(1);
  const __m256i nibble_masks =
      _mm256_set_m128i(_mm_set1_epi8(static_cast<char>(0xF0)), _mm_set1_epi8(0x0F));
  (void)low4, (void)high_half_by_4, (void)flip, (void)ones16, (void)nibble_masks;  // per path
  for (int64_t b0 = 0; b0 < n_blocks; b0 += kScaleChunk) {
    const int64_t nb = std::min(kScaleChunk, n_blocks - b0);
    alignas(32) float s[R][kScaleChunk];
    // Software prefetch, kPrefetchBytes ahead in each row, into L2. A block costs the kernel far
    // more instructions per byte than a plain type does, so the out-of-order window reaches fewer
    // cache lines ahead and, from memory, too few misses are in flight: on a 1 GiB sweep of
    // 2048×8192 and 8192×2048 matrices (one thread, `kvq bench matvec`), Q4_0 took 3.2-3.5 ms per
    // matrix without, 2.0-2.1 ms with. Past the row's end it prefetches the rows that follow; a
    // prefetch never faults. The address is an integer: it may lie past the matrix.
    for (int i = 0; i < R; ++i) {
      const uintptr_t ahead = reinterpret_cast<uintptr_t>(a[i] + b0 * kBytes) + kPrefetchBytes;
      for (int64_t at = 0; at < kScaleChunk * kBytes; at += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(ahead + at), _MM_HINT_T1);
      }
    }
    ChunkScalesX86<R, kBytes>(a, x.d, b0, nb, s);
    for (int64_t j = 0; j < nb; ++j) {
      const int64_t b = b0 + j;
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + b * 32));
      const __m256i off = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.offset + b * 8));
      (void)off;
      for (int i = 0; i < R; ++i) {
        const uint8_t* qs = a[i] + b * kBytes + 2;
        __m256i dot;
        if constexpr (kQ4) {
          const __m256i raw =
              _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
#if KVQ_MATVEC_VNNI
          // Low half: n_lo = code + 8; high half: the byte & 0xF0 = 16·n_hi, unshifted (one AND for
          // both). Lanes 4..7 therefore hold 16·Σ code·q (their offset is −128·Σq): exact integers,
          // and the f32 accumulation of 16× values is 16× the accumulation, bit for bit (a power of
          // two commutes with rounding, barring underflow and overflow), undone by one multiply by
          // 1/16 per row at the end.
          dot = _mm256_dpbusd_epi32(off, _mm256_and_si256(raw, nibble_masks), xv);
#else
          // The upper half shifted right by 4: n = code + 8 in every byte. maddubs: |n·q| ≤ 15·127,
          // so the i16 pair sums cannot saturate (16·n could: this is why there is a shift here).
          const __m256i nib = _mm256_and_si256(_mm256_srlv_epi64(raw, high_half_by_4), low4);
          dot = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(nib, xv), ones16), off);
#endif
        } else {
          const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
#if KVQ_MATVEC_VNNI
          dot = _mm256_dpbusd_epi32(off, _mm256_xor_si256(wv, flip), xv);  // (w + 128)·q, then − 128·Σq
#else
          // |w|·(±q): |w| ≤ 128 and |q| ≤ 127, so a pair sums to at most 32512 (no saturation).
          const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv));
          dot = _mm256_madd_epi16(pairs, ones16);
#endif
        }
        acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(s[i][j]), _mm256_cvtepi32_ps(dot), acc[i]);
      }
    }
  }
#if KVQ_MATVEC_VNNI
  if constexpr (kQ4) {
    const __m256 unscale = _mm256_set_ps(0.0625f, 0.0625f, 0.0625f, 0.0625f, 1.0f, 1.0f, 1.0f, 1.0f);
    for (int i = 0; i < R; ++i) acc[i] = _mm256_mul_ps(acc[i], unscale);
  }
#endif
  for (int i = 0; i < R; ++i) y[r + i] = HorizontalSumX86(acc[i]);
}

template <bool kQ4>
void QuantRows(const uint8_t* w, const matvec_internal::QuantizedX& x, float* y, int64_t cols, int64_t r0,
               int64_t r1) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) QuantRowGroupX86<4, kQ4>(w, x, y, cols, r);
  for (; r < r1; ++r) QuantRowGroupX86<1, kQ4>(w, x, y, cols, r);
}

#else  // not x86 AVX2 or better: plain integer loops

// The integer dot of one block (exact), then acc += s·dot (s = d_w·d_x rounded once).
template <int R, bool kQ4>
void QuantRowGroupGeneric(const uint8_t* w, const matvec_internal::QuantizedX& x, float* y, int64_t cols,
                          int64_t r) {
  constexpr int64_t kBytes = kQ4 ? matvec_internal::kQ4Bytes : matvec_internal::kQ8Bytes;
  const int64_t n_blocks = cols / matvec_internal::kBlockElems;
  const int64_t row_bytes = n_blocks * kBytes;
  float acc[R];
  for (int i = 0; i < R; ++i) acc[i] = 0.0f;
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int8_t* q = x.q + b * matvec_internal::kBlockElems;
    for (int i = 0; i < R; ++i) {
      const uint8_t* block = w + (r + i) * row_bytes + b * kBytes;
      int32_t dot = 0;
      if constexpr (kQ4) {
        for (int j = 0; j < 16; ++j) {
          dot += ((block[2 + j] & 0x0F) - 8) * q[j] + ((block[2 + j] >> 4) - 8) * q[j + 16];
        }
      } else {
        for (int j = 0; j < 32; ++j) dot += static_cast<int8_t>(block[2 + j]) * q[j];
      }
      const float s = F16ToF32(matvec_internal::LoadU16(block)) * x.d[b];
      acc[i] += s * static_cast<float>(dot);
    }
  }
  for (int i = 0; i < R; ++i) y[r + i] = acc[i];
}

template <bool kQ4>
void QuantRows(const uint8_t* w, const matvec_internal::QuantizedX& x, float* y, int64_t cols, int64_t r0,
               int64_t r1) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) QuantRowGroupGeneric<4, kQ4>(w, x, y, cols, r);
  for (; r < r1; ++r) QuantRowGroupGeneric<1, kQ4>(w, x, y, cols, r);
}

#endif  // HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2

// Rows [r0, r1) of y = W x for a quantised x (same signature for both types).
void MatVecQ8Rows(const uint8_t* w, const matvec_internal::QuantizedX& x, float* y, int64_t cols, int64_t r0,
                  int64_t r1) {
  QuantRows<false>(w, x, y, cols, r0, r1);
}
void MatVecQ4Rows(const uint8_t* w, const matvec_internal::QuantizedX& x, float* y, int64_t cols, int64_t r0,
                  int64_t r1) {
  QuantRows<true>(w, x, y, cols, r0, r1);
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
