// Q1_0's lookup-table kernel for the repacked layout (MatrixLayout::kInterleaved16, repack.h) on
// AVX3_DL with GFNI: the tables of partial sums built once per token and the 16-row-group kernel
// that reads them (q1_0.h, "Repacked"). Per-target bodies for q1_0_kernels.cc (include after
// foreach_target.h; this file opens its own namespaces); other targets get nothing from it.
#if defined(KVQ_WEIGHTS_Q1_0_LOOKUP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVQ_WEIGHTS_Q1_0_LOOKUP_INL_H_
#undef KVQ_WEIGHTS_Q1_0_LOOKUP_INL_H_
#else
#define KVQ_WEIGHTS_Q1_0_LOOKUP_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "weights/q1_0/q1_0.h"
#include "weights/weight_type.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {
namespace q1_0_detail {

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3_DL
using weights_q1_0::kBlockBytes;
using weights_q1_0::kBlockElems;
constexpr int64_t kLookupSub = kBlockElems / 32;  // activation blocks per weight block

// KVQ_MATVEC_X86_ATTR (quant_rows-inl.h) and GFNI, which Highway's AVX3_DL target string lacks.
#if defined(__clang__)
#define KVQ_Q1_0_GFNI_ATTR __attribute__((target(HWY_TARGET_STR ",avx512vnni,gfni")))
#else
#define KVQ_Q1_0_GFNI_ATTR __attribute__((target("avx512vnni,no-avxvnni,gfni")))
#endif

// ---- Lookup tables for the repacked layout (MatrixLayout::kInterleaved16, repack.h) ----
// A code q ∈ [−127, 127] is 16·h + l with l = q & 15 ∈ [0, 15] and h = q >> 4 ∈ [−8, 7] (exact).
// Per activation block b (32 codes) and byte position i < 4 of a row's 4 code bytes (elements
// 8i .. 8i+7 of the block), the nibble half u ∈ {0: bits 0-3, 1: bits 4-7} covers the 4 codes
// 8i + 4u + m (m < 4). Tables of block b, at byte kTableBytes·b after the permuted codes:
//   [u][part][16i + n], part 0 = 2·Σ_{m: bit m of n} l, part 1 = 2·Σ_{m: bit m of n} h
// (2·Σ l ∈ [0, 120] read as unsigned bytes, 2·Σ h ∈ [−64, 56] as signed: both exact in a byte).
// One vpermb of a table by the index byte 16i + (nibble) then gives, per weight byte, twice the
// partial sums over its 4 set bits. The two nibble halves' part 0 bytes are added (≤ 240: still
// exact as unsigned bytes), and their part 1 bytes ([−128, 112]: exact as signed ones); vpdpbusd
// by 1 (part 0) and by 16 (part 1) then adds 2·Σ_{bit set} q, and started from −Σq the lane ends
// at I_b = Σ ±q exactly. (Adding the bytes first halves the dots, each a 5-cycle step of the
// lane's dependency chain; the integers are the same.)
constexpr int64_t kTableBytes = 256;  // per activation block: [2][2][64]
constexpr int64_t kOffsetBytesPerElem =
    1 + kTableBytes / 32;  // the permuted codes, then the tables

// LookupTables' permute indices and masks, built at compile time (not per call).
struct TableIndices {
  alignas(64) uint8_t idx[2][4][64];  // [u][m][entry 16i + n] = 8i + 4u + m
  uint64_t mask[4];                   // [m] bit e set: bit m of e % 16
};
constexpr TableIndices kTableIndices = [] {
  TableIndices r{};
  for (int u = 0; u < 2; ++u) {
    for (int m = 0; m < 4; ++m) {
      for (int e = 0; e < 64; ++e) r.idx[u][m][e] = static_cast<uint8_t>(8 * (e / 16) + 4 * u + m);
    }
  }
  for (int m = 0; m < 4; ++m) {
    for (int e = 0; e < 64; ++e) r.mask[m] |= static_cast<uint64_t>((e % 16) >> m & 1) << e;
  }
  return r;
}();

// tables [n / 32][2][2][64] (above) from the codes q [n] of one token: per table 4 masked byte
// permutes of the block's doubled l or h (vpermb picks code 8i + 4u + m into entry 16i + n where
// bit m of n is set, 0 elsewhere) and 3 byte adds, none of which can wrap.
KVQ_Q1_0_GFNI_ATTR void LookupTables(const int8_t* q, int64_t n, uint8_t* tables) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const __m512i codes =
        _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * b)));
    const __m512i l = _mm512_and_si512(codes, _mm512_set1_epi8(15));
    // (q + 128) >> 4 = h + 8 (l < 16): a 16-bit shift, the bits from the next byte masked off.
    const __m512i h8 = _mm512_and_si512(
        _mm512_srli_epi16(_mm512_xor_si512(codes, _mm512_set1_epi8(static_cast<char>(0x80))), 4),
        _mm512_set1_epi8(15));
    const __m512i part[2] = {_mm512_add_epi8(l, l),
                             _mm512_sub_epi8(_mm512_add_epi8(h8, h8), _mm512_set1_epi8(16))};
    for (int u = 0; u < 2; ++u) {
      for (int p = 0; p < 2; ++p) {
        __m512i t = _mm512_setzero_si512();
        for (int m = 0; m < 4; ++m) {
          const __m512i idx = _mm512_load_si512(kTableIndices.idx[u][m]);
          t = _mm512_add_epi8(t, _mm512_maskz_permutexvar_epi8(
                                     _cvtu64_mask64(kTableIndices.mask[m]), idx, part[p]));
        }
        _mm512_storeu_si512(tables + kTableBytes * b + 128 * u + 64 * p, t);
      }
    }
  }
}

