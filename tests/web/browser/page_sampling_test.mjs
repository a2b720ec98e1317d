// The page's sampler settings reach kvq's sampler whole, in headless Chromium, on the WebAssembly
// path and the WebGPU path (SwiftShader) alike, with the bundled stories260K:
//   1. seeds past 32 bits (2^32 + 1, 2^53 - 1, and one past 2^53 given as its digits): a sampled
//      generation's ids equal native `kvq run --seed S`'s with the same settings, strictly, through
//      the hook and (2^32 + 1) through the form's seed field. The check can fail: native's ids for
//      S mod 2^32 (what a seed cut to 32 bits would draw) are required to differ from S's;
//   2. the form's penalty fields (repeat, frequency, presence, the window): the ids equal native
//      `kvq run --repeat-penalty ... --repeat-last-n ...`'s; with a logit bias typed in the form
//      ("ID:-100, ID:+2.5") the ids equal native `kvq run --logit-bias ID-100 --logit-bias ID:+2.5`'s
//      with those penalties, strictly, and so do the hook's given the bias as pairs; the token
//      biased by -100 never comes, and the ids differ from the run without the bias;
//   3. bad values (each penalty field out of range, a bias that is not ID:BIAS, an id outside the
//      vocabulary, a seed of 2^64) are refused beside the form naming the field and the value typed,
//      nothing runs (the last run's text and status stay), and every field keeps what was typed.
// Usage: node page_sampling_test.mjs BUNDLE_DIR KVQ_CLI PLAYWRIGHT_NPM_DIR
import {execFileSync} from 'node:child_process';
import path from 'node:path';

import {Checks, LaunchChromium, OpenPage, Serve, Text} from './browser_util.mjs';

const checks = new Checks('page_sampling_test');
const [bundle, kvq_cli, npm_dir] = process.argv.slice(2);
if (!bundle || !kvq_cli || !npm_dir) checks.Fatal('usage: page_sampling_test.mjs BUNDLE_DIR KVQ_CLI PLAYWRIGHT_NPM_DIR');

const kPrompt = 'Once upon a time';
const kNew = 24;
const kStories = ['-m', path.join(bundle, 'models/stories260K.bin'), '--tokenizer', path.join(bundle, 'models/tok512.bin')];
const kHot = {temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05};
// Seeds a 32-bit cut would change: 2^32 + 1 (cut: 1), 2^53 - 1 (the largest whole double), and
// 2^64 - 59 (past 2^53: only its digits carry it).
const kSeeds = [4294967297, 9007199254740991, '18446744073709551557'];
// Strong enough to change stories260K's ids at seed 2^32 + 1 within kNew tokens (checked below).
const kPenalties = {repeat_penalty: 1.5, frequency_penalty: 0.5, presence_penalty: 1.5, repeat_last_n: 32};

// Native `kvq run --json` with kHot's settings, the seed and `extra` flags, f32 KV, one thread.
function Native(seed, extra = []) {
  const out = execFileSync(kvq_cli, ['run', ...kStories, '--prompt', kPrompt, '-n', String(kNew), '--temp', '0.8',
                                     '--top-k', '40', '--top-p', '0.95', '--min-p', '0.05', '--seed', String(seed),
                                     '--kv', 'f32', '-t', '1', '--json', ...extra], {encoding: 'utf8'});
  return JSON.parse(out).tokens;
}
const NativePenaltyFlags = ['--repeat-penalty', '1.5', '--frequency-penalty', '0.5', '--presence-penalty', '1.5',
                            '--repeat-last-n', '32'];

const Generate = (page, opts) => page.evaluate((o) => window.kvqPage.generate(o),
                                               {prompt: kPrompt, kv_k: 'f32', max_tokens: kNew, ...kHot, ...opts});
