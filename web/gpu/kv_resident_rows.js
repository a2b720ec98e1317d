// Sink and residual rows (kvq's "sinkN" and "resN" transforms) on the resident path
// (kv_resident.js). kvq's KvCache (kvq/kv_cache.h, src/cache/kv_cache_append.cc) keeps the first
// N positions also in f32 and reads them from there, their slots in an encoded block holding a
// stand-in (zeros, or for a group of rows that is not all sinks the group's first non-sink row);
// and keeps the newest N positions in f32, encoding a row (a KIVI key group: when its last row
// does) once it ages out. A query at position p reads the rows as they were when p was appended:
// per tensor, rows [0, sinks) in f32, [sinks, EncodedRows(p + 1)) from the blocks, the rest f32.
//
// On the GPU, per layer:
//   - a ring of f32 rows ([2][cap][n_kv_heads][head_dim]: K then V, position p at slot p % cap),
//     cap a multiple of the page (so a page's rows are contiguous) holding a page more than the
//     rows still to be encoded or read in f32 (residual + G − 1 + the piece recorded): the rows
//     a step encodes as they age out come from here, and so do the residual rows attention reads;
//   - the sink rows in f32 after their page's bytes in its buffer ([2][its sinks][n_kv_heads]
//     [head_dim] from Ceil4(page_bytes)): kv_device.js's attend kernel reads a window's "head
//     rows" from the buffer its blocks are in, so a page's first window takes both, as the
//     stream path's slot does;
//   - the pages after those holding sinks in a page pool (kv_resident_pool.js; in mixed mode a
//     ring of the resident pages, without sinkN only), so a run of their encoded rows is one
//     attend window, its position chunks in parallel (RowsAttends), where a page each took a
//     dispatch of its own.
// A block is recorded in pieces (RowsPieces) within one page, cut where a later query would see
// a row encoded that an earlier one reads in f32 (as KIVI's SubBlocks cuts at a group's end); a
// piece copies its rows into the ring (and the sinks), encodes the rows that age out up to its
// view (RowsEncodes), then attends page by page in windows cut where a tensor's rows change
// source (RowsWindows): the same instructions on the same rows in the same order as one window,
// so the stream path's bits.
//
// Write-behind (kv_resident.js's staged pages): a page whose last position a step appended has its
// f32 rows (K and V, from the ring) copied to a staging buffer in that step's submit; once mapped,
// after the step returned, they are Appended to the module's master (kvq_web_kv_append), which
// encodes them with kvq's codecs itself: KvCache::AppendEncodedPages cannot take these specs (the
// master must hold the sinks and residual rows in f32, which page bytes do not carry), and rows
// appended page by page leave the master in exactly the state Append of the whole run's rows would
// (the rows of the newest `residual` positions f32 there too). The GPU's pages and the master's
// hold the same bytes (gpu_resident_check.js compares both with the streamed run's master).
//
// Also here (kv_resident.js's, moved out so it stays small): KIVI's pieces without sinkN / resN
// (SubBlocks) and the uniform slots a block takes (BlockUniformSlots).

import {PoolWindows} from './kv_resident_pool.js';

// kvq's EncodedRows (formats/kv_spec.cc): rows of n positions in blocks of G with `residual` f32.
export function EncodedRowsAt(n, G, residual) {
  return Math.floor(Math.max(0, n - residual) / G) * G;
}

/**
 * The sinkN and resN of a key spec and a value spec (FORMAT[+TRANSFORM...]): {sinks, residual},
 * null when neither has one, or {why} when they differ between the tensors (a window's cuts
 * assume both tensors' sinks and residual are the same).
 */
export function RowsSpecOf(kv_k, kv_v) {
  const of = (spec) => {
    const get = (re) => Number(spec.split('+').slice(1).map((t) => re.exec(t)?.[1]).find((x) => x !== undefined) ?? 0);
    return {sinks: get(/^sink(\d+)$/), residual: get(/^res(\d+)$/)};
  };
  const k = of(kv_k), v = of(kv_v);
  if (!k.sinks && !k.residual && !v.sinks && !v.residual) return null;
  if (k.sinks !== v.sinks || k.residual !== v.residual) {
    return {why: `the key spec "${kv_k}" and the value spec "${kv_v}" keep different sinkN / resN rows (resident: the same for both)`};
  }
  return k;
}

/**
 * The pieces a block of n positions from pos is recorded in ([first, n] pairs): within one page
 * (pages of P), and cut before a position whose query sees, for a tensor w of groups[w] rows per
 * block, a row encoded that an earlier query of the piece reads in f32: every query of a piece
 * that reads rows past the sinks in f32 sees the same EncodedRows (a query reading none in f32
 * sees only rows the later ones see encoded too).
 */
