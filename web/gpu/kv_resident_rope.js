// Prerope keys on the resident path (kv_resident.js): kvq's "prerope" key transform stores keys as
// they are before RoPE and ropes them as attention reads them, by the cos/sin of each row's
// position. The resident pages hold those pre-RoPE rows (the step program hands the resident cache
// its `k_pre` rows), encoded by the same WGSL encoders, so the GPU's pages and the master's stay
// byte for byte kvq's; the attends rotate each key as they read it with kv_device.js's attend
// kernel, the streamed path's (its pre_rope k_value: the same instructions, so the same bits).
//
// The streamed path hands that kernel each window's cos/sin (the module's RopeCosSin, for the
// window's positions). Here one table per cache holds them by position: row p is the module's
// cos/sin at position p (`rope(p)`: the step program's source, kvq_web_gpu_rope, which is
// RopeCosSin with the model's RoPE parameters, the cache's key_rope), and a window binds the whole
// table with its first position as the kernel's rope_row (no binding offset: WebGPU's 256-byte
// offset alignment would not fit a window starting at any position). The table is filled a page
// of positions at a time as the steps reach them, by queue writes, before the submit of the step
// that first reads them: a row, once written, never changes, so commands recorded earlier in the
// same command buffer read the same values. Outgrown, a table is replaced by one twice the size
// filled from the host copy, the old one destroyed after the submit (kv_resident.js's retired).
// No readback and no submit of its own.

export class ResidentRopeTable {
  /**
   * device: the GPUDevice; rotary_dims: the floats of a position's row ([rotary_dims / 2][cos,
   * sin]); P: positions per page (the table is filled a page at a time); rope(pos):
   * Float32Array [rotary_dims] of the module's cos/sin at pos; retire(buffer): destroys a buffer
   * after the submit of the commands recorded with it.
   */
  constructor(device, rotary_dims, P, rope, retire) {
    this.device = device;
    this.rotary_dims = rotary_dims;
    this.P = P;
    this.rope = rope;
    this.retire = retire;
    this.filled = 0;  // positions [0, filled) have their rows, on the GPU and in `host`
    this.host = new Float32Array(0);  // [capacity positions][rotary_dims]: what the GPU table holds
    this.buffer = null;  // GPU [capacity positions][rotary_dims] f32
    this.bytes = 0;      // of `buffer`
  }

  /** Rows for positions [0, end) at least (whole pages): written before the next submit. */
  Cover(end) {
    const want = Math.ceil(end / this.P) * this.P, d = this.rotary_dims;
    if (want <= this.filled) return;
    if (want * d > this.host.length) {
      const positions = Math.max(want, 2 * this.host.length / d);  // doubling: the copies cost O(positions)
      const host = new Float32Array(positions * d);
      host.set(this.host.subarray(0, this.filled * d));
      this.host = host;
      if (this.buffer) this.retire(this.buffer);
      this.bytes = host.byteLength;
      this.buffer = this.device.createBuffer({size: Math.max(16, this.bytes),
                                              usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST});
      if (this.filled) this.device.queue.writeBuffer(this.buffer, 0, host, 0, this.filled * d);
    }
    for (let p = this.filled; p < want; ++p) this.host.set(this.rope(p), p * d);
    this.device.queue.writeBuffer(this.buffer, this.filled * d * 4, this.host, this.filled * d, (want - this.filled) * d);
    this.filled = want;
  }

  Destroy() { this.buffer?.destroy(); }
}
