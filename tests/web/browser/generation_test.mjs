// The page's completions end by kvq's own rules (the module's Generator: web/worker.js keeps no
// generation rule of its own), on the WebAssembly path and the WebGPU path alike, in headless
// Chromium: a stop string ends the bundled stories260K's greedy text with native `kvq run --stop`'s
// text, tokens and finish reason (through the hook, and through the form, whose status names the
// finish); an end token ends it with "stop" (with ignore_eos it is kept and the run goes on), max
// tokens with "length", and on a synth of 40 positions a full context with "context", each as
// `kvq run` reports it. Bad stop strings are refused naming the field, before the prompt runs.
// A chat's turns on the GPU path keep the conversation in the cache (GpuChat below).
// Usage: node generation_test.mjs BUNDLE_DIR KVQ_CLI PLAYWRIGHT_NPM_DIR
import {execFileSync} from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import {Checks, LaunchChromium, OpenPage, Serve, Synth, Text} from './browser_util.mjs';

const checks = new Checks('generation_test');
const [bundle, kvq_cli, npm_dir] = process.argv.slice(2);
if (!bundle || !kvq_cli || !npm_dir) checks.Fatal('usage: generation_test.mjs BUNDLE_DIR KVQ_CLI PLAYWRIGHT_NPM_DIR');
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), `kvq-generation-${process.pid}-`));
process.on('exit', () => fs.rmSync(tmp, {recursive: true, force: true}));

const kPrompt = 'Once upon a time';
const kStories = ['-m', path.join(bundle, 'models/stories260K.bin'), '--tokenizer', path.join(bundle, 'models/tok512.bin')];
// A llama small enough that 40 positions fill its context within a second on either path; q8_0
// matrices, which the GPU path reads.
const kSynthContext = 40;
const kSynthArgs = ['--arch', 'llama', '--dim', '64', '--layers', '2', '--heads', '4', '--kv-heads', '2',
                    '--ffn', '128', '--context', String(kSynthContext), '--type', 'q8_0'];

// Native `kvq run --json`, greedy, f32 KV (as the page runs below), one thread.
function Native(model_args, prompt, n, extra = []) {
  const out = execFileSync(kvq_cli, ['run', ...model_args, '--prompt', prompt, '--temp', '0', '-n', String(n),
                                     '--kv', 'f32', '-t', '1', '--json', ...extra], {encoding: 'utf8'});
  return JSON.parse(out);
}

const Generate = (page, opts) => page.evaluate((o) => window.kvqPage.generate(o), {kv_k: 'f32', ...opts});

// The page's run against native's: the ids (the page keeps an end token it stopped on, kvq run
// does not), the completion's text and the finish reason, strictly equal.
function SameRun(what, r, native, device) {
  checks.Expect(r.path?.device === device, `${what}: ran on ${device} (${JSON.stringify(r.path)})`);
  checks.SameIds(`${what}: ids`, r.end_token ? r.ids.slice(0, -1) : r.ids, native.tokens);
  const Show = (t) => JSON.stringify(t.length > 48 ? `${t.slice(0, 48)}…` : t) + ` (${t.length} chars)`;
  checks.Expect(r.completion === native.completion, `${what}: text ${Show(r.completion)} ` +
                (r.completion === native.completion ? "equals kvq run's" : `(kvq run: ${Show(native.completion)})`));
  checks.Expect(r.finish_reason === native.finish_reason,
                `${what}: finish_reason ${r.finish_reason} (kvq run: ${native.finish_reason})`);
  checks.Expect(r.text.endsWith(r.completion), `${what}: the page's text ends with the completion`);
}

