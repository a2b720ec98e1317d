// Per-target row kernels of the quantised-activation weight types with blocks of 32 and an f16
// scale d at byte 0 (Q8_0, Q4_0, Q5_0: weight = d·code; Q4_1, Q5_1: weight = d·code + m with an
// f16 min m at bytes 2-3), for a type's <name>_kernels.cc (include after foreach_target.h; this
// file opens its own namespaces). See matvec.h for the numerics contract.
// A type supplies a block policy B:
//   static constexpr int64_t kBytes                        bytes per block
//   static constexpr bool kHasMin (optional, false if absent)   an f16 min m at bytes 2-3: the
//                                                          codes start at byte 4 instead of 2
//   static int32_t OffsetBias(bool high_half)              the unsigned-byte bias k its x86 lanes
//                                                          start from (QuantizedX::offset = −k·Σq)
//   x86 AVX2 or better (KVQ_MATVEC_X86_ATTR functions):
//     static __m256i Dot(const uint8_t* codes, __m256i xq, __m256i offset)
//                                     int32 lane l = Σ code·q over elements 4l .. 4l+3 (or a fixed
//                                     power-of-two multiple, undone by Finish)
//     static __m256 Finish(__m256 acc)                     the row's lanes before the final sum
//   other targets:
//     static int32_t DotScalar(const uint8_t* codes, const int8_t* q)   Σ code·q over the block
// and gets MakeQuantKernels<B>().
//   x86 AVX2 / AVX3       256-bit integer dot per block: maddubs (u8 × s8 -> i16 pairs) + madd
//                         (-> i32 lanes of 4 elements)
//   x86 AVX3_DL           the same with vpdpbusd (AVX-512 VNNI, EVEX encoded): one instruction
//                         from bytes to i32 lanes, started from the activation's offset
//   128-bit targets       (WebAssembly SIMD128, x86 SSE4) a type with B::DotLanes: 4 rows at a
//                         time, int16 pair dots (QuantRowQuadLanes), the plain loops' integers
//                         and f32 operations
//   other targets         plain C++ integer loops (Highway's scalar targets, types without
//                         DotLanes, tail rows)
// The 128-bit helpers here serve Q1_0's and Q2_0's kernels too (PlaneRowGroup: their plain row
// loop four rows at a time over the activation permuted per weight block, PlaneActivationOffsets).
// Every integer step is exact; per block the i32 lanes are converted to f32 (exact) and
// accumulated with one FMA by s = d_w·d_x, so the f32 rounding is the same handful of steps
// whatever the path.
// A type with a min adds Σ_b (m·d_x)·Σq per row: s_m = m·d_x is rounded once and multiplied by
// the block's exact sum (QuantizedX::sum) in an accumulator of its own (on x86 an 8-lane vector,
// blocks j and j+8 of a chunk in lane j), added to the dot lanes once after Finish. Each dot term
// is then rounded at most n_blocks + 5 times (scale product, one FMA per block, the add of the
// min lanes, 3 adds of the lane reduction), each min term at most n_blocks/8 + 5 times: such a
// type states matvec_roundings = 5.
#if defined(KVQ_WEIGHTS_QUANT_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVQ_WEIGHTS_QUANT_ROWS_INL_H_
#undef KVQ_WEIGHTS_QUANT_ROWS_INL_H_
#else
#define KVQ_WEIGHTS_QUANT_ROWS_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "base/float_codes.h"
#include "weights/lanes128-inl.h"
#include "weights/weight_type.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

// Scales are converted a chunk of kScaleChunk blocks at a time per row: s[j] = d_w·d_x for the
// chunk's blocks, so the block loop reads each with a broadcast from memory.
constexpr int64_t kScaleChunk = 16;
constexpr int64_t kQuantBlockElems = 32;  // elements per block, weights and activation alike
constexpr int64_t kLaneElems = 4;         // elements one int32 lane of an x86 byte dot product sums

