// The WGSL kernels of the step program (web/gpu/step_program.js): one module of the ops that need
// no weight decoding, and per (weight type, layout) one module of the weight ops (matvec, a prefill
// block's matmul: matmul_kernels.js's row kernel or the 'lanes' one here, the embedding row). Each mirrors the kvq op named beside it; f32 throughout. Norm sums and the argmax
// are workgroup trees; a matvec row's sum is in order, as kvq's scalar kernels add (a block type's
// rows 8 to a workgroup whose lanes form the terms; F32, F16 and BF16 rows one invocation each): every
// order is fixed by the code, not by scheduling, so a step gives the same bits every time on one
// device. (Tiled and subgroup kernels: later.)

import {kDivRnWgsl} from './div_rn.js';
import {kByteHelpers, Readers} from './kv_formats.js';
import {BlockCodesWgsl, kMatmulTokens, MatmulLanesTermsWgsl, MatmulWgsl} from './matmul_kernels.js';
import {WeightBlock, WeightReaderWgsl} from './weight_types.js';

/** Lanes of the reduction workgroups (norms, argmax); invocations per matvec and matmul workgroup. */
export const kNormLanes = 64;
export const kRowLanes = 64;
/** Rows of a matvec workgroup of a type that quantises its activation (its lanes share them). */
export const kMatvecRows = 8;

/**
 * Whether an adapter (its GPUAdapterInfo) is a CPU emulation (SwiftShader): there a workgroup that
 * shares memory runs each invocation as a coroutine, and kernels with a lane per row are faster.
 */
export function IsEmulatedAdapter(info) {
  return Boolean(info?.isFallbackAdapter) || /swiftshader/i.test(info?.architecture || '');
}

/**
 * The matvec kernel for a device: 'lanes' (a block type's rows shared by a workgroup's lanes) on a
 * GPU, 'rows' (a row per invocation) on an emulated adapter. Both give the same bits.
 */
export function MatvecKernelFor(device) {
  return IsEmulatedAdapter(device.adapterInfo) ? 'rows' : 'lanes';
}

/** The matvec's workgroups [x, y] for `rows` rows of a weight of `type` with `kernel`. */
export function MatvecGroups(type, rows, kernel) {
  const lanes = kernel === 'lanes' && WeightBlock(type).quantized_activation;
  const groups = Math.ceil(rows / (lanes ? kMatvecRows : kRowLanes));
  return [Math.min(groups, 32768), Math.ceil(groups / 32768)];
}

/**
 * The matmul's workgroups [x, y, z] for `rows` rows and `tokens` tokens: the 'lanes' kernel takes a
 * group of kMatmulTokens tokens per workgroup (z), the row kernel every token in each invocation.
 */
export function MatmulGroups(type, rows, tokens, kernel) {
  const lanes = kernel === 'lanes' && WeightBlock(type).quantized_activation;
  return [...MatvecGroups(type, rows, kernel), lanes ? Math.ceil(tokens / kMatmulTokens) : 1];
}

