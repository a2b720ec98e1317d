// `kvq eval attention` end to end on the bundled model: JSON keys and one entry per format and
// context in context order, the defaults capped at the model's 512 positions, synthetic rows
// without a top-1 column, the table's header, and bad flags refused with exit 2 naming the flag.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "test_util/run_kvq.h"

namespace {

using kvq_test::KvqRun;
using kvq_test::Slurp;

KvqRun Kvq(const std::string& args) { return kvq_test::RunKvq(args); }

// A short text of our own: shorter than 512 tokens, so the command must repeat it.
std::string TextFile() {
  const std::string path = testing::TempDir() + "/kvq_eval_attention_text_" + std::to_string(getpid()) + ".txt";
  std::ofstream(path) << "Once upon a time, there was a little boy named Tom. Tom had a small boat. He liked to "
                         "sail it on the lake near his house. One day the wind was strong and the boat went far "
                         "away. Tom was sad, but his mom helped him find it. They laughed and went home for "
                         "dinner.\n";
  return path;
}

nlohmann::json Json(const std::string& args) {
  const KvqRun r = Kvq("eval attention " + args + " --json");
  EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.err;
  return nlohmann::json::parse(r.out);
}

TEST(EvalAttention, ModelRowsForEveryRequestedContext) {
  const std::string text = TextFile();
  const auto j = Json("-f " + text + " --format f32,int4 --contexts 256,16,64");
  EXPECT_EQ(j["source"], "model");
  EXPECT_GT(j["text_repeats"].get<int64_t>(), 1);  // the text is shorter than 256 tokens
  EXPECT_EQ(j["model_context"].get<int64_t>(), 512);
  ASSERT_EQ(j["results"].size(), 6u);
  const int64_t want[] = {16, 64, 256};
  for (size_t i = 0; i < 6; ++i) {
    const auto& r = j["results"][i];
    for (const char* key : {"format", "context", "mean_abs_error", "max_abs_error", "positions_attended",
                            "top1_changed"}) {
      EXPECT_TRUE(r.contains(key)) << key;
    }
    EXPECT_EQ(r["format"], i < 3 ? "f32" : "int4");
    EXPECT_EQ(r["context"].get<int64_t>(), want[i % 3]);
    EXPECT_EQ(r["positions_attended"].get<int64_t>(), want[i % 3]);
    ASSERT_TRUE(r["top1_changed"].is_boolean());
    if (i < 3) {
      EXPECT_EQ(r["mean_abs_error"].get<double>(), 0.0);
      EXPECT_EQ(r["max_abs_error"].get<double>(), 0.0);
      EXPECT_FALSE(r["top1_changed"].get<bool>());
    } else {
      EXPECT_GT(r["mean_abs_error"].get<double>(), 0.0);
    }
  }
  EXPECT_TRUE(j["slope"]["f32"].is_null());
  EXPECT_TRUE(j["slope"]["int4"].is_number());
  std::remove(text.c_str());
}

TEST(EvalAttention, DefaultContextsAreCappedAtTheModelsContext) {
  const std::string text = TextFile();
  const auto j = Json("-f " + text + " --format int8 --layer 1 --head 3");
  std::vector<int64_t> contexts;
  for (const auto& r : j["results"]) contexts.push_back(r["context"].get<int64_t>());
  EXPECT_EQ(contexts, (std::vector<int64_t>{16, 64, 256, 512}));
  ASSERT_TRUE(j["contexts_note"].is_string());
  EXPECT_NE(j["contexts_note"].get<std::string>().find("512"), std::string::npos);
  EXPECT_EQ(j["layer"].get<int64_t>(), 1);
  EXPECT_EQ(j["head"].get<int64_t>(), 3);
  std::remove(text.c_str());
}

TEST(EvalAttention, SyntheticRowsHaveNoTopOneColumn) {
  const auto j = Json("--synthetic --format int4 --contexts 16,64,256 --seed 5");
  EXPECT_EQ(j["source"], "synthetic");
  EXPECT_EQ(j["shape"]["head_dim"].get<int64_t>(), 8);  // the bundled model's shape by default
  ASSERT_EQ(j["results"].size(), 3u);
  for (const auto& r : j["results"]) {
    EXPECT_TRUE(r["top1_changed"].is_null());
    EXPECT_EQ(r["positions_attended"], r["context"]);
  }
  EXPECT_LT(j["slope"]["int4"].get<double>(), 0.0);
  // Shape flags replace the model's.
  const auto k = Json("--synthetic --format int4 --contexts 16,64 --layers 1 --q-heads 4 --kv-heads 2 --head-dim 32");
  EXPECT_EQ(k["shape"]["q_heads"].get<int64_t>(), 4);
  EXPECT_EQ(k["results"].size(), 2u);
}

TEST(EvalAttention, TableNamesItsSourceAndPrintsSlopes) {
  const std::string text = TextFile();
  const KvqRun r = Kvq("eval attention -f " + text + " --format int4 --contexts 16,256");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("model rows from"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("repeated"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("top-1 changed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("log-log slope"), std::string::npos) << r.out;
  const KvqRun s = Kvq("eval attention --synthetic --format int4 --contexts 16,64");
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_NE(s.out.find("synthetic rows"), std::string::npos) << s.out;
  std::remove(text.c_str());
}

TEST(EvalAttention, BadFlagsExit2NamingTheFlag) {
  const std::string text = TextFile();
  const struct { std::string args, needle; } cases[] = {
      {"--format nope", "--format"},
      {"--contexts 0", "--contexts"},
      {"--contexts 16,-4", "--contexts"},
      {"--contexts 16,513", "512"},
      {"--layer 5", "--layer 5"},
      {"--layer -1", "--layer"},
      {"--head 8", "--head 8"},
      {"--head-dim 16", "--head-dim"},
      {"--synthetic --q-heads 3 --kv-heads 2", "--q-heads"},
      {"--threads 0", "--threads"},
      {"--synthetic --contexts 100000000 --layers 65536 --kv-heads 65536 --q-heads 65536 --head-dim 1024",
       "--contexts"},
  };
  for (const auto& c : cases) {
    const KvqRun r = Kvq("eval attention -f " + text + " " + c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << "\n" << r.err;
  }
  const KvqRun missing = Kvq("eval attention -f /nonexistent/text.txt");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("/nonexistent/text.txt"), std::string::npos) << missing.err;
  std::remove(text.c_str());
}

}  // namespace
