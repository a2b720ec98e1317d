// Q1_0 row kernels for every compiled target. AVX3_DL: one weight bit position at a time (a GF(2)
// affine map and a byte dot against the activation permuted by bit position, QuantizedX::offset),
// 512 weights per vector. AVX3: Σ ±q as one masked byte blend (the sign bits are the mask
// register) and one byte dot, four rows' integer lanes folded before the float work. AVX2: bits
// spread to bytes, maddubs/madd. 128-bit targets: the codes under the set bits summed one bit
// position at a time, four rows together (BlockSetSums); Highway's scalar and emulated targets: a
// loop, the same integers and f32 operations. Four activation blocks share a weight scale
// (q1_0.h, "Kernel numerics"). AVX3_DL is compiled for vpdpbusd and GFNI.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "weights/q1_0/q1_0_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "base/float_codes.h"
#include "weights/q1_0/q1_0.h"
#include "weights/q1_0/q1_0_lookup-inl.h"  // AVX3_DL: LookupTables, LookupRows, KVQ_Q1_0_GFNI_ATTR
#include "weights/quant_rows-inl.h"        // KVQ_MATVEC_X86_ATTR, kPrefetchBytes, HorizontalSumX86

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {
namespace q1_0_detail {

using weights_q1_0::kBlockBytes;
using weights_q1_0::kBlockElems;
constexpr int64_t kSub = kBlockElems / 32;  // activation blocks per weight block
[[maybe_unused]] constexpr int64_t kChunk = 16;  // weight blocks whose scales are converted together (x86 paths)

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2

// Each row's f16 scales of weight blocks c0 .. c0+nb−1 -> dw[i][0 .. nb) in f32 (F16C, 8 at a
// time), and a prefetch kPrefetchBytes ahead in each row into L2, as quant_rows-inl.h does (the
// out-of-order window alone keeps too few misses in flight; a prefetch past the matrix never
// faults, the address is an integer until then).
template <int R>
KVQ_MATVEC_X86_ATTR inline void ChunkScales(const uint8_t* const* a, int64_t c0, int64_t nb, float (*dw)[kChunk]) {
  for (int i = 0; i < R; ++i) {
    const uintptr_t ahead = reinterpret_cast<uintptr_t>(a[i] + c0 * kBlockBytes) + kPrefetchBytes;
    for (int64_t at = 0; at < kChunk * kBlockBytes; at += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(ahead + at), _MM_HINT_T1);
    }
    alignas(16) uint16_t half[kChunk] = {};
    for (int64_t j = 0; j < nb; ++j) std::memcpy(&half[j], a[i] + (c0 + j) * kBlockBytes, 2);
    for (int64_t h = 0; h < kChunk; h += 8) {
      _mm256_store_ps(&dw[i][h], _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(half + h))));
    }
  }
}

#if HWY_TARGET <= HWY_AVX3_DL
// AVX3_DL (AVX-512 GFNI, VBMI, VNNI, all guaranteed by Highway's AVX3_DL target): one bit plane
// of the weights at a time. One 512-bit vector holds four weight blocks' sign bits (512 weights,
// 16 activation blocks), byte 4(4L + s) + j = byte j of activation block s of weight block L
// (elements 8j .. 8j+7 of it). For each bit position t one GF(2) affine map turns every byte into
// 2·(its bit t), i.e. 0 or 2, and one vpdpbusd multiplies those by the activation codes of the
// same elements (8j + t, permuted once per token into QuantizedX::offset, ActivationOffsets
// below): after the 8 positions, started from −Σq, lane 4L + s holds 2·Σ_{bit set} q − Σq = Σ ±q
// of that activation block, exactly (|lane| ≤ 32·127). The activation vectors and −Σq serve four
// rows; per row and 512 weights that is 8 affine maps, 8 dots, the weight loads and permutes and
// one convert, multiply and FMA — against 8 ANDs, 8 byte popcounts, 8 dots and 2 corrections per
// 512 weights for the bit-serial dots against the activation's bit planes this replaced, with the
// same integers and float operations (so the same results). `kvq bench matvec` on a heavily
// loaded machine did not resolve the difference (docs/performance.md). Measured no better with
// the bit-serial kernel: rows in groups of 8 (slower from memory); prefetch distances 2-64 KiB,
// or into L1.
constexpr int64_t kGroupBlocks = 4;  // weight blocks per vector

