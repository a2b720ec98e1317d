// kvq's KV device tier over WebGPU (kvq/kv_device.h): the C++ cache (compiled to WebAssembly) keeps
// the master copy in host memory and calls this object, through src/web/web_kv.cc, to stream a
// layer's pages into a ring of GPU storage buffers (its slots, within the device budget the cache
// planned) and attend over each as it arrives; the online-softmax state (m, l, acc) of every query
// head lives in a GPU buffer across the pages and is normalised once by Finish.
//
// Every call only queues GPU work (writeBuffer, dispatch): queue order makes a slot's next write
// wait for the dispatch reading it, so with two or more slots the next page is in flight while the
// current one is consumed. The cache decides the slot layout; the kernel reads it as written:
// K blocks, V blocks, then per tensor f32 head rows (sinks) and residual rows, decoded in registers
// (web/gpu/kv_formats.js), prerope keys rotated by the window's cos/sin as they are read, queries
// rotated ("rot") and the output unrotated by the same fast Walsh-Hadamard steps as kvq's
// hadamard.cc (so the same bits). Positions are split into chunks of a fixed size (absolute, as
// kvq's CPU attention splits them: kvq/attention.h's position_chunk); one workgroup per (KV head,
// query, chunk the window touches) takes that chunk's rows in order (kv_attention.js's
// OnlineSoftmaxWgsl: its lanes share the work, the order is one invocation's), a chunk's state is merged
// into the earlier chunks' at its end in chunk order (kvq's MergeState), and the layer ends as
// kvq's FinishAttention does. The same instructions whatever the pages: the output has the same
// bits for every page size and budget, and kvq's CPU attention's structure (which positions share
// a running state, which merges, in which order) past one chunk.

import {AttendLanes, OnlineSoftmaxPreludeWgsl, OnlineSoftmaxWgsl} from './kv_attention.js';
import {DecodeWgsl} from './kv_formats.js';
import {CachedPipeline} from './pipeline_cache.js';

// The bugs seed 000 found in windowed attention, injectable to show the tests catch them: a row
// dropped at each boundary, a row counted twice there, the output normalised there.
export const kDeviceBugs = ['drop_first_row', 'double_count_row', 'normalise_at_boundary'];

function F32Const(x) {  // an exact f32 literal
  return `bitcast<f32>(${new Uint32Array(new Float32Array([x]).buffer)[0]}u)`;
}

/** Bytes of AttendWgsl's Params (24 words: 22 used, padded to 16 bytes). */
export const kAttendParamsBytes = 96;

/**
 * The attention kernels (attend, fold) of one layer shape (also kv_resident.js's). s.pages, when
 * given ({k_region, v_region, stride}: bytes of K blocks and of V blocks per page, bytes from a page
 * to the next): a window's encoded rows may run on through consecutive pages of a pool or of the
 * mixed mode's streaming slots (kv_resident_pool.js), page-aligned, each page's blocks where its
 * layout puts them.
 */
