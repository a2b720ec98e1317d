// The GPU sampler: kvq's chain (src/generate/sampler.cc's Sample: Adjust, then SampleWithWords at
// temperature > 0) in WGSL, so a step's token is picked on the GPU and only its id is read back.
// The module keeps the generator and hands each token's words (module_sampler.js: top-k, the
// temperature's scale, top-p, min-p and one 64-bit draw) and, when the settings bias or penalise,
// the edits of its logits; this file runs the chain on them, op for op:
//   0. adjust (when there are edits): logit_bias and the penalties on the logits they name, with
//      Adjust's float operations (the division by repeat_penalty in integers: WGSL's is inexact);
//   1. load: every logit not -inf becomes (key, id), key ordering logits descending; the chain's
//      order is (key, id) ascending (ties: the lower id), a total order, so any sort gives it;
//   2. top_k in (0, vocab): a radix select finds the top_k-th (key, id), a byte at a time from the
//      top (7 histogram + scan passes: 4 bytes of key, 3 of id), and the elements up to it are
//      compacted into ≤ k_pad slots (k_pad: the power of two ≥ max(top_k, 512)): exactly
//      the chain's top_k set, since the order is total. top_k 0 (or ≥ vocab) skips this: all
//      n_pad slots are sorted;
//   3. sort: a bitonic sort of (key, id) ascending over those slots, blocks of 512 in workgroup
//      memory, longer strides globally;
//   4. weigh: each candidate's integer weight from the logit gap (read to 2^-20) and the table of
//      2^-x (kvq_web_sample_exp2_table), as sampler.cc's Weight;
//   5. pick: one workgroup sums the weights in 64-bit integers (exact in any order, so lanes sum
//      chunks in parallel), then one lane walks the chunks for top-p's cut, min-p's (a binary
//      search: the weights never grow along the order), the kept total and the draw.
// WGSL has no 64-bit integer: vec2u (low, high) with the carries written out, as sampler.cc's Mul128.
// Cost: the select reads the vocabulary 9 times (load, 7 histograms, compact), whatever top_k, and
// sorts k_pad slots: at top_k 40, 1 sort dispatch of 512. Without a top_k the sort takes every
// logit: 55 sort dispatches at a vocabulary of 151936 (2^18 slots, 171 bitonic stages, 126 of them
// in workgroup memory), 28 at 32000 (120 stages, 99), so a pick grows as n log^2 n there.
// web.gpu_sampler prints a pick's time with and without a top_k. The edits: one invocation each.
// Logits that are subnormal floats may differ from sampler.cc's where the device flushes them to
// zero (WGSL allows it) in the adjust pass's + - ·; kvq's models' logits are far from 2^-126.

const kLanes = 256;   // invocations per workgroup of every entry point but scan (one)
const kBlock = 512;   // elements a workgroup sorts in its memory (two per lane)
const kPad = 0xffffffff;  // the id of a slot holding no candidate (sorts last)

