// WGSL encoders of kvq's small-float KV formats, bit-identical to the C++ codecs: fp4-e2m1 (K and V
// one row per block; src/formats/fp4_e2m1/fp4_e2m1.h) and fp8-e4m3 (V one row per block, K in
// groups of 32 rows; src/formats/fp8_e4m3/fp8_e4m3.h). kv_formats.js registers them with its other
// encoders and wraps them in its module (EncodeWgsl: the bindings x, out, params and scales; the
// byte helpers, f32_to_f16_bits, div_rn; the `encode` entry point calling block_byte, and the
// `scales_main` pass calling block_params once per (block, scale)).
//
// Exactness: the E4M3 and E2M1 roundings are integer work on the f32 bits (RNE to the code's
// mantissa bits, as kvq's table search with ties to the even code gives: both distances to the
// neighbours are exact, so "nearest, ties to even" is the bitwise RNE); NaNs and infinities are
// told apart by their bits (a WGSL device may assume no NaN or infinity in float arithmetic). The
// only float arithmetic is div_rn (div_rn.js: correctly rounded, as the CPU's '/'): fp4's amax / 6
// and x / s, whose E4M3 and E2M1 ties a 2.5-ulp '/' would round off the even code.

// Shared by both formats: the amax step and kvq's F32ToE4m3 on a magnitude.
const kFpCommon = /* wgsl */ `
// std::fmax(amax, std::fabs(x)) on bits, from amax = +0: a NaN x is passed over, an infinity kept.
fn amax_step(amax: u32, u: u32) -> u32 {
  let a = u & 0x7fffffffu;
  return select(amax, max(amax, a), a <= 0x7f800000u);
}
// kvq's F32ToE4m3 of a magnitude (f32 bits, not NaN): RNE to 3 mantissa bits, E4M3's subnormals
// (steps of 2^-9) under 2^-6, and 448 (0x7e) from 448 on, infinity included (the table's end).
fn e4m3_code_of(a: u32) -> u32 {
  if (a >= 0x43e00000u) { return 0x7eu; }  // ≥ 448
  if (a >= 0x3c800000u) {                  // ≥ 2^-6: E4M3 exponent = f32's − 120
    let r = a - (120u << 23u);
    return (r + 0x7ffffu + ((r >> 20u) & 1u)) >> 20u;  // a mantissa carry steps the exponent
  }
  let e = a >> 23u;
  if (e == 0u) { return 0u; }      // an f32 subnormal: under 2^-126
  let shift = 141u - e;            // |x| · 2^9 = m · 2^(e − 141) = m >> shift (shift ≥ 21)
  if (shift >= 25u) { return 0u; } // under 2^-10, half the smallest subnormal
  let m = (a & 0x7fffffu) | 0x800000u;
  let n = m >> shift;
  let rem = m & ((1u << shift) - 1u);
  let half = 1u << (shift - 1u);
  return n + select(0u, 1u, rem > half || (rem == half && (n & 1u) == 1u));  // 8: 2^-6, code 0x08
}
`;

// fp4-e2m1: per 16 numbers of the row (heads in order) [s: E4M3][8 bytes of E2M1, number 2j in
// the low nibble of byte j]; s = roundE4M3(amax / 6), 2^-9 (code 1) where that is 0; code =
// roundE2M1(x / s), saturating at ±6; NaN → +0 (code 0). Scales: one E4M3 code per group of 16.
function Fp4E2m1Encode(shape) {
  const groups = shape.n_kv_heads * shape.head_dim / 16;
  return {rows_per_block: 1, scales_per_block: groups, code: /* wgsl */ `${kFpCommon}
const scales_per_block: u32 = ${groups}u;
// kvq's F32ToE2m1 of a magnitude q (f32 bits, not NaN) by the midpoints of 0, 0.5, 1, 1.5, 2, 3, 4,
// 6: a tie goes to the even code (0.25 → 0, 0.75 → 1, 1.25 → 1, 1.75 → 2, 2.5 → 2, 3.5 → 4, 5 → 4).
fn e2m1_code_of(q: u32) -> u32 {
  if (q <= 0x3e800000u) { return 0u; }  // ≤ 0.25
  if (q < 0x3f400000u) { return 1u; }   // < 0.75
  if (q <= 0x3fa00000u) { return 2u; }  // ≤ 1.25
  if (q < 0x3fe00000u) { return 3u; }   // < 1.75
  if (q <= 0x40200000u) { return 4u; }  // ≤ 2.5
  if (q < 0x40600000u) { return 5u; }   // < 3.5
  if (q <= 0x40a00000u) { return 6u; }  // ≤ 5
  return 7u;
}
// The E2M1 nibble of x (f32 bits) at scale s (> 0): x / s keeps x's sign; an infinite x saturates.
fn e2m1_code(u: u32, s: f32) -> u32 {
  let a = u & 0x7fffffffu;
  if (a > 0x7f800000u) { return 0u; }
  let sign = (u >> 28u) & 8u;
  if (a == 0x7f800000u) { return sign | 7u; }
  return sign | e2m1_code_of(bitcast<u32>(div_rn(bitcast<f32>(a), s)));  // may overflow to inf: 7
}
// The E4M3 scale code of group g of the row.
fn block_params(row: u32, g: u32) -> u32 {
  let at = row * params.x_stride + g * 16u;
  var amax = 0u;
  for (var k = 0u; k < 16u; k++) { amax = amax_step(amax, x[at + k]); }
  if (amax == 0x7f800000u) { return 0x7eu; }  // inf / 6 saturates
  if (amax < 0x00800000u) { return 1u; }      // zero or an f32 subnormal: / 6 rounds to E4M3's 0
  return max(e4m3_code_of(bitcast<u32>(div_rn(bitcast<f32>(amax), 6.0))), 1u);
}
fn block_byte(row: u32, within: u32) -> u32 {
  let g = within / 9u;
  let o = within % 9u;
  let s8 = scales[row * scales_per_block + g];
  if (o == 0u) { return s8; }
  let s = e4m3_to_f32(s8);
  let at = row * params.x_stride + g * 16u + 2u * (o - 1u);
  return e2m1_code(x[at], s) | (e2m1_code(x[at + 1u], s) << 4u);
}`};
}

