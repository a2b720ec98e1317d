// The K-quant weight types on a WebGPU device (ggml's super-blocks of 256 elements; kvq's
// src/weights/q2_k .. q6_k), in the file's rows (the layout the WebAssembly module holds them in)
// and for Q4_K, Q5_K and Q6_K also in the 16-row groups LoadModel repacks them into on x86
// (weights/kquant_repack.h; the last rows % 16 rows stay row-major after the groups). WGSL over
// w_u8 / w_u16 (kv_formats.js's Readers) and the uniform `dims` {rows, cols, row_bytes,
// first_byte} of one matrix (or piece of one):
//   kq_d(row, sb), kq_dmin(row, sb) -> f32        super-block sb's scale and min scale
//   kq_sc(row, sb, j), kq_m(row, sb, j) -> i32    the scale and min of its 16-element sub-block j
//   kq_code(row, sb, e) -> i32                     element e's code: weight = d·sc·code − dmin·m
//   w_elem(row, col) -> f32                        the weight, as ggml's dequantize_row_* makes it
// (Q6_K and Q3_K have no mins: kq_dmin 0, kq_m 0; their codes are signed: Q6_K's stored 6 bits
// − 32, Q3_K's 3 bits − 4.) The matvec over them is step_kernels.js's, the scalar K-quant kernel's arithmetic (weights/kquant_rows-inl.h).

/** Bytes per super-block of each K-quant type read here. */
export const kKQuantBytes = {q4_k: 144, q6_k: 210, q5_k: 176, q2_k: 84, q3_k: 110};

// Where super-block sb of `row` starts, row-major; and in the grouped layout, the group's
// super-block (16 rows' worth) and whether the row is in a group at all.
function Locate(bytes, layout) {
  const rows = `fn kq_at(row: u32, sb: u32) -> u32 { return dims.first_byte + row * dims.row_bytes + sb * ${bytes}u; }`;
  if (layout === 'rows') return `${rows}\nfn kq_grouped(row: u32) -> bool { return false; }\nfn kq_group(row: u32, sb: u32) -> u32 { return 0u; }`;
  return `${rows}
fn kq_grouped(row: u32) -> bool { return row < dims.rows - dims.rows % 16u; }
fn kq_group(row: u32, sb: u32) -> u32 {
  return dims.first_byte + (row / 16u) * 16u * dims.row_bytes + sb * ${16 * bytes}u;
}`;
}

// One K-quant element from the type's kq_* accessors, in dequantize_row_q*_K's order of operations
// (so the bits are the scalar reference's): with a min (Q2_K, Q4_K, Q5_K) d1 = d·sc and m1 = dmin·m
// (exact), then d1·code (exact) − m1; without (Q3_K, Q6_K) (d·sc)·code, exact.
const kElemWithMin = /* wgsl */ `
fn w_elem(row: u32, col: u32) -> f32 {
  let sb = col / 256u;
  let e = col % 256u;
  let d1 = kq_d(row, sb) * f32(kq_sc(row, sb, e / 16u));
  let m1 = kq_dmin(row, sb) * f32(kq_m(row, sb, e / 16u));
  return d1 * f32(kq_code(row, sb, e)) - m1;
}
`;
const kElemNoMin = /* wgsl */ `
fn w_elem(row: u32, col: u32) -> f32 {
  let sb = col / 256u;
  let e = col % 256u;
  return (kq_d(row, sb) * f32(kq_sc(row, sb, e / 16u))) * f32(kq_code(row, sb, e));
}
`;

// Q4_K: [d f16][dmin f16][scales 12 bytes, 6-bit sc and m packed][qs 128: per 64 elements c, 32
// bytes whose low nibbles are elements 64c..64c+31 and high nibbles 64c+32..64c+63]. Grouped:
// d of rows 0..15, dmin of rows 0..15, then 3 vectors of scale bytes and 32 of qs, 64 bytes each,
// byte 4j + i of vector v being row j's byte 4v + i.
const kQ4KScales = /* wgsl */ `
fn kq_d(row: u32, sb: u32) -> f32 {
  if (kq_grouped(row)) { return f16_bits_to_f32(w_u16(kq_group(row, sb) + 2u * (row % 16u))); }
  return f16_bits_to_f32(w_u16(kq_at(row, sb)));
}
fn kq_dmin(row: u32, sb: u32) -> f32 {
  if (kq_grouped(row)) { return f16_bits_to_f32(w_u16(kq_group(row, sb) + 32u + 2u * (row % 16u))); }
  return f16_bits_to_f32(w_u16(kq_at(row, sb) + 2u));
}
// Byte s of the 12 packed scale bytes, byte q of the 128 code bytes.
fn kq_vector_byte(row: u32, sb: u32, first: u32, n: u32) -> u32 {
  return w_u8(kq_group(row, sb) + first + (n / 4u) * 64u + 4u * (row % 16u) + n % 4u);
}
fn kq_scale_byte(row: u32, sb: u32, s: u32) -> u32 {
  if (kq_grouped(row)) { return kq_vector_byte(row, sb, 64u, s); }
  return w_u8(kq_at(row, sb) + 4u + s);
}
// ggml's get_scale_min_k4 for the 32-element sub-block j / 2.
fn kq_sc(row: u32, sb: u32, j: u32) -> i32 {
  let k = j / 2u;
  if (k < 4u) { return i32(kq_scale_byte(row, sb, k) & 63u); }
  return i32((kq_scale_byte(row, sb, k + 4u) & 15u) | ((kq_scale_byte(row, sb, k - 4u) >> 6u) << 4u));
}
fn kq_m(row: u32, sb: u32, j: u32) -> i32 {
  let k = j / 2u;
  if (k < 4u) { return i32(kq_scale_byte(row, sb, k + 4u) & 63u); }
  return i32((kq_scale_byte(row, sb, k + 4u) >> 4u) | ((kq_scale_byte(row, sb, k) >> 6u) << 4u));
}
`;

