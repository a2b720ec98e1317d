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
#include "weights/kquant_interleaved-inl.h"
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
#elif HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  // The reference Ints on vectors (the same integers), 16 codes at a time: element 128h + 32k + l
  // is bits 2k, 2k+1 of byte 32 + 32h + l, plus 4 where hmask byte l's bit 4h + k is set, minus 4
  // (in bytes, modulo 256: the int8 code) — each field by one 16-bit shift and a byte mask.
  static void Ints(const uint8_t* block, KQuantInts* out) {
    namespace hn = hwy::HWY_NAMESPACE;
    const hn::Full128<uint8_t> du8;
    const hn::Full128<uint16_t> du16;
    out->d = KQuantHalf(block + 108);
    out->dmin = 0.0f;
    uint8_t u[16];
    KQuantScales6x16(block + 96, u);
    for (int j = 0; j < 16; ++j) out->sc[j] = u[j] - 32, out->m[j] = 0;
    const auto mask2 = hn::Set(du8, uint8_t{3}), four = hn::Set(du8, uint8_t{4});
    auto* code = reinterpret_cast<uint8_t*>(out->code);
    for (int half = 0; half < 2; ++half) {
      const auto hm = hn::BitCast(du16, hn::LoadU(du8, block + 16 * half));
      for (int h = 0; h < 2; ++h) {
        const auto low = hn::BitCast(du16, hn::LoadU(du8, block + 32 + 32 * h + 16 * half));
        for (int k = 0; k < 4; ++k) {
          const auto bits = hn::And(hn::BitCast(du8, hn::ShiftRightSame(low, 2 * k)), mask2);
          const int b = 4 * h + k;  // hmask bit b moved to bit 2
          const auto high = hn::And(hn::BitCast(du8, b <= 2 ? hn::ShiftLeftSame(hm, 2 - b) : hn::ShiftRightSame(hm, b - 2)), four);
          hn::StoreU(hn::Sub(hn::Or(bits, high), four), du8, code + 128 * h + 32 * k + 16 * half);
        }
      }
    }
  }
#else
  static void Ints(const uint8_t* block, KQuantInts* out) { weights_q3_k::Ints(block, out); }
#endif
};

