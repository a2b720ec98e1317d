// The WGSL of the step program's mixture-of-experts ops (src/web/gpu_moe.h; kvq's MoeRows and
// RouteRow in src/model/moe.cc): the routing (a softmax over every expert's logit, the top k with
// ties to the lower index, their probabilities renormalised), the chosen experts' matvecs read
// from their rows of a stacked expert tensor by ids in a GPU buffer, and the gated shared expert
// plus the weighted sum in rank order.
//
// The routing must choose the CPU's experts with the CPU's weights, bit for bit, and WGSL's exp
// is accurate to a few ulp only (a near tie would go the other way). So exp here is the C
// library's expf (musl's, which the WebAssembly module runs; the ARM optimized-routines
// algorithm: a 32-entry table of 2^(j/32) and a cubic, evaluated in double precision), computed
// with doubles emulated in u32 arithmetic: each double operation rounds to nearest even as IEEE
// binary64 does, so the result has the library's bits. Divisions are div_rn (step_kernels.js),
// correctly rounded as the CPU's. The sums run in the CPU's order in one invocation.

import {kDivRnWgsl} from './div_rn.js';
import {kMatvecRows, kRowLanes} from './step_kernels.js';

// 2^(j/32) rounded to a double, for j = 0..31: the mantissa's high 21 and low 32 bits (the value
// is mantissa · 2^-52). These are the doubles of musl's __exp2f_data table (tab[j] + (j << 47)).
const kExp2Table = [
  0x100000, 0x00000000, 0x1059b0, 0xd3158574, 0x10b558, 0x6cf9890f, 0x111301, 0xd0125b51, 0x1172b8, 0x3c7d517b,
  0x11d487, 0x3168b9aa, 0x12387a, 0x6e756238, 0x129e9d, 0xf51fdee1, 0x1306fe, 0x0a31b715, 0x1371a7, 0x373aa9cb,
  0x13dea6, 0x4c123422, 0x144e08, 0x6061892d, 0x14bfda, 0xd5362a27, 0x15342b, 0x569d4f82, 0x15ab07, 0xdd485429,
  0x16247e, 0xb03a5585, 0x16a09e, 0x667f3bcd, 0x171f75, 0xe8ec5f74, 0x17a114, 0x73eb0187, 0x182589, 0x994cce13,
  0x18ace5, 0x422aa0db, 0x193737, 0xb0cdc5e5, 0x19c491, 0x82a3f090, 0x1a5503, 0xb23e255d, 0x1ae89f, 0x995ad3ad,
  0x1b7f76, 0xf2fb5e47, 0x1c199b, 0xdd85529c, 0x1cb720, 0xdcef9069, 0x1d5818, 0xdcfba487, 0x1dfc97, 0x337b9b5f,
  0x1ea4af, 0xa2a490da, 0x1f5076, 0x5b6e4540,
];

