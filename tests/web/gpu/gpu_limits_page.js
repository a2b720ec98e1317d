// In the page: the WebGPU path within a device's limits (web/gpu/step_program.js: WeightPlacement,
// GpuLimitsFor). For each model of gpu_forward_fixture's manifest:
//   - split: the binding limit forced below the model's largest matrix of each layout (2.5× under
//     it, so such a tensor runs as three or more pieces, each its own binding, as a 151,936-row embedding or
//     classifier does under the default 128 MiB): one prompt's steps give the logits of the
//     unforced run bit for bit (a piece is a row range: every row's arithmetic is unchanged)
//     and so the same ids; and the same ids prefilled as one block (GpuModelRunner.Prefill: op by
//     op, a matmul per piece for Q1_0) give the last step's logits bit for bit;
//   - refused: maxBufferSize forced 4 bytes under the logits buffer: GpuStepProgram refuses with a
//     sentence naming maxBufferSize and the model before creating any buffer or shader, and
//     RequestGpuDevice refuses before asking the adapter for a device;
//   - a binding limit under the readback buffer: refused naming maxStorageBufferBindingSize; a
//     piece under the widest row (or 16-row group) of any weight: no placement, naming that tensor;
//   - the program with one query head per KV head more than the attention kernel's lanes, or a
//     head_dim over 256: StepProgramWhyNot says so (the page then runs on the CPU); as it is: ''.
import {GpuModelRunner, GpuProgramOf, RequestGpuDevice} from '/web/gpu/gpu_engine.js';
import {AttendLanes} from '/web/gpu/kv_attention.js';
import {GpuLimitsFor, GpuStepProgram, ProgramName, StepProgramWhyNot, TensorKey, WeightPlacement} from '/web/gpu/step_program.js';
import {LoadModel} from '/test/gpu_device_loss_page.js';
import {LoadModule} from '/test/gpu_kv_device_page.js';

const kSpec = 'int8';
const kSteps = 12;

async function Run(runner, ids) {
  runner.NewSequence(kSpec, kSpec);
  const out = [];
  for (let i = 0; i < kSteps; ++i) {
    const {token, logits} = await runner.Step(i < ids.length ? ids[i] : out[out.length - 1].token, {logits: true});
    out.push({token, logits});
  }
  return out;
}

