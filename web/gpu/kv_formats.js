// WGSL dequantisation of kvq's KV formats, read straight from the bytes kvq's cache stores (the
// layouts of src/formats/<name>/, one position per block): each returns the WGSL functions
//   fn <t>_elem(row: u32, head: u32, i: u32) -> f32
// reading buffer <t>_buf (array<u32>) for t in {k, v}: element i of head `head` of window row
// `row`, decoded in registers (no dequantised copy). Every decode is exact integer and bit work
// plus at most one f32 multiply (correctly rounded in WGSL), so it gives the bits of kvq's scalar
// Codec::decode_row; tests/web/gpu/gpu_attention_test.mjs checks that for every row. And, below,
// encoders of the one-row formats (GpuKvEncoder).

import {kDivRnWgsl} from './div_rn.js';
import {kFpEncoders} from './fp_encoders.js';
import {CachedPipeline} from './pipeline_cache.js';

// Bytes are read from u32 words: blocks need not be 4-byte aligned (int4 at head_dim 8: 6 bytes
// per head row).
// Shared with weight_types.js: byte_of, f16_bits_to_f32, e4m3_to_f32, e2m1_to_f32.
export const kByteHelpers = /* wgsl */ `
fn byte_of(word: u32, offset: u32) -> u32 { return (word >> ((offset & 3u) * 8u)) & 0xffu; }
// f16 bits to f32 by integer work: exact for normals, subnormals (m · 2^-24 is a normal f32),
// infinities and NaNs, whatever the device does with f16 subnormals.
fn f16_bits_to_f32(h: u32) -> f32 {
  let sign = (h >> 15u) << 31u;
  let e = (h >> 10u) & 0x1fu;
  let m = h & 0x3ffu;
  if (e == 0u) {
    let magnitude = f32(m) * 5.9604644775390625e-8;  // m · 2^-24, exact
    return select(magnitude, -magnitude, sign != 0u);
  }
  if (e == 31u) { return bitcast<f32>(sign | 0x7f800000u | (m << 13u)); }
  return bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
}
// OCP FP8 E4M3 (no infinities; S.1111.111 is NaN): placed as f16 bits S.0EEEE.MMM0000000 it is the
// value / 2^8, subnormals included (src/base/float_codes.h).
fn e4m3_to_f32(code: u32) -> f32 {
  if ((code & 0x7fu) == 0x7fu) { return bitcast<f32>(0x7fc00000u | ((code & 0x80u) << 24u)); }
  return f16_bits_to_f32(((code & 0x80u) << 8u) | ((code & 0x7fu) << 7u)) * 256.0;
}
// OCP FP4 E2M1: S.EE.M, magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (code 8 is -0).
fn e2m1_to_f32(code: u32) -> f32 {
  var magnitudes = array<f32, 8>(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);
  let v = magnitudes[code & 7u];
  return select(v, -v, (code & 8u) != 0u);
}
`;

// Per tensor t: u8, u16 and u32 readers over t_buf (array<u32>) at byte offsets, counted from the
// WGSL expression `base` (bytes) when given: where t's blocks start in a buffer that holds more
// than them (a cache slot: K blocks, V blocks, f32 rows). pages: {region, stride} when t's blocks
// lie in consecutive pages of a pool (kv_resident_pool.js), `region` bytes of them per page, pages
// `stride` bytes apart: an offset counts bytes as if the regions were back to back (a decoder's row
// · block arithmetic), and the reader finds its page. A block never spans two regions.
export function Readers(t, base = '', pages = null) {
  const paged = pages ? `(offset / ${pages.region}u) * ${pages.stride}u + offset % ${pages.region}u` : 'offset';
  const at = base ? `${paged} + ${base}` : paged;
  return /* wgsl */ `
fn ${t}_u8(offset: u32) -> u32 { let at = ${at}; return byte_of(${t}_buf[at >> 2u], at); }
fn ${t}_u16(offset: u32) -> u32 { return ${t}_u8(offset) | (${t}_u8(offset + 1u) << 8u); }
fn ${t}_u32(offset: u32) -> u32 {
  let at = ${at};
  let shift = 8u * (at & 3u);
  if (shift == 0u) { return ${t}_buf[at >> 2u]; }
  // Unaligned: the four bytes span two words, both holding some of them (so both in the buffer).
  return (${t}_buf[at >> 2u] >> shift) | (${t}_buf[(at >> 2u) + 1u] << (32u - shift));
}
`;
}

