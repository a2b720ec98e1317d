// Per-target driver of the repacked K-quants (MatrixLayout::kInterleaved16, weights/kquant_repack.h):
// 16 rows × T tokens per step, for MatVec (T = 1) and MatMul (T up to kKqMaxTokens, each unpacked
// weight vector used for every token of the step, so prefill reads a group's weights once per T
// tokens instead of once per token). Include after kquant_rows-inl.h (its KVQ_KQUANT_X86_ATTR); a
// type supplies a policy B:
//   static constexpr WeightType kType   the type (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)
//   static constexpr int64_t kBytes     bytes per plain super-block (84, 110, 144, 176, 210)
//   static constexpr bool kSub16        scales per 16 elements (Q2_K, Q3_K, Q6_K) rather than per 32
//                                       with mins
//   static constexpr int kHighTimes     (not kSub16) the factor an odd block's dot carries (below)
//   static constexpr int kSubTimes[2]   (kSub16) the factors sub-blocks 2b and 2b+1's dots carry
//   x86 AVX2 or better:
//     template <class V, int T> static void Step(g, x0, cols, t0, y, y_stride, r, half)
//         the group at g (rows r..r+15, or the half's 8 of them where V has 8 lanes) times
//         tokens t0..t0+T−1, written to y[t][r + ...] — V is KqRowsVec below
//   other targets:
//     static void Ints(const uint8_t* block, KQuantInts* out)   the integer form (kquant.h)
// and gets KQuantInterleavedRows<B> for WeightKernels::interleaved_rows.
//
// Per row j (int32 lane j), token and activation block b (32 elements): sub-block dots I exact in
// int32 (512-bit vpdpbusd on AVX3_DL; 256-bit maddubs + madd on AVX2 / AVX3, the group's two
// 8-row halves in turn; plain integers elsewhere), then in f32
//   Q4_K, Q5_K:  acc  = fma(fl(d·sc·d_x), I, acc),  macc = fma(dmin·m, fl(d_x·Σq), macc),  y = acc − macc
//          (Q4_K's odd block — the high nibbles — as fma(fl((d·sc/16)·d_x), 16·I, acc), kHighTimes
//          16: VNNI reads the nibbles unshifted; the same value barring underflow, and the same
//          operations everywhere. Q5_K's high codes carry their 5th bit, 16·u would not fit a byte:
//          kHighTimes 1, the plain form)
//   Q2_K (scales and mins per 16): per block, M = sc_2b·I_2b + sc_2b+1·I_2b+1 and
//          N = m_2b·S_2b + m_2b+1·S_2b+1 (S the sums of the sub-blocks' 16 activation codes), exact in
//          f32 (< 2^18), then acc = fma(fl(d·d_x), M, acc), macc = fma(fl(dmin·d_x), N, macc),
//          y = acc − macc
//   Q3_K, Q6_K:  acc_e = fma(fl((d·sc_e/k_e)·d_x), k_e·I_e, acc_e) for the block's sub-blocks e = 0, 1
//          of 16, y = acc_0 + acc_1, k_e = kSubTimes[e] (Q6_K 4, 4: VNNI reads the codes as 4·u,
//          unshifted; Q3_K 1, 8: sub-block 2b+1's codes are read as 8·u in bits 3-5; the value of
//          fma(fl(d·sc_e·d_x), I_e, acc_e) barring underflow, and the same operations everywhere)
// d·sc and dmin·m are exact (11 × ≤ 8 significant bits), I and Σq exact in f32 (< 2^24). Each term
// is rounded once for its scale, once per activation block by its accumulator's FMA (n_blocks)
// and once by the final add: at most n_blocks + 2 roundings (matvec.h). Every target does these
// operations (the scalar path with std::fma), so the grouped rows give the same bits on every
// target, whatever T and the threads.
#if defined(KVQ_WEIGHTS_KQUANT_INTERLEAVED_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVQ_WEIGHTS_KQUANT_INTERLEAVED_INL_H_
#undef KVQ_WEIGHTS_KQUANT_INTERLEAVED_INL_H_
#else
#define KVQ_WEIGHTS_KQUANT_INTERLEAVED_INL_H_
#endif

#include <hwy/highway.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "weights/kquant.h"
#include "weights/kquant_repack.h"
#include "weights/weight_type.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

