// The page's benchmark, run in the worker (web/worker.js's `bench` request; the page's Benchmark
// button and window.kvqPage.bench): the webgpu-bench method. For each context depth D and each
// path (the WebGPU path and the WebAssembly path, in the same page, on the same model): D ids are
// run first (not timed: the context the prompt follows), then a prompt of prompt_tokens ids in the
// page's prefill blocks (timed: prefill tok/s), then new_tokens greedy ids decoded one by one
// (timed: decode tok/s). The ids are fixed (BenchIds), so both paths run the same positions and
// their greedy ids can be compared. Before the timed runs each path runs a short warm-up sequence
// (kWarmupIds ids and kWarmupIds decodes, not reported), so a first use's costs (a pipeline's
// first dispatch, the module's first allocations) are not in the first depth's figures. The
// result is one JSON object (RunBench's return).

/**
 * The defaults for a real GPU: a 512-token prompt, 128 new tokens, depths 0, 4K and 16K, no device
 * budget (device_budget_bytes 0: the GPU path's own; a smaller one takes the mixed KV path when the
 * context's KV is over it).
 */
export const kBenchDefaults = {prompt_tokens: 512, new_tokens: 128, depths: [0, 4096, 16384], kv_k: 'f16',
                               kv_v: 'f16', paths: ['gpu', 'cpu'], gpu_prefill_block: 64, device_budget_bytes: 0};

/** n ids of a vocabulary of `vocab`, the same for every path: a fixed walk from `start`. */
export function BenchIds(n, vocab, start) {
  const ids = new Array(n);
  for (let i = 0; i < n; ++i) ids[i] = 1 + ((start + i) * 7919 + 13) % (vocab - 1);  // 7919: a prime stride
  return ids;
}

const kWarmupIds = 8;

const Rate = (n, ms) => (ms > 0 ? +(n / (ms / 1000)).toFixed(2) : null);

/**
 * p: kBenchDefaults' fields (any may be omitted). env: {vocab, context (the model's positions),
 * block (the page's prefill block), why_not(path): '' or why that path cannot run this benchmark,
 * Engine(path, q): the worker's engine for path 'gpu' or 'cpu' with generation params q
 * ({prefill(ids), sample(), decode(token, pos), stats()}), Free(): frees the CPU session,
 * progress(what): a line for the page, describe: {model, adapter, cpu} for the JSON}.
 * Returns {method, ...describe, prompt_tokens, new_tokens, kv_k, kv_v, depths, runs, same_ids}:
 * runs [{path, depth, prefill_tok_s, decode_tok_s, depth_ms, prefill_ms, decode_ms, ids, gpu}] or
 * [{path, depth, skipped}]; same_ids [{depth, same}] where both paths ran.
 */
export async function RunBench(p, env) {
  const o = {...kBenchDefaults, ...p};
  const Whole = (v, what, min) => {
    if (!(Number.isInteger(v) && v >= min)) throw new Error(`benchmark ${what} ${v}: a whole number ≥ ${min}`);
    return v;
  };
  Whole(o.prompt_tokens, 'prompt_tokens', 1);
  Whole(o.new_tokens, 'new_tokens', 1);
  Whole(o.gpu_prefill_block, 'gpu_prefill_block', 1);
  Whole(o.device_budget_bytes, 'device_budget_bytes', 0);
  if (!Array.isArray(o.depths) || !o.depths.length) throw new Error('benchmark depths: a list of whole numbers');
  for (const d of o.depths) Whole(d, 'depth', 0);
  for (const path of o.paths) if (!['gpu', 'cpu'].includes(path)) throw new Error(`benchmark path "${path}": gpu or cpu`);
  const q = {kv_k: o.kv_k, kv_v: o.kv_v, temperature: 0, top_k: 0, top_p: 1, min_p: 0, seed: 0, device_budget_bytes: o.device_budget_bytes,
             gpu_prefill_block: o.gpu_prefill_block};
  const runs = [];
  for (const path of o.paths) {  // the warm-up
    if (env.why_not(path) || kWarmupIds * 2 > env.context) continue;
    env.progress(`${path}, warming up`);
    const engine = await env.Engine(path, q);
    try {
      await engine.prefill(BenchIds(kWarmupIds, env.vocab, 0));
      for (let i = 0; i < kWarmupIds; ++i) await engine.decode(engine.sample(), kWarmupIds + i);
    } finally {
      env.Free();
    }
  }
  for (const depth of o.depths) {
    const positions = depth + o.prompt_tokens + o.new_tokens;
    for (const path of o.paths) {
      const why = positions > env.context ? `depth ${depth} + ${o.prompt_tokens} + ${o.new_tokens} positions are ` +
                                            `over the model's context of ${env.context}` : env.why_not(path);
      if (why) {
        runs.push({path, depth, skipped: why});
        continue;
      }
      env.progress(`${path}, depth ${depth}`);
      const engine = await env.Engine(path, q);
      try {
        const Prefill = async (ids) => {
          for (let i = 0; i < ids.length; i += env.block) await engine.prefill(ids.slice(i, i + env.block));
        };
        let t = performance.now();
        if (depth) await Prefill(BenchIds(depth, env.vocab, 0));
        const depth_ms = performance.now() - t;
        t = performance.now();
        await Prefill(BenchIds(o.prompt_tokens, env.vocab, depth));
        const prefill_ms = performance.now() - t;
        const ids = [];
        t = performance.now();
        for (let i = 0; i < o.new_tokens; ++i) {
          const token = engine.sample();
          ids.push(token);
          await engine.decode(token, depth + o.prompt_tokens + i);
        }
        const decode_ms = performance.now() - t;
        const g = path === 'gpu' ? engine.stats().gpu : null;
        runs.push({path, depth, prefill_tok_s: Rate(o.prompt_tokens, prefill_ms), decode_tok_s: Rate(o.new_tokens, decode_ms),
                   depth_ms: +depth_ms.toFixed(1), prefill_ms: +prefill_ms.toFixed(1), decode_ms: +decode_ms.toFixed(1), ids,
                   gpu: g && {kv_path: g.kv_path, matvec_kernel: g.matvec_kernel, prefill: g.prefill, submits_per_step: g.submits_per_step,
                              readbacks_per_step: g.readbacks_per_step, attend_dispatches_per_step: g.attend_dispatches_per_step,
                              ...(g.kv_path === 'mixed' && {resident_pages: g.resident_pages, stream_slots: g.stream_slots})}});
      } finally {
        env.Free();
      }
    }
  }
  const same_ids = [];
  for (const depth of o.depths) {
    const [a, b] = ['gpu', 'cpu'].map((path) => runs.find((r) => r.path === path && r.depth === depth && r.ids));
    if (a && b) same_ids.push({depth, same: a.ids.length === b.ids.length && a.ids.every((v, i) => v === b.ids[i])});
  }
  return {method: 'greedy; per depth D: D ids run first (not timed), then a prompt of prompt_tokens ids (prefill ' +
                  'tok/s), then new_tokens ids decoded (decode tok/s); the GPU and WebAssembly paths in the same page',
          ...env.describe, prompt_tokens: o.prompt_tokens, new_tokens: o.new_tokens, kv_k: o.kv_k, kv_v: o.kv_v,
          device_budget_bytes: o.device_budget_bytes,
          gpu_prefill_block: o.gpu_prefill_block, depths: o.depths, runs, same_ids};
}
