// Uniform parameters for commands recorded into one command buffer that runs several tokens (a
// prefill block, web/gpu/gpu_engine.js): a queue write to one uniform buffer lands before the
// whole command buffer runs, so a buffer written once per token would give every token the last
// token's values. Each recorded dispatch instead takes its own slot of an arena (a binding at an
// offset of a shared uniform buffer), filled on the CPU while recording and written to the GPU in
// one queue write per buffer just before the submit (Write). After a submit the slots are free
// again (Reset): a queue write issued after a submit lands after that submit's commands ran.

// Bytes per arena buffer: 256 slots of WebGPU's default minUniformBufferOffsetAlignment.
const kArenaBytes = 65536;

export class UniformArena {
  /** device: the GPUDevice; slot_bytes: the largest parameter block any caller takes. */
  constructor(device, slot_bytes) {
    this.device = device;
    this.align = device.limits.minUniformBufferOffsetAlignment;
    this.stride = Math.ceil(slot_bytes / this.align) * this.align;
    this.per_buffer = Math.floor(kArenaBytes / this.stride);
    this.buffers = [];  // [{buffer: GPUBuffer [kArenaBytes], host: ArrayBuffer [kArenaBytes]}]
    this.used = 0;      // slots taken since the last Reset
    this.written = 0;   // of those, slots already written to the GPU
    this.taken = 0;     // slots taken in all (a count for tests)
  }

  /**
   * A slot holding `bytes` (an ArrayBuffer or typed array, at most slot_bytes): the GPUBufferBinding
   * to bind. The GPU sees it once Write runs before the submit.
   */
  Take(bytes) {
    const src = ArrayBuffer.isView(bytes) ? new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength)
                                          : new Uint8Array(bytes);
    if (src.byteLength > this.stride) throw new Error(`uniform arena: ${src.byteLength} bytes over a slot of ${this.stride}`);
    const b = Math.floor(this.used / this.per_buffer), offset = (this.used % this.per_buffer) * this.stride;
    if (b === this.buffers.length) {
      this.buffers.push({host: new ArrayBuffer(kArenaBytes), buffer: this.device.createBuffer(
          {size: kArenaBytes, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST})});
    }
    new Uint8Array(this.buffers[b].host, offset, this.stride).fill(0).set(src);
    ++this.used;
    ++this.taken;
    return {buffer: this.buffers[b].buffer, offset, size: src.byteLength};
  }

  /** Writes the slots taken since the last Write to the GPU (call before submitting them). */
  Write() {
    while (this.written < this.used) {
      const b = Math.floor(this.written / this.per_buffer), first = this.written % this.per_buffer;
      const last = Math.min(this.used - b * this.per_buffer, this.per_buffer);  // slots of buffer b taken
      this.device.queue.writeBuffer(this.buffers[b].buffer, first * this.stride, this.buffers[b].host,
                                    first * this.stride, (last - first) * this.stride);
      this.written = b * this.per_buffer + last;
    }
  }

  /** After the submit of every slot taken: they may be taken again. */
  Reset() {
    if (this.written !== this.used) throw new Error('uniform arena: reset with slots never written');
    this.used = 0;
    this.written = 0;
  }

  Destroy() {
    for (const b of this.buffers) b.buffer.destroy();
    this.buffers = [];
  }
}
