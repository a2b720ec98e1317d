// Correctly rounded f32 division in WGSL, shared by the step's kernels (quantised activations, the
// MoE routing) and the KV encoders (kv_formats.js): WGSL's '/' is accurate to 2.5 ulp only.

/** WGSL of div_rn(x, d): x / d correctly rounded, as the CPU divides (WGSL's '/' is not). */
export const kDivRnWgsl = /* wgsl */ `
// WGSL's division is accurate to 2.5 ulp, not correctly rounded; the CPU's quotients (IEEE
// divisions: QuantizeActivation's d = amax / 127 and x / d, the MoE routing's normalisations) are
// found here exactly.
// x / d correctly rounded (to nearest, ties to even) for finite x and d ≠ 0 (d = ±inf: ±0), every
// range, subnormals included: the significands' quotient by integer long division (27 bits and a
// remainder), then rounded once where the result's last bit falls.
fn div_rn(x: f32, d: f32) -> f32 {
  let bx = bitcast<u32>(x);
  let bd = bitcast<u32>(d);
  let sign = (bx ^ bd) & 0x80000000u;
  let ex_biased = (bx >> 23u) & 0xffu;
  let ed_biased = (bd >> 23u) & 0xffu;
  if ((bx & 0x7fffffffu) == 0u || ed_biased == 0xffu) { return bitcast<f32>(sign); }
  // Significands in [2^23, 2^24) and their exponents (value = m · 2^e).
  var mx = select((bx & 0x7fffffu) | 0x800000u, bx & 0x7fffffu, ex_biased == 0u);
  var ex = select(i32(ex_biased) - 150, -149, ex_biased == 0u);
  var md = select((bd & 0x7fffffu) | 0x800000u, bd & 0x7fffffu, ed_biased == 0u);
  var ed = select(i32(ed_biased) - 150, -149, ed_biased == 0u);
  let nx = countLeadingZeros(mx) - 8u;
  mx = mx << nx;
  ex = ex - i32(nx);
  let nd = countLeadingZeros(md) - 8u;
  md = md << nd;
  ed = ed - i32(nd);
  // q = floor(mx / md · 2^26): 26 or 27 bits; rem ≠ 0 when the quotient is not exact.
  var rem = mx;
  var q = 0u;
  for (var i = 0u; i < 27u; i++) {
    let bit = rem >= md;
    if (bit) { rem = rem - md; }
    q = (q << 1u) | select(0u, 1u, bit);
    rem = rem << 1u;
  }
  let lsb = ex - ed - 26;  // the exponent of q's last bit
  let len = 32 - i32(countLeadingZeros(q));
  let e = lsb + len - 1;   // the result in [2^e, 2^(e + 1))
  if (e > 127) { return bitcast<f32>(sign | 0x7f800000u); }
  let sh = select(len - 24, -149 - lsb, e < -126);  // q's bits below the result's last
  if (sh >= 28) { return bitcast<f32>(sign); }
  var mant = q >> u32(sh);
  let half = (q >> u32(sh - 1)) & 1u;
  let sticky = (q & ((1u << u32(sh - 1)) - 1u)) != 0u || rem != 0u;
  if (half == 1u && (sticky || (mant & 1u) == 1u)) { mant = mant + 1u; }
  if (e < -126) { return bitcast<f32>(sign | mant); }  // subnormal (a carry makes it the smallest normal)
  return bitcast<f32>(sign | ((u32(e + 126) << 23u) + mant));
}
`;
