// Exact windowed attention on a WebGPU device over kvq's encoded KV rows (seed 000's architecture):
// the master rows stay in host memory (an ArrayBuffer, as kvq's host tier holds them); windows of
// them are written into a ring of two GPU buffers per tensor within a device budget (the next
// window's write queued while the current one is consumed); the online-softmax state (m, l, acc)
// of every query head lives in a GPU buffer across windows and is normalised once at the end. The
// kernel takes the window's rows one at a time in order and updates the state with the same
// instructions whatever the window, so the output has the same bits for every window size.
//
// One workgroup per (KV head, query position) serves every query head that shares the KV head, so
// each K and V row is read and decoded once for all of them (GQA). A decode step is one query
// position; a prefill block is several consecutive ones, each attending causally (positions up to
// its own). Per row and query head: the score Σ_i q·k' in order of i, then m' = max(m, s),
// c = exp(m − m'), e = exp(s − m'), l = l·c + e, acc = acc·c + e·v' (kvq's per-row update), the
// rows in order; the workgroup's lanes split that work by row (scores), by query head (m, l) and
// by element (acc) without changing any operand (OnlineSoftmaxWgsl). Checked on SwiftShader.

import {DecodeWgsl, KeyRowsPerBlock} from './kv_formats.js';

/** Lanes of an attention workgroup (OnlineSoftmaxWgsl): at least 64, and one per head element. */
export function AttendLanes(head_dim) {
  if (head_dim > 256) throw new Error(`attention on the GPU takes head_dim up to 256 (got ${head_dim}): a lane per element`);
  return Math.max(64, head_dim);
}

// Rows a tile takes: at most the lanes, and its two f32 tables of tile · q_per_kv numbers within
// 16 KiB (WebGPU's default maxComputeWorkgroupStorageSize).
function TileRows(q_per_kv, head_dim) {
  let tile = AttendLanes(head_dim);
  while (tile > 1 && 2 * tile * q_per_kv * 4 > 16384) tile >>= 1;
  return tile;
}

/**
 * The online-softmax update of one workgroup (a KV head, a query position; AttendLanes lanes, `lid`
 * the local invocation index) over a window's rows, shared by this file's kernel and kv_device.js's.
 * kvq's per-row recurrence, the instructions of one invocation taking the rows in order — score =
 * Σ_i q·k_value(r, kv_head, i) in order of i, s = score · scale, m' = max(m, s), c = exp(m − m'),
 * e = exp(s − m'), l = l·c + e, acc = acc·c + e·v_value(r, kv_head, i) — with its work spread over
 * the lanes without changing an operand or an order: per tile of rows, (1) lane t scores row t
 * (each score's sum in order of i, as one invocation did), (2) lane j runs query head j's m and l
 * through the tile's rows in order, leaving each row's c and e in workgroup memory, (3) lane i
 * updates element i of every head's acc through the tile's rows in order. So every number has the
 * bits the one-invocation loop gave, and no invocation holds more than q_per_kv accumulators.
 * (first_head, head_dim, q_per_kv in scope; rows: {begin, end, row}: the loop's t runs over
 * [begin, end), workgroup-uniform, and `row` is the WGSL of row r at t.) OnlineSoftmaxPreludeWgsl's
 * declarations go at module scope.
 */
