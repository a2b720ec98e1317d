// Q6_K row kernels for every compiled target: the super-block dot product plugged into the K-quant
// row driver (weights/kquant_rows-inl.h). AVX3_DL is compiled here for its vpdpbusd.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "weights/q6_k/q6_k_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "weights/kquant_rows-inl.h"
#include "weights/q6_k/q6_k.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

struct Q6_KBlock {
  static constexpr int64_t kBytes = 210;
  static constexpr int kRowGroup = 2;
  // The kernels multiply the unsigned 6-bit codes u = code + 32: lanes start at −32·Σq.
  static int32_t OffsetBias() { return 32; }
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  // Per half (128 elements) three 32-byte loads, ql[0..31], ql[32..63] and qh[0..31], give the
  // codes of its four activation blocks k = 0..3 (q6_k.h). Each block's int32 lanes are exact
  // Σ (u − 32)·q over 4 elements (started from the offset); lanes 0-3 are sub-block 2b, lanes
  // 4-7 sub-block 2b+1, so the f32 factor per lane is s_j = (d·sc_j)·d_x (d·sc_j exact, one
  // rounding), permuted into place from the row's 16 factors.
  template <int R>
  static KVQ_KQUANT_X86_ATTR inline void SuperBlockX86(const uint8_t* const* blk, const KQuantXBlock& x,
                                                       __m256* acc, __m256*) {
    // d_x per sub-block: d_x of activation block j / 2.
    const __m256 dx_lo = _mm256_permutevar8x32_ps(x.dx, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
    const __m256 dx_hi = _mm256_permutevar8x32_ps(x.dx, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7));
    alignas(32) float s[R][16];  // [row][sub-block] (d·sc)·d_x
    for (int i = 0; i < R; ++i) {
      const __m256 d = _mm256_set1_ps(KQuantHalfX86(blk[i] + 208));
      _mm256_store_ps(s[i], _mm256_mul_ps(_mm256_mul_ps(d, KQuantI8x8(blk[i] + 192)), dx_lo));
      _mm256_store_ps(s[i] + 8, _mm256_mul_ps(_mm256_mul_ps(d, KQuantI8x8(blk[i] + 200)), dx_hi));
    }
    const __m256i low = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(0x30);
    const __m256i pick[4] = {_mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3),
                             _mm256_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5), _mm256_setr_epi32(6, 6, 6, 6, 7, 7, 7, 7)};
    for (int h = 0; h < 2; ++h) {
      __m256i q[4], off[4];
      for (int k = 0; k < 4; ++k) {
        q[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + 128 * h + 32 * k));
        off[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.off + 32 * h + 8 * k));
      }
      for (int i = 0; i < R; ++i) {
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[i] + 64 * h));
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[i] + 64 * h + 32));
        const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[i] + 128 + 32 * h));
        // 16-bit shifts: bits 4-5 of each byte come from the same byte, the rest is masked off.
        __m256i u[4];
        u[0] = _mm256_or_si256(_mm256_and_si256(a, low), _mm256_and_si256(_mm256_slli_epi16(hb, 4), two));
        u[1] = _mm256_or_si256(_mm256_and_si256(b, low), _mm256_and_si256(_mm256_slli_epi16(hb, 2), two));
        u[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low), _mm256_and_si256(hb, two));
        u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), low),
                               _mm256_and_si256(_mm256_srli_epi16(hb, 2), two));
        const __m256 sv = _mm256_load_ps(s[i] + 8 * h);
        for (int k = 0; k < 4; ++k) {
          const __m256i lanes = KQuantDot(u[k], q[k], off[k]);
          acc[i] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(sv, pick[k]), _mm256_cvtepi32_ps(lanes), acc[i]);
        }
      }
    }
  }
#else
  static void Ints(const uint8_t* block, KQuantInts* out) { weights_q6_k::Ints(block, out); }
#endif
};

const WeightKernels& Q6_KWeightKernelsHere() { return MakeKQuantKernels<Q6_KBlock>(); }

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::weights_q6_k {
HWY_EXPORT(Q6_KWeightKernelsHere);
const WeightKernels& Kernels() { return HWY_DYNAMIC_DISPATCH(Q6_KWeightKernelsHere)(); }
}  // namespace kvq::weights_q6_k
#endif
