// kvq's model runner for the page: a classic Web Worker that loads kvq-threads.js (SIMD128 and
// pthreads: the page is cross-origin isolated, so SharedArrayBuffer exists), kvq.js (SIMD128, one
// thread) or kvq-scalar.js (no SIMD: the feature test fails, or the page asked with ?simd=0), reads
// a model file into the module's memory a chunk at a time (worker_load.js; held there once: the
// model maps it in place) and runs prefill/sample/decode, so the page's main thread stays responsive while it generates.
// When a generation ends, and what text it shows, kvq's Generator in the module decides (Completion
// below): this file only moves tokens between the model runner and the rules, and posts progress.
// Protocol: the page posts {type, id, ...}; every reply carries the request's id (see app.js).
'use strict';

// Module choice, WebGPU's device, the module's memory and reading model files (worker_load.js);
// the WebGPU path's engine of a generation (worker_gpu.js).
importScripts('./worker_load.js');
importScripts('./worker_gpu.js');

let kvq = null;        // the Emscripten module
let api = null;        // cwrapped kvq_web_* functions
let model = 0;         // handle of the loaded model (0 = none)
let model_context = 0;  // the loaded model's context (positions)
let threads = 1;       // threads the module runs models with
let memory = null;     // the module's ModuleMemory (worker_load.js)
let with_sampler_settings = null;  // module_sampler.js's WithSamplerSettings (loaded with the module)
let session = 0;       // handle of the last generation's session, kept so its stats stay readable
let session_spec = '';  // the formats and budget it was made with: a chat's next turn reuses it if they match
let busy = false;      // what is running ('a generation', 'a model load'), or false
let stopRequested = false;
// The WebGPU path (web/gpu/): the module's step program of the loaded model (its forward pass as
// ops over a tensor table, src/web/gpu_program.h) run by web/gpu/step_program.js's WGSL kernels,
// the KV master in the module's KvCache, attention streamed through the device. For dense models
// (llama, mistral, qwen2, qwen3: Bonsai) and the hybrids (qwen35, qwen35moe, qwen3next: Gated DeltaNet
// and mixture-of-experts layers) with matrices of any weight type in kvq's registry, any KV spec the
// device decodes, any sampler setting (kvq's chain on the GPU: sample_kernels.js); anything else runs
// on the WebAssembly CPU path, which is also what runs where the browser offers no WebGPU adapter.
// On both paths a chat's next turn keeps the conversation in the cache and prefills only its new
// tokens (Generate's chat).
let gpu = null;              // {device, name} when WebGPU offers an adapter
let gpu_why_not = 'not probed yet';
let gpu_program = null;      // the loaded model's step program (null: the GPU path cannot run it)
let gpu_model_why_not = 'no model is loaded';
let gpu_step = null;         // its GpuModelRunner (web/gpu/gpu_engine.js), made on first use
let gpu_forced = false;      // ?gpu=1: the GPU path even on an emulated adapter ('auto' takes it)
// A picked GGUF file the GPU path runs is loaded from its header alone (kvq_web_model_load_header):
// its weights go from the file to GPU buffers, never into the module's memory, which then holds
// the header, the vocabulary and the KV master. What needs the CPU forward (the WebAssembly path,
// no device after a loss) loads the whole file into the module then (FullModel).
let model_file = null;       // the picked File of a header-only model (null: the model is whole)
let model_full = 0;          // the whole file's model, loaded on demand for the CPU forward (0: none)

function LastError() {
  const message = api ? api.lastError() : '';
  return message || 'kvq reported a failure without a message';
}

class KvqError extends Error {}

function Check(ok, what) {
  if (!ok) throw new KvqError(`${what}: ${LastError()}`);
}

// Why a generation cannot take the GPU path ('' when it can): every sampler setting can.
function GpuWhyNot() {
  if (!gpu) return gpu_why_not;
  return gpu_program ? '' : gpu_model_why_not;
}

