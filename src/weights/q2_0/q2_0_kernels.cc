// Q2_0 row kernels for every compiled target. Per activation block of 32 the weight codes c − 1
// ∈ {−1, 0, 1, 2} are multiplied as the unsigned c ∈ [0, 3] (one byte dot) from a start of −Σq
// (the offset trick); two activation blocks share a weight scale, so per block one FMA by d_x
// and per weight block one FMA by d_w (q2_0.h, "Kernel numerics"). AVX3_DL is compiled for
// vpdpbusd and vpmultishiftqb. 128-bit targets: one code position at a time, four rows together;
// Highway's scalar and emulated targets: a loop, the same integers and f32 operations.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "weights/q2_0/q2_0_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "base/float_codes.h"
#include "weights/q2_0/q2_0.h"
#include "weights/quant_rows-inl.h"  // KVQ_MATVEC_X86_ATTR, kPrefetchBytes, HorizontalSumX86
#include "weights/interleaved_rows-inl.h"  // InterleavedRows, shared with Q4_0 and Q8_0

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {
namespace q2_0_detail {

using weights_q2_0::kBlockBytes;
using weights_q2_0::kBlockElems;
constexpr int64_t kSub = kBlockElems / 32;  // activation blocks per weight block
[[maybe_unused]] constexpr int64_t kChunk = 16;  // weight blocks whose scales are converted together (x86 paths)

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2

#if HWY_TARGET <= HWY_AVX3_DL
// AVX-512 VBMI: one multishift puts each element's 2-bit code at the bottom of its own byte in
// element order (byte m of qword k takes the 8 bits from bit 2·(8k + m) of the block's 8 bytes),
// an AND clears the rest, and vpdpbusd multiplies the unsigned codes c ∈ [0, 3] by q, started
// from the lane's −Σq (QuantizedX::offset): Σ (c − 1)·q, exactly. Measured no faster (thread CPU
// time per matvec, in L2, one core): a whole weight block per 512-bit vector (the two code qwords
// broadcast to the halves, one multishift, AND and vpdpbusd, then one scale product and one FMA
// per 64 weights and row) — half the instructions, but 512-bit ones on two ports instead of three;
// also the block's 16 bytes broadcast to all four 128-bit lanes by one load (slower).
struct Shared {
  __m256i q;  // [32] the activation block's codes
};
KVQ_MATVEC_X86_ATTR inline Shared Prepare(__m256i xv) { return {xv}; }
KVQ_MATVEC_X86_ATTR inline __m256i Dot(const uint8_t* codes, const Shared& xs, __m256i off) {
  uint64_t word;
  std::memcpy(&word, codes, 8);  // little-endian host
  const __m256i ctrl = _mm256_set_epi64x(0x3E3C3A3836343230, 0x2E2C2A2826242220, 0x1E1C1A1816141210,
                                         0x0E0C0A0806040200);
  const __m256i c = _mm256_and_si256(_mm256_multishift_epi64_epi8(ctrl, _mm256_set1_epi64x(static_cast<int64_t>(word))),
                                     _mm256_set1_epi8(3));
  return _mm256_dpbusd_epi32(off, c, xs.q);
}
// Lane l of a block: elements 4l .. 4l+3.
inline int64_t LaneElement(int64_t l, int64_t m) { return 4 * l + m; }
#else
// AVX2 / AVX3: the block's 8 bytes broadcast to 4 qwords, qword k shifted right by 2k and ANDed
// with 3, so byte p = 8k + m holds the code of element 4m + k (a transposed order). The
// activation block is permuted to the same order once per block for all rows (a byte shuffle
// within 128-bit lanes, then a dword permute), and maddubs/madd multiply c ∈ [0, 3] by q
// (|pair| ≤ 2·3·127: no saturation), started from −Σq over each lane's own elements.
struct Shared {
  __m256i q;  // [32] the activation block's codes in the codes' byte order
};
KVQ_MATVEC_X86_ATTR inline Shared Prepare(__m256i xv) {
  // Within each 128-bit lane, dword k gathers the lane's elements 4m' + k (m' = 0..3); then
  // dword l of the result is (lane l % 2, k = l / 2).
  const __m256i within = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                          0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m256i shuffled = _mm256_shuffle_epi8(xv, within);
  return {_mm256_permutevar8x32_epi32(shuffled, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))};
}
KVQ_MATVEC_X86_ATTR inline __m256i Dot(const uint8_t* codes, const Shared& xs, __m256i off) {
  uint64_t word;
  std::memcpy(&word, codes, 8);
  const __m256i c = _mm256_and_si256(
      _mm256_srlv_epi64(_mm256_set1_epi64x(static_cast<int64_t>(word)), _mm256_setr_epi64x(0, 2, 4, 6)),
      _mm256_set1_epi8(3));
  return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(c, xs.q), _mm256_set1_epi16(1)), off);
}
// Lane l = 2k + L of a block: elements 4m + k for m = 4L .. 4L+3 (byte 4l + m' is element
// 4(4L + m') + k).
inline int64_t LaneElement(int64_t l, int64_t m) { return 4 * (4 * (l % 2) + m) + l / 2; }
#endif
constexpr bool kUsesOffset = true;

