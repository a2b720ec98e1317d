// The page's state as a user meets it, in headless Chromium (index.html?gpu=0, the WebAssembly path):
// a failed load keeps the old model usable (Generate works after it, same ids) and says why beside
// the load buttons; errors are in user words and dismissable; a picked model's load reports
// progress as a share of its bytes from the click on, strictly increasing to 100%, clears the previous run's numbers
// and lists the KV formats for its head size; Stop during a 1,000-token prefill answers within one block; rates
// have decimals; ?threads=1 and ?gpu=0 say what they turned off. A screenshot of each state is
// saved in the test's temp folder, its path printed, and the folder kept only when a check failed.
// Usage: node page_state_test.mjs BUNDLE_DIR KVQ_CLI PLAYWRIGHT_NPM_DIR
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import {Checks, LaunchChromium, OpenPage, Serve, Synth, Text} from './browser_util.mjs';

const checks = new Checks('page_state_test');
const [bundle, kvq_cli, npm_dir] = process.argv.slice(2);
if (!bundle || !kvq_cli || !npm_dir) checks.Fatal('usage: page_state_test.mjs BUNDLE_DIR KVQ_CLI PLAYWRIGHT_NPM_DIR');
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), `kvq-page-state-${process.pid}-`));
checks.Log(`screenshots and models in ${tmp} (removed if every check passes)`);

// A llama of head size 128 (the bundled model's is 8), 2,048 positions (room for a 1,000-token
// prompt), q4_0: a few MiB, so its load takes several 1 MiB chunks.
const kSynthArgs = ['--arch', 'llama', '--dim', '512', '--layers', '4', '--heads', '4', '--kv-heads', '2',
                    '--ffn', '1024', '--context', '2048', '--type', 'q4_0'];
const kBlock = 64;  // kvq's prefill block (kPrefillBlock, kvq/session.h)

let shot = 0;
async function Screenshot(page, what) {
  const file = path.join(tmp, `${String(++shot).padStart(2, '0')}-${what}.png`);
  await page.screenshot({path: file, fullPage: true});
  checks.Log(`screenshot (${what}): ${file}`);
}

const Idle = (page) => page.waitForFunction(() => !['loading', 'running'].includes(document.getElementById('status').dataset.state));
const ErrorShown = (page, where) => page.$eval(`#${where}-error`, (e) => (e.hidden ? null : e.querySelector('.msg').textContent));

// Picks `file` in the model input and clicks Load; resolves when the page is idle again.
async function LoadPicked(page, file) {
  await page.setInputFiles('#model-file', file);
  await page.click('#load-picked');
  await Idle(page);
}

async function FailedLoadKeepsTheModel(page, before) {
  // A GGUF magic and nothing sensible after it: the picker lets it through, kvq refuses it.
  const broken = path.join(tmp, 'broken.gguf');
  fs.writeFileSync(broken, Buffer.concat([Buffer.from('GGUF'), Buffer.alloc(4096, 0xab)]));
  await LoadPicked(page, broken);
  const error = await ErrorShown(page, 'load');
  checks.Expect(error && error.includes('broken.gguf'), `a failed load says why beside the load buttons: ${error}`);
  checks.Expect(await Text(page, '#model-name') === 'stories260K.bin', 'the model in use is still stories260K.bin');
  checks.Expect(!await page.$eval('#generate', (e) => e.disabled), 'Generate stays enabled');
  checks.Expect(await Text(page, '#st-decode') !== '–', "the last run's numbers stay (the model did not change)");
  await Screenshot(page, 'failed-load');
  const after = await page.evaluate(() => window.kvqPage.generate({prompt: 'Once upon a time', max_tokens: 40}));
  checks.SameIds('Generate after the failed load', after.ids, before.ids);
  await page.click('#load-error .dismiss');
  checks.Expect(await ErrorShown(page, 'load') === null, 'the load error is dismissed');
}

async function BadFormatInUserWords(page) {
  await page.fill('#kv-k', 'bogus');
  await page.click('#generate');
  await Idle(page);
  const error = await ErrorShown(page, 'generate');
  checks.Expect(error && /K format "bogus"/.test(error) && !error.includes('::'),
                `an unknown K format is named as the form names it, no C++ names: ${error}`);
  await Screenshot(page, 'bad-format');
  await page.click('#generate-error .dismiss');
  await page.fill('#kv-k', 'f16');
}

