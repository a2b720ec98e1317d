// In the page (headless Chromium, WebGPU on SwiftShader): web/gpu/kv_attention.js on the cases
// tests/web/gpu/gpu_attention_fixture.cc wrote with kvq's codecs. Per case:
//   1. the shader's dequantisation of every K and V row == kvq's Codec::decode_row, bit for bit;
//   2. windowed == one window, bit for bit, for a decode step (the last position's query) and a
//      prefill block (8 query positions, causal): every window size 1..100 at 100 positions (the
//      prefill block at 14 of them) on each format's first shape, kShapeWindows on its other
//      shapes, 18 sizes at 4,100 (boundaries at and around powers of two; 32-row key groups then
//      split at every offset, and 4 residual keys);
//   3. one window vs a double-precision reference over kvq's decoded rows, within the bound derived
//      below;
//   4. seed 000's three bugs injected (a dropped row at a boundary, a row counted twice, a
//      normalisation at a boundary), each seen by check 2 on two-window and many-window runs;
//   5. the device budget: GPU KV buffers peak at or under it, with a context 100x what it holds,
//      and the same bits as one window.
//   6. the weight matvecs (web/gpu/weight_types.js) for every type in kvq's weight-type registry
//      (the fixture iterates it; each must be one the GPU reads, kGpuWeightTypes, and each of those
//      must have a case): every weight the shader decodes == kvq's dequantize_block_ref, bit for
//      bit; y = W x vs double over those weights within γ_(cols+1)·Σ|w·x| per row (a sum in order
//      of f32 products, u = 2^-24); and for the types whose matvec quantises its activation (all
//      but F32, F16, BF16), the step program's kernels (step_kernels.js: quantize, then the
//      matvec) == kvq's MatVec on its SCALAR target, bit for bit (the same quantisation, integer
//      dots and f32 sums in order), over the file's rows and, for the types the WebAssembly module
//      repacks (Q8_0, Q4_0, Q4_K, Q6_K), over kvq's repacked 16-row groups;
//      for every type and layout, the block kernels (matmul_kernels.js's matmul, after the
//      quantisation of every token in one dispatch for the quantising types) over
//      kMatmulCheckTokens tokens (the case's x and variations of it; more than one group of
//      kMatmulTokens, the last partial; strided slices) == the matvec's for each token alone,
//      bit for bit.
// Returns {cases, checks, failures: [...], seconds}.
import {GpuKvAttention, kInjectedBugs} from '/web/gpu/kv_attention.js';
import {kOpsBindings, kOpsWgsl, MatmulGroups, MatvecGroups, WeightOpsBindings, WeightOpsWgsl} from '/web/gpu/step_kernels.js';
import {GpuMatvec, kGpuWeightTypes, RowBytes} from '/web/gpu/weight_types.js';

// Window sizes at 4,100 positions. 31, 33, 63 and 65 are odd, so their window starts fall on every
// offset within a 32-row key group (each runs over 64 or more windows); sizes below 31 are tried
// at 100 positions (every size 1..100), where they cost 1/41 of the submits (a window is a submit:
// 3 and 7 here were 1,953 of the 2,752 windows per run, and crossed no group offset 31 and 33 miss).
const kLongWindows = [31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 255, 256, 257, 511, 512, 1000, 2048, 4095];

// Window sizes at 100 positions on a format's shapes after its first (which runs every size): what
// a shape changes is the bytes of a row, so where a window's rows start in the buffers; 2 and 3 put
// window starts on every offset of a 32-row key group (3 is odd) and of the 4 residual keys, 31-33
// split at a group boundary and either side of it, 50 and 99 give two windows, the second of one row.
const kShapeWindows = {decode: [2, 3, 5, 31, 32, 33, 50, 99], prefill: [3, 32, 33, 99]};

export function SameBits(a, b) {
  const x = new Uint32Array(a.buffer, a.byteOffset, a.length), y = new Uint32Array(b.buffer, b.byteOffset, b.length);
  if (x.length !== y.length) return `${x.length} vs ${y.length} numbers`;
  for (let i = 0; i < x.length; ++i) {
    if (x[i] !== y[i]) return `number ${i}: ${a[i]} vs ${b[i]}`;
  }
  return '';
}

