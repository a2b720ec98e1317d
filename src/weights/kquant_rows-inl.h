// Per-target row driver of the K-quant weight types (super-blocks of 256 elements, weights/kquant.h),
// for a type's <name>_kernels.cc (include after foreach_target.h; this file opens its own
// namespaces). See matvec.h for the numerics contract; the rounding count is derived below.
// A type supplies a block policy B:
//   static constexpr int64_t kBytes               bytes per super-block
//   static constexpr int kRowGroup                rows sharing each activation load on x86 (2 or 4:
//                                                 measured per type, `kvq bench matvec`)
//   static int32_t OffsetBias()                   the unsigned-byte bias k its x86 lanes start from
//                                                 (QuantizedX::offset = −k·Σq over 4 codes; 0: none)
//   x86 AVX2 or better (KVQ_KQUANT_X86_ATTR):
//     template <int R> static void SuperBlockX86(const uint8_t* const* blk, const KQuantXBlock& x,
//                                                __m256* acc, __m256* macc)
//         adds super-block blk[i] of row i times the activation's 256 codes into acc[i]
//         (Σ_b s·I over its 8 activation blocks) and its min term into macc[i] (subtracted)
//   other targets:
//     static void Ints(const uint8_t* block, KQuantInts* out)   the integer form (kquant.h), then
//         int16 pair dots on 128-bit targets (WebAssembly SIMD128, x86 SSE4), plain loops on
//         Highway's scalar targets: the same integers and f32 operations either way
// and gets MakeKQuantKernels<B>().
//
// Rounding (matvec_roundings = 5 for every K-quant). A term is a scale times an exact integer:
//   x86: s·I with s = fl(fl(d·sc)·d_x) (d·sc exact: 11 × ≤ 8 significant bits) or fl(d·d_x), I a
//   lane of exact int32 codes·q; min terms fl(dmin·d_x)·(m·S) with m·S exact in f32 (< 2^24).
//   Each is rounded once for its scale, then by one FMA per activation block of the row into an
//   8-lane accumulator (n_blocks; the min accumulator gets n_blocks / 8), by the 3 adds of the
//   lane reduction and by the final acc − macc: at most n_blocks + 5 roundings.
//   scalar: acc += fl(d·d_x)·I per activation block (scale 1, product 1, adds ≤ n_blocks) and
//   the same for the mins, then acc − macc: n_blocks + 3.
// So |kernel − Σ terms| ≤ γ_{n_blocks+5}·Σ|terms| ≤ γ_{n_blocks+5}·abs_sum (kquant.h: abs_i =
// |d·sc·code| + |dmin·m|, and every lane's |I| ≤ Σ |sc·code·q|).
#if defined(KVQ_WEIGHTS_KQUANT_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVQ_WEIGHTS_KQUANT_ROWS_INL_H_
#undef KVQ_WEIGHTS_KQUANT_ROWS_INL_H_
#else
#define KVQ_WEIGHTS_KQUANT_ROWS_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>
#include <cstring>

#include "weights/kquant.h"
#include "weights/lanes128-inl.h"
#include "weights/weight_type.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

constexpr int64_t kKQuantActBlocks = kKQuantBlockElems / 32;  // activation blocks per super-block

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2

// As quant_rows-inl.h (which see for why): Highway's AVX3_DL enables the VEX "avxvnni", so these
// functions enable the EVEX avx512vnni and drop avxvnni, and call intrinsics only.
#undef KVQ_KQUANT_X86_ATTR
#undef KVQ_KQUANT_VNNI
#if HWY_TARGET <= HWY_AVX3_DL
#if defined(__clang__)
// clang (the fuzz build): a function's own target attribute replaces Highway's pragma instead of
// adding to it, so name the whole target and avx512vnni; with avx512vl too, LLVM selects EVEX.
#define KVQ_KQUANT_X86_ATTR __attribute__((target(HWY_TARGET_STR ",avx512vnni")))
#else
#define KVQ_KQUANT_X86_ATTR __attribute__((target("avx512vnni,no-avxvnni")))
#endif
#define KVQ_KQUANT_VNNI 1
#else
#define KVQ_KQUANT_X86_ATTR
#define KVQ_KQUANT_VNNI 0
#endif

