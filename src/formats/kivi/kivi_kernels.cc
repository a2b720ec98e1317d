// KIVI SIMD kernels for every compiled target; see format/row_kernels-inl.h. Keys read a
// per-channel scale and min vector beside the codes; values a per-row scale and min. A chunk
// decodes as raw · s + z with a separate multiply and add, exactly as the scalar reference does.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "formats/kivi/kivi_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "base/float_codes.h"
#include "formats/codec_helpers.h"
#include "formats/kivi/kivi.h"
#include "formats/row_kernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

template <int kBits>
struct KiviKeyReader {
  struct Row {
    const uint8_t* params;  // s[head_dim] then z[head_dim], f16
    const uint8_t* codes;   // this row's codes
  };
  static Row At(const RowTile& t, int32_t i, int32_t kv_head, const CodecArgs& a) {
    const int64_t d = a.shape.head_dim;
    const int64_t row_code_bytes = d * kBits / 8;
    const uint8_t* head = t.block + kv_head * (4 * d + kKiviGroupRows * row_code_bytes);
    return {head, head + 4 * d + (t.first_row + i) * row_code_bytes};
  }
  template <class D>
  static hn::Vec<D> Load(D d, const Row& r, int32_t j, const CodecArgs& a) {
    const hn::Rebind<hwy::float16_t, D> df16;
    const auto* s16 = reinterpret_cast<const hwy::float16_t*>(r.params);
    const auto s = hn::PromoteTo(d, hn::LoadU(df16, s16 + j));
    const auto z = hn::PromoteTo(d, hn::LoadU(df16, s16 + a.shape.head_dim + j));
    const auto raw = CodesToFloat(d, UnpackCodes<kBits>(d, r.codes + j * kBits / 8));
    return hn::Add(hn::Mul(raw, s), z);
  }
  static float Scalar(const Row& r, int32_t j, const CodecArgs& a) {
    const float s = F16ToF32(format_internal::LoadU16(r.params + 2 * j));
    const float z = F16ToF32(format_internal::LoadU16(r.params + 2 * (a.shape.head_dim + j)));
    return static_cast<float>(format_internal::UnpackCode(r.codes, j, kBits)) * s + z;
  }
  static float RowScale(const Row&, const CodecArgs&) { return 1.0f; }
};

template <int kBits>
struct KiviValueReader {
  struct Row {
    const uint8_t* codes;
    float s, z;
  };
  static Row At(const RowTile& t, int32_t i, int32_t kv_head, const CodecArgs& a) {
    const int64_t head_bytes = 4 + static_cast<int64_t>(a.shape.head_dim) * kBits / 8;
    const uint8_t* p = TileRow(t, i) + kv_head * head_bytes;
    return {p + 4, F16ToF32(format_internal::LoadU16(p)), F16ToF32(format_internal::LoadU16(p + 2))};
  }
  template <class D>
  static hn::Vec<D> Load(D d, const Row& r, int32_t j, const CodecArgs&) {
    const auto raw = CodesToFloat(d, UnpackCodes<kBits>(d, r.codes + j * kBits / 8));
    return hn::Add(hn::Mul(raw, hn::Set(d, r.s)), hn::Set(d, r.z));
  }
  static float Scalar(const Row& r, int32_t j, const CodecArgs&) {
    return static_cast<float>(format_internal::UnpackCode(r.codes, j, kBits)) * r.s + r.z;
  }
  static float RowScale(const Row&, const CodecArgs&) { return 1.0f; }
};

const CodecKernels& Int4KiviKeyKernelsHere() { return MakeKernels<KiviKeyReader<4>>(); }
const CodecKernels& Int2KiviKeyKernelsHere() { return MakeKernels<KiviKeyReader<2>>(); }
const CodecKernels& Int4KiviValueKernelsHere() { return MakeKernels<KiviValueReader<4>>(); }
const CodecKernels& Int2KiviValueKernelsHere() { return MakeKernels<KiviValueReader<2>>(); }

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq {
HWY_EXPORT(Int4KiviKeyKernelsHere);
HWY_EXPORT(Int2KiviKeyKernelsHere);
HWY_EXPORT(Int4KiviValueKernelsHere);
HWY_EXPORT(Int2KiviValueKernelsHere);
const CodecKernels& Int4KiviKeyKernels() { return HWY_DYNAMIC_DISPATCH(Int4KiviKeyKernelsHere)(); }
const CodecKernels& Int2KiviKeyKernels() { return HWY_DYNAMIC_DISPATCH(Int2KiviKeyKernelsHere)(); }
const CodecKernels& Int4KiviValueKernels() { return HWY_DYNAMIC_DISPATCH(Int4KiviValueKernelsHere)(); }
const CodecKernels& Int2KiviValueKernels() { return HWY_DYNAMIC_DISPATCH(Int2KiviValueKernelsHere)(); }
}  // namespace kvq
#endif
