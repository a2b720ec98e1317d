// The KV device's decode attention split over position chunks (web/gpu/kv_device.js), checked in
// the page against kvq's CPU attention's structure past one chunk: a kvq::KvCache in the
// WebAssembly module (the bundle's kvq.js) holds 2·2048 + 300 positions (three chunks of kvq's
// default position chunk) in each KV format the GPU decodes (every registered one), and streams
// them to the GPU as one window (three chunks attended in parallel, then folded), as pages of 256
// (windows starting at chunk boundaries) and as pages of 96 (windows straddling them). Per format,
// for a decode step and a prefill block of 4 queries:
//   1. the GPU's output equals, bit for bit, kvq's chunked attention computed here in f32 step by
//      step — attention/attend_kernels.cc's per-row recurrence (m' = max(m, s), c = exp(m − m'),
//      e = exp(s − m'), l = l·c + e, acc = acc·c + e·v) within each 2048-position chunk, a chunk's
//      state merged into the earlier ones' at the chunk's end (attention/chunk_merge.cc's
//      MergeState: c = 1 for the state holding the max, an empty state adding nothing) in chunk
//      order, FinishAttention's last merge and acc / l (0 where l = 0) — over the rows as kvq
//      reads them (kvq_web_kv_rows) with scores summed in order of the element (f32, as the
//      GPU's). The one thing taken from the device is exp: WGSL's exp is not the CPU's, so the
//      emulation evaluates its exp arguments (which do not depend on any exp) on the GPU in one
//      batch and uses those values (and checks exp(0) = 1 there, which makes the GPU's c = exp(0)
//      the CPU's c = 1);
//   2. the same emulation without chunks (one running state over every position) differs from the
//      GPU's output for some format: the check can see the chunk structure;
//   3. every window size gives the one-window bits;
//   4. the resident path (web/gpu/kv_resident.js) gives them too, for each format it encodes, with
//      pages of 256 and 96: the master's full pages uploaded into its page pool, the rest encoded on
//      the GPU by one block whose last queries are these. Its attends read runs of pooled pages as
//      one window: the whole context (its three chunks in parallel, then folded: one attend for a
//      one-row format), and runs of 3 pages (windows cutting chunks, pools of several segments).
import {GpuKvDevice} from '/web/gpu/kv_device.js';
import {KeyRowsPerBlock} from '/web/gpu/kv_formats.js';
import {GpuResidentKv, PageBufferBytes, ResidentWhyNot} from '/web/gpu/kv_resident.js';
import {SameBits} from '/test/gpu_attention_page.js';
import {LoadModule, Rng, Rows} from '/test/gpu_kv_device_page.js';

const kChunk = 2048;  // kvq's kDefaultPositionChunk, which src/web/web_kv.cc hands the device
const kPositions = 2 * kChunk + 300;

