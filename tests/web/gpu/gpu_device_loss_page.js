// In the page: the WebGPU path (web/gpu/gpu_engine.js) survives losing its device. The bundled
// stories260K, 3 prompts × KV specs {int8, int4-kivi+prerope} (one spec per call: `only`), 120 greedy ids
// after each prompt:
//   - uninterrupted: the reference ids;
//   - (the first prompt) the device destroyed (device.destroy(), as a lost device behaves) after
//     40 generated ids: the runner asks for a new device, uploads the weights again from the
//     module's memory and goes on at the same position over the module's master cache — the 120
//     ids equal the reference, exactly (the same kernels on the same adapter give the same bits);
//   - the device destroyed in the middle of a step (after layer 1's K and V rows reached the
//     master; int4-kivi+prerope, streamed: path 'stream' asked for, as the resident path takes prerope
//     too, and its other runs here are resident, kv_resident_rope.js): the redone step keeps the
//     rows that got through and gives the same ids; and int4-kivi+sink4+res16, resident (f32 sink
//     and residual rows on the GPU), lost after 40 ids with pages of 32: the held ids run again
//     from position 0 (the master's pages lack those rows) and give the same ids; and
//     int4-kivi+prerope in the mixed KV mode (pages of 32, one resident per layer), lost after 40
//     ids: page 0 streamed from the master before the loss and after it, the same ids;
//   - the device destroyed after 40 ids with no device coming back (acquire forced to give
//     none): the rest runs on the module's C++ forward over the same cache.
// And one int8 run streamed with pages of 32 positions (the KV device reusing its slots within a
// step, so it submits part of the step's commands itself) gives the logits of the one-page run bit
// for bit. int8 has a WGSL encoder, so its runs hold the KV resident on the GPU (kv_resident.js):
// a loss drops the tail page the master has not got yet, and the runner runs its ids again — one
// more int8 run with pages of 32 loses its device with a page written behind (rebuilt from the
// master) and must give the same ids too; and so must one in the mixed KV mode (a device budget of
// 2 streaming slots and one resident page per layer, under the context: the page written behind is
// evicted and streamed from the master, before the loss and after it). And one int8 run with pages
// of 32 prefills the prompt and the reference's first kLoseAt ids in blocks of kBlock
// (GpuModelRunner.Prefill) and loses its device in the block after the first page (submitted, its
// readback not back): the block is redone from its first position and the ids equal the reference.
// The CPU continuation is not the GPU's arithmetic bit for bit: the C++ forward sums matvecs,
// norms and attention in its SIMD lanes' order where the GPU sums per row in column order and
// per workgroup in trees, and its exp is Highway's. Both quantise activations for Q-type weights
// by the same rule and score attention in f32 (kvq_web_kv_cpu_step sets it), and stories260K's
// weights are F32, so the logits differ by rounding only (~1e-5, gpu_forward's kBound reasoning),
// while the smallest gap between the two largest logits along these runs is reported (min_gap):
// the ids can only part where that gap is within rounding, and the test fails with that gap
// printed if they do. The test also asserts where the steps ran (events, cpu_steps).
import {GpuModelRunner, GpuProgramOf, RequestGpuDevice} from '/web/gpu/gpu_engine.js';
import {kMinStreamSlots, MixedCosts, PageBufferBytes} from '/web/gpu/kv_resident.js';
import {LoadModule} from '/test/gpu_kv_device_page.js';

const kSpecs = ['int8', 'int4-kivi+prerope'];
const kPrompts = ['Once upon a time', 'The little dog', 'Lily wanted to'];
const kNew = 120, kLoseAt = 40, kMidStepAt = 60;
const kBlock = 16;  // prefill block of the mid-block loss: the third block starts at position 32

async function Bytes(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`fetching ${url}: HTTP ${r.status}`);
  return new Uint8Array(await r.arrayBuffer());
}

/** Loads the model at `url` (and a llama2.c tokenizer) into the module; returns its handle. */
export async function LoadModel(M, url, tokenizer_url) {
  const path = `/${url.split('/').pop()}`;
  M.FS.writeFile(path, await Bytes(url));
  let tok = '';
  if (tokenizer_url) {
    tok = `/${tokenizer_url.split('/').pop()}`;
    M.FS.writeFile(tok, await Bytes(tokenizer_url));
  }
  const model = M.ccall('kvq_web_model_load', 'number', ['string', 'string'], [path, tok]);
  M.FS.unlink(path);
  if (tok) M.FS.unlink(tok);
  if (!model) throw new Error(`loading ${url}: ${M.UTF8ToString(M._kvq_web_last_error())}`);
  return model;
}