// QuantizedX::offset [n · kOffsetBytesPerElem / 4] as this target's kernels read it: the codes q
// [n] of one token (QuantizeActivationFor calls this per token) permuted for the row kernel, per
// group g of m ≤ 4 weight blocks (elements 512g .. 512g + 128m − 1; m = 4 but for a row's last
// group), byte 512g + 16m·t + 16L + 4s + j = code 512g + 128L + 32s + 8j + t (bit position t,
// weight block L, activation block s, byte j), n bytes; then the lookup tables of the interleaved
// kernel (q1_0_lookup-inl.h).
//
// PermuteGroup: one whole group's permutation as a transpose of 64 × 8 bytes, out[64t + k] =
// in[8k + t]. Each input vector's 8 × 8 bytes are transposed by one byte permute (qword t of w[s]
// = out vector t's qword s), then the 8 × 8 qwords by unpacks and 128-bit shuffles: 32 vector
// instructions for 512 codes where a byte loop took 512 loads and stores.
KVQ_Q1_0_GFNI_ATTR inline void PermuteGroup(const int8_t* in, int8_t* out) {
  alignas(64) static constexpr auto kByteTranspose = [] {  // byte 8t + j takes byte 8j + t
    std::array<uint8_t, 64> r{};
    for (int e = 0; e < 64; ++e) r[e] = static_cast<uint8_t>(8 * (e % 8) + e / 8);
    return r;
  }();
  const __m512i bt = _mm512_load_si512(kByteTranspose.data());
  __m512i w[8];  // w[s]: input vector s with its 8 × 8 bytes transposed
  for (int s = 0; s < 8; ++s) w[s] = _mm512_permutexvar_epi8(bt, _mm512_loadu_si512(in + 64 * s));
  for (int odd = 0; odd < 2; ++odd) {  // out vectors t = 2·(128-bit lane) + odd
    __m512i a[4];                      // a[p], lane L: (w[2p], w[2p+1]) qwords 2L + odd
    for (int p = 0; p < 4; ++p) {
      a[p] = odd ? _mm512_unpackhi_epi64(w[2 * p], w[2 * p + 1])
                 : _mm512_unpacklo_epi64(w[2 * p], w[2 * p + 1]);
    }
    // c0: lanes a0.0 a0.2 a1.0 a1.2, c1: a0.1 a0.3 a1.1 a1.3; c2, c3 the same of a2, a3. Then
    // out vector 2L + odd = lane L of a0, a1, a2, a3.
    constexpr int kEven = _MM_SHUFFLE(2, 0, 2, 0), kOdd = _MM_SHUFFLE(3, 1, 3, 1);
    const __m512i c0 = _mm512_shuffle_i64x2(a[0], a[1], kEven);
    const __m512i c1 = _mm512_shuffle_i64x2(a[0], a[1], kOdd);
    const __m512i c2 = _mm512_shuffle_i64x2(a[2], a[3], kEven);
    const __m512i c3 = _mm512_shuffle_i64x2(a[2], a[3], kOdd);
    _mm512_storeu_si512(out + 64 * (0 + odd), _mm512_shuffle_i64x2(c0, c2, kEven));
    _mm512_storeu_si512(out + 64 * (2 + odd), _mm512_shuffle_i64x2(c1, c3, kEven));
    _mm512_storeu_si512(out + 64 * (4 + odd), _mm512_shuffle_i64x2(c0, c2, kOdd));
    _mm512_storeu_si512(out + 64 * (6 + odd), _mm512_shuffle_i64x2(c1, c3, kOdd));
  }
}

KVQ_Q1_0_GFNI_ATTR void ActivationOffsets(const int8_t* q, int64_t n, int32_t* offset) {
  int8_t* out = reinterpret_cast<int8_t*>(offset);
  const int64_t n_wb = n / kBlockElems;
  for (int64_t wb = 0; wb < n_wb; wb += kGroupBlocks) {
    const int64_t m = std::min(kGroupBlocks, n_wb - wb);
    if (m == kGroupBlocks) {
      PermuteGroup(q + wb * kBlockElems, out + wb * kBlockElems);
      continue;
    }
    for (int64_t t = 0; t < 8; ++t) {
      for (int64_t k = 0; k < 16 * m; ++k) {  // k = 16L + 4s + j = 4·(activation block) + j
        out[wb * kBlockElems + 16 * m * t + k] = q[wb * kBlockElems + 32 * (k / 4) + 8 * (k % 4) + t];
      }
    }
  }
  LookupTables(q, n, reinterpret_cast<uint8_t*>(offset) + n);
}

