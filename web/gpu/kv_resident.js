// The KV working set resident on the GPU, for formats with a WGSL encoder (kv_formats.js's
// kEncoderFormats and kGroupKeyEncoderFormats): each layer's pages live in GPU buffers in exactly the master's page layout
// (KvCache::LayerPageLayout: K blocks from byte 0, V blocks from value_offset). A step encodes
// the layer's new K and V rows on the GPU into its tail page and attends over the layer's pages
// with kv_device.js's kernels, all recorded into the step's one command encoder: no readback and
// no submit of its own. A page that fills is copied to a staging buffer in the same submit and
// reaches the module's master (kvq_web_kv_append_pages) when that copy maps, after the step
// returned (write-behind), in page order; so the master holds every full page and the GPU the
// tail, and a lost device costs at most the tail (the runner replays it, gpu_engine.js).
//
// Why one submit works: queue writes (writeBuffer) land before the command buffer they precede
// runs, so every dispatch's parameters take a slot of their own in a uniform arena
// (uniform_arena.js, written once before the submit: BeforeSubmit), which also lets one command
// buffer hold several tokens (a prefill block), and the attention state shared by the layers is
// reset by a copy recorded in the encoder, in command order. The window kernels are the KV device's: the same instructions
// for any split of the positions into windows, so the bits equal the streamed path's.
//
// A layer's pages lie in a pool (kv_resident_pool.js; with sinkN, those after the pages holding
// sinks), so a run of pages is one window, its position chunks in parallel. In mixed mode (below)
// the pool is a ring of the resident pages' slots (not with sinkN), a run that does not wrap one
// window.
//
// Mixed mode (a context over the device budget, seed 000's architecture): each layer keeps its
// newest `resident_pages` pages on the GPU (the tail among them, encoded there as above); an older
// page is evicted once its write-back has landed in the master, and the step's attention reads it
// from the master (read(layer, page)) through the streaming slots (mixed.stream_slots, chosen from
// the budget: kv_resident_specs.js's StreamSlotsFor), in position order before the resident pages,
// all into the one state: the same rows in the same order as the whole-context run, so the same
// bits. The slots are taken in turn and lie side by side, so a run of a layer's streamed pages in
// consecutive slots is one window (StreamWindows), its position chunks in parallel. A slot written
// again within a step would lose its first page (queue writes land before the whole command
// buffer), so once the slots are all written the step's commands so far are submitted first
// (sink.flush): readbacks stay one a token, submits grow with the streamed pages over the slots.
//
// Keys in groups (int4-kivi, int2-kivi, fp8-e4m3: kv_formats.js's kGroupKeyEncoderFormats) are encoded a group of
// G = 32 rows at a time: a layer's newest group's K rows are kept f32 in its `residual` buffer
// ([G][n_kv_heads][head_dim], row r of the group at r), copied there in the step's encoder, and the
// group is encoded into its page when its last row arrives (as kvq's KvCache does: the query at
// that position reads the group encoded). A query reads the rows as they were at its position (a
// group not yet whole in f32): a block is cut where a group completes (SubBlocks), so within a
// piece every query sees the same groups encoded, and the page holding the residual group is
// attended as two windows: its encoded rows, then the residual rows (K from the residual buffer, V
// from the page), the same bits as one window. In mixed mode that page is the tail, always
// resident: a streamed page holds only whole groups, so its master bytes are its one window.
//
// A sinkN / resN spec keeps rows in f32 as kvq's cache does (kv_resident_rows.js: a ring of f32
// rows per layer, sinks beside their page's bytes, blocks cut where a row ages out); its full pages
// reach the master as f32 rows, which the master encodes itself. In mixed mode a page is evicted
// only once the master encoded all its rows (MasterPagesToEvict: the residual's pages stay), and a
// streamed page's sinks go into its slot after its bytes, kept from its write-behind (L.sinks).
//
// A "rot" spec (FORMAT+rot, K or V or both; not with KIVI keys; kv_resident_rotation.js): the
// block's new rows are rotated in scratch before the encoder reads them, so the pages hold the C++
// cache's bytes; rotated keys rotate the queries too, rotated values unrotate the output.
//
// A "prerope" key spec (kv_resident_rope.js): the step program hands the cache the keys before
// RoPE (its k_pre rows), which the pages hold encoded as the master's do, and the attends rope
// each key as they read it (kv_device.js's kernel with pre_rope) by the cos/sin of its position,
// read from a table of the module's cos/sin by position that grows a page at a time; in mixed mode
// a ring of the resident pages' rows, a streamed page's rows written beside its slot (the slots'
// cos/sin buffer, [slots][P][rotary_dims], slot j's rows from row j·P).
//
// Mixed mode's GPU bytes are kv_resident_specs.js's MixedCosts (the slots, each layer's resident
// pages and f32 rows, the cos/sin ring), all counted in counts.kv_bytes as they are made.

