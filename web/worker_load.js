// What web/worker.js starts with and how it reads model files, apart from the generation it runs:
// which module variant this browser can run (SIMD128, threads) and whether WebGPU offers a device;
// views of the module's memory; a model file (a picked File or a fetched body) read into that
// memory a chunk at a time, with load progress, or a picked GGUF file's header alone (the GPU
// path's weights are then read from the file), and the models loaded from them. A classic script: worker.js imports it with
// importScripts, so these names are the worker's globals; each takes what it uses as arguments.
'use strict';

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

// Which module runs, and with how many threads: threads need SharedArrayBuffer, which a browser
// gives only to a cross-origin isolated page (served with COOP same-origin and COEP require-corp).
// want_threads: the page's ?threads=N, or null for every core the browser reports.
function ChooseModule(want_simd, want_threads) {
  const simd = want_simd && SimdSupported();
  const cores = Math.max(1, navigator.hardwareConcurrency || 1);
  const asked = want_threads ?? cores;
  const isolated = self.crossOriginIsolated === true && typeof SharedArrayBuffer === 'function';
  let why = '';
  if (asked === 1) why = want_threads === 1 ? 'asked for one thread (?threads=1)' : 'the browser reports one core';
  else if (!simd) why = 'the scalar build has no threaded variant';
  else if (!isolated) why = 'the page is not cross-origin isolated (its server sends no COOP/COEP headers), so the browser offers no SharedArrayBuffer';
  return {simd, threads: why ? 1 : asked, why};
}

// WebGPU's device for the page: {gpu: {device, name, emulated}, why_not: ''} when the browser
// offers an adapter, else {gpu: null, why_not: the reason}.
async function OpenGpu() {
  if (!self.navigator || !navigator.gpu) {
    return {gpu: null, why_not: 'this browser offers no WebGPU (navigator.gpu is missing)'};
  }
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) return {gpu: null, why_not: 'WebGPU offers no adapter'};
  const info = adapter.info || {};
  const {IsEmulatedAdapter} = await import('./gpu/step_kernels.js');  // the step program's own test
  // As large a model buffer as the adapter allows (the default limits stop at 128 MiB bindings).
  const requiredLimits = {maxStorageBufferBindingSize: adapter.limits.maxStorageBufferBindingSize,
                          maxBufferSize: adapter.limits.maxBufferSize};
  return {gpu: {device: await adapter.requestDevice({requiredLimits}),
                name: [info.vendor, info.architecture, info.description].filter(Boolean).join(' ') || 'an unnamed adapter',
                // A CPU emulation (SwiftShader): 'auto' keeps to WebAssembly, far faster there.
                emulated: IsEmulatedAdapter(info) || Boolean(adapter.isFallbackAdapter)},
          why_not: ''};
}

// The memory of an Emscripten module as bytes. The threaded module's memory is a SharedArrayBuffer
// that growth replaces; its HEAP views follow only when its own JS touches them, so this checks
// the memory each time.
class ModuleMemory {
  constructor(module) {
    this.module = module;
    this.view = null;  // [heap bytes] Uint8Array over the module's memory, refreshed when it grows
  }

  get u8() {
    const buffer = this.module.wasmMemory ? this.module.wasmMemory.buffer : this.module.HEAPU8.buffer;
    if (!this.view || this.view.buffer !== buffer) this.view = new Uint8Array(buffer);
    return this.view;
  }

  get i32() {
    return new Int32Array(this.u8.buffer);
  }

  get bytes() {
    return this.u8.length;
  }
}

// Bytes read per step from a picked file: only this much is ever held outside the module's memory.
const kChunkBytes = 1 << 20;

// Chunks ([n] Uint8Array each) of a File, read as they are needed.
async function* FileChunks(file) {
  for (let offset = 0; offset < file.size; offset += kChunkBytes) {
    yield new Uint8Array(await file.slice(offset, offset + kChunkBytes).arrayBuffer());
  }
}

// A fetched file (the bundled model, 1 MiB) as one chunk: streaming its body saves nothing at this
// size, and Chromium intermittently reported a streamed read of it as an aborted request.
async function FetchChunks(pending) {
  const response = await pending;
  if (!response.ok) throw new Error(`fetching ${response.url}: HTTP ${response.status}`);
  const bytes = new Uint8Array(await response.arrayBuffer());
  return {total: bytes.length, chunks: [bytes]};
}

// A model file's {total bytes, chunks}: f is {name, file: File} or {name, response: a fetch's promise}.
async function ModelSource(f) {
  return f.file ? {total: f.file.size, chunks: FileChunks(f.file)} : FetchChunks(f.response);
}

// on_bytes(read so far) for a load of `total` bytes: posts {type: 'progress', id, load: {bytes,
// total, percent}} in steps of a tenth of a percent of the whole file, strictly increasing (a
// figure not above the last is not posted), 100 at the end.
function LoadProgress(id, total) {
  let last_percent = -1;
  return (bytes) => {
    const percent = Math.floor(1000 * bytes / total) / 10;
    if (percent <= last_percent) return;
    last_percent = percent;
    self.postMessage({type: 'progress', id, load: {bytes, total, percent}});
  };
}

