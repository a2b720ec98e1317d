// kvq's model runner for the page: a classic Web Worker that loads kvq.js (WebAssembly SIMD128) or
// kvq-scalar.js (no SIMD: the feature test fails, or the page asked with ?simd=0), keeps the model in
// MEMFS and runs prefill/sample/decode, so the page's main thread stays responsive while it generates.
// Protocol: the page posts {type, id, ...}; every reply carries the request's id (see app.js).
'use strict';

let kvq = null;        // the Emscripten module
let api = null;        // cwrapped kvq_web_* functions
let model = 0;         // handle of the loaded model (0 = none)
let model_context = 0;  // the loaded model's context (positions)
let model_bos = -1;     // its BOS id (-1: none), which also ends a generation
let session = 0;       // handle of the last generation's session, kept so its stats stay readable
let busy = false;      // a generation is running
let stopRequested = false;

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

async function Init(want_simd) {
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
  };
}

function HeapBytes() {
  return kvq.HEAPU8.length;
}

// Writes the files into MEMFS and loads them; the previous model (and its files) is freed first.
// files: {model: {name, bytes: ArrayBuffer}, tokenizer: {name, bytes} | null}
function LoadModel(files) {
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
  model_bos = info.bos;
  return {name: files.model.name, info, heap_bytes: HeapBytes()};
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
  session = api.sessionNew(model, p.kv_k, p.kv_v, p.device_budget_bytes || 0);
  Check(session, `creating a session with K "${p.kv_k}", V "${p.kv_v}"`);
  api.setSampler(session, p.temperature, p.top_k, p.top_p, p.min_p, p.seed | 0);

  const ids = prompt_ids.slice();
  const buf = kvq._malloc(prompt_ids.length * 4);  // [n_prompt] int32
  let prefill_ms;
  try {
    kvq.HEAP32.set(prompt_ids, buf >> 2);
    const t0 = performance.now();
    // Cut as `kvq run` cuts it (generate.cc), so greedy ids equal its ids: all but the last prompt
    // token (prefill runs them in blocks of 64), then the last token alone.
    const n_head = prompt_ids.length - 1;
    if (n_head > 0) Check(api.prefill(session, buf, n_head) === 0, 'prefill');
    Check(api.prefill(session, buf + 4 * n_head, 1) === 0, 'prefill of the last prompt token');
    prefill_ms = performance.now() - t0;
  } finally {
    kvq._free(buf);
  }
  const timing = () => ({n_prompt: prompt_ids.length, prefill_ms, n_generated: ids.length - prompt_ids.length,
                         decode_ms});
  let decode_ms = 0;  // sampling and decode steps, the pauses for messages excluded
  let sent = 0;  // ids already posted: the first post carries BOS and the prompt
  let last_post = performance.now();
  const post = (type, extra) => {
    self.postMessage({type, id, new_ids: ids.slice(sent), text: Detokenize(ids), timing: timing(), stats: Stats(),
                      ...extra});
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
    const token = api.sample(session);
    Check(token >= 0, 'sampling');
    ids.push(token);
    // An end token or BOS ends it, as in `kvq run`; kept in ids, as run.c's golden ids keep it.
    end_token = api.isEnd(model, token) !== 0 || token === model_bos;
    const last = end_token || i + 1 === max_new;
    // The last token needs no decode step: nothing is sampled after it.
    if (!last) Check(api.decode(session, token) === 0, `decode at position ${ids.length - 1}`);
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

const handlers = {
  init: (m) => Init(m.simd),
  load_bundled: () => LoadBundled(),
  load: (m) => LoadModel(m.files),
  tokenize: (m) => ({ids: Tokenize(m.text, m.add_bos === undefined ? -1 : m.add_bos)}),
  generate: (m) => Generate(m.id, m.params),
  stats: () => Stats(),
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
