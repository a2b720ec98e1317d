// Q4_1 row kernels for every compiled target: the nibble dot product plugged into the
// quantised-activation row driver (weights/quant_rows-inl.h), which adds the min term m·d_x·Σq.
// AVX3_DL is compiled here for its vpdpbusd (AVX-512 VNNI).
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "weights/q4_1/q4_1_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "weights/q4_1/q4_1.h"
#include "weights/quant_rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

// A block's 32 nibbles map onto the 32 bytes of one 256-bit vector in element order: the 16 low
// nibbles, then the 16 high nibbles, from one 16-byte load broadcast to both halves. The nibbles
// are unsigned already (the min carries the offset), so the lanes start at 0.
struct Q4_1Block {
  static constexpr int64_t kBytes = 20;
  static constexpr bool kHasMin = true;
  static int32_t OffsetBias(bool /*high_half*/) { return 0; }
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  static KVQ_MATVEC_X86_ATTR inline __m256i Dot(const uint8_t* qs, __m256i xv, __m256i off) {
    const __m256i raw = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
#if KVQ_MATVEC_VNNI
    // Low half: n; high half: the byte & 0xF0 = 16·n, unshifted (one AND for both): lanes 4..7
    // hold 16·Σ n·q, exact, undone by Finish (a power of two commutes with the f32 rounding).
    const __m256i nibble_masks = _mm256_set_m128i(_mm_set1_epi8(static_cast<char>(0xF0)), _mm_set1_epi8(0x0F));
    return _mm256_dpbusd_epi32(off, _mm256_and_si256(raw, nibble_masks), xv);  // off = 0
#else
    (void)off;
    // The upper half shifted right by 4: n in every byte. maddubs: |n·q| ≤ 15·127, so the i16
    // pair sums cannot saturate.
    const __m256i nib = _mm256_and_si256(_mm256_srlv_epi64(raw, _mm256_set_epi64x(4, 4, 0, 0)),
                                         _mm256_set1_epi8(0x0F));
    return _mm256_madd_epi16(_mm256_maddubs_epi16(nib, xv), _mm256_set1_epi16(1));
#endif
  }
  // VNNI: lanes 4..7 hold 16× their sums; one multiply by 1/16 per row (exact).
  static KVQ_MATVEC_X86_ATTR inline __m256 Finish(__m256 acc) {
#if KVQ_MATVEC_VNNI
    return _mm256_mul_ps(acc, _mm256_set_ps(0.0625f, 0.0625f, 0.0625f, 0.0625f, 1.0f, 1.0f, 1.0f, 1.0f));
#else
    return acc;
#endif
  }
#else
  static int32_t DotScalar(const uint8_t* qs, const int8_t* q) {
    int32_t dot = 0;
    for (int j = 0; j < 16; ++j) dot += (qs[j] & 0x0F) * q[j] + (qs[j] >> 4) * q[j + 16];
    return dot;
  }
#if KVQ_QUANT_ROWS_LANES
  // DotScalar on 128-bit vectors (QuantRowQuadLanes): the nibbles widened to int16 against q16.
  static hn::Vec<QrI32> DotLanes(const uint8_t* qs, const hn::Vec<QrI16>* q16) {
    hn::Vec<hn::Full128<int8_t>> lo, hi;
    NibbleCodes(qs, &lo, &hi);
    return CodeDotLanes(lo, hi, q16);
  }
#endif
#endif
};

const WeightKernels& Q4_1WeightKernelsHere() { return MakeQuantKernels<Q4_1Block>(); }

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::weights_q4_1 {
HWY_EXPORT(Q4_1WeightKernelsHere);
const WeightKernels& Kernels() { return HWY_DYNAMIC_DISPATCH(Q4_1WeightKernelsHere)(); }
}  // namespace kvq::weights_q4_1
#endif