// Bindings (auto layouts hold only those an entry point uses): the weights as u32 words, the
// input x, the output y, the op's uniform, the step's [token, position], the RoPE table, the
// argmax output, the quantised activation.
export const kOpsWgsl = /* wgsl */ `
// n: elements; a: a weight vector's first word in w (norms, biases), head_dim (rope) or x's floats
// per token (quantize); b: eps's bits (norms), rotary dims (rope) or xd's floats per token
// (quantize); c: the RoPE pairing (0 adjacent, 1 halves).
struct P { n: u32, a: u32, b: u32, c: u32 }
@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;
@group(0) @binding(5) var<storage, read> rope_table: array<f32>;  // [rotary_dims / 2][cos, sin]
@group(0) @binding(6) var<storage, read_write> out_id: array<u32>; // [1] the argmax
@group(0) @binding(7) var<storage, read_write> xq: array<i32>;     // [cols] activation codes
@group(0) @binding(8) var<storage, read_write> xd: array<f32>;     // [cols / 32] their scales

fn wf(i: u32) -> f32 { return bitcast<f32>(w[i]); }

var<workgroup> part: array<f32, ${kNormLanes}>;
var<workgroup> part_i: array<u32, ${kNormLanes}>;

fn tree_sum(lid: u32) -> f32 {
  for (var s = ${kNormLanes / 2}u; s > 0u; s >>= 1u) {
    if (lid < s) { part[lid] = part[lid] + part[lid + s]; }
    workgroupBarrier();
  }
  return part[0];
}

// RmsNorm: y = w · (x / sqrt(mean(x²) + eps)), the sum of squares a workgroup tree.
@compute @workgroup_size(${kNormLanes})
fn rmsnorm(@builtin(local_invocation_id) l: vec3u) {
  var ss = 0.0;
  for (var i = l.x; i < p.n; i += ${kNormLanes}u) { ss = ss + x[i] * x[i]; }
  part[l.x] = ss;
  workgroupBarrier();
  let scale = 1.0 / sqrt(tree_sum(l.x) / f32(p.n) + bitcast<f32>(p.b));
  for (var i = l.x; i < p.n; i += ${kNormLanes}u) { y[i] = wf(p.a + i) * (scale * x[i]); }
}

// Qwen3's per-head RmsNorm of y in place: one workgroup per head of p.n numbers.
@compute @workgroup_size(${kNormLanes})
fn head_rmsnorm(@builtin(local_invocation_id) l: vec3u, @builtin(workgroup_id) g: vec3u) {
  let base = g.x * p.n;
  var ss = 0.0;
  for (var i = l.x; i < p.n; i += ${kNormLanes}u) { ss = ss + y[base + i] * y[base + i]; }
  part[l.x] = ss;
  workgroupBarrier();
  let scale = 1.0 / sqrt(tree_sum(l.x) / f32(p.n) + bitcast<f32>(p.b));
  for (var i = l.x; i < p.n; i += ${kNormLanes}u) { y[base + i] = wf(p.a + i) * (scale * y[base + i]); }
}

// RotateByCosSin: pair i of each head (adjacent: 2i, 2i+1; halves: i, i + rot/2) by the table's
// cos and sin (kvq's RopeCosSin, computed by the module for this position).
@compute @workgroup_size(64)
fn rope(@builtin(global_invocation_id) id: vec3u) {
  let half = p.b / 2u;
  if (id.x >= (p.n / p.a) * half) { return; }
  let head = id.x / half;
  let i = id.x % half;
  let h = head * p.a;
  let ia = select(h + i, h + 2u * i, p.c == 0u);
  let ib = select(h + i + half, h + 2u * i + 1u, p.c == 0u);
  let c = rope_table[2u * i];
  let s = rope_table[2u * i + 1u];
  let xa = y[ia];
  let xb = y[ib];
  y[ia] = xa * c - xb * s;
  y[ib] = xa * s + xb * c;
}

// y += x (the residual adds).
@compute @workgroup_size(64)
fn add(@builtin(global_invocation_id) id: vec3u) {
  if (id.x < p.n) { y[id.x] = y[id.x] + x[id.x]; }
}

// y += w[a ..] (AddBias).
@compute @workgroup_size(64)
fn bias(@builtin(global_invocation_id) id: vec3u) {
  if (id.x < p.n) { y[id.x] = y[id.x] + wf(p.a + id.x); }
}

// y = x.
@compute @workgroup_size(64)
fn copy(@builtin(global_invocation_id) id: vec3u) {
  if (id.x < p.n) { y[id.x] = x[id.x]; }
}

// SwiGlu: y = (g · σ(g)) · x with g = y, σ(g) = 1 / (1 + exp(−g)).
@compute @workgroup_size(64)
fn swiglu(@builtin(global_invocation_id) id: vec3u) {
  if (id.x >= p.n) { return; }
  let g = y[id.x];
  let sig = 1.0 / (1.0 + exp(-g));
  y[id.x] = (g * sig) * x[id.x];
}

// The first index of the largest x (greedy sampling): each lane its stride, then a tree that
// keeps the larger value and, on a tie, the smaller index.
@compute @workgroup_size(${kNormLanes})
fn argmax(@builtin(local_invocation_id) l: vec3u) {
  var best = -3.4028234663852886e38;
  var best_i = 0xffffffffu;
  for (var i = l.x; i < p.n; i += ${kNormLanes}u) {
    if (x[i] > best || best_i == 0xffffffffu) { best = x[i]; best_i = i; }
  }
  part[l.x] = best;
  part_i[l.x] = best_i;
  workgroupBarrier();
  for (var s = ${kNormLanes / 2}u; s > 0u; s >>= 1u) {
    if (l.x < s) {
      let o = l.x + s;
      if (part_i[o] != 0xffffffffu &&
          (part_i[l.x] == 0xffffffffu || part[o] > part[l.x] || (part[o] == part[l.x] && part_i[o] < part_i[l.x]))) {
        part[l.x] = part[o];
        part_i[l.x] = part_i[o];
      }
    }
    workgroupBarrier();
  }
  if (l.x == 0u) { out_id[0] = part_i[0]; }
}

${kDivRnWgsl}
// QuantizeActivation (weights/matvec.h) of x [n]: per block of 32, d = amax / 127, codes
// round-half-even(x / d) clamped to ±127; a zero block gets d = 0 and codes 0. A prefill block's
// tokens in one dispatch (workgroups along y: token id.y's x at id.y · p.a, its codes at id.y · n,
// its scales at id.y · p.b; one token: p.a = p.b = 0).
@compute @workgroup_size(64)
fn quantize(@builtin(global_invocation_id) id: vec3u) {
  if (id.x >= p.n / 32u) { return; }
  let base = id.x * 32u;
  let xo = id.y * p.a + base;
  let qo = id.y * p.n + base;
  var amax = 0.0;
  for (var i = 0u; i < 32u; i++) { amax = max(amax, abs(x[xo + i])); }
  let d = div_rn(amax, 127.0);
  xd[id.y * p.b + id.x] = d;
  for (var i = 0u; i < 32u; i++) {
    // round-half-even of the clamped quotient, as the CPU's magic-number rounding.
    xq[qo + i] = select(i32(round(clamp(div_rn(x[xo + i], d), -127.0, 127.0))), 0, d == 0.0);
  }
}
`;

