// In the page: the GPU sampler (web/gpu/sample_kernels.js) against kvq's C++ chain in the module.
//   1. conformance: logits vectors (random, with ties, with -inf, with values beyond the ±2048
//      clamp and signed zeros, every one -inf) at vocabularies 32000 and 151936 under settings of
//      {temperature 0.7, 1.0, 1.5} × {top_k 0, 1, 40} × {top_p 1, 0.9, 0.5} × {min_p 0, 0.05}, a
//      seed each: the GPU's id equals kvq_web_sample_with_words' on the same words and logits, and
//      the module's kvq::Sampler::Sample with the same seed (the CPU path's call) — strict
//      equality. The random vector at 32000 takes every 2nd setting, the others every kStride-th
//      (each a different subset); at 151936 the settings with a top_k every kStride-th, those
//      without every kEvery151936-th (SwiftShader sorts 151936 logits in seconds; a top_k's select
//      takes tens of ms). The check can fail: cases with the draw's top bit flipped give another
//      id in many of them (counted and required), so the draw reaches the pick;
//   1b. penalties and logit_bias (AdjustCases): after a history of ids that repeat, every logit the
//      GPU's adjust pass leaves is bit-equal to Sampler::Adjust's, and the pick equals the chain's
//      on those and Sampler::Sample's with the history (greedy too); the adjustments must change
//      picks (counted and required);
//   1c. the select's edges (top_k around the candidates left, cutting a run of ties) and a pick's
//      time at 151936 with top_k 40 and 0 (printed, not asserted; top_k 0 checks a pick there);
//   2. generation on the GPU path (GpuModelRunner, the bundled stories260K, KV int8: resident) at
//      temperature 0.8 with a seed: one readback per token (counted by the step program), the same
//      ids on a rerun with the seed, other ids with another seed, and each id equal to the C++
//      chain's pick from the logits the step read back with that token's words (a ModuleSampler
//      with the same settings replays them); at temperature 0 the ids equal the argmax run's. With
//      penalties and a bias (sampled and greedy): each id the chain's on the read-back logits as
//      Sampler::Adjust leaves them after the prompt and the ids before it, and other ids than
//      without them.
import {GpuModelRunner, GpuProgramOf, RequestGpuDevice} from '/web/gpu/gpu_engine.js';
import {ModuleSampler, SampleExp2Table} from '/web/gpu/module_sampler.js';
import {CompileSampler, GpuSampler} from '/web/gpu/sample_kernels.js';
import {LoadModel, Tokenize} from '/test/gpu_device_loss_page.js';
import {LoadModule, Rng} from '/test/gpu_kv_device_page.js';

const kVocabs = [32000, 151936];
const kTemperatures = [0.7, 1.0, 1.5];
const kTopK = [0, 1, 40];
const kTopP = [1, 0.9, 0.5];
const kMinP = [0, 0.05];
const kNew = 40;  // generated ids per run (part 2)
const kBlock = 512;  // sample_kernels.js's sort block
const kStride = 9;        // settings per case taken at 32000 beyond the random vector's (every 2nd)
const kEvery151936 = 54;  // settings without a top_k per case taken at 151936 (every logit sorted: seconds)

// Logits [n] of one kind, from `rng`.
function Logits(kind, n, rng) {
  const x = new Float32Array(n);
  const normal = () => (rng() + rng() + rng() + rng() - 2) * 1.7;  // roughly N(0, 1)
  for (let i = 0; i < n; ++i) {
    switch (kind) {
      case 'random': x[i] = 3 * normal(); break;
      // 12 levels: long runs of equal logits, the top one shared by many ids.
      case 'ties': x[i] = Math.floor(rng() * 12) * 0.75; break;
      // A third refused; a few narrow gaps at the top.
      case '-inf': x[i] = rng() < 1 / 3 ? -Infinity : 2 * normal(); break;
      // Beyond the clamp (±2048), signed zeros, and tiny values.
      case 'edges': {
        const r = rng();
        x[i] = r < 0.05 ? 3000 * normal() : r < 0.1 ? (rng() < 0.5 ? -0 : 0) : r < 0.15 ? 1e-30 * normal() : 4 * normal();
        break;
      }
      default: throw new Error(kind);
    }
  }
  return x;
}

