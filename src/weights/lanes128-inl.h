// Per-target 128-bit lane helpers (WebAssembly SIMD128, x86 SSE4) shared by the row kernels of
// the block types (quant_rows-inl.h) and of the K-quants (kquant_rows-inl.h): exact integer pair
// dots and lane sums, and four rows' f16 scales. Include after foreach_target.h; this file opens
// its own namespaces and defines nothing on other targets.
#if defined(KVQ_WEIGHTS_LANES128_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVQ_WEIGHTS_LANES128_INL_H_
#undef KVQ_WEIGHTS_LANES128_INL_H_
#else
#define KVQ_WEIGHTS_LANES128_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>
#include <cstring>

#include "base/float_codes.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

#if HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128 && !(HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2)
namespace hn = hwy::HWY_NAMESPACE;
using QrI16 = hn::Full128<int16_t>;  // 8 lanes
using QrI32 = hn::Full128<int32_t>;  // 4 lanes
using QrF32 = hn::Full128<float>;    // 4 lanes

// Lane k = a[2k]·b[2k] + a[2k+1]·b[2k+1] in int32, exact unless both pairs are −2^15·−2^15
// (WebAssembly: i32x4.dot_i16x8_s; x86: pmaddwd).
inline hn::Vec<QrI32> PairDots(hn::Vec<QrI16> a, hn::Vec<QrI16> b) {
#if HWY_TARGET == HWY_WASM
  return hn::Vec<QrI32>{wasm_i32x4_dot_i16x8(a.raw, b.raw)};
#elif HWY_ARCH_X86
  return hn::Vec<QrI32>{_mm_madd_epi16(a.raw, b.raw)};
#else
  const QrI32 d32;
  hn::Vec<QrI32> odd = hn::Zero(d32);
  const auto even = hn::ReorderWidenMulAccumulate(d32, a, b, hn::Zero(d32), odd);
  return hn::RearrangeToOddPlusEven(even, odd);
#endif
}

// Four rows' int32 lanes -> lane i = Σ of l_i's lanes (exact): [l0_0+l0_2, l1_0+l1_2, l0_1+l0_3,
// l1_1+l1_3] and the same for rows 2, 3, then the 64-bit halves paired.
inline hn::Vec<QrI32> SumLanesOfFour(hn::Vec<QrI32> l0, hn::Vec<QrI32> l1, hn::Vec<QrI32> l2, hn::Vec<QrI32> l3) {
  const QrI32 d32;
  const hn::Full128<int64_t> d64;
  const auto p01 = hn::Add(hn::InterleaveLower(d32, l0, l1), hn::InterleaveUpper(d32, l0, l1));
  const auto p23 = hn::Add(hn::InterleaveLower(d32, l2, l3), hn::InterleaveUpper(d32, l2, l3));
  const auto h01 = hn::BitCast(d64, p01), h23 = hn::BitCast(d64, p23);
  return hn::Add(hn::BitCast(d32, hn::InterleaveLower(d64, h01, h23)), hn::BitCast(d32, hn::InterleaveUpper(d64, h01, h23)));
}

// Lane k = v[2k] + v[2k+1], exact (WebAssembly: one extadd; SSSE3: one pmaddubsw by 1).
inline hn::Vec<QrI16> PairSums(hn::Vec<hn::Full128<int8_t>> v) {
#if HWY_TARGET == HWY_WASM
  return hn::Vec<QrI16>{wasm_i16x8_extadd_pairwise_i8x16(v.raw)};
#elif HWY_ARCH_X86
  return hn::Vec<QrI16>{_mm_maddubs_epi16(_mm_set1_epi8(1), v.raw)};
#else
  const auto w = hn::BitCast(QrI16(), v);
  return hn::Add(hn::ShiftRight<8>(w), hn::ShiftRight<8>(hn::ShiftLeft<8>(w)));
#endif
}

// Lane k = v[2k] + v[2k+1] in int32, exact (WebAssembly: one extadd; x86: one pmaddwd by 1).
inline hn::Vec<QrI32> WidenSum(hn::Vec<QrI16> v) {
#if HWY_TARGET == HWY_WASM
  return hn::Vec<QrI32>{wasm_i32x4_extadd_pairwise_i16x8(v.raw)};
#elif HWY_ARCH_X86
  return hn::Vec<QrI32>{_mm_madd_epi16(v.raw, _mm_set1_epi16(1))};
#else
  const auto w = hn::BitCast(QrI32(), v);
  return hn::Add(hn::ShiftRight<16>(w), hn::ShiftRight<16>(hn::ShiftLeft<16>(w)));
#endif
}

// Four rows' f16 at rows[i] + at (little-endian host) in f32, lane i.
HWY_INLINE hn::Vec<QrF32> FourScales(const uint8_t* const* rows, int64_t at) {
  alignas(16) float f[4];
  for (int i = 0; i < 4; ++i) {
    uint16_t bits;
    std::memcpy(&bits, rows[i] + at, 2);
    f[i] = F16ToF32(bits);
  }
  return hn::Load(QrF32(), f);
}

#endif  // a 128-bit target

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
