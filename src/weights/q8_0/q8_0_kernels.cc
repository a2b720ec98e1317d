// Q8_0 row kernels for every compiled target: the block dot product plugged into the
// quantised-activation row driver (weights/quant_rows-inl.h). AVX3_DL is compiled here for its
// vpdpbusd (AVX-512 VNNI).
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "weights/q8_0/q8_0_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "weights/q8_0/q8_0.h"
#include "weights/quant_rows-inl.h"
#include "weights/interleaved_rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

struct Q8_0Block {
  static constexpr int64_t kBytes = 34;
  // VNNI multiplies unsigned bytes: w ^ 0x80 = w + 128, so its lanes start at −128·Σq. The
  // maddubs path does not read the offset.
  static int32_t OffsetBias(bool /*high_half*/) { return 128; }
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  static KVQ_MATVEC_X86_ATTR inline __m256i Dot(const uint8_t* qs, __m256i xv, __m256i off) {
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
#if KVQ_MATVEC_VNNI
    return _mm256_dpbusd_epi32(off, _mm256_xor_si256(wv, _mm256_set1_epi8(static_cast<char>(0x80))),
                               xv);  // (w + 128)·q, then − 128·Σq
#else
    (void)off;
    // |w|·(±q): |w| ≤ 128 and |q| ≤ 127, so a pair sums to at most 32512 (no saturation).
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
#endif
  }
  static KVQ_MATVEC_X86_ATTR inline __m256 Finish(__m256 acc) { return acc; }
#else
  // The rows round as the groups do (quant_rows-inl.h): a page holding rows gives native's bits.
  static constexpr bool kGroupArithmetic = true;
  static int32_t DotScalar(const uint8_t* qs, const int8_t* q) {
    int32_t dot = 0;
    for (int j = 0; j < 32; ++j) dot += static_cast<int8_t>(qs[j]) * q[j];
    return dot;
  }
#if KVQ_QUANT_ROWS_LANES
  // DotScalar on 128-bit vectors: the int8 codes widened to int16 against q16 (elements
  // 8k .. 8k+7 in q16[k]); int32 lanes whose sum is the block's dot.
  static hn::Vec<QrI32> DotLanes(const uint8_t* qs, const hn::Vec<QrI16>* q16) {
    const hn::Full128<int8_t> d8;
    const int8_t* c = reinterpret_cast<const int8_t*>(qs);
    return CodeDotLanes(hn::LoadU(d8, c), hn::LoadU(d8, c + 16), q16);
  }
#endif
#endif
};

// The 16-row interleaved layout (weights/repack.h) for InterleavedRows.
struct Q8_0Interleaved {
  static constexpr int64_t kBytes = 34;
  static constexpr int64_t kElems = 32;
  static constexpr bool kSigned = true;
  static constexpr int32_t kBias = 128;  // VNNI multiplies w + 128 (unsigned)
  static int32_t CodeScalar(const uint8_t* codes, int64_t j, int64_t m) {
    return static_cast<int8_t>(codes[m / 4 * 64 + 4 * j + m % 4]);
  }
};

const WeightKernels& Q8_0WeightKernelsHere() {
  static const WeightKernels kKernels = [] {
    WeightKernels k = MakeQuantKernels<Q8_0Block>();
    k.interleaved_rows = &InterleavedRows<Q8_0Interleaved>;
    return k;
  }();
  return kKernels;
}

// Whether LoadModel repacks Q8_0 for this target (weights_q8_0::RepackPays): where the interleaved
// kernel is x86's (AVX2 or better). Elsewhere it is the portable loop (a std::fma per block and
// row, a library call in WebAssembly), which in the WebAssembly module ran at about a quarter of the
// 128-bit row kernels' speed (`node build/wasm/kvq-matvec-bench.js`, docs/performance.md).
bool Q8_0RepackPaysHere() { return HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2; }

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::weights_q8_0 {
HWY_EXPORT(Q8_0WeightKernelsHere);
HWY_EXPORT(Q8_0RepackPaysHere);
const WeightKernels& Kernels() { return HWY_DYNAMIC_DISPATCH(Q8_0WeightKernelsHere)(); }
bool RepackPays() { return HWY_DYNAMIC_DISPATCH(Q8_0RepackPaysHere)(); }
}  // namespace kvq::weights_q8_0
#endif