constexpr int64_t kKqIlRows = 16;  // rows per group (weights/repack.h kInterleaveRows)

/// Whether this target runs the groups with x86 byte dots (the Step kernels below) rather than the
/// portable kernel that gathers each row's block: where KQuantRepackPays (kquant_repack.h) says
/// repacking was measured to pay.
constexpr bool kKqInterleavedX86 = HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2;

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2

#if KVQ_KQUANT_VNNI
// Tokens per step: 8 unpacked weight vectors and two f32 accumulators per token within AVX-512's
// 32 vector registers; AVX2's 16 at 2.
constexpr int kKqMaxTokens = 4;

/// The group's 16 rows in one 512-bit vector (lane j = row j); half is always 0.
struct KqRowsVec {
  using I = __m512i;
  using F = __m512;
  static constexpr int kHalves = 1;
  static constexpr int kLanes = 16;
  static KVQ_KQUANT_X86_ATTR inline I Load(const uint8_t* vec64, int) { return _mm512_loadu_si512(vec64); }
  /// 16 f16 at p (row j at 2j) -> f32 lanes.
  static KVQ_KQUANT_X86_ATTR inline F Halves(const uint8_t* p, int) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static KVQ_KQUANT_X86_ATTR inline I Set32(int32_t v) { return _mm512_set1_epi32(v); }
  static KVQ_KQUANT_X86_ATTR inline I And(I a, I b) { return _mm512_and_si512(a, b); }
  static KVQ_KQUANT_X86_ATTR inline I Or(I a, I b) { return _mm512_or_si512(a, b); }
  static KVQ_KQUANT_X86_ATTR inline I Sub8(I a, I b) { return _mm512_sub_epi8(a, b); }
  template <int N> static KVQ_KQUANT_X86_ATTR inline I Srli16(I v) { return _mm512_srli_epi16(v, N); }
  template <int N> static KVQ_KQUANT_X86_ATTR inline I Slli16(I v) { return _mm512_slli_epi16(v, N); }
  static KVQ_KQUANT_X86_ATTR inline I Srl32(I v, int n) { return _mm512_srl_epi32(v, _mm_cvtsi32_si128(n)); }
  static KVQ_KQUANT_X86_ATTR inline I Sll32(I v, int n) { return _mm512_sll_epi32(v, _mm_cvtsi32_si128(n)); }
  static KVQ_KQUANT_X86_ATTR inline I Srai32_24(I v) { return _mm512_srai_epi32(v, 24); }
  /// acc + Σ over each lane's 4 bytes of u (unsigned, ≤ 63) times the 4 codes at q.
  static KVQ_KQUANT_X86_ATTR inline I Dot(I acc, I u, const int8_t* q) {
    // vpdpbusd with the 32-bit memory operand broadcast ({1to16}), as interleaved_rows-inl.h.
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*reinterpret_cast<const int32_t*>(q)));
    return acc;
  }
  /// The high nibbles as they stand (16·n: vpdpbusd takes any unsigned byte), one AND; the
  /// dot is then 16× the nibbles' dot, which Q4_K's scale of 1/16 undoes exactly.
  static KVQ_KQUANT_X86_ATTR inline I HighNibbles(I v) { return _mm512_and_si512(v, _mm512_set1_epi8(static_cast<char>(0xF0))); }
  static KVQ_KQUANT_X86_ATTR inline I SixteenTimes(I dot) { return dot; }
  /// Q6_K (kquant_repack.h): 4·u of a code vector's elements, its bit pairs masked off (4·u ≤ 252:
  /// vpdpbusd takes any unsigned byte).
  static KVQ_KQUANT_X86_ATTR inline I Q6Codes(I v) { return _mm512_and_si512(v, _mm512_set1_epi8(static_cast<char>(0xFC))); }
  /// 4·u of the sub-block's last chunk from the bit pairs of its 3 vectors: bits 2-3 from v0, 4-5
  /// from v1, 6-7 from v2 (16-bit shifts; two bit selects, ternary logic 0xCA = A ? B : C).
  static KVQ_KQUANT_X86_ATTR inline I Q6Last(I v0, I v1, I v2) {
    const I high = _mm512_ternarylogic_epi32(_mm512_set1_epi8(static_cast<char>(0xC0)), _mm512_slli_epi16(v2, 6),
                                             _mm512_slli_epi16(v1, 4), 0xCA);
    const I low = _mm512_slli_epi16(_mm512_and_si512(v0, _mm512_set1_epi8(3)), 2);
    return _mm512_ternarylogic_epi32(_mm512_set1_epi8(static_cast<char>(0xF0)), high, low, 0xCA);
  }
  /// The dot of Q6Codes / Q6Last bytes, as 4·Σ u·q: already.
  static KVQ_KQUANT_X86_ATTR inline I Q6FourTimes(I dot) { return dot; }
  static constexpr int32_t kQ6StartScale = 4;  // the lanes start at 4·(−32·Σq)
  /// Q2_K (kquant_repack.h): sub-block k's codes of a code vector as 4^k·code, unshifted (≤ 192:
  /// vpdpbusd takes any unsigned byte), and their dot as 4^k·Σ code·q: already.
  static KVQ_KQUANT_X86_ATTR inline I Q2Codes(I v, int k) {
    return _mm512_and_si512(v, _mm512_set1_epi8(static_cast<char>(3 << (2 * k))));
  }
  static KVQ_KQUANT_X86_ATTR inline I Q2Times(I dot, int) { return dot; }
  /// Sub-block scales: 16 int8 at p (row j at j) -> int32 lanes.
  static KVQ_KQUANT_X86_ATTR inline I ScalesI8(const uint8_t* p, int) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static KVQ_KQUANT_X86_ATTR inline F Zero() { return _mm512_setzero_ps(); }
  static KVQ_KQUANT_X86_ATTR inline F Cvt(I v) { return _mm512_cvtepi32_ps(v); }
  static KVQ_KQUANT_X86_ATTR inline F Set1(float v) { return _mm512_set1_ps(v); }
  static KVQ_KQUANT_X86_ATTR inline F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static KVQ_KQUANT_X86_ATTR inline F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static KVQ_KQUANT_X86_ATTR inline F Sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static KVQ_KQUANT_X86_ATTR inline F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static KVQ_KQUANT_X86_ATTR inline void Store(float* y, F v) { _mm512_storeu_ps(y, v); }
};
#else
constexpr int kKqMaxTokens = 2;