// B::kHasMin if B declares it, else false (Q8_0/Q4_0 do not: their kernels are unchanged).
template <class B>
constexpr bool HasMin() {
  if constexpr (requires { B::kHasMin; }) {
    return B::kHasMin;
  } else {
    return false;
  }
}
// Bytes before a block's codes: d, and m for a type with a min.
template <class B>
constexpr int64_t CodeOffset() {
  return HasMin<B>() ? 4 : 2;
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2

// Highway 1.0.3 compiles AVX3_DL with "avxvnni" (the VEX-encoded AVX-VNNI of newer cores) and
// not "avx512vnni", so GCC would encode vpdpbusd as VEX, which faults on a CPU with AVX-512 VNNI
// but without AVX-VNNI (Ice Lake), although Highway's runtime check for AVX3_DL is AVX-512 VNNI.
// These functions (and the types' Dot and Finish) therefore enable avx512vnni and drop avxvnni:
// vpdpbusd is then EVEX, as the CPU check promises. They call intrinsics only (a Highway op
// compiled with "avxvnni" cannot be inlined into them).
#undef KVQ_MATVEC_X86_ATTR
#undef KVQ_MATVEC_VNNI
#if HWY_TARGET <= HWY_AVX3_DL
#if defined(__clang__)
// clang (the fuzz build): a function's own target attribute replaces Highway's pragma instead of
// adding to it, so name the whole target and avx512vnni; with avx512vl too, LLVM selects EVEX.
#define KVQ_MATVEC_X86_ATTR __attribute__((target(HWY_TARGET_STR ",avx512vnni")))
#else
#define KVQ_MATVEC_X86_ATTR __attribute__((target("avx512vnni,no-avxvnni")))
#endif
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

// The 32 unsigned 5-bit codes of a Q5_0 / Q5_1 block (ggml's qh[4] then qs[16], at p) in element
// order, one byte each: code i = (nibble i) | (bit i of the little-endian qh) << 4, the nibbles
// as in Q4_0 (low nibbles elements 0..15, high nibbles 16..31).
KVQ_MATVEC_X86_ATTR inline __m256i FiveBitCodesX86(const uint8_t* p) {
  uint32_t qh;
  std::memcpy(&qh, p, 4);  // little-endian host
  const __m256i raw = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 4)));
#if HWY_TARGET <= HWY_AVX3_DL
  // AVX-512 VBMI: vpmultishiftqb takes each byte from its qword at a bit offset, byte j of the
  // upper half 4 bits above byte j of the lower: the high nibbles come down on port 5, leaving
  // ports 0 and 1 (vpsrlvq's) to the dot product, its conversion and the FMA. In cache (one
  // thread, `kvq bench matvec --working-set 8MiB --rows 512 --cols 2048`, best repetition) Q5_0
  // ran at 0.94× Q4_0's GB/s with vpsrlvq and 0.96× with this, within the shared machine's noise.
  const __m256i offsets = _mm256_set_epi64x(0x3C342C241C140C04LL, 0x3C342C241C140C04LL,
                                            0x3830282018100800LL, 0x3830282018100800LL);
  const __m256i shifted = _mm256_multishift_epi64_epi8(offsets, raw);
#else
  const __m256i shifted = _mm256_srlv_epi64(raw, _mm256_set_epi64x(4, 4, 0, 0));
#endif
#if HWY_TARGET <= HWY_AVX3
  // AVX-512 BW/VL: qh is a byte mask selecting 0x10s, then (shifted & 0x0F) | high in one
  // ternary-logic op (0xEA = A & B | C).
  const __m256i high = _mm256_maskz_mov_epi8(_cvtu32_mask32(qh), _mm256_set1_epi8(0x10));
  return _mm256_ternarylogic_epi32(shifted, _mm256_set1_epi8(0x0F), high, 0xEA);
#else
  // Byte i gets qh's byte i/8, then its bit i mod 8 is tested: 0x10 where set.
  const __m256i bits = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int32_t>(qh)),
      _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bits), bits);
  return _mm256_or_si256(_mm256_and_si256(shifted, _mm256_set1_epi8(0x0F)),
                         _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
#endif
}

