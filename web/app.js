// The page's UI: the form, the streamed output, the numbers and the errors. The model runs in
// worker.js; this module only talks to it. window.kvqPage is the hook a test driver uses
// (tests/web/browser/): ready (a promise), generate(opts) → {ids, text, completion, finish_reason, ...}, tokenize(text),
// loadProgress() (the last load's progress events), stop(), bench(opts) → the benchmark's JSON.

import {SeedWords} from './gpu/module_sampler.js';

const $ = (id) => document.getElementById(id);

// ---- settings from the address, for reproducible runs: ?simd=0 ?threads=N ?gpu=0 ?gpu=1 ----
// ?gpu=1: the GPU path even on a CPU-emulated adapter (SwiftShader), a picked GGUF file then loaded
// from its header alone as on a real GPU (its weights go from the file to GPU buffers).
const params = new URLSearchParams(location.search);
const want_simd = params.get('simd') !== '0';
const want_gpu = params.get('gpu') !== '0';
const gpu_forced = params.get('gpu') === '1';
let want_threads = null;  // null: every core the browser reports
let settings_error = '';
if (params.has('threads')) {
  const n = Number(params.get('threads'));
  if (Number.isInteger(n) && n >= 1 && n <= 256) want_threads = n;
  else settings_error = `?threads=${params.get('threads')}: use a whole number of threads from 1 to 256`;
}

// ---- errors: each beside the control that caused it, until dismissed or that control runs again ----
// where: 'load' (the model buttons), 'generate' (the form), 'page' (anything else).
function ShowError(where, message) {
  console.warn(message);  // shown to the user; not a fault of the page
  const box = $(`${where}-error`);
  box.querySelector('.msg').textContent = message;
  box.hidden = false;
}
const ClearError = (where) => ($(`${where}-error`).hidden = true);
for (const box of document.querySelectorAll('.error-box')) {
  box.querySelector('.dismiss').addEventListener('click', () => (box.hidden = true));
}
window.addEventListener('error', (e) => ShowError('page', e.message));
window.addEventListener('unhandledrejection', (e) => ShowError('page', `${e.reason?.message ?? e.reason}`));

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
    if (m.type === 'error') ShowError('page', m.message);
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
  const message = `The model runner stopped: ${e.message || 'it failed to start (is the page served over HTTP?)'}`;
  ShowError('page', message);
  for (const request of pending.values()) request.reject(new Error(message));
  pending.clear();
  SetStatus('error', 'The model runner failed.');
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
// Three significant digits at least: 0.52 tok/s is not "1 tok/s", nor 0.4 "0 tok/s".
function Rate(n, ms) {
  if (!(ms > 0)) return '–';
  const v = n / (ms / 1000);
  return `${v.toFixed(v >= 100 ? 0 : v >= 10 ? 1 : 2)} tok/s`;
}

// ---- state shown on the page ----
const page = {build: null, simd_target: null, formats: [], model: null, load_progress: []};

// The figures of a run: cleared when the model changes, so none of them describes another model.
const kRunFigures = ['st-prefill', 'st-decode', 'st-positions', 'st-kv-token', 'st-kv-total', 'st-kv-held', 'st-gpu',
                     'st-held'];
function ClearNumbers() {
  for (const id of kRunFigures) $(id).textContent = '–';
  $('text').textContent = '';
  $('ids').textContent = '';
}

// The KV formats this model can use, with their bits per number at its head size.
function ShowFormats(formats, head_dim) {
  page.formats = formats;
  const list = $('kv-formats');
  list.textContent = '';
  for (const f of formats) {
    const option = document.createElement('option');
    option.value = f.name;
    option.label = `${f.name}: ${Number(f.bits_per_value.toFixed(3))} bits per value`;
    list.append(option);
  }
  $('format-list').textContent = `(bits per number at head size ${head_dim}) ` +
      formats.map((f) => `${f.name} (${Number(f.bits_per_value.toFixed(3))} bits)`).join(', ');
}