export function Tokenize(M, model, text) {
  const n = M.ccall('kvq_web_tokenize', 'number', ['number', 'string', 'number', 'number', 'number'], [model, text, -1, 0, 0]);
  const p = M._malloc(n * 4);
  M.ccall('kvq_web_tokenize', 'number', ['number', 'string', 'number', 'number', 'number'], [model, text, -1, p, n]);
  const ids = Array.from(M.HEAP32.subarray(p >> 2, (p >> 2) + n));
  M._free(p);
  return ids;
}

// kNew greedy ids after `prompt` on `runner`; hook(i) is called before generated id i runs.
// Returns {ids, min_gap: the smallest gap between the two largest logits where ids were chosen
// (with_logits only)}.
export async function Generate(runner, spec, prompt, hook = () => {}, with_logits = false, page_positions = 0, path = 'auto',
                        budget = 0) {
  runner.NewSequence(spec, spec, budget, page_positions, {path});
  let last;
  for (const id of prompt) last = await runner.Step(id, {logits: with_logits});
  const ids = [];
  let min_gap = Infinity;
  const logits = [];
  for (let i = 0; i < kNew; ++i) {
    if (with_logits) {
      logits.push(last.logits);
      let best = -Infinity, second = -Infinity;
      for (const v of last.logits) {
        if (v > best) [best, second] = [v, best];
        else if (v > second) second = v;
      }
      min_gap = Math.min(min_gap, best - second);
    }
    ids.push(last.token);
    if (i + 1 === kNew) break;
    await hook(i + 1);
    last = await runner.Step(last.token, {logits: with_logits});
  }
  return {ids, min_gap, logits};
}

export function FirstDifference(a, b) {
  for (let i = 0; i < Math.max(a.length, b.length); ++i) if (a[i] !== b[i]) return i;
  return -1;
}

