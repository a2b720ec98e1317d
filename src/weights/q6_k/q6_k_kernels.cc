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
#include "weights/kquant_interleaved-inl.h"
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
#elif HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  // The reference Ints on vectors (the same integers), 16 codes at a time: the low 4 bits of
  // element 128h + 32k + l from byte 64h + 32·(k%2) + l (shifted 4 for k ≥ 2), the high 2 from
  // byte 128 + 32h + l (shifted 2k), each by one 16-bit shift and a byte mask; minus 32 in bytes.
  static void Ints(const uint8_t* block, KQuantInts* out) {
    namespace hn = hwy::HWY_NAMESPACE;
    const hn::Full128<uint8_t> du8;
    const hn::Full128<uint16_t> du16;
    out->d = KQuantHalf(block + 208);
    out->dmin = 0.0f;
    for (int j = 0; j < 16; ++j) out->sc[j] = static_cast<int8_t>(block[192 + j]), out->m[j] = 0;
    const auto mask4 = hn::Set(du8, uint8_t{15}), mask2 = hn::Set(du8, uint8_t{0x30}), bias = hn::Set(du8, uint8_t{32});
    auto* code = reinterpret_cast<uint8_t*>(out->code);
    for (int h = 0; h < 2; ++h) {
      for (int half = 0; half < 2; ++half) {
        const auto lo0 = hn::LoadU(du8, block + 64 * h + 16 * half);       // quarters 0 and 2
        const auto lo1 = hn::LoadU(du8, block + 64 * h + 32 + 16 * half);  // quarters 1 and 3
        const auto hi = hn::BitCast(du16, hn::LoadU(du8, block + 128 + 32 * h + 16 * half));
        // Quarter k's high bits 2k, 2k+1 moved to bits 4, 5 (shift 4 − 2k), then masked.
        const auto high0 = hn::And(hn::BitCast(du8, hn::ShiftLeft<4>(hi)), mask2);
        const auto high1 = hn::And(hn::BitCast(du8, hn::ShiftLeft<2>(hi)), mask2);
        const auto high2 = hn::And(hn::BitCast(du8, hi), mask2);
        const auto high3 = hn::And(hn::BitCast(du8, hn::ShiftRight<2>(hi)), mask2);
        const auto low2 = hn::And(hn::BitCast(du8, hn::ShiftRight<4>(hn::BitCast(du16, lo0))), mask4);
        const auto low3 = hn::And(hn::BitCast(du8, hn::ShiftRight<4>(hn::BitCast(du16, lo1))), mask4);
        uint8_t* at = code + 128 * h + 16 * half;  // quarter k at + 32k
        hn::StoreU(hn::Sub(hn::Or(hn::And(lo0, mask4), high0), bias), du8, at);
        hn::StoreU(hn::Sub(hn::Or(hn::And(lo1, mask4), high1), bias), du8, at + 32);
        hn::StoreU(hn::Sub(hn::Or(low2, high2), bias), du8, at + 64);
        hn::StoreU(hn::Sub(hn::Or(low3, high3), bias), du8, at + 96);
      }
    }
  }
#else
  static void Ints(const uint8_t* block, KQuantInts* out) { weights_q6_k::Ints(block, out); }
#endif
};

