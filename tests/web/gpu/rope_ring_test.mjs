// web/gpu/kv_resident_rope.js's ResidentRopeTable in Node, on a recording stand-in for the
// GPUDevice (the class calls only queue.writeBuffer and, without a ring, createBuffer): what each
// queue write carries and where, the ring's row of each position, and the throw that keeps a ring
// page from being written again while commands not yet submitted read it (a queue write lands
// before the whole command buffer, so that block would read the new page's cos/sin for the old
// page's positions). The rows are the positions themselves (rope(p)[j] = 1000·p + j), so a row in
// the wrong place is a wrong number. Usage: node rope_ring_test.mjs
import assert from 'node:assert/strict';
import test from 'node:test';

import {ResidentRopeTable} from '../../../web/gpu/kv_resident_rope.js';

globalThis.GPUBufferUsage ??= {STORAGE: 0x80, COPY_DST: 0x8};

const kDims = 4;  // rotary_dims: floats per position's row
const kP = 4;     // positions per page

const Rope = (p) => Float32Array.from({length: kDims}, (_, j) => 1000 * p + j);

// A device whose buffers are Float32Arrays and whose queue writes land at once, each one logged
// as {buffer, row: first row written, rows} (rows of kDims floats).
function RecordingDevice() {
  const device = {
    writes: [],
    created: [],
    createBuffer({size}) {
      const b = {size, data: new Float32Array(size / 4), destroyed: false, destroy() { this.destroyed = true; }};
      device.created.push(b);
      return b;
    },
    queue: {
      writeBuffer(buffer, offset, src, src_offset = 0, count = src.length - src_offset) {
        assert.equal(offset % (4 * kDims), 0, 'a write starts at a row');
        assert.equal(count % kDims, 0, 'a write is whole rows');
        buffer.data.set(src.subarray(src_offset, src_offset + count), offset / 4);
        device.writes.push({buffer, row: offset / (4 * kDims), rows: count / kDims});
      },
    },
  };
  return device;
}

// Row `row` of the GPU buffer holds position pos's cos/sin.
function ExpectRow(buffer, row, pos) {
  assert.deepEqual(Array.from(buffer.data.subarray(row * kDims, (row + 1) * kDims)), Array.from(Rope(pos)),
                   `row ${row} holds position ${pos}`);
}

test('a ring of 2 pages: each page written once into slot page mod 2, each position at Row(pos)', () => {
  const device = RecordingDevice();
  const ring = {pages: 2, buffer: device.createBuffer({size: 2 * kP * kDims * 4})};
  const table = new ResidentRopeTable(device, kDims, kP, Rope, () => assert.fail('a ring retires nothing'), ring);
  table.Cover(0, 6);  // pages 0 and 1
  assert.deepEqual(device.writes.map((w) => [w.row, w.rows]), [[0, kP], [kP, kP]]);
  for (let pos = 0; pos < 2 * kP; ++pos) ExpectRow(ring.buffer, table.Row(pos), pos);
  table.Cover(1, 8);  // page 1 again: already in its slot, nothing written
  assert.equal(device.writes.length, 2);
  table.Submitted();
  table.Cover(1, 12);  // page 2 replaces page 0 in slot 0
  assert.deepEqual(device.writes.slice(2).map((w) => [w.row, w.rows]), [[0, kP]]);
  for (let pos = kP; pos < 3 * kP; ++pos) ExpectRow(ring.buffer, table.Row(pos), pos);
  assert.equal(table.Row(9), 1, 'position 9: page 2, slot 0, row 1');
  for (let i = 0; i < 3; ++i) assert.deepEqual(Array.from(table.Rows(i)), Array.from({length: kP}, (_, k) => Array.from(Rope(i * kP + k))).flat());
});

test('a ring page read since the last submit is never written again before the next submit', () => {
  const device = RecordingDevice();
  const ring = {pages: 2, buffer: device.createBuffer({size: 2 * kP * kDims * 4})};
  const table = new ResidentRopeTable(device, kDims, kP, Rope, () => {}, ring);
  table.Cover(0, 2 * kP);  // pages 0 and 1, both read by the commands recorded so far
  const before = Array.from(ring.buffer.data);
  assert.throws(() => table.Cover(1, 2 * kP + 1), /the rope ring's page 0 holds page 0, read by commands not yet submitted, and page 2 would replace it/);
  assert.deepEqual(Array.from(ring.buffer.data), before, 'the refused cover wrote nothing');
  table.Submitted();
  table.Cover(2, 2 * kP + 1);  // after the submit the slot is free again
  ExpectRow(ring.buffer, table.Row(2 * kP), 2 * kP);
  // A block that itself reads more pages than the ring holds is refused too.
  table.Submitted();
  assert.throws(() => table.Cover(2, 5 * kP), /the blocks since the submit read more pages than the ring holds/);
});

test('without a ring: a table by position, replaced by a larger one (filled from the host copy) as it grows', () => {
  const device = RecordingDevice();
  const retired = [];
  const table = new ResidentRopeTable(device, kDims, kP, Rope, (b) => retired.push(b));
  table.Cover(0, 3);  // page 0
  const first = table.buffer;
  for (let pos = 0; pos < kP; ++pos) ExpectRow(first, table.Row(pos), pos);
  table.Cover(0, 3 * kP);  // pages 1 and 2: the table outgrown
  assert.deepEqual(retired, [first], 'the outgrown table retired (destroyed after the submit), not destroyed at once');
  assert.equal(first.destroyed, false);
  assert.notEqual(table.buffer, first);
  for (let pos = 0; pos < 3 * kP; ++pos) {
    assert.equal(table.Row(pos), pos);
    ExpectRow(table.buffer, pos, pos);
  }
  assert.equal(table.bytes, table.buffer.size);
  table.Cover(0, 3 * kP);  // covered: no write
  const writes = device.writes.length;
  table.Cover(0, 2 * kP);
  assert.equal(device.writes.length, writes);
});