async function StopStrings(page) {
  // Stop strings taken from the unstopped text, so that they occur (and likely span tokens).
  const free_run = Native(kStories, kPrompt, 60);
  const text = free_run.completion;
  if (text.length < 40) checks.Fatal(`kvq run's 60 tokens gave only ${JSON.stringify(text)}`);
  const stop = [text.slice(30, 34), text.slice(14, 17)];
  const native = Native(kStories, kPrompt, 60, stop.flatMap((s) => ['--stop', s]));
  checks.Expect(native.finish_reason === 'stop' && native.completion.length < text.length,
                `kvq run --stop ${JSON.stringify(stop)}: "${native.finish_reason}" after ${native.completion.length} ` +
                `of ${text.length} chars`);
  for (const device of ['cpu', 'gpu']) {
    const r = await Generate(page, {prompt: kPrompt, max_tokens: 60, stop, device});
    SameRun(`${device}, stop ${JSON.stringify(stop)}`, r, native, device);
    checks.Expect(!r.end_token && !stop.some((s) => r.completion.includes(s)), `${device}: no stop string is shown`);
  }
  // The form: its stop field, and the status naming the finish.
  const hook = await Generate(page, {prompt: kPrompt, max_tokens: 60, stop: [stop[0]], device: 'cpu'});
  const one = Native(kStories, kPrompt, 60, ['--stop', stop[0]]);
  SameRun(`cpu, stop ${JSON.stringify(stop[0])}`, hook, one, 'cpu');
  await page.fill('#prompt', kPrompt);
  await page.fill('#temperature', '0');
  await page.fill('#max-tokens', '60');
  await page.fill('#kv-k', 'f32');
  await page.fill('#kv-v', 'f32');
  await page.fill('#stop-text', stop[0]);
  await page.selectOption('#device', 'cpu');
  await page.click('#generate');
  await page.waitForFunction(() => ['done', 'error'].includes(document.getElementById('status').dataset.state) &&
                                   !document.getElementById('generate').disabled);
  const status = await Text(page, '#status');
  checks.Expect(/finish: stop, a stop string/.test(status), `the form's run says why it ended: "${status}"`);
  checks.Expect(await Text(page, '#text') === hook.text, `the form's run shows the hook's text: ${JSON.stringify(hook.text)}`);
  await page.fill('#stop-text', '');
}

async function EndTokenAndLength(page) {
  // Greedy "Once" ends its story with an end token within 400 tokens (kvq's CLI test says so too).
  const ended = Native(kStories, 'Once', 400);
  checks.Expect(ended.finish_reason === 'stop', `kvq run "Once" -n 400: ${ended.finish_reason}`);
  const r = await Generate(page, {prompt: 'Once', max_tokens: 400, device: 'cpu'});
  SameRun('cpu, end token', r, ended, 'cpu');
  checks.Expect(r.end_token && r.ids.length === ended.tokens.length + 1, 'cpu: the end token is in the ids, as run.c keeps it');
  // ignore_eos: the end token is kept like any token and the run goes on to max tokens.
  const on = await Generate(page, {prompt: 'Once', max_tokens: 400, ignore_eos: true, device: 'cpu'});
  checks.Expect(on.finish_reason === 'length' && !on.end_token && on.ids.length === on.n_prompt + 400 &&
                r.ids.every((id, i) => on.ids[i] === id),
                `cpu, ignore_eos: "${on.finish_reason}" after ${on.ids.length - r.n_prompt} tokens, the end token kept`);
  const short = Native(kStories, kPrompt, 7);
  for (const device of ['cpu', 'gpu']) {
    SameRun(`${device}, 7 tokens`, await Generate(page, {prompt: kPrompt, max_tokens: 7, device}), short, device);
  }
}

async function BadOptions(page) {
  for (const [stop, field] of [[[''], 'stop[0]'], [['a', 3], 'stop[1]'], ['text', 'stop']]) {
    const error = await Generate(page, {prompt: kPrompt, max_tokens: 4, stop, device: 'cpu'}).then(
        () => null, (e) => e.message);
    checks.Expect(error && error.includes(field) && !error.includes('::'),
                  `stop ${JSON.stringify(stop)} is refused naming ${field}: ${error}`);
  }
  await page.click('#generate-error .dismiss');
}