// Repacked (repack.h) Q1_0, G ≤ 4 consecutive 16-row groups (g0, group g at g·16·row_bytes) for one
// token -> y[0 .. 16G). Per vector of 16 rows × 32 weights one shift, two ternary-logic ops (the
// index bytes 16i + nibble), 4 table permutes, 2 byte adds and 2 byte dots (the tables above) make
// each row's I_b exactly; the G groups share each table load (read from L1 or L2 once per G
// vectors: loading them per vector bound this kernel more than its arithmetic did). The float
// operations are the row kernel's on the same values, lane for lane: the row kernel's lane 4L + k
// of row j (weight blocks wb ≡ L mod 4, activation block 4wb + k) is lane j of a vector here. The
// lanes are visited L by L, each one's blocks in the row kernel's order, so only 4 accumulators per
// group are live (G·4 registers); each lane starts at +0 (a lane with no block stays +0, as the row
// kernel's lanes past a short last group do, an exact sum of ±0 terms), and the 16 are summed in
// the order of _mm512_reduce_add_ps (GCC's: lane ℓ + 8 onto ℓ, then ℓ + 4, then 2, then 1): every
// row's bits equal the row kernel's (RowGroup, q1_0_kernels.cc) on the plain rows, whatever G. Each
// pass reads its G groups' blocks front to back (RepackedBlockAt lays them out in pass order), so
// the hardware prefetchers stream them; no software prefetch (one into L1 of the next G groups
// overflowed L1 beside the tables, one into L2 was no faster than none once the passes read
// sequentially: docs/performance.md).
template <int G>
KVQ_Q1_0_GFNI_ATTR void InterleavedGroups(const uint8_t* g0, const QuantizedX& x, int64_t n_wb,
                                          float* y) {
  constexpr int64_t kGroupBlock = kBlockBytes * 16;  // one weight block of 16 rows
  const int64_t group_bytes = n_wb * kGroupBlock;
  const uint8_t* tables = reinterpret_cast<const uint8_t*>(x.offset) + n_wb * kBlockElems;
  const __m512i nibble = _mm512_set1_epi8(15);
  const __m512i sel = _mm512_set1_epi32(0x30201000);  // byte 4j + i: 16i
  const __m512i ones = _mm512_set1_epi8(1);
  const __m512i sixteen = _mm512_set1_epi8(16);
  alignas(64) float lanes[G][16][16];  // [group][row kernel lane 4L + k][row j]
  for (int64_t L = 0; L < 4; ++L) {
    __m512 acc[G][kLookupSub];  // [group][k], lane j = row j
    for (int g = 0; g < G; ++g) {
      for (int k = 0; k < kLookupSub; ++k) acc[g][k] = _mm512_setzero_ps();
    }
    // The pass's blocks lie one after another from `first` on (RepackedBlockAt).
    const uint8_t* first = g0 + weights_q1_0::RepackedBlockAt(L, n_wb) * kGroupBlock;
    for (int64_t wb = L; wb < n_wb; wb += 4) {
      const uint8_t* at_wb = first + (wb / 4) * kGroupBlock;  // group 0's block wb
      __m512 dw[G];  // [group], lane j: row j's d_w of weight block wb
      for (int g = 0; g < G; ++g) {
        dw[g] = _mm512_cvtph_ps(_mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(at_wb + g * group_bytes)));
      }
#pragma GCC unroll 4
      for (int k = 0; k < kLookupSub; ++k) {
        const int64_t b = kLookupSub * wb + k;
        const uint8_t* t = tables + kTableBytes * b;
        const __m512i t0 = _mm512_loadu_si512(t);
        const __m512i t1 = _mm512_loadu_si512(t + 64);
        const __m512i t2 = _mm512_loadu_si512(t + 128);
        const __m512i t3 = _mm512_loadu_si512(t + 192);
        const __m512i neg_sum = _mm512_set1_epi32(-x.sum[b]);
        const __m512 dx = _mm512_set1_ps(x.d[b]);
#pragma GCC unroll 4
        for (int g = 0; g < G; ++g) {
          // byte 4j + i: row j's qs[4k + i]
          const __m512i z =
              _mm512_loadu_si512(at_wb + g * group_bytes + 32 + 64 * k);
          // (z & 15) | 16i and ((z >> 4) & 15) | 16i: ternary-logic 0xEA is (A & B) | C.
          const __m512i lo = _mm512_ternarylogic_epi32(z, nibble, sel, 0xEA);
          const __m512i hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(z, 4), nibble, sel, 0xEA);
          const __m512i part0 =  // 2·Σ l of both nibble halves, ≤ 240
              _mm512_add_epi8(_mm512_permutexvar_epi8(lo, t0), _mm512_permutexvar_epi8(hi, t2));
          const __m512i part1 =  // 2·Σ h of both nibble halves, in [−128, 112]
              _mm512_add_epi8(_mm512_permutexvar_epi8(lo, t1), _mm512_permutexvar_epi8(hi, t3));
          const __m512i dot =
              _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(neg_sum, part0, ones), sixteen, part1);
          acc[g][k] = _mm512_fmadd_ps(_mm512_mul_ps(dw[g], dx), _mm512_cvtepi32_ps(dot), acc[g][k]);
        }
      }
    }
    for (int g = 0; g < G; ++g) {
      for (int k = 0; k < kLookupSub; ++k) _mm512_store_ps(lanes[g][4 * L + k], acc[g][k]);
    }
  }
  for (int g = 0; g < G; ++g) {
    __m512 s8[8];
    for (int i = 0; i < 8; ++i) {
      s8[i] = _mm512_add_ps(_mm512_load_ps(lanes[g][8 + i]), _mm512_load_ps(lanes[g][i]));
    }
    __m512 s4[4];
    for (int i = 0; i < 4; ++i) s4[i] = _mm512_add_ps(s8[4 + i], s8[i]);
    const __m512 s0 = _mm512_add_ps(s4[0], s4[2]);
    const __m512 s1 = _mm512_add_ps(s4[1], s4[3]);
    _mm512_storeu_ps(y + 16 * g, _mm512_add_ps(s0, s1));
  }
}

