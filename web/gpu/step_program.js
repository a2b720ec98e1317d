// Runs the WebAssembly module's step program (src/web/gpu_program.h: one decode step of the loaded
// model as ops over named buffers and a tensor table) on a WebGPU device with the kernels of
// step_kernels.js. The module defines the forward pass; this file only executes it. Weights are
// copied once from the module's memory into GPU buffers; bind groups and uniforms are made once,
// so a step writes only its token, position and RoPE table before encoding its ops.
//
// Limits: a storage binding holds at most maxStorageBufferBindingSize bytes (128 MiB by default)
// and a buffer at most maxBufferSize, so the weights go into "chunks" of at most the smaller of
// the two (WeightPlacement), a tensor whole where it fits and otherwise cut into row ranges
// ("pieces", each a matrix of its own: a matvec or embedding dispatch per piece), which is how a
// 151,936 × 2,048 embedding or classifier runs under the default binding limit. A tensor comes
// from the module's memory (its address), or, for a model loaded from its file's header alone
// (the table gives its file_offset), from the file itself, read a chunk at a time
// (options.read_file): such weights never pass through the module's memory. GpuLimitsFor
// gives the limits to request for a program, or the sentence refusing it before anything is
// allocated. The kernels decode f16 from its bits, so the shader-f16 feature is not needed.
//
// Submits and readbacks per step: the ops up to a layer's attention are encoded into one command
// encoder and submitted; that layer's new K and V rows come back to the module (its KvCache, the
// master copy, encodes them with kvq's codecs), the cache streams its pages to the GPU through
// kv_device.js, whose attention commands go into the encoder of the next span (no submit of its
// own while the layer's pages fit its slots); the next span follows. The last span ends with the
// argmax (or, at temperature > 0, sample_kernels.js's pick), whose id is the step's final readback. So a step is n_layers + 1 submits and as many
// readbacks (the K and V rows must reach the module's master cache before attention reads it).
// With a resident cache (kv_resident.js: formats with a WGSL encoder) the rows are encoded and
// attended on the GPU inside the one encoder instead: one submit and one readback per step, full
// pages reaching the master behind it; in its mixed mode (a context over the device budget) the
// pages it streams from the master add a submit each time the streaming slots are all written and
// another page comes (⌈pages / slots⌉ a step), and still one readback. `counts` tallies them (the device's too).
//
// A block of tokens (a prefill block: Steps) with a resident cache runs op by op in one command
// encoder (block_steps.js: each token's activations a slice of block buffers, the kernels the
// per-token step's, a matvec one matmul for the block): the bits of as many steps, one submit
// (plus the mixed mode's submits where its slots wrap) and one readback (the last token's id, and its logits when
// asked for). Without one (the stream path) a block's tokens run one after another, each token's
// id, position and RoPE table copied by commands in the encoder from block buffers.
//
// A hybrid's recurrent layers (hybrid_kernels.js) keep their state in the program's `states`:
// one GPU buffer each, read and written in place by every step (a block's tokens in order), zeroed
// by ResetStates for a new sequence; nothing of it is read back.
//
// A mixture-of-experts feed-forward (moe_kernels.js) is chosen on the GPU too: the router's top k
// go into a GPU buffer that the expert matvecs read their rows by, so routing adds no readback.

import {BlockRecorder} from './block_steps.js';
import {HybridDispatch, kHybridBindings, kHybridWgsl} from './hybrid_kernels.js';
import {AttendLanes} from './kv_attention.js';
import {ExpertMatvecBindings, ExpertMatvecGroups, ExpertMatvecWgsl, kMoeOpsBindings, kMoeOpsWgsl} from './moe_kernels.js';
import {CachedPipelines, SharedOnDevice} from './pipeline_cache.js';
import {CompileSampler, GpuSampler} from './sample_kernels.js';
import {kOpsBindings, kOpsWgsl, MatvecGroups, MatvecKernelFor, WeightOpsBindings, WeightOpsWgsl} from './step_kernels.js';
import {kGpuWeightTypes, kInterleavedTypes, WeightBlock} from './weight_types.js';

const kStorage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;
const Ceil4 = (n) => Math.ceil(n / 4) * 4;
// WebGPU's default limits: what a device has when nothing more is requested.
const kDefaultBindingBytes = 134217728;
const kDefaultBufferBytes = 268435456;

