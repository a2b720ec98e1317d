// Checks what the model files a user picked (File API) are from their first bytes, before they go
// to the worker, which reads them into the module a chunk at a time (no whole copy is made here).
// Loaded by app.js with import() on first use: the bundled model never needs it.

const kGgufMagic = 0x46554747;  // "GGUF", little-endian

function Fail(file, what) {
  throw new Error(`${file.name}: ${what}`);
}

// Returns 'gguf' or 'llama2c' from the first bytes; a llama2.c checkpoint opens with seven int32s
// (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size (negative = unshared classifier), seq_len).
function Kind(file, bytes) {
  if (bytes.byteLength < 28) Fail(file, `${bytes.byteLength} bytes: too short for a GGUF or a llama2.c model`);
  const view = new DataView(bytes);
  if (view.getUint32(0, true) === kGgufMagic) return 'gguf';
  const header = Array.from({length: 7}, (_, i) => view.getInt32(4 * i, true));
  const [dim, hidden, layers, heads, kv_heads, vocab, seq] = header;
  const positive = [dim, hidden, layers, heads, kv_heads, seq].every((v) => v > 0) && vocab !== 0;
  if (!positive || dim % heads !== 0 || heads % kv_heads !== 0) {
    Fail(file, `neither GGUF (no "GGUF" magic) nor a llama2.c checkpoint (header ${header.join(', ')})`);
  }
  return 'llama2c';
}

// model_file: File; tokenizer_file: File or null.
// Returns {model: {name, kind, file: File}, tokenizer: {name, file: File} | null}.
export async function CheckModelFiles(model_file, tokenizer_file) {
  if (!model_file) throw new Error('pick a model file first');
  const kind = Kind(model_file, await model_file.slice(0, 28).arrayBuffer());
  let tokenizer = null;
  if (kind === 'llama2c') {
    if (!tokenizer_file) {
      Fail(model_file, 'a llama2.c checkpoint has no vocabulary: pick its tokenizer .bin too (e.g. tok512.bin)');
    }
    tokenizer = {name: tokenizer_file.name, file: tokenizer_file};
  }
  // A GGUF carries its own vocabulary: a picked tokenizer is not used.
  return {model: {name: model_file.name, kind, file: model_file}, tokenizer};
}