export function AttendWgsl(s) {
  const half = s.rotary_dims / 2;
  const rope = !s.pre_rope ? `fn k_value(r: u32, head: u32, i: u32) -> f32 { return k_stored(r, head, i); }` : `
// cos/sin of positions: [rows][rotary_dims / 2][2] (kvq's RopeCosSin), row r of the window at
// params.rope_row + r (0 here: the window's own; kv_resident_rope.js's table by position: its first).
@group(0) @binding(5) var<storage, read> rope: array<f32>;
// A prerope key rotated at its position as it is read (kvq's ApplyRope, pairing ${s.rope_pairing}).
fn k_value(r: u32, head: u32, i: u32) -> f32 {
  if (i >= ${s.rotary_dims}u) { return k_stored(r, head, i); }
  ${s.rope_pairing === 'adjacent' ? 'let p = i / 2u; let a = 2u * p; let b = a + 1u;'
                                  : `let p = i % ${half}u; let a = p; let b = p + ${half}u;`}
  let at = ((params.rope_row + r) * ${half}u + p) * 2u;
  let c = rope[at];
  let sn = rope[at + 1u];
  let x = k_stored(r, head, a);
  let y = k_stored(r, head, b);
  if (i == a) { return x * c - y * sn; }
  return x * sn + y * c;
}`;
  return /* wgsl */ `
const head_dim: u32 = ${s.head_dim}u;
const n_kv_heads: u32 = ${s.n_kv_heads}u;
const q_per_kv: u32 = ${s.q_per_kv}u;
const k_block: u32 = ${s.k_block_bytes}u;
const v_block: u32 = ${s.v_block_bytes}u;
// One window (a page in a slot; KvDeviceWindow): rows, absolute positions of row 0 and of query 0;
// per tensor the byte offsets of its blocks, head rows and residual rows in the slot and where its
// runs end. start / repeat: the injected bugs (0 when none).
// chunk: positions per chunk (absolute: chunk c holds [c·chunk, (c + 1)·chunk)); pieces: the chunks
// the window touches; first_fresh: 1 when its first piece starts a chunk after position 0 (then it
// too fills a state of its own), else 0 (it continues the open chunk's state); n_tokens: queries;
// q_stride: floats from one query position's heads to the next's in q (n_q · head_dim when packed;
// a prefill block's per-token slices are wider); rope_row: the rope table's row of the window's
// row 0 (prerope keys).
struct Params {
  rows: u32, first_pos: u32, query_pos: u32, scale: f32,
  k_blocks: u32, k_head: u32, k_res: u32, k_n_head: u32, k_n_block: u32,
  v_blocks: u32, v_head: u32, v_res: u32, v_n_head: u32, v_n_block: u32,
  start: u32, repeat: u32,
  chunk: u32, pieces: u32, first_fresh: u32, n_tokens: u32,
  q_stride: u32, rope_row: u32, pad1: u32, pad2: u32,
}
@group(0) @binding(0) var<storage, read> k_buf: array<u32>;        // the slot
@group(0) @binding(1) var<storage, read> v_buf: array<u32>;        // the same slot
// [queries][q_stride]: each query position's [n_kv_heads · q_per_kv][head_dim] first
@group(0) @binding(2) var<storage, read> q: array<f32>;
// Per query state h (n_states = n_tokens · n_q of them) [m, l, acc[head_dim]], in regions of n_states
// states: region 0 the open chunk's (what Finish normalises), region 1 the merge of the chunks before
// it (kvq's AttentionState merged_*), regions 2 + p the window's pieces that start a chunk.
@group(0) @binding(3) var<storage, read_write> state: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;
${DecodeWgsl(s.key_format, s.value_format, {k: 'params.k_blocks', v: 'params.v_blocks', ...(s.pages ? {
    k_pages: {region: s.pages.k_region, stride: s.pages.stride}, v_pages: {region: s.pages.v_region, stride: s.pages.stride}} : {})})}

fn k_stored(r: u32, head: u32, i: u32) -> f32 {
  if (r < params.k_n_head) { return bitcast<f32>(k_buf[params.k_head / 4u + (r * n_kv_heads + head) * head_dim + i]); }
  if (r < params.k_n_block) { return k_elem(r, head, i); }
  return bitcast<f32>(k_buf[params.k_res / 4u + ((r - params.k_n_block) * n_kv_heads + head) * head_dim + i]);
}
fn v_value(r: u32, head: u32, i: u32) -> f32 {
  if (r < params.v_n_head) { return bitcast<f32>(v_buf[params.v_head / 4u + (r * n_kv_heads + head) * head_dim + i]); }
  if (r < params.v_n_block) { return v_elem(r, head, i); }
  return bitcast<f32>(v_buf[params.v_res / 4u + ((r - params.v_n_block) * n_kv_heads + head) * head_dim + i]);
}
${rope}

${OnlineSoftmaxPreludeWgsl(s.q_per_kv, s.head_dim)}
// One workgroup per (KV head and piece: x, query position: y; a piece is the window's rows within
// one position chunk), the piece's rows in order (OnlineSoftmaxWgsl) — the chunks of a window in
// parallel.
@compute @workgroup_size(${AttendLanes(s.head_dim)})
fn attend(@builtin(workgroup_id) wg: vec3u, @builtin(local_invocation_index) lid: u32) {
  let n_q = n_kv_heads * q_per_kv;
  let queries = params.n_tokens;
  let kv_head = wg.x % n_kv_heads;
  let piece = wg.x / n_kv_heads;
  let query = wg.y;
  let last = params.query_pos + query;  // causal: rows past this query's position are not its
  let rows = select(0u, min(params.rows, last + 1u - params.first_pos), last >= params.first_pos);
  // The piece's rows [lo, hi) of the window: those of chunk first_pos / chunk + piece.
  let chunk_index = params.first_pos / params.chunk + piece;
  let lo = max(chunk_index * params.chunk, params.first_pos) - params.first_pos;
  let hi = min(min((chunk_index + 1u) * params.chunk - params.first_pos, rows), params.rows);
  let first_head = query * n_q + kv_head * q_per_kv;
  let n_states = queries * n_q;
  let fresh = piece > 0u || params.first_fresh == 1u;
  // The injected bugs, in the window's first piece: start 1 skips its row 0; repeat 1 takes it twice.
  let start = select(0u, params.start, piece == 0u);
  let repeat = select(0u, params.repeat, piece == 0u);
${OnlineSoftmaxWgsl(s.q_per_kv, s.head_dim, {begin: 'lo + start', end: 'hi + repeat', row: 'select(t - repeat, lo, t < lo + repeat)'},
    {base: 'select(0u, (2u + piece) * n_states * (head_dim + 2u), fresh)', fresh: 'fresh',
     q_at: 'query * params.q_stride + (kv_head * q_per_kv + j) * head_dim'})}
}

${MergeWgsl()}

// After a window: for each piece that started a chunk, in chunk order, the open state is merged
// into the merged one and the piece's becomes the open one (kvq's FoldOpenChunk at the chunk's
// first position, then the chunk's state: its MergeChunkStates). One invocation per query state.
@compute @workgroup_size(64)
fn fold(@builtin(global_invocation_id) id: vec3u) {
  let n_states = params.n_tokens * n_kv_heads * q_per_kv;
  if (id.x >= n_states) { return; }
  let stride = head_dim + 2u;
  let open = id.x * stride;
  let merged = (n_states + id.x) * stride;
  for (var p = select(1u, 0u, params.first_fresh == 1u); p < params.pieces; p++) {
    merge_into(merged, open);
    let src = ((2u + p) * n_states + id.x) * stride;
    for (var i = 0u; i < stride; i++) { state[open + i] = state[src + i]; }
  }
}
`;
}