export async function RunGpuLimitsTests(fixture_url, bundle_url, only = '') {
  const t0 = performance.now();
  const failures = [];
  const fail = (m) => failures.push(m);
  if (!navigator.gpu) return {failures: ['navigator.gpu is missing (WebGPU not enabled)'], models: 0};
  const M = await LoadModule(bundle_url);
  const manifest = await (await fetch(`${fixture_url}/manifest.json`)).json();
  const origin = new URL(fixture_url).origin;
  const report = {};
  let models = 0;
  // One device for every model (the adapter's limits: at or over what RequestGpuDevice asks for
  // any of them; the splits below force their own lower ones): the kernels the models share are
  // compiled once (pipeline_cache.js), where a device per model compiled them all again for each.
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) return {failures: ['no WebGPU adapter'], models: 0};
  const device = await adapter.requestDevice({requiredLimits: {
    maxStorageBufferBindingSize: adapter.limits.maxStorageBufferBindingSize, maxBufferSize: adapter.limits.maxBufferSize}});
  let model_name = '';  // the model whose checks run, for a WebGPU error
  device.addEventListener('uncapturederror', (e) => fail(`${model_name}: WebGPU error: ${e.error.message}`));
  for (const m of manifest.models.filter((o) => !only || o.name === only)) {
    ++models;
    model_name = m.name;
    const model = await LoadModel(M, origin + m.model, m.tokenizer ? origin + m.tokenizer : '');
    const {program, why_not} = GpuProgramOf(M, model);
    if (!program) {
      fail(`${m.name}: the GPU path refused it: ${why_not}`);
      continue;
    }
    const needs = GpuLimitsFor(program, adapter.limits);
    if (needs.why_not) fail(`${m.name}: the adapter cannot hold it: ${needs.why_not}`);
    {  // attention heads the kernel takes: a lane per query head of a KV head, per element up to 256
      const cfg = program.config, lanes = AttendLanes(cfg.head_dim);
      const WhyNot = (config) => StepProgramWhyNot({...program, config: {...cfg, ...config}});
      const wide = WhyNot({n_heads: cfg.n_kv_heads * (lanes + 1)}), long = WhyNot({head_dim: 512});
      if (!wide.includes(`at most ${lanes} query heads per KV head`)) fail(`${m.name}: ${lanes + 1} query heads per KV head: "${wide}"`);
      if (!long.includes('head_dim up to 256')) fail(`${m.name}: head_dim 512: "${long}"`);
      if (WhyNot({}) !== '') fail(`${m.name}: the program as it is refused: "${WhyNot({})}"`);
    }
    // Split: the largest tensor of each layout in three or more pieces.
    // Matrices only: a vector (a norm's weights, a DeltaNet layer's conv taps) is one row, never
    // cut. And only a layout whose largest matrix, cut so, leaves a binding that still holds the
    // program's other buffers (the readback, activations, states): the tiny qwen35's largest F32
    // matrix (ssm_alpha, 6 × 64 floats) would force a binding under its 6,144-byte delta-rule state.
    const c = program.config;
    const others = Math.max(4 + 4 * c.vocab_size, 8 * c.kv_dim, ...Object.values(program.buffers).map((n) => 4 * n),
                            ...Object.values(program.states || {}).map((n) => 4 * n));
    const matrices = program.tensors.filter((t) => t.rows > 1);
    const targets = [...new Set(matrices.map((t) => t.layout))].map((layout) =>
      matrices.filter((t) => t.layout === layout).reduce((a, t) => (t.bytes > a.bytes ? t : a)))
      .filter((t) => Math.floor(t.bytes / 2.5 / 4) * 4 >= others);
    if (!targets.length) fail(`${m.name}: no matrix large enough to split under a binding that holds ${others} bytes`);
    const cap = Math.min(...targets.map((t) => Math.floor(t.bytes / 2.5 / 4) * 4));
    const placed = WeightPlacement(program, cap);
    const pieces = {};
    for (const t of targets) {
      pieces[t.name] = placed.pieces.get(TensorKey(t))?.length;
      if (placed.why_not || !(pieces[t.name] >= 3)) fail(`${m.name}: a ${cap}-byte binding cuts ${t.name} into ${pieces[t.name]} pieces (${placed.why_not})`);
    }
    const ids = m.runs[0].ids;
    const whole = await GpuModelRunner.Create(M, device, model, program);
    const want = await Run(whole, ids);
    whole.Destroy();
    const split = await GpuModelRunner.Create(M, device, model, program, {step: {max_binding_bytes: cap}});
    const got = await Run(split, ids);
    const buffers = split.step.chunks.length;
    split.NewSequence(kSpec, kSpec);
    const fed = got.slice(0, kSteps - 1).map((g, i) => (i + 1 < ids.length ? ids[i + 1] : g.token));
    const block = await split.Prefill([ids[0], ...fed], {logits: true});
    const at_block = block.logits.findIndex((v, j) => !Object.is(v, want[kSteps - 1].logits[j]));
    if (at_block >= 0 || block.token !== want[kSteps - 1].token) {
      fail(`${m.name}: ${kSteps} ids prefilled as one block split at ${cap} B: id ${block.token} vs ` +
           `${want[kSteps - 1].token}, logit ${at_block}: ${block.logits[at_block]} vs ${want[kSteps - 1].logits[at_block]}`);
    }
    split.Destroy();
    for (let i = 0; i < kSteps; ++i) {
      const a = got[i].logits, b = want[i].logits;
      const at = a.findIndex((v, j) => !Object.is(v, b[j]));
      if (at >= 0 || got[i].token !== want[i].token) {
        fail(`${m.name}: step ${i} with ${JSON.stringify(pieces)} split at ${cap} B: id ${got[i].token} vs ${want[i].token}, ` +
             `logit ${at}: ${a[at]} vs ${b[at]}`);
        break;
      }
    }
    report[m.name] = {binding_bytes: cap, pieces, weight_buffers: buffers};
    // Refused: maxBufferSize under the logits buffer, before any allocation.
    const max_buffer = 4 + program.config.vocab_size * 4 - 4;
    let created = 0;
    const counted = {  // the device's limits; anything created is counted (and not usable)
      limits: {maxStorageBufferBindingSize: device.limits.maxStorageBufferBindingSize, maxBufferSize: device.limits.maxBufferSize},
      createBuffer: () => ++created, createShaderModule: () => ++created, createComputePipelineAsync: async () => ++created,
    };
    const name = ProgramName(program);
    try {
      await GpuStepProgram.Create(counted, program, M.HEAPU8, () => new Float32Array(program.config.rotary_dims), null,
                                  {max_buffer_bytes: max_buffer});
      fail(`${m.name}: a ${max_buffer}-byte maxBufferSize was not refused`);
    } catch (e) {
      if (!e.message.includes('maxBufferSize') || !e.message.includes(name)) {
        fail(`${m.name}: the refusal does not name maxBufferSize and ${name}: ${e.message}`);
      }
      if (created) fail(`${m.name}: ${created} buffers or shaders created before the refusal`);
      report[m.name].refusal = e.message;
    }
    let asked = 0;
    const small_adapter = {limits: {maxStorageBufferBindingSize: 1 << 30, maxBufferSize: max_buffer},
                           features: new Set(), requestDevice: async () => ++asked};
    try {
      await RequestGpuDevice(program, small_adapter);
      fail(`${m.name}: RequestGpuDevice took an adapter whose maxBufferSize is ${max_buffer}`);
    } catch (e) {
      if (!e.message.includes('maxBufferSize') || asked) fail(`${m.name}: RequestGpuDevice: ${e.message} (${asked} devices asked for)`);
    }
    // A binding under the readback buffer: refused naming the binding limit; a piece under the
    // widest row (or 16-row group) of any weight: no placement, naming that tensor.
    const narrow = GpuLimitsFor(program, {maxStorageBufferBindingSize: max_buffer, maxBufferSize: 1 << 30});
    if (!narrow.why_not.includes('maxStorageBufferBindingSize') || !narrow.why_not.includes(name)) {
      fail(`${m.name}: a ${max_buffer}-byte binding limit: expected a refusal naming it and ${name}, got "${narrow.why_not}"`);
    }
    // The widest row is not always the largest tensor's: a model whose largest tensor has rows
    // of a few hundred bytes (a Q2_K or Q6_K classifier of 256 columns, row-major) has wider
    // norm vectors (one row of dim f32).
    const unit_of = (t) => (t.layout === 'interleaved16' ? 16 : 1) * t.bytes / t.rows;
    const widest = program.tensors.reduce((a, t) => (unit_of(t) > unit_of(a) ? t : a));
    const unit = unit_of(widest);
    const under = WeightPlacement(program, unit - 4);
    if (!under.why_not.includes(widest.name)) {
      fail(`${m.name}: ${unit - 4}-byte pieces: expected ${widest.name} named as not fitting, got "${under.why_not}"`);
    }
    M._kvq_web_model_free(model);
  }
  device.destroy();
  return {models, report, failures, seconds: (performance.now() - t0) / 1000};
}
