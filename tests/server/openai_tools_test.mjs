// A two-step tool loop with OpenAI's own JavaScript client (npm `openai`) against `kvq serve` on a
// tiny random-weight Qwen 3 carrying Qwen 3's real vocabulary, once per tool-call format: Qwen 3's
// own template (Hermes `<tool_call>`), Llama 3.2's (Llama 3.1's JSON format, `ipython` results),
// Mistral Nemo's (`[TOOL_CALLS]`) and DeepSeek V3's (`<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME` and a
// ```json block), the last three given by `--chat-template`. Each run: a request with
// `tools` and tool_choice "required" (grammar-forced, so even random weights produce a call that
// parses and names a declared function), the call run here, its result sent back as a `tool`
// message, and the final answer. Non-streamed and streamed (the streamed deltas rebuild the same
// calls, by hand and by the client's stream helper; the arguments come in pieces as written). Each step's prompt is checked against @huggingface/jinja's render of the same
// conversation: sent as a plain completion, the oracle's text has the same token count and the
// same greedy continuation as the chat request (tool_choice "none": no grammar, no parsing). Last, a
// vocabulary in which [TOOL_CALLS] is a control token, as in Mistral's: a forced call opens with it,
// and its logprob entry shows "[TOOL_CALLS]".
// Usage: node openai_tools_test.mjs KVQ_BINARY OPENAI_NPM_DIR QWEN3_TOKENIZER_DIR CHAT_TEMPLATES_DIR
// (CHAT_TEMPLATES_DIR: tests/text/fetch_chat_templates.sh's folder, with templates/ and @huggingface/jinja)
import { spawn, execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import assert from 'node:assert/strict';

const [kvq, npmDir, tokenizerDir, templatesDir] = process.argv.slice(2).map((a) => a && path.resolve(a));
if (!kvq || !npmDir || !tokenizerDir || !templatesDir) {
  console.error('usage: node openai_tools_test.mjs KVQ_BINARY OPENAI_NPM_DIR QWEN3_TOKENIZER_DIR CHAT_TEMPLATES_DIR');
  process.exit(2);
}
const require = createRequire(path.join(npmDir, 'node_modules', 'x.js'));
const OpenAI = require('openai');
const { Template } = createRequire(path.join(templatesDir, 'node_modules', 'x.js'))('@huggingface/jinja');

// The synth model: Qwen 3's tokenizer.json (its tokenizer_config.json beside it gives the template).
const model = path.join(os.tmpdir(), `kvq_openai_tools_${process.pid}.gguf`);
execFileSync(kvq, ['synth', '--arch', 'qwen3', '--dim', '64', '--layers', '2', '--heads', '4', '--kv-heads', '2',
                   '--ffn', '128', '--context', '2048', '--embeddings', 'tied', '--type', 'f16', '--seed', '5',
                   '--vocab', path.join(tokenizerDir, 'tokenizer.json'), '-o', model, '--force', '-t', '2'],
             { stdio: ['ignore', 'ignore', 'inherit'] });

// The formats: the template (the model's own, or a file given by --chat-template), what the
// oracle's renders must hold, and the ids the server gives calls.
const packaged = (name) =>
  JSON.parse(fs.readFileSync(path.join(templatesDir, 'templates', `${name}.tokenizer_config.json`), 'utf8')).chat_template;
const formats = [
  { name: 'Qwen 3 (the model\'s own template)', template: JSON.parse(fs.readFileSync(path.join(tokenizerDir,
      'tokenizer_config.json'), 'utf8')).chat_template, own: true, id: /^call_[A-Za-z0-9]{24}$/,
    step1: (t) => t.includes('<tools>') && t.endsWith('<|im_start|>assistant\n'),
    step2: (t, name) => t.includes('<tool_call>\n{"name": "' + name + '"') && t.includes('<tool_response>\n') },
  { name: 'Llama 3.2 (--chat-template)', template: packaged('llama3_2'), id: /^call_[A-Za-z0-9]{24}$/,
    step1: (t) => t.includes('"parameters": dictionary of argument name') &&
                  t.endsWith('<|start_header_id|>assistant<|end_header_id|>\n\n'),
    step2: (t, name) => t.includes('{"name": "' + name + '", "parameters": ') &&
                        t.includes('<|start_header_id|>ipython<|end_header_id|>') },
  { name: 'Mistral Nemo (--chat-template)', template: packaged('mistral_nemo'), id: /^[A-Za-z0-9]{9}$/,
    step1: (t) => t.includes('[AVAILABLE_TOOLS]') && t.endsWith('[/INST]'),
    step2: (t, name) => t.includes('[TOOL_CALLS][{"name": "' + name + '"') && t.includes('[TOOL_RESULTS]') },
  // DeepSeek V3's template shows no tool definitions, and renders an earlier call only from a message
  // whose content is null and whose arguments are a string (textCalls: the oracle gets them so).
  { name: 'DeepSeek V3 (--chat-template)', template: packaged('deepseek_v3'), id: /^call_[A-Za-z0-9]{24}$/,
    textCalls: true,
    step1: (t) => t.endsWith('<｜Assistant｜>'),
    step2: (t, name) => t.includes('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>' + name +
                                   '\n```json\n{') && t.includes('<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>') },
];

async function startServer(templateFile, modelFile = model) {
  const args = ['serve', '-m', modelFile, '--port', '0', '--parallel', '1', '-t', '2', '--web', ''];
  if (templateFile) args.push('--chat-template', templateFile);
  const server = spawn(kvq, args, { stdio: ['ignore', 'inherit', 'pipe'] });
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
  return { server, port, stop: async () => {
    server.kill('SIGTERM');
    await new Promise((r) => server.on('exit', r));
  } };
}

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

const modelId = path.basename(model, '.gguf');
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Oslo', 'Lima'] },
                                                unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
                  required: ['city', 'unit'] } } },
  { type: 'function', function: { name: 'get_time', description: 'The time in a time zone',
    parameters: { type: 'object', properties: { zone: { type: 'string', enum: ['UTC', 'CET'] } }, required: ['zone'] } } },
];
const run = {  // the tools, run here
  get_weather: (a) => JSON.stringify({ city: a.city, temperature: 21, unit: a.unit }),
  get_time: (a) => JSON.stringify({ zone: a.zone, time: '12:00' }),
};
const question = [{ role: 'system', content: 'Use the tools.' }, { role: 'user', content: 'What is the weather in Paris?' }];
const sampling = { model: modelId, temperature: 0, max_tokens: 400 };

