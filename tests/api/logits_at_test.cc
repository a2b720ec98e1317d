// Logits at chosen positions (BatchItem::logits_at, Session::chosen_logits): a speculative-decoding
// verifier's rows. For every registered KV format, the logits after chosen tokens of one Prefill
// equal those of running the same tokens one Decode at a time, bit for bit; RunBatch gives each
// item its own; bad indices are refused, naming the index.
#include <gtest/gtest.h>

#include <vector>

#include "kvq/format.h"
#include "kvq/model.h"
#include "kvq/session.h"
#include "test_util/synth_model.h"

namespace kvq {
namespace {

using test::NewSessionOrFail;
using test::RandomIds;

// Rows across block boundaries (63 | 64, 127 | 128), the first token and the last.
const std::vector<int32_t> kAt = {0, 1, 5, 63, 64, 65, 127, 128, 149};

// The logits after each token named in `at`, decoding `ids` one at a time: [at.size()][vocab].
std::vector<float> DecodedRows(Session& s, std::span<const int32_t> ids,
                               std::span<const int32_t> at) {
  std::vector<float> rows;
  size_t next = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_TRUE(s.Decode(ids[i]).ok());
    if (next < at.size() && at[next] == static_cast<int32_t>(i)) {
      rows.insert(rows.end(), s.logits().begin(), s.logits().end());
      ++next;
    }
  }
  return rows;
}

std::vector<float> Copy(std::span<const float> v) { return {v.begin(), v.end()}; }

TEST(LogitsAt, EveryFormatEqualsDecodingOneTokenAtATime) {
  std::unique_ptr<Model> m = test::LoadTinySynth("logits_at");
  ASSERT_NE(m, nullptr);
  const int32_t vocab = m->info().vocab_size;
  const std::vector<int32_t> prefix = RandomIds(70, vocab, 20), ids = RandomIds(150, vocab, 21);
  for (const FormatDesc* f : Formats()) {
    SCOPED_TRACE(f->name);
    const KvOptions kv{.key_format = f->name, .value_format = f->name};
    std::unique_ptr<Session> block = NewSessionOrFail(*m, kv), step = NewSessionOrFail(*m, kv);
    ASSERT_TRUE(block && step);
    // After a prefix, so that the chosen rows sit at positions that are not block-aligned.
    ASSERT_TRUE(block->Prefill(prefix).ok());
    ASSERT_TRUE(step->Prefill(prefix).ok());
    ASSERT_TRUE(block->Prefill(ids, kAt).ok());
    const std::vector<float> expected = DecodedRows(*step, ids, kAt);
    ASSERT_EQ(block->chosen_logits().size(), kAt.size() * vocab);
    EXPECT_TRUE(Copy(block->chosen_logits()) == expected);
    EXPECT_TRUE(Copy(block->logits()) == Copy(step->logits()));  // the last token's, as always
    EXPECT_EQ(block->kv_bytes(), step->kv_bytes());
    // Any later call that names none leaves none.
    ASSERT_TRUE(block->Decode(3).ok());
    EXPECT_TRUE(block->chosen_logits().empty());
  }
}

TEST(LogitsAt, RunBatchGivesEachItemItsOwnRows) {
  std::unique_ptr<Model> m = test::LoadTinySynth("logits_at_batch");
  ASSERT_NE(m, nullptr);
  const int32_t vocab = m->info().vocab_size;
  const std::vector<int32_t> a = RandomIds(150, vocab, 30), b = RandomIds(1, vocab, 31),
                             c = RandomIds(40, vocab, 32);
  const std::vector<int32_t> a_at = kAt, b_at = {0}, c_at = {};
  std::unique_ptr<Session> sa = NewSessionOrFail(*m), sb = NewSessionOrFail(*m),
                           sc = NewSessionOrFail(*m);
  ASSERT_TRUE(sa && sb && sc);
  const BatchItem items[] = {{sa.get(), a, a_at}, {sb.get(), b, b_at}, {sc.get(), c, c_at}};
  ASSERT_TRUE(Session::RunBatch(items).ok());
  std::unique_ptr<Session> alone = NewSessionOrFail(*m);
  EXPECT_TRUE(Copy(sa->chosen_logits()) == DecodedRows(*alone, a, a_at));
  EXPECT_TRUE(Copy(sb->chosen_logits()) == Copy(sb->logits()));  // its only token is its last
  EXPECT_TRUE(sc->chosen_logits().empty());
}

TEST(LogitsAt, BadIndicesAreRefusedNamingTheIndex) {
  std::unique_ptr<Model> m = test::LoadTinySynth("logits_at_bad");
  ASSERT_NE(m, nullptr);
  std::unique_ptr<Session> s = NewSessionOrFail(*m);
  ASSERT_NE(s, nullptr);
  const std::vector<int32_t> ids = RandomIds(10, m->info().vocab_size, 40);
  auto refused = [&](std::vector<int32_t> at, const std::string& part) {
    const Status st = s->Prefill(ids, at);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find(part), std::string::npos) << st.message();
    EXPECT_EQ(s->positions(), 0);  // nothing ran
  };
  refused({10}, "logits_at[0] is 10; expected an index into the 10 tokens, [0, 10)");
  refused({2, -1}, "logits_at[1] is -1");
  refused({4, 4}, "logits_at[1] is 4, not after logits_at[0] = 4");
  refused({5, 3}, "logits_at[1] is 3, not after logits_at[0] = 5");
  const Status st = s->Prefill({}, std::vector<int32_t>{0});
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("no tokens"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace kvq