// R consecutive rows from r, sharing each activation load. Per weight block and row:
// t = Σ_{2 activation blocks} d_x·(int32 lanes → f32), then acc += d_w·t.
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
    // Prefetch kPrefetchBytes ahead in each row into L2, as quant_rows-inl.h does (a prefetch
    // past the matrix never faults; the address is an integer until then).
    for (int i = 0; i < R; ++i) {
      const uintptr_t ahead = reinterpret_cast<uintptr_t>(a[i] + c0 * kBlockBytes) + kPrefetchBytes;
      for (int64_t at = 0; at < kChunk * kBlockBytes; at += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(ahead + at), _MM_HINT_T1);
      }
    }
    alignas(32) float dw[R][kChunk];  // the chunk's weight scales, f32
    for (int i = 0; i < R; ++i) {
      alignas(16) uint16_t half[kChunk] = {};
      for (int64_t j = 0; j < nb; ++j) std::memcpy(&half[j], a[i] + (c0 + j) * kBlockBytes, 2);
      for (int64_t h = 0; h < kChunk; h += 8) {
        _mm256_store_ps(&dw[i][h], _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(half + h))));
      }
    }
    for (int64_t j = 0; j < nb; ++j) {
      const int64_t wb = c0 + j;
      __m256 t[R];
      for (int64_t s = 0; s < kSub; ++s) {
        const int64_t b = wb * kSub + s;  // activation block
        const Shared xs = Prepare(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + b * 32)));
        const __m256i off = kUsesOffset ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.offset + b * 8))
                                        : _mm256_setzero_si256();
        const __m256 dx = _mm256_set1_ps(x.d[b]);
        for (int i = 0; i < R; ++i) {
          const __m256 dot = _mm256_cvtepi32_ps(Dot(a[i] + wb * kBlockBytes + 2 + 8 * s, xs, off));
          t[i] = s == 0 ? _mm256_mul_ps(dx, dot) : _mm256_fmadd_ps(dx, dot, t[i]);
        }
      }
      for (int i = 0; i < R; ++i) acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(dw[i][j]), t[i], acc[i]);
    }
  }
  for (int i = 0; i < R; ++i) y[r + i] = HorizontalSumX86(acc[i]);
}

// QuantizedX::offset as this target's Dot starts its lanes: lane l of block b (offset[8b + l])
// at −Σq over the lane's 4 elements (LaneElement).
void ActivationOffsets(const int8_t* q, int64_t n, int32_t* offset) {
  for (int64_t b = 0; b < n / 32; ++b) {
    for (int64_t l = 0; l < 8; ++l) {
      int32_t sum = 0;
      for (int64_t m = 0; m < 4; ++m) sum += q[32 * b + LaneElement(l, m)];
      offset[8 * b + l] = -sum;
    }
  }
}