// A call as the server returned it must name a declared function with arguments its schema accepts.
function checkCall(format, call) {
  assert.equal(call.type, 'function');
  assert.match(call.id, format.id);
  const tool = tools.find((t) => t.function.name === call.function.name);
  assert.ok(tool, `undeclared function ${call.function.name}`);
  const args = JSON.parse(call.function.arguments);
  for (const key of tool.function.parameters.required) {
    assert.ok(tool.function.parameters.properties[key].enum.includes(args[key]), `${key}: ${args[key]}`);
  }
  return args;
}

// The messages as a transformers template sees them: arguments parsed, null content as "" (for a
// textCalls template, as the client sent them).
function templateMessages(format, messages) {
  if (format.textCalls) return messages;
  return messages.map((m) => {
    const t = { ...m, content: m.content ?? '' };
    if (m.tool_calls) {
      t.tool_calls = m.tool_calls.map((c) => ({ ...c, function: { ...c.function, arguments: JSON.parse(c.function.arguments) } }));
    }
    return t;
  });
}

// The oracle's prompt for `messages` gives the same tokens as kvq's: as a completion, the same count
// and the same greedy continuation as the chat request without a grammar. bos_token and eos_token:
// the server's (/props), as transformers takes them from the tokenizer.
async function checkPromptIsTheOracles(client, format, messages) {
  const props = await (await fetch(client.baseURL.replace(/\/v1$/, '/props'))).json();
  const oracle = new Template(format.template).render({ messages: templateMessages(format, messages), tools,
    add_generation_prompt: true, bos_token: props.bos_token, eos_token: props.eos_token });
  // The text: byte for byte what the server renders (/apply-template takes a chat request's body).
  const rendered = await (await fetch(client.baseURL.replace(/\/v1$/, '/apply-template'), {
    method: 'POST', body: JSON.stringify({ messages, tools }) })).json();
  assert.equal(rendered.prompt, oracle);
  // The tokens: a template that writes BOS's text gets BOS's id (Model::TokenizeChatPrompt), which
  // a plain completion of the same text does not; otherwise the same count and continuation.
  if (props.bos_token === '' || !oracle.startsWith(props.bos_token)) {
    const chat = await client.chat.completions.create({ ...sampling, max_tokens: 12, messages, tools, tool_choice: 'none' });
    const plain = await client.completions.create({ ...sampling, max_tokens: 12, prompt: oracle });
    assert.equal(chat.usage.prompt_tokens, plain.usage.prompt_tokens);
    assert.equal(chat.choices[0].message.content, plain.choices[0].text);
  }
  return oracle;
}

