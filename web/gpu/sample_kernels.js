// The GPU sampler: kvq's chain at temperature > 0 (src/generate/sampler.cc's SampleWithWords) in
// WGSL, so a step's token is picked on the GPU and only its id is read back. The module keeps the
// generator and hands each token's words (kvq_web_sampler_next_words: top-k, the temperature's
// scale, top-p, min-p and one 64-bit draw); this file runs the chain on them, op for op:
//   1. load: every logit not -inf becomes (key, id), key ordering logits descending;
//   2. sort: a bitonic sort of (key, id) ascending (ties: the lower id; a total order, so any sort
//      gives sampler.cc's order), blocks of 512 in workgroup memory, longer strides globally;
//   3. weigh: each candidate's integer weight from the logit gap (read to 2^-20) and the table of
//      2^-x (kvq_web_sample_exp2_table), as sampler.cc's Weight;
//   4. pick: one workgroup sums the weights in 64-bit integers (exact in any order, so lanes sum
//      chunks in parallel), then one lane walks the chunks for top-p's cut, min-p's (a binary
//      search: the weights never grow along the order), the kept total and the draw.
// WGSL has no 64-bit integer: vec2u (low, high) with the carries written out, as sampler.cc's Mul128.
// Cost: the sort takes every logit, whatever top_k: 55 sort dispatches at a vocabulary of 151936
// (2^18 slots, 171 bitonic stages, 126 of them in workgroup memory), 28 at 32000 (120 stages, 99).
// Seconds a pick on SwiftShader (web.gpu_sampler prints its time); a top-k preselection would cut it.

const kLanes = 256;   // invocations per workgroup of every entry point
const kBlock = 512;   // elements a workgroup sorts in its memory (two per lane)
const kPad = 0xffffffff;  // the id of a slot holding no candidate (sorts last)