// Penalty and bias settings (kvq::SamplerOptions' fields) the adjust pass is checked under, each
// with every base below (at 151936 half the pairs, of the bases with a top_k); logit_bias: true stands for a bias over
// the vector's top ids, one id twice (its biases add in turn) and two outside the vocabulary.
const kAdjustments = [
  {repeat_penalty: 1.3},
  {repeat_penalty: 0.77, repeat_last_n: -1},
  {frequency_penalty: 0.5, presence_penalty: 0.9, repeat_last_n: 16},
  {frequency_penalty: -0.7, presence_penalty: -1.1, repeat_penalty: 1.1, repeat_last_n: -1},
  {logit_bias: true},
  {repeat_penalty: 1.5, presence_penalty: 0.5, repeat_last_n: 0, logit_bias: true},
  {repeat_penalty: 1.17, frequency_penalty: 0.3, presence_penalty: 0.4, repeat_last_n: 5000, logit_bias: true},
];
const kAdjustBases = [{temperature: 0.9, top_k: 40, top_p: 0.95, min_p: 0.05}, {temperature: 0, top_k: 0, top_p: 1, min_p: 0},
                      {temperature: 1.2, top_k: 0, top_p: 0.9, min_p: 0}];

// The k ids of the largest logits (ties: the lower id first).
function TopIds(logits, k) {
  const ids = Array.from(logits.keys());
  ids.sort((a, b) => logits[b] - logits[a] || a - b);
  return ids.slice(0, k);
}

// Each adjustment on a vector of each kind after a history of 402 ids (3 in 4 among its 24 top
// logits, so tokens repeat ~10 times and the penalties move the pick; -1 and vocab among them,
// which Adjust skips): the GPU's adjusted logits equal Sampler::Adjust's bit for bit (all of
// them), and its pick SampleWithWords' on those and Sampler::Sample's with the history.
// {cases, differs: picks the adjustment changed, edits: adjusted logits compared}.
async function AdjustCases({M, vocab, rng, kinds, logits_buffer, logits_ptr, words_ptr, GpuPick, CpuPick, SetWords, fail, device}) {
  let cases = 0, differs = 0, edits = 0;
  const adjusted_ptr = M._malloc(vocab * 4);  // [vocab] f32
  const gpu_bits = new Uint32Array(vocab);
  for (const [kind_index, kind] of kinds.entries()) {
    const logits = Logits(kind, vocab, rng);
    device.queue.writeBuffer(logits_buffer, 0, logits);
    M.HEAPU8.set(new Uint8Array(logits.buffer), logits_ptr);
    const top = TopIds(logits, 24);
    const history = [];
    for (let i = 0; i < 400; ++i) history.push(rng() < 0.75 ? top[Math.floor(rng() * top.length)] : Math.floor(rng() * vocab));
    history.splice(390, 0, -1, vocab);
    const bias = [[top[5], 4.5], [top[0], -3.25], [top[7], 0.3], [top[7], 0.7], [Math.floor(rng() * vocab), 2], [vocab + 1, 9], [-2, 1]];
    for (const [a, adjustment] of kAdjustments.entries()) {
      for (const [b, base] of kAdjustBases.entries()) {
        if (vocab === 151936 && (base.top_k === 0 || (a + b + kind_index) % 2 !== 0)) continue;  // every logit sorted: seconds
        const p = {...base, ...adjustment, seed: 7 * a + 3 * b + kind_index, logit_bias: adjustment.logit_bias ? bias : []};
        const what = `vocab ${vocab}, ${kind}, ${JSON.stringify({...p, logit_bias: p.logit_bias.length})} (bias entries)`;
        const ms = new ModuleSampler(M, p);
        const words = ms.Next();
        const adjust = ms.Adjustment(history, vocab);
        ms.Free();
        if (!words || !adjust) {
          fail(`${what}: no words or no edits`);
          continue;
        }
        const gpu_id = await GpuPick(words, adjust, gpu_bits);
        M.HEAPU8.copyWithin(adjusted_ptr, logits_ptr, logits_ptr + vocab * 4);
        const cpu = new ModuleSampler(M, p);  // the same seed: Sample draws what `words` hold
        cpu.AdjustInPlace(adjusted_ptr, vocab, history);
        const cpu_bits = new Uint32Array(M.HEAPU8.buffer, adjusted_ptr, vocab);
        let wrong = 0, first = -1;
        for (let i = 0; i < vocab; ++i) {
          if (cpu_bits[i] !== gpu_bits[i] && !wrong++) first = i;
        }
        if (wrong) {
          fail(`${what}: ${wrong} adjusted logits differ from Sampler::Adjust's; id ${first}: the GPU's bits ` +
               `${gpu_bits[first].toString(16)}, the CPU's ${cpu_bits[first].toString(16)} (logit ${logits[first]})`);
        }
        SetWords(words);
        const cpu_id = M._kvq_web_sample_with_words(words_ptr, adjusted_ptr, vocab);
        const sample_id = cpu.Sample(logits_ptr, vocab, history);
        cpu.Free();
        ++cases;
        edits += adjust.edits.length / 4;
        if (gpu_id !== cpu_id) fail(`${what}: the GPU picked ${gpu_id}, kvq's chain on the adjusted logits ${cpu_id}`);
        if (sample_id !== cpu_id) fail(`${what}: Sampler::Sample picked ${sample_id}, SampleWithWords on Adjust's logits ${cpu_id}`);
        if (CpuPick(words) !== cpu_id) ++differs;
      }
    }
  }
  M._free(adjusted_ptr);
  return {cases, differs, edits};
}