// Element decoders per format and tensor t. `row` counts rows from the first uploaded block (a
// group codec's window may start inside a block: the caller adds the rows before it).
const kDecoders = {
  // [row of f32, heads in order]
  f32: (t) => `fn ${t}_elem(row: u32, head: u32, i: u32) -> f32 {
  return bitcast<f32>(${t}_u32(row * ${t}_block + (head * head_dim + i) * 4u));
}`,
  // [row of f16, heads in order]
  f16: (t) => `fn ${t}_elem(row: u32, head: u32, i: u32) -> f32 {
  return f16_bits_to_f32(${t}_u16(row * ${t}_block + (head * head_dim + i) * 2u));
}`,
  // [row of bf16, heads in order]: the high half of an f32
  bf16: (t) => `fn ${t}_elem(row: u32, head: u32, i: u32) -> f32 {
  return bitcast<f32>(${t}_u16(row * ${t}_block + (head * head_dim + i) * 2u) << 16u);
}`,
  // Per head: [s: f16][codes: head_dim · b / 8 bytes], element i at bits (i mod (8/b))·b of byte
  // i/(8/b); x' = (raw − 2^(b−1)) · s (src/formats/int_token/int_token.h).
  int8: (t) => IntToken(t, 8),
  int4: (t) => IntToken(t, 4),
  int2: (t) => IntToken(t, 2),
  // The row in groups of 16 numbers (heads in order), 9 bytes each: [s: E4M3][8 bytes of E2M1,
  // number 2j in the low nibble of byte j]; x' = E2M1 · s (src/formats/fp4_e2m1/fp4_e2m1.h).
  'fp4-e2m1': (t) => `fn ${t}_elem(row: u32, head: u32, i: u32) -> f32 {
  let j = head * head_dim + i;
  let group_at = row * ${t}_block + (j / 16u) * 9u;
  let s = e4m3_to_f32(${t}_u8(group_at));
  let code = (${t}_u8(group_at + 1u + (j % 16u) / 2u) >> ((j % 2u) * 4u)) & 0xfu;
  return e2m1_to_f32(code) * s;
}`,
};

function IntToken(t, bits) {
  const per_byte = 8 / bits, half = 1 << (bits - 1), mask = (1 << bits) - 1;
  return `fn ${t}_elem(row: u32, head: u32, i: u32) -> f32 {
  let head_at = row * ${t}_block + head * (2u + head_dim * ${bits}u / 8u);
  let s = f16_bits_to_f32(${t}_u16(head_at));
  let raw = (${t}_u8(head_at + 2u + i / ${per_byte}u) >> ((i % ${per_byte}u) * ${bits}u)) & ${mask}u;
  return f32(i32(raw) - ${half}) * s;
}`;
}

// Keys in groups of 32 rows (the newest incomplete group is f32 residual rows, read by the caller).
// int4-kivi / int2-kivi: per head [s: f16 × head_dim][z: f16 × head_dim][codes: 32 rows × head_dim
// · b / 8], one (s, z) per channel; x' = raw · s + z (raw · s is exact: at most 4 + 11 significant
// bits, so a fused multiply-add gives the same bits). src/formats/kivi/kivi.h.
function KiviKey(t, bits) {
  const per_byte = 8 / bits, mask = (1 << bits) - 1;
  return `fn ${t}_elem(row: u32, head: u32, i: u32) -> f32 {
  let head_at = (row / 32u) * ${t}_block + head * (4u * head_dim + 32u * head_dim * ${bits}u / 8u);
  let s = f16_bits_to_f32(${t}_u16(head_at + 2u * i));
  let z = f16_bits_to_f32(${t}_u16(head_at + 2u * (head_dim + i)));
  let codes_at = head_at + 4u * head_dim + (row % 32u) * (head_dim * ${bits}u / 8u);
  let raw = (${t}_u8(codes_at + i / ${per_byte}u) >> ((i % ${per_byte}u) * ${bits}u)) & ${mask}u;
  return f32(raw) * s + z;
}`;
}
// Values per row: per head [s: f16][z: f16][codes: head_dim · b / 8].
function KiviValue(t, bits) {
  const per_byte = 8 / bits, mask = (1 << bits) - 1;
  return `fn ${t}_elem(row: u32, head: u32, i: u32) -> f32 {
  let head_at = row * ${t}_block + head * (4u + head_dim * ${bits}u / 8u);
  let s = f16_bits_to_f32(${t}_u16(head_at));
  let z = f16_bits_to_f32(${t}_u16(head_at + 2u));
  let raw = (${t}_u8(head_at + 4u + i / ${per_byte}u) >> ((i % ${per_byte}u) * ${bits}u)) & ${mask}u;
  return f32(raw) * s + z;
}`;
}
// fp8-e4m3 (src/formats/fp8_e4m3/fp8_e4m3.h): x' = E4M3(code) · 2^(b − 127), exact. Keys per group of
// 32 rows, per head [b][32 rows × head_dim codes]; values per row [b][n_kv_heads × head_dim codes].
const kFp8Key = (t) => `fn ${t}_elem(row: u32, head: u32, i: u32) -> f32 {
  let head_at = (row / 32u) * ${t}_block + head * (1u + 32u * head_dim);
  let s = bitcast<f32>(${t}_u8(head_at) << 23u);
  return e4m3_to_f32(${t}_u8(head_at + 1u + (row % 32u) * head_dim + i)) * s;
}`;
const kFp8Value = (t) => `fn ${t}_elem(row: u32, head: u32, i: u32) -> f32 {
  let row_at = row * ${t}_block;
  let s = bitcast<f32>(${t}_u8(row_at) << 23u);
  return e4m3_to_f32(${t}_u8(row_at + 1u + head * head_dim + i)) * s;
}`;

