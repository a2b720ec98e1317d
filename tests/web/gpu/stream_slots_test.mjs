// The mixed KV mode's streaming slots in Node (web/gpu/kv_resident_pool.js's StreamWindows,
// kv_resident_specs.js's StreamSlotsFor): which slot each streamed page takes, which windows join
// into one, where the slots are all written and the step's commands must be submitted first (a
// queue write lands before the whole command buffer), and how many slots a device budget buys.
// The page test (gpu_kv_mixed_page.js) checks the bits and dispatch counts on a GPU; this one the
// plan itself, case by case. Usage: node --test stream_slots_test.mjs
import assert from 'node:assert/strict';
import test from 'node:test';

import {StreamWindows} from '../../../web/gpu/kv_resident_pool.js';
import {KvPathOf, kMaxStreamSlots, kMinStreamSlots, kStreamBindingBytes, kStreamBudgetShare, MixedCosts, StreamSlotsFor}
  from '../../../web/gpu/kv_resident_specs.js';

const kP = 32;  // positions per page

// PageWindows' window of page i's rows [first, first + rows) of encoded rows (K blocks from 0, V's after).
const Window = (i, first = i * kP, rows = kP) => ({i, first, rows, k: {blocks: 0, head: 0, n_head: 0, n_block: rows},
                                                  v: {blocks: 4096 + (first - i * kP) * 8, head: 0, n_head: 0, n_block: rows}});
// [slot, pages, flush] per streamed window, or 'resident i' for a window passed as it was.
const Plan = (windows) => windows.map((w) => w.stream ? [w.stream.slot, w.stream.pages, w.stream.flush] : `resident ${w.i}`);

test('a layer\'s evicted pages fill the slots in turn, one window per run, a submit where they are all written', () => {
  const windows = [0, 1, 2, 3, 4, 5, 6].map((i) => Window(i)).concat([Window(7), Window(8, 8 * kP, 5)]);
  const got = StreamWindows(windows, kP, {first_resident: 7, slots: 3, next_slot: 2, join: true});
  assert.deepEqual(Plan(got.windows), [[2, [0], false], [0, [1, 2, 3], true], [0, [4, 5, 6], true], 'resident 7', 'resident 8']);
  assert.equal(got.next_slot, 3);
  // A joined window's rows run on through its pages: K and V counts with them.
  const run = got.windows[1];
  assert.deepEqual([run.first, run.rows, run.k.n_block, run.v.n_block, run.v.blocks], [kP, 3 * kP, 3 * kP, 3 * kP, 4096]);
  assert.equal(windows[1].rows, kP, 'the windows given are not changed');
});

test('without join (a buffer per slot: sinkN) each page is a window of its own', () => {
  const got = StreamWindows([0, 1, 2].map((i) => Window(i)), kP, {first_resident: 3, slots: 2, next_slot: 0, join: false});
  assert.deepEqual(Plan(got.windows), [[0, [0], false], [1, [1], false], [0, [2], true]]);
  assert.equal(got.next_slot, 1);
});

test('a window that reads sinks or another buffer takes its slot but joins nothing', () => {
  const sinks = {...Window(1), k: {...Window(1).k, n_head: 4}};
  const residual = {...Window(2), k: {...Window(2).k, buffer: {}}};
  const part = Window(3, 3 * kP + 8, kP - 8);  // not from its page's start
  const got = StreamWindows([Window(0), sinks, Window(1, kP + 4, kP - 4), residual, part, Window(4), Window(5)], kP,
                            {first_resident: 6, slots: 8, next_slot: 0, join: true});
  assert.deepEqual(Plan(got.windows), [[0, [0], false], [1, [1], false], [2, [1], false], [3, [2], false], [4, [3], false],
                                       [5, [4, 5], false]]);
});

test('pages that do not follow each other are not joined', () => {
  const got = StreamWindows([Window(0), Window(2)], kP, {first_resident: 3, slots: 4, next_slot: 0, join: true});
  assert.deepEqual(Plan(got.windows), [[0, [0], false], [1, [2], false]]);
});

test('the slots a budget buys: a share of it, at least two, at most the cap and one binding', () => {
  // A cache whose slot costs 1,000 bytes, a resident page (all layers) 4,000, 500 fixed besides the slots.
  const costs_of = (slots, least = 1) => ({slot: 1000, page: 4000, fixed: slots * 1000 + 500, least});
  assert.equal(StreamSlotsFor(0, costs_of), kMinStreamSlots);
  assert.equal(StreamSlotsFor(10000, costs_of), kMinStreamSlots);                  // a share of 1,250 bytes
  assert.equal(StreamSlotsFor(kStreamBudgetShare * 7000 + 999, costs_of), 7);      // floor(share / slot)
  assert.equal(StreamSlotsFor(1e9, costs_of), kMaxStreamSlots);
  const big = (slots) => ({slot: 2 ** 24, page: 1, fixed: slots * 2 ** 24, least: 1});
  assert.equal(StreamSlotsFor(1e12, big), kStreamBindingBytes / 2 ** 24);          // side by side in one binding: 8
  // Fewer slots where the share would leave fewer resident pages than the least: 40,000 bytes buy
  // 5 slots, leaving (40,000 − 5,500) / 4,000 = 8 pages; 4 slots 8 too; 3 slots 9.
  assert.equal(StreamSlotsFor(40000, (slots) => costs_of(slots, 8)), 5);
  assert.equal(StreamSlotsFor(40000, (slots) => costs_of(slots, 9)), 3);
  assert.equal(StreamSlotsFor(40000, (slots) => costs_of(slots, 100)), kMinStreamSlots);  // too small either way: the caller says so
});

test('MixedCosts counts the slots it is given', () => {
  const layout = {page_bytes: 1000, page_positions: kP, max_positions: 1024};
  const c = {n_cache_layers: 2, kv_dim: 64, rotary_dims: 32};
  const two = MixedCosts(layout, c, 'int8', 'int8'), five = MixedCosts(layout, c, 'int8', 'int8', 5);
  assert.equal(two.slot, 1000);
  assert.equal(five.fixed - two.fixed, 3 * two.slot);
});

test('the mixed path takes the slots the budget buys, or the ones given kept within their bounds', () => {
  const layout = {page_bytes: 1000, page_positions: kP, max_positions: 32 * kP};
  const c = {n_cache_layers: 2, kv_dim: 64, rotary_dims: 32};
  const Path = (budget, stream_slots = 0) => KvPathOf({kv_k: 'int8', kv_v: 'int8', want: 'auto', budget, total: 1e6, layout,
                                                       c, on_cpu: false, stream_slots});
  const bought = Path(40000);  // 5 slots of 1,000 bytes (its share), 17 pages of 2 × 1,000 after them
  assert.deepEqual([bought.path, bought.stream_slots, bought.resident_pages], ['mixed', 5, 17]);
  assert.match(bought.why, /through 5 slots/);
  assert.equal(Path(40000, 1).stream_slots, kMinStreamSlots);
  assert.equal(Path(400000, 1000).stream_slots, kMaxStreamSlots);
  assert.deepEqual([Path(40000, 3).stream_slots, Path(40000, 3).resident_pages], [3, 18]);
  assert.equal(Path(2e6).stream_slots, 0);  // the context fits: resident, no slots
});
