// Which KV specs the resident path (kv_resident.js) holds on the GPU, what their transforms cost
// it per block, and what its mixed mode holds on the GPU for them under a device budget (moved out
// of kv_resident.js so it stays small; it re-exports these).

import {kEncoderFormats, kGroupKeyEncoderFormats, KeyRowsPerBlock} from './kv_formats.js';
import {RingPositions, RowsResidentPages, RowsSpecOf} from './kv_resident_rows.js';

/** A KV spec (FORMAT[+TRANSFORM...], kvq's ParseKvSpec) as {format, transforms: [names]}. */
export function SplitKvSpec(spec) {
  const [format, ...transforms] = spec.split('+');
  return {format, transforms};
}

/**
 * Why the resident path cannot hold a cache of these specs ('' when it can): both tensors need a
 * WGSL encoder and no transform but rot, sinkN, resN and (keys) prerope (kv_resident_rows.js:
 * the same N for K and V, not with rot; kv_resident_rope.js: the pages hold the keys before RoPE,
 * roped as the attends read them; kvq itself takes prerope with no rot); grouped keys, KIVI's and
 * fp8-e4m3's, take no rot. over: the context is over the device budget (the mixed mode), which
 * takes grouped keys (their f32 newest-group buffers in MixedCosts), prerope keys (the cos/sin
 * rows of the resident pages in a ring, a streamed page's beside it in its slot) and sinkN / resN
 * (the ring of f32 rows and the sinks in MixedCosts, a page evicted once the master encoded all
 * its rows: RowsResidentPages; a streamed page's sinks written beside its bytes in the slot), with
 * prerope keys too (a streamed page's cos/sin rows in its slot serve its sinks as its blocks).
 */
export function ResidentWhyNot(kv_k, kv_v, over = false) {
  const encoders = [...kEncoderFormats, ...kGroupKeyEncoderFormats];
  for (const [what, spec] of [['key', kv_k], ['value', kv_v]]) {
    const {format, transforms} = SplitKvSpec(spec);
    if (!encoders.includes(format)) {
      return `the ${what} spec "${spec}" has no GPU encoder (encoders: ${encoders.join(', ')})`;
    }
    // prerope: the keys' (one spec for both, as the module takes it: the key's alone).
    const key_only = (t) => t === 'prerope' && (what === 'key' || kv_v === kv_k);
    const other = transforms.filter((t) => t !== 'rot' && !/^(sink|res)\d+$/.test(t) && !key_only(t));
    if (other.length) {
      return `the ${what} spec "${spec}" has the transform${other.length > 1 ? 's' : ''} ${other.join(', ')}, which ` +
             'the GPU encoders do not apply (resident: rot, sinkN, resN; keys also prerope)';
    }
    if (transforms.includes('rot') && KeyRowsPerBlock(format) > 1) {
      return `the ${what} spec "${spec}" has rot and keys in groups of ${KeyRowsPerBlock(format)} rows, which the GPU encoders do not rotate`;
    }
  }
  const rows = RowsSpecOf(kv_k, kv_v);
  if (rows?.why) return rows.why;
  if (rows && RotationSlots(kv_k, kv_v)) {
    return `sinkN / resN with rot ("${kv_k}", "${kv_v}"): pages are written behind as rows the master rotates, and the GPU's are rotated`;
  }
  return '';
}

/**
 * Head-op dispatches (and uniform slots) per layer and block for these specs: rotated keys, the
 * rows' rotation and the queries'; rotated values, the rows' rotation and the output's unrotation.
 */
export function RotationSlots(kv_k, kv_v) {
  return [kv_k, kv_v].filter((spec) => SplitKvSpec(spec).transforms.includes('rot')).length * 2;
}

const Ceil4 = (n) => Math.ceil(n / 4) * 4;

/** GPU bytes of one page buffer (resident or streaming slot): whole words, at least 16. */
export function PageBufferBytes(page_bytes) { return Math.max(16, Ceil4(page_bytes)); }