/**
 * Why the GPU kernels here cannot run `program` ('' when they can): a weight type or layout
 * they do not read, named with its tensor; or attention heads the attention kernel does not take
 * (kv_attention.js: a lane per head element, up to 256, and a lane per query head of a KV head).
 */
export function StepProgramWhyNot(program) {
  const c = program.config;
  if (c.n_kv_heads > 0 && c.head_dim > 256) {
    return `the GPU attention takes head_dim up to 256 (a lane per element; this model: ${c.head_dim})`;
  }
  if (c.n_kv_heads > 0 && c.n_heads / c.n_kv_heads > AttendLanes(c.head_dim)) {
    return `the GPU attention takes at most ${AttendLanes(c.head_dim)} query heads per KV head at head_dim ${c.head_dim} ` +
           `(a lane per query head; this model: ${c.n_heads / c.n_kv_heads})`;
  }
  for (const t of program.tensors) {
    if (!kGpuWeightTypes.includes(t.type)) {
      return `the GPU kernels do not read ${t.type.toUpperCase()} weights (tensor ${t.name}; they read ` +
             `${kGpuWeightTypes.map((s) => s.toUpperCase()).join(', ')})`;
    }
    if (t.layout !== 'rows' && !(t.layout === 'interleaved16' && kInterleavedTypes.includes(t.type))) {
      return `the GPU kernels do not read ${t.type.toUpperCase()} in the ${t.layout} layout (tensor ${t.name})`;
    }
  }
  return '';
}

/** "this qwen3 model (28 layers, dim 1024, vocabulary 151936)": how a refusal names the model. */
export function ProgramName(program) {
  const c = program.config;
  return `this ${c.arch} model (${c.n_layers} layers, dim ${c.dim}, vocabulary ${c.vocab_size})`;
}

// A tensor's bytes' place: its file offset (the file's weights) or its address (the module's),
// and its length (a tied classifier is the embedding's bytes; an expert's slice of a stacked
// tensor starts where the stack does but is not the stack).
export const TensorKey = (t) => `${t.file_offset !== undefined ? `file ${t.file_offset}` : t.address}+${t.bytes}`;
// Bytes read from a file per upload step: only this much is held outside the GPU at once.
const kUploadChunkBytes = 16 << 20;

/**
 * Where each weight goes in GPU buffers of at most `cap` bytes: {chunks: [bytes] per buffer,
 * pieces: Map TensorKey -> [{chunk, offset (bytes in the chunk), row0, rows, bytes}] (a tensor's
 * row ranges in order; one piece when it fits whole), why_not: '' or the tensor that cannot be
 * cut to fit (a row, or an interleaved group of 16 rows, over the cap)}. A tied classifier is
 * the embedding: each address (or file offset) placed once.
 */
export function WeightPlacement(program, cap) {
  const chunks = [], pieces = new Map();
  let why_not = '';
  const Put = (bytes) => {  // the chunk and offset of `bytes` more, first fit in the last chunk
    if (!chunks.length || chunks[chunks.length - 1] + Ceil4(bytes) > cap) chunks.push(0);
    const offset = chunks[chunks.length - 1];
    chunks[chunks.length - 1] += Ceil4(bytes);
    return {chunk: chunks.length - 1, offset};
  };
  for (const t of program.tensors) {
    if (pieces.has(TensorKey(t))) continue;
    const row_bytes = t.bytes / t.rows;
    // A piece starts at a row its layout can start from: any row, or a group of 16 (interleaved).
    const unit = t.layout === 'interleaved16' ? 16 : 1;
    const list = [];
    if (Ceil4(t.bytes) <= cap) {
      list.push({...Put(t.bytes), row0: 0, rows: t.rows, bytes: t.bytes});
    } else {
      const most = Math.floor(cap / (unit * row_bytes)) * unit;  // rows in a full piece
      if (most === 0 || Ceil4(Math.min(unit, t.rows) * row_bytes) > cap) {
        why_not ||= `tensor ${t.name} has ${unit > 1 ? 'groups of 16 rows' : 'rows'} of ` +
                    `${unit * row_bytes} bytes, which cannot be cut to fit`;
        continue;
      }
      for (let row0 = 0; row0 < t.rows;) {
        const rows = Math.min(most, t.rows - row0);
        if (Ceil4(rows * row_bytes) > cap) {  // an interleaved tail that does not fit beside its last group
          why_not ||= `tensor ${t.name}'s last rows cannot be cut to fit`;
          break;
        }
        list.push({...Put(rows * row_bytes), row0, rows, bytes: rows * row_bytes});
        row0 += rows;
      }
    }
    pieces.set(TensorKey(t), list);
  }
  return {chunks, pieces, why_not};
}

