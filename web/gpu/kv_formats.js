// WGSL dequantisation of kvq's KV formats, read straight from the bytes kvq's cache stores (the
// layouts of src/formats/<name>/, one position per block): each returns the WGSL functions
//   fn <t>_elem(row: u32, head: u32, i: u32) -> f32
// reading buffer <t>_buf (array<u32>) for t in {k, v}: element i of head `head` of window row
// `row`, decoded in registers (no dequantised copy). Every decode is exact integer and bit work
// plus at most one f32 multiply (correctly rounded in WGSL), so it gives the bits of kvq's scalar
// Codec::decode_row; tests/web/gpu/gpu_attention_test.mjs checks that for every row.

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
// WGSL expression `base` (bytes; a multiple of 4) when given: where t's blocks start in a buffer
// that holds more than them (a cache slot: K blocks, V blocks, f32 rows).
export function Readers(t, base = '') {
  const at = base ? `offset + ${base}` : 'offset';
  return /* wgsl */ `
fn ${t}_u8(offset: u32) -> u32 { let at = ${at}; return byte_of(${t}_buf[at >> 2u], at); }
fn ${t}_u16(offset: u32) -> u32 { return ${t}_u8(offset) | (${t}_u8(offset + 1u) << 8u); }
fn ${t}_u32(offset: u32) -> u32 {
  let at = ${at};
  if ((at & 3u) == 0u) { return ${t}_buf[at >> 2u]; }
  return ${t}_u16(offset) | (${t}_u16(offset + 2u) << 16u);
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
 * in its buffer (bytes), when not at 0.
 */
export function DecodeWgsl(key_format, value_format, bases = {}) {
  for (const f of [key_format, value_format]) {
    if (!kGpuFormats.includes(f)) throw new Error(`no WGSL decoder for KV format '${f}' (have: ${kGpuFormats.join(', ')})`);
  }
  return [kByteHelpers, Readers('k', bases.k), Readers('v', bases.v), Decoder(key_format, 'k'),
          Decoder(value_format, 'v')].join('\n');
}
