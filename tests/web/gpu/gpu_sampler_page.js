// In the page: the GPU sampler (web/gpu/sample_kernels.js) against kvq's C++ chain in the module.
//   1. conformance: logits vectors (random, with ties, with -inf, with values beyond the ±2048
//      clamp and signed zeros, every one -inf) at vocabularies 32000 and 151936 under settings of
//      {temperature 0.7, 1.0, 1.5} × {top_k 0, 1, 40} × {top_p 1, 0.9, 0.5} × {min_p 0, 0.05}, a
//      seed each: the GPU's id equals kvq_web_sample_with_words' on the same words and logits, and
//      the module's kvq::Sampler::Sample with the same seed (the CPU path's call) — strict
//      equality. The random vector at 32000 takes every 2nd setting, the others every kStride-th
//      (each a different subset); at 151936 every kEvery151936-th: SwiftShader sorts 151936
//      logits in seconds (sample_kernels.js sorts the whole vocabulary). The check
//      can fail: cases with the draw's top bit flipped give another id in many of them (counted
//      and required), so the draw reaches the pick;
//   2. generation on the GPU path (GpuModelRunner, the bundled stories260K, KV int8: resident) at
//      temperature 0.8 with a seed: one readback per token (counted by the step program), the same
//      ids on a rerun with the seed, other ids with another seed, and each id equal to the C++
//      chain's pick from the logits the step read back with that token's words (a ModuleSampler
//      with the same settings replays them); at temperature 0 the ids equal the argmax run's.
import {GpuModelRunner, GpuProgramOf, RequestGpuDevice} from '/web/gpu/gpu_engine.js';
import {CompileSampler, GpuSampler, ModuleSampler, SampleExp2Table} from '/web/gpu/sample_kernels.js';
import {LoadModel, Tokenize} from '/test/gpu_device_loss_page.js';
import {LoadModule, Rng} from '/test/gpu_kv_device_page.js';

const kVocabs = [32000, 151936];
const kTemperatures = [0.7, 1.0, 1.5];
const kTopK = [0, 1, 40];
const kTopP = [1, 0.9, 0.5];
const kMinP = [0, 0.05];
const kNew = 40;  // generated ids per run (part 2)
const kStride = 9;        // settings per case taken at 32000 beyond the random vector's (every 2nd)
const kEvery151936 = 54;  // settings per case taken at 151936 (one: a different one per case)

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
  const ids_seen = new Set();
  const kinds = ['random', 'ties', '-inf', 'edges'];
  const rng = Rng(31);
  for (const vocab of kVocabs) {
    const sampler = new GpuSampler(device, pipelines, vocab, table, out);
    const logits_buffer = device.createBuffer({size: vocab * 4, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC});
    const logits_ptr = M._malloc(vocab * 4);
    const GpuPick = async (words) => {
      const encoder = device.createCommandEncoder();
      sampler.Record(encoder, logits_buffer, 0, words);
      encoder.copyBufferToBuffer(out, 0, staging, 0, 4);
      device.queue.submit([encoder.finish()]);
      await staging.mapAsync(GPUMapMode.READ);
      const id = new Uint32Array(staging.getMappedRange().slice(0))[0];
      staging.unmap();
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
              const stride = vocab === 32000 ? (kind === 'random' ? 2 : kStride) : kEvery151936;
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
                const handle = M._kvq_web_sampler_new(temperature, top_k, top_p, min_p, seed);
                const sample_id = M._kvq_web_sampler_sample(handle, logits_ptr, vocab);
                M._kvq_web_sampler_free(handle);
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
    sampler.Destroy();
    logits_buffer.destroy();
    M._free(logits_ptr);
  }
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
  M._free(logits_ptr);
  M._free(words_ptr);
  runner.Destroy();
  return {cases, flipped_differs, greedy_differs, distinct_ids: ids_seen.size, replayed,
          generation: {ids: first.ids.slice(0, 12), readbacks_per_token: first.readbacks_per_token},
          failures, seconds: (performance.now() - t0) / 1000};
}
