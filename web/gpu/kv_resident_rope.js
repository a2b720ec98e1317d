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
//
// Mixed mode (a context over the device budget): the table would grow with the context, so it is a
// ring of the resident pages' rows instead, resident_pages pages: page i's rows at ring page
// i mod resident_pages, written when a block first reads page i resident (Cover). A queue write
// lands before the whole command buffer, so a ring page must not be written again while commands
// not yet submitted read it: the page a new page replaces was evicted by the step that made the
// new one, and read only by earlier, submitted steps, as the runner cuts a block where a page would
// be evicted (gpu_engine.js's #BlockLength; a block's later page replacing a ring page its earlier
// queries read throws). A streamed page's rows (Rows: the host copy) go beside its streaming slot
// (kv_resident.js: the slots' cos/sin buffer, slot j's from row j·P), written as they are. Either way a window binds a buffer whose row `Row(first)`
// is its first position's.
// No readback and no submit of its own.

export class ResidentRopeTable {
  /**
   * device: the GPUDevice; rotary_dims: the floats of a position's row ([rotary_dims / 2][cos,
   * sin]); P: positions per page (the table is filled a page at a time); rope(pos):
   * Float32Array [rotary_dims] of the module's cos/sin at pos; retire(buffer): destroys a buffer
   * after the submit of the commands recorded with it. ring (mixed mode): {pages, buffer: GPU
   * [pages][P][rotary_dims] f32 (the caller's, counted in its KV bytes)}; null: a table by position.
   */
  constructor(device, rotary_dims, P, rope, retire, ring = null) {
    this.device = device;
    this.rotary_dims = rotary_dims;
    this.P = P;
    this.rope = rope;
    this.retire = retire;
    this.ring = ring;
    this.ring_page = ring ? new Array(ring.pages).fill(-1) : null;  // the page each ring page holds
    this.used = new Set();  // ring pages read by commands recorded since the last submit
    this.filled = 0;  // positions [0, filled) have their rows in `host` (and, without a ring, on the GPU)
    this.host = new Float32Array(0);  // [capacity positions][rotary_dims]: the module's rows
    this.buffer = ring?.buffer ?? null;  // GPU: the table [capacity positions][rotary_dims] f32, or the ring
    this.bytes = ring ? ring.buffer.size : 0;  // of `buffer`
  }

  // The host rows of positions [0, want) (want: whole pages); without a ring the GPU table too.
  #Host(want) {
    const d = this.rotary_dims;
    if (want <= this.filled) return;
    if (want * d > this.host.length) {
      const positions = Math.max(want, 2 * this.host.length / d);  // doubling: the copies cost O(positions)
      const host = new Float32Array(positions * d);
      host.set(this.host.subarray(0, this.filled * d));
      this.host = host;
      if (!this.ring) {
        if (this.buffer) this.retire(this.buffer);
        this.bytes = host.byteLength;
        this.buffer = this.device.createBuffer({size: Math.max(16, this.bytes),
                                                usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST});
        if (this.filled) this.device.queue.writeBuffer(this.buffer, 0, host, 0, this.filled * d);
      }
    }
    for (let p = this.filled; p < want; ++p) this.host.set(this.rope(p), p * d);
    if (!this.ring) this.device.queue.writeBuffer(this.buffer, this.filled * d * 4, this.host, this.filled * d, (want - this.filled) * d);
    this.filled = want;
  }

  /**
   * Rows for the pages a block reads resident, first_page up to position end's (end exclusive):
   * without a ring every position before end (whole pages); written before the next submit.
   */
  Cover(first_page, end) {
    const P = this.P, d = this.rotary_dims, last = Math.ceil(end / P) - 1;
    this.#Host((last + 1) * P);
    if (!this.ring) return;
    for (let i = first_page; i <= last; ++i) {
      const at = i % this.ring.pages;
      if (this.ring_page[at] !== i) {
        if (this.used.has(at)) {
          throw new Error(`the rope ring's page ${at} holds page ${this.ring_page[at]}, read by commands not yet submitted, ` +
                          `and page ${i} would replace it: the blocks since the submit read more pages than the ring holds`);
        }
        this.device.queue.writeBuffer(this.buffer, at * P * d * 4, this.host, i * P * d, P * d);
        this.ring_page[at] = i;
      }
      this.used.add(at);
    }
  }

  /** The row of `buffer` that holds position pos (covered): pos, or its place in the ring. */
  Row(pos) { return this.ring ? (Math.floor(pos / this.P) % this.ring.pages) * this.P + pos % this.P : pos; }

  /** Page i's rows (covered): Float32Array [P][rotary_dims], a view of the host copy. */
  Rows(i) { return this.host.subarray(i * this.P * this.rotary_dims, (i + 1) * this.P * this.rotary_dims); }

  /** After a submit: the ring's pages may be written again. */
  Submitted() { this.used.clear(); }

  Destroy() { if (!this.ring) this.buffer?.destroy(); }
}
