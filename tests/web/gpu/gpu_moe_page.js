// In the page: the GPU's mixture-of-experts ops (web/gpu/moe_kernels.js through the step program's
// moe_route, expert_matvec and moe_combine) against the module's C++ (src/web/web_moe.cc):
//   1. routing: logits of many shapes (random at several scales, exact ties, all equal, gaps past
//      exp's underflow and into its subnormal results, k = n up to 16, 512 experts) through moe_route: the
//      softmax, the chosen ids and their weights equal kvq's RouteRow in the module bit for bit;
//   2. the expert matvec: in the fixture's tiny qwen35moe models (F32, Q8_0 and Q4_0 repacked
//      into the interleaved layout at load, and Q4_1 in rows, a type with a min; 16 experts, 4
//      chosen; the F32 model's first and last layers, the others' first), each rank's rows equal
//      the plain matvec of the chosen expert's slice (ExpertMatrix), bit for bit, the quantised
//      models under both matvec kernels (step_kernels.js: 'rows' and 'lanes');
//   3. each layer's whole MoE feed-forward on random input: the experts the GPU chose are those
//      MoeRows chose, and for the F32 model (whose weights the page reads as they are) the output
//      is within MoeBound of the module's and of a double-precision reference;
//   4. each model's whole step program builds (nothing refused) with its DeltaNet and MoE ops.
import {GpuStepProgram} from '/web/gpu/step_program.js';
import {kMoeOpsBindings, kMoeOpsWgsl} from '/web/gpu/moe_kernels.js';
import {LoadModule, Rng, Rows} from '/test/gpu_kv_device_page.js';
import {LoadModel} from '/test/gpu_device_loss_page.js';

const kU = 2 ** -24;  // f32's unit roundoff
const Gamma = (n) => n * kU / (1 - n * kU);  // γ_n: a sum of n products in f32, any order (Higham 3.1)
const Bits = (f) => new Uint32Array(new Float32Array([f]).buffer)[0];

// The routing cases: [n_experts, k, logits].
function RouteCases() {
  const rng = Rng(31), cases = [];
  const Logits = (n, f) => Float32Array.from({length: n}, (_, i) => f(i));
  for (const n of [2, 6, 16, 64, 128, 512]) {
    for (const k of [1, 2, 4, 8, 10, n]) {
      if (k > n || (k === n && n > 16)) continue;  // k = n: the serial top-k costs n² per row
      for (const scale of [1e-6, 0.1, 1, 4, 30]) {
        for (let r = 0; r < 3; ++r) cases.push([n, k, Rows(n, rng, scale)]);
      }
      cases.push([n, k, Logits(n, () => Math.round(rng() * 4) / 2)]);  // few values: many exact ties
      cases.push([n, k, Logits(n, () => 0.25)]);                        // all equal
      cases.push([n, k, Logits(n, (i) => (i % 3 ? -200 : rng()))]);     // exp underflows to 0: ties at 0
      cases.push([n, k, Logits(n, (i) => (i === n - 1 ? 0 : -80 - 30 * rng()))]);  // subnormal and zero exps
      cases.push([n, k, Logits(n, () => (rng() - 0.5) * 2 ** (40 * rng() - 30))]);  // every magnitude
    }
  }
  return cases;
}