// Formats whose K and V codecs differ: [key decoder, value decoder, key rows per block].
const kSplitFormats = {
  'int4-kivi': [(t) => KiviKey(t, 4), (t) => KiviValue(t, 4), 32],
  'int2-kivi': [(t) => KiviKey(t, 2), (t) => KiviValue(t, 2), 32],
  'fp8-e4m3': [kFp8Key, kFp8Value, 32],
};

/** Format names the WGSL kernels decode. */
export const kGpuFormats = [...Object.keys(kDecoders), ...Object.keys(kSplitFormats)];

/** Rows per K block of a format (32 for the group codecs, else 1); V is one row per block in all. */
export function KeyRowsPerBlock(format) {
  return kSplitFormats[format] ? kSplitFormats[format][2] : 1;
}

function Decoder(format, tensor) {
  if (kSplitFormats[format]) return kSplitFormats[format][tensor === 'k' ? 0 : 1](tensor);
  return kDecoders[format](tensor);
}

/**
 * WGSL for decoding K (format key_format) and V (value_format): the byte helpers, the readers and
 * each tensor's `<t>_elem`. The caller declares k_buf, v_buf, the consts k_block and v_block
 * (bytes per row) and head_dim. bases: {k, v}, WGSL expressions of where each tensor's blocks start
 * in its buffer (bytes), when not at 0; k_pages, v_pages: Readers' pages for blocks in a page pool.
 */
export function DecodeWgsl(key_format, value_format, bases = {}) {
  for (const f of [key_format, value_format]) {
    if (!kGpuFormats.includes(f)) throw new Error(`no WGSL decoder for KV format '${f}' (have: ${kGpuFormats.join(', ')})`);
  }
  return [kByteHelpers, Readers('k', bases.k, bases.k_pages), Readers('v', bases.v, bases.v_pages), Decoder(key_format, 'k'),
          Decoder(value_format, 'v')].join('\n');
}

// Encoders of the one-row formats and of KIVI (K in groups of 32 rows), and fp4-e2m1's and
// fp8-e4m3's (fp_encoders.js), bit-identical to kvq's C++ codecs (src/formats/<name>/): new K and
// V rows (f32, [rows][n_kv_heads][head_dim]) become the bytes kvq's cache stores, on the GPU —
// what kv_resident.js writes its GPU-resident pages with, handing the host master whole pages of
// bytes.
//
// Exactness: every step is integer and bit work on the f32 bit patterns (WGSL lets a device assume
// no NaN or infinity in float arithmetic, so those are told apart by their bits, never by float
// compares), plus, for the int formats, one f32 division per head row (max|x| / (2^(b−1) − 1)) and
// one per number (x / s) and WGSL's round (half to even, as kvq's RoundHalfEven); for KIVI a
// subtraction and a division per scale ((max − z) / R) and per number ((x − z) / s). The divisions
// are div_rn's (div_rn.js: correctly rounded, as the CPU's): WGSL's '/' is not, and SwiftShader's
// once missed an f16 tie of a rotated int4 row's max|x| / 7 (1.35400390625, rounded up where kvq
// rounds to even).
//
// Two entry points per format: `scales_main` (int formats: one invocation per (row, head), the f16
// scale bits into `scales`; KIVI per (row, head) or (group, channel); fp_encoders.js's per scale
// code), then `encode`, one invocation per u32 word of the output: each of its bytes inside
// [first_byte, first_byte + blocks · block) is computed from the rows (and scales); bytes outside
// keep what the word held, so a row can be written into a page whose rows are not 4-byte aligned,
// and neighbouring invocations never write the same word.