// Copies `total` bytes of chunks into memory from the module ([total] bytes, page-aligned: api's
// kvq_web_file_alloc), calling on_bytes(read so far) after each chunk; returns the address (the
// caller hands it on or frees it). memory: the module's ModuleMemory; check(ok, what) throws
// with the module's last error when ok is false.
async function ReadIntoModule(memory, api, check, name, total, chunks, on_bytes) {
  const ptr = api.fileAlloc(total);
  check(ptr, `reading ${name} (${total} bytes)`);
  let done = 0;
  try {
    for await (const chunk of chunks) {
      if (done + chunk.length > total) throw new Error(`${name} grew while it was read (over ${total} bytes)`);
      memory.u8.set(chunk, ptr + done);
      done += chunk.length;
      on_bytes(done);
    }
    if (done !== total) throw new Error(`${name}: read ${done} of its ${total} bytes`);
  } catch (e) {
    api.fileFree(ptr);
    throw e;
  }
  return ptr;
}

// Writes a tokenizer file ({name, file | response}, a few KiB) into the module's MEMFS; returns its
// path there (the caller unlinks it once the model has loaded).
async function WriteTokenizer(module, t) {
  const bytes = t.file ? await t.file.arrayBuffer() : await (await t.response).arrayBuffer();
  const path = `/models/${t.name.replace(/[\/\\]/g, '_')}`;
  module.FS.writeFile(path, new Uint8Array(bytes));
  return path;
}

// The header (metadata and tensor table) of a picked GGUF file read into memory from the module:
// its first 4 MiB, then twice as much until the module's kvq_web_gguf_header_bytes can tell the
// header's length (0: read more), so the file's tensors never enter the module's memory (the GPU
// path reads them from the file: web/gpu/step_program.js). Returns {ptr, bytes}: the caller hands
// the bytes to kvq_web_model_load_header, which takes them. on_bytes(read) after each read.
async function ReadHeaderIntoModule(memory, api, check, name, file, on_bytes) {
  for (let n = Math.min(file.size, 4 << 20); ; n = Math.min(file.size, 2 * n)) {
    const ptr = await ReadIntoModule(memory, api, check, name, n, FileChunks(file.slice(0, n)), () => {});
    const header = api.ggufHeaderBytes(ptr, n, file.size, name);
    if (header > 0) {
      on_bytes(n);
      return {ptr, bytes: n};
    }
    api.fileFree(ptr);
    check(header === 0, `reading the header of ${name}`);
    if (n === file.size) throw new Error(`${name}: no GGUF header found in its ${file.size} bytes`);
    on_bytes(n);
  }
}

// The model loads below take env: {kvq (the module), api, memory (its ModuleMemory), check (ok,
// what), threads (the models' thread count)}.

// The model of a whole file ({name, file | response}, with its tokenizer file or null) read into
// the module: {model: its handle, total: the file's bytes}. progress_for(total): LoadProgress for
// the total (null: no progress posted).
async function LoadWholeModel(env, files, progress_for) {
  const {kvq, api, memory, check, threads} = env;
  const source = await ModelSource(files.model);
  const ptr = await ReadIntoModule(memory, api, check, files.model.name, source.total, source.chunks,
                                   progress_for ? progress_for(source.total) : () => {});
  const tok_path = files.tokenizer ? await WriteTokenizer(kvq, files.tokenizer) : '';
  // kvq_web_model_load_bytes takes the bytes: the model keeps them, or the failed load frees them.
  const next = api.modelLoadBytes(ptr, source.total, files.model.name, tok_path, threads);
  if (tok_path) kvq.FS.unlink(tok_path);
  check(next, `loading ${files.model.name}${files.tokenizer ? ` with ${files.tokenizer.name}` : ''}`);
  return {model: next, total: source.total};
}

// The model of a picked GGUF file ({name, file}, its own vocabulary) from its header alone
// (kvq_web_model_load_header): its handle, or 0 when the module cannot load it so (its last error
// says why: e.g. a tensor read at load). on_bytes(read) as ReadHeaderIntoModule's.
async function LoadHeaderModel(env, f, on_bytes) {
  const {api, memory, check, threads} = env;
  const {ptr, bytes} = await ReadHeaderIntoModule(memory, api, check, f.name, f.file, on_bytes);
  return api.modelLoadHeader(ptr, bytes, f.file.size, f.name, '', threads);
}

// async (offset, bytes) => Uint8Array [bytes]: a File's bytes, read when asked (the GPU path's
// weights, uploaded from the file in chunks by their file offsets, again after a lost device).
function FileReader(file) {
  return async (offset, bytes) => {
    const data = new Uint8Array(await file.slice(offset, offset + bytes).arrayBuffer());
    if (data.length !== bytes) throw new Error(`${file.name}: read ${data.length} of ${bytes} bytes at ${offset}`);
    return data;
  };
}