// Numbers the quantised activation holds: the widest matrix's input, or the chosen experts' down
// projections' inputs (one per expert a token runs).
function QuantizedFloats(program) {
  const moe = program.config.moe;
  return Math.max(...program.tensors.map((t) => t.cols), moe ? moe.n_experts_used * moe.expert_hidden_dim : 0);
}

// Bytes of the step program's buffers besides the weights, by what they hold.
function OtherBuffers(program) {
  const c = program.config;
  const out = Object.entries(program.buffers).map(([name, n]) => [`the ${name} activation`, n * 4]);
  for (const [name, n] of Object.entries(program.states || {})) out.push([`the ${name} recurrent state`, n * 4]);
  out.push(['the readback buffer', Math.max(2 * c.kv_dim * 4, 4 + c.vocab_size * 4)],
           ['the quantised activation', QuantizedFloats(program) * 4]);
  return out;
}

/**
 * The limits a device needs to run `program` given the adapter's (or forced) `limits`
 * ({maxStorageBufferBindingSize, maxBufferSize}): {requiredLimits, requiredFeatures, why_not}.
 * why_not names the limit and the model when something cannot fit (name: how to call the model;
 * default ProgramName); then nothing should be allocated.
 */
export function GpuLimitsFor(program, limits, name = ProgramName(program)) {
  const binding = Number(limits.maxStorageBufferBindingSize), buffer = Number(limits.maxBufferSize);
  const cap = Math.min(binding, buffer);
  const limit_name = binding <= buffer ? 'maxStorageBufferBindingSize' : 'maxBufferSize';
  const Refuse = (what) => ({why_not: `${name} cannot run on this WebGPU device: ${what}, over its ${limit_name} ` +
                                      `of ${cap.toLocaleString('en')} bytes`});
  for (const [what, bytes] of OtherBuffers(program)) {
    if (Ceil4(bytes) > cap) return Refuse(`${what} needs ${Ceil4(bytes).toLocaleString('en')} bytes`);
  }
  const placed = WeightPlacement(program, cap);
  if (placed.why_not) return Refuse(placed.why_not);
  const largest = Math.max(16, ...placed.chunks, ...OtherBuffers(program).map(([, b]) => Ceil4(b)));
  return {requiredLimits: {maxStorageBufferBindingSize: Math.max(kDefaultBindingBytes, largest),
                           maxBufferSize: Math.max(kDefaultBufferBytes, largest)},
          requiredFeatures: [], why_not: '', placement: placed};
}