async function FullContext(page, synth) {
  await page.setInputFiles('#model-file', synth);
  await page.click('#load-picked');
  await page.waitForFunction(() => document.getElementById('status').dataset.state !== 'loading');
  checks.Expect(await Text(page, '#model-name') === path.basename(synth), 'the synth is loaded');
  const native = Native(['-m', synth], kPrompt, 100);
  checks.Expect(native.finish_reason === 'context' && native.tokens.length === kSynthContext + 1,
                `kvq run on ${kSynthContext} positions: "${native.finish_reason}", ${native.tokens.length} ids`);
  for (const device of ['cpu', 'gpu']) {
    const r = await Generate(page, {prompt: kPrompt, max_tokens: 100, device});
    SameRun(`${device}, full context`, r, native, device);
    checks.Expect(r.context_full, `${device}: context_full is set with finish_reason context`);
    // n_positions counts BOS and the prompt, as run.c's -n: 30 positions end with "length".
    const n = await Generate(page, {prompt: kPrompt, n_positions: 30, device});
    checks.Expect(n.finish_reason === 'length' && n.ids.length === 30,
                  `${device}: n_positions 30 gives ${n.ids.length} ids, "${n.finish_reason}"`);
  }
}

// A chat on the GPU path (device 'gpu' asked for each turn, as the chat page's in-tab runtime on
// ?gpu=1 takes it: the worker's generate in chat mode) with the bundled stories260K and ChatML-like
// turns as plain text: three turns, then one that edits turn 2's message. Each turn keeps what the
// held sequence shares with its prompt and prefills only the rest (timing.n_reused, and the GPU's
// own count of prefilled tokens); each turn's ids equal a fresh sequence's over the same prompt
// (greedy), bit for bit (the mixed path, which must be the resident one bit for bit, against the
// resident path's fresh sequences). The turns cross the 256-position page of the cache, and the
// edit goes back into a page already written behind to the master, so the truncation cuts the
// master and the GPU-resident pages both, and the edit's reply fills that page again (written
// behind anew). On three KV paths: resident (f32), mixed (a device budget that keeps 1 page per
// layer resident: the edit brings an evicted page back from the master) and stream
// (int4-kivi+rot, which streams: the GPU encoders do not rotate grouped keys, kv_resident_specs.js's
// ResidentWhyNot; the master alone is cut, down to a whole
// 32-key group where the edit splits one).
// Each turn's length is the fewest tokens that still reach its point (every turn is decoded twice
// on SwiftShader, the chat and its fresh reference): turn 1 (46 prompt ids + 100) leaves the edit's
// cut at 176 < 256; turn 2 (58 more + 60) ends at 264, past the page; turn 3 only needs to leave
// more held than the edit shares (8 tokens); the edit (61 more + 60) ends at 267, past the page
// again. The checks below assert each of these, so a change that moves them fails, never passes.
const kChatTurns = [['Once upon a time', 100], ['Tell me about the cat.', 60], ['What did the dog do?', 8]];
const kChatEdit = ['Tell me about the big red ball.', 60];  // replaces turn 2's message
const User = (text) => `<|im_start|>user\n${text}<|im_end|>\n<|im_start|>assistant\n`;
// stories260K: 5 layers, 4 KV heads of 8 dims, so a page of 256 f32 positions holds K and V of
// 256 · 32 · 4 · 2 = 64 KiB; a budget of 2 streaming slots and 5 pages keeps one page per layer.
const kMixedBudget = (2 + 5) * 65536;
const kKiviGroup = 32;  // int4-kivi's key groups (src/formats/kivi/kivi.h's kKiviGroupRows)

