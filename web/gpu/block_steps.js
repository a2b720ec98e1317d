// A block of tokens through the step program op by op (step_program.js's Steps, resident KV): each
// op is recorded for every token of the block before the next op, each token's activations a
// slice of a [tokens][stride] buffer per activation, bound at the token's offset, so the kernels
// are the per-token step's. Attention is query-blocked (kv_resident.js's RecordBlock): the block's
// K and V rows are encoded, then one attend dispatch per page window serves every token, each
// causally up to its own position (the bits of per-token attention). A recurrent layer's ops
// (hybrid_kernels.js) run token after token on its state, the recurrence's order. The ops after
// the last attention or recurrent op run only for the last token (nothing else reads them; a
// recurrent layer after them would need every token's). A matvec (any weight type and
// layout) is one matmul dispatch per piece of the weight for the block (matmul_kernels.js), after
// one dispatch quantising every token's activation into its slice where the type's matvec
// quantises: the matmul reads each weight block once per kMatmulTokens tokens and gives each
// token the matvec's bits. So a block gives the bits of as many token-by-token steps. `counts`
// tallies the weight dispatches: matmuls, block quantisations, the last token's matvecs.

import {MatmulGroups, WeightOpsBindings} from './step_kernels.js';

const kStorage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC;
// Floats per token slice: a multiple of 64 (256 bytes, the largest minStorageBufferOffsetAlignment).
const Stride = (n) => Math.ceil(n / 64) * 64;

export class BlockRecorder {
  /** program: the GpuStepProgram whose ops, buffers and kernels a block runs. */
  constructor(program) {
    this.p = program;
    const ops = program.program.ops;
    // The last op that carries a token's effect to later tokens: attention, or a recurrent state's.
    this.last_carried = ops.findLastIndex((op) => op.kind === 'attention' || op.state !== undefined);
    // Activations a token before the last needs: those the ops up to that one use.
    this.per_token = new Set();
    for (const op of ops.slice(0, this.last_carried + 1)) {
      for (const k of ['x', 'y', 'k', 'v', 'k_pre', 'gates', 'sel', 'gate']) if (op[k] !== undefined) this.per_token.add(op[k]);
    }
    this.per_token.add('x');  // head_rmsnorm, rope and bias name 'x' for an unused binding
    this.capacity = 0;
    this.buffers = null;
    this.counts = {matmul_dispatches: 0, quantize_dispatches: 0, matvec_dispatches: 0};
  }

