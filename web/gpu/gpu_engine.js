// The WebGPU path of a model loaded in the WebAssembly module (kvq.js): its step program
// (kvq_web_gpu_program, src/web/gpu_program.h) run by step_program.js, the KV master in the
// module's KvCache made for the model (kvq_web_kv_new_for_model), attention through kv_device.js.
// The page's worker (web/worker.js) and the tests (tests/web/gpu/gpu_forward_page.js) both run
// models through this file. M: the Emscripten module; model: a kvq_web_model_load handle.
//
// A lost device (device.lost, or a step whose readback fails because the device went away) does
// not end the conversation: the master cache is the module's, so the runner asks for a new
// device, uploads the weights again (from the module's memory, or from the model file for a model
// loaded from its header alone: options.read_file) and redoes the step at the same
// position (attention streams its pages from the master on every call, so the GPU working set
// is rebuilt by the next attention call). If no device comes back, the rest of the conversation
// runs on the module's C++ forward over the same cache (module_forward.js; options.cpu_model
// gives the model it runs, the whole file's when the runner's was loaded from its header alone).
// A hybrid's recurrent states went with the device, and the master cannot give them back (they
// took in every position; the master holds only the attention layers' rows), so its held ids,
// positions 0 .. pos − 1, run again first: on the new device in Prefill's blocks from a zeroed
// state over a master cut back to none — the replay writes K and V again rather than attending
// the master's rows, as a query must read the rows as they were at its position (a KIVI group
// not yet whole read in f32) and the same kernels and encoders give the same bytes, so the master
// and the ids are the uninterrupted run's bit for bit (a block gives the bits of token steps, the
// recurrent layers' too: block_steps.js) — or, with no device, on the CPU (module_forward.js:
// the sequence is then the CPU's from position 0). events[i].replayed says what ran again.
//
// Three paths for a sequence's KV (`path`, and `path_why` saying why): "resident" (the specs have
// WGSL encoders and no transform but rot, sinkN, resN and prerope, and the device budget holds the whole
// context: kv_resident.js keeps the working set on the GPU, a step is one submit and one readback,
// full pages reach the master behind it; a lost device costs the tail page, whose ids run again on
// the next device or the CPU); "mixed" (the same specs, the context over the budget, which holds
// their f32 rows: the newest pages that fit the budget (kv_resident_specs.js's MixedCosts) stay resident
// as above, older ones, once written behind (sinkN / resN: encoded), are evicted and streamed from the master
// each step through kv_resident.js's slots with the same window kernels in position order: the
// same bits, one readback a step, a submit more each time the slots wrap);
// else "stream" (each layer's rows read back into the master, whose pages stream through
// kv_device.js: n_layers + 1 submits and readbacks a step).
//
// Prefill (a prompt's ids) runs in blocks on the resident and mixed paths: a block's ops are
// encoded op by op for all its tokens into one command encoder (step_program.js's Steps,
// block_steps.js: the same bits as token-by-token steps), one submit and one readback per block (the mixed
// path adds its submits per streaming-slot reuse, and cuts its blocks where a page would be
// evicted: a page read by a block's earlier tokens cannot be freed before the block's submit).
// The stream path reads each layer's rows back, so it prefills token by token.
//
// A chat's next turn keeps the sequence (KeepPrefix): what it shares with the new prompt stays,
// in the master and in the resident pages alike, and only the rest of the prompt runs.
// A hybrid's recurrent layers keep their state on the GPU (the step program's states, zeroed by
// NewSequence), not in the module's cache: a sequence of such a model cannot be cut back to a
// prefix (KeepPrefixWhyNot); it starts anew.

import {GpuKvDevice} from './kv_device.js';
import {BlockUniformSlots, GpuResidentKv, KvPathOf, PageBufferBytes} from './kv_resident.js';
import {LastError, ModuleForward, RewindKv} from './module_forward.js';
import {ModuleSampler, SampleExp2Table} from './module_sampler.js';
import {GpuLimitsFor, GpuStepProgram, StepProgramWhyNot} from './step_program.js';