/// Half the group's rows (8 × 32 bits) in one 256-bit vector: half h is rows 8h..8h+7, the
/// upper or lower 32 bytes of each 64-byte vector.
struct KqRowsVec {
  using I = __m256i;
  using F = __m256;
  static constexpr int kHalves = 2;
  static constexpr int kLanes = 8;
  static inline I Load(const uint8_t* vec64, int half) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vec64 + 32 * half));
  }
  static inline F Halves(const uint8_t* p, int half) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * half)));
  }
  static inline I Set32(int32_t v) { return _mm256_set1_epi32(v); }
  static inline I And(I a, I b) { return _mm256_and_si256(a, b); }
  static inline I Or(I a, I b) { return _mm256_or_si256(a, b); }
  static inline I Sub8(I a, I b) { return _mm256_sub_epi8(a, b); }
  template <int N> static inline I Srli16(I v) { return _mm256_srli_epi16(v, N); }
  template <int N> static inline I Slli16(I v) { return _mm256_slli_epi16(v, N); }
  static inline I Srl32(I v, int n) { return _mm256_srl_epi32(v, _mm_cvtsi32_si128(n)); }
  static inline I Sll32(I v, int n) { return _mm256_sll_epi32(v, _mm_cvtsi32_si128(n)); }
  static inline I Srai32_24(I v) { return _mm256_srai_epi32(v, 24); }
  /// maddubs: u ≤ 63 (Q3_K's 8·u ≤ 56), |q| ≤ 127, so a pair is at most 16002 (no saturation).
  static inline I Dot(I acc, I u, const int8_t* q) {
    int32_t four;
    std::memcpy(&four, q, 4);
    return _mm256_add_epi32(
        acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_set1_epi32(four)), _mm256_set1_epi16(1)));
  }
  /// The high nibbles shifted down (16·n pairs would saturate maddubs), and the dot scaled by 16
  /// after: the same 16·Σ n·q as the VNNI path, exact.
  static inline I HighNibbles(I v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }
  static inline I SixteenTimes(I dot) { return _mm256_slli_epi32(dot, 4); }
  /// Q6_K: u itself (4·u pairs would saturate maddubs), and the dot scaled by 4 after: the same
  /// 4·Σ u·q as the VNNI path, exact.
  static inline I Q6Codes(I v) { return _mm256_and_si256(_mm256_srli_epi16(v, 2), _mm256_set1_epi8(0x3F)); }
  static inline I Q6Last(I v0, I v1, I v2) {
    const I three = _mm256_set1_epi8(3);
    return _mm256_or_si256(_mm256_or_si256(_mm256_and_si256(v0, three),
                                           _mm256_slli_epi16(_mm256_and_si256(v1, three), 2)),
                           _mm256_slli_epi16(_mm256_and_si256(v2, three), 4));
  }
  static inline I Q6FourTimes(I dot) { return _mm256_slli_epi32(dot, 2); }
  static constexpr int32_t kQ6StartScale = 1;
  /// Q2_K: the codes themselves (4^k·code pairs would saturate maddubs; a 32-bit shift, the bits
  /// kept are the byte's own), and the dot scaled by 4^k after: the VNNI path's 4^k·Σ code·q, exact.
  static inline I Q2Codes(I v, int k) { return _mm256_and_si256(Srl32(v, 2 * k), _mm256_set1_epi8(3)); }
  static inline I Q2Times(I dot, int k) { return Sll32(dot, 2 * k); }
  static inline I ScalesI8(const uint8_t* p, int half) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * half)));
  }
  static inline F Zero() { return _mm256_setzero_ps(); }
  static inline F Cvt(I v) { return _mm256_cvtepi32_ps(v); }
  static inline F Set1(float v) { return _mm256_set1_ps(v); }
  static inline F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static inline F Add(F a, F b) { return _mm256_add_ps(a, b); }
  static inline F Sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static inline F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static inline void Store(float* y, F v) { _mm256_storeu_ps(y, v); }
};
#endif  // KVQ_KQUANT_VNNI