// Returns {where, prompts, fresh}: the arm's name, the turns' prompts and the fresh sequences' ids over them. With
// `references` (another arm's return) no fresh sequences are run: this arm's prompts must be that
// arm's and its ids that arm's fresh ids, which holds where the two paths are bit for bit the same.
async function GpuChat(page, kv_k, budget, want_path, references = null) {
  const where = `${kv_k}${budget ? `, budget ${budget}` : ''}`;
  const Turn = (prompt, max_tokens) => Generate(page, {
    prompt, max_tokens, device: 'gpu', chat: true, kv_k, device_budget_bytes: budget});
  // The conversation: the prompts as the chat page renders them (each turn the whole of it).
  const turns = [];
  let history = '';
  const prompts = [];
  for (const [k, [text, n]] of kChatTurns.entries()) {
    const prompt = history + User(text);
    prompts.push([prompt, n]);
    const r = await Turn(prompt, n);
    turns.push(r);
    history = prompt + r.completion + '<|im_end|>\n';
    checks.Expect(r.path.device === 'gpu' && r.stats.gpu.kv_path === want_path &&
                  (want_path !== 'mixed' || /newest 1 page /.test(r.stats.gpu.kv_path_why)),
                  `${where}, turn ${k + 1}: on the GPU's ${r.stats.gpu.kv_path} path (${r.stats.gpu.kv_path_why})`);
  }
  // The edit: turn 2's message replaced, after turn 3 (a shorter common prefix than what is held).
  const edited = prompts[0][0] + turns[0].completion + '<|im_end|>\n' + User(kChatEdit[0]);
  prompts.push([edited, kChatEdit[1]]);
  turns.push(await Turn(edited, kChatEdit[1]));
  checks.Expect(turns[0].stats.gpu.sequence === 'new', `${where}, turn 1: a new sequence (${turns[0].stats.gpu.sequence_why})`);
  for (let k = 1; k < turns.length; ++k) {
    const before = turns[k - 1], r = turns[k], t = r.timing, what = `${where}, ${k === 3 ? 'the edit' : `turn ${k + 1}`}`;
    // What the sequence held after the last turn (its prompt and the tokens it ran) against this prompt.
    const held = before.ids.slice(0, before.stats.session.positions);
    const prompt_ids = r.ids.slice(0, t.n_prompt);
    let common = 0;
    while (common < held.length && held[common] === prompt_ids[common]) ++common;
    const expected = Math.min(common, t.n_prompt - 1);
    const cut = expected < held.length;  // the edit goes back into what the sequence held
    // The stream path's master drops rows to KvCache::TruncationPoint: a whole KIVI key group.
    const exact = want_path !== 'stream' || !cut;
    checks.Expect(r.stats.gpu.sequence === 'kept' && (exact ? t.n_reused === expected :
                  t.n_reused <= expected && expected - t.n_reused < kKiviGroup),
                  `${what}: ${t.n_reused} of ${t.n_prompt} prompt tokens reused (${common} shared with the ${held.length} held)`);
    checks.Expect(r.stats.gpu.prefill.tokens === t.n_prompt - t.n_reused && t.n_prompt_held === t.n_prompt,
                  `${what}: the GPU prefilled ${r.stats.gpu.prefill.tokens} tokens, the prompt's ${t.n_prompt} less those reused`);
    if (k < 3) {
      checks.Expect(t.n_reused >= before.timing.n_prompt,
                    `${what}: the last prompt's ${before.timing.n_prompt} tokens are all reused (${t.n_reused})`);
    } else {
      checks.Expect(cut && held.length > 256 && expected < 256 && t.n_reused > 0,
                    `${what}: the sequence is cut back from ${held.length} to ${t.n_reused} positions, into a written-behind page`);
    }
  }
  const Name = (k) => `${where}, ${k === 3 ? 'the edit' : `turn ${k + 1}`}`;
  // The edit's reply runs past the page it was cut into, so that page is written behind anew.
  checks.Expect(turns[3].ids.length > 256, `${Name(3)}: the reply ends at ${turns[3].ids.length} positions, past the page`);
  // Another budget (or KV spec) in between makes the next generation start anew.
  const Other = () => Generate(page, budget ? {prompt: 'x', max_tokens: 1, device: 'gpu', chat: true, kv_k,
                                               device_budget_bytes: 0} :
                                              {prompt: 'x', max_tokens: 1, device: 'gpu', chat: true, kv_k: 'f16'});
  const ExpectOtherIsNew = (other, what) =>
    checks.Expect(other.stats.gpu.sequence === 'new' && /differ/.test(other.stats.gpu.sequence_why),
                  `${what}: another ${budget ? 'budget' : 'KV spec'} starts a new sequence (${other.stats.gpu.sequence_why})`);
  if (references) {
    // The mixed path is bit for bit the resident one (web.gpu_kv_mixed checks it for every format),
    // so this chat must have the same prompts and the resident arm's fresh ids: running fresh
    // sequences again here would only repeat them.
    ExpectOtherIsNew(await Other(), where);
    for (const [k, [prompt]] of prompts.entries()) {
      checks.Expect(prompt === references.prompts[k][0],
                    `${Name(k)}: the prompt is the ${references.where} chat's (${prompt.length} chars)`);
      checks.SameIds(`${Name(k)}: the chat's ids against the ${references.where} fresh sequence's`, turns[k].ids,
                     references.fresh[k]);
    }
    return {where, prompts, fresh: references.fresh};
  }
  // Fresh sequences over the same prompts.
  const fresh_ids = [];
  for (const [k, [prompt, n]] of prompts.entries()) {
    ExpectOtherIsNew(await Other(), Name(k));
    const fresh = await Turn(prompt, n);
    checks.Expect(fresh.stats.gpu.sequence === 'new' && fresh.timing.n_reused === 0,
                  `${Name(k)}: the reference is a fresh sequence (${fresh.timing.n_reused} reused)`);
    checks.SameIds(`${Name(k)}: the chat's ids against a fresh sequence's`, turns[k].ids, fresh.ids);
    fresh_ids.push(fresh.ids);
  }
  return {where, prompts, fresh: fresh_ids};
}

