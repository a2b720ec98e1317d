// `kvq plan --auto` and --kv-plan end to end: a plan file is written, `kvq run` and
// `kvq eval fidelity` take it (the fidelity row reproduces the plan's measured KL), and plan files
// that are damaged, for another model, of another layer count, with an unknown spec or over
// --kv-bits are refused with exit 2 and a message naming the file, as are -f texts that are missing,
// not regular files or empty; `kvq plan --format` takes specs and counts their f32 rows.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "test_util/run_kvq.h"

namespace {

using kvq_test::KvqRun;
using kvq_test::Slurp;

KvqRun Kvq(const std::string& args) { return kvq_test::RunKvq(args); }

std::string TempPath(const std::string& name) {
  return testing::TempDir() + "/kvq_plan_cli_" + std::to_string(getpid()) + "_" + name;
}

void Write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::trunc) << text; }

// One plan for the suite (two candidates on the bundled model and text: 20 arms and the plan).
class PlanAutoCli : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = new std::string(TempPath("plan.json"));
    const KvqRun r = Kvq("plan --auto --kv-bits 4.5 --candidates int2,int4-kivi -o " + *path_ + " --json");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    result_ = new nlohmann::json(nlohmann::json::parse(r.out));
    stderr_ = new std::string(r.err);
  }
  static void TearDownTestSuite() {
    std::remove(path_->c_str());
    delete path_;
    delete result_;
    delete stderr_;
  }
  void SetUp() override { ASSERT_NE(result_, nullptr); }
  // The suite's plan file with `from` replaced by `to`, written to a file of its own.
  static std::string Edited(const std::string& name, const std::string& from, const std::string& to) {
    std::string text = Slurp(*path_);
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) text.replace(at, from.size(), to);
    const std::string out = TempPath(name);
    Write(out, text);
    return out;
  }
  static inline std::string* path_ = nullptr;
  static inline nlohmann::json* result_ = nullptr;
  static inline std::string* stderr_ = nullptr;
};

TEST_F(PlanAutoCli, WritesAPlanFileWithinTheBudget) {
  const nlohmann::json file = nlohmann::json::parse(Slurp(*path_));
  EXPECT_EQ(file["kvq_plan"], 1);
  EXPECT_EQ(file["model"]["n_layers"], 5);
  EXPECT_EQ(file["model"]["n_kv_heads"], 4);
  EXPECT_EQ(file["model"]["head_dim"], 8);
  EXPECT_EQ(file["model"]["weights_hash"].get<std::string>().size(), 16u);
  EXPECT_EQ(file["budget"]["kv_bits"], 4.5);
  ASSERT_EQ(file["layers"].size(), 5u);
  for (const auto& l : file["layers"]) {
    for (const char* t : {"k", "v"}) EXPECT_TRUE(l[t] == "int2" || l[t] == "int4-kivi") << l;
  }
  EXPECT_LE(file["bits_per_number"].get<double>(), 4.5);
  EXPECT_LE(file["kv_bytes"].get<int64_t>(), (*result_)["budget_bytes"].get<int64_t>());
  EXPECT_EQ((*result_)["plan"], file);
  EXPECT_EQ((*result_)["sensitivity"].size(), 20u);
  // Progress on stderr: one line per arm (the reference, 20 tensors, then the plan's run).
  EXPECT_NE(stderr_->find("[21/21] layer 4 V int4-kivi"), std::string::npos) << *stderr_;
  EXPECT_NE(stderr_->find("[2/2] plan"), std::string::npos) << *stderr_;
}

TEST_F(PlanAutoCli, RunAndEvalFidelityTakeIt) {
  const KvqRun run = Kvq("run --kv-plan " + *path_ + " -p Lily -n 8 --temp 0 --json");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(nlohmann::json::parse(run.out)["kv_format"], "plan " + *path_);
  const KvqRun eval = Kvq("eval fidelity --format int2 --kv-plan " + *path_ + " --json");
  ASSERT_EQ(eval.exit_code, 0) << eval.err;
  const nlohmann::json j = nlohmann::json::parse(eval.out);
  ASSERT_EQ(j["formats"].size(), 2u);
  EXPECT_EQ(j["formats"][0]["format"], "int2");
  EXPECT_NE(j["formats"][1]["format"].get<std::string>().find("plan "), std::string::npos);
  // The same tokens and the same arithmetic as the plan's own measured run.
  EXPECT_EQ(j["formats"][1]["kl"].get<double>(), (*result_)["plan"]["measured_kl"].get<double>());
  EXPECT_LT(j["formats"][1]["kl"].get<double>(), j["formats"][0]["kl"].get<double>());
  EXPECT_EQ(Kvq("eval fidelity --kv-plan " + *path_ + " --kv-bits 4.5").exit_code, 0);
}