export class GpuStepProgram {
  /**
   * program: the module's kvq_web_gpu_program JSON, parsed; heap: the module's HEAPU8 (the tensor
   * table's addresses index it); rope(pos): Float32Array [rotary_dims / 2][2] for a position
   * (kvq_web_gpu_rope); kv_device: the GpuKvDevice attention streams through (for its counts).
   * options: {max_binding_bytes, max_buffer_bytes}: limits lower than the device's to plan with
   * (tests: a small model's tensors split as a large one's are), model_name for a refusal, and
   * read_file: async (offset, bytes) => Uint8Array [bytes], the model file's bytes, for tensors
   * given by file_offset; matvec: 'lanes' or 'rows' (default MatvecKernelFor(device): the same bits
   * either way). Refuses (throws, naming the limit and the model) before compiling or allocating
   * anything.
   */
  static async Create(device, program, heap, rope, kv_device, options = {}) {
    const why_not = StepProgramWhyNot(program);
    if (why_not) throw new Error(why_not);
    const limits = {
      maxStorageBufferBindingSize: Math.min(device.limits.maxStorageBufferBindingSize, options.max_binding_bytes ?? Infinity),
      maxBufferSize: Math.min(device.limits.maxBufferSize, options.max_buffer_bytes ?? Infinity)};
    const fit = GpuLimitsFor(program, limits, options.model_name);
    if (fit.why_not) throw new Error(fit.why_not);
    // Shared with every other step program on this device that compiles the same WGSL (pipeline_cache.js).
    const compile = (code, entries, what) => CachedPipelines(device, code, entries, what);
    const ops = await compile(kOpsWgsl, Object.keys(kOpsBindings), 'step ops');
    const hybrid = program.ops.some((op) => kHybridBindings[op.kind]) ?
        await compile(kHybridWgsl, Object.keys(kHybridBindings), 'hybrid layer ops') : {};
    // The MoE ops (moe_kernels.js) where the program has them; the expert matvec in the modules of
    // the stacked expert tensors' types.
    const Key = (t) => `${t.type}/${t.layout}`;
    const moe = program.ops.some((op) => op.kind === 'moe_route') ?
        await compile(kMoeOpsWgsl, Object.keys(kMoeOpsBindings), 'MoE ops') : {};
    const expert_keys = new Set(program.ops.filter((op) => op.kind === 'expert_matvec').map((op) => Key(program.tensors[op.w])));
    const weight_ops = {};  // by `${type}/${layout}`
    const matvec = options.matvec ?? MatvecKernelFor(device);
    for (const t of program.tensors) {
      const key = Key(t);
      if (weight_ops[key] || !(t.rows > 1 || t.type !== 'f32')) continue;
      weight_ops[key] = expert_keys.has(key) ?
          await compile(WeightOpsWgsl(t.type, t.layout, matvec) + ExpertMatvecWgsl(matvec, WeightBlock(t.type).quantized_activation), ['matvec', 'embed', 'matmul', 'expert_matvec'],
                        `${key} weights`) :
          await compile(WeightOpsWgsl(t.type, t.layout, matvec), ['matvec', 'embed', 'matmul'], `${key} weights`);
    }
    if (program.tensors.some((t) => t.file_offset !== undefined) && !options.read_file) {
      throw new Error('the step program reads its weights from the model file, and no read_file was given');
    }
    const step = new GpuStepProgram(device, program, heap, rope, kv_device, {ops, weight_ops, hybrid, moe}, fit.placement, matvec);
    // Temperature > 0 (Steps' options.sample): the GPU sampler ends the step instead of the argmax.
    step.sampler = options.sample_table ? new GpuSampler(device, await SharedOnDevice(device, CompileSampler), program.config.vocab_size,
                                                         options.sample_table, step.out_id) : null;
    await step.#UploadFromFile(options.read_file);
    return step;
  }

