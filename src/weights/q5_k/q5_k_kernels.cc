// Q5_K row kernels for every compiled target: the super-block dot product plugged into the K-quant
// row driver (weights/kquant_rows-inl.h), and the 16-row interleaved layout's (Q4_K's kernel with
// the 5th bits, weights/kquant_interleaved-inl.h). AVX3_DL is compiled here for its vpdpbusd.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "weights/q5_k/q5_k_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "weights/kquant_rows-inl.h"
#include "weights/kquant_interleaved-inl.h"
#include "weights/q5_k/q5_k.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

struct Q5_KBlock {
  static constexpr int64_t kBytes = 176;
  static constexpr int kRowGroup = 4;
  static int32_t OffsetBias() { return 0; }  // nibbles are unsigned codes: no bias
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  // Sub-block j is activation block j: its scale goes into the f32 factor s_j = (d·sc_j)·d_x,j
  // (d·sc_j exact, one rounding), its min into macc += (dmin·d_x)·(m_j·Σq_j) (m·Σq ≤ 63·4064,
  // exact in f32). Per 64 elements one 32-byte load of qs: low nibbles = activation block 2c,
  // high nibbles (shifted down) = block 2c+1, their 5th bits from bits 2c, 2c+1 of qh (one load),
  // each an exact int32 lane dot with the codes (u ≤ 31: maddubs pairs ≤ 2·31·127, no saturation).
  template <int R>
  static KVQ_KQUANT_X86_ATTR inline void SuperBlockX86(const uint8_t* const* blk, const KQuantXBlock& x,
                                                       __m256* acc, __m256* macc) {
    alignas(32) float s[R][8];
    for (int i = 0; i < R; ++i) {
      alignas(8) uint8_t sc[8], m[8];
      KQuantScalesMins6(blk[i] + 4, sc, m);
      const __m256 d = _mm256_set1_ps(KQuantHalfX86(blk[i])),
                   dmin = _mm256_set1_ps(KQuantHalfX86(blk[i] + 2));
      _mm256_store_ps(s[i], _mm256_mul_ps(_mm256_mul_ps(d, KQuantU8x8(sc)), x.dx));
      macc[i] = _mm256_fmadd_ps(_mm256_mul_ps(dmin, x.dx), _mm256_mul_ps(KQuantU8x8(m), x.sum), macc[i]);
    }
    const __m256i low = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10), zero = _mm256_setzero_si256();
    __m256i qh[R];  // qh, shifted right by 2c: bits 0 and 1 of each byte are its chunk's 5th bits
    for (int i = 0; i < R; ++i) qh[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[i] + 16));
    for (int c = 0; c < 4; ++c) {
      const __m256i q_lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + 64 * c));
      const __m256i q_hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + 64 * c + 32));
      for (int i = 0; i < R; ++i) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[i] + 48 + 32 * c));
        // 16-bit shifts: bit 4 of each byte comes from bit 0 (1) of the same byte; the bits the
        // shifts of qh (by 6 at most) carry in from the next byte sit at bits ≥ 2.
        const __m256i u_lo = _mm256_or_si256(_mm256_and_si256(raw, low), _mm256_and_si256(_mm256_slli_epi16(qh[i], 4), bit4));
        const __m256i u_hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), low),
                                             _mm256_and_si256(_mm256_slli_epi16(qh[i], 3), bit4));
        qh[i] = _mm256_srli_epi16(qh[i], 2);
        const __m256i lo = KQuantDot(u_lo, q_lo, zero);
        const __m256i hi = KQuantDot(u_hi, q_hi, zero);
        acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(s[i][2 * c]), _mm256_cvtepi32_ps(lo), acc[i]);
        acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(s[i][2 * c + 1]), _mm256_cvtepi32_ps(hi), acc[i]);
      }
    }
  }
#elif HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  // The reference Ints on vectors (the same integers), 16 codes at a time: per chunk c the low
  // then the high nibbles of bytes 48 + 32c + l, the fifth bit from qh byte 16 + l, bit 2c + high,
  // moved to bit 4 — each by one 16-bit shift and a byte mask.
  static void Ints(const uint8_t* block, KQuantInts* out) {
    namespace hn = hwy::HWY_NAMESPACE;
    const hn::Full128<uint8_t> du8;
    const hn::Full128<uint16_t> du16;
    KQuantHeader6(block, out);
    const auto mask4 = hn::Set(du8, uint8_t{15}), fifth = hn::Set(du8, uint8_t{16});
    // qh's bit b moved to bit 4 of its byte (bits crossing bytes are masked off).
    const auto bit_at_4 = [&](hn::Vec<hn::Full128<uint16_t>> qh, int b) {
      return hn::And(hn::BitCast(du8, b <= 4 ? hn::ShiftLeftSame(qh, 4 - b) : hn::ShiftRightSame(qh, b - 4)), fifth);
    };
    auto* code = reinterpret_cast<uint8_t*>(out->code);
    for (int half = 0; half < 2; ++half) {
      const auto qh = hn::BitCast(du16, hn::LoadU(du8, block + 16 + 16 * half));
      for (int c = 0; c < 4; ++c) {
        const auto nib = hn::LoadU(du8, block + 48 + 32 * c + 16 * half);
        const auto high = hn::And(hn::BitCast(du8, hn::ShiftRight<4>(hn::BitCast(du16, nib))), mask4);
        hn::StoreU(hn::Or(hn::And(nib, mask4), bit_at_4(qh, 2 * c)), du8, code + 64 * c + 16 * half);
        hn::StoreU(hn::Or(high, bit_at_4(qh, 2 * c + 1)), du8, code + 64 * c + 32 + 16 * half);
      }
    }
  }
#else
  static void Ints(const uint8_t* block, KQuantInts* out) { weights_q5_k::Ints(block, out); }
#endif
};

// The 16-row interleaved layout (weights/kquant_repack.h) for KQuantInterleavedRows.
struct Q5_KInterleaved : KQuantNibblesInterleaved<true> {
#if !(HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2)
  static void Ints(const uint8_t* block, KQuantInts* out) { weights_q5_k::Ints(block, out); }
#endif
};

const WeightKernels& Q5_KWeightKernelsHere() {
  static const WeightKernels kKernels = [] {
    WeightKernels k = MakeKQuantKernels<Q5_KBlock>();
    k.interleaved_rows = &KQuantInterleavedRows<Q5_KInterleaved>;
    return k;
  }();
  return kKernels;
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::weights_q5_k {
HWY_EXPORT(Q5_KWeightKernelsHere);
const WeightKernels& Kernels() { return HWY_DYNAMIC_DISPATCH(Q5_KWeightKernelsHere)(); }
}  // namespace kvq::weights_q5_k
#endif