// The 16-row interleaved layout (weights/kquant_repack.h) for KQuantInterleavedRows.
struct Q3_KInterleaved {
  static constexpr WeightType kType = WeightType::kQ3_K;
  static constexpr int64_t kBytes = 110;
  static constexpr bool kSub16 = true;
  static constexpr int kSubTimes[2] = {1, 8};
  static constexpr int64_t kGroupBlock = kKqIlRows * kBytes;  // a group's super-block
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  // Per super-block: the rows' d and their sixteen scales, four sub-blocks to a vector (kquant.h's
  // KQuantScales6x16 on 32-bit lanes, less 32 per byte: byte k of lane j is row j's sc of sub-block
  // 4v+k, int8), and per token −4·Σq over each sub-block's 16 codes (Q3_KBlock's activation offsets
  // summed; 8× for the odd sub-blocks). Per activation block b its 3 code vectors: sub-block 2b's
  // chunks 0-2 are bits 0-2 (u, one AND each), 2b+1's bits 3-5 (8·u, one AND each), the chunks 3
  // are gathered from bits 6-7. Sub-block 2b's lanes end at the exact Σ (u − 4)·q, taken with
  // fl(d·sc) (exact), into acc_0; 2b+1's at 8· that, with fl(d·sc)/8 (exact), into acc_1.
  template <class V, int T>
  static KVQ_KQUANT_X86_ATTR void Step(const uint8_t* g, const QuantizedX& x0, int64_t cols, int64_t t0, float* y,
                                       int64_t y_stride, int64_t r, int half) {
    using I = typename V::I;
    using F = typename V::F;
    const int64_t n_super = cols / kKQuantBlockElems;
    const KqTokens<T> x(x0, cols, t0);  // x.off: −4·Σq per 4 codes
    F acc[2][T];
    for (int t = 0; t < T; ++t) acc[0][t] = acc[1][t] = V::Zero();
    const __m256i times = _mm256_setr_epi32(1, 8, 1, 8, 1, 8, 1, 8);  // kSubTimes by sub-block
    const I low = V::Set32(0x0F0F0F0F), three = V::Set32(0x03030303), bias = V::Set32(0x20202020),
            bits02 = V::Set32(0x07070707), bits35 = V::Set32(0x38383838), bit2 = V::Set32(0x04040404),
            bits34 = V::Set32(0x18181818), bit5 = V::Set32(0x20202020);
    const F eighth = V::Set1(0.125f);
    for (int64_t sb = 0; sb < n_super; ++sb) {
      const uint8_t* blk = g + sb * kGroupBlock;
      alignas(32) int32_t start[T][16];  // [token][sub-block] −4·Σq over its 16 codes, × kSubTimes
      KqSubBlockStarts<T>(x.off, sb, times, start);
      const F d = V::Halves(blk, half);
      // 16-bit shifts: every bit kept comes from its own byte (masks drop what the next byte brings).
      const I a = V::Load(blk + 32, half), b = V::Load(blk + 96, half), c = V::Load(blk + 160, half);
      const I sc[4] = {V::Sub8(V::Or(V::And(a, low), V::template Slli16<4>(V::And(c, three))), bias),
                       V::Sub8(V::Or(V::And(b, low), V::template Slli16<4>(V::And(V::template Srli16<2>(c), three))), bias),
                       V::Sub8(V::Or(V::And(V::template Srli16<4>(a), low),
                                     V::template Slli16<4>(V::And(V::template Srli16<4>(c), three))), bias),
                       V::Sub8(V::Or(V::And(V::template Srli16<4>(b), low),
                                     V::template Slli16<4>(V::And(V::template Srli16<6>(c), three))), bias)};
      for (int blk8 = 0; blk8 < 8; ++blk8) {  // activation block sb·8 + blk8: sub-blocks s0, s0 + 1
        KqPrefetch<T>(blk + blk8 * (kGroupBlock / 8), kGroupBlock / 8);
        const int64_t ab = sb * 8 + blk8;
        const int s0 = 2 * blk8;
        const uint8_t* codes = blk + kQ3_KGroupScaleBytes + 3 * blk8 * 64;
        const I v0 = V::Load(codes, half), v1 = V::Load(codes + 64, half), v2 = V::Load(codes + 128, half);
        const I u0[4] = {V::And(v0, bits02), V::And(v1, bits02), V::And(v2, bits02),
                         V::Or(V::And(V::template Srli16<6>(v0), three), V::And(V::template Srli16<4>(v2), bit2))};
        const I u1[4] = {V::And(v0, bits35), V::And(v1, bits35), V::And(v2, bits35),
                         V::Or(V::And(V::template Srli16<3>(v1), bits34), V::And(V::template Srli16<2>(v2), bit5))};
        // Sub-block s's sc: byte s % 4 of sc[s / 4]'s lanes, sign-extended.
        const I sc0 = V::Srai32_24(V::Sll32(sc[s0 / 4], 24 - 8 * (s0 % 4)));
        const I sc1 = V::Srai32_24(V::Sll32(sc[s0 / 4], 16 - 8 * (s0 % 4)));
        const F dsc0 = V::Mul(d, V::Cvt(sc0));                  // exact
        const F dsc1 = V::Mul(V::Mul(d, V::Cvt(sc1)), eighth);  // exact
        for (int t = 0; t < T; ++t) {
          const int8_t* qs = x.q[t] + ab * 32;
          I dot0 = V::Set32(start[t][s0]), dot1 = V::Set32(start[t][s0 + 1]);
          for (int kk = 0; kk < 4; ++kk) {
            dot0 = V::Dot(dot0, u0[kk], qs + 4 * kk);
            dot1 = V::Dot(dot1, u1[kk], qs + 16 + 4 * kk);
          }
          acc[0][t] = V::Fma(V::Mul(dsc0, V::Set1(x.dx[t][ab])), V::Cvt(dot0), acc[0][t]);
          acc[1][t] = V::Fma(V::Mul(dsc1, V::Set1(x.dx[t][ab])), V::Cvt(dot1), acc[1][t]);
        }
      }
    }
    for (int t = 0; t < T; ++t) {
      V::Store(y + (t0 + t) * y_stride + r + V::kLanes * half, V::Add(acc[0][t], acc[1][t]));
    }
  }
#else
  static void Ints(const uint8_t* block, KQuantInts* out) { weights_q3_k::Ints(block, out); }
#endif
};

const WeightKernels& Q3_KWeightKernelsHere() {
  static const WeightKernels kKernels = [] {
    WeightKernels k = MakeKQuantKernels<Q3_KBlock>();
    k.interleaved_rows = &KQuantInterleavedRows<Q3_KInterleaved>;
    return k;
  }();
  return kKernels;
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::weights_q3_k {
HWY_EXPORT(Q3_KWeightKernelsHere);
const WeightKernels& Kernels() { return HWY_DYNAMIC_DISPATCH(Q3_KWeightKernelsHere)(); }
}  // namespace kvq::weights_q3_k
#endif