  constructor(device, program, heap, rope, kv_device, pipelines, placement, matvec) {
    this.matvec_kernel = matvec;  // 'lanes' or 'rows' (step_kernels.js's MatvecKernelFor)
    this.device = device;
    this.program = program;
    this.config = program.config;
    this.rope = rope;
    this.kv_device = kv_device;
    this.counts = {steps: 0, submits: 0, readbacks: 0, device_submits: 0};
    // The weights: each distinct tensor once, in its pieces (WeightPlacement), 4-byte aligned.
    this.chunks = placement.chunks.map((bytes) => device.createBuffer({size: Math.max(16, bytes), usage: kStorage}));
    this.weight_bytes = placement.chunks.reduce((a, b) => a + b, 0);
    this.placement = placement;
    this.pieces_of = (t) => placement.pieces.get(TensorKey(program.tensors[t]));
    for (const t of program.tensors) {
      const pieces = placement.pieces.get(TensorKey(t));
      if (pieces.written || t.file_offset !== undefined) continue;  // the file's: #UploadFromFile
      pieces.written = true;
      const row_bytes = t.bytes / t.rows;
      for (const p of pieces) {
        device.queue.writeBuffer(this.chunks[p.chunk], p.offset, heap.buffer, heap.byteOffset + t.address + p.row0 * row_bytes,
                                 Ceil4(p.bytes));
      }
    }
    // Activations [f32 elements] by name (program.buffers), the step's [token, position], the RoPE
    // table, the argmax id, the quantised activation [QuantizedFloats] codes and [/ 32] scales.
    this.buffers = {};
    for (const [name, n] of Object.entries(program.buffers)) this.buffers[name] = this.#Buffer(n * 4);
    // The recurrent layers' states [f32 elements] by name: one whatever the tokens in flight.
    this.states = {};
    for (const [name, n] of Object.entries(program.states || {})) this.states[name] = this.#Buffer(n * 4);
    const quantized_floats = QuantizedFloats(program);
    this.step = this.#Buffer(8);
    this.rope_table = this.#Buffer(this.config.rotary_dims * 4);
    // A block's tokens' [n][token, position] and [n][rotary_dims] RoPE tables (grown to the block).
    this.block_capacity = 0;
    this.block_steps = null;
    this.block_rope = null;
    this.out_id = this.#Buffer(4);
    this.xq = this.#Buffer(quantized_floats * 4);
    this.xd = this.#Buffer(Math.ceil(quantized_floats / 32) * 4);
    const c = this.config;
    const kv_floats = 2 * c.kv_dim;
    this.staging = device.createBuffer({size: Math.max(kv_floats * 4, 4 + c.vocab_size * 4),
                                        usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
    this.pipelines = pipelines;  // {ops, weight_ops, hybrid, moe}
    this.uniforms = new Map();  // op uniforms by their words: read-only, so shared by every record
    // Each op recorded once: [{pipeline, group, groups: [x, y]}], and the attention ops apart.
    this.records = program.ops.map((op) => this.RecordOp(op));
    this.block = new BlockRecorder(this);  // a block's ops op by op (kv.resident blocks)
  }

  // The tensors given by file_offset, read from the model file kUploadChunkBytes at a time into
  // their pieces (each distinct tensor once: a tied classifier is the embedding's bytes).
  async #UploadFromFile(read_file) {
    const done = new Set();
    for (const t of this.program.tensors) {
      const key = TensorKey(t);
      if (t.file_offset === undefined || done.has(key)) continue;
      done.add(key);
      const row_bytes = t.bytes / t.rows;
      for (const p of this.placement.pieces.get(key)) {
        for (let at = 0; at < p.bytes; at += kUploadChunkBytes) {
          const n = Math.min(kUploadChunkBytes, p.bytes - at);
          let bytes = await read_file(t.file_offset + p.row0 * row_bytes + at, n);
          if (n % 4) {  // writeBuffer takes whole words: the piece's tail padded (its slot is Ceil4)
            const padded = new Uint8Array(Ceil4(n));
            padded.set(bytes);
            bytes = padded;
          }
          this.device.queue.writeBuffer(this.chunks[p.chunk], p.offset + at, bytes);
        }
      }
    }
  }

  /** Frees the GPU buffers (the weights and activations). */
  Destroy() {
    for (const b of this.chunks) b.destroy();
    for (const b of Object.values(this.buffers)) b.destroy();
    for (const b of Object.values(this.states)) b.destroy();
    for (const b of [this.step, this.rope_table, this.out_id, this.xq, this.xd, this.staging]) b.destroy();
    this.block_steps?.destroy();
    this.block_rope?.destroy();
    for (const b of this.uniforms.values()) b.destroy();
    this.block.Destroy();
    this.sampler?.Destroy();
  }

  /** Zeroes the recurrent states (a new sequence): queued before any later step's commands. */
  ResetStates() {
    for (const [name, n] of Object.entries(this.program.states || {})) {
      this.device.queue.writeBuffer(this.states[name], 0, new Float32Array(n));
    }
  }

  #Buffer(bytes) {
    return this.device.createBuffer({size: Math.max(16, Ceil4(bytes)), usage: kStorage});
  }

  /** A uniform buffer holding `words` (u32), shared by every record that needs the same words. */
  Uniform(words) {
    const key = words.join(',');
    let b = this.uniforms.get(key);
    if (!b) {
      b = this.device.createBuffer({size: Math.max(16, Math.ceil(words.length / 4) * 16),
                                    usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST});
      this.device.queue.writeBuffer(b, 0, new Uint32Array(words));
      this.uniforms.set(key, b);
    }
    return b;
  }

  /** A bind group of `pipeline`: per binding a GPUBuffer or a GPUBufferBinding. */
  Group(pipeline, bindings, resources) {
    return this.device.createBindGroup({layout: pipeline.getBindGroupLayout(0), entries: bindings.map((b) => (
      {binding: b, resource: resources[b] instanceof GPUBuffer ? {buffer: resources[b]} : resources[b]}))});
  }