/**
 * Streaming slots of a mixed-mode cache (kv_resident.js): at least two, so consecutive streamed
 * windows use different buffers; at most kMaxStreamSlots, and slots of one cache take at most
 * 1 / kStreamBudgetShare of the device budget and, side by side in one buffer, at most
 * kStreamBindingBytes (the storage binding every WebGPU device takes). The slots are written in
 * turn and a run of a layer's streamed pages in consecutive slots is one attend window, its
 * position chunks in parallel; a step submits its commands so far once the slots are all written
 * (a queue write lands before the whole command buffer). So more slots mean fewer dispatches and
 * submits per step, each slot costing a resident page's share of the budget.
 */
export const kMinStreamSlots = 2;
export const kMaxStreamSlots = 64;
export const kStreamBudgetShare = 8;
export const kStreamBindingBytes = 128 * 1024 * 1024;

// The most streaming slots of `slot_bytes` each: kMaxStreamSlots, and side by side within one
// binding (but kMinStreamSlots however large a slot is: then each a buffer of its own).
const MostStreamSlots = (slot_bytes) =>
  Math.max(kMinStreamSlots, Math.min(kMaxStreamSlots, Math.floor(kStreamBindingBytes / slot_bytes)));

/**
 * The streaming slots a mixed-mode cache takes under `budget` bytes (see kMinStreamSlots):
 * costs_of(slots) is MixedCosts with that many slots; least: the resident pages per layer it must
 * keep (MixedCosts' least). Fewer than the share allows when the resident pages would fall under
 * least; kMinStreamSlots when even they do (the caller then says the budget is too small).
 */
export function StreamSlotsFor(budget, costs_of) {
  const one = costs_of(kMinStreamSlots);
  let slots = Math.min(MostStreamSlots(one.slot), Math.floor(budget / kStreamBudgetShare / one.slot));
  while (slots > kMinStreamSlots && ResidentPagesFor(budget, costs_of(slots)) < one.least) --slots;
  return Math.max(kMinStreamSlots, slots);
}

/**
 * The GPU bytes a mixed-mode cache of these specs holds (kv_resident.js allocates exactly these,
 * counted in its kv_bytes): {slot: a streaming slot (a page buffer, with prerope keys the page's
 * cos/sin rows [P][rotary_dims] f32 beside it, with sinkN page 0's sinks [2][sinks][kv_dim] f32
 * after its bytes); page: a resident page of every layer (with prerope its cos/sin rows in the
 * ring: kv_resident_rope.js); fixed: `slots` streaming slots (StreamSlotsFor), each layer's f32 newest-group buffer for
 * keys in groups ([G][kv_dim] f32) and, with sinkN / resN (kv_resident_rows.js), each layer's ring
 * ([2][RingPositions][kv_dim] f32) and sinks beside its pages ([2][sinks][kv_dim] f32), the
 * cache's zero row ([kv_dim] f32) and encoder scratch ([max(P, G)][kv_dim] f32); least: the
 * resident pages per layer it needs (sinkN / resN: RowsResidentPages, the pages whose rows the
 * master has not all encoded yet; else 1)}. layout: kvq_web_kv_page_layout's; c: the step
 * program's config; kv_k, kv_v: the specs.
 */
export function MixedCosts(layout, c, kv_k, kv_v = kv_k, slots = kMinStreamSlots) {
  const {format, transforms} = SplitKvSpec(kv_k);
  const unit = PageBufferBytes(layout.page_bytes), G = KeyRowsPerBlock(format), P = layout.page_positions;
  const rope = transforms.includes('prerope') ? Math.max(16, P * c.rotary_dims * 4) : 0;
  const spec = RowsSpecOf(kv_k, kv_v), rows = spec?.why ? null : spec, row_bytes = c.kv_dim * 4;
  const residual = G > 1 && !rows ? Math.max(16, G * c.kv_dim * 4) : 0;  // with rows the ring holds them
  const sinks = rows ? 2 * Math.min(rows.sinks, P) * row_bytes : 0;  // in a slot: page 0's
  const per_layer = residual + (rows ? 2 * (rows.sinks + RingPositions(P, G, rows)) * row_bytes : 0);
  const once = rows ? Math.max(16, row_bytes) + Math.max(P, G) * row_bytes : 0;
  return {slot: unit + rope + sinks, page: c.n_cache_layers * unit + rope,
          fixed: slots * (unit + rope + sinks) + c.n_cache_layers * per_layer + once,
          least: rows ? RowsResidentPages(P, [G, 1], rows) : 1};
}

