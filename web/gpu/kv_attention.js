// Exact windowed attention on a WebGPU device over kvq's encoded KV rows (seed 000's architecture):
// the master rows stay in host memory (an ArrayBuffer, as kvq's host tier holds them); windows of
// them are written into a ring of two GPU buffers per tensor within a device budget (the next
// window's write queued while the current one is consumed); the online-softmax state (m, l, acc)
// of every query head lives in a GPU buffer across windows and is normalised once at the end. The
// kernel takes the window's rows one at a time in order and updates the state with the same
// instructions whatever the window, so the output has the same bits for every window size.
//
// One invocation per (KV head, query position) serves every query head that shares the KV head, so
// each K and V row is read and decoded once for all of them (GQA). A decode step is one query
// position; a prefill block is several consecutive ones, each attending causally (positions up to
// its own). This is the exact form, written for bit identity and checked on SwiftShader; a faster
// one for real GPUs (lanes over head_dim, subgroup sums in a fixed order) is for later. Per row and query head: the score is a fixed-shape tree sum of q·k' in
// workgroup memory, then m' = max(m, s), c = exp(m − m'), e = exp(s − m'), l = l·c + e,
// acc = acc·c + e·v' (kvq's CPU update, attention/softmax_tile.h).

import {DecodeWgsl} from './kv_formats.js';

function AttentionWgsl(shape) {
  const {key_format, value_format, n_kv_heads, q_per_kv, head_dim, k_block_bytes, v_block_bytes} = shape;
  return /* wgsl */ `
const head_dim: u32 = ${head_dim}u;
const q_per_kv: u32 = ${q_per_kv}u;
const k_block: u32 = ${k_block_bytes}u;
const v_block: u32 = ${v_block_bytes}u;
// rows: the window's; first_pos: the absolute position of its row 0; query_pos: of query 0.
struct Params { rows: u32, scale: f32, first_pos: u32, query_pos: u32 }
@group(0) @binding(0) var<storage, read> k_buf: array<u32>;      // the window's K rows as stored
@group(0) @binding(1) var<storage, read> v_buf: array<u32>;      // the window's V rows as stored
@group(0) @binding(2) var<storage, read> q: array<f32>;          // [queries][n_kv_heads · q_per_kv][head_dim]
// Per query position t and head h: [m, l, acc[head_dim]] at (t · n_q + h) · (head_dim + 2):
// carried across windows.
@group(0) @binding(3) var<storage, read_write> state: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;
${DecodeWgsl(key_format, value_format)}

// One invocation per (KV head, query position), which takes the window's rows in order: each
// score a sum in order of i (as kvq's scalar Codec::dot), each row's K and V numbers decoded once
// for the query heads sharing the KV head. No workgroup barriers: the bits cannot depend on how
// invocations are scheduled.
@compute @workgroup_size(64)
fn attend(@builtin(global_invocation_id) id: vec3u) {
  let n_q = ${n_kv_heads * q_per_kv}u;
  let queries = arrayLength(&state) / ((head_dim + 2u) * n_q);
  if (id.x >= ${n_kv_heads}u * queries) { return; }
  let kv_head = id.x % ${n_kv_heads}u;
  let query = id.x / ${n_kv_heads}u;
  // Causal: rows past this query's position are not its.
  let last = params.query_pos + query;
  let rows = select(0u, min(params.rows, last + 1u - params.first_pos), last >= params.first_pos);
  var m: array<f32, ${q_per_kv}>;
  var l: array<f32, ${q_per_kv}>;
  var score: array<f32, ${q_per_kv}>;
  var c: array<f32, ${q_per_kv}>;
  var e: array<f32, ${q_per_kv}>;
  var acc: array<f32, ${q_per_kv * head_dim}>;  // [q_per_kv][head_dim]
  let first_head = query * n_q + kv_head * q_per_kv;
  for (var j = 0u; j < q_per_kv; j++) {
    let at = (first_head + j) * (head_dim + 2u);
    m[j] = state[at];
    l[j] = state[at + 1u];
    for (var i = 0u; i < head_dim; i++) { acc[j * head_dim + i] = state[at + 2u + i]; }
  }
  for (var r = 0u; r < rows; r++) {
    for (var j = 0u; j < q_per_kv; j++) { score[j] = 0.0; }
    for (var i = 0u; i < head_dim; i++) {
      let k = k_elem(r, kv_head, i);
      for (var j = 0u; j < q_per_kv; j++) { score[j] = score[j] + q[(first_head + j) * head_dim + i] * k; }
    }
    for (var j = 0u; j < q_per_kv; j++) {
      let s = score[j] * params.scale;
      let m_new = max(m[j], s);
      c[j] = exp(m[j] - m_new);
      e[j] = exp(s - m_new);
      l[j] = l[j] * c[j] + e[j];
      m[j] = m_new;
    }
    for (var i = 0u; i < head_dim; i++) {
      let v = v_elem(r, kv_head, i);
      for (var j = 0u; j < q_per_kv; j++) { acc[j * head_dim + i] = acc[j * head_dim + i] * c[j] + e[j] * v; }
    }
  }
  for (var j = 0u; j < q_per_kv; j++) {
    let at = (first_head + j) * (head_dim + 2u);
    state[at] = m[j];
    state[at + 1u] = l[j];
    for (var i = 0u; i < head_dim; i++) { state[at + 2u + i] = acc[j * head_dim + i]; }
  }
}

// Every K and V number of the window's rows as the shader decodes them (the exactness check of the
// in-register dequantisation): decoded [rows][K, V][n_kv_heads][head_dim].
@group(0) @binding(5) var<storage, read_write> decoded: array<f32>;
@compute @workgroup_size(64)
fn decode(@builtin(global_invocation_id) id: vec3u) {
  let per_row = ${n_kv_heads}u * head_dim;
  if (id.x >= params.rows * per_row) { return; }
  let r = id.x / per_row;
  let within = id.x % per_row;
  decoded[2u * r * per_row + within] = k_elem(r, within / head_dim, within % head_dim);
  decoded[(2u * r + 1u) * per_row + within] = v_elem(r, within / head_dim, within % head_dim);
}

// out[h][i] = acc / l, once after the last window (or, for the injected bug, at a boundary: then
// m and l restart as if the normalised output were one position's).
@group(0) @binding(0) var<storage, read_write> norm_state: array<f32>;
@compute @workgroup_size(64)
fn normalise(@builtin(global_invocation_id) id: vec3u) {
  let n = arrayLength(&norm_state) / (head_dim + 2u) * head_dim;
  if (id.x >= n) { return; }
  let h = id.x / head_dim;
  let at = h * (head_dim + 2u);
  norm_state[at + 2u + id.x % head_dim] = norm_state[at + 2u + id.x % head_dim] / norm_state[at + 1u];
}
`;
}

