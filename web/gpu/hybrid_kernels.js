// The WGSL kernels of the hybrid models' layers in the step program (src/web/gpu_delta_net.h):
// the Gated DeltaNet token mixer (model/delta_net.cc) and the gated attention output
// (DecoderModel::ForwardBatch). f32 throughout. Every sum runs in index order in one invocation,
// as kvq's scalar code adds: the delta rule is one invocation per column j of a value head's
// state (delta_rule.cc's StepColumn: the decay, u = Σ_i S[i][j]·k[i], δ = β·(v[j] − u), the
// rank-1 update and o = Σ_i S[i][j]·q[i], each in order of i), the norms one invocation per head.
// A recurrent layer's state is a storage buffer of the step program's (its `states`), read and
// written in place each step, so it stays on the GPU from token to token; a prefill block runs
// these ops token by token in order (block_steps.js), which is the recurrence's order.

// Bindings: the weights as u32 words, the input x, the output y, the op's uniform, a recurrent
// state, the delta rule's [2][Hv] gates.
export const kHybridWgsl = /* wgsl */ `
// Per kind (HybridDispatch below): sizes, a weight vector's first word in w, eps's or the scale's bits.
struct P { n: u32, a: u32, b: u32, c: u32, d: u32, e: u32, f: u32, g: u32 }
@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: P;
@group(0) @binding(9) var<storage, read_write> state: array<f32>;
@group(0) @binding(10) var<storage, read> gates: array<f32>;  // [β: Hv][γ: Hv]

fn wf(i: u32) -> f32 { return bitcast<f32>(w[i]); }
fn sigmoid(v: f32) -> f32 { return 1.0 / (1.0 + exp(-v)); }
fn silu(v: f32) -> f32 { return v * sigmoid(v); }
// ln(1 + v) without the cancellation of log(1 + v) for small v (Goldberg's form): WGSL has no log1p.
fn log1p(v: f32) -> f32 {
  let u = 1.0 + v;
  if (u == 1.0) { return v; }
  return log(u) * (v / (u - 1.0));
}
// delta_net.cc's Softplus: x itself above 20.
fn softplus(v: f32) -> f32 {
  if (v > 20.0) { return v; }
  return log1p(exp(v));
}

// Gated attention: head h of y [n heads][b] = numbers a .. a + b of x's head h ([n][2b]: q, gate).
@compute @workgroup_size(64)
fn head_slice(@builtin(global_invocation_id) id: vec3u) {
  if (id.x >= p.n * p.b) { return; }
  let h = id.x / p.b;
  y[id.x] = x[h * 2u * p.b + p.a + id.x % p.b];
}

// Gated attention: y ⊙= σ(x) over n numbers.
@compute @workgroup_size(64)
fn sigmoid_mul(@builtin(global_invocation_id) id: vec3u) {
  if (id.x < p.n) { y[id.x] = y[id.x] * (1.0 / (1.0 + exp(-x[id.x]))); }
}

// A fused ssm_ba's rows (per key head g: [b of its a value heads][a of them]) into [b: n][a: n]
// (n = Hv, a = Hv / Hk), as RecurrentMixer splits them.
@compute @workgroup_size(64)
fn ba_order(@builtin(global_invocation_id) id: vec3u) {
  if (id.x >= p.n) { return; }
  let g = id.x / p.a;
  let j = id.x % p.a;
  y[id.x] = x[g * 2u * p.a + j];
  y[p.n + id.x] = x[g * 2u * p.a + p.a + j];
}

// y [b: n][a: n] in place: β = σ(b); a + dt_bias (w from word a) through softplus.
@compute @workgroup_size(64)
fn dn_gate_bias(@builtin(global_invocation_id) id: vec3u) {
  if (id.x >= p.n) { return; }
  y[id.x] = sigmoid(y[id.x]);
  y[p.n + id.x] = softplus(y[p.n + id.x] + wf(p.a + id.x));
}

// γ = exp(A · softplus(..)) with w (from word a) = −exp(A_log) as stored: γ ∈ (0, 1].
@compute @workgroup_size(64)
fn dn_gate_decay(@builtin(global_invocation_id) id: vec3u) {
  if (id.x >= p.n) { return; }
  y[p.n + id.x] = exp(wf(p.a + id.x) * y[p.n + id.x]);
}

// The causal depthwise conv of channel id.x of n, K = b taps (w [n][K] from word a, tap 0 the
// oldest), over the channel's window in state [n][K − 1] (oldest first) then this token's x;
// the window then drops its oldest and keeps x. y = SiLU of the sum.
@compute @workgroup_size(64)
fn conv_silu(@builtin(global_invocation_id) id: vec3u) {
  let ch = id.x;
  if (ch >= p.n) { return; }
  let K = p.b;
  let win = ch * (K - 1u);
  let taps = p.a + ch * K;
  let xv = x[ch];
  var u = 0.0;
  for (var j = 0u; j + 1u < K; j++) { u = u + wf(taps + j) * state[win + j]; }
  u = u + wf(taps + K - 1u) * xv;
  for (var j = 0u; j + 2u < K; j++) { state[win + j] = state[win + j + 1u]; }
  if (K > 1u) { state[win + K - 2u] = xv; }
  y[ch] = silu(u);
}

// Head id.x of a heads of n numbers of y in place: y / max(‖y‖₂, eps) (eps's bits: b).
@compute @workgroup_size(64)
fn l2norm(@builtin(global_invocation_id) id: vec3u) {
  if (id.x >= p.a) { return; }
  let base = id.x * p.n;
  var sum = 0.0;
  for (var i = 0u; i < p.n; i++) { sum = sum + y[base + i] * y[base + i]; }
  let scale = 1.0 / max(sqrt(sum), bitcast<f32>(p.b));
  for (var i = 0u; i < p.n; i++) { y[base + i] = y[base + i] * scale; }
}

// DeltaRuleStep, column j of value head h per invocation: n = dk, a = dv, b = Hk, c = Hv,
// d = the value-head map (0: h mod Hk, 1: h / (Hv / Hk)), e = the scale's bits, f = Ck. x [C]:
// q heads, k heads (from f), v heads (from 2f); state S_h [dk][dv] at h·dk·dv.
@compute @workgroup_size(64)
fn delta_rule(@builtin(global_invocation_id) id: vec3u) {
  let dk = p.n;
  let dv = p.a;
  if (id.x >= p.c * dv) { return; }
  let h = id.x / dv;
  let j = id.x % dv;
  let g = select(h / (p.c / p.b), h % p.b, p.d == 0u);
  let q0 = g * dk;
  let k0 = p.f + g * dk;
  let beta = gates[h];
  let gamma = gates[p.c + h];
  let s0 = h * dk * dv + j;
  var u = 0.0;
  for (var i = 0u; i < dk; i++) {
    let s = state[s0 + i * dv] * gamma;  // decay first
    state[s0 + i * dv] = s;
    u = u + s * x[k0 + i];
  }
  let delta = beta * (x[2u * p.f + h * dv + j] - u);  // move towards v by β
  var o = 0.0;
  for (var i = 0u; i < dk; i++) {
    let s = state[s0 + i * dv] + x[k0 + i] * delta;  // rank-1 update
    state[s0 + i * dv] = s;
    o = o + s * x[q0 + i];  // read with the updated state
  }
  y[h * dv + j] = o * bitcast<f32>(p.e);
}

// Head id.x of b heads of n numbers of y: RmsNorm by w [n] (from word a; eps's bits: c), then
// ⊙ SiLU(x), x the output gate z.
@compute @workgroup_size(64)
fn gated_rmsnorm(@builtin(global_invocation_id) id: vec3u) {
  if (id.x >= p.b) { return; }
  let base = id.x * p.n;
  var ss = 0.0;
  for (var i = 0u; i < p.n; i++) { ss = ss + y[base + i] * y[base + i]; }
  let scale = 1.0 / sqrt(ss / f32(p.n) + bitcast<f32>(p.c));
  for (var i = 0u; i < p.n; i++) {
    let o = wf(p.a + i) * (scale * y[base + i]);
    y[base + i] = o * silu(x[base + i]);
  }
}
`;

