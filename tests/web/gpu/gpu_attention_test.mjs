// WebGPU attention (web/gpu/kv_attention.js) in headless Chromium on the SwiftShader adapter, over
// the cases gpu_attention_fixture wrote with kvq's codecs (tests/web/gpu/gpu_attention_page.js runs
// the checks in the page). A missing Chromium, playwright-core, fixture or WebGPU adapter fails it.
// With `--forward` (then FIXTURE_DIR is gpu_forward_fixture's, followed by the web bundle's folder),
// the page's GPU path instead (tests/web/gpu/gpu_forward_page.js: the module's step program);
// its CASE is a model's name, or "K/N" for shard K of N of the manifest's models (ModelsOf there).
// With `--kv-device` (then FIXTURE_DIR is the web bundle), the C++ cache's device tier over WebGPU
// (tests/web/gpu/gpu_kv_device_page.js: kvq.js's KvCache streaming into web/gpu/kv_device.js).
// With `--device-loss` (FIXTURE_DIR is the web bundle), the GPU path losing its device
// (tests/web/gpu/gpu_device_loss_page.js). With `--file-weights` (FIXTURE_DIR is the web bundle),
// a model loaded from its GGUF header, its weights read from the file (gpu_file_weights_page.js).
// With `--limits` (arguments as --forward), the GPU path
// within forced device limits (tests/web/gpu/gpu_limits_page.js). With `--chunks` (FIXTURE_DIR is the
// web bundle), the KV device's attention split over position chunks against kvq's chunked
// attention (tests/web/gpu/gpu_chunk_attention_page.js). With `--encode` (FIXTURE_DIR as without a
// flag), the WGSL KV encoders against kvq's codecs (tests/web/gpu/gpu_kv_encode_page.js); with
// `--write-behind` (FIXTURE_DIR is the web bundle), pages they encode handed to the module's master.
// With `--sampler` (FIXTURE_DIR is the web bundle), the GPU sampler against kvq's C++ chain and
// sampled generation on the GPU path (tests/web/gpu/gpu_sampler_page.js).
// With `--mixed` (arguments as --forward; CASE is "RUN:LIST", the formats to run and the registry's
// list, as gpu_kv_mixed_page.js takes it), the mixed KV mode on a context 8× the device budget
// (tests/web/gpu/gpu_kv_mixed_page.js), every format in one page. With `--moe` (arguments as
// --forward), the GPU's mixture-of-experts ops against the module's (tests/web/gpu/gpu_moe_page.js).
// With `--hybrid-loss` (arguments as --forward; CASE: the hybrid's name in the manifest), a hybrid
// losing its device mid-generation (tests/web/gpu/gpu_hybrid_loss_page.js).
// KVQ_GPU_PROFILE=1 in the environment prints where the time went (gpu_call_profile.js): Chromium's
// launch, the page's load, the test's evaluation, and the WebGPU calls within it.
// Usage: node gpu_attention_test.mjs [--forward|--limits|--mixed|--moe|--hybrid-loss|--kv-device|--device-loss|--file-weights|--chunks|--encode|--write-behind|--sampler]
//        FIXTURE_DIR [BUNDLE_DIR (--forward, --limits, --mixed, --moe, --hybrid-loss)] PLAYWRIGHT_NPM_DIR
//        [CASE_SUBSTRING]
import fs from 'node:fs';
import http from 'node:http';
import {createRequire} from 'node:module';
import path from 'node:path';
import {fileURLToPath} from 'node:url';

const kChromium = process.env.KVQ_CHROMIUM || '/usr/bin/chromium';
const kSourceDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
// SwiftShader's Vulkan behind WebGPU: the adapter every machine has (no GPU needed).
const kWebGpuFlags = ['--enable-unsafe-webgpu', '--enable-features=Vulkan', '--use-vulkan=swiftshader',
                      '--use-webgpu-adapter=swiftshader'];

function Fatal(message) {
  console.error(`gpu_attention_test: FAIL: ${message}`);
  process.exit(1);
}

