// In the page: the WebGPU path as the page runs it (web/gpu/gpu_engine.js: the WebAssembly module's
// step program of the loaded model on step_program.js's kernels, the KV master in the module's
// KvCache, attention streamed through kv_device.js) against native kvq (gpu_forward_fixture: the
// public API, greedy), for stories260K (llama2.c, F32), a tiny qwen3 with Q1_0 matrices (Bonsai's
// architecture), one with Q4_0 (repacked: the interleaved layout) and a Q4_K_M mix (Q4_K and Q6_K,
// repacked into the K-quant groups; the GPU runs kvq's scalar K-quant kernel's arithmetic) and the
// tiny hybrids qwen35 (Gated DeltaNet layers, their state on the GPU, and gated attention), qwen35moe
// and qwen3next (the same with mixture-of-experts feed-forward layers, routed on the GPU), 3 prompts × KV specs
// {f32, int8, int4, int4-kivi, int4+rot}; and tiny qwen3s of the other weight types (Q2_K, Q3_K_M
// and Q5_K_M mixes, Q4_1, Q2_0: every type in kvq's registry between them; gpu_forward_fixture
// lists which matrix gets which), 3 prompts × {f32, int8}. Teacher-forced along native's ids, at every position:
//   - the logits agree with native's within the model's bound (kBound or kBound + 2·S, below);
//   - from the last prompt position on, the id the GPU returns (its argmax, the only number a step
//     reads back besides K and V) is native's next greedy id — so a greedy run on the GPU gives
//     native's ids — except where native's two best logits are within twice the bound of each
//     other (a near-tie the bound cannot order: counted and reported);
//   - stories260K with f32 KV: those ids are run.c's golden ids (golden-runc-ids.txt);
//   - structure: a spec whose formats have a WGSL encoder (kv_formats.js's registry), with no
//     transform but rot (int4+rot must: issue 31), runs on the resident path: each step is 1
//     submit and 1 readback; any other runs streamed: each step reads back exactly n_cache_layers + 1 times (each attention layer's K and V rows for the
//     module's cache, then the id) and submits as many command buffers, attention's included. Either way the
//     KV device submits none of its own (these contexts fit its slots, so its commands ride in
//     the step program's encoders);
//   - every encoder format, resident against streamed: the same logits bit for bit and the same
//     master pages byte for byte (gpu_resident_check.js), with each path's step time printed:
//     on stories260K every format, the grouped keys (int4-kivi, int2-kivi, fp8-e4m3) included; the three
//     qwen3 synths share one KV shape (kSharedKvShape), so they split the one-row formats between
//     them (kResidentFormats: each once on that shape; their int4-kivi runs above are resident).
//     The two paths run the same weights and differ only in where K and V live, so what the check
//     exercises is the KV shape and format (and each model's weights through both paths and its
//     prefill blocks, which every model still runs).
// The hybrid's recurrent state is checked by the same comparisons: its runs start from a zeroed
// state (NewSequence), and a state carried wrongly from token to token, or from one run into the
// next, moves the later logits. The resident check runs it with kHybridResidentFormats.
// Nothing is refused: a model in the manifest the GPU path gives no program for fails the test.
//
// kBound, the largest |GPU − native| logit allowed for F32 weights: both sides compute in f32 and
// differ only in rounding — summation order (the GPU's workgroup trees vs kvq's SIMD lanes in
// matvecs, norms and attention's online softmax) and exp (WGSL's vs Highway's, a few ulp): ~1e-6
// relative per op, accumulated over 5 layers of sums of 8–172 terms, ~1e-5 relative on logits of
// magnitude up to ~15; kBound = 2e-3 holds that with margin (measured: ~1e-5), while a real bug
// (a RoPE pairing, a head mapping, a dropped position, a wrong weight block) moves logits by
// O(0.1–1) (tests/model's reference-forward tests reason the same way).
// Block-quantised weights (every type whose WeightBlock says quantized_activation: all but F32,
// F16 and BF16): the matvec quantises its activation to int8 per 32 exactly as kvq's CPU
// does (weights/matvec.h; the GPU's quotients are correctly rounded as the CPU's IEEE divisions),
// so equal activations give equal codes. But the activations themselves differ in their last bits
// (the orders above), and a value whose x/d lies at a rounding boundary then gets a code one
// apart — and likewise a K or V element at an int8/int4 KV code boundary. Each such flip moves the
// logits by far more than rounding; kvq's own SIMD targets show it too: the fixture reruns every
// case on kvq's lowest target (SCALAR) against its best (AVX3 here), and their logits differ by up
// to S (target_spread). The bound for these models is kBound + 2·S: the GPU is a third arithmetic
// order, allowed twice the disagreement kvq's own two show. (An empirical anchor, not a
// derivation: the flips' effect on logits is not bounded analytically here.) Since kvq's targets
// share one exp and one value-accumulation order (src/simd/portable_exp-inl.h), SCALAR differs
// from AVX3 in fewer ops, so S fell from 0.08 to 0.04 on these models while the GPU, which keeps
// its own exp and sums, still differs by up to 0.13 (Q4_0 weights, any KV spec): S is taken as at
// least kTargetSpreadFloor, the spread these fixtures showed while SCALAR had its own exp and
// fused no multiply-add (a different order in the same ops the GPU differs in).
// The MoE hybrids (Q8_0) take that bound too. Their feed-forward is the dense one's ops in a
// different arrangement: the experts' matvecs are the dense matvec's row function (matvec_row,
// the activation quantised as the CPU does), SwiGLU uses WGSL's exp as the dense FFN does (not bit
// exact: the rounding argument above), and the routing (moe_route) is kvq's RouteRow bit for bit
// on equal router logits (web.gpu_moe). What differs is only the router logits' last bits, as any
// matvec output's. Those move the chosen experts' weights by rounding, inside the bound; they can
// change which experts are chosen only where two experts' probabilities tie within that rounding.
// Such a routing near-tie has no exemption here: another expert's SwiGLU moves the logits by far
// more than rounding does, and the position fails where that passes the bound. kvq's own two
// targets route from differently rounded logits too: a flip between them would show as a
// target_spread past kTargetSpreadFloor, widening every model's bound, so a MoE model's spread
// past it fails. None occurs in these fixtures: worst differences per KV spec printed.
const kTargetSpreadFloor = 0.08;
import {GpuModelRunner, GpuProgramOf} from '/web/gpu/gpu_engine.js';
import {WeightBlock} from '/web/gpu/weight_types.js';
import {LoadModule} from '/test/gpu_kv_device_page.js';
import {CheckResidentPath} from '/test/gpu_resident_check.js';
import {ResidentWhyNot} from '/web/gpu/kv_resident.js';
import {kEncoderFormats, kGroupKeyEncoderFormats} from '/web/gpu/kv_formats.js';