// A buffer's first `bytes` read back.
async function ReadBack(device, buffer, bytes) {
  const staging = device.createBuffer({size: bytes, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
  const encoder = device.createCommandEncoder();
  encoder.copyBufferToBuffer(buffer, 0, staging, 0, bytes);
  device.queue.submit([encoder.finish()]);
  await staging.mapAsync(GPUMapMode.READ);
  const out = staging.getMappedRange().slice(0);
  staging.destroy();
  return out;
}

// 1: every routing case through moe_route in one submit, against RouteRow.
async function CheckRouting(M, device, fail) {
  const module = device.createShaderModule({code: kMoeOpsWgsl});
  const pipeline = device.createComputePipeline({layout: 'auto', compute: {module, entryPoint: 'moe_route'}});
  const cases = RouteCases();
  const Slot = (floats) => Math.ceil(floats * 4 / 256) * 256;  // bytes per case: storage offsets align to 256
  const logit_bytes = cases.reduce((s, [n]) => s + Slot(n), 0), sel_bytes = cases.reduce((s, [, k]) => s + Slot(2 * k), 0);
  const Storage = (bytes) => device.createBuffer({size: bytes, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST |
                                                                        GPUBufferUsage.COPY_SRC});
  const logits = Storage(logit_bytes), sel = Storage(sel_bytes);
  const uniforms = device.createBuffer({size: cases.length * 256, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST});
  const encoder = device.createCommandEncoder();
  const pass = encoder.beginComputePass();
  pass.setPipeline(pipeline);
  const at = [];
  for (let c = 0, lo = 0, so = 0; c < cases.length; ++c) {
    const [n, k, x] = cases[c];
    device.queue.writeBuffer(logits, lo, x);
    device.queue.writeBuffer(uniforms, c * 256, new Uint32Array([n, k, 0, 0]));
    pass.setBindGroup(0, device.createBindGroup({layout: pipeline.getBindGroupLayout(0), entries: [
      {binding: 2, resource: {buffer: logits, offset: lo, size: n * 4}},
      {binding: 3, resource: {buffer: uniforms, offset: c * 256, size: 16}},
      {binding: 9, resource: {buffer: sel, offset: so, size: 2 * k * 4}}]}));
    pass.dispatchWorkgroups(1);
    at.push([lo, so]);
    lo += Slot(n);
    so += Slot(2 * k);
  }
  pass.end();
  device.queue.submit([encoder.finish()]);
  const got_p = new Uint32Array(await ReadBack(device, logits, logit_bytes));
  const got_sel = new Uint32Array(await ReadBack(device, sel, sel_bytes));
  logits.destroy();
  sel.destroy();
  uniforms.destroy();
  // The module's RouteRow of each case.
  const max_n = 512, in_p = M._malloc(max_n * 4), probs = M._malloc(max_n * 4), ids = M._malloc(max_n * 4),
      weights = M._malloc(max_n * 4);
  let checks = 0, exps = 0;
  cases.forEach(([n, k, x], c) => {
    M.HEAPF32.set(x, in_p >> 2);
    if (M._kvq_web_moe_route(in_p, n, k, probs, ids, weights) !== 0) {
      fail(`route case ${c}: ${M.UTF8ToString(M._kvq_web_last_error())}`);
      return;
    }
    const want_p = M.HEAPU32.subarray(probs >> 2, (probs >> 2) + n), want_ids = M.HEAP32.subarray(ids >> 2, (ids >> 2) + k);
    const want_w = M.HEAPU32.subarray(weights >> 2, (weights >> 2) + k);
    const [lo, so] = at[c];
    const what = `route case ${c} (${n} experts, top ${k})`;
    for (let e = 0; e < n; ++e) {
      if (got_p[lo / 4 + e] !== want_p[e]) {
        fail(`${what}: expert ${e}'s probability has bits ${got_p[lo / 4 + e].toString(16)}, RouteRow's ` +
             `${want_p[e].toString(16)} (logit ${x[e]}, largest ${Math.max(...x)})`);
        break;
      }
    }
    for (let i = 0; i < k; ++i) {
      if (got_sel[so / 4 + i] !== want_ids[i] || got_sel[so / 4 + k + i] !== want_w[i]) {
        fail(`${what}: rank ${i} is expert ${got_sel[so / 4 + i]} weight bits ${got_sel[so / 4 + k + i].toString(16)}, ` +
             `RouteRow's expert ${want_ids[i]} bits ${want_w[i].toString(16)}`);
        break;
      }
    }
    ++checks;
    exps += n;
  });
  for (const p of [in_p, probs, ids, weights]) M._free(p);
  return {route_cases: checks, exps};
}

// The double-precision MoE feed-forward of normed input xb and each side's error bound against it
// (first order; each step's f32 roundings at their worst, Higham 3.1 for every dot in any order):
//   dot of length n, exact inputs: γ_n·Σ|w·x|, plus Σ|w|·(the inputs' errors);
//   SwiGLU h = silu(g)·u: 1.1·|u|·e_g + |silu(g)|·e_u (|silu'| ≤ 1.1) + (10 + 2|g|)·u·|h| (WGSL's exp
//     3 + 2|g| ulp, its division 2.5, the add and two products; the CPU's are tighter);
//   softmax: logits off by δ move each probability by 2δ relative, the rounding of l − top by
//     u·|l − top| (and the sum by its p-weighted mean), plus (n + 4)·u (the sum, exp, division);
//     a chosen weight by its probability's and the worst chosen one's, plus (k + 2)·u;
//   σ(gate): 0.25·e_gate + 4·u·σ; the sum: γ_{k+1} of its terms' magnitudes.
// `W(name)`: a tensor's f32 weights [rows][cols]; ids: the chosen experts (MoeRows' = the GPU's).
function MoeBound(c, W, layer, xb, ids) {
  const dim = c.dim, fe = c.moe.expert_hidden_dim, k = ids.length;
  const blk = `blk.${layer}.`;
  const Dot = (w, row0, rows, cols, x, ex) => {  // [rows] of y, Σ|w·x|, the input errors' share
    const y = new Float64Array(rows), e = new Float64Array(rows);
    for (let r = 0; r < rows; ++r) {
      let s = 0, a = 0, d = 0;
      for (let j = 0; j < cols; ++j) {
        const wv = w[(row0 + r) * cols + j];
        s += wv * x[j];
        a += Math.abs(wv * x[j]);
        d += ex ? Math.abs(wv) * ex[j] : 0;
      }
      y[r] = s;
      e[r] = Gamma(cols) * a + d;
    }
    return {y, e};
  };
  const Silu = (g) => g / (1 + Math.exp(-g));
  const SwiGlu = (g, u) => {  // h, e_h
    const h = g.y.map((gv, r) => Silu(gv) * u.y[r]);
    const e = h.map((hv, r) => 1.1 * Math.abs(u.y[r]) * g.e[r] + Math.abs(Silu(g.y[r])) * u.e[r] +
                               (10 + 2 * Math.abs(g.y[r])) * kU * Math.abs(hv));
    return {h, e};
  };
  const Ffn = (w1, w3, w2, row0, rows, down_row0) => {
    const sw = SwiGlu(Dot(W(w1), row0, rows, dim, xb), Dot(W(w3), row0, rows, dim, xb));
    return Dot(W(w2), down_row0, dim, rows, sw.h, sw.e);
  };
  const shared = Ffn(blk + 'ffn_gate_shexp', blk + 'ffn_up_shexp', blk + 'ffn_down_shexp', 0, c.hidden_dim, 0);
  const router = Dot(W(blk + 'ffn_gate_inp'), 0, c.moe.n_experts, dim, xb);
  const top = Math.max(...router.y);
  const ex = router.y.map((l) => Math.exp(l - top)), total = ex.reduce((a, b) => a + b, 0);
  const p = ex.map((v) => v / total), d_logit = Math.max(...router.e);
  // Relative error of each probability: the logits' (2δ), the rounding of l − top inside the exp
  // (|l − top|·u), the sum's share of those, and the sum, exp and division themselves.
  const spread = p.reduce((s, pe, e) => s + pe * Math.abs(router.y[e] - top), 0);
  const rel_p = router.y.map((l) => 2 * d_logit + kU * (Math.abs(l - top) + spread) + (c.moe.n_experts + 4) * kU);
  const chosen_sum = ids.reduce((s, e) => s + p[e], 0), rel_chosen = Math.max(...ids.map((e) => rel_p[e]));
  const w = ids.map((e) => p[e] / chosen_sum), e_w = ids.map((e, i) => w[i] * (rel_p[e] + rel_chosen + (k + 2) * kU));
  const gate = Dot(W(blk + 'ffn_gate_inp_shexp'), 0, 1, dim, xb);
  const sig = 1 / (1 + Math.exp(-gate.y[0])), e_sig = 0.25 * gate.e[0] + 4 * kU * sig;
  const experts = ids.map((e) => Ffn(blk + 'ffn_gate_exps', blk + 'ffn_up_exps', blk + 'ffn_down_exps', e * fe, fe, e * dim));
  const out = new Float64Array(dim), bound = new Float64Array(dim);
  for (let j = 0; j < dim; ++j) {
    let o = sig * shared.y[j], mag = Math.abs(o);
    let b = e_sig * Math.abs(shared.y[j]) + sig * shared.e[j];
    for (let i = 0; i < k; ++i) {
      o += w[i] * experts[i].y[j];
      mag += w[i] * Math.abs(experts[i].y[j]);
      b += e_w[i] * Math.abs(experts[i].y[j]) + w[i] * experts[i].e[j];
    }
    out[j] = o;
    bound[j] = (b + Gamma(k + 1) * mag) * (1 + 2 ** -10);  // the margin: products of two errors (~u²)
  }
  return {out, bound};
}

// 2 and 3 for one model's layer: the step program of its MoE feed-forward alone, run op by op.
async function CheckLayer(M, device, model, layer, type, fail, rng, kernel) {
  const json = M._kvq_web_gpu_moe_program(model, layer);
  if (!json) return fail(`${type} layer ${layer}: ${M.UTF8ToString(M._kvq_web_last_error())}`);
  const program = JSON.parse(M.UTF8ToString(json));
  const c = program.config, dim = c.dim, k = c.moe.n_experts_used, E = c.moe.n_experts;
  // Each expert's slice of each stacked tensor as a matrix of its own (ExpertMatrix's bytes).
  const slices = new Map();  // op index -> [E] tensor indices
  program.ops.forEach((op, i) => {
    if (op.kind !== 'expert_matvec') return;
    const t = program.tensors[op.w], row_bytes = t.bytes / t.rows;
    slices.set(i, Array.from({length: E}, (_, e) => program.tensors.push(
        {...t, name: `${t.name}[${e}]`, address: t.address + e * op.n * row_bytes, bytes: op.n * row_bytes, rows: op.n}) - 1));
  });
  const step = await GpuStepProgram.Create(device, program, M.HEAPU8, () => new Float32Array(c.rotary_dims), null, {matvec: kernel});
  const Storage = (floats) => device.createBuffer({size: floats * 4, usage: GPUBufferUsage.STORAGE |
                                                                       GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC});
  const max_rows = Math.max(dim, c.moe.expert_hidden_dim);
  step.buffers.slice_in = Storage(Math.max(dim, c.moe.expert_hidden_dim));  // [cols] one rank's input
  step.buffers.slice_out = Storage(max_rows);                                // [rows] a slice's matvec
  const slice_results = Storage(slices.size * k * E * max_rows);  // [op][rank][expert][max_rows]
  const rank_results = Storage(slices.size * k * max_rows);       // [op][rank][max_rows]
  const xb = Rows(dim, rng, 1);
  device.queue.writeBuffer(step.buffers.xb, 0, xb);
  device.queue.writeBuffer(step.buffers.x, 0, new Float32Array(dim));  // zero: x becomes the FFN's output
  const encoder = device.createCommandEncoder();
  const Run = (records) => {
    const pass = encoder.beginComputePass();
    for (const r of records) {
      pass.setPipeline(r.pipeline);
      pass.setBindGroup(0, r.group);
      pass.dispatchWorkgroups(r.groups[0], r.groups[1]);
    }
    pass.end();
  };
  let s = 0;
  program.ops.forEach((op, i) => {
    Run(step.records[i]);
    if (!slices.has(i)) return;
    const cols = program.tensors[op.w].cols;
    for (let rank = 0; rank < k; ++rank) {
      encoder.copyBufferToBuffer(step.buffers[op.y], rank * op.n * 4, rank_results, (s * k + rank) * max_rows * 4, op.n * 4);
      encoder.copyBufferToBuffer(step.buffers[op.x], rank * (op.x_stride ?? 0) * 4, step.buffers.slice_in, 0, cols * 4);
      for (let e = 0; e < E; ++e) {
        Run(step.RecordOp({kind: 'matvec', w: slices.get(i)[e], x: 'slice_in', y: 'slice_out'}));
        encoder.copyBufferToBuffer(step.buffers.slice_out, 0, slice_results, ((s * k + rank) * E + e) * max_rows * 4, op.n * 4);
      }
    }
    ++s;
  });
  device.queue.submit([encoder.finish()]);
  const got = new Float32Array(await ReadBack(device, step.buffers.x, dim * 4));
  const sel = new Uint32Array(await ReadBack(device, step.buffers.moe_sel, 2 * k * 4));
  const by_rank = new Uint32Array(await ReadBack(device, rank_results, slices.size * k * max_rows * 4));
  const by_slice = new Uint32Array(await ReadBack(device, slice_results, slices.size * k * E * max_rows * 4));
  const what = `${type} layer ${layer} (${kernel} matvec)`;
  let matvec_checks = 0;
  [...slices.keys()].forEach((i, si) => {
    const op = program.ops[i];
    for (let rank = 0; rank < k; ++rank) {
      const e = sel[rank], a = (si * k + rank) * max_rows, b = ((si * k + rank) * E + e) * max_rows;
      for (let r = 0; r < op.n; ++r) {
        if (by_rank[a + r] !== by_slice[b + r]) {
          fail(`${what}: ${program.tensors[op.w].name} rank ${rank} (expert ${e}) row ${r} has bits ` +
               `${by_rank[a + r].toString(16)}, the slice's matvec ${by_slice[b + r].toString(16)}`);
          break;
        }
      }
      ++matvec_checks;
    }
  });
  // 3: the module's MoeRows on the same input.
  const xb_p = M._malloc(dim * 4), out_p = M._malloc(dim * 4), ids_p = M._malloc(k * 4);
  M.HEAPF32.set(xb, xb_p >> 2);
  if (M._kvq_web_moe_ffn(model, layer, xb_p, out_p, ids_p) !== 0) fail(`${what}: ${M.UTF8ToString(M._kvq_web_last_error())}`);
  const want = M.HEAPF32.slice(out_p >> 2, (out_p >> 2) + dim), ids = Array.from(M.HEAP32.subarray(ids_p >> 2, (ids_p >> 2) + k));
  for (const p of [xb_p, out_p, ids_p]) M._free(p);
  const gpu_ids = Array.from(sel.subarray(0, k));
  if (gpu_ids.join() !== ids.join()) fail(`${what}: the GPU chose experts ${gpu_ids}, MoeRows ${ids}`);
  let worst = 0, worst_ref = 0;
  if (type === 'f32') {
    const index = new Map(program.tensors.map((t, i) => [t.name, i]));
    const W = (name) => {
      const t = program.tensors[index.get(name)];
      if (t.type !== 'f32') throw new Error(`${name} is ${t.type}, not f32`);
      return new Float32Array(M.HEAPU8.buffer, t.address, t.rows * t.cols);
    };
    const {out, bound} = MoeBound(c, W, layer, xb, ids);
    for (let j = 0; j < dim; ++j) {
      const diff = Math.abs(got[j] - want[j]), diff_ref = Math.abs(got[j] - out[j]);
      worst = Math.max(worst, diff / (2 * bound[j]));
      worst_ref = Math.max(worst_ref, diff_ref / bound[j]);
      if (!(diff <= 2 * bound[j])) fail(`${what}: output ${j} is ${got[j]}, MoeRows' ${want[j]} (|diff| ${diff} > ${2 * bound[j]})`);
      if (!(diff_ref <= bound[j])) fail(`${what}: output ${j} is ${got[j]}, the double reference's ${out[j]} (> ${bound[j]})`);
    }
  }
  step.Destroy();
  for (const b of [slice_results, rank_results]) b.destroy();  // (slice_in and slice_out: step.Destroy's)
  return {matvec_checks, worst, worst_ref, ops: program.ops.map((op) => op.kind)};
}

export async function RunGpuMoeTests(fixture_url, bundle_url) {
  const t0 = performance.now();
  const failures = [];
  const fail = (m) => failures.push(m);
  if (!navigator.gpu) return {failures: ['navigator.gpu is missing (WebGPU not enabled)'], route_cases: 0};
  const manifest = await (await fetch(`${fixture_url}/manifest.json`)).json();
  const M = await LoadModule(bundle_url);
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) return {failures: ['no WebGPU adapter'], route_cases: 0};
  const device = await adapter.requestDevice();
  device.addEventListener('uncapturederror', (e) => fail(`WebGPU error: ${e.error.message}`));
  const routing = await CheckRouting(M, device, fail);
  device.destroy();
  const route_seconds = (performance.now() - t0) / 1000;
  const rng = Rng(3131);
  const layers = {}, worst_over_bound = {};
  let matvec_checks = 0, programs_built = 0;
  for (const url of manifest.moe ?? []) {
    const type = url.match(/qwen35moe-(.*)\.gguf/)[1];
    const model = await LoadModel(M, url, '');
    // The whole model's program: nothing refused (its Gated DeltaNet layers and its experts both
    // run on the GPU; gpu_forward_page.js runs the model end to end against native kvq).
    const whole = M._kvq_web_gpu_program(model);
    if (!whole) {
      fail(`${type}: the GPU path refused the whole model: "${M.UTF8ToString(M._kvq_web_last_error())}"`);
    } else {
      const kinds = new Set(JSON.parse(M.UTF8ToString(whole)).ops.map((op) => op.kind));
      for (const k of ['delta_rule', 'moe_route', 'expert_matvec', 'moe_combine']) {
        if (!kinds.has(k)) fail(`${type}: the whole model's program has no ${k} op`);
      }
      programs_built += 1;
    }
    layers[type] = 0;
    const first = M._kvq_web_gpu_moe_program(model, 0);
    if (!first) {
      fail(`${type}: ${M.UTF8ToString(M._kvq_web_last_error())}`);
      continue;
    }
    const n_layers = JSON.parse(M.UTF8ToString(first)).config.n_layers;
    const gpu = await (await navigator.gpu.requestAdapter()).requestDevice();
    gpu.addEventListener('uncapturederror', (e) => fail(`WebGPU error: ${e.error.message}`));
    // Each layer pays for its program's pipelines on SwiftShader: the F32 model's first and last
    // layers (the bound), the others' first.
    // The quantised models' first layer under each matvec kernel (step_kernels.js: the page picks one
    // per adapter; 'lanes' shares a workgroup's rows among its lanes, the experts' as the dense ones').
    const runs = type === 'f32' ? [[0, 'rows'], [n_layers - 1, 'rows']] : [[0, 'rows'], [0, 'lanes']];
    for (const [layer, kernel] of runs) {
      const r = await CheckLayer(M, gpu, model, layer, type, fail, rng, kernel);
      if (!r) continue;
      matvec_checks += r.matvec_checks;
      if (type === 'f32') worst_over_bound[type] = Math.max(worst_over_bound[type] ?? 0, r.worst, r.worst_ref);
      ++layers[type];
    }
    gpu.destroy();
    M._kvq_web_model_free(model);
  }
  if (!Object.keys(layers).length) fail('the fixture lists no MoE models (manifest "moe")');
  return {...routing, route_seconds, layers, matvec_checks, worst_over_bound, programs_built, failures,
          seconds: (performance.now() - t0) / 1000};
}
