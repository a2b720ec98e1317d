// The page's benchmark (web/bench.js through window.kvqPage.bench) on a model file of your own, in
// headless Chromium: the page loads the file as a user picks it (#model-file, #load-picked), then
// runs the benchmark and prints its JSON result on one line. Not a test (ctest runs bench_test.mjs
// on the bundled model): figures for docs/performance.md, e.g. the WebAssembly path on a
// Bonsai-shaped synth. On SwiftShader the GPU path shows dispatch overhead, not a GPU's speed.
// Usage: node page_bench.mjs BUNDLE_DIR PLAYWRIGHT_NPM_DIR MODEL.gguf [--paths cpu,gpu]
//          [--prompt N] [--new N] [--depths 0,512] [--kv f16] [--query ?gpu=1] [--budget-kib N]
// (--budget-kib: the GPU path's device budget; under the context's KV it takes the mixed KV path)
import path from 'node:path';

import {Checks, LaunchChromium, OpenPage, Serve, Text} from './browser_util.mjs';

const checks = new Checks('page_bench');
const kUsage = 'usage: page_bench.mjs BUNDLE_DIR PLAYWRIGHT_NPM_DIR MODEL.gguf [--paths cpu,gpu] [--prompt N] ' +
               '[--new N] [--depths 0,512] [--kv f16] [--query ?gpu=1] [--budget-kib N]';
const [bundle, npm_dir, model, ...rest] = process.argv.slice(2);
if (!bundle || !npm_dir || !model) checks.Fatal(kUsage);

const flags = {paths: 'cpu', prompt: '64', new: '32', depths: '0', kv: 'f16', query: '', 'budget-kib': '0'};
for (let i = 0; i < rest.length; i += 2) {
  const name = rest[i].replace(/^--/, '');
  if (!(name in flags) || !rest[i].startsWith('--') || rest[i + 1] === undefined) {
    checks.Fatal(`${rest[i]}: unknown flag or missing value; ${kUsage}`);
  }
  flags[name] = rest[i + 1];
}
const Whole = (flag, v) => {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0) checks.Fatal(`--${flag} ${v}: expected a whole number`);
  return n;
};
const options = {paths: flags.paths.split(','), prompt_tokens: Whole('prompt', flags.prompt),
                 new_tokens: Whole('new', flags.new), depths: flags.depths.split(',').map((d) => Whole('depths', d)),
                 kv_k: flags.kv, kv_v: flags.kv, device_budget_bytes: Whole('budget-kib', flags['budget-kib']) * 1024};

const {server, base} = await Serve(checks, bundle);
const browser = await LaunchChromium(checks, npm_dir);
try {
  const {page} = await OpenPage(checks, browser, base, flags.query);
  await page.setInputFiles('#model-file', model);
  await page.click('#load-picked');
  await page.waitForFunction(() => document.getElementById('status').dataset.state !== 'loading', null,
                             {timeout: 600000});
  const loaded = await Text(page, '#model-name');
  if (loaded !== path.basename(model)) checks.Fatal(`the page did not load ${model}: ${await Text(page, '#status')}`);
  const result = await page.evaluate((o) => window.kvqPage.bench(o), options);
  console.log(JSON.stringify(result));
} catch (e) {
  checks.Fail(`${e.stack ?? e}`);
} finally {
  await browser.close();
  server.close();
}
checks.Finish();