// For a type with a min: s[i][j] = d_w·d_x as ChunkScalesX86, and the chunk's min terms
// acc_min[i] += (m·d_x)·Σq, lane j taking blocks j and j + 8. d and m are adjacent, so each
// block's pair is copied as one 32-bit word (half the scalar copies of two ChunkScalesX86 calls,
// which dominated the block loop's cost) and split by a pack.
template <int R, int64_t kBytes>
KVQ_MATVEC_X86_ATTR inline void ChunkScalesMinX86(const uint8_t* const* rows, const QuantizedX& x, int64_t b0,
                                                  int64_t nb, float (*s)[kScaleChunk], __m256* acc_min) {
  alignas(32) uint32_t dm[kScaleChunk] = {};  // [chunk] d | m << 16, zero past the row's end
  float padded[kScaleChunk] = {};             // a partial chunk's d_x, zero past the row's end
  alignas(32) int32_t sum[kScaleChunk] = {};  // [chunk] Σq per block, zero past the row's end
  const float* dxc = x.d + b0;
  const int32_t* sumc = x.sum + b0;
  if (nb < kScaleChunk) {
    std::memcpy(padded, dxc, nb * sizeof(float));
    std::memcpy(sum, sumc, nb * sizeof(int32_t));
    dxc = padded;
    sumc = sum;
  }
  const __m256 sum_f[2] = {_mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sumc))),
                           _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sumc + 8)))};
  for (int i = 0; i < R; ++i) {
    for (int64_t j = 0; j < nb; ++j) std::memcpy(&dm[j], rows[i] + (b0 + j) * kBytes, 4);
    for (int64_t h = 0; h < kScaleChunk; h += 8) {
      const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(dm + h));
      // Per 128-bit lane [d d d d m m m m] (u16; packus cannot saturate a value below 2^16),
      // then the lanes' quarters reordered: 8 d halves, then 8 m halves.
      const __m256i halves = _mm256_permute4x64_epi64(
          _mm256_packus_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_srli_epi32(v, 16)), 0xD8);
      const __m256 dx = _mm256_loadu_ps(dxc + h);
      _mm256_store_ps(&s[i][h], _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(halves)), dx));
      const __m256 s_m = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(halves, 1)), dx);
      acc_min[i] = _mm256_fmadd_ps(s_m, sum_f[h / 8], acc_min[i]);
    }
  }
}

KVQ_MATVEC_X86_ATTR inline float HorizontalSumX86(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// R consecutive rows from r, sharing each load of the activation block. B::Dot maps a block's 32
// weights onto the 32 bytes of one 256-bit vector in element order, so int32 lane l sums elements
// 4l .. 4l+3 — the grouping of QuantizedX::offset.
template <class B, int R>
KVQ_MATVEC_X86_ATTR void QuantRowGroupX86(const uint8_t* w, const QuantizedX& x, float* y, int64_t cols,
                                          int64_t r) {
  constexpr int64_t kBytes = B::kBytes;
  constexpr bool kMin = HasMin<B>();
  const int64_t n_blocks = cols / kQuantBlockElems;
  const int64_t row_bytes = n_blocks * kBytes;
  const uint8_t* a[R];
  __m256 acc[R];
  __m256 acc_min[R];  // the min terms (kMin only): lane j sums blocks ≡ j mod 8
  for (int i = 0; i < R; ++i) {
    a[i] = w + (r + i) * row_bytes;
    acc[i] = _mm256_setzero_ps();
    acc_min[i] = _mm256_setzero_ps();
  }
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
    if constexpr (kMin) {
      ChunkScalesMinX86<R, kBytes>(a, x, b0, nb, s, acc_min);
    } else {
      ChunkScalesX86<R, kBytes>(a, x.d, b0, nb, s);
    }
    for (int64_t j = 0; j < nb; ++j) {
      const int64_t b = b0 + j;
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + b * kQuantBlockElems));
      const __m256i off = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.offset + b * 8));
      for (int i = 0; i < R; ++i) {
        const __m256i dot = B::Dot(a[i] + b * kBytes + CodeOffset<B>(), xv, off);
        acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(s[i][j]), _mm256_cvtepi32_ps(dot), acc[i]);
      }
    }
  }
  for (int i = 0; i < R; ++i) {
    if constexpr (kMin) {
      y[r + i] = HorizontalSumX86(_mm256_add_ps(B::Finish(acc[i]), acc_min[i]));
    } else {
      y[r + i] = HorizontalSumX86(B::Finish(acc[i]));
    }
  }
}