// Weight blocks wb .. wb+m−1 of one row (block = the first one's bytes, 18-byte stride), from
// two loads of the group's 72 bytes: *bits gets 128-bit lane L = block wb+L's 16 bytes of qs (one
// byte permute, VBMI), *scale lane 4L + s = block wb+L's d in f32 (one word permute, one convert).
// A partial group's loads are masked to its own bytes (no read past the row), its lanes past m
// zero. Measured slower: the scales copied to a stack array per chunk and converted from there
// (the narrow stores stall the wide load that converts them).
template <bool kFull>
KVQ_Q1_0_GFNI_ATTR inline void WeightBlocks(const uint8_t* block, int m, __m512i* bits, __m512* scale) {
  // Byte j (lane L = j / 16, byte b = j % 16) sits at 2 + 18L + b: from the first load (at 0)
  // for L < 3, from the second (at 8, index 64 + 48 + b) for L = 3.
  const __m512i idx = _mm512_set_epi8(127, 126, 125, 124, 123, 122, 121, 120, 119, 118, 117, 116, 115, 114, 113, 112,
                                      53, 52, 51, 50, 49, 48, 47, 46, 45, 44, 43, 42, 41, 40, 39, 38,
                                      35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20,
                                      17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2);
  // Word 4L + s takes word 9L of the first load: block L's d.
  const __m512i didx = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  //
                                        27, 27, 27, 27, 18, 18, 18, 18, 9, 9, 9, 9, 0, 0, 0, 0);
  __m512i z0, z1;
  if constexpr (kFull) {
    z0 = _mm512_loadu_si512(block);
    z1 = _mm512_loadu_si512(block + 8);
  } else {
    const int64_t bytes = m * kBlockBytes;  // the group's bytes from `block`
    z0 = _mm512_maskz_loadu_epi8(_bzhi_u64(~0ULL, static_cast<unsigned>(std::min<int64_t>(64, bytes))), block);
    z1 = _mm512_maskz_loadu_epi8(_bzhi_u64(~0ULL, static_cast<unsigned>(std::max<int64_t>(0, bytes - 8))), block + 8);
  }
  *bits = _mm512_permutex2var_epi8(z0, idx, z1);
  *scale = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(didx, z0)));
}

// One group of m ≤ 4 weight blocks (wb .. wb+m−1) for R rows: acc[i] += (d_w ⊙ d_x) ⊙
// f32(Σ ±q), lane 4L + s (1 rounding for the product, 1 for the FMA). Lanes past 4m: zero bits,
// zero codes and zero −Σq, so 0.
template <bool kFull, int R>
KVQ_Q1_0_GFNI_ATTR inline void Group(const uint8_t* const* a, const QuantizedX& x, int64_t wb, int m, __m512* acc) {
  const __mmask16 lanes = kFull ? 0xFFFF : static_cast<__mmask16>((1u << (4 * m)) - 1);
  const int8_t* perm = reinterpret_cast<const int8_t*>(x.offset) + wb * kBlockElems;  // ActivationOffsets
  __m512i q[8];  // q[t]: byte 4(4L + s) + j = code 128L + 32s + 8j + t of the group
  for (int t = 0; t < 8; ++t) {
    q[t] = kFull ? _mm512_loadu_si512(perm + 64 * t)
                 : _mm512_maskz_loadu_epi8(_bzhi_u64(~0ULL, static_cast<unsigned>(16 * m)), perm + 16 * m * t);
  }
  const __m512i neg_sum = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_maskz_loadu_epi32(lanes, x.sum + wb * kSub));
  const __m512 dx = _mm512_maskz_loadu_ps(lanes, x.d + wb * kSub);
  for (int i = 0; i < R; ++i) {
    __m512i bits;
    __m512 dw;
    WeightBlocks<kFull>(a[i] + wb * kBlockBytes, m, &bits, &dw);
    __m512i dot = neg_sum;
    for (int t = 0; t < 8; ++t) {
      // Output bit 1 of each byte = input bit t: the affine matrix's byte 6 (the row of output bit
      // 1) is 1 << t, every other row 0.
      const __m512i two_bits = _mm512_gf2p8affine_epi64_epi8(bits, _mm512_set1_epi64(static_cast<int64_t>((1ULL << t) << 48)), 0);
      dot = _mm512_dpbusd_epi32(dot, two_bits, q[t]);
    }
    acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(dot), acc[i]);
  }
}

