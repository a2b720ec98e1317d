// The KV working set resident on the GPU, for formats with a WGSL encoder (kv_formats.js's
// kEncoderFormats): each layer's pages live in GPU buffers in exactly the master's page layout
// (KvCache::LayerPageLayout: K blocks from byte 0, V blocks from value_offset). A step encodes
// the layer's new K and V rows on the GPU into its tail page and attends over the layer's pages
// with kv_device.js's kernels, all recorded into the step's one command encoder: no readback and
// no submit of its own. A page that fills is copied to a staging buffer in the same submit and
// reaches the module's master (kvq_web_kv_append_pages) when that copy maps, after the step
// returned (write-behind), in page order; so the master holds every full page and the GPU the
// tail, and a lost device costs at most the tail (the runner replays it, gpu_engine.js).
//
// Why one submit works: queue writes (writeBuffer) land before the command buffer they precede
// runs, so everything a layer writes by queue is in buffers of its own (its pages' params, its
// encoders' params), and the attention state shared by the layers is reset by a copy recorded in
// the encoder, in command order. The window kernels are the KV device's: the same instructions
// for any split of the positions into windows, so the bits equal the streamed path's.

import {AttendWgsl, NormaliseWgsl} from './kv_device.js';
import {GpuKvEncoder, kEncoderFormats} from './kv_formats.js';

const Ceil4 = (n) => Math.ceil(n / 4) * 4;
// kvq's kDefaultPositionChunk (kvq/attention.h), which the module gives the KV device too.
const kPositionChunk = 2048;

/**
 * Why the resident path cannot hold a cache of these specs ('' when it can): both tensors need a
 * WGSL encoder and no transform (a spec with '+' or '-' carries one).
 */
export function ResidentWhyNot(kv_k, kv_v) {
  for (const [what, spec] of [['key', kv_k], ['value', kv_v]]) {
    if (!kEncoderFormats.includes(spec)) {
      return `the ${what} spec "${spec}" has no GPU encoder (encoders: ${kEncoderFormats.join(', ')})`;
    }
  }
  return '';
}

export class GpuResidentKv {
  /**
   * device: the GPUDevice; c: the step program's config; layout: kvq_web_kv_page_layout's
   * {page_bytes, value_offset, page_positions} (the same for every layer: one spec for all);
   * formats: {key, value} format names; append(layer, Uint8Array page): hands a full page to the
   * master (throws on failure).
   */
  constructor(device, c, layout, formats, append) {
    const P = layout.page_positions;
    this.device = device;
    this.c = c;
    this.P = P;
    this.page_bytes = layout.page_bytes;
    this.value_offset = layout.value_offset;
    this.k_block = layout.value_offset / P;
    this.v_block = (layout.page_bytes - layout.value_offset) / P;
    if (!Number.isInteger(this.k_block) || !Number.isInteger(this.v_block)) {
      throw new Error(`a page of ${layout.page_bytes} bytes (V from ${layout.value_offset}) is not ${P} rows of K and V blocks`);
    }
    this.append = append;
    const shape = {n_kv_heads: c.n_kv_heads, head_dim: c.head_dim};
    this.layers = Array.from({length: c.n_layers}, () => ({
      pages: [],  // [{buffer [page_bytes], params (uniform, 80 bytes)}]
      k: new GpuKvEncoder(device, formats.key, {...shape, block_bytes: this.k_block}),
      v: new GpuKvEncoder(device, formats.value, {...shape, block_bytes: this.v_block})}));
    const s = {head_dim: c.head_dim, n_kv_heads: c.n_kv_heads, q_per_kv: c.n_heads / c.n_kv_heads,
               k_block_bytes: this.k_block, v_block_bytes: this.v_block, key_format: formats.key,
               value_format: formats.value, pre_rope: false, rotary_dims: c.rotary_dims, rope_pairing: c.rope_pairing};
    const attend_module = device.createShaderModule({code: AttendWgsl(s)});
    const norm_module = device.createShaderModule({code: NormaliseWgsl(c.head_dim)});
    const Pipe = (module, entryPoint) => device.createComputePipeline({layout: 'auto', compute: {module, entryPoint}});
    this.attend = Pipe(attend_module, 'attend');
    this.fold = Pipe(attend_module, 'fold');
    this.finish = Pipe(norm_module, 'finish');
    this.gather = Pipe(norm_module, 'gather');
    // Attention state: per query head [m, l, acc[head_dim]] in regions (AttendWgsl): the open
    // chunk's, the merged chunks', one per piece a page window can start (ceil(P / chunk) + 1).
    this.region_bytes = c.n_heads * (c.head_dim + 2) * 4;
    this.max_pieces = Math.ceil(P / kPositionChunk) + 1;
    this.state = this.#Storage((2 + this.max_pieces) * this.region_bytes);
    // Regions 0 and 1 as a layer starts them (m = −inf; l, acc 0), copied in before each layer.
    const initial = new Float32Array(2 * this.region_bytes / 4);
    for (let h = 0; h < 2 * c.n_heads; ++h) initial[h * (c.head_dim + 2)] = -Infinity;
    this.initial = this.#Storage(initial.byteLength);
    device.queue.writeBuffer(this.initial, 0, initial);
    // LlamaModel's attention scale, as f32: 1 / sqrtf(head_dim) (f64 then rounded: the same bits).
    this.scale = Math.fround(1 / Math.fround(Math.sqrt(c.head_dim)));
    this.staged = [];        // pages copied out in the step being recorded: [{layer, staging}]
    this.behind = Promise.resolve();  // the write-backs, in order
    this.broken = null;      // the first write-back that failed (later ones are then not appended)
    this.counts = {write_backs: 0, kv_bytes: 0};
  }