// f32 bits to f16 bits, kvq's F32ToF16 (base/float_codes.cc): RNE by integer work; overflow to ±inf
// (from 65520 on); NaN stays a quiet NaN with its sign and top payload bits; subnormal results
// RNE(|x| · 2^24) computed on the bits.
const kF16Encode = /* wgsl */ `
fn f32_to_f16_bits(u: u32) -> u32 {
  let sign = (u >> 16u) & 0x8000u;
  let a = u & 0x7fffffffu;
  if (a > 0x7f800000u) { return sign | 0x7e00u | ((a >> 13u) & 0x1ffu); }
  if (a >= 0x477ff000u) { return sign | 0x7c00u; }
  if (a >= 0x38800000u) {
    let r = a - (112u << 23u);
    return sign | ((r + 0xfffu + ((r >> 13u) & 1u)) >> 13u);
  }
  let e = a >> 23u;
  if (e == 0u) { return sign; }  // zero or an f32 subnormal: under 2^-126, rounds to 0
  let shift = 126u - e;          // |x| · 2^24 = m · 2^(e − 126) = m >> shift (shift ≥ 14)
  if (shift >= 25u) { return sign; }  // under half of 2^-24
  let m = (a & 0x7fffffu) | 0x800000u;
  let n = m >> shift;
  let rem = m & ((1u << shift) - 1u);
  let half = 1u << (shift - 1u);
  return sign | (n + select(0u, 1u, rem > half || (rem == half && (n & 1u) == 1u)));
}
// kvq's F32ToBf16: RNE on the high half; NaN → its high half with the quiet bit.
fn f32_to_bf16_bits(u: u32) -> u32 {
  if ((u & 0x7fffffffu) > 0x7f800000u) { return (u >> 16u) | 0x40u; }
  return (u + 0x7fffu + ((u >> 16u) & 1u)) >> 16u;
}
`;

// Byte `within` of row `row`'s block, per format.
const kByteOf = {
  f32: () => `fn block_byte(row: u32, within: u32) -> u32 {
  return (x[row * params.x_stride + within / 4u] >> ((within % 4u) * 8u)) & 0xffu;
}`,
  f16: () => `fn block_byte(row: u32, within: u32) -> u32 {
  return (f32_to_f16_bits(x[row * params.x_stride + within / 2u]) >> ((within % 2u) * 8u)) & 0xffu;
}`,
  bf16: () => `fn block_byte(row: u32, within: u32) -> u32 {
  return (f32_to_bf16_bits(x[row * params.x_stride + within / 2u]) >> ((within % 2u) * 8u)) & 0xffu;
}`,
  int8: () => IntTokenEncode(8),
  int4: () => IntTokenEncode(4),
  int2: () => IntTokenEncode(2),
};

