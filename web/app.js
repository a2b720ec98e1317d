// The page's UI: the form, the streamed output, the numbers and the errors. The model runs in
// worker.js; this module only talks to it. window.kvqPage is the hook a test driver uses
// (tests/web/browser/): ready (a promise), generate(opts) → {ids, text, ...}, tokenize(text).

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const want_simd = params.get('simd') !== '0';

// ---- errors, shown in the page (and the console) ----
let n_errors = 0;
function ShowError(message) {
  console.error(message);
  const list = $('errors');
  if (n_errors++ === 0) list.textContent = '';
  const item = document.createElement('li');
  item.textContent = `${new Date().toLocaleTimeString()}: ${message}`;
  list.append(item);
}
window.addEventListener('error', (e) => ShowError(`page: ${e.message}`));
window.addEventListener('unhandledrejection', (e) => ShowError(`page: ${e.reason?.message ?? e.reason}`));

function SetStatus(state, text) {
  const status = $('status');
  status.dataset.state = state;
  status.textContent = text;
}

// ---- the worker, one request at a time per id ----
const worker = new Worker('./worker.js');
const pending = new Map();  // request id → {resolve, reject, on_progress}
let next_id = 1;

worker.onmessage = (event) => {
  const m = event.data;
  const request = pending.get(m.id);
  if (!request) {
    if (m.type === 'error') ShowError(m.message);
    return;
  }
  if (m.type === 'progress') {
    request.on_progress?.(m);
    return;
  }
  pending.delete(m.id);
  if (m.type === 'error') {
    request.reject(new Error(m.message));
  } else {
    request.resolve(m.type === 'done' ? m : m.result);
  }
};
worker.onerror = (e) => {
  e.preventDefault();
  const message = `worker: ${e.message || 'failed to start (is the page served over HTTP?)'}`;
  ShowError(message);
  for (const request of pending.values()) request.reject(new Error(message));
  pending.clear();
  SetStatus('error', 'The worker failed; see Errors.');
};

function Ask(type, fields = {}, transfer = [], on_progress = null) {
  const id = next_id++;
  return new Promise((resolve, reject) => {
    pending.set(id, {resolve, reject, on_progress});
    worker.postMessage({type, id, ...fields}, transfer);
  });
}

// ---- formatting ----
const Int = (n) => Math.round(n).toLocaleString('en-US');
function Bytes(n) {
  if (n < 1024) return `${Int(n)} B`;
  const units = ['KiB', 'MiB', 'GiB'];
  let v = n / 1024;
  let u = 0;
  while (v >= 1024 && u + 1 < units.length) v /= 1024, ++u;
  return `${v.toFixed(v < 10 ? 2 : 1)} ${units[u]} (${Int(n)} B)`;
}
const Rate = (n, ms) => (ms > 0 ? `${Int(n / (ms / 1000))} tok/s` : '–');

// ---- state shown on the page ----
const page = {build: null, simd_target: null, formats: [], model: null};

function ShowModel(loaded) {
  page.model = loaded;
  const i = loaded.info;
  $('model-name').textContent = loaded.name;
  $('model-info').textContent = `${i.architecture}, ${i.n_layers} layers, dim ${i.dim}, ${i.n_heads} heads ` +
      `(${i.n_kv_heads} KV, head_dim ${i.head_dim}), vocab ${i.vocab_size}, context ${i.context}, ` +
      `weights ${Bytes(i.weight_bytes)}`;
  // Whether the GPU path runs this model, or why it falls back to WebAssembly.
  if (page.gpu) {
    $('st-path').textContent = loaded.gpu === 'supported' ? `GPU path: runs ${loaded.name} (WebGPU on ${page.gpu})` :
        `CPU: ${page.cpu_path} for ${loaded.name} (${loaded.gpu}; it runs on WebAssembly)`;
  }
  ShowHeap(loaded.heap_bytes);
}

function ShowHeap(heap_bytes) {
  $('st-heap').textContent = Bytes(heap_bytes);
  const memory = performance.memory;  // Chromium only
  $('st-jsheap').textContent = memory ?
      `${Bytes(memory.usedJSHeapSize)} used of ${Bytes(memory.totalJSHeapSize)} (limit ${Bytes(memory.jsHeapSizeLimit)})` :
      'not available in this browser';
}

// Which path ran the generation, and why not the GPU when it did not.
function ShowPath(path) {
  $('st-path').textContent = path.device === 'gpu'
      ? `GPU: WebGPU on ${path.adapter} (the module's forward pass as WGSL kernels, KV master in this tab's memory)`
      : `CPU: ${page.cpu_path}${path.why === 'asked for' ? '' : ` (not the GPU: ${path.why})`}`;
}

