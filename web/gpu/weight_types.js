// Weight matrices on a WebGPU device in the bytes a GGUF file holds (kvq's weight-type registry,
// src/weights/<type>/): WGSL that dequantises element (row, col) inside the shader, and a matvec
// over it. Every decode is integer and bit work plus f32 multiplies of exact operands (an f16
// scale times small integers; the types with a min — Q4_1, Q5_1, the K-quants' dmin — then add
// or subtract it, one rounding, as ggml does), so it gives the bits of kvq's scalar DequantizeBlock;
// tests/web/gpu/gpu_attention_page.js (RunGpuMatvecTests) checks that for every weight.
//
// The matvec takes each row's sum in order of the column in f32 (one invocation per row). kvq's
// CPU matvec for the block types quantises the activation to int8 per 32 numbers instead
// (weights/matvec.h); this one keeps the activation in f32.

import {kKQuantBytes, KQuantWgsl} from './kquant_weights.js';
import {kByteHelpers, Readers} from './kv_formats.js';

// Per type: elems, bytes: a block's elements and bytes; elem: WGSL body of w_elem given the
// block's byte offset `at` and the element `j` within the block; for the types whose CPU matvec
// quantises the activation (weights/matvec.h) code: the WGSL of element j's integer code (weight =
// d · code, d the f16 at byte 0), and for those with a min (weight = d · code + m) min: the byte
// of m's f16 in the block.
const kTypes = {
  // IEEE binary32 / binary16 / bfloat16, one element per block.
  f32: {elems: 1, bytes: 4, elem: 'return bitcast<f32>(w_u32(at));'},
  f16: {elems: 1, bytes: 2, elem: 'return f16_bits_to_f32(w_u16(at));'},
  bf16: {elems: 1, bytes: 2, elem: 'return bitcast<f32>(w_u16(at) << 16u);'},
  // Q8_0: [d: f16][32 × int8]; w = d · q.
  q8_0: {elems: 32, bytes: 34, elem: `let d = f16_bits_to_f32(w_u16(at));
  let q = i32(w_u8(at + 2u + j) << 24u) >> 24u;
  return d * f32(q);`, code: 'return i32(w_u8(at + 2u + j) << 24u) >> 24u;'},
  // Q4_0: [d: f16][16 bytes]: element j < 16 in the low nibble of byte j, j ≥ 16 in the high
  // nibble of byte j − 16; w = d · (nibble − 8).
  q4_0: {elems: 32, bytes: 18, elem: `let d = f16_bits_to_f32(w_u16(at));
  let byte = w_u8(at + 2u + j % 16u);
  let nibble = select(byte >> 4u, byte & 15u, j < 16u);
  return d * f32(i32(nibble) - 8);`, code: `let byte = w_u8(at + 2u + j % 16u);
  return i32(select(byte >> 4u, byte & 15u, j < 16u)) - 8;`},
  // Q4_1 (q4_1.h): [d: f16][m: f16][16 bytes, Q4_0's nibbles]; w = nibble · d + m (ggml's order:
  // the product is exact, the add rounds once). The matvec's code is the unsigned nibble.
  q4_1: {elems: 32, bytes: 20, min: 2, elem: `let byte = w_u8(at + 4u + j % 16u);
  return f32(select(byte >> 4u, byte & 15u, j < 16u)) * f16_bits_to_f32(w_u16(at)) + f16_bits_to_f32(w_u16(at + 2u));`,
  code: `let byte = w_u8(at + 4u + j % 16u);
  return i32(select(byte >> 4u, byte & 15u, j < 16u));`},
  // Q5_0 (q5_0.h): [d: f16][qh: 32 high bits, bit j for element j][16 bytes, Q4_0's nibbles];
  // w = d · ((nibble | high bit << 4) − 16), exact.
  q5_0: {elems: 32, bytes: 22, elem: `return f16_bits_to_f32(w_u16(at)) * f32(q5_code(at + 2u, j) - 16);`,
         code: 'return q5_code(at + 2u, j) - 16;'},
  // Q5_1 (q5_1.h): [d: f16][m: f16][qh][16 bytes]; w = n · d + m with n Q5_0's 5 bits unsigned.
  q5_1: {elems: 32, bytes: 24, min: 2, elem: `return f32(q5_code(at + 4u, j)) * f16_bits_to_f32(w_u16(at)) + f16_bits_to_f32(w_u16(at + 2u));`,
         code: 'return q5_code(at + 4u, j);'},
  // Q1_0 (PrismML, Bonsai): [d: f16][16 bytes of sign bits, LSB first]; w = bit ? +d : −d.
  q1_0: {elems: 128, bytes: 18, elem: `let d = f16_bits_to_f32(w_u16(at));
  let bit = (w_u8(at + 2u + j / 8u) >> (j % 8u)) & 1u;
  return select(-d, d, bit == 1u);`, code: 'return select(-1, 1, ((w_u8(at + 2u + j / 8u) >> (j % 8u)) & 1u) == 1u);'},
  // Q2_0 (PrismML, Bonsai; q2_0.h): [d: f16][16 bytes, four 2-bit codes each, lowest bits first];
  // w = d · (code − 1), exact (−0 for code 1 where d < 0, as the CPU's table).
  q2_0: {elems: 64, bytes: 18, elem: `return f16_bits_to_f32(w_u16(at)) * f32(i32((w_u8(at + 2u + j / 4u) >> (2u * (j % 4u))) & 3u) - 1);`,
         code: 'return i32((w_u8(at + 2u + j / 4u) >> (2u * (j % 4u))) & 3u) - 1;'},
};

