// kvq's model runner for the page: a classic Web Worker that loads kvq.js (WebAssembly SIMD128) or
// kvq-scalar.js (no SIMD: the feature test fails, or the page asked with ?simd=0), keeps the model in
// MEMFS and runs prefill/sample/decode, so the page's main thread stays responsive while it generates.
// Protocol: the page posts {type, id, ...}; every reply carries the request's id (see app.js).
'use strict';

let kvq = null;        // the Emscripten module
let api = null;        // cwrapped kvq_web_* functions
let model = 0;         // handle of the loaded model (0 = none)
let model_context = 0;  // the loaded model's context (positions)
let session = 0;       // handle of the last generation's session, kept so its stats stay readable
let busy = false;      // a generation is running
let stopRequested = false;
// The WebGPU path (web/gpu/): the module's step program of the loaded model (its forward pass as
// ops over a tensor table, src/web/gpu_program.h) run by web/gpu/step_program.js's WGSL kernels,
// the KV master in the module's KvCache, attention streamed through the device. For attention-only
// models (llama, mistral, qwen2, qwen3: Bonsai) with F32, F16, BF16, Q8_0, Q4_0 or Q1_0 matrices,
// any KV spec the device decodes, greedy sampling; anything else (hybrid Gated DeltaNet or
// mixture-of-experts layers, other weight types, temperature > 0) runs on the WebAssembly CPU path,
// which is also what runs where the browser offers no WebGPU adapter.
let gpu = null;              // {device, name} when WebGPU offers an adapter
let gpu_why_not = 'not probed yet';
let gpu_program = null;      // the loaded model's step program (null: the GPU path cannot run it)
let gpu_model_why_not = 'no model is loaded';
let gpu_step = null;         // its GpuModelRunner (web/gpu/gpu_engine.js), made on first use

// The smallest module that uses a SIMD instruction: (func (result v128) i32.const 0 i32x4.splat).
// WebAssembly.validate says whether this engine accepts SIMD128 without running anything.
const kSimdProbe = new Uint8Array([
  0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,  // magic, version 1
  0x01, 0x05, 0x01, 0x60, 0x00, 0x01, 0x7b,        // type section: () -> v128
  0x03, 0x02, 0x01, 0x00,                          // function section: one function of type 0
  0x0a, 0x08, 0x01, 0x06, 0x00, 0x41, 0x00, 0xfd, 0x11, 0x0b,  // code: i32.const 0, i32x4.splat, end
]);

function SimdSupported() {
  try {
    return typeof WebAssembly === 'object' && WebAssembly.validate(kSimdProbe);
  } catch (e) {
    return false;
  }
}

function LastError() {
  const message = api ? api.lastError() : '';
  return message || 'kvq reported a failure without a message';
}

class KvqError extends Error {}

function Check(ok, what) {
  if (!ok) throw new KvqError(`${what}: ${LastError()}`);
}

async function InitGpu() {
  if (!self.navigator || !navigator.gpu) {
    gpu_why_not = 'this browser offers no WebGPU (navigator.gpu is missing)';
    return;
  }
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) {
    gpu_why_not = 'WebGPU offers no adapter';
    return;
  }
  const info = adapter.info || {};
  // As large a model buffer as the adapter allows (the default limits stop at 128 MiB bindings).
  const requiredLimits = {maxStorageBufferBindingSize: adapter.limits.maxStorageBufferBindingSize,
                          maxBufferSize: adapter.limits.maxBufferSize};
  gpu = {device: await adapter.requestDevice({requiredLimits}),
         name: [info.vendor, info.architecture, info.description].filter(Boolean).join(' ') || 'an unnamed adapter',
         // A CPU emulation (SwiftShader): 'auto' keeps to WebAssembly, far faster there.
         emulated: Boolean(info.isFallbackAdapter || adapter.isFallbackAdapter) || /swiftshader/i.test(info.architecture || '')};
  gpu_why_not = '';
}

// Why a generation with params p cannot take the GPU path ('' when it can).
function GpuWhyNot(p) {
  if (!gpu) return gpu_why_not;
  if (!gpu_program) return gpu_model_why_not;
  if (p.temperature !== 0) return 'the GPU path samples greedily only (temperature 0)';
  return '';
}