  // Buffers for `n` tokens: per activation [n or 1][Stride], [n][64] u32 steps, [n][Stride(rotary)]
  // RoPE tables, the matmuls' [n][max cols] codes and [n][Stride(max cols / 32)] scales.
  #Grow(n) {
    if (n <= this.capacity) return;
    this.Destroy();
    const p = this.p, c = p.config, device = p.device;
    const Buffer = (floats) => device.createBuffer({size: Math.max(16, floats * 4), usage: kStorage});
    const max_cols = Math.max(...p.program.tensors.map((t) => t.cols));
    this.act = {};
    for (const [name, size] of Object.entries(p.program.buffers)) {
      this.act[name] = Buffer((this.per_token.has(name) ? n : 1) * Stride(size));
    }
    this.steps = Buffer(n * 64);
    this.rope = Buffer(n * Stride(c.rotary_dims));
    this.xq = Buffer(n * max_cols);
    this.xd = Buffer(n * Stride(Math.ceil(max_cols / 32)));
    this.capacity = n;
    this.records = [];  // [token][op]: that token's records (made on first use)
    this.matmuls = new Map();  // `${op}/${tokens}` -> its records
  }

  // Where token t keeps its activations, steps and RoPE table.
  #View(t) {
    const p = this.p, c = p.config;
    const buf = (name) => {
      const n = p.program.buffers[name], at = this.per_token.has(name) ? t * Stride(n) * 4 : 0;
      return {buffer: this.act[name], offset: at, size: n * 4};
    };
    return {buf, step: {buffer: this.steps, offset: t * 256, size: 8},
            rope: {buffer: this.rope, offset: t * Stride(c.rotary_dims) * 4, size: c.rotary_dims * 4}};
  }

  #Records(t, i) {
    this.records[t] ??= [];
    return (this.records[t][i] ??= this.p.RecordOp(this.p.program.ops[i], this.#View(t)) || []);
  }

  // The block's matvec op i over `n` tokens: where the type's matvec quantises its activation, one
  // dispatch quantising every token's into its slice (workgroups along y: the tokens), then one
  // matmul dispatch per piece of the weight.
  #Matmul(i, n) {
    const key = `${i}/${n}`;
    if (this.matmuls.has(key)) return this.matmuls.get(key);
    const p = this.p, op = p.program.ops[i], t = p.program.tensors[op.w];
    const x_stride = Stride(p.program.buffers[op.x]), xd_stride = Stride(t.cols / 32), out = [];
    const bindings = WeightOpsBindings(t.type).matmul, kernel = p.pipelines.weight_ops[`${t.type}/${t.layout}`].matmul;
    const quantized = bindings.includes(7);
    if (quantized) {
      const quantize = p.pipelines.ops.quantize;
      out.push({pipeline: quantize, groups: [Math.ceil(t.cols / 32 / 64), n], group: p.Group(quantize, [1, 3, 7, 8], {
        1: this.act[op.x], 3: p.Uniform([t.cols, x_stride, xd_stride, 0]), 7: this.xq, 8: this.xd})});
    }
    for (const piece of p.pieces_of(op.w)) {
      const dims = p.Uniform([piece.rows, t.cols, t.bytes / t.rows, piece.offset, piece.row0 + (op.y_offset ?? 0), n,
                              Stride(p.program.buffers[op.y]), xd_stride, x_stride]);
      out.push({pipeline: kernel, groups: MatmulGroups(t.type, piece.rows, n, p.matvec_kernel),
                group: p.Group(kernel, bindings, {0: p.chunks[piece.chunk], 1: this.act[op.x], 2: this.act[op.y],
                                                  3: dims, 7: this.xq, 8: this.xd})});
    }
    out.quantizes = quantized ? 1 : 0;
    out.matmuls = out.length - out.quantizes;
    this.matmuls.set(key, out);
    return out;
  }

  /**
   * Records `ids` (rows [n][token, position]) with RoPE tables `rope` ([n][rotary_dims]) at
   * positions pos.. into `encoder` (no pass open), kv: the step's cache view with kv.resident.
   * Returns {encoder (the one the commands end in), logits: {buffer, offset} of the last token's}.
   */
  Record(encoder, tokens, pos, kv, rope) {
    const p = this.p, c = p.config, device = p.device, n = tokens.length, ops = p.program.ops;
    this.#Grow(n);
    const steps = new Uint32Array(n * 64), tables = new Float32Array(n * Stride(c.rotary_dims));
    for (let t = 0; t < n; ++t) {
      steps.set([tokens[t], pos + t], t * 64);
      tables.set(rope.subarray(t * c.rotary_dims, (t + 1) * c.rotary_dims), t * Stride(c.rotary_dims));
    }
    device.queue.writeBuffer(this.steps, 0, steps);
    device.queue.writeBuffer(this.rope, 0, tables);
    let pass = encoder.beginComputePass();
    const Dispatch = (records) => {
      for (const r of records) {
        pass.setPipeline(r.pipeline);
        pass.setBindGroup(0, r.group);
        pass.dispatchWorkgroups(...r.groups);
      }
    };
    for (let i = 0; i < ops.length; ++i) {
      const op = ops[i];
      if (op.kind === 'attention') {
        pass.end();
        const sink = {encoder, flush: () => {
          p.Submit(sink.encoder);
          sink.encoder = device.createCommandEncoder();
        }};
        // Query-blocked: the block's K and V rows encoded (a call per page), then all n queries in
        // one pass over the pages (kv_resident.js's RecordBlock: the bits of n per-token Records).
        const v0 = this.#View(0);
        const S = (name) => Stride(p.program.buffers[name]);
        const k = kv.prerope ? op.k_pre : op.k;  // a prerope cache takes the keys before RoPE
        if (S(k) !== S(op.v)) throw new Error(`block: K and V rows of ${k} and ${op.v} differ in stride`);
        kv.resident.RecordBlock(sink, op.layer, pos, {n, k: v0.buf(k), v: v0.buf(op.v), kv_stride: S(k),
                                                      q: v0.buf(op.x), q_stride: S(op.x), out: v0.buf(op.y), out_stride: S(op.y)});
        encoder = sink.encoder;
        pass = encoder.beginComputePass();
        continue;
      }
      if (i > this.last_carried) {
        Dispatch(this.#Records(n - 1, i));
        if (op.kind === 'matvec') this.counts.matvec_dispatches += p.pieces_of(op.w).length;
        continue;
      }
      if (op.kind === 'matvec') {
        const records = this.#Matmul(i, n);
        Dispatch(records);
        this.counts.matmul_dispatches += records.matmuls;
        this.counts.quantize_dispatches += records.quantizes;
        continue;
      }
      for (let k = 0; k < n; ++k) Dispatch(this.#Records(k, i));
    }
    pass.end();
    const logits = this.#View(n - 1).buf('logits');
    return {encoder, logits: {buffer: logits.buffer, offset: logits.offset}};
  }

  Destroy() {
    if (!this.capacity) return;
    for (const b of [...Object.values(this.act), this.steps, this.rope, this.xq, this.xd]) b.destroy();
    this.capacity = 0;
  }
}