// The select at its edges: a top_k one under, at and over the candidates left (a third refused:
// the select meets empty slots) and vocab - 1; at ties, top_k cutting a run of equal logits (the
// lower ids taken) and one over a sort block (${kBlock}). The number of cases.
async function SelectEdgeCases({M, vocab, rng, logits_buffer, logits_ptr, GpuPick, CpuPick, fail, device}) {
  let cases = 0;
  for (const kind of ['-inf', 'ties']) {
    const logits = Logits(kind, vocab, rng);
    device.queue.writeBuffer(logits_buffer, 0, logits);
    M.HEAPU8.set(new Uint8Array(logits.buffer), logits_ptr);
    const count = logits.filter((x) => x !== -Infinity).length;
    const largest = logits.reduce((m, x) => Math.max(m, x), -Infinity);
    const top = logits.filter((x) => x === largest).length;  // the top run's length (ties)
    const ks = kind === '-inf' ? (vocab === 32000 ? [count - 1, count, count + 1, vocab - 1] : [count + 1]) : [1, 2, top - 1, top + 3, kBlock + 1];
    for (const [i, top_k] of ks.entries()) {
      const p = {temperature: 1.5, top_k, top_p: 1, min_p: 0, seed: 900 + i};
      const ms = new ModuleSampler(M, p);
      const words = ms.Next();
      ms.Free();
      const gpu_id = await GpuPick(words), cpu_id = CpuPick(words);
      ++cases;
      if (gpu_id !== cpu_id) fail(`vocab ${vocab}, ${kind}, top_k ${top_k} (${count} candidates): the GPU picked ${gpu_id}, kvq's chain ${cpu_id}`);
    }
  }
  return cases;
}

// A pick's milliseconds (submit to the id's readback, after one pick to warm: the mean of 3 at
// top_k 40, the select; 1 at top_k 0, a sort of every logit, what every pick cost before the
// select), each pick checked against kvq's chain.
async function PickTimes({M, vocab, rng, logits_buffer, logits_ptr, GpuPick, CpuPick, fail, device}) {
  const logits = Logits('random', vocab, rng);
  device.queue.writeBuffer(logits_buffer, 0, logits);
  M.HEAPU8.set(new Uint8Array(logits.buffer), logits_ptr);
  const ms_of = {};
  for (const [top_k, picks] of [[40, 3], [0, 1]]) {
    const sampler = new ModuleSampler(M, {temperature: 1, top_k, top_p: 0.9, min_p: 0.02, seed: 77});
    let ms = 0;
    for (let i = 0; i <= picks; ++i) {
      const words = sampler.Next();
      const t = performance.now();
      const gpu_id = await GpuPick(words);
      if (i) ms += (performance.now() - t) / picks;
      if (gpu_id !== CpuPick(words)) fail(`vocab ${vocab}, top_k ${top_k}, pick ${i}: the GPU picked ${gpu_id}, kvq's chain ${CpuPick(words)}`);
    }
    sampler.Free();
    ms_of[`top_k_${top_k}`] = Math.round(ms);
  }
  return ms_of;
}

