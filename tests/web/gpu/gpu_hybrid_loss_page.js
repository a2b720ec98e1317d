// In the page: a hybrid (a tiny qwen35 of gpu_forward_fixture, or another of its hybrids: Gated
// DeltaNet layers whose recurrent state lives on the GPU, between gated attention layers) survives
// losing its WebGPU device mid-generation (web/gpu/gpu_engine.js's #Rebuild, module_forward.js's
// CatchUp): the held ids run again, since the state went with the device. The first prompt of the
// manifest's runs, kNew greedy ids (gpu_device_loss_page.js's Generate: the prompt token by token),
// pages of kPage positions, KV int8 (resident: WGSL encoders) and int4-kivi+prerope (streamed: path
// 'stream' asked for, kPaths, as the resident path takes prerope too; grouped keys, the case where a replay that attended the master's rows instead of writing them
// again would read a whole group where the first pass read f32 rows):
//   - uninterrupted: the reference ids, logits and master pages;
//   - the device destroyed after kLoseAt ids, a new one coming back: positions 0 .. pos − 1 run
//     again on it in prefill blocks from zeroed states, then the step. The ids equal the
//     reference's strictly, the logits of every step after the loss equal its bit for bit (so a
//     block replay gives the recurrent states of token steps), the master's pages equal its byte
//     for byte (the replay wrote the same K and V), and the event says replayed {from 0, pos};
//   - int8: lost while a prefill block is in flight (the block starts at position 2·kBlock): the
//     positions before it run again, then the block; the same ids;
//   - int4-kivi+prerope: lost in the middle of a step (after the first attention layer's rows reached the
//     master): the same ids;
//   - the device destroyed after kLoseAt ids with none coming back: the held ids run again on the
//     module's C++ forward from position 0 (the master cut back to none, its state zeroed) and the
//     rest runs there. The rule (module_forward.js): the sequence is the CPU's from position 0, so
//     the ids after the loss are exactly what kvq_web_kv_cpu_step gives, greedy, over a fresh
//     cache fed the prompt and the first kLoseAt ids (asserted strictly; how many of them differ
//     from the GPU's reference is printed: the CPU sums in another order, see gpu_forward_page.js).
// A replay one position short fails each case that replays there (tried by hand on the GPU's and on
// the CPU's: the step then runs over a master and a state one position behind), and so does a CPU
// continuation that keeps the master's rows and runs nothing again (its state then starts at zero).
import {GpuModelRunner, GpuProgramOf, RequestGpuDevice} from '/web/gpu/gpu_engine.js';
import {FirstDifference, Generate, LoadModel} from '/test/gpu_device_loss_page.js';
import {LoadModule} from '/test/gpu_kv_device_page.js';

const kSpecs = ['int8', 'int4-kivi+prerope'];
const kPaths = {'int8': 'auto', 'int4-kivi+prerope': 'stream'};  // Generate's path per spec
const kNew = 120, kLoseAt = 40, kMidStepAt = 60;  // kNew: Generate's
const kPage = 32;
const kBlock = 16;

// Every whole page of every layer in `runner`'s master (after its write-backs): [layer][page] bytes.
async function MasterPages(M, runner) {
  await runner.Drain();
  const c = runner.config, {page_positions, page_bytes} = runner.layout, ptr = M._malloc(page_bytes), out = [];
  try {
    for (let layer = 0; layer < c.n_cache_layers; ++layer) {
      const pages = [];
      for (let page = 0; page < Math.floor(M._kvq_web_kv_positions(runner.kv, layer) / page_positions); ++page) {
        if (M._kvq_web_kv_read_page(runner.kv, layer, page, ptr) !== 0) throw new Error(`reading page ${page} of layer ${layer}`);
        pages.push(M.HEAPU8.slice(ptr, ptr + page_bytes));
      }
      out.push(pages);
    }
  } finally {
    M._free(ptr);
  }
  return out;
}