export const kSampleWgsl = /* wgsl */ `
// k, j: the bitonic stage of a sort pass (k 0: sort_local sorts its blocks whole); n: the vocabulary;
// n_pad: the slots (a power of two, at least ${kBlock}).
struct Pass { k: u32, j: u32, n: u32, n_pad: u32 }
// One token's words (kvq::SampleWords).
struct Words { top_k: u32, exp_scale: u32, top_p_q24: u32, min_weight: u32, draw_lo: u32, draw_hi: u32, r0: u32, r1: u32 }
@group(0) @binding(0) var<storage, read> logits: array<f32>;            // [n]
@group(0) @binding(1) var<storage, read_write> keys: array<vec2u>;      // [n_pad] (key, id)
@group(0) @binding(2) var<storage, read_write> weights: array<u32>;     // [n_pad] in sorted order
@group(0) @binding(3) var<uniform> pass_: Pass;
@group(0) @binding(4) var<uniform> words: Words;
@group(0) @binding(5) var<storage, read> table: array<u32>;             // [2][1024] 2^-x · 2^31
@group(0) @binding(6) var<storage, read_write> out_id: array<u32>;      // [1] the pick

fn before(a: vec2u, b: vec2u) -> bool { return a.x < b.x || (a.x == b.x && a.y < b.y); }

// 64-bit integers as (low, high).
fn mul32(a: u32, b: u32) -> vec2u {
  let a0 = a & 0xffffu; let a1 = a >> 16u; let b0 = b & 0xffffu; let b1 = b >> 16u;
  let p00 = a0 * b0; let p01 = a0 * b1; let p10 = a1 * b0; let p11 = a1 * b1;
  let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
  return vec2u((mid << 16u) | (p00 & 0xffffu), p11 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u));
}
fn add64(a: vec2u, b: vec2u) -> vec2u {
  let lo = a.x + b.x;
  return vec2u(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}
fn ge64(a: vec2u, b: vec2u) -> bool { return a.y > b.y || (a.y == b.y && a.x >= b.x); }
fn gt64(a: vec2u, b: vec2u) -> bool { return a.y > b.y || (a.y == b.y && a.x > b.x); }
// The high 64 bits of a · b.
fn mul64_hi(a: vec2u, b: vec2u) -> vec2u {
  let p00 = mul32(a.x, b.x); let p01 = mul32(a.x, b.y); let p10 = mul32(a.y, b.x); let p11 = mul32(a.y, b.y);
  let w1 = add64(vec2u(p00.y, 0u), vec2u(p01.x, 0u));
  let w1b = add64(w1, vec2u(p10.x, 0u));  // .y: the carry into word 2
  let w2 = add64(add64(vec2u(p01.y, 0u), vec2u(p10.y, 0u)), add64(vec2u(p11.x, 0u), vec2u(w1b.y, 0u)));
  return vec2u(w2.x, p11.y + w2.y);
}

// The sort key of a logit's bits: ascending keys are descending logits (-0 taken as +0).
fn key_of(bits_in: u32) -> u32 {
  let bits = select(bits_in, 0u, bits_in == 0x80000000u);
  return ~select(bits | 0x80000000u, ~bits, (bits & 0x80000000u) != 0u);
}

@compute @workgroup_size(${kLanes})
fn load(@builtin(global_invocation_id) g: vec3u) {
  let i = g.x;
  if (i >= pass_.n_pad) { return; }
  var e = vec2u(${kPad}u, ${kPad}u);
  if (i < pass_.n) {
    let bits = bitcast<u32>(logits[i]);
    if (bits != 0xff800000u) { e = vec2u(key_of(bits), i); }  // -inf: never drawn
  }
  keys[i] = e;
}

var<workgroup> block: array<vec2u, ${kBlock}>;

fn local_step(t: u32, base: u32, k: u32, j: u32) {
  let i = (t / j) * 2u * j + (t % j);
  let a = block[i];
  let b = block[i + j];
  if (((base + i) & k) == 0u) == before(b, a) {
    block[i] = b;
    block[i + j] = a;
  }
}

// pass_.k 0: each block of ${kBlock} sorted (stages k = 2 .. ${kBlock}); else stage pass_.k's strides
// ${kBlock / 2} .. 1 (the longer ones ran in sort_global).
@compute @workgroup_size(${kLanes})
fn sort_local(@builtin(local_invocation_id) l: vec3u, @builtin(workgroup_id) w: vec3u) {
  let base = w.x * ${kBlock}u;
  block[l.x] = keys[base + l.x];
  block[l.x + ${kLanes}u] = keys[base + l.x + ${kLanes}u];
  workgroupBarrier();
  if (pass_.k == 0u) {
    for (var k = 2u; k <= ${kBlock}u; k <<= 1u) {
      for (var j = k >> 1u; j > 0u; j >>= 1u) {
        local_step(l.x, base, k, j);
        workgroupBarrier();
      }
    }
  } else {
    for (var j = ${kBlock / 2}u; j > 0u; j >>= 1u) {
      local_step(l.x, base, pass_.k, j);
      workgroupBarrier();
    }
  }
  keys[base + l.x] = block[l.x];
  keys[base + l.x + ${kLanes}u] = block[l.x + ${kLanes}u];
}

@compute @workgroup_size(${kLanes})
fn sort_global(@builtin(global_invocation_id) g: vec3u) {
  let t = g.x;
  if (t >= pass_.n_pad / 2u) { return; }
  let j = pass_.j;
  let i = (t / j) * 2u * j + (t % j);
  let a = keys[i];
  let b = keys[i + j];
  if (((i & pass_.k) == 0u) == before(b, a)) {
    keys[i] = b;
    keys[i + j] = a;
  }
}

// sampler.cc's LogitQ20: the logit in units of 2^-20, clamped (a product by 2^20: exact).
fn q20(x: f32) -> u32 { return bitcast<u32>(i32(clamp(x, -2048.0, 2047.0) * 1048576.0)); }

@compute @workgroup_size(${kLanes})
fn weigh(@builtin(global_invocation_id) g: vec3u) {
  let i = g.x;
  if (i >= pass_.n_pad) { return; }
  let e = keys[i];
  if (e.y == ${kPad}u) {
    weights[i] = 0u;
    return;
  }
  let below = q20(logits[keys[0].y]) - q20(logits[e.y]);
  let p = mul32(below, words.exp_scale);
  let y_hi = p.y >> 24u;
  let y = (p.x >> 24u) | (p.y << 8u);  // log2 units · 2^20
  let whole = y >> 20u;
  if (y_hi != 0u || whole >= 32u) {
    weights[i] = 0u;
    return;
  }
  let frac = y & 0xfffffu;
  let m = mul32(table[frac >> 10u], table[1024u + (frac & 1023u)]);
  let s = 31u + whole;
  weights[i] = select(m.y >> (s - 32u), (m.x >> s) | (m.y << (32u - s)), s < 32u);
}

var<workgroup> chunk_sum: array<vec2u, ${kLanes}>;
var<workgroup> shared_count: u32;

// The first index i < limit whose running sum of weights passes goal (≥, or > when strict), and
// the running sum there: (i, sum.low, sum.high); (limit, total) when none. Chunks of 'chunk'
// elements below 'full' (the range their sums cover) are skipped whole when they do not pass.
fn find(limit: u32, chunk: u32, full: u32, goal: vec2u, strict: bool) -> vec3u {
  var cum = vec2u(0u, 0u);
  for (var c = 0u; c < ${kLanes}u; c++) {
    let lo = c * chunk;
    if (lo >= limit) { break; }
    let hi = min(lo + chunk, limit);
    let whole = add64(cum, chunk_sum[c]);
    if (hi == min(lo + chunk, full) && !select(ge64(whole, goal), gt64(whole, goal), strict)) {
      cum = whole;
      continue;
    }
    for (var i = lo; i < hi; i++) {
      cum = add64(cum, vec2u(weights[i], 0u));
      if (select(ge64(cum, goal), gt64(cum, goal), strict)) { return vec3u(i, cum); }
    }
  }
  return vec3u(limit, cum);
}

@compute @workgroup_size(${kLanes})
fn pick(@builtin(local_invocation_id) l: vec3u) {
  if (l.x == 0u) {  // the candidates: the slots before the first empty one
    var lo = 0u;
    var hi = pass_.n_pad;
    while (lo < hi) {
      let mid = (lo + hi) / 2u;
      if (keys[mid].y == ${kPad}u) { hi = mid; } else { lo = mid + 1u; }
    }
    shared_count = lo;
  }
  let count = workgroupUniformLoad(&shared_count);
  let keep_k = select(count, min(count, words.top_k), words.top_k > 0u);
  let chunk = (keep_k + ${kLanes - 1}u) / ${kLanes}u;
  var s = vec2u(0u, 0u);
  for (var i = l.x * chunk; i < min((l.x + 1u) * chunk, keep_k); i++) { s = add64(s, vec2u(weights[i], 0u)); }
  chunk_sum[l.x] = s;
  workgroupBarrier();
  if (l.x != 0u) { return; }
  if (count == 0u) {
    out_id[0] = 0u;
    return;
  }
  var total = vec2u(0u, 0u);
  for (var c = 0u; c < ${kLanes}u; c++) { total = add64(total, chunk_sum[c]); }
  // Top-p: the threshold ceil(total · top_p_q24 / 2^24), from the 96-bit product.
  let p0 = mul32(total.x, words.top_p_q24);
  let p1 = mul32(total.y, words.top_p_q24);
  let w1 = add64(vec2u(p0.y, 0u), vec2u(p1.x, 0u));
  let w2 = p1.y + w1.y;
  var threshold = vec2u((p0.x >> 24u) | (w1.x << 8u), (w1.x >> 24u) | (w2 << 8u));
  if ((p0.x & 0xffffffu) != 0u) { threshold = add64(threshold, vec2u(1u, 0u)); }
  let reach = find(keep_k, chunk, keep_k, threshold, false).x;
  let cut = select(keep_k, reach + 1u, reach < keep_k);
  // Min-p: the first index in [1, cut) whose weight is under min_weight.
  var lo = 1u;
  var hi = cut;
  while (lo < hi) {
    let mid = (lo + hi) / 2u;
    if (weights[mid] >= words.min_weight) { lo = mid + 1u; } else { hi = mid; }
  }
  let keep = lo;
  let kept_sum = find(keep, chunk, keep_k, vec2u(0xffffffffu, 0xffffffffu), true);
  let r = mul64_hi(vec2u(words.draw_lo, words.draw_hi), kept_sum.yz);
  let at = find(keep, chunk, keep_k, r, true).x;
  out_id[0] = keys[min(at, keep - 1u)].y;
}
`;