async function Init(want_simd) {
  await InitGpu().catch((e) => {
    gpu = null;
    gpu_why_not = `WebGPU failed to start: ${e.message}`;
  });
  const simd = want_simd && SimdSupported();
  // Two literal importScripts calls (not one computed URL) so the bundle check can follow both.
  if (simd) {
    importScripts('./kvq.js');
  } else {
    importScripts('./kvq-scalar.js');
  }
  const factory = self.createKvq;
  if (typeof factory !== 'function') {
    throw new Error(`${simd ? 'kvq.js' : 'kvq-scalar.js'} loaded but defines no createKvq()`);
  }
  kvq = await factory({
    // kvq's own log lines go to stderr; they are information, errors come back through last_error.
    print: (line) => console.log(`kvq: ${line}`),
    printErr: (line) => console.log(`kvq(stderr): ${line}`),
  });
  const w = (name, ret, args) => kvq.cwrap(name, ret, args);
  api = {
    modelLoad: w('kvq_web_model_load', 'number', ['string', 'string']),
    modelInfo: w('kvq_web_model_info', 'string', ['number']),
    modelFree: w('kvq_web_model_free', null, ['number']),
    sessionNew: w('kvq_web_session_new', 'number', ['number', 'string', 'string', 'number']),
    sessionFree: w('kvq_web_session_free', null, ['number']),
    tokenize: w('kvq_web_tokenize', 'number', ['number', 'string', 'number', 'number', 'number']),
    detokenize: w('kvq_web_detokenize', 'number', ['number', 'number', 'number', 'number', 'number']),
    isEnd: w('kvq_web_is_end', 'number', ['number', 'number']),
    prefill: w('kvq_web_prefill', 'number', ['number', 'number', 'number']),
    decode: w('kvq_web_decode', 'number', ['number', 'number']),
    setSampler: w('kvq_web_set_sampler', null, ['number', 'number', 'number', 'number', 'number', 'number']),
    sample: w('kvq_web_sample', 'number', ['number']),
    sessionStats: w('kvq_web_session_stats', 'string', ['number']),
    formats: w('kvq_web_formats', 'string', []),
    simdTarget: w('kvq_web_simd_target', 'string', []),
    lastError: w('kvq_web_last_error', 'string', []),
  };
  try {
    kvq.FS.mkdir('/models');
  } catch (e) {
    // already there
  }
  return {
    build: simd ? 'simd128' : 'scalar',
    simd_supported: SimdSupported(),
    simd_target: api.simdTarget(),
    formats: JSON.parse(api.formats()),
    gpu: gpu ? gpu.name : null,
    gpu_why_not,
  };
}

function HeapBytes() {
  return kvq.HEAPU8.length;
}

// Writes the files into MEMFS and loads them; the previous model (and its files) is freed first.
// files: {model: {name, bytes: ArrayBuffer}, tokenizer: {name, bytes} | null}
async function LoadModel(files) {
  FreeSession();
  if (model) {
    api.modelFree(model);
    model = 0;
  }
  const write = (file) => {
    // MEMFS names: the picked name without folders, so a path in it cannot leave /models.
    const path = `/models/${file.name.replace(/[\/\\]/g, '_')}`;
    kvq.FS.writeFile(path, new Uint8Array(file.bytes));
    return path;
  };
  gpu_program = null;
  gpu_step?.Destroy();
  gpu_step = null;
  const model_path = write(files.model);
  const tok_path = files.tokenizer ? write(files.tokenizer) : '';
  model = api.modelLoad(model_path, tok_path);
  // The loaded model holds its own copy (Emscripten's mmap of a MEMFS file copies it; kvq closes
  // the file after mapping): the files go at once, so a model is not held twice.
  kvq.FS.unlink(model_path);
  if (tok_path) kvq.FS.unlink(tok_path);
  Check(model, `loading ${files.model.name}${files.tokenizer ? ` with ${files.tokenizer.name}` : ''}`);
  const info = JSON.parse(api.modelInfo(model));
  model_context = info.context;
  // The GPU path runs the module's step program of this model, if the module builds one (it says
  // why not: hybrid layers) and the kernels read its weights.
  gpu_model_why_not = gpu ? '' : gpu_why_not;
  if (gpu) {
    const {GpuProgramOf} = await import('./gpu/gpu_engine.js');
    const {program, why_not} = GpuProgramOf(kvq, model);
    gpu_program = program || null;
    if (why_not) gpu_model_why_not = `the GPU path cannot run this model: ${why_not}`;
  }
  return {name: files.model.name, info, heap_bytes: HeapBytes(), gpu: gpu_program ? 'supported' : gpu_model_why_not};
}