async function toolLoop(client, format, stream) {
  const messages = [...question];
  assert.ok(format.step1(await checkPromptIsTheOracles(client, format, messages)), 'the step-1 render lacks the tools');
  // Step 1: a forced call.
  const request = { ...sampling, messages, tools, tool_choice: 'required', parallel_tool_calls: false };
  let message, finish;
  if (!stream) {
    const r = await client.chat.completions.create(request);
    message = r.choices[0].message;
    finish = r.choices[0].finish_reason;
    assert.equal(message.content, null);
  } else {
    const calls = [];
    const pieces = [];  // per call, its arguments' deltas
    let content = '';
    for await (const chunk of await client.chat.completions.create({ ...request, stream: true })) {
      const choice = chunk.choices[0];
      if (!choice) continue;
      content += choice.delta.content || '';
      for (const d of choice.delta.tool_calls || []) {
        // OpenAI's shape: a call's first delta has its id, type and name with arguments "";
        // the arguments follow in later deltas, which carry neither id nor name.
        if (!calls[d.index]) {
          assert.equal(d.type, 'function');
          assert.equal(d.function.arguments, '', 'the first delta of a call carries no arguments');
          assert.ok(d.id && d.function.name, 'the first delta of a call names it');
        } else {
          assert.equal(d.id, undefined);
          assert.equal(d.function.name, undefined);
        }
        calls[d.index] ??= { id: '', type: 'function', function: { name: '', arguments: '' } };
        calls[d.index].id += d.id || '';
        calls[d.index].function.name += d.function?.name || '';
        calls[d.index].function.arguments += d.function?.arguments || '';
        (pieces[d.index] ??= []).push(d.function?.arguments || '');
      }
      finish = choice.finish_reason || finish;
    }
    assert.equal(content, '');
    // How many pieces the arguments arrive in depends on scheduling: the server's stream sends the
    // text generated since its last wait (Job::Wait), so a loaded HTTP thread can get the whole
    // arguments in one delta. That the parser releases arguments as they are written is checked
    // deterministically, a byte at a time, by tests/api/tool_calls_test.cc
    // (EveryFormat.ArgumentsStreamAsWrittenAndConcatenateToTheWholeCall); here the pieces must
    // concatenate to the unstreamed call (below), whatever their number.
    assert.ok(pieces[0].some((p) => p !== ''), `no arguments streamed: ${JSON.stringify(pieces[0])}`);
    message = { role: 'assistant', content: null, tool_calls: calls };
    // The same calls as the request unstreamed (greedy): only the ids differ.
    const whole = await client.chat.completions.create(request);
    assert.deepEqual(calls.map((c) => c.function), whole.choices[0].message.tool_calls.map((c) => c.function));
    // The client's own stream helper assembles the same calls from the deltas.
    const helper = client.beta.chat.completions.stream(request);
    let helperDeltas = 0;
    helper.on('tool_calls.function.arguments.delta', (e) => { helperDeltas += e.arguments_delta !== '' ? 1 : 0; });
    const assembled = await helper.finalChatCompletion();
    assert.equal(assembled.choices[0].finish_reason, 'tool_calls');
    assert.deepEqual(assembled.choices[0].message.tool_calls.map((c) => c.function),
                     whole.choices[0].message.tool_calls.map((c) => c.function));
    assert.ok(helperDeltas >= 1, 'the stream helper saw no argument deltas');
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(message.tool_calls.length, 1);
  const call = message.tool_calls[0];
  const args = checkCall(format, call);
  // Step 2: the call's result goes back; the reply is the answer.
  messages.push({ role: 'assistant', content: null, tool_calls: message.tool_calls });
  messages.push({ role: 'tool', tool_call_id: call.id, content: run[call.function.name](args) });
  const oracle = await checkPromptIsTheOracles(client, format, messages);
  assert.ok(format.step2(oracle, call.function.name), `the step-2 render lacks the call or its result:\n${oracle}`);
  const answer = await client.chat.completions.create({ ...sampling, max_tokens: 16, messages, tools, tool_choice: 'auto' });
  assert.ok(['stop', 'length', 'tool_calls'].includes(answer.choices[0].finish_reason));
  if (answer.choices[0].finish_reason !== 'tool_calls') assert.equal(typeof answer.choices[0].message.content, 'string');
}

for (const format of formats) {
  let file = null;
  if (!format.own) {
    file = path.join(os.tmpdir(), `kvq_openai_tools_${process.pid}.jinja`);
    fs.writeFileSync(file, format.template);
  }
  const s = await startServer(file);
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${s.port}/v1`, apiKey: 'none', maxRetries: 0 });
  for (const stream of [false, true]) {
    await check(`${format.name}: two-step tool loop (${stream ? 'streamed' : 'not streamed'})`,
                () => toolLoop(client, format, stream));
  }
  await check(`${format.name}: a named function is the one called`, async () => {
    const r = await client.chat.completions.create({ ...sampling, messages: question, tools,
      tool_choice: { type: 'function', function: { name: 'get_time' } } });
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    assert.equal(r.choices[0].message.tool_calls.length, 1);
    assert.equal(r.choices[0].message.tool_calls[0].function.name, 'get_time');
    checkCall(format, r.choices[0].message.tool_calls[0]);
  });
  if (format.own) {
    await check('tool_choice auto: after a forced opening only a declared call can follow (lazy grammar)', async () => {
      const tok = await (await fetch(`http://127.0.0.1:${s.port}/tokenize`, {
        method: 'POST', body: JSON.stringify({ content: '<tool_call>' }) })).json();
      assert.equal(tok.tokens.length, 1);
      const bias = { [tok.tokens[0]]: 100 };  // the opening is the greedy choice wherever it is allowed
      const r = await client.chat.completions.create({ ...sampling, messages: question, tools, tool_choice: 'auto',
                                                       parallel_tool_calls: false, logit_bias: bias });
      assert.equal(r.choices[0].finish_reason, 'tool_calls');
      assert.equal(r.choices[0].message.tool_calls.length, 1);
      checkCall(format, r.choices[0].message.tool_calls[0]);
      // The same bias with no grammar (tool_choice none): the opening and no call that parses.
      const free = await client.chat.completions.create({ ...sampling, max_tokens: 24, messages: question, tools,
                                                          tool_choice: 'none', logit_bias: bias });
      assert.equal(free.choices[0].message.tool_calls, undefined);
      assert.ok(free.choices[0].message.content.startsWith('<tool_call>'), free.choices[0].message.content);
    });
    await check('a call cut by max_tokens keeps its arguments so far, streamed or not, with finish_reason length', async () => {
      const request = { ...sampling, messages: question, tools, tool_choice: 'required', parallel_tool_calls: false };
      const whole = await client.chat.completions.create(request);
      const full = whole.choices[0].message.tool_calls[0].function;
      const cutRequest = { ...request, max_tokens: whole.usage.completion_tokens - 3 };
      const cut = await client.chat.completions.create(cutRequest);
      assert.equal(cut.choices[0].finish_reason, 'length');
      assert.equal(cut.choices[0].message.tool_calls.length, 1);
      const part = cut.choices[0].message.tool_calls[0].function;
      assert.equal(part.name, full.name);
      assert.ok(full.arguments.startsWith(part.arguments), `${part.arguments} | ${full.arguments}`);
      let streamed = '', finish = null;
      for await (const chunk of await client.chat.completions.create({ ...cutRequest, stream: true })) {
        for (const d of chunk.choices[0]?.delta?.tool_calls || []) streamed += d.function?.arguments || '';
        finish = chunk.choices[0]?.finish_reason || finish;
      }
      assert.equal(streamed, part.arguments);
      assert.equal(finish, 'length');
    });
    await check('a bad tool definition is a BadRequestError naming tools', async () => {
      await assert.rejects(
        client.chat.completions.create({ ...sampling, messages: question, tools: [{ type: 'function', function: {} }] }),
        (e) => e instanceof OpenAI.BadRequestError && e.param === 'tools' && /function.name/.test(e.message),
      );
    });
  }
  await s.stop();
  if (file) fs.rmSync(file, { force: true });
}