/**
 * Pages per layer a device budget keeps resident when it is under the context: what is left of
 * `budget_bytes` after MixedCosts' fixed bytes, over its bytes per resident page (0: not even the
 * tail fits).
 */
export function ResidentPagesFor(budget_bytes, costs) {
  return Math.max(0, Math.floor((budget_bytes - costs.fixed) / costs.page));
}

/**
 * The KV path of a sequence (gpu_engine.js's NewSequence): {path: 'resident' | 'mixed' | 'stream',
 * why: a sentence saying why, resident_pages: per layer when over the budget, else Infinity,
 * resident_bytes: the GPU bytes of KV the resident path holds at most for the whole context,
 * stream_slots: the mixed mode's streaming slots (StreamSlotsFor; 0 on the other paths)}.
 * want: 'auto' or 'stream'; budget: the device budget in bytes (0: none); total: the plan's bytes
 * of the context (the module's cache: pages and its f32 rows); layout: kvq_web_kv_page_layout's; c:
 * the step program's config; on_cpu: no device; stream_slots: the mixed mode's slots when given
 * (tests), else StreamSlotsFor's. The budget must hold both: the GPU keeps a key
 * group's f32 rows whole ([G][kv_dim], one row more than the module's cache ever holds), and a
 * page buffer is whole words where the plan's is 64-byte aligned.
 */
export function KvPathOf({kv_k, kv_v, want, budget, total, layout, c, on_cpu, stream_slots = 0}) {
  const costs_of = (slots) => MixedCosts(layout, c, kv_k, kv_v, slots);
  const most = MostStreamSlots(costs_of(kMinStreamSlots).slot);  // given slots (tests) kept within the bounds
  const slots = stream_slots ? Math.min(most, Math.max(kMinStreamSlots, stream_slots)) : StreamSlotsFor(budget, costs_of);
  const costs = costs_of(slots);
  // Every page resident (pools made at full size under a budget: kv_resident_pool.js), no slots.
  const max_pages = layout.max_positions > 0 ? Math.ceil(layout.max_positions / layout.page_positions) : 0;
  const resident_bytes = costs.fixed - slots * costs.slot + max_pages * costs.page;
  const needed = Math.max(total, resident_bytes);
  const over = budget > 0 && budget < needed;  // the context does not fit the device budget
  const resident_pages = over ? ResidentPagesFor(budget, costs) : Infinity;
  const why_not = want === 'stream' ? 'the stream path was asked for' : ResidentWhyNot(kv_k, kv_v, over) ||
      (over && resident_pages < costs.least ?
       `the device budget (${budget} bytes) is under the context's ${needed} and holds less than ${slots} ` +
       `streaming slots, ${costs.least} page${costs.least === 1 ? '' : 's'} per layer${costs.least > 1 ? ' (resN: the pages ' +
       'whose rows the master has not all encoded)' : ''} and the f32 rows beside them (${costs.fixed + costs.least * costs.page} bytes)` : '');
  const path = why_not || on_cpu ? 'stream' : over ? 'mixed' : 'resident';
  const why = why_not ? `KV streamed from the module: ${why_not}; prefill runs token by token (each layer's ` +
                        'K and V rows are read back into the master before its attention)' : !over ?
      'KV resident on the GPU: the specs have WGSL encoders (a rot spec\'s rows rotated there first; sinkN / resN ' +
      'rows kept f32 there, full pages written behind as rows; prerope keys encoded before RoPE, roped as read) ' +
      'and the budget holds the context' :
      `KV mixed: the device budget (${budget} bytes) is under the context's ${needed}, so the newest ` +
      `${resident_pages} page${resident_pages === 1 ? '' : 's'} of ${layout.page_positions} positions ` +
      `per layer stay resident on the GPU (encoded there) and older pages stream from the module's master through ` +
      `${slots} slots`;
  return {path, why, resident_pages, resident_bytes: needed, stream_slots: path === 'mixed' ? slots : 0};
}