// Where two masters' pages differ ('' when every page of every layer is equal byte for byte).
function PagesDiffer(got, want) {
  for (let layer = 0; layer < want.length; ++layer) {
    if (got[layer].length !== want[layer].length) return `layer ${layer} holds ${got[layer].length} pages, expected ${want[layer].length}`;
    for (let page = 0; page < want[layer].length; ++page) {
      const at = want[layer][page].findIndex((b, i) => b !== got[layer][page][i]);
      if (at >= 0) return `layer ${layer} page ${page} byte ${at}`;
    }
  }
  return '';
}

// `n` greedy ids on the module's C++ forward over a fresh cache with `spec` after `fed` (the ids
// run: the id after fed's last is the first).
function CpuGreedy(M, model, spec, fed, n) {
  const kv = M.ccall('kvq_web_kv_new_for_model', 'number', ['number', 'string', 'string', 'number', 'number'],
                     [model, spec, spec, 0, kPage]);
  if (!kv) throw new Error(`a CPU cache (${spec}): ${M.UTF8ToString(M._kvq_web_last_error())}`);
  try {
    const Run = (id) => {
      const next = M._kvq_web_kv_cpu_step(model, kv, id, 0);
      if (next < 0) throw new Error(`a CPU step: ${M.UTF8ToString(M._kvq_web_last_error())}`);
      return next;
    };
    let id;
    for (const t of fed) id = Run(t);
    const ids = [id];
    while (ids.length < n) ids.push(id = Run(id));
    return ids;
  } finally {
    M._kvq_web_kv_free(kv);
  }
}