export function OnlineSoftmaxWgsl(q_per_kv, head_dim, rows,
                                  {base = '0u', fresh = 'false', q_at = '(first_head + j) * head_dim'} = {}) {
  // base: the float index in `state` of this state region's head 0; fresh: start from the empty
  // state (m = −inf, l = 0, acc = 0) instead of loading it (a position chunk of its own); q_at:
  // the float index in q of query head j's vector (j in scope; default: queries packed densely).
  if (q_per_kv > AttendLanes(head_dim)) {
    throw new Error(`attention on the GPU takes at most ${AttendLanes(head_dim)} query heads per KV head at head_dim ${head_dim} (got ${q_per_kv}): a lane per query head`);
  }
  const tile = TileRows(q_per_kv, head_dim);
  return /* wgsl */ `
  let state_base = ${base};
  let state_fresh = ${fresh};
  var neg_inf_bits = 0xff800000u;  // a var: a runtime −inf (a constant one is a WGSL error)
  let neg_inf = bitcast<f32>(neg_inf_bits);
  var m = neg_inf;  // lane j < q_per_kv: query head j's running max and sum
  var l = 0.0;
  var acc: array<f32, ${q_per_kv}>;  // lane i < head_dim: element i of each query head's acc
  for (var j = 0u; j < q_per_kv; j++) { acc[j] = 0.0; }
  if (lid < q_per_kv) {
    let at = state_base + (first_head + lid) * (head_dim + 2u);
    m = select(state[at], neg_inf, state_fresh);
    l = select(state[at + 1u], 0.0, state_fresh);
  }
  if (lid < head_dim) {
    for (var j = 0u; j < q_per_kv; j++) {
      acc[j] = select(state[state_base + (first_head + j) * (head_dim + 2u) + 2u + lid], 0.0, state_fresh);
    }
  }
  let rows_end = ${rows.end};
  for (var t0 = ${rows.begin}; t0 < rows_end; t0 += ${tile}u) {
    let n_tile = min(${tile}u, rows_end - t0);
    if (lid < n_tile) {  // (1) row t's scores
      let t = t0 + lid;
      let r = ${rows.row};
      var score: array<f32, ${q_per_kv}>;
      for (var j = 0u; j < q_per_kv; j++) { score[j] = 0.0; }
      for (var i = 0u; i < head_dim; i++) {
        let k = k_value(r, kv_head, i);
        for (var j = 0u; j < q_per_kv; j++) { score[j] = score[j] + q[${q_at} + i] * k; }
      }
      for (var j = 0u; j < q_per_kv; j++) { tile_s[lid * q_per_kv + j] = score[j] * params.scale; }
    }
    workgroupBarrier();
    if (lid < q_per_kv) {  // (2) head j's m and l through the tile's rows; each row's c and e kept
      for (var u = 0u; u < n_tile; u++) {
        let s = tile_s[u * q_per_kv + lid];
        let m_new = max(m, s);
        let c = exp(m - m_new);
        let e = exp(s - m_new);
        l = l * c + e;
        m = m_new;
        tile_c[u * q_per_kv + lid] = c;
        tile_s[u * q_per_kv + lid] = e;
      }
    }
    workgroupBarrier();
    if (lid < head_dim) {  // (3) element i of every head's acc through the tile's rows
      for (var u = 0u; u < n_tile; u++) {
        let t = t0 + u;
        let r = ${rows.row};
        let v = v_value(r, kv_head, lid);
        for (var j = 0u; j < q_per_kv; j++) {
          acc[j] = acc[j] * tile_c[u * q_per_kv + j] + tile_s[u * q_per_kv + j] * v;
        }
      }
    }
    workgroupBarrier();
  }
  if (lid < q_per_kv) {
    let at = state_base + (first_head + lid) * (head_dim + 2u);
    state[at] = m;
    state[at + 1u] = l;
  }
  if (lid < head_dim) {
    for (var j = 0u; j < q_per_kv; j++) { state[state_base + (first_head + j) * (head_dim + 2u) + 2u + lid] = acc[j]; }
  }
`;
}

/** OnlineSoftmaxWgsl's module-scope declarations: the tile's per-row, per-head s then e, and c. */
export function OnlineSoftmaxPreludeWgsl(q_per_kv, head_dim) {
  const n = TileRows(q_per_kv, head_dim) * q_per_kv;
  return /* wgsl */ `
var<workgroup> tile_s: array<f32, ${n}>;  // [tile row][query head]: s = score · scale, then e
var<workgroup> tile_c: array<f32, ${n}>;  // [tile row][query head]: c`;
}