export async function RunGpuDeviceLossTests(bundle_url, only = '') {
  const t0 = performance.now();
  const failures = [];
  const fail = (m) => failures.push(m);
  if (!navigator.gpu) return {failures: ['navigator.gpu is missing (WebGPU not enabled)'], runs: 0};
  const M = await LoadModule(bundle_url);
  const model = await LoadModel(M, '/models/stories260K.bin', '/models/tok512.bin');
  const {program, why_not} = GpuProgramOf(M, model);
  if (!program) return {failures: [`the GPU path refused stories260K: ${why_not}`], runs: 0};
  let acquired = 0;
  const acquire = async () => {
    ++acquired;
    return RequestGpuDevice(program);
  };
  const reference = await GpuModelRunner.Create(M, await RequestGpuDevice(program), model, program);
  const survivor = await GpuModelRunner.Create(M, await RequestGpuDevice(program), model, program, {acquire});
  let runs = 0, losses = 0, min_gap = Infinity;
  const prompts = kPrompts.map((text) => Tokenize(M, model, text));
  const Check = (what, got, want) => {
    ++runs;
    const at = FirstDifference(got.ids, want.ids);
    if (at >= 0) fail(`${what}: id ${at} is ${got.ids[at]}, the uninterrupted run's ${want.ids[at]}`);
  };
  const references = {};
  const specs = kSpecs.filter((s) => !only || s === only);
  if (!specs.length) fail(`no KV spec "${only}" here (${kSpecs.join(', ')})`);
  for (const spec of specs) {
    for (let pi = 0; pi < prompts.length; ++pi) {
      const what = `"${kPrompts[pi]}" ${spec}`;
      const want = references[what] = await Generate(reference, spec, prompts[pi], () => {}, true);
      min_gap = Math.min(min_gap, want.min_gap);
      // The re-acquire after kLoseAt ids on the first prompt only: the other prompts' references
      // are for the cases below (their runs of this one changed only the ids it ran on).
      if (pi !== 0) continue;
      const events = survivor.events.length;
      const got = await Generate(survivor, spec, prompts[pi], (i) => {
        if (i === kLoseAt) {
          survivor.device.destroy();
          ++losses;
        }
      });
      Check(`${what}, device lost after ${kLoseAt} ids`, got, want);
      const e = survivor.events.slice(events);
      if (e.length !== 1 || e[0].to !== 'gpu' || e[0].position !== prompts[pi].length + kLoseAt - 1) {
        fail(`${what}: expected one re-acquired device at position ${prompts[pi].length + kLoseAt - 1}, got ${JSON.stringify(e)}`);
      }
    }
  }
  // Lost in the middle of a step: after layer 1's rows reached the master.
  if (specs.includes('int4-kivi+prerope')) {
    const spec = 'int4-kivi+prerope', what = `"${kPrompts[0]}" ${spec}`;
    let armed = false;
    survivor.after_append = (layer) => {
      if (armed && layer === 1) {
        armed = false;
        survivor.device.destroy();
        ++losses;
      }
    };
    const got = await Generate(survivor, spec, prompts[0], (i) => {
      armed = i === kMidStepAt;
    }, false, 0, 'stream');
    survivor.after_append = null;
    Check(`${what}, device lost in the middle of a step`, got, references[what]);
    // A resident sinkN / resN spec (kv_resident_rows.js) with pages of 32, lost after kLoseAt ids:
    // the master's pages lack its f32 rows, so the held ids run again from position 0.
    const rows_spec = 'int4-kivi+sink4+res16', rows_what = `"${kPrompts[0]}" ${rows_spec} pages of 32`;
    const rows_want = await Generate(reference, rows_spec, prompts[0], () => {}, false, 32);
    const rows_events = survivor.events.length;
    const rows_got = await Generate(survivor, rows_spec, prompts[0], (i) => {
      if (i !== kLoseAt) return;
      if (survivor.path !== 'resident') fail(`${rows_what}: the ${survivor.path} path ran (${survivor.path_why})`);
      survivor.device.destroy();
      ++losses;
    }, false, 32);
    Check(`${rows_what}, device lost after ${kLoseAt} ids`, rows_got, rows_want);
    const e = survivor.events.slice(rows_events);
    if (e.length !== 1 || e[0].replayed?.from !== 0) fail(`${rows_what}: expected one replay from position 0, got ${JSON.stringify(e)}`);
    // Mixed with pages of 32 (a budget of one resident page per layer beside the slots, the f32
    // newest key groups and the cos/sin rows: MixedCosts), lost after kLoseAt ids: page 0 of every
    // layer evicted before the loss, so the new device's cache streams it from the master again.
    survivor.NewSequence(spec, spec, 0, 32);
    const costs = MixedCosts(survivor.layout, program.config, spec), mixed_budget = costs.fixed + costs.page;
    const mixed_what = `${what} pages of 32, mixed KV (budget ${mixed_budget} bytes)`;
    const mixed_events = survivor.events.length, streamed_before = survivor.counts.streamed_bytes;
    let streamed_at_loss = 0;
    const mixed_got = await Generate(survivor, spec, prompts[0], (i) => {
      if (i !== kLoseAt) return;
      if (survivor.path !== 'mixed' || survivor.resident_pages !== 1) {
        fail(`${mixed_what}: the ${survivor.path} path ran with ${survivor.resident_pages} resident pages (${survivor.path_why})`);
      }
      streamed_at_loss = survivor.counts.streamed_bytes - streamed_before;
      survivor.device.destroy();
      ++losses;
    }, false, 32, 'auto', mixed_budget);
    Check(`${mixed_what}, device lost after ${kLoseAt} ids`, mixed_got, references[what]);
    const me = survivor.events.slice(mixed_events);
    if (me.length !== 1 || me[0].to !== 'gpu' || !(streamed_at_loss > 0) ||
        !(survivor.counts.streamed_bytes - streamed_before > streamed_at_loss)) {
      fail(`${mixed_what}: expected one re-acquired device and pages streamed before the loss and after it, got ` +
           `${JSON.stringify(me)}, ${streamed_at_loss} bytes before, ${survivor.counts.streamed_bytes - streamed_before} in all`);
    }
  }
  // Resident with pages of 32: lost after 40 ids, a whole page already in the master.
  if (specs.includes('int8')) {
    const spec = 'int8', what = `"${kPrompts[0]}" ${spec} pages of 32`;
    const events = survivor.events.length;
    const got = await Generate(survivor, spec, prompts[0], (i) => {
      if (i === kLoseAt) {
        if (survivor.path !== 'resident') fail(`${what}: the ${survivor.path} path ran (${survivor.path_why})`);
        survivor.device.destroy();
        ++losses;
      }
    }, false, 32);
    Check(`${what}, device lost after ${kLoseAt} ids`, got, references[`"${kPrompts[0]}" ${spec}`]);
    if (survivor.events.length !== events + 1) fail(`${what}: expected one re-acquired device`);
    // Mixed: lost after 40 ids (position ≥ 32: page 0 of every layer already evicted, streamed).
    const budget = (kMinStreamSlots + program.config.n_layers) * PageBufferBytes(survivor.layout.page_bytes);
    const mixed_what = `"${kPrompts[0]}" ${spec} pages of 32, mixed KV (budget ${budget} bytes)`;
    const streamed_before = survivor.counts.streamed_bytes;
    let streamed_at_loss = 0;
    const mixed = await Generate(survivor, spec, prompts[0], (i) => {
      if (i === kLoseAt) {
        if (survivor.path !== 'mixed') fail(`${mixed_what}: the ${survivor.path} path ran (${survivor.path_why})`);
        streamed_at_loss = survivor.counts.streamed_bytes - streamed_before;
        survivor.device.destroy();
        ++losses;
      }
    }, false, 32, 'auto', budget);
    Check(`${mixed_what}, device lost after ${kLoseAt} ids`, mixed, references[`"${kPrompts[0]}" ${spec}`]);
    if (survivor.events.length !== events + 2) fail(`${mixed_what}: expected one re-acquired device`);
    // Lost in a prefill block (the synchronous part of Prefill records and submits the block; the
    // destroy lands before its readback).
    const block_what = `"${kPrompts[0]}" ${spec} pages of 32, lost in a prefill block`;
    const want = references[`"${kPrompts[0]}" ${spec}`];
    const fed = [...prompts[0], ...want.ids.slice(0, kLoseAt)];
    survivor.NewSequence(spec, spec, 0, 32);
    await survivor.Prefill(fed.slice(0, 32), {block: kBlock});
    const pending = survivor.Prefill(fed.slice(32), {block: kBlock});
    survivor.device.destroy();
    ++losses;
    let last = await pending;
    const block_ids = want.ids.slice(0, kLoseAt);
    while (block_ids.length < kNew) {
      block_ids.push(last.token);
      if (block_ids.length < kNew) last = await survivor.Step(last.token);
    }
    Check(block_what, {ids: block_ids}, want);
    const e = survivor.events.slice(events + 2);
    if (e.length !== 1 || e[0].to !== 'gpu' || e[0].position !== 32) {
      fail(`${block_what}: expected one re-acquired device at position 32, got ${JSON.stringify(e)}`);
    }
    if (!(streamed_at_loss > 0) || !(survivor.counts.streamed_bytes - streamed_before > streamed_at_loss)) {
      fail(`${mixed_what}: ${streamed_at_loss} bytes streamed before the loss, ` +
           `${survivor.counts.streamed_bytes - streamed_before} in all (expected some before and more after)`);
    }
  }
  // Pages of 32 positions through the KV device's two slots: each layer's attention streams 4–5
  // windows, so the device submits the step's encoder before reusing a slot (kv_device.js's sink).
  // The attention has the same bits for every page size: the logits equal the one-page run's.
  let flushes = 0;
  if (specs.includes('int8')) {  // (one spec: each test stays near a minute on SwiftShader)
    const spec = 'int8', what = `"${kPrompts[2]}" ${spec}`;
    const before = reference.counts.device_submits;
    const got = await Generate(reference, spec, prompts[2], () => {}, true, 32, 'stream');
    flushes = reference.counts.device_submits - before;
    const want = references[what];
    const at = got.logits.findIndex((l, i) => l.some((v, j) => !Object.is(v, want.logits[i][j])));
    if (at >= 0) fail(`${what}: pages of 32 positions change the logits after generated id ${at}`);
    if (!(flushes > 0)) fail(`${what}: pages of 32 positions through 2 slots, yet the KV device never submitted`);
  }
  const gpu_events = survivor.events.length;
  if (acquired !== losses) fail(`${losses} devices lost, ${acquired} asked for`);
  if (survivor.cpu_steps !== 0) fail(`${survivor.cpu_steps} steps ran on the CPU with a device coming back`);
  survivor.Destroy();
  // No device comes back: the rest on the CPU.
  const stranded = await GpuModelRunner.Create(M, await RequestGpuDevice(program), model, program, {acquire: async () => null});
  for (const spec of specs) {
    const what = `"${kPrompts[1]}" ${spec}`;
    const before = stranded.cpu_steps;
    const got = await Generate(stranded, spec, prompts[1], (i) => {
      if (i === kLoseAt && stranded.device) stranded.device.destroy();
    });
    Check(`${what}, device lost after ${kLoseAt} ids and none back (the rest on the CPU)`, got, references[what]);
    const on_cpu = stranded.cpu_steps - before;
    if (on_cpu !== kNew - kLoseAt) fail(`${what}: ${on_cpu} steps on the CPU, expected ${kNew - kLoseAt}`);
  }
  if (specs.length && (stranded.events.length !== 1 || stranded.events[0].to !== 'cpu')) {
    fail(`expected one move to the CPU, got ${JSON.stringify(stranded.events)}`);
  }
  const cpu_event = stranded.events[0]?.why;
  stranded.Destroy();
  reference.Destroy();
  return {runs, losses, gpu_events, cpu_event, flushes, failures, min_gap, seconds: (performance.now() - t0) / 1000};
}
