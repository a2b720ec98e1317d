// `kvq bench spec` on the bundled stories260K: every draft source's arm (the draft model's with
// the bundled model as its own draft), for each format asked,
// generates the tokens of the arm without speculation (the bench checks that itself and fails
// otherwise), and its counts add up: tokens per pass = generated / passes, kept ≤ drafted, and
// the draft-free arm runs one pass per token but the last.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "kvq/speculation.h"
#include "test_util/run_kvq.h"

namespace {

using kvq_test::RunKvq;

// The draft model: the bundled model itself, its cache in int8 (some drafts then differ).
const std::string kDraft = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/stories260K.bin";

TEST(BenchSpecCli, EveryDraftSourceGivesTheSameTokensAndItsCountsAddUp) {
  const kvq_test::KvqRun r = RunKvq("bench spec --formats f16,int4-kivi --tokens 48 --reps 1 --spec-ungated --json -md " +
                                    kDraft + " --draft-kv int8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json doc = nlohmann::json::parse(r.out);
  EXPECT_TRUE(doc["same_tokens_as_without_speculation"].get<bool>());
  std::set<std::string> sources;
  int64_t kept = 0;
  for (const nlohmann::json& row : doc["results"]) {
    const std::string source = row["source"];
    sources.insert(source);
    const int64_t generated = row["generated_tokens"], passes = row["passes"];
    const int64_t drafted = row["drafted_tokens"], accepted = row["accepted_tokens"];
    EXPECT_EQ(generated, 48) << source;
    EXPECT_LE(accepted, drafted) << source;
    EXPECT_GE(passes, 1) << source;
    EXPECT_DOUBLE_EQ(row["tokens_per_pass"].get<double>(), static_cast<double>(generated) / passes) << source;
    if (source == "none") {
      // One pass per token but the last, which is drawn and not run (max_tokens reached).
      EXPECT_EQ(drafted, 0);
      EXPECT_EQ(passes, generated - 1);
    } else {
      kept += accepted;
    }
  }
  for (const kvq::DraftSource s : kvq::DraftSources()) EXPECT_EQ(sources.count(kvq::DraftSourceName(s)), 1u);
  EXPECT_GT(kept, 0) << "no draft was ever kept: the repeated text should give some";
}

TEST(BenchSpecCli, BadFlagsAreNamed) {
  const kvq_test::KvqRun unknown = RunKvq("bench spec --spec eagle");
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.err.find("--spec"), std::string::npos) << unknown.err;
  const kvq_test::KvqRun deep = RunKvq("bench spec --context 100000");
  EXPECT_NE(deep.exit_code, 0);
  EXPECT_NE(deep.err.find("--context 100000"), std::string::npos) << deep.err;
  const kvq_test::KvqRun no_draft = RunKvq("bench spec --spec draft");
  EXPECT_NE(no_draft.exit_code, 0);
  EXPECT_NE(no_draft.err.find("--draft-model"), std::string::npos) << no_draft.err;
  const kvq_test::KvqRun missing = RunKvq("bench spec --text /nonexistent/kvq.txt");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("/nonexistent/kvq.txt"), std::string::npos) << missing.err;
}

}  // namespace
