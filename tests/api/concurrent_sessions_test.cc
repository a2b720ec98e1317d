// Sessions of one model decoding at the same time on separate OS threads, each on its own thread
// pool: every session's logits, step by step, equal those of the same session run alone — with 1
// and with several threads per session, for a dense model and a hybrid MoE model (whose recurrent
// layers and experts run on the pool too). The sessions get different prompts, so any state shared
// between them (a pool's job, a scratch buffer) would show as a difference.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "kvq/model.h"
#include "kvq/session.h"
#include "synth/synth.h"
#include "test_util/synth_model.h"

namespace kvq {
namespace {

using test::RandomIds;

constexpr int kSteps = 48;

// A session with `threads` threads that prefills a 40-token prompt of `seed` and then decodes
// kSteps greedy tokens; the logits after the prefill and after every step, concatenated.
std::vector<float> DecodeLogits(const Model& m, int32_t threads, uint32_t seed) {
  std::vector<float> out;
  Result<std::unique_ptr<Session>> made = m.NewSession({});
  if (!made.ok()) {
    ADD_FAILURE() << made.status().message();
    return out;
  }
  Session& s = **made;
  if (!s.SetThreads(threads).ok() || !s.Prefill(RandomIds(40, m.info().vocab_size, seed)).ok()) {
    ADD_FAILURE() << "prefill";
    return out;
  }
  for (int step = 0; step <= kSteps; ++step) {
    const std::span<const float> l = s.logits();
    out.insert(out.end(), l.begin(), l.end());
    if (step == kSteps) break;
    if (!s.Decode(static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin())).ok()) {
      ADD_FAILURE() << "decode step " << step;
      return out;
    }
  }
  return out;
}

// n sessions (seeds 1..n) at once, each on its own OS thread, against each run alone first.
void ExpectConcurrentEqualsAlone(const Model& m, int32_t n, int32_t threads) {
  std::vector<std::vector<float>> alone(n), together(n);
  for (int32_t i = 0; i < n; ++i) alone[i] = DecodeLogits(m, threads, 1 + i);
  std::vector<std::thread> workers;
  for (int32_t i = 0; i < n; ++i) workers.emplace_back([&, i] { together[i] = DecodeLogits(m, threads, 1 + i); });
  for (std::thread& w : workers) w.join();
  for (int32_t i = 0; i < n; ++i) {
    ASSERT_FALSE(alone[i].empty());
    EXPECT_TRUE(together[i] == alone[i]) << "session " << i << " of " << n << ", " << threads << " threads each";
  }
  EXPECT_FALSE(alone[0] == alone[1]) << "the prompts should differ, or the test could not see cross-talk";
}

// Large enough that a decode step's products are split across a pool's threads (a group of
// q/k/v is 512 rows × 256 columns, over MatMulGroup's single-thread cut of 2^16 multiply-adds),
// in Q4_0 so the quantised-activation and repacked kernels run.
std::unique_ptr<Model> Dense(const std::string& tag) {
  const SynthSpec spec{.arch = SynthArch::kLlama, .dim = 256, .n_layers = 2, .n_heads = 4,
                       .n_kv_heads = 2, .hidden_dim = 512, .vocab_size = 512, .context = 128,
                       .type = "q4_0", .seed = 5};
  return test::LoadSynth(spec, tag, 1);
}

TEST(ConcurrentSessions, OneThreadEachGivesTheBitsOfEachAlone) {
  std::unique_ptr<Model> m = Dense("concurrent_1");
  ASSERT_NE(m, nullptr);
  ExpectConcurrentEqualsAlone(*m, 4, 1);
}

TEST(ConcurrentSessions, SeveralThreadsEachGiveTheBitsOfEachAlone) {
  std::unique_ptr<Model> m = Dense("concurrent_3");
  ASSERT_NE(m, nullptr);
  ExpectConcurrentEqualsAlone(*m, 2, 3);
  // and the thread count itself changes no bit
  EXPECT_TRUE(DecodeLogits(*m, 1, 1) == DecodeLogits(*m, 3, 1));
}

TEST(ConcurrentSessions, AHybridMoeModelGivesTheBitsOfEachAlone) {
  Result<SynthSpec> spec = SynthPreset("tiny-qwen35moe");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  spec.value().type = "f32";
  std::unique_ptr<Model> m = test::LoadSynth(*spec, "concurrent_moe", 1);
  ASSERT_NE(m, nullptr);
  ExpectConcurrentEqualsAlone(*m, 2, 2);
}

}  // namespace
}  // namespace kvq