import {AttendWgsl, kAttendParamsBytes, NormaliseWgsl} from './kv_device.js';
import {GpuKvEncoder, KeyRowsPerBlock} from './kv_formats.js';
import {ResidentRopeTable} from './kv_resident_rope.js';
import {ResidentRotation} from './kv_resident_rotation.js';
import {PagePool, PoolWindows, StreamWindows} from './kv_resident_pool.js';
import {PageWindows, ResidentRows, RowsPieces, RowsPoolFrom, RowsSpecOf, SubBlocks} from './kv_resident_rows.js';
import {kMinStreamSlots, PageBufferBytes, RotationSlots, SplitKvSpec} from './kv_resident_specs.js';
import {CachedPipeline} from './pipeline_cache.js';
import {UniformArena} from './uniform_arena.js';

export {BlockUniformSlots} from './kv_resident_rows.js';
export {KvPathOf, kMinStreamSlots, MixedCosts, PageBufferBytes, ResidentPagesFor, ResidentWhyNot, RotationSlots,
        SplitKvSpec} from './kv_resident_specs.js';

const Ceil4 = (n) => Math.ceil(n / 4) * 4;
// A GPUBuffer or GPUBufferBinding as a binding from its offset to the buffer's end, `floats` on.
const From = (b, floats = 0) => b instanceof GPUBuffer ? {buffer: b, offset: floats * 4}
                                                        : {buffer: b.buffer, offset: (b.offset ?? 0) + floats * 4};
// kvq's kDefaultPositionChunk (kvq/attention.h), which the module gives the KV device too.
const kPositionChunk = 2048;

