// Fuzz target: GGUF files. The reader (GgufFile::Open, every metadata value formatted and read back
// through the typed getters, every tensor found by name), then LoadModel over the same file — the
// loader of every architecture kvq runs (llama, mistral, qwen2, qwen3: general.architecture picks
// the path), the weight repacking and the GGUF vocabulary (also loaded on its own, and used to
// encode a text) — and, when a model loads, one forward
// token: a file the loader accepts must be one the forward pass can run.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "gguf/gguf_reader.h"
#include "kvq/format.h"
#include "kvq/kv_cache.h"
#include "model/decoder.h"
#include "model/load_model.h"
#include "text/tokenizer.h"

namespace kvq::fuzz {

namespace {

void ExerciseReader(const GgufFile& file) {
  for (const GgufKeyValue& kv : file.metadata()) {
    (void)FormatGgufValue(kv.value, 4);
    if (file.Find(kv.key) == nullptr) Fail("gguf", "key " + kv.key + " is listed but not found");
    // Each getter either returns a value or an error; none may crash on any type.
    (void)file.GetString(kv.key);
    (void)file.GetU32(kv.key);
    (void)file.GetI32(kv.key);
    (void)file.GetU64(kv.key);
    (void)file.GetI64(kv.key);
    (void)file.GetF32(kv.key);
    (void)file.GetBool(kv.key);
    (void)file.GetStringArray(kv.key);
    (void)file.GetF32Array(kv.key);
    (void)file.GetI32Array(kv.key);
    Result<const GgufArray*> array = file.GetArray(kv.key);
    if (array.ok() && GgufScalarBytes((*array)->element_type) > 0 && (*array)->size > 0) {
      (void)(*array)->NumberAt(0);
      (void)(*array)->NumberAt((*array)->size - 1);
    }
  }
  for (const GgufTensor& t : file.tensors()) {
    Result<const GgufTensor*> found = file.FindTensor(t.name);
    if (!found.ok()) Fail("gguf", "tensor " + t.name + " is listed but not found");
    // Its extent was validated against the mapping: touch the first and last byte.
    if (t.n_bytes > 0) {
      volatile uint8_t first = t.data[0];
      volatile uint8_t last = t.data[t.n_bytes - 1];
      (void)first;
      (void)last;
    }
  }
}

// One token through the loaded model into a 2-position f32 cache.
void RunOneToken(LoadedModel& loaded) {
  const DecoderConfig c = loaded.weights.config;
  // Bound the work per input (a tiny seed has dim 16): bigger models are only loaded.
  if (static_cast<int64_t>(c.dim) * c.n_layers > (int64_t{1} << 16) || c.vocab_size > 4096) return;
  Result<const FormatDesc*> f32 = FindFormat("f32");
  if (!f32.ok()) Fail("gguf", "no f32 format");
  KvCacheConfig cc;
  cc.n_layers = c.n_attention_layers();  // a hybrid's cache: its attention layers and its state
  cc.state_floats = c.state_floats();
  cc.n_kv_heads = c.n_kv_heads;
  cc.head_dim = c.head_dim();
  cc.layers = {LayerFormats::Both(*f32)};
  cc.key_rope = ModelRopeConfig(c);
  cc.max_positions = 2;
  cc.page_positions = 32;
  Result<std::unique_ptr<KvCache>> cache = KvCache::Create(cc);
  if (!cache.ok()) return;  // a shape the cache refuses is refused by name, not run
  DecoderModel model(std::move(loaded.weights), 1);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));  // [vocab_size]
  const std::vector<int32_t> ids = loaded.tokenizer.Encode("Once", /*add_bos=*/true);
  const int32_t token = ids.empty() ? 0 : ids.back();
  if (token < 0 || token >= c.vocab_size) Fail("gguf", "Encode returned a token outside the vocabulary");
  (void)model.Forward(token, 0, **cache, logits.data());
}

}  // namespace

int FuzzGguf(const uint8_t* data, size_t size) {
  const std::string path = WriteInput(data, size, "input.gguf");
  Result<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  if (file.ok()) {
    ExerciseReader(**file);
    // The vocabulary on its own (LoadModel reaches it only past valid weights).
    Result<Tokenizer> loaded = Tokenizer::LoadGguf(**file);
    if (loaded.ok()) {
      Tokenizer tokenizer = std::move(loaded).value();
      tokenizer.set_notice_sink([](std::string_view) {});
      for (int32_t id : tokenizer.Encode("Once upon a time \xe2\x96\x81<|endoftext|>\xff", true)) {
        if (id < 0 || id >= tokenizer.vocab_size()) Fail("gguf", "Encode returned id " + std::to_string(id));
      }
    }
  }
  Result<LoadedModel> model = LoadModel(path, "");
  if (model.ok()) {
    LoadedModel owned = std::move(model).value();
    RunOneToken(owned);
  }
  return 0;
}

}  // namespace kvq::fuzz

KVQ_FUZZ_TARGET(FuzzGguf)