const kBound = 2e-3;
// The matvec kernels (step_kernels.js: 'rows', a row per invocation, and 'lanes', a block type's
// rows shared by a workgroup's lanes) add the same terms in the same order, so a model's logits
// are the same bits under either: each model's first run, its steps up to kKernelPositions, runs
// again under the kernel the page did not pick (MatvecKernelFor: 'rows' on SwiftShader, where
// 'lanes' is the slower) and must give the same logits bit for bit; then the same ids as one
// prefill block (the kernel's matmul) must give the last step's logits bit for bit.
const kKernelPositions = 12;

// The check above: returns the positions compared.
async function CheckOtherMatvecKernel(M, device, model, program, run, kernel, want, what, fail) {
  const other = kernel === 'rows' ? 'lanes' : 'rows';
  const runner = await GpuModelRunner.Create(M, device, model, program, {step: {matvec: other}});
  let checks = 0;
  try {
    if (runner.step.matvec_kernel !== other) fail(`${what}: asked for the ${other} matvec kernel, the step runs ${runner.step.matvec_kernel}`);
    runner.NewSequence(run.spec, run.spec);
    for (let p = 0; p < want.length; ++p) {
      const {logits} = await runner.Step(run.ids[p], {logits: true});
      const a = new Uint32Array(want[p].buffer), b = new Uint32Array(Float32Array.from(logits).buffer);
      const i = a.length !== b.length ? 0 : a.findIndex((x, j) => x !== b[j]);
      if (i >= 0) {
        fail(`${what} position ${p}: the ${other} matvec kernel's logit ${i} is ${logits[i]}, the ${kernel} kernel's ${want[p][i]}`);
        break;
      }
      ++checks;
    }
    if (want.length > 1) {  // the same ids as one prefill block (the kernel's matmul): the last step's logits
      runner.NewSequence(run.spec, run.spec);
      const {logits} = await runner.Prefill(run.ids.slice(0, want.length), {logits: true});
      const a = new Uint32Array(want[want.length - 1].buffer), b = new Uint32Array(Float32Array.from(logits).buffer);
      const i = a.length !== b.length ? 0 : a.findIndex((x, j) => x !== b[j]);
      if (i >= 0) {
        fail(`${what}: ${want.length} ids prefilled as a block under the ${other} matvec kernel give logit ${i} = ` +
             `${b[i]}, the token-by-token ${kernel} steps ${a[i]}`);
      }
      ++checks;
    }
  } finally {
    runner.Destroy();
  }
  return checks;
}
// The qwen3 synths' KV: gpu_forward_fixture writes all three with 2 layers of 2 KV heads × 64.
const kSharedKvShape = {n_layers: 2, n_kv_heads: 2, head_dim: 64};
// The encoder formats each qwen3 synth runs resident against streamed: together, the registry.
const kResidentFormats = {'qwen3-q1_0': ['f32', 'int4'], 'qwen3-q4_0': ['f16', 'int2', 'fp4-e2m1'], 'qwen3-q4_k_m': ['bf16', 'int8']};
// The models after those (each a weight type or mix; gpu_forward_fixture) run it in f32 KV only:
// what they add is their weights through both paths and the prefill blocks' matmuls, not a format.
const kWeightModelResidentFormats = ['f32'];
// The hybrid's resident-vs-streamed formats: its KV layers are the qwen3 synths' kind; what it
// adds is a state the block and token-by-token runs must carry alike, which any one format shows.
const kHybridResidentFormats = ['int8'];
// Rot specs run resident against streamed too (kv_resident.js rotates the rows it encodes, the
// queries and the output on the GPU; gpu_resident_check.js's KEY/VALUE pairs): both tensors, keys
// alone, values alone, at head_dim 8 (stories260K) and 64 (the qwen3 synths' shared shape).
// stories260K's int4+rot: its layer 1 K row at position 24 has, rotated, a head whose max|x| is
// 9.47802734375, so max|x| / 7 is exactly 1.35400390625, an f16 rounding tie: kvq rounds it to even
// (0x3d6a); with WGSL's '/' SwiftShader once came out above it (0x3d6b: '/' is accurate to 2.5 ulp,
// and how it rounds depends on how the shader compiles — the same '/' in another build of the
// module rounded it right), so the encoders divide with div_rn (div_rn.js, correctly rounded).
// fp4-e2m1+rot: the float encoders (fp_encoders.js) read the rotated rows as the int ones do.
const kRotResidentSpecs = {'stories260K': ['int8+rot/int4', 'int2/f16+rot', 'int4+rot', 'fp4-e2m1+rot'],
                           'qwen3-q1_0': ['int4+rot']};
