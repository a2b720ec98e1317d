// Per-target kernels of Q4_0 / Q8_0 / Q2_0 matrices in MatrixLayout::kInterleaved16
// (weights/repack.h): 16 rows × T tokens per step, for MatVec (T = 1) and MatMul (T up to
// kIlMaxTokens, each unpacked weight vector used for every token of the step). Include after
// foreach_target.h and after quant_rows-inl.h (its KVQ_MATVEC_X86_ATTR); a type supplies a policy B:
//   static constexpr int64_t kBytes    bytes per plain block (18, 34)
//   static constexpr int64_t kElems    elements per block: 32, or 64 (Q2_0: two activation blocks
//                                      share the block's scale)
//   static constexpr bool kSigned      codes are int8 (Q8_0) rather than 4- or 2-bit fields
//   static constexpr int kCodeBits     unsigned types: bits per code (4, 2)
//   static constexpr int32_t kBias     the unsigned byte a dot multiplies is code + kBias (Q8_0 on
//                                      VNNI: 128; Q4_0's nibble: 8; Q2_0's field: 1)
//   static int32_t CodeScalar(const uint8_t* codes, int64_t j, int64_t m)   code of row j, element m
// and gets InterleavedRows<B> for WeightKernels::interleaved_rows. An unsigned type's group block
// holds 4 code vectors, and bits kCodeBits·p of vector k's byte 4j + e are row j's field of element
// 16p + 4k + e (chunk 4p + k of 4 elements: a shift and an AND unpack it, once per block for all
// the step's tokens; VNNI's MatVec instead one AND, in place, and a shift of each field's dot).
//
// Per row j, token t and block b of 32: I_b = Σ code·q exact in int32 (lane j of one accumulator:
// 512-bit vpdpbusd on AVX3_DL, 16 rows per vector; 256-bit maddubs + madd on AVX2 / AVX3, the
// group's two 8-row halves in turn — Q8_0 through |w| and sign(q, w), as (w + 128)·q pairs would
// saturate int16 —; plain integers elsewhere), then
//   s = d_w·d_x      (f32, rounded once; the rows' d_w converted together, F16C)
//   acc = fma(s, I_b, acc)   (one rounding per block)
// so each term is rounded at most n_blocks + 1 times (no lane reduction: lane j is row j's
// result), inside matvec.h's γ_{n_blocks + 4}. The scalar path does the same operations with
// std::fma, so every target gives the same bits on this layout, whatever T and the threads.
#if defined(KVQ_WEIGHTS_INTERLEAVED_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVQ_WEIGHTS_INTERLEAVED_ROWS_INL_H_
#undef KVQ_WEIGHTS_INTERLEAVED_ROWS_INL_H_
#else
#define KVQ_WEIGHTS_INTERLEAVED_ROWS_INL_H_
#endif

#include <hwy/highway.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "base/float_codes.h"
#include "weights/weight_type.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

constexpr int64_t kIlRows = 16;        // rows per group (weights/repack.h kInterleaveRows)
constexpr int64_t kIlScaleBytes = 32;  // a group block's 16 f16 scales
constexpr int64_t kIlVectorBytes = 64; // a code vector: 4 bytes per row
constexpr int64_t kIlChunks = 8;       // 4-element chunks per block of 32

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2

// Tokens per step: AVX-512 keeps the 8 unpacked weight vectors and an f32 accumulator per token in
// its 32 vector registers (a token's int32 dot lives only while its block is done). `kvq bench
// matvec --type q4_0 -t 1 --tokens 64 --working-set 128MiB` (one run per size, load ~2.2 on 2
// cores): 10 per step 205.7 GMAC/s, 12 209.2, 16 183.2; 10 keeps a speculative verify pass (up
// to 9 tokens at the default draft length) in one step, reading each weight vector once.
// AVX2's 16 registers (two int32 chains) hold 2.
#if KVQ_MATVEC_VNNI
constexpr int kIlMaxTokens = 10;
#else
constexpr int kIlMaxTokens = 2;
#endif

