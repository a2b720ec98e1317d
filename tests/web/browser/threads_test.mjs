// The page's threaded build in headless Chromium: served cross-origin isolated (tools/serve_web.mjs)
// it runs kvq-threads.js with a thread per core; greedy ids with 2 threads equal 1 thread's and
// native `kvq run`'s on a small synth (a prompt of several prefill blocks); tok/s of 2 threads
// against 1, one run each in the same page, is printed, not asserted (the machine is shared: a
// figure for the record, not a measurement, so it gets no repeats of its own). Served
// without the headers, the page runs the one-thread kvq.js and says why.
// Usage: node threads_test.mjs BUNDLE_DIR KVQ_CLI PLAYWRIGHT_NPM_DIR
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import {Checks, LaunchChromium, NativeIds, OpenPage, Serve, Synth} from './browser_util.mjs';

const checks = new Checks('threads_test');
const [bundle, kvq_cli, npm_dir] = process.argv.slice(2);
if (!bundle || !kvq_cli || !npm_dir) checks.Fatal('usage: threads_test.mjs BUNDLE_DIR KVQ_CLI PLAYWRIGHT_NPM_DIR');
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), `kvq-threads-${process.pid}-`));
process.on('exit', () => fs.rmSync(tmp, {recursive: true, force: true}));

// A qwen3 (grouped KV, head norms) of 8 MiB or so: matrices large enough for the pool to split.
const kSynthArgs = ['--arch', 'qwen3', '--dim', '512', '--layers', '4', '--heads', '8', '--kv-heads', '4',
                    '--head-dim', '64', '--ffn', '1536', '--context', '1024', '--type', 'q4_0'];
const kPrompt = 'Once upon a time there was a little dog who liked to run in the park. '.repeat(8);
const kNew = 48;
// int8 KV: its scores are exact integer dots. With f16 keys (f32 scores) this run's ids left native's
// AVX-512 ones at the second generated token, threads 1 and 2 alike: the f32 sums follow the SIMD width.
const kKv = 'int8';

async function Main() {
  const synth = Synth(kvq_cli, tmp, 'synth-qwen3.gguf', kSynthArgs);
  const browser = await LaunchChromium(checks, npm_dir);
  const isolated = await Serve(checks, bundle, true);
  const plain = await Serve(checks, bundle, false);
  try {
    const {page, info} = await OpenPage(checks, browser, isolated.base, '?gpu=0');
    const cores = await page.evaluate(() => navigator.hardwareConcurrency);
    checks.Expect(cores < 2 || (info.module === 'kvq-threads.js' && info.threads === cores),
                  `cross-origin isolated: ${info.module} with ${info.threads} threads (${cores} cores reported)`);
    await page.setInputFiles('#model-file', synth);
    await page.click('#load-picked');
    await page.waitForFunction(() => document.getElementById('status').dataset.state !== 'loading');
    const n_prompt = (await page.evaluate((p) => window.kvqPage.tokenize(p), kPrompt)).length;
    checks.Expect(n_prompt > 2 * 64, `the prompt has ${n_prompt} tokens (over two prefill blocks)`);
    const native = NativeIds(kvq_cli, synth, kPrompt, kNew, {kv: kKv});
    const rates = {};
    for (const threads of [1, 2]) {
      if (threads > info.threads) continue;
      const r = await page.evaluate((o) => window.kvqPage.generate(o),
                                    {prompt: kPrompt, max_tokens: kNew, threads, kv_k: kKv});
      checks.SameIds(`${threads} thread(s) vs native kvq run -t 1`, r.ids, native);
      rates[threads] = {prefill: r.timing.n_prompt / r.timing.prefill_ms * 1000,
                        decode: r.timing.n_generated / r.timing.decode_ms * 1000};
    }
    if (info.threads >= 2) {
      const line = (what) => `${what} ${rates[1][what].toFixed(1)} -> ${rates[2][what].toFixed(1)} tok/s ` +
                             `(${(rates[2][what] / rates[1][what]).toFixed(2)}x)`;
      checks.Log(`1 -> 2 threads, one run each (printed, not asserted: the machine is shared): ` +
                 `${line('prefill')}, ${line('decode')}`);
    }

    const one = await OpenPage(checks, browser, plain.base, '?gpu=0');
    checks.Expect(one.info.module === 'kvq.js' && one.info.threads === 1 && /isolated/.test(one.info.threads_why_not),
                  `without COOP/COEP: ${one.info.module}, one thread (${one.info.threads_why_not})`);
  } finally {
    await browser.close();
    isolated.server.close();
    plain.server.close();
  }
}

await Main().catch((e) => checks.Fail(`${e.stack ?? e}`));
checks.Finish();
