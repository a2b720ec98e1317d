// Q2_K row kernels for every compiled target: the super-block dot product plugged into the K-quant
// row driver (weights/kquant_rows-inl.h). AVX3_DL is compiled here for its vpdpbusd.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "weights/q2_k/q2_k_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "weights/kquant_rows-inl.h"
#include "weights/q2_k/q2_k.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

struct Q2_KBlock {
  static constexpr int64_t kBytes = 84;
  static constexpr int kRowGroup = 4;
  static int32_t OffsetBias() { return 0; }  // unsigned codes: no bias
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  // Main terms as Q6_K's (lanes 0-3 sub-block 2b, 4-7 sub-block 2b+1, f32 factors (d·sc_j)·d_x),
  // the codes at bits 2k of one 32-byte load per half. Min terms per activation block b:
  // (dmin·d_x)·(m_2b·S_2b + m_2b+1·S_2b+1), S the sums of its two halves of 16 codes: S_2b computed
  // once per super-block for all rows, S_2b+1 = Σq − S_2b; the products and their sum are exact in
  // f32 (≤ 2·15·16·127).
  template <int R>
  static KVQ_KQUANT_X86_ATTR inline void SuperBlockX86(const uint8_t* const* blk, const KQuantXBlock& x,
                                                       __m256* acc, __m256* macc) {
    // S_2b for b = 0..7: the first 16 codes of each activation block, two blocks per vector.
    __m256i v[4];
    for (int t = 0; t < 4; ++t) {
      const __m256i pair = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(x.q + 64 * t + 32),
                                               reinterpret_cast<const __m128i*>(x.q + 64 * t));
      v[t] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), pair), _mm256_set1_epi16(1));
    }
    // Two rounds of hadd: lanes [S0 S2 S4 S6 | S1 S3 S5 S7], then into order.
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256 s_even = _mm256_cvtepi32_ps(_mm256_permutevar8x32_epi32(h, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    const __m256 s_odd = _mm256_sub_ps(x.sum, s_even);  // exact: integers below 2^13
    const __m256 dx_lo = _mm256_permutevar8x32_ps(x.dx, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
    const __m256 dx_hi = _mm256_permutevar8x32_ps(x.dx, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7));
    const __m128i deinterleave = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m128i nib = _mm_set1_epi8(0x0F);
    alignas(32) float s[R][16];  // [row][sub-block] (d·sc)·d_x
    for (int i = 0; i < R; ++i) {
      const __m128i scales = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk[i]));
      const __m128i sc = _mm_and_si128(scales, nib);
      const __m128i m = _mm_and_si128(_mm_srli_epi16(_mm_shuffle_epi8(scales, deinterleave), 4), nib);
      const __m256 d = _mm256_set1_ps(KQuantHalfX86(blk[i] + 80));
      const __m256 dmin = _mm256_set1_ps(KQuantHalfX86(blk[i] + 82));
      _mm256_store_ps(s[i], _mm256_mul_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc))), dx_lo));
      _mm256_store_ps(s[i] + 8, _mm256_mul_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sc, 8)))), dx_hi));
      const __m256 m_even = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(m));
      const __m256 m_odd = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(m, 8)));
      const __m256 mins = _mm256_add_ps(_mm256_mul_ps(m_even, s_even), _mm256_mul_ps(m_odd, s_odd));
      macc[i] = _mm256_fmadd_ps(_mm256_mul_ps(dmin, x.dx), mins, macc[i]);
    }
    const __m256i three = _mm256_set1_epi8(3), zero = _mm256_setzero_si256();
    const __m256i pick[4] = {_mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3),
                             _mm256_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5), _mm256_setr_epi32(6, 6, 6, 6, 7, 7, 7, 7)};
    for (int hf = 0; hf < 2; ++hf) {
      __m256i q[4];
      for (int k = 0; k < 4; ++k) q[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + 128 * hf + 32 * k));
      for (int i = 0; i < R; ++i) {
        const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[i] + 16 + 32 * hf));
        const __m256 sv = _mm256_load_ps(s[i] + 8 * hf);
        for (int k = 0; k < 4; ++k) {
          // A 16-bit shift by 2k ≤ 6: bits 0-1 come from the same byte.
          const __m256i u = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * k), three);
          const __m256i lanes = KQuantDot(u, q[k], zero);
          acc[i] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sv, pick[k]), _mm256_cvtepi32_ps(lanes), acc[i]);
        }
      }
    }
  }
#else
  static void Ints(const uint8_t* block, KQuantInts* out) { weights_q2_k::Ints(block, out); }
#endif
};

const WeightKernels& Q2_KWeightKernelsHere() { return MakeKQuantKernels<Q2_KBlock>(); }

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::weights_q2_k {
HWY_EXPORT(Q2_KWeightKernelsHere);
const WeightKernels& Kernels() { return HWY_DYNAMIC_DISPATCH(Q2_KWeightKernelsHere)(); }
}  // namespace kvq::weights_q2_k
#endif