export class GpuResidentKv {
  /**
   * device: the GPUDevice; c: the step program's config; layout: kvq_web_kv_page_layout's
   * {page_bytes, value_offset, page_positions, rotation_signs (with a rot spec)} (the same for
   * every layer: one spec for all); formats: {key, value} specs (ResidentWhyNot's);
   * append(layer, Uint8Array page): hands a full page to the master (throws on failure). mixed:
   * {resident_pages (per layer, ≥ 1), read(layer, page) → Uint8Array [page_bytes] of the master's
   * page (valid until the next call)} for a context over the device budget; omitted: every page
   * stays resident. rope(pos): Float32Array [rotary_dims] of the module's cos/sin at pos (the
   * step program's), needed by a prerope key spec (its keys are given before RoPE). options:
   * {segment_pages: pooled pages per attend window at most (tests: windows that cut position chunks),
   * pool_grows: false under a device budget (kv_resident_pool.js: pools made at full size)}.
   */
  constructor(device, c, layout, formats, append, mixed = null, rope = null, options = {}) {
    const P = layout.page_positions;
    this.device = device;
    this.c = c;
    this.P = P;
    this.page_bytes = layout.page_bytes;
    this.value_offset = layout.value_offset;
    this.group = KeyRowsPerBlock(SplitKvSpec(formats.key).format);  // K rows per block: 32 for KIVI and fp8-e4m3, else 1
    this.k_block = layout.key_block_bytes;  // the codecs': the regions and the page are padded (fp8-e4m3: to 64 bytes)
    this.v_block = layout.value_block_bytes;
    if (!(P / this.group * this.k_block <= layout.value_offset && layout.value_offset + P * this.v_block <= layout.page_bytes)) {
      throw new Error(`a page of ${layout.page_bytes} bytes (V from ${layout.value_offset}) does not hold ${P} rows of K blocks of ` +
                      `${layout.key_block_bytes} bytes (${this.group} rows each) and V blocks of ${layout.value_block_bytes}`);
    }
    this.append = append;
    this.resident_pages = mixed ? mixed.resident_pages : Infinity;
    if (!(this.resident_pages >= 1)) throw new Error(`a mixed-mode KV cache needs at least 1 resident page per layer (got ${this.resident_pages})`);
    this.read = mixed?.read;
    this.counts = {write_backs: 0, kv_bytes: 0, kv_bytes_now: 0, peak_kv_bytes: 0, streamed_bytes: 0,
                   streamed_pages: 0, streamed_rope_bytes: 0, streamed_sink_bytes: 0, evictions: 0, flushes: 0, attend_dispatches: 0,
                   encode_dispatches: 0, head_op_dispatches: 0};
    this.prerope = SplitKvSpec(formats.key).transforms.includes('prerope');
    if (this.prerope && !rope) throw new Error(`the prerope key spec "${formats.key}" needs the module's cos/sin (rope)`);
    const rope_page = P * c.rotary_dims * 4;  // prerope: a page's cos/sin rows, [P][rotary_dims] f32
    this.rows_spec = RowsSpecOf(formats.key, formats.value);  // sinkN / resN: kv_resident_rows.js
    this.rows = this.rows_spec && new ResidentRows(device, c, P, this.page_bytes, this.value_offset, [this.group, 1],
                                                   this.rows_spec, (bytes) => this.#NewBuffers(bytes).buffer);
    if (mixed && this.resident_pages < this.rows?.least) throw new Error(`a mixed-mode sinkN / resN cache needs ${this.rows.least} resident pages per layer`);
    const shape = {n_kv_heads: c.n_kv_heads, head_dim: c.head_dim};
    this.rotation = ResidentRotation.Of(device, c, formats, layout.rotation_signs, this.counts);
    this.rotation_slots = RotationSlots(formats.key, formats.value);  // per layer and block
    // prerope: the module's cos/sin (kv_resident_rope.js): [positions][rotary_dims] f32 by position,
    // or in mixed mode a ring [resident_pages][P][rotary_dims] f32 of the resident pages' rows.
    const ring = mixed && this.prerope ? {pages: this.resident_pages,
                                          buffer: this.#NewBuffers(this.resident_pages * rope_page).buffer} : null;
    this.rope_table = this.prerope ? new ResidentRopeTable(device, c.rotary_dims, P, rope, (b) => this.retired.push(b), ring) : null;
    formats = {key: SplitKvSpec(formats.key).format, value: SplitKvSpec(formats.value).format};
    // A layer's pages in a pool (kv_resident_pool.js), so a run of them is one attend window,
    // segments as large as one storage binding takes. sinkN: the pages holding sinks (before
    // pool_from) keep buffers of their own, the sinks after their bytes. Mixed mode: the pool is a
    // ring of resident_pages slots, made at once (what MixedCosts counts); with sinkN no pool (a
    // sink page beside a full ring would hold a page more than the budget), a buffer per page.
    this.stride = PageBufferBytes(this.page_bytes);
    this.pool_from = this.rows ? RowsPoolFrom(P, this.rows_spec) : 0;
    const binding = Math.min(device.limits.maxStorageBufferBindingSize, device.limits.maxBufferSize);
    const segment_pages = Math.max(1, Math.min(Math.floor(binding / this.stride), options.segment_pages ?? Infinity));
    // Pages an attend window runs through at most, as BlockUniformSlots counts a block's windows
    // (mixed mode: a window per page, an upper bound: its runs depend on where the ring wraps).
    this.segment_pages = mixed ? 1 : segment_pages;
    const pool = mixed && this.pool_from ? null : {stride: this.stride, segment_pages, ring: mixed ? this.resident_pages : 0,
      max_pages: layout.max_positions > 0 ? Math.max(1, Math.ceil(layout.max_positions / P) - this.pool_from) : Infinity,
      grows: options.pool_grows ?? true,
      storage: (bytes) => this.#NewBuffers(bytes).buffer, free: (buffer, deferred) => {
        if (!deferred) return this.#FreeBuffers({buffer});
        this.retired_kv_bytes += buffer.size;  // still counted: it lives until the submit
        this.retired.push(buffer);
      }};
    // The streaming slots (mixed mode: mixed.stream_slots of them, kv_resident_specs.js's
    // StreamSlotsFor): [{buffer, offset: the slot's bytes in it, rope (prerope): the buffer of its
    // cos/sin rows [P][rotary_dims] f32, rope_row: its first row there}]. With a pool, side by side
    // in one buffer [slots][stride] and one [slots][P][rotary_dims] f32 of cos/sin rows, so a run of
    // streamed pages in consecutive slots is one window (StreamWindows); with sinkN a buffer each
    // (page 0's PageBytes, its sinks after) and a window each. next_slot: the next slot to write
    // (0 once the commands that read the slots are submitted).
    // (A buffer each, not joined, also where the slots side by side would exceed one binding: pages
    // over 64 MiB.)
    const n_slots = mixed ? Math.max(kMinStreamSlots, mixed.stream_slots ?? kMinStreamSlots) : 0;
    this.slots_joined = Boolean(pool) && n_slots * this.stride <= binding;
    if (this.slots_joined && n_slots) {
      const buffer = this.#NewBuffers(n_slots * this.stride).buffer, rope = this.prerope ? this.#NewBuffers(n_slots * rope_page).buffer : null;
      this.slots = Array.from({length: n_slots}, (_, j) => ({buffer, offset: j * this.stride, rope, rope_row: j * P}));
    } else {
      this.slots = Array.from({length: n_slots}, () => ({
        ...this.#NewBuffers(this.rows ? this.rows.PageBytes(0) : this.page_bytes),
        rope: this.prerope ? this.#NewBuffers(rope_page).buffer : null, rope_row: 0}));
    }
    this.next_slot = 0;
    this.layers = Array.from({length: c.n_cache_layers}, () => ({
      pages: [],  // [{buffer, offset: the page's bytes [page_bytes] in it}, or null once evicted]
      pool: pool && new PagePool(pool),
      landed: 0,  // pages of this layer whose write-back reached the master (they fill in order)
      held: 0,    // positions recorded
      // [G][n_kv_heads][head_dim] f32: the newest group's K rows (KIVI); with sinkN / resN the ring instead
      residual: this.group > 1 && !this.rows ? this.#NewBuffers(this.group * c.kv_dim * 4).buffer : null,
      ring: this.rows?.NewRing(),  // sinkN / resN: [2][ring positions][n_kv_heads][head_dim] f32
      sinks: [],  // mixed sinkN: per landed page with sinks its sink area (ResidentRows.SinkArea), to stream
      k: new GpuKvEncoder(device, formats.key, {...shape, block_bytes: this.k_block}, 'k'),
      v: new GpuKvEncoder(device, formats.value, {...shape, block_bytes: this.v_block}, 'v')}));
    // A block encodes at most a page of rows per call; its calls share the scale buffers.
    for (const L of this.layers) for (const e of [L.k, L.v]) e.Reserve(P);
    const s = {head_dim: c.head_dim, n_kv_heads: c.n_kv_heads, q_per_kv: c.n_heads / c.n_kv_heads,
               k_block_bytes: this.k_block, v_block_bytes: this.v_block, key_format: formats.key,
               value_format: formats.value, pre_rope: this.prerope, rotary_dims: c.rotary_dims, rope_pairing: c.rope_pairing,
               pages: pool ? {k_region: P / this.group * this.k_block, v_region: P * this.v_block, stride: this.stride} : null};
    // Shared with every resident cache of this shape on the device (a new one per sequence).
    const attend_code = AttendWgsl(s), norm_code = NormaliseWgsl(c.head_dim);
    this.attend = CachedPipeline(device, attend_code, 'attend');
    this.fold = CachedPipeline(device, attend_code, 'fold');
    this.finish = CachedPipeline(device, norm_code, 'finish');
    this.gather = CachedPipeline(device, norm_code, 'gather_strided');
    // Attention state: per query head [m, l, acc[head_dim]] in regions (AttendWgsl): the open
    // chunk's, the merged chunks', one per piece a window starts (as many as its chunks).
    // region_bytes: one query position's; a block of n positions has n times as much (#State).
    this.region_bytes = c.n_heads * (c.head_dim + 2) * 4;
    this.pieces = 0;
    this.queries = 0;
    this.state = null;
    this.initial = null;
    this.retired = [];  // buffers outgrown while recording: destroyed after the submit
    this.retired_kv_bytes = 0;  // of those, a pool's outgrown KV buffers' bytes (counted until then)
    this.#State(1, Math.ceil(P / kPositionChunk) + 1);
    // LlamaModel's attention scale, as f32: 1 / sqrtf(head_dim) (f64 then rounded: the same bits).
    this.scale = Math.fround(1 / Math.fround(Math.sqrt(c.head_dim)));
    // Every dispatch's parameters (AttendWgsl's Params; the encoders' 16) until the submit.
    this.uniforms = new UniformArena(device, kAttendParamsBytes);
    this.staged = [];        // pages copied out in the step being recorded: [{layer, staging}]
    this.behind = Promise.resolve();  // the write-backs, in order
    this.broken = null;      // the first write-back that failed (later ones are then not appended)
  }

  #Storage(bytes) {
    return this.device.createBuffer({size: Math.max(16, Ceil4(bytes)),
                                     usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST | GPUBufferUsage.COPY_SRC});
  }

  // A page's buffers (a resident page or a streaming slot; or `bytes`), its KV bytes counted.
  #NewBuffers(bytes = this.page_bytes) {
    const b = {buffer: this.#Storage(bytes), offset: 0};
    this.counts.kv_bytes += b.buffer.size;
    this.counts.kv_bytes_now += b.buffer.size;
    this.counts.peak_kv_bytes = Math.max(this.counts.peak_kv_bytes, this.counts.kv_bytes_now);
    return b;
  }

  // encoder: where a pool's growth copies its pages (no pass open); null: submitted at once.
  #NewPage(L, encoder = null) {
    const i = L.pages.length, pooled = L.pool && i >= this.pool_from;
    const page = pooled ? L.pool.NewPage(this.device, encoder, i - this.pool_from)
                        : this.#NewBuffers(this.rows ? this.rows.PageBytes(i) : this.page_bytes);
    L.pages.push(page);
    return page;
  }

  #FreeBuffers(b) {
    this.counts.kv_bytes_now -= b.buffer.size;
    b.buffer.destroy();
  }

  /**
   * Master page `bytes` (Uint8Array [page_bytes]) as layer `layer`'s next page (after a lost
   * device): uploaded, or, when the next step at position `next_pos` streams it (mixed mode),
   * only recorded as evicted. Either way it is in the master (landed).
   */
  Restore(layer, bytes, next_pos) {
    if (this.rows) throw new Error('GpuResidentKv.Restore: a sinkN / resN cache\'s f32 rows are not in master pages (replay from 0)');
    const L = this.layers[layer];
    ++L.landed;
    L.held = L.landed * this.P;
    if (L.pages.length < this.#FirstResident(next_pos)) {
      L.pages.push(null);
      return;
    }
    L.pages.push(this.#Uploaded(L, bytes, L.pages.length));
  }

  // Page i holding `bytes` (Uint8Array [page_bytes], a master page): in layer L's pool (its next
  // page, or in mixed mode its slot in the ring), else a buffer of its own.
  #Uploaded(L, bytes, i) {
    const page = L.pool && i >= this.pool_from ? L.pool.NewPage(this.device, null, i - this.pool_from) : this.#NewBuffers();
    const padded = new Uint8Array(Ceil4(bytes.byteLength));  // writeBuffer takes whole words
    padded.set(bytes);
    this.device.queue.writeBuffer(page.buffer, page.offset, padded);
    return page;
  }

  /**
   * Keeps positions [0, n) of every layer (a chat's next turn shares only them with the last
   * one; n ≤ the positions held, every write-back landed: Drain first, nothing recorded since).
   * Pages after n's are freed; n's page, unless n ends a page, is the tail again: its rows from n
   * on are stale until the next steps encode them, and nothing reads them before (attention takes
   * a page's rows up to the query's position, a page is written behind once full, and an encoder
   * call replaces every byte of its rows: kv_formats.js's masked words). Pages up to n's that the
   * newest resident_pages at n hold but were evicted (mixed mode) come back from the master
   * (read): the window a fresh sequence would have. Afterwards the master must hold exactly the
   * pages before n's (the runner truncates it there: they are the landed ones).
   */
  Truncate(n) {
    if (this.staged.length) throw new Error('GpuResidentKv.Truncate: pages staged by a step not submitted');
    if (this.KeepablePositions(n) !== n) throw new Error(`GpuResidentKv.Truncate: position ${n} is inside an encoded KIVI group, or f32 rows are encoded since`);
    const P = this.P, kept_pages = Math.ceil(n / P), first = this.#FirstResident(n);
    for (const [layer, L] of this.layers.entries()) {
      if (L.landed < Math.floor(n / P)) {
        throw new Error(`GpuResidentKv.Truncate: layer ${layer}'s pages before position ${n} are not all in the master (Drain first)`);
      }
      for (const page of L.pages.splice(kept_pages)) if (page && !page.segment) this.#FreeBuffers(page);  // not a pool's
      L.pool?.Truncate(Math.max(0, kept_pages - this.pool_from));
      for (let i = first; i < kept_pages; ++i) L.pages[i] ??= this.#Uploaded(L, this.read(layer, i), i);
      L.landed = Math.min(L.landed, Math.floor(n / P));
      L.sinks.length = Math.min(L.sinks.length, L.landed);
      L.held = n;
    }
  }

  /**
   * The most positions up to n that Truncate can keep: n, unless n cuts a KIVI group that is no
   * longer the residual one (its f32 rows are gone): then the start of that group (the rows from
   * there run again, as kvq's KvCache::TruncationPoint cuts back).
   */
  KeepablePositions(n) {
    const G = this.group;
    if (this.rows) return this.layers.every((L) => L.held <= n) ? n : 0;  // encoded rows cannot be f32 again
    if (G === 1 || n % G === 0) return n;
    const same = this.layers.every((L) => L.held >= n && Math.floor(n / G) === Math.floor((L.held - 1) / G));
    return same ? n : Math.floor(n / G) * G;
  }

  // The first page a step at `pos` keeps resident: the newest resident_pages up to pos's page.
  #FirstResident(pos) { return Math.max(0, Math.floor(pos / this.P) + 1 - this.resident_pages); }

  /**
   * Whether a step at `pos` would evict a page whose write-back has not landed yet (the runner
   * then waits for `behind` first: the streamed windows read the master).
   */
  WaitsFor(pos) {
    const first = this.#FirstResident(pos), need = this.rows ? this.rows.MasterPages(first) : first;
    return this.layers.some((L) => L.landed < Math.min(need, L.pages.length));
  }

  /**
   * Records layer `layer` at position `pos` into sink.encoder (no compute pass open): the rows k, v
   * (GPU buffers [n_kv_heads][head_dim] f32) encoded into the tail page, then out = attention of
   * q ([n_heads][head_dim]) over positions 0..pos (out the same shape as q). sink.flush(): submits
   * sink.encoder and puts a new one there (mixed mode, before a slot is written again).
   */
  Record(sink, layer, k, v, q, pos, out) {
    const packed = this.c.n_heads * this.c.head_dim;
    this.RecordBlock(sink, layer, pos, {n: 1, k, v, kv_stride: this.c.kv_dim, q, q_stride: packed, out, out_stride: packed});
  }

  /**
   * A prefill block's layer (or a decode step's: one position): the n consecutive positions pos..
   * encode their rows into their pages, one encoder call per tensor and page the block writes (as
   * one call per position would: each row's bytes depend on that row alone), then every position t
   * attends over positions 0..pos + t in one pass over the pages (query-blocked: one attend
   * dispatch per page window for all n queries, each taking the window's rows up to its own
   * position). b: {n; k, v: bindings at position 0's rows ([n_kv_heads][head_dim] f32, Record's),
   * position t's t · kv_stride floats further; q and out: bindings at position 0's
   * [n_heads][head_dim], position t's t · q_stride and t · out_stride floats further}. Each
   * query's (m, l, acc) goes through the same instructions on the same rows in the same order as a
   * Record at its position alone (a window past a query's position gives it no rows, and an empty
   * state merges as nothing), so the same bits.
   */
  RecordBlock(sink, layer, pos, b) {
    const L = this.layers[layer], P = this.P, c = this.c, n = b.n, {out, out_stride} = b;
    const first_resident = this.#FirstResident(pos);
    const evicts = n > 1 && this.#FirstResident(pos + n - 1) !== first_resident;
    const pieces = evicts ? Array.from({length: n}, (_, t) => [pos + t, 1]) :
        this.rows ? RowsPieces(pos, n, P, [this.group, 1], this.rows_spec) : this.group > 1 ? SubBlocks(pos, n, this.group) : null;
    if (pieces && pieces.length > 1) {
      // A page would be evicted inside the block (the earlier queries still read it): per position.
      // Or a KIVI group completes inside it, or a row ages out (or a page ends) with sinkN / resN:
      // pieces whose queries see the same rows encoded.
      for (const [a, m] of pieces) {
        const t = a - pos;
        this.RecordBlock(sink, layer, a, {...b, n: m, k: From(b.k, t * b.kv_stride), v: From(b.v, t * b.kv_stride),
                                          q: From(b.q, t * b.q_stride), out: From(out, t * out_stride)});
      }
      return;
    }
    this.rope_table?.Cover(first_resident, pos + n);  // prerope: the resident pages' cos/sin, to the block's page end
    const index = Math.floor(pos / P);
    if (index !== L.pages.length - (pos % P === 0 ? 0 : 1)) {
      throw new Error(`layer ${layer} holds ${L.pages.length} pages; position ${pos} needs ${index + 1}`);
    }
    // Evictions: pages older than the newest resident_pages, each in the master already (the
    // runner waited for their write-backs: WaitsFor).
    for (let i = 0; i < first_resident; ++i) {
      if (!L.pages[i]) continue;
      if (L.landed < (this.rows ? this.rows.MasterPages(first_resident) : i + 1)) {
        throw new Error(`layer ${layer}'s page ${i} is not in the master yet (or not all its rows encoded there); it cannot be evicted`);
      }
      // A buffer of its own destroyed (destroy waits for the submitted commands that read it); a
      // ring's slot is the next page's, written after this step's earlier commands read it.
      if (!L.pages[i].segment) this.#FreeBuffers(L.pages[i]);
      L.pages[i] = null;
      ++this.counts.evictions;
    }
    L.held = pos + n;
    if (this.rotation) b = this.rotation.Rotated(sink.encoder, b, this.uniforms, this.retired);  // rot: rows and queries rotated copies
    const {q, q_stride} = b;
    const full = [];  // pages the block fills: copied out after its rows are encoded
    if (this.rows) {  // one page's piece: copied into the ring, rows aged out encoded (kv_resident_rows.js)
      if (pos % P === 0) this.#NewPage(L, sink.encoder);
      this.counts.encode_dispatches += this.rows.RecordRows(sink.encoder, L, b, pos, n, From, this.uniforms);
    }
    for (let t = this.rows ? n : 0; t < n;) {  // the block's rows in each page it writes: rows t .. t + run − 1
      const row = (pos + t) % P, run = Math.min(n - t, P - row);
      const tail = row === 0 ? this.#NewPage(L, sink.encoder) : L.pages[L.pages.length - 1];
      const k_rows = From(b.k, t * b.kv_stride);
      this.counts.encode_dispatches += this.group > 1 ? this.#RecordKeyGroupRows(sink.encoder, L, k_rows, b.kv_stride, pos + t, run, tail)
          : L.k.Record(sink.encoder, k_rows, run, tail.buffer, tail.offset + row * this.k_block, this.uniforms, b.kv_stride);
      this.counts.encode_dispatches +=
          L.v.Record(sink.encoder, From(b.v, t * b.kv_stride), run, tail.buffer, tail.offset + this.value_offset + row * this.v_block,
                     this.uniforms, b.kv_stride);
      if (row + run === P) full.push(tail);
      t += run;
    }
    const last = pos + n - 1, last_index = Math.floor(last / P);
    // One window per page in position order (a KIVI page holding residual rows: two, PageWindows;
    // sinkN / resN: cut where a tensor's rows change source, RowsWindows); pooled, one per
    // segment's run of pages (and the residual rows').
    // Mixed mode: the evicted pages through the streaming slots, a run of them in consecutive
    // slots one window (StreamWindows), runs of resident ones joined in their ring.
    const pooled = L.pool && {segment_pages: L.pool.segment_pages, ring: L.pool.ring, first_resident};
    let windows = this.rows ? this.rows.Windows(L, last, pooled)
        : PageWindows(pos, last, P, this.group, this.value_offset, this.v_block, L.residual);
    if (pooled && !this.rows) windows = PoolWindows(windows, P, pooled);
    if (first_resident > 0) {
      ({windows, next_slot: this.next_slot} = StreamWindows(windows, P, {first_resident, slots: this.slots.length,
                                                                          next_slot: this.next_slot, join: this.slots_joined}));
    }
    const Pieces = (first, rows) => Math.floor((first + rows - 1) / kPositionChunk) - Math.floor(first / kPositionChunk) + 1;
    this.#State(n, Math.max(...windows.map((w) => Pieces(w.first, w.rows))));
    const region_bytes = n * this.region_bytes;  // one state per (query position, query head)
    sink.encoder.copyBufferToBuffer(this.initial, 0, this.state, 0, 2 * region_bytes);
    let pass = sink.encoder.beginComputePass();
    for (const {i, first, rows: window_rows, k, v, stream} of windows) {
      let page = L.pages[i];
      if (stream) {  // evicted: its pages streamed from the master into consecutive slots
        if (stream.flush) {  // the slots' last windows are not submitted yet: submit them first
          pass.end();
          this.uniforms.Write();
          sink.flush();
          this.uniforms.Reset();
          ++this.counts.flushes;
          pass = sink.encoder.beginComputePass();
        }
        page = this.slots[stream.slot];
        for (const [j, index] of stream.pages.entries()) {
          const slot = this.slots[stream.slot + j], bytes = this.read(layer, index);
          this.device.queue.writeBuffer(slot.buffer, slot.offset, bytes.buffer, bytes.byteOffset, Ceil4(this.page_bytes));
          this.counts.streamed_bytes += this.page_bytes;
          ++this.counts.streamed_pages;
          if (this.rows?.SinksIn(index)) {  // sinkN: its sinks after its bytes, as its resident buffer held them
            this.device.queue.writeBuffer(slot.buffer, slot.offset + this.rows.sink_at, L.sinks[index]);
            this.counts.streamed_sink_bytes += L.sinks[index].byteLength;
          }
          if (slot.rope) {  // prerope: the page's cos/sin beside it (kv_resident_rope.js)
            const rows = this.rope_table.Rows(index);
            this.device.queue.writeBuffer(slot.rope, slot.rope_row * c.rotary_dims * 4, rows);
            this.counts.streamed_rope_bytes += rows.byteLength;
          }
        }
      }
      const pieces = Pieces(first, window_rows);
      const first_fresh = first > 0 && first % kPositionChunk === 0 ? 1 : 0;
      const p = new ArrayBuffer(kAttendParamsBytes), u = new Uint32Array(p);
      // AttendWgsl's Params: rows, first_pos, query_pos, scale; K blocks/head/residual offsets and
      // counts; V's; no injected bug; chunk, pieces, first_fresh, n queries; q's stride; the rope
      // rows' row of the window's row 0 (prerope: a streamed page's own rows, else the table's).
      const rope_row = !this.rope_table ? first : stream && page.rope ? page.rope_row + first - i * P : this.rope_table.Row(first);
      const k_at = k.buffer ? 0 : page.offset, v_at = v.buffer ? 0 : page.offset;  // a pooled page's bytes in its segment
      u.set([window_rows, first, pos, 0, k_at + k.blocks, k.head, 0, k.n_head, k.n_block, v_at + v.blocks, v.head, 0, v.n_head, v.n_block,
             0, 0, kPositionChunk, pieces, first_fresh, n, q_stride, rope_row]);
      new Float32Array(p, 12, 1)[0] = this.scale;
      const params = this.uniforms.Take(p);
      const state = {buffer: this.state, size: (2 + pieces) * region_bytes};
      pass.setPipeline(this.attend);
      const bindings = [k.buffer ?? page.buffer, v.buffer ?? page.buffer, From(q), state, params];
      if (this.rope_table) bindings.push(page.rope ?? this.rope_table.buffer);
      pass.setBindGroup(0, this.#Group(this.attend, bindings));
      pass.dispatchWorkgroups(c.n_kv_heads * pieces, n);  // a workgroup per (KV head, piece; query)
      ++this.counts.attend_dispatches;
      if (pieces > 1 || first_fresh) {
        pass.setPipeline(this.fold);
        pass.setBindGroup(0, this.device.createBindGroup({layout: this.fold.getBindGroupLayout(0), entries: [
          {binding: 3, resource: state}, {binding: 4, resource: params}]}));
        pass.dispatchWorkgroups(Math.ceil(n * c.n_heads / 64));
      }
    }
    pass.setPipeline(this.finish);
    pass.setBindGroup(0, this.#Group(this.finish, [{buffer: this.state, size: 2 * region_bytes}]));
    pass.dispatchWorkgroups(Math.ceil(n * c.n_heads / 64));
    if (this.rotation?.value) {  // the normalised output's value rotation undone in the state (kvq's UnrotateHeads)
      this.rotation.HeadOp(pass, 'unrotate', {buffer: this.state, size: region_bytes}, n * c.n_heads, c.head_dim + 2, 2, this.uniforms);
    }
    const gather = this.uniforms.Take(new Uint32Array([c.n_heads, out_stride, 0, 0]));
    pass.setPipeline(this.gather);
    pass.setBindGroup(0, this.#Group(this.gather, [{buffer: this.state, size: region_bytes}, From(out), gather]));
    pass.dispatchWorkgroups(Math.ceil(n * c.n_heads / 64));
    pass.end();
    if (this.rows && (pos + n) % P === 0) this.staged.push({layer, staging: this.rows.StageRows(sink.encoder, L, last_index), rows: true});
    for (const tail of full) {  // a page filled: copied out in this submit, appended once mapped
      const staging = this.device.createBuffer({size: this.stride, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
      sink.encoder.copyBufferToBuffer(tail.buffer, tail.offset, staging, 0, this.stride);
      this.staged.push({layer, staging});
    }
  }

  // KIVI keys: `run` rows of x (a binding: position `at`'s row, the next kv_stride floats on) into
  // the layer's residual buffer, and a group they complete encoded from it into page `tail`, in
  // command order (copied, encoded, then the next group's rows overwrite it). Returns the encoder
  // dispatches recorded.
  #RecordKeyGroupRows(encoder, L, x, kv_stride, at, run, tail) {
    const G = this.group, row_bytes = this.c.kv_dim * 4;
    let dispatches = 0;
    for (let t = 0; t < run;) {
      const slot = (at + t) % G, m = Math.min(run - t, G - slot), src = From(x, t * kv_stride);
      for (let r = 0; r < m; r += kv_stride === this.c.kv_dim ? m : 1) {  // packed rows: one copy
        const rows = kv_stride === this.c.kv_dim ? m : 1;
        encoder.copyBufferToBuffer(src.buffer, src.offset + r * kv_stride * 4, L.residual, (slot + r) * row_bytes,
                                   rows * row_bytes);
      }
      if (slot + m === G) {  // the group is whole: encoded into its page
        const group_in_page = Math.floor(((at + t + m - 1) % this.P) / G);
        dispatches += L.k.Record(encoder, L.residual, G, tail.buffer, tail.offset + group_in_page * this.k_block, this.uniforms);
      }
      t += m;
    }
    return dispatches;
  }

  // The attention state and its initial regions for blocks of n query positions and windows of up
  // to `pieces` chunks: region r of the state ([n][n_heads][m, l, acc[head_dim]]) at r · n ·
  // region_bytes, 2 + pieces regions. A buffer outgrown is destroyed after the submit of the
  // commands recorded with it.
  #State(n, pieces) {
    if (n <= this.queries && pieces <= this.pieces) return;
    if (this.state) this.retired.push(this.state, this.initial);
    const c = this.c;
    n = Math.max(n, this.queries);
    this.pieces = Math.max(pieces, this.pieces);
    this.state = this.#Storage((2 + this.pieces) * n * this.region_bytes);
    // Regions 0 and 1 as a layer starts them (m = −inf; l, acc 0), copied in before each layer.
    const initial = new Float32Array(2 * n * this.region_bytes / 4);
    for (let h = 0; h < 2 * n * c.n_heads; ++h) initial[h * (c.head_dim + 2)] = -Infinity;
    this.initial = this.#Storage(initial.byteLength);
    this.device.queue.writeBuffer(this.initial, 0, initial);
    this.queries = n;
  }

  // entries: per binding a GPUBuffer or a GPUBufferBinding.
  #Group(pipeline, entries) {
    return this.device.createBindGroup({layout: pipeline.getBindGroupLayout(0),
      entries: entries.map((b, i) => ({binding: i, resource: b instanceof GPUBuffer ? {buffer: b} : b}))});
  }

  /** Before the step's (or block's) submit: its parameters to the GPU. */
  BeforeSubmit() { this.uniforms.Write(); }

  /** After the step's submit: maps this step's full pages and queues their appends, in order. */
  Submitted() {
    this.uniforms.Reset();
    this.rope_table?.Submitted();
    for (const b of this.retired) b.destroy();
    this.retired = [];
    this.counts.kv_bytes_now -= this.retired_kv_bytes;
    this.retired_kv_bytes = 0;
    this.next_slot = 0;  // the step's commands are all submitted: the slots may be written again
    for (const {layer, staging, rows} of this.staged) {
      const mapped = staging.mapAsync(GPUMapMode.READ);
      this.behind = this.behind.then(async () => {
        try {
          await mapped;
          if (this.broken) return;
          const range = staging.getMappedRange(), floats = this.P * this.c.kv_dim, L = this.layers[layer];
          if (rows) {  // [2][P][kv_dim] f32 (mixed sinkN: the page's sinks kept, to stream it)
            const k = new Float32Array(range, 0, floats), v = new Float32Array(range, floats * 4, floats);
            this.append(layer, null, {k, v});
            if (this.read && this.rows.SinksIn(L.landed)) L.sinks[L.landed] = this.rows.SinkArea(L.landed, k, v);
          } else {
            this.append(layer, new Uint8Array(range, 0, this.page_bytes));
          }
          ++this.counts.write_backs;
          ++L.landed;
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
      L.pool?.Destroy();
      for (const p of L.pages) if (p && !p.segment) this.#FreeBuffers(p);
      L.residual?.destroy();
      L.ring?.destroy();
    }
    for (const b of new Set(this.slots.map((s) => s.buffer))) this.#FreeBuffers({buffer: b});
    for (const b of [...new Set(this.slots.map((s) => s.rope)), this.rope_table?.ring?.buffer]) b?.destroy();
    for (const b of [this.state, this.initial, ...this.retired]) b.destroy();
    this.rotation?.Destroy();
    this.uniforms.Destroy();
    this.rows?.Destroy();
    this.rope_table?.Destroy();
  }
}