// kvq's int8 / int4 / int2 per token (src/formats/int_token/int_token.h): per head [s: f16][codes],
// s = f16(max|x| / qmax) saturated to 65504 (an infinite max too), raw = clamp(RNE(x / s) + 2^(b−1),
// 0, 2^b − 1), 2^(b−1) where s = 0; NaN numbers are left out of the max and get raw 0 (the C++
// clamp of a NaN), infinities clamp to the ends.
function IntTokenEncode(bits) {
  const per_byte = 8 / bits, offset = 1 << (bits - 1), qmax = offset - 1, raw_max = (1 << bits) - 1;
  return `
const head_bytes: u32 = 2u + head_dim * ${bits}u / 8u;
fn scale_bits(row: u32, head: u32) -> u32 {
  var amax = 0u;  // the largest |x| as bits (the order of non-negative floats), NaNs left out
  for (var i = 0u; i < head_dim; i++) {
    let a = x[row * params.x_stride + head * head_dim + i] & 0x7fffffffu;
    if (a <= 0x7f800000u) { amax = max(amax, a); }
  }
  if (amax == 0x7f800000u) { return 0x7bffu; }
  let s = f32_to_f16_bits(bitcast<u32>(div_rn(bitcast<f32>(amax), ${qmax}.0)));
  return select(s, 0x7bffu, (s & 0x7fffu) >= 0x7c00u);
}
fn raw_code(u: u32, s: f32) -> u32 {
  let a = u & 0x7fffffffu;
  if (a > 0x7f800000u) { return 0u; }
  if (s == 0.0) { return ${offset}u; }
  if (a == 0x7f800000u) { return select(${raw_max}u, 0u, u != a); }
  return u32(clamp(round(div_rn(bitcast<f32>(u), s)) + ${offset}.0, 0.0, ${raw_max}.0));
}
fn block_byte(row: u32, within: u32) -> u32 {
  let head = within / head_bytes;
  let o = within % head_bytes;
  let s16 = scales[row * n_kv_heads + head];
  if (o < 2u) { return (s16 >> (o * 8u)) & 0xffu; }
  let s = f16_bits_to_f32(s16);
  var byte = 0u;
  for (var t = 0u; t < ${per_byte}u; t++) {
    let i = (o - 2u) * ${per_byte}u + t;
    byte |= raw_code(x[row * params.x_stride + head * head_dim + i], s) << (t * ${bits}u);
  }
  return byte;
}
@compute @workgroup_size(64)
fn scales_main(@builtin(global_invocation_id) id: vec3u) {
  if (id.x >= params.rows * n_kv_heads) { return; }
  scales[id.x] = scale_bits(id.x / n_kv_heads, id.x % n_kv_heads);
}`;
}

// KIVI (src/formats/kivi/kivi.h): z = f16(min), s = f16((max − z) / (2^b − 1)), both saturated
// to ±65504; raw = clamp(RNE((x − z) / s), 0, 2^b − 1), 0 where s = ±0. min and max are the
// C++'s std::fmin / std::fmax chains from the first number, as glibc's give them: a NaN is passed
// over (while every number so far is one, the latest is kept), and of equal numbers (±0) the first
// is kept (each compare is on the bits: a device may assume no NaN in float compares). NaN numbers get
// raw 0 (fmax(NaN, 0)); an infinite or huge quotient clamps by its sign.
function KiviCommon(bits) {
  const raw_max = (1 << bits) - 1;
  return `
const raw_max: u32 = ${raw_max}u;
fn is_nan(u: u32) -> bool { return (u & 0x7fffffffu) > 0x7f800000u; }
// An order key for non-NaN f32 bits with ±0 equal: a < b as floats iff key(a) < key(b).
fn order_key(u: u32) -> u32 {
  let v = select(u, 0u, u == 0x80000000u);
  return select(v | 0x80000000u, ~v, (v & 0x80000000u) != 0u);
}
// std::fmin(lo, x) and std::fmax(hi, x) as bits.
fn fmin_bits(lo: u32, x: u32) -> u32 {
  return select(lo, x, is_nan(lo) || (!is_nan(x) && order_key(x) < order_key(lo)));
}
fn fmax_bits(hi: u32, x: u32) -> u32 {
  return select(hi, x, is_nan(hi) || (!is_nan(x) && order_key(x) > order_key(hi)));
}
fn f16_saturated(u: u32) -> u32 {
  let h = f32_to_f16_bits(u);
  return select(h, (h & 0x8000u) | 0x7bffu, (h & 0x7fffu) >= 0x7c00u);
}
// (s | z << 16), f16 bits, for numbers in [lo, hi]. An infinite or NaN hi makes (hi − z) / R
// infinite or NaN with hi's sign: saturated to ±65504.
fn kivi_params(lo: u32, hi: u32) -> u32 {
  let z16 = f16_saturated(lo);
  var s16 = ((hi >> 16u) & 0x8000u) | 0x7bffu;
  if ((hi & 0x7fffffffu) < 0x7f800000u) {
    s16 = f16_saturated(bitcast<u32>(div_rn(bitcast<f32>(hi) - f16_bits_to_f32(z16), ${raw_max}.0)));
  }
  return s16 | (z16 << 16u);
}
fn kivi_code(u: u32, params: u32) -> u32 {
  let s16 = params & 0xffffu;
  if ((s16 & 0x7fffu) == 0u || is_nan(u)) { return 0u; }
  let positive = ((u >> 31u) ^ (s16 >> 15u)) == 0u;  // the sign of (x − z) / s for an infinite x
  if ((u & 0x7fffffffu) == 0x7f800000u) { return select(0u, raw_max, positive); }
  let q = div_rn(bitcast<f32>(u) - f16_bits_to_f32(params >> 16u), f16_bits_to_f32(s16));
  let qb = bitcast<u32>(q);
  if ((qb & 0x7fffffffu) >= 0x4b000000u) { return select(0u, raw_max, (qb >> 31u) == 0u); }  // |q| ≥ 2^23, inf
  return u32(clamp(round(q), 0.0, ${raw_max}.0));
}`;
}

