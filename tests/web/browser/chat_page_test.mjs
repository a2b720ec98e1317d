// The chat page (web/chat/) in headless Chromium, against a `kvq serve` this test starts on a tiny
// synth Qwen 3 carrying Qwen 3's real vocabulary and chat template:
//   - through the server: the served model's name, KV format and KV bytes (= the sum of /slots) are
//     shown; a greedy reply streams in and equals the same request made directly; Regenerate gives
//     it again with its prompt tokens reused; Stop ends a long reply mid-stream, the server's
//     session goes idle and the page takes the next message;
//   - on the in-tab runtime (the WebAssembly module, the same page with ?runtime=tab): the module
//     renders the Qwen 3 template byte for byte as the server's /apply-template does, a template's
//     raise_exception comes back as that error (the module keeps working), a reply streams, two
//     greedy turns give native `kvq chat --json`'s prompt and reply ids, reused and prefilled
//     counts (turn 2 prefills only its new tokens), and Stop ends a reply (finish cancelled); with
//     ?gpu=1 greedy turns run on the WebGPU path, the second prefilling only its new tokens;
//   - the seed field takes any 64-bit seed as digits: a sampled reply with seed 2^53 + 1 or 2^64 - 59
//     equals native `kvq chat --seed S` with the same settings, through the server (which reads a
//     signed 64-bit seed: the page sends 2^64 - 59 as -59, the same bits) and in the standalone
//     tab below (the digits to the module); seed 2^53's reply differs (a seed sent as a double
//     would show);
//   - standalone (the bundle from a plain static server, no kvq serve): the page finds no server,
//     starts the in-tab runtime with the bundled stories260K, renders ChatML (its fallback) and
//     replies, and its sampled replies with those seeds equal native kvq chat's.
// Page errors, console errors and failed requests fail it. Screenshots: OUT_DIR/chat_page_*.png.
// Usage: node chat_page_test.mjs KVQ_CLI BUNDLE_DIR PLAYWRIGHT_NPM_DIR QWEN3_TOKENIZER_JSON OUT_DIR
import {spawn, execFileSync} from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import {createRequire} from 'node:module';
import path from 'node:path';

const kChromium = process.env.KVQ_CHROMIUM || '/usr/bin/chromium';
const kAlias = 'chat-synth-qwen3';
const kTurns = ['Hello', 'Tell me more.'];  // the two turns the tab and native kvq chat are given
const t_start = Date.now();

function Fatal(message) {
  console.error(`chat_page_test: FAIL: ${message}`);
  process.exit(1);
}
const failures = [];
function Fail(message) {
  failures.push(message);
  console.error(`chat_page_test: FAIL: ${message}`);
}
function Expect(ok, message) {
  if (ok) console.log(`chat_page_test: ok: ${message}`);
  else Fail(message);
}

const [kvq, bundle, npm_dir, vocab, out_dir] = process.argv.slice(2);
if (!out_dir) Fatal('usage: chat_page_test.mjs KVQ_CLI BUNDLE_DIR PLAYWRIGHT_NPM_DIR QWEN3_TOKENIZER_JSON OUT_DIR');
for (const [what, file] of [['kvq', kvq], ['the web bundle\'s worker', path.join(bundle, 'worker.js')],
                            ['Qwen 3\'s tokenizer.json', vocab], ['Chromium', kChromium]]) {
  if (!fs.existsSync(file)) Fatal(`${what} is missing: ${file}`);
}
let chromium;
try {
  ({chromium} = createRequire(path.join(path.resolve(npm_dir), 'node_modules', '/'))('playwright-core'));
} catch (e) {
  Fatal(`playwright-core is not in ${npm_dir}/node_modules (the web.fetch_playwright fixture): ${e.message}`);
}
fs.mkdirSync(out_dir, {recursive: true});