// fp8-e4m3's exponent byte and codes. b = e + 127 for the smallest e in [−126, 119] with amax ≤
// 448 · 2^e: amax = 1.f · 2^(E − 127) (E its biased exponent) is ≤ 1.75 · 2^(E − 127) iff f ≤ 0.75,
// so b = E − 8, plus 1 when f > 0.75; zero and f32 subnormals give E ≤ 0, clamped to 1; infinity
// 247, clamped to 246. A code is roundE4M3(x · 2^-e): the product built on the bits (exact while it
// is a normal f32; under 2^-126 it rounds to E4M3's 0 anyway, as the C++'s ldexp then does).
const kFp8Common = /* wgsl */ `${kFpCommon}
fn exponent_byte(amax: u32) -> u32 {
  let b = i32(amax >> 23u) - 8 + select(0, 1, (amax & 0x7fffffu) > 0x600000u);
  return u32(clamp(b, 1, 246));
}
fn fp8_code(u: u32, b: u32) -> u32 {
  let sign = (u >> 24u) & 0x80u;
  let a = u & 0x7fffffffu;
  if (a > 0x7f800000u) { return sign | 0x7fu; }  // NaN
  if (a == 0x7f800000u) { return sign | 0x7eu; } // ±inf saturates to ±448
  if (a == 0u) { return sign; }
  var e = i32(a >> 23u);
  var m = a & 0x7fffffu;
  if (e == 0) {  // an f32 subnormal m · 2^-149 = 1.f · 2^(p − 149), p its leading bit
    let p = 31 - i32(countLeadingZeros(m));
    e = p - 22;
    m = (m << u32(23 - p)) & 0x7fffffu;
  }
  let scaled = e - (i32(b) - 127);  // the biased exponent of x · 2^-e
  if (scaled < 1) { return sign; }
  if (scaled > 135) { return sign | 0x7eu; }  // ≥ 2^9: past 448
  return sign | e4m3_code_of((u32(scaled) << 23u) | m);
}`;

// fp8-e4m3 values, one row per block: [b][n_kv_heads · head_dim codes]; b of the row's amax.
function Fp8ValueEncode(shape) {
  return {rows_per_block: 1, scales_per_block: 1, code: /* wgsl */ `${kFp8Common}
const scales_per_block: u32 = 1u;
fn block_params(row: u32, unused: u32) -> u32 {
  let at = row * params.x_stride;
  var amax = 0u;
  for (var i = 0u; i < n_kv_heads * head_dim; i++) { amax = amax_step(amax, x[at + i]); }
  return exponent_byte(amax);
}
fn block_byte(row: u32, within: u32) -> u32 {
  let b = scales[row];
  if (within == 0u) { return b; }
  return fp8_code(x[row * params.x_stride + within - 1u], b);
}`};
}

// fp8-e4m3 keys, a block per group of 32 rows: per head [b][32 rows × head_dim codes], b of the
// head's amax over the group; zero bytes after the last head up to the block's end.
function Fp8KeyEncode(shape) {
  return {rows_per_block: 32, scales_per_block: shape.n_kv_heads, code: /* wgsl */ `${kFp8Common}
const scales_per_block: u32 = n_kv_heads;
const head_bytes: u32 = 1u + 32u * head_dim;
fn block_params(group: u32, head: u32) -> u32 {
  var amax = 0u;
  for (var r = 0u; r < 32u; r++) {
    let at = (group * 32u + r) * params.x_stride + head * head_dim;
    for (var i = 0u; i < head_dim; i++) { amax = amax_step(amax, x[at + i]); }
  }
  return exponent_byte(amax);
}
fn block_byte(group: u32, within: u32) -> u32 {
  let head = within / head_bytes;
  if (head >= n_kv_heads) { return 0u; }  // the padding
  let o = within % head_bytes;
  let b = scales[group * n_kv_heads + head];
  if (o == 0u) { return b; }
  let r = (o - 1u) / head_dim;
  let i = (o - 1u) % head_dim;
  return fp8_code(x[(group * 32u + r) * params.x_stride + head * head_dim + i], b);
}`};
}

/**
 * Per format: {k, v}, each (shape {n_kv_heads, head_dim}) => {code (WGSL: block_params,
 * block_byte, the const scales_per_block), rows_per_block, scales_per_block}.
 */
export const kFpEncoders = {
  'fp4-e2m1': {k: Fp4E2m1Encode, v: Fp4E2m1Encode},
  'fp8-e4m3': {k: Fp8KeyEncode, v: Fp8ValueEncode},
};
