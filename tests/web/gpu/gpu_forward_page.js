// In the page: web/gpu/forward.js (the llama2.c forward on WebGPU, KV master in host memory,
// attention streamed in windows of 16 positions through GpuKvAttention) along run.c's golden
// greedy runs of the bundled stories260K, teacher-forced:
//   - greedy equals run.c: from the last prompt position on, the argmax of the GPU logits is the
//     next golden id (so generating greedily on the GPU gives the golden tokens);
//   - the logits agree with native kvq's (gpu_forward_fixture: LlamaModel, f32 KV) within 1e-3 at
//     every position. Tolerance: both are f32 with different summation orders (kvq's SIMD lanes
//     and online softmax by tiles; here sequential sums, WGSL's exp/sin/cos/pow within a few ULP),
//     so they differ by rounding accumulated over 5 layers of 64- and 172-wide sums — the same
//     reasoning and bound as tests/model/reference_forward_test.cc (logits up to ~20: ~5e-5
//     relative); a real bug (a RoPE angle, a dropped position, a head mapping) moves them O(0.1-1).
// And tiny Llama GGUFs (gpu_forward_fixture: kvq synth, every matrix in F16, BF16, Q8_0, Q4_0, Q1_0)
// read by web/gpu/gguf.js, each weight dequantised in the matvec shader, against the run.c-style
// reference forward over the same weights (f32 activations): logits within 1e-3 at every position
// (the reasoning above), and the same argmax wherever the reference's top two differ by more than
// twice that.
// Returns {runs, gguf_models, positions, failures, worst_logit_difference, tokens_per_second, seconds}.
import {GpuLlamaForward, ParseLlama2c} from '/web/gpu/forward.js';
import {LlamaFromGguf} from '/web/gpu/gguf.js';

export async function RunGpuForwardTests(fixture_url, model_url) {
  const t0 = performance.now();
  const failures = [];
  const fail = (what) => failures.push(what);
  if (!navigator.gpu) return {failures: ['navigator.gpu is missing (WebGPU not enabled)'], runs: 0};
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) return {failures: ['no WebGPU adapter'], runs: 0};
  const device = await adapter.requestDevice();
  device.addEventListener('uncapturederror', (e) => fail(`WebGPU error: ${e.error.message}`));
  const model = ParseLlama2c(await (await fetch(model_url)).arrayBuffer());
  const gpu = await GpuLlamaForward.Create(device, model);
  const manifest = await (await fetch(`${fixture_url}/manifest.json`)).json();
  let positions = 0, worst = 0, decode_seconds = 0, golden_positions = 0;
  for (const run of manifest.runs) {
    const native = new Float32Array(await (await fetch(`${fixture_url}/${run.file}`)).arrayBuffer());
    gpu.Reset();
    for (let p = 0; p + 1 < run.ids.length; ++p) {
      const t = performance.now();
      const logits = await gpu.Forward(run.ids[p], {window: 16});
      decode_seconds += (performance.now() - t) / 1000;
      ++positions;
      ++golden_positions;
      let argmax = 0, diff = 0;
      for (let i = 0; i < run.vocab; ++i) {
        if (logits[i] > logits[argmax]) argmax = i;
        diff = Math.max(diff, Math.abs(logits[i] - native[p * run.vocab + i]));
      }
      worst = Math.max(worst, diff);
      if (!(diff <= 1e-3)) {
        fail(`prompt "${run.prompt}" position ${p}: logits differ from native kvq's by ${diff} (> 1e-3)`);
        break;
      }
      if (p >= run.n_prompt - 1 && argmax !== run.ids[p + 1]) {
        fail(`prompt "${run.prompt}" position ${p}: GPU greedy ${argmax}, run.c ${run.ids[p + 1]}`);
        break;
      }
    }
  }
  for (const g of manifest.gguf) {
    const reference = new Float32Array(await (await fetch(`${fixture_url}/${g.file}`)).arrayBuffer());
    let model;
    try {
      model = LlamaFromGguf(await (await fetch(`${fixture_url}/${g.model}`)).arrayBuffer());
    } catch (e) {
      fail(`${g.model}: ${e.message}`);
      continue;
    }
    const forward = await GpuLlamaForward.Create(device, model);
    for (let p = 0; p + 1 < g.ids.length; ++p) {
      const logits = await forward.Forward(g.ids[p], {window: 16});
      ++positions;
      const want = reference.subarray(p * g.vocab, (p + 1) * g.vocab);
      let argmax = 0, best = 0, second = -Infinity, diff = 0;
      for (let i = 0; i < g.vocab; ++i) {
        if (logits[i] > logits[argmax]) argmax = i;
        diff = Math.max(diff, Math.abs(logits[i] - want[i]));
        if (want[i] > want[best]) best = i;
      }
      for (let i = 0; i < g.vocab; ++i) if (i !== best) second = Math.max(second, want[i]);
      worst = Math.max(worst, diff);
      if (!(diff <= 1e-3)) {
        fail(`${g.model} position ${p}: logits differ from the reference's by ${diff} (> 1e-3)`);
        break;
      }
      if (want[best] - second > 2e-3 && argmax !== best) {
        fail(`${g.model} position ${p}: GPU argmax ${argmax}, reference ${best}`);
        break;
      }
    }
  }
  device.destroy();
  return {runs: manifest.runs.length, gguf_models: manifest.gguf.length, positions, failures, worst_logit_difference: worst,
          tokens_per_second: golden_positions / decode_seconds, seconds: (performance.now() - t0) / 1000};
}