// sinkN / resN specs (kv_resident_rows.js: f32 rows on the GPU, pages written behind as rows):
// sinks alone and a residual alone on a one-row format, grouped keys with a residual (KIVI's and
// fp8-e4m3's), and issue 31's.
const kRowsResidentSpecs = {'stories260K': ['int4+sink4', 'int8+res16', 'int4-kivi+res16', 'int2-kivi+sink4+res64',
                                           'int2+sink40+res8', 'fp8-e4m3+res16']};
// prerope key specs (kv_resident_rope.js: keys encoded before RoPE, roped at read by the module's
// cos/sin of each row's position): a one-row format, KIVI's grouped keys, and with sinks and
// residual rows (windows that start anywhere in a page). kvq takes prerope with no rot.
const kPreropeResidentSpecs = {'stories260K': ['int8+prerope', 'int4-kivi+prerope', 'int4-kivi+prerope+sink4+res16']};

async function Bytes(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`fetching ${url}: HTTP ${r.status}`);
  return new Uint8Array(await r.arrayBuffer());
}

// Loads the file at `url` (and a llama2.c tokenizer) into the module; returns the model handle.
async function LoadModel(M, url, tokenizer_url) {
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

// The manifest's models `only` picks: '' all of them; "K/N" (shard K of N) those at manifest index i
// with i % N === K, so the N shards run every model once, a model added to the fixture included,
// in N pages that share one Chromium, module and device set-up each (the set-up is the cost a test
// per model paid again for each); any other text, the model of that name.
function ModelsOf(manifest, only) {
  const shard = /^(\d+)\/(\d+)$/.exec(only);
  if (!shard) return manifest.models.filter((m) => !only || m.name === only);
  const [k, n] = [Number(shard[1]), Number(shard[2])];
  if (!(n > 0 && k < n)) throw new Error(`shard "${only}": K/N needs 0 <= K < N`);
  return manifest.models.filter((m, i) => i % n === k);
}

// Returns {models, names, runs, positions, positions_by_model, near_ties, failures,
// worst_logit_difference, per_step, seconds}; each failure names its model. only: ModelsOf's.
export async function RunGpuForwardTests(fixture_url, bundle_url, only = '') {
  const t0 = performance.now();
  const failures = [];
  const fail = (what) => failures.push(what);
  if (!navigator.gpu) return {failures: ['navigator.gpu is missing (WebGPU not enabled)'], positions: 0};
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) return {failures: ['no WebGPU adapter'], positions: 0};
  const device = await adapter.requestDevice({requiredLimits: {
    maxStorageBufferBindingSize: adapter.limits.maxStorageBufferBindingSize, maxBufferSize: adapter.limits.maxBufferSize}});
  device.addEventListener('uncapturederror', (e) => fail(`WebGPU error: ${e.error.message}`));
  const M = await LoadModule(bundle_url);
  const manifest = await (await fetch(`${fixture_url}/manifest.json`)).json();
  const origin = new URL(fixture_url).origin;
  let positions = 0, worst = 0, runs = 0, near_ties = 0;
  const per_step = {}, architectures = {}, tensor_types = {}, bounds = {}, worst_by_spec = {}, step_ms = {}, prefill_dispatches = {};
  let resident_checks = 0;
  const matvec_kernel_checks = {};  // by model: positions compared under the other matvec kernel
  const models = ModelsOf(manifest, only);
  if (!models.length) fail(`no model named "${only}" in the manifest (or an empty shard)`);
  const positions_by_model = {};
  for (const m of models) {
    // A model's exception fails that model, named, and the shard goes on to the next.
    try {
      const positions_before = positions;
      const model = await LoadModel(M, origin + m.model, m.tokenizer ? origin + m.tokenizer : '');
      const {program, why_not} = GpuProgramOf(M, model);
      if (!program) {
        fail(`${m.name}: the GPU path refused it: ${why_not}`);
        continue;
      }
      const runner = await GpuModelRunner.Create(M, device, model, program);
      architectures[m.name] = program.config.arch;
      tensor_types[m.name] = [...new Set(program.tensors.map((t) => `${t.type}/${t.layout}`))].join(' ');
      const n_cache_layers = program.config.n_cache_layers;
      const quantized = program.tensors.some((t) => WeightBlock(t.type).quantized_activation);
      const own_spread = Math.max(...m.runs.map((r) => r.target_spread));
      if (program.config.moe?.n_experts > 0 && !(own_spread <= kTargetSpreadFloor)) {
        fail(`${m.name}: kvq's two targets differ by ${own_spread} (> ${kTargetSpreadFloor}): a routing flip between them?`);
      }
      const spread = Math.max(...manifest.models.filter((o) => o.name !== 'stories260K')
                                   .flatMap((o) => o.runs.map((r) => r.target_spread)));
      const bound = quantized ? kBound + 2 * Math.max(spread, kTargetSpreadFloor) : kBound;
      bounds[m.name] = bound;
      const first_logits = [];  // runs[0]'s first kKernelPositions logits, for the other matvec kernel
      for (const run of m.runs) {
        ++runs;
        const native = new Float32Array((await Bytes(`${fixture_url}/${run.file}`)).buffer);
        const what = `${m.name} "${run.prompt}" ${run.spec}`;
        runner.NewSequence(run.spec, run.spec);
        const want_path = ResidentWhyNot(run.spec, run.spec) ? 'stream' : 'resident';
        // Issue 31: rot, sinkN and resN (int2-kivi+sink4+res64 among the runs) run on the GPU's encoders.
        if (/\+(rot|sink\d+|res\d+|prerope)$/.test(run.spec) && want_path !== 'resident') {
          fail(`${what}: a rot, sinkN, resN or prerope spec of an encoder format must run resident; ResidentWhyNot says ` +
               `"${ResidentWhyNot(run.spec, run.spec)}"`);
        }
        if (runner.path !== want_path) fail(`${what}: the ${runner.path} path ran, expected ${want_path} (${runner.path_why})`);
        const per_token = want_path === 'resident' ? 1 : n_cache_layers + 1;
        const golden = run.spec === 'f32' ? m.golden?.find((g) => g.prompt === run.prompt)?.ids : undefined;
        if (m.golden && run.spec === 'f32' && !golden) fail(`${what}: no golden run for this prompt`);
        for (let p = 0; p + 1 < run.ids.length; ++p) {
          const before = {...runner.counts};
          const {token, logits} = await runner.Step(run.ids[p], {logits: true});
          ++positions;
          const readbacks = runner.counts.readbacks - before.readbacks, submits = runner.counts.submits - before.submits;
          const kv_device_submits = runner.counts.device_submits - before.device_submits;
          if (readbacks !== per_token || submits !== per_token || kv_device_submits !== 0) {
            fail(`${what} position ${p}: ${readbacks} readbacks, ${submits} submits and ${kv_device_submits} KV device ` +
                 `submits (expected ${per_token}, ${per_token} and 0: the ${runner.path} path)`);
          }
          per_step[`${m.name} ${runner.path}`] = {readbacks, submits, kv_device_submits};
          if (run === m.runs[0] && p < kKernelPositions) first_logits.push(Float32Array.from(logits));
          const want = native.subarray(p * m.vocab, (p + 1) * m.vocab);
          let diff = 0, best = 0, second = -Infinity;
          for (let i = 0; i < m.vocab; ++i) {
            diff = Math.max(diff, Math.abs(logits[i] - want[i]));
            if (want[i] > want[best]) best = i;
          }
          for (let i = 0; i < m.vocab; ++i) if (i !== best) second = Math.max(second, want[i]);
          worst = Math.max(worst, diff);
          worst_by_spec[`${m.name} ${run.spec}`] = Math.max(worst_by_spec[`${m.name} ${run.spec}`] || 0, diff);
          if (!(diff <= bound)) {
            fail(`${what} position ${p}: logits differ from native kvq's by ${diff} (> ${bound})`);
            break;
          }
          if (p < run.n_prompt - 1) continue;
          if (token !== run.ids[p + 1]) {
            if (want[best] - second <= 2 * bound) {
              ++near_ties;
            } else {
              fail(`${what} position ${p}: the GPU's greedy id ${token}, native kvq's ${run.ids[p + 1]}`);
              break;
            }
          }
          if (golden && p + 1 < golden.length && token !== golden[p + 1]) {
            fail(`${what} position ${p}: the GPU's greedy id ${token}, run.c's ${golden[p + 1]}`);
            break;
          }
        }
      }
      const kernel = runner.step.matvec_kernel;
      runner.Destroy();
      matvec_kernel_checks[m.name] = await CheckOtherMatvecKernel(M, device, model, program, m.runs[0], kernel, first_logits,
                                                           `${m.name} "${m.runs[0].prompt}" ${m.runs[0].spec}`, fail);
      let resident_formats = m.name === 'stories260K' ? [...kEncoderFormats, ...kGroupKeyEncoderFormats]
          : program.states && Object.keys(program.states).length ? kHybridResidentFormats : kWeightModelResidentFormats;
      if (kResidentFormats[m.name]) {
        resident_formats = kResidentFormats[m.name];
        const split = Object.values(kResidentFormats).flat().sort().join(','), registry = [...kEncoderFormats].sort().join(',');
        if (split !== registry) fail(`the qwen3 synths split the formats ${split} between them; the registry has ${registry}`);
        const c = program.config;
        if (Object.entries(kSharedKvShape).some(([k, v]) => c[k] !== v)) {
          fail(`${m.name}: KV shape ${c.n_layers} layers × ${c.n_kv_heads} heads × ${c.head_dim}, not the shared ` +
               `${JSON.stringify(kSharedKvShape)} its share of the resident-vs-streamed formats assumes`);
        }
      }
      resident_formats = [...resident_formats, ...(kRotResidentSpecs[m.name] ?? []), ...(kRowsResidentSpecs[m.name] ?? []),
                          ...(kPreropeResidentSpecs[m.name] ?? [])];
      const resident = await CheckResidentPath(M, device, model, program, m.runs[0].ids, m.name, fail, resident_formats);
      resident_checks += resident.checks;
      step_ms[m.name] = resident.timing;
      prefill_dispatches[m.name] = resident.dispatches;
      positions_by_model[m.name] = positions - positions_before;
      if (!positions_by_model[m.name]) fail(`${m.name}: no position ran`);
      M._kvq_web_model_free(model);
    } catch (e) {
      fail(`${m.name}: ${e.stack || e.message}`);
    }
  }
  device.destroy();
  return {models: models.length, names: models.map((m) => m.name), positions_by_model, runs, positions, near_ties, failures, worst_logit_difference: worst, per_step,
          architectures, tensor_types, bounds, worst_by_spec, resident_checks, matvec_kernel_checks, step_ms,
          prefill_dispatches,
          seconds: (performance.now() - t0) / 1000};
}