template <class B>
void QuantRows(const uint8_t* w, const QuantizedX& x, float* y, int64_t cols, int64_t r0, int64_t r1) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) QuantRowGroupX86<B, 4>(w, x, y, cols, r);
  for (; r < r1; ++r) QuantRowGroupX86<B, 1>(w, x, y, cols, r);
}

// QuantizedX::offset as this target's kernels of B start their int32 lanes: lane j covers
// elements 4j .. 4j+3 (the high half of a block: lanes 4..7 of its 8).
template <class B>
void ActivationOffsets(const int8_t* q, int64_t n, int32_t* offset) {
  for (int64_t j = 0; j < n / kLaneElems; ++j) {
    const int32_t k = B::OffsetBias(j % 8 >= 4);
    offset[j] = -k * (q[4 * j] + q[4 * j + 1] + q[4 * j + 2] + q[4 * j + 3]);
  }
}

#else  // not x86 AVX2 or better: plain integer loops

// B::kGroupArithmetic if B declares it, else false.
template <class B>
constexpr bool GroupArithmetic() {
  if constexpr (requires { B::kGroupArithmetic; }) {
    return B::kGroupArithmetic;
  } else {
    return false;
  }
}

// fma(s, i, acc) rounded once, for |i| < 2^24, without an FMA instruction (WebAssembly has none, and
// std::fma is a library call there): s·i is exact in double (24 + 24 bits), so r = acc + s·i is
// the nearest double to the exact sum v, and no float midpoint (a double) lies strictly between v
// and r; RN32(r) is therefore RN32(v) unless r is itself a midpoint (low 29 significand bits
// 1000…0, where r's tie may not be v's) or below the normal floats (where the midpoints have
// another pattern). Those rare cases take std::fma.
inline float FusedMulAddInt(float s, int32_t i, float acc) {
  const double r = static_cast<double>(acc) + static_cast<double>(s) * static_cast<double>(i);
  uint64_t bits;
  std::memcpy(&bits, &r, 8);
  const bool midpoint = (bits & 0x1FFFFFFFu) == 0x10000000u;
  const bool subnormal_range = r != 0.0 && r < 0x1p-126 && r > -0x1p-126;
  if (midpoint || subnormal_range) return std::fma(s, static_cast<float>(i), acc);
  return static_cast<float>(r);
}

// The integer dot of one block (exact), then acc += s·dot (s = d_w·d_x rounded once): a type with
// kGroupArithmetic (Q4_0, Q8_0) rounds once, acc = fma(s, dot, acc), as the 16-row groups' kernel
// does on every target (interleaved_rows-inl.h), so its rows give the groups' bits here; the others
// round the product and the sum. With a min also acc_min += s_m·Σq (s_m = m·d_x rounded once),
// added to acc at the end.
template <class B, int R>
void QuantRowGroupGeneric(const uint8_t* w, const QuantizedX& x, float* y, int64_t cols, int64_t r) {
  constexpr int64_t kBytes = B::kBytes;
  constexpr bool kMin = HasMin<B>();
  const int64_t n_blocks = cols / kQuantBlockElems;
  const int64_t row_bytes = n_blocks * kBytes;
  float acc[R];
  float acc_min[R];
  for (int i = 0; i < R; ++i) acc[i] = 0.0f, acc_min[i] = 0.0f;
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int8_t* q = x.q + b * kQuantBlockElems;
    for (int i = 0; i < R; ++i) {
      const uint8_t* block = w + (r + i) * row_bytes + b * kBytes;
      const int32_t dot = B::DotScalar(block + CodeOffset<B>(), q);
      uint16_t d_bits;
      std::memcpy(&d_bits, block, 2);  // little-endian host
      const float s = F16ToF32(d_bits) * x.d[b];
      if constexpr (GroupArithmetic<B>()) {
        acc[i] = FusedMulAddInt(s, dot, acc[i]);
      } else {
        acc[i] += s * static_cast<float>(dot);
      }
      if constexpr (kMin) {
        uint16_t m_bits;
        std::memcpy(&m_bits, block + 2, 2);
        const float s_m = F16ToF32(m_bits) * x.d[b];
        acc_min[i] += s_m * static_cast<float>(x.sum[b]);
      }
    }
  }
  for (int i = 0; i < R; ++i) {
    if constexpr (kMin) {
      y[r + i] = acc[i] + acc_min[i];
    } else {
      y[r + i] = acc[i];
    }
  }
}

