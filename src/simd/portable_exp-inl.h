// PortableExp: a vector exp whose bits are the same on every SIMD target (include after
// foreach_target.h, as any per-target header).
//
// Highway's Exp (contrib/math) evaluates its range reduction and polynomial with MulAdd, which is
// one fused rounding on AVX2/AVX3 and a multiply then an add (two roundings) on WebAssembly SIMD128
// and HWY_SCALAR, which have no fused multiply-add: the same input gave different bits natively
// and in the browser (softmax factors and SwiGLU, so the page's greedy ids left native kvq run's).
// This is the same algorithm — q = trunc(x/ln2 ± 1/2), r = x − q·ln2 in two parts (Cody–Waite),
// exp(r) ≈ 1 + r + r²·P(r) with Highway's degree-5 coefficients (Estrin's scheme), times 2^q as
// two exponent loads — with every multiply-add written as a Mul then an Add. Each operation is
// lane-wise IEEE single precision (or an exact integer/bit operation), so the result depends on
// neither the target nor the lane count. Error: within a few ulp of exp, as Highway's (the two
// roundings per step instead of one add at most one ulp of r per step; tests check 4 ulp).
// Inputs below −104 give 0 (as Highway's); +inf and NaN are not defined inputs (callers pass
// score differences ≤ 0, or −g for a finite activation g).
#if defined(KVQ_SIMD_PORTABLE_EXP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KVQ_SIMD_PORTABLE_EXP_INL_H_
#undef KVQ_SIMD_PORTABLE_EXP_INL_H_
#else
#define KVQ_SIMD_PORTABLE_EXP_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace kvq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

/// exp(x) per lane, the same bits on every target (see above).
template <class D, class V = hn::Vec<D>>
HWY_INLINE V PortableExp(D d, V x) {
  const hn::Rebind<int32_t, D> di;
  const V one = hn::Set(d, 1.0f);
  // q = x/ln2 rounded half away from zero: trunc(x·(1/ln2) + copysign(1/2, x)).
  const V half_signed = hn::Or(hn::Set(d, 0.5f), hn::And(x, hn::Set(d, -0.0f)));
  const auto q = hn::ConvertTo(di, hn::Add(hn::Mul(x, hn::Set(d, 1.442695040888963407359924681f)), half_signed));
  // r = x − q·ln2, ln2 in two parts; the first has 16 significant bits, so q·part0 is exact.
  const V qf = hn::ConvertTo(d, q);
  V r = hn::Add(hn::Mul(qf, hn::Set(d, -0.693145751953125f)), x);
  r = hn::Add(hn::Mul(qf, hn::Set(d, -1.428606765330187045e-6f)), r);
  // exp(r) − 1 ≈ r + r²·(k0 + k1·r + … + k5·r⁵) (Estrin's scheme, Highway's coefficients).
  const V r2 = hn::Mul(r, r);
  const V r4 = hn::Mul(r2, r2);
  const V p01 = hn::Add(hn::Mul(hn::Set(d, 0.166666671633720397949219f), r), hn::Set(d, 0.5f));
  const V p23 = hn::Add(hn::Mul(hn::Set(d, 0.00833336077630519866943359f), r), hn::Set(d, 0.0416664853692054748535156f));
  const V p45 = hn::Add(hn::Mul(hn::Set(d, 0.000198527617612853646278381f), r), hn::Set(d, 0.00139304355252534151077271f));
  const V poly = hn::Add(hn::Mul(r4, p45), hn::Add(hn::Mul(r2, p23), p01));
  const V y = hn::Add(hn::Add(hn::Mul(poly, r2), r), one);
  // y·2^q as y·2^(q>>1)·2^(q−(q>>1)), so a q near the exponent range's ends does not overflow the
  // exponent field of one factor.
  const auto q_half = hn::ShiftRight<1>(q);
  const auto pow2 = [&](decltype(q) e) { return hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(e, hn::Set(di, 0x7F)))); };
  const V result = hn::Mul(hn::Mul(y, pow2(q_half)), pow2(hn::Sub(q, q_half)));
  return hn::IfThenElseZero(hn::Ge(x, hn::Set(d, -104.0f)), result);
}

}  // namespace HWY_NAMESPACE
}  // namespace kvq
HWY_AFTER_NAMESPACE();

#endif  // KVQ_SIMD_PORTABLE_EXP_INL_H_