#if KVQ_MATVEC_VNNI
// acc += u (u8) · the 4 codes at q broadcast to every lane (s8): vpdpbusd with its 32-bit memory
// operand broadcast by EVEX ({1to16}), one fused instruction where _mm512_set1_epi32 costs GCC a
// separate vpbroadcastd (it does not fold the broadcast into vpdpbusd).
KVQ_MATVEC_X86_ATTR inline __m512i DotBroadcast(__m512i acc, __m512i u, const int8_t* q) {
  __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*reinterpret_cast<const int32_t*>(q)));
  return acc;
}

// One step: the group's 16 rows (their block data at g) times tokens t0..t0+T−1, 512-bit. The
// measured int8-dot peak of a 512-bit vpdpbusd here is about 1.7× the 256-bit one's (kvq bench roofline).
template <class B, int T>
KVQ_MATVEC_X86_ATTR void InterleavedStepX86(const uint8_t* g, const QuantizedX& x0, int64_t cols, int64_t t0,
                                            float* y, int64_t y_stride, int64_t r, bool prefetch) {
  constexpr int64_t kGroupBlock = kIlRows * B::kBytes;
  constexpr int64_t kSub = B::kElems / 32;  // activation blocks per weight block
  const int64_t n_blocks = cols / 32;
  const int8_t* q[T];     // token t's codes [cols]
  const float* dx[T];     // [n_blocks]
  const int32_t* sum[T];  // [n_blocks]
  __m512 acc[T];
  for (int t = 0; t < T; ++t) {
    q[t] = x0.q + (t0 + t) * cols;
    dx[t] = x0.d + (t0 + t) * n_blocks;
    sum[t] = x0.sum + (t0 + t) * n_blocks;
    acc[t] = _mm512_setzero_ps();
  }
  for (int64_t wb = 0; wb < n_blocks / kSub; ++wb) {
    const uint8_t* blk = g + wb * kGroupBlock;
    // A group's first step (MatVec's only one) reads it from memory: software prefetch
    // kPrefetchBytes ahead into L2, as the row kernels do (quant_rows-inl.h), for every T — from
    // memory the hardware prefetcher alone keeps too few misses in flight, and a step of several
    // tokens, with more work per byte, reaches even fewer lines ahead. The later steps find the
    // group in cache. An integer address: it may lie past the matrix (a prefetch never faults).
    if (prefetch) {
      const uintptr_t ahead = reinterpret_cast<uintptr_t>(blk) + kPrefetchBytes;
      for (int64_t at = 0; at < kGroupBlock; at += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(ahead + at), _MM_HINT_T1);
      }
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    const uint8_t* codes = blk + kIlScaleBytes;
#pragma GCC unroll 2
    for (int64_t s = 0; s < kSub; ++s) {
      const int64_t b = wb * kSub + s;  // activation block
      if constexpr (B::kSigned) {
        __m512i u[kIlChunks];  // u[c]: the unsigned bytes of chunk c (elements 4c..4c+3 of each row)
        for (int c = 0; c < kIlChunks; ++c) {
          u[c] = _mm512_xor_si512(_mm512_loadu_si512(codes + kIlVectorBytes * c),
                                  _mm512_set1_epi8(static_cast<char>(0x80)));  // w + 128
        }
        for (int t = 0; t < T; ++t) {
          const int8_t* qb = q[t] + b * 32;
          // Lanes start at −128·Σq (the unsigned bytes are w + 128). One chain of 8 (the T
          // tokens' chains and the next blocks' overlap it).
          __m512i dot = _mm512_set1_epi32(-B::kBias * sum[t][b]);
          for (int c = 0; c < kIlChunks; ++c) dot = DotBroadcast(dot, u[c], qb + 4 * c);
          const __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(dx[t][b]));
          acc[t] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(dot), acc[t]);
        }
      } else if constexpr (T == 1) {
        // MatVec: fields f = 2s (chunks c < 4: elements 4c..4c+3) and 2s + 1 (chunks 4 + c) of
        // vector c, masked in place: the bytes are 2^(kCodeBits·f)·(code + bias), so each field's
        // chain is 2^(kCodeBits·f) times its dot, exactly (|chain| ≤ 2^6·3·127·16 for Q2_0's top
        // field, 16·15·127·16 for Q4_0's), and an arithmetic shift returns the dot exactly.
        // One AND per chunk instead of a shift and an AND; two chains.
        constexpr int kBits = B::kCodeBits;
        const int lo = static_cast<int>(2 * s * kBits), hi = lo + kBits;  // the fields' bit offsets
        const __m512i lo_mask = _mm512_set1_epi8(static_cast<char>(((1 << kBits) - 1) << lo));
        const __m512i hi_mask = _mm512_set1_epi8(static_cast<char>(((1 << kBits) - 1) << hi));
        __m512i u[kIlChunks];  // u[c], u[4 + c]: vector c's two fields, in place
        for (int c = 0; c < 4; ++c) {
          const __m512i v = _mm512_loadu_si512(codes + kIlVectorBytes * c);
          u[c] = _mm512_and_si512(v, lo_mask);
          u[4 + c] = _mm512_and_si512(v, hi_mask);
        }
        const int8_t* qb = q[0] + b * 32;
        // The low field's chain starts at 2^lo·(−bias·Σq) (|·| ≤ 2^4·127·32 for Q2_0, 8·127·32
        // for Q4_0): the shift below returns it exactly with the dot.
        __m512i lo_dot = _mm512_set1_epi32(-B::kBias * sum[0][b] * (1 << lo)), hi_dot = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c) {
          lo_dot = DotBroadcast(lo_dot, u[c], qb + 4 * c);
          hi_dot = DotBroadcast(hi_dot, u[4 + c], qb + 16 + 4 * c);
        }
        // Σ (code + bias)·q − bias·Σq: I_b, exactly.
        const __m512i dot =
            _mm512_add_epi32(lo == 0 ? lo_dot : _mm512_srai_epi32(lo_dot, lo), _mm512_srai_epi32(hi_dot, hi));
        const __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(dx[0][b]));
        acc[0] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(dot), acc[0]);
      } else {
        // Several tokens: the fields shifted down to code + bias once per block (a shift and an
        // AND per chunk, shared by the T tokens), so each token's dot is one chain of 8 that
        // starts at −bias·Σq and ends at I_b exactly (|·| ≤ 23·127·32), with no shift or add
        // per token. The same integer as the T = 1 path, so the same bits.
        constexpr int kBits = B::kCodeBits;
        const int lo = static_cast<int>(2 * s * kBits), hi = lo + kBits;  // the fields' bit offsets
        const __m512i mask = _mm512_set1_epi8(static_cast<char>((1 << kBits) - 1));
        __m512i u[kIlChunks];  // u[c], u[4 + c]: vector c's two fields as code + bias
        for (int c = 0; c < 4; ++c) {
          const __m512i v = _mm512_loadu_si512(codes + kIlVectorBytes * c);
          u[c] = _mm512_and_si512(lo == 0 ? v : _mm512_srli_epi16(v, lo), mask);
          u[4 + c] = _mm512_and_si512(_mm512_srli_epi16(v, hi), mask);
        }
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) {
          const int8_t* qb = q[t] + b * 32;  // u[k] covers elements 4k..4k+3 of the block
          __m512i dot = _mm512_set1_epi32(-B::kBias * sum[t][b]);
          for (int k = 0; k < kIlChunks; ++k) dot = DotBroadcast(dot, u[k], qb + 4 * k);
          const __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(dx[t][b]));
          acc[t] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(dot), acc[t]);
        }
      }
    }
  }
  for (int t = 0; t < T; ++t) _mm512_storeu_ps(y + (t0 + t) * y_stride + r, acc[t]);
}

