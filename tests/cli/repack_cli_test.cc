// --repack and --repack-memory as a user gives them: the choice reaches the loader from a command
// that loads through the public API (eval fidelity, whose --kl-divergence-base-out writes every
// position's logits) and from one that loads the weights directly (bench decode), on the
// tiny-qwen35moe synth, a mixture-of-experts hybrid whose Q8_0 experts repack. `--repack auto`
// with a --repack-memory too small for the experts' copy says so in one line and gives other
// logits than `--repack all` (the experts' layout changes the f32 sums' order); with room it gives
// all's, bit for bit. A bad value is an error naming the flag and the choices.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "test_util/run_kvq.h"

namespace {

using kvq_test::KvqRun;
using kvq_test::RunKvq;
using kvq_test::Slurp;

class RepackCli : public testing::Test {
 protected:
  static std::string Temp(const std::string& name) {
    return testing::TempDir() + "/kvq_repack_cli_" + std::to_string(getpid()) + "_" + name;
  }
  static void SetUpTestSuite() {
    model_ = new std::string(Temp("moe.gguf"));
    const KvqRun w = RunKvq("synth --preset tiny-qwen35moe -o " + *model_);
    ASSERT_EQ(w.exit_code, 0) << w.err;
  }
  static void TearDownTestSuite() {
    std::remove(model_->c_str());
    delete model_;
  }
  // The logits file `eval fidelity` writes with `flags`, and its stderr.
  static std::pair<std::string, std::string> Logits(const std::string& name, const std::string& flags) {
    const std::string out = Temp(name + ".logits");
    const KvqRun r = RunKvq("eval fidelity -m " + *model_ + " -c 64 --kv f32 --kl-divergence-base-out " + out +
                            " " + flags);
    EXPECT_EQ(r.exit_code, 0) << flags << ": " << r.err;
    std::string bytes = Slurp(out);
    std::remove(out.c_str());
    EXPECT_GT(bytes.size(), 0u) << flags;
    return {bytes, r.err};
  }
  static inline std::string* model_ = nullptr;
};

constexpr const char* kLeftMapped = "experts left in the file's layout";

TEST_F(RepackCli, AutoDecidesByTheMemoryGivenAndAllAndNoneDoNot) {
  const auto [low, low_err] = Logits("low", "--repack auto --repack-memory 1MiB");
  const auto [high, high_err] = Logits("high", "--repack-memory 1TiB");  // auto is the default
  const auto [all, all_err] = Logits("all", "--repack all --repack-memory 1MiB");
  const auto [none, none_err] = Logits("none", "--repack none");
  EXPECT_NE(low_err.find(kLeftMapped), std::string::npos) << low_err;
  EXPECT_NE(low_err.find("--repack all to force"), std::string::npos) << low_err;
  for (const std::string* quiet : {&high_err, &all_err, &none_err}) {
    EXPECT_EQ(quiet->find(kLeftMapped), std::string::npos) << *quiet;
  }
  EXPECT_EQ(high, all);
  EXPECT_NE(low, all);   // the experts' layout shows: the equality above can fail
  EXPECT_NE(none, all);  // --repack none reached the loader
}

TEST_F(RepackCli, BenchDecodeTakesTheFlag) {
  const std::string bench = "bench decode -m " + *model_ + " --format f16 --context 0 --reps 2";
  const KvqRun low = RunKvq(bench + " --repack-memory 1MiB");
  ASSERT_EQ(low.exit_code, 0) << low.err;
  EXPECT_NE(low.err.find(kLeftMapped), std::string::npos) << low.err;
  const KvqRun all = RunKvq(bench + " --repack all --repack-memory 1MiB");
  ASSERT_EQ(all.exit_code, 0) << all.err;
  EXPECT_EQ(all.err.find(kLeftMapped), std::string::npos) << all.err;
}

TEST_F(RepackCli, ABadValueNamesTheFlagAndTheChoices) {
  for (const std::string command : {"run -p hi -n 1", "bench decode --format f16 --context 0", "eval fidelity"}) {
    const KvqRun r = RunKvq(command + " -m " + *model_ + " --repack some");
    EXPECT_NE(r.exit_code, 0) << command;
    EXPECT_NE(r.err.find("--repack"), std::string::npos) << command << ": " << r.err;
    EXPECT_NE(r.err.find("one of: auto, all, none"), std::string::npos) << command << ": " << r.err;
    EXPECT_NE(r.err.find("some"), std::string::npos) << command << ": " << r.err;
  }
}

}  // namespace
