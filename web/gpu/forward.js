// A Llama model's forward pass on a WebGPU device (issue 14, deliverable 3), from a llama2.c
// checkpoint or a GGUF (gguf.js) with matrices in F32, F16, BF16, Q8_0, Q4_0 or Q1_0 (weight_types.js):
// run.c's transformer — RMSNorm, the q/k/v/o and SwiGLU matvecs, RoPE on adjacent pairs, the
// residual adds, the classifier — as WGSL kernels over weights in GPU buffers, with the KV master
// in host memory and attention streamed through the device in windows: by default its own f32
// rows and GpuKvAttention; in the page, kvq's KvCache (any format) and kv_device.js (Reset(kv)). One token at a time; after each layer's q, k, v the
// new K and V rows come back to the host master (the cache's tier model: host master, device
// working set).
import {GpuKvAttention} from './kv_attention.js';
import {GpuMatvec, RowBytes} from './weight_types.js';

/**
 * The model the forward runs, from a llama2.c checkpoint (run.c's layout, f32): the config and
 * where each tensor lies in the file ({type, at}: its type and byte offset), as LlamaFromGguf
 * (gguf.js) gives for a GGUF.
 */
export function ParseLlama2c(buffer) {
  if (buffer.byteLength < 28) throw new Error('not a llama2.c checkpoint: shorter than its 28-byte header');
  const header = new Int32Array(buffer, 0, 7);
  const [dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_signed, seq_len] = header;
  const c = {dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size: Math.abs(vocab_signed), seq_len,
             head_dim: dim / n_heads, rope_theta: 10000, norm_eps: 1e-5};
  c.kv_dim = c.head_dim * n_kv_heads;
  if (!(dim > 0 && hidden_dim > 0 && n_layers > 0 && n_heads > 0 && n_kv_heads > 0 && c.vocab_size > 0 &&
        seq_len > 0 && dim % n_heads === 0 && n_heads % n_kv_heads === 0)) {
    throw new Error(`not a llama2.c checkpoint: header ${Array.from(header).join(', ')}`);
  }
  let at = 28;
  const take = (n) => {  // n f32 numbers; returns where they start
    if (at + 4 * n > buffer.byteLength) throw new Error(`llama2.c checkpoint truncated at byte ${at}`);
    at += 4 * n;
    return {type: 'f32', at: at - 4 * n};
  };
  const L = n_layers, per = (t, n) => Array.from({length: L}, (_, l) => ({type: 'f32', at: t.at + 4 * n * l}));
  const embd = take(c.vocab_size * dim);
  const rms_att = per(take(L * dim), dim), wq = per(take(L * dim * dim), dim * dim);
  const wk = per(take(L * dim * c.kv_dim), dim * c.kv_dim), wv = per(take(L * dim * c.kv_dim), dim * c.kv_dim);
  const wo = per(take(L * dim * dim), dim * dim), rms_ffn = per(take(L * dim), dim);
  const w1 = per(take(L * dim * hidden_dim), dim * hidden_dim), w2 = per(take(L * hidden_dim * dim), dim * hidden_dim);
  const w3 = per(take(L * dim * hidden_dim), dim * hidden_dim);
  const rms_final = take(dim);
  take(seq_len * c.head_dim / 2);  // freq_cis_real, freq_cis_imag: unused (RoPE is computed)
  take(seq_len * c.head_dim / 2);
  const classifier = vocab_signed > 0 ? embd : take(c.vocab_size * dim);
  const layers = Array.from({length: L}, (_, l) => ({attn_norm: rms_att[l], wq: wq[l], wk: wk[l], wv: wv[l], wo: wo[l],
                                                     ffn_norm: rms_ffn[l], w1: w1[l], w2: w2[l], w3: w3[l]}));
  return {config: c, bytes: buffer, tensors: {token_embedding: embd, classifier, rms_final, layers}};
}