/** WGSL of expf_exact(x: f32) -> f32: the bits of the C library's expf (see the file comment). */
export const kExpExactWgsl = /* wgsl */ `
// A double: (−1)^neg · m · 2^e with m = hi · 2^32 + lo, 2^52 ≤ m < 2^53, or m = 0 (zero).
struct Dbl { neg: bool, e: i32, hi: u32, lo: u32 }

// 128-bit unsigned integers as vec4u, least significant word first.
fn mul32(a: u32, b: u32) -> vec2u {  // a · b as (low word, high word)
  let a0 = a & 0xffffu;
  let a1 = a >> 16u;
  let b0 = b & 0xffffu;
  let b1 = b >> 16u;
  let p00 = a0 * b0;
  let p01 = a0 * b1;
  let p10 = a1 * b0;
  let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
  return vec2u((p00 & 0xffffu) | (mid << 16u), a1 * b1 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u));
}
fn add128(a: vec4u, b: vec4u) -> vec4u {
  var r = vec4u(0u);
  var carry = 0u;
  for (var i = 0u; i < 4u; i++) {
    let s = a[i] + b[i];
    let s2 = s + carry;
    carry = select(0u, 1u, s < a[i]) + select(0u, 1u, s2 < s);
    r[i] = s2;
  }
  return r;
}
fn sub128(a: vec4u, b: vec4u) -> vec4u {  // a − b for a ≥ b
  var r = vec4u(0u);
  var borrow = 0u;
  for (var i = 0u; i < 4u; i++) {
    let d = a[i] - b[i];
    r[i] = d - borrow;
    borrow = select(0u, 1u, a[i] < b[i]) + select(0u, 1u, d < borrow);
  }
  return r;
}
fn ge128(a: vec4u, b: vec4u) -> bool {
  for (var i = 3i; i >= 0; i--) {
    if (a[i] != b[i]) { return a[i] > b[i]; }
  }
  return true;
}
fn shl128(a: vec4u, n: u32) -> vec4u {  // n < 128
  var r = vec4u(0u);
  let ws = i32(n / 32u);
  let bs = n % 32u;
  for (var i = 3i; i >= ws; i--) {
    var v = a[i - ws] << bs;
    if (bs > 0u && i - ws > 0) { v = v | (a[i - ws - 1] >> (32u - bs)); }
    r[i] = v;
  }
  return r;
}
// a >> n with the bits shifted out ORed into the lowest bit (sticky).
fn shr128_sticky(a: vec4u, n: u32) -> vec4u {
  if (n == 0u) { return a; }
  if (n >= 128u) { return vec4u(select(0u, 1u, any(a != vec4u(0u))), 0u, 0u, 0u); }
  var r = vec4u(0u);
  let ws = n / 32u;
  let bs = n % 32u;
  for (var i = 0u; i + ws < 4u; i++) {
    var v = a[i + ws] >> bs;
    if (bs > 0u && i + ws < 3u) { v = v | (a[i + ws + 1u] << (32u - bs)); }
    r[i] = v;
  }
  var lost = bs > 0u && (a[ws] & ((1u << bs) - 1u)) != 0u;
  for (var i = 0u; i < ws; i++) { lost = lost || a[i] != 0u; }
  if (lost) { r.x = r.x | 1u; }
  return r;
}
fn bitlen128(a: vec4u) -> u32 {
  for (var i = 3i; i >= 0; i--) {
    if (a[i] != 0u) { return u32(i) * 32u + 32u - countLeadingZeros(a[i]); }
  }
  return 0u;
}
// m >> sh rounded to nearest, ties to even (sh ≥ 1; m < 2^127; the result fits in 64 bits).
fn round_shr(m: vec4u, sh: u32) -> vec2u {
  let g = shr128_sticky(shl128(m, 1u), sh - 1u);  // m >> (sh − 2): the round bit, then the sticky bit
  var lo = (g.x >> 2u) | (g.y << 30u);
  var hi = (g.y >> 2u) | (g.z << 30u);
  if ((g.x & 2u) != 0u && ((g.x & 1u) != 0u || (lo & 1u) != 0u)) {
    lo = lo + 1u;
    if (lo == 0u) { hi = hi + 1u; }
  }
  return vec2u(lo, hi);
}
// (−1)^neg · m · 2^e rounded to a double.
fn dbl_round(neg: bool, m: vec4u, e: i32) -> Dbl {
  let len = bitlen128(m);
  if (len == 0u) { return Dbl(false, 0, 0u, 0u); }
  if (len <= 53u) {
    let s = shl128(m, 53u - len);
    return Dbl(neg, e - i32(53u - len), s.y, s.x);
  }
  let q = round_shr(m, len - 53u);
  if (q.y == 0x200000u) { return Dbl(neg, e + i32(len - 52u), 0x100000u, 0u); }  // rounded up to 2^53
  return Dbl(neg, e + i32(len - 53u), q.y, q.x);
}
fn dbl_is_zero(a: Dbl) -> bool { return a.hi == 0u && a.lo == 0u; }
fn dbl_mul(a: Dbl, b: Dbl) -> Dbl {
  if (dbl_is_zero(a) || dbl_is_zero(b)) { return Dbl(false, 0, 0u, 0u); }
  let ll = mul32(a.lo, b.lo);
  let lh = mul32(a.lo, b.hi);
  let hl = mul32(a.hi, b.lo);
  let hh = mul32(a.hi, b.hi);
  let m = add128(add128(vec4u(ll.x, ll.y, hh.x, hh.y), vec4u(0u, lh.x, lh.y, 0u)), vec4u(0u, hl.x, hl.y, 0u));
  return dbl_round(a.neg != b.neg, m, a.e + b.e);
}
// The smaller operand aligned below the larger's 64 extra bits; past them only its sticky bit
// counts, which rounds as the exact sum would (the round bit is at least 62 bits above it).
fn dbl_add(a: Dbl, b: Dbl) -> Dbl {
  if (dbl_is_zero(a)) { return b; }
  if (dbl_is_zero(b)) { return a; }
  var big = a;  // the larger exponent
  var small = b;
  if (small.e > big.e) {
    big = b;
    small = a;
  }
  let d = u32(big.e - small.e);
  let mb = shl128(vec4u(big.lo, big.hi, 0u, 0u), 64u);
  var ms = vec4u(small.lo, small.hi, 0u, 0u);
  ms = select(shr128_sticky(ms, d - 64u), shl128(ms, 64u - d), d <= 64u);
  if (big.neg == small.neg) { return dbl_round(big.neg, add128(mb, ms), big.e - 64); }
  if (ge128(mb, ms)) { return dbl_round(big.neg, sub128(mb, ms), big.e - 64); }
  return dbl_round(small.neg, sub128(ms, mb), big.e - 64);
}
fn dbl_from_f32(x: f32) -> Dbl {
  let b = bitcast<u32>(x);
  let biased = (b >> 23u) & 0xffu;
  let frac = b & 0x7fffffu;
  let m = select(frac | 0x800000u, frac, biased == 0u);
  return dbl_round((b >> 31u) == 1u, vec4u(m, 0u, 0u, 0u), select(i32(biased) - 150, -149, biased == 0u));
}
// A positive double rounded to f32, to nearest even, subnormals included (no overflow here).
fn dbl_to_f32(a: Dbl) -> f32 {
  if (dbl_is_zero(a)) { return 0.0; }
  let m = vec4u(a.lo, a.hi, 0u, 0u);
  let exponent = a.e + 52;  // a in [2^exponent, 2^(exponent + 1))
  if (exponent >= -126) {
    let q = round_shr(m, 29u).x;  // 2^23 ≤ q ≤ 2^24 (2^24: the next binade, which the sum carries into)
    return bitcast<f32>((u32(exponent + 126) << 23u) + q);
  }
  return bitcast<f32>(round_shr(m, u32(-149 - a.e)).x);  // a subnormal (or the smallest normal)
}

var<private> exp2_table: array<u32, 64> = array<u32, 64>(${kExp2Table.map((v) => `0x${v.toString(16)}u`).join(', ')});

// expf: x = (k + r) / 32 · ln 2 with k = round(x · 32/ln 2), |r| ≤ 1/2; exp(x) = 2^(k/32) · 2^(r/32),
// the first from the table (k mod 32) and the exponent (k >> 5), the second a cubic in r.
fn expf_exact(x: f32) -> f32 {
  let ix = bitcast<u32>(x);
  let abstop = (ix >> 20u) & 0x7ffu;
  if (abstop >= 0x42bu) {  // |x| ≥ 88, or not finite
    if (ix == 0xff800000u) { return 0.0; }
    if (abstop >= 0x7f8u) { return x + x; }
    if (x > bitcast<f32>(0x42b17217u)) { return bitcast<f32>(0x7f800000u | (ix & 0u)); }  // over log(2^128): inf
    if (x < bitcast<f32>(0xc2cff1b4u)) { return 0.0; }  // under log(2^-150)
  }
  let inv_ln2_n = Dbl(false, -47, 0x171547u, 0x652b82feu);  // 0x1.71547652b82fep+0 · 32
  let c0 = Dbl(false, -72, 0x1c6af8u, 0x4b912394u);  // 0x1.c6af84b912394p-5 / 32^3
  let c1 = Dbl(false, -65, 0x1ebfceu, 0x50fac4f3u);  // 0x1.ebfce50fac4f3p-3 / 32^2
  let c2 = Dbl(false, -58, 0x162e42u, 0xff0c52d6u);  // 0x1.62e42ff0c52d6p-1 / 32
  let one = Dbl(false, -52, 0x100000u, 0u);
  let z = dbl_mul(inv_ln2_n, dbl_from_f32(x));
  // k = z rounded to the nearest integer, ties to even (|z| < 2^13, so z.e < 0).
  var k = 0i;
  if (!dbl_is_zero(z)) {
    let k_abs = i32(round_shr(vec4u(z.lo, z.hi, 0u, 0u), u32(-z.e)).x);
    k = select(k_abs, -k_abs, z.neg);
  }
  let kd = dbl_round(k < 0, vec4u(u32(abs(k)), 0u, 0u, 0u), 0);
  let r = dbl_add(z, Dbl(!kd.neg, kd.e, kd.hi, kd.lo));  // exact
  let j = u32(k) & 31u;
  let s = Dbl(false, -52 + (k >> 5u), exp2_table[2u * j], exp2_table[2u * j + 1u]);
  let cubic = dbl_add(dbl_mul(c0, r), c1);
  let r2 = dbl_mul(r, r);
  var sum = dbl_add(dbl_mul(c2, r), one);
  sum = dbl_add(dbl_mul(cubic, r2), sum);
  return dbl_to_f32(dbl_mul(sum, s));
}
`;