// exp of every argument, on the device (the WGSL exp the attention kernel calls).
async function DeviceExp(device, args) {
  const code = `@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3u) { if (id.x < arrayLength(&x)) { x[id.x] = exp(x[id.x]); } }`;
  const pipeline = device.createComputePipeline({layout: 'auto', compute: {module: device.createShaderModule({code}), entryPoint: 'main'}});
  const bytes = Math.max(4, args.length * 4);
  const buffer = device.createBuffer({size: bytes, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC});
  const readback = device.createBuffer({size: bytes, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
  device.queue.writeBuffer(buffer, 0, args);
  const encoder = device.createCommandEncoder();
  const pass = encoder.beginComputePass();
  pass.setPipeline(pipeline);
  pass.setBindGroup(0, device.createBindGroup({layout: pipeline.getBindGroupLayout(0), entries: [{binding: 0, resource: {buffer}}]}));
  pass.dispatchWorkgroups(Math.ceil(args.length / 64));
  pass.end();
  encoder.copyBufferToBuffer(buffer, 0, readback, 0, bytes);
  device.queue.submit([encoder.finish()]);
  await readback.mapAsync(GPUMapMode.READ);
  const out = new Float32Array(readback.getMappedRange().slice(0, args.length * 4));
  readback.unmap();
  buffer.destroy();
  readback.destroy();
  return out;
}

const f = Math.fround;

// kvq's chunked attention for query heads of `queries` positions ending at n − 1, in two passes:
// Args() walks the running maxima (which no exp feeds) and records each exp argument in order;
// Run(exps) repeats the walk with those exps. chunk 0: one running state, no merges.
class ChunkedAttention {
  constructor(s, q, k, v, n, queries, scale, chunk) {
    Object.assign(this, {s, q, k, v, n, queries, scale, chunk});
  }

  // The walk; exp(x) gives the factor for argument x (records it in the first pass).
  #Walk(exp) {
    const {s, q, k, v, n, queries, scale, chunk} = this, d = s.head_dim, n_q = s.n_kv_heads * s.q_per_kv;
    const out = new Float32Array(queries * n_q * d);
    const merge = (a, b) => {  // MergeState(a ← b)
      if (b.m === -Infinity) return;
      if (a.m === -Infinity) {
        a.m = b.m;
        a.l = b.l;
        a.acc = Float32Array.from(b.acc);
        return;
      }
      const m = a.m > b.m ? a.m : b.m;
      const c1 = a.m === m ? 1 : exp(f(a.m - m)), c2 = b.m === m ? 1 : exp(f(b.m - m));
      a.l = f(f(a.l * c1) + f(b.l * c2));
      for (let i = 0; i < d; ++i) a.acc[i] = f(f(a.acc[i] * c1) + f(b.acc[i] * c2));
      a.m = m;
    };
    const empty = () => ({m: -Infinity, l: 0, acc: new Float32Array(d)});
    for (let t = 0; t < queries; ++t) {
      const last = n - queries + t;
      for (let h = 0; h < n_q; ++h) {
        const kv = Math.floor(h / s.q_per_kv), qh = q.subarray((t * n_q + h) * d, (t * n_q + h + 1) * d);
        let open = empty();
        const merged = empty();
        for (let r = 0; r <= last; ++r) {
          if (chunk > 0 && r > 0 && r % chunk === 0) {  // FoldOpenChunk
            merge(merged, open);
            open = empty();
          }
          const row = (r * s.n_kv_heads + kv) * d;
          let score = 0;
          for (let i = 0; i < d; ++i) score = f(score + f(qh[i] * k[row + i]));
          const x = f(score * scale);
          const m = x > open.m ? x : open.m;
          const c = exp(f(open.m - m)), e = exp(f(x - m));
          open.l = f(f(open.l * c) + e);
          for (let i = 0; i < d; ++i) open.acc[i] = f(f(open.acc[i] * c) + f(e * v[row + i]));
          open.m = m;
        }
        if (merged.m !== -Infinity) {  // FinishAttention
          merge(merged, open);
          open = merged;
        }
        for (let i = 0; i < d; ++i) out[(t * n_q + h) * d + i] = open.l > 0 ? f(open.acc[i] / open.l) : 0;
      }
    }
    return out;
  }

  Args() {
    const args = [];
    this.#Walk((x) => {
      args.push(x);
      return 1;
    });
    return new Float32Array(args);
  }

  Run(exps) {
    let i = 0;
    return this.#Walk(() => exps[i++]);
  }
}