function ShowProgress(m) {
  const t = m.timing;
  if (m.path) ShowPath(m.path);
  $('text').textContent = m.text;
  const ids = $('ids');
  ids.textContent += (ids.textContent && m.new_ids.length ? ' ' : '') + m.new_ids.join(' ');
  $('st-prefill').textContent = `${Rate(t.n_prompt, t.prefill_ms)} (${t.n_prompt} tokens in ${t.prefill_ms.toFixed(1)} ms)`;
  $('st-decode').textContent = t.n_generated ?
      `${Rate(t.n_generated, t.decode_ms)} (${t.n_generated} tokens in ${t.decode_ms.toFixed(1)} ms)` : '–';
  const s = m.stats.session;
  if (s) {
    $('st-positions').textContent = `${Int(s.positions)} of ${Int(s.context)}`;
    $('st-kv-token').textContent = `${Int(s.kv_bytes_per_token)} B with K ${s.kv_key_format}, V ${s.kv_value_format}` +
        ` — f16: ${Int(s.kv_f16_bytes_per_token)} B (${(100 * s.kv_bytes_per_token / s.kv_f16_bytes_per_token).toFixed(1)}%)`;
    $('st-kv-total').textContent = `${Bytes(s.positions * s.kv_bytes_per_token)} — f16: ` +
        `${Bytes(s.positions * s.kv_f16_bytes_per_token)}`;
    $('st-kv-held').textContent = `${Bytes(s.kv_bytes)}` +
        (s.device_budget_bytes ? ` (device budget ${Bytes(s.device_budget_bytes)})` : '');
  }
  ShowHeap(m.stats.heap_bytes);
}

// ---- generation: the form and the hook both come here ----
let running = false;

function SetRunning(on) {
  running = on;
  $('generate').disabled = on;
  $('stop').disabled = !on;
  $('load-picked').disabled = on;
  $('load-bundled').disabled = on;
}