async function LoadBundled() {
  const body = async (response) => {
    if (!response.ok) throw new Error(`fetching ${response.url}: HTTP ${response.status}`);
    return response.arrayBuffer();
  };
  // Literal URLs, so the bundle check sees what the page loads.
  const [bin, tok] = await Promise.all([fetch('./models/stories260K.bin').then(body),
                                        fetch('./models/tok512.bin').then(body)]);
  return LoadModel({model: {name: 'stories260K.bin', bytes: bin}, tokenizer: {name: 'tok512.bin', bytes: tok}});
}

function RequireModel() {
  if (!model) throw new Error('no model is loaded');
}

// add_bos: -1 = the model's default.
function Tokenize(text, add_bos) {
  RequireModel();
  let capacity = 256;
  for (;;) {
    const ptr = kvq._malloc(capacity * 4);  // [capacity] int32 ids
    try {
      const n = api.tokenize(model, text, add_bos, ptr, capacity);
      Check(n >= 0, 'tokenizing the prompt');
      if (n <= capacity) return Array.from(kvq.HEAP32.subarray(ptr >> 2, (ptr >> 2) + n));
      capacity = n;
    } finally {
      kvq._free(ptr);
    }
  }
}

const decoder = new TextDecoder('utf-8');

function Detokenize(ids) {
  RequireModel();
  const ids_ptr = kvq._malloc(Math.max(1, ids.length) * 4);  // [ids.length] int32
  try {
    kvq.HEAP32.set(ids, ids_ptr >> 2);
    let capacity = ids.length * 16 + 64;
    for (;;) {
      const out = kvq._malloc(capacity + 1);  // [capacity + 1] bytes: text and its NUL
      try {
        const n = api.detokenize(model, ids_ptr, ids.length, out, capacity + 1);
        Check(n >= 0, 'detokenizing');
        if (n <= capacity) return decoder.decode(kvq.HEAPU8.slice(out, out + n));
        capacity = n;
      } finally {
        kvq._free(out);
      }
    }
  } finally {
    kvq._free(ids_ptr);
  }
}

function FreeSession() {
  if (session) api.sessionFree(session);
  session = 0;
}

function Stats() {
  const stats = session ? JSON.parse(api.sessionStats(session)) : null;
  return {session: stats, heap_bytes: HeapBytes()};
}

// A macrotask break, so the Stop message (queued behind this loop) is seen. Taken at most every
// kYieldMs: setTimeout's clamp would cost more than a token if it came after every one.
const kYieldMs = 40;
const Pause = () => new Promise((resolve) => setTimeout(resolve, 0));

