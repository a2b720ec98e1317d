// Per-target body of the softmax tile step (see softmax_tile.h). Exponentials come from
// PortableExp (simd/portable_exp-inl.h: the same bits on every SIMD target, WebAssembly's too),
// evaluated over all kMaxTileRows lanes of a tile, so a position's factor is the same whether its
// tile held 1 or 32 positions; the running max and l recurrences
// are sequential, one position at a time, exactly as docs/design.md §3 writes them.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/softmax_tile.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>  // Tanh (softcap)

#include <cmath>

#include "attention/softmax_tile.h"
#include "kvq/format.h"
#include "simd/portable_exp-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvq::attention_internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void SoftmaxTileHere(float* scores, float* c, int32_t n_q, int32_t n, float scale, float softcap,
                     float* m, float* l) {
  const hn::CappedTag<float, 16> d;  // kMaxTileRows (32) must be a whole number of vectors
  const int32_t lanes = static_cast<int32_t>(hn::Lanes(d));
  const auto v_scale = hn::Set(d, scale);
  const auto v_cap = hn::Set(d, softcap);
  for (int32_t h = 0; h < n_q; ++h) {
    float* s = scores + h * kMaxTileRows;
    float* ch = c + h * kMaxTileRows;
    for (int32_t i = 0; i < kMaxTileRows; i += lanes) {
      auto v = hn::Mul(hn::LoadU(d, s + i), v_scale);
      if (softcap > 0.0f) v = hn::Mul(v_cap, hn::Tanh(d, hn::Div(v, v_cap)));
      hn::StoreU(v, d, s + i);
    }
    // Fast path, the common case once the running max has settled: no score in the tile
    // exceeds m, so every position keeps m (c = 1 exactly) and e = exp(s − m) — the very values
    // the position-by-position path below computes, so the bits do not depend on the path.
    for (int32_t i = n; i < kMaxTileRows; ++i) s[i] = -INFINITY;
    auto tile_max = hn::LoadU(d, s);
    for (int32_t i = lanes; i < kMaxTileRows; i += lanes) tile_max = hn::Max(tile_max, hn::LoadU(d, s + i));
    const float top = hn::GetLane(hn::MaxOfLanes(d, tile_max));
    if (top <= m[h] && m[h] != -INFINITY) {
      const auto v_m = hn::Set(d, m[h]);
      for (int32_t i = 0; i < kMaxTileRows; i += lanes) {
        hn::StoreU(kvq::HWY_NAMESPACE::PortableExp(d, hn::Sub(hn::LoadU(d, s + i), v_m)), d, s + i);  // s now holds e
      }
      float ll = l[h];
      for (int32_t i = 0; i < n; ++i) {
        ch[i] = 1.0f;
        ll = ll * 1.0f + s[i];
      }
      l[h] = ll;
      continue;
    }
    // Running max, one position at a time; arguments of the two exps. A position that leaves m
    // unchanged gets c = 1 exactly (so its rescale can be skipped); a −inf score adds nothing.
    alignas(64) float c_arg[kMaxTileRows] = {};
    bool m_unchanged[kMaxTileRows];
    float mm = m[h];
    for (int32_t i = 0; i < n; ++i) {
      const float next = s[i] > mm ? s[i] : mm;  // not std::fmax: a libm call
      m_unchanged[i] = next == mm;
      c_arg[i] = m_unchanged[i] ? 0.0f : mm - next;
      s[i] = s[i] == -INFINITY ? -INFINITY : s[i] - next;  // e's argument, in place
      mm = next;
    }
    for (int32_t i = 0; i < kMaxTileRows; i += lanes) {
      hn::StoreU(kvq::HWY_NAMESPACE::PortableExp(d, hn::LoadU(d, c_arg + i)), d, ch + i);
      hn::StoreU(kvq::HWY_NAMESPACE::PortableExp(d, hn::LoadU(d, s + i)), d, s + i);  // s now holds e
    }
    float ll = l[h];
    for (int32_t i = 0; i < n; ++i) {
      if (m_unchanged[i]) ch[i] = 1.0f;
      ll = ll * ch[i] + s[i];
    }
    m[h] = mm;
    l[h] = ll;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq::attention_internal
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvq::attention_internal {
HWY_EXPORT(SoftmaxTileHere);
SoftmaxTileFn SoftmaxTileForThisCpu() { return HWY_DYNAMIC_DISPATCH(SoftmaxTileHere); }
}  // namespace kvq::attention_internal
#endif