// ---- the model and the server ----
const model = path.join(out_dir, `chat_page_qwen3_${process.pid}.gguf`);
execFileSync(kvq, ['synth', '--arch', 'qwen3', '--dim', '64', '--layers', '2', '--heads', '4', '--kv-heads', '2',
                   '--ffn', '128', '--context', '4096', '--embeddings', 'tied', '--type', 'f16', '--vocab', vocab,
                   '--seed', '11', '-t', '1', '-o', model, '--force'], {stdio: ['ignore', 'ignore', 'inherit']});

function StartServer() {
  const child = spawn(kvq, ['serve', '-m', model, '--alias', kAlias, '--port', '0', '--parallel', '1', '-t', '1',
                            '--kv', 'int8', '--web', bundle], {stdio: ['ignore', 'ignore', 'pipe']});
  let log = '';
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`kvq serve did not start in 30 s:\n${log}`)), 30000);
    child.stderr.on('data', (d) => {
      log += d;
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve({child, base: `http://127.0.0.1:${m[1]}`});
      }
    });
    child.on('exit', (code) => reject(new Error(`kvq serve exited (${code}):\n${log}`)));
  });
}

async function Api(base, route, body) {
  const r = await fetch(`${base}${route}`, body === undefined ? {} :
                        {method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify(body)});
  return {status: r.status, json: await r.json()};
}
const Sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const KvBytesHeld = async (base) => (await Api(base, '/slots')).json.reduce((sum, s) => sum + s.kv_bytes, 0);