function ShowModel(loaded) {
  page.model = loaded;
  const i = loaded.info;
  ClearNumbers();
  ShowFormats(loaded.formats, i.head_dim);
  $('model-name').textContent = loaded.name;
  $('model-info').textContent = `${i.architecture}, ${i.n_layers} layers, dim ${i.dim}, ${i.n_heads} heads ` +
      `(${i.n_kv_heads} KV, head_dim ${i.head_dim}), vocab ${i.vocab_size}, context ${i.context}, ` +
      `weights ${Bytes(i.weight_bytes)}`;
  // Whether the GPU path runs this model, or why it falls back to WebAssembly.
  if (page.gpu) {
    $('st-path').textContent = loaded.gpu === 'supported' ? `GPU path: runs ${loaded.name} (WebGPU on ${page.gpu})` :
        `CPU: ${page.cpu_path} for ${loaded.name} (${loaded.gpu}; it runs on WebAssembly)`;
  }
  $('st-file').textContent = Bytes(loaded.file_bytes);
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
  if (m.prefill) {  // a block of the prompt has run
    $('st-prefill').textContent = `${Int(m.prefill.held)} of ${Int(m.prefill.total)} prompt tokens… ` +
        `(${Rate(t.n_prompt_held, t.prefill_ms)})`;
    return;
  }
  $('text').textContent = m.text;
  const ids = $('ids');
  ids.textContent += (ids.textContent && m.new_ids.length ? ' ' : '') + m.new_ids.join(' ');
  $('st-prefill').textContent = `${Rate(t.n_prompt_held, t.prefill_ms)} (${t.n_prompt_held} tokens in ${t.prefill_ms.toFixed(1)} ms` +
      `${t.n_prompt_held < t.n_prompt ? `, stopped with ${t.n_prompt - t.n_prompt_held} of the prompt left` : ''})`;
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
  const g = m.stats.gpu;
  const kv_gpu = g?.kv_gpu_bytes ?? s?.device_bytes ?? 0;
  $('st-gpu').textContent = g ? `${Bytes(g.weight_bytes + kv_gpu)} (weights ${Bytes(g.weight_bytes)}, ` +
      `KV ${Bytes(kv_gpu)}); ${g.kv_path_why} — ${g.submits_per_step.toFixed(1)} submits and ` +
      `${g.readbacks_per_step.toFixed(1)} readbacks a token, matvec kernel ${g.matvec_kernel}` +
      (g.kv_streamed_bytes_per_step ? `, ${Bytes(g.kv_streamed_bytes_per_step)} of KV streamed from the master a token` : '') :
      'none (this run is on the CPU)';
  $('st-gpu-events').textContent = g ? DeviceEventsText(g.device_events) : '–';
  ShowHeap(m.stats.heap_bytes);
  if (s) ShowHeld(m.stats.heap_bytes, g ? g.weight_bytes + kv_gpu : 0, s.kv_bytes);
}

// The devices lost during this generation (worker_gpu.js's device_events: where the sequence went
// on, and what ran again there), in words; a loss is recovered from, never an error the user sees.
function DeviceEventsText(events) {
  if (!events?.length) return 'not lost during this generation';
  return events.map((e) => {
    const again = e.replayed?.positions ? `; ${Int(e.replayed.positions)} positions ran again there` +
        (e.replayed.ms !== undefined ? ` in ${e.replayed.ms.toFixed(0)} ms` : '') : '';
    return `lost at position ${Int(e.position)}: went on ${e.to === 'gpu' ? 'on a new WebGPU device' :
        'on the CPU (WebAssembly)'}${again} — ${e.why}`;
  }).join('; then ');
}

// The model held once: heap + GPU buffers against 1.15 x the file + the KV + the module's scratch
// (its initial memory and one heap growth step: kvq_web_memory_scratch_bytes).
function ShowHeld(heap, gpu_bytes, kv) {
  const file = page.model.file_bytes;
  const bound = 1.15 * file + kv + page.memory_scratch_bytes;
  $('st-held').textContent = `${Bytes(heap + gpu_bytes)}: ${heap + gpu_bytes <= bound ? 'within' : 'over'} ` +
      `1.15 × file ${Bytes(file)} + KV ${Bytes(kv)} + scratch ${page.memory_scratch_bytes / 1048576} MiB ` +
      `= ${Bytes(Math.floor(bound))}`;
}

// Why a generation ended, in words (its finish_reason first, as kvq run and kvq serve name it).
function FinishText(done) {
  switch (done.finish_reason) {
    case 'stop': return done.end_token ? 'stop, an end token' : 'stop, a stop string';
    case 'length': return 'length, the tokens asked for';
    case 'context': return `context, the model's context of ${Int(done.context)} is full`;
    case 'cancelled': return 'cancelled';
  }
  return done.finish_reason;
}