/// MatVec (T = 1): software prefetch kKQuantPrefetchBytes ahead of bytes [from, from + bytes) of
/// the group's stream, as the row kernels do, spread over the super-block's steps (a burst of a
/// whole super-block's lines at once measured slower); MatMul's later steps find the group in
/// cache. An integer address: it may lie past the matrix (a prefetch never faults). The kernels'
/// target attribute too: without it GCC cannot inline this into Step (the targets differ), finds
/// a function of prefetches alone free of side effects, and deletes the call — the AVX3_DL kernels
/// then ran with no software prefetch at all.
template <int T>
KVQ_KQUANT_X86_ATTR inline void KqPrefetch(const uint8_t* from, int64_t bytes) {
  if constexpr (T == 1) {
    const uintptr_t ahead = reinterpret_cast<uintptr_t>(from) + kKQuantPrefetchBytes;
    for (int64_t at = 0; at < bytes; at += 64) _mm_prefetch(reinterpret_cast<const char*>(ahead + at), _MM_HINT_T1);
  }
}

/// A Step's T tokens t0..t0+T−1 in x0 (their codes, scales, block sums and offsets), token t at [t].
template <int T>
struct KqTokens {
  const int8_t* q[T];     // [cols] codes
  const float* dx[T];     // [cols / 32] block scales
  const int32_t* sum[T];  // [cols / 32] block sums Σq
  const int32_t* off[T];  // [cols / 4] the type's offsets (−k·Σq per 4 codes); null where it has none
  KqTokens(const QuantizedX& x0, int64_t cols, int64_t t0) {
    for (int t = 0; t < T; ++t) {
      q[t] = x0.q + (t0 + t) * cols;
      dx[t] = x0.d + (t0 + t) * (cols / 32);
      sum[t] = x0.sum + (t0 + t) * (cols / 32);
      off[t] = x0.offset != nullptr ? x0.offset + (t0 + t) * (cols / 4) : nullptr;
    }
  }
};

