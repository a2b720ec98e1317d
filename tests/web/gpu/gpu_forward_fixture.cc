// Writes the WebGPU forward test's inputs (tests/web/gpu/gpu_attention_page.js, RunGpuForwardTests):
// for each of run.c's golden greedy runs of the bundled stories260K (golden-runc-ids.txt), its ids,
// how many of them are BOS + prompt (kvq's tokenizer), and native kvq's logits after each id but the
// last (LlamaModel, f32 KV, one thread), which the GPU forward must match within the tolerance the
// page states. Output: DIR/manifest.json and DIR/<run>.bin ([n − 1][vocab] f32 logits).
// Usage: gpu_forward_fixture DIR
#include <fmt/format.h>

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
#include "test_util/golden_runc.h"

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
  std::ofstream(dir / "manifest.json", std::ios::trunc) << nlohmann::json{{"runs", runs}}.dump() << "\n";
  fmt::print("gpu_forward_fixture: {} golden runs in {}\n", runs.size(), dir.string());
  return 0;
}
