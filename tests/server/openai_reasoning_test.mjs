// Reasoning split on /v1/chat/completions, read with OpenAI's JavaScript client (npm `openai`),
// against `kvq serve` on a tiny random-weight Qwen 3 carrying Qwen 3's real vocabulary and
// template. A grammar makes the random model write a thought and an answer (`<think>\n...\n</think>\n\n...`),
// so the split is checked on what the model really wrote: message.reasoning_content and content
// (and, with reasoning_format "none", the raw text they came from), streamed reasoning deltas all
// before the content deltas and concatenating to the unstreamed fields, a reply cut inside its
// thought (max_tokens) returned as reasoning only with finish_reason "length", and
// chat_template_kwargs.enable_thinking false rendered as @huggingface/jinja renders Qwen 3's template.
// Usage: node openai_reasoning_test.mjs KVQ_BINARY OPENAI_NPM_DIR QWEN3_TOKENIZER_DIR CHAT_TEMPLATES_DIR
import { spawn, execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import assert from 'node:assert/strict';

const [kvq, npmDir, tokenizerDir, templatesDir] = process.argv.slice(2).map((a) => a && path.resolve(a));
if (!kvq || !npmDir || !tokenizerDir || !templatesDir) {
  console.error('usage: node openai_reasoning_test.mjs KVQ_BINARY OPENAI_NPM_DIR QWEN3_TOKENIZER_DIR CHAT_TEMPLATES_DIR');
  process.exit(2);
}
const OpenAI = createRequire(path.join(npmDir, 'node_modules', 'x.js'))('openai');
const { Template } = createRequire(path.join(templatesDir, 'node_modules', 'x.js'))('@huggingface/jinja');

const model = path.join(os.tmpdir(), `kvq_openai_reasoning_${process.pid}.gguf`);
execFileSync(kvq, ['synth', '--arch', 'qwen3', '--dim', '64', '--layers', '2', '--heads', '4', '--kv-heads', '2',
                   '--ffn', '128', '--context', '1024', '--embeddings', 'tied', '--type', 'f16', '--seed', '7',
                   '--vocab', path.join(tokenizerDir, 'tokenizer.json'), '-o', model, '--force', '-t', '2'],
             { stdio: ['ignore', 'ignore', 'inherit'] });
const template = JSON.parse(fs.readFileSync(path.join(tokenizerDir, 'tokenizer_config.json'), 'utf8')).chat_template;

const server = spawn(kvq, ['serve', '-m', model, '--port', '0', '--parallel', '1', '-t', '2', '--web', ''],
                     { stdio: ['ignore', 'inherit', 'pipe'] });
let log = '';
const port = await new Promise((resolve, reject) => {
  const timer = setTimeout(() => reject(new Error(`kvq serve did not start:\n${log}`)), 60000);
  server.stderr.on('data', (d) => {
    log += d;
    const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
    if (m) {
      clearTimeout(timer);
      resolve(Number(m[1]));
    }
  });
  server.on('exit', (code) => reject(new Error(`kvq serve exited with ${code}:\n${log}`)));
});
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'none', maxRetries: 0 });

let failed = false;
async function check(name, fn) {
  try {
    await fn();
    console.log(`ok   ${name}`);
  } catch (e) {
    failed = true;
    console.log(`FAIL ${name}: ${e.stack || e}`);
  }
}

const messages = [{ role: 'user', content: 'Why is the sky blue?' }];
// A thought and an answer of two words each, as Qwen 3 lays them out.
const word = '[a-z] [a-z] [a-z]? [a-z]?';
const grammar = `root ::= "<think>\\n" ${word} " " ${word} "\\n</think>\\n\\n" ${word} " " ${word}`;
const request = { model: path.basename(model, '.gguf'), messages, temperature: 0, max_tokens: 64, grammar };
const twoWords = /^[a-z]{2,4} [a-z]{2,4}$/;