  /**
   * One dispatch (or two: a quantised matvec's activation first; or one per piece of a split
   * weight) of `op`: [{pipeline, group, groups}]. view: where a block's token keeps its
   * activations ({buf(name), step, rope}: GPUBufferBindings; block_steps.js), or the step's own.
   */
  RecordOp(op, view = null) {
    const c = this.config, ops = this.pipelines.ops, weight_ops = this.pipelines.weight_ops;
    const B = view ? new Proxy({}, {get: (_, name) => view.buf(name)}) : this.buffers;
    const eps_bits = new Uint32Array(new Float32Array([c.norm_eps]).buffer)[0];
    const base = {5: view ? view.rope : this.rope_table, 6: this.out_id, 7: this.xq, 8: this.xd,
                  4: view ? view.step : this.step};
    const pieces = op.w !== undefined ? this.pieces_of(op.w) : [{chunk: 0, offset: 0}];
    const weights = this.chunks[pieces[0].chunk];  // a vector (norm, bias) is one piece
    const simple = (entry, words, x, y, groups) => {
      const pipeline = ops[entry];
      return [{pipeline, groups, group: this.Group(pipeline, kOpsBindings[entry],
                                                    {...base, 0: weights, 1: B[x], 2: B[y], 3: this.Uniform(words)})}];
    };
    const word = () => pieces[0].offset / 4;
    const t = op.w !== undefined ? this.program.tensors[op.w] : null;
    switch (op.kind) {
      case 'embed':
      case 'matvec': {
        const kernels = weight_ops[`${t.type}/${t.layout}`];
        const entry = op.kind;
        const row_bytes = t.bytes / t.rows;
        const out = [];
        if (entry === 'matvec' && WeightOpsBindings(t.type).matvec.includes(7)) {  // quantised activation
          out.push(...simple('quantize', [t.cols, 0, 0, 0], op.x, op.y, [Math.ceil(t.cols / 32 / 64), 1]));
        }
        for (const p of pieces) {  // rows p.row0 .. p.row0 + p.rows of the weight, each its own matrix
          const dims = this.Uniform([p.rows, t.cols, row_bytes, p.offset, p.row0 + (op.y_offset ?? 0), 0, 0, 0, 0]);
          const group = this.Group(kernels[entry], WeightOpsBindings(t.type)[entry],
                                    {...base, 0: this.chunks[p.chunk], 1: B[op.x], 2: B[op.y], 3: dims});
          const groups = entry === 'embed' ? [Math.ceil(t.cols / 64), 1] : MatvecGroups(t.type, p.rows, this.matvec_kernel);
          out.push({pipeline: kernels[entry], group, groups});
        }
        return out;
      }
      case 'rmsnorm': return simple('rmsnorm', [op.n, word(), eps_bits, 0], op.x, op.y, [1, 1]);
      case 'head_rmsnorm': return simple('head_rmsnorm', [c.head_dim, word(), eps_bits, 0], 'x', op.y, [op.heads, 1]);
      case 'rope': {
        const pairs = (op.n / c.head_dim) * (c.rotary_dims / 2);
        return simple('rope', [op.n, c.head_dim, c.rotary_dims, c.rope_pairing === 'adjacent' ? 0 : 1], 'x', op.y,
                      [Math.ceil(pairs / 64), 1]);
      }
      case 'add': return simple('add', [op.n, 0, 0, 0], op.x, op.y, [Math.ceil(op.n / 64), 1]);
      case 'bias': return simple('bias', [op.n, word(), 0, 0], 'x', op.y, [Math.ceil(op.n / 64), 1]);
      case 'copy': return simple('copy', [op.n, 0, 0, 0], op.x, op.y, [Math.ceil(op.n / 64), 1]);
      case 'swiglu': return simple('swiglu', [op.n, 0, 0, 0], op.x, op.y, [Math.ceil(op.n / 64), 1]);
      case 'argmax': return simple('argmax', [op.n, 0, 0, 0], op.x, 'x', [1, 1]);
      case 'expert_matvec': {  // as a matvec, each rank's rows chosen by the ids in sel
        const kernel = weight_ops[`${t.type}/${t.layout}`].expert_matvec;
        const quantized = WeightOpsBindings(t.type).matvec.includes(7);
        const x_stride = op.x_stride ?? 0, xd_stride = x_stride ? t.cols / 32 : 0;
        const out = [];
        if (quantized) {  // each rank's input (or the one input) quantised, rank i's codes at i · cols
          out.push(...simple('quantize', [t.cols, x_stride, xd_stride, 0], op.x, op.y,
                             [Math.ceil(t.cols / 32 / 64), x_stride ? op.top_k : 1]));
        }
        for (const p of pieces) {
          const dims = this.Uniform([p.rows, t.cols, t.bytes / t.rows, p.offset, p.row0, op.top_k, op.n, xd_stride, x_stride]);
          const group = this.Group(kernel, ExpertMatvecBindings(quantized),
                                   {...base, 0: this.chunks[p.chunk], 1: B[op.x], 2: B[op.y], 3: dims, 9: B[op.sel]});
          out.push({pipeline: kernel, group, groups: ExpertMatvecGroups(this.matvec_kernel, quantized, op.n, op.top_k)});
        }
        return out;
      }
      case 'moe_route':
      case 'moe_combine': {
        const pipeline = this.pipelines.moe[op.kind];
        const resources = op.kind === 'moe_route' ? {2: B[op.x], 9: B[op.sel]} : {1: B[op.x], 2: B[op.y], 9: B[op.sel], 10: B[op.gate]};
        return [{pipeline, groups: [op.kind === 'moe_route' ? 1 : Math.ceil(op.n / 64), 1],
                 group: this.Group(pipeline, kMoeOpsBindings[op.kind], {...resources, 3: this.Uniform([op.n, op.top_k, 0, 0])})}];
      }
      case 'attention': return null;  // the cache's, at run time
      default: {
        const bindings = kHybridBindings[op.kind];
        if (!bindings) throw new Error(`step program: unknown op '${op.kind}'`);
        const {words, groups} = HybridDispatch(op, c, op.w !== undefined ? word() : 0);
        const pipeline = this.pipelines.hybrid[op.kind];
        const resource = {0: () => weights, 1: () => B[op.x], 2: () => B[op.y], 3: () => this.Uniform(words),
                          9: () => this.states[op.state], 10: () => B[op.gates]};
        const group = this.Group(pipeline, bindings, Object.fromEntries(bindings.map((b) => [b, resource[b]()])));
        return [{pipeline, group, groups}];
      }
    }
  }