async function Init(m) {
  gpu_forced = m.gpu_forced === true;
  if (m.gpu === false) {
    gpu_why_not = 'turned off by ?gpu=0';
  } else {
    ({gpu, why_not: gpu_why_not} = await OpenGpu().catch((e) => ({
      gpu: null, why_not: `WebGPU failed to start: ${e.message}`})));
  }
  const choice = ChooseModule(m.simd, m.threads);
  const file = choice.threads > 1 ? 'kvq-threads.js' : choice.simd ? 'kvq.js' : 'kvq-scalar.js';
  // Literal importScripts calls (not one computed URL) so the bundle check can follow each.
  if (choice.threads > 1) {
    importScripts('./kvq-threads.js');
  } else if (choice.simd) {
    importScripts('./kvq.js');
  } else {
    importScripts('./kvq-scalar.js');
  }
  const factory = self.createKvq;
  if (typeof factory !== 'function') throw new Error(`${file} loaded but defines no createKvq()`);
  kvq = await factory({
    // The threaded module's pool of Web Workers, started before it resolves: one per thread of
    // kvq's pool beyond the caller's, and one for a KV staging thread.
    kvqPoolSize: choice.threads,
    // What the pool's workers import (beside them): a module loaded by importScripts cannot tell.
    mainScriptUrlOrBlob: './kvq-threads.js',
    // kvq's own log lines go to stderr; they are information, errors come back through last_error.
    print: (line) => console.log(`kvq: ${line}`),
    printErr: (line) => console.log(`kvq(stderr): ${line}`),
  });
  memory = new ModuleMemory(kvq);
  // Both paths take the sampler settings as the module's kvq_web::WebSamplerOptions reads them.
  ({WithSamplerSettings: with_sampler_settings} = await import('./gpu/module_sampler.js'));
  const w = (name, ret, args) => kvq.cwrap(name, ret, args);
  api = {
    modelLoad: w('kvq_web_model_load', 'number', ['string', 'string']),
    modelInfo: w('kvq_web_model_info', 'string', ['number']),
    modelFree: w('kvq_web_model_free', null, ['number']),
    sessionNew: w('kvq_web_session_new', 'number', ['number', 'string', 'string', 'number']),
    sessionFree: w('kvq_web_session_free', null, ['number']),
    tokenize: w('kvq_web_tokenize', 'number', ['number', 'string', 'number', 'number', 'number']),
    tokenizeChatPrompt: w('kvq_web_tokenize_chat_prompt', 'number', ['number', 'string', 'number', 'number']),
    sessionKeepPrefix: w('kvq_web_session_keep_prefix', 'number', ['number', 'number', 'number']),
    detokenize: w('kvq_web_detokenize', 'number', ['number', 'number', 'number', 'number', 'number']),
    prefill: w('kvq_web_prefill', 'number', ['number', 'number', 'number']),
    decode: w('kvq_web_decode', 'number', ['number', 'number']),
    sample: w('kvq_web_sample', 'number', ['number']),
    sessionStats: w('kvq_web_session_stats', 'string', ['number']),
    formats: w('kvq_web_formats', 'string', ['number']),
    maxThreads: w('kvq_web_max_threads', 'number', []),
    memoryScratchBytes: w('kvq_web_memory_scratch_bytes', 'number', []),
    fileAlloc: w('kvq_web_file_alloc', 'number', ['number']),
    fileFree: w('kvq_web_file_free', null, ['number']),
    modelLoadBytes: w('kvq_web_model_load_bytes', 'number', ['number', 'number', 'string', 'string', 'number']),
    ggufHeaderBytes: w('kvq_web_gguf_header_bytes', 'number', ['number', 'number', 'number', 'string']),
    modelLoadHeader: w('kvq_web_model_load_header', 'number', ['number', 'number', 'number', 'string', 'string', 'number']),
    sessionSetThreads: w('kvq_web_session_set_threads', 'number', ['number', 'number']),
    simdTarget: w('kvq_web_simd_target', 'string', []),
    generatorCheck: w('kvq_web_generator_check', 'number', ['string']),
    generatorNew: w('kvq_web_generator_new', 'number', ['number', 'string']),
    generatorNewForSequence: w('kvq_web_generator_new_for_sequence', 'number', ['number', 'number', 'number', 'string']),
    generatorNext: w('kvq_web_generator_next', 'string', ['number', 'number']),
    generatorCancel: w('kvq_web_generator_cancel', 'string', ['number']),
    generatorFree: w('kvq_web_generator_free', null, ['number']),
    prefillBlock: w('kvq_web_prefill_block', 'number', []),
    lastError: w('kvq_web_last_error', 'string', []),
  };
  try {
    kvq.FS.mkdir('/models');
  } catch (e) {
    // already there
  }
  threads = Math.min(choice.threads, api.maxThreads());
  return {
    build: choice.simd ? 'simd128' : 'scalar',
    module: file,
    threads,
    threads_why_not: choice.why,
    simd_supported: SimdSupported(),
    simd_target: api.simdTarget(),
    formats: JSON.parse(api.formats(0)),
    memory_scratch_bytes: api.memoryScratchBytes(),
    gpu: gpu ? gpu.name : null,
    gpu_why_not,
  };
}