/** Bindings each entry point of kHybridWgsl uses (each op kind is the entry point of its name). */
export const kHybridBindings = {
  head_slice: [1, 2, 3], sigmoid_mul: [1, 2, 3], ba_order: [1, 2, 3], dn_gate_bias: [0, 2, 3],
  dn_gate_decay: [0, 2, 3], conv_silu: [0, 1, 2, 3, 9], l2norm: [2, 3], delta_rule: [1, 2, 3, 9, 10],
  gated_rmsnorm: [0, 1, 2, 3],
};

const F32Bits = (v) => new Uint32Array(new Float32Array([v]).buffer)[0];
const Groups = (n) => [Math.ceil(n / 64), 1];

/**
 * The uniform words and workgroups of hybrid op `op` of a program with config `c`; word: the
 * first word of its weight vector in its chunk (0 without one).
 */
export function HybridDispatch(op, c, word) {
  const {words, groups} = Dispatch(op, c, word);
  return {words: [...words, 0, 0, 0, 0, 0, 0, 0, 0].slice(0, 8), groups};  // P's 8 words whatever the kind uses
}

function Dispatch(op, c, word) {
  const d = c.delta_net;
  const eps = F32Bits(c.norm_eps);
  switch (op.kind) {
    case 'head_slice': return {words: [op.heads, op.n ?? 0, c.head_dim, 0], groups: Groups(op.heads * c.head_dim)};
    case 'sigmoid_mul': return {words: [op.n, 0, 0, 0], groups: Groups(op.n)};
    case 'ba_order': return {words: [d.n_v_heads, d.n_v_heads / d.n_k_heads, 0, 0], groups: Groups(d.n_v_heads)};
    case 'dn_gate_bias':
    case 'dn_gate_decay': return {words: [d.n_v_heads, word, 0, 0], groups: Groups(d.n_v_heads)};
    case 'conv_silu': {
      const channels = 2 * d.n_k_heads * d.key_dim + d.n_v_heads * d.value_dim;
      return {words: [channels, word, d.conv_kernel, 0], groups: Groups(channels)};
    }
    case 'l2norm': return {words: [op.n, op.heads, eps, 0], groups: Groups(op.heads)};
    case 'delta_rule': {
      // delta_net.cc's 1 / sqrt(dk) in f32: a double sqrt and quotient of f32s, rounded once, are
      // the correctly rounded f32 results.
      const scale = Math.fround(1 / Math.fround(Math.sqrt(d.key_dim)));
      return {words: [d.key_dim, d.value_dim, d.n_k_heads, d.n_v_heads, d.v_head_map === 'modulo' ? 0 : 1,
                      F32Bits(scale), d.n_k_heads * d.key_dim, 0],
              groups: Groups(d.n_v_heads * d.value_dim)};
    }
    case 'gated_rmsnorm': return {words: [op.n, word, op.heads, eps], groups: Groups(op.heads)};
    default: throw new Error(`hybrid kernels: unknown op '${op.kind}'`);
  }
}
