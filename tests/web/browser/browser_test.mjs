// The page (web/) in headless Chromium against the golden ids: the bundled stories260K run greedily
// in the browser must give run.c's ids with f32 KV (SIMD build, one prompt through the real form,
// one on the scalar build) and native `kvq run --json`'s ids with int4 KV. Page errors, console
// errors, failed requests and 404s fail it; so does a missing Chromium, bundle or playwright-core.
// Usage: node browser_test.mjs BUNDLE_DIR KVQ_CLI PLAYWRIGHT_NPM_DIR   (env KVQ_BROWSER_SCREENSHOT=FILE.png)
import {execFileSync} from 'node:child_process';
import fs from 'node:fs';
import {createRequire} from 'node:module';
import path from 'node:path';
import {fileURLToPath} from 'node:url';

import {ServeStatic} from '../../../tools/serve_web.mjs';

const kChromium = process.env.KVQ_CHROMIUM || '/usr/bin/chromium';
const kSourceDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const kGoldenFile = path.join(kSourceDir, 'models/stories260K/golden-runc-ids.txt');
// run.c -n 200 makes 200 forward passes, each emitting the token after its position: with the BOS,
// 201 ids (fewer only when it stops on a sampled BOS, the final 1). The hook's n_positions and the
// form's max tokens ask for the same length: ids in all, BOS and prompt included.
const kPositions = 201;
const kUiPrompt = 'Once upon a time';
const kScalarPrompt = 'The cat';
const t_start = Date.now();

function Fatal(message) {
  console.error(`browser_test: FAIL: ${message}`);
  process.exit(1);
}

const [bundle_arg, kvq_cli, npm_dir] = process.argv.slice(2);
if (!bundle_arg || !kvq_cli || !npm_dir) Fatal('usage: browser_test.mjs BUNDLE_DIR KVQ_CLI PLAYWRIGHT_NPM_DIR');
const bundle = path.resolve(bundle_arg);
for (const file of ['index.html', 'app.js', 'worker.js', 'worker_load.js', 'worker_gpu.js', 'kvq.js', 'kvq.wasm',
                    'kvq-scalar.js', 'kvq-scalar.wasm', 'models/stories260K.bin', 'models/tok512.bin']) {
  if (!fs.existsSync(path.join(bundle, file))) Fatal(`the bundle ${bundle} has no ${file} (build the wasm preset)`);
}
if (!fs.existsSync(kChromium)) Fatal(`no Chromium at ${kChromium} (scripts/setup.sh installs it)`);
if (!fs.existsSync(kvq_cli)) Fatal(`no native kvq at ${kvq_cli}`);
let chromium;
try {
  ({chromium} = createRequire(path.join(path.resolve(npm_dir), 'node_modules', '/'))('playwright-core'));
} catch (e) {
  Fatal(`playwright-core is not in ${npm_dir}/node_modules (the web.fetch_playwright fixture): ${e.message}`);
}

const failures = [];
function Fail(message) {
  failures.push(message);
  console.error(`browser_test: FAIL: ${message}`);
}