/** Bindings each entry point uses (layout 'auto' keeps only those). */
const kBindings = {load: [0, 1, 3], sort_local: [1, 3], sort_global: [1, 3], weigh: [0, 1, 2, 3, 4, 5],
                   pick: [1, 2, 3, 4, 6]};

/** The sampler's pipelines on `device`, compiled (a load's warm-up). */
export async function CompileSampler(device) {
  const module = device.createShaderModule({code: kSampleWgsl});
  const info = await module.getCompilationInfo();
  const errors = info.messages.filter((m) => m.type === 'error');
  if (errors.length) throw new Error(`sampler WGSL: ${errors.map((m) => `${m.lineNum}: ${m.message}`).join('; ')}`);
  const pipelines = {};
  for (const e of Object.keys(kBindings)) {
    pipelines[e] = await device.createComputePipelineAsync({layout: 'auto', compute: {module, entryPoint: e}});
  }
  return pipelines;
}

/**
 * The chain on one device for a vocabulary of `vocab` logits: Record puts a pick into a command
 * encoder, its id written to `out_id` (a storage buffer's first word). table: Uint32Array [2048]
 * (kvq_web_sample_exp2_table's). Buffers and bind groups are made once here.
 */
export class GpuSampler {
  constructor(device, pipelines, vocab, table, out_id) {
    this.device = device;
    this.vocab = vocab;
    let n_pad = kBlock;
    while (n_pad < vocab) n_pad *= 2;
    this.n_pad = n_pad;
    const storage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;
    const buffer = (size, usage = storage) => device.createBuffer({size, usage});
    this.logits = buffer(vocab * 4);          // [vocab] f32, the step's logits copied in
    const keys = buffer(n_pad * 8);           // [n_pad] (key, id)
    const weights = buffer(n_pad * 4);        // [n_pad] u32
    this.words = buffer(32, GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST);  // [8] u32 Words
    const table_buffer = buffer(table.byteLength);
    device.queue.writeBuffer(table_buffer, 0, table);
    this.buffers = [this.logits, keys, weights, this.words, table_buffer];
    const bound = {0: this.logits, 1: keys, 2: weights, 4: this.words, 5: table_buffer, 6: out_id};
    const group = (entry, k, j) => {
      const pass = buffer(16, GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST);  // [4] u32 Pass
      device.queue.writeBuffer(pass, 0, new Uint32Array([k, j, vocab, n_pad]));
      this.buffers.push(pass);
      return device.createBindGroup({layout: pipelines[entry].getBindGroupLayout(0), entries: kBindings[entry].map(
          (b) => ({binding: b, resource: {buffer: b === 3 ? pass : bound[b]}}))});
    };
    const wide = [Math.ceil(n_pad / kLanes), 1], half = [Math.ceil(n_pad / 2 / kLanes), 1];
    // The passes in order: [pipeline, bind group, workgroups].
    this.passes = [[pipelines.load, group('load', 0, 0), wide], [pipelines.sort_local, group('sort_local', 0, 0), [n_pad / kBlock, 1]]];
    for (let k = 2 * kBlock; k <= n_pad; k *= 2) {
      for (let j = k / 2; j >= kBlock; j /= 2) this.passes.push([pipelines.sort_global, group('sort_global', k, j), half]);
      this.passes.push([pipelines.sort_local, group('sort_local', k, 0), [n_pad / kBlock, 1]]);
    }
    this.passes.push([pipelines.weigh, group('weigh', 0, 0), wide], [pipelines.pick, group('pick', 0, 0), [1, 1]]);
  }