async function Run(p) {
  if (running) throw new Error('a generation is running');
  SetRunning(true);
  SetStatus('running', 'Generating…');
  $('text').textContent = '';
  $('ids').textContent = '';
  try {
    const done = await Ask('generate', {params: p}, [], ShowProgress);
    ShowProgress(done);
    const t = done.timing;
    SetStatus('done', `${done.stopped ? 'Stopped' : 'Done'}: ${t.n_generated} tokens after a ` +
        `${t.n_prompt}-token prompt${done.context_full ? `, stopped at the model's context of ${done.context}` : ''}.`);
    return {ids: done.ids, text: done.text, n_prompt: t.n_prompt, stopped: done.stopped, end_token: done.end_token,
            timing: t, stats: done.stats, path: done.path};
  } catch (e) {
    SetStatus('error', 'Failed; see Errors.');
    ShowError(e.message);
    throw e;
  } finally {
    SetRunning(false);
  }
}

function NumberField(id, name, {integer = false, min = -Infinity, max = Infinity} = {}) {
  const raw = $(id).value.trim();
  const v = Number(raw);
  if (raw === '' || !Number.isFinite(v) || (integer && !Number.isInteger(v)) || v < min || v > max) {
    throw new Error(`${name}: "${raw}" is not ${integer ? 'an integer' : 'a number'} in [${min}, ${max}]`);
  }
  return v;
}

function FormParams() {
  const seed_raw = $('seed').value.trim();
  let seed;
  if (seed_raw === '') {
    seed = crypto.getRandomValues(new Uint32Array(1))[0] & 0x7fffffff;
  } else {
    seed = NumberField('seed', 'Seed', {integer: true, min: 0, max: 0x7fffffff});
  }
  const kv_k = $('kv-k').value.trim();
  const kv_v = $('kv-v').value.trim();
  if (!kv_k || !kv_v) throw new Error('K and V formats: both are needed (for example f16)');
  return {
    prompt: $('prompt').value,
    temperature: NumberField('temperature', 'Temperature', {min: 0}),
    top_k: NumberField('top-k', 'Top-k', {integer: true, min: 0}),
    top_p: NumberField('top-p', 'Top-p', {min: 0, max: 1}),
    min_p: NumberField('min-p', 'Min-p', {min: 0, max: 1}),
    seed,
    max_tokens: NumberField('max-tokens', 'Max new tokens', {integer: true, min: 1}),
    kv_k,
    kv_v,
    device_budget_bytes: NumberField('budget', 'Device budget', {min: 0}) * 1024 * 1024,
    device: $('device').value,
  };
}

$('gen-form').addEventListener('submit', async (event) => {
  event.preventDefault();
  let p;
  try {
    p = FormParams();
  } catch (e) {
    ShowError(e.message);
    return;
  }
  if ($('seed').value.trim() === '') $('seed').placeholder = `random (last: ${p.seed})`;
  await Run(p).catch(() => {});  // shown already
});
$('stop').addEventListener('click', () => worker.postMessage({type: 'stop'}));

// ---- picking a model: picker.js is only needed by someone who brings their own files ----
let picker = null;
async function Picker() {
  picker ??= await import('./picker.js');
  return picker;
}
const UpdatePicked = () => {
  $('load-picked').disabled = running || $('model-file').files.length === 0;
};
$('model-file').addEventListener('change', UpdatePicked);
$('tok-file').addEventListener('change', UpdatePicked);

async function Load(type, fields, transfer, what) {
  SetRunning(true);
  SetStatus('loading', `Loading ${what}…`);
  try {
    ShowModel(await Ask(type, fields, transfer));
    SetStatus('ready', 'Ready.');
  } catch (e) {
    SetStatus('error', 'Loading failed; see Errors.');
    ShowError(e.message);
  } finally {
    SetRunning(false);
    UpdatePicked();
  }
}

$('load-picked').addEventListener('click', async () => {
  try {
    const {ReadModelFiles} = await Picker();
    const files = await ReadModelFiles($('model-file').files[0], $('tok-file').files[0] ?? null);
    const transfer = [files.model.bytes, ...(files.tokenizer ? [files.tokenizer.bytes] : [])];
    await Load('load', {files}, transfer, files.model.name);
  } catch (e) {
    ShowError(e.message);
  }
});
$('load-bundled').addEventListener('click', () => Load('load_bundled', {}, [], 'stories260K'));

// ---- start: the module, its formats, the bundled model ----
async function Start() {
  const info = await Ask('init', {simd: want_simd});
  page.build = info.build;
  page.simd_target = info.simd_target;
  page.formats = info.formats;
  page.cpu_path = info.build === 'simd128' ?
      `WebAssembly SIMD128 (kvq.js; Highway target ${info.simd_target})` :
      `scalar (kvq-scalar.js; Highway target ${info.simd_target}) — ${info.simd_supported ?
          'SIMD is available but ?simd=0 asked for scalar' : 'this browser has no WebAssembly SIMD'}`;
  page.gpu = info.gpu;
  $('st-path').textContent = `CPU: ${page.cpu_path}; GPU: ${info.gpu ? `WebGPU on ${info.gpu}` : info.gpu_why_not}`;
  const list = $('kv-formats');
  for (const f of info.formats) {
    const option = document.createElement('option');
    option.value = f.name;
    option.label = `${f.name}: ${Number(f.bits_per_value.toFixed(3))} bits per value`;
    list.append(option);
  }
  $('format-list').textContent = info.formats.map((f) => `${f.name} (${Number(f.bits_per_value.toFixed(3))} bits)`).join(', ');
  SetStatus('loading', 'Loading the bundled stories260K…');
  ShowModel(await Ask('load_bundled'));
  SetStatus('ready', 'Ready.');
  $('generate').disabled = false;
  $('load-bundled').disabled = false;
  return {build: info.build, simd_target: info.simd_target, formats: info.formats, gpu: info.gpu,
          gpu_why_not: info.gpu_why_not};
}

const ready = Start().catch((e) => {
  SetStatus('error', 'Could not start; see Errors.');
  ShowError(e.message);
  throw e;
});

// The test hook. opts: {prompt, kv_k, kv_v (default kv_k), n_positions (BOS and prompt included) or
// max_tokens, temperature (default 0 = greedy), top_k, top_p, min_p, seed, device_budget_bytes,
// device ('auto' default, 'cpu', 'gpu')}; the result's path says which ran.
window.kvqPage = {
  ready,
  generate: async (opts) => {
    await ready;
    const p = {
      prompt: opts.prompt ?? '',
      kv_k: opts.kv_k ?? 'f16',
      kv_v: opts.kv_v ?? opts.kv_k ?? 'f16',
      temperature: opts.temperature ?? 0,
      top_k: opts.top_k ?? 0,
      top_p: opts.top_p ?? 1,
      min_p: opts.min_p ?? 0,
      seed: opts.seed ?? 0,
      device_budget_bytes: opts.device_budget_bytes ?? 0,
      device: opts.device ?? 'auto',
    };
    if (opts.n_positions !== undefined) p.n_positions = opts.n_positions;
    else p.max_tokens = opts.max_tokens ?? 256;
    return Run(p);
  },
  tokenize: async (text) => (await ready, (await Ask('tokenize', {text})).ids),
};
