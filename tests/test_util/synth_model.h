// A tiny random-weight Llama loaded through the public API, for API tests that need a long context
// (the bundled stories260K holds 512 positions): dim 64, 2 layers, 4 heads on 2 KV heads, a
// 512-token vocabulary borrowed from stories260K, 4,096 positions, f32 weights.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kvq/model.h"
#include "kvq/session.h"
#include "synth/synth.h"

namespace kvq::test {

/// The model `spec` describes, written to a temporary file (`tag` names it: unique per test
/// program) with stories260K's vocabulary, and loaded with `threads`. Null, with a test failure
/// added, when it cannot be made.
inline std::unique_ptr<Model> LoadSynth(const SynthSpec& spec, const std::string& tag,
                                        int32_t threads = 2) {
  namespace fs = std::filesystem;
  const std::string path =
      (fs::path(::testing::TempDir()) / ("kvq_" + tag + "_" + std::to_string(::getpid()) + ".gguf"))
          .string();
  const std::string vocab_from =
      std::string(KVQ_SOURCE_DIR) + "/models/stories260K/stories260K.gguf";
  if (Status s = WriteSynthModel(spec, vocab_from, path); !s.ok()) {
    ADD_FAILURE() << s.message();
    return nullptr;
  }
  Result<std::unique_ptr<Model>> m = Model::Load(path, {.threads = threads});
  fs::remove(path);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

/// The tiny Llama described at the top of this file.
inline std::unique_ptr<Model> LoadTinySynth(const std::string& tag, int32_t threads = 2) {
  const SynthSpec spec{.arch = SynthArch::kLlama,
                       .dim = 64,
                       .n_layers = 2,
                       .n_heads = 4,
                       .n_kv_heads = 2,
                       .hidden_dim = 128,
                       .vocab_size = 512,
                       .context = 4096,
                       .type = "f32",
                       .seed = 3};
  return LoadSynth(spec, tag, threads);
}

/// A new session of `m` with `kv`; null, with a test failure added, when it cannot be made.
inline std::unique_ptr<Session> NewSessionOrFail(const Model& m, const KvOptions& kv = {}) {
  Result<std::unique_ptr<Session>> s = m.NewSession(kv);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? std::move(s).value() : nullptr;
}

/// What a completion left: the completion, and the session's snapshot afterwards (SavePrefix: its
/// KV and any recurrent state) as bytes, for comparing two runs cache for cache.
struct GenerateOutcome {
  Completion completion;
  std::string cache;
};

/// Generate(prompt, request) on a new session of `m` with `kv`; `tag` names the snapshot's temporary
/// file. Failures are added to the test (and leave the outcome empty).
inline GenerateOutcome GenerateAndSnapshot(const Model& m, const KvOptions& kv, std::span<const int32_t> prompt,
                                           const GenerateRequest& request, const std::string& tag) {
  GenerateOutcome out;
  std::unique_ptr<Session> s = NewSessionOrFail(m, kv);
  if (s == nullptr) return out;
  Result<Completion> c = s->Generate(prompt, request);
  EXPECT_TRUE(c.ok()) << c.status().message();
  if (!c.ok()) return out;
  out.completion = std::move(c).value();
  const std::string path =
      (std::filesystem::path(::testing::TempDir()) / (tag + "_" + std::to_string(::getpid()) + ".snap")).string();
  EXPECT_TRUE(s->SavePrefix(path).ok());
  std::ifstream in(path, std::ios::binary);
  out.cache.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  std::filesystem::remove(path);
  return out;
}

/// `n` ids drawn uniformly from [0, vocab) by a generator seeded with `seed`.
inline std::vector<int32_t> RandomIds(int32_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return ids;
}

}  // namespace kvq::test