// Per head vector: rotate (x ← H·diag(s)·x/√d, kvq's RotateHeads), unrotate (x ← diag(s)·H·x/√d
// in kvq's order: (x·norm)·s), renormalise (the injected bug: acc /= l, l = 1). Also
// kv_resident.js's, which rotates the rows it encodes and its queries, and unrotates its output.
export function HeadOpsWgsl(d) {
  return /* wgsl */ `
struct Range { count: u32, stride: u32, offset: u32 }
@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> signs: array<f32>;
@group(0) @binding(2) var<uniform> range: Range;
const d: u32 = ${d}u;
const norm: f32 = ${F32Const(1 / Math.sqrt(d))};
fn fwht(v: ptr<function, array<f32, ${d}>>) {
  for (var half = 1u; half < d; half *= 2u) {
    for (var block = 0u; block < d; block += 2u * half) {
      for (var i = block; i < block + half; i++) {
        let a = (*v)[i];
        let b = (*v)[i + half];
        (*v)[i] = a + b;
        (*v)[i + half] = a - b;
      }
    }
  }
}
@compute @workgroup_size(64)
fn rotate(@builtin(global_invocation_id) id: vec3u) {
  if (id.x >= range.count) { return; }
  let at = id.x * range.stride + range.offset;
  var v: array<f32, ${d}>;
  for (var i = 0u; i < d; i++) { v[i] = x[at + i] * signs[i]; }
  fwht(&v);
  for (var i = 0u; i < d; i++) { x[at + i] = v[i] * norm; }
}
@compute @workgroup_size(64)
fn unrotate(@builtin(global_invocation_id) id: vec3u) {
  if (id.x >= range.count) { return; }
  let at = id.x * range.stride + range.offset;
  var v: array<f32, ${d}>;
  for (var i = 0u; i < d; i++) { v[i] = x[at + i]; }
  fwht(&v);
  for (var i = 0u; i < d; i++) { x[at + i] = v[i] * norm * signs[i]; }
}
`;
}