/** Bindings each entry point of kOpsWgsl uses. */
export const kOpsBindings = {
  rmsnorm: [0, 1, 2, 3], head_rmsnorm: [0, 2, 3], rope: [2, 3, 5], add: [1, 2, 3], bias: [0, 2, 3], copy: [1, 2, 3],
  swiglu: [1, 2, 3], argmax: [1, 3, 6], quantize: [1, 3, 7, 8],
};

/**
 * The weight ops of `type` in `layout`: matvec (f32 activation or quantised; `kernel` as
 * MatvecKernelFor says), matmul, embed.
 */
export function WeightOpsWgsl(type, layout, kernel = 'rows') {
  if (kernel !== 'rows' && kernel !== 'lanes') throw new Error(`matvec kernel '${kernel}' (have: rows, lanes)`);
  const {elems, quantized_activation, kquant, min} = WeightBlock(type);
  // matvec_term(row, b, qo, dxo): activation block b's terms of the row's two sums (the second 0
  // where the type has one sum), each term's operands and operations the scalar kernel's;
  // matvec_row adds them in order of b and finishes the row (matvec_finish). The activation's
  // codes start at xq[qo], its scales at xd[dxo] (xo, its f32 start, unused here).
  const matvec_k = `
// MatVec of a K-quant (weights/kquant_rows-inl.h's scalar kernel): per activation block b of 32
// (half a Q4_K sub-block pair, two Q6_K sub-blocks of 16) the exact integers dot = Σ_j sc_j·Σ code·q
// and mins = Σ_j m_j·Σ q over its two 16-element sub-blocks j, then acc += (d·d_x)·dot and
// macc += (dmin·d_x)·mins in f32 in order of b; the row's value is acc − macc.
fn matvec_term(row: u32, b: u32, qo: u32, dxo: u32) -> vec2f {
  let sb = b / 8u;
  var dot = 0;
  var mins = 0;
  for (var h = 0u; h < 2u; h++) {
    let j = (b % 8u) * 2u + h;
    var sub = 0;
    var sum16 = 0;
    for (var l = 0u; l < 16u; l++) {
      let q = xq[qo + b * 32u + 16u * h + l];
      sub = sub + kq_code(row, sb, 16u * j + l) * q;
      sum16 = sum16 + q;
    }
    dot = dot + kq_sc(row, sb, j) * sub;
    mins = mins + kq_m(row, sb, j) * sum16;
  }
  return vec2f((kq_d(row, sb) * xd[dxo + b]) * f32(dot), (kq_dmin(row, sb) * xd[dxo + b]) * f32(mins));
}
fn matvec_finish(s: vec2f) -> f32 { return s.x - s.y; }`;
  const matvec_q = `
// MatVec with the activation quantised (weights/matvec.h): per activation block b of 32 the exact
// integer I_b = Σ code·q, then Σ_b (d_w · d_x) · I_b in f32 in order of b. A type with a min
// (Q4_1, Q5_1) also sums Σ_b (m · d_x) · Σq apart and adds the two sums last, as the scalar
// kernel does (weights/quant_rows-inl.h).
fn matvec_term(row: u32, b: u32, qo: u32, dxo: u32) -> vec2f {
  let block = (b * 32u) / ${elems}u;
  let first = (b * 32u) % ${elems}u;
  var dot = 0;
  ${BlockCodesWgsl(type, (code, j) => `dot = dot + ${code} * xq[qo + b * 32u + ${j}];`)}
  ${min ? `var q_sum = 0;  // Σq of the block, exact
  for (var j = 0u; j < 32u; j++) { q_sum = q_sum + xq[qo + b * 32u + j]; }
  return vec2f((w_scale(row, block) * xd[dxo + b]) * f32(dot), (w_min(row, block) * xd[dxo + b]) * f32(q_sum));`
      : 'return vec2f((w_scale(row, block) * xd[dxo + b]) * f32(dot), 0.0);'}
}
fn matvec_finish(s: vec2f) -> f32 { return ${min ? 's.x + s.y' : 's.x'}; }`;
  const matvec_blocks = `
// A block's terms added to the row's sums (the second only where the type has two).
fn matvec_add(sums: ptr<function, vec2f>, term: vec2f) {
  ${kquant || min ? '*sums = vec2f((*sums).x + term.x, (*sums).y + term.y);' : '(*sums).x = (*sums).x + term.x;'}
}
fn matvec_row(row: u32, xo: u32, qo: u32, dxo: u32) -> f32 {
  var sums = vec2f(0.0, 0.0);
  for (var b = 0u; b < dims.cols / 32u; b++) { matvec_add(&sums, matvec_term(row, b, qo, dxo)); }
  return matvec_finish(sums);
}`;
  const matvec_lanes = `
var<workgroup> terms: array<vec2f, ${kMatvecRows * kRowLanes}>;  // [row of the group][block of the tile]

// MatVec: ${kMatvecRows} rows of the piece per workgroup. Per tile of up to ${kRowLanes} activation blocks the
// lanes form the rows' terms (a full tile: lane l forms block l of each row; a narrow one packs
// several rows' blocks into the lanes), then lane r adds row r's in order of b: matvec_row's
// operands and order, the work of a row spread over the lanes.
@compute @workgroup_size(${kRowLanes})
fn matvec(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let first_row = (wg.x + wg.y * 32768u) * ${kMatvecRows}u;
  let blocks = dims.cols / 32u;
  var sums = vec2f(0.0, 0.0);  // lane r < ${kMatvecRows}: row first_row + r's
  for (var b0 = 0u; b0 < blocks; b0 += ${kRowLanes}u) {
    let tile = min(${kRowLanes}u, blocks - b0);  // blocks of this tile
    for (var k = lid; k < ${kMatvecRows}u * tile; k += ${kRowLanes}u) {  // term k: row k / tile, block k % tile
      let r = k / tile;
      if (first_row + r < dims.rows) { terms[r * ${kRowLanes}u + k % tile] = matvec_term(first_row + r, b0 + k % tile, 0u, 0u); }
    }
    workgroupBarrier();
    if (lid < ${kMatvecRows}u) {
      for (var u = 0u; u < tile; u++) { matvec_add(&sums, terms[lid * ${kRowLanes}u + u]); }
    }
    workgroupBarrier();
  }
  if (lid < ${kMatvecRows}u && first_row + lid < dims.rows) { y[dims.row0 + first_row + lid] = matvec_finish(sums); }
}`;
  // Per tile: kMatvecRows rows × kMatmulTokens tokens × kMatmulTileBlocks blocks of terms.
  const tile_blocks = kRowLanes * kMatvecRows / (kMatvecRows * kMatmulTokens);
  const matmul_lanes = `
var<workgroup> mm_terms: array<vec2f, ${kMatvecRows * kMatmulTokens * tile_blocks}>;  // [row][token][block of the tile]
${MatmulLanesTermsWgsl(type, WeightBlock(type), tile_blocks)}
// MatMul over a block of tokens: ${kMatvecRows} rows of the piece and a group of ${kMatmulTokens} tokens (z) per
// workgroup. Per tile of ${tile_blocks} activation blocks lane k forms row k / tile's terms of block
// k % tile for every token of the group (matmul_terms: the weight block read once for the group,
// each term matvec_term's), then lane ${kMatmulTokens}·r + t adds row r's for token t in order of b: each
// token's y has its matvec's bits.
@compute @workgroup_size(${kRowLanes})
fn matmul(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let first_row = (wg.x + wg.y * 32768u) * ${kMatvecRows}u;
  let t0 = wg.z * ${kMatmulTokens}u;
  let in_group = min(${kMatmulTokens}u, dims.tokens - t0);  // tokens in this group
  let blocks = dims.cols / 32u;
  var sums = vec2f(0.0, 0.0);  // lane ${kMatmulTokens}·r + t: row first_row + r's for token t0 + t
  for (var b0 = 0u; b0 < blocks; b0 += ${tile_blocks}u) {
    let tile = min(${tile_blocks}u, blocks - b0);
    for (var k = lid; k < ${kMatvecRows}u * tile; k += ${kRowLanes}u) {  // row k / tile, block k % tile
      let r = k / tile;
      if (first_row + r < dims.rows) {
        matmul_terms(first_row + r, b0 + k % tile, t0, in_group, r * ${kMatmulTokens * tile_blocks}u + k % tile);
      }
    }
    workgroupBarrier();
    for (var u = 0u; u < tile; u++) { matvec_add(&sums, mm_terms[lid * ${tile_blocks}u + u]); }
    workgroupBarrier();
  }
  let r = lid / ${kMatmulTokens}u;
  let t = lid % ${kMatmulTokens}u;
  if (first_row + r < dims.rows && t < in_group) { y[(t0 + t) * dims.y_stride + dims.row0 + first_row + r] = matvec_finish(sums); }
}`;
  const matvec_f32 = `
// MatVec, f32 activation: the row's products summed in order of the column; x starts at x[xo]
// (qo, dxo unused here).
fn matvec_row(row: u32, xo: u32, qo: u32, dxo: u32) -> f32 {
  var sum = 0.0;
  for (var c = 0u; c < dims.cols; c++) { sum = sum + w_elem(row, c) * x[xo + c]; }
  return sum;
}`;
  return /* wgsl */ `
// One piece of a weight (step_program.js's WeightPlacement): its rows row0 .. row0 + rows of the
// matrix, starting at byte first_byte of the bound buffer.
// matmul only (matmul_kernels.js): tokens, and per token the floats of y (y_stride), of the scales
// xd (xd_stride) and of x (x_stride).
struct Dims { rows: u32, cols: u32, row_bytes: u32, first_byte: u32, row0: u32, tokens: u32, y_stride: u32,
              xd_stride: u32, x_stride: u32 }
@group(0) @binding(0) var<storage, read> w_buf: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;        // [cols] (matmul: [tokens][x_stride])
@group(0) @binding(2) var<storage, read_write> y: array<f32>;  // [row0 + rows] (matmul: [tokens][y_stride])
@group(0) @binding(3) var<uniform> dims: Dims;
@group(0) @binding(4) var<storage, read> step: array<u32>;     // [token, position]
@group(0) @binding(7) var<storage, read> xq: array<i32>;       // [cols] activation codes (matmul: [tokens][cols])
@group(0) @binding(8) var<storage, read> xd: array<f32>;       // [cols / 32] their scales (matmul: [tokens][xd_stride])
${kByteHelpers}
${Readers('w')}
${WeightReaderWgsl(type, layout)}

${quantized_activation ? (kquant ? matvec_k : matvec_q) + matvec_blocks : matvec_f32}
${quantized_activation && kernel === 'lanes' ? matvec_lanes : `
// MatVec: one invocation per row of the piece.
@compute @workgroup_size(${kRowLanes})
fn matvec(@builtin(global_invocation_id) id: vec3u) {
  let row = id.x + id.y * ${kRowLanes}u * 32768u;
  if (row >= dims.rows) { return; }
  y[dims.row0 + row] = matvec_row(row, 0u, 0u, 0u);
}`}
${quantized_activation && kernel === 'lanes' ? matmul_lanes : MatmulWgsl(type, WeightBlock(type), kRowLanes)}

// DecodeWeightRow: y = row step[0] of w, by the piece that holds it.
@compute @workgroup_size(64)
fn embed(@builtin(global_invocation_id) id: vec3u) {
  let token = step[0];
  if (token < dims.row0 || token - dims.row0 >= dims.rows) { return; }
  if (id.x < dims.cols) { y[id.x] = w_elem(token - dims.row0, id.x); }
}
`;
}

/** Bindings of WeightOpsWgsl's entry points (the matmul's are the matvec's). */
export function WeightOpsBindings(type) {
  const matvec = WeightBlock(type).quantized_activation ? [0, 2, 3, 7, 8] : [0, 1, 2, 3];
  return {matvec, embed: [0, 2, 3, 4], matmul: matvec};
}
