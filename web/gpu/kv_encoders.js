// WGSL encoders of kvq's one-row KV formats, bit-identical to kvq's C++ codecs (src/formats/<name>/):
// new K and V rows (f32, [rows][n_kv_heads][head_dim]) become the bytes kvq's cache stores, on the
// GPU, so a step's rows can be written into the working set where attention reads them and reach
// the host master as bytes (no decode-encode round trip through the CPU).
//
// Exactness: every step is integer and bit work on the f32 bit patterns (WGSL lets a device assume
// no NaN or infinity in float arithmetic, so those are told apart by their bits, never by float
// compares), plus, for the int formats, one f32 division per head row (max|x| / (2^(b−1) − 1)) and
// one per number (x / s) and WGSL's round (half to even, as kvq's RoundHalfEven). The divisions
// are the CPU's only where the device divides correctly rounded (SwiftShader does; the tests check
// the bytes, which would show any device that does not).
//
// Two entry points per format: `scales` (int formats: one invocation per (row, head), the f16 scale
// bits into `scales`), then `encode`, one invocation per u32 word of the output: each of its bytes
// inside [first_byte, first_byte + rows · block) is computed from the rows (and scales); bytes
// outside keep what the word held, so a row can be written into a page whose rows are not 4-byte
// aligned, and neighbouring invocations never write the same word.

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
  return (x[row * elems + within / 4u] >> ((within % 4u) * 8u)) & 0xffu;
}`,
  f16: () => `fn block_byte(row: u32, within: u32) -> u32 {
  return (f32_to_f16_bits(x[row * elems + within / 2u]) >> ((within % 2u) * 8u)) & 0xffu;
}`,
  bf16: () => `fn block_byte(row: u32, within: u32) -> u32 {
  return (f32_to_bf16_bits(x[row * elems + within / 2u]) >> ((within % 2u) * 8u)) & 0xffu;
}`,
  int8: () => IntToken(8),
  int4: () => IntToken(4),
  int2: () => IntToken(2),
};

// kvq's int8 / int4 / int2 per token (src/formats/int_token/int_token.h): per head [s: f16][codes],
// s = f16(max|x| / qmax) saturated to 65504 (an infinite max too), raw = clamp(RNE(x / s) + 2^(b−1),
// 0, 2^b − 1), 2^(b−1) where s = 0; NaN numbers are left out of the max and get raw 0 (the C++
// clamp of a NaN), infinities clamp to the ends.
function IntToken(bits) {
  const per_byte = 8 / bits, offset = 1 << (bits - 1), qmax = offset - 1, raw_max = (1 << bits) - 1;
  return `
const head_bytes: u32 = 2u + head_dim * ${bits}u / 8u;
fn scale_bits(row: u32, head: u32) -> u32 {
  var amax = 0u;  // the largest |x| as bits (the order of non-negative floats), NaNs left out
  for (var i = 0u; i < head_dim; i++) {
    let a = x[row * elems + head * head_dim + i] & 0x7fffffffu;
    if (a <= 0x7f800000u) { amax = max(amax, a); }
  }
  if (amax == 0x7f800000u) { return 0x7bffu; }
  let s = f32_to_f16_bits(bitcast<u32>(bitcast<f32>(amax) / ${qmax}.0));
  return select(s, 0x7bffu, (s & 0x7fffu) >= 0x7c00u);
}
fn raw_code(u: u32, s: f32) -> u32 {
  let a = u & 0x7fffffffu;
  if (a > 0x7f800000u) { return 0u; }
  if (s == 0.0) { return ${offset}u; }
  if (a == 0x7f800000u) { return select(${raw_max}u, 0u, u != a); }
  return u32(clamp(round(bitcast<f32>(u) / s) + ${offset}.0, 0.0, ${raw_max}.0));
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
    byte |= raw_code(x[row * elems + head * head_dim + i], s) << (t * ${bits}u);
  }
  return byte;
}
@compute @workgroup_size(64)
fn scales_main(@builtin(global_invocation_id) id: vec3u) {
  if (id.x >= params.rows * n_kv_heads) { return; }
  scales[id.x] = scale_bits(id.x / n_kv_heads, id.x % n_kv_heads);
}`;
}

/** Formats with a GPU encoder (both tensors: these formats use one codec for K and V). */
export const kEncoderFormats = Object.keys(kByteOf);

/** Whether `format`'s encoder has a `scales_main` pass before `encode`. */
export function EncoderHasScales(format) { return format.startsWith('int'); }

/**
 * The WGSL module encoding rows of `format` at shape {n_kv_heads, head_dim, block_bytes}: bindings
 * 0 x (array<u32>: f32 bits [rows][n_kv_heads][head_dim]), 1 out (array<u32>: the blocks, written
 * from byte params.first_byte), 2 params ({rows, first_byte}), 3 scales (array<u32>: f16 bits
 * [rows][n_kv_heads], int formats). f16_bits_to_f32 comes from kv_formats.js's kByteHelpers.
 */
export function EncodeWgsl(format, shape, byte_helpers) {
  if (!kByteOf[format]) throw new Error(`no WGSL encoder for KV format '${format}' (have: ${kEncoderFormats.join(', ')})`);
  return /* wgsl */ `