#undef KVQ_QUANT_ROWS_LANES
#if HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
#define KVQ_QUANT_ROWS_LANES 1
// B::DotLanes if B declares it: a 128-bit target's block dot, int32 lanes that sum to DotScalar.
template <class B>
constexpr bool HasDotLanes() {
  return requires(const uint8_t* c, const hn::Vec<QrI16>* q) { B::DotLanes(c, q); };
}

#if HWY_TARGET == HWY_WASM
// FusedMulAddInt on four lanes (acc[k] = fma(s_k, i_k, acc[k])) in f64x2 halves, for WebAssembly,
// where Highway 1.0.3 has no f64 vectors. Returns false, acc untouched, where a lane is a midpoint
// or below the normal floats: the caller then takes FusedMulAddInt per lane.
inline bool FusedMulAddIntWasm(v128_t s, v128_t i, float* acc) {
  const v128_t a = wasm_v128_load(acc);
  const auto half = [](v128_t a2, v128_t s2, v128_t i2) {  // the low two lanes' r = a + s·i in f64
    return wasm_f64x2_add(wasm_f64x2_promote_low_f32x4(a2),
                          wasm_f64x2_mul(wasm_f64x2_promote_low_f32x4(s2), wasm_f64x2_convert_low_i32x4(i2)));
  };
  const v128_t lo = half(a, s, i);
  const v128_t hi = half(wasm_i32x4_shuffle(a, a, 2, 3, 0, 1), wasm_i32x4_shuffle(s, s, 2, 3, 0, 1),
                         wasm_i32x4_shuffle(i, i, 2, 3, 0, 1));
  const v128_t low_bits = wasm_i64x2_const(0x1FFFFFFF, 0x1FFFFFFF);
  const v128_t mid = wasm_i64x2_const(0x10000000, 0x10000000);
  const v128_t tiny = wasm_f64x2_const(0x1p-126, 0x1p-126);
  const v128_t zero = wasm_f64x2_const(0.0, 0.0);
  const auto unsafe = [&](v128_t r) {
    return wasm_v128_or(wasm_i64x2_eq(wasm_v128_and(r, low_bits), mid),
                        wasm_v128_and(wasm_f64x2_lt(wasm_f64x2_abs(r), tiny), wasm_f64x2_ne(r, zero)));
  };
  if (wasm_v128_any_true(wasm_v128_or(unsafe(lo), unsafe(hi)))) return false;
  wasm_v128_store(acc, wasm_i32x4_shuffle(wasm_f32x4_demote_f64x2_zero(lo), wasm_f32x4_demote_f64x2_zero(hi), 0, 1, 4, 5));
  return true;
}
#endif

// QuantizedX::offset [n bytes] as PlaneRowGroup reads it: per weight block wb, plane p lane j,
// byte E·wb + 16p + j = code E·wb + B::kPlanes·j + p (E = B::kBlockElems = 16·B::kPlanes: element
// p of the block's code byte j).
template <class B>
void PlaneActivationOffsets(const int8_t* q, int64_t n, int32_t* offset) {
  constexpr int64_t kElems = B::kBlockElems;
  static_assert(kElems == 16 * B::kPlanes, "16 code bytes per weight block");
  int8_t* out = reinterpret_cast<int8_t*>(offset);
  for (int64_t wb = 0; wb < n / kElems; ++wb) {
    for (int64_t p = 0; p < B::kPlanes; ++p) {
      for (int64_t j = 0; j < 16; ++j) out[kElems * wb + 16 * p + j] = q[kElems * wb + B::kPlanes * j + p];
    }
  }
}