// ---- generation: the form and the hook both come here ----
let running = false;

function SetRunning(on) {
  running = on;
  $('generate').disabled = on || !page.model;
  $('bench-run').disabled = on || !page.model;
  $('stop').disabled = !on;
  $('load-picked').disabled = on;
  $('load-bundled').disabled = on;
}

async function Run(p) {
  if (running) throw new Error('a generation is running');
  SetRunning(true);
  ClearError('generate');
  SetStatus('running', 'Generating…');
  $('text').textContent = '';
  $('ids').textContent = '';
  try {
    const done = await Ask('generate', {params: p}, [], ShowProgress);
    ShowProgress(done);
    const t = done.timing;
    SetStatus('done', t.n_prompt_held < t.n_prompt ?
        `Stopped during the prompt: ${t.n_prompt_held} of its ${t.n_prompt} tokens ran (finish: cancelled).` :
        `${done.stopped ? 'Stopped' : 'Done'}: ${t.n_generated} tokens after a ${t.n_prompt}-token prompt ` +
        `(finish: ${FinishText(done)}).`);
    return {ids: done.ids, text: done.text, completion: done.completion, n_prompt: t.n_prompt, stopped: done.stopped,
            end_token: done.end_token, finish_reason: done.finish_reason, context_full: done.context_full,
            timing: t, stats: done.stats,
            path: done.path, threads: done.threads};
  } catch (e) {
    SetStatus('error', 'Generating failed.');
    ShowError('generate', e.message);
    throw e;
  } finally {
    SetRunning(false);
  }
}

// A number field's value; refused, naming the field, the value typed and what it takes, when it is
// empty, not a number, or outside [min, max] (above: a bound it must exceed).
function NumberField(id, name, {integer = false, min = -Infinity, max = Infinity, above = -Infinity} = {}) {
  const raw = $(id).value.trim();
  const v = Number(raw);
  if (raw === '' || !Number.isFinite(v) || (integer && !Number.isInteger(v)) || v < min || v > max || v <= above) {
    const range = above > -Infinity ? `> ${above}` : `in [${min}, ${max}]`;
    throw new Error(`${name}: "${raw}" is not ${integer ? 'an integer' : 'a number'} ${range}`);
  }
  return v;
}

// The seed field: empty = a random seed (31 bits, shown in the placeholder after the run); else a
// whole number in [0, 2^64 - 1], passed whole (module_sampler.js's SeedWords: never wrapped), as
// a Number up to 2^53 - 1 and as its digits beyond (a Number there has lost its low bits).
function SeedField() {
  const raw = $('seed').value.trim();
  if (raw === '') return crypto.getRandomValues(new Uint32Array(1))[0] & 0x7fffffff;
  const digits = /^[0-9]+$/.test(raw) ? BigInt(raw).toString() : null;  // leading zeros dropped
  try {
    SeedWords(digits ?? raw);
  } catch {
    throw new Error(`Seed: "${raw}" is not a whole number in [0, ${(1n << 64n) - 1n}] (empty = random)`);
  }
  return Number.isSafeInteger(Number(digits)) ? Number(digits) : digits;
}