const head_dim: u32 = ${shape.head_dim}u;
const n_kv_heads: u32 = ${shape.n_kv_heads}u;
const elems: u32 = ${shape.n_kv_heads * shape.head_dim}u;
const block: u32 = ${shape.block_bytes}u;
struct Params { rows: u32, first_byte: u32 }
@group(0) @binding(0) var<storage, read> x: array<u32>;           // [rows][n_kv_heads][head_dim] f32 bits
@group(0) @binding(1) var<storage, read_write> out: array<u32>;   // blocks from byte params.first_byte
@group(0) @binding(2) var<uniform> params: Params;
@group(0) @binding(3) var<storage, read_write> scales: array<u32>;  // [rows][n_kv_heads] f16 bits
${byte_helpers}
${kF16Encode}
${kByteOf[format]()}
@compute @workgroup_size(64)
fn encode(@builtin(global_invocation_id) id: vec3u) {
  let lo = params.first_byte;
  let hi = lo + params.rows * block;
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
 * Encodes rows on `device`: x (a GPUBuffer of f32 rows, or a Float32Array) into `out` (a GPUBuffer)
 * from byte `first_byte`, recorded into `encoder` (a GPUCommandEncoder). Pipelines are cached per
 * (format, shape) on the returned object.
 */
export class GpuKvEncoder {
  constructor(device, format, shape, byte_helpers) {
    this.device = device;
    this.format = format;
    this.shape = shape;
    const module = device.createShaderModule({code: EncodeWgsl(format, shape, byte_helpers)});
    this.encode = device.createComputePipeline({layout: 'auto', compute: {module, entryPoint: 'encode'}});
    this.scales = EncoderHasScales(format)
        ? device.createComputePipeline({layout: 'auto', compute: {module, entryPoint: 'scales_main'}}) : null;
    this.params = device.createBuffer({size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST});
    this.scale_buffer = null;
  }

  /** rows rows of x (GPUBuffer, f32 bits) into out from first_byte; commands into `encoder`. */
  Record(encoder, x, rows, out, first_byte) {
    const {n_kv_heads, block_bytes} = this.shape;
    this.device.queue.writeBuffer(this.params, 0, new Uint32Array([rows, first_byte, 0, 0]));
    const scale_bytes = Math.max(16, rows * n_kv_heads * 4);
    if (!this.scale_buffer || this.scale_buffer.size < scale_bytes) {
      this.scale_buffer?.destroy();
      this.scale_buffer = this.device.createBuffer({size: Math.ceil(scale_bytes / 16) * 16, usage: GPUBufferUsage.STORAGE});
    }
    const pass = encoder.beginComputePass();
    if (this.scales) {
      pass.setPipeline(this.scales);
      pass.setBindGroup(0, this.device.createBindGroup({layout: this.scales.getBindGroupLayout(0), entries: [
        {binding: 0, resource: {buffer: x}}, {binding: 2, resource: {buffer: this.params}},
        {binding: 3, resource: {buffer: this.scale_buffer}}]}));
      pass.dispatchWorkgroups(Math.max(1, Math.ceil(rows * n_kv_heads / 64)));
    }
    pass.setPipeline(this.encode);
    const entries = [{binding: 0, resource: {buffer: x}}, {binding: 1, resource: {buffer: out}},
                     {binding: 2, resource: {buffer: this.params}}];
    if (this.scales) entries.push({binding: 3, resource: {buffer: this.scale_buffer}});
    pass.setBindGroup(0, this.device.createBindGroup({layout: this.encode.getBindGroupLayout(0), entries}));
    const words = Math.floor((first_byte + rows * block_bytes + 3) / 4) - Math.floor(first_byte / 4);
    pass.dispatchWorkgroups(Math.max(1, Math.ceil(words / 64)));
    pass.end();
  }
}
