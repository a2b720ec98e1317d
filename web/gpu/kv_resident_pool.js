// A layer's resident pages in a pool (kv_resident.js; with sinkN, the pages after those holding
// sinks): pages side by side in one buffer,
// `stride` bytes apart, so one attend dispatch reads a run of pages as one window and takes its
// position chunks in parallel (AttendWgsl's pieces, merged in chunk order by its fold) — where a
// buffer per page took a dispatch per page, each continuing the previous one's state, one after
// another (128 a layer at 32K positions with pages of 256). The bits are the same: each chunk's
// rows go through one workgroup in position order either way, and the chunks merge in order.
//
// A segment (one buffer) holds at most `segment_pages` pages: what one storage binding may span.
// Its buffer grows by doubling up to the pages the context can need (max_pages), the pages written
// so far copied into the new one in command order (the old buffer is destroyed after the submit
// of the commands that read it), so a short sequence holds little more than its pages. A growth
// holds the old buffer beside the new one until that submit, and every layer grows in the same
// step: at the last doubling up to half the context's pages again. Under a device budget
// (`grows` false) a segment is made at its full size at once instead, so the pages never exceed
// what the budget was checked against (KvPathOf: the context's bytes).
//
// In mixed mode (a layer's newest `ring` pages resident, older ones evicted to the host master)
// the pool is a ring: page i lives in slot i mod ring, the slots made at full size at once (the
// budget holds them: MixedCosts). An evicted page's slot is the next page's, written in command
// order after the commands that read the evicted one. A run of resident pages that does not wrap
// is one window; a run that wraps is two.

/** A page of the pool: its segment's buffer (the current one: it changes when the segment grows) and byte offset. */
class PoolPage {
  constructor(segment, slot, stride) {
    this.segment = segment;
    this.offset = slot * stride;
  }

  get buffer() { return this.segment.buffer; }
}

export class PagePool {
  /**
   * stride: bytes from a page to the next (PageBufferBytes: whole words); segment_pages: pages a
   * segment holds at most; max_pages: pages the context can need (Infinity: unknown); storage(bytes):
   * a new storage buffer, its bytes counted; free(buffer, deferred): uncounts it and destroys it,
   * after the next submit when `deferred` (commands recorded but not submitted read it); grows:
   * false makes each segment at its full size (a finite max_pages) instead of doubling; ring: > 0
   * for a ring of that many slots (made at full size; max_pages and grows then unused).
   */
  constructor({stride, segment_pages, max_pages = Infinity, storage, free, grows = true, ring = 0}) {
    if (!(segment_pages >= 1)) throw new Error(`a page pool needs segments of at least 1 page of ${stride} bytes (got ${segment_pages})`);
    if (ring) [max_pages, grows] = [ring, false];
    Object.assign(this, {stride, segment_pages, max_pages, storage, free, ring, grows: grows || max_pages === Infinity});
    this.segments = [];  // [{buffer [capacity][stride] bytes, capacity: pages}]
    this.pages = 0;      // pages handed out (a ring: one past the newest)
  }

  /**
   * The pool's page `index` (without a ring: the next one, this.pages). encoder: the command
   * encoder (no pass open) a growth's copy goes into, in command order; null: submitted at once on
   * `device`'s queue (no commands pending).
   */
  NewPage(device, encoder, index = this.pages) {
    if (!this.ring && index !== this.pages) throw new Error(`PagePool.NewPage: page ${index} asked for, the next is ${this.pages}`);
    const at = this.ring ? index % this.ring : index;  // the page's slot
    const s = Math.floor(at / this.segment_pages), slot = at % this.segment_pages;
    const most = Math.max(1, Math.min(this.segment_pages, this.max_pages - s * this.segment_pages));
    while (s >= this.segments.length) {  // (a ring's slots may be asked for out of order after a Truncate)
      const capacity = this.grows ? 1 : Math.max(1, Math.min(this.segment_pages, this.max_pages - this.segments.length * this.segment_pages));
      this.segments.push({buffer: this.storage(capacity * this.stride), capacity});
    }
    const segment = this.segments[s];
    if (slot >= segment.capacity) {
      const capacity = Math.min(most, Math.max(slot + 1, 2 * segment.capacity));
      const buffer = this.storage(capacity * this.stride);
      const own = !encoder;
      if (own) encoder = device.createCommandEncoder();
      encoder.copyBufferToBuffer(segment.buffer, 0, buffer, 0, slot * this.stride);
      if (own) device.queue.submit([encoder.finish()]);
      this.free(segment.buffer, !own);
      Object.assign(segment, {buffer, capacity});
    }
    this.pages = Math.max(this.pages, index + 1);
    return new PoolPage(segment, slot, this.stride);
  }