// Loads a model and makes it the one in use only once it has loaded: a failed load leaves the
// previous model, its session and its GPU program as they were. The model file is read into the
// module a chunk at a time (progress posted as {type: 'progress', load: {bytes, total, percent}});
// the tokenizer, a few KiB, goes through MEMFS. A picked GGUF file, where the GPU path is the one
// 'auto' takes (a GPU not emulated, or ?gpu=1), is loaded from its header alone when the GPU path
// runs it (HeaderModel): the weights are then read from the file by the GPU path only.
// files: {model: {name, file: File} | {name, response: a fetch's promise}, tokenizer: the same | null}
async function LoadModel(id, files) {
  const f = files.model;
  const on_gpu = gpu && (!gpu.emulated || gpu_forced);
  // One progress for the load: a header that cannot run alone leaves its percent, which the whole
  // file's read then passes (LoadProgress posts only rising figures).
  let progress = null;
  const progress_for = (total) => (progress ??= LoadProgress(id, total));
  const header = on_gpu && f.file && !files.tokenizer && /\.gguf$/i.test(f.name) ?
      await HeaderModel(files, progress_for(f.file.size)) : null;
  let next, total, program = header?.program ?? null, why_not = gpu ? '' : gpu_why_not;
  if (header) {
    ({model: next, total} = header);
  } else {
    ({model: next, total} = await WholeModel(files, progress_for));
    if (gpu) {
      try {
        ({program, why_not} = await ProgramOf(next));
      } catch (e) {
        api.modelFree(next);
        throw e;
      }
    }
  }
  const info = JSON.parse(api.modelInfo(next));
  // Loaded: the previous model goes now.
  FreeSession();
  FreeModels();
  model = next;
  model_file = header ? f.file : null;
  model_context = info.context;
  gpu_program = program;
  gpu_model_why_not = why_not;
  return {name: f.name, info, file_bytes: total, threads, heap_bytes: memory.bytes,
          formats: JSON.parse(api.formats(info.head_dim)), gpu: gpu_program ? 'supported' : gpu_model_why_not};
}

// What worker_load.js's model loads use of this worker.
const LoadEnv = () => ({kvq, api, memory, check: Check, threads});
const WholeModel = (files, progress_for) => LoadWholeModel(LoadEnv(), files, progress_for);

// The GPU path's step program of a loaded model, if the module builds one (it says why not: a
// tensor its file lacks) and the kernels read its weights: {program (null: none), why_not}.
async function ProgramOf(handle) {
  const {GpuProgramOf} = await import('./gpu/gpu_engine.js');
  const made = GpuProgramOf(kvq, handle);
  return {program: made.program || null, why_not: made.why_not ? `the GPU path cannot run this model: ${made.why_not}` : ''};
}

// A picked GGUF file's model (its own vocabulary) from its header alone, if the GPU path runs it:
// {model, total, program}; null when it cannot (a weight type or layer the GPU path does not run,
// a header the module cannot load alone): the caller then loads the whole file.
async function HeaderModel(files, progress) {
  const f = files.model;
  const next = await LoadHeaderModel(LoadEnv(), f, progress);
  if (!next) return null;  // e.g. rope_freqs.weight, read at load: the whole file it is
  let made;
  try {
    made = await ProgramOf(next);
  } catch (e) {
    api.modelFree(next);
    throw e;
  }
  if (!made.program) {
    api.modelFree(next);
    return null;
  }
  progress(f.file.size);  // nothing more to read: the weights go from the file to the GPU
  return {model: next, total: f.file.size, program: made.program};
}