// The WebGPU device lost between two chat turns (kvqPage.loseDevice: device.destroy(), as a driver
// reset loses it): the next turn goes on on a new device — a new sequence (the resident pages went
// with the device), its ids a fresh sequence's bit for bit — and the page's "GPU device" row says
// where it went on and why; the turn after it on the same device says nothing was lost.
async function DeviceLostBetweenTurns(page) {
  const prompt = User('Once upon a time'), max_tokens = 12;
  const Turn = () => Generate(page, {prompt, max_tokens, device: 'gpu', chat: true, kv_k: 'f16'});
  const first = await Turn();
  checks.Expect(first.stats.gpu.device_events.length === 0 &&
                /not lost/.test(await Text(page, '#st-gpu-events')),
                `device loss: before it, the page says the device was not lost ("${await Text(page, '#st-gpu-events')}")`);
  const lost = await page.evaluate(() => window.kvqPage.loseDevice());
  checks.Expect(lost?.settled === true, `device loss: device.lost settled before the next turn (${JSON.stringify(lost)})`);
  const after = await Turn();
  const events = after.stats.gpu.device_events, shown = await Text(page, '#st-gpu-events');
  checks.Expect(events.length === 1 && events[0].to === 'gpu' && /destroyed/.test(events[0].why),
                `device loss: the turn after it went on on a new device (${JSON.stringify(events)})`);
  checks.Expect(after.stats.gpu.sequence === 'new',
                `device loss: the turn starts a new sequence (${after.stats.gpu.sequence_why})`);
  checks.Expect(/^lost at position \d+: went on on a new WebGPU device/.test(shown) && shown.includes(events[0].why),
                `device loss: the page's GPU device row names it ("${shown}")`);
  checks.SameIds('device loss: the turn on the new device against the turn before the loss', after.ids, first.ids);
  const next = await Turn();
  checks.Expect(next.stats.gpu.device_events.length === 0 && /not lost/.test(await Text(page, '#st-gpu-events')),
                `device loss: the next turn on the new device lost nothing ("${await Text(page, '#st-gpu-events')}")`);
}

async function Main() {
  const synth = Synth(kvq_cli, tmp, 'synth-llama-ctx40.gguf', kSynthArgs);
  const {server, base} = await Serve(checks, bundle);
  const browser = await LaunchChromium(checks, npm_dir);
  try {
    // One page for all: each generation names its device, so ?gpu=1 (which only changes what
    // 'auto' picks and how a picked GGUF loads) would change none of the runs below.
    const {page, info} = await OpenPage(checks, browser, base, '');
    if (!info.gpu) checks.Fatal(`no WebGPU adapter (${info.gpu_why_not}), though Chromium runs with SwiftShader's`);
    const resident = await GpuChat(page, 'f32', 0, 'resident');
    await GpuChat(page, 'f32', kMixedBudget, 'mixed', resident);
    await GpuChat(page, 'int4-kivi+rot', 0, 'stream');
    await StopStrings(page);
    await EndTokenAndLength(page);
    await BadOptions(page);
    await DeviceLostBetweenTurns(page);
    await FullContext(page, synth);
  } finally {
    await browser.close();
    server.close();
  }
}

await Main().catch((e) => checks.Fail(`${e.stack ?? e}`));
checks.Finish();