TEST_F(PlanAutoCli, BadPlanFilesAreRefusedNamingTheFile) {
  const std::string damaged = TempPath("damaged.json");
  Write(damaged, Slurp(*path_).substr(0, 40));
  const std::string hash = (*result_)["plan"]["model"]["weights_hash"];
  const std::string other_hash = std::string(hash.substr(0, 15)) + (hash[15] == '0' ? "1" : "0");
  const struct {
    std::string file, why;
  } cases[] = {
      {damaged, "not valid JSON"},
      {Edited("model.json", hash, other_hash), "another model"},
      {Edited("layers.json", "{\n      \"k\"", "{\"k\": \"int8\", \"v\": \"int8\"}, {\n      \"k\""),
       "6 layers; the model has 5"},
      {Edited("spec.json", "\"int4-kivi\"", "\"int3-kivi\""), "int3-kivi"},
      {TempPath("missing.json"), "cannot open"},
  };
  for (const auto& c : cases) {
    for (const std::string cmd : {"run -n 1 --kv-plan ", "eval fidelity --kv-plan "}) {
      const KvqRun r = Kvq(cmd + c.file);
      EXPECT_EQ(r.exit_code, 2) << cmd << c.file << "\n" << r.err;
      EXPECT_NE(r.err.find("--kv-plan " + c.file + ": "), std::string::npos) << r.err;
      EXPECT_NE(r.err.find(c.why), std::string::npos) << r.err;
    }
    std::remove(c.file.c_str());
  }
  const KvqRun over = Kvq("run -n 1 --kv-bits 4 --kv-plan " + *path_);
  EXPECT_EQ(over.exit_code, 2);
  EXPECT_NE(over.err.find(*path_), std::string::npos) << over.err;
  EXPECT_NE(over.err.find("over the budget of 4"), std::string::npos) << over.err;
  const KvqRun both = Kvq("run -n 1 --kv int4 --kv-plan " + *path_);
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.err.find("excludes"), std::string::npos) << both.err;
  EXPECT_NE(Kvq("run -n 1 --kv-bits 4").err.find("needs --kv-plan"), std::string::npos);
}

TEST(PlanCli, AutoNeedsOneBudgetAndAutoOnlyFlagsNeedAuto) {
  EXPECT_NE(Kvq("plan --auto").err.find("one budget"), std::string::npos);
  EXPECT_NE(Kvq("plan --auto --kv-bits 4 --bytes-per-token 100").err.find("one budget"), std::string::npos);
  const KvqRun tight = Kvq("plan --auto --kv-bits 3 --candidates int2 -c 16");
  EXPECT_EQ(tight.exit_code, 1);
  EXPECT_NE(tight.err.find("no choice fits"), std::string::npos) << tight.err;
  EXPECT_NE(Kvq("plan --layers 5 --kv-heads 4 --head-dim 8 --context 9 -o x.json").err.find("--auto"),
            std::string::npos);
  EXPECT_NE(Kvq("plan --auto --kv-bits 4 --layers 5").err.find("excludes"), std::string::npos);
}

// The text is read before the model loads: each way -f can be wrong is named as what it is.
TEST(PlanCli, TextFileErrorsSayWhatIsWrongWithTheFile) {
  const KvqRun missing = Kvq("plan --auto --kv-bits 4 -f " + TempPath("missing.txt"));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("no such text file"), std::string::npos) << missing.err;
  const KvqRun device = Kvq("plan --auto --kv-bits 4 -f /dev/null");
  EXPECT_EQ(device.exit_code, 2);
  EXPECT_NE(device.err.find("-f /dev/null: not a regular file (a character device;"), std::string::npos)
      << device.err;
  const KvqRun folder = Kvq("plan --auto --kv-bits 4 -f " + testing::TempDir());
  EXPECT_NE(folder.err.find("not a regular file (a directory;"), std::string::npos) << folder.err;
  const std::string empty = TempPath("empty.txt");
  Write(empty, "");
  const KvqRun empty_run = Kvq("plan --auto --kv-bits 4 -f " + empty);
  std::remove(empty.c_str());
  EXPECT_EQ(empty_run.exit_code, 2);
  EXPECT_NE(empty_run.err.find("the file is empty"), std::string::npos) << empty_run.err;
}

TEST(PlanCli, FormatTakesSpecsAndCountsTheirRows) {
  // 2 layers x 4 KV heads x head_dim 8 (32 numbers, an f32 row 128 bytes), int4 24 bytes a row:
  // 10 rows + 4 f32 sink rows per tensor.
  const KvqRun r = Kvq("plan --layers 2 --kv-heads 4 --head-dim 8 --format int4+rot+sink4 --context 10,1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["format"], "int4+rot+sink4");
  EXPECT_EQ(j["transforms"]["sinks"], 4);
  EXPECT_EQ(j["contexts"][0]["total_bytes"].get<int64_t>(), 2 * 2 * (10 * 24 + 4 * 128));
  EXPECT_EQ(j["contexts"][1]["total_bytes"].get<int64_t>(), 2 * 2 * (1 * 24 + 1 * 128));
  EXPECT_EQ(j["contexts"][0]["bits_per_number"].get<double>(), 18.8);
  EXPECT_EQ(j["bytes_per_layer_position"], 48);  // steady state: the element format's
  const KvqRun rot = Kvq("plan --layers 2 --kv-heads 4 --head-dim 12 --format int8+rot --context 10");
  EXPECT_EQ(rot.exit_code, 2);
  EXPECT_NE(rot.err.find("power of two"), std::string::npos) << rot.err;
}

}  // namespace