// Q5_0 / Q5_1's unsigned 5-bit value of element j from its qh at byte `qh` (a little-endian
// uint32, read a byte at a time: blocks are not 4-byte aligned) and the nibbles after it.
const kFiveBitCode = /* wgsl */ `
fn q5_code(qh: u32, j: u32) -> i32 {
  let byte = w_u8(qh + 4u + j % 16u);
  let nibble = select(byte >> 4u, byte & 15u, j < 16u);
  return i32(nibble | (((w_u8(qh + j / 8u) >> (j % 8u)) & 1u) << 4u));
}`;

// The repacked layout (MatrixLayout::kInterleaved16, weights/repack.h) of the types that have one
// here: per group of 16 rows and block, the 16 rows' f16 scales, then vectors of 64 bytes whose
// byte 4r + i is row r's code byte 4k + i (k: the vector). The last rows % 16 rows stay row-major.
// The types WeightReaderWgsl reads in that layout:
const kInterleaved16 = {
  q8_0: true,
  q4_0: true,
  // The K-quants' groups (weights/kquant_repack.h) are read by kquant_weights.js.
  q4_k: true,
  q6_k: true,
  q5_k: true,
};
// The WebAssembly module repacks nothing: LoadModel repacks Q4_0 and Q8_0 only where their x86
// kernels run (weights_q4_0::RepackPays, weights_q8_0::RepackPays; the module's 128-bit row
// kernels are faster than its portable group loops), Q1_0 and Q2_0 only where their AVX3_DL
// kernels run (weights_q1_0::RepackPays, weights_q2_0::RepackPays), every K-quant only where its
// x86 kernels run (KQuantRepackPays), and no other type has a repacked layout (weights/repack.h,
// weights/kquant_repack.h). The groups above are read all the same, checked against the CPU.
/** Weight types WeightReaderWgsl also reads in the interleaved16 layout. */
export const kInterleavedTypes = Object.keys(kInterleaved16);

/**
 * WGSL for the weights of `type` in `layout` ('rows' or 'interleaved16') in w_buf (array<u32>):
 *   w_elem(row, col) -> f32    the weight, decoded exactly
 * and, for the types whose CPU matvec quantises the activation, per block of the type
 *   w_scale(row, block) -> f32 and w_code(row, block, j) -> i32 (weight = scale · code), and for
 *   the types with a min also w_min(row, block) -> f32 (weight = scale · code + min)
 * over uniform `dims` {rows, cols, row_bytes, first_byte}.
 */