// A step is redone at most this many times after losing its device (a device lost again and
// again is a broken one: the error then reaches the caller).
const kMaxRecoveries = 3;
// Tokens per prefill block at most: kvq's kPrefillBlock (kvq/session.h), the page's block too.
export const kGpuPrefillBlock = 64;
// Uniform slots (uniform_arena.js: 256 bytes each on most devices) a block may take: #BlockLength
// counts what the block records (kv_resident.js's BlockUniformSlots: per layer the encoder calls
// of the pages it writes, an attend per page or per pool segment and a gather), which grows with
// the pages attended, not the block's tokens; a context too long for a block's attends gets blocks cut at a page end
// (4 MiB of parameters at most) rather than an arena that grows with the context.
const kBlockUniformSlots = 16384;
// How long a failed step waits for device.lost to say whether the device went away (the
// rejected readback and the lost promise settle in either order).
const kLostWaitMs = 2000;

/**
 * The model's step program, or why the GPU path cannot run it: {program} or {why_not} (the
 * module builds every layer kind; the kernels here refuse weight types they do not read).
 */
export function GpuProgramOf(M, model) {
  const json = M._kvq_web_gpu_program(model);
  if (!json) return {why_not: LastError(M)};
  const program = JSON.parse(M.UTF8ToString(json));
  const why_not = StepProgramWhyNot(program);
  return why_not ? {why_not} : {program};
}

/**
 * A device for `program` from `adapter` (navigator.gpu's first when not given), requesting the
 * limits the program needs (GpuLimitsFor), or null when WebGPU offers no adapter. Throws, naming
 * the limit and the model, when the adapter cannot give them.
 */
export async function RequestGpuDevice(program, adapter = null) {
  adapter ??= await globalThis.navigator?.gpu?.requestAdapter();
  if (!adapter) return null;
  const {requiredLimits, requiredFeatures, why_not} = GpuLimitsFor(program, adapter.limits, adapter.features);
  if (why_not) throw new Error(why_not);
  return adapter.requestDevice({requiredLimits, requiredFeatures});
}

export class GpuModelRunner {
  /**
   * The runner of `model` (program from GpuProgramOf) on `device`; compiles every pipeline.
   * options.acquire: async () => a new GPUDevice or null, asked when the device is lost (default:
   * RequestGpuDevice on navigator.gpu's adapter); options.step: GpuStepProgram.Create's options
   * (forced limits, the model's name for a refusal); options.read_file: async (offset, bytes) =>
   * the model file's bytes, for a program whose tensors are given by file_offset (uploaded from
   * the file, at Create and after a lost device); options.cpu_model: async () => the model handle
   * the CPU steps run (default: `model`; a header-only model's whole-file twin).
   */
  static async Create(M, device, model, program, options = {}) {
    const runner = new GpuModelRunner(M, model, program, options.acquire || (() => RequestGpuDevice(program)));
    runner.step_options = {...options.step, sample_table: SampleExp2Table(M),
                           ...(options.read_file ? {read_file: options.read_file} : {})};
    runner.cpu_model = options.cpu_model || (async () => model);
    runner.cpu_model_handle = 0;  // what cpu_model gave, asked for on the first CPU step
    await runner.#Attach(device);
    return runner;
  }