  /** Submits `encoder`'s commands, counted. */
  Submit(encoder) {
    this.device.queue.submit([encoder.finish()]);
    ++this.counts.submits;
  }

  // after_submit: called between the submit and the wait (a resident cache maps its written-back pages).
  async #ReadBack(encoder, bytes, after_submit = () => {}) {
    this.Submit(encoder);
    after_submit();
    await this.staging.mapAsync(GPUMapMode.READ, 0, bytes);
    const out = this.staging.getMappedRange(0, bytes).slice(0);
    this.staging.unmap();
    ++this.counts.readbacks;
    return out;
  }

  /**
   * One decode step: `token` at position `pos` through every op; kv: the module's cache for the
   * attention ops ({prerope, Append(layer, k, v) with Float32Arrays, Attend(layer, q, pos, out):
   * GPU buffers q [n_heads·head_dim] in, out the same shape}), or with kv.resident (a
   * kv_resident.js GpuResidentKv) the cache's working set on the GPU: then the whole step is one
   * submit and one readback. Returns {token: the argmax, logits: Float32Array [vocab] when
   * options.logits}; with options.sample (Uint32Array [6], ModuleSampler's words) the token is
   * the GPU sampler's pick instead, still the one id read back (options.adjust: ModuleSampler's
   * Adjustment, applied to the logits first; options.logits reads them back unadjusted).
   */
  async Step(token, pos, kv, options = {}) { return this.Steps([token], pos, kv, options); }

  /**
   * `tokens` at positions pos, pos + 1, ... one after another, as that many Steps would run them
   * (the same commands per token, so the same bits); returns the last token's {token, logits}.
   * With kv.resident: one submit (and one each time mixed mode's streaming slots wrap) and one readback
   * for the whole block. kv(p): the cache's view at position p (Step's kv) for each token.
   */
  async Steps(tokens, pos, kv_at, options = {}) {
    const c = this.config, device = this.device, B = this.buffers, n = tokens.length;
    const kv_of = typeof kv_at === 'function' ? kv_at : () => kv_at;
    for (const token of tokens) {
      if (!(token >= 0 && token < c.vocab_size)) throw new Error(`token ${token} is outside the vocabulary of ${c.vocab_size}`);
    }
    if (!n) throw new Error('a block of no tokens');
    const device_submits = this.kv_device ? this.kv_device.submits : 0;
    this.#BlockBuffers(n);
    const ids = new Uint32Array(2 * n);  // [n][token, position]
    const rope = new Float32Array(n * c.rotary_dims);  // [n][rotary_dims]
    for (let i = 0; i < n; ++i) {
      ids.set([tokens[i], pos + i], 2 * i);
      rope.set(this.rope(pos + i), i * c.rotary_dims);
    }
    let encoder = device.createCommandEncoder();
    let kv = kv_of(pos), logits = {buffer: B.logits, offset: 0};
    if (n > 1 && kv.resident) {  // op by op (block_steps.js)
      ({encoder, logits} = this.block.Record(encoder, tokens, pos, kv, rope));
    } else {
      device.queue.writeBuffer(this.block_steps, 0, ids);
      device.queue.writeBuffer(this.block_rope, 0, rope);
      for (let t = 0; t < n; ++t) {
        const p = pos + t;
        kv = kv_of(p);
        encoder.copyBufferToBuffer(this.block_steps, 8 * t, this.step, 0, 8);
        encoder.copyBufferToBuffer(this.block_rope, 4 * t * c.rotary_dims, this.rope_table, 0, 4 * c.rotary_dims);
        encoder = await this.#RecordToken(encoder, p, kv);
      }
    }
    if (options.sample) {  // the last token's pick by kvq's chain under these words (sample_kernels.js)
      if (!this.sampler) throw new Error('step program: a sampled step, and no options.sample_table was given at Create');
      this.sampler.Record(encoder, logits.buffer, logits.offset, options.sample, options.adjust);
    }
    encoder.copyBufferToBuffer(this.out_id, 0, this.staging, 0, 4);
    if (options.logits) encoder.copyBufferToBuffer(logits.buffer, logits.offset, this.staging, 4, c.vocab_size * 4);
    kv.resident?.BeforeSubmit();
    const bytes = await this.#ReadBack(encoder, options.logits ? 4 + c.vocab_size * 4 : 4,
                                       () => kv.resident?.Submitted());
    this.counts.steps += n;
    if (this.kv_device) this.counts.device_submits += this.kv_device.submits - device_submits;
    return {token: new Uint32Array(bytes, 0, 1)[0], logits: options.logits ? new Float32Array(bytes, 4) : null};
  }

  // The block buffers for n tokens.
  #BlockBuffers(n) {
    if (n <= this.block_capacity) return;
    this.block_steps?.destroy();
    this.block_rope?.destroy();
    this.block_capacity = n;
    this.block_steps = this.#Buffer(8 * n);
    this.block_rope = this.#Buffer(4 * n * this.config.rotary_dims);
  }

  // Every op of one token at `pos` into `encoder` (no pass open); returns the encoder the token's
  // commands end in (the stream path submits and reads back at each attention; a mixed-mode cache
  // may submit before reusing a slot).
  async #RecordToken(encoder, pos, kv) {
    const c = this.config, device = this.device, B = this.buffers;
    let pass = encoder.beginComputePass();
    for (let i = 0; i < this.program.ops.length; ++i) {
      const op = this.program.ops[i];
      if (op.kind === 'attention' && kv.resident) {  // encoded and attended on the GPU: no readback
        pass.end();
        // A mixed-mode cache submits the commands so far before writing a streaming slot again.
        const sink = {encoder, flush: () => {
          this.Submit(sink.encoder);
          sink.encoder = device.createCommandEncoder();
        }};
        // A prerope cache takes the keys before RoPE (it ropes them as it reads them).
        kv.resident.Record(sink, op.layer, B[kv.prerope ? op.k_pre : op.k], B[op.v], B[op.x], pos, B[op.y]);
        encoder = sink.encoder;
        pass = encoder.beginComputePass();
        continue;
      }
      if (op.kind === 'attention') {
        pass.end();
        const k = kv.prerope ? op.k_pre : op.k;
        encoder.copyBufferToBuffer(B[k], 0, this.staging, 0, c.kv_dim * 4);
        encoder.copyBufferToBuffer(B[op.v], 0, this.staging, c.kv_dim * 4, c.kv_dim * 4);
        const rows = new Float32Array(await this.#ReadBack(encoder, 2 * c.kv_dim * 4));
        kv.Append(op.layer, rows.subarray(0, c.kv_dim), rows.subarray(c.kv_dim));
        // The attention's commands go into the encoder the next ops continue (one submit for
        // both) unless the KV device must submit to reuse a slot (it then hands back a new one).
        const sink = {encoder: device.createCommandEncoder()};
        if (this.kv_device) this.kv_device.sink = sink;
        try {
          kv.Attend(op.layer, B[op.x], pos, B[op.y]);
        } finally {
          if (this.kv_device) this.kv_device.sink = null;
        }
        encoder = sink.encoder;
        pass = encoder.beginComputePass();
        continue;
      }
      for (const r of this.records[i]) {
        pass.setPipeline(r.pipeline);
        pass.setBindGroup(0, r.group);
        pass.dispatchWorkgroups(...r.groups);
      }
    }
    pass.end();
    return encoder;
  }
}