// R rows from r. Per term: the scale product (1), its FMA (1), ≤ n_wb/4 later FMAs into the
// lane, the 16 lanes summed (4): ≤ n_wb/4 + 6 ≤ n_blocks + 4 roundings (n_blocks = 4·n_wb ≥ 4).
// Each row's arithmetic depends on that row alone, so grouping (R, threads, MatMul) changes no
// bit. A prefetch kPrefetchBytes ahead per kChunk blocks and row, as quant_rows-inl.h does.
template <int R>
KVQ_Q1_0_GFNI_ATTR void RowGroup(const uint8_t* w, const QuantizedX& x, float* y, int64_t cols, int64_t r) {
  const int64_t n_wb = cols / kBlockElems;
  const int64_t row_bytes = n_wb * kBlockBytes;
  const uint8_t* a[R];
  __m512 acc[R];  // lane 4L + s: activation block s of each group's weight block L
  for (int i = 0; i < R; ++i) {
    a[i] = w + (r + i) * row_bytes;
    acc[i] = _mm512_setzero_ps();
  }
  for (int64_t c0 = 0; c0 < n_wb; c0 += kChunk) {
    const int64_t nb = std::min(kChunk, n_wb - c0);
    for (int i = 0; i < R; ++i) {
      const uintptr_t ahead = reinterpret_cast<uintptr_t>(a[i] + c0 * kBlockBytes) + kPrefetchBytes;
      for (int64_t at = 0; at < kChunk * kBlockBytes; at += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(ahead + at), _MM_HINT_T1);
      }
    }
    int64_t g = 0;
    for (; g + 4 <= nb; g += 4) Group<true, R>(a, x, c0 + g, 4, acc);
    if (g < nb) Group<false, R>(a, x, c0 + g, static_cast<int>(nb - g), acc);
  }
  for (int i = 0; i < R; ++i) y[r + i] = _mm512_reduce_add_ps(acc[i]);
}

#define KVQ_Q1_0_HAS_LUT 1

#elif HWY_TARGET <= HWY_AVX3
// AVX-512BW, 512-bit: two activation blocks (64 elements, 8 bytes of bits) per vector. The 64
// bits go straight into a mask register; one masked byte blend gives v = bit ? q : −q, one byte
// dot (vpdpbusd by 1; without VNNI maddubs/madd) the lanes Σ ±q over 4 elements each, exact.
// 512 bits halve the instructions per weight against 256 (this loop is bound by them, not by
// memory), and nothing 256-bit runs beside it to lose port 1 to.
KVQ_MATVEC_X86_ATTR inline __m512i Dot(const uint8_t* bits, __m512i q, __m512i neg_q) {
  uint64_t word;
  std::memcpy(&word, bits, 8);  // element j of the half: bit j (little-endian host)
  const __m512i v = _mm512_mask_blend_epi8(_cvtu64_mask64(word), neg_q, q);
#if KVQ_MATVEC_VNNI
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), v);
#else
  return _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_set1_epi8(1), v), _mm512_set1_epi16(1));
#endif
}

// Four rows' dot lanes (|lane| ≤ 4·127) folded into one vector in integers, exactly: dword r of
// each 128-bit lane = row r's Σ ±q over that lane's 16 elements (two saturating packs to i16 and
// pair sums by madd; every value stays ≤ 16·127 < 2^15). The float work (convert, FMA) is then
// one instruction per 64 weights for all four rows instead of one per row: the convert and the
// FMA are what bind this loop to port 0, the packs run on port 5.
KVQ_MATVEC_X86_ATTR inline __m512i Fold4(__m512i a, __m512i b, __m512i c, __m512i d) {
  const __m512i ones = _mm512_set1_epi16(1);
  const __m512i ab = _mm512_madd_epi16(_mm512_packs_epi32(a, b), ones);  // [a a b b] per 128 bits
  const __m512i cd = _mm512_madd_epi16(_mm512_packs_epi32(c, d), ones);  // [c c d d]
  return _mm512_madd_epi16(_mm512_packs_epi32(ab, cd), ones);            // [a b c d]
}

