// Q5_0 row kernels for every compiled target: the 5-bit block dot product plugged into the
// quantised-activation row driver (weights/quant_rows-inl.h). AVX3_DL is compiled here for its
// vpdpbusd (AVX-512 VNNI).
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "weights/q5_0/q5_0_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "weights/q5_0/q5_0.h"
#include "weights/quant_rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

// The kernels multiply the unsigned 5-bit values n = code + 16 (FiveBitCodesX86: one byte per
// element, in element order), so every lane starts at −16·Σq.
struct Q5_0Block {
  static constexpr int64_t kBytes = 22;
  static int32_t OffsetBias(bool /*high_half*/) { return 16; }
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  static KVQ_MATVEC_X86_ATTR inline __m256i Dot(const uint8_t* codes, __m256i xv, __m256i off) {
    const __m256i n = FiveBitCodesX86(codes);
#if KVQ_MATVEC_VNNI
    return _mm256_dpbusd_epi32(off, n, xv);
#else
    // maddubs: |n·q| ≤ 31·127, so the i16 pair sums (≤ 7874) cannot saturate.
    return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(n, xv), _mm256_set1_epi16(1)), off);
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
      const int32_t lo = ((qs[j] & 0x0F) | static_cast<int32_t>((qh >> j) & 1) << 4) - 16;
      const int32_t hi = ((qs[j] >> 4) | static_cast<int32_t>((qh >> (j + 16)) & 1) << 4) - 16;
      dot += lo * q[j] + hi * q[j + 16];
    }
    return dot;
  }
#if KVQ_QUANT_ROWS_LANES
  // DotScalar on 128-bit vectors (QuantRowQuadLanes): the 5-bit values − 16 widened to int16
  // against q16.
  static hn::Vec<QrI32> DotLanes(const uint8_t* codes, const hn::Vec<QrI16>* q16) {
    const hn::Full128<int8_t> d8;
    hn::Vec<hn::Full128<int8_t>> lo, hi;
    FiveBitCodes(codes, codes + 4, &lo, &hi);
    const auto sixteen = hn::Set(d8, 16);
    return CodeDotLanes(hn::Sub(lo, sixteen), hn::Sub(hi, sixteen), q16);
  }
#endif
#endif
};

const WeightKernels& Q5_0WeightKernelsHere() { return MakeQuantKernels<Q5_0Block>(); }

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::weights_q5_0 {
HWY_EXPORT(Q5_0WeightKernelsHere);
const WeightKernels& Kernels() { return HWY_DYNAMIC_DISPATCH(Q5_0WeightKernelsHere)(); }
}  // namespace kvq::weights_q5_0
#endif