// Bindings: the op's input x, its output y, the uniform, the selection (ids, then weights'
// bits), the shared expert's gate logit.
export const kMoeOpsWgsl = /* wgsl */ `
// n: experts (moe_route) or floats per expert output (moe_combine); k: experts chosen.
struct P { n: u32, k: u32, a: u32, b: u32 }
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;
@group(0) @binding(9) var<storage, read_write> sel: array<u32>;  // [k] expert ids, [k] weights' bits
@group(0) @binding(10) var<storage, read> gate: array<f32>;      // [1] the shared expert's gate logit
${kDivRnWgsl}
${kExpExactWgsl}

var<workgroup> sum_all: f32;

// RouteRow over the logits y [n], left holding their softmax: the exps in parallel, then one
// invocation sums them in order of the expert (the CPU's order), the divisions in parallel, then
// one invocation picks the top k (each time the first largest not yet chosen: ties to the lower
// index) and divides them by their sum in rank order.
@compute @workgroup_size(64)
fn moe_route(@builtin(local_invocation_id) l: vec3u) {
  var top = -3.4028234663852886e38;
  for (var e = 0u; e < p.n; e++) { top = max(top, y[e]); }
  storageBarrier();  // every invocation's top read before any exp is written
  for (var e = l.x; e < p.n; e += 64u) { y[e] = expf_exact(y[e] - top); }
  storageBarrier();
  if (l.x == 0u) {
    var sum = 0.0;
    for (var e = 0u; e < p.n; e++) { sum = sum + y[e]; }
    sum_all = sum;
  }
  workgroupBarrier();
  let sum = sum_all;
  for (var e = l.x; e < p.n; e += 64u) { y[e] = div_rn(y[e], sum); }
  storageBarrier();
  if (l.x != 0u) { return; }
  var chosen_sum = 0.0;
  for (var i = 0u; i < p.k; i++) {
    var best = p.n;  // none yet
    for (var e = 0u; e < p.n; e++) {
      var taken = false;
      for (var j = 0u; j < i; j++) { taken = taken || sel[j] == e; }
      // Compared as bits (the same order for probabilities, all ≥ +0): a device may flush a
      // subnormal to zero in a float comparison, and the CPU's order counts them.
      if (!taken && (best == p.n || bitcast<u32>(y[e]) > bitcast<u32>(y[best]))) { best = e; }
    }
    sel[i] = best;
    sel[p.k + i] = bitcast<u32>(y[best]);
    chosen_sum = chosen_sum + y[best];
  }
  for (var i = 0u; i < p.k; i++) { sel[p.k + i] = bitcast<u32>(div_rn(bitcast<f32>(sel[p.k + i]), chosen_sum)); }
}

// MoeRows' sum: y = σ(gate) · y (the shared expert's output) + Σ_i weight_i · x[i][.] in rank
// order, σ(g) = 1 / (1 + exp(−g)) as the CPU computes it.
@compute @workgroup_size(64)
fn moe_combine(@builtin(global_invocation_id) id: vec3u) {
  if (id.x >= p.n) { return; }
  let shared_weight = div_rn(1.0, 1.0 + expf_exact(-gate[0]));
  var o = shared_weight * y[id.x];
  for (var i = 0u; i < p.k; i++) { o = o + bitcast<f32>(sel[p.k + i]) * x[i * p.n + id.x]; }
  y[id.x] = o;
}
`;