export async function RunGpuChunkAttentionTests(bundle_url) {
  const t0 = performance.now();
  const failures = [];
  const fail = (m) => failures.push(m);
  let checks = 0, cases = 0, unchunked_differs = 0;
  const adapter = await navigator.gpu?.requestAdapter();
  if (!adapter) return {cases, checks, failures: ['no WebGPU adapter'], seconds: 0};
  const device = await adapter.requestDevice();
  device.addEventListener('uncapturederror', (e) => fail(`WebGPU error: ${e.error.message}`));
  const M = await LoadModule(bundle_url);
  const gpu = new GpuKvDevice(device);
  M.kvqDevice = gpu;
  const Error_ = () => M.UTF8ToString(M._kvq_web_last_error());
  const Floats = (x) => {
    const p = M._malloc(Math.max(4, x.length * 4));
    M.HEAPF32.set(x, p >> 2);
    return p;
  };
  const Str = (s) => {
    const n = M.lengthBytesUTF8(s) + 1, p = M._malloc(n);
    M.stringToUTF8(s, p, n);
    return p;
  };
  const s = {n_kv_heads: 2, q_per_kv: 2, head_dim: 16}, n = kPositions;
  const elems = s.n_kv_heads * s.head_dim, n_q = s.n_kv_heads * s.q_per_kv;
  const Cache = (spec, page, k, v) => {
    const ks = Str(spec);
    const h = M._kvq_web_kv_new(ks, ks, 1, s.n_kv_heads, s.head_dim, n, page, 0, 10000.0, 1, s.head_dim);
    M._free(ks);
    if (!h) {
      fail(`${spec} page ${page}: ${Error_()}`);
      return 0;
    }
    const kp = Floats(k), vp = Floats(v);
    if (M._kvq_web_kv_append(h, 0, kp, vp, n) !== 0) fail(`${spec}: append: ${Error_()}`);
    if (M._kvq_web_kv_append(h, 0, kp, vp, 0) !== 0) fail(`${spec}: append: ${Error_()}`);  // rows as held now
    M._free(kp);
    M._free(vp);
    return h;
  };
  const Attend = async (h, q, queries) => {
    gpu.SetQueries(q, n_q);
    if (M._kvq_web_kv_attend_device(h, 0, n - queries, queries) !== 0) {
      fail(`attend: ${Error_()}`);
      return new Float32Array(0);
    }
    return gpu.Output();
  };
  // The resident path over cache h's rows (pages of `page`; k, v the f32 rows it was given): its full
  // pages restored into the pool, the rest one block whose last `queries` positions take q; windows of up to segment_pages pages.
  // Returns {out: those queries' output, attends: the block's attend dispatches}.
  const Resident = async (h, spec, page, k, v, q, queries, segment_pages) => {
    const layout = JSON.parse(M.UTF8ToString(M._kvq_web_kv_page_layout(h, 0))), d = s.head_dim;
    const c = {n_heads: n_q, n_kv_heads: s.n_kv_heads, head_dim: d, kv_dim: elems, n_cache_layers: 1,
               rotary_dims: d, rope_pairing: 'halves'};
    const resident = new GpuResidentKv(device, c, layout, {key: spec, value: spec}, () => {}, null, null, {segment_pages});
    let full = Math.floor(n / page);
    if (n - full * page < queries) --full;
    const at = M._malloc(PageBufferBytes(layout.page_bytes));
    for (let i = 0; i < full; ++i) {
      if (M._kvq_web_kv_read_page(h, 0, i, at) !== 0) fail(`${spec} page ${i}: ${Error_()}`);
      resident.Restore(0, M.HEAPU8.slice(at, at + layout.page_bytes), full * page);
    }
    M._free(at);
    const pos = full * page, m = n - pos, floats = n_q * d;
    const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;
    const Buffer = (x) => {
      const b = device.createBuffer({size: Math.max(16, x.byteLength), usage});
      device.queue.writeBuffer(b, 0, x);
      return b;
    };
    const queries_at = new Float32Array(m * floats);  // [m][n_q][head_dim]: the block's last `queries` are q
    queries_at.set(q, (m - queries) * floats);
    // Rows 256 bytes apart, as the runner's blocks lay them out (a storage binding's offset alignment).
    const kv_stride = Math.ceil(elems / 64) * 64;
    const Strided = (x) => {
      const rows = new Float32Array(m * kv_stride);
      for (let t = 0; t < m; ++t) rows.set(x.subarray((pos + t) * elems, (pos + t + 1) * elems), t * kv_stride);
      return Buffer(rows);
    };
    const kb = Strided(k), vb = Strided(v);
    const qb = Buffer(queries_at), out = Buffer(new Float32Array(m * floats));
    const readback = device.createBuffer({size: queries * floats * 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
    const sink = {encoder: device.createCommandEncoder()};
    sink.flush = () => {
      device.queue.submit([sink.encoder.finish()]);
      sink.encoder = device.createCommandEncoder();
    };
    const before = resident.counts.attend_dispatches;
    resident.RecordBlock(sink, 0, pos, {n: m, k: kb, v: vb, kv_stride, q: qb, q_stride: floats, out, out_stride: floats});
    const attends = resident.counts.attend_dispatches - before;
    sink.encoder.copyBufferToBuffer(out, (m - queries) * floats * 4, readback, 0, queries * floats * 4);
    resident.BeforeSubmit();
    device.queue.submit([sink.encoder.finish()]);
    resident.Submitted();
    await readback.mapAsync(GPUMapMode.READ);
    const result = new Float32Array(readback.getMappedRange().slice(0));
    readback.unmap();
    const failed = await resident.Drain();
    if (failed) fail(`${spec}: a write-back failed: ${failed.message}`);
    resident.Destroy();
    for (const b of [kb, vb, qb, out, readback]) b.destroy();
    return {out: result, attends};
  };
  let resident_cases = 0;
  {
    ++checks;
    const one = await DeviceExp(device, new Float32Array([0]));
    if (one[0] !== 1) fail(`the device's exp(0) is ${one[0]}, not 1: its c = exp(0) is not kvq's c = 1`);
  }
  const formats = JSON.parse(M.UTF8ToString(M._kvq_web_formats())).map((x) => x.name);
  for (const spec of formats) {
    ++cases;
    const rng = Rng(spec.length * 7919 + 17);
    const k = Rows(n * elems, rng, 2), v = Rows(n * elems, rng, 2);
    const whole = Cache(spec, Math.ceil(n / 32) * 32, k, v);
    if (!whole) continue;
    const kd = M._malloc(n * elems * 4), vd = M._malloc(n * elems * 4);
    if (M._kvq_web_kv_rows(whole, 0, kd, vd) !== 0) fail(`${spec}: rows: ${Error_()}`);
    const k_rows = M.HEAPF32.slice(kd >> 2, (kd >> 2) + n * elems), v_rows = M.HEAPF32.slice(vd >> 2, (vd >> 2) + n * elems);
    M._free(kd);
    M._free(vd);
    for (const queries of [1, 4]) {
      const name = `${spec} q${queries} n=${n}`;
      const q = Rows(queries * n_q * s.head_dim, rng, 1);
      const got = await Attend(whole, q, queries);
      const scale = gpu.L.scale;
      for (const chunk of [kChunk, 0]) {
        const emu = new ChunkedAttention(s, q, k_rows, v_rows, n, queries, scale, chunk);
        const want = emu.Run(await DeviceExp(device, emu.Args()));
        const why = SameBits(got, want);
        if (chunk) {
          ++checks;
          if (why) fail(`${name}: the GPU differs from kvq's chunked attention (${why})`);
        } else if (why) {
          ++unchunked_differs;
        }
      }
      for (const page of [256, 96]) {
        const h = Cache(spec, page, k, v);
        if (!h) continue;
        ++checks;
        const why = SameBits(await Attend(h, q, queries), got);
        if (why) fail(`${name}: pages of ${page} differ from one window (${why})`);
        if (!ResidentWhyNot(spec, spec)) {
          ++resident_cases;
          for (const segment_pages of [Infinity, 3]) {
            const what = `${name}: the resident path, pages of ${page}, windows of ${segment_pages} pages`;
            const r = await Resident(h, spec, page, k, v, q, queries, segment_pages);
            ++checks;
            const differs = SameBits(r.out, got);
            if (differs) fail(`${what}: differs from the KV device's one window (${differs})`);
            if (KeyRowsPerBlock(spec) === 1) {  // one window per run of pages (KIVI: per group piece, plus the residual rows')
              ++checks;
              const want = Math.max(1, Math.ceil(Math.ceil(n / page) / segment_pages));
              if (r.attends !== want) fail(`${what}: ${r.attends} attend dispatches, expected ${want}`);
            }
          }
        }
        M._kvq_web_kv_free(h);
      }
    }
    M._kvq_web_kv_free(whole);
  }
  ++checks;
  if (cases && !unchunked_differs) fail('an unchunked walk gives the GPU\'s bits in every case: the check cannot see the chunks');
  ++checks;
  if (!resident_cases) fail('no format ran on the resident path');
  device.destroy();
  return {cases, checks, failures, unchunked_differs, resident_cases, seconds: (performance.now() - t0) / 1000};
}