async function LoadSynth(page, synth, formats_before) {
  // Every status line from the click on, recorded as it is set (the load may end before a poll).
  await page.evaluate(() => {
    window.status_lines = [];
    new MutationObserver(() => window.status_lines.push(document.getElementById('status').textContent))
        .observe(document.getElementById('status'), {childList: true, characterData: true, subtree: true});
  });
  await LoadPicked(page, synth);
  const progress = await page.evaluate(() => window.kvqPage.loadProgress());
  const increasing = progress.every((p, i) => i === 0 || p > progress[i - 1]);
  checks.Expect(progress.length >= 3 && increasing && progress.at(-1) === 100,
                `load progress strictly increasing to 100%: ${progress.join(', ')}`);
  const lines = await page.evaluate(() => window.status_lines);
  checks.Expect(/^Loading .*: 0%$/.test(lines[0] ?? ''),
                `the first status after the click is a percentage, before any byte is read: "${lines[0]}"`);
  checks.Expect(await Text(page, '#model-name') === path.basename(synth), 'the picked model is in use');
  const cleared = await page.$$eval('#st-prefill, #st-decode, #st-positions, #st-kv-held, #text',
                                    (all) => all.map((e) => e.textContent));
  checks.Expect(cleared.every((t) => t === '–' || t === ''), `the previous model's numbers are cleared: ${JSON.stringify(cleared)}`);
  const formats = await page.evaluate(() => window.kvqPage.formats());
  const list = await Text(page, '#format-list');
  const differ = formats.filter((f) => formats_before.find((g) => g.name === f.name)?.bits_per_value !== f.bits_per_value);
  checks.Expect(list.includes('head size 128') && differ.length > 0,
                `the format list is for head size 128 (${differ.length} of ${formats.length} formats differ from head size 8)`);
  await Screenshot(page, 'synth-loaded');
}

async function StopDuringPrefill(page) {
  const prompt = 'Once upon a time there was a little dog. '.repeat(95);
  const n = (await page.evaluate((p) => window.kvqPage.tokenize(p), prompt)).length;
  checks.Expect(n >= 1000 && n < 2048, `the long prompt has ${n} tokens`);
  await page.evaluate((p) => {
    window.prefill_seen = 0;
    window.long_run = window.kvqPage.generate({prompt: p, max_tokens: 8});
  }, prompt);
  // Stop once two blocks have run, reading how many the page has seen at that moment.
  await page.waitForFunction(() => /^[\d,]+ of/.test(document.getElementById("st-prefill").textContent) &&
                                   Number(/^([\d,]+) of/.exec(document.getElementById("st-prefill").textContent)[1].replace(/,/g, "")) >= 128);
  const at_stop = await page.evaluate(() => {
    const held = Number(/^([\d,]+) of/.exec(document.getElementById('st-prefill').textContent)[1].replace(/,/g, ''));
    window.stop_ms = performance.now();
    window.kvqPage.stop();
    return held;
  });
  const r = await page.evaluate(() => window.long_run.then((r) => ({...r, answer_ms: performance.now() - window.stop_ms})));
  const t = r.timing;
  checks.Expect(r.stopped && r.finish_reason === 'cancelled' && t.n_prompt_held < t.n_prompt &&
                t.n_prompt_held - at_stop <= kBlock,
                `Stop at ${at_stop} of ${t.n_prompt} prompt tokens: "${r.finish_reason}", ${t.n_prompt_held} held (at most one ` +
                `block of ${kBlock} more), answered in ${r.answer_ms.toFixed(0)} ms; a block took ` +
                `${(t.prefill_ms / (t.n_prompt_held / kBlock)).toFixed(0)} ms`);
  await Screenshot(page, 'stopped-in-prefill');
}

async function Main() {
  const synth = Synth(kvq_cli, tmp, 'synth-llama-h128.gguf', kSynthArgs);
  const {server, base} = await Serve(checks, bundle);
  const browser = await LaunchChromium(checks, npm_dir);
  try {
    const {page, info} = await OpenPage(checks, browser, base, '?gpu=0');
    checks.Expect(info.gpu === null && /\?gpu=0/.test(info.gpu_why_not), `?gpu=0: no GPU (${info.gpu_why_not})`);
    const formats_before = await page.evaluate(() => window.kvqPage.formats());
    const before = await page.evaluate(() => window.kvqPage.generate({prompt: 'Once upon a time', max_tokens: 40}));
    const decode = await Text(page, '#st-decode');
    checks.Expect(/^(\d+\.\d{1,2}|\d{3,}) tok\/s/.test(decode), `rates have decimals below 100 tok/s: ${decode}`);
    await Screenshot(page, 'stories-run');
    await FailedLoadKeepsTheModel(page, before);
    await BadFormatInUserWords(page);
    await LoadSynth(page, synth, formats_before);
    await StopDuringPrefill(page);

    const one = await OpenPage(checks, browser, base, '?threads=1&gpu=0');
    checks.Expect(one.info.threads === 1 && /\?threads=1/.test(one.info.threads_why_not),
                  `?threads=1: one thread (${one.info.threads_why_not})`);
    checks.Expect((await Text(one.page, '#st-path')).includes('one thread'), 'the page says it runs one thread and why');
  } finally {
    await browser.close();
    server.close();
  }
}

await Main().catch((e) => checks.Fail(`${e.stack ?? e}`));
// The screenshots and models stay for a look only when something failed.
if (!checks.failures.length) fs.rmSync(tmp, {recursive: true, force: true});
checks.Finish();