// The bugs seed 000 found in a windowed attention, injectable to show the tests catch them.
export const kInjectedBugs = ['drop_first_row', 'repeat_previous_row', 'normalise_at_boundary'];

export class GpuKvAttention {
  /**
   * shape: {key_format, value_format, n_kv_heads, q_per_kv, head_dim, k_block_bytes, v_block_bytes}
   * (block bytes: one position's row of every head, as kvq's codec stores it).
   */
  static async Create(device, shape) {
    const code = AttentionWgsl(shape);
    const module = device.createShaderModule({code});
    const info = await module.getCompilationInfo();
    const errors = info.messages.filter((m) => m.type === 'error');
    if (errors.length) {
      throw new Error(`WGSL for ${shape.key_format}/${shape.value_format}: ` +
                      errors.map((m) => `${m.lineNum}:${m.linePos} ${m.message}`).join('; '));
    }
    const attend = await device.createComputePipelineAsync({layout: 'auto', compute: {module, entryPoint: 'attend'}});
    const normalise =
        await device.createComputePipelineAsync({layout: 'auto', compute: {module, entryPoint: 'normalise'}});
    return new GpuKvAttention(device, shape, module, attend, normalise);
  }

  constructor(device, shape, module, attend, normalise) {
    this.device = device;
    this.attend_module = module;
    this.shape = shape;
    this.attend = attend;
    this.normalise = normalise;
    this.n_q = shape.n_kv_heads * shape.q_per_kv;
    /** Bytes of GPU buffers holding KV rows: at most the device budget (counted, not assumed). */
    this.kv_bytes_now = 0;
    this.peak_kv_bytes = 0;
  }

  /** The rows per window a device budget allows: two slots (one in use, one being written) per tensor. */
  WindowRowsFor(budget_bytes) {
    const per_row = this.shape.k_block_bytes + this.shape.v_block_bytes;
    return Math.floor(budget_bytes / (2 * per_row + 8));  // + up to 4 bytes of padding per slot
  }

