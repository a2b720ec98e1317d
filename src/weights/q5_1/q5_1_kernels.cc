// Q5_1 row kernels for every compiled target: the 5-bit block dot product plugged into the
// quantised-activation row driver (weights/quant_rows-inl.h), which adds the min term m·d_x·Σq.
// AVX3_DL is compiled here for its vpdpbusd (AVX-512 VNNI).
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "weights/q5_1/q5_1_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "weights/q5_1/q5_1.h"
#include "weights/quant_rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

// The unsigned 5-bit values n (FiveBitCodesX86: one byte per element, in element order) are the
// codes themselves (the min carries the offset), so the lanes start at 0.
struct Q5_1Block {
  static constexpr int64_t kBytes = 24;
  static constexpr bool kHasMin = true;
  static int32_t OffsetBias(bool /*high_half*/) { return 0; }
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  static KVQ_MATVEC_X86_ATTR inline __m256i Dot(const uint8_t* codes, __m256i xv, __m256i off) {
    const __m256i n = FiveBitCodesX86(codes);
#if KVQ_MATVEC_VNNI
    return _mm256_dpbusd_epi32(off, n, xv);  // off = 0
#else
    (void)off;
    // maddubs: |n·q| ≤ 31·127, so the i16 pair sums (≤ 7874) cannot saturate.
    return _mm256_madd_epi16(_mm256_maddubs_epi16(n, xv), _mm256_set1_epi16(1));
#endif
  }
  static KVQ_MATVEC_X86_ATTR inline __m256 Finish(__m256 acc) { return acc; }
#else
  static int32_t DotScalar(const uint8_t* codes, const int8_t* q) {
    uint32_t qh;
    std::memcpy(&qh, codes, 4);  // little-endian host
    const uint8_t* qs = codes + 4;
    int32_t dot = 0;
    for (int j = 0; j < 16; ++j) {
      const int32_t lo = (qs[j] & 0x0F) | static_cast<int32_t>((qh >> j) & 1) << 4;
      const int32_t hi = (qs[j] >> 4) | static_cast<int32_t>((qh >> (j + 16)) & 1) << 4;
      dot += lo * q[j] + hi * q[j + 16];
    }
    return dot;
  }
#if KVQ_QUANT_ROWS_LANES
  // DotScalar on 128-bit vectors (QuantRowQuadLanes): the 5-bit values widened to int16 against q16.
  static hn::Vec<QrI32> DotLanes(const uint8_t* codes, const hn::Vec<QrI16>* q16) {
    hn::Vec<hn::Full128<int8_t>> lo, hi;
    FiveBitCodes(codes, codes + 4, &lo, &hi);
    return CodeDotLanes(lo, hi, q16);
  }
#endif
#endif
};

const WeightKernels& Q5_1WeightKernelsHere() { return MakeQuantKernels<Q5_1Block>(); }

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::weights_q5_1 {
HWY_EXPORT(Q5_1WeightKernelsHere);
const WeightKernels& Kernels() { return HWY_DYNAMIC_DISPATCH(Q5_1WeightKernelsHere)(); }
}  // namespace kvq::weights_q5_1
#endif
