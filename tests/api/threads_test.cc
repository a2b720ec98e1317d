// Session::SetThreads: the thread count can change after load, and no count changes a bit — work is
// split across rows of a product, (query block, KV head) pairs of attention and value heads of a
// recurrent layer, never inside one sum — for every KV format, and for a hybrid MoE model.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "kvq/format.h"
#include "kvq/model.h"
#include "kvq/session.h"
#include "synth/synth.h"
#include "test_util/synth_model.h"

namespace kvq {
namespace {

using test::RandomIds;

// The logits after a 150-token prefill (three blocks, the last part-filled) and after each of 3
// greedy decode steps, run with `threads`, concatenated.
std::vector<float> LogitsWithThreads(const Model& m, const KvOptions& kv, int32_t threads) {
  Result<std::unique_ptr<Session>> made = m.NewSession(kv);
  EXPECT_TRUE(made.ok()) << made.status().message();
  if (!made.ok()) return {};
  Session& s = **made;
  EXPECT_TRUE(s.SetThreads(threads).ok());
  EXPECT_EQ(s.threads(), threads);
  EXPECT_TRUE(s.Prefill(RandomIds(150, m.info().vocab_size, 11)).ok());
  std::vector<float> out;
  for (int step = 0; step < 4; ++step) {
    const std::span<const float> l = s.logits();
    out.insert(out.end(), l.begin(), l.end());
    if (step < 3) {
      EXPECT_TRUE(
          s.Decode(static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin())).ok());
    }
  }
  return out;
}

TEST(SessionThreads, EveryFormatGivesTheSameBitsWithAnyThreadCount) {
  std::unique_ptr<Model> m = test::LoadTinySynth("threads", 1);
  ASSERT_NE(m, nullptr);
  for (const FormatDesc* f : Formats()) {
    SCOPED_TRACE(f->name);
    const KvOptions kv{.key_format = f->name, .value_format = f->name};
    const std::vector<float> one = LogitsWithThreads(*m, kv, 1);
    ASSERT_FALSE(one.empty());
    for (int32_t threads : {2, 3, 8}) {
      SCOPED_TRACE(threads);
      EXPECT_TRUE(LogitsWithThreads(*m, kv, threads) == one);
    }
  }
}

TEST(SessionThreads, AHybridMoeModelGivesTheSameBitsWithAnyThreadCount) {
  Result<SynthSpec> spec = SynthPreset("tiny-qwen35moe");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  spec.value().type = "f32";
  std::unique_ptr<Model> m = test::LoadSynth(*spec, "threads_moe", 1);
  ASSERT_NE(m, nullptr);
  const std::vector<float> one = LogitsWithThreads(*m, {}, 1);
  ASSERT_FALSE(one.empty());
  for (int32_t threads : {2, 5}) {
    SCOPED_TRACE(threads);
    EXPECT_TRUE(LogitsWithThreads(*m, {}, threads) == one);
  }
}

TEST(SessionThreads, OutOfRangeCountsAreRefused) {
  std::unique_ptr<Model> m = test::LoadTinySynth("threads_bad", 2);
  ASSERT_NE(m, nullptr);
  std::unique_ptr<Session> s = test::NewSessionOrFail(*m);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->threads(), 2);  // the model's, until set
  for (int32_t bad : {0, -1, 1025}) {
    const Status st = s->SetThreads(bad);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("threads"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("1..1024"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(std::to_string(bad)), std::string::npos) << st.message();
    EXPECT_EQ(s->threads(), 2);  // unchanged
  }
  EXPECT_TRUE(s->SetThreads(1024).ok());
}

// The OS threads of this process now (/proc/self/status).
int ProcessThreads() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  ADD_FAILURE() << "no Threads: line in /proc/self/status";
  return -1;
}

// A server steps its sessions through RunBatch with whichever session comes first. The pass runs
// on workers the model lends per call, so sessions taking turns at being first start no pool each:
// 4 sessions × 4 batches, each led by another session, start one pool's workers (threads − 1).
TEST(SessionThreads, RunBatchLedByEachSessionInTurnStartsOnePoolNotOnePerSession) {
  constexpr int32_t kThreads = 3;
  std::unique_ptr<Model> m = test::LoadTinySynth("threads_batch_pool", kThreads);
  ASSERT_NE(m, nullptr);
  std::vector<std::unique_ptr<Session>> sessions;
  for (int i = 0; i < 4; ++i) {
    sessions.push_back(test::NewSessionOrFail(*m));
    ASSERT_NE(sessions.back(), nullptr);
  }
  const int before = ProcessThreads();
  const std::vector<int32_t> ids = RandomIds(4 * 4, m->info().vocab_size, 5);
  for (size_t lead = 0; lead < sessions.size(); ++lead) {
    std::vector<BatchItem> items;
    for (size_t k = 0; k < sessions.size(); ++k) {
      const size_t i = (lead + k) % sessions.size();
      items.push_back({.session = sessions[i].get(), .tokens = std::span<const int32_t>(&ids[lead * 4 + i], 1)});
    }
    ASSERT_TRUE(Session::RunBatch(items).ok());
  }
  EXPECT_EQ(ProcessThreads() - before, kThreads - 1);
}

}  // namespace
}  // namespace kvq
