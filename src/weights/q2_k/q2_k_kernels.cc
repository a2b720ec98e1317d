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
#include "weights/kquant_interleaved-inl.h"
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
#elif HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  // The reference Ints on vectors (the same integers), 16 codes at a time: element 128h + 32k + l
  // is bits 2k, 2k+1 of byte 16 + 32h + l (one 16-bit shift and a byte mask).
  static void Ints(const uint8_t* block, KQuantInts* out) {
    namespace hn = hwy::HWY_NAMESPACE;
    const hn::Full128<uint8_t> du8;
    const hn::Full128<uint16_t> du16;
    out->d = KQuantHalf(block + 80);
    out->dmin = KQuantHalf(block + 82);
    for (int j = 0; j < 16; ++j) out->sc[j] = block[j] & 15, out->m[j] = block[j] >> 4;
    const auto mask2 = hn::Set(du8, uint8_t{3});
    auto* code = reinterpret_cast<uint8_t*>(out->code);
    for (int h = 0; h < 2; ++h) {
      for (int half = 0; half < 2; ++half) {
        const auto v = hn::BitCast(du16, hn::LoadU(du8, block + 16 + 32 * h + 16 * half));
        for (int k = 0; k < 4; ++k) {
          hn::StoreU(hn::And(hn::BitCast(du8, hn::ShiftRightSame(v, 2 * k)), mask2), du8, code + 128 * h + 32 * k + 16 * half);
        }
      }
    }
  }
#else
  static void Ints(const uint8_t* block, KQuantInts* out) { weights_q2_k::Ints(block, out); }
#endif
};

