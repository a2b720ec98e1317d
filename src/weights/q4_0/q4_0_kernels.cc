// Q4_0 row kernels for every compiled target: the block dot product plugged into the
// quantised-activation row driver (weights/quant_rows-inl.h). AVX3_DL is compiled here for its
// vpdpbusd (AVX-512 VNNI).
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "weights/q4_0/q4_0_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "weights/q4_0/q4_0.h"
#include "weights/quant_rows-inl.h"
#include "weights/interleaved_rows-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

// A block's 32 weights map onto the 32 bytes of one 256-bit vector in element order: the 16 low
// nibbles, then the 16 high nibbles, from one 16-byte load broadcast to both halves.
struct Q4_0Block {
  static constexpr int64_t kBytes = 18;
  // The kernels multiply unsigned nibbles n = code + 8, so lanes start at −8·Σq; on VNNI the
  // high half's bytes are 16·n (unshifted), so those lanes start at −128·Σq.
  static int32_t OffsetBias(bool high_half) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3_DL
    return high_half ? 128 : 8;
#else
    (void)high_half;
    return 8;
#endif
  }
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  static KVQ_MATVEC_X86_ATTR inline __m256i Dot(const uint8_t* qs, __m256i xv, __m256i off) {
    const __m256i raw = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
#if KVQ_MATVEC_VNNI
    // Low half: n_lo = code + 8; high half: the byte & 0xF0 = 16·n_hi, unshifted (one AND for
    // both). Lanes 4..7 therefore hold 16·Σ code·q (their offset is −128·Σq): exact integers, and
    // the f32 accumulation of 16× values is 16× the accumulation, bit for bit (a power of two
    // commutes with rounding, barring underflow and overflow), undone by Finish.
    const __m256i nibble_masks = _mm256_set_m128i(_mm_set1_epi8(static_cast<char>(0xF0)), _mm_set1_epi8(0x0F));
    return _mm256_dpbusd_epi32(off, _mm256_and_si256(raw, nibble_masks), xv);
#else
    // The upper half shifted right by 4: n = code + 8 in every byte. maddubs: |n·q| ≤ 15·127,
    // so the i16 pair sums cannot saturate (16·n could: this is why there is a shift here).
    const __m256i nib = _mm256_and_si256(_mm256_srlv_epi64(raw, _mm256_set_epi64x(4, 4, 0, 0)),
                                         _mm256_set1_epi8(0x0F));
    return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(nib, xv), _mm256_set1_epi16(1)), off);
#endif
  }
  // VNNI: lanes 4..7 hold 16× their sums; one multiply by 1/16 per row (exact).
  static KVQ_MATVEC_X86_ATTR inline __m256 Finish(__m256 acc) {
#if KVQ_MATVEC_VNNI
    return _mm256_mul_ps(acc, _mm256_set_ps(0.0625f, 0.0625f, 0.0625f, 0.0625f, 1.0f, 1.0f, 1.0f, 1.0f));
#else
    return acc;
#endif
  }
#else
  // The rows round as the groups do (quant_rows-inl.h): a page holding rows gives native's bits.
  static constexpr bool kGroupArithmetic = true;
  static int32_t DotScalar(const uint8_t* qs, const int8_t* q) {
    int32_t dot = 0;
    for (int j = 0; j < 16; ++j) dot += ((qs[j] & 0x0F) - 8) * q[j] + ((qs[j] >> 4) - 8) * q[j + 16];
    return dot;
  }
#if KVQ_QUANT_ROWS_LANES
  // DotScalar on 128-bit vectors: the codes (nibble − 8) widened to int16 against q16 (elements
  // 8k .. 8k+7 in q16[k]); int32 lanes whose sum is the block's dot.
  static hn::Vec<QrI32> DotLanes(const uint8_t* qs, const hn::Vec<QrI16>* q16) {
    const hn::Full128<int8_t> d8;
    hn::Vec<hn::Full128<int8_t>> lo, hi;
    NibbleCodes(qs, &lo, &hi);
    const auto eight = hn::Set(d8, 8);  // the signed code n − 8
    return CodeDotLanes(hn::Sub(lo, eight), hn::Sub(hi, eight), q16);
  }
#endif
#endif
};

// The 16-row interleaved layout (weights/repack.h) for InterleavedRows.
struct Q4_0Interleaved {
  static constexpr int64_t kBytes = 18;
  static constexpr int64_t kElems = 32;
  static constexpr bool kSigned = false;
  static constexpr int kCodeBits = 4;
  static constexpr int32_t kBias = 8;  // the nibble is code + 8
  static int32_t CodeScalar(const uint8_t* codes, int64_t j, int64_t m) {
    const uint8_t byte = codes[(m % 16) / 4 * 64 + 4 * j + m % 4];
    return (m < 16 ? (byte & 0x0F) : (byte >> 4)) - 8;
  }
};

const WeightKernels& Q4_0WeightKernelsHere() {
  static const WeightKernels kKernels = [] {
    WeightKernels k = MakeQuantKernels<Q4_0Block>();
    k.interleaved_rows = &InterleavedRows<Q4_0Interleaved>;
    return k;
  }();
  return kKernels;
}

// Whether LoadModel repacks Q4_0 for this target (weights_q4_0::RepackPays): where the interleaved
// kernel is x86's (AVX2 or better). Elsewhere it is the portable loop (a std::fma per block and
// row, a library call in WebAssembly), which in the WebAssembly module ran at about a quarter of the
// 128-bit row kernels' speed (`node build/wasm/kvq-matvec-bench.js`, docs/performance.md).
bool Q4_0RepackPaysHere() { return HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2; }

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::weights_q4_0 {
HWY_EXPORT(Q4_0WeightKernelsHere);
HWY_EXPORT(Q4_0RepackPaysHere);
const WeightKernels& Kernels() { return HWY_DYNAMIC_DISPATCH(Q4_0WeightKernelsHere)(); }
bool RepackPays() { return HWY_DYNAMIC_DISPATCH(Q4_0RepackPaysHere)(); }
}  // namespace kvq::weights_q4_0
#endif