const kKernels = /* wgsl */ `
struct Dims { rows: u32, cols: u32, offset: u32, pos: u32 }
@group(0) @binding(0) var<storage, read> w: array<f32>;  // the model file (its f32 norms), or the RoPE table
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> dims: Dims;

// y = x / sqrt(mean(x²) + eps) · w[offset ..] (run.c's rmsnorm), over cols numbers; eps's bits in pos.
@compute @workgroup_size(64)
fn rmsnorm(@builtin(global_invocation_id) id: vec3u) {
  if (id.x >= dims.cols) { return; }
  var ss = 0.0;
  for (var c = 0u; c < dims.cols; c++) { ss = ss + x[c] * x[c]; }
  let scale = 1.0 / sqrt(ss / f32(dims.cols) + bitcast<f32>(dims.pos));
  y[id.x] = w[dims.offset + id.x] * (scale * x[id.x]);
}

// RoPE on adjacent pairs (run.c): pair i of y (rows numbers) rotates by the angle of its place in
// the head (head_dim = cols), whose cos and sin the host computed for this position into w:
// [head_dim / 2][cos, sin]. (WGSL's sin and cos are only accurate to 2^-11 within [-π, π], and
// the angles reach the context length.)
@compute @workgroup_size(64)
fn rope(@builtin(global_invocation_id) id: vec3u) {
  let i = id.x * 2u;
  if (i >= dims.rows) { return; }
  let pair = (i % dims.cols) / 2u;
  let c = w[2u * pair];
  let s = w[2u * pair + 1u];
  let a = y[i];
  let b = y[i + 1u];
  y[i] = a * c - b * s;
  y[i + 1u] = a * s + b * c;
}

// y[i] += x[i] (the residual).
@compute @workgroup_size(64)
fn add(@builtin(global_invocation_id) id: vec3u) {
  if (id.x >= dims.rows) { return; }
  y[id.x] = y[id.x] + x[id.x];
}

// y[i] = silu(y[i]) · x[i] (SwiGLU: y = w1·x, x = w3·x).
@compute @workgroup_size(64)
fn swiglu(@builtin(global_invocation_id) id: vec3u) {
  if (id.x >= dims.rows) { return; }
  let g = y[id.x];
  y[id.x] = g * (1.0 / (1.0 + exp(-g))) * x[id.x];
}
`;

// The bindings (w 0, x 1, y 2, dims 3) each kernel uses.
const kBindings = {rmsnorm: [0, 1, 2, 3], rope: [0, 2, 3], add: [1, 2, 3], swiglu: [1, 2, 3]};

// run.c's angles in f32: freq = 1 / theta^(j / head_dim) for even j, angle = pos · freq, then cos and
// sin of it (double here, rounded to f32: within an ULP of run.c's cosf and sinf).
function RopeTable(pos, head_dim, theta) {
  const table = new Float32Array(head_dim);
  for (let j = 0; j < head_dim; j += 2) {
    const freq = Math.fround(1 / Math.fround(Math.pow(theta, Math.fround(j / head_dim))));
    const angle = Math.fround(pos * freq);
    table[j] = Math.cos(angle);
    table[j + 1] = Math.sin(angle);
  }
  return table;
}

export class GpuLlamaForward {
  /**
   * Uploads the model file (whole: the matrices are read in their own types, GpuMatvec) to one GPU
   * buffer; `model` from ParseLlama2c or LlamaFromGguf.
   */
  static async Create(device, model) {
    const module = device.createShaderModule({code: kKernels});
    const info = await module.getCompilationInfo();
    const errors = info.messages.filter((m) => m.type === 'error');
    if (errors.length) throw new Error(`forward WGSL: ${errors.map((m) => `${m.lineNum}: ${m.message}`).join('; ')}`);
    const pipelines = {};
    for (const name of Object.keys(kBindings)) {
      pipelines[name] = await device.createComputePipelineAsync({layout: 'auto', compute: {module, entryPoint: name}});
    }
    const t = model.tensors;
    const matvecs = {};
    for (const m of [t.token_embedding, t.classifier, ...t.layers.flatMap((L) => [L.wq, L.wk, L.wv, L.wo, L.w1, L.w2, L.w3])]) {
      matvecs[m.type] ??= await GpuMatvec.Create(device, m.type);
    }
    const c = model.config;
    const attention = await GpuKvAttention.Create(device, {key_format: 'f32', value_format: 'f32',
      n_kv_heads: c.n_kv_heads, q_per_kv: c.n_heads / c.n_kv_heads, head_dim: c.head_dim,
      k_block_bytes: c.kv_dim * 4, v_block_bytes: c.kv_dim * 4});
    return new GpuLlamaForward(device, model, pipelines, matvecs, attention);
  }