export function RowsPieces(pos, n, P, groups, spec) {
  const pieces = [];
  for (let a = pos; a < pos + n;) {
    const fixed = [undefined, undefined];
    let z = a;
    for (; z < pos + n; ++z) {
      if (z > a && z % P === 0) break;
      const enc = groups.map((G) => EncodedRowsAt(z + 1, G, spec.residual));
      if (enc.some((e, w) => fixed[w] !== undefined && e !== fixed[w])) break;
      enc.forEach((e, w) => { if (e < z + 1) fixed[w] ??= e; });
    }
    pieces.push([a, z - a]);
    a = z;
  }
  return pieces;
}

/**
 * The encoder calls that bring tensor w's encoded rows from EncodedRowsAt(pos) to the view of the
 * piece ending at `last` (EncodedRowsAt(last + 1)): [{w, first, rows, stand_in}], one per group of
 * G > 1 rows, per run of rows within a page for G = 1; stand_in: the call's rows include sinks
 * (G = 1: the run is all sinks, encoded from zeros; G > 1: the group's sink rows replaced first).
 */
export function RowsEncodes(pos, last, P, groups, spec) {
  const calls = [];
  groups.forEach((G, w) => {
    const from = EncodedRowsAt(pos, G, spec.residual), to = EncodedRowsAt(last + 1, G, spec.residual);
    if (G > 1) {
      for (let g = from; g < to; g += G) calls.push({w, first: g, rows: G, stand_in: g < spec.sinks});
      return;
    }
    for (let r = from; r < to;) {
      const end = Math.min(to, r < spec.sinks ? spec.sinks : Infinity, (Math.floor(r / P) + 1) * P);
      calls.push({w, first: r, rows: end - r, stand_in: r < spec.sinks});
      r = end;
    }
  });
  return calls;
}

/**
 * The attention windows of a piece whose view is that of position `last` (queries up to last),
 * page by page in position order: [{i (page), first (position), rows, k, v}], k and v {src:
 * 'page' (the page buffer: n_head sink rows, then blocks up to n_block) or 'ring' (f32 rows from
 * the ring: all of them)}. A page is cut where a tensor's rows leave the blocks (kvq's
 * RowsOfPage: sinks, then blocks up to EncodedRows, then f32).
 */
export function RowsWindows(last, P, groups, spec) {
  const windows = [];
  const enc = groups.map((G) => EncodedRowsAt(last + 1, G, spec.residual));
  for (let i = 0; i <= Math.floor(last / P); ++i) {
    const first = i * P, end = Math.min(first + P, last + 1);
    const head_end = Math.min(Math.max(spec.sinks, first), end);
    const [bk, bv] = enc.map((e) => Math.min(Math.max(e, head_end), end));
    const c1 = Math.min(bk, bv), c2 = Math.max(bk, bv);
    if (c1 > first) {
      const t = {src: 'page', n_head: head_end - first, n_block: c1 - first};
      windows.push({i, first, rows: c1 - first, k: t, v: t});
    }
    if (c2 > c1) {
      if (bv < bk) throw new Error(`values leave the blocks before keys at position ${bv} (the resident rows take keys first)`);
      windows.push({i, first: c1, rows: c2 - c1, k: {src: 'ring'}, v: {src: 'page', n_head: 0, n_block: c2 - c1}});
    }
    if (end > c2) windows.push({i, first: c2, rows: end - c2, k: {src: 'ring'}, v: {src: 'ring'}});
  }
  return windows;
}

/**
 * The first page of a layer's page pool (kv_resident_pool.js) with sinkN / resN: the pages holding
 * sinks keep their own buffers (the sinks after the page's bytes), the pages after lie in the pool.
 */
export function RowsPoolFrom(P, spec) { return Math.ceil(spec.sinks / P); }

/**
 * The attends of a piece whose view is that of position `last` (RowsWindows), its runs of pooled
 * pages joined (PoolWindows: pool {segment_pages, ring, first_resident}; null: no pool, a window
 * per page).
 */
export function RowsAttends(last, P, groups, spec, pool = null) {
  const windows = RowsWindows(last, P, groups, spec);
  return pool ? PoolWindows(windows, P, {...pool, first_pooled: RowsPoolFrom(P, spec)}) : windows;
}

