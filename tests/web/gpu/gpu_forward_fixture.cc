// Writes the WebGPU forward test's inputs (tests/web/gpu/gpu_forward_page.js):
// - for each of run.c's golden greedy runs of the bundled stories260K (golden-runc-ids.txt), its ids,
//   how many of them are BOS + prompt (kvq's tokenizer), and native kvq's logits after each id but
//   the last (LlamaModel, f32 KV, one thread);
// - tiny Llama GGUFs kvq synth writes with every matrix in F16, BF16, Q8_0, Q4_0 and Q1_0 (random
//   weights, the bundled vocabulary), and the logits of the run.c-style reference forward
//   (test_util/reference_forward.h: scalar decode, f32 activations, sums in order — what the GPU
//   computes; kvq's fast matvec quantises the activation to int8 for the block types instead)
//   along the first golden run's first 48 ids.
// The page compares the GPU's logits with them within the tolerance it states.
// Output: DIR/manifest.json, DIR/golden<i>.bin and DIR/<type>.bin ([n − 1][vocab] f32 logits), DIR/<type>.gguf.
// Usage: gpu_forward_fixture DIR
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvq/format.h"
#include "kvq/kv_cache.h"
#include "model/llama.h"
#include "model/load_model.h"
#include "synth/synth.h"
#include "test_util/golden_runc.h"
#include "test_util/reference_forward.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    fmt::print(stderr, "usage: gpu_forward_fixture DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  const std::string models = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";
  kvq::Result<kvq::LoadedModel> loaded = kvq::LoadModel(models + "stories260K.bin", models + "tok512.bin");
  if (!loaded.ok()) {
    fmt::print(stderr, "gpu_forward_fixture: {}\n", loaded.status().message());
    return 1;
  }
  const kvq::Tokenizer tokenizer = loaded->tokenizer;
  kvq::LlamaModel model(std::move(loaded->weights), 1);
  const kvq::LlamaConfig& c = model.config();
  const kvq::FormatDesc* f32 = *kvq::FindFormat("f32");
  nlohmann::json runs = nlohmann::json::array();
  const std::vector<kvq::test::GoldenRun> golden = kvq::test::ReadGoldenRuns();
  if (golden.empty()) {
    fmt::print(stderr, "gpu_forward_fixture: no golden runs in {}golden-runc-ids.txt\n", models);
    return 1;
  }
  for (size_t r = 0; r < golden.size(); ++r) {
    const kvq::test::GoldenRun& run = golden[r];
    const int64_t n = static_cast<int64_t>(run.ids.size());
    kvq::Result<std::unique_ptr<kvq::KvCache>> cache = kvq::KvCache::Create(
        {.n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim(), .layers = {{f32, f32}},
         .max_positions = c.seq_len, .page_positions = 64});
    if (!cache.ok()) {
      fmt::print(stderr, "gpu_forward_fixture: {}\n", cache.status().message());
      return 1;
    }
    std::vector<float> logits((n - 1) * c.vocab_size);
    for (int64_t p = 0; p + 1 < n; ++p) {
      if (kvq::Status s = model.Forward(run.ids[p], p, **cache, logits.data() + p * c.vocab_size); !s.ok()) {
        fmt::print(stderr, "gpu_forward_fixture: {}\n", s.message());
        return 1;
      }
    }
    const std::string file = fmt::format("golden{}.bin", r);
    std::ofstream(dir / file, std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * 4));
    const int64_t n_prompt = static_cast<int64_t>(tokenizer.Encode(run.prompt, tokenizer.add_bos()).size());
    runs.push_back({{"prompt", run.prompt}, {"ids", run.ids}, {"n_prompt", n_prompt}, {"file", file},
                    {"vocab", c.vocab_size}});
  }
  nlohmann::json ggufs = nlohmann::json::array();
  const std::vector<int32_t> ids(golden[0].ids.begin(), golden[0].ids.begin() + std::min<size_t>(48, golden[0].ids.size()));
  for (const char* type : {"f16", "bf16", "q8_0", "q4_0", "q1_0"}) {
    kvq::SynthSpec spec{.name = fmt::format("tiny-llama-{}", type), .dim = 128, .n_layers = 2, .n_heads = 4,
                        .n_kv_heads = 2, .hidden_dim = 256, .context = 128};
    spec.type = type;  // (set apart: g++ 12 warns on the braced form's strings)
    const std::string gguf = fmt::format("{}.gguf", type);
    if (kvq::Status s = kvq::WriteSynthModel(spec, models + "stories260K.gguf", (dir / gguf).string()); !s.ok()) {
      fmt::print(stderr, "gpu_forward_fixture: {}\n", s.message());
      return 1;
    }
    kvq::Result<kvq::LoadedModel> m = kvq::LoadModel((dir / gguf).string(), "");
    if (!m.ok()) {
      fmt::print(stderr, "gpu_forward_fixture: {}\n", m.status().message());
      return 1;
    }
    kvq::test::ReferenceForward reference(m->weights);
    const int32_t vocab = m->weights.config.vocab_size;
    std::vector<float> logits;
    for (size_t p = 0; p + 1 < ids.size(); ++p) {
      const std::vector<float> l = reference.Forward(ids[p], static_cast<int32_t>(p));
      logits.insert(logits.end(), l.begin(), l.end());
    }
    const std::string file = fmt::format("{}.bin", type);
    std::ofstream(dir / file, std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * 4));
    ggufs.push_back({{"type", type}, {"model", gguf}, {"file", file}, {"ids", ids}, {"vocab", vocab}});
  }
  std::ofstream(dir / "manifest.json", std::ios::trunc) << nlohmann::json{{"runs", runs}, {"gguf", ggufs}}.dump() << "\n";
  fmt::print("gpu_forward_fixture: {} golden runs and {} GGUF models in {}\n", runs.size(), ggufs.size(), dir.string());
  return 0;
}