export const kSampleWgsl = /* wgsl */ `
// k, j: the bitonic stage of a sort pass (k 0: sort_local sorts its blocks whole), or k the digit
// of a select pass (0..6); n: the vocabulary; len: the slots of 'keys' the sort runs over (a power
// of two, at least ${kBlock}: n_pad for the whole vocabulary, k_pad after a top-k select).
struct Pass { k: u32, j: u32, n: u32, len: u32 }
// One token's words (kvq::SampleWords), then the adjustment's repeat_penalty (f32 bits) and its
// number of edits (0: no bias or penalty).
struct Words { top_k: u32, exp_scale: u32, top_p_q24: u32, min_weight: u32, draw_lo: u32, draw_hi: u32,
               repeat_penalty: u32, edits: u32 }
// One adjusted logit (kvq_web_sampler_edits): its id, its biases (biases[bias_at ..], count in
// bits 0..30; bit 31: the token is in the penalties' window) and the window's subtrahend (f32 bits:
// count · frequency_penalty + presence_penalty, as sampler.cc's Adjust computes it).
struct Edit { id: u32, bias_at: u32, bias_count: u32, sub: u32 }
// The radix select's state: the composite (key, id) prefix fixed so far and its mask, how many of
// the elements under the prefix are still to take, and the compaction's counter.
struct Select { prefix: vec2u, mask: vec2u, remaining: u32, taken: atomic<u32> }
@group(0) @binding(0) var<storage, read_write> logits: array<f32>;      // [n] (adjust edits them)
@group(0) @binding(1) var<storage, read_write> keys: array<vec2u>;      // [len] (key, id), sorted
@group(0) @binding(2) var<storage, read_write> weights: array<u32>;     // [len] in sorted order
@group(0) @binding(3) var<uniform> pass_: Pass;
@group(0) @binding(4) var<uniform> words: Words;
@group(0) @binding(5) var<storage, read> table: array<u32>;             // [2][1024] 2^-x · 2^31
@group(0) @binding(6) var<storage, read_write> out_id: array<u32>;      // [1] the pick
@group(0) @binding(7) var<storage, read_write> all_keys: array<vec2u>;  // [n] (key, id): the select's input
@group(0) @binding(8) var<storage, read_write> hist: array<atomic<u32>, 256>;  // [256] a digit's counts
@group(0) @binding(9) var<storage, read_write> sel: Select;
@group(0) @binding(10) var<storage, read> edits: array<Edit>;           // [words.edits]
@group(0) @binding(11) var<storage, read> biases: array<f32>;           // [the edits' bias counts]

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

// A positive float's mantissa with its leading bit at bit 23, and its exponent (biased; below 1
// for a subnormal, normalised).
fn unpack(bits: u32) -> vec2i {
  let e = i32(bits >> 23u);
  let m = bits & 0x7fffffu;
  if (e != 0) { return vec2i(i32(m | 0x800000u), e); }
  let s = countLeadingZeros(m) - 8u;
  return vec2i(i32(m << s), 1 - i32(s));
}

// a / b correctly rounded (to nearest, ties to even), for a > 0 and b > 0 finite: WGSL's f32
// division may be off by 2.5 ulp and sampler.cc's (IEEE) is exact, so this divides the mantissas
// in integers (25 quotient bits and a sticky remainder) and rounds as IEEE does, subnormal results
// and overflow to infinity included. (SwiftShader's '/' gave the same bits on web.gpu_sampler's
// cases, so that test cannot tell the two apart; a GPU whose division is a reciprocal can.)
fn div_exact(a: f32, b: f32) -> f32 {
  let ab = bitcast<u32>(a);
  if (ab >= 0x7f800000u) { return a; }  // +infinity
  let ua = unpack(ab);
  let ub = unpack(bitcast<u32>(b));
  var ma = u32(ua.x);
  let mb = u32(ub.x);
  var e = ua.y - ub.y + 127;
  if (ma < mb) { ma = ma << 1u; e = e - 1; }  // ma / mb in [1, 2)
  var q = 0u;
  var r = ma;
  for (var i = 0u; i < 25u; i++) {
    q = q << 1u;
    if (r >= mb) { r = r - mb; q = q | 1u; }
    r = r << 1u;
  }
  // q = floor(ma / mb · 2^24): the result is q · 2^(e - 151); keep 24 bits (fewer below 2^-126).
  let s = u32(max(1, 2 - e));
  var mant = 0u;
  var half = false;
  var rest = true;
  if (s < 26u) {
    mant = q >> s;
    half = ((q >> (s - 1u)) & 1u) != 0u;
    rest = (q & ((1u << (s - 1u)) - 1u)) != 0u || r != 0u;
  }
  if (half && (rest || (mant & 1u) != 0u)) { mant = mant + 1u; }
  // The mantissa's leading bit lands in the exponent field (a carry from rounding too).
  return bitcast<f32>(min((u32(max(e, 1) - 1) << 23u) + mant, 0x7f800000u));
}

// sampler.cc's Adjust on the logits the edits name: the biases in their order, then for a token in
// the window l > 0 ? l / repeat_penalty : l · repeat_penalty, minus the subtrahend (WGSL's + - ·
// are correctly rounded, as IEEE's).
@compute @workgroup_size(${kLanes})
fn adjust(@builtin(global_invocation_id) g: vec3u) {
  if (g.x >= words.edits) { return; }
  let e = edits[g.x];
  var l = logits[e.id];
  for (var b = 0u; b < (e.bias_count & 0x7fffffffu); b++) { l = l + biases[e.bias_at + b]; }
  if ((e.bias_count & 0x80000000u) != 0u) {
    let penalty = bitcast<f32>(words.repeat_penalty);
    if (l > 0.0) { l = div_exact(l, penalty); } else { l = l * penalty; }
    l = l - bitcast<f32>(e.sub);
  }
  logits[e.id] = l;
}

// The sort key of a logit's bits: ascending keys are descending logits (-0 taken as +0).
fn key_of(bits_in: u32) -> u32 {
  let bits = select(bits_in, 0u, bits_in == 0x80000000u);
  return ~select(bits | 0x80000000u, ~bits, (bits & 0x80000000u) != 0u);
}

// Logit i's (key, id), or the empty slot's for -inf (never drawn).
fn entry_of(i: u32) -> vec2u {
  let bits = bitcast<u32>(logits[i]);
  if (bits == 0xff800000u) { return vec2u(${kPad}u, ${kPad}u); }
  return vec2u(key_of(bits), i);
}

// The whole vocabulary's path: every logit into keys [len = n_pad].
@compute @workgroup_size(${kLanes})
fn load(@builtin(global_invocation_id) g: vec3u) {
  let i = g.x;
  if (i >= pass_.len) { return; }
  keys[i] = select(vec2u(${kPad}u, ${kPad}u), entry_of(min(i, pass_.n - 1u)), i < pass_.n);
}

// The top-k path: every logit into all_keys [n], keys [len] emptied, the select's state reset.
@compute @workgroup_size(${kLanes})
fn load_select(@builtin(global_invocation_id) g: vec3u) {
  let i = g.x;
  if (i < pass_.len) { keys[i] = vec2u(${kPad}u, ${kPad}u); }
  if (i < 256u) { atomicStore(&hist[i], 0u); }
  if (i == 0u) {
    sel.prefix = vec2u(0u, 0u);
    sel.mask = vec2u(0u, 0u);
    sel.remaining = words.top_k;
    atomicStore(&sel.taken, 0u);
  }
  if (i < pass_.n) { all_keys[i] = entry_of(i); }
}

// Digit d of the composite (key, id) from the top: d 0..3 the key's bytes, 4..6 the id's low 3
// (ids < 2^24). The shift of its byte in its word.
fn digit_shift(d: u32) -> u32 { return select(16u - 8u * (d - 4u), 24u - 8u * d, d < 4u); }

// Counts digit pass_.k of the elements under the select's prefix (straight into the global
// counts: on SwiftShader a workgroup histogram's barriers cost ~50x these atomics).
@compute @workgroup_size(${kLanes})
fn histogram(@builtin(global_invocation_id) g: vec3u) {
  if (g.x >= pass_.n) { return; }
  let e = all_keys[g.x];
  if ((e.x & sel.mask.x) == sel.prefix.x && (e.y & sel.mask.y) == sel.prefix.y) {
    let word = select(e.y, e.x, pass_.k < 4u);
    atomicAdd(&hist[(word >> digit_shift(pass_.k)) & 0xffu], 1u);
  }
}

// The digit whose bucket holds the remaining-th element under the prefix joins the prefix; the
// counts are zeroed for the next digit.
@compute @workgroup_size(1)
fn scan() {
  let want = sel.remaining;
  var below = 0u;
  var chosen = 256u;
  for (var b = 0u; b < 256u; b++) {
    let c = atomicExchange(&hist[b], 0u);
    if (chosen == 256u) {
      if (below + c >= want) { chosen = b; } else { below += c; }
    }
  }
  chosen = min(chosen, 255u);  // unreachable: 1 <= want <= the elements under the prefix
  sel.remaining = want - below;
  let shift = digit_shift(pass_.k);
  if (pass_.k < 4u) {
    sel.prefix.x |= chosen << shift;
    sel.mask.x |= 0xffu << shift;
  } else {
    sel.prefix.y |= chosen << shift;
    sel.mask.y |= 0xffu << shift;
  }
}

// After the 7 digits the prefix is the top_k-th smallest (key, id): the elements up to it (the
// empty ones left out) into keys, in any order (the sort that follows makes it the chain's).
@compute @workgroup_size(${kLanes})
fn compact(@builtin(global_invocation_id) g: vec3u) {
  if (g.x >= pass_.n) { return; }
  let e = all_keys[g.x];
  let t = sel.prefix;
  if (e.y != ${kPad}u && (e.x < t.x || (e.x == t.x && e.y <= t.y))) {
    let at = atomicAdd(&sel.taken, 1u);
    if (at < pass_.len) { keys[at] = e; }
  }
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
  if (t >= pass_.len / 2u) { return; }
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
  if (i >= pass_.len) { return; }
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
    var hi = pass_.len;
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
const kBindings = {adjust: [0, 4, 10, 11], load: [0, 1, 3], load_select: [0, 1, 3, 4, 7, 8, 9],
                   histogram: [3, 7, 8, 9], scan: [3, 8, 9], compact: [1, 3, 7, 9], sort_local: [1, 3],
                   sort_global: [1, 3], weigh: [0, 1, 2, 3, 4, 5], pick: [1, 2, 3, 4, 6]};
const kSelectDigits = 7;  // the composite (key, id) in bytes: 4 of the key, 3 of the id

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
 * (kvq_web_sample_exp2_table's). Buffers and bind groups are made once here (a top-k's passes and
 * the edits' buffers when first needed).
 */
export class GpuSampler {
  constructor(device, pipelines, vocab, table, out_id) {
    if (!(vocab >= 1 && vocab < 2 ** 24)) throw new Error(`GpuSampler: a vocabulary of ${vocab} (the select takes ids < 2^24)`);
    this.device = device;
    this.pipelines = pipelines;
    this.vocab = vocab;
    let n_pad = kBlock;
    while (n_pad < vocab) n_pad *= 2;
    this.n_pad = n_pad;
    const storage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;
    this.Buffer = (size, usage = storage) => {
      const b = device.createBuffer({size, usage});
      this.buffers.push(b);
      return b;
    };
    this.buffers = [];
    this.logits = this.Buffer(vocab * 4);  // [vocab] f32, the step's logits copied in (then adjusted)
    this.words = this.Buffer(32, GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST);  // [8] u32 Words
    const table_buffer = this.Buffer(table.byteLength);  // [2048] u32
    device.queue.writeBuffer(table_buffer, 0, table);
    this.bound = {0: this.logits, 1: this.Buffer(n_pad * 8) /* [n_pad] (key, id) */,
                  2: this.Buffer(n_pad * 4) /* [n_pad] u32 weights */, 4: this.words, 5: table_buffer, 6: out_id,
                  7: this.Buffer(vocab * 8) /* [vocab] (key, id) */, 8: this.Buffer(256 * 4) /* [256] u32 */,
                  9: this.Buffer(32) /* Select: [8] u32 */};
    this.full = this.#Passes(0);
    this.selects = new Map();  // k_pad → the top-k path's passes
    this.edit_capacity = 0;    // edits the edit buffers hold (grown on demand)
  }

  // A bind group of `entry` with Pass {k, j, vocab, len}.
  #Group(entry, k, j, len) {
    const pass = this.Buffer(16, GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST);  // [4] u32 Pass
    this.device.queue.writeBuffer(pass, 0, new Uint32Array([k, j, this.vocab, len]));
    return this.device.createBindGroup({layout: this.pipelines[entry].getBindGroupLayout(0), entries: kBindings[entry].map(
        (b) => ({binding: b, resource: {buffer: b === 3 ? pass : this.bound[b]}}))});
  }

  // The passes in order ([pipeline, bind group, workgroups]) of a pick from the whole vocabulary
  // (k_pad 0: sorted over n_pad slots) or from a top-k select's k ≤ k_pad candidates.
  #Passes(k_pad) {
    const P = this.pipelines, len = k_pad || this.n_pad;
    const over = (threads) => [Math.ceil(threads / kLanes), 1];
    const passes = [];
    const add = (entry, k, j, workgroups) => passes.push([P[entry], this.#Group(entry, k, j, len), workgroups]);
    if (k_pad) {
      add('load_select', 0, 0, over(Math.max(this.vocab, len)));
      for (let d = 0; d < kSelectDigits; ++d) {
        add('histogram', d, 0, over(this.vocab));
        add('scan', d, 0, [1, 1]);
      }
      add('compact', 0, 0, over(this.vocab));
    } else {
      add('load', 0, 0, over(len));
    }
    add('sort_local', 0, 0, [len / kBlock, 1]);
    for (let k = 2 * kBlock; k <= len; k *= 2) {
      for (let j = k / 2; j >= kBlock; j /= 2) add('sort_global', k, j, over(len / 2));
      add('sort_local', k, 0, [len / kBlock, 1]);
    }
    add('weigh', 0, 0, over(len));
    add('pick', 0, 0, [1, 1]);
    return passes;
  }

  /** The passes of a pick under top_k: a select then a sort of ≤ top_k, or a sort of every logit. */
  PassesFor(top_k) {
    if (!(top_k > 0 && top_k < this.vocab)) return this.full;
    let k_pad = kBlock;
    while (k_pad < top_k) k_pad *= 2;
    if (!this.selects.has(k_pad)) this.selects.set(k_pad, this.#Passes(k_pad));
    return this.selects.get(k_pad);
  }

  // The adjust pass for `adjust` (ModuleSampler.Adjustment's), its edits written to the queue.
  #AdjustPass(adjust) {
    const m = adjust.edits.length / 4;
    if (m > this.edit_capacity) {
      this.edit_capacity = Math.max(m, 2 * this.edit_capacity, 64);
      this.edit_buffer?.destroy();
      this.edit_buffer = this.device.createBuffer({size: this.edit_capacity * 16, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST});  // [capacity] Edit
      this.adjust_group = null;
    }
    const nb = Math.max(adjust.biases.length, 1);
    if (!this.bias_buffer || this.bias_buffer.size < nb * 4) {
      this.bias_buffer?.destroy();
      this.bias_buffer = this.device.createBuffer({size: Math.max(nb, 64) * 4, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST});  // [≥ nb] f32
      this.adjust_group = null;
    }
    this.adjust_group ??= this.device.createBindGroup({layout: this.pipelines.adjust.getBindGroupLayout(0), entries: [
      {binding: 0, resource: {buffer: this.logits}}, {binding: 4, resource: {buffer: this.words}},
      {binding: 10, resource: {buffer: this.edit_buffer}}, {binding: 11, resource: {buffer: this.bias_buffer}}]});
    this.device.queue.writeBuffer(this.edit_buffer, 0, adjust.edits);
    if (adjust.biases.length) this.device.queue.writeBuffer(this.bias_buffer, 0, adjust.biases);
    return [this.pipelines.adjust, this.adjust_group, [Math.ceil(m / kLanes), 1]];
  }

  /**
   * Records a pick from the logits at byte `offset` of `logits` ([vocab] f32) under `words`
   * (Uint32Array [6], kvq_web_sampler_next_words's), written to out_id; `adjust` (ModuleSampler's
   * {edits, biases, repeat_penalty}, or null) biases and penalises the logits first, as
   * kvq::Sampler::Adjust. The words go to the queue now: submit the encoder before recording
   * another pick.
   */
  Record(encoder, logits, offset, words, adjust = null) {
    if (words.length !== 6) throw new Error(`GpuSampler: ${words.length} words (kvq::SampleWords has 6)`);
    const edits = adjust ? adjust.edits.length / 4 : 0;
    const passes = edits ? [this.#AdjustPass(adjust), ...this.PassesFor(words[0])] : this.PassesFor(words[0]);
    const penalty = new Float32Array([adjust ? adjust.repeat_penalty : 1]);
    this.device.queue.writeBuffer(this.words, 0, new Uint32Array([...words, new Uint32Array(penalty.buffer)[0], edits]));
    encoder.copyBufferToBuffer(logits, offset, this.logits, 0, this.vocab * 4);
    const pass = encoder.beginComputePass();
    for (const [pipeline, group, [x, y]] of passes) {
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, group);
      pass.dispatchWorkgroups(x, y);
    }
    pass.end();
  }

  /** Frees the buffers. */
  Destroy() {
    for (const b of this.buffers) b.destroy();
    this.edit_buffer?.destroy();
    this.bias_buffer?.destroy();
  }
}