// Four rows a[0..3] -> out[0..3]. Per weight block: t = Σ_{2 halves} dx ⊙ f32(Fold4(...)) (dx = [d_x,2h ×8 |
// d_x,2h+1 ×8], ≤ 2 roundings), acc += [d_w,r0 .. d_w,r3 ×4] ⊙ t (1, then ≤ n_wb − 1 more); row
// r's 4 lanes summed at the end (2): ≤ n_wb + 4 ≤ n_blocks + 4 roundings per term.
KVQ_MATVEC_X86_ATTR void FourRows(const uint8_t* const* a, const QuantizedX& x, int64_t cols, float* out) {
  const int64_t n_wb = cols / kBlockElems;
  __m512 acc = _mm512_setzero_ps();  // lane 4L + i: row i
  for (int64_t c0 = 0; c0 < n_wb; c0 += kChunk) {
    const int64_t nb = std::min(kChunk, n_wb - c0);
    for (int i = 0; i < 4; ++i) {
      const uintptr_t ahead = reinterpret_cast<uintptr_t>(a[i] + c0 * kBlockBytes) + kPrefetchBytes;
      for (int64_t at = 0; at < kChunk * kBlockBytes; at += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(ahead + at), _MM_HINT_T1);
      }
    }
    alignas(64) uint16_t half[kChunk][4] = {};  // the chunk's f16 scales, rows side by side
    alignas(64) float dw[kChunk][4];            // the same in f32
    for (int64_t j = 0; j < nb; ++j) {
      for (int i = 0; i < 4; ++i) std::memcpy(&half[j][i], a[i] + (c0 + j) * kBlockBytes, 2);
    }
    for (int64_t j = 0; j < kChunk; j += 2) {
      _mm256_store_ps(&dw[j][0], _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(&half[j][0]))));
    }
    for (int64_t j = 0; j < nb; ++j) {
      const int64_t wb = c0 + j;
      __m512 t = _mm512_setzero_ps();
      for (int64_t h = 0; h < kSub / 2; ++h) {
        const int64_t b = wb * kSub + 2 * h;  // the first of the half's two activation blocks
        const __m512i q = _mm512_loadu_si512(x.q + b * 32);
        const __m512i neg_q = _mm512_sub_epi8(_mm512_setzero_si512(), q);
        const __m512 dx = _mm512_insertf32x8(_mm512_set1_ps(x.d[b]), _mm256_set1_ps(x.d[b + 1]), 1);
        const int64_t at = wb * kBlockBytes + 2 + 8 * h;
        const __m512 dot = _mm512_cvtepi32_ps(
            Fold4(Dot(a[0] + at, q, neg_q), Dot(a[1] + at, q, neg_q), Dot(a[2] + at, q, neg_q), Dot(a[3] + at, q, neg_q)));
        t = h == 0 ? _mm512_mul_ps(dx, dot) : _mm512_fmadd_ps(dx, dot, t);
      }
      acc = _mm512_fmadd_ps(_mm512_broadcast_f32x4(_mm_load_ps(&dw[j][0])), t, acc);
    }
  }
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1)));
}

// R = 4 rows from r, or R = 1: that row through the same four-row code (all four slots on it),
// so a row's bits do not depend on how rows are grouped (sub-ranges, threads, MatMul).
template <int R>
KVQ_MATVEC_X86_ATTR void RowGroup(const uint8_t* w, const QuantizedX& x, float* y, int64_t cols, int64_t r) {
  const int64_t row_bytes = cols / kBlockElems * kBlockBytes;
  const uint8_t* a[4];
  for (int i = 0; i < 4; ++i) a[i] = w + (r + (R == 4 ? i : 0)) * row_bytes;
  alignas(16) float out[4];
  FourRows(a, x, cols, out);
  for (int i = 0; i < R; ++i) y[r + i] = out[i];
}

void ActivationOffsets(const int8_t*, int64_t, int32_t*) {}  // lanes start from 0

#else  // AVX2
// AVX2, 256-bit, one activation block per vector: the 32 bits expanded to one 0/1 byte per
// element (byte shuffle, AND with the bit's value, min with 1), then 2·Σ_{bit set} q per lane
// from maddubs/madd by 2, started from the lane's −Σq (QuantizedX::offset): exactly Σ ±q.
// Per weight block and row: t = Σ_{4 activation blocks} d_x·f32(lanes) (≤ 4 roundings), acc +=
// d_w·t; 8 lanes summed at the end (3): ≤ n_wb + 7 ≤ n_blocks + 4.
KVQ_MATVEC_X86_ATTR inline __m256i Dot(const uint8_t* bits, __m256i q, __m256i off) {
  uint32_t word;
  std::memcpy(&word, bits, 4);
  // Byte p takes byte p / 8 of the word (every dword of the vector holds the word, so the index
  // within each 128-bit lane is p / 8 as well), then keeps bit p % 8.
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int32_t>(word)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i bit = _mm256_min_epu8(
      _mm256_and_si256(spread, _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL))),
      _mm256_set1_epi8(1));
  const __m256i twice = _mm256_madd_epi16(_mm256_maddubs_epi16(bit, q), _mm256_set1_epi16(2));
  return _mm256_add_epi32(twice, off);
}