export async function RunGpuSamplerTests(bundle_url) {
  const t0 = performance.now();
  const failures = [];
  const fail = (m) => failures.push(m);
  if (!navigator.gpu) return {failures: ['navigator.gpu is missing (WebGPU not enabled)'], cases: 0};
  const M = await LoadModule(bundle_url);
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) return {failures: ['no WebGPU adapter'], cases: 0};
  const device = await adapter.requestDevice();
  device.addEventListener('uncapturederror', (e) => fail(`WebGPU error: ${e.error.message}`));
  const pipelines = await CompileSampler(device);
  const table = SampleExp2Table(M);
  const out = device.createBuffer({size: 16, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC});
  const staging = device.createBuffer({size: 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
  const words_ptr = M._malloc(6 * 4);
  const SetWords = (words) => M.HEAPU8.set(new Uint8Array(words.buffer, words.byteOffset, 6 * 4), words_ptr);

  // 1. Conformance.
  let cases = 0, flipped_differs = 0, greedy_differs = 0;
  let adjust_cases = 0, adjust_differs = 0, edits_checked = 0, pick_ms = null;
  const ids_seen = new Set();
  const kinds = ['random', 'ties', '-inf', 'edges'];
  const rng = Rng(31);
  for (const vocab of kVocabs) {
    const sampler = new GpuSampler(device, pipelines, vocab, table, out);
    const logits_buffer = device.createBuffer({size: vocab * 4, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC});
    const logits_ptr = M._malloc(vocab * 4);
    // The GPU's pick under words (and adjust: ModuleSampler's Adjustment); with `adjusted`, the
    // logits after the adjust pass too (Uint32Array [vocab], their bits).
    const adjusted_staging = device.createBuffer({size: vocab * 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
    const GpuPick = async (words, adjust = null, adjusted = null) => {
      const encoder = device.createCommandEncoder();
      sampler.Record(encoder, logits_buffer, 0, words, adjust);
      encoder.copyBufferToBuffer(out, 0, staging, 0, 4);
      if (adjusted) encoder.copyBufferToBuffer(sampler.logits, 0, adjusted_staging, 0, vocab * 4);
      device.queue.submit([encoder.finish()]);
      await staging.mapAsync(GPUMapMode.READ);
      const id = new Uint32Array(staging.getMappedRange().slice(0))[0];
      staging.unmap();
      if (adjusted) {
        await adjusted_staging.mapAsync(GPUMapMode.READ);
        adjusted.set(new Uint32Array(adjusted_staging.getMappedRange()));
        adjusted_staging.unmap();
      }
      return id;
    };
    const CpuPick = (words) => {
      SetWords(words);
      return M._kvq_web_sample_with_words(words_ptr, logits_ptr, vocab);
    };
    for (const kind of [...kinds, 'all -inf']) {
      const logits = kind === 'all -inf' ? new Float32Array(vocab).fill(-Infinity) : Logits(kind, vocab, rng);
      device.queue.writeBuffer(logits_buffer, 0, logits);
      M.HEAPU8.set(new Uint8Array(logits.buffer), logits_ptr);
      let argmax = 0;
      for (let i = 1; i < vocab; ++i) if (logits[i] > logits[argmax]) argmax = i;
      let setting = 0;
      for (const temperature of kTemperatures) {
        for (const top_k of kTopK) {
          for (const top_p of kTopP) {
            for (const min_p of kMinP) {
              const stride = vocab === 32000 ? (kind === 'random' ? 2 : kStride) : top_k ? kStride : kEvery151936;
              const taken = (setting + kinds.indexOf(kind) + 1) % stride === 0;
              for (let s = 0; s < (taken ? 1 : 0); ++s) {
                const seed = 1000 * setting + 17 * kinds.indexOf(kind) + vocab % 97;
                const p = {temperature, top_k, top_p, min_p, seed};
                const what = `vocab ${vocab}, ${kind}, ${JSON.stringify(p)}`;
                const ms = new ModuleSampler(M, p);
                const words = ms.Next();
                ms.Free();
                const gpu_id = await GpuPick(words);
                const cpu_id = CpuPick(words);
                const cpu_sampler = new ModuleSampler(M, p);
                const sample_id = cpu_sampler.Sample(logits_ptr, vocab);
                cpu_sampler.Free();
                ++cases;
                ids_seen.add(cpu_id);
                if (gpu_id !== cpu_id) fail(`${what}: the GPU picked ${gpu_id}, kvq's chain ${cpu_id}`);
                if (sample_id !== cpu_id) fail(`${what}: Sampler::Sample picked ${sample_id}, SampleWithWords ${cpu_id}`);
                if (kind !== 'all -inf' && cpu_id !== argmax) ++greedy_differs;
                if (kind === 'all -inf' && gpu_id !== 0) fail(`${what}: every logit refused, the GPU picked ${gpu_id}, not 0`);
                if (top_k === 0 && kind === 'random') {  // the draw's top bit flipped
                  const other = Uint32Array.from(words);
                  other[5] ^= 0x80000000;
                  const gpu_other = await GpuPick(other);
                  if (gpu_other !== CpuPick(other)) fail(`${what}, draw flipped: the GPU picked ${gpu_other}, kvq's chain ${CpuPick(other)}`);
                  if (gpu_other !== gpu_id) ++flipped_differs;
                }
              }
              ++setting;
            }
          }
        }
      }
    }
    // Penalties and logit_bias (the adjust pass), then the select's edges and a pick's time.
    const env = {M, vocab, rng, kinds, logits_buffer, logits_ptr, words_ptr, GpuPick, CpuPick, SetWords, fail, device};
    const adjusted = await AdjustCases(env);
    adjust_cases += adjusted.cases;
    adjust_differs += adjusted.differs;
    edits_checked += adjusted.edits;
    cases += await SelectEdgeCases(env);
    if (vocab === 151936) pick_ms = await PickTimes(env);
    sampler.Destroy();
    logits_buffer.destroy();
    adjusted_staging.destroy();
    M._free(logits_ptr);
  }
  if (adjust_differs < 10) fail(`only ${adjust_differs} of ${adjust_cases} adjusted picks differ from the unadjusted ones`);
  // The checks can fail: a pick that ignored the draw, or the chain, would show here.
  if (flipped_differs < 5) fail(`only ${flipped_differs} cases changed id with the draw's top bit flipped`);
  if (greedy_differs < 10) fail(`only ${greedy_differs} of ${cases} picks differ from the argmax`);

  // 2. Generation on the GPU path.
  const model = await LoadModel(M, '/models/stories260K.bin', '/models/tok512.bin');
  const {program, why_not} = GpuProgramOf(M, model);
  if (!program) return {failures: [...failures, `the GPU path refused stories260K: ${why_not}`], cases};
  const runner = await GpuModelRunner.Create(M, await RequestGpuDevice(program), model, program);
  const prompt = Tokenize(M, model, 'Once upon a time');
  const Run = async (p, options = {}) => {  // {ids, logits, readbacks per generated token}
    runner.NewSequence('int8', 'int8');
    if (p) runner.SetSampler(p);
    const sample = p !== null;
    let last = await runner.Prefill(prompt, {sample, logits: options.logits});
    const ids = [], logits = [];
    const readbacks0 = runner.counts.readbacks;
    for (let i = 0; i < kNew; ++i) {
      ids.push(last.token);
      if (options.logits) logits.push(last.logits);
      if (i + 1 < kNew) last = await runner.Step(last.token, {sample, logits: options.logits});
    }
    return {ids, logits, readbacks_per_token: (runner.counts.readbacks - readbacks0) / (kNew - 1), path: runner.path};
  };
  const hot = {temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05, seed: 4242};
  const first = await Run(hot, {logits: true});
  const again = await Run(hot);
  const other = await Run({...hot, seed: 4243});
  const greedy = await Run({...hot, temperature: 0});
  const argmax = await Run(null);
  if (first.path !== 'resident') fail(`the int8 run took the ${first.path} path, not resident`);
  for (const r of [first, again, greedy]) {
    if (r.readbacks_per_token !== 1) fail(`${r.readbacks_per_token} readbacks per generated token, not 1`);
  }
  const Same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
  if (!Same(first.ids, again.ids)) fail(`the rerun with seed ${hot.seed} gave other ids: ${first.ids} vs ${again.ids}`);
  if (Same(first.ids, other.ids)) fail(`seed ${hot.seed + 1} gave the same ${kNew} ids as seed ${hot.seed}`);
  if (!Same(greedy.ids, argmax.ids)) fail(`temperature 0 through the sampler: ${greedy.ids}, the argmax run: ${argmax.ids}`);
  if (Same(first.ids, argmax.ids)) fail(`temperature 0.8 gave the greedy ids`);
  // Each sampled id from the logits the step read back and that step's words (replayed).
  const replay = new ModuleSampler(M, hot);
  const logits_ptr = M._malloc(program.config.vocab_size * 4);
  let replayed = 0;
  for (let i = 0; i < kNew; ++i) {
    M.HEAPU8.set(new Uint8Array(first.logits[i].buffer, first.logits[i].byteOffset, first.logits[i].byteLength), logits_ptr);
    const words = replay.Next();
    SetWords(words);
    const want = M._kvq_web_sample_with_words(words_ptr, logits_ptr, program.config.vocab_size);
    if (want !== first.ids[i]) fail(`generated id ${i}: the GPU sampled ${first.ids[i]}, kvq's chain on its logits ${want}`);
    ++replayed;
  }
  replay.Free();
  // With penalties and a bias, sampled and greedy: each id the C++ chain's on the logits read back,
  // adjusted by Sampler::Adjust after the prompt and the ids before it (the window the GPU got).
  const penalised = {...hot, repeat_penalty: 1.3, frequency_penalty: 0.4, presence_penalty: 0.6, repeat_last_n: 32,
                     logit_bias: [[first.ids[3], -2.5], [first.ids[9], 1.5], [first.ids[9], 0.25]]};
  const penalised_runs = [];
  for (const q of [penalised, {...penalised, temperature: 0}]) {
    const run = await Run(q, {logits: true});
    penalised_runs.push(run);
    if (run.readbacks_per_token !== 1) fail(`penalised (temperature ${q.temperature}): ${run.readbacks_per_token} readbacks per generated token, not 1`);
    const sampler = new ModuleSampler(M, q);
    for (let i = 0; i < kNew; ++i) {
      M.HEAPU8.set(new Uint8Array(run.logits[i].buffer, run.logits[i].byteOffset, run.logits[i].byteLength), logits_ptr);
      const words = sampler.Next();
      sampler.AdjustInPlace(logits_ptr, program.config.vocab_size, [...prompt, ...run.ids.slice(0, i)]);
      SetWords(words);
      const want = M._kvq_web_sample_with_words(words_ptr, logits_ptr, program.config.vocab_size);
      if (want !== run.ids[i]) fail(`penalised (temperature ${q.temperature}), id ${i}: the GPU sampled ${run.ids[i]}, kvq's chain on its adjusted logits ${want}`);
      ++replayed;
    }
    sampler.Free();
  }
  if (Same(penalised_runs[0].ids, first.ids)) fail(`the penalties and bias left seed ${hot.seed}'s ${kNew} ids as they were`);
  if (Same(penalised_runs[1].ids, argmax.ids)) fail(`the penalties and bias left the greedy ids as they were`);
  M._free(logits_ptr);
  M._free(words_ptr);
  runner.Destroy();
  return {cases, flipped_differs, greedy_differs, distinct_ids: ids_seen.size, replayed, adjust_cases, adjust_differs,
          edits_checked, pick_ms,
          generation: {ids: first.ids.slice(0, 12), penalised_ids: penalised_runs[0].ids.slice(0, 12),
                       readbacks_per_token: first.readbacks_per_token},
          failures, seconds: (performance.now() - t0) / 1000};
}
