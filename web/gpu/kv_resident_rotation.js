// A "rot" spec on the resident path (kv_resident.js; FORMAT+rot, K or V or both): a block's new
// rows are copied into scratch and rotated there by kv_device.js's head ops (kvq's RotateHeads, the
// same bits) before the encoders read them, so the pages hold the C++ cache's bytes; with rotated
// keys the queries are rotated likewise (a copy), with rotated values the normalised output is
// unrotated in the attention state before the gather. All in the step's encoder.

import {HeadOpsWgsl} from './kv_device.js';
import {CachedPipeline} from './pipeline_cache.js';
import {SplitKvSpec} from './kv_resident_specs.js';

// A GPUBuffer or GPUBufferBinding as {buffer, offset}.
const From = (b) => b instanceof GPUBuffer ? {buffer: b, offset: 0} : {buffer: b.buffer, offset: b.offset ?? 0};

export class ResidentRotation {
  /**
   * The rotation of these {key, value} specs, or null when neither has rot. c: the step program's
   * config; signs: the page layout's rotation_signs ([head_dim] ±1, the module's); counts: the
   * cache's counts (head_op_dispatches counted there).
   */
  static Of(device, c, formats, signs, counts) {
    const [key, value] = [formats.key, formats.value].map((spec) => SplitKvSpec(spec).transforms.includes('rot'));
    if (!key && !value) return null;
    if (signs?.length !== c.head_dim) {
      throw new Error(`a rot spec needs the page layout's rotation_signs: ${c.head_dim} signs (got ${signs?.length})`);
    }
    return new ResidentRotation(device, c, key, value, signs, counts);
  }

  constructor(device, c, key, value, signs, counts) {
    Object.assign(this, {device, c, key, value, counts});
    this.signs = this.#Storage(c.head_dim * 4);  // [head_dim] f32
    device.queue.writeBuffer(this.signs, 0, new Float32Array(signs));
    const code = HeadOpsWgsl(c.head_dim);
    this.rotate = CachedPipeline(device, code, 'rotate');
    this.unrotate = CachedPipeline(device, code, 'unrotate');
    this.k = this.v = this.q = null;  // scratch: the block's rows and queries at its strides, rotated
  }

  #Storage(bytes) {
    return this.device.createBuffer({size: Math.max(16, Math.ceil(bytes / 4) * 4),
                                     usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC});
  }

  /**
   * RecordBlock's b with its rows (and, rotated keys, its queries) copied into the scratch at b's
   * strides (so its bindings keep their alignment) and the rotated tensors rotated there, in
   * `encoder` (no pass open): b's buffers are the step's. A row's padding up to the stride is a
   * whole number of head vectors (checked), rotated with them and never read. Outgrown scratch goes
   * to `retired` (destroyed after the submit of the commands that used it).
   */
  Rotated(encoder, b, uniforms, retired) {
    const c = this.c, n = b.n, d = c.head_dim, q_floats = c.n_heads * d;
    const span = (stride, floats) => (n - 1) * stride + floats;  // floats from row 0 to row n − 1's end
    for (const [what, stride] of [['K and V', b.kv_stride], ['query', b.q_stride]]) {
      if (stride % d) throw new Error(`rot: the block's ${what} rows are ${stride} floats apart, not whole heads of ${d}`);
    }
    const want = [span(b.kv_stride, c.kv_dim), span(b.kv_stride, c.kv_dim), span(b.q_stride, q_floats)];
    if (!this.k || want.some((floats, i) => floats * 4 > [this.k, this.v, this.q][i].size)) {
      for (const x of [this.k, this.v, this.q]) if (x) retired.push(x);
      [this.k, this.v, this.q] = want.map((floats) => this.#Storage(floats * 4));
    }
    const copy = (src, floats, dst) => {
      const from = From(src);
      encoder.copyBufferToBuffer(from.buffer, from.offset, dst, 0, floats * 4);
    };
    copy(b.k, want[0], this.k);  // both tensors, rotated or not: the encoders read K and V at one binding kind
    copy(b.v, want[1], this.v);
    const out = {...b, k: this.k, v: this.v};
    if (this.key) {
      copy(b.q, want[2], this.q);
      out.q = this.q;
    }
    const pass = encoder.beginComputePass();
    if (this.key) this.HeadOp(pass, 'rotate', this.q, want[2] / d, d, 0, uniforms);
    for (const [on, x, floats] of [[this.key, this.k, want[0]], [this.value, this.v, want[1]]]) {
      if (on) this.HeadOp(pass, 'rotate', x, floats / d, d, 0, uniforms);
    }
    pass.end();
    return out;
  }

  /**
   * kv_device.js's head op `entry` ('rotate' or 'unrotate') on `count` head vectors of x (a buffer
   * or binding), vector i at i · stride + offset floats, into `pass`, its parameters in `uniforms`.
   */
  HeadOp(pass, entry, x, count, stride, offset, uniforms) {
    const pipeline = this[entry];
    pass.setPipeline(pipeline);
    const entries = [x, this.signs, uniforms.Take(new Uint32Array([count, stride, offset, 0]))];
    pass.setBindGroup(0, this.device.createBindGroup({layout: pipeline.getBindGroupLayout(0),
      entries: entries.map((b, i) => ({binding: i, resource: b instanceof GPUBuffer ? {buffer: b} : b}))}));
    pass.dispatchWorkgroups(Math.ceil(count / 64));
    ++this.counts.head_op_dispatches;
  }

  Destroy() {
    for (const b of [this.signs, this.k, this.v, this.q]) b?.destroy();
  }
}
