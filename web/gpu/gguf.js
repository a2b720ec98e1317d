// A GGUF file's metadata and tensor table (the layout of src/gguf/gguf_reader.h, version 2 and 3,
// little-endian), enough to find a Llama model's tensors for web/gpu/forward.js. Every length is
// checked against the file before it is used; an error names what was wrong.

const kGgmlTypes = {0: 'f32', 1: 'f16', 8: 'q8_0', 2: 'q4_0', 30: 'bf16', 41: 'q1_0'};
const kValueBytes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8};  // by GGUF value type

/** {metadata: Map(key → value), tensors: Map(name → {dims, type, ggml_type, at}), data_at}. */
export function ParseGguf(buffer) {
  const view = new DataView(buffer);
  let at = 0;
  const need = (n, what) => {
    if (at + n > buffer.byteLength) throw new Error(`GGUF truncated: ${what} at byte ${at} needs ${n} bytes`);
  };
  const u32 = (what) => (need(4, what), at += 4, view.getUint32(at - 4, true));
  const u64 = (what) => {
    need(8, what);
    const v = view.getBigUint64(at, true);
    at += 8;
    if (v > BigInt(Number.MAX_SAFE_INTEGER)) throw new Error(`GGUF ${what} ${v} is implausible`);
    return Number(v);
  };
  const string = (what) => {
    const n = u64(`${what} length`);
    need(n, what);
    const s = new TextDecoder().decode(new Uint8Array(buffer, at, n));
    at += n;
    return s;
  };
  const value = (type, what) => {
    if (type === 8) return string(what);
    if (type === 9) {
      const inner = u32(`${what} array type`), n = u64(`${what} array length`);
      if (inner === 8 || inner === 9) {
        const out = [];
        for (let i = 0; i < n; ++i) out.push(value(inner, what));
        return out;
      }
      const size = kValueBytes[inner];
      if (!size) throw new Error(`GGUF ${what}: unknown array element type ${inner}`);
      need(n * size, what);
      at += n * size;  // numeric arrays (token scores, types): skipped, not needed here
      return {array_of: inner, length: n};
    }
    const size = kValueBytes[type];
    if (!size) throw new Error(`GGUF ${what}: unknown value type ${type}`);
    need(size, what);
    const o = at;
    at += size;
    switch (type) {
      case 0: return view.getUint8(o);
      case 1: return view.getInt8(o);
      case 2: return view.getUint16(o, true);
      case 3: return view.getInt16(o, true);
      case 4: return view.getUint32(o, true);
      case 5: return view.getInt32(o, true);
      case 6: return view.getFloat32(o, true);
      case 7: return view.getUint8(o) !== 0;
      case 12: return view.getFloat64(o, true);
      default: return Number(view.getBigInt64(o, true));
    }
  };
  if (u32('magic') !== 0x46554747) throw new Error('not a GGUF file (bad magic)');
  const version = u32('version');
  if (version !== 2 && version !== 3) throw new Error(`GGUF version ${version} is not read (2 and 3 are)`);
  const n_tensors = u64('tensor count'), n_kv = u64('metadata count');
  const metadata = new Map();
  for (let i = 0; i < n_kv; ++i) {
    const key = string('a metadata key');
    metadata.set(key, value(u32(`${key} type`), key));
  }
  const infos = [];
  for (let i = 0; i < n_tensors; ++i) {
    const name = string('a tensor name');
    const n_dims = u32(`${name} dims`);
    if (n_dims > 4) throw new Error(`GGUF tensor ${name}: ${n_dims} dimensions`);
    const dims = [];
    for (let d = 0; d < n_dims; ++d) dims.push(u64(`${name} dim`));
    const ggml_type = u32(`${name} type`);
    infos.push({name, dims, ggml_type, type: kGgmlTypes[ggml_type], offset: u64(`${name} offset`)});
  }
  const alignment = metadata.get('general.alignment') ?? 32;
  const data_at = Math.ceil(at / alignment) * alignment;
  const tensors = new Map();
  for (const t of infos) tensors.set(t.name, {dims: t.dims, type: t.type, ggml_type: t.ggml_type, at: data_at + t.offset});
  return {metadata, tensors, data_at};
}

/**
 * The model web/gpu/forward.js runs, from a GGUF of architecture llama: the config and where each
 * tensor lies in the file ({type, at}), matrices in any type GpuMatvec reads, norms F32.
 */
export function LlamaFromGguf(buffer) {
  const g = ParseGguf(buffer);
  const arch = g.metadata.get('general.architecture');
  if (arch !== 'llama') throw new Error(`the GPU forward runs GGUF architecture llama (this file: ${arch})`);
  const key = (k, fallback) => {
    const v = g.metadata.get(`llama.${k}`);
    if (v === undefined && fallback === undefined) throw new Error(`GGUF: llama.${k} is missing`);
    return v ?? fallback;
  };
  const c = {dim: key('embedding_length'), hidden_dim: key('feed_forward_length'), n_layers: key('block_count'),
             n_heads: key('attention.head_count'), seq_len: key('context_length'),
             rope_theta: key('rope.freq_base', 10000), norm_eps: key('attention.layer_norm_rms_epsilon', 1e-5)};
  c.n_kv_heads = key('attention.head_count_kv', c.n_heads);
  c.head_dim = key('attention.key_length', c.dim / c.n_heads);
  if (c.head_dim * c.n_heads !== c.dim) throw new Error('the GPU forward needs n_heads · head_dim = dim');
  c.kv_dim = c.head_dim * c.n_kv_heads;
  const tensor = (name, type_check = true) => {
    const t = g.tensors.get(name);
    if (!t) throw new Error(`GGUF: tensor ${name} is missing`);
    if (type_check && !t.type) throw new Error(`GGUF: tensor ${name} has ggml type ${t.ggml_type}, which the GPU path does not read`);
    return t;
  };
  const norm = (name) => {
    const t = tensor(name);
    if (t.type !== 'f32') throw new Error(`GGUF: ${name} is ${t.type}; norms must be F32`);
    return t;
  };
  const embd = tensor('token_embd.weight');
  c.vocab_size = embd.dims[1];
  const layers = [];
  for (let l = 0; l < c.n_layers; ++l) {
    const b = `blk.${l}.`;
    layers.push({attn_norm: norm(b + 'attn_norm.weight'), wq: tensor(b + 'attn_q.weight'), wk: tensor(b + 'attn_k.weight'),
                 wv: tensor(b + 'attn_v.weight'), wo: tensor(b + 'attn_output.weight'),
                 ffn_norm: norm(b + 'ffn_norm.weight'), w1: tensor(b + 'ffn_gate.weight'),
                 w2: tensor(b + 'ffn_down.weight'), w3: tensor(b + 'ffn_up.weight')});
  }
  return {config: c, bytes: buffer, tensors: {token_embedding: embd, rms_final: norm('output_norm.weight'), layers,
          classifier: g.tensors.has('output.weight') ? tensor('output.weight') : embd}};
}
