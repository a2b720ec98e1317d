// kvq run's sampling flags: --repeat-penalty, --frequency-penalty, --presence-penalty and
// --repeat-last-n reach the core (the text equals Session::Generate's with the same options, and
// differs from the text without them); NaN, infinities and values out of range are refused, naming
// the flag; --seed -1 is random.
#include <gtest/gtest.h>

#include <string>

#include "kvq/model.h"
#include "kvq/session.h"
#include "test_util/run_kvq.h"

namespace {

using kvq_test::KvqRun;
using kvq_test::RunKvq;
const std::string kDir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";
const std::string kPrompt = "Once upon a time";

std::string Generated(const kvq::SamplerOptions& sampling) {
  auto model = kvq::Model::Load(kDir + "stories260K.bin", {.tokenizer_path = kDir + "tok512.bin", .threads = 1});
  EXPECT_TRUE(model.ok());
  auto session = (*model)->NewSession();
  auto c = (*session)->Generate(kPrompt, {.max_tokens = 40, .sampling = sampling});
  EXPECT_TRUE(c.ok());
  return kPrompt + c->text;
}

TEST(SamplingCli, PenaltyFlagsReachTheCore) {
  const std::string flags = " -n 40 --temp 0 -t 1 --repeat-penalty 3 --frequency-penalty 2 --presence-penalty 2 "
                            "--repeat-last-n 64";
  const KvqRun with = RunKvq("run -p '" + kPrompt + "'" + flags);
  ASSERT_EQ(with.exit_code, 0) << with.err;
  const KvqRun without = RunKvq("run -p '" + kPrompt + "' -n 40 --temp 0 -t 1");
  ASSERT_EQ(without.exit_code, 0) << without.err;
  const std::string core = Generated({.temperature = 0, .repeat_penalty = 3, .frequency_penalty = 2,
                                      .presence_penalty = 2, .repeat_last_n = 64});
  EXPECT_EQ(with.out.substr(0, core.size()), core);
  EXPECT_NE(with.out, without.out);
}

TEST(SamplingCli, NonFiniteAndOutOfRangeValuesAreRefused) {
  const struct {
    std::string flags, says;
  } cases[] = {
      {"--temp nan", "--temp must be a finite number"},
      {"--top-p inf", "--top-p must be a finite number"},
      {"--frequency-penalty -inf", "--frequency-penalty must be a finite number"},
      {"--repeat-penalty 0", "--repeat-penalty must be > 0"},
      {"--repeat-last-n -2", "--repeat-last-n must be >= -1"},
  };
  for (const auto& c : cases) {
    const KvqRun r = RunKvq("run -p x -n 1 " + c.flags);
    EXPECT_EQ(r.exit_code, 2) << c.flags;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << c.flags << ": " << r.err;
  }
}

TEST(SamplingCli, SeedMinusOneIsRandom) {
  const std::string cmd = "run -p '" + kPrompt + "' -n 24 --temp 1.5 --top-k 0 --top-p 1 --min-p 0 -t 1 --seed -1";
  const KvqRun a = RunKvq(cmd), b = RunKvq(cmd), c = RunKvq(cmd);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  // Three random seeds giving one text at temperature 1.5 over 24 tokens: effectively impossible.
  EXPECT_FALSE(a.out == b.out && b.out == c.out) << a.out;
}

// -s is llama.cpp's short name of --seed: the same seed, the same text (and another seed, another).
TEST(SamplingCli, ShortSeedFlagIsTheSeed) {
  const std::string cmd = "run -p '" + kPrompt + "' -n 24 --temp 1.5 --top-k 0 --top-p 1 --min-p 0 -t 1 ";
  const KvqRun s = RunKvq(cmd + "-s 7"), seed = RunKvq(cmd + "--seed 7"), other = RunKvq(cmd + "-s 8");
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_EQ(s.out, seed.out);
  EXPECT_NE(s.out, other.out);
}

}  // namespace