// Q1_0's and Q2_0's plain row loop (a weight block: an f16 d_w, then 16 code bytes for B::kSub
// activation blocks; per activation block acc += (d_w·d_x)·f32(I_b), the product and the sum
// rounded apart) for four rows at a time: lane i of the f32 vectors is row r + i, each f32
// operation the loop's on the same values in the same order, so the same bits. The activation's
// codes come permuted per weight block (B::kPlanes vectors of 16 in QuantizedX::offset,
// PlaneActivationOffsets), and B::BlockSums(rows, at, planes, j) gives j[s] lane i = row i's
// J of activation block s, exact, with I = B::kJScale·J − Σq. R < 4: the last row is read again
// in the spare lanes, which are dropped.
template <class B, int R>
void PlaneRowGroup(const uint8_t* w, const QuantizedX& x, float* y, int64_t cols, int64_t r) {
  const hn::Full128<int8_t> d8;
  const QrI32 d32;
  const QrF32 df;
  const int64_t n_wb = cols / B::kBlockElems;
  const int64_t row_bytes = n_wb * B::kBlockBytes;
  const uint8_t* a[4];  // lane i's row
  for (int i = 0; i < 4; ++i) a[i] = w + (r + std::min(i, R - 1)) * row_bytes;
  auto acc = hn::Zero(df);
  for (int64_t wb = 0; wb < n_wb; ++wb) {
    const auto d = FourScales(a, wb * B::kBlockBytes);  // the rows' d_w
    const int8_t* perm = reinterpret_cast<const int8_t*>(x.offset) + wb * B::kBlockElems;
    hn::Vec<hn::Full128<int8_t>> planes[B::kPlanes];  // [kPlanes] the weight block's codes, permuted
    for (int p = 0; p < B::kPlanes; ++p) planes[p] = hn::LoadU(d8, perm + 16 * p);
    hn::Vec<QrI32> j[B::kSub];
    B::BlockSums(a, wb * B::kBlockBytes + 2, planes, j);
    for (int64_t s = 0; s < B::kSub; ++s) {
      const int64_t b = wb * B::kSub + s;
      const auto sc = hn::Mul(d, hn::Set(df, x.d[b]));
      const auto dot = hn::Sub(B::kJScale == 2 ? hn::Add(j[s], j[s]) : j[s], hn::Set(d32, x.sum[b]));  // I_b
      acc = hn::Add(acc, hn::Mul(sc, hn::ConvertTo(df, dot)));
    }
  }
  alignas(16) float out[4];
  hn::Store(acc, df, out);
  for (int i = 0; i < R; ++i) y[r + i] = out[i];
}

// A block's int8 codes (elements 0..15 in lo, 16..31 in hi) against its activations widened to
// int16 (elements 8k .. 8k+7 in q16[k]): int32 lanes whose sum is Σ code·q, exact (i16 pairs
// through ReorderWidenMulAccumulate: i32x4.dot_i16x8 / pmaddwd).
inline hn::Vec<QrI32> CodeDotLanes(hn::Vec<hn::Full128<int8_t>> lo, hn::Vec<hn::Full128<int8_t>> hi,
                                   const hn::Vec<QrI16>* q16) {
  const QrI16 d16;
  const QrI32 d32;
  const hn::Full64<int8_t> d8h;
  auto sum1 = hn::Zero(d32);  // unused by int16 on these targets; RearrangeToOddPlusEven folds it
  auto sum = hn::ReorderWidenMulAccumulate(d32, hn::PromoteTo(d16, hn::LowerHalf(d8h, lo)), q16[0], hn::Zero(d32), sum1);
  sum = hn::ReorderWidenMulAccumulate(d32, hn::PromoteTo(d16, hn::UpperHalf(d8h, lo)), q16[1], sum, sum1);
  sum = hn::ReorderWidenMulAccumulate(d32, hn::PromoteTo(d16, hn::LowerHalf(d8h, hi)), q16[2], sum, sum1);
  sum = hn::ReorderWidenMulAccumulate(d32, hn::PromoteTo(d16, hn::UpperHalf(d8h, hi)), q16[3], sum, sum1);
  return hn::RearrangeToOddPlusEven(sum, sum1);
}

