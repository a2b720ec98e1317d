// A picked model is held once, in headless Chromium: a synth (q4_0), picked in the page and read
// into the module a chunk at a time, then run for a few tokens: the WebAssembly heap + GPU buffers
// stay within 1.15 x the file + the KV bytes + a stated scratch (the page used to hold 2.3 x the
// file in its heap alone), and the page shows those figures and that bound.
// ctest runs a 68 MiB llama (seconds); `--preset qwen3-0.6b` runs the 325 MiB case by hand.
// Usage: node memory_test.mjs BUNDLE_DIR KVQ_CLI PLAYWRIGHT_NPM_DIR [--preset NAME]
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import {Checks, LaunchChromium, NativeIds, OpenPage, Serve, Synth, Text} from './browser_util.mjs';

const checks = new Checks('memory_test');
const [bundle, kvq_cli, npm_dir, preset_flag, preset] = process.argv.slice(2);
if (!bundle || !kvq_cli || !npm_dir || (preset_flag !== undefined && (preset_flag !== '--preset' || !preset))) {
  checks.Fatal('usage: memory_test.mjs BUNDLE_DIR KVQ_CLI PLAYWRIGHT_NPM_DIR [--preset NAME]');
}
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), `kvq-memory-${process.pid}-`));
process.on('exit', () => fs.rmSync(tmp, {recursive: true, force: true}));

const MiB = 1024 * 1024;
// A llama of 68 MiB (q4_0), small enough to load and run in seconds, large enough that a second
// copy of it (68 MiB) cannot hide in the bound's slack (0.15 x 68 + the page's scratch, 48 MiB).
// Tied embeddings, as qwen3-0.6b's: the classifier is repacked over the embedding's bytes and the
// embedding read from them (RepackWeightsInPlace), so the ids are checked against native kvq run's.
const kSmallArgs = ['--arch', 'llama', '--dim', '1024', '--layers', '10', '--heads', '8', '--kv-heads', '4',
                    '--ffn', '3072', '--context', '512', '--type', 'q4_0', '--embeddings', 'tied'];
const kPrompt = 'Once upon a time';
const kNew = 8;
const kKv = 'int8';  // exact integer scores: the page's ids are native's (threads_test.mjs says why)

async function Main() {
  const [name, args] = preset ? [`${preset}-q4_0.gguf`, ['--preset', preset, '--type', 'q4_0']]
                              : ['llama-68mib-q4_0.gguf', kSmallArgs];
  const synth = Synth(kvq_cli, tmp, name, args);
  const file = fs.statSync(synth).size;
  const {server, base} = await Serve(checks, bundle);
  const browser = await LaunchChromium(checks, npm_dir);
  try {
    const {page, info} = await OpenPage(checks, browser, base, '?gpu=0');
    const scratch = info.memory_scratch_bytes;
    checks.Expect(Number.isInteger(scratch) && scratch > 0, `the page states its scratch: ${scratch} bytes`);
    const t_load = Date.now();
    await page.setInputFiles('#model-file', synth);
    await page.click('#load-picked');
    await page.waitForFunction(() => document.getElementById('status').dataset.state !== 'loading', null,
                               {timeout: 240000});
    checks.Expect(await Text(page, '#model-name') === path.basename(synth),
                  `${path.basename(synth)} (${(file / MiB).toFixed(1)} MiB) loaded in ${Date.now() - t_load} ms`);
    const r = await page.evaluate(([prompt, n, kv]) => window.kvqPage.generate({prompt, max_tokens: n, kv_k: kv}),
                                  [kPrompt, kNew, kKv]);
    checks.SameIds(`${path.basename(synth)}: the page vs native kvq run`, r.ids,
                   NativeIds(kvq_cli, synth, kPrompt, kNew, {kv: kKv}));
    const heap = r.stats.heap_bytes;
    const g = r.stats.gpu;
    const gpu = g ? g.weight_bytes + (g.kv_gpu_bytes ?? r.stats.session.device_bytes) : 0;
    const kv = r.stats.session.kv_bytes;
    const bound = 1.15 * file + kv + scratch;
    checks.Expect(heap + gpu <= bound,
                  `heap ${(heap / MiB).toFixed(1)} MiB + GPU ${(gpu / MiB).toFixed(1)} MiB <= 1.15 x file ` +
                  `${(file / MiB).toFixed(1)} MiB + KV ${(kv / MiB).toFixed(2)} MiB + scratch ${scratch / MiB} MiB ` +
                  `= ${(bound / MiB).toFixed(1)} MiB (${(heap / file).toFixed(3)} x the file in the heap)`);
    const shown = await Text(page, '#st-heap');
    checks.Expect(shown.includes(`(${heap.toLocaleString('en-US')} B)`), `the page shows the heap: ${shown}`);
    const held = await Text(page, '#st-held');
    checks.Expect(held.includes(`${scratch / MiB} MiB`) && held.includes('within'),
                  `the page shows the sum against the bound, its scratch stated: ${held}`);
  } finally {
    await browser.close();
    server.close();
  }
}

await Main().catch((e) => checks.Fail(`${e.stack ?? e}`));
checks.Finish();