// KIVI values, one row per block: per head [s: f16][z: f16][codes]; (s, z) per (row, head) into
// scales by scales_main.
function KiviValueEncode(bits) {
  const per_byte = 8 / bits;
  return `${KiviCommon(bits)}
const head_bytes: u32 = 4u + head_dim * ${bits}u / 8u;
const scales_per_block: u32 = n_kv_heads;
fn block_params(row: u32, head: u32) -> u32 {
  let at = row * params.x_stride + head * head_dim;
  var lo = x[at];
  var hi = lo;
  for (var i = 1u; i < head_dim; i++) {
    lo = fmin_bits(lo, x[at + i]);
    hi = fmax_bits(hi, x[at + i]);
  }
  return kivi_params(lo, hi);
}
fn block_byte(row: u32, within: u32) -> u32 {
  let head = within / head_bytes;
  let o = within % head_bytes;
  let sz = scales[row * n_kv_heads + head];
  if (o < 4u) { return (sz >> (o * 8u)) & 0xffu; }
  var byte = 0u;
  for (var t = 0u; t < ${per_byte}u; t++) {
    let i = (o - 4u) * ${per_byte}u + t;
    byte |= kivi_code(x[row * params.x_stride + head * head_dim + i], sz) << (t * ${bits}u);
  }
  return byte;
}`;
}

// KIVI keys, a block per group of 32 rows: per head [s: f16 × head_dim][z: f16 × head_dim][32
// rows of codes]; (s, z) per (group, head, channel) into scales by scales_main.
function KiviKeyEncode(bits) {
  const per_byte = 8 / bits;
  return `${KiviCommon(bits)}
const row_code_bytes: u32 = head_dim * ${bits}u / 8u;
const head_bytes: u32 = 4u * head_dim + 32u * row_code_bytes;
const scales_per_block: u32 = n_kv_heads * head_dim;
fn block_params(group: u32, channel: u32) -> u32 {  // channel: head · head_dim + i
  let at = group * 32u * params.x_stride + channel;
  var lo = x[at];
  var hi = lo;
  for (var r = 1u; r < 32u; r++) {
    lo = fmin_bits(lo, x[at + r * params.x_stride]);
    hi = fmax_bits(hi, x[at + r * params.x_stride]);
  }
  return kivi_params(lo, hi);
}
fn block_byte(group: u32, within: u32) -> u32 {
  let head = within / head_bytes;
  let o = within % head_bytes;
  let first = (group * n_kv_heads + head) * head_dim;
  if (o < 4u * head_dim) {  // s of channel o / 2, then z of channel o / 2 − head_dim
    let c = (o / 2u) % head_dim;
    return (scales[first + c] >> (select(0u, 16u, o >= 2u * head_dim) + (o % 2u) * 8u)) & 0xffu;
  }
  let r = (o - 4u * head_dim) / row_code_bytes;
  let within_row = (o - 4u * head_dim) % row_code_bytes;
  let at = (group * 32u + r) * params.x_stride + head * head_dim;
  var byte = 0u;
  for (var t = 0u; t < ${per_byte}u; t++) {
    let i = within_row * ${per_byte}u + t;
    byte |= kivi_code(x[at + i], scales[first + i]) << (t * ${bits}u);
  }
  return byte;
}`;
}