// The 4-bit and 5-bit types' unsigned codes: low nibbles of qs[0..15] are elements 0..15, high
// nibbles 16..31; with qh (4 bytes, bit j = bit 4 of element j), that bit added as 16.
inline void NibbleCodes(const uint8_t* qs, hn::Vec<hn::Full128<int8_t>>* lo, hn::Vec<hn::Full128<int8_t>>* hi) {
  const hn::Full128<uint8_t> du8;
  const hn::Full128<int8_t> d8;
  const auto raw = hn::LoadU(du8, qs);
  *lo = hn::BitCast(d8, hn::And(raw, hn::Set(du8, 0x0F)));
  *hi = hn::BitCast(d8, hn::ShiftRight<4>(raw));
}
inline void FiveBitCodes(const uint8_t* qh, const uint8_t* qs, hn::Vec<hn::Full128<int8_t>>* lo,
                         hn::Vec<hn::Full128<int8_t>>* hi) {
  const hn::Full128<uint8_t> du8;
  const hn::Full128<int8_t> d8;
  alignas(16) static constexpr uint8_t kBytesLo[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
  alignas(16) static constexpr uint8_t kBytesHi[16] = {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
  alignas(16) static constexpr uint8_t kBit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  uint32_t word;
  std::memcpy(&word, qh, 4);  // little-endian host
  const auto bytes = hn::BitCast(du8, hn::Set(hn::Full128<uint32_t>(), word));
  const auto bit = hn::Load(du8, kBit);
  const auto sixteen = hn::Set(du8, 16);
  const auto high_lo = hn::IfThenElseZero(hn::TestBit(hn::TableLookupBytes(bytes, hn::Load(du8, kBytesLo)), bit), sixteen);
  const auto high_hi = hn::IfThenElseZero(hn::TestBit(hn::TableLookupBytes(bytes, hn::Load(du8, kBytesHi)), bit), sixteen);
  NibbleCodes(qs, lo, hi);
  *lo = hn::Or(*lo, hn::BitCast(d8, high_lo));
  *hi = hn::Or(*hi, hn::BitCast(d8, high_hi));
}

// Four rows from r with the block dots on 128-bit vectors (the WebAssembly module's SIMD128, x86
// SSE4): per block, B::DotLanes gives each row's int32 lanes, a transpose-add makes lane i row i's
// integer dot (exact, so the same integer as DotScalar), and row i then takes QuantRowGroupGeneric's
// f32 operations on vectors, lane i = row r + i: s = d_w·d_x rounded once, then acc = fma(s, dot,
// acc) (B has kGroupArithmetic) or acc + s·dot rounded twice; with a min also acc_min += s_m·Σq
// (s_m = m·d_x), added at the end. The bits are QuantRowGroupGeneric's (and for kGroupArithmetic
// the 16-row groups' on every target).
template <class B>
void QuantRowQuadLanes(const uint8_t* w, const QuantizedX& x, float* y, int64_t cols, int64_t r) {
  constexpr int64_t kBytes = B::kBytes;
  constexpr bool kMin = HasMin<B>();
  const QrI16 d16;
  const QrI32 d32;
  const QrF32 df;
  const hn::Full64<int8_t> d8h;
  const int64_t n_blocks = cols / kQuantBlockElems;
  const int64_t row_bytes = n_blocks * kBytes;
  const uint8_t* a = w + r * row_bytes;  // [4][row_bytes] the four rows
  alignas(16) float acc[4] = {};         // row r + i (kGroupArithmetic)
  auto acc_v = hn::Zero(df), acc_min = hn::Zero(df);  // lane i: row r + i (the others)
  for (int64_t b = 0; b < n_blocks; ++b) {
    // The block's 32 activations widened to int16, elements 8k .. 8k+7 in q16[k], shared by the rows.
    const int8_t* q = x.q + b * kQuantBlockElems;
    const hn::Vec<QrI16> q16[4] = {hn::PromoteTo(d16, hn::LoadU(d8h, q)), hn::PromoteTo(d16, hn::LoadU(d8h, q + 8)),
                                   hn::PromoteTo(d16, hn::LoadU(d8h, q + 16)),
                                   hn::PromoteTo(d16, hn::LoadU(d8h, q + 24))};
    const uint8_t* blk = a + b * kBytes;
    const auto l0 = B::DotLanes(blk + CodeOffset<B>(), q16);
    const auto l1 = B::DotLanes(blk + row_bytes + CodeOffset<B>(), q16);
    const auto l2 = B::DotLanes(blk + 2 * row_bytes + CodeOffset<B>(), q16);
    const auto l3 = B::DotLanes(blk + 3 * row_bytes + CodeOffset<B>(), q16);
    const auto dot = SumLanesOfFour(l0, l1, l2, l3);  // lane i: row i's integer dot
    const uint8_t* const rows[4] = {blk, blk + row_bytes, blk + 2 * row_bytes, blk + 3 * row_bytes};
    const auto dx = hn::Set(df, x.d[b]);
    const auto s = hn::Mul(FourScales(rows, 0), dx);  // d_w·d_x
    if constexpr (kMin) {  // m·d_x, then times Σq
      acc_min = hn::Add(acc_min, hn::Mul(hn::Mul(FourScales(rows, 2), dx), hn::Set(df, static_cast<float>(x.sum[b]))));
    }
    if constexpr (!GroupArithmetic<B>()) {
      acc_v = hn::Add(acc_v, hn::Mul(s, hn::ConvertTo(df, dot)));
      continue;
    }
#if HWY_TARGET == HWY_WASM
    if (FusedMulAddIntWasm(s.raw, dot.raw, acc)) continue;
#endif
    alignas(16) float sk[4];
    alignas(16) int32_t ik[4];  // the rows' integer dots
    hn::Store(s, df, sk);
    hn::Store(dot, d32, ik);
    for (int k = 0; k < 4; ++k) acc[k] = FusedMulAddInt(sk[k], ik[k], acc[k]);
  }
  if constexpr (!GroupArithmetic<B>()) {
    hn::Store(kMin ? hn::Add(acc_v, acc_min) : acc_v, df, acc);
  }
  for (int k = 0; k < 4; ++k) y[r + k] = acc[k];
}
#else
#define KVQ_QUANT_ROWS_LANES 0
#endif

template <class B>
void QuantRows(const uint8_t* w, const QuantizedX& x, float* y, int64_t cols, int64_t r0, int64_t r1) {
  int64_t r = r0;
#if KVQ_QUANT_ROWS_LANES
  if constexpr (HasDotLanes<B>() && !(GroupArithmetic<B>() && HasMin<B>())) {
    for (; r + 4 <= r1; r += 4) QuantRowQuadLanes<B>(w, x, y, cols, r);
  }
#endif
  for (; r + 4 <= r1; r += 4) QuantRowGroupGeneric<B, 4>(w, x, y, cols, r);
  for (; r < r1; ++r) QuantRowGroupGeneric<B, 1>(w, x, y, cols, r);
}

template <class B>
void ActivationOffsets(const int8_t*, int64_t, int32_t*) {}  // the integer loops start from 0

#endif  // HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2

template <class B>
const WeightKernels& MakeQuantKernels() {
  static const WeightKernels kKernels = {
      .target = hwy::TargetName(HWY_TARGET),
      .rows = nullptr,
      .activation_offsets = &ActivationOffsets<B>,
      .quant_rows = &QuantRows<B>,
  };
  return kKernels;
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