// ---- golden ids (the format tests/test_util/golden_runc.h reads) ----
function ReadGolden() {
  const runs = [];
  for (const line of fs.readFileSync(kGoldenFile, 'utf8').split('\n')) {
    const header = /^=== model=stories260K\.bin prompt="(.*)" \(token ids/.exec(line);
    if (header) runs.push({prompt: header[1], ids: []});
    else if (line.startsWith('IDS:') && runs.length) runs.at(-1).ids = line.slice(4).trim().split(/\s+/).map(Number);
  }
  if (runs.length === 0) Fatal(`${kGoldenFile}: no golden runs parsed`);
  for (const r of runs) {
    if (r.ids.length !== kPositions && r.ids.at(-1) !== 1) {
      Fatal(`${kGoldenFile}: prompt "${r.prompt}" has ${r.ids.length} ids, expected ${kPositions} or a final BOS stop`);
    }
  }
  return runs;
}

// Strict equality of two id lists; a mismatch names the first differing position.
function CompareIds(what, got, want) {
  const n = Math.min(got.length, want.length);
  let i = 0;
  while (i < n && got[i] === want[i]) ++i;
  if (i === n && got.length === want.length) {
    console.log(`browser_test: ok: ${what}: ${got.length} ids equal`);
    return true;
  }
  Fail(`${what}: first difference at position ${i} of ${got.length} (expected ${want.length}): ` +
       `got ${got[i] ?? '(end)'}, expected ${want[i] ?? '(end)'}; got ${JSON.stringify(got.slice(i, i + 8))}..., ` +
       `expected ${JSON.stringify(want.slice(i, i + 8))}...`);
  return false;
}

// ---- the static server: the bundle folder only, cross-origin isolated (the threaded build) ----
const Serve = (root) => ServeStatic(root, {on_refusal: (method, url, code, why) => Fail(`server: ${method} ${url}: ${code} ${why}`)});

// ---- the native binary: int4 ids for the same prompt and positions ----
function NativeIds(prompt, n_prompt, kv, extra = []) {
  const out = execFileSync(kvq_cli, [
    'run', '-m', path.join(bundle, 'models/stories260K.bin'), '--tokenizer', path.join(bundle, 'models/tok512.bin'),
    '--prompt', prompt, '--temp', '0', '-n', String(kPositions - n_prompt), '--kv', kv, '-t', '1', '--json', ...extra,
  ], {encoding: 'utf8'});
  return JSON.parse(out);
}

// Tokens per second, or a note when the clock did not move (performance.now's coarse steps).
const Rate = (n, ms) => (ms > 0 ? `${(n / ms * 1000).toFixed(0)} tok/s` : `${n} tokens in < 1 clock step`);

// ---- a page: opened, watched for errors, its hook ready ----
async function OpenPage(browser, base, query) {
  const page = await browser.newPage();
  const where = `page${query}`;
  page.on('pageerror', (e) => Fail(`${where}: page error: ${e.message}`));
  page.on('requestfailed', (r) => Fail(`${where}: request failed: ${r.url()}: ${r.failure()?.errorText}`));
  // Worker messages come to the page's console event too (in newer Playwright): each once.
  const seen = new Set();
  const OnConsole = (origin) => (msg) => {
    if (msg.type() !== 'error' || seen.has(msg.text())) return;
    seen.add(msg.text());
    Fail(`${where}: console error (${origin}): ${msg.text()}`);
  };
  page.on('console', OnConsole('page'));
  page.on('worker', (w) => w.on('console', OnConsole(`worker ${w.url()}`)));
  await page.goto(`${base}/index.html${query}`);
  const info = await page.evaluate(() => window.kvqPage.ready);
  console.log(`browser_test: ${where}: build ${info.build} (${info.module}, ${info.threads} thread(s)` +
              `${info.threads_why_not ? `: ${info.threads_why_not}` : ''}), Highway target ${info.simd_target}, ` +
              `${info.formats.length} KV formats`);
  return {page, info};
}

async function Hook(page, opts) {
  return page.evaluate((o) => window.kvqPage.generate(o), opts);
}

// The form as a user fills it; Generate clicked; the ids read from the page when it says done.
async function RunThroughForm(page, prompt, kv) {
  const n_prompt = (await page.evaluate((p) => window.kvqPage.tokenize(p), prompt)).length;
  await page.fill('#prompt', prompt);
  await page.fill('#temperature', '0');
  await page.fill('#seed', '1');
  await page.fill('#max-tokens', String(kPositions - n_prompt));
  await page.fill('#kv-k', kv);
  await page.fill('#kv-v', kv);
  await page.fill('#budget', '0');
  await page.selectOption('#device', 'cpu');  // the WebAssembly path (the GPU one has its own runs)
  await page.click('#generate');
  await page.waitForFunction(() => ['done', 'error'].includes(document.getElementById('status').dataset.state) &&
                                   !document.getElementById('generate').disabled);
  const state = await page.$eval('#status', (e) => `${e.dataset.state}: ${e.textContent}`);
  if (!state.startsWith('done')) Fail(`form run: the page says ${state}`);
  const ids = (await page.$eval('#ids', (e) => e.textContent)).trim().split(/\s+/).filter(Boolean).map(Number);
  return {ids, text: await page.$eval('#text', (e) => e.textContent)};
}

async function PageErrors(page, where) {
  const shown = await page.$$eval('.error-box:not([hidden]) .msg', (items) => items.map((e) => e.textContent));
  for (const e of shown) Fail(`${where}: the page shows an error: ${e}`);
}

// The page's WebGPU path (issue 14; web/gpu/): the golden runs through it, and 'auto' choosing it
// only where it can run (and saying why not).
async function GpuPath(page, info, golden) {
  if (!info.gpu) {
    Fail(`the page found no WebGPU adapter (${info.gpu_why_not}), though Chromium runs with SwiftShader's`);
    return;
  }
  for (const g of golden) {
    const r = await Hook(page, {prompt: g.prompt, kv_k: 'f32', n_positions: kPositions, device: 'gpu'});
    if (r.path?.device !== 'gpu') Fail(`gpu f32 "${g.prompt}": ran on ${JSON.stringify(r.path)}`);
    CompareIds(`gpu f32 "${g.prompt}" (hook)`, r.ids, g.ids);
  }
  // SwiftShader's adapter is a CPU emulation: 'auto' keeps to WebAssembly there and says why.
  const auto_emulated = await Hook(page, {prompt: kScalarPrompt, kv_k: 'f32', max_tokens: 4});
  if (auto_emulated.path?.device !== 'cpu' || !/emulation/.test(auto_emulated.path.why)) {
    Fail(`auto on SwiftShader: expected the CPU path and why, got ${JSON.stringify(auto_emulated.path)}`);
  }
  // Every sampler setting runs on the GPU path (web/gpu/sample_kernels.js; web.gpu_sampler checks
  // its picks): temperature 0.8 with a seed runs there, and the same seed gives the same ids again.
  const hot = {prompt: kScalarPrompt, kv_k: 'int4', max_tokens: 8, temperature: 0.8, top_k: 40, top_p: 0.95,
               seed: 7, device: 'gpu'};
  const sampled = await Hook(page, hot);
  if (sampled.path?.device !== 'gpu') Fail(`gpu with temperature 0.8: ran on ${JSON.stringify(sampled.path)}`);
  CompareIds('gpu temperature 0.8 seed 7, run again', (await Hook(page, hot)).ids, sampled.ids);
  // The GPU path's KV in kvq's cache in other formats (encoded by kvq's codecs in the WebAssembly
  // module, decoded in the shader): greedy ids equal native `kvq run` with the same format and f32
  // score arithmetic (as the shader scores; by default native int8/int4 keys score on integer dot
  // products, which this model's int4 greedy run leaves at position 9 — printed for the record).
  // One golden prompt per format, each prompt taken once (a prompt changes only the ids the same
  // code runs on; web.gpu_forward runs every prompt x spec against native, logits included).
  const kGpuFormats = ['int8', 'int4', 'int4-kivi'];
  for (const [i, kv] of kGpuFormats.entries()) {
    const g = golden[i % golden.length];
    const r = await Hook(page, {prompt: g.prompt, kv_k: kv, kv_v: kv, n_positions: kPositions, device: 'gpu'});
    if (r.path?.device !== 'gpu') Fail(`gpu ${kv} "${g.prompt}": ran on ${JSON.stringify(r.path)}`);
    const ids = r.end_token ? r.ids.slice(0, -1) : r.ids;
    CompareIds(`gpu ${kv} "${g.prompt}" vs kvq run --score-arithmetic f32`, ids,
               NativeIds(g.prompt, r.n_prompt, kv, ['--score-arithmetic', 'f32']).tokens);
    const native = NativeIds(g.prompt, r.n_prompt, kv).tokens;
    let agree = 0;
    while (agree < Math.min(ids.length, native.length) && ids[agree] === native[agree]) ++agree;
    console.log(`browser_test: gpu ${kv} "${g.prompt}": ${agree} of ${native.length} ids as native's default (integer scores)`);
  }
  // (No decode-speed comparison here: nothing would assert on it, and on SwiftShader it is dispatch
  // overhead; web.bench runs the page's benchmark, GPU against WebAssembly.)
}

async function Main() {
  const golden = ReadGolden();
  const server = await Serve(bundle);
  const base = `http://127.0.0.1:${server.address().port}`;
  const browser = await chromium.launch({
    executablePath: kChromium,
    headless: true,
    // WebGPU on SwiftShader's Vulkan (a CPU emulation every machine has), for the page's GPU path.
    args: ['--no-sandbox', '--disable-quic', '--no-first-run', '--disable-background-networking',
           '--disable-component-update', '--disable-sync', '--enable-unsafe-webgpu', '--enable-features=Vulkan',
           '--use-vulkan=swiftshader', '--use-webgpu-adapter=swiftshader'],
  });
  try {
    // SIMD build.
    const {page, info} = await OpenPage(browser, base, '');
    if (info.build !== 'simd128') Fail(`the default page runs the ${info.build} build, expected simd128`);
    const ui_golden = golden.find((g) => g.prompt === kUiPrompt) ?? Fatal(`no golden run for "${kUiPrompt}"`);
    const ui = await RunThroughForm(page, kUiPrompt, 'f32');
    CompareIds(`simd f32 "${kUiPrompt}" (form)`, ui.ids, ui_golden.ids);
    if (process.env.KVQ_BROWSER_SCREENSHOT) {  // the page as the form run left it, ids opened
      await page.click('details > summary');
      await page.screenshot({path: process.env.KVQ_BROWSER_SCREENSHOT, fullPage: true});
      await page.click('details > summary');
    }
    for (const g of golden.filter((g) => g !== ui_golden)) {
      const r = await Hook(page, {prompt: g.prompt, kv_k: 'f32', kv_v: 'f32', n_positions: kPositions, device: 'cpu'});
      CompareIds(`simd f32 "${g.prompt}" (hook)`, r.ids, g.ids);
      const t = r.timing;
      console.log(`browser_test: simd f32 "${g.prompt}": prefill ${Rate(t.n_prompt, t.prefill_ms)}, ` +
                  `decode ${Rate(t.n_generated, t.decode_ms)} (${t.n_generated} tokens)`);
    }
    for (const g of golden) {
      const t0 = Date.now();
      const r = await Hook(page, {prompt: g.prompt, kv_k: 'int4', kv_v: 'int4', n_positions: kPositions, device: 'cpu'});
      const native = NativeIds(g.prompt, r.n_prompt, 'int4');
      // kvq run leaves out the end token it stopped on; the page keeps it (as run.c's ids do).
      const same = CompareIds(`simd int4 "${g.prompt}" vs kvq run`, r.end_token ? r.ids.slice(0, -1) : r.ids,
                              native.tokens);
      // The page's KV figures: the cache's positions times seed 000's bytes per token are native's
      // (same positions only when the ids are the same).
      const s = r.stats.session;
      if (same && (s.positions * s.kv_bytes_per_token !== native.kv_bytes ||
                   s.positions * s.kv_f16_bytes_per_token !== native.kv_bytes_f16)) {
        Fail(`simd int4 "${g.prompt}": page KV ${s.positions} x ${s.kv_bytes_per_token} B (f16 ` +
             `${s.kv_f16_bytes_per_token} B), native kv_bytes ${native.kv_bytes} (f16 ${native.kv_bytes_f16})`);
      }
      const t = r.timing;
      console.log(`browser_test: simd int4 "${g.prompt}": prefill ${Rate(t.n_prompt, t.prefill_ms)}, ` +
                  `decode ${Rate(t.n_generated, t.decode_ms)} (${t.n_generated} tokens), ` +
                  `KV ${s.kv_bytes_per_token} B/token (f16 ${s.kv_f16_bytes_per_token}), ${Date.now() - t0} ms`);
    }
    await GpuPath(page, info, golden);
    await PageErrors(page, 'simd page');

    // Scalar build, as a browser without SIMD gets it.
    const scalar = await OpenPage(browser, base, '?simd=0');
    if (scalar.info.build !== 'scalar') Fail(`?simd=0 runs the ${scalar.info.build} build, expected scalar`);
    if (scalar.info.simd_target === info.simd_target) {
      Fail(`the scalar build reports the SIMD build's Highway target ${info.simd_target}`);
    }
    const sg = golden.find((g) => g.prompt === kScalarPrompt) ?? Fatal(`no golden run for "${kScalarPrompt}"`);
    const r = await Hook(scalar.page, {prompt: sg.prompt, kv_k: 'f32', kv_v: 'f32', n_positions: kPositions,
                                       device: 'cpu'});
    CompareIds(`scalar f32 "${sg.prompt}" (hook)`, r.ids, sg.ids);
    const t = r.timing;
    console.log(`browser_test: scalar f32 "${sg.prompt}": prefill ${Rate(t.n_prompt, t.prefill_ms)}, ` +
                `decode ${Rate(t.n_generated, t.decode_ms)} (${t.n_generated} tokens)`);
    await PageErrors(scalar.page, 'scalar page');
  } finally {
    await browser.close();
    server.close();
  }
}

await Main().catch((e) => Fail(`${e.stack ?? e}`));
const seconds = ((Date.now() - t_start) / 1000).toFixed(1);
if (failures.length) {
  console.error(`browser_test: ${failures.length} failure(s) in ${seconds} s`);
  process.exit(1);
}
console.log(`browser_test: all passed in ${seconds} s`);