/// Q3_K, Q6_K (scales per 16, a bias on the codes): per token t, start[t][s] = the sum of sub-block
/// s's 4 activation offsets in super-block sb (the type's −k·Σq per 4 codes: the lanes' start, so
/// that they end at Σ code·q) times times[s % 8] (the factor the sub-block's dot carries).
/// off[t]: token t's offsets [cols / 4]; start: [T][16], 32-byte aligned.
template <int T>
KVQ_KQUANT_X86_ATTR inline void KqSubBlockStarts(const int32_t* const* off, int64_t sb, __m256i times,
                                                 int32_t (*start)[16]) {
  // hadd of hadd leaves the 4-sums of 8 consecutive groups in the order 0, 2, 4, 6, 1, 3, 5, 7.
  const __m256i quad_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < 2; ++h) {
      const __m256i* o = reinterpret_cast<const __m256i*>(off[t] + sb * 64 + 32 * h);
      const __m256i s01 = _mm256_hadd_epi32(_mm256_loadu_si256(o), _mm256_loadu_si256(o + 1));
      const __m256i s23 = _mm256_hadd_epi32(_mm256_loadu_si256(o + 2), _mm256_loadu_si256(o + 3));
      const __m256i sums = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(s01, s23), quad_order);
      _mm256_store_si256(reinterpret_cast<__m256i*>(start[t] + 8 * h), _mm256_mullo_epi32(sums, times));
    }
  }
}

template <class B>
void KQuantInterleavedRows(const uint8_t* w, const QuantizedX& x0, int64_t n_tokens, float* y, int64_t y_stride,
                           int64_t cols, int64_t r0, int64_t r1) {
  using V = KqRowsVec;
  const int64_t row_bytes = cols / kKQuantBlockElems * B::kBytes;
  for (int64_t r = r0; r < r1; r += kKqIlRows) {
    const uint8_t* g = w + r * row_bytes;
    for (int half = 0; half < V::kHalves; ++half) {
      int64_t t = 0;
      for (; t + kKqMaxTokens <= n_tokens; t += kKqMaxTokens) {
        B::template Step<V, kKqMaxTokens>(g, x0, cols, t, y, y_stride, r, half);
      }
      switch (n_tokens - t) {
        case 1: B::template Step<V, 1>(g, x0, cols, t, y, y_stride, r, half); break;
#if KVQ_KQUANT_VNNI
        case 2: B::template Step<V, 2>(g, x0, cols, t, y, y_stride, r, half); break;
        case 3: B::template Step<V, 3>(g, x0, cols, t, y, y_stride, r, half); break;
#endif
        default: break;
      }
    }
  }
}

#else  // not x86 AVX2 or better: plain integer loops over each row's gathered block, std::fma

template <class B>
void KQuantInterleavedRows(const uint8_t* w, const QuantizedX& x0, int64_t n_tokens, float* y, int64_t y_stride,
                           int64_t cols, int64_t r0, int64_t r1) {
  constexpr WeightType kType = B::kType;
  const int64_t n_super = cols / kKQuantBlockElems;
  const int64_t n_blocks = cols / 32;
  const int64_t row_bytes = n_super * B::kBytes;
  uint8_t plain[B::kBytes];
  KQuantInts k;
  for (int64_t r = r0; r < r1; r += kKqIlRows) {
    const uint8_t* g = w + r * row_bytes;
    for (int64_t t = 0; t < n_tokens; ++t) {
      const int8_t* q = x0.q + t * cols;           // [cols]
      const float* dx = x0.d + t * n_blocks;       // [n_blocks]
      const int32_t* sum = x0.sum + t * n_blocks;  // [n_blocks]
      for (int64_t j = 0; j < kKqIlRows; ++j) {
        float acc = 0.0f, macc = 0.0f;  // kSub16: acc and macc are acc_0 and acc_1
        for (int64_t sb = 0; sb < n_super; ++sb) {
          GatherKQuantBlock(kType, g + sb * kKqIlRows * B::kBytes, j, plain);
          B::Ints(plain, &k);
          for (int64_t b = 0; b < 8; ++b) {
            const int64_t ab = sb * 8 + b;
            int32_t dot[2] = {0, 0};  // the two 16-element halves
            for (int64_t l = 0; l < 32; ++l) dot[l / 16] += k.code[32 * b + l] * q[32 * ab + l];
            if constexpr (B::kType == WeightType::kQ2_K) {
              // As the x86 kernel: both sub-blocks' scaled dots and mins summed exactly, one FMA each.
              int32_t s[2] = {0, 0};  // the two halves' Σq
              for (int64_t l = 0; l < 32; ++l) s[l / 16] += q[32 * ab + l];
              const float main = static_cast<float>(k.sc[2 * b] * dot[0] + k.sc[2 * b + 1] * dot[1]);
              const float mins = static_cast<float>(k.m[2 * b] * s[0] + k.m[2 * b + 1] * s[1]);
              acc = std::fma(k.d * dx[ab], main, acc);
              macc = std::fma(k.dmin * dx[ab], mins, macc);
            } else if constexpr (B::kSub16) {
              // As the x86 kernels: sub-block e's dot kSubTimes[e]× and its scale / kSubTimes[e]
              // (both exact).
              const float ds0 = (k.d * static_cast<float>(k.sc[2 * b])) * (1.0f / B::kSubTimes[0]);
              const float ds1 = (k.d * static_cast<float>(k.sc[2 * b + 1])) * (1.0f / B::kSubTimes[1]);
              acc = std::fma(ds0 * dx[ab], static_cast<float>(B::kSubTimes[0] * dot[0]), acc);
              macc = std::fma(ds1 * dx[ab], static_cast<float>(B::kSubTimes[1] * dot[1]), macc);
            } else {
              // As the x86 kernels: an odd block's dot kHighTimes× and its scale / kHighTimes (both exact).
              const int times = b % 2 == 1 ? B::kHighTimes : 1;
              const float dsc = (k.d * static_cast<float>(k.sc[2 * b])) * (1.0f / static_cast<float>(times));
              acc = std::fma(dsc * dx[ab], static_cast<float>(times * (dot[0] + dot[1])), acc);
              macc = std::fma(k.dmin * static_cast<float>(k.m[2 * b]), dx[ab] * static_cast<float>(sum[ab]), macc);
            }
          }
        }
        y[t * y_stride + r + j] = B::kSub16 && B::kType != WeightType::kQ2_K ? acc + macc : acc - macc;
      }
    }
  }
}

