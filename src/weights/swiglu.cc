// SwiGlu (see ops.h), vectorised: silu(g)·u = g / (1 + exp(−g)) · u with PortableExp
// (simd/portable_exp-inl.h, within a few ulp of std::exp), dispatched per call. It was the largest
// non-matrix cost of a prefill (one scalar std::exp per hidden unit and token: 12% of a 512-token
// prefill of a 1B model). Every operation is lane-wise IEEE
// f32 and PortableExp has no fused multiply-add, so the bits are the same on every SIMD target
// (WebAssembly SIMD128 and HWY_SCALAR, which have no FMA, included).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "weights/swiglu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "simd/portable_exp-inl.h"
#include "weights/ops.h"

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void SwiGluHere(float* gate, const float* up, int64_t n) {
  const hn::CappedTag<float, 8> d;  // 256-bit at most, as the row kernels around it
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto one = hn::Set(d, 1.0f);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto g = hn::LoadU(d, gate + i);
    const auto sig = hn::Div(one, hn::Add(one, PortableExp(d, hn::Neg(g))));
    hn::StoreU(hn::Mul(hn::Mul(g, sig), hn::LoadU(d, up + i)), d, gate + i);
  }
  if (i < n) {  // the tail through one padded vector, so it rounds as the body does
    alignas(32) float g_tail[8] = {}, u_tail[8] = {};
    for (int64_t j = i; j < n; ++j) g_tail[j - i] = gate[j], u_tail[j - i] = up[j];
    const auto g = hn::Load(d, g_tail);
    const auto sig = hn::Div(one, hn::Add(one, PortableExp(d, hn::Neg(g))));
    hn::Store(hn::Mul(hn::Mul(g, sig), hn::Load(d, u_tail)), d, g_tail);
    for (int64_t j = i; j < n; ++j) gate[j] = g_tail[j - i];
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq {
HWY_EXPORT(SwiGluHere);
void SwiGlu(float* gate, const float* up, int64_t n) { HWY_DYNAMIC_DISPATCH(SwiGluHere)(gate, up, n); }
}  // namespace kvq
#endif
