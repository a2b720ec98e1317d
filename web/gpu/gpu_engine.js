// The WebGPU path of a model loaded in the WebAssembly module (kvq.js): its step program
// (kvq_web_gpu_program, src/web/gpu_program.h) run by step_program.js, the KV master in the
// module's KvCache made for the model (kvq_web_kv_new_for_model), attention through kv_device.js.
// The page's worker (web/worker.js) and the tests (tests/web/gpu/gpu_forward_page.js) both run
// models through this file. M: the Emscripten module; model: a kvq_web_model_load handle.

import {GpuKvDevice} from './kv_device.js';
import {GpuStepProgram, StepProgramWhyNot} from './step_program.js';

function LastError(M) {
  return M.UTF8ToString(M._kvq_web_last_error()) || 'kvq reported a failure without a message';
}

/**
 * The model's step program, or why the GPU path cannot run it: {program} or {why_not} (the
 * module refuses hybrid layers; the kernels here refuse weight types they do not read).
 */
export function GpuProgramOf(M, model) {
  const json = M._kvq_web_gpu_program(model);
  if (!json) return {why_not: LastError(M)};
  const program = JSON.parse(M.UTF8ToString(json));
  const why_not = StepProgramWhyNot(program);
  return why_not ? {why_not} : {program};
}

export class GpuModelRunner {
  /** The runner of `model` (program from GpuProgramOf) on `device`; compiles every pipeline. */
  static async Create(M, device, model, program) {
    const kv_device = new GpuKvDevice(device);
    M.kvqDevice = kv_device;
    const rope_ptr = M._malloc(program.config.rotary_dims * 4);  // [rotary_dims / 2][cos, sin]
    const rope = (pos) => {
      if (M._kvq_web_gpu_rope(model, pos, rope_ptr) !== 0) throw new Error(`RoPE at position ${pos}: ${LastError(M)}`);
      return M.HEAPF32.slice(rope_ptr >> 2, (rope_ptr >> 2) + program.config.rotary_dims);
    };
    const step = await GpuStepProgram.Create(device, program, M.HEAPU8, rope, kv_device);
    return new GpuModelRunner(M, model, program, kv_device, step, rope_ptr);
  }

  constructor(M, model, program, kv_device, step, rope_ptr) {
    this.M = M;
    this.model = model;
    this.config = program.config;
    this.kv_device = kv_device;
    this.step = step;
    this.rope_ptr = rope_ptr;
    this.kv = 0;        // the module's KvCache handle of the current sequence
    this.rows = M._malloc(2 * this.config.kv_dim * 4);  // one position's K and V: [2][kv_dim]
    this.positions = 0;
  }

  /**
   * Starts a sequence: a new cache with key and value specs as kvq's --kv-k / --kv-v and a device
   * budget in bytes (0: none). Returns the cache's plan {total_bytes, slot_bytes, device_slots, ...}.
   */
  NewSequence(kv_k, kv_v, device_budget_bytes = 0) {
    const M = this.M;
    this.FreeSequence();
    const str = (s) => {
      const n = M.lengthBytesUTF8(s) + 1, p = M._malloc(n);
      M.stringToUTF8(s, p, n);
      return p;
    };
    const k = str(kv_k), v = str(kv_v);
    try {
      this.kv = M._kvq_web_kv_new_for_model(this.model, k, v, device_budget_bytes);
    } finally {
      M._free(k);
      M._free(v);
    }
    if (!this.kv) throw new Error(`the GPU path's KV cache (K "${kv_k}", V "${kv_v}"): ${LastError(M)}`);
    this.prerope = /prerope/.test(kv_k);  // the cache stores keys before RoPE: it gets k_pre
    this.positions = 0;
    this.M.kvqDevice = this.kv_device;
    this.plan = JSON.parse(M.UTF8ToString(M._kvq_web_kv_plan(this.kv)));
    return this.plan;
  }

  FreeSequence() {
    if (this.kv) this.M._kvq_web_kv_free(this.kv);
    this.kv = 0;
  }

  /** Runs `token` at the next position: {token: the greedy next id, logits (options.logits)}. */
  async Step(token, options = {}) {
    if (!this.kv) throw new Error('GpuModelRunner: no sequence (NewSequence first)');
    const M = this.M, c = this.config, kv = this.kv, rows = this.rows;
    const cache = {
      prerope: this.prerope,
      Append: (layer, k, v) => {
        M.HEAPF32.set(k, rows >> 2);
        M.HEAPF32.set(v, (rows >> 2) + c.kv_dim);
        if (M._kvq_web_kv_append(kv, layer, rows, rows + c.kv_dim * 4, 1) !== 0) {
          throw new Error(`KV append at layer ${layer}: ${LastError(M)}`);
        }
      },
      Attend: (layer, q, position, out) => {  // q, out: GPU buffers [n_heads][head_dim]
        this.kv_device.SetQueries(q, c.n_heads, c.n_heads * c.head_dim);
        if (M._kvq_web_kv_attend_device(kv, layer, position, 1) !== 0) {
          throw new Error(`attention on the GPU at layer ${layer}: ${LastError(M)}`);
        }
        this.kv_device.OutputTo(out);
      },
    };
    const out = await this.step.Step(token, this.positions, cache, options);
    ++this.positions;
    return out;
  }

  /** Submits, readbacks and steps so far ({steps, submits, readbacks, device_submits}). */
  get counts() { return this.step.counts; }
  get weight_bytes() { return this.step.weight_bytes; }

  Destroy() {
    this.FreeSequence();
    this.M._free(this.rows);
    this.M._free(this.rope_ptr);
    this.step.Destroy();
  }
}