  constructor(device, model, pipelines, matvecs, attention) {
    this.device = device;
    this.config = model.config;
    this.tensors = model.tensors;
    this.pipelines = pipelines;
    this.matvecs = matvecs;
    this.attention = attention;
    const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;
    const padded = new Uint8Array(Math.ceil(model.bytes.byteLength / 4) * 4);
    padded.set(new Uint8Array(model.bytes));
    this.file = device.createBuffer({size: padded.byteLength, usage});  // the model file, as it is
    device.queue.writeBuffer(this.file, 0, padded);
    const c = this.config;
    const act = (n) => device.createBuffer({size: n * 4, usage});
    // Activations of one token: x residual, xb normed/attention out, q, k, v, xb2, hb, hb2, logits,
    // and this position's RoPE table.
    this.a = {x: act(c.dim), xb: act(c.dim), xb2: act(c.dim), q: act(c.dim), k: act(c.kv_dim), v: act(c.kv_dim),
              hb: act(c.hidden_dim), hb2: act(c.hidden_dim), logits: act(c.vocab_size), rope: act(c.head_dim)};
    this.readback = device.createBuffer({size: Math.max(c.dim + 2 * c.kv_dim, c.vocab_size) * 4,
                                         usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
    this.dims = [];  // uniform buffers, one per dispatch of an encoder (reused every token)
    this.Reset();
  }

  /**
   * Forgets the sequence: the host KV master is emptied. kv: where the KV rows go instead of this
   * object's own f32 master and GpuKvAttention — {Append(layer, k, v) with Float32Arrays,
   * Attend(layer, q, position, out): GPU buffers q [n_heads][head_dim] in, out the same shape,
   * queued} (the page's: kvq's KvCache streaming into kv_device.js, web/worker.js) — or undefined.
   */
  Reset(kv) {
    const c = this.config;
    this.kv = kv;
    // Host master, per layer: K and V rows as kvq's f32 format stores them (one position per row).
    const rows = kv ? 0 : c.seq_len * c.kv_dim;
    this.k_rows = Array.from({length: c.n_layers}, () => new Float32Array(rows));
    this.v_rows = Array.from({length: c.n_layers}, () => new Float32Array(rows));
    this.positions = 0;
  }

  // One dispatch of an elementwise `kernel` (kKernels) with y = f(w, x); index: its uniform buffer.
  #Dispatch(encoder, index, kernel, w, x, y, rows, cols, offset = 0, pos = 0) {
    const device = this.device;
    if (!this.dims[index]) {
      this.dims[index] = device.createBuffer({size: 16, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST});
    }
    device.queue.writeBuffer(this.dims[index], 0, new Uint32Array([rows, cols, offset, pos]));
    // A pipeline's automatic layout has only the bindings its entry point uses.
    const buffers = [w, x, y, this.dims[index]];
    const group = device.createBindGroup({layout: this.pipelines[kernel].getBindGroupLayout(0),
      entries: kBindings[kernel].map((b) => ({binding: b, resource: {buffer: buffers[b]}}))});
    const pass = encoder.beginComputePass();
    pass.setPipeline(this.pipelines[kernel]);
    pass.setBindGroup(0, group);
    pass.dispatchWorkgroups(Math.ceil(Math.max(rows, cols) / 64));
    pass.end();
  }

  // y = W x for the tensor t ({type, at}) of rows × cols.
  #Matvec(encoder, index, t, x, y, rows, cols) {
    this.matvecs[t.type].Record(encoder, index, this.file, t.at, rows, cols, x, y);
  }