#else  // not x86 AVX2 or better: integer dots of 128-bit vectors (SIMD128, SSE4), or plain loops
#if KVQ_QUANT_ROWS_LANES
// Four rows at a time (PlaneRowGroup): the plain loop below on vectors, its bits. The
// integers one code position at a time, as Q1_0's 128-bit kernel takes bit positions: byte j of a
// weight block holds elements 4j + k (bits 2k, 2k+1); a row's 16 code bytes are tested against
// bit 2k and bit 2k + 1 at once, and the codes of elements 4j + k (the activation permuted once per
// token, ActivationOffsets) are kept where each is set and summed in adjacent pairs, so
// J = Σ c·q = Σ_{bit 2k} q + 2·Σ_{bit 2k+1} q (|int16 lane| ≤ 3·4·2·127), exact; one widening pair
// sum leaves activation block 0 in int32 lanes 0, 1 and block 1 in lanes 2, 3, and four rows'
// lanes are transposed and added to one vector per activation block. I_b = J_b − Σq. The
// WebAssembly module's Q2_0 kernel (node build/wasm/kvq-matvec-bench.js --type q2_0).
using I8 = hn::Full128<int8_t>;  // 16 lanes

// PlaneRowGroup's B: planes[k] lane j = code 4j + k of the weight block; a row's 16 code bytes
// tested against bits 2k and 2k + 1, the codes kept where each is set.
struct Q2_0Planes {
  static constexpr int64_t kBlockElems = weights_q2_0::kBlockElems;
  static constexpr int64_t kBlockBytes = weights_q2_0::kBlockBytes;
  static constexpr int64_t kSub = q2_0_detail::kSub;
  static constexpr int kPlanes = 4;  // code positions within a byte
  static constexpr int32_t kJScale = 1;
  // One row's int32 lanes 0 + 1 = J of activation block 0, lanes 2 + 3 = J of block 1.
  static HWY_INLINE hn::Vec<QrI32> RowSums(const uint8_t* codes, const hn::Vec<I8>* planes) {
    const hn::Full128<uint8_t> du8;
    const I8 d8;
    const auto w = hn::LoadU(du8, codes);
    auto low = hn::Zero(QrI16()), high = hn::Zero(QrI16());  // Σ q under each element's bit 0, bit 1
    for (int k = 0; k < 4; ++k) {
      const auto bit0 = hn::TestBit(w, hn::Set(du8, static_cast<uint8_t>(1u << (2 * k))));
      const auto bit1 = hn::TestBit(w, hn::Set(du8, static_cast<uint8_t>(2u << (2 * k))));
      low = hn::Add(low, PairSums(hn::IfThenElseZero(hn::RebindMask(d8, bit0), planes[k])));
      high = hn::Add(high, PairSums(hn::IfThenElseZero(hn::RebindMask(d8, bit1), planes[k])));
    }
    return WidenSum(hn::Add(low, hn::ShiftLeft<1>(high)));
  }
  // lo: [l0_0, l0_1, l1_0, l1_1] (rows 0, 1 of block 0), hi the same of lanes 2, 3 (block 1);
  // then the even and odd lanes of rows 0-1 and 2-3 added: j[s] lane i = row i's J_s.
  static HWY_INLINE void BlockSums(const uint8_t* const* a, int64_t at, const hn::Vec<I8>* planes, hn::Vec<QrI32>* j) {
    const QrI32 d32;
    const hn::Full128<int64_t> d64;
    const auto l0 = hn::BitCast(d64, RowSums(a[0] + at, planes)), l1 = hn::BitCast(d64, RowSums(a[1] + at, planes));
    const auto l2 = hn::BitCast(d64, RowSums(a[2] + at, planes)), l3 = hn::BitCast(d64, RowSums(a[3] + at, planes));
    const auto lo01 = hn::BitCast(d32, hn::InterleaveLower(d64, l0, l1));
    const auto lo23 = hn::BitCast(d32, hn::InterleaveLower(d64, l2, l3));
    const auto hi01 = hn::BitCast(d32, hn::InterleaveUpper(d64, l0, l1));
    const auto hi23 = hn::BitCast(d32, hn::InterleaveUpper(d64, l2, l3));
    j[0] = hn::Add(hn::ConcatEven(d32, lo23, lo01), hn::ConcatOdd(d32, lo23, lo01));
    j[1] = hn::Add(hn::ConcatEven(d32, hi23, hi01), hn::ConcatOdd(d32, hi23, hi01));
  }
};

