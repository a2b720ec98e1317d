// The WebGPU path's engine for one generation, which web/worker.js's Generate drives as it drives
// the WebAssembly path's (keep_prefix, prefill, sample, decode, completion, stats). A classic
// script: worker.js imports it with importScripts, so its names are the worker's globals.
//
// web/gpu/gpu_engine.js's GpuModelRunner runs the module's step program of the model, its token
// picked on the GPU (the argmax, or kvq's chain on the module's generator's draws), the prompt in blocks (one submit and one readback a block on the resident and mixed paths; token by
// token on the stream path), its KV master in the module's KvCache: resident on the GPU for specs
// with WGSL encoders (one submit and readback a token), mixed when such a context is over the
// device budget (the newest pages resident, older ones streamed from the master: still one
// readback a token), else streamed to the GPU's slots for attention (stats().gpu.kv_path says
// which, and why).
//
// A chat's turn keeps the runner's sequence, as the WebAssembly path keeps its session: the
// positions it shares with the new prompt stay in the cache and only the prompt's other tokens
// are prefilled (GpuModelRunner.KeepPrefix: Session::KeepCommonPrefix's rule, the master and the
// GPU-resident pages truncated alike). A new sequence instead, its reason in
// stats().gpu.sequence_why: a generation that is not a chat turn, other KV specs or another device
// budget than the held sequence's (the WebAssembly path's rule), none held (the WebAssembly path
// ran the last turn), a step of the last generation that failed, a device lost since, or a hybrid
// model's turn that does not extend the held sequence (its recurrent state cannot be cut back).
'use strict';

// What the sequence each runner holds was made with (JSON of [kv_k, kv_v, device budget]); none
// after a failed step, so that the next turn starts anew.
const gpu_sequence_specs = new WeakMap();

// The engine of one generation with params p on `runner` (a GpuModelRunner); keep: a chat turn,
// which keeps what the held sequence shares with its prompt. env: {context (the model's positions),
// heap_bytes () → the module's memory, completion (options, prompt_ids) → the module's Generator
// for the runner's sequence}.
function GpuTurn(runner, p, keep, env) {
  const budget = p.device_budget_bytes || 0;
  const spec = JSON.stringify([p.kv_k, p.kv_v, budget]);
  const held = gpu_sequence_specs.get(runner);
  let sequence_why = !keep ? 'not a chat turn' : !runner.kv ? 'no sequence is held' :
      held === undefined ? 'the last generation failed' :
      held !== spec ? 'the KV specs or the device budget differ from the held sequence\'s' : '';
  if (sequence_why) {
    gpu_sequence_specs.delete(runner);
    runner.NewSequence(p.kv_k, p.kv_v, budget);
    gpu_sequence_specs.set(runner, spec);
  }
  runner.SetSampler(p);  // this generation's settings and seed
  const plan = runner.plan, c = runner.config;
  let prompt_left = 0;  // the prompt's ids not yet prefilled: its last piece samples the first token
  const events0 = runner.events.length;  // the device's losses before this generation
  let counts0 = {...runner.counts};
  let decode0 = counts0;  // the counts when the prompt was in: per-step figures are the decode's
  let last = null;
  // A failed step leaves the sequence in doubt: the next turn starts anew.
  const guarded = (fn) => async (...args) => {
    try {
      return await fn(...args);
    } catch (e) {
      gpu_sequence_specs.delete(runner);
      throw e;
    }
  };
  return {
    // The positions kept of prompt_ids' prefix (never all of it).
    keep_prefix: guarded(async (prompt_ids) => {
      const kept = sequence_why ? 0 : await runner.KeepPrefix(prompt_ids);
      prompt_left = prompt_ids.length - kept;
      sequence_why ||= runner.keep_why;
      counts0 = decode0 = {...runner.counts};  // a restarted sequence retires its resident cache's counts
      return kept;
    }),
    prefill: guarded(async (prompt_ids) => {
      prompt_left -= prompt_ids.length;
      last = await runner.Prefill(prompt_ids, {sample: !prompt_left, ...(p.gpu_prefill_block ? {block: p.gpu_prefill_block} : {})});
      decode0 = {...runner.counts};
    }),
    sample: () => last.token,
    decode: guarded(async (token) => {
      last = await runner.Step(token, {sample: true});
    }),
    // The rules of the completion that follows the runner's sequence (the prompt, run).
    completion: (options, prompt_ids) => env.completion(options, prompt_ids),
    // What the CPU path's session reports; bytes per token are the cache's planned bytes at full
    // context over the context (its f32 sink and residual rows spread over every position). gpu:
    // this generation's decode steps and, per step, the submits and readbacks of the step program
    // and the submits of the KV device; the prompt's tokens (those prefilled: not the kept ones),
    // submits and readbacks (its blocks); sequence: 'kept' (a chat turn went on with the held
    // sequence) or 'new', and sequence_why, why new; device_events: the devices lost during this
    // generation (GpuModelRunner.events: where the sequence went on, and the held positions run
    // again there, {from, positions, ms}).
    stats: () => {
      const counts = runner.counts, steps = counts.steps - decode0.steps;
      const per = (k) => steps ? (counts[k] - decode0[k]) / steps : 0;
      const positions = runner.positions;
      return {session: {positions, context: env.context, kv_key_format: p.kv_k, kv_value_format: p.kv_v,
                        kv_bytes_per_token: Math.round(plan.total_bytes / env.context),
                        kv_f16_bytes_per_token: 2 * c.n_cache_layers * c.kv_dim * 2,  // attention layers only (a hybrid)
                        kv_bytes: Math.round(positions * plan.total_bytes / env.context),
                        device_budget_bytes: budget,
                        device_slots: plan.device_slots, device_bytes: plan.device_bytes},
              gpu: {steps, submits_per_step: per('submits'), readbacks_per_step: per('readbacks'),
                    kv_device_submits_per_step: per('device_submits'), weight_bytes: runner.weight_bytes,
                    prefill: {tokens: decode0.steps - counts0.steps, submits: decode0.submits - counts0.submits,
                              readbacks: decode0.readbacks - counts0.readbacks},
                    sequence: sequence_why ? 'new' : 'kept', sequence_why, device_events: runner.events.slice(events0),
                    kv_path: runner.path, kv_path_why: runner.path_why,
                    resident_pages: runner.resident_pages, stream_slots: runner.stream_slots,  // mixed: per layer; slots
                    matvec_kernel: runner.step?.matvec_kernel,  // step_kernels.js's MatvecKernelFor
                    pages_written_behind: counts.write_backs - counts0.write_backs,
                    kv_streamed_bytes_per_step: per('streamed_bytes'),
                    // resident and mixed paths: attention windows a step dispatches (pooled pages: one a layer)
                    attend_dispatches_per_step: per('attend_dispatches'),
                    // KV bytes in GPU buffers now: the resident and mixed paths' pages and slots,
                    // else the KV device's slots.
                    kv_gpu_bytes: runner.resident ? runner.resident.counts.kv_bytes_now : runner.kv_device?.kv_bytes_now ?? 0},
              heap_bytes: env.heap_bytes()};
    },
  };
}