constexpr int64_t kKQuantPrefetchBytes = 16384;  // as quant_rows-inl.h: into L2, this far ahead per row

/// One super-block's share of the activation, as SuperBlockX86 reads it.
struct KQuantXBlock {
  const int8_t* q;       // [256] codes
  const int32_t* off;    // [64] lane offsets (B::OffsetBias)
  __m256 dx;             // d_x of the 8 activation blocks
  __m256 sum;            // Σq of the 8 activation blocks (exact, as f32)
};

/// int32 lane l = Σ u·q over bytes 4l .. 4l+3 (u unsigned ≤ 127 with |2·u·q| < 2^15 off VNNI),
/// started from `start`.
KVQ_KQUANT_X86_ATTR inline __m256i KQuantDot(__m256i u, __m256i q, __m256i start) {
#if KVQ_KQUANT_VNNI
  return _mm256_dpbusd_epi32(start, u, q);
#else
  return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(u, q), _mm256_set1_epi16(1)), start);
#endif
}

KVQ_KQUANT_X86_ATTR inline float KQuantHorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/// The f16 at p as f32 (F16C; KQuantHalf's value).
KVQ_KQUANT_X86_ATTR inline float KQuantHalfX86(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

/// 8 bytes at p -> 8 f32 (unsigned or signed).
KVQ_KQUANT_X86_ATTR inline __m256 KQuantU8x8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
KVQ_KQUANT_X86_ATTR inline __m256 KQuantI8x8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

template <class B, int R>
KVQ_KQUANT_X86_ATTR void KQuantRowGroupX86(const uint8_t* w, const QuantizedX& x, float* y, int64_t cols,
                                           int64_t r) {
  constexpr int64_t kBytes = B::kBytes;
  const int64_t n_super = cols / kKQuantBlockElems;
  const int64_t row_bytes = n_super * kBytes;
  const uint8_t* a[R];
  __m256 acc[R], macc[R];
  for (int i = 0; i < R; ++i) {
    a[i] = w + (r + i) * row_bytes;
    acc[i] = _mm256_setzero_ps();
    macc[i] = _mm256_setzero_ps();
  }
  for (int64_t sb = 0; sb < n_super; ++sb) {
    const uint8_t* blk[R];
    for (int i = 0; i < R; ++i) {
      blk[i] = a[i] + sb * kBytes;
      // Software prefetch as quant_rows-inl.h: every 64 bytes of the row's stream, once.
      const uintptr_t ahead = reinterpret_cast<uintptr_t>(blk[i]) + kKQuantPrefetchBytes;
      for (int64_t at = 0; at < kBytes; at += 64) _mm_prefetch(reinterpret_cast<const char*>(ahead + at), _MM_HINT_T1);
    }
    const KQuantXBlock xb = {
        .q = x.q + sb * kKQuantBlockElems,
        .off = x.offset + sb * (kKQuantBlockElems / 4),
        .dx = _mm256_loadu_ps(x.d + sb * kKQuantActBlocks),
        .sum = _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.sum + sb * kKQuantActBlocks))),
    };
    B::template SuperBlockX86<R>(blk, xb, acc, macc);
  }
  for (int i = 0; i < R; ++i) y[r + i] = KQuantHorizontalSum(acc[i]) - KQuantHorizontalSum(macc[i]);
}

template <class B>
void KQuantRows(const uint8_t* w, const QuantizedX& x, float* y, int64_t cols, int64_t r0, int64_t r1) {
  int64_t r = r0;
  constexpr int kGroup = B::kRowGroup;
  for (; r + kGroup <= r1; r += kGroup) KQuantRowGroupX86<B, kGroup>(w, x, y, cols, r);
  for (; r < r1; ++r) KQuantRowGroupX86<B, 1>(w, x, y, cols, r);
}

template <class B>
void KQuantActivationOffsets(const int8_t* q, int64_t n, int32_t* offset) {
  const int32_t k = B::OffsetBias();
  for (int64_t j = 0; j < n / 4; ++j) offset[j] = -k * (q[4 * j] + q[4 * j + 1] + q[4 * j + 2] + q[4 * j + 3]);
}
template <class B>
constexpr auto kKQuantActivationOffsets = &KQuantActivationOffsets<B>;
constexpr int64_t kKQuantOffsetBytesPerElem = 1;  // KQuantInterleavedRows reads cols / 4 words per token

