// A file a command will write is checked when its flag is parsed: a missing or unwritable folder, or
// a folder given as the file, is refused at once, naming the flag, before any model is loaded or
// measured (plan --auto would otherwise measure for a minute, then fail to write).
#include <string>

#include <gtest/gtest.h>

#include "test_util/run_kvq.h"

namespace {

TEST(OutputPathCli, BadOutputPathsAreRefusedBeforeAnyWork) {
  const std::string model = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/stories260K.gguf";
  const struct {
    std::string args, flag;
  } cases[] = {
      {"synth --dim 64 --layers 1 --heads 2 --ffn 64 -o /nonexistent-kvq/d/x.gguf", "--output"},
      {"plan --auto -m " + model + " --kv-bits 4 -o /nonexistent-kvq/d/plan.json", "--output"},
      {"run -p hi -n 4 --prompt-cache /nonexistent-kvq/d/pc.bin", "--prompt-cache"},
      {"eval fidelity -m " + model + " --plot /nonexistent-kvq/d/p.png", "--plot"},
      {"eval fidelity -m " + model + " -c 128 --kl-divergence-base-out /nonexistent-kvq/d/x.bin",
       "--kl-divergence-base-out"},
      {"run -p hi -n 4 --prompt-cache " + testing::TempDir(), "--prompt-cache"},
  };
  for (const auto& c : cases) {
    const kvq_test::KvqRun r = kvq_test::RunKvq(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE(r.err.find("error: " + c.flag + ": "), std::string::npos) << c.args << "\n" << r.err;
    const bool names_problem = r.err.find("does not exist") != std::string::npos ||
                               r.err.find("give a file name") != std::string::npos;
    EXPECT_TRUE(names_problem) << c.args << "\n" << r.err;
    // Refused while parsing: nothing was loaded or measured (no progress lines).
    EXPECT_EQ(r.err.find("loading"), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_EQ(r.err.find("[1/"), std::string::npos) << c.args << "\n" << r.err;
  }
}

}  // namespace