  // RMSNorm of x into y with the f32 weights of tensor t.
  #Norm(encoder, index, t, x, y) {
    const eps_bits = new Uint32Array(new Float32Array([this.config.norm_eps]).buffer)[0];
    this.#Dispatch(encoder, index, 'rmsnorm', this.file, x, y, this.config.dim, this.config.dim, t.at / 4, eps_bits);
  }

  async #Read(buffer, floats) {
    const encoder = this.device.createCommandEncoder();
    encoder.copyBufferToBuffer(buffer, 0, this.readback, 0, floats * 4);
    this.device.queue.submit([encoder.finish()]);
    await this.readback.mapAsync(GPUMapMode.READ, 0, floats * 4);
    const out = new Float32Array(this.readback.getMappedRange(0, floats * 4).slice(0));
    this.readback.unmap();
    return out;
  }

  /**
   * Runs `token` at the next position; returns the logits [vocab_size]. `attention_options` go to
   * GpuKvAttention.Run (window, device_budget_bytes).
   */
  async Forward(token, attention_options = {}) {
    const c = this.config, a = this.a, t = this.tensors, device = this.device;
    const pos = this.positions;
    if (pos >= c.seq_len) throw new Error(`position ${pos} is past the model's context of ${c.seq_len}`);
    if (!(token >= 0 && token < c.vocab_size)) throw new Error(`token ${token} is outside the vocabulary of ${c.vocab_size}`);
    device.queue.writeBuffer(a.rope, 0, RopeTable(pos, c.head_dim, c.rope_theta));
    let e = device.createCommandEncoder();
    // The embedding row, decoded from its type.
    const embd = t.token_embedding;
    this.matvecs[embd.type].Record(e, 0, this.file, embd.at + token * RowBytes(embd.type, c.dim), 1, c.dim, null, a.x,
                                   'dequantize');
    device.queue.submit([e.finish()]);
    for (let l = 0; l < c.n_layers; ++l) {
      const L = t.layers[l];
      e = device.createCommandEncoder();
      let i = 1;
      this.#Norm(e, i++, L.attn_norm, a.x, a.xb);
      this.#Matvec(e, i++, L.wq, a.xb, a.q, c.dim, c.dim);
      this.#Matvec(e, i++, L.wk, a.xb, a.k, c.kv_dim, c.dim);
      this.#Matvec(e, i++, L.wv, a.xb, a.v, c.kv_dim, c.dim);
      this.#Dispatch(e, i++, 'rope', a.rope, a.xb, a.q, c.dim, c.head_dim);
      this.#Dispatch(e, i++, 'rope', a.rope, a.xb, a.k, c.kv_dim, c.head_dim);
      if (this.kv) {
        // K and V back to the host, into kvq's cache (the master); q stays on the GPU, and the
        // attention output goes straight into xb.
        e.copyBufferToBuffer(a.k, 0, this.readback, 0, c.kv_dim * 4);
        e.copyBufferToBuffer(a.v, 0, this.readback, c.kv_dim * 4, c.kv_dim * 4);
        device.queue.submit([e.finish()]);
        await this.readback.mapAsync(GPUMapMode.READ, 0, 2 * c.kv_dim * 4);
        const kv = new Float32Array(this.readback.getMappedRange(0, 2 * c.kv_dim * 4).slice(0));
        this.readback.unmap();
        this.kv.Append(l, kv.subarray(0, c.kv_dim), kv.subarray(c.kv_dim));
        this.kv.Attend(l, a.q, pos, a.xb);
      } else {
        // q, k, v back to the host: K and V join the master; q goes to the attention.
        e.copyBufferToBuffer(a.q, 0, this.readback, 0, c.dim * 4);
        e.copyBufferToBuffer(a.k, 0, this.readback, c.dim * 4, c.kv_dim * 4);
        e.copyBufferToBuffer(a.v, 0, this.readback, (c.dim + c.kv_dim) * 4, c.kv_dim * 4);
        device.queue.submit([e.finish()]);
        await this.readback.mapAsync(GPUMapMode.READ, 0, (c.dim + 2 * c.kv_dim) * 4);
        const qkv = new Float32Array(this.readback.getMappedRange(0, (c.dim + 2 * c.kv_dim) * 4).slice(0));
        this.readback.unmap();
        this.k_rows[l].set(qkv.subarray(c.dim, c.dim + c.kv_dim), pos * c.kv_dim);
        this.v_rows[l].set(qkv.subarray(c.dim + c.kv_dim), pos * c.kv_dim);
        const rows = pos + 1;
        const out = await this.attention.Run(qkv.subarray(0, c.n_heads * c.head_dim), {
          k_blocks: new Uint8Array(this.k_rows[l].buffer, 0, rows * c.kv_dim * 4), k_residual: new Float32Array(0),
          v_blocks: new Uint8Array(this.v_rows[l].buffer, 0, rows * c.kv_dim * 4)}, rows, attention_options);
        device.queue.writeBuffer(a.xb, 0, out);
      }
      e = device.createCommandEncoder();
      i = 1;
      this.#Matvec(e, i++, L.wo, a.xb, a.xb2, c.dim, c.dim);
      this.#Dispatch(e, i++, 'add', a.rope, a.xb2, a.x, c.dim, c.dim);
      this.#Norm(e, i++, L.ffn_norm, a.x, a.xb);
      this.#Matvec(e, i++, L.w1, a.xb, a.hb, c.hidden_dim, c.dim);
      this.#Matvec(e, i++, L.w3, a.xb, a.hb2, c.hidden_dim, c.dim);
      this.#Dispatch(e, i++, 'swiglu', a.rope, a.hb2, a.hb, c.hidden_dim, c.hidden_dim);
      this.#Matvec(e, i++, L.w2, a.hb, a.xb, c.dim, c.hidden_dim);
      this.#Dispatch(e, i++, 'add', a.rope, a.xb, a.x, c.dim, c.dim);
      device.queue.submit([e.finish()]);
    }
    e = device.createCommandEncoder();
    this.#Norm(e, 1, t.rms_final, a.x, a.xb);
    this.#Matvec(e, 2, t.classifier, a.xb, a.logits, c.vocab_size, c.dim);
    device.queue.submit([e.finish()]);
    this.positions = pos + 1;
    return this.#Read(a.logits, c.vocab_size);
  }
}