// The page keeps an end token it stopped on in its ids; kvq run does not.
const RunIds = (r) => (r.end_token ? r.ids.slice(0, -1) : r.ids);
const Idle = (page) => page.waitForFunction(() => !['loading', 'running'].includes(document.getElementById('status').dataset.state) &&
                                                  !document.getElementById('generate').disabled);
const ErrorShown = (page) => page.$eval('#generate-error', (e) => (e.hidden ? null : e.querySelector('.msg').textContent));

async function LargeSeeds(page) {
  for (const seed of kSeeds) {
    const native = Native(seed);
    const cut = Native(BigInt(seed) & 0xffffffffn);
    checks.Expect(cut.join() !== native.join(), `seed ${seed}: native's ids differ from seed ${BigInt(seed) & 0xffffffffn}'s ` +
                  '(a seed cut to 32 bits would show)');
    for (const device of ['cpu', 'gpu']) {
      const r = await Generate(page, {seed, device});
      checks.Expect(r.path.device === device, `seed ${seed}: ran on ${device} (${JSON.stringify(r.path)})`);
      checks.SameIds(`seed ${seed}, ${device}: ids against kvq run --seed ${seed}`, RunIds(r), native);
    }
  }
}

// Fills the form's sampler fields (field id → value; the rest as kHot, f32 KV, kNew tokens) on
// `device` and runs it; returns the ids it shows.
async function FormRun(page, device, fields) {
  const all = {'prompt': kPrompt, 'temperature': '0.8', 'top-k': '40', 'top-p': '0.95', 'min-p': '0.05', 'seed': '',
               'max-tokens': String(kNew), 'kv-k': 'f32', 'kv-v': 'f32', 'stop-text': '', 'repeat-penalty': '1',
               'frequency-penalty': '0', 'presence-penalty': '0', 'repeat-last-n': '64', 'logit-bias': '', ...fields};
  for (const [id, value] of Object.entries(all)) await page.fill(`#${id}`, value);
  await page.selectOption('#device', device);
  await page.click('#generate');
  await Idle(page);
  const error = await ErrorShown(page);
  if (error) checks.Fail(`the form on ${device} with ${JSON.stringify(fields)}: ${error}`);
  return (await Text(page, '#ids')).split(' ').filter((s) => s !== '').map(Number);
}

async function FormSettings(page) {
  const seed = kSeeds[0];
  const penalties = {'repeat-penalty': '1.5', 'frequency-penalty': '0.5', 'presence-penalty': '1.5', 'repeat-last-n': '32'};
  const native_seed = Native(seed);
  const native_penalised = Native(seed, NativePenaltyFlags);
  checks.Expect(native_penalised.join() !== native_seed.join(), 'native: the penalties change the ids');
  // A bias: -100 on a token the penalised run generated, +2.5 on another; native takes them as
  // llama.cpp's TOKEN_ID-BIAS and as the form's TOKEN_ID:BIAS.
  const generated = native_penalised.slice(native_penalised.length - kNew);
  const [banned, favoured] = [generated[2], generated[7]];
  const bias_flags = ['--logit-bias', `${banned}-100`, '--logit-bias', `${favoured}:+2.5`];
  const native_biased = Native(seed, [...NativePenaltyFlags, ...bias_flags]);
  const typed = `${banned}:-100, ${favoured}:+2.5`;
  for (const device of ['cpu', 'gpu']) {
    const shown = await FormRun(page, device, {seed: String(seed)});
    // The page shows an end token it stopped on; kvq run does not list it.
    checks.SameIds(`the form, ${device}, seed ${seed}: ids against kvq run`, shown.slice(0, native_seed.length), native_seed);
    const penalised = await FormRun(page, device, {seed: String(seed), ...penalties});
    checks.SameIds(`the form, ${device}, penalties: ids against kvq run ${NativePenaltyFlags.join(' ')}`,
                   penalised.slice(0, native_penalised.length), native_penalised);
    const biased = await FormRun(page, device, {seed: String(seed), ...penalties, 'logit-bias': typed});
    checks.SameIds(`the form, ${device}, penalties and "${typed}": ids against kvq run ${bias_flags.join(' ')}`,
                   biased.slice(0, native_biased.length), native_biased);
    const hook = await Generate(page, {seed, device, ...kPenalties, logit_bias: [[banned, -100], [favoured, 2.5]]});
    checks.SameIds(`the hook, ${device}, penalties and the bias as pairs: ids against kvq run ${bias_flags.join(' ')}`,
                   RunIds(hook), native_biased);
    const n_prompt = hook.n_prompt;
    checks.Expect(!biased.slice(n_prompt).includes(banned) && biased.join() !== penalised.join(),
                  `the form, ${device}: the bias changes the ids and token ${banned} (-100) never comes`);
    if (device === 'cpu') {
      checks.Expect(!native_biased.slice(n_prompt).includes(banned) && native_biased.join() !== native_penalised.join(),
                    `native: ${bias_flags.join(' ')} changes the ids and token ${banned} never comes`);
    }
  }
}