// The 16-row interleaved layout (weights/kquant_repack.h) for KQuantInterleavedRows.
struct Q2_KInterleaved {
  static constexpr WeightType kType = WeightType::kQ2_K;
  static constexpr int64_t kBytes = 84;
  static constexpr bool kSub16 = true;
  static constexpr int64_t kGroupBlock = kKqIlRows * kBytes;  // a group's super-block
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  // Per super-block: per token the sums S of the 16 sub-blocks' activation codes (the first halves
  // of its blocks summed here, the second the block sums less those; scaled by 2^−f_k below, exact).
  // Per quad p of sub-blocks (activation blocks 2p, 2p+1): one scale vector gives sub-block 4p+k's
  // sc/4^k (masked in place at sc·2^8k, times 2^−10k: exact) and m·2^f_k (masked in place; f_k = 4,
  // 12, 20, and 0 for the top byte, shifted down: its 2^28 would be negative); its 4 code vectors
  // give each sub-block's codes by one mask (V::Q2Codes, 4^k·code on VNNI). Per block and token
  // M = (4^k·I_2b)·(sc_2b/4^k) + (4^k·I_2b+1)·(sc_2b+1/4^k) and N = (m·2^f)·(S·2^−f) summed over the
  // two sub-blocks, both exact in f32 (kquant_interleaved-inl.h), then one FMA each.
  template <class V, int T>
  static KVQ_KQUANT_X86_ATTR void Step(const uint8_t* g, const QuantizedX& x0, int64_t cols, int64_t t0, float* y,
                                       int64_t y_stride, int64_t r, int half) {
    using I = typename V::I;
    using F = typename V::F;
    const int64_t n_super = cols / kKQuantBlockElems;
    const KqTokens<T> x(x0, cols, t0);
    F acc[T], macc[T];
    for (int t = 0; t < T; ++t) acc[t] = macc[t] = V::Zero();
    constexpr float kMinUnit[4] = {0x1p-4f, 0x1p-12f, 0x1p-20f, 1.0f};  // 2^−f_k
    const I sc_mask[4] = {V::Set32(0x0F), V::Set32(0x0F00), V::Set32(0x0F0000), V::Set32(0x0F000000)};
    const I m_mask[3] = {V::Set32(0xF0), V::Set32(0xF000), V::Set32(0xF00000)};
    const F sc_unit[4] = {V::Set1(1.0f), V::Set1(0x1p-10f), V::Set1(0x1p-20f), V::Set1(0x1p-30f)};  // 2^−10k
    const __m256i quad_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t sb = 0; sb < n_super; ++sb) {
      const uint8_t* blk = g + sb * kGroupBlock;
      alignas(32) float s_scaled[T][16];  // [token][sub-block] S·2^−f_k, k = sub-block % 4
      for (int t = 0; t < T; ++t) {
        const int8_t* qs = x.q[t] + sb * kKQuantBlockElems;
        __m256i v[4];  // the first 16 codes of blocks 2u and 2u+1, summed by 4
        for (int u = 0; u < 4; ++u) {
          const __m256i pair = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(qs + 64 * u + 32),
                                                   reinterpret_cast<const __m128i*>(qs + 64 * u));
          v[u] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), pair), _mm256_set1_epi16(1));
        }
        const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
        alignas(32) int32_t first[8];  // [block] S of its first 16 codes
        _mm256_store_si256(reinterpret_cast<__m256i*>(first), _mm256_permutevar8x32_epi32(h, quad_order));
        for (int b = 0; b < 8; ++b) {
          const int32_t s2[2] = {first[b], x.sum[t][sb * 8 + b] - first[b]};
          for (int e = 0; e < 2; ++e) {
            const int s = 2 * b + e;
            s_scaled[t][s] = static_cast<float>(s2[e]) * kMinUnit[s % 4];  // exact
          }
        }
      }
      const F d = V::Halves(blk, half), dmin = V::Halves(blk + 32, half);
      for (int p = 0; p < 4; ++p) {  // sub-blocks 4p..4p+3: activation blocks 2p, 2p+1
        KqPrefetch<T>(blk + p * (kGroupBlock / 4), kGroupBlock / 4);
        const I sv = V::Load(blk + kQ2_KGroupScalesAt + 64 * p, half);
        F scq[4], mq[4];  // sub-block 4p+k: sc/4^k, m·2^f_k (exact)
        for (int k = 0; k < 4; ++k) scq[k] = V::Mul(V::Cvt(V::And(sv, sc_mask[k])), sc_unit[k]);
        for (int k = 0; k < 3; ++k) mq[k] = V::Cvt(V::And(sv, m_mask[k]));
        mq[3] = V::Cvt(V::Srl32(sv, 28));
        const uint8_t* codes = blk + kQ2_KGroupScaleBytes + 4 * p * 64;
        const I c[4] = {V::Load(codes, half), V::Load(codes + 64, half), V::Load(codes + 128, half),
                        V::Load(codes + 192, half)};
        for (int hb = 0; hb < 2; ++hb) {  // activation block ab: sub-blocks 4p + 2hb + e
          const int64_t ab = sb * 8 + 2 * p + hb;
          I u[2][4];
          for (int e = 0; e < 2; ++e) {
            for (int cc = 0; cc < 4; ++cc) u[e][cc] = V::Q2Codes(c[cc], 2 * hb + e);
          }
          for (int t = 0; t < T; ++t) {
            const int8_t* qb = x.q[t] + ab * 32;
            I dot0 = V::Set32(0), dot1 = V::Set32(0);
            for (int cc = 0; cc < 4; ++cc) {
              dot0 = V::Dot(dot0, u[0][cc], qb + 4 * cc);
              dot1 = V::Dot(dot1, u[1][cc], qb + 16 + 4 * cc);
            }
            dot0 = V::Q2Times(dot0, 2 * hb);
            dot1 = V::Q2Times(dot1, 2 * hb + 1);
            const int s0 = 4 * p + 2 * hb;
            const F main = V::Fma(V::Cvt(dot0), scq[2 * hb], V::Mul(V::Cvt(dot1), scq[2 * hb + 1]));  // exact
            const F mins = V::Fma(mq[2 * hb], V::Set1(s_scaled[t][s0]),
                                  V::Mul(mq[2 * hb + 1], V::Set1(s_scaled[t][s0 + 1])));  // exact
            acc[t] = V::Fma(V::Mul(d, V::Set1(x.dx[t][ab])), main, acc[t]);
            macc[t] = V::Fma(V::Mul(dmin, V::Set1(x.dx[t][ab])), mins, macc[t]);
          }
        }
      }
    }
    for (int t = 0; t < T; ++t) V::Store(y + (t0 + t) * y_stride + r + V::kLanes * half, V::Sub(acc[t], macc[t]));
  }
#else
  static void Ints(const uint8_t* block, KQuantInts* out) { weights_q2_k::Ints(block, out); }
#endif
};

const WeightKernels& Q2_KWeightKernelsHere() {
  static const WeightKernels kKernels = [] {
    WeightKernels k = MakeKQuantKernels<Q2_KBlock>();
    k.interleaved_rows = &KQuantInterleavedRows<Q2_KInterleaved>;
    return k;
  }();
  return kKernels;
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::weights_q2_k {
HWY_EXPORT(Q2_KWeightKernelsHere);
const WeightKernels& Kernels() { return HWY_DYNAMIC_DISPATCH(Q2_KWeightKernelsHere)(); }
}  // namespace kvq::weights_q2_k
#endif
