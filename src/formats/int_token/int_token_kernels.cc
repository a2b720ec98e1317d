// int8 / int4 / int2 per-token SIMD kernels for every compiled target; see row_kernels-inl.h.
// A chunk decodes as (raw − 2^(b−1)) · s exactly as the scalar reference does (the subtraction is
// exact in f32), so SIMD and scalar differ only in how the dot product is summed. int8 and int4
// keys also have integer scores (formats/int_score.h), handed out as `score` unless
// GetScoreArithmetic() is kF32.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "formats/int_token/int_token_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "base/float_codes.h"
#include "formats/codec_helpers.h"
#include "formats/int_score.h"
#include "formats/int_token/int_token.h"
#include "formats/row_kernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {

template <int kBits>
struct IntTokenReader {
  static constexpr float kOffset = static_cast<float>(1 << (kBits - 1));
  struct Row {
    const uint8_t* codes;
    float s;  // the head row's f16 scale: RowScale
  };
  static Row At(const RowTile& t, int32_t i, int32_t kv_head, const CodecArgs& a) {
    const int64_t head_bytes = 2 + static_cast<int64_t>(a.shape.head_dim) * kBits / 8;
    const uint8_t* p = TileRow(t, i) + kv_head * head_bytes;
    return {p + 2, F16ToF32(format_internal::LoadU16(p))};
  }
  // raw − 2^(b−1) as f32: subtracted in 8-bit lanes (wrapping), read back as signed bytes and
  // sign-extended, so no float op is spent on it; the scale s is applied per row (RowScale).
  template <class D>
  static hn::Vec<D> Load(D d, const Row& r, int32_t j, const CodecArgs&) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    if constexpr (kBits == 4 && hn::MaxLanes(D()) == 16) return LoadInt4x16(r.codes + j / 2);
#endif
    const hn::Rebind<uint8_t, D> du8;
    const hn::Rebind<int8_t, D> di8;
    const hn::Rebind<int32_t, D> di32;
    const auto raw = UnpackCodes<kBits>(d, r.codes + j * kBits / 8);
    const auto centred = hn::BitCast(di8, hn::Sub(raw, hn::Set(du8, static_cast<uint8_t>(kOffset))));
    return hn::ConvertTo(d, hn::PromoteTo(di32, centred));
  }
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  // 16 int4 codes (8 bytes at p) as raw − 8 in f32: three shuffle/shift ops instead of the
  // generic path's eight widen/mask/shift/or/subtract/extend/convert steps, which made the value
  // accumulation of int4 cost more than f16's. Lane k takes the 32-bit word holding nibble k
  // (word k / 8) shifted right by 4·(k mod 8), so the nibble sits in bits 0..3, the only index
  // bits vpermps reads; the table holds n − 8 for n = 0..15. The values are exactly those of the
  // generic path (small integers are exact in f32), so no bit of any result changes.
  static hn::Vec<hn::CappedTag<float, 16>> LoadInt4x16(const uint8_t* p) {
    const __m512i word_of_lane = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i shift_of_lane = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    const __m512 centred = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    const __m512i bytes = _mm512_zextsi128_si512(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m512i index = _mm512_srlv_epi32(_mm512_permutexvar_epi32(word_of_lane, bytes), shift_of_lane);
    return hn::Vec<hn::CappedTag<float, 16>>{_mm512_permutexvar_ps(index, centred)};
  }
#endif
  static float Scalar(const Row& r, int32_t j, const CodecArgs&) {
    return static_cast<float>(format_internal::UnpackCode(r.codes, j, kBits)) - kOffset;
  }
  static float RowScale(const Row& r, const CodecArgs&) { return r.s; }
};

// The f32 kernels with score_int set, and score = score_int unless `arithmetic` is kF32.
template <int kBits>
const CodecKernels& IntTokenKernels(ScoreArithmetic arithmetic) {
  using ScoreFn = decltype(CodecKernels::score);
  static constexpr ScoreFn kInt = kBits == 8   ? &int_score::Int8TokenScore
                                  : kBits == 4 ? &int_score::Int4TokenScore
                                               : nullptr;
  static const CodecKernels kF32Scores = [] {
    CodecKernels k = MakeKernels<IntTokenReader<kBits>>();
    k.score_int = kInt;
    return k;
  }();
  static const CodecKernels kIntScores = [] {
    CodecKernels k = kF32Scores;
    if (kInt != nullptr) {
      k.score = kInt;
      k.int8_scores = true;  // `kvq bench attention` then holds the score half to the int8 dot peak
      // The query quantised once per attention call instead of once per tile.
      k.prepared_head_bytes = &int_score::PreparedQueryHeadBytes;
      k.prepare_query = kBits == 8 ? &int_score::Int8PrepareQuery : &int_score::Int4PrepareQuery;
      k.score_prepared = kBits == 8 ? &int_score::Int8ScorePrepared : &int_score::Int4ScorePrepared;
    }
    return k;
  }();
  return arithmetic == ScoreArithmetic::kF32 ? kF32Scores : kIntScores;
}

const CodecKernels& Int8KernelsHere(ScoreArithmetic a) { return IntTokenKernels<8>(a); }
const CodecKernels& Int4KernelsHere(ScoreArithmetic a) { return IntTokenKernels<4>(a); }
const CodecKernels& Int2KernelsHere(ScoreArithmetic a) { return IntTokenKernels<2>(a); }

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq {
HWY_EXPORT(Int8KernelsHere);
HWY_EXPORT(Int4KernelsHere);
HWY_EXPORT(Int2KernelsHere);
const CodecKernels& Int8Kernels() { return HWY_DYNAMIC_DISPATCH(Int8KernelsHere)(GetScoreArithmetic()); }
const CodecKernels& Int4Kernels() { return HWY_DYNAMIC_DISPATCH(Int4KernelsHere)(GetScoreArithmetic()); }
const CodecKernels& Int2Kernels() { return HWY_DYNAMIC_DISPATCH(Int2KernelsHere)(GetScoreArithmetic()); }
}  // namespace kvq
#endif