#else  // AVX2 / AVX3: 256-bit, the group's halves (rows 0..7, 8..15) in turn

KVQ_MATVEC_X86_ATTR inline __m256i BroadcastChunk(const int8_t* q) {
  int32_t v;
  std::memcpy(&v, q, 4);
  return _mm256_set1_epi32(v);
}

template <class B, int T>
KVQ_MATVEC_X86_ATTR void InterleavedHalfX86(const uint8_t* g, const QuantizedX& x0, int64_t cols, int64_t t0,
                                            float* y, int64_t y_stride, int64_t r, int half) {
  constexpr int64_t kGroupBlock = kIlRows * B::kBytes;
  constexpr int64_t kSub = B::kElems / 32;  // activation blocks per weight block
  const int64_t n_blocks = cols / 32;
  const int8_t* q[T];     // token t's codes [cols]
  const float* dx[T];     // [n_blocks]
  const int32_t* sum[T];  // [n_blocks]
  __m256 acc[T];
  for (int t = 0; t < T; ++t) {
    q[t] = x0.q + (t0 + t) * cols;
    dx[t] = x0.d + (t0 + t) * n_blocks;
    sum[t] = x0.sum + (t0 + t) * n_blocks;
    acc[t] = _mm256_setzero_ps();
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t wb = 0; wb < n_blocks / kSub; ++wb) {
    const uint8_t* blk = g + wb * kGroupBlock;
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * half)));
    const uint8_t* codes = blk + kIlScaleBytes + 32 * half;
    for (int64_t s = 0; s < kSub; ++s) {
      const int64_t b = wb * kSub + s;  // activation block
      __m256i u[kIlChunks];  // u[c]: chunk c's bytes (Q4_0: code + 8; Q2_0: code + 1; Q8_0: the signed codes)
      if constexpr (B::kSigned) {
        for (int c = 0; c < kIlChunks; ++c) {
          u[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + kIlVectorBytes * c));
        }
      } else {
        const __m256i mask = _mm256_set1_epi8((1 << B::kCodeBits) - 1);
        const int lo = static_cast<int>(2 * s * B::kCodeBits);
        for (int c = 0; c < 4; ++c) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + kIlVectorBytes * c));
          u[c] = _mm256_and_si256(lo == 0 ? v : _mm256_srli_epi16(v, lo), mask);
          u[c + 4] = _mm256_and_si256(_mm256_srli_epi16(v, lo + B::kCodeBits), mask);
        }
      }
      for (int t = 0; t < T; ++t) {
        const int8_t* qb = q[t] + b * 32;
        __m256i i0, i1;
        if constexpr (B::kSigned) {
          // |w|·(±q): |w| ≤ 128, |q| ≤ 127, so a pair is at most 32512 (no saturation).
          i0 = _mm256_setzero_si256();
          i1 = _mm256_setzero_si256();
          for (int c = 0; c < kIlChunks; c += 2) {
            const __m256i x_a = BroadcastChunk(qb + 4 * c), x_b = BroadcastChunk(qb + 4 * c + 4);
            i0 = _mm256_add_epi32(i0, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(u[c]),
                                                                             _mm256_sign_epi8(x_a, u[c])), ones));
            i1 = _mm256_add_epi32(i1, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(u[c + 1]),
                                                                             _mm256_sign_epi8(x_b, u[c + 1])), ones));
          }
        } else {
          // (code + bias)·q: at most 15·127·2 per pair, no saturation; then − bias·Σq.
          i0 = _mm256_set1_epi32(-B::kBias * sum[t][b]);
          i1 = _mm256_setzero_si256();
          for (int c = 0; c < kIlChunks; c += 2) {
            i0 = _mm256_add_epi32(i0, _mm256_madd_epi16(_mm256_maddubs_epi16(u[c], BroadcastChunk(qb + 4 * c)), ones));
            i1 = _mm256_add_epi32(
                i1, _mm256_madd_epi16(_mm256_maddubs_epi16(u[c + 1], BroadcastChunk(qb + 4 * c + 4)), ones));
          }
        }
        const __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(dx[t][b]));
        acc[t] = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(_mm256_add_epi32(i0, i1)), acc[t]);
      }
    }
  }
  for (int t = 0; t < T; ++t) _mm256_storeu_ps(y + (t0 + t) * y_stride + r + 8 * half, acc[t]);
}