// Rows [r0, r1) (whole groups) × n_tokens by the lookup tables, up to 4 groups at a time, each
// block of groups meeting every token while it is in cache.
KVQ_Q1_0_GFNI_ATTR void LookupRows(const uint8_t* w, const QuantizedX& x0, int64_t n_tokens,
                                   float* y, int64_t y_stride, int64_t cols, int64_t r0,
                                   int64_t r1) {
  const int64_t n_wb = cols / kBlockElems;
  const int64_t row_bytes = n_wb * kBlockBytes;
  const int64_t n_blocks = cols / 32;
  alignas(64) float out[64];  // [row of the block of groups]
  for (int64_t r = r0; r < r1;) {
    const int64_t groups = std::min<int64_t>(4, (r1 - r) / 16);
    for (int64_t t = 0; t < n_tokens; ++t) {
      const QuantizedX x = {.q = x0.q + t * cols,
                            .d = x0.d + t * n_blocks,
                            .sum = x0.sum + t * n_blocks,
                            .offset = x0.offset + t * (cols / 4 * kOffsetBytesPerElem)};
      const uint8_t* g0 = w + r * row_bytes;
      switch (groups) {
        case 4:
          InterleavedGroups<4>(g0, x, n_wb, out);
          break;
        case 3:
          InterleavedGroups<3>(g0, x, n_wb, out);
          break;
        case 2:
          InterleavedGroups<2>(g0, x, n_wb, out);
          break;
        default:
          InterleavedGroups<1>(g0, x, n_wb, out);
          break;
      }
      std::memcpy(y + t * y_stride + r, out, sizeof(float) * 16 * groups);
    }
    r += 16 * groups;
  }
}

#endif  // HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3_DL

}  // namespace q1_0_detail
}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