// Mistral's [TOOL_CALLS] as the control token it is in Mistral's own vocabularies (text "" when
// detokenised): Qwen 3's vocabulary with its unused control token <|box_start|> renamed so. A forced
// call opens with that token (its logprob entry's text is "[TOOL_CALLS]" whole, with its bytes, as
// the output spells it: not "" and not "[" of the text spelled in pieces), and the reply still parses
// into tool_calls with no content.
{
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kvq_openai_tools_control_'));
  const vocab = JSON.parse(fs.readFileSync(path.join(tokenizerDir, 'tokenizer.json'), 'utf8'));
  const renamed = vocab.added_tokens.find((t) => t.content === '<|box_start|>');
  assert.ok(renamed && renamed.special);
  renamed.content = '[TOOL_CALLS]';
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(vocab));
  fs.copyFileSync(path.join(tokenizerDir, 'tokenizer_config.json'), path.join(dir, 'tokenizer_config.json'));
  const controlModel = path.join(dir, 'model.gguf');
  execFileSync(kvq, ['synth', '--arch', 'qwen3', '--dim', '64', '--layers', '2', '--heads', '4', '--kv-heads', '2',
                     '--ffn', '128', '--context', '2048', '--embeddings', 'tied', '--type', 'f16', '--seed', '5',
                     '--vocab', path.join(dir, 'tokenizer.json'), '-o', controlModel, '--force', '-t', '2'],
               { stdio: ['ignore', 'ignore', 'inherit'] });
  const format = formats.find((f) => f.name.startsWith('Mistral'));
  const file = path.join(dir, 'mistral.jinja');
  fs.writeFileSync(file, format.template);
  const s = await startServer(file, controlModel);
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${s.port}/v1`, apiKey: 'none', maxRetries: 0 });
  const controlSampling = { ...sampling, model: path.basename(controlModel, '.gguf') };
  await check('Mistral Nemo, [TOOL_CALLS] a control token: a forced call opens with it and parses', async () => {
    const tok = await (await fetch(`http://127.0.0.1:${s.port}/tokenize`, {
      method: 'POST', body: JSON.stringify({ content: '[TOOL_CALLS]' }) })).json();
    assert.deepEqual(tok.tokens, [renamed.id]);
    const r = await client.chat.completions.create({ ...controlSampling, messages: question, tools,
      tool_choice: 'required', parallel_tool_calls: false, logprobs: true });
    const entries = r.choices[0].logprobs.content;
    assert.equal(entries[0].token, '[TOOL_CALLS]');
    assert.deepEqual(entries[0].bytes, [...Buffer.from('[TOOL_CALLS]', 'utf8')]);
    // The entries spell the reply the parser read: the control token's text, then the call.
    const spelled = entries.map((e) => e.token).join('');
    assert.ok(spelled.startsWith('[TOOL_CALLS][{') && spelled.includes(r.choices[0].message.tool_calls[0].function.name), spelled);
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    assert.equal(r.choices[0].message.content, null);
    assert.equal(r.choices[0].message.tool_calls.length, 1);
    checkCall(format, r.choices[0].message.tool_calls[0]);
    // Streamed: the same call, and no content (the control text is never shown).
    let content = '', name = '', args = '';
    for await (const chunk of await client.chat.completions.create({ ...controlSampling, messages: question, tools,
      tool_choice: 'required', parallel_tool_calls: false, stream: true })) {
      content += chunk.choices[0]?.delta?.content || '';
      for (const d of chunk.choices[0]?.delta?.tool_calls || []) {
        name += d.function?.name || '';
        args += d.function?.arguments || '';
      }
    }
    assert.equal(content, '');
    assert.equal(name, r.choices[0].message.tool_calls[0].function.name);
    assert.equal(args, r.choices[0].message.tool_calls[0].function.arguments);
  });
  await s.stop();
  fs.rmSync(dir, { recursive: true, force: true });
}

fs.rmSync(model, { force: true });
process.exit(failed ? 1 : 0);
