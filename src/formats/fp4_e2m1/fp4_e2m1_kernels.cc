// fp4-e2m1 SIMD kernels for every compiled target; see format/row_kernels-inl.h.
// E2M1 magnitude k = S.EE.M & 7 becomes f32 bits arithmetically: k ≥ 2 is (1 + M/2)·2^(E−1), i.e.
// exponent field (k >> 1) + 126 and mantissa bit 22 = k & 1; k = 1 is 0.5 and k = 0 is 0.
// Chunks of 8 or 16 numbers never straddle a 16-number scale group (CheckShape's rule).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "formats/fp4_e2m1/fp4_e2m1_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "base/float_codes.h"
#include "formats/codec_helpers.h"
#include "formats/fp4_e2m1/fp4_e2m1.h"
#include "formats/row_kernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

struct Fp4E2m1Reader {
  static constexpr int64_t kGroupBytes = 1 + kFp4GroupElems / 2;
  struct Row {
    const uint8_t* row;  // the whole row's block
    int64_t first;       // the head's first element within the row
  };
  static Row At(const RowTile& t, int32_t i, int32_t kv_head, const CodecArgs& a) {
    return {TileRow(t, i), static_cast<int64_t>(kv_head) * a.shape.head_dim};
  }
  template <class D>
  static hn::Vec<D> Load(D d, const Row& r, int32_t j, const CodecArgs&) {
    const int64_t e = r.first + j;
    const uint8_t* g = r.row + (e / kFp4GroupElems) * kGroupBytes;
    const hn::Rebind<int32_t, D> di;
    const auto nib = hn::PromoteTo(di, UnpackCodes<4>(d, g + 1 + (e % kFp4GroupElems) / 2));
    hn::Vec<D> value;
#if HWY_TARGET != HWY_SCALAR
    if constexpr (hn::MaxLanes(D()) == 16) {
      // All 16 E2M1 values fit one vector: one lane permute decodes 16 nibbles.
      alignas(64) static constexpr float kValues[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                                        -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
      value = hn::TableLookupLanes(hn::Load(d, kValues), hn::IndicesFromVec(d, nib));
    } else
#endif
    {
      const auto k = hn::And(nib, hn::Set(di, 7));
      const auto normal = hn::Or(hn::ShiftLeft<23>(hn::Add(hn::ShiftRight<1>(k), hn::Set(di, 126))),
                                 hn::ShiftLeft<22>(hn::And(k, hn::Set(di, 1))));
      auto bits = hn::IfThenElse(hn::Lt(k, hn::Set(di, 2)),
                                 hn::IfThenElseZero(hn::Eq(k, hn::Set(di, 1)), hn::Set(di, 0x3F000000)),
                                 normal);
      bits = hn::Or(bits, hn::ShiftLeft<28>(hn::And(nib, hn::Set(di, 8))));  // sign bit 3 -> 31
      value = hn::BitCast(d, bits);
    }
    return hn::Mul(value, hn::Set(d, E4m3ToF32(g[0])));
  }
  static float Scalar(const Row& r, int32_t j, const CodecArgs&) {
    const int64_t e = r.first + j;
    const uint8_t* g = r.row + (e / kFp4GroupElems) * kGroupBytes;
    const uint32_t nib = format_internal::UnpackCode(g + 1, static_cast<int32_t>(e % kFp4GroupElems), 4);
    return E2m1ToF32(static_cast<uint8_t>(nib)) * E4m3ToF32(g[0]);
  }
  static float RowScale(const Row&, const CodecArgs&) { return 1.0f; }
};

const CodecKernels& Fp4E2m1KernelsHere() { return MakeKernels<Fp4E2m1Reader>(); }

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq {
HWY_EXPORT(Fp4E2m1KernelsHere);
const CodecKernels& Fp4E2m1Kernels() { return HWY_DYNAMIC_DISPATCH(Fp4E2m1KernelsHere)(); }
}  // namespace kvq
#endif