// kvq's MergeState (attention/chunk_merge.cc) on `state` at float indices a (the earlier positions'
// state, updated) and b: m = max(m1, m2), c = 1 for a state whose max is m else exp(m_i − m),
// l = l1·c1 + l2·c2, acc = acc1·c1 + acc2·c2; an empty b (m2 = −inf) adds nothing, an empty a takes
// b's numbers as they are. Needs head_dim in scope.
function MergeWgsl() {
  return /* wgsl */ `
fn merge_into(a: u32, b: u32) {
  let m1 = state[a];
  let m2 = state[b];
  // An empty state's m is −inf, told by its bits (a device may assume floats finite).
  if (bitcast<u32>(m2) == 0xff800000u) { return; }
  if (bitcast<u32>(m1) == 0xff800000u) {
    for (var i = 0u; i < head_dim + 2u; i++) { state[a + i] = state[b + i]; }
    return;
  }
  let m = select(m2, m1, m1 > m2);
  let c1 = select(exp(m1 - m), 1.0, m1 == m);
  let c2 = select(exp(m2 - m), 1.0, m2 == m);
  state[a + 1u] = state[a + 1u] * c1 + state[b + 1u] * c2;
  for (var i = 0u; i < head_dim; i++) { state[a + 2u + i] = state[a + 2u + i] * c1 + state[b + 2u + i] * c2; }
  state[a] = m;
}
`;
}

/** The layer-end kernels (finish, gather, renormalise) at head_dim d. */
export function NormaliseWgsl(d) {
  return /* wgsl */ `
const head_dim: u32 = ${d}u;
// Bound to region 0 (the open states) for every entry point but finish, which sees regions 0 and 1.
@group(0) @binding(0) var<storage, read_write> state: array<f32>;  // per head [m, l, acc[${d}]]
${MergeWgsl()}
// The layer's end (kvq's FinishAttention): the open chunk merged into a copy of the merged state
// (region 1, when it holds any chunk), then acc / l, 0 where l is 0 — into region 0.
@compute @workgroup_size(64)
fn finish(@builtin(global_invocation_id) id: vec3u) {
  let n_states = arrayLength(&state) / (2u * ${d + 2}u);
  if (id.x >= n_states) { return; }
  let open = id.x * ${d + 2}u;
  let merged = (n_states + id.x) * ${d + 2}u;
  if (bitcast<u32>(state[merged]) != 0xff800000u) {
    merge_into(merged, open);
    for (var i = 0u; i < ${d + 2}u; i++) { state[open + i] = state[merged + i]; }
  }
  let l = state[open + 1u];
  for (var i = 0u; i < ${d}u; i++) { state[open + 2u + i] = select(0.0, state[open + 2u + i] / l, l > 0.0); }
}
@group(0) @binding(1) var<storage, read_write> out: array<f32>;  // [heads][${d}]
@compute @workgroup_size(64)
fn gather(@builtin(global_invocation_id) id: vec3u) {
  if (id.x >= arrayLength(&state) / ${d + 2}u) { return; }
  for (var i = 0u; i < ${d}u; i++) { out[id.x * ${d}u + i] = state[id.x * ${d + 2}u + 2u + i]; }
}
// A prefill block's outputs: state h (of n_q per query position) to out[(h / n_q) · out_stride +
// (h % n_q) · head_dim ..], each query position's heads in its own slice of the block's buffer.
struct Gather { n_q: u32, out_stride: u32, pad0: u32, pad1: u32 }
@group(0) @binding(2) var<uniform> gather_params: Gather;
@compute @workgroup_size(64)
fn gather_strided(@builtin(global_invocation_id) id: vec3u) {
  if (id.x >= arrayLength(&state) / ${d + 2}u) { return; }
  let at = (id.x / gather_params.n_q) * gather_params.out_stride + (id.x % gather_params.n_q) * ${d}u;
  for (var i = 0u; i < ${d}u; i++) { out[at + i] = state[id.x * ${d + 2}u + 2u + i]; }
}
@compute @workgroup_size(64)
fn renormalise(@builtin(global_invocation_id) id: vec3u) {
  if (id.x >= arrayLength(&state) / ${d + 2}u) { return; }
  let at = id.x * ${d + 2}u;
  for (var i = 0u; i < ${d}u; i++) { state[at + 2u + i] = state[at + 2u + i] / state[at + 1u]; }
  state[at + 1u] = 1.0;
}
`;
}