  /**
   * Records a pick from the logits at byte `offset` of `logits` ([vocab] f32) under `words`
   * (Uint32Array [6], kvq_web_sampler_next_words's), written to out_id. The words go to the
   * queue now: submit the encoder before recording another pick.
   */
  Record(encoder, logits, offset, words) {
    if (words.length !== 6) throw new Error(`GpuSampler: ${words.length} words (kvq::SampleWords has 6)`);
    this.device.queue.writeBuffer(this.words, 0, new Uint32Array([...words, 0, 0]));
    encoder.copyBufferToBuffer(logits, offset, this.logits, 0, this.vocab * 4);
    const pass = encoder.beginComputePass();
    for (const [pipeline, group, [x, y]] of this.passes) {
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(x, y);
    }
    pass.end();
  }

  /** Frees the buffers. */
  Destroy() {
    for (const b of this.buffers) b.destroy();
  }
}

/** The module's table of 2^-x (kvq_web_sample_exp2_table): Uint32Array [2048], a copy. */
export function SampleExp2Table(M) {
  const at = M._kvq_web_sample_exp2_table();
  return new Uint32Array(M.HEAPU8.buffer.slice(at, at + 2048 * 4));
}

/**
 * The chain's generator in the module (kvq::Sampler with the page's settings {temperature, top_k,
 * top_p, min_p, seed}): Next() gives the next token's words (Uint32Array [6]), advancing it as a
 * CPU Sample would, or null at temperature 0 (greedy: the step program's argmax). Free() it.
 */
export class ModuleSampler {
  constructor(M, p) {
    this.M = M;
    this.handle = M._kvq_web_sampler_new(p.temperature, p.top_k, p.top_p, p.min_p, p.seed | 0);
    this.out = M._malloc(6 * 4);
  }

  Next() {
    const M = this.M;
    if (!M._kvq_web_sampler_next_words(this.handle, this.out)) return null;
    return new Uint32Array(M.HEAPU8.buffer.slice(this.out, this.out + 6 * 4));
  }

  Free() {
    this.M._kvq_web_sampler_free(this.handle);
    this.M._free(this.out);
  }
}
