// Q4_K row kernels for every compiled target: the super-block dot product plugged into the K-quant
// row driver (weights/kquant_rows-inl.h). AVX3_DL is compiled here for its vpdpbusd.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "weights/q4_k/q4_k_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "weights/kquant_rows-inl.h"
#include "weights/kquant_interleaved-inl.h"
#include "weights/q4_k/q4_k.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

struct Q4_KBlock {
  static constexpr int64_t kBytes = 144;
  static constexpr int kRowGroup = 4;
  static int32_t OffsetBias() { return 0; }  // nibbles are unsigned codes: no bias
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  // Sub-block j is activation block j: its scale goes into the f32 factor s_j = (d·sc_j)·d_x,j
  // (d·sc_j exact, one rounding), its min into macc += (dmin·d_x)·(m_j·Σq_j) (m·Σq ≤ 63·4064,
  // exact in f32). Per 64 elements one 32-byte load: low nibbles = activation block 2c, high
  // nibbles (shifted down) = block 2c+1, each an exact int32 lane dot with the codes.
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
    const __m256i low = _mm256_set1_epi8(0x0F), zero = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i q_lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + 64 * c));
      const __m256i q_hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + 64 * c + 32));
      for (int i = 0; i < R; ++i) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[i] + 16 + 32 * c));
        const __m256i lo = KQuantDot(_mm256_and_si256(raw, low), q_lo, zero);
        const __m256i hi = KQuantDot(_mm256_and_si256(_mm256_srli_epi16(raw, 4), low), q_hi, zero);
        acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(s[i][2 * c]), _mm256_cvtepi32_ps(lo), acc[i]);
        acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(s[i][2 * c + 1]), _mm256_cvtepi32_ps(hi), acc[i]);
      }
    }
  }
#elif HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  // The reference Ints on vectors (the same integers): per 32 code bytes, low nibbles then high
  // nibbles (one 16-bit shift, masked), 16 bytes at a time.
  static void Ints(const uint8_t* block, KQuantInts* out) {
    namespace hn = hwy::HWY_NAMESPACE;
    const hn::Full128<uint8_t> du8;
    const hn::Full128<uint16_t> du16;
    KQuantHeader6(block, out);
    const auto low = hn::Set(du8, uint8_t{15});
    auto* code = reinterpret_cast<uint8_t*>(out->code);
    for (int c = 0; c < 4; ++c) {
      for (int half = 0; half < 2; ++half) {
        const auto v = hn::LoadU(du8, block + 16 + 32 * c + 16 * half);
        hn::StoreU(hn::And(v, low), du8, code + 64 * c + 16 * half);
        hn::StoreU(hn::And(hn::BitCast(du8, hn::ShiftRight<4>(hn::BitCast(du16, v))), low), du8, code + 64 * c + 32 + 16 * half);
      }
    }
  }
#else
  static void Ints(const uint8_t* block, KQuantInts* out) { weights_q4_k::Ints(block, out); }
#endif
};

// The 16-row interleaved layout (weights/kquant_repack.h) for KQuantInterleavedRows.
struct Q4_KInterleaved : KQuantNibblesInterleaved<false> {
#if !(HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2)
  static void Ints(const uint8_t* block, KQuantInts* out) { weights_q4_k::Ints(block, out); }
#endif
};

const WeightKernels& Q4_KWeightKernelsHere() {
  static const WeightKernels kKernels = [] {
    WeightKernels k = MakeKQuantKernels<Q4_KBlock>();
    k.interleaved_rows = &KQuantInterleavedRows<Q4_KInterleaved>;
    return k;
  }();
  return kKernels;
}

// KQuantRepackPays (kquant_repack.h) for this target.
bool KQuantRepackPaysHere() { return kKqInterleavedX86; }

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq {
HWY_EXPORT(KQuantRepackPaysHere);
bool KQuantRepackPays() { return HWY_DYNAMIC_DISPATCH(KQuantRepackPaysHere)(); }
}  // namespace kvq
namespace kvq::weights_q4_k {
HWY_EXPORT(Q4_KWeightKernelsHere);
const WeightKernels& Kernels() { return HWY_DYNAMIC_DISPATCH(Q4_KWeightKernelsHere)(); }
}  // namespace kvq::weights_q4_k
#endif