const kStorage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;

export class GpuKvDevice {
  constructor(device) {
    this.device = device;
    this.pipelines = new Map();  // by the shape and formats they were generated for
    this.slots = [];             // [{buffer, params, rope}]
    this.slot_bytes = 0;
    /** Bytes of GPU buffers holding KV rows (the slots): counted as they are created. */
    this.kv_bytes_now = 0;
    this.peak_kv_bytes = 0;
    this.bug = undefined;  // one of kDeviceBugs, or undefined
    this.windows = 0;      // since Begin
    this.submits = 0;      // command buffers submitted, since construction
    /**
     * Where the commands go: null (each call submits its own command buffer), or {encoder} of a
     * caller that submits it later with its own work (a step program: attention then costs no
     * submit of its own). Uploads are queue writes, applied at once, so a slot written twice
     * before the encoder is submitted would lose its first window: the device then submits the
     * encoder and puts a new one in sink.encoder (counted in `submits`; never when the layer's
     * pages fit its slots).
     */
    this.sink = null;
  }

  // An encoder for the next commands, and the end of them: the sink's, or one submitted now.
  #Encoder() { return this.sink ? this.sink.encoder : this.device.createCommandEncoder(); }
  #Done(encoder) {
    if (!this.sink) this.#Submit(encoder);
  }
  // The sink's commands so far submitted, and a new encoder in their place.
  #Flush() {
    this.#Submit(this.sink.encoder);
    this.sink.encoder = this.device.createCommandEncoder();
    this.sink.slots = new Set();  // the slots written since
    this.sink.begun = false;      // a layer begun since
  }

  #Pipeline(key, code, entry) {
    const id = `${key}|${entry}`;
    let p = this.pipelines.get(id);
    if (!p) {
      p = CachedPipeline(this.device, code, entry);  // shared with the device's other KV devices
      this.pipelines.set(id, p);
    }
    return p;
  }

  // Every command buffer this device submits goes through here, counted (`submits`).
  #Submit(encoder) {
    this.device.queue.submit([encoder.finish()]);
    ++this.submits;
  }

  #Buffer(bytes, usage = kStorage) {
    return this.device.createBuffer({size: Math.max(16, Math.ceil(bytes / 16) * 16), usage});
  }

  // entries: per binding a GPUBuffer (bound whole) or a GPUBufferBinding ({buffer, size}).
  #Dispatch(pipeline, entries, groups) {
    const group = this.device.createBindGroup({
      layout: pipeline.getBindGroupLayout(0),
      entries: entries.map((b, i) => ({binding: i, resource: b instanceof GPUBuffer ? {buffer: b} : b}))});
    const encoder = this.#Encoder();
    const pass = encoder.beginComputePass();
    pass.setPipeline(pipeline);
    pass.setBindGroup(0, group);
    pass.dispatchWorkgroups(Math.max(1, Math.ceil(groups / 64)));
    pass.end();
    this.#Done(encoder);
  }

  /**
   * The queries of the next attention call: Float32Array [n_tokens][n_heads][head_dim], or a
   * GPUBuffer holding `floats` of them.
   */
  SetQueries(q, n_heads, floats = q.length) {
    if (!this.q || this.q.size < floats * 4) {
      this.q?.destroy();
      this.q = this.#Buffer(floats * 4);
    }
    if (q instanceof GPUBuffer) {  // already on the device (the forward pass's q): copied in queue order
      const encoder = this.#Encoder();
      encoder.copyBufferToBuffer(q, 0, this.q, 0, floats * 4);
      this.#Done(encoder);
    } else {
      this.device.queue.writeBuffer(this.q, 0, q);
    }
    this.q_floats = floats;
    this.n_heads = n_heads;
  }

  /** kvq's KvDeviceLayer (as src/web/web_kv.cc writes it). */
  Begin(layer) {
    const L = layer;
    if (this.sink) {  // a second layer into one sink: the first's commands read buffers reset below
      if (this.sink.begun) this.#Flush();
      this.sink.begun = true;
    }
    if (L.softcap !== 0) throw new Error(`the WebGPU KV device has no softcap (got ${L.softcap})`);
    if (!this.q || this.q_floats !== L.n_tokens * this.n_heads * L.head_dim || this.n_heads % L.n_kv_heads) {
      throw new Error(`the queries given (${this.q_floats} numbers, ${this.n_heads} heads) do not fit ${L.n_tokens} ` +
                      `tokens of ${L.n_kv_heads} KV heads x head_dim ${L.head_dim}`);
    }
    this.L = L;
    this.shape = {...L, q_per_kv: this.n_heads / L.n_kv_heads};
    this.key = JSON.stringify([L.key_format, L.value_format, L.n_kv_heads, this.shape.q_per_kv, L.head_dim,
                               L.k_block_bytes, L.v_block_bytes, L.pre_rope, L.rope_pairing, L.rotary_dims]);
    // The slots: allocated once per (count, size), within the budget the cache planned, each one
    // binding (so within the device's limits: refused here, before allocating, if not).
    for (const limit of ['maxStorageBufferBindingSize', 'maxBufferSize']) {
      if (L.slot_bytes > this.device.limits[limit]) {
        throw new Error(`a KV slot of ${L.slot_bytes} bytes (one page of layer ${L.layer}) is over this WebGPU ` +
                        `device's ${limit} of ${this.device.limits[limit]} bytes`);
      }
    }
    if (this.slots.length !== L.slots || this.slot_bytes !== L.slot_bytes) {
      for (const s of this.slots) {
        s.buffer.destroy();
        this.kv_bytes_now -= s.buffer.size;
      }
      this.slots = [];
      for (let i = 0; i < L.slots; ++i) {
        const buffer = this.device.createBuffer({size: L.slot_bytes, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST});
        this.kv_bytes_now += buffer.size;
        const params = this.#Buffer(kAttendParamsBytes, GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST);
        this.slots.push({buffer, params});
      }
      this.slot_bytes = L.slot_bytes;
    }
    this.peak_kv_bytes = Math.max(this.peak_kv_bytes, this.kv_bytes_now);
    const rope_bytes = L.pre_rope ? L.window_rows * L.rotary_dims * 4 : 0;
    for (const s of this.slots) {
      if (rope_bytes && (!s.rope || s.rope.size < rope_bytes)) s.rope = this.#Buffer(rope_bytes);
    }
    // The state regions (AttendWgsl): the open chunk's, the merged chunks', one per piece of a
    // window that can start a chunk (a window of window_rows rows touches at most
    // ceil(window_rows / chunk) + 1 chunks).
    if (!(L.position_chunk > 0)) throw new Error(`the KV device layer carries no position_chunk (got ${L.position_chunk})`);
    this.max_pieces = Math.ceil(L.window_rows / L.position_chunk) + 1;
    const n_states = L.n_tokens * this.n_heads;
    this.region_bytes = n_states * (L.head_dim + 2) * 4;
    const state_bytes = (2 + this.max_pieces) * this.region_bytes;
    if (!this.state || this.state.size !== Math.max(16, Math.ceil(state_bytes / 16) * 16)) {
      this.state?.destroy();
      this.state = this.#Buffer(state_bytes);
    }
    const initial = new Float32Array(2 * this.region_bytes / 4);
    for (let h = 0; h < 2 * n_states; ++h) initial[h * (L.head_dim + 2)] = -Infinity;  // m; l, acc 0
    this.device.queue.writeBuffer(this.state, 0, initial);
    this.open_state = {buffer: this.state, size: this.region_bytes};  // region 0
    // The queries as attention reads them: rotated when the keys are.
    let q = this.q;
    if (L.rotate_queries || L.unrotate_output) {
      this.signs = this.#Buffer(L.head_dim * 4);
      this.device.queue.writeBuffer(this.signs, 0, new Float32Array(L.rotation_signs));
    }
    if (L.rotate_queries) {
      if (!this.q_rotated || this.q_rotated.size < this.q.size) this.q_rotated = this.#Buffer(this.q.size);
      const encoder = this.#Encoder();
      encoder.copyBufferToBuffer(this.q, 0, this.q_rotated, 0, this.q.size);
      this.#Done(encoder);
      this.#HeadOp('rotate', this.q_rotated, n_states, L.head_dim, 0);
      q = this.q_rotated;
    }
    this.attend = this.#Pipeline(this.key, AttendWgsl(this.shape), 'attend');
    this.fold = this.#Pipeline(this.key, AttendWgsl(this.shape), 'fold');
    for (const s of this.slots) {
      const entries = [s.buffer, s.buffer, q, this.state, s.params];
      if (L.pre_rope) entries.push(s.rope);
      s.group = this.device.createBindGroup({layout: this.attend.getBindGroupLayout(0),
                                             entries: entries.map((b, i) => ({binding: i, resource: {buffer: b}}))});
      s.fold_group = this.device.createBindGroup({layout: this.fold.getBindGroupLayout(0), entries: [
        {binding: 3, resource: {buffer: this.state}}, {binding: 4, resource: {buffer: s.params}}]});
    }
    this.windows = 0;
  }

  #HeadOp(entry, buffer, count, stride, offset) {
    const range = this.#Buffer(16, GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST);
    this.device.queue.writeBuffer(range, 0, new Uint32Array([count, stride, offset, 0]));
    this.#Dispatch(this.#Pipeline(`ops${this.L.head_dim}`, HeadOpsWgsl(this.L.head_dim), entry),
                   [buffer, this.signs, range], count);
  }

  #Normalise(entry) {
    const regions = entry === 'finish' ? 2 : 1;  // finish merges region 1 into region 0
    this.#Dispatch(this.#Pipeline(`norm${this.L.head_dim}`, NormaliseWgsl(this.L.head_dim), entry),
                   [{buffer: this.state, size: regions * this.region_bytes}], this.L.n_tokens * this.n_heads);
  }

  /** n bytes at `offset` of `memory` (the WebAssembly heap's ArrayBuffer) into slot `slot`. */
  Upload(slot, memory, offset, n) {
    if (!(slot >= 0 && slot < this.slots.length) || n > this.slot_bytes || n % 4) {
      throw new Error(`upload of ${n} bytes into slot ${slot} of ${this.slots.length} x ${this.slot_bytes} B`);
    }
    if (this.sink) {  // the slot's last window not yet submitted: submit it before overwriting
      this.sink.slots ??= new Set();
      if (this.sink.slots.has(slot)) this.#Flush();
      this.sink.slots.add(slot);
    }
    this.device.queue.writeBuffer(this.slots[slot].buffer, 0, memory, offset, n);
  }

  /** kvq's KvDeviceWindow; rope: Float32Array of its cos/sin (prerope keys), else empty. */
  Attend(w, rope) {
    const L = this.L, s = this.slots[w.slot];
    const later = this.windows > 0;
    if (later && this.bug === 'normalise_at_boundary') this.#Normalise('renormalise');
    if (L.pre_rope) this.device.queue.writeBuffer(s.rope, 0, rope);
    // The chunks the window touches (pieces); its first starts a chunk of its own when the window
    // begins at a chunk's first position after 0 (else it continues the open chunk).
    const chunk = L.position_chunk, first = w.first_position;
    const pieces = w.n_rows > 0 ? Math.floor((first + w.n_rows - 1) / chunk) - Math.floor(first / chunk) + 1 : 0;
    if (pieces > this.max_pieces) throw new Error(`a window of ${w.n_rows} rows over ${pieces} chunks (at most ${this.max_pieces})`);
    const first_fresh = first > 0 && first % chunk === 0 ? 1 : 0;
    const p = new ArrayBuffer(kAttendParamsBytes), u = new Uint32Array(p);
    u.set([w.n_rows, w.first_position, L.first_query_position, 0, w.k.blocks_offset, w.k.head_offset,
           w.k.residual_offset, w.k.n_head, w.k.n_block, w.v.blocks_offset, w.v.head_offset, w.v.residual_offset,
           w.v.n_head, w.v.n_block, later && this.bug === 'drop_first_row' ? 1 : 0,
           later && this.bug === 'double_count_row' ? 1 : 0, chunk, pieces, first_fresh, L.n_tokens,
           this.n_heads * L.head_dim]);
    new Float32Array(p, 12, 1)[0] = L.scale;
    this.device.queue.writeBuffer(s.params, 0, p);
    const encoder = this.#Encoder();
    const pass = encoder.beginComputePass();
    pass.setPipeline(this.attend);
    pass.setBindGroup(0, s.group);
    if (pieces > 0) pass.dispatchWorkgroups(L.n_kv_heads * pieces, L.n_tokens);  // a workgroup per (KV head, piece; query)
    if (pieces > 1 || first_fresh) {  // pieces that started a chunk: folded in chunk order
      pass.setPipeline(this.fold);
      pass.setBindGroup(0, s.fold_group);
      pass.dispatchWorkgroups(Math.ceil(L.n_tokens * this.n_heads / 64));
    }
    pass.end();
    this.#Done(encoder);
    ++this.windows;
  }

  /**
   * acc / l in the state buffer; with rotated values, the output unrotated in a copy of it (the
   * state keeps the rotated output: OutputRotated). Output reads the result.
   */
  Finish() {
    this.#Normalise('finish');
    this.result = this.state;
    if (this.L.unrotate_output) {
      if (!this.unrotated || this.unrotated.size !== Math.max(16, Math.ceil(this.region_bytes / 16) * 16)) {
        this.unrotated?.destroy();
        this.unrotated = this.#Buffer(this.region_bytes);
      }
      const encoder = this.#Encoder();
      encoder.copyBufferToBuffer(this.state, 0, this.unrotated, 0, this.region_bytes);
      this.#Done(encoder);
      this.#HeadOp('unrotate', this.unrotated, this.L.n_tokens * this.n_heads, this.L.head_dim + 2, 2);
      this.result = this.unrotated;
    }
  }

  /**
   * The last call's output, [n_tokens][n_heads][head_dim] f32, written into the GPU buffer `out`
   * (queue order: after Finish) — for a forward pass that goes on on the GPU without reading it.
   */
  OutputTo(out) {
    const result = this.result === this.state ? this.open_state : this.result;
    this.#Dispatch(this.#Pipeline(`norm${this.L.head_dim}`, NormaliseWgsl(this.L.head_dim), 'gather'), [result, out],
                   this.L.n_tokens * this.n_heads);
  }

  async #Read(buffer, bytes) {
    const readback = this.device.createBuffer({size: bytes, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
    const encoder = this.device.createCommandEncoder();
    encoder.copyBufferToBuffer(buffer, 0, readback, 0, bytes);
    this.#Submit(encoder);
    await readback.mapAsync(GPUMapMode.READ);
    const out = new Float32Array(readback.getMappedRange().slice(0));
    readback.unmap();
    readback.destroy();
    return out;
  }

  /** The last call's output: Float32Array [n_tokens][n_heads][head_dim]. */
  async Output() { return this.#Acc(this.result); }
  /** Before a value rotation was undone (the same as Output without one). */
  async OutputRotated() { return this.#Acc(this.state); }

  async #Acc(buffer) {
    const d = this.L.head_dim, n = this.L.n_tokens * this.n_heads;
    const all = await this.#Read(buffer, n * (d + 2) * 4);
    const out = new Float32Array(n * d);
    for (let h = 0; h < n; ++h) out.set(all.subarray(h * (d + 2) + 2, (h + 1) * (d + 2)), h * d);
    return out;
  }

  /** The queries as the last call's attention read them (rotated for a "rot" key spec). */
  async QueriesRead() {
    return this.#Read(this.L.rotate_queries ? this.q_rotated : this.q, this.q_floats * 4);
  }
}