#endif  // HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2

/// Q4_K and Q5_K (kFifthBit) in the 16-row layout (weights/kquant_repack.h), one policy for
/// KQuantInterleavedRows; the type's kernel file adds Ints for the targets without the x86 Step.
template <bool kFifthBit>
struct KQuantNibblesInterleaved {
  static constexpr WeightType kType = kFifthBit ? WeightType::kQ5_K : WeightType::kQ4_K;
  static constexpr int64_t kBytes = kFifthBit ? 176 : 144;
  static constexpr bool kSub16 = false;
  static constexpr int kHighTimes = kFifthBit ? 1 : 16;
  static constexpr int64_t kGroupBlock = kKqIlRows * kBytes;  // a group's super-block
  static constexpr int64_t kCodesAt = kFifthBit ? kQ5_KGroupScaleBytes : kQ4_KGroupScaleBytes;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  // Per super-block: the rows' d and dmin, their 6-bit scales and mins unpacked four sub-blocks
  // to a vector (kquant.h's KQuantScalesMins6 on 32-bit lanes: byte k of lane j is row j's sc or m
  // of sub-block 4v+k), per token fl(d_x·Σq) of its 8 blocks; per pair of sub-blocks (64
  // elements) the 8 code vectors' low and high nibbles (Q5_K: with bits 2·pair, 2·pair+1 of the
  // qh vector as bit 4), then per token 16 byte dots.
  template <class V, int T>
  static KVQ_KQUANT_X86_ATTR void Step(const uint8_t* g, const QuantizedX& x0, int64_t cols, int64_t t0, float* y,
                                       int64_t y_stride, int64_t r, int half) {
    using I = typename V::I;
    using F = typename V::F;
    const int64_t n_super = cols / kKQuantBlockElems;
    const KqTokens<T> x(x0, cols, t0);
    F acc[T], macc[T];
    for (int t = 0; t < T; ++t) acc[t] = macc[t] = V::Zero();
    const I low = V::Set32(0x0F0F0F0F), six = V::Set32(0x3F3F3F3F), top = V::Set32(0x30303030),
            byte = V::Set32(0xFF), bit4 = V::Set32(0x10101010);
    const F high_scale = V::Set1(1.0f / static_cast<float>(kHighTimes));
    for (int64_t sb = 0; sb < n_super; ++sb) {
      const uint8_t* blk = g + sb * kGroupBlock;
      alignas(32) float dxs[T][8];  // [token][block of the super-block] fl(d_x·Σq)
      for (int t = 0; t < T; ++t) {
        const __m256i s8 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.sum[t] + sb * 8));
        _mm256_store_ps(dxs[t], _mm256_mul_ps(_mm256_loadu_ps(x.dx[t] + sb * 8), _mm256_cvtepi32_ps(s8)));
      }
      const F d = V::Halves(blk, half), dmin = V::Halves(blk + 32, half);
      const I a = V::Load(blk + 64, half), b = V::Load(blk + 128, half), c = V::Load(blk + 192, half);
      const I sc[2] = {V::And(a, six), V::Or(V::And(c, low), V::And(V::Srl32(a, 2), top))};
      const I mn[2] = {V::And(b, six), V::Or(V::And(V::Srl32(c, 4), low), V::And(V::Srl32(b, 2), top))};
      for (int pair = 0; pair < 4; ++pair) {  // sub-blocks 2·pair (low nibbles) and 2·pair+1 (high)
        const int shift = 16 * (pair % 2);
        const I sc_pair = V::Srl32(sc[pair / 2], shift), mn_pair = V::Srl32(mn[pair / 2], shift);
        const F dsc0 = V::Mul(d, V::Cvt(V::And(sc_pair, byte)));                                     // exact
        const F dsc1 = V::Mul(V::Mul(d, V::Cvt(V::And(V::Srl32(sc_pair, 8), byte))), high_scale);  // exact
        const F dm0 = V::Mul(dmin, V::Cvt(V::And(mn_pair, byte)));                                   // exact
        const F dm1 = V::Mul(dmin, V::Cvt(V::And(V::Srl32(mn_pair, 8), byte)));                      // exact
        const uint8_t* codes = blk + kCodesAt + pair * 8 * 64;
        KqPrefetch<T>(blk + pair * (kGroupBlock / 4), kGroupBlock / 4);
        I lo[8], hi[8];  // [k]: elements 4k..4k+3 of sub-block 2·pair, 2·pair+1, per row
        for (int k = 0; k < 8; ++k) {
          const I v = V::Load(codes + 64 * k, half);
          if constexpr (kFifthBit) {
            // qh >> 2·pair in 32-bit lanes: bits 0 and 1 of each byte are its own bits 2·pair and
            // 2·pair+1 (a shift ≤ 6 brings the next byte's bits only to bits ≥ 2); the 16-bit
            // shifts by 4 and 3 move them to bit 4 of the same byte.
            const I h = V::Srl32(V::Load(blk + kQ5_KGroupHighBitsAt + 64 * k, half), 2 * pair);
            lo[k] = V::Or(V::And(v, low), V::And(V::template Slli16<4>(h), bit4));
            hi[k] = V::Or(V::And(V::template Srli16<4>(v), low), V::And(V::template Slli16<3>(h), bit4));
          } else {
            lo[k] = V::And(v, low);
            hi[k] = V::HighNibbles(v);
          }
        }
        const int64_t ab = sb * 8 + 2 * pair;  // the low nibbles' activation block
        for (int t = 0; t < T; ++t) {
          const int8_t* qb = x.q[t] + ab * 32;
          I dot0 = V::Set32(0), dot1 = V::Set32(0);
          for (int k = 0; k < 8; ++k) {
            dot0 = V::Dot(dot0, lo[k], qb + 4 * k);
            dot1 = V::Dot(dot1, hi[k], qb + 32 + 4 * k);
          }
          if constexpr (!kFifthBit) dot1 = V::SixteenTimes(dot1);  // 16·Σ n·q on every x86 target
          acc[t] = V::Fma(V::Mul(dsc0, V::Set1(x.dx[t][ab])), V::Cvt(dot0), acc[t]);
          macc[t] = V::Fma(dm0, V::Set1(dxs[t][2 * pair]), macc[t]);
          acc[t] = V::Fma(V::Mul(dsc1, V::Set1(x.dx[t][ab + 1])), V::Cvt(dot1), acc[t]);
          macc[t] = V::Fma(dm1, V::Set1(dxs[t][2 * pair + 1]), macc[t]);
        }
      }
    }
    for (int t = 0; t < T; ++t) V::Store(y + (t0 + t) * y_stride + r + V::kLanes * half, V::Sub(acc[t], macc[t]));
  }
#endif
};

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