  /**
   * Keeps the first n pages (those after are dropped; a segment left empty is freed: a ring's
   * slots past the n pages' once fewer than its size).
   */
  Truncate(n) {
    if (n >= this.pages) return;
    this.pages = n;
    const keep = Math.ceil(Math.min(n, this.ring || Infinity) / this.segment_pages);
    for (const segment of this.segments.splice(keep)) this.free(segment.buffer, false);
  }

  Destroy() {
    for (const segment of this.segments) this.free(segment.buffer, false);
    this.segments = [];
    this.pages = 0;
  }
}

/**
 * The attend windows of a block (kv_resident_rows.js's PageWindows, or ResidentRows' plan of
 * RowsWindows) over a pool's pages as the attends take them: consecutive windows of encoded rows
 * within one segment, each from its page's start, joined into one (its rows run on through the
 * pages, AttendWgsl's s.pages). A window stays as it is when it reads rows from elsewhere: KIVI's
 * residual group (k.buffer), the ring of f32 rows (src 'ring') or a page's sinks (n_head), or when
 * its page is not in the pool: sinkN's pages before `first_pooled` (sinks in their own buffers),
 * mixed mode's evicted pages before `first_resident` (streamed through slots). P: positions per
 * page; pool page j is page first_pooled + j, in slot j mod `ring` for a ring (PagePool's).
 */
export function PoolWindows(windows, P, {segment_pages, first_pooled = 0, ring = 0, first_resident = 0}) {
  const pooled = (w) => !w.k.buffer && !w.v.buffer && w.k.src !== 'ring' && w.v.src !== 'ring' && !w.k.n_head &&
                        !w.v.n_head && w.i >= first_pooled && w.i >= first_resident;
  const segment = (w) => {  // [pass over the ring, segment]: pages in one segment lie side by side
    const j = w.i - first_pooled;
    return ring ? `${Math.floor(j / ring)}:${Math.floor((j % ring) / segment_pages)}` : `${Math.floor(j / segment_pages)}`;
  };
  const out = [];
  for (const w of windows) {
    const last = out[out.length - 1];
    if (last && pooled(last) && pooled(w) && last.first === last.i * P && w.first === w.i * P &&
        last.first + last.rows === w.first && segment(last) === segment(w)) {
      last.rows += w.rows;
      last.k = {...last.k, n_block: last.rows};
      last.v = {...last.v, n_block: last.rows};
    } else {
      out.push({...w});
    }
  }
  return out;
}

/**
 * Mixed mode's streamed windows (those of evicted pages, i < first_resident) given their streaming
 * slots, in order: each takes the next of `slots` slots from `next_slot` and gets stream {slot, pages:
 * the pages it reads, slot by slot from `slot`, flush: the slots are all written since the last
 * submit, so the commands so far are submitted first (a queue write lands before the whole command
 * buffer: a slot written again would lose its first page)}. With `join` (the slots side by side:
 * kv_resident.js's pooled attends) a window of a whole page of encoded rows joins the one before
 * when that one is such pages too, the page before it, and no flush comes between: one window whose
 * rows run on through the slots. The resident pages' windows pass as they are. Returns {windows,
 * next_slot}. P: positions per page.
 */
export function StreamWindows(windows, P, {first_resident, slots, next_slot, join}) {
  const whole = (w) => w.first === w.i * P && w.rows === P && w.k.n_block === P && w.v.n_block === P && !w.k.buffer &&
                       !w.v.buffer && w.k.src !== 'ring' && w.v.src !== 'ring' && !w.k.n_head && !w.v.n_head;
  const out = [];
  for (const w of windows) {
    if (w.i >= first_resident) {
      out.push(w);
      continue;
    }
    const flush = next_slot === slots;
    if (flush) next_slot = 0;
    const last = out[out.length - 1];
    if (join && !flush && last?.stream?.whole && whole(w) && last.stream.pages[last.stream.pages.length - 1] === w.i - 1) {
      last.rows += w.rows;
      last.k = {...last.k, n_block: last.rows};
      last.v = {...last.v, n_block: last.rows};
      last.stream.pages.push(w.i);
    } else {
      out.push({...w, stream: {slot: next_slot, pages: [w.i], flush, whole: whole(w)}});
    }
    ++next_slot;
  }
  return {windows: out, next_slot};
}