export function WeightReaderWgsl(type, layout) {
  if (kKQuantBytes[type]) return KQuantWgsl(type, layout);
  const info = kTypes[type];
  if (!info) throw new Error(`no WGSL for weight type '${type}' (have: ${kGpuWeightTypes.join(', ')})`);
  if (layout !== 'rows' && !(layout === 'interleaved16' && kInterleaved16[type])) {
    throw new Error(`no WGSL for weight type '${type}' in layout ${layout}`);
  }
  const {elems, bytes, elem, code, min} = info;
  // Row-major: block `block` of `row` at first_byte + row · row_bytes + block · bytes.
  const rows_at = `dims.first_byte + row * dims.row_bytes + block * ${bytes}u`;
  let locate, read;
  if (layout === 'rows') {
    locate = `fn w_block_at(row: u32, block: u32) -> u32 { return ${rows_at}; }
// A block's scale and code bytes in the row-major layout: contiguous after the scale.
fn w_scale_at(row: u32, block: u32) -> u32 { return w_block_at(row, block); }
fn w_code_byte(row: u32, block: u32, s: u32) -> u32 { return w_block_at(row, block) + 2u + s; }`;
    read = (wgsl) => `let at = w_block_at(row, block);\n  ${wgsl}`;
  } else {
    locate = `fn w_grouped(row: u32) -> bool { return row < dims.rows - dims.rows % 16u; }
fn w_group_block(row: u32, block: u32) -> u32 {
  return dims.first_byte + (row / 16u) * 16u * dims.row_bytes + block * 16u * ${bytes}u;
}
fn w_scale_at(row: u32, block: u32) -> u32 {
  if (!w_grouped(row)) { return ${rows_at}; }
  return w_group_block(row, block) + 2u * (row % 16u);
}
fn w_code_byte(row: u32, block: u32, s: u32) -> u32 {
  if (!w_grouped(row)) { return ${rows_at} + 2u + s; }
  return w_group_block(row, block) + 32u + (s / 4u) * 64u + 4u * (row % 16u) + s % 4u;
}`;
    // Element j's code read through w_code_byte: the bodies of the interleaved types address
    // `at + 2u + s`, so they are rewritten to read code byte s of (row, block) wherever the
    // layout put it.
    read = (wgsl) => wgsl.replace(/w_u8\(at \+ 2u \+ ([^)]*\))\)/g, 'w_u8(w_code_byte(row, block, $1))')
                         .replace(/w_u8\(at \+ 2u \+ ([^)]*)\)/g, 'w_u8(w_code_byte(row, block, $1))')
                         .replace(/w_u16\(at\)/g, 'w_u16(w_scale_at(row, block))');
  }
  return /* wgsl */ `
${locate}
${elem.includes('q5_code') ? kFiveBitCode : ''}
fn w_elem(row: u32, col: u32) -> f32 {
  let block = col / ${elems}u;
  let j = col % ${elems}u;
  ${read(elem)}
}
${code ? `fn w_scale(row: u32, block: u32) -> f32 { return f16_bits_to_f32(w_u16(w_scale_at(row, block))); }
fn w_code(row: u32, block: u32, j: u32) -> i32 {
  ${read(code)}
}` : ''}
${min !== undefined ? `fn w_min(row: u32, block: u32) -> f32 { return f16_bits_to_f32(w_u16(w_block_at(row, block) + ${min}u)); }` : ''}`;
}

/**
 * Elements and bytes per block of `type`, whether its CPU matvec quantises the activation,
 * whether its weights have a min (w_min: Q4_1, Q5_1), and whether it is a K-quant (super-blocks
 * with sub-block scales: kquant_weights.js).
 */
export function WeightBlock(type) {
  if (kKQuantBytes[type]) return {elems: 256, bytes: kKQuantBytes[type], quantized_activation: true, kquant: true};
  const info = kTypes[type];
  if (!info) throw new Error(`no WGSL for weight type '${type}' (have: ${kGpuWeightTypes.join(', ')})`);
  return {elems: info.elems, bytes: info.bytes, quantized_activation: info.code !== undefined, min: info.min !== undefined};
}

/** Weight types the WGSL matvec reads. */
export const kGpuWeightTypes = [...Object.keys(kTypes), ...Object.keys(kKQuantBytes)];