let whole;
await check('the thought is message.reasoning_content, the answer its content', async () => {
  whole = await client.chat.completions.create(request);
  const m = whole.choices[0].message;
  assert.equal(whole.choices[0].finish_reason, 'stop');
  assert.match(m.reasoning_content, twoWords);
  assert.match(m.content, twoWords);
  // The same reply unsplit (reasoning_format "none", llama-server's field): the raw text, tags and all.
  const raw = await client.chat.completions.create({ ...request, reasoning_format: 'none' });
  assert.equal(raw.choices[0].message.reasoning_content, undefined);
  assert.equal(raw.choices[0].message.content, `<think>\n${m.reasoning_content}\n</think>\n\n${m.content}`);
});

await check('streamed: reasoning deltas, then content deltas, concatenating to the unstreamed fields', async () => {
  const order = [];
  let reasoning = '', content = '', finish = null;
  for await (const chunk of await client.chat.completions.create({ ...request, stream: true })) {
    const d = chunk.choices[0]?.delta;
    if (!d) continue;
    if (d.reasoning_content) {
      order.push('r');
      reasoning += d.reasoning_content;
    }
    if (d.content) {
      order.push('c');
      content += d.content;
    }
    finish = chunk.choices[0].finish_reason || finish;
  }
  assert.equal(reasoning, whole.choices[0].message.reasoning_content);
  assert.equal(content, whole.choices[0].message.content);
  assert.equal(finish, 'stop');
  const s = order.join('');
  assert.match(s, /^r+c+$/, `deltas out of order: ${s}`);
  assert.ok(s.indexOf('c') > 1, `the thought came in one piece: ${s}`);
});

await check('a reply cut inside its thought (max_tokens) is reasoning only, finish_reason length', async () => {
  // The reply's tokens (logprobs give their texts): cut after the first that ends inside the thought.
  const raw = await client.chat.completions.create({ ...request, reasoning_format: 'none', logprobs: true });
  let text = '', cut = 0;
  for (const t of raw.choices[0].logprobs.content) {
    text += t.token;
    ++cut;
    if (text.length > '<think>\n'.length && !text.includes('\n</think>')) break;
  }
  assert.ok(!text.includes('</think>'), `no token ends inside the thought: ${JSON.stringify(text)}`);
  for (const stream of [false, true]) {
    let reasoning = '', content = '', finish = null;
    if (!stream) {
      const r = await client.chat.completions.create({ ...request, max_tokens: cut });
      reasoning = r.choices[0].message.reasoning_content ?? '';
      content = r.choices[0].message.content;
      finish = r.choices[0].finish_reason;
    } else {
      for await (const chunk of await client.chat.completions.create({ ...request, max_tokens: cut, stream: true })) {
        const d = chunk.choices[0]?.delta;
        if (!d) continue;
        reasoning += d.reasoning_content || '';
        content += d.content || '';
        finish = chunk.choices[0].finish_reason || finish;
      }
    }
    assert.equal(finish, 'length');
    assert.equal(content, '');
    assert.ok(reasoning.length > 0 && whole.choices[0].message.reasoning_content.startsWith(reasoning),
              `${JSON.stringify(reasoning)} is not the start of the thought`);
  }
});

await check('enable_thinking false renders as the oracle, and the reply has no reasoning', async () => {
  const rendered = await (await fetch(`http://127.0.0.1:${port}/apply-template`, {
    method: 'POST', body: JSON.stringify({ messages, chat_template_kwargs: { enable_thinking: false } }) })).json();
  const oracle = new Template(template).render({ messages, add_generation_prompt: true, enable_thinking: false });
  assert.equal(rendered.prompt, oracle);
  assert.ok(oracle.endsWith('<|im_start|>assistant\n<think>\n\n</think>\n\n'), oracle);
  const r = await client.chat.completions.create({ ...request, grammar: `root ::= ${word} " " ${word}`,
                                                   chat_template_kwargs: { enable_thinking: false } });
  assert.equal(r.choices[0].message.reasoning_content, undefined);
  assert.match(r.choices[0].message.content, twoWords);
});

await check('a bad reasoning_format is a BadRequestError naming it', async () => {
  await assert.rejects(client.chat.completions.create({ ...request, reasoning_format: 'r1' }),
                       (e) => e instanceof OpenAI.BadRequestError && e.param === 'reasoning_format');
});

server.kill('SIGTERM');
await new Promise((r) => server.on('exit', r));
fs.rmSync(model, { force: true });
process.exit(failed ? 1 : 0);