const limits = process.argv[2] === '--limits';
const mixed = process.argv[2] === '--mixed';
const moe = process.argv[2] === '--moe';
const hybrid_loss = process.argv[2] === '--hybrid-loss';
const forward = process.argv[2] === '--forward' || limits || mixed || moe || hybrid_loss;  // all take gpu_forward_fixture's cases and the bundle
const device_loss = process.argv[2] === '--device-loss';
const chunks = process.argv[2] === '--chunks';
const encode = process.argv[2] === '--encode';
const write_behind = process.argv[2] === '--write-behind';
const file_weights = process.argv[2] === '--file-weights';
const sampler = process.argv[2] === '--sampler';
const kv_device = process.argv[2] === '--kv-device' || device_loss || chunks || write_behind || file_weights || sampler;  // all take the bundle as FIXTURE_DIR
const rest = process.argv.slice(forward || kv_device || encode ? 3 : 2);
const bundle_arg = forward ? rest.splice(1, 1)[0] : undefined;
const [fixture_arg, npm_dir, only] = rest;
if (forward && !fs.existsSync(path.join(path.resolve(bundle_arg || ''), 'kvq.js'))) Fatal(`no kvq.js in the bundle folder ${bundle_arg}`);
if (!fixture_arg || !npm_dir) Fatal('usage: gpu_attention_test.mjs FIXTURE_DIR PLAYWRIGHT_NPM_DIR [CASE]');
const fixture = path.resolve(fixture_arg);
if (!fs.existsSync(path.join(fixture, kv_device ? 'kvq.js' : 'manifest.json'))) Fatal(`no manifest.json in ${fixture} (run gpu_attention_fixture)`);
if (!fs.existsSync(kChromium)) Fatal(`no Chromium at ${kChromium} (scripts/setup.sh installs it)`);
let chromium;
try {
  ({chromium} = createRequire(path.join(path.resolve(npm_dir), 'node_modules', '/'))('playwright-core'));
} catch (e) {
  Fatal(`playwright-core is not in ${npm_dir}/node_modules (the web.fetch_playwright fixture): ${e.message}`);
}

// /web/ -> the source web/, /test/ -> this folder, /fixture/ -> the cases; the page at /.
const kRoots = {'/web/': path.join(kSourceDir, 'web'), '/test/': path.dirname(fileURLToPath(import.meta.url)),
                '/fixture/': fixture, '/models/': path.join(kSourceDir, 'models/stories260K')};
if (forward) kRoots['/bundle/'] = path.resolve(bundle_arg);
const kTypes = {'.js': 'text/javascript', '.wasm': 'application/wasm', '.json': 'application/json', '.bin': 'application/octet-stream',
                '.html': 'text/html'};
const server = http.createServer((req, res) => {
  const url = decodeURIComponent(new URL(req.url, 'http://x').pathname);
  if (url === '/favicon.ico') {  // asked for by every page: none
    res.writeHead(204);
    res.end();
    return;
  }
  if (url === '/') {
    res.writeHead(200, {'content-type': 'text/html'});
    res.end('<!doctype html><meta charset="utf-8"><title>kvq WebGPU attention</title>' +
            '<script type="module">import {RunGpuAttentionTests} from "/test/gpu_attention_page.js";' +
            'import {RunGpuForwardTests} from "/test/gpu_forward_page.js";' +
            'import {RunGpuKvDeviceTests} from "/test/gpu_kv_device_page.js";' +
            'import {RunGpuDeviceLossTests} from "/test/gpu_device_loss_page.js";' +
            'import {RunGpuLimitsTests} from "/test/gpu_limits_page.js";' +
            'import {RunGpuFileWeightsTests} from "/test/gpu_file_weights_page.js";' +
            'window.RunGpuFileWeightsTests = RunGpuFileWeightsTests;' +
            'import {RunGpuKvMixedTests} from "/test/gpu_kv_mixed_page.js";' +
            'window.RunGpuKvMixedTests = RunGpuKvMixedTests;' +
            'import {RunGpuChunkAttentionTests} from "/test/gpu_chunk_attention_page.js";' +
            'window.RunGpuChunkAttentionTests = RunGpuChunkAttentionTests;' +
            'import {RunGpuKvEncodeTests, RunGpuWriteBehindTests} from "/test/gpu_kv_encode_page.js";' +
            'window.RunGpuKvEncodeTests = RunGpuKvEncodeTests; window.RunGpuWriteBehindTests = RunGpuWriteBehindTests;' +
            'window.RunGpuLimitsTests = RunGpuLimitsTests;' +
            'import {RunGpuSamplerTests} from "/test/gpu_sampler_page.js"; window.RunGpuSamplerTests = RunGpuSamplerTests;' +
            'import {RunGpuMoeTests} from "/test/gpu_moe_page.js"; window.RunGpuMoeTests = RunGpuMoeTests;' +
            'import {RunGpuHybridLossTests} from "/test/gpu_hybrid_loss_page.js";' +
            'window.RunGpuHybridLossTests = RunGpuHybridLossTests;' +
            'window.RunGpuAttentionTests = RunGpuAttentionTests; window.RunGpuForwardTests = RunGpuForwardTests;' +
            'window.RunGpuKvDeviceTests = RunGpuKvDeviceTests; window.RunGpuDeviceLossTests = RunGpuDeviceLossTests;</script>');
    return;
  }
  for (const [prefix, root] of Object.entries(kRoots)) {
    if (!url.startsWith(prefix)) continue;
    const file = path.join(root, url.slice(prefix.length));
    if (!file.startsWith(root) || !fs.existsSync(file) || !fs.statSync(file).isFile()) break;
    res.writeHead(200, {'content-type': kTypes[path.extname(file)] || 'application/octet-stream'});
    fs.createReadStream(file).pipe(res);
    return;
  }
  res.writeHead(404);
  res.end();
});
await new Promise((ok) => server.listen(0, '127.0.0.1', ok));
const origin = `http://127.0.0.1:${server.address().port}`;