/** Uniform slots a block takes per layer in rows mode: per piece its encoder calls, attends and gather. */
export function RowsBlockSlots(P, pos, n, groups, spec, segment_pages = 1) {
  let slots = 0;
  for (const [a, m] of RowsPieces(pos, n, P, groups, spec)) {
    slots += RowsEncodes(a, a + m - 1, P, groups, spec).length + RowsAttends(a + m - 1, P, groups, spec, {segment_pages}).length + 1;
  }
  return slots;
}

// The pieces RecordBlock cuts a block of n positions from pos into when K is in groups of G rows:
// a piece starts at each position that completes a group ([first, n] pairs).
export function SubBlocks(pos, n, G) {
  const pieces = [];
  for (let a = pos; a < pos + n;) {
    let z = a + 1;
    while (z < pos + n && z % G !== G - 1) ++z;
    pieces.push([a, z - a]);
    a = z;
  }
  return pieces;
}

/**
 * The attention windows (without sinkN / resN) of a block from pos to `last` with pages of P
 * positions and K blocks of G rows: {i (the page), first (position), rows, k, v (bindings as
 * ResidentRows.Windows')}, a page each in position order, the page of a KIVI residual group cut
 * where that group starts (the rows after: K f32 in `residual` ([G][n_kv_heads][head_dim]), row r of
 * the window at r, V in the page). value_offset, v_block: the page's V blocks' offset and bytes.
 */
export function PageWindows(pos, last, P, G, value_offset, v_block, residual) {
  const last_index = Math.floor(last / P), last_row = last % P;
  const encoded_end = G > 1 ? Math.floor((pos + 1) / G) * G : Infinity;
  const windows = [];
  for (let i = 0; i <= last_index; ++i) {
    const first = i * P, end = first + (i < last_index ? P : last_row + 1);
    const cut = Math.min(Math.max(encoded_end, first), end);
    const v = (at, rows) => ({blocks: value_offset + (at - first) * v_block, head: 0, n_head: 0, n_block: rows});
    if (cut > first) windows.push({i, first, rows: cut - first, k: {blocks: 0, head: 0, n_head: 0, n_block: cut - first}, v: v(first, cut - first)});
    if (end > cut) windows.push({i, first: cut, rows: end - cut, k: {buffer: residual, blocks: 0, head: 0, n_head: 0, n_block: 0}, v: v(cut, end - cut)});
  }
  return windows;
}

/**
 * Uniform-arena slots RecordBlock takes for a block of n positions from pos (no page evicted
 * inside it) over n_layers layers with pages of P positions and K blocks of G rows: per layer an
 * encoder call for K and one for V per page the block writes, an attend per page window up to its
 * last position, and the gather; for G > 1 per piece (SubBlocks) a V call per page it writes, a K
 * call for the group its first position completes, an attend per page of encoded rows and one
 * for the residual rows, and its gather; and `rotations` more per layer (RotationSlots: the
 * specs' head ops; rot is not taken with G > 1). rows: RowsSpecOf's {sinks, residual} (RowsBlockSlots).
 * segment_pages: pages an attend window runs through (kv_resident_pool.js's segments; 1: a window
 * per page), so the attends of encoded rows are one per segment they touch (with rows, of the
 * pooled pages: RowsAttends).
 */
export function BlockUniformSlots(n_layers, P, pos, n, G = 1, rotations = 0, rows = null, segment_pages = 1) {
  if (rows) return n_layers * RowsBlockSlots(P, pos, n, [G, 1], rows, segment_pages);
  const windows = (pages) => Math.ceil(pages / segment_pages);  // attends over pages [0, pages)
  if (G > 1) {
    let slots = 0;
    for (const [a, m] of SubBlocks(pos, n, G)) {
      const last = a + m - 1, encoded_end = Math.floor((a + 1) / G) * G;
      const written = Math.floor(last / P) - Math.floor(a / P) + 1;
      slots += written + (a % G === G - 1 ? 1 : 0) + windows(Math.ceil(Math.min(encoded_end, last + 1) / P)) +
               (last >= encoded_end ? 1 : 0) + 1;
    }
    return n_layers * slots;
  }
  const last = Math.floor((pos + n - 1) / P), written = last - Math.floor(pos / P) + 1;
  return n_layers * (2 * written + windows(last + 1) + 1 + rotations);
}

/**
 * Pages of a layer the master must hold before a mixed-mode step evicts its pages before `first`
 * (0 when none): the fewest whose rows leave every tensor's rows before first · P encoded there
 * (EncodedRowsAt; pages reach the master as f32 rows, encoded only once they age out), so a page
 * streamed from the master holds its final bytes, the GPU's (which encodes no row of it again).
 */