/** Bytes of one row of `cols` weights of `type`. */
export function RowBytes(type, cols) {
  const {elems, bytes} = WeightBlock(type);
  if (cols % elems !== 0) throw new Error(`${type} rows hold multiples of ${elems} weights (got ${cols})`);
  return cols / elems * bytes;
}

function MatvecWgsl(type) {
  return /* wgsl */ `
struct Dims { rows: u32, cols: u32, row_bytes: u32, first_byte: u32 }
@group(0) @binding(0) var<storage, read> w_buf: array<u32>;   // the matrix's bytes as the file holds them
@group(0) @binding(1) var<storage, read> x: array<f32>;       // [cols]
@group(0) @binding(2) var<storage, read_write> y: array<f32>; // [rows]
@group(0) @binding(3) var<uniform> dims: Dims;

${kByteHelpers}
${Readers('w')}
// Weight (row, col) of the matrix starting at byte first_byte, rows back to back.
${WeightReaderWgsl(type, 'rows')}

// y[r] = Σ_c w[r][c] · x[c], in order of c.
@compute @workgroup_size(64)
fn matvec(@builtin(global_invocation_id) id: vec3u) {
  if (id.x >= dims.rows) { return; }
  var sum = 0.0;
  for (var c = 0u; c < dims.cols; c++) { sum = sum + w_elem(id.x, c) * x[c]; }
  y[id.x] = sum;
}

// y[r · cols + c] = w[r][c]: the decode, for the exactness check.
@compute @workgroup_size(64)
fn dequantize(@builtin(global_invocation_id) id: vec3u) {
  if (id.x >= dims.rows * dims.cols) { return; }
  y[id.x] = w_elem(id.x / dims.cols, id.x % dims.cols);
}
`;
}

/** A matvec over weights of one type held in GPU buffers as their file's bytes. */
export class GpuMatvec {
  static async Create(device, type) {
    if (!kGpuWeightTypes.includes(type)) throw new Error(`no WGSL matvec for weight type '${type}' (have: ${kGpuWeightTypes.join(', ')})`);
    const module = device.createShaderModule({code: MatvecWgsl(type)});
    const info = await module.getCompilationInfo();
    const errors = info.messages.filter((m) => m.type === 'error');
    if (errors.length) throw new Error(`matvec WGSL for ${type}: ${errors.map((m) => `${m.lineNum}: ${m.message}`).join('; ')}`);
    const pipeline = async (entryPoint) => device.createComputePipelineAsync({layout: 'auto', compute: {module, entryPoint}});
    return new GpuMatvec(device, type, await pipeline('matvec'), await pipeline('dequantize'));
  }

  constructor(device, type, matvec, dequantize) {
    this.device = device;
    this.type = type;
    this.pipelines = {matvec, dequantize};
    this.dims = [];  // uniform buffers by dispatch index (reused: queue order keeps them apart)
  }

  /**
   * Records y = W x into `encoder`: W the rows × cols matrix at byte `first_byte` of the buffer w
   * (its rows back to back), x [cols] and y [rows] GPU buffers. `index` picks the uniform buffer:
   * dispatches recorded into one encoder need different ones.
   */
  Record(encoder, index, w, first_byte, rows, cols, x, y, entry = 'matvec') {
    const device = this.device;
    if (!this.dims[index]) {
      this.dims[index] = device.createBuffer({size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST});
    }
    device.queue.writeBuffer(this.dims[index], 0, new Uint32Array([rows, cols, RowBytes(this.type, cols), first_byte]));
    const pipeline = this.pipelines[entry];
    const entries = [{binding: 0, resource: {buffer: w}}, {binding: 2, resource: {buffer: y}},
                     {binding: 3, resource: {buffer: this.dims[index]}}];
    if (entry === 'matvec') entries.push({binding: 1, resource: {buffer: x}});
    const pass = encoder.beginComputePass();
    pass.setPipeline(pipeline);
    pass.setBindGroup(0, device.createBindGroup({layout: pipeline.getBindGroupLayout(0), entries}));
    pass.dispatchWorkgroups(Math.ceil((entry === 'matvec' ? rows : rows * cols) / 64));
    pass.end();
  }
}