  #KvBuffer(bytes) {
    const size = Math.max(4, Math.ceil(bytes / 4) * 4);
    this.kv_bytes_now += size;
    this.peak_kv_bytes = Math.max(this.peak_kv_bytes, this.kv_bytes_now);
    return this.device.createBuffer({size, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST});
  }

  #Params(rows, scale, first_pos = 0, query_pos = 0) {
    const params = this.device.createBuffer({size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST});
    const p = new ArrayBuffer(16);
    new Uint32Array(p, 0, 1)[0] = rows;
    new Float32Array(p, 4, 1)[0] = scale;
    new Uint32Array(p, 8, 2).set([first_pos, query_pos]);
    this.device.queue.writeBuffer(params, 0, p);
    return params;
  }

  /**
   * The shader's decode of n host rows of K and V: Float32Array [n][K, V][n_kv_heads][head_dim].
   * Must equal kvq's Codec::decode_row bit for bit.
   */
  async Decode(k_blocks, v_blocks, n) {
    const {n_kv_heads, head_dim, k_block_bytes: kb, v_block_bytes: vb} = this.shape;
    const device = this.device;
    if (!this.decode) {
      this.decode = await device.createComputePipelineAsync(
          {layout: 'auto', compute: {module: this.attend_module, entryPoint: 'decode'}});
    }
    const k = device.createBuffer({size: Math.ceil(n * kb / 4) * 4, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST});
    const v = device.createBuffer({size: Math.ceil(n * vb / 4) * 4, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST});
    device.queue.writeBuffer(k, 0, Padded(k_blocks.subarray(0, n * kb)));
    device.queue.writeBuffer(v, 0, Padded(v_blocks.subarray(0, n * vb)));
    const bytes = n * 2 * n_kv_heads * head_dim * 4;
    const out = device.createBuffer({size: bytes, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC});
    const readback = device.createBuffer({size: bytes, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
    const params = this.#Params(n, 0);
    const group = device.createBindGroup({layout: this.decode.getBindGroupLayout(0), entries: [
      {binding: 0, resource: {buffer: k}}, {binding: 1, resource: {buffer: v}},
      {binding: 4, resource: {buffer: params}}, {binding: 5, resource: {buffer: out}}]});
    const encoder = device.createCommandEncoder();
    const pass = encoder.beginComputePass();
    pass.setPipeline(this.decode);
    pass.setBindGroup(0, group);
    pass.dispatchWorkgroups(Math.ceil(n * n_kv_heads * head_dim / 64));
    pass.end();
    encoder.copyBufferToBuffer(out, 0, readback, 0, bytes);
    device.queue.submit([encoder.finish()]);
    await readback.mapAsync(GPUMapMode.READ);
    const result = new Float32Array(readback.getMappedRange().slice(0));
    readback.unmap();
    for (const b of [k, v, out, readback, params]) b.destroy();
    return result;
  }

  /**
   * Attention over positions [0, n) of the host rows k_blocks and v_blocks (Uint8Array, n × block
   * bytes) for `queries` consecutive query positions n − queries .. n − 1 (1: a decode step; more:
   * a prefill block, each position attending to those up to its own), q [queries][n_q][head_dim];
   * in windows of `window` rows (0: one window), within device_budget_bytes of GPU KV buffers when
   * given (window then at most WindowRowsFor). Returns the output [queries][n_q][head_dim].
   * `bug`: one of kInjectedBugs, or undefined.
   */
  async Run(q, k_blocks, v_blocks, n, {queries = 1, window = 0, device_budget_bytes = 0, bug} = {}) {
    const {head_dim, k_block_bytes: kb, v_block_bytes: vb} = this.shape;
    const device = this.device;
    if (device_budget_bytes > 0) {
      const most = this.WindowRowsFor(device_budget_bytes);
      if (most < 1) throw new Error(`device budget ${device_budget_bytes} B holds no window of one row (2 slots)`);
      window = window > 0 ? Math.min(window, most) : most;
    }
    if (window <= 0) window = n;
    const rows_max = window + (bug === 'repeat_previous_row' ? 1 : 0);
    const slots = [0, 1].map(() => ({k: this.#KvBuffer(rows_max * kb), v: this.#KvBuffer(rows_max * vb)}));
    const q_buffer = device.createBuffer({size: q.byteLength, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST});
    device.queue.writeBuffer(q_buffer, 0, q);
    if (!(queries >= 1 && queries <= n) || q.length !== queries * this.n_q * head_dim) {
      throw new Error(`Run: ${queries} query positions over ${n} need q of ${queries * this.n_q * head_dim} numbers (got ${q.length})`);
    }
    const states = queries * this.n_q;
    const state_floats = states * (head_dim + 2);
    const initial = new Float32Array(state_floats);
    for (let h = 0; h < states; ++h) initial[h * (head_dim + 2)] = -Infinity;  // m; l and acc 0
    const state = device.createBuffer(
        {size: state_floats * 4, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC});
    device.queue.writeBuffer(state, 0, initial);
    const scale = 1 / Math.sqrt(head_dim);
    const norm_group = device.createBindGroup(
        {layout: this.normalise.getBindGroupLayout(0), entries: [{binding: 0, resource: {buffer: state}}]});
    const uniforms = [];
    let slot = 0;
    for (let start = 0; start < n; start += window) {
      let first = start, end = Math.min(n, start + window);
      if (start > 0 && bug === 'drop_first_row') first += 1;
      if (start > 0 && bug === 'repeat_previous_row') first -= 1;
      const rows = end - first;
      const s = slots[slot];
      slot ^= 1;
      // Queue order makes this write wait for the dispatch that last read the slot (two windows ago).
      device.queue.writeBuffer(s.k, 0, Padded(k_blocks.subarray(first * kb, end * kb)));
      device.queue.writeBuffer(s.v, 0, Padded(v_blocks.subarray(first * vb, end * vb)));
      const params = this.#Params(rows, scale, first, n - queries);
      uniforms.push(params);
      const group = device.createBindGroup({layout: this.attend.getBindGroupLayout(0), entries: [
        {binding: 0, resource: {buffer: s.k}}, {binding: 1, resource: {buffer: s.v}},
        {binding: 2, resource: {buffer: q_buffer}}, {binding: 3, resource: {buffer: state}},
        {binding: 4, resource: {buffer: params}}]});
      const encoder = device.createCommandEncoder();
      const pass = encoder.beginComputePass();
      pass.setPipeline(this.attend);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(Math.ceil(this.shape.n_kv_heads * queries / 64));
      if (bug === 'normalise_at_boundary' && end < n) {
        pass.setPipeline(this.normalise);  // acc /= l, then m and l as for one position
        pass.setBindGroup(0, norm_group);
        pass.dispatchWorkgroups(Math.ceil(states * head_dim / 64));
      }
      pass.end();
      device.queue.submit([encoder.finish()]);
      if (bug === 'normalise_at_boundary' && end < n) {
        // l = 1 after acc /= l (queue order: after the pass): the normalised output then weighs
        // as one position.
        for (let h = 0; h < states; ++h) device.queue.writeBuffer(state, (h * (head_dim + 2) + 1) * 4, new Float32Array([1]));
      }
    }
    const encoder = device.createCommandEncoder();
    const pass = encoder.beginComputePass();
    pass.setPipeline(this.normalise);
    pass.setBindGroup(0, norm_group);
    pass.dispatchWorkgroups(Math.ceil(states * head_dim / 64));
    pass.end();
    const readback = device.createBuffer({size: state_floats * 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
    encoder.copyBufferToBuffer(state, 0, readback, 0, state_floats * 4);
    device.queue.submit([encoder.finish()]);
    await readback.mapAsync(GPUMapMode.READ);
    const all = new Float32Array(readback.getMappedRange().slice(0));
    readback.unmap();
    const out = new Float32Array(states * head_dim);
    for (let h = 0; h < states; ++h) out.set(all.subarray(h * (head_dim + 2) + 2, (h + 1) * (head_dim + 2)), h * head_dim);
    for (const b of [readback, state, q_buffer, ...uniforms]) b.destroy();
    for (const s of slots) {
      for (const b of [s.k, s.v]) {
        this.kv_bytes_now -= b.size;
        b.destroy();
      }
    }
    return out;
  }
}

// writeBuffer needs a multiple of 4 bytes.
function Padded(bytes) {
  if (bytes.byteLength % 4 === 0) return bytes;
  const padded = new Uint8Array(Math.ceil(bytes.byteLength / 4) * 4);
  padded.set(bytes);
  return padded;
}