// prefetch: unused here (the 256-bit kernels have not been timed with software prefetch).
template <class B, int T>
void InterleavedStepX86(const uint8_t* g, const QuantizedX& x0, int64_t cols, int64_t t0, float* y,
                        int64_t y_stride, int64_t r, bool /*prefetch*/) {
  InterleavedHalfX86<B, T>(g, x0, cols, t0, y, y_stride, r, 0);
  InterleavedHalfX86<B, T>(g, x0, cols, t0, y, y_stride, r, 1);
}

#endif  // KVQ_MATVEC_VNNI

// InterleavedStepX86<B, T> by T − 1, for T in 1..kIlMaxTokens.
template <class B, size_t... I>
constexpr auto InterleavedSteps(std::index_sequence<I...>) {
  return std::array{&InterleavedStepX86<B, static_cast<int>(I) + 1>...};
}

template <class B>
void InterleavedRows(const uint8_t* w, const QuantizedX& x0, int64_t n_tokens, float* y, int64_t y_stride,
                     int64_t cols, int64_t r0, int64_t r1) {
  static constexpr auto kSteps = InterleavedSteps<B>(std::make_index_sequence<kIlMaxTokens>());
  const int64_t row_bytes = cols / B::kElems * B::kBytes;
  // The fewest steps that hold n_tokens, their sizes as even as can be (13 tokens with 10 per
  // step at most: 7 + 6, not 10 + 3): a small step runs fewer independent chains per weight vector
  // it unpacks. Each token's operations are the same in any step, so the split changes no bit.
  const int64_t steps = (n_tokens + kIlMaxTokens - 1) / kIlMaxTokens;
  const int64_t base = n_tokens / steps, longer = n_tokens % steps;  // the first `longer` steps: base + 1
  for (int64_t r = r0; r < r1; r += kIlRows) {
    const uint8_t* g = w + r * row_bytes;
    if (n_tokens == 1) {  // MatVec, the decode step: a direct call
      InterleavedStepX86<B, 1>(g, x0, cols, 0, y, y_stride, r, true);
      continue;
    }
    for (int64_t s = 0, t = 0; s < steps; ++s) {
      const int64_t size = base + (s < longer ? 1 : 0);
      kSteps[size - 1](g, x0, cols, t, y, y_stride, r, s == 0);
      t += size;
    }
  }
}