template <int R>
KVQ_MATVEC_X86_ATTR void RowGroup(const uint8_t* w, const QuantizedX& x, float* y, int64_t cols, int64_t r) {
  const int64_t n_wb = cols / kBlockElems;
  const int64_t row_bytes = n_wb * kBlockBytes;
  const uint8_t* a[R];
  __m256 acc[R];
  for (int i = 0; i < R; ++i) {
    a[i] = w + (r + i) * row_bytes;
    acc[i] = _mm256_setzero_ps();
  }
  for (int64_t c0 = 0; c0 < n_wb; c0 += kChunk) {
    const int64_t nb = std::min(kChunk, n_wb - c0);
    alignas(32) float dw[R][kChunk];  // the chunk's weight scales, f32
    ChunkScales<R>(a, c0, nb, dw);
    for (int64_t j = 0; j < nb; ++j) {
      const int64_t wb = c0 + j;
      __m256 t[R];
      for (int64_t s = 0; s < kSub; ++s) {
        const int64_t b = wb * kSub + s;  // activation block
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + b * 32));
        const __m256i off = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.offset + b * 8));
        const __m256 dx = _mm256_set1_ps(x.d[b]);
        for (int i = 0; i < R; ++i) {
          const __m256 dot = _mm256_cvtepi32_ps(Dot(a[i] + wb * kBlockBytes + 2 + 4 * s, q, off));
          t[i] = s == 0 ? _mm256_mul_ps(dx, dot) : _mm256_fmadd_ps(dx, dot, t[i]);
        }
      }
      for (int i = 0; i < R; ++i) acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(dw[i][j]), t[i], acc[i]);
    }
  }
  for (int i = 0; i < R; ++i) y[r + i] = HorizontalSumX86(acc[i]);
}

// QuantizedX::offset where Dot reads it: lane j starts at −Σ of its 4 codes.
void ActivationOffsets(const int8_t* q, int64_t n, int32_t* offset) {
  for (int64_t j = 0; j < n / 4; ++j) offset[j] = -(q[4 * j] + q[4 * j + 1] + q[4 * j + 2] + q[4 * j + 3]);
}
#endif

#else  // not x86 AVX2 or better: integer dots of 128-bit vectors (SIMD128, SSE4), or plain loops
#if KVQ_QUANT_ROWS_LANES
// Four rows at a time (PlaneRowGroup): the plain loop below on vectors, its bits. The
// integers one bit position at a time, as AVX3_DL does: a row's weight block (16 bytes of sign
// bits, byte j = elements 8j .. 8j+7) is tested against bit t in every byte at once, and the codes
// of elements 8j + t (the activation permuted once per token, ActivationOffsets) are kept where it
// is set and summed in adjacent pairs to int16, 8 bit positions into one vector (|lane| ≤ 8·2·127):
// lanes 2s, 2s+1 hold activation block s's bytes, so one widening pair sum gives int32 lane s =
// J_s = Σ_{bit set} q, exact, and I_s = 2·J_s − Σq. Four rows' lanes are transposed to one vector
// per activation block. The WebAssembly module's Q1_0 kernel
// (node build/wasm/kvq-matvec-bench.js --type q1_0).
using I8 = hn::Full128<int8_t>;  // 16 lanes