function AttentionWgsl(shape) {
  const {key_format, value_format, n_kv_heads, q_per_kv, head_dim, k_block_bytes, v_block_bytes} = shape;
  return /* wgsl */ `
const head_dim: u32 = ${head_dim}u;
const q_per_kv: u32 = ${q_per_kv}u;
const k_block: u32 = ${k_block_bytes}u;
const v_block: u32 = ${v_block_bytes}u;
// rows: the window's; first_pos: the absolute position of its row 0; query_pos: of query 0. Of the
// window's K rows the first k_encoded are in k_buf's blocks, starting k_offset rows into its first
// block (a group codec's window may start inside a group); the rest are f32 rows in k_res.
struct Params { rows: u32, scale: f32, first_pos: u32, query_pos: u32, k_offset: u32, k_encoded: u32 }
@group(0) @binding(0) var<storage, read> k_buf: array<u32>;      // the window's K rows as stored
@group(0) @binding(1) var<storage, read> v_buf: array<u32>;      // the window's V rows as stored
@group(0) @binding(2) var<storage, read> q: array<f32>;          // [queries][n_kv_heads · q_per_kv][head_dim]
// Per query position t and head h: [m, l, acc[head_dim]] at (t · n_q + h) · (head_dim + 2):
// carried across windows.
@group(0) @binding(3) var<storage, read_write> state: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;
@group(0) @binding(6) var<storage, read> k_res: array<f32>;      // [rows][n_kv_heads][head_dim]
${DecodeWgsl(key_format, value_format)}

fn k_value(r: u32, head: u32, i: u32) -> f32 {
  if (r < params.k_encoded) { return k_elem(r + params.k_offset, head, i); }
  return k_res[((r - params.k_encoded) * ${n_kv_heads}u + head) * head_dim + i];
}
fn v_value(r: u32, head: u32, i: u32) -> f32 { return v_elem(r, head, i); }

${OnlineSoftmaxPreludeWgsl(q_per_kv, head_dim)}
// One workgroup per (KV head: x, query position: y), which takes the window's rows in order
// (OnlineSoftmaxWgsl): each score a sum in order of i (as kvq's scalar Codec::dot), each row's K
// and V numbers decoded once for the query heads sharing the KV head. Every order is fixed by the
// code: the bits cannot depend on how invocations are scheduled.
@compute @workgroup_size(${AttendLanes(head_dim)})
fn attend(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let n_q = ${n_kv_heads * q_per_kv}u;
  let kv_head = wg.x;
  let query = wg.y;
  // Causal: rows past this query's position are not its.
  let last = params.query_pos + query;
  let rows = select(0u, min(params.rows, last + 1u - params.first_pos), last >= params.first_pos);
  let first_head = query * n_q + kv_head * q_per_kv;
${OnlineSoftmaxWgsl(q_per_kv, head_dim, {begin: '0u', end: 'rows', row: 't'})}
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
  decoded[2u * r * per_row + within] = k_value(r, within / head_dim, within % head_dim);
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
    this.key_rows_per_block = KeyRowsPerBlock(shape.key_format);
    /** Bytes of GPU buffers holding KV rows: at most the device budget (counted, not assumed). */
    this.kv_bytes_now = 0;
    this.peak_kv_bytes = 0;
  }

  /**
   * GPU bytes of one ring slot for windows of `rows` rows: K blocks (a group codec's window spans
   * at most ceil(rows / G) + 1 groups), K residual rows (at most G − 1, f32), V rows; each rounded
   * up to 4 bytes as WebGPU sizes buffers.
   */
  SlotBytes(rows) {
    const {n_kv_heads, head_dim, k_block_bytes: kb, v_block_bytes: vb} = this.shape;
    const g = this.key_rows_per_block;
    const up4 = (x) => Math.max(4, Math.ceil(x / 4) * 4);
    const k_blocks = g === 1 ? rows : Math.ceil(rows / g) + 1;
    const k_residual = g === 1 ? 0 : Math.min(rows, g - 1);
    return up4(k_blocks * kb) + up4(k_residual * n_kv_heads * head_dim * 4) + up4(rows * vb);
  }

  /** The most rows per window a device budget allows: two slots, one in use and one being written. */
  WindowRowsFor(budget_bytes) {
    let rows = 0;
    while (2 * this.SlotBytes(rows + 1) <= budget_bytes) ++rows;
    return rows;
  }

  #Buffer(bytes, usage, kv) {
    const size = Math.max(4, Math.ceil(bytes / 4) * 4);
    if (kv) {
      this.kv_bytes_now += size;
      this.peak_kv_bytes = Math.max(this.peak_kv_bytes, this.kv_bytes_now);
    }
    return this.device.createBuffer({size, usage});
  }

  #Free(buffers) {
    for (const b of buffers) {
      if (b.kv) this.kv_bytes_now -= b.size;
      b.destroy();
    }
  }

  // The kernels' uniform Params, written into `buffer` (queue order: after what read it before).
  #WriteParams(buffer, rows, scale, first_pos, query_pos, k_offset, k_encoded) {
    const p = new ArrayBuffer(32);
    new Uint32Array(p, 0, 1)[0] = rows;
    new Float32Array(p, 4, 1)[0] = scale;
    new Uint32Array(p, 8, 4).set([first_pos, query_pos, k_offset, k_encoded]);
    this.device.queue.writeBuffer(buffer, 0, p);
  }

  #Params(rows, scale, first_pos = 0, query_pos = 0, k_offset = 0, k_encoded = rows) {
    const params = this.device.createBuffer({size: 32, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST});
    this.#WriteParams(params, rows, scale, first_pos, query_pos, k_offset, k_encoded);
    return params;
  }

  // The host rows [first, end) as what one slot receives: K blocks from the group holding `first`
  // (k_offset rows into it) up to the last encoded row, K residual rows past the encoded ones, V rows.
  #WindowBytes(host, n, first, end) {
    const {n_kv_heads, head_dim, k_block_bytes: kb, v_block_bytes: vb} = this.shape;
    const g = this.key_rows_per_block;
    const encoded = Math.floor(n / g) * g;  // rows in blocks; the rest are residual rows
    const enc_end = Math.min(end, encoded);
    let k_blocks = new Uint8Array(0), k_offset = 0, k_encoded = 0;
    if (first < enc_end) {
      const lo = Math.floor(first / g), hi = Math.ceil(enc_end / g);
      k_blocks = host.k_blocks.subarray(lo * kb, hi * kb);
      k_offset = first - lo * g;
      k_encoded = enc_end - first;
    }
    const elems = n_kv_heads * head_dim, res_first = Math.max(first, encoded);
    const k_residual = end > res_first ? host.k_residual.subarray((res_first - encoded) * elems, (end - encoded) * elems)
                                       : new Float32Array(0);
    return {k_blocks, k_offset, k_encoded, k_residual, v_blocks: host.v_blocks.subarray(first * vb, end * vb)};
  }

  /**
   * The shader's decode of the n host rows: Float32Array [n][K, V][n_kv_heads][head_dim] (residual K
   * rows as they are). Must equal kvq's Codec::decode_row bit for bit.
   */
  async Decode(host, n) {
    const {n_kv_heads, head_dim} = this.shape;
    const device = this.device;
    if (!this.decode) {
      this.decode = await device.createComputePipelineAsync(
          {layout: 'auto', compute: {module: this.attend_module, entryPoint: 'decode'}});
    }
    const w = this.#WindowBytes(host, n, 0, n);
    const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST;
    const k = this.#Buffer(w.k_blocks.byteLength, usage), r = this.#Buffer(w.k_residual.byteLength, usage);
    const v = this.#Buffer(w.v_blocks.byteLength, usage);
    device.queue.writeBuffer(k, 0, Padded(w.k_blocks));
    if (w.k_residual.length) device.queue.writeBuffer(r, 0, w.k_residual);
    device.queue.writeBuffer(v, 0, Padded(w.v_blocks));
    const bytes = n * 2 * n_kv_heads * head_dim * 4;
    const out = device.createBuffer({size: bytes, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC});
    const readback = device.createBuffer({size: bytes, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
    const params = this.#Params(n, 0, 0, 0, w.k_offset, w.k_encoded);
    const group = device.createBindGroup({layout: this.decode.getBindGroupLayout(0), entries: [
      {binding: 0, resource: {buffer: k}}, {binding: 1, resource: {buffer: v}},
      {binding: 4, resource: {buffer: params}}, {binding: 5, resource: {buffer: out}},
      {binding: 6, resource: {buffer: r}}]});
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
    this.#Free([k, r, v, out, readback, params]);
    return result;
  }

  /**
   * Attention over positions [0, n) of the host rows for `queries` consecutive query positions
   * n − queries .. n − 1 (1: a decode step; more: a prefill block, each position attending to
   * those up to its own), q [queries][n_q][head_dim]. host: {k_blocks (Uint8Array: the complete K
   * blocks), k_residual (Float32Array: K rows past them, [rows][n_kv_heads][head_dim]; empty for
   * one-row codecs), v_blocks (Uint8Array, n rows)}, as kvq's cache holds them. In windows of
   * `window` rows (0: one window), within device_budget_bytes of GPU KV buffers when given (window
   * then at most WindowRowsFor). Returns the output [queries][n_q][head_dim]. `bug`: one of
   * kInjectedBugs, or undefined.
   */
  async Run(q, host, n, {queries = 1, window = 0, device_budget_bytes = 0, bug} = {}) {
    const {head_dim} = this.shape;
    const device = this.device;
    if (device_budget_bytes > 0) {
      const most = this.WindowRowsFor(device_budget_bytes);
      if (most < 1) throw new Error(`device budget ${device_budget_bytes} B holds no window of one row (2 slots)`);
      window = window > 0 ? Math.min(window, most) : most;
    }
    if (window <= 0) window = n;
    if (!(queries >= 1 && queries <= n) || q.length !== queries * this.n_q * head_dim) {
      throw new Error(`Run: ${queries} query positions over ${n} need q of ${queries * this.n_q * head_dim} numbers (got ${q.length})`);
    }
    const rows_max = window + (bug === 'repeat_previous_row' ? 1 : 0);
    const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST;
    const slot_parts = (rows) => {  // the three buffers of a slot, as SlotBytes sizes them
      const g = this.key_rows_per_block, {n_kv_heads, k_block_bytes: kb, v_block_bytes: vb} = this.shape;
      const k = this.#Buffer((g === 1 ? rows : Math.ceil(rows / g) + 1) * kb, usage, true);
      const r = this.#Buffer((g === 1 ? 0 : Math.min(rows, g - 1)) * n_kv_heads * head_dim * 4, usage, true);
      const v = this.#Buffer(rows * vb, usage, true);
      for (const b of [k, r, v]) b.kv = true;
      const params = this.device.createBuffer({size: 32, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST});
      return {k, r, v, params};
    };
    const slots = [slot_parts(rows_max), slot_parts(rows_max)];
    const q_buffer = this.#Buffer(q.byteLength, usage);
    device.queue.writeBuffer(q_buffer, 0, q);
    const states = queries * this.n_q;
    const state_floats = states * (head_dim + 2);
    const initial = new Float32Array(state_floats);
    for (let h = 0; h < states; ++h) initial[h * (head_dim + 2)] = -Infinity;  // m; l and acc 0
    const state = this.#Buffer(state_floats * 4, usage | GPUBufferUsage.COPY_SRC);
    device.queue.writeBuffer(state, 0, initial);
    const scale = 1 / Math.sqrt(head_dim);
    const norm_group = device.createBindGroup(
        {layout: this.normalise.getBindGroupLayout(0), entries: [{binding: 0, resource: {buffer: state}}]});
    for (const s of slots) {  // one bind group per slot, reused by every window it carries
      s.group = device.createBindGroup({layout: this.attend.getBindGroupLayout(0), entries: [
        {binding: 0, resource: {buffer: s.k}}, {binding: 1, resource: {buffer: s.v}},
        {binding: 2, resource: {buffer: q_buffer}}, {binding: 3, resource: {buffer: state}},
        {binding: 4, resource: {buffer: s.params}}, {binding: 6, resource: {buffer: s.r}}]});
    }
    let slot = 0;
    for (let start = 0; start < n; start += window) {
      let first = start;
      const end = Math.min(n, start + window);
      if (start > 0 && bug === 'drop_first_row') first += 1;
      if (start > 0 && bug === 'repeat_previous_row') first -= 1;
      const w = this.#WindowBytes(host, n, first, end);
      const s = slots[slot];
      slot ^= 1;
      // Queue order makes these writes wait for the dispatch that last read the slot.
      device.queue.writeBuffer(s.k, 0, Padded(w.k_blocks));
      if (w.k_residual.length) device.queue.writeBuffer(s.r, 0, w.k_residual);
      device.queue.writeBuffer(s.v, 0, Padded(w.v_blocks));
      this.#WriteParams(s.params, end - first, scale, first, n - queries, w.k_offset, w.k_encoded);
      const encoder = device.createCommandEncoder();
      const pass = encoder.beginComputePass();
      pass.setPipeline(this.attend);
      pass.setBindGroup(0, s.group);
      pass.dispatchWorkgroups(this.shape.n_kv_heads, queries);  // a workgroup per (KV head, query)
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
    this.#Free([readback, state, q_buffer, ...slots.flatMap((x) => [x.k, x.r, x.v, x.params])]);
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