#else  // not x86 AVX2 or better: integer loops over the integer form

#if HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
// 128-bit targets (the WebAssembly module's SIMD128, x86 SSE4): the scalar loop below, its
// integers formed otherwise and its f32 operations the same. KQuantWideActivation widens each
// token's codes to int16 once (x.offset) and sums them per 16-element sub-block. Per sub-block j
// the dot Σ code·q is 4 int32 lanes of int16 pair dots (|code·q| ≤ 64·127: exact), the lanes of 4
// sub-blocks are summed at once and multiplied by their scales sc[j]; an activation block's dot is
// then its two sub-blocks' products added, and its mins Σ_j m[j]·Σq — the scalar loop's integers
// (integer sums do not depend on their order; |dot| ≤ 32·4096·127 < 2^31). Per activation block
// fl(d·d_x)·dot and fl(dmin·d_x)·mins are formed on 4 lanes at a time (the same IEEE products)
// and added to acc and macc one at a time in order of the block, as the scalar loop adds them.

// x.offset as KQuantRows reads it here: [cols] int16 codes, then [cols / 16] int32 Σq per 16.
constexpr int64_t kKQuantWideBytesPerElem = 3;  // ≥ 2 + 4/16

inline void KQuantWideActivation(const int8_t* q, int64_t n, int32_t* offset) {
  auto* q16 = reinterpret_cast<int16_t*>(offset);
  int32_t* s16 = offset + n / 2;
  for (int64_t i = 0; i < n; ++i) q16[i] = q[i];
  for (int64_t j = 0; j < n / 16; ++j) {
    int32_t s = 0;
    for (int64_t l = 0; l < 16; ++l) s += q[16 * j + l];
    s16[j] = s;
  }
}

// Lanes k = v0[2k] + v0[2k+1] for k < 2, v1's pairs in lanes 2, 3 (exact).
inline hn::Vec<QrI32> PairsOfTwo(hn::Vec<QrI32> v0, hn::Vec<QrI32> v1) {
  const QrI32 d32;
  return hn::Add(hn::ConcatEven(d32, v1, v0), hn::ConcatOdd(d32, v1, v0));
}

template <class B>
void KQuantRows(const uint8_t* w, const QuantizedX& x, float* y, int64_t cols, int64_t r0, int64_t r1) {
  const hn::Full128<int8_t> d8;    // 16 lanes
  const hn::Full64<int8_t> d8h;    // 8 lanes
  const QrI16 d16;
  const QrI32 d32;
  const QrF32 df;
  const int64_t n_super = cols / kKQuantBlockElems;
  const int64_t row_bytes = n_super * B::kBytes;
  const auto* q16 = reinterpret_cast<const int16_t*>(x.offset);  // [cols]
  const int32_t* s16 = x.offset + cols / 2;                       // [cols / 16]
  alignas(16) KQuantInts k;
  for (int64_t r = r0; r < r1; ++r) {
    float acc = 0.0f, macc = 0.0f;
    for (int64_t sb = 0; sb < n_super; ++sb) {
      B::Ints(w + r * row_bytes + sb * B::kBytes, &k);
      const int16_t* qs = q16 + sb * kKQuantBlockElems;  // [256]
      hn::Vec<QrI32> dot[2], mins[2];  // activation blocks 4h .. 4h+3 of the super-block, lane b
      for (int h = 0; h < 2; ++h) {
        hn::Vec<QrI32> t[2], m[2];  // sub-blocks 8h + 4g .. +3: sc·Σ code·q and m·Σq
        for (int g = 0; g < 2; ++g) {
          const int64_t j0 = 8 * h + 4 * g;
          hn::Vec<QrI32> p[4];
          for (int i = 0; i < 4; ++i) {
            const int64_t j = j0 + i;
            const auto c = hn::LoadU(d8, k.code + 16 * j);
            const auto lo = hn::PromoteTo(d16, hn::LowerHalf(d8h, c));
            const auto hi = hn::PromoteTo(d16, hn::UpperHalf(d8h, c));
            p[i] = hn::Add(PairDots(lo, hn::LoadU(d16, qs + 16 * j)), PairDots(hi, hn::LoadU(d16, qs + 16 * j + 8)));
          }
          t[g] = hn::Mul(SumLanesOfFour(p[0], p[1], p[2], p[3]), hn::LoadU(d32, k.sc + j0));
          m[g] = hn::Mul(hn::LoadU(d32, s16 + sb * 16 + j0), hn::LoadU(d32, k.m + j0));
        }
        dot[h] = PairsOfTwo(t[0], t[1]);
        mins[h] = PairsOfTwo(m[0], m[1]);
      }
      const int64_t ab0 = sb * kKQuantActBlocks;  // the super-block's first activation block
      alignas(16) float terms[2][kKQuantActBlocks];  // fl(d·d_x)·dot, fl(dmin·d_x)·mins per block
      for (int h = 0; h < 2; ++h) {
        const auto dx = hn::LoadU(df, x.d + ab0 + 4 * h);
        hn::Store(hn::Mul(hn::Mul(hn::Set(df, k.d), dx), hn::ConvertTo(df, dot[h])), df, terms[0] + 4 * h);
        hn::Store(hn::Mul(hn::Mul(hn::Set(df, k.dmin), dx), hn::ConvertTo(df, mins[h])), df, terms[1] + 4 * h);
      }
      for (int64_t b = 0; b < kKQuantActBlocks; ++b) {
        acc += terms[0][b];
        macc += terms[1][b];
      }
    }
    y[r] = acc - macc;
  }
}