// Per KIVI format: [key encoder, value encoder] (keys in blocks of 32 rows).
const kKiviEncoders = {
  'int4-kivi': [() => KiviKeyEncode(4), () => KiviValueEncode(4)],
  'int2-kivi': [() => KiviKeyEncode(2), () => KiviValueEncode(2)],
};
// kvq's codec's `scales_main` pass: one invocation per (block, scale) of the params block_params gives
// (KIVI's, fp_encoders.js's).
const kBlockScalesMain = `
@compute @workgroup_size(64)
fn scales_main(@builtin(global_invocation_id) id: vec3u) {
  if (id.x >= params.rows / rows_per_block * scales_per_block) { return; }
  scales[id.x] = block_params(id.x / scales_per_block, id.x % scales_per_block);
}`;

/** Formats with a GPU encoder whose K and V are one row per block, one codec for both tensors. */
export const kEncoderFormats = [...Object.keys(kByteOf), 'fp4-e2m1'];
/** Formats with a GPU encoder of K in groups of KeyRowsPerBlock rows and V one row per block. */
export const kGroupKeyEncoderFormats = [...Object.keys(kKiviEncoders), 'fp8-e4m3'];

/** Whether `format`'s encoder has a `scales_main` pass before `encode`. */
export function EncoderHasScales(format) { return format.startsWith('int') || format in kFpEncoders; }

// The encoder's WGSL functions for `format` and tensor ('k' or 'v'), the rows per block it
// encodes, and the scale words it keeps per block (the `scales` buffer).
function EncoderOf(format, tensor, shape) {
  if (kKiviEncoders[format]) {
    const key = tensor === 'k';
    return {code: kKiviEncoders[format][key ? 0 : 1]() + kBlockScalesMain, rows_per_block: key ? 32 : 1,
            scales_per_block: key ? shape.n_kv_heads * shape.head_dim : shape.n_kv_heads};
  }
  if (kFpEncoders[format]) {
    const encoder = kFpEncoders[format][tensor](shape);
    return {...encoder, code: encoder.code + kBlockScalesMain};
  }
  if (!kByteOf[format]) {
    const have = [...kEncoderFormats, ...kGroupKeyEncoderFormats].join(', ');
    throw new Error(`no WGSL encoder for KV format '${format}' (have: ${have})`);
  }
  return {code: kByteOf[format](), rows_per_block: 1, scales_per_block: shape.n_kv_heads};
}

/**
 * The WGSL module encoding rows of `format`'s `tensor` ('k' or 'v'; they differ for KIVI) at shape
 * {n_kv_heads, head_dim, block_bytes}: bindings 0 x (array<u32>: f32 bits [rows][x_stride], each
 * row's [n_kv_heads][head_dim] first), 1 out (array<u32>: the blocks, written from byte
 * params.first_byte), 2 params ({rows (a whole number of blocks), first_byte, x_stride}), 3 scales
 * (array<u32>: the int and KIVI formats' per-block scales).
 */
export function EncodeWgsl(format, shape, tensor = 'k') {
  const encoder = EncoderOf(format, tensor, shape);
  return /* wgsl */ `
const head_dim: u32 = ${shape.head_dim}u;
const n_kv_heads: u32 = ${shape.n_kv_heads}u;
const block: u32 = ${shape.block_bytes}u;
const rows_per_block: u32 = ${encoder.rows_per_block}u;
struct Params { rows: u32, first_byte: u32, x_stride: u32 }
@group(0) @binding(0) var<storage, read> x: array<u32>;           // [rows][x_stride ≥ n_kv_heads · head_dim] f32 bits
@group(0) @binding(1) var<storage, read_write> out: array<u32>;   // blocks from byte params.first_byte
@group(0) @binding(2) var<uniform> params: Params;
// [blocks][scales_per_block]: f16 bits (KIVI: s | z << 16; fp_encoders.js: an E4M3 or E8M0 code)
@group(0) @binding(3) var<storage, read_write> scales: array<u32>;
${kByteHelpers}
${kF16Encode}
${kDivRnWgsl}
${encoder.code}
@compute @workgroup_size(64)
fn encode(@builtin(global_invocation_id) id: vec3u) {
  let lo = params.first_byte;
  let hi = lo + params.rows / rows_per_block * block;
  let w = lo / 4u + id.x;
  if (w * 4u >= hi) { return; }
  var word = out[w];
  for (var k = 0u; k < 4u; k++) {
    let b = w * 4u + k;
    if (b < lo || b >= hi) { continue; }
    let rel = b - lo;
    word = (word & ~(0xffu << (k * 8u))) | (block_byte(rel / block, rel % block) << (k * 8u));
  }
  out[w] = word;
}
`;
}

