// The chat page: the conversation, its settings and each reply's figures. It talks to a transport
// (transport.js): the kvq serve that served it, or the in-tab runtime (?runtime=tab, or where no
// server answers). Text is shown as text (textContent), never parsed as HTML. In the tab, greedy
// replies run on the WebGPU path where the browser offers a GPU that is not an emulation (?gpu=1:
// even then; ?gpu=0: never), the rest on WebAssembly, as the runtime page's 'auto'.
// window.kvqChat is the hook a test driver uses: ready (a promise of {runtime}), render(messages,
// template_override) (the prompt text the model is given; an override only in the tab), load(files),
// turns() (the in-tab replies' ids and prompt reuse).
import {ServerTransport, TabTransport} from './transport.js';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);

// ---- errors and status ----
function ShowError(message) {
  console.error(message);
  const list = $('errors');
  list.querySelector('.muted')?.remove();
  const item = document.createElement('li');
  item.textContent = `${new Date().toLocaleTimeString()}: ${message}`;
  list.append(item);
}
window.addEventListener('unhandledrejection', (e) => ShowError(`page: ${e.reason?.message ?? e.reason}`));

function SetStatus(state, text) {
  $('status').dataset.state = state;
  $('status').textContent = text;
}

const Int = (n) => Math.round(n).toLocaleString('en-US');

// ---- the conversation: [{role, content}] as the API takes it; each shown as an <li> ----
const conversation = [];
let transport = null;
let running = false;

function MessageItem(role, text) {
  const item = document.createElement('li');
  item.className = `message ${role}`;
  const who = document.createElement('span');
  who.className = 'role';
  who.textContent = role;
  const body = document.createElement('div');
  body.className = 'text';
  body.textContent = text;
  const stats = document.createElement('div');
  stats.className = 'reply-stats';
  item.append(who, body, stats);
  $('messages').append(item);
  item.scrollIntoView({block: 'end'});
  return item;
}

function SetRunning(on) {
  running = on;
  $('send').disabled = on || !transport;
  $('stop').disabled = !on;
  $('regenerate').disabled = on || !transport || !conversation.some((m) => m.role === 'assistant');
  $('clear').disabled = on;
  document.body.dataset.running = on ? 'yes' : 'no';
}

function NumberField(id, name, {integer = false, min = -Infinity, max = Infinity}) {
  const raw = $(id).value.trim();
  const v = Number(raw);
  if (raw === '' || !Number.isFinite(v) || (integer && !Number.isInteger(v)) || v < min || v > max) {
    throw new Error(`${name}: "${raw}" is not ${integer ? 'an integer' : 'a number'} in [${min}, ${max}]`);
  }
  return v;
}

// The seed field: empty = random (null); else any 64-bit seed, as `kvq run --seed` and the runtime
// page take it, kept as its digits (leading zeros dropped): a Number past 2^53 has lost its low bits.
function SeedField() {
  const raw = $('seed').value.trim();
  if (raw === '') return null;
  if (!/^[0-9]+$/.test(raw) || BigInt(raw) >= 1n << 64n) {
    throw new Error(`Seed: "${raw}" is not a whole number in [0, ${(1n << 64n) - 1n}] (empty = random)`);
  }
  return BigInt(raw).toString();
}

function Sampling() {
  return {
    temperature: NumberField('temperature', 'Temperature', {min: 0, max: 2}),
    top_p: NumberField('top-p', 'Top-p', {min: 0, max: 1}),
    max_tokens: NumberField('max-tokens', 'Max tokens', {integer: true, min: 1}),
    seed: SeedField(),
  };
}

// The messages the model is given: the system prompt (when set) first.
function Messages() {
  const system = $('system').value.trim();
  return system ? [{role: 'system', content: system}, ...conversation] : conversation.slice();
}

async function ShowModel() {
  const d = await transport.Describe();
  $('model-name').textContent = d.model;
  $('runtime').textContent = d.runtime;
  $('kv-format').textContent = d.kv_format;
  $('kv-bytes').textContent = `${Int(d.kv_bytes)} bytes`;
  $('kv-bytes').dataset.bytes = String(d.kv_bytes);
  $('kv-note').textContent = d.kv_note;
}

// Runs the model on the conversation; its reply is appended (streamed into a new item).
async function Reply() {
  let sampling;
  try {
    sampling = Sampling();
  } catch (e) {
    ShowError(e.message);
    return;
  }
  SetRunning(true);
  SetStatus('running', 'Replying…');
  const item = MessageItem('assistant', '');
  item.dataset.state = 'streaming';
  const body = item.querySelector('.text');
  try {
    const r = await transport.Chat(Messages(), sampling, (delta) => {
      body.textContent += delta;
    });
    body.textContent = r.text;
    conversation.push({role: 'assistant', content: r.text});
    const figures = [];
    if (r.prompt_tokens !== null) figures.push(`prompt ${Int(r.prompt_tokens)} tokens (${Int(r.reused_tokens)} reused)`);
    if (r.completion_tokens !== null) figures.push(`${Int(r.completion_tokens)} generated`);
    if (r.tokens_per_second) figures.push(`${r.tokens_per_second.toFixed(1)} tok/s`);
    figures.push(r.stopped ? 'stopped' : `finish: ${r.finish ?? '?'}`);
    item.querySelector('.reply-stats').textContent = figures.join(' · ');
    item.dataset.state = r.stopped ? 'stopped' : 'done';
    Object.assign(item.dataset, {promptTokens: r.prompt_tokens ?? '', reusedTokens: r.reused_tokens ?? '',
                                 completionTokens: r.completion_tokens ?? '', tokensPerSecond: r.tokens_per_second ?? ''});
    SetStatus('done', r.stopped ? 'Stopped.' : 'Ready.');
  } catch (e) {
    item.dataset.state = 'error';
    item.querySelector('.reply-stats').textContent = 'failed';
    SetStatus('error', 'The reply failed; see Errors.');
    ShowError(e.message);
  } finally {
    SetRunning(false);
  }
  await ShowModel().catch((e) => ShowError(e.message));
}

