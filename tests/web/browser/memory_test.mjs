// A picked model is held once, in headless Chromium: a qwen3-0.6b-shaped synth (q4_0, 325 MiB),
// picked in the page and read into the module a chunk at a time, then run for a few tokens: the
// WebAssembly heap + GPU buffers stay within 1.15 x the file + the KV bytes + a stated scratch (the
// page used to hold 2.3 x the file in its heap alone). The page's own figures are checked against it.
// Usage: node memory_test.mjs BUNDLE_DIR KVQ_CLI PLAYWRIGHT_NPM_DIR
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import {Checks, LaunchChromium, OpenPage, Serve, Synth, Text} from './browser_util.mjs';

const checks = new Checks('memory_test');
const [bundle, kvq_cli, npm_dir] = process.argv.slice(2);
if (!bundle || !kvq_cli || !npm_dir) checks.Fatal('usage: memory_test.mjs BUNDLE_DIR KVQ_CLI PLAYWRIGHT_NPM_DIR');
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), `kvq-memory-${process.pid}-`));
process.on('exit', () => fs.rmSync(tmp, {recursive: true, force: true}));

const MiB = 1024 * 1024;
// What the page may hold beyond the file and the KV: the module's initial memory (32 MiB: code,
// stacks, the bundled model it starts with) and one step of the heap's growth past what was asked
// (Emscripten grows by at most 96 MiB more than a request: MEMORY_GROWTH_GEOMETRIC_CAP), which
// also covers a session's activations and logits (151,936 f32 logits: 0.6 MiB).
const kScratchBytes = 128 * MiB;

async function Main() {
  const synth = Synth(kvq_cli, tmp, 'qwen3-0.6b-q4_0.gguf', ['--preset', 'qwen3-0.6b']);
  const file = fs.statSync(synth).size;
  const {server, base} = await Serve(checks, bundle);
  const browser = await LaunchChromium(checks, npm_dir);
  try {
    const {page} = await OpenPage(checks, browser, base, '?gpu=0');
    await page.setInputFiles('#model-file', synth);
    await page.click('#load-picked');
    await page.waitForFunction(() => document.getElementById('status').dataset.state !== 'loading', null,
                               {timeout: 120000});
    checks.Expect(await Text(page, '#model-name') === path.basename(synth), `${path.basename(synth)} loaded`);
    const r = await page.evaluate(() => window.kvqPage.generate({prompt: 'Once upon a time', max_tokens: 4, kv_k: 'int8'}));
    const heap = r.stats.heap_bytes;
    const gpu = r.stats.gpu ? r.stats.gpu.weight_bytes + r.stats.session.device_bytes : 0;
    const kv = r.stats.session.kv_bytes;
    const bound = 1.15 * file + kv + kScratchBytes;
    checks.Expect(heap + gpu <= bound,
                  `heap ${(heap / MiB).toFixed(1)} MiB + GPU ${(gpu / MiB).toFixed(1)} MiB <= 1.15 x file ` +
                  `${(file / MiB).toFixed(1)} MiB + KV ${(kv / MiB).toFixed(2)} MiB + scratch ${kScratchBytes / MiB} MiB ` +
                  `= ${(bound / MiB).toFixed(1)} MiB (${(heap / file).toFixed(2)} x the file in the heap)`);
    const shown = await Text(page, '#st-heap');
    checks.Expect(shown.includes(`(${heap.toLocaleString('en-US')} B)`), `the page shows the heap: ${shown}`);
  } finally {
    await browser.close();
    server.close();
  }
}

await Main().catch((e) => checks.Fail(`${e.stack ?? e}`));
checks.Finish();
