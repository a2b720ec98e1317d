// Session::Fork: a forked session shares its parent's KV pages until one of them writes a page,
// and generates exactly what a session that ran the same tokens alone generates — for every KV
// format; N forks after a long prefix hold the prefix's pages once.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "kvq/format.h"
#include "kvq/model.h"
#include "kvq/session.h"
#include "test_util/synth_model.h"

namespace kvq {
namespace {

// A tiny random-weight Llama with a 4,096-token context.
std::unique_ptr<Model> LoadSynth() { return test::LoadTinySynth("fork"); }

using test::RandomIds;

// Greedy: the ids of n decode steps after what the session holds, and the logits' bits on the way.
std::vector<int32_t> Greedy(Session& s, int32_t n, std::vector<float>* logits) {
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < n; ++i) {
    const std::span<const float> l = s.logits();
    logits->insert(logits->end(), l.begin(), l.end());
    const int32_t next = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    ids.push_back(next);
    EXPECT_TRUE(s.Decode(next).ok());
  }
  return ids;
}

// Parent prefills `prefix`; each of n_forks forks prefills its own suffix and decodes; each must
// equal a session that ran prefix + suffix alone. Returns {parent, forks} for byte checks.
struct Forked {
  std::unique_ptr<Session> parent;
  std::vector<std::unique_ptr<Session>> forks;
  std::unique_ptr<Session> alone;  // the last fork's tokens, unshared
};

Forked ForkAndCompare(const Model& m, const KvOptions& kv, int32_t prefix_len, int32_t n_forks, int32_t suffix_len) {
  Forked out;
  Result<std::unique_ptr<Session>> parent = m.NewSession(kv);
  EXPECT_TRUE(parent.ok()) << parent.status().message();
  if (!parent.ok()) return out;
  out.parent = std::move(parent).value();
  const int32_t vocab = m.info().vocab_size;
  const std::vector<int32_t> prefix = RandomIds(prefix_len, vocab, 1);
  EXPECT_TRUE(out.parent->Prefill(prefix).ok());
  for (int32_t i = 0; i < n_forks; ++i) {
    Result<std::unique_ptr<Session>> fork = out.parent->Fork();
    EXPECT_TRUE(fork.ok()) << fork.status().message();
    if (!fork.ok()) return out;
    EXPECT_EQ((*fork)->positions(), prefix_len);
    const std::vector<int32_t> suffix = RandomIds(suffix_len, vocab, 100 + i);
    EXPECT_TRUE((*fork)->Prefill(suffix).ok());
    Result<std::unique_ptr<Session>> alone = m.NewSession(kv);
    EXPECT_TRUE(alone.ok());
    if (!alone.ok()) return out;
    std::vector<int32_t> all = prefix;
    all.insert(all.end(), suffix.begin(), suffix.end());
    EXPECT_TRUE((*alone)->Prefill(all).ok());
    std::vector<float> fork_logits, alone_logits;
    EXPECT_EQ(Greedy(**fork, 6, &fork_logits), Greedy(**alone, 6, &alone_logits)) << "fork " << i;
    EXPECT_TRUE(fork_logits == alone_logits) << "fork " << i;  // the same bits
    EXPECT_EQ((*fork)->kv_bytes(), (*alone)->kv_bytes());
    out.forks.push_back(std::move(fork).value());
    out.alone = std::move(alone).value();
  }
  return out;
}

TEST(SessionFork, EveryFormatGeneratesWhatAnUnsharedSessionGenerates) {
  std::unique_ptr<Model> m = LoadSynth();
  ASSERT_NE(m, nullptr);
  for (const FormatDesc* f : Formats()) {
    SCOPED_TRACE(f->name);
    const std::string name(f->name);
    // 300 positions: the parent's last page (of 64) part filled, so each fork copies it on write.
    const Forked forked = ForkAndCompare(*m, {.key_format = name, .value_format = name, .page_positions = 64}, 300, 2, 40);
    ASSERT_EQ(forked.forks.size(), 2u);
    // The parent is unchanged by its forks' writes: it still continues as a fresh session would.
    Result<std::unique_ptr<Session>> again = m->NewSession({.key_format = name, .value_format = name, .page_positions = 64});
    ASSERT_TRUE(again.ok());
    ASSERT_TRUE((*again)->Prefill(RandomIds(300, m->info().vocab_size, 1)).ok());
    std::vector<float> a, b;
    EXPECT_EQ(Greedy(*forked.parent, 4, &a), Greedy(**again, 4, &b));
    EXPECT_TRUE(a == b);
  }
}

TEST(SessionFork, EightForksHoldTheirPrefixOnce) {
  std::unique_ptr<Model> m = LoadSynth();
  ASSERT_NE(m, nullptr);
  const KvOptions kv{.key_format = "f16", .value_format = "f16", .page_positions = 32};
  const Forked forked = ForkAndCompare(*m, kv, 2000, 8, 48);
  ASSERT_EQ(forked.forks.size(), 8u);
  // Bytes of pages: the prefix alone, and what a suffix (48 + 6 decoded) adds to an unshared session.
  Result<std::unique_ptr<Session>> one = m->NewSession(kv);
  ASSERT_TRUE(one.ok());
  ASSERT_TRUE((*one)->Prefill(RandomIds(2000, m->info().vocab_size, 1)).ok());
  const int64_t prefix_bytes = (*one)->kv_page_bytes_held();
  const int64_t suffix_bytes = forked.alone->kv_page_bytes_held() - prefix_bytes;
  // A page of this shape: the parent's partly filled last page, which each fork copies when it
  // first writes (a fork pays at most that on top of its own suffix).
  const int64_t page_bytes = prefix_bytes / ((2000 + 31) / 32);
  ASSERT_GT(suffix_bytes, 0);
  // Memory actually used: every page once — the parent's (its shared pages counted here), then
  // what each fork alone holds.
  int64_t used = forked.parent->kv_page_bytes_held();
  for (const auto& f : forked.forks) used += f->kv_page_bytes_unshared();
  EXPECT_LE(used, prefix_bytes + 8 * (suffix_bytes + page_bytes));
  EXPECT_GE(used, prefix_bytes + 8 * suffix_bytes);
  // Unshared, the nine sessions would hold the prefix nine times.
  EXPECT_LT(used, 2 * prefix_bytes);
  std::printf("SessionFork: 8 forks after 2000 positions (pages of 32, f16): %lld bytes of pages in all; "
              "one prefix %lld, one suffix of 54 positions %lld (%.3f x prefix + 8 x suffix: %.3f)\n",
              static_cast<long long>(used), static_cast<long long>(prefix_bytes), static_cast<long long>(suffix_bytes),
              static_cast<double>(used - 8 * suffix_bytes) / static_cast<double>(prefix_bytes),
              static_cast<double>(used) / static_cast<double>(prefix_bytes + 8 * suffix_bytes));
}

TEST(SessionFork, ADiskMasterIsRefused) {
  std::unique_ptr<Model> m = LoadSynth();
  ASSERT_NE(m, nullptr);
  const std::string dir = ::testing::TempDir();
  Result<std::unique_ptr<Session>> s = m->NewSession({.key_format = "f16", .value_format = "f16", .budgets = {.disk_dir = dir}});
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_TRUE((*s)->Prefill(RandomIds(10, m->info().vocab_size, 2)).ok());
  Result<std::unique_ptr<Session>> fork = (*s)->Fork();
  ASSERT_FALSE(fork.ok());
  EXPECT_NE(fork.status().message().find("--kv-disk"), std::string::npos) << fork.status().message();
}

}  // namespace
}  // namespace kvq