export function MasterPagesToEvict(first, P, groups, spec) {
  let n = first;
  while (groups.some((G) => EncodedRowsAt(n * P, G, spec.residual) < first * P)) ++n;
  return n;
}

/**
 * Resident pages per layer a mixed-mode cache of these rows needs (groups: [K, V] rows per block):
 * the step at a page's first position evicts up to `first` = page + 1 − R with
 * MasterPagesToEvict(first) pages, at most the page's earlier ones, written behind (over one
 * period of the groups' alignment, P a multiple of each).
 */
export function RowsResidentPages(P, groups, spec) {
  let least = 1;
  for (let first = 1; first <= Math.max(...groups); ++first) least = Math.max(least, MasterPagesToEvict(first, P, groups, spec) - first + 1);
  return least;
}

/** The ring's capacity in positions: a page more than residual + G − 1, in whole pages. */
export function RingPositions(P, G, spec) {
  return P * (Math.ceil((spec.residual + G - 1) / P) + 1);
}

// The f32 rows of a resident cache's layers (the module comment): the ring per layer, the pages'
// sink area, and the encoder calls, copies and windows' bindings of a piece.
export class ResidentRows {
  /**
   * c: the step program's config; P: page positions; page_bytes, value_offset: the page layout;
   * groups: [K, V] rows per block; spec: RowsSpecOf's {sinks, residual}; storage(bytes): a new
   * storage buffer (counted as KV bytes by the caller).
   */
  constructor(device, c, P, page_bytes, value_offset, groups, spec, storage) {
    this.device = device;
    this.P = P;
    this.groups = groups;
    this.spec = spec;
    this.value_offset = value_offset;
    this.row_bytes = c.kv_dim * 4;
    this.kv_dim = c.kv_dim;
    this.cap = RingPositions(P, Math.max(...groups), spec);
    this.least = RowsResidentPages(P, groups, spec);  // resident pages per layer in mixed mode
    this.storage = storage;
    this.page_bytes = page_bytes;
    this.sink_at = Math.ceil(page_bytes / 4) * 4;  // a page's sinks after its bytes (PageBytes)
    this.zero = storage(this.row_bytes);  // one row of zeros: G = 1 sink stand-ins (stride 0)
    // [max(P, G)][kv_dim]: an encoder call's rows, copied out of the ring (a storage binding's
    // offset must be aligned to 256 bytes, a ring row's is not), stand-ins in place
    this.scratch = storage(Math.max(P, ...groups) * this.row_bytes);
  }

  /** Sink rows in page i: those of positions [iP, (i + 1)P) under `sinks`. */
  SinksIn(i) { return Math.min(Math.max(this.spec.sinks - i * this.P, 0), this.P); }

  /** Bytes of page i's buffer: [page_bytes, padded to a word][K sinks][V sinks] (SinksIn(i) rows each). */
  PageBytes(i) { return this.SinksIn(i) ? this.sink_at + 2 * this.SinksIn(i) * this.row_bytes : this.page_bytes; }

  /**
   * Page i's sink area ([2][SinksIn(i)][kv_dim] f32, K then V, as PageBytes lays it out) from its
   * f32 rows k, v ([P][kv_dim], the write-behind's): a mixed-mode cache writes it into the slot
   * that streams the page (the master's page bytes hold only the sinks' stand-ins).
   */
  SinkArea(i, k, v) {
    const n = this.SinksIn(i) * this.kv_dim, area = new Float32Array(2 * n);
    area.set(k.subarray(0, n));
    area.set(v.subarray(0, n), n);
    return area;
  }

  /** Pages the master must hold before a mixed-mode step evicts those before `first` (MasterPagesToEvict). */
  MasterPages(first) { return first > 0 ? MasterPagesToEvict(first, this.P, this.groups, this.spec) : 0; }

  /** A layer's ring: [2][cap][kv_dim] f32. */
  NewRing() { return this.storage(2 * this.cap * this.row_bytes); }

  // Bytes of position p's row of tensor w in the ring.
  #Slot(w, p) { return (w * this.cap + p % this.cap) * this.row_bytes; }

