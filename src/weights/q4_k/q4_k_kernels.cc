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
#else
  static void Ints(const uint8_t* block, KQuantInts* out) { weights_q4_k::Ints(block, out); }
#endif
};

// The 16-row interleaved layout (weights/kquant_repack.h) for KQuantInterleavedRows.
struct Q4_KInterleaved {
  static constexpr int64_t kBytes = 144;
  static constexpr bool kSub16 = false;
  static constexpr int64_t kGroupBlock = kKqIlRows * kBytes;  // a group's super-block
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  // Per super-block: the rows' d and dmin, their 6-bit scales and mins unpacked four sub-blocks
  // to a vector (kquant.h's KQuantScalesMins6 on 32-bit lanes: byte k of lane j is row j's sc or m
  // of sub-block 4v+k), per token fl(d_x·Σq) of its 8 blocks; per pair of sub-blocks (64
  // elements) the 8 code vectors' low and high nibbles, then per token 16 byte dots.
  template <class V, int T>
  static KVQ_KQUANT_X86_ATTR void Step(const uint8_t* g, const QuantizedX& x0, int64_t cols, int64_t t0, float* y,
                                       int64_t y_stride, int64_t r, int half) {
    using I = typename V::I;
    using F = typename V::F;
    const int64_t n_super = cols / kKQuantBlockElems;
    const int64_t n_blocks = cols / 32;
    const int8_t* q[T];     // token t's codes [cols]
    const float* dx[T];     // [n_blocks]
    const int32_t* sum[T];  // [n_blocks]
    F acc[T], macc[T];
    for (int t = 0; t < T; ++t) {
      q[t] = x0.q + (t0 + t) * cols;
      dx[t] = x0.d + (t0 + t) * n_blocks;
      sum[t] = x0.sum + (t0 + t) * n_blocks;
      acc[t] = V::Zero();
      macc[t] = V::Zero();
    }
    const I low = V::Set32(0x0F0F0F0F), six = V::Set32(0x3F3F3F3F), top = V::Set32(0x30303030),
            byte = V::Set32(0xFF);
    const F sixteenth = V::Set1(0.0625f);
    for (int64_t sb = 0; sb < n_super; ++sb) {
      const uint8_t* blk = g + sb * kGroupBlock;
      alignas(32) float dxs[T][8];  // [token][block of the super-block] fl(d_x·Σq)
      for (int t = 0; t < T; ++t) {
        const __m256i s8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sum[t] + sb * 8));
        _mm256_store_ps(dxs[t], _mm256_mul_ps(_mm256_loadu_ps(dx[t] + sb * 8), _mm256_cvtepi32_ps(s8)));
      }
      const F d = V::Halves(blk, half), dmin = V::Halves(blk + 32, half);
      const I a = V::Load(blk + 64, half), b = V::Load(blk + 128, half), c = V::Load(blk + 192, half);
      const I sc[2] = {V::And(a, six), V::Or(V::And(c, low), V::And(V::Srl32(a, 2), top))};
      const I mn[2] = {V::And(b, six), V::Or(V::And(V::Srl32(c, 4), low), V::And(V::Srl32(b, 2), top))};
      for (int pair = 0; pair < 4; ++pair) {  // sub-blocks 2·pair (low nibbles) and 2·pair+1 (high)
        const int shift = 16 * (pair % 2);
        const I sc_pair = V::Srl32(sc[pair / 2], shift), mn_pair = V::Srl32(mn[pair / 2], shift);
        const F dsc0 = V::Mul(d, V::Cvt(V::And(sc_pair, byte)));                                    // exact
        const F dsc1 = V::Mul(V::Mul(d, V::Cvt(V::And(V::Srl32(sc_pair, 8), byte))), sixteenth);  // exact
        const F dm0 = V::Mul(dmin, V::Cvt(V::And(mn_pair, byte)));                                  // exact
        const F dm1 = V::Mul(dmin, V::Cvt(V::And(V::Srl32(mn_pair, 8), byte)));                     // exact
        const uint8_t* codes = blk + kQ4_KGroupScaleBytes + pair * 8 * 64;
        KqPrefetch<T>(blk + pair * (kGroupBlock / 4), kGroupBlock / 4);
        I lo[8], hi[8];  // [k]: elements 4k..4k+3 of sub-block 2·pair, 2·pair+1, per row
        for (int k = 0; k < 8; ++k) {
          const I v = V::Load(codes + 64 * k, half);
          lo[k] = V::And(v, low);
          hi[k] = V::HighNibbles(v);
        }
        const int64_t ab = sb * 8 + 2 * pair;  // the low nibbles' activation block
        for (int t = 0; t < T; ++t) {
          const int8_t* qb = q[t] + ab * 32;
          I dot0 = V::Set32(0), dot1 = V::Set32(0);
          for (int k = 0; k < 8; ++k) {
            dot0 = V::Dot(dot0, lo[k], qb + 4 * k);
            dot1 = V::Dot(dot1, hi[k], qb + 32 + 4 * k);
          }
          acc[t] = V::Fma(V::Mul(dsc0, V::Set1(dx[t][ab])), V::Cvt(dot0), acc[t]);
          macc[t] = V::Fma(dm0, V::Set1(dxs[t][2 * pair]), macc[t]);
          acc[t] = V::Fma(V::Mul(dsc1, V::Set1(dx[t][ab + 1])), V::Cvt(V::SixteenTimes(dot1)), acc[t]);
          macc[t] = V::Fma(dm1, V::Set1(dxs[t][2 * pair + 1]), macc[t]);
        }
      }
    }
    for (int t = 0; t < T; ++t) V::Store(y + (t0 + t) * y_stride + r + V::kLanes * half, V::Sub(acc[t], macc[t]));
  }
#else
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

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::weights_q4_k {
HWY_EXPORT(Q4_KWeightKernelsHere);
const WeightKernels& Kernels() { return HWY_DYNAMIC_DISPATCH(Q4_KWeightKernelsHere)(); }
}  // namespace kvq::weights_q4_k
#endif