async function BadValues(page) {
  const before = {text: await Text(page, '#text'), status: await Text(page, '#status')};
  // [field id, the value typed, the field's name in the error, what of the value the error shows]
  const cases = [['repeat-penalty', '0', 'Repeat penalty', '"0"'], ['repeat-penalty', '-1.5', 'Repeat penalty', '"-1.5"'],
                 ['frequency-penalty', '2.5', 'Frequency penalty', '"2.5"'], ['presence-penalty', '-3', 'Presence penalty', '"-3"'],
                 ['repeat-last-n', '-2', 'Penalty window', '"-2"'], ['repeat-last-n', '1.5', 'Penalty window', '"1.5"'],
                 ['logit-bias', '15=-100', 'Logit bias', '"15=-100"'], ['logit-bias', '9999:1', 'Logit bias', 'token 9999'],
                 ['logit-bias', '7:+2.5, 8:x', 'Logit bias', '"8:x"'],
                 ['seed', '18446744073709551616', 'Seed', '"18446744073709551616"']];
  for (const [id, bad, name, shows] of cases) {
    await page.fill('#prompt', 'A prompt typed before the bad value');
    await page.fill(`#${id}`, bad);
    const typed = await page.$$eval('#gen-form input, #gen-form textarea', (all) => all.map((e) => [e.id, e.value]));
    await page.click('#generate');
    const error = await ErrorShown(page);
    checks.Expect(error && error.startsWith(`${name}:`) && error.includes(shows),
                  `#${id} "${bad}" is refused naming the field and the value: ${error}`);
    const after = {text: await Text(page, '#text'), status: await Text(page, '#status')};
    checks.Expect(after.text === before.text && after.status === before.status,
                  `#${id} "${bad}": nothing ran (the last run's text and status stay)`);
    const kept = await page.$$eval('#gen-form input, #gen-form textarea', (all) => all.map((e) => [e.id, e.value]));
    checks.Expect(JSON.stringify(kept) === JSON.stringify(typed), `#${id} "${bad}": every field keeps what was typed`);
    await page.click('#generate-error .dismiss');
    await page.fill(`#${id}`, {'repeat-penalty': '1', 'frequency-penalty': '0', 'presence-penalty': '0',
                               'repeat-last-n': '64', 'logit-bias': '', 'seed': ''}[id]);
  }
}

async function Main() {
  const {server, base} = await Serve(checks, bundle);
  const browser = await LaunchChromium(checks, npm_dir);
  try {
    const {page, info} = await OpenPage(checks, browser, base, '');
    if (!info.gpu) checks.Fail(`no WebGPU adapter (${info.gpu_why_not}), though Chromium runs with SwiftShader's`);
    await LargeSeeds(page);
    await FormSettings(page);
    await BadValues(page);
  } finally {
    await browser.close();
    server.close();
  }
}

await Main().catch((e) => checks.Fail(`${e.stack ?? e}`));
checks.Finish();