  /**
   * Records a piece of m positions from a (RowsPieces') of layer L ({ring, pages, k, v: encoders})
   * into `encoder`: its rows (b: kv_resident.js's RecordBlock bindings, rows t · kv_stride floats
   * apart, From: its binding helper) copied into the ring and the sink area, then the rows aging
   * out up to its view encoded into their pages. Returns the encoder dispatches.
   */
  RecordRows(encoder, L, b, a, m, From, uniforms) {
    const {P, spec, row_bytes} = this;
    // n_rows rows of x (a binding: row r at r · kv_stride floats) to dst from byte dst_at, packed.
    const copy = (x, n_rows, dst, dst_at) => {
      const src = From(x);
      if (b.kv_stride === this.kv_dim || n_rows === 1) {
        encoder.copyBufferToBuffer(src.buffer, src.offset, dst, dst_at, n_rows * row_bytes);
        return;
      }
      for (let r = 0; r < n_rows; ++r) {
        encoder.copyBufferToBuffer(src.buffer, src.offset + r * b.kv_stride * 4, dst, dst_at + r * row_bytes, row_bytes);
      }
    };
    const i = Math.floor(a / P), in_page = this.SinksIn(i);  // the piece's page and its sink rows
    [b.k, b.v].forEach((x, w) => {
      copy(x, m, L.ring, this.#Slot(w, a));
      const sinks = Math.min(a + m, spec.sinks) - a;
      if (sinks > 0) copy(x, sinks, L.pages[i].buffer, L.pages[i].offset + this.sink_at + (w * in_page + a - i * P) * row_bytes);
    });
    let dispatches = 0;
    for (const {w, first, rows, stand_in} of RowsEncodes(a, a + m - 1, P, this.groups, spec)) {
      const G = this.groups[w], enc = w ? L.v : L.k, {buffer: page, offset} = L.pages[Math.floor(first / P)];
      const at = offset + (w ? this.value_offset : 0) + ((first % P) / G) * enc.shape.block_bytes;
      if (stand_in && G === 1) {  // sinks' slots: zeros (kvq's EncodeAged)
        dispatches += enc.Record(encoder, this.zero, rows, page, at, uniforms, 0);
        continue;
      }
      encoder.copyBufferToBuffer(L.ring, this.#Slot(w, first), this.scratch, 0, rows * row_bytes);
      if (stand_in) {  // the group's sink rows replaced by its first non-sink row, or zeros if all are sinks
        const n_sinks = Math.min(G, spec.sinks - first);
        for (let r = 0; r < n_sinks; ++r) {
          if (n_sinks < G) {
            encoder.copyBufferToBuffer(L.ring, this.#Slot(w, first + n_sinks), this.scratch, r * row_bytes, row_bytes);
          } else {
            encoder.clearBuffer(this.scratch, r * row_bytes, row_bytes);
          }
        }
      }
      dispatches += enc.Record(encoder, this.scratch, rows, page, at, uniforms);
    }
    return dispatches;
  }

  /**
   * The attend windows of a piece of queries up to `last` on layer L (RowsAttends: a run of pooled
   * pages one window), with their bindings: [{i, first, rows, k, v}], k and v {buffer, blocks,
   * head, n_head, n_block} (AttendWgsl's Params: byte offsets of the blocks and the head rows, the
   * rows read from each); a page's tensor has no buffer: the caller binds page i's (a pooled
   * page's segment, its offset added to blocks; an evicted page's streaming slot).
   */
  Windows(L, last, pool) {
    return RowsAttends(last, this.P, this.groups, this.spec, pool).map((win) => {
      const row0 = win.first - win.i * this.P;
      const bind = (t, w) => {
        if (t.src === 'ring') return {buffer: L.ring, blocks: 0, head: this.#Slot(w, win.first), n_head: win.rows, n_block: win.rows};
        const block_bytes = (w ? L.v : L.k).shape.block_bytes, G = this.groups[w];
        if (row0 % G) throw new Error(`a window from position ${win.first} starts inside a group of ${G} rows`);
        // The head rows (sinks: only in pages of their own, at offset 0) at the page's sink area.
        return {blocks: (w ? this.value_offset : 0) + (row0 / G) * block_bytes,
                head: this.sink_at + w * this.SinksIn(win.i) * this.row_bytes, n_head: t.n_head, n_block: t.n_block};
      };
      return {i: win.i, first: win.first, rows: win.rows, k: bind(win.k, 0), v: bind(win.v, 1)};
    });
  }

  /**
   * Page `page`'s f32 rows of layer L copied from the ring into a new staging buffer ([2][P]
   * [kv_dim]: K, then V), in `encoder`; returns it (the write-behind maps it).
   */
  StageRows(encoder, L, page) {
    const bytes = this.P * this.row_bytes;
    const staging = this.device.createBuffer({size: 2 * bytes, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
    for (let w = 0; w < 2; ++w) encoder.copyBufferToBuffer(L.ring, this.#Slot(w, page * this.P), staging, w * bytes, bytes);
    return staging;
  }

  Destroy() {
    this.zero.destroy();
    this.scratch.destroy();
  }
}