// p: {prompt, kv_k, kv_v, device_budget_bytes, temperature, top_k, top_p, min_p, seed,
//     max_tokens | n_positions (positions in all, BOS and prompt included, as run.c's -n)}
async function Generate(id, p) {
  RequireModel();
  stopRequested = false;
  FreeSession();
  const prompt_ids = Tokenize(p.prompt, -1);
  if (prompt_ids.length === 0) throw new Error('the prompt gave no tokens (and the model adds no BOS)');
  const asked = p.n_positions !== undefined ? p.n_positions - prompt_ids.length : p.max_tokens;
  // The cache holds the model's context; the token sampled after the last position is kept, not run.
  const max_new = Math.min(asked, model_context + 1 - prompt_ids.length);
  if (!(asked >= 1)) {
    throw new Error(`nothing to generate: ${p.n_positions !== undefined ?
      `n_positions ${p.n_positions} <= the prompt's ${prompt_ids.length} tokens` : `max tokens ${p.max_tokens}`}`);
  }
  if (prompt_ids.length > model_context) {
    throw new Error(`the prompt's ${prompt_ids.length} tokens do not fit the model's context of ${model_context}`);
  }
  // The path: p.device 'cpu', 'gpu', or 'auto' (the GPU when it can, unless the adapter is an
  // emulation). What the GPU path cannot run (a hybrid model, a weight type its kernels do not
  // read, temperature > 0) runs on WebAssembly instead, with the reason in path.why: nothing the
  // CPU can run errors for want of the GPU.
  const want = p.device || 'auto';
  if (!['auto', 'cpu', 'gpu'].includes(want)) throw new Error(`device "${want}": use auto, cpu or gpu`);
  const why_not = GpuWhyNot(p);
  const emulated = want === 'auto' && !why_not && gpu.emulated ?
      `the WebGPU adapter (${gpu.name}) is a CPU emulation, slower than WebAssembly here: choose gpu to use it` : '';
  const on_gpu = want !== 'cpu' && !why_not && !emulated;
  const path = on_gpu ? {device: 'gpu', adapter: gpu.name}
                      : {device: 'cpu', why: want === 'cpu' ? 'asked for' :
                           `${why_not || emulated}${want === 'gpu' ? '; running on WebAssembly instead' : ''}`};
  const engine = on_gpu ? await GpuEngine(p) : CpuEngine(p);

  const ids = prompt_ids.slice();
  const t_prefill = performance.now();
  await engine.prefill(prompt_ids);
  const prefill_ms = performance.now() - t_prefill;
  const timing = () => ({n_prompt: prompt_ids.length, prefill_ms, n_generated: ids.length - prompt_ids.length,
                         decode_ms});
  let decode_ms = 0;  // sampling and decode steps, the pauses for messages excluded
  let sent = 0;  // ids already posted: the first post carries BOS and the prompt
  let last_post = performance.now();
  const post = (type, extra) => {
    self.postMessage({type, id, new_ids: ids.slice(sent), text: Detokenize(ids), timing: timing(),
                      stats: engine.stats(ids.length - 1), path, ...extra});
    sent = ids.length;
    last_post = performance.now();
  };
  post('progress');
  await Pause();
  let stopped = false;
  let end_token = false;
  for (let i = 0; i < max_new; ++i) {
    if (stopRequested) {
      stopped = true;
      break;
    }
    const t0 = performance.now();
    const token = engine.sample();
    ids.push(token);
    // An end token ends it, as in `kvq run` (BOS too for llama2.c vocabularies); kept in ids, as
    // run.c's golden ids keep it.
    end_token = api.isEnd(model, token) !== 0;
    const last = end_token || i + 1 === max_new;
    // The last token needs no decode step: nothing is sampled after it.
    if (!last) await engine.decode(token, ids.length - 1);
    decode_ms += performance.now() - t0;
    if (last) break;
    if (performance.now() - last_post >= kYieldMs) {
      post('progress');
      await Pause();
    }
  }
  post('done', {ids, stopped, end_token, context: model_context,
                context_full: !stopped && !end_token && max_new < asked && ids.length === prompt_ids.length + max_new});
}

// The WebAssembly CPU path: a kvq session in the module.
function CpuEngine(p) {
  session = api.sessionNew(model, p.kv_k, p.kv_v, p.device_budget_bytes || 0);
  Check(session, `creating a session with K "${p.kv_k}", V "${p.kv_v}"`);
  api.setSampler(session, p.temperature, p.top_k, p.top_p, p.min_p, p.seed | 0);
  return {
    prefill: async (prompt_ids) => {
      const buf = kvq._malloc(prompt_ids.length * 4);  // [n_prompt] int32
      try {
        kvq.HEAP32.set(prompt_ids, buf >> 2);
        // One call: however the module cuts the prompt into blocks, the bits are those of `kvq run`.
        Check(api.prefill(session, buf, prompt_ids.length) === 0, 'prefill');
      } finally {
        kvq._free(buf);
      }
    },
    sample: () => {
      const token = api.sample(session);
      Check(token >= 0, 'sampling');
      return token;
    },
    decode: async (token, position) => Check(api.decode(session, token) === 0, `decode at position ${position}`),
    stats: () => Stats(),
  };
}

// The WebGPU path: web/gpu/gpu_engine.js runs the module's step program of the model token by
// token (prompt included: prefill is not batched on the GPU yet), greedy, its KV master in the
// module's KvCache, streamed to the GPU's slots for attention.
async function GpuEngine(p) {
  if (!gpu_step) {
    const {GpuModelRunner} = await import('./gpu/gpu_engine.js');
    gpu_step = await GpuModelRunner.Create(kvq, gpu.device, model, gpu_program);
  }
  const runner = gpu_step;
  const c = gpu_program.config;
  const plan = runner.NewSequence(p.kv_k, p.kv_v, p.device_budget_bytes || 0);
  const counts0 = {...runner.counts};
  let last = null;
  return {
    prefill: async (prompt_ids) => {
      for (const id of prompt_ids) last = await runner.Step(id);
    },
    sample: () => last.token,
    decode: async (token) => {
      last = await runner.Step(token);
    },
    // What the CPU path's session reports; bytes per token are the cache's planned bytes at full
    // context over the context (its f32 sink and residual rows spread over every position). gpu:
    // this generation's steps and, per step, the submits and readbacks of the step program and the
    // submits of the KV device.
    stats: () => {
      const counts = runner.counts, steps = counts.steps - counts0.steps;
      const per = (k) => steps ? (counts[k] - counts0[k]) / steps : 0;
      const positions = runner.positions;
      return {session: {positions, context: model_context, kv_key_format: p.kv_k, kv_value_format: p.kv_v,
                        kv_bytes_per_token: Math.round(plan.total_bytes / model_context),
                        kv_f16_bytes_per_token: 2 * c.n_layers * c.kv_dim * 2,
                        kv_bytes: Math.round(positions * plan.total_bytes / model_context),
                        device_budget_bytes: p.device_budget_bytes || 0,
                        device_slots: plan.device_slots, device_bytes: plan.device_bytes},
              gpu: {steps, submits_per_step: per('submits'), readbacks_per_step: per('readbacks'),
                    kv_device_submits_per_step: per('device_submits'), weight_bytes: runner.weight_bytes},
              heap_bytes: HeapBytes()};
    },
  };
}

const handlers = {
  init: (m) => Init(m.simd),
  load_bundled: () => LoadBundled(),
  load: (m) => LoadModel(m.files),
  tokenize: (m) => ({ids: Tokenize(m.text, m.add_bos === undefined ? -1 : m.add_bos)}),
  generate: (m) => Generate(m.id, m.params),
  stats: () => Stats(),
  // The chat page's in-tab runtime (chat/transport.js): the loaded model's chat template rendered
  // in the module. m: {messages: [{role, content}], add_generation_prompt, template_override (Jinja
  // source; '' or absent: the model's)} → {prompt, template}.
  apply_template: (m) => {
    RequireModel();
    const request = JSON.stringify({messages: m.messages, add_generation_prompt: m.add_generation_prompt ?? true,
                                    template_override: m.template_override ?? ''});
    const answer = kvq.ccall('kvq_web_apply_template', 'string', ['number', 'string'], [model, request]);
    Check(answer, 'rendering the chat template');
    return JSON.parse(answer);
  },
};

self.onmessage = async (event) => {
  const m = event.data;
  if (m.type === 'stop') {
    stopRequested = true;
    return;
  }
  const handler = handlers[m.type];
  let owns_busy = false;
  try {
    if (!handler) throw new Error(`worker: unknown request "${m.type}"`);
    if (busy) throw new Error('a generation is running: stop it first');
    if (m.type !== 'init' && !api) throw new Error('the WebAssembly module is not loaded');
    // Every request but generate runs to its end before the next message is read; generate pauses.
    busy = owns_busy = m.type === 'generate';
    const result = await handler(m);
    // generate posts its own 'done'; the others answer with their result.
    if (m.type !== 'generate') self.postMessage({type: 'result', id: m.id, result});
  } catch (e) {
    self.postMessage({type: 'error', id: m.id, message: e instanceof Error ? e.message : String(e)});
  } finally {
    if (owns_busy) busy = false;
  }
};