// Attention in double over kvq's decoded rows, and per output number the error bound of the f32
// computation. Derivation (u = 2^-24, the f32 unit roundoff): a score s_i = scale · Σ_d q·k' summed
// in f32 in order of d is off by at most δ_i = (d + 2)·u·scale·Σ|q·k'| (d − 1 additions, the
// products, the scale, to first order); WGSL's f32 exp is within
// 3 + 2|x| ULP = (3 + 2|x|)·2u relative. The weights e^(s_i − m) are then off by a factor within
// exp(2·max δ) · (1 + (3 + 2R)·2u) with R = max |s_i − m| over the row, and the running sums l and
// acc take one rounding per row for the product and one for the add, plus one per rescale by c:
// 3(n + 1)·u relative to Σ p_i|v_i|. acc / l adds one more rounding. So
//   |out − ref| ≤ Σ_i p_i|v_i| · (2·(2·max δ + (3 + 2R)·2u) + (3n + 5)·u) + |out|·u
// (twice the weight error: once in acc, once in l). Observed errors are 1-3 orders below it.
// Query position `pos` attends to positions 0 .. pos; q: its [n_q][head_dim].
export function Reference(c, q, k, v, h, pos) {
  const d = c.head_dim, kv_head = Math.floor(h / c.q_per_kv), per_row = c.n_kv_heads * d;
  const positions = pos + 1;
  const scale = Math.fround(1 / Math.sqrt(d));
  const u = 2 ** -24;
  const scores = new Float64Array(positions);
  let m = -Infinity, max_delta = 0;
  for (let i = 0; i < positions; ++i) {
    let s = 0, abs = 0;
    for (let j = 0; j < d; ++j) {
      const p = q[h * d + j] * k[i * per_row + kv_head * d + j];
      s += p;
      abs += Math.abs(p);
    }
    scores[i] = s * scale;
    max_delta = Math.max(max_delta, (d + 2) * u * scale * abs);
    m = Math.max(m, scores[i]);
  }
  let l = 0, range = 0;
  const w = new Float64Array(positions);
  for (let i = 0; i < positions; ++i) {
    w[i] = Math.exp(scores[i] - m);
    l += w[i];
    range = Math.max(range, m - scores[i]);
  }
  const out = new Float64Array(d), bound = new Float64Array(d);
  const relative = 2 * (2 * max_delta + (3 + 2 * range) * 2 * u) + (3 * positions + 5) * u;
  for (let j = 0; j < d; ++j) {
    let o = 0, mass = 0;
    for (let i = 0; i < positions; ++i) {
      const x = v[i * per_row + kv_head * d + j];
      o += w[i] * x;
      mass += w[i] * Math.abs(x);
    }
    out[j] = o / l;
    bound[j] = (mass / l) * relative + Math.abs(out[j]) * u;
  }
  return {out, bound};
}

async function Fetch(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r;
}