/** Bindings each entry point of kMoeOpsWgsl uses. */
export const kMoeOpsBindings = {moe_route: [2, 3, 9], moe_combine: [1, 2, 3, 9, 10]};

/**
 * WGSL of the expert matvec, appended to a weight type's module (step_kernels.js's WeightOpsWgsl with
 * the same `kernel`: its Dims, bindings, matvec_row, and for the 'lanes' kernel matvec_term and the
 * terms table): y [k][rows per expert] = for each rank i < dims.tokens, expert sel[i]'s rows of the
 * stacked matrix times rank i's activation. dims.y_stride is the rows per expert (and y's floats per
 * rank); dims.x_stride and dims.xd_stride the floats of x and of its scales per rank (0: one
 * activation for every rank; its codes then one row, else 32 · xd_stride per rank). A piece of the
 * stack (dims.row0, dims.rows) serves the rows it holds. Ranks along y; per rank a row per
 * invocation ('rows', or an f32 activation), or 8 rows per workgroup as the dense 'lanes' matvec
 * takes them (the same terms in the same order: the same bits).
 */
export function ExpertMatvecWgsl(kernel, quantized_activation) {
  const head = /* wgsl */ `
@group(0) @binding(9) var<storage, read> sel: array<u32>;  // [k] expert ids, [k] weights' bits
`;
  if (kernel !== 'lanes' || !quantized_activation) {
    return head + /* wgsl */ `
@compute @workgroup_size(64)
fn expert_matvec(@builtin(global_invocation_id) id: vec3u) {
  let rank = id.y;
  if (id.x >= dims.y_stride || rank >= dims.tokens) { return; }
  let row = sel[rank] * dims.y_stride + id.x;  // in the stacked matrix
  if (row < dims.row0 || row - dims.row0 >= dims.rows) { return; }  // another piece's
  y[rank * dims.y_stride + id.x] =
      matvec_row(row - dims.row0, rank * dims.x_stride, rank * 32u * dims.xd_stride, rank * dims.xd_stride);
}
`;
  }
  return head + /* wgsl */ `
// Row i of rank's expert, as the row of this piece it is (or dims.rows: not this piece's).
fn expert_row(rank: u32, i: u32) -> u32 {
  let row = sel[rank] * dims.y_stride + i;  // in the stacked matrix
  if (i >= dims.y_stride || row < dims.row0 || row - dims.row0 >= dims.rows) { return dims.rows; }
  return row - dims.row0;
}

@compute @workgroup_size(${kRowLanes})
fn expert_matvec(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let rank = wg.y;
  if (rank >= dims.tokens) { return; }
  let first = wg.x * ${kMatvecRows}u;  // the workgroup's rows first.. of the expert
  let blocks = dims.cols / 32u;
  let qo = rank * 32u * dims.xd_stride;
  let dxo = rank * dims.xd_stride;
  var sums = vec2f(0.0, 0.0);  // lane r < ${kMatvecRows}: row first + r's
  for (var b0 = 0u; b0 < blocks; b0 += ${kRowLanes}u) {
    let tile = min(${kRowLanes}u, blocks - b0);
    for (var k = lid; k < ${kMatvecRows}u * tile; k += ${kRowLanes}u) {  // term k: row k / tile, block k % tile
      let row = expert_row(rank, first + k / tile);
      if (row < dims.rows) { terms[(k / tile) * ${kRowLanes}u + k % tile] = matvec_term(row, b0 + k % tile, qo, dxo); }
    }
    workgroupBarrier();
    if (lid < ${kMatvecRows}u) {
      for (var u = 0u; u < tile; u++) { matvec_add(&sums, terms[lid * ${kRowLanes}u + u]); }
    }
    workgroupBarrier();
  }
  if (lid < ${kMatvecRows}u && expert_row(rank, first + lid) < dims.rows) { y[rank * dims.y_stride + first + lid] = matvec_finish(sums); }
}
`;
}

/** The expert matvec's workgroups [x, y] for `rows` rows per expert and top_k ranks. */
export function ExpertMatvecGroups(kernel, quantized_activation, rows, top_k) {
  return [Math.ceil(rows / (kernel === 'lanes' && quantized_activation ? kMatvecRows : 64)), top_k];
}

/** Bindings of ExpertMatvecWgsl by whether the type's matvec quantises its activation. */
export function ExpertMatvecBindings(quantized_activation) {
  return quantized_activation ? [0, 2, 3, 7, 8, 9] : [0, 1, 2, 3, 9];
}