// The logit bias field: "ID:BIAS" entries separated by commas or spaces ("15043:-100, 29871:+2.5"),
// as [[token id, bias], ...] (an id given twice: its biases add, as kvq's sampler applies them in
// turn). Each id must be in the loaded model's vocabulary and each bias a finite number.
function LogitBiasField() {
  const raw = $('logit-bias').value.trim();
  if (raw === '') return [];
  const vocab = page.model?.info.vocab_size ?? 0;
  return raw.split(/[\s,]+/).filter((entry) => entry !== '').map((entry) => {
    const m = /^(\d+):([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)$/.exec(entry);
    if (!m) throw new Error(`Logit bias: "${entry}" is not TOKEN_ID:BIAS (for example 15043:-100 or 29871:+2.5)`);
    const id = Number(m[1]), bias = Number(m[2]);
    if (!(id < vocab)) throw new Error(`Logit bias: token ${m[1]} in "${entry}" is not in the model's vocabulary (ids 0 to ${vocab - 1})`);
    if (!Number.isFinite(bias)) throw new Error(`Logit bias: the bias in "${entry}" is not a finite number`);
    return [id, bias];
  });
}

function FormParams() {
  const seed = SeedField();
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
    // As kvq::SamplerOptions (and `kvq run`'s flags) take them; the module refuses the same ranges.
    repeat_penalty: NumberField('repeat-penalty', 'Repeat penalty', {above: 0}),
    frequency_penalty: NumberField('frequency-penalty', 'Frequency penalty', {min: -2, max: 2}),
    presence_penalty: NumberField('presence-penalty', 'Presence penalty', {min: -2, max: 2}),
    repeat_last_n: NumberField('repeat-last-n', 'Penalty window', {integer: true, min: -1, max: 2147483647}),
    logit_bias: LogitBiasField(),
    max_tokens: NumberField('max-tokens', 'Max new tokens', {integer: true, min: 1}),
    stop: $('stop-text').value ? [$('stop-text').value] : [],  // the text ends before it
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
    ShowError('generate', e.message);
    return;
  }
  if ($('seed').value.trim() === '') $('seed').placeholder = `random (last: ${p.seed})`;
  await Run(p).catch(() => {});  // shown already
});
const Stop = () => worker.postMessage({type: 'stop'});
$('stop').addEventListener('click', Stop);

// ---- the benchmark (web/bench.js in the worker): the form's fields or the hook's options ----
async function Bench(opts) {
  if (running) throw new Error('a generation is running');
  SetRunning(true);
  ClearError('bench');
  SetStatus('running', 'Benchmarking…');
  $('bench-out').textContent = '';
  try {
    const result = await Ask('bench', {params: opts}, [], (m) => SetStatus('running', `Benchmarking: ${m.bench}…`));
    $('bench-out').textContent = JSON.stringify(result, null, 1);
    SetStatus('done', 'Benchmark done.');
    return result;
  } catch (e) {
    SetStatus('error', 'The benchmark failed.');
    ShowError('bench', e.message);
    throw e;
  } finally {
    SetRunning(false);
  }
}

$('bench-run').addEventListener('click', async () => {
  let opts;
  try {
    const depths = $('bench-depths').value.split(',').map((d) => d.trim());
    if (depths.some((d) => !/^\d+$/.test(d))) throw new Error(`Depths: "${$('bench-depths').value}" is not whole numbers`);
    const kv = $('bench-kv').value.trim();
    opts = {prompt_tokens: NumberField('bench-prompt', 'Prompt tokens', {integer: true, min: 1}),
            new_tokens: NumberField('bench-new', 'New tokens', {integer: true, min: 1}),
            depths: depths.map(Number), kv_k: kv, kv_v: kv};
  } catch (e) {
    ShowError('bench', e.message);
    return;
  }
  await Bench(opts).catch(() => {});  // shown already
});

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

// Progress of a load: the share of the file's bytes in the module, then the model's preparation.
function ShowLoadProgress(what, load) {
  page.load_progress.push(load.percent);
  $('load-progress').value = load.percent;
  SetStatus('loading', load.percent < 100 ? `Loading ${what}: ${load.percent.toFixed(1)}% ` +
      `(${Bytes(load.bytes)} of ${Bytes(load.total)})` : `Loading ${what}: read, preparing the model…`);
}

// Loads a model; the one in use stays until the new one has loaded (a failed load changes nothing).
// files: a promise of the worker's files (what the picker checked), or null for the bundled model.
async function Load(what, files) {
  SetRunning(true);
  ClearError('load');
  page.load_progress = [];
  $('load-progress').value = 0;
  $('load-progress').hidden = false;
  SetStatus('loading', `Loading ${what}: 0%`);  // at once: reading a large file takes a while
  try {
    const [type, fields] = files ? ['load', {files: await files}] : ['load_bundled', {}];
    ShowModel(await Ask(type, fields, [], (m) => ShowLoadProgress(what, m.load)));
    SetStatus('ready', 'Ready.');
  } catch (e) {
    SetStatus(page.model ? 'ready' : 'error', page.model ? `Not loaded; still using ${page.model.name}.` : 'No model.');
    ShowError('load', e.message);
  } finally {
    $('load-progress').hidden = true;
    SetRunning(false);
    UpdatePicked();
  }
}