  #Storage(bytes) {
    return this.device.createBuffer({size: Math.max(16, Ceil4(bytes)),
                                     usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC});
  }

  #NewPage(L) {
    const page = {buffer: this.#Storage(this.page_bytes),
                  params: this.device.createBuffer({size: 80, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST})};
    this.counts.kv_bytes += page.buffer.size;
    L.pages.push(page);
    return page;
  }

  /** Master page `bytes` (Uint8Array [page_bytes]) as layer `layer`'s next resident page (after a lost device). */
  Restore(layer, bytes) {
    const page = this.#NewPage(this.layers[layer]);
    const padded = new Uint8Array(Ceil4(bytes.byteLength));  // writeBuffer takes whole words
    padded.set(bytes);
    this.device.queue.writeBuffer(page.buffer, 0, padded);
  }

  /**
   * Records layer `layer` at position `pos` into `encoder` (no compute pass open): the rows k, v
   * (GPU buffers [n_kv_heads][head_dim] f32) encoded into the tail page, then out = attention of
   * q ([n_heads][head_dim]) over positions 0..pos (out the same shape as q).
   */
  Record(encoder, layer, k, v, q, pos, out) {
    const L = this.layers[layer], P = this.P, c = this.c;
    const row = pos % P, index = Math.floor(pos / P);
    if (index !== L.pages.length - (row === 0 ? 0 : 1)) {
      throw new Error(`layer ${layer} holds ${L.pages.length} resident pages; position ${pos} needs ${index + 1}`);
    }
    const tail = row === 0 ? this.#NewPage(L) : L.pages[index];
    L.k.Record(encoder, k, 1, tail.buffer, row * this.k_block);
    L.v.Record(encoder, v, 1, tail.buffer, this.value_offset + row * this.v_block);
    encoder.copyBufferToBuffer(this.initial, 0, this.state, 0, this.initial.size);
    const pass = encoder.beginComputePass();
    for (let i = 0; i <= index; ++i) {  // one window per page, in position order
      const page = L.pages[i], first = i * P, rows = i < index ? P : row + 1;
      const pieces = Math.floor((first + rows - 1) / kPositionChunk) - Math.floor(first / kPositionChunk) + 1;
      const first_fresh = first > 0 && first % kPositionChunk === 0 ? 1 : 0;
      const p = new ArrayBuffer(80), u = new Uint32Array(p);
      // AttendWgsl's Params: rows, first_pos, query_pos, scale; K blocks/head/residual offsets and
      // counts; V's; no injected bug; chunk, pieces, first_fresh, one query.
      u.set([rows, first, pos, 0, 0, 0, 0, 0, rows, this.value_offset, 0, 0, 0, rows, 0, 0, kPositionChunk, pieces,
             first_fresh, 1]);
      new Float32Array(p, 12, 1)[0] = this.scale;
      this.device.queue.writeBuffer(page.params, 0, p);
      pass.setPipeline(this.attend);
      pass.setBindGroup(0, this.#Group(this.attend, [page.buffer, page.buffer, q, this.state, page.params]));
      pass.dispatchWorkgroups(Math.ceil(c.n_kv_heads * pieces / 64));
      if (pieces > 1 || first_fresh) {
        pass.setPipeline(this.fold);
        pass.setBindGroup(0, this.device.createBindGroup({layout: this.fold.getBindGroupLayout(0), entries: [
          {binding: 3, resource: {buffer: this.state}}, {binding: 4, resource: {buffer: page.params}}]}));
        pass.dispatchWorkgroups(Math.ceil(c.n_heads / 64));
      }
    }
    pass.setPipeline(this.finish);
    pass.setBindGroup(0, this.#Group(this.finish, [{buffer: this.state, size: 2 * this.region_bytes}]));
    pass.dispatchWorkgroups(Math.ceil(c.n_heads / 64));
    pass.setPipeline(this.gather);
    pass.setBindGroup(0, this.#Group(this.gather, [{buffer: this.state, size: this.region_bytes}, out]));
    pass.dispatchWorkgroups(Math.ceil(c.n_heads / 64));
    pass.end();
    if (row === P - 1) {  // the page is full: copied out in this submit, appended once mapped
      const staging = this.device.createBuffer({size: tail.buffer.size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
      encoder.copyBufferToBuffer(tail.buffer, 0, staging, 0, tail.buffer.size);
      this.staged.push({layer, staging});
    }
  }

  // entries: per binding a GPUBuffer or a GPUBufferBinding.
  #Group(pipeline, entries) {
    return this.device.createBindGroup({layout: pipeline.getBindGroupLayout(0),
      entries: entries.map((b, i) => ({binding: i, resource: b instanceof GPUBuffer ? {buffer: b} : b}))});
  }

  /** After the step's submit: maps this step's full pages and queues their appends, in order. */
  Submitted() {
    for (const {layer, staging} of this.staged) {
      const mapped = staging.mapAsync(GPUMapMode.READ);
      this.behind = this.behind.then(async () => {
        try {
          await mapped;
          if (this.broken) return;
          this.append(layer, new Uint8Array(staging.getMappedRange(), 0, this.page_bytes));
          ++this.counts.write_backs;
        } catch (e) {
          this.broken ??= e;
        } finally {
          if (staging.mapState === 'mapped') staging.unmap();
          staging.destroy();
        }
      });
    }
    this.staged = [];
  }

  /** Waits for every queued write-back; the first failure, or null. */
  async Drain() {
    await this.behind;
    return this.broken;
  }

  Destroy() {
    for (const L of this.layers) {
      for (const p of L.pages) {
        p.buffer.destroy();
        p.params.destroy();
      }
    }
    this.state.destroy();
    this.initial.destroy();
  }
}