async function CheckMatvec(device, c, url, fail) {
  const bytes = await (await Fetch(url)).arrayBuffer();
  const section = (name, Type) => new Type(bytes.slice(c.sections[name].offset, c.sections[name].offset + c.sections[name].bytes));
  const w = section('w', Uint8Array), want = section('decoded', Float32Array), x = section('x', Float32Array);
  const gpu = await GpuMatvec.Create(device, c.type);
  const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;
  const buffer = (n) => device.createBuffer({size: Math.ceil(n / 4) * 4, usage});
  const w_buf = buffer(w.byteLength), x_buf = buffer(x.byteLength);
  const padded = new Uint8Array(Math.ceil(w.byteLength / 4) * 4);
  padded.set(w);
  device.queue.writeBuffer(w_buf, 0, padded);
  device.queue.writeBuffer(x_buf, 0, x);
  const run = async (entry, n) => {
    const out = buffer(n * 4), readback = device.createBuffer({size: n * 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
    const encoder = device.createCommandEncoder();
    gpu.Record(encoder, 0, w_buf, 0, c.rows, c.cols, x_buf, out, entry);
    encoder.copyBufferToBuffer(out, 0, readback, 0, n * 4);
    device.queue.submit([encoder.finish()]);
    await readback.mapAsync(GPUMapMode.READ);
    const result = new Float32Array(readback.getMappedRange().slice(0));
    readback.unmap();
    out.destroy();
    readback.destroy();
    return result;
  };
  const decoded = await run('dequantize', c.rows * c.cols);
  const why = SameBits(decoded, want);
  if (why) fail(`${c.name}: the shader decodes a weight differently from kvq's dequantize_block_ref (${why})`);
  const y = await run('matvec', c.rows);
  const gamma = (c.cols + 1) * 2 ** -24 / (1 - (c.cols + 1) * 2 ** -24);
  for (let r = 0; r < c.rows; ++r) {
    let exact = 0, abs = 0;
    for (let k = 0; k < c.cols; ++k) {
      exact += want[r * c.cols + k] * x[k];
      abs += Math.abs(want[r * c.cols + k] * x[k]);
    }
    if (!(Math.abs(y[r] - exact) <= gamma * abs)) {
      fail(`${c.name}: row ${r}: GPU ${y[r]} vs double ${exact}, over the bound ${gamma * abs}`);
      break;
    }
  }
  let checks = 2;
  const layouts = [['rows', w_buf]];  // the matrix as each layout the page reads it in holds it
  if (c.sections.w_interleaved) {  // kvq's repacked bytes of the same matrix
    const wi = section('w_interleaved', Uint8Array);
    const wi_buf = buffer(wi.byteLength);
    const wi_padded = new Uint8Array(Math.ceil(wi.byteLength / 4) * 4);
    wi_padded.set(wi);
    device.queue.writeBuffer(wi_buf, 0, wi_padded);
    layouts.push(['interleaved16', wi_buf]);
  }
  if (c.sections.y_scalar) {
    const want_y = section('y_scalar', Float32Array);
    for (const [layout, buf] of layouts) {  // the same bits in either layout, with either matvec kernel
      for (const kernel of kMatvecKernels) {
        const why_q = SameBits((await StepMatvecs(device, c, buf, [x], layout, kernel))[0], want_y);
        if (why_q) fail(`${c.name}: the step program's quantised matvec (${layout}, ${kernel}) differs from kvq's SCALAR MatVec (${why_q})`);
        ++checks;
      }
    }
  }
  for (const [layout, buf] of layouts) {
    for (const kernel of kMatvecKernels) checks += await CheckMatmul(device, c, buf, x, layout, kernel, fail);
  }
  for (const [, buf] of layouts) buf.destroy();
  x_buf.destroy();
  return checks;
}

const kMatmulCheckTokens = 11;
// The step program's matvec kernels (step_kernels.js's MatvecKernelFor picks one per device): each
// must give kvq's SCALAR MatVec's bits.
const kMatvecKernels = ['rows', 'lanes'];
// Floats per token of the matmul's x, xd and y beyond the packed sizes: none a multiple of 4, so
// a stride mistaken for the packed size shows.
const kStridePad = {x: 7, xd: 3, y: 5};

// The step program's block kernels over kMatmulCheckTokens tokens (token 0: x; token t: x rotated
// by 37·t columns and scaled by 1 + t/16), the weights in w_buf in `layout`: the quantisation of
// every token in one dispatch (quantising types), then the matmul (`kernel`); each token's y against
// StepMatvecs' (the same kernel's) for that token alone, bit for bit. Returns the checks made.
async function CheckMatmul(device, c, w_buf, x, layout, kernel, fail) {
  const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;
  const T = kMatmulCheckTokens, nb = c.cols / 32;
  const x_stride = c.cols + kStridePad.x, xd_stride = nb + kStridePad.xd, y_stride = c.rows + kStridePad.y;
  const x_all = new Float32Array(T * x_stride);  // [T][x_stride]
  const xs = [];  // [T][cols]
  for (let t = 0; t < T; ++t) {
    const xt = new Float32Array(c.cols);
    for (let k = 0; k < c.cols; ++k) xt[k] = Math.fround(x[(k + 37 * t) % c.cols] * (1 + t / 16));
    x_all.set(xt, t * x_stride);
    xs.push(xt);
  }
  const want = await StepMatvecs(device, c, w_buf, xs, layout, kernel);
  const x_buf = device.createBuffer({size: x_all.byteLength, usage});
  device.queue.writeBuffer(x_buf, 0, x_all);
  const xq_all = device.createBuffer({size: T * c.cols * 4, usage});     // [T][cols]
  const xd_all = device.createBuffer({size: T * xd_stride * 4, usage});  // [T][xd_stride]
  const y_all = device.createBuffer({size: T * y_stride * 4, usage});    // [T][y_stride]
  const Pipeline = (code, entry) => CachedPipeline(device, code, entry);
  const Uniform = (words) => {
    const b = device.createBuffer({size: Math.ceil(words.length / 4) * 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST});
    device.queue.writeBuffer(b, 0, new Uint32Array(words));
    return b;
  };
  const Group = (pipeline, bindings, resources) => device.createBindGroup({layout: pipeline.getBindGroupLayout(0),
    entries: bindings.map((b) => ({binding: b, resource: {buffer: resources[b]}}))});
  const matmul = Pipeline(WeightOpsWgsl(c.type, layout, kernel), 'matmul');
  const dims = Uniform([c.rows, c.cols, RowBytes(c.type, c.cols), 0, 0, T, y_stride, xd_stride, x_stride]);
  const quantize_params = Uniform([c.cols, x_stride, xd_stride, 0]);
  const resources = {0: w_buf, 1: x_buf, 2: y_all, 3: dims, 7: xq_all, 8: xd_all};
  const readback = device.createBuffer({size: T * y_stride * 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
  const encoder = device.createCommandEncoder();
  const pass = encoder.beginComputePass();
  if (WeightOpsBindings(c.type).matmul.includes(7)) {  // every token's activation quantised at once
    const quantize = Pipeline(kOpsWgsl, 'quantize');
    pass.setPipeline(quantize);
    pass.setBindGroup(0, Group(quantize, kOpsBindings.quantize, {...resources, 3: quantize_params}));
    pass.dispatchWorkgroups(Math.ceil(nb / 64), T);
  }
  pass.setPipeline(matmul);
  pass.setBindGroup(0, Group(matmul, WeightOpsBindings(c.type).matmul, resources));
  pass.dispatchWorkgroups(...MatmulGroups(c.type, c.rows, T, kernel));
  pass.end();
  encoder.copyBufferToBuffer(y_all, 0, readback, 0, T * y_stride * 4);
  device.queue.submit([encoder.finish()]);
  await readback.mapAsync(GPUMapMode.READ);
  const got = new Float32Array(readback.getMappedRange().slice(0));
  readback.unmap();
  for (const b of [x_buf, xq_all, xd_all, y_all, dims, quantize_params, readback]) b.destroy();
  for (let t = 0; t < T; ++t) {
    const why = SameBits(got.subarray(t * y_stride, t * y_stride + c.rows), want[t]);
    if (why) fail(`${c.name} (${layout}, ${kernel}): the matmul's token ${t} of ${T} differs from its matvec (${why})`);
  }
  return T;
}

// A compute pipeline of `code`'s `entry`, made once per device (SwiftShader compiles slowly).
const pipeline_cache = new WeakMap();  // device -> Map entry + code -> GPUComputePipeline
function CachedPipeline(device, code, entry) {
  if (!pipeline_cache.has(device)) pipeline_cache.set(device, new Map());
  const cache = pipeline_cache.get(device), key = `${entry}\n${code}`;
  if (!cache.has(key)) {
    cache.set(key, device.createComputePipeline({layout: 'auto', compute: {module: device.createShaderModule({code}), entryPoint: entry}}));
  }
  return cache.get(key);
}

// Per activation of `xs` (Float32Array [cols] each), y [rows] = the step program's matvec (`kernel`)
// over the weights in w_buf in `layout` (the activation quantised first by its quantize kernel for the
// types whose matvec quantises): each its own buffers and dispatches, all in one submit.
async function StepMatvecs(device, c, w_buf, xs, layout, kernel = 'rows') {
  const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;
  const Uniform = (words) => {
    const b = device.createBuffer({size: Math.ceil(words.length / 4) * 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST});
    device.queue.writeBuffer(b, 0, new Uint32Array(words));
    return b;
  };
  const Group = (pipeline, bindings, resources) => device.createBindGroup({layout: pipeline.getBindGroupLayout(0),
    entries: bindings.map((b) => ({binding: b, resource: {buffer: resources[b]}}))});
  const matvec = CachedPipeline(device, WeightOpsWgsl(c.type, layout, kernel), 'matvec');
  const quantize = CachedPipeline(device, kOpsWgsl, 'quantize');
  const uniforms = [Uniform([c.cols, 0, 0, 0]), Uniform([c.rows, c.cols, RowBytes(c.type, c.cols), 0, 0, 0, 0, 0, 0])];
  const readback = device.createBuffer({size: xs.length * c.rows * 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
  const bindings = WeightOpsBindings(c.type).matvec, made = [...uniforms, readback];
  const encoder = device.createCommandEncoder();
  xs.forEach((x, t) => {
    const x_buf = device.createBuffer({size: c.cols * 4, usage}), xq = device.createBuffer({size: c.cols * 4, usage});
    const xd = device.createBuffer({size: Math.max(16, c.cols / 32 * 4), usage}), y = device.createBuffer({size: c.rows * 4, usage});
    made.push(x_buf, xq, xd, y);
    device.queue.writeBuffer(x_buf, 0, x);
    const pass = encoder.beginComputePass();
    if (bindings.includes(7)) {
      pass.setPipeline(quantize);
      pass.setBindGroup(0, Group(quantize, kOpsBindings.quantize, {1: x_buf, 3: uniforms[0], 7: xq, 8: xd}));
      pass.dispatchWorkgroups(Math.ceil(c.cols / 32 / 64));
    }
    pass.setPipeline(matvec);
    pass.setBindGroup(0, Group(matvec, bindings, {0: w_buf, 1: x_buf, 2: y, 3: uniforms[1], 7: xq, 8: xd}));
    pass.dispatchWorkgroups(...MatvecGroups(c.type, c.rows, kernel));
    pass.end();
    encoder.copyBufferToBuffer(y, 0, readback, t * c.rows * 4, c.rows * 4);
  });
  device.queue.submit([encoder.finish()]);
  await readback.mapAsync(GPUMapMode.READ);
  const out = new Float32Array(readback.getMappedRange().slice(0));
  readback.unmap();
  for (const b of made) b.destroy();
  return xs.map((_, t) => out.subarray(t * c.rows, (t + 1) * c.rows));
}

export async function RunGpuAttentionTests(fixture_url, only) {
  const t0 = performance.now();
  const failures = [];
  let checks = 0;
  const fail = (what) => failures.push(what);
  if (!navigator.gpu) return {failures: ['navigator.gpu is missing (WebGPU not enabled)'], checks, cases: 0};
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) return {failures: ['no WebGPU adapter'], checks, cases: 0};
  const device = await adapter.requestDevice();
  device.addEventListener('uncapturederror', (e) => fail(`WebGPU error: ${e.error.message}`));
  const manifest = await (await Fetch(`${fixture_url}/manifest.json`)).json();
  let cases = 0;
  const swept = new Set();  // formats whose every window size ran (at 100 positions)
  for (const c of manifest.cases) {
    if (only && !c.name.includes(only)) continue;
    ++cases;
    const bytes = await (await Fetch(`${fixture_url}/${c.file}`)).arrayBuffer();
    const section = (name, Type) => {
      const s = c.sections[name];
      return new Type(bytes.slice(s.offset, s.offset + s.bytes));
    };
    const q_block = section('q', Float32Array);
    const host = {k_blocks: section('k_blocks', Uint8Array), k_residual: section('k_residual', Float32Array),
                  v_blocks: section('v_blocks', Uint8Array)};
    const kd = section('k_decoded', Float32Array), vd = section('v_decoded', Float32Array);
    const n = c.positions, per_row = c.n_kv_heads * c.head_dim, n_q = c.n_kv_heads * c.q_per_kv;
    const q = q_block.subarray((c.queries - 1) * n_q * c.head_dim);  // the decode step's query
    let gpu;
    try {
      gpu = await GpuKvAttention.Create(device, {key_format: c.format, value_format: c.format,
        n_kv_heads: c.n_kv_heads, q_per_kv: c.q_per_kv, head_dim: c.head_dim,
        k_block_bytes: c.k_block_bytes, v_block_bytes: c.v_block_bytes});
    } catch (e) {
      fail(`${c.name}: ${e.message}`);
      continue;
    }
    // 1. Dequantisation in the shader == kvq's decode_row.
    const decoded = await gpu.Decode(host, n);
    ++checks;
    for (let r = 0; r < n; ++r) {
      const why = SameBits(decoded.subarray(2 * r * per_row, (2 * r + 1) * per_row), kd.subarray(r * per_row, (r + 1) * per_row)) ||
                  SameBits(decoded.subarray((2 * r + 1) * per_row, (2 * r + 2) * per_row), vd.subarray(r * per_row, (r + 1) * per_row));
      if (why) {
        fail(`${c.name}: row ${r} decodes differently from kvq's decode_row (${why})`);
        break;
      }
    }
    // 2. Windowed == one window, decode and prefill.
    const whole = await gpu.Run(q, host, n);
    const block = await gpu.Run(q_block, host, n, {queries: c.queries});
    ++checks;
    const last = SameBits(block.subarray((c.queries - 1) * n_q * c.head_dim), whole);
    if (last) fail(`${c.name}: the prefill block's last position differs from the decode step (${last})`);
    const sweep = n <= 100 && !swept.has(c.format);
    if (sweep) swept.add(c.format);
    const windows = n > 100 ? kLongWindows : sweep ? Array.from({length: n}, (_, i) => i + 1) : kShapeWindows.decode;
    for (const w of windows) {
      const out = await gpu.Run(q, host, n, {window: w});
      ++checks;
      const why = SameBits(out, whole);
      if (why) fail(`${c.name}: window ${w} differs from one window (${why})`);
    }
    const block_windows = n > 100 ? kLongWindows : sweep ? [1, 2, 3, 5, 7, 8, 9, 16, 31, 32, 33, 48, 89, 99]
                                                         : kShapeWindows.prefill;
    for (const w of block_windows) {
      const out = await gpu.Run(q_block, host, n, {queries: c.queries, window: w});
      ++checks;
      const why = SameBits(out, block);
      if (why) fail(`${c.name}: prefill block at window ${w} differs from one window (${why})`);
    }
    // 3. One window vs the double reference over kvq's decoded rows, every query position.
    let worst = 0;
    for (let t = 0; t < c.queries; ++t) {
      const qt = q_block.subarray(t * n_q * c.head_dim, (t + 1) * n_q * c.head_dim);
      for (let h = 0; h < n_q; ++h) {
        const {out, bound} = Reference(c, qt, kd, vd, h, n - c.queries + t);
        const got = block.subarray((t * n_q + h) * c.head_dim);
        for (let j = 0; j < c.head_dim; ++j) {
          const err = Math.abs(got[j] - out[j]);
          worst = Math.max(worst, err / bound[j]);
          if (!(err <= bound[j])) {
            fail(`${c.name}: query ${t} head ${h} number ${j}: GPU ${got[j]} vs double ${out[j]}, ` +
                 `error ${err} over the bound ${bound[j]}`);
            break;
          }
        }
      }
    }
    ++checks;
    c.worst_error_over_bound = worst;
    // 4. The injected bugs are seen, with two windows and with many, decode and prefill.
    for (const bug of kInjectedBugs) {
      for (const w of [Math.ceil(n / 2), n <= 100 ? 10 : 100]) {
        const out = await gpu.Run(q, host, n, {window: w, bug});
        const out_block = await gpu.Run(q_block, host, n, {queries: c.queries, window: w, bug});
        checks += 2;
        if (!SameBits(out, whole)) fail(`${c.name}: injected bug ${bug} at window ${w} went unseen`);
        if (!SameBits(out_block, block)) fail(`${c.name}: injected bug ${bug} at window ${w} went unseen (prefill)`);
      }
    }
    // 5. The device budget: a context 100x the rows it holds.
    if (n > 100) {
      const rows = Math.floor(n / 100);
      const budget = 2 * gpu.SlotBytes(rows);
      gpu.peak_kv_bytes = 0;  // this run's peak (no GPU KV buffer is alive between runs)
      const out = await gpu.Run(q, host, n, {device_budget_bytes: budget});
      ++checks;
      const why = SameBits(out, whole);
      if (why) fail(`${c.name}: the budgeted run (${budget} B, ${gpu.WindowRowsFor(budget)} rows a window) differs (${why})`);
      if (gpu.peak_kv_bytes > budget) fail(`${c.name}: GPU KV buffers peaked at ${gpu.peak_kv_bytes} B over the budget ${budget} B`);
      if (gpu.WindowRowsFor(budget) !== rows) fail(`${c.name}: the budget holds ${gpu.WindowRowsFor(budget)} rows, not ${rows} (1/100 of ${n})`);
      c.budget = {bytes: budget, rows: gpu.WindowRowsFor(budget)};
    }
  }
  // The registry's types (the fixture writes one case per type) against the types the GPU reads.
  const registry = manifest.matvec.map((c) => c.type);
  for (const t of registry) if (!kGpuWeightTypes.includes(t)) fail(`weight type ${t} (kvq's registry): the GPU kernels do not read it`);
  for (const t of kGpuWeightTypes) if (!registry.includes(t)) fail(`weight type ${t}: read by the GPU kernels, but no matvec case (not in kvq's registry?)`);
  for (const c of manifest.matvec) {
    if (only && !c.name.includes(only)) continue;
    ++cases;
    checks += await CheckMatvec(device, c, `${fixture_url}/${c.file}`, fail);
  }
  device.destroy();
  const worst = Math.max(0, ...manifest.cases.filter((c) => c.worst_error_over_bound !== undefined).map((c) => c.worst_error_over_bound));
  return {cases, checks, failures, worst_error_over_bound: worst, seconds: (performance.now() - t0) / 1000};
}