// PlaneRowGroup's B: planes[t] lane j = code 8j + t of the weight block; a row's 16 sign bytes
// tested against bit t, the codes kept where it is set.
struct Q1_0Planes {
  static constexpr int64_t kBlockElems = weights_q1_0::kBlockElems;
  static constexpr int64_t kBlockBytes = weights_q1_0::kBlockBytes;
  static constexpr int64_t kSub = q1_0_detail::kSub;
  static constexpr int kPlanes = 8;  // bit positions
  static constexpr int32_t kJScale = 2;
  // One row's int32 lane s = J_s = Σ q over the set bits of activation block s.
  static HWY_INLINE hn::Vec<QrI32> RowSums(const uint8_t* bits, const hn::Vec<I8>* planes) {
    const hn::Full128<uint8_t> du8;
    const I8 d8;
    const auto w = hn::LoadU(du8, bits);
    auto sum16 = PairSums(hn::IfThenElseZero(hn::RebindMask(d8, hn::TestBit(w, hn::Set(du8, 1))), planes[0]));
    for (int t = 1; t < 8; ++t) {
      const auto set = hn::TestBit(w, hn::Set(du8, static_cast<uint8_t>(1u << t)));
      sum16 = hn::Add(sum16, PairSums(hn::IfThenElseZero(hn::RebindMask(d8, set), planes[t])));
    }
    return WidenSum(sum16);
  }
  // Lane s of row i -> j[s] lane i: [row 0, row 1] pairs of lanes s = 0, 1 (lo) and 2, 3 (hi),
  // then the 64-bit halves of rows 0-1 and 2-3 paired.
  static HWY_INLINE void BlockSums(const uint8_t* const* a, int64_t at, const hn::Vec<I8>* planes, hn::Vec<QrI32>* j) {
    const QrI32 d32;
    const hn::Full128<int64_t> d64;
    const auto l0 = RowSums(a[0] + at, planes), l1 = RowSums(a[1] + at, planes);
    const auto l2 = RowSums(a[2] + at, planes), l3 = RowSums(a[3] + at, planes);
    const auto lo01 = hn::BitCast(d64, hn::InterleaveLower(d32, l0, l1));
    const auto hi01 = hn::BitCast(d64, hn::InterleaveUpper(d32, l0, l1));
    const auto lo23 = hn::BitCast(d64, hn::InterleaveLower(d32, l2, l3));
    const auto hi23 = hn::BitCast(d64, hn::InterleaveUpper(d32, l2, l3));
    j[0] = hn::BitCast(d32, hn::InterleaveLower(d64, lo01, lo23));
    j[1] = hn::BitCast(d32, hn::InterleaveUpper(d64, lo01, lo23));
    j[2] = hn::BitCast(d32, hn::InterleaveLower(d64, hi01, hi23));
    j[3] = hn::BitCast(d32, hn::InterleaveUpper(d64, hi01, hi23));
  }
};

template <int R>
void RowGroup(const uint8_t* w, const QuantizedX& x, float* y, int64_t cols, int64_t r) {
  PlaneRowGroup<Q1_0Planes, R>(w, x, y, cols, r);
}

// QuantizedX::offset where RowGroup reads it: the codes permuted per weight block (byte 128wb + 16t + j = code 128wb + 8j + t).
void ActivationOffsets(const int8_t* q, int64_t n, int32_t* offset) {
  PlaneActivationOffsets<Q1_0Planes>(q, n, offset);
}

#else  // Highway's scalar and emulated targets: plain loops

// Σ q over the set bits (element k: bit k % 8 of bits[k / 8]) of one activation block's 32 codes.
inline int32_t SetSum(const uint8_t* bits, const int8_t* q) {
  int32_t set = 0;
  for (int k = 0; k < 32; ++k) set += (bits[k / 8] >> (k % 8) & 1) * q[k];
  return set;
}

template <int R>
void RowGroup(const uint8_t* w, const QuantizedX& x, float* y, int64_t cols, int64_t r) {
  const int64_t n_wb = cols / kBlockElems;
  const int64_t row_bytes = n_wb * kBlockBytes;
  float acc[R];
  for (int i = 0; i < R; ++i) acc[i] = 0.0f;
  for (int64_t wb = 0; wb < n_wb; ++wb) {
    for (int i = 0; i < R; ++i) {
      const uint8_t* block = w + (r + i) * row_bytes + wb * kBlockBytes;
      uint16_t d_bits;
      std::memcpy(&d_bits, block, 2);  // little-endian host
      const float d = F16ToF32(d_bits);
      for (int64_t s = 0; s < kSub; ++s) {
        const int64_t b = wb * kSub + s;
        const int32_t set = SetSum(block + 2 + 4 * s, x.q + b * 32);  // Σ ±q = 2·set − Σq
        const float sc = d * x.d[b];
        acc[i] += sc * static_cast<float>(2 * set - x.sum[b]);
      }
    }
  }
  for (int i = 0; i < R; ++i) y[r + i] = acc[i];
}

void ActivationOffsets(const int8_t*, int64_t, int32_t*) {}  // the integer loops start from 0
#endif  // KVQ_QUANT_ROWS_LANES

#endif  // HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2

void QuantRows(const uint8_t* w, const QuantizedX& x, float* y, int64_t cols, int64_t r0, int64_t r1) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) RowGroup<4>(w, x, y, cols, r);
  for (; r < r1; ++r) RowGroup<1>(w, x, y, cols, r);
}