  constructor(M, model, program, acquire) {
    this.M = M;
    this.model = model;
    this.program = program;
    this.config = program.config;
    this.acquire = acquire;
    this.rope_ptr = M._malloc(program.config.rotary_dims * 4);  // [rotary_dims / 2][cos, sin]
    this.rope = (pos) => {
      if (M._kvq_web_gpu_rope(model, pos, this.rope_ptr) !== 0) throw new Error(`RoPE at position ${pos}: ${LastError(M)}`);
      return M.HEAPF32.slice(this.rope_ptr >> 2, (this.rope_ptr >> 2) + program.config.rotary_dims);
    };
    this.kv = 0;        // the module's KvCache handle of the current sequence
    this.rows = M._malloc(2 * this.config.kv_dim * 4);  // one position's K and V: [2][kv_dim]
    this.cpu = new ModuleForward(M, program.config);  // the steps after a device that did not come back
    this.positions = 0;
    this.ids = [];        // [positions] the ids the sequence holds (a CPU rewind runs them again)
    this.device = null;
    this.lost = null;     // device.lost's info once the current device is lost
    this.on_cpu = false;  // no device came back: steps run on the module's C++ forward
    /**
     * What happened to the device: [{position, to: 'gpu' | 'cpu', why, replayed: {from, positions,
     * ms}}] (why: the loss, and for 'cpu' the failed re-acquire; replayed: the held positions run
     * again there before `position`, the first of them and the milliseconds it took).
     */
    this.events = [];
    this.retired = {steps: 0, submits: 0, readbacks: 0, device_submits: 0};  // of step programs of lost devices
    this.retired_write_backs = 0;  // pages written behind by resident caches gone since
    this.retired_streamed_bytes = 0;  // bytes streamed from the master by mixed-mode caches gone since
    this.retired_attend_dispatches = 0;  // attention dispatches of resident caches gone since
    this.resident = null;  // the sequence's GpuResidentKv on the resident and mixed paths
    this.resident_pages = Infinity;  // pages per layer kept on the GPU (mixed: fewer than the context's)
    this.stream_slots = 0;  // the mixed mode's streaming slots (kv_resident_specs.js's StreamSlotsFor)
    this.path = '';        // 'resident', 'mixed' or 'stream' (NewSequence)
    this.path_why = '';    // why this path
    this.sampler = null;  // SetSampler's ModuleSampler
    /** Test hook: called after each layer's K and V rows reach the master (layer, position). */
    this.after_append = null;
  }