$('chat-form').addEventListener('submit', async (event) => {
  event.preventDefault();
  const text = $('input').value;
  if (running || !transport || text.trim() === '') return;
  $('input').value = '';
  conversation.push({role: 'user', content: text});
  MessageItem('user', text);
  await Reply();
});
// Enter sends, Shift+Enter is a new line.
$('input').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey) {
    e.preventDefault();
    $('chat-form').requestSubmit();
  }
});
$('stop').addEventListener('click', () => transport?.Stop());
// Regenerate: the last reply is dropped and asked for again.
$('regenerate').addEventListener('click', async () => {
  const last = conversation.findLastIndex((m) => m.role === 'assistant');
  if (running || last < 0) return;
  conversation.splice(last);
  const items = $('messages').querySelectorAll('li.message.assistant');
  items[items.length - 1]?.remove();
  await Reply();
});
$('clear').addEventListener('click', () => {
  conversation.length = 0;
  $('messages').textContent = '';
  SetRunning(false);
});

// ---- the in-tab runtime's model: the bundled one, or files picked here ----
async function LoadInTab(files) {
  SetRunning(true);
  $('send').disabled = true;
  SetStatus('loading', `Loading ${files ? files.model.name : 'the bundled stories260K'} into this tab…`);
  try {
    await transport.Load(files);
    await ShowModel();
    SetStatus('ready', 'Ready.');
  } catch (e) {
    SetStatus('error', 'Loading failed; see Errors.');
    ShowError(e.message);
  } finally {
    SetRunning(false);
  }
}

// chosen: the page was asked for the tab (?runtime=tab) rather than falling back to it, so there is
// a server to go back to.
function SetupTab(chosen) {
  $('tab-settings').hidden = false;
  $('switch').href = '?';
  $('switch').textContent = 'Chat with the server instead';
  $('switch').hidden = !chosen;
  $('load-bundled').addEventListener('click', () => LoadInTab(null));
  $('load-picked').addEventListener('click', async () => {
    try {
      const {CheckModelFiles} = await import('../picker.js');
      await LoadInTab(await CheckModelFiles($('model-file').files[0], $('tok-file').files[0] ?? null));
    } catch (e) {
      ShowError(e.message);
    }
  });
  const kv = () => transport.SetKv($('kv-k').value.trim() || 'f16', $('kv-v').value.trim() || 'f16');
  $('kv-k').addEventListener('change', kv);
  $('kv-v').addEventListener('change', kv);
}

function SetupServer() {
  $('server-settings').hidden = false;
  $('switch').href = '?runtime=tab';
  $('switch').textContent = 'Run a model in this tab instead';
  // Offered only where the in-tab runtime was built (the web bundle is served beside this page).
  fetch('../worker.js').then((r) => {
    if (transport.kind === 'server') $('switch').hidden = !r.ok;  // not if the page fell back to the tab
  }, () => {});
  $('api-key').addEventListener('change', async () => {
    transport.api_key = $('api-key').value.trim();
    await ShowModel().then(() => SetStatus('ready', 'Ready.')).catch((e) => ShowError(e.message));
  });
}

// ---- start: the server when one answers (or says it wants a key), else this tab ----
async function Start() {
  SetRunning(false);
  if (params.get('runtime') !== 'tab') {
    const server = new ServerTransport('');
    try {
      transport = server;
      SetupServer();
      // A server still loading its model answers 503 until it is ready: wait for it.
      for (;;) {
        try {
          await ShowModel();
          break;
        } catch (e) {
          if (!/HTTP 503/.test(e.message)) throw e;
          SetStatus('loading', 'The server is loading its model…');
          await new Promise((resolve) => setTimeout(resolve, 1000));
        }
      }
      SetStatus('ready', 'Ready.');
      SetRunning(false);
      return {runtime: 'server'};
    } catch (e) {
      if (/HTTP 401/.test(e.message)) {
        SetStatus('error', 'This server wants an API key: enter it under Settings.');
        SetRunning(false);
        return {runtime: 'server'};
      }
      // No kvq serve behind this page (a static server): the in-tab runtime.
      $('server-settings').hidden = true;
      SetStatus('loading', `No kvq serve answered (${e.message}); starting the in-tab runtime…`);
    }
  }
  transport = new TabTransport();
  SetupTab(params.get('runtime') === 'tab');
  const build = await transport.Start(params.get('simd') !== '0',
                                      {gpu: params.get('gpu') !== '0', gpu_forced: params.get('gpu') === '1'});
  SetStatus('ready', `In-tab runtime ready (WebAssembly ${build.build}): load a model.`);
  if (params.get('model') !== 'none') await LoadInTab(null);
  return {runtime: 'tab', build: build.build};
}

const ready = Start().catch((e) => {
  SetStatus('error', 'Could not start; see Errors.');
  ShowError(e.message);
  throw e;
});

window.kvqChat = {
  ready,
  render: async (messages, template_override) => (await ready, transport.RenderPrompt(messages, template_override)),
  load: async (files) => (await ready, LoadInTab(files)),
  // The in-tab runtime's replies so far (TabTransport.turns: their ids, reused and prefilled tokens).
  turns: () => transport?.turns ?? [],
};