// The model the CPU forward runs: the loaded one, or for a header-only one the whole file's,
// read into the module now (once per model).
async function FullModel() {
  if (!model_file) return model;
  if (!model_full) ({model: model_full} = await WholeModel({model: {name: model_file.name, file: model_file}, tokenizer: null}, null));
  return model_full;
}

// Frees the loaded model, its GPU runner and its whole-file twin.
function FreeModels() {
  gpu_step?.Destroy();
  gpu_step = null;
  if (model_full) api.modelFree(model_full);
  model_full = 0;
  if (model) api.modelFree(model);
  model = 0;
  model_file = null;
}

// Literal URLs, so the bundle check sees what the page loads.
const LoadBundled = (id) => LoadModel(id, {model: {name: 'stories260K.bin', response: fetch('./models/stories260K.bin')},
                                           tokenizer: {name: 'tok512.bin', response: fetch('./models/tok512.bin')}});

function RequireModel() {
  if (!model) throw new Error('no model is loaded');
}

// add_bos: -1 = the model's default; 'chat': a rendered chat prompt's ids (one BOS, whether or
// not the template wrote its text: Model::TokenizeChatPrompt, as kvq chat and kvq serve).
function Tokenize(text, add_bos) {
  RequireModel();
  let capacity = 256;
  for (;;) {
    const ptr = kvq._malloc(capacity * 4);  // [capacity] int32 ids
    try {
      const n = add_bos === 'chat' ? api.tokenizeChatPrompt(model, text, ptr, capacity)
                                   : api.tokenize(model, text, add_bos, ptr, capacity);
      Check(n >= 0, 'tokenizing the prompt');
      if (n <= capacity) return Array.from(memory.i32.subarray(ptr >> 2, (ptr >> 2) + n));
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
    memory.i32.set(ids, ids_ptr >> 2);
    let capacity = ids.length * 16 + 64;
    for (;;) {
      const out = kvq._malloc(capacity + 1);  // [capacity + 1] bytes: text and its NUL
      try {
        const n = api.detokenize(model, ids_ptr, ids.length, out, capacity + 1);
        Check(n >= 0, 'detokenizing');
        if (n <= capacity) return decoder.decode(memory.u8.slice(out, out + n));
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
  session_spec = '';
}

function Stats() {
  const stats = session ? JSON.parse(api.sessionStats(session)) : null;
  return {session: stats, heap_bytes: memory.bytes};
}

// A macrotask break, so the Stop message (queued behind this loop) is seen. Taken at most every
// kYieldMs: setTimeout's clamp would cost more than a token if it came after every one.
const kYieldMs = 40;
const Pause = () => new Promise((resolve) => setTimeout(resolve, 0));

// The completion's rules: kvq's Generator in the module (src/web/web_generate.cc), handed each
// sampled token. It decides what text may be shown (a possible stop string or a cut UTF-8
// character held back), whether the token runs, and when and why the completion ends, as in
// `kvq run` and kvq serve. A step: {text, kept, run, finished, finish_reason, completion (once
// finished: the whole text)}.
function Completion(handle) {
  Check(handle, 'starting the completion');
  return {
    next: (token) => JSON.parse(api.generatorNext(handle, token)),
    cancel: () => JSON.parse(api.generatorCancel(handle)),
    free: () => api.generatorFree(handle),
  };
}

// p: {prompt, kv_k, kv_v, device_budget_bytes, temperature, top_k, top_p, min_p, seed,
//     repeat_penalty, frequency_penalty, presence_penalty, repeat_last_n, logit_bias (optional),
//     max_tokens | n_positions (positions in all, BOS and prompt included, as run.c's -n),
//     stop (strings the text ends before), ignore_eos, chat}
// chat: the prompt is a rendered conversation (the chat page's turn): its ids by the chat rule,
// and the last generation's cache, when made on the same path with the same formats and budget,
// is kept up to where it and the prompt differ (Session::KeepCommonPrefix, as kvq chat: the
// WebAssembly path's session, or the WebGPU path's sequence, worker_gpu.js): a turn prefills only
// what the history did not hold (timing.n_reused: the prompt tokens kept). One such cache is held
// at a time: a turn on one path frees the other's.
// Posts progress and a 'done' whose finish_reason is stop (an end token or a stop string),
// length, context (the model's context is full) or cancelled (Stop).
async function Generate(id, p) {
  RequireModel();
  stopRequested = false;
  if (!p.chat) FreeSession();
  p = {...p, threads: p.threads ?? threads};
  if (!(Number.isInteger(p.threads) && p.threads >= 1 && p.threads <= threads)) {
    throw new Error(`threads ${p.threads}: this page runs 1${threads > 1 ? ` to ${threads}` : ''}`);
  }
  const prompt_ids = Tokenize(p.prompt, p.chat ? 'chat' : -1);
  if (prompt_ids.length === 0) throw new Error('the prompt gave no tokens (and the model adds no BOS)');
  const max_tokens = p.n_positions !== undefined ? p.n_positions - prompt_ids.length : p.max_tokens;
  if (!(max_tokens >= 1)) {
    throw new Error(`nothing to generate: ${p.n_positions !== undefined ?
      `n_positions ${p.n_positions} <= the prompt's ${prompt_ids.length} tokens` : `max tokens ${p.max_tokens}`}`);
  }
  if (prompt_ids.length > model_context) {
    throw new Error(`the prompt's ${prompt_ids.length} tokens do not fit the model's context of ${model_context}`);
  }
  // Checked before the prompt runs, so a bad stop string costs no prefill.
  const options = JSON.stringify({max_tokens, stop: p.stop ?? [], ignore_eos: p.ignore_eos ?? false});
  Check(api.generatorCheck(options) === 0, 'the generation options');
  // The path: p.device 'cpu', 'gpu', or 'auto' (the GPU when it can, unless the adapter is an
  // emulation). What the GPU path cannot run (a model past the device's limits) runs on
  // WebAssembly instead, with the reason in path.why: nothing the CPU can run errors for want of
  // the GPU (every sampler setting runs on both).
  const want = p.device || 'auto';
  if (!['auto', 'cpu', 'gpu'].includes(want)) throw new Error(`device "${want}": use auto, cpu or gpu`);
  const why_not = GpuWhyNot();
  const emulated = want === 'auto' && !why_not && gpu.emulated && !gpu_forced ?
      `the WebGPU adapter (${gpu.name}) is a CPU emulation, slower than WebAssembly here: choose gpu to use it` : '';
  const on_gpu = want !== 'cpu' && !why_not && !emulated;
  const path = on_gpu ? {device: 'gpu', adapter: gpu.name}
                      : {device: 'cpu', why: want === 'cpu' ? 'asked for' :
                           `${why_not || emulated}${want === 'gpu' ? '; running on WebAssembly instead' : ''}`};
  if (on_gpu) FreeSession();
  else gpu_step?.FreeSequence();
  const engine = on_gpu ? await GpuEngine(p, p.chat) : CpuEngine(p, p.chat, await FullModel());
  const n_reused = await engine.keep_prefix(prompt_ids);

  const ids = prompt_ids.slice();  // the prompt and every token sampled (an end token too, as run.c's ids)
  const prompt_text = Detokenize(prompt_ids);
  let completion = '';  // the text the completion's rules have released so far
  let prefill_ms = 0;  // the prompt's blocks, the pauses between them excluded
  let held = n_reused;  // prompt tokens the session holds
  let decode_ms = 0;   // sampling and decode steps, the pauses for messages excluded
  const timing = () => ({n_prompt: prompt_ids.length, n_reused, n_prompt_held: held, prefill_ms,
                         n_generated: ids.length - prompt_ids.length, decode_ms});
  let sent = 0;  // ids already posted: the first post carries BOS and the prompt
  let last_post = performance.now();
  const post = (type, extra) => {
    self.postMessage({type, id, new_ids: ids.slice(sent), text: prompt_text + completion, completion,
                      timing: timing(), stats: engine.stats(), path, threads: p.threads, ...extra});
    sent = ids.length;
    last_post = performance.now();
  };
  const done = (finish_reason, end_token) => post('done', {
    ids, finish_reason, stopped: finish_reason === 'cancelled', end_token, context: model_context,
    context_full: finish_reason === 'context'});
  // The prompt in kvq's own blocks (the module's kPrefillBlock: weights are read once per block,
  // and how a prompt is cut changes no bit of the cache or logits), with a pause after each so
  // that Stop is seen within one block.
  const prefill_block = api.prefillBlock();
  while (held < prompt_ids.length) {
    const t0 = performance.now();
    const block = prompt_ids.slice(held, held + prefill_block);
    await engine.prefill(block);
    held += block.length;
    prefill_ms += performance.now() - t0;
    if (held === prompt_ids.length) break;
    self.postMessage({type: 'progress', id, prefill: {held, total: prompt_ids.length}, timing: timing(), path});
    await Pause();
    if (stopRequested) return done('cancelled', false);
  }
  post('progress');
  await Pause();
  // Each sampled token goes to the rules, which say whether it runs and when the completion ends.
  const rules = Completion(engine.completion(options, prompt_ids));
  try {
    for (;;) {
      let step;
      if (stopRequested) {
        step = rules.cancel();
      } else {
        const t0 = performance.now();
        const token = engine.sample();
        ids.push(token);
        step = rules.next(token);
        if (step.run) await engine.decode(token, ids.length - 1);
        decode_ms += performance.now() - t0;
      }
      completion = step.finished ? step.completion : completion + step.text;
      if (step.finished) return done(step.finish_reason, !step.kept && step.finish_reason === 'stop');
      if (performance.now() - last_post >= kYieldMs) {
        post('progress');
        await Pause();
      }
    }
  } finally {
    rules.free();
  }
}

// fn(address) of `ids` copied into the module's memory ([ids.length] int32), freed after it returns.
function WithIds(ids, fn) {
  const buf = kvq._malloc(Math.max(1, ids.length) * 4);
  try {
    memory.i32.set(ids, buf >> 2);
    return fn(buf);
  } finally {
    kvq._free(buf);
  }
}

// The WebAssembly CPU path: a kvq session in the module; keep: the last one, if it was made with
// these formats and budget (a chat's history), else a new one.
// cpu_model: the model the CPU forward runs (FullModel).
function CpuEngine(p, keep, cpu_model) {
  const spec = JSON.stringify([p.kv_k, p.kv_v, p.device_budget_bytes || 0]);
  if (!keep || spec !== session_spec) {
    FreeSession();
    session = api.sessionNew(cpu_model, p.kv_k, p.kv_v, p.device_budget_bytes || 0);
    Check(session, `creating a session with K "${p.kv_k}", V "${p.kv_v}"`);
    session_spec = spec;
  }
  Check(with_sampler_settings(kvq, p, (...settings) => kvq._kvq_web_set_sampler(session, ...settings)) === 0,
        'the sampler settings');
  // No count changes a bit of the logits (kvq/session.h): ?threads=N and a test's threads: 1 vs 2.
  Check(api.sessionSetThreads(session, p.threads) === 0, `running with ${p.threads} threads`);
  return {
    // Keeps what the session holds of prompt_ids' prefix (never all of it); the positions kept.
    keep_prefix: (prompt_ids) => WithIds(prompt_ids, (buf) => {
      const kept = api.sessionKeepPrefix(session, buf, prompt_ids.length);
      Check(kept >= 0, 'reusing the session');
      return kept;
    }),
    prefill: async (prompt_ids) =>
      WithIds(prompt_ids, (buf) => Check(api.prefill(session, buf, prompt_ids.length) === 0, 'prefill')),
    sample: () => {
      const token = api.sample(session);
      Check(token >= 0, 'sampling');
      return token;
    },
    decode: async (token, position) => Check(api.decode(session, token) === 0, `decode at position ${position}`),
    // The rules of the completion that follows what the session holds.
    completion: (options) => api.generatorNew(session, options),
    stats: () => Stats(),
  };
}

// The WebGPU path (worker_gpu.js's GpuTurn); keep: a chat turn, which keeps what the runner's
// sequence shares with its prompt.
async function GpuEngine(p, keep) {
  if (!gpu_step) {
    const {GpuModelRunner} = await import('./gpu/gpu_engine.js');
    // A header-only model's weights come from its file (again after a lost device); its CPU steps
    // (no device came back) run the whole file's model, loaded then.
    gpu_step = await GpuModelRunner.Create(kvq, gpu.device, model, gpu_program,
                                           {read_file: model_file ? FileReader(model_file) : null, cpu_model: FullModel});
  }
  const runner = gpu_step;
  return GpuTurn(runner, p, keep, {
    context: model_context, heap_bytes: () => memory.bytes,
    completion: (options, prompt_ids) => api.generatorNewForSequence(model, prompt_ids.at(-1), runner.positions, options)});
}

// The page's benchmark (web/bench.js) on the loaded model: the GPU path (forced, even on an
// emulated adapter) and the WebAssembly path, greedy, each over its own fresh sequence.
async function Bench(id, p) {
  RequireModel();
  const {RunBench} = await import('./bench.js');
  const info = JSON.parse(api.modelInfo(model));
  return RunBench(p, {
    vocab: info.vocab_size, context: model_context, block: api.prefillBlock(),
    why_not: (path) => (path === 'gpu' ? GpuWhyNot() : ''),
    Engine: async (path, q) => (path === 'gpu' ? GpuEngine(q, false) : CpuEngine({...q, threads}, false, await FullModel())),
    Free: FreeSession,
    progress: (what) => self.postMessage({type: 'progress', id, bench: what}),
    describe: {model: info, adapter: gpu ? gpu.name : null,
               cpu: `WebAssembly (Highway target ${api.simdTarget()}), ${threads} thread(s)`}});
}

// kvqPage.loseDevice: the device the GPU path holds destroyed, as a lost device behaves; the
// runner notices at its next step (device.lost) and goes on on a new device or the CPU. Returns
// once device.lost has settled (the runner's handler, attached first, has run: the next turn then
// starts from a lost device, whatever the host's speed) or kLoseWaitMs have passed.
const kLoseWaitMs = 5000;
async function LoseDevice() {
  const device = gpu_step?.device;
  if (!device) throw new Error('no WebGPU device is in use: run a generation on the GPU path first');
  device.destroy();
  const settled = await Promise.race([device.lost.then(() => true),
                                      new Promise((resolve) => setTimeout(() => resolve(false), kLoseWaitMs))]);
  return {lost: true, settled};
}

const handlers = {
  init: (m) => Init(m),
  load_bundled: (m) => LoadBundled(m.id),
  load: (m) => LoadModel(m.id, m.files),
  tokenize: (m) => ({ids: Tokenize(m.text, m.add_bos === undefined ? -1 : m.add_bos)}),
  generate: (m) => Generate(m.id, m.params),
  bench: (m) => Bench(m.id, m.params ?? {}),
  stats: () => Stats(),
  lose_device: () => LoseDevice(),
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
    if (busy) throw new Error(`${busy} is running: wait for it${busy === 'a generation' ? ' or stop it' : ''}`);
    if (m.type !== 'init' && !api) throw new Error('the WebAssembly module is not loaded');
    // Generating and loading pause (for Stop, for the file's chunks): nothing else runs meanwhile.
    busy = {generate: 'a generation', bench: 'a benchmark', load: 'a model load', load_bundled: 'a model load'}[m.type] || false;
    owns_busy = Boolean(busy);
    const result = await handler(m);
    // generate posts its own 'done'; the others answer with their result.
    if (m.type !== 'generate') self.postMessage({type: 'result', id: m.id, result});
  } catch (e) {
    self.postMessage({type: 'error', id: m.id, message: e instanceof Error ? e.message : String(e)});
  } finally {
    if (owns_busy) busy = false;
  }
};