// A plain static server of the bundle folder (GET only), as a user would host the page.
function ServeStatic(root) {
  const kMime = {'.html': 'text/html; charset=utf-8', '.js': 'text/javascript; charset=utf-8',
                 '.css': 'text/css; charset=utf-8', '.wasm': 'application/wasm', '.bin': 'application/octet-stream'};
  const server = http.createServer((req, res) => {
    let rel = decodeURIComponent(new URL(req.url, 'http://127.0.0.1').pathname);
    if (rel.endsWith('/')) rel += 'index.html';
    const file = path.join(root, path.normalize(rel));
    if (!file.startsWith(root + path.sep) || !fs.existsSync(file) || !fs.statSync(file).isFile()) {
      return res.writeHead(404, {'Content-Type': 'text/plain'}).end('not found');
    }
    res.writeHead(200, {'Content-Type': kMime[path.extname(file)] ?? 'application/octet-stream'});
    fs.createReadStream(file).pipe(res);
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

// allowed_404: URLs a page may find missing (the standalone page asks for a server that is not there).
async function OpenPage(browser, url, where, allowed_404 = /\/favicon\.ico$/) {
  const page = await browser.newPage();
  page.on('pageerror', (e) => Fail(`${where}: page error: ${e.message}`));
  page.on('requestfailed', (r) => {
    // Stop aborts the reply's fetch: that one failure is the point.
    if (!/v1\/chat\/completions/.test(r.url())) Fail(`${where}: request failed: ${r.url()}: ${r.failure()?.errorText}`);
  });
  page.on('console', (msg) => {
    // The browser asks for a favicon on its own; the page has none and needs none.
    if (msg.type() === 'error' && !allowed_404.test(msg.location()?.url ?? '')) {
      Fail(`${where}: console error: ${msg.text()}`);
    }
  });
  await page.goto(url);
  const info = await page.evaluate(() => window.kvqChat.ready);
  console.log(`chat_page_test: ${where}: ${JSON.stringify(info)} at ${page.url()}`);
  return page;
}

const Text = (page, selector) => page.$eval(selector, (e) => e.textContent);
const LastReply = (page) => page.$eval('#messages li.assistant:last-of-type', (li) => ({
  text: li.querySelector('.text').textContent, state: li.dataset.state, ...li.dataset}));
const WaitIdle = (page) => page.waitForFunction(() => document.body.dataset.running === 'no' &&
                                                      !document.getElementById('send').disabled);

async function Send(page, text) {
  await page.fill('#input', text);
  await page.click('#send');
}

// Asks for a long reply, clicks Stop once its text has started streaming in, and returns the reply
// as the page shows it when idle again.
async function StopALongReply(page) {
  await page.fill('#max-tokens', '4000');
  await Send(page, 'Tell me a very long story.');
  await page.waitForFunction(() => {
    const li = document.querySelector('#messages li.assistant:last-of-type');
    return li && li.dataset.state === 'streaming' && li.querySelector('.text').textContent.length > 0;
  }, null, {timeout: 20000});
  Expect(true, 'a reply streams in (text shown while it is still being generated)');
  await page.click('#stop');
  await WaitIdle(page);
  return LastReply(page);
}

// Returns the page, for SeedsThroughTheServer.
async function ThroughTheServer(browser, base) {
  const page = await OpenPage(browser, `${base}/`, 'server page');
  Expect(new URL(page.url()).pathname === '/chat/', `/ leads to the chat page (${page.url()})`);
  Expect(await Text(page, '#model-name') === kAlias, `the served model's name is shown (${await Text(page, '#model-name')})`);
  Expect((await Text(page, '#kv-format')) === 'K int8, V int8', `the KV format is shown (${await Text(page, '#kv-format')})`);

  // A greedy reply, streamed into the page, equals the same request made directly.
  await page.fill('#system', 'You answer <b>briefly</b> & plainly.');
  await page.fill('#temperature', '0');
  await page.fill('#max-tokens', '24');
  await page.fill('#seed', '5');
  const user = 'Hello <script>alert(1)</script>, how are you?';
  await Send(page, user);
  await WaitIdle(page);
  const first = await LastReply(page);
  const messages = [{role: 'system', content: 'You answer <b>briefly</b> & plainly.'}, {role: 'user', content: user}];
  const direct = (await Api(base, '/v1/chat/completions', {messages, temperature: 0, top_p: 0.95, max_tokens: 24,
                                                          seed: 5})).json;
  Expect(first.state === 'done' && first.text === direct.choices[0].message.content && first.text.length > 0,
         `the streamed reply equals the direct request's (${JSON.stringify(first.text.slice(0, 40))}...)`);
  Expect(Number(first.completionTokens) === direct.usage.completion_tokens,
         `its generated tokens are shown (${first.completionTokens})`);
  Expect(first.tokensPerSecond !== '' && Number(first.tokensPerSecond) > 0, `its tok/s is shown (${first.tokensPerSecond})`);
  // Text is text: the user's markup is shown, never run or parsed.
  Expect(await page.$$eval('#messages li.user .text', (e) => e[0].textContent) === user &&
         await page.$$eval('#messages script, #messages b', (e) => e.length) === 0, 'messages are shown as text');
  const held = await KvBytesHeld(base);
  await page.waitForFunction((want) => document.getElementById('kv-bytes').dataset.bytes === String(want), held,
                             {timeout: 20000}).catch(() => {});
  const shown = Number(await page.$eval('#kv-bytes', (e) => e.dataset.bytes));
  Expect(held > 0 && shown === held, `the KV bytes shown (${shown}) are the server's sessions' (${held})`);

  // Regenerate: the same greedy reply again, its prompt now reused from the session.
  await page.click('#regenerate');
  await WaitIdle(page);
  const again = await LastReply(page);
  Expect(again.text === first.text, 'Regenerate gives the greedy reply again');
  Expect(Number(again.reusedTokens) > 0 && Number(again.reusedTokens) <= Number(again.promptTokens),
         `its reused prompt tokens are shown (${again.reusedTokens} of ${again.promptTokens})`);
  Expect(await page.$$eval('#messages li.assistant', (e) => e.length) === 1, 'Regenerate replaces the reply');
  await page.screenshot({path: path.join(out_dir, 'chat_page_server.png'), fullPage: true});

  // Stop: a long reply is stopped once text has streamed in; the server's session goes idle.
  const stopped = await StopALongReply(page);
  Expect(stopped.state === 'stopped', `Stop ends the reply (state ${stopped.state}, ${stopped.text.length} chars)`);
  let idle = false;
  for (let i = 0; i < 50 && !idle; ++i) {
    idle = (await Api(base, '/slots')).json.every((s) => s.state === 'idle');
    if (!idle) await Sleep(100);
  }
  Expect(idle, 'the server\'s session is idle after Stop');
  const metrics = await (await fetch(`${base}/metrics`)).text();
  const generated = Number(/\nkvq_generated_tokens_total (\d+)/.exec(metrics)?.[1] ?? NaN);
  Expect(generated < 3 * 24 + 4000, `the stopped reply was not run to its end (${generated} tokens generated in all)`);
  // The page takes the next message.
  await page.fill('#max-tokens', '4');
  await Send(page, 'Thanks.');
  await WaitIdle(page);
  Expect((await LastReply(page)).state === 'done', 'after Stop the page replies again');
  await page.screenshot({path: path.join(out_dir, 'chat_page_server_stopped.png'), fullPage: true});
  return page;
}

async function InTheTab(browser, base) {
  const page = await OpenPage(browser, `${base}/chat/?runtime=tab&model=none`, 'tab page');
  await page.setInputFiles('#model-file', model);
  await page.click('#load-picked');
  await page.waitForFunction(() => document.getElementById('status').dataset.state !== 'loading' &&
                                   document.getElementById('model-name').textContent.endsWith('.gguf'),
                             null, {timeout: 30000});
  Expect(await Text(page, '#model-name') === path.basename(model), `the tab loaded ${await Text(page, '#model-name')}`);
  const conversations = [
    [{role: 'user', content: 'Hi'}],
    [{role: 'system', content: 'Be brief.'}, {role: 'user', content: 'What is 2+2?'}],
    [{role: 'system', content: 'Ünïcödé ✓ 你好 <b>&amp;</b>'}, {role: 'user', content: 'One'},
     {role: 'assistant', content: 'Two'}, {role: 'user', content: 'Three\n\nfour  '}],
    [{role: 'user', content: 'a'}, {role: 'assistant', content: '<think>\nhm\n</think>\n\nb'}, {role: 'user', content: 'c'}],
  ];
  for (const [i, messages] of conversations.entries()) {
    const server = await Api(base, '/apply-template', {messages});
    const tab = await page.evaluate((m) => window.kvqChat.render(m), messages);
    Expect(server.status === 200 && tab === server.json.prompt,
           `conversation ${i}: the module's Qwen 3 render equals /apply-template byte for byte (${tab.length} chars)`);
  }
  // A template's raise_exception, and an error the interpreter throws (a string plus an int), come
  // back from the module as errors (not an abort); the module renders again afterwards.
  const TabError = (m, t) => page.evaluate(([m, t]) => window.kvqChat.render(m, t).then(() => '', (e) => e.message), [m, t]);
  const raised = await TabError(conversations[0], "{{ raise_exception('no ' + messages[0].role + ' wanted') }}");
  Expect(raised.endsWith('refused the messages: no user wanted'), `a template's raise_exception comes back (${raised})`);
  const thrown = await TabError(conversations[0], '{{ messages[0].content + 1 }}');
  Expect(/refused the messages: chat template 1:\d+: /.test(thrown), `an interpreter error comes back (${thrown})`);
  Expect(await page.evaluate((m) => window.kvqChat.render(m), conversations[0]) ===
         (await Api(base, '/apply-template', {messages: conversations[0]})).json.prompt, 'the module renders after an error');
  // A reply streams in the tab; two turns give native kvq chat's ids, and the second prefills only
  // what the session did not hold after the first.
  await page.fill('#temperature', '0');
  await page.fill('#max-tokens', '8');
  await Send(page, kTurns[0]);
  await WaitIdle(page);
  const reply = await LastReply(page);
  Expect(reply.state === 'done' && Number(reply.completionTokens) >= 1,
         `the tab replies (${reply.completionTokens} tokens, ${JSON.stringify(reply.text)})`);
  await Send(page, kTurns[1]);
  await WaitIdle(page);
  const turns = await page.evaluate(() => window.kvqChat.turns());
  const native = NativeChat();
  Expect(turns.length === 2 && native.length === 2, `two turns in the tab (${turns.length}) and natively (${native.length})`);
  for (const [i, n] of native.entries()) {
    const t = turns[i] ?? {};
    for (const field of ['prompt_ids', 'reply_ids', 'reused', 'prefilled', 'positions']) {
      Expect(JSON.stringify(t[field]) === JSON.stringify(n[field]),
             `turn ${i + 1}: ${field} equal kvq chat's (${JSON.stringify(t[field])?.slice(0, 60)})`);
    }
  }
  if (turns.length === 2) {
    // Turn 2 reuses what turn 1 left in the session up to where it and turn 2's prompt differ.
    const [one, two] = turns;
    const held = [...one.prompt_ids, ...one.reply_ids].slice(0, one.positions);
    let common = 0;
    while (common < held.length && held[common] === two.prompt_ids[common]) ++common;
    Expect(common >= one.prompt_ids.length - 1 && two.reused === Math.min(common, two.prompt_ids.length - 1) &&
           two.prefilled === two.prompt_ids.length - two.reused && two.prefilled < two.prompt_ids.length - one.prompt_ids.length + 2,
           `turn 2 prefills only its new tokens: ${two.prefilled} of ${two.prompt_ids.length} (${two.reused} reused, ` +
           `${common} shared with the ${held.length} held)`);
    const shown = await LastReply(page);
    Expect(Number(shown.reusedTokens) === two.reused, `the page shows the reused tokens (${shown.reusedTokens})`);
  }
  await page.screenshot({path: path.join(out_dir, 'chat_page_tab.png'), fullPage: true});

  // Stop ends a long reply in the tab as on the server (state stopped; the worker's finish_reason
  // cancelled), and the next turn still reuses the history.
  const stopped = await StopALongReply(page);
  const cut = (await page.evaluate(() => window.kvqChat.turns())).at(-1);
  Expect(stopped.state === 'stopped' && cut.finish === 'cancelled' && cut.reply_ids.length < 4000,
         `Stop ends the tab's reply (state ${stopped.state}, finish ${cut.finish}, ${cut.reply_ids.length} tokens)`);
  await page.fill('#max-tokens', '4');
  await Send(page, 'Thanks.');
  await WaitIdle(page);
  const after = (await page.evaluate(() => window.kvqChat.turns())).at(-1);
  Expect((await LastReply(page)).state === 'done' && after.reused >= cut.prompt_ids.length - 1,
         `after Stop the tab replies again, reusing the history (${after.reused} of ${after.prompt_ids.length} reused)`);
  await page.close();
}

// The same two turns through native kvq chat (greedy, f16 KV as the tab's default): its --json turns.
function NativeChat() {
  const out = execFileSync(kvq, ['chat', '-m', model, '--temp', '0', '-n', '8', '-t', '1', '--kv', 'f16', '--json'],
                           {input: kTurns.join('\n') + '\n', stdio: ['pipe', 'pipe', 'ignore']}).toString();
  return out.split('\n').filter((line) => line.trim()).map((line) => JSON.parse(line));
}

// Seeds a double cannot carry: 2^53 + 1 (rounds to 2^53) and 2^64 - 59 (past a signed 64-bit seed).
const kSeeds = ['9007199254740993', '18446744073709551557'];
const kRounded = '9007199254740992';  // 2^53: what 2^53 + 1 becomes as a JSON double

// One sampled turn of native kvq chat ('Hello', temperature 1, 8 tokens, one thread) with the seed
// and `flags` (the model and the other settings of the page's path): its --json turn.
function NativeSampled(seed, flags) {
  const out = execFileSync(kvq, ['chat', '--temp', '1', '--top-p', '0.95', '-n', '8', '-t', '1', '--seed', seed,
                                 ...flags, '--json'], {input: 'Hello\n', stdio: ['pipe', 'pipe', 'ignore']}).toString();
  return JSON.parse(out.split('\n').find((line) => line.trim()));
}

// The page's sampled reply to 'Hello' alone (the conversation cleared first) with the seed field `seed`.
async function SampledReply(page, seed) {
  await page.click('#clear');
  await page.fill('#system', '');
  await page.fill('#temperature', '1');
  await page.fill('#top-p', '0.95');
  await page.fill('#max-tokens', '8');
  await page.fill('#seed', seed);
  await Send(page, 'Hello');
  await WaitIdle(page);
  return LastReply(page);
}

// The server's sampler: kvq's defaults top-k 40, min-p 0.05; the server's int8 KV. On the page
// ThroughTheServer left (SampledReply clears the conversation and sets every field it depends on).
async function SeedsThroughTheServer(page) {
  const replies = {};
  for (const seed of [...kSeeds, kRounded]) {
    replies[seed] = await SampledReply(page, seed);
    if (seed === kRounded) continue;
    const native = NativeSampled(seed, ['-m', model, '--top-k', '40', '--min-p', '0.05', '--kv', 'int8']);
    Expect(replies[seed].state === 'done' && replies[seed].text === native.reply,
           `server, seed ${seed}: the page's sampled reply equals kvq chat --seed ${seed}'s ` +
           `(${JSON.stringify(replies[seed].text)} vs ${JSON.stringify(native.reply)})`);
  }
  Expect(replies[kSeeds[0]].text !== replies[kRounded].text,
         `server: seed ${kSeeds[0]}'s reply differs from seed ${kRounded}'s (a seed rounded to a double would show)`);
  await page.close();
}

// The tab's sampled replies with the bundled stories260K (the synth model's flat distributions over
// 151,936 tokens make a draw hang on the last bits of every logit, which WebAssembly's sums need not
// share with native's; stories260K's draws do not: web.page_sampling): top-k 0 and min-p 0
// (TabTransport's), f16 KV (the tab's default).
async function SeedsInTheTab(page) {
  const stories = ['-m', path.join(bundle, 'models/stories260K.bin'), '--tokenizer', path.join(bundle, 'models/tok512.bin')];
  const ids = {};
  for (const seed of [...kSeeds, kRounded]) {
    await SampledReply(page, seed);
    ids[seed] = (await page.evaluate(() => window.kvqChat.turns())).at(-1).reply_ids;
    if (seed === kRounded) continue;
    const native = NativeSampled(seed, [...stories, '--top-k', '0', '--min-p', '0', '--kv', 'f16']);
    Expect(JSON.stringify(ids[seed]) === JSON.stringify(native.reply_ids),
           `tab, seed ${seed}: the reply's ids equal kvq chat --seed ${seed}'s (${JSON.stringify(ids[seed])})`);
  }
  Expect(JSON.stringify(ids[kSeeds[0]]) !== JSON.stringify(ids[kRounded]),
         `tab: seed ${kSeeds[0]}'s reply differs from seed ${kRounded}'s`);
  await page.fill('#seed', '');
}

async function Standalone(browser) {
  const server = await ServeStatic(path.resolve(bundle));
  const base = `http://127.0.0.1:${server.address().port}`;
  try {
    const page = await OpenPage(browser, `${base}/chat/`, 'standalone page', /\/(favicon\.ico|props|slots)$/);
    const info = await page.evaluate(() => window.kvqChat.ready);
    Expect(info.runtime === 'tab', `with no kvq serve the page runs the model in the tab (${JSON.stringify(info)})`);
    Expect(await page.$eval('#switch', (a) => a.hidden), 'it offers no server to switch to');
    await page.waitForFunction(() => document.getElementById('model-name').textContent === 'stories260K.bin',
                               null, {timeout: 30000});
    const messages = [{role: 'system', content: 'Be brief.'}, {role: 'user', content: 'Hi'}];
    const chatml = '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n';
    Expect(await page.evaluate((m) => window.kvqChat.render(m), messages) === chatml,
           'stories260K (no template) is rendered as ChatML, kvq/chat.h\'s fallback');
    await page.fill('#temperature', '0');
    await page.fill('#max-tokens', '16');
    await Send(page, 'Once upon a time');
    await WaitIdle(page);
    const reply = await LastReply(page);
    Expect(reply.state === 'done' && reply.text.length > 0, `the standalone page replies (${JSON.stringify(reply.text)})`);
    // ChatML writes no BOS text: the prompt gets the one BOS (id 1) stories260K's vocabulary adds.
    const ids = (await page.evaluate(() => window.kvqChat.turns()))[0]?.prompt_ids ?? [];
    Expect(ids[0] === 1 && ids.filter((id) => id === 1).length === 1, `its prompt starts with one BOS (${ids.slice(0, 4)}...)`);
    await page.screenshot({path: path.join(out_dir, 'chat_page_standalone.png'), fullPage: true});
    await SeedsInTheTab(page);
    await page.close();
  } finally {
    server.close();
  }
}

// The in-tab runtime on the WebGPU path (?gpu=1: SwiftShader's adapter taken though it is an
// emulation), the bundled stories260K, greedy: each turn runs on the GPU and the second keeps the
// first's sequence, so it prefills only what the first did not hold (web.generation checks the
// GPU path's turns against fresh sequences, bit for bit).
async function OnTheTabsGpu(browser, base) {
  const page = await OpenPage(browser, `${base}/chat/?runtime=tab&gpu=1`, 'tab page on the GPU');
  await page.waitForFunction(() => document.getElementById('model-name').textContent === 'stories260K.bin',
                             null, {timeout: 30000});
  await page.fill('#temperature', '0');
  await page.fill('#max-tokens', '16');
  for (const text of ['Once upon a time', 'The cat']) {
    await Send(page, text);
    await WaitIdle(page);
  }
  const turns = await page.evaluate(() => window.kvqChat.turns());
  Expect(turns.length === 2 && turns.every((t) => t.device === 'gpu' && t.reply_ids.length > 0),
         `two replies on the GPU path (${turns.map((t) => `${t.device}: ${t.reply_ids.length} tokens`).join(', ')})`);
  const [one, two] = turns;
  Expect(two && two.reused >= one.prompt_ids.length && two.prefilled === two.prompt_ids.length - two.reused,
         `the second turn keeps the first's sequence: ${two?.reused} of ${two?.prompt_ids.length} prompt tokens ` +
         `reused, ${two?.prefilled} prefilled`);
  // The model's line is shown again after each reply (ShowModel, once the page is idle).
  const shows_gpu = await page.waitForFunction(() => /WebGPU on /.test(document.getElementById('runtime').textContent),
                                               null, {timeout: 10000}).then(() => true, () => false);
  Expect(shows_gpu, `the page says the GPU ran it (${await Text(page, '#runtime')})`);
  await page.close();
}

async function Main() {
  const {child, base} = await StartServer();
  // Software WebGPU (SwiftShader), as the page's other browser tests run it.
  const browser = await chromium.launch({executablePath: kChromium, headless: true,
                                         args: ['--no-sandbox', '--disable-quic', '--no-first-run',
                                                '--disable-background-networking', '--disable-component-update',
                                                '--disable-sync', '--enable-unsafe-webgpu', '--enable-features=Vulkan',
                                                '--use-vulkan=swiftshader', '--use-webgpu-adapter=swiftshader']});
  try {
    for (let i = 0; i < 100 && (await fetch(`${base}/health`)).status !== 200; ++i) await Sleep(100);
    await SeedsThroughTheServer(await ThroughTheServer(browser, base));
    await InTheTab(browser, base);
    await OnTheTabsGpu(browser, base);
    await Standalone(browser);
  } finally {
    await browser.close();
    child.kill('SIGTERM');
    fs.rmSync(model, {force: true});
  }
}

await Main().catch((e) => Fail(`${e.stack ?? e}`));
for (const shot of ['chat_page_server.png', 'chat_page_server_stopped.png', 'chat_page_tab.png',
                    'chat_page_standalone.png']) {
  if (fs.existsSync(path.join(out_dir, shot))) console.log(`chat_page_test: screenshot ${path.join(out_dir, shot)}`);
}
const seconds = ((Date.now() - t_start) / 1000).toFixed(1);
if (failures.length) {
  console.error(`chat_page_test: ${failures.length} failure(s) in ${seconds} s`);
  process.exit(1);
}
console.log(`chat_page_test: all passed in ${seconds} s`);
