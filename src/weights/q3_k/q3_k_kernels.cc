// Q3_K row kernels for every compiled target: the super-block dot product plugged into the K-quant
// row driver (weights/kquant_rows-inl.h). AVX3_DL is compiled here for its vpdpbusd.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "weights/q3_k/q3_k_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "weights/kquant_rows-inl.h"
#include "weights/q3_k/q3_k.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

struct Q3_KBlock {
  static constexpr int64_t kBytes = 110;
  static constexpr int kRowGroup = 2;
  // The kernels multiply the unsigned codes u = code + 4 ∈ [0, 7]: lanes start at −4·Σq.
  static int32_t OffsetBias() { return 4; }
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  // Per half (128 elements) one 32-byte load of qs and the row's hmask give the codes of its four
  // activation blocks k: low 2 bits at bit 2k of qs, the high bit at bit 4h + k of hmask. Lanes
  // are exact Σ (u − 4)·q over 4 elements (started from the offset); lanes 0-3 are sub-block 2b,
  // 4-7 sub-block 2b+1, with f32 factors s_j = (d·sc_j)·d_x (d·sc_j exact, one rounding).
  template <int R>
  static KVQ_KQUANT_X86_ATTR inline void SuperBlockX86(const uint8_t* const* blk, const KQuantXBlock& x,
                                                       __m256* acc, __m256*) {
    const __m256 dx_lo = _mm256_permutevar8x32_ps(x.dx, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
    const __m256 dx_hi = _mm256_permutevar8x32_ps(x.dx, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7));
    const __m256 bias = _mm256_set1_ps(32.0f);
    alignas(32) float s[R][16];  // [row][sub-block] (d·sc)·d_x
    for (int i = 0; i < R; ++i) {
      alignas(16) uint8_t u[16];
      KQuantScales6x16(blk[i] + 96, u);
      const __m256 d = _mm256_set1_ps(KQuantHalfX86(blk[i] + 108));
      _mm256_store_ps(s[i], _mm256_mul_ps(_mm256_mul_ps(d, _mm256_sub_ps(KQuantU8x8(u), bias)), dx_lo));
      _mm256_store_ps(s[i] + 8, _mm256_mul_ps(_mm256_mul_ps(d, _mm256_sub_ps(KQuantU8x8(u + 8), bias)), dx_hi));
    }
    const __m256i three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    const __m256i pick[4] = {_mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3),
                             _mm256_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5), _mm256_setr_epi32(6, 6, 6, 6, 7, 7, 7, 7)};
    for (int h = 0; h < 2; ++h) {
      __m256i q[4], off[4];
      for (int k = 0; k < 4; ++k) {
        q[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + 128 * h + 32 * k));
        off[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.off + 32 * h + 8 * k));
      }
      for (int i = 0; i < R; ++i) {
        const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[i] + 32 + 32 * h));
        const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[i]));
        const __m256 sv = _mm256_load_ps(s[i] + 8 * h);
        for (int k = 0; k < 4; ++k) {
          // 16-bit shifts by < 8: the bits kept (0-1 of qs >> 2k, bit 2 of the moved hmask) come
          // from the same byte (a right shift by ≤ 5 carries the next byte in at bits ≥ 3).
          const int p = 4 * h + k;  // hmask bit -> bit 2
          const __m256i hb = p < 2 ? _mm256_slli_epi16(hm, 2 - p) : _mm256_srli_epi16(hm, p - 2);
          const __m256i u = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs, 2 * k), three),
                                            _mm256_and_si256(hb, four));
          const __m256i lanes = KQuantDot(u, q[k], off[k]);
          acc[i] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sv, pick[k]), _mm256_cvtepi32_ps(lanes), acc[i]);
        }
      }
    }
  }
#else
  static void Ints(const uint8_t* block, KQuantInts* out) { weights_q3_k::Ints(block, out); }
#endif
};

const WeightKernels& Q3_KWeightKernelsHere() { return MakeKQuantKernels<Q3_KBlock>(); }

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::weights_q3_k {
HWY_EXPORT(Q3_KWeightKernelsHere);
const WeightKernels& Kernels() { return HWY_DYNAMIC_DISPATCH(Q3_KWeightKernelsHere)(); }
}  // namespace kvq::weights_q3_k
#endif
