// Which KV specs the resident path (kv_resident.js) holds on the GPU, and what their transforms
// cost it per block (moved out of kv_resident.js so it stays small; it re-exports these).

import {kEncoderFormats, kGroupKeyEncoderFormats, KeyRowsPerBlock} from './kv_formats.js';
import {RowsSpecOf} from './kv_resident_rows.js';

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
 * grouped keys, sinkN / resN and prerope do not take yet: their f32 rows are not in
 * ResidentPagesFor's budget, and kvq's slot plan for them (a page and the f32 rows per slot) asks
 * more than the mixed mode's streaming slots; prerope keys would read their streamed windows'
 * cos/sin from the table as the resident ones do, but no test runs the mixed mode with them.
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
  if (over && KeyRowsPerBlock(SplitKvSpec(kv_k).format) > 1) {
    return `the context is over the device budget and the mixed mode does not take keys in groups (KIVI, fp8-e4m3: "${kv_k}")`;
  }
  if (over && rows) return `the context is over the device budget and the mixed mode does not take sinkN / resN ("${kv_k}")`;
  if (over && SplitKvSpec(kv_k).transforms.includes('prerope')) {
    return `the context is over the device budget and the mixed mode does not take prerope keys yet ("${kv_k}": not tested)`;
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