$('load-picked').addEventListener('click', () => {
  const model_file = $('model-file').files[0];
  const files = Picker().then(({CheckModelFiles}) => CheckModelFiles(model_file, $('tok-file').files[0] ?? null));
  return Load(model_file?.name ?? 'the picked file', files);
});
$('load-bundled').addEventListener('click', () => Load('stories260K', null));

// ---- start: the module, its threads, the bundled model ----
async function Start() {
  if (settings_error) ShowError('page', settings_error);
  const info = await Ask('init', {simd: want_simd, threads: want_threads, gpu: want_gpu, gpu_forced});
  page.build = info.build;
  page.simd_target = info.simd_target;
  page.memory_scratch_bytes = info.memory_scratch_bytes;
  const threads = info.threads > 1 ? `${info.threads} threads` : `one thread (${info.threads_why_not})`;
  page.cpu_path = info.build === 'simd128' ?
      `WebAssembly SIMD128, ${threads} (${info.module}; Highway target ${info.simd_target})` :
      `scalar, ${threads} (${info.module}; Highway target ${info.simd_target}) — ${info.simd_supported ?
          'SIMD is available but ?simd=0 asked for scalar' : 'this browser has no WebAssembly SIMD'}`;
  page.gpu = info.gpu;
  $('st-path').textContent = `CPU: ${page.cpu_path}; GPU: ${info.gpu ? `WebGPU on ${info.gpu}` : info.gpu_why_not}`;
  $('st-threads').textContent = threads;
  ShowFormats(info.formats, 64);
  await Load('the bundled stories260K', null);
  if (!page.model) throw new Error('the bundled model did not load');
  return {build: info.build, module: info.module, threads: info.threads, threads_why_not: info.threads_why_not,
          simd_target: info.simd_target, formats: info.formats, gpu: info.gpu, gpu_why_not: info.gpu_why_not,
          memory_scratch_bytes: info.memory_scratch_bytes};
}

const ready = Start().catch((e) => {
  SetStatus('error', 'Could not start.');
  ShowError('page', e.message);
  throw e;
});

// The test hook. opts: {prompt, kv_k, kv_v (default kv_k), n_positions (BOS and prompt included) or
// max_tokens, stop (strings the text ends before), ignore_eos, temperature (default 0 = greedy),
// top_k, top_p, min_p, seed (module_sampler.js's SeedWords: a Number, or digits past 2^53 - 1),
// repeat_penalty, frequency_penalty, presence_penalty, repeat_last_n,
// logit_bias ([[token id, bias], ...]), device_budget_bytes, device ('auto' default, 'cpu', 'gpu'), chat (the
// prompt is a rendered conversation's next turn: the worker keeps what its cache shares with it,
// as for the chat page)}; the result's path says which ran, its finish_reason why it ended (stop,
// length, context, cancelled), its timing.n_reused the prompt tokens the cache kept.
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
    if (opts.threads !== undefined) p.threads = opts.threads;
    for (const k of ['repeat_penalty', 'frequency_penalty', 'presence_penalty', 'repeat_last_n', 'logit_bias']) {
      if (opts[k] !== undefined) p[k] = opts[k];  // kvq::SamplerOptions' defaults otherwise (off)
    }
    if (opts.stop !== undefined) p.stop = opts.stop;
    if (opts.ignore_eos !== undefined) p.ignore_eos = opts.ignore_eos;
    if (opts.chat !== undefined) p.chat = opts.chat;
    if (opts.n_positions !== undefined) p.n_positions = opts.n_positions;
    else p.max_tokens = opts.max_tokens ?? 256;
    return Run(p);
  },
  // The benchmark (web/bench.js: kBenchDefaults' fields) → its JSON.
  bench: async (opts = {}) => (await ready, Bench(opts)),
  tokenize: async (text) => (await ready, (await Ask('tokenize', {text})).ids),
  loadProgress: () => page.load_progress.slice(),
  formats: () => page.formats.slice(),
  stop: Stop,
  // Destroys the WebGPU device the GPU path holds, as a driver reset or a GPU process crash loses
  // it: the next generation goes on on a new device (or the CPU) and the page says so.
  loseDevice: async () => (await ready, Ask('lose_device')),
};