/**
 * Encodes rows of `format`'s `tensor` ('k' or 'v') on `device`: x (a GPUBuffer of f32 rows) into
 * `out` (a GPUBuffer) from byte `first_byte`, recorded into `encoder` (a GPUCommandEncoder); a
 * KIVI key encoder takes whole groups of rows_per_block rows. Pipelines are cached per (format,
 * tensor, shape) on the device.
 */
export class GpuKvEncoder {
  constructor(device, format, shape, tensor = 'k') {
    this.device = device;
    this.format = format;
    this.shape = shape;
    const {rows_per_block, scales_per_block} = EncoderOf(format, tensor, shape);
    this.rows_per_block = rows_per_block;
    this.scales_per_block = scales_per_block;
    // One pipeline per (format, tensor, shape) on the device, whichever layer or sequence asks (pipeline_cache.js).
    const code = EncodeWgsl(format, shape, tensor);
    this.encode = CachedPipeline(device, code, 'encode');
    this.scales = EncoderHasScales(format) ? CachedPipeline(device, code, 'scales_main') : null;
    this.params = device.createBuffer({size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST});
    this.scale_buffer = null;
  }

  /**
   * rows rows of x (a GPUBuffer or a binding of one, f32 bits; row r at r · x_stride floats, by
   * default packed) into out from first_byte; commands into `encoder`. arena: a UniformArena
   * (uniform_arena.js) for the parameters when the command buffer holds more than one call (a
   * prefill block); without one they are queue-written to this encoder's own buffer. Returns the
   * dispatches recorded (2 with a scales pass, else 1).
   */
  Record(encoder, x_in, rows, out, first_byte, arena = null, x_stride = this.shape.n_kv_heads * this.shape.head_dim) {
    const {block_bytes} = this.shape;
    if (rows % this.rows_per_block !== 0) {
      throw new Error(`${this.format}: ${rows} rows are not whole blocks of ${this.rows_per_block}`);
    }
    const blocks = rows / this.rows_per_block;
    const x = x_in instanceof GPUBuffer ? {buffer: x_in} : x_in;  // a buffer or a binding of one
    const values = new Uint32Array([rows, first_byte, x_stride, 0]);
    let params = {buffer: this.params};
    if (arena) {
      params = arena.Take(values);
    } else {
      this.device.queue.writeBuffer(this.params, 0, values);
    }
    this.Reserve(rows);
    const pass = encoder.beginComputePass();
    if (this.scales) {
      pass.setPipeline(this.scales);
      pass.setBindGroup(0, this.device.createBindGroup({layout: this.scales.getBindGroupLayout(0), entries: [
        {binding: 0, resource: x}, {binding: 2, resource: params},
        {binding: 3, resource: {buffer: this.scale_buffer}}]}));
      pass.dispatchWorkgroups(Math.max(1, Math.ceil(blocks * this.scales_per_block / 64)));
    }
    pass.setPipeline(this.encode);
    const entries = [{binding: 0, resource: x}, {binding: 1, resource: {buffer: out}},
                     {binding: 2, resource: params}];
    if (this.scales) entries.push({binding: 3, resource: {buffer: this.scale_buffer}});
    pass.setBindGroup(0, this.device.createBindGroup({layout: this.encode.getBindGroupLayout(0), entries}));
    const words = Math.floor((first_byte + blocks * block_bytes + 3) / 4) - Math.floor(first_byte / 4);
    pass.dispatchWorkgroups(Math.max(1, Math.ceil(words / 64)));
    pass.end();
    return this.scales ? 2 : 1;
  }

  /**
   * Room for `rows` rows' scales. The scale buffer is replaced when it grows, so a caller recording
   * several calls into one command buffer reserves their largest first (a buffer destroyed before
   * the submit of commands that use it fails the submit).
   */
  Reserve(rows) {
    const scale_bytes = Math.max(16, Math.ceil(rows / this.rows_per_block) * this.scales_per_block * 4);
    if (this.scale_buffer && this.scale_buffer.size >= scale_bytes) return;
    this.scale_buffer?.destroy();
    this.scale_buffer = this.device.createBuffer({size: Math.ceil(scale_bytes / 16) * 16, usage: GPUBufferUsage.STORAGE});
  }
}