export async function RunGpuHybridLossTests(fixture_url, bundle_url, only = 'qwen35') {
  const t0 = performance.now();
  const failures = [];
  const fail = (m) => failures.push(m);
  if (!navigator.gpu) return {failures: ['navigator.gpu is missing (WebGPU not enabled)'], runs: 0};
  const M = await LoadModule(bundle_url);
  const manifest = await (await fetch(`${fixture_url}/manifest.json`)).json();
  const m = manifest.models.find((x) => x.name === only);
  if (!m) return {failures: [`no model named "${only}" in the manifest`], runs: 0};
  const model = await LoadModel(M, new URL(fixture_url).origin + m.model, '');
  const {program, why_not} = GpuProgramOf(M, model);
  if (!program) return {failures: [`the GPU path refused ${m.name}: ${why_not}`], runs: 0};
  if (!Object.keys(program.states || {}).length) return {failures: [`${m.name} has no recurrent state: not a hybrid`], runs: 0};
  const prompt = m.runs[0].ids.slice(0, m.runs[0].n_prompt);
  let acquired = 0;
  const acquire = async () => {
    ++acquired;
    return RequestGpuDevice(program);
  };
  const reference = await GpuModelRunner.Create(M, await RequestGpuDevice(program), model, program);
  const survivor = await GpuModelRunner.Create(M, await RequestGpuDevice(program), model, program, {acquire});
  let runs = 0, losses = 0, cpu_differs = 0;
  const replays = [];
  const Check = (what, got, want) => {
    ++runs;
    const at = FirstDifference(got.ids, want.ids);
    if (at >= 0) fail(`${what}: id ${at} is ${got.ids[at]}, expected ${want.ids[at]}`);
  };
  // The events since `before` must be one move `to` at `position`, everything before it replayed.
  const CheckEvent = (what, runner, before, to, position) => {
    const e = runner.events.slice(before);
    if (e.length !== 1 || e[0].to !== to || e[0].position !== position || e[0].replayed?.from !== 0 ||
        e[0].replayed?.positions !== position || !(e[0].replayed?.ms >= 0)) {
      fail(`${what}: expected one move to the ${to} at position ${position} replaying positions 0-${position - 1}, ` +
           `got ${JSON.stringify(e)}`);
    }
    if (e[0]?.replayed) replays.push({what, to: e[0].to, ...e[0].replayed});
  };
  const lose = (runner) => (i) => {
    if (i === kLoseAt && runner.device) {
      runner.device.destroy();
      ++losses;
    }
  };
  const lost_at = prompt.length + kLoseAt - 1;  // the position of the step after the loss
  for (const spec of kSpecs) {
    const what = `${m.name} ${spec}`;
    const want = await Generate(reference, spec, prompt, () => {}, true, kPage, kPaths[spec]);
    const want_path = spec === 'int8' ? 'resident' : 'stream';
    if (reference.path !== want_path) fail(`${what}: the ${reference.path} path ran, expected ${want_path} (${reference.path_why})`);
    const want_pages = await MasterPages(M, reference);
    // Lost after kLoseAt ids, a device back.
    let before = survivor.events.length;
    const got = await Generate(survivor, spec, prompt, lose(survivor), true, kPage, kPaths[spec]);
    Check(`${what}, device lost after ${kLoseAt} ids`, got, want);
    CheckEvent(`${what}, device lost after ${kLoseAt} ids`, survivor, before, 'gpu', lost_at);
    const bits = got.logits.findIndex((l, i) => l.some((v, j) => !Object.is(v, want.logits[i][j])));
    if (bits >= 0) fail(`${what}, device lost after ${kLoseAt} ids: the logits before generated id ${bits} differ from the uninterrupted run's`);
    const differ = PagesDiffer(await MasterPages(M, survivor), want_pages);
    if (differ) fail(`${what}, device lost after ${kLoseAt} ids: the master differs from the uninterrupted run's at ${differ}`);
    if (spec === 'int8') {  // lost while a prefill block is in flight
      const block_what = `${what}, lost in a prefill block`;
      const fed = [...prompt, ...want.ids.slice(0, kLoseAt)];
      before = survivor.events.length;
      survivor.NewSequence(spec, spec, 0, kPage);
      await survivor.Prefill(fed.slice(0, 2 * kBlock), {block: kBlock});
      const pending = survivor.Prefill(fed.slice(2 * kBlock), {block: kBlock});
      survivor.device.destroy();
      ++losses;
      let last = await pending;
      const ids = want.ids.slice(0, kLoseAt);
      while (ids.length < kNew) {
        ids.push(last.token);
        if (ids.length < kNew) last = await survivor.Step(last.token);
      }
      Check(block_what, {ids}, want);
      CheckEvent(block_what, survivor, before, 'gpu', 2 * kBlock);
    } else {  // lost in the middle of a step: after the first attention layer's rows reached the master
      const mid_what = `${what}, lost in the middle of a step`;
      let armed = false;
      survivor.after_append = (layer) => {
        if (armed && layer === 0) {
          armed = false;
          survivor.device.destroy();
          ++losses;
        }
      };
      before = survivor.events.length;
      const mid = await Generate(survivor, spec, prompt, (i) => {
        armed = i === kMidStepAt;
      }, false, kPage, kPaths[spec]);
      survivor.after_append = null;
      Check(mid_what, mid, want);
      CheckEvent(mid_what, survivor, before, 'gpu', prompt.length + kMidStepAt - 1);
    }
    // No device comes back: the rest on the CPU, the sequence the CPU's from position 0.
    const stranded = await GpuModelRunner.Create(M, await RequestGpuDevice(program), model, program, {acquire: async () => null});
    const cpu_what = `${what}, device lost after ${kLoseAt} ids and none back (the rest on the CPU)`;
    const cpu = await Generate(stranded, spec, prompt, lose(stranded), false, kPage, kPaths[spec]);
    const cpu_want = {ids: [...want.ids.slice(0, kLoseAt),
                            ...CpuGreedy(M, model, spec, [...prompt, ...want.ids.slice(0, kLoseAt)], kNew - kLoseAt)]};
    Check(cpu_what, cpu, cpu_want);
    CheckEvent(cpu_what, stranded, 0, 'cpu', lost_at);
    if (stranded.cpu_steps !== kNew - kLoseAt) fail(`${cpu_what}: ${stranded.cpu_steps} steps on the CPU, expected ${kNew - kLoseAt}`);
    cpu_differs += cpu_want.ids.filter((id, i) => id !== want.ids[i]).length;
    stranded.Destroy();
  }
  if (acquired !== losses - kSpecs.length) fail(`${losses - kSpecs.length} devices lost with one to come back, ${acquired} asked for`);
  if (survivor.cpu_steps !== 0) fail(`${survivor.cpu_steps} steps ran on the CPU with a device coming back`);
  survivor.Destroy();
  reference.Destroy();
  return {model: m.name, arch: program.config.arch, runs, losses, replays, cpu_differs, failures,
          seconds: (performance.now() - t0) / 1000};
}