const kQ4K = kQ4KScales + /* wgsl */ `
fn kq_qs(row: u32, sb: u32, q: u32) -> u32 {
  if (kq_grouped(row)) { return kq_vector_byte(row, sb, 256u, q); }
  return w_u8(kq_at(row, sb) + 16u + q);
}
fn kq_code(row: u32, sb: u32, e: u32) -> i32 {
  let r = e % 64u;
  let byte = kq_qs(row, sb, 32u * (e / 64u) + r % 32u);
  return i32(select(byte >> 4u, byte & 15u, r < 32u));
}
` + kElemWithMin;

// Q6_K: [ql 128: low 4 bits][qh 64: high 2 bits][scales 16 × int8][d f16]; element 128h + 32k + l
// (k = 0..3) has the low nibble (k ≥ 2: high nibble) of ql[64h + 32(k % 2) + l] and bits 2k, 2k+1
// of qh[32h + l]. Grouped (the codes re-cut; u = the stored 6 bits, code + 32): d of rows 0..15,
// then 16 scale vectors of 16 bytes (vector s, byte j: row j's scales[s]), then per 16-element
// sub-block s three vectors v at 288 + (3s + v)·64, byte 4j + i: u of element 16s + 4v + i shifted
// left by 2, with bits 2v..2v+1 of u of element 16s + 12 + i in bits 0-1.
const kQ6K = /* wgsl */ `
fn kq_d(row: u32, sb: u32) -> f32 {
  if (kq_grouped(row)) { return f16_bits_to_f32(w_u16(kq_group(row, sb) + 2u * (row % 16u))); }
  return f16_bits_to_f32(w_u16(kq_at(row, sb) + 208u));
}
fn kq_dmin(row: u32, sb: u32) -> f32 { return 0.0; }
fn kq_m(row: u32, sb: u32, j: u32) -> i32 { return 0; }
fn kq_sc(row: u32, sb: u32, j: u32) -> i32 {
  var byte: u32;
  if (kq_grouped(row)) {
    byte = w_u8(kq_group(row, sb) + 32u + 16u * j + row % 16u);
  } else {
    byte = w_u8(kq_at(row, sb) + 192u + j);
  }
  return i32(byte << 24u) >> 24u;
}
fn kq_code(row: u32, sb: u32, e: u32) -> i32 {
  if (kq_grouped(row)) {
    let g = kq_group(row, sb) + 288u + (e / 16u) * 192u + 4u * (row % 16u);
    let r = e % 16u;
    if (r < 12u) { return i32(w_u8(g + (r / 4u) * 64u + r % 4u) >> 2u) - 32; }
    var u = 0u;
    for (var v = 0u; v < 3u; v++) { u |= (w_u8(g + v * 64u + r - 12u) & 3u) << (2u * v); }
    return i32(u) - 32;
  }
  let at = kq_at(row, sb);
  let h = e / 128u;
  let k = (e % 128u) / 32u;
  let l = e % 32u;
  let low = (w_u8(at + 64u * h + 32u * (k % 2u) + l) >> select(4u, 0u, k < 2u)) & 15u;
  let high = (w_u8(at + 128u + 32u * h + l) >> (2u * k)) & 3u;
  return i32(low | (high << 4u)) - 32;
}
` + kElemNoMin;

