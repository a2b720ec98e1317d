// fp8-e4m3 SIMD kernels for every compiled target; see format/row_kernels-inl.h.
// Decoding trick: an E4M3 code S.EEEE.MMM placed as f16 bits S.0EEEE.MMM0000000 is the same
// number divided by 2^8 (f16's exponent bias is 15, E4M3's is 7), subnormals included; so one
// u8 -> u16 shift and a hardware f16 -> f32 conversion give E4M3(c) / 2^8 exactly, and RowScale,
// 2^(e + 8) (exact), restores E4M3(c) · 2^e as the scalar reference computes it.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "formats/fp8_e4m3/fp8_e4m3_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <bit>

#include "base/float_codes.h"
#include "formats/fp8_e4m3/fp8_e4m3.h"
#include "formats/row_kernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

// Keys (kGrouped: rows of one 32-row group, an exponent per head) or values (one row per
// block, `stride_bytes` apart, one exponent per row); see fp8_e4m3.h for both layouts.
template <bool kGrouped>
struct Fp8E4m3Reader {
  struct Row {
    const uint8_t* codes;  // this row's head_dim codes of the head
    float scale;           // 2^(e + 8)
  };
  static Row At(const RowTile& t, int32_t i, int32_t kv_head, const CodecArgs& a) {
    const int64_t d = a.shape.head_dim;
    const uint8_t* exponent;
    const uint8_t* codes;
    if constexpr (kGrouped) {
      exponent = t.block + kv_head * (1 + kFp8KeyGroupRows * d);
      codes = exponent + 1 + (t.first_row + i) * d;
    } else {
      exponent = TileRow(t, i);
      codes = exponent + 1 + kv_head * d;
    }
    // b + 8 <= 254 (b <= 246): 2^(b − 127 + 8) is a normal f32, built from its bits.
    return {codes, std::bit_cast<float>(static_cast<uint32_t>(exponent[0] + 8) << 23)};
  }
  template <class D>
  static hn::Vec<D> Load(D d, const Row& r, int32_t j, const CodecArgs&) {
    const hn::Rebind<uint8_t, D> du8;
    const hn::Rebind<uint16_t, D> du16;
    const hn::Rebind<hwy::float16_t, D> df16;
    const auto w = hn::PromoteTo(du16, hn::LoadU(du8, r.codes + j));
    const auto h = hn::Or(hn::ShiftLeft<8>(hn::And(w, hn::Set(du16, 0x80))),
                          hn::ShiftLeft<7>(hn::And(w, hn::Set(du16, 0x7F))));
    return hn::PromoteTo(d, hn::BitCast(df16, h));  // E4M3 value / 2^8; RowScale restores it
  }
  static float Scalar(const Row& r, int32_t j, const CodecArgs&) {
    return E4m3ToF32(r.codes[j]) * 0x1p-8f;  // exact
  }
  static float RowScale(const Row& r, const CodecArgs&) { return r.scale; }
};

const CodecKernels& Fp8E4m3KeyKernelsHere() { return MakeKernels<Fp8E4m3Reader<true>>(); }
const CodecKernels& Fp8E4m3ValueKernelsHere() { return MakeKernels<Fp8E4m3Reader<false>>(); }

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq {
HWY_EXPORT(Fp8E4m3KeyKernelsHere);
HWY_EXPORT(Fp8E4m3ValueKernelsHere);
const CodecKernels& Fp8E4m3KeyKernels() { return HWY_DYNAMIC_DISPATCH(Fp8E4m3KeyKernelsHere)(); }
const CodecKernels& Fp8E4m3ValueKernels() { return HWY_DYNAMIC_DISPATCH(Fp8E4m3ValueKernelsHere)(); }
}  // namespace kvq
#endif