#ifndef KVQ_Q1_0_HAS_LUT
constexpr int64_t kOffsetBytesPerElem = 1;
#endif

// Each 16-row group of the repacked layout copied back to plain rows (repack.h) and run through
// QuantRows for every token: this target's row-kernel bits. What targets without the lookup-table
// kernel run, and AVX3_DL for a block of tokens (prefill), where one copy serves every token and
// the row kernel reads each token's cols bytes of codes instead of its 8·cols bytes of tables.
void CopyBackRows(const uint8_t* w, const QuantizedX& x0, int64_t n_tokens, float* y, int64_t y_stride,
                  int64_t cols, int64_t r0, int64_t r1) {
  const int64_t n_wb = cols / kBlockElems;
  const int64_t row_bytes = n_wb * kBlockBytes;
  const int64_t n_blocks = cols / 32;
  thread_local std::vector<uint8_t> plain;  // [16][row_bytes]
  plain.resize(16 * row_bytes);
  for (int64_t r = r0; r < r1; r += 16) {
    const uint8_t* g = w + r * row_bytes;
    for (int64_t wb = 0; wb < n_wb; ++wb) {
      const uint8_t* blk = g + weights_q1_0::RepackedBlockAt(wb, n_wb) * 16 * kBlockBytes;
      for (int64_t j = 0; j < 16; ++j) {
        uint8_t* dst = plain.data() + j * row_bytes + wb * kBlockBytes;
        std::memcpy(dst, blk + 2 * j, 2);
        for (int64_t k = 0; k < kSub; ++k) std::memcpy(dst + 2 + 4 * k, blk + 32 + 64 * k + 4 * j, 4);
      }
    }
    for (int64_t t = 0; t < n_tokens; ++t) {
      const QuantizedX x = {.q = x0.q + t * cols, .d = x0.d + t * n_blocks, .sum = x0.sum + t * n_blocks,
                            .offset = x0.offset + t * (cols / 4 * kOffsetBytesPerElem)};
      QuantRows(plain.data(), x, y + t * y_stride + r, cols, 0, 16);
    }
  }
}

// WeightKernels::interleaved_rows. The same bits either way (the row kernel's), so the choice by
// n_tokens changes none (MatMul = n_tokens MatVec calls, bit for bit).
void InterleavedRows(const uint8_t* w, const QuantizedX& x0, int64_t n_tokens, float* y, int64_t y_stride,
                     int64_t cols, int64_t r0, int64_t r1) {
#ifdef KVQ_Q1_0_HAS_LUT
  constexpr int64_t kLookupMaxTokens = 4;  // 4 tokens' tables (32·cols bytes) stay in L2 beside a group
  if (n_tokens <= kLookupMaxTokens) return LookupRows(w, x0, n_tokens, y, y_stride, cols, r0, r1);
#endif
  CopyBackRows(w, x0, n_tokens, y, y_stride, cols, r0, r1);
}
#undef KVQ_Q1_0_HAS_LUT

}  // namespace q1_0_detail

const WeightKernels& Q1_0WeightKernelsHere() {
  static const WeightKernels kKernels = {
      .target = hwy::TargetName(HWY_TARGET),
      .rows = nullptr,
      .activation_offsets = &q1_0_detail::ActivationOffsets,
      .quant_rows = &q1_0_detail::QuantRows,
      .interleaved_rows = &q1_0_detail::InterleavedRows,
      .offset_bytes_per_elem = q1_0_detail::kOffsetBytesPerElem,
  };
  return kKernels;
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::weights_q1_0 {
HWY_EXPORT(Q1_0WeightKernelsHere);
const WeightKernels& Kernels() {
  const WeightKernels& k = HWY_DYNAMIC_DISPATCH(Q1_0WeightKernelsHere)();
#if HWY_ARCH_X86 && (HWY_TARGETS & HWY_AVX3)
  // Highway's AVX3_DL check does not ask for GFNI, which that target's kernels use (every CPU with
  // AVX3_DL so far has it); without it, the AVX3 kernels.
  if (std::strcmp(k.target, hwy::TargetName(HWY_AVX3_DL)) == 0 && !__builtin_cpu_supports("gfni")) {
    return N_AVX3::Q1_0WeightKernelsHere();
  }
#endif
  return k;
}
bool RepackPays() { return Kernels().offset_bytes_per_elem > 1; }  // only the lookup-table kernels ask for tables
}  // namespace kvq::weights_q1_0
#endif