template <int R>
void RowGroup(const uint8_t* w, const QuantizedX& x, float* y, int64_t cols, int64_t r) {
  PlaneRowGroup<Q2_0Planes, R>(w, x, y, cols, r);
}

// QuantizedX::offset where RowGroup reads it: the codes permuted per weight block (byte 64wb + 16k + j = code 64wb + 4j + k).
void ActivationOffsets(const int8_t* q, int64_t n, int32_t* offset) {
  PlaneActivationOffsets<Q2_0Planes>(q, n, offset);
}

#else  // Highway's scalar and emulated targets: plain loops

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
        const int8_t* q = x.q + b * 32;
        int32_t dot = 0;  // Σ c·q; Σ (c − 1)·q = dot − Σq
        for (int k = 0; k < 32; ++k) dot += (block[2 + 8 * s + k / 4] >> (2 * (k % 4)) & 3) * q[k];
        const float sc = d * x.d[b];
        acc[i] += sc * static_cast<float>(dot - x.sum[b]);
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

// The 16-row interleaved layout (weights/repack.h) for InterleavedRows: vector k's byte 4j + e holds
// row j's codes of elements 16p + 4k + e in its bits 2p, 2p + 1 (p < 4), code + 1 ∈ [0, 3] (the
// stored 2-bit field), so the shared driver unpacks chunk 4p + k by a shift and an AND, as it
// unpacks Q4_0's nibbles.
struct Q2_0Interleaved {
  static constexpr int64_t kBytes = kBlockBytes;
  static constexpr int64_t kElems = kBlockElems;
  static constexpr bool kSigned = false;
  static constexpr int kCodeBits = 2;
  static constexpr int32_t kBias = 1;
  static int32_t CodeScalar(const uint8_t* codes, int64_t j, int64_t m) {
    const uint8_t byte = codes[(m % 16) / 4 * 64 + 4 * j + m % 4];
    return (byte >> (2 * (m / 16)) & 3) - 1;
  }
};

}  // namespace q2_0_detail

const WeightKernels& Q2_0WeightKernelsHere() {
  static const WeightKernels kKernels = {
      .target = hwy::TargetName(HWY_TARGET),
      .rows = nullptr,
      .activation_offsets = &q2_0_detail::ActivationOffsets,
      .quant_rows = &q2_0_detail::QuantRows,
      .interleaved_rows = &InterleavedRows<q2_0_detail::Q2_0Interleaved>,
  };
  return kKernels;
}

// Whether LoadModel should repack Q2_0 for this target (weights_q2_0::RepackPays): where the
// interleaved kernel runs 512-bit vpdpbusd, measured faster than the row kernel there
// (docs/performance.md). The interleaved kernel serves every target, with the same bits on each;
// the 256-bit and scalar targets were not measured, so they keep the plain rows.
bool Q2_0RepackPaysHere() {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3_DL
  return true;
#else
  return false;
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::weights_q2_0 {
HWY_EXPORT(Q2_0WeightKernelsHere);
HWY_EXPORT(Q2_0RepackPaysHere);
const WeightKernels& Kernels() { return HWY_DYNAMIC_DISPATCH(Q2_0WeightKernelsHere)(); }
bool RepackPays() { return HWY_DYNAMIC_DISPATCH(Q2_0RepackPaysHere)(); }
}  // namespace kvq::weights_q2_0
#endif
