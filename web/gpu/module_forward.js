// The GPU path's CPU half: the module's C++ forward (kvq_web_kv_cpu_step) over the same master
// cache the GPU steps fill, which runs the rest of a sequence when no WebGPU device comes back
// after a loss (gpu_engine.js's GpuModelRunner), and the cut-back of that cache to positions every
// layer holds (a step the lost device left half done, or a chat turn keeping a prefix).
//
// A hybrid's recurrent state (Gated DeltaNet layers) was the GPU's and went with the device: the
// master cache's own state (KvCacheConfig::state_floats, what the C++ forward reads and updates)
// was never written by the GPU steps. So the runner cuts such a cache back to no positions (which
// zeroes its state) and CatchUp runs every held id on the CPU: the sequence is then the CPU's
// from position 0 — its K and V rows, its state, and the ids after the loss those a CPU-only run of
// the same ids gives, bit for bit (a dense model keeps the master's rows instead: see gpu_engine.js).

/** The module's last error message (kvq_web_last_error), never empty. */
export function LastError(M) {
  return M.UTF8ToString(M._kvq_web_last_error()) || 'kvq reported a failure without a message';
}

/**
 * Every layer of the module's cache `kv` (n_layers of them) cut back to at most `pos` positions
 * and to the fewest any layer holds, where the formats can drop rows (kvq_web_kv_rewind: down to
 * KvCache's TruncationPoint). Returns the positions kept; the ids after them run again. A half-done
 * step leaves layers one apart; a lost resident cache, a page or more.
 */
export function RewindKv(M, kv, n_layers, pos) {
  let fewest = pos, uneven = false;
  for (let l = 0; l < n_layers; ++l) {
    const n = M._kvq_web_kv_positions(kv, l);
    uneven ||= n !== pos;
    fewest = Math.min(fewest, n);
  }
  if (!uneven) return pos;
  const kept = M._kvq_web_kv_rewind(kv, fewest);
  if (kept < 0) throw new Error(`dropping the positions after ${fewest}: ${LastError(M)}`);
  return kept;
}

/**
 * The module's C++ forward of a model with `config` (the step program's: n_cache_layers,
 * vocab_size) one token at a time; `steps` counts the tokens it ran. Free() it.
 */
export class ModuleForward {
  constructor(M, config) {
    this.M = M;
    this.config = config;
    this.logits_ptr = 0;  // [vocab] logits then [6] u32 sampler words, made on first use
    this.steps = 0;
  }

  /**
   * `token` at `pos` on `model` (a module model handle) over the cache `kv`, whose sequence holds
   * `ids` ([pos] at least: the ids before pos, which run again from where RewindKv cuts a cache
   * that a lost device left with layers at different positions). options: logits (return them, as
   * the model gave them: what the GPU path reads back), sample (a ModuleSampler's words, with
   * adjust and recent: the GPU sampler's edits and window, applied by `sampler`, the C++ chain the
   * GPU's mirrors). Returns {token: the argmax or the sampled id, logits (options.logits)}.
   */
  Step(model, kv, ids, token, pos, options, sampler) {
    const M = this.M, vocab = this.config.vocab_size;
    const Fail = (what) => new Error(`${what} on the CPU: ${LastError(M)}`);
    this.CatchUp(model, kv, ids, pos, pos);
    const want_logits = options.logits || options.sample;
    if (want_logits && !this.logits_ptr) this.logits_ptr = M._malloc(vocab * 4 + 6 * 4);
    let id = M._kvq_web_kv_cpu_step(model, kv, token, want_logits ? this.logits_ptr : 0);
    if (id < 0) throw Fail(`position ${pos}`);
    const logits = options.logits ? M.HEAPF32.slice(this.logits_ptr >> 2, (this.logits_ptr >> 2) + vocab) : null;
    if (options.sample) {  // the GPU sampler's words (and edits), picked from by the C++ chain it mirrors
      if (options.adjust) sampler.AdjustInPlace(this.logits_ptr, vocab, options.recent);
      const words_ptr = this.logits_ptr + vocab * 4;
      M.HEAPU8.set(new Uint8Array(options.sample.buffer, options.sample.byteOffset, 6 * 4), words_ptr);
      id = M._kvq_web_sample_with_words(words_ptr, this.logits_ptr, vocab);
    }
    ++this.steps;
    return {token: id, logits};
  }

  /**
   * Brings the cache `kv` to `pos` positions of `ids` on `model`: the C++ forward appends to every
   * layer, so the cache first goes back to at most `from` positions where the formats can drop rows
   * and every layer is at the same position (RewindKv; from = 0 for a recurrent model: none, its
   * state zeroed), then the ids from there run again. Returns what ran again: {from (the first
   * position), positions, ms}.
   */
  CatchUp(model, kv, ids, from, pos) {
    const M = this.M, t0 = performance.now();
    const kept = RewindKv(M, kv, this.config.n_cache_layers, from);
    for (let p = kept; p < pos; ++p) {
      if (M._kvq_web_kv_cpu_step(model, kv, ids[p], 0) < 0) throw new Error(`running position ${p} again on the CPU: ${LastError(M)}`);
    }
    return {from: kept, positions: pos - kept, ms: performance.now() - t0};
  }

  Free() {
    if (this.logits_ptr) this.M._free(this.logits_ptr);
    this.logits_ptr = 0;
  }
}