// The 16-row interleaved layout (weights/kquant_repack.h) for KQuantInterleavedRows.
struct Q6_KInterleaved {
  static constexpr WeightType kType = WeightType::kQ6_K;
  static constexpr int64_t kBytes = 210;
  static constexpr bool kSub16 = true;
  static constexpr int kSubTimes[2] = {4, 4};
  static constexpr int64_t kGroupBlock = kKqIlRows * kBytes;  // a group's super-block
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  // Per sub-block of 16 (4 chunks of 4 elements, kquant_repack.h): its 3 code vectors give the
  // first 3 chunks' unsigned codes u = code + 32 by a mask and the last chunk's from their bit
  // pairs (V::Q6Codes, V::Q6Last: 4·u on VNNI, u elsewhere, the dot then scaled by 4 exactly). A
  // sub-block's lanes start at −32·Σq over its 16 codes (times the same factor; the sum of 4 of
  // Q6_KBlock's activation offsets, summed per super-block and token up front), so each ends at
  // the exact 4·Σ (u − 32)·q, taken with the scale fl(d·sc)/4 (exact); sub-blocks 2b and 2b+1 of
  // activation block b go to acc_0 and acc_1.
  template <class V, int T>
  static KVQ_KQUANT_X86_ATTR void Step(const uint8_t* g, const QuantizedX& x0, int64_t cols, int64_t t0, float* y,
                                       int64_t y_stride, int64_t r, int half) {
    using I = typename V::I;
    using F = typename V::F;
    const int64_t n_super = cols / kKQuantBlockElems;
    const KqTokens<T> x(x0, cols, t0);  // x.off: −32·Σq per 4 codes
    F acc[2][T];
    for (int t = 0; t < T; ++t) acc[0][t] = acc[1][t] = V::Zero();
    const F quarter = V::Set1(0.25f);
    for (int64_t sb = 0; sb < n_super; ++sb) {
      const uint8_t* blk = g + sb * kGroupBlock;
      alignas(32) int32_t start[T][16];  // [token][sub-block] −32·Σq over its 16 codes, × V::kQ6StartScale
      KqSubBlockStarts<T>(x.off, sb, _mm256_set1_epi32(V::kQ6StartScale), start);
      const F d_quarter = V::Mul(V::Halves(blk, half), quarter);  // exact
      for (int blk8 = 0; blk8 < 8; ++blk8) {  // activation block sb·8 + blk8
        KqPrefetch<T>(blk + blk8 * (kGroupBlock / 8), kGroupBlock / 8);
        const int64_t ab = sb * 8 + blk8;
        for (int e = 0; e < 2; ++e) {  // sub-block s = 2·blk8 + e
          const int s = 2 * blk8 + e;
          const uint8_t* codes = blk + kQ6_KGroupScaleBytes + 3 * s * 64;
          const I v0 = V::Load(codes, half), v1 = V::Load(codes + 64, half), v2 = V::Load(codes + 128, half);
          const I u[4] = {V::Q6Codes(v0), V::Q6Codes(v1), V::Q6Codes(v2), V::Q6Last(v0, v1, v2)};
          const F dsc = V::Mul(d_quarter, V::Cvt(V::ScalesI8(blk + kQ6_KGroupScalesAt + 16 * s, half)));  // exact
          for (int t = 0; t < T; ++t) {
            const int8_t* qs = x.q[t] + ab * 32 + 16 * e;
            I dot = V::Set32(start[t][s]);
            for (int kk = 0; kk < 4; ++kk) dot = V::Dot(dot, u[kk], qs + 4 * kk);
            acc[e][t] = V::Fma(V::Mul(dsc, V::Set1(x.dx[t][ab])), V::Cvt(V::Q6FourTimes(dot)), acc[e][t]);
          }
        }
      }
    }
    for (int t = 0; t < T; ++t) {
      V::Store(y + (t0 + t) * y_stride + r + V::kLanes * half, V::Add(acc[0][t], acc[1][t]));
    }
  }
#else
  static void Ints(const uint8_t* block, KQuantInts* out) { weights_q6_k::Ints(block, out); }
#endif
};

const WeightKernels& Q6_KWeightKernelsHere() {
  static const WeightKernels kKernels = [] {
    WeightKernels k = MakeKQuantKernels<Q6_KBlock>();
    k.interleaved_rows = &KQuantInterleavedRows<Q6_KInterleaved>;
    return k;
  }();
  return kKernels;
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::weights_q6_k {
HWY_EXPORT(Q6_KWeightKernelsHere);
const WeightKernels& Kernels() { return HWY_DYNAMIC_DISPATCH(Q6_KWeightKernelsHere)(); }
}  // namespace kvq::weights_q6_k
#endif