  async #Attach(device) {
    this.device = device;
    this.lost = null;
    device.lost.then((info) => {
      if (this.device === device) this.lost = info;
    });
    this.kv_device = new GpuKvDevice(device);
    this.M.kvqDevice = this.kv_device;
    this.step = await GpuStepProgram.Create(device, this.program, this.M.HEAPU8, this.rope, this.kv_device,
                                           this.step_options);
  }

  /**
   * Starts a sequence: a new cache with key and value specs as kvq's --kv-k / --kv-v, a device
   * budget in bytes (0: none) and positions per page (0: the cache's default; else a multiple of
   * 32). Returns the cache's plan {total_bytes, slot_bytes, device_slots, ...}.
   */
  //
  // options.path: 'auto' (resident where it can, else stream) or 'stream' (forced); options.stream_slots:
  // the mixed mode's streaming slots (tests; else kv_resident_specs.js's StreamSlotsFor).
  NewSequence(kv_k, kv_v, device_budget_bytes = 0, page_positions = 0, options = {}) {
    const M = this.M;
    this.FreeSequence();
    const str = (s) => {
      const n = M.lengthBytesUTF8(s) + 1, p = M._malloc(n);
      M.stringToUTF8(s, p, n);
      return p;
    };
    const k = str(kv_k), v = str(kv_v);
    try {
      this.kv = M._kvq_web_kv_new_for_model(this.model, k, v, device_budget_bytes, page_positions);
    } finally {
      M._free(k);
      M._free(v);
    }
    if (!this.kv) throw new Error(`the GPU path's KV cache (K "${kv_k}", V "${kv_v}"): ${LastError(M)}`);
    this.prerope = /prerope/.test(kv_k);  // the cache stores keys before RoPE: it gets k_pre
    this.positions = 0;
    this.ids = [];
    this.M.kvqDevice = this.kv_device;
    this.plan = JSON.parse(M.UTF8ToString(M._kvq_web_kv_plan(this.kv)));
    this.kv_specs = {key: kv_k, value: kv_v};
    this.sequence_args = [kv_k, kv_v, device_budget_bytes, page_positions, options];  // KeepPrefix's restart
    this.keep_why = '';
    const want = options.path || 'auto';
    if (!['auto', 'stream'].includes(want)) throw new Error(`KV path "${want}": use auto or stream`);
    /** The cache's page (one spec for every layer): kvq_web_kv_page_layout's {page_bytes, value_offset,
     *  page_positions, key_block_bytes, value_block_bytes[, rotation_signs]}. */
    this.layout = JSON.parse(M.UTF8ToString(M._kvq_web_kv_page_layout(this.kv, 0)));
    // resident_bytes: the device budget that keeps every page of the context on the GPU
    ({path: this.path, why: this.path_why, resident_pages: this.resident_pages, resident_bytes: this.resident_bytes,
      stream_slots: this.stream_slots} = KvPathOf({
      kv_k, kv_v, want, budget: device_budget_bytes, total: this.plan.total_bytes, layout: this.layout, c: this.config,
      on_cpu: this.on_cpu, stream_slots: options.stream_slots}));
    if (this.path !== 'stream') this.resident = this.#NewResident();
    this.step?.ResetStates();
    return this.plan;
  }

  /**
   * Why this model's sequences cannot keep a prefix of their positions and go on from there ('' when
   * they can): a recurrent layer's state has taken in every position and cannot drop the last ones.
   * A caller that would keep a prefix (a chat cut back to an earlier turn) starts anew instead:
   * NewSequence, then the prefix's ids again.
   */
  KeepPrefixWhyNot() {
    if (!Object.keys(this.program.states || {}).length) return '';
    return `this ${this.config.arch} model has recurrent (Gated DeltaNet) layers, whose state cannot be cut back to a ` +
           'prefix: the sequence starts anew';
  }

  /** Whether a sequence of this model can keep a prefix of its positions (KeepPrefixWhyNot). */
  CanKeepPrefix() { return this.KeepPrefixWhyNot() === ''; }

  // A resident cache on the current device for the sequence, its pages appended to the master;
  // in mixed mode its older pages read back from the master to stream.
  #NewResident() {
    const M = this.M, kv = this.kv, layout = this.layout;
    const bytes = PageBufferBytes(layout.page_bytes);  // whole words: the GPU copies take them
    if (this.page_ptr) M._free(this.page_ptr);
    if (this.read_ptr) M._free(this.read_ptr);
    this.page_ptr = M._malloc(bytes);
    this.read_ptr = M._malloc(bytes);
    const mixed = this.path !== 'mixed' ? null : {
      resident_pages: this.resident_pages,
      stream_slots: this.stream_slots,
      read: (layer, page) => {
        if (M._kvq_web_kv_read_page(kv, layer, page, this.read_ptr) !== 0) {
          throw new Error(`reading page ${page} of layer ${layer} from the master to stream it: ${LastError(M)}`);
        }
        return M.HEAPU8.subarray(this.read_ptr, this.read_ptr + bytes);
      }};
    const resident = new GpuResidentKv(this.device, this.config, layout, this.kv_specs, (layer, bytes, rows) => {
      if (this.resident !== resident) return;  // a sequence or device gone since
      if (rows) {  // sinkN / resN: a page's f32 rows, which the master encodes (kv_resident_rows.js)
        const at = M._malloc(2 * rows.k.byteLength);
        M.HEAPF32.set(rows.k, at >> 2);
        M.HEAPF32.set(rows.v, (at + rows.k.byteLength) >> 2);
        const failed = M._kvq_web_kv_append(kv, layer, at, at + rows.k.byteLength, layout.page_positions) !== 0;
        M._free(at);
        if (failed) throw new Error(`writing a page of layer ${layer}'s rows behind: ${LastError(M)}`);
        return;
      }
      M.HEAPU8.set(bytes, this.page_ptr);
      if (M._kvq_web_kv_append_pages(kv, layer, this.page_ptr, 1) !== 0) {
        throw new Error(`writing a page of layer ${layer} behind: ${LastError(M)}`);
      }
    }, mixed, this.rope,  // rope: prerope keys' cos/sin, the step program's (kv_resident_rope.js)
    {pool_grows: !(this.sequence_args[2] > 0)});  // under a budget, pools at full size (kv_resident_pool.js)
    return resident;
  }

  // Drops the resident cache (its write-backs go on landing only while it is current).
  #DropResident() {
    if (!this.resident) return;
    this.retired_write_backs += this.resident.counts.write_backs;
    this.retired_streamed_bytes += this.resident.counts.streamed_bytes;
    this.retired_attend_dispatches += this.resident.counts.attend_dispatches;
    try {
      this.resident.Destroy();
    } catch {
      // Its buffers went with the device.
    }
    this.resident = null;
  }

  /**
   * Makes the sequence a prefix of `ids` (the next prompt, a chat's next turn) by
   * Session::KeepCommonPrefix's rule (kvq::PositionsToKeep, asked of the module): the positions up
   * to where the held ids and `ids` first differ are kept, never all of `ids` (its last id runs
   * again, for the logits), and the rest dropped. On the stream path (and the CPU's) the master drops them (kvq_web_kv_rewind:
   * KvCache::Truncate, down to its TruncationPoint where a format keeps rows in groups); on the
   * resident and mixed paths the resident cache drops them (GpuResidentKv.Truncate: n's page the
   * tail again) and the master keeps the whole pages before n's, the ones written behind, as a
   * sequence that ran only the kept ids would hold them. Returns the positions kept: the prompt's
   * ids from there on are the ones to prefill. A sequence whose resident cache is in doubt (its
   * device lost since, or a page written behind that failed) starts anew with the same
   * arguments instead: 0 kept, and keep_why says why ('' when the sequence was kept).
   */
  async KeepPrefix(ids) {
    if (!this.kv) throw new Error('GpuModelRunner: no sequence to keep (NewSequence first)');
    if (!ids.length) throw new Error('GpuModelRunner: a prompt of no ids');
    const n = this.#PositionsToKeep(ids);
    this.keep_why = '';
    // A recurrent state has taken in every held position: a prompt that extends them goes on, one
    // that cuts them back starts anew.
    if (n < this.positions && !this.CanKeepPrefix()) return this.#Restart(this.KeepPrefixWhyNot());
    if (!this.resident) {  // the master holds every position
      this.positions = this.#RewindTo(n);
    } else {
      const failed = !this.on_cpu && !this.lost ? await this.resident.Drain() : null;
      const why = this.on_cpu || this.lost ? 'the WebGPU device was lost after the last turn' :
          failed ? `a page written behind failed (${failed.message})` : '';
      if (why) return this.#Restart(why);
      if (n < this.positions) {
        const keep = this.resident.KeepablePositions(n);  // a KIVI group encoded since: from its start
        this.resident.Truncate(keep);
        const whole = Math.floor(keep / this.resident.P) * this.resident.P;  // the master's pages before keep's
        if (this.M._kvq_web_kv_positions(this.kv, 0) > whole) {
          const kept = this.M._kvq_web_kv_rewind(this.kv, whole);
          if (kept !== whole) throw new Error(`dropping the master's pages from position ${whole}: ${kept < 0 ? LastError(this.M) : `it kept ${kept}`}`);
        }
        this.positions = keep;
      }
    }
    this.ids.length = this.positions;
    return this.positions;
  }

  // The positions of the held ids that `ids` keeps, by the module's rule (kvq::PositionsToKeep).
  #PositionsToKeep(ids) {
    const M = this.M, held = this.ids;
    const buf = M._malloc((held.length + ids.length) * 4);  // [held.length] then [ids.length] int32
    try {
      M.HEAP32.set(held, buf >> 2);
      M.HEAP32.set(ids, (buf >> 2) + held.length);
      const n = M._kvq_web_positions_to_keep(buf, held.length, buf + held.length * 4, ids.length);
      if (n < 0) throw new Error(`the positions a prompt keeps: ${LastError(M)}`);
      return n;
    } finally {
      M._free(buf);
    }
  }

  // A new sequence with the current one's arguments: 0 positions kept (why: keep_why).
  #Restart(why) {
    this.NewSequence(...this.sequence_args);
    this.keep_why = why;
    return 0;
  }

  /** Waits until every page written behind so far is in the master (tests read it then). */
  async Drain() {
    const failed = await this.resident?.Drain();
    if (failed) throw failed;
  }

  FreeSequence() {
    this.#DropResident();
    if (this.kv) this.M._kvq_web_kv_free(this.kv);
    this.kv = 0;
  }

  /**
   * Runs `token` at the next position: {token: the greedy next id, or with options.sample (a
   * ModuleSampler's words) the sampled one, logits (options.logits)}.
   */
  async Step(token, options = {}) { return this.#Run([token], this.#Draw(options, [token])); }

  /**
   * The sampler of the steps and prefills asked to sample (options.sample: true): kvq's chain with
   * the page's settings {temperature, top_k, top_p, min_p, seed, and the penalties and logit_bias
   * (module_sampler.js's WithSamplerSettings)}, its generator in the module (ModuleSampler),
   * replacing any earlier one.
   */
  SetSampler(p) {
    this.sampler?.Free();
    this.sampler = null;
    this.sampler = new ModuleSampler(this.M, p);
  }

  // options with sample: true as the next token's words (null when greedy), drawn once per call
  // (a block redone after a lost device draws nothing more), and with the penalties' window (the
  // ids held and `tokens`, the ones the call runs: Session::Sample's) the adjust pass's edits
  // (options.adjust; null when the settings adjust nothing) and the window (options.recent).
  #Draw(options, tokens) {
    if (options.sample !== true) return options;
    if (!this.sampler) throw new Error('GpuModelRunner: a sampled step, and no SetSampler');
    const sample = this.sampler.Next();
    if (!sample) return {...options, sample};
    const recent = [...this.ids, ...tokens];
    return {...options, sample, recent, adjust: this.sampler.Adjustment(recent, this.config.vocab_size)};
  }

  /**
   * Runs `ids` at the next positions, in blocks (kGpuPrefillBlock tokens at most, or
   * options.block; options.uniform_slots: kBlockUniformSlots unless given) where the path batches
   * them: the last id's {token, logits (options.logits)}, as many Steps would give.
   */
  async Prefill(ids, options = {}) {
    if (!ids.length) throw new Error('GpuModelRunner: a prefill of no ids');
    options = this.#Draw(options, ids);
    const most = options.block ?? kGpuPrefillBlock;
    if (!(Number.isInteger(most) && most >= 1)) throw new Error(`prefill block ${most}: a whole number ≥ 1`);
    let out = null;
    for (let i = 0; i < ids.length;) {
      const n = this.#BlockLength(this.positions, ids.length - i, most, options.uniform_slots ?? kBlockUniformSlots);
      out = await this.#Run(ids.slice(i, i + n), i + n === ids.length ? options : {});
      i += n;
    }
    return out;
  }

  // Tokens the block at `pos` takes: 1 on the stream path (or the CPU); at most `slots` uniform slots
  // (cut at the end of an earlier page while over: a block's slots change only where it enters a
  // page; 1 token when even its page's are over); on the mixed path up to the end of the current
  // page when the next page's first token evicts a page (FirstResident moves).
  #BlockLength(pos, left, most, slots) {
    if (this.on_cpu || !this.resident) return 1;
    const P = this.resident.P;
    let n = Math.min(left, most);
    while (n > 1 && BlockUniformSlots(this.config.n_cache_layers, P, pos, n, this.resident.group,
                                      this.resident.rotation_slots, this.resident.rows_spec, this.resident.segment_pages) > slots) {
      n = Math.max(1, Math.floor((pos + n - 1) / P) * P - pos);
    }
    if (this.path === 'mixed') {
      const page = Math.floor(pos / P);
      if (page + 2 > this.resident_pages) n = Math.min(n, (page + 1) * P - pos);
    }
    return n;
  }

  // `tokens` at the next positions on the GPU (one block), redone after a lost device from the
  // block's first position, or on the CPU when no device came back.
  async #Run(tokens, options) {
    if (!this.kv) throw new Error('GpuModelRunner: no sequence (NewSequence first)');
    const pos = this.positions;
    let out;
    for (let recoveries = 0; ; ++recoveries) {
      if (!this.on_cpu && this.lost) await this.#Recover(pos);
      if (this.on_cpu) {
        this.cpu_model_handle ||= await this.cpu_model();
        for (let i = 0; i < tokens.length; ++i) {
          out = this.cpu.Step(this.cpu_model_handle, this.kv, this.ids, tokens[i], this.positions,
                              i + 1 === tokens.length ? options : {}, this.sampler);
          this.ids.push(tokens[i]);
          ++this.positions;
        }
        return out;
      }
      if (this.resident?.broken) {  // a page written behind failed: the master lacks it
        if (!(await this.#DeviceLost())) throw new Error(`writing a page behind failed: ${this.resident.broken.message}`);
        continue;  // the loss is handled at the loop's top
      }
      try {
        out = await this.#GpuSteps(tokens, pos, options);
        break;
      } catch (e) {
        if (recoveries >= kMaxRecoveries || !(await this.#DeviceLost())) throw e;
      }
    }
    this.ids.push(...tokens);
    this.positions += tokens.length;
    return out;
  }

  // A block on the GPU. In mixed mode the pages it evicts must be in the master first (it streams
  // them from there): their write-backs were submitted by earlier steps, so this waits on those
  // maps only, not on the GPU's work of this block.
  async #GpuSteps(tokens, pos, options = {}) {
    if (this.resident?.WaitsFor(pos + tokens.length - 1)) {
      const failed = await this.resident.Drain();
      if (failed) throw new Error(`writing a page behind failed: ${failed.message}`);
    }
    return this.step.Steps(tokens, pos, (p) => this.#Cache(p), options);
  }

  // The step program's view of the master cache at position `pos`.
  #Cache(pos) {
    const M = this.M, c = this.config, kv = this.kv, rows = this.rows;
    return {
      prerope: this.prerope,
      resident: this.resident,
      Append: (layer, k, v) => {
        // A step redone after a lost device: the layers it got through hold this position's rows
        // already (read back whole before the loss; the same kernels give the same bits).
        if (M._kvq_web_kv_positions(kv, layer) > pos) return;
        M.HEAPF32.set(k, rows >> 2);
        M.HEAPF32.set(v, (rows >> 2) + c.kv_dim);
        if (M._kvq_web_kv_append(kv, layer, rows, rows + c.kv_dim * 4, 1) !== 0) {
          throw new Error(`KV append at layer ${layer}: ${LastError(M)}`);
        }
        this.after_append?.(layer, pos);
      },
      Attend: (layer, q, position, out) => {  // q, out: GPU buffers [n_heads][head_dim]
        M.kvqDevice = this.kv_device;  // the module's cache calls it (another runner may have set its own)
        this.kv_device.SetQueries(q, c.n_heads, c.n_heads * c.head_dim);
        if (M._kvq_web_kv_attend_device(kv, layer, position, 1) !== 0) {
          throw new Error(`attention on the GPU at layer ${layer}: ${LastError(M)}`);
        }
        this.kv_device.OutputTo(out);
      },
    };
  }

  // Whether the current device is lost (waiting a little for device.lost to settle).
  async #DeviceLost() {
    if (this.lost) return true;
    const device = this.device;
    const lost = await Promise.race([device.lost.then(() => true),
                                     new Promise((ok) => setTimeout(() => ok(false), kLostWaitMs))]);
    if (lost && this.device === device) this.lost ??= {message: 'the device was lost'};
    return lost;
  }

  // A new device with the weights uploaded again, or the CPU when none comes; the held positions
  // the master cannot give back run again there (#Rebuild, module_forward.js's CatchUp).
  async #Recover(pos) {
    const why = `the WebGPU device was lost (${this.lost.reason || 'unknown'}: ${this.lost.message || 'no message'})`;
    for (const k of Object.keys(this.retired)) this.retired[k] += this.step.counts[k];
    try {
      this.step.Destroy();
    } catch {
      // Its buffers went with the device.
    }
    this.step = null;
    let device = null, failed = '';
    try {
      device = await this.acquire();
      if (!device) failed = 'no WebGPU device came back';
    } catch (e) {
      failed = `asking for a new WebGPU device failed: ${e.message}`;
    }
    if (device) {
      try {
        await this.#Attach(device);
        const replayed = this.resident || !this.CanKeepPrefix() ? await this.#Rebuild(pos) : {from: pos, positions: 0, ms: 0};
        this.events.push({position: pos, to: 'gpu', why, replayed});
        return;
      } catch (e) {
        failed = `the new WebGPU device failed: ${e.message}`;
        device.destroy();
      }
    }
    this.on_cpu = true;
    this.device = null;
    this.M.kvqDevice = null;
    await this.resident?.behind;  // the pages that reached the master before the loss, then the CPU
    this.#DropResident();
    const event = {position: pos, to: 'cpu', why: `${why}; ${failed}`};
    this.events.push(event);
    this.cpu_model_handle ||= await this.cpu_model();
    event.replayed = this.cpu.CatchUp(this.cpu_model_handle, this.kv, this.ids, this.CanKeepPrefix() ? pos : 0, pos);
  }

  // The sequence on the new device: the master's pages (those written behind before the loss;
  // every layer cut back to the fewest) uploaded to a new resident cache, then the ids after them
  // run again in Prefill's blocks; a hybrid's from position 0 (the master cut back to none, the
  // new program's states zeroed). Returns {from, positions, ms}: what ran again.
  async #Rebuild(pos) {
    const M = this.M, kv = this.kv, c = this.config, t0 = performance.now();
    await this.resident?.behind;
    const rows = this.resident?.rows;  // sinkN / resN: f32 rows the master's pages lack, so from 0
    this.#DropResident();
    const kept = this.#RewindTo(this.CanKeepPrefix() && !rows ? pos : 0);
    this.step.ResetStates();
    if (this.path !== 'stream') this.resident = this.#NewResident();
    for (let layer = 0; this.resident && layer < c.n_cache_layers; ++layer) {
      for (let page = 0; page < kept / this.resident.P; ++page) {
        if (M._kvq_web_kv_read_page(kv, layer, page, this.page_ptr) !== 0) {
          throw new Error(`reading page ${page} of layer ${layer} from the master: ${LastError(M)}`);
        }
        this.resident.Restore(layer, M.HEAPU8.slice(this.page_ptr, this.page_ptr + this.resident.page_bytes), kept);
      }
    }
    for (let p = kept, n; p < pos; p += n) {
      n = this.#BlockLength(p, pos - p, kGpuPrefillBlock, kBlockUniformSlots);
      await this.#GpuSteps(this.ids.slice(p, p + n), p);
    }
    return {from: kept, positions: pos - kept, ms: performance.now() - t0};
  }

  // Every layer cut back to at most `pos` positions and to the fewest any layer holds
  // (module_forward.js's RewindKv); the positions kept.
  #RewindTo(pos) { return RewindKv(this.M, this.kv, this.config.n_cache_layers, pos); }

  /**
   * Submits, readbacks and GPU steps so far ({steps, submits, readbacks, device_submits}), every
   * device's, write_backs: pages a resident cache wrote behind into the master, and streamed_bytes:
   * page bytes a mixed-mode cache streamed from the master to the GPU.
   */
  get counts() {
    const out = {...this.retired};
    if (this.step) for (const k of Object.keys(out)) out[k] += this.step.counts[k];
    out.write_backs = this.retired_write_backs + (this.resident ? this.resident.counts.write_backs : 0);
    out.streamed_bytes = this.retired_streamed_bytes + (this.resident ? this.resident.counts.streamed_bytes : 0);
    out.attend_dispatches = this.retired_attend_dispatches + (this.resident ? this.resident.counts.attend_dispatches : 0);
    return out;
  }
  get weight_bytes() { return this.step ? this.step.weight_bytes : 0; }
  /** Tokens run on the module's C++ forward (no device came back). */
  get cpu_steps() { return this.cpu.steps; }

  Destroy() {
    this.FreeSequence();
    this.M._free(this.rows);
    this.M._free(this.rope_ptr);
    if (this.page_ptr) this.M._free(this.page_ptr);
    if (this.read_ptr) this.M._free(this.read_ptr);
    this.cpu.Free();
    this.sampler?.Free();
    this.step?.Destroy();
  }
}
