// OpenAI's own JavaScript client (npm `openai`) against `kvq serve` on the bundled model: a
// completion, a streamed chat completion (the chunks joined equal the same request unstreamed),
// and errors (an unknown model is the client's NotFoundError, a wrong key its AuthenticationError);
// then SIGTERM: the server finishes a request under way and exits 0.
// Usage: node openai_client_test.mjs KVQ_BINARY NPM_DIR (the folder tests/server/fetch_openai.sh filled)
import { spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import path from 'node:path';
import assert from 'node:assert/strict';

const [kvq, npmDir] = process.argv.slice(2);
if (!kvq || !npmDir) {
  console.error('usage: node openai_client_test.mjs KVQ_BINARY NPM_DIR');
  process.exit(2);
}
const require = createRequire(path.join(npmDir, 'node_modules', 'x.js'));
const OpenAI = require('openai');

const key = 'test-key';
const server = spawn(kvq, ['serve', '--port', '0', '--parallel', '2', '-t', '1', '--api-key', key, '--web', ''], {
  stdio: ['ignore', 'inherit', 'pipe'],
});
let log = '';
const port = await new Promise((resolve, reject) => {
  const timer = setTimeout(() => reject(new Error(`kvq serve did not start:\n${log}`)), 30000);
  server.stderr.on('data', (d) => {
    log += d;
    process.stderr.write(d);
    const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
    if (m) {
      clearTimeout(timer);
      resolve(Number(m[1]));
    }
  });
  server.on('exit', (code) => reject(new Error(`kvq serve exited with ${code}:\n${log}`)));
});
const exited = new Promise((resolve) => server.on('exit', (code, signal) => resolve({ code, signal })));

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

const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: key, maxRetries: 0 });

await check('models lists the served model', async () => {
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ['stories260K']);
});

await check('completion', async () => {
  const c = await client.completions.create({ model: 'stories260K', prompt: 'Once upon a time', max_tokens: 24, temperature: 0 });
  assert.equal(c.object, 'text_completion');
  assert.ok(c.choices[0].text.length > 0);
  assert.ok(['stop', 'length'].includes(c.choices[0].finish_reason));
  assert.equal(c.usage.total_tokens, c.usage.prompt_tokens + c.usage.completion_tokens);
});

await check('streamed chat completion equals the same request unstreamed', async () => {
  const request = { model: 'stories260K', messages: [{ role: 'user', content: 'Tell me about a cat.' }], max_tokens: 32, temperature: 0 };
  const whole = await client.chat.completions.create(request);
  const stream = await client.chat.completions.create({ ...request, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let role = '';
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    const choice = chunk.choices[0];
    if (!choice) continue;
    role ||= choice.delta.role || '';
    text += choice.delta.content || '';
    finish = choice.finish_reason || finish;
  }
  assert.equal(role, 'assistant');
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(finish, whole.choices[0].finish_reason);
  assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
});

await check('an unknown model is a NotFoundError', async () => {
  await assert.rejects(
    client.completions.create({ model: 'gpt-nothing', prompt: 'x', max_tokens: 2 }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404 && /does not exist/.test(e.message),
  );
});

await check('a bad field is a BadRequestError naming it', async () => {
  await assert.rejects(
    client.completions.create({ model: 'stories260K', prompt: 'x', max_tokens: -1 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'max_tokens',
  );
});

await check('a wrong key is an AuthenticationError', async () => {
  const wrong = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'nope', maxRetries: 0 });
  await assert.rejects(wrong.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
});

await check('SIGTERM lets a running request finish, then the server exits 0', async () => {
  const running = client.completions.create({ model: 'stories260K', prompt: 'Once', max_tokens: 400, temperature: 0, ignore_eos: true });
  // Signal once the server is generating it (its metrics say a session is active).
  for (let i = 0; i < 500; ++i) {
    const m = await fetch(`http://127.0.0.1:${port}/metrics`, { headers: { Authorization: `Bearer ${key}` } });
    if (/^kvq_active_sessions [1-9]/m.test(await m.text())) break;
    await new Promise((r) => setTimeout(r, 5));
  }
  server.kill('SIGTERM');
  const c = await running;
  assert.equal(c.usage.completion_tokens, 400);
  const { code } = await exited;
  assert.equal(code, 0);
  assert.match(log, /stopped/);
});

if (server.exitCode === null) server.kill('SIGKILL');
process.exit(failed ? 1 : 0);