// Q5_K (q5_k.h): Q4_K's d, dmin and packed 6-bit scales (bytes 0-15), then qh[32] (bit 2c of
// qh[l]: the 5th bit of element 64c + l, bit 2c + 1: of element 64c + 32 + l) and qs[128] laid
// out as Q4_K's; code = nibble + 16 · that bit. Grouped: Q4_K's d, dmin and scale vectors, then
// 8 vectors of qh bytes at 256 and Q4_K's 32 code vectors at 768 (kquant_repack.h).
const kQ5K = kQ4KScales + /* wgsl */ `
fn kq_code(row: u32, sb: u32, e: u32) -> i32 {
  let c = e / 64u;
  let r = e % 64u;
  var byte: u32;
  var bits: u32;
  if (kq_grouped(row)) {
    byte = kq_vector_byte(row, sb, 768u, 32u * c + r % 32u);
    bits = kq_vector_byte(row, sb, 256u, r % 32u);
  } else {
    let at = kq_at(row, sb);
    byte = w_u8(at + 48u + 32u * c + r % 32u);
    bits = w_u8(at + 16u + r % 32u);
  }
  let high = (bits >> (2u * c + select(0u, 1u, r >= 32u))) & 1u;
  return i32(select(byte >> 4u, byte & 15u, r < 32u) | (high << 4u));
}
` + kElemWithMin;

// Q2_K and Q3_K have no repacked layout (weights/kquant_repack.h): their WGSL reads the file's
// rows, where kq_grouped is false.

// Q2_K (q2_k.h): [scales 16: sc in the low nibble, m in the high, per 16 elements][qs 64: bits 2k
// of qs[32h + l] for element 128h + 32k + l][d f16][dmin f16]; code ∈ [0, 3].
const kQ2K = /* wgsl */ `
fn kq_d(row: u32, sb: u32) -> f32 { return f16_bits_to_f32(w_u16(kq_at(row, sb) + 80u)); }
fn kq_dmin(row: u32, sb: u32) -> f32 { return f16_bits_to_f32(w_u16(kq_at(row, sb) + 82u)); }
fn kq_sc(row: u32, sb: u32, j: u32) -> i32 { return i32(w_u8(kq_at(row, sb) + j) & 15u); }
fn kq_m(row: u32, sb: u32, j: u32) -> i32 { return i32(w_u8(kq_at(row, sb) + j) >> 4u); }
fn kq_code(row: u32, sb: u32, e: u32) -> i32 {
  let byte = w_u8(kq_at(row, sb) + 16u + 32u * (e / 128u) + e % 32u);
  return i32((byte >> (2u * ((e % 128u) / 32u))) & 3u);
}
` + kElemWithMin;

// Q3_K (q3_k.h): [hmask 32: bit 4h + k of hmask[l], element 128h + 32k + l's high bit][qs 64: its
// low 2 bits, as Q2_K's][scales 12: sixteen 6-bit u, sc = u − 32][d f16]; code = low2 − (high
// bit ? 0 : 4) ∈ [−4, 3]; no mins. u[j]'s low 4 bits are scales[j] & 15 (j < 8) or
// scales[j − 8] >> 4, its high 2 bits (scales[8 + j % 4] >> 2·(j / 4)) & 3 (kquant.h,
// KQuantScales6x16).
const kQ3K = /* wgsl */ `
fn kq_d(row: u32, sb: u32) -> f32 { return f16_bits_to_f32(w_u16(kq_at(row, sb) + 108u)); }
fn kq_dmin(row: u32, sb: u32) -> f32 { return 0.0; }
fn kq_m(row: u32, sb: u32, j: u32) -> i32 { return 0; }
fn kq_sc(row: u32, sb: u32, j: u32) -> i32 {
  let s = kq_at(row, sb) + 96u;
  let byte = w_u8(s + j % 8u);
  let low = select(byte >> 4u, byte & 15u, j < 8u);
  let high = (w_u8(s + 8u + j % 4u) >> (2u * (j / 4u))) & 3u;
  return i32(low | (high << 4u)) - 32;
}
fn kq_code(row: u32, sb: u32, e: u32) -> i32 {
  let at = kq_at(row, sb);
  let k = (e % 128u) / 32u;
  let l = e % 32u;
  let low2 = (w_u8(at + 32u + 32u * (e / 128u) + l) >> (2u * k)) & 3u;
  let high = (w_u8(at + l) >> (4u * (e / 128u) + k)) & 1u;
  return i32(low2) - select(4, 0, high == 1u);
}
` + kElemNoMin;

/** K-quant types kquant_weights.js reads in the interleaved16 layout as well as the file's rows. */
const kGrouped = {q4_k: true, q6_k: true, q5_k: true};

/** WGSL of kq_* and w_elem for K-quant `type` in `layout` ('rows' or 'interleaved16'). */
export function KQuantWgsl(type, layout) {
  const body = {q4_k: kQ4K, q6_k: kQ6K, q5_k: kQ5K, q2_k: kQ2K, q3_k: kQ3K}[type];
  if (!body) throw new Error(`no WGSL for K-quant weight type '${type}'`);
  if (layout !== 'rows' && !(layout === 'interleaved16' && kGrouped[type])) throw new Error(`no WGSL for ${type} in layout ${layout}`);
  return `${Locate(kKQuantBytes[type], layout)}\n${body}`;
}
