// The GPU sampler's side in the module (src/web/web_sampler.cc): kvq::Sampler with the page's
// settings keeps the generator and hands, per token, the words web/gpu/sample_kernels.js's
// GpuSampler picks with, and the edits its adjust pass applies for logit_bias and the penalties
// (the window: the tokens the caller passes, which the host already holds: no readback).

/** The module's table of 2^-x (kvq_web_sample_exp2_table): Uint32Array [2048], a copy. */
export function SampleExp2Table(M) {
  const at = M._kvq_web_sample_exp2_table();
  return new Uint32Array(M.HEAPU8.buffer.slice(at, at + 2048 * 4));
}

// The largest seed kvq::SamplerOptions holds (`kvq run` reads this one, its `--seed -1`, as "random").
const kMaxSeed = (1n << 64n) - 1n;

/**
 * The page's seed (a whole Number ≤ 2^53 - 1, a BigInt, or a string of decimal digits for any
 * 64-bit seed) as kvq::SamplerOptions::seed's two 32-bit words [low, high]. The module takes two
 * words, not a double: a double holds whole numbers only to 2^53, and `kvq run --seed` takes any
 * 64-bit seed; a Number past 2^53 has lost its low bits already, so one is refused (pass a string).
 * Throws, naming the field and the value, for anything else (a seed is never wrapped).
 */
export function SeedWords(seed) {
  const refuse = () => new Error(`seed ${typeof seed === 'string' ? JSON.stringify(seed) : String(seed)}: must be a ` +
                                 `whole number in [0, 2^64 - 1] (past 2^53 - 1, as a string of digits)`);
  let value;
  if (typeof seed === 'number') {
    if (!Number.isSafeInteger(seed) || seed < 0) throw refuse();
    value = BigInt(seed);
  } else if (typeof seed === 'bigint') {
    value = seed;
  } else if (typeof seed === 'string' && /^[0-9]+$/.test(seed)) {
    value = BigInt(seed);
  } else {
    throw refuse();
  }
  if (value < 0n || value > kMaxSeed) throw refuse();
  return [Number(value & 0xffffffffn), Number(value >> 32n)];
}

/**
 * fn(settings, seed_low, seed_high, bias, n_bias) with the page's sampler settings p in the
 * module's memory, as kvq_web_sampler_new and kvq_web_set_sampler take them
 * (kvq_web::WebSamplerOptions): {temperature, top_k, top_p, min_p, seed (SeedWords),
 * repeat_penalty (1), frequency_penalty (0), presence_penalty (0), repeat_last_n (64:
 * kvq::SamplerOptions' defaults), logit_bias ([[token id, bias], ...])}.
 */
export function WithSamplerSettings(M, p, fn) {
  const bias = p.logit_bias ?? [];
  if (!Array.isArray(bias) || bias.some((b) => !Array.isArray(b) || b.length !== 2 || !Number.isInteger(b[0]))) {
    throw new Error('logit_bias: a list of [token id, bias] pairs');
  }
  const [seed_low, seed_high] = SeedWords(p.seed);
  const settings = M._malloc(8 * 4), pairs = M._malloc(Math.max(bias.length, 1) * 8);
  try {
    M.HEAPF32.set([p.temperature, p.top_k, p.top_p, p.min_p, p.repeat_penalty ?? 1, p.frequency_penalty ?? 0,
                   p.presence_penalty ?? 0, p.repeat_last_n ?? 64], settings >> 2);
    const words = new Int32Array(2 * bias.length);  // [n][id, f32 bits]
    const values = new Float32Array(words.buffer);
    bias.forEach(([id, value], i) => {
      words[2 * i] = id;
      values[2 * i + 1] = value;
    });
    M.HEAP32.set(words, pairs >> 2);
    return fn(settings, seed_low, seed_high, pairs, bias.length);
  } finally {
    M._free(settings);
    M._free(pairs);
  }
}

/**
 * The chain's generator in the module (kvq::Sampler with the page's settings: WithSamplerSettings):
 * Next() gives the next token's words (Uint32Array [6]), advancing it as a CPU Sample would, or
 * null at temperature 0 with nothing to adjust (greedy: the step program's argmax); Adjustment(recent)
 * what the GPU sampler's adjust pass applies after the tokens `recent` (the sequence's, the one
 * drawn after excluded), or null when the settings adjust nothing. Free() it.
 */
export class ModuleSampler {
  constructor(M, p) {
    this.M = M;
    this.handle = WithSamplerSettings(M, p, (...args) => M._kvq_web_sampler_new(...args));
    if (!this.handle) throw new Error(`sampler settings: ${M.UTF8ToString(M._kvq_web_last_error())}`);
    this.repeat_penalty = Math.fround(p.repeat_penalty ?? 1);
    this.out = M._malloc(6 * 4);
  }

  Next() {
    const M = this.M;
    if (!M._kvq_web_sampler_next_words(this.handle, this.out)) return null;
    return new Uint32Array(M.HEAPU8.buffer.slice(this.out, this.out + 6 * 4));
  }

  /**
   * What the adjust pass applies to a vocabulary of `vocab` after the tokens `recent`
   * (kvq_web_sampler_edits): {edits: Uint32Array [m][4], biases: Float32Array [nb],
   * repeat_penalty}, or null when the settings adjust nothing.
   */
  Adjustment(recent, vocab) {
    const M = this.M;
    return this.#WithIds(recent, (ids) => {
      const out = M._malloc(M._kvq_web_sampler_edits_capacity(this.handle, recent.length) * 4);
      try {
        const m = M._kvq_web_sampler_edits(this.handle, ids, recent.length, vocab, out);
        if (!m) return null;
        const nb = M.HEAP32[(out >> 2) + 1], at = out + 8;
        return {edits: new Uint32Array(M.HEAPU8.buffer.slice(at, at + 16 * m)), repeat_penalty: this.repeat_penalty,
                biases: new Float32Array(M.HEAPU8.buffer.slice(at + 16 * m, at + 16 * m + 4 * nb))};
      } finally {
        M._free(out);
      }
    });
  }

  /** kvq::Sampler::Adjust on the module's logits [vocab] at logits_ptr, in place, after `recent`. */
  AdjustInPlace(logits_ptr, vocab, recent) {
    this.#WithIds(recent, (ids) => this.M._kvq_web_sampler_adjust(this.handle, logits_ptr, vocab, ids, recent.length));
  }

  /** kvq::Sampler::Sample (the CPU path's pick) on the module's logits [vocab] after `recent`. */
  Sample(logits_ptr, vocab, recent = []) {
    return this.#WithIds(recent, (ids) => this.M._kvq_web_sampler_sample(this.handle, logits_ptr, vocab, ids, recent.length));
  }

  #WithIds(ids, fn) {
    const M = this.M, at = M._malloc(Math.max(ids.length, 1) * 4);  // [ids] i32
    try {
      M.HEAP32.set(ids, at >> 2);
      return fn(at);
    } finally {
      M._free(at);
    }
  }

  Free() {
    this.M._kvq_web_sampler_free(this.handle);
    this.M._free(this.out);
  }
}