// One function for every K-quant (an inline function's one address), so a MatMulGroup of several
// K-quant types quantises and widens its activation once.
template <class B>
constexpr auto kKQuantActivationOffsets = &KQuantWideActivation;
constexpr int64_t kKQuantOffsetBytesPerElem = kKQuantWideBytesPerElem;

#else
// Highway's scalar targets: dot = Σ_j sc[j]·Σ code·q and mins = Σ_j m[j]·Σ q over activation
// block b's two 16-element sub-blocks j (q: its 32 codes).
inline void KQuantBlockInts(const KQuantInts& k, int64_t b, const int8_t* q, int32_t* dot, int32_t* mins) {
  *dot = 0, *mins = 0;
  for (int64_t h = 0; h < 2; ++h) {
    const int64_t j = 2 * b + h;
    int32_t sub = 0, sum16 = 0;
    for (int64_t l = 0; l < 16; ++l) {
      sub += k.code[16 * j + l] * q[16 * h + l];
      sum16 += q[16 * h + l];
    }
    *dot += k.sc[j] * sub;
    *mins += k.m[j] * sum16;
  }
}

template <class B>
void KQuantRows(const uint8_t* w, const QuantizedX& x, float* y, int64_t cols, int64_t r0, int64_t r1) {
  const int64_t n_super = cols / kKQuantBlockElems;
  const int64_t row_bytes = n_super * B::kBytes;
  KQuantInts k;
  for (int64_t r = r0; r < r1; ++r) {
    float acc = 0.0f, macc = 0.0f;
    for (int64_t sb = 0; sb < n_super; ++sb) {
      B::Ints(w + r * row_bytes + sb * B::kBytes, &k);
      for (int64_t b = 0; b < kKQuantActBlocks; ++b) {
        const int64_t ab = sb * kKQuantActBlocks + b;  // activation block
        int32_t dot, mins;
        KQuantBlockInts(k, b, x.q + ab * 32, &dot, &mins);
        acc += (k.d * x.d[ab]) * static_cast<float>(dot);
        macc += (k.dmin * x.d[ab]) * static_cast<float>(mins);
      }
    }
    y[r] = acc - macc;
  }
}

template <class B>
void KQuantActivationOffsets(const int8_t*, int64_t, int32_t*) {}  // the integer loops start from 0
template <class B>
constexpr auto kKQuantActivationOffsets = &KQuantActivationOffsets<B>;
constexpr int64_t kKQuantOffsetBytesPerElem = 1;
#endif

#endif  // HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2

template <class B>
const WeightKernels& MakeKQuantKernels() {
  static const WeightKernels kKernels = {
      .target = hwy::TargetName(HWY_TARGET),
      .rows = nullptr,
      .activation_offsets = kKQuantActivationOffsets<B>,
      .quant_rows = &KQuantRows<B>,
      .offset_bytes_per_elem = kKQuantOffsetBytesPerElem,
  };
  return kKernels;
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