#else  // not x86 AVX2 or better: plain integer loops, the same f32 operations (std::fma)

template <class B>
void InterleavedRows(const uint8_t* w, const QuantizedX& x0, int64_t n_tokens, float* y, int64_t y_stride,
                     int64_t cols, int64_t r0, int64_t r1) {
  constexpr int64_t kGroupBlock = kIlRows * B::kBytes;
  constexpr int64_t kSub = B::kElems / 32;  // activation blocks per weight block
  const int64_t n_blocks = cols / 32;
  const int64_t row_bytes = n_blocks / kSub * B::kBytes;
  for (int64_t r = r0; r < r1; r += kIlRows) {
    const uint8_t* g = w + r * row_bytes;
    for (int64_t t = 0; t < n_tokens; ++t) {
      const int8_t* q = x0.q + t * cols;
      const float* dx = x0.d + t * n_blocks;
      for (int64_t j = 0; j < kIlRows; ++j) {
        float acc = 0.0f;
        for (int64_t b = 0; b < n_blocks; ++b) {
          const uint8_t* blk = g + b / kSub * kGroupBlock;
          const int64_t m0 = 32 * (b % kSub);  // the activation block's first element in the weight block
          int32_t dot = 0;
          for (int64_t m = 0; m < 32; ++m) dot += B::CodeScalar(blk + kIlScaleBytes, j, m0 + m) * q[b * 32 + m];
          uint16_t d_bits;
          std::memcpy(&d_bits, blk + 2 * j, 2);  // little-endian host
          const float s = F16ToF32(d_bits) * dx[b];
          acc = std::fma(s, static_cast<float>(dot), acc);
        }
        y[t * y_stride + r + j] = acc;
      }
    }
  }
}

#endif  // HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