const t_launch = performance.now();
const browser = await chromium.launch({executablePath: kChromium, headless: true,
  args: ['--no-sandbox', '--disable-quic', '--no-first-run', '--disable-background-networking', ...kWebGpuFlags]});
let result;
try {
  const page = await browser.newPage();
  const t_page = performance.now();
  if (process.env.KVQ_GPU_PROFILE) await page.addInitScript({path: path.join(path.dirname(fileURLToPath(import.meta.url)), 'gpu_call_profile.js')});
  const errors = [];
  page.on('pageerror', (e) => errors.push(`page error: ${e.message}`));
  page.on('console', (m) => { if (m.type() === 'error') errors.push(`console error: ${m.text()}`); });
  page.on('response', (r) => { if (r.status() >= 400) errors.push(`HTTP ${r.status()} for ${r.url()}`); });
  await page.goto(origin + '/');
  await page.waitForFunction(() => typeof window.RunGpuAttentionTests === 'function', null, {timeout: 30000});
  page.setDefaultTimeout(0);
  const t_ready = performance.now();
  result = sampler ? await page.evaluate((url) => window.RunGpuSamplerTests(url), origin + '/fixture')
      : write_behind ? await page.evaluate((url) => window.RunGpuWriteBehindTests(url), origin + '/fixture')
      : encode ? await page.evaluate((url) => window.RunGpuKvEncodeTests(url), origin + '/fixture')
      : chunks ? await page.evaluate((url) => window.RunGpuChunkAttentionTests(url), origin + '/fixture')
      : file_weights ? await page.evaluate((url) => window.RunGpuFileWeightsTests(url), origin + '/fixture')
      : device_loss ? await page.evaluate(([url, only]) => window.RunGpuDeviceLossTests(url, only), [origin + '/fixture', only || ''])
      : kv_device ? await page.evaluate((url) => window.RunGpuKvDeviceTests(url), origin + '/fixture')
      : hybrid_loss ? await page.evaluate(([url, bundle, only]) => window.RunGpuHybridLossTests(url, bundle, only),
                                          [origin + '/fixture', origin + '/bundle', only || 'qwen35'])
      : moe ? await page.evaluate(([url, bundle]) => window.RunGpuMoeTests(url, bundle), [origin + '/fixture', origin + '/bundle'])
      : mixed ? await page.evaluate(([url, bundle, only]) => window.RunGpuKvMixedTests(url, bundle, only),
                                    [origin + '/fixture', origin + '/bundle', only || ''])
      : limits ? await page.evaluate(([url, bundle, only]) => window.RunGpuLimitsTests(url, bundle, only),
                                     [origin + '/fixture', origin + '/bundle', only || '']) : forward
      ? await page.evaluate(([url, bundle, only]) => window.RunGpuForwardTests(url, bundle, only),
                            [origin + '/fixture', origin + '/bundle', only || ''])
      : await page.evaluate(([url, only]) => window.RunGpuAttentionTests(url, only), [origin + '/fixture', only || '']);
  result.failures.push(...errors);
  if (process.env.KVQ_GPU_PROFILE) {
    console.log(`PROFILE launch ${((t_page - t_launch) / 1000).toFixed(1)}s, page ready ${((t_ready - t_page) / 1000).toFixed(1)}s, ` +
                `evaluate ${((performance.now() - t_ready) / 1000).toFixed(1)}s, ${JSON.stringify(await page.evaluate(() => window.__gpu_profile_report()))}`);
  }
} finally {
  await browser.close();
  server.close();
}
if (sampler) {
  console.log(`gpu_attention_test --sampler: ${result.cases} cases (GPU pick = kvq's chain), ${result.failures.length} failures, ` +
              `${result.flipped_differs} picks changed by the draw's top bit, ${result.greedy_differs} not the argmax, ` +
              `${result.distinct_ids} distinct ids, ${result.adjust_cases} penalty/bias cases (${result.edits_checked} ` +
              `logits edited, every logit compared bit for bit with Sampler::Adjust's, ${result.adjust_differs} picks changed), ` +
              `a pick at 151936 in ms ${JSON.stringify(result.pick_ms)} (top_k 0: every logit sorted), ` +
              `${result.replayed} generated ids replayed on the CPU, generation ` +
              `${JSON.stringify(result.generation)}, ${result.seconds?.toFixed(1)} s in the page`);
  if (!result.cases || !result.replayed || !result.adjust_cases) Fatal('no case ran');
} else if (hybrid_loss) {
  console.log(`gpu_attention_test --hybrid-loss: ${result.model} (${result.arch}), ${result.runs} runs, ` +
              `${result.losses} devices lost, ${result.failures.length} failures, replayed ${JSON.stringify(result.replays)} ` +
              `(ms on SwiftShader under load: not claims), ${result.cpu_differs} CPU continuation ids differ from the ` +
              `GPU's uninterrupted ones, ${result.seconds?.toFixed(1)} s in the page`);
  if (!result.runs) Fatal('no run');
} else if (moe) {
  console.log(`gpu_attention_test --moe: ${result.route_cases} routing cases (${result.exps} exps) bit-equal checked ` +
              `(${result.route_seconds?.toFixed(1)} s), ` +
              `layers per model ${JSON.stringify(result.layers)}, ${result.matvec_checks} expert matvecs checked, ` +
              `worst |difference| over its bound ${JSON.stringify(result.worst_over_bound)}, ${result.programs_built} whole-model ` +
              `programs built, ${result.failures.length} failures, ${result.seconds?.toFixed(1)} s in the page`);
  if (!result.route_cases) Fatal('no routing case ran');
} else if (mixed) {
  console.log(`gpu_attention_test --mixed: formats ${result.formats?.join(', ')}, ${result.positions} positions, ` +
              `${result.checks} checks, ${result.failures.length} failures, context ${result.ratio}x the device budget, ` +
              `${result.streamed_bytes} bytes streamed from the master, ${result.submits} submits, ` +
              `${result.seconds?.toFixed(1)} s in the page`);
  for (const [format, r] of Object.entries(result.per_format ?? {})) {
    console.log(`gpu_attention_test --mixed: ${format}: ${r.positions} positions, ${r.checks} checks, ` +
                `${r.failures ? `${r.failures} FAILURES` : 'passed'}, ${r.seconds.toFixed(1)} s`);
  }
  if (!result.positions) result.failures.push('no position ran');
  const missing = (result.formats ?? []).filter((f) => !result.per_format?.[f]?.positions);
  if (missing.length) result.failures.push(`no position ran for ${missing.join(', ')}`);  // printed with the page's, which say why
} else if (limits) {
  console.log(`gpu_attention_test --limits: ${result.models} models, ${result.failures.length} failures, ` +
              `${JSON.stringify(result.report)}, ${result.seconds?.toFixed(1)} s in the page`);
  if (!result.models) Fatal('no model ran');
} else if (file_weights) {
  console.log(`gpu_attention_test --file-weights: ${result.tensors} tensors at their file offsets, ${result.runs} runs, ` +
              `${result.read_bytes} bytes read from the file, ${result.failures.length} failures, the CPU forward ` +
              `refused: "${result.refusal}", ${result.seconds?.toFixed(1)} s in the page`);
  if (!result.runs) Fatal('no run');
} else if (device_loss) {
  console.log(`gpu_attention_test --device-loss: ${result.runs} runs, ${result.losses} devices lost, ` +
              `${result.failures.length} failures, smallest top-2 logit gap ${result.min_gap}, ${result.flushes} KV device submits with pages of 32, ` +
              `moved to the CPU because: "${result.cpu_event}", ${result.seconds?.toFixed(1)} s in the page`);
  if (!result.runs) Fatal('no run');
} else if (encode || write_behind) {
  console.log(`gpu_attention_test ${process.argv[2]}: ${result.cases} formats encoded on the GPU, ${result.checks} checks, ` +
              `${result.failures.length} failures, without a GPU encoder: ${result.without_encoder?.join(', ')}, ` +
              `${result.seconds?.toFixed(1)} s in the page`);
} else if (chunks) {
  console.log(`gpu_attention_test --chunks: ${result.cases} formats, ${result.checks} checks, ${result.failures.length} failures, ` +
              `${result.unchunked_differs} runs where an unchunked walk differs, ${result.seconds?.toFixed(1)} s in the page`);
} else if (kv_device) {
  console.log(`gpu_attention_test --kv-device: ${result.cases} cases, ${result.checks} checks, ` +
              `${result.failures.length} failures, worst error ${result.worst_error_over_bound?.toFixed(4)} of the bound, ` +
              `${result.seconds.toFixed(1)} s in the page`);
} else if (forward) {
  console.log(`gpu_attention_test --forward: ${result.models} models (positions each ${JSON.stringify(result.positions_by_model)}), ` +
              `${result.runs} runs, ${result.positions} positions, ` +
              `${result.failures.length} failures, worst |GPU - native| logit ${result.worst_logit_difference}, ` +
              `${result.near_ties} near-ties, bounds ${JSON.stringify(result.bounds)}, worst by KV spec ${JSON.stringify(result.worst_by_spec)}, per step ${JSON.stringify(result.per_step)}, ` +
              `weights ${JSON.stringify(result.tensor_types)}, architectures ${JSON.stringify(result.architectures)}, ` +
              `${result.resident_checks} resident-vs-streamed checks, positions under the other matvec kernel ${JSON.stringify(result.matvec_kernel_checks)}, ms per token streamed/resident (SwiftShader, ` +
              `under load: not claims) ${JSON.stringify(result.step_ms)}, prefill dispatches in blocks/per token ` +
              `(attend, KV encode, weight) ${JSON.stringify(result.prefill_dispatches)}, ` +
              `${result.seconds?.toFixed(1)} s in the page`);
  // Per model, so one model's flood of failures past the 50 printed below hides no other's.
  const by_model = Object.fromEntries((result.names ?? []).map((n) => [n, result.failures.filter(
      (f) => f.startsWith(`${n} `) || f.startsWith(`${n}:`)).length]));
  console.log(`gpu_attention_test --forward: failures by model ${JSON.stringify(by_model)}`);
} else {
  console.log(`gpu_attention_test: ${result.cases} cases, ${result.checks} checks, ${result.failures.length} failures, ` +
              `worst error ${result.worst_error_over_bound?.toFixed(4)} of the bound, ${result.seconds.toFixed(1)} s in the page`);
}
for (const f of result.failures.slice(0, 50)) console.error(`gpu_attention_test: FAIL: ${f}`);
if (!forward && !device_loss && !file_weights && !sampler && result.cases === 0) Fatal('no case ran');  // (--kv-device too)
if (forward && !limits && !mixed && !moe && !hybrid_loss && !result.positions) Fatal('no position ran');
process.exit(result.failures.length ? 1 : 0);
