// -l/--logit-bias on kvq run and kvq chat (llama.cpp's TOKEN_ID(+/-)BIAS, and TOKEN_ID:BIAS): a ban
// (-inf) of a token the run generated changes the output and the token never comes, greedy and
// sampled; a large + bias makes a token the run never generated come; the ids equal
// Session::Generate's with the same SamplerOptions::logit_bias, strictly; a value that is not a
// number, lacks its sign, is NaN or +inf, or names an id outside the vocabulary is refused, naming
// the flag and the value, before anything runs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvq/model.h"
#include "kvq/session.h"
#include "test_util/run_kvq.h"

namespace {

using kvq_test::KvqRun;
using kvq_test::RunKvq;
using nlohmann::json;
const std::string kDir = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/";
const std::string kModel =
    "-m " + kDir + "stories260K.bin --tokenizer " + kDir + "tok512.bin -t 1 -q ";
const std::string kPrompt = "Once upon a time";
constexpr int kNew = 24;
constexpr int32_t kVocab = 512;  // tok512.bin's
const std::string kGreedy = "--temp 0 ";
const std::string kSampled = "--temp 1.5 --top-k 0 --top-p 1 --min-p 0 --seed 7 ";

// The ids `kvq run --json` generated (its `tokens` less the prompt's) with `flags`; every run here
// ends on -n (finish "length"), so the generated ids are the last kNew.
std::vector<int32_t> RunIds(const std::string& flags) {
  const KvqRun r = RunKvq("run " + kModel + "-p '" + kPrompt + "' -n " + std::to_string(kNew) +
                          " --json " + flags);
  EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.err;
  if (r.exit_code != 0) return {};
  const json j = json::parse(r.out);
  EXPECT_EQ(j["finish_reason"], "length") << flags;
  const std::vector<int32_t> tokens = j["tokens"].get<std::vector<int32_t>>();
  EXPECT_GE(tokens.size(), static_cast<size_t>(kNew));
  return std::vector<int32_t>(tokens.end() - kNew, tokens.end());
}

// The id generated most often (the lowest of a tie).
int32_t MostFrequent(const std::vector<int32_t>& ids) {
  std::map<int32_t, int> count;
  for (int32_t id : ids) ++count[id];
  return std::max_element(count.begin(), count.end(),
                          [](auto& a, auto& b) { return a.second < b.second; })
      ->first;
}

bool Contains(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

TEST(LogitBiasCli, ABanChangesTheOutputAndTheTokenNeverComes) {
  for (const std::string& mode : {kGreedy, kSampled}) {
    const std::vector<int32_t> plain = RunIds(mode);
    ASSERT_EQ(plain.size(), static_cast<size_t>(kNew));
    // The first generated id (so the output changes at once) and the most frequent one (so it
    // would have come again).
    for (const int32_t banned : {plain[0], MostFrequent(plain)}) {
      for (const std::string& spelling :
           {std::to_string(banned) + "-inf", std::to_string(banned) + ":-inf"}) {
        const std::vector<int32_t> biased = RunIds(mode + "--logit-bias " + spelling);
        EXPECT_NE(biased, plain) << mode << spelling;
        EXPECT_FALSE(Contains(biased, banned)) << mode << spelling;
      }
    }
  }
}

TEST(LogitBiasCli, APlusBiasMakesATokenCome) {
  const std::vector<int32_t> plain = RunIds(kGreedy);
  ASSERT_EQ(plain.size(), static_cast<size_t>(kNew));
  int32_t favoured = 300;  // an ordinary token the plain run never generated
  while (Contains(plain, favoured)) ++favoured;
  for (const std::string& spelling :
       {std::to_string(favoured) + "+100", std::to_string(favoured) + ":100"}) {
    // -l is llama.cpp's short name.
    const std::vector<int32_t> biased = RunIds(kGreedy + "-l " + spelling);
    ASSERT_FALSE(biased.empty()) << spelling;
    // Greedy takes the argmax: a logit raised by 100 is the largest from the first step.
    EXPECT_EQ(biased[0], favoured) << spelling;
    EXPECT_NE(biased, plain) << spelling;
  }
}

// The flag is a client of SamplerOptions::logit_bias: the sampled ids with a ban, a raise and one
// id given twice (its biases add) equal Session::Generate's with those pairs, in that order.
TEST(LogitBiasCli, EqualsTheApisLogitBias) {
  const std::vector<int32_t> plain = RunIds(kSampled);
  ASSERT_EQ(plain.size(), static_cast<size_t>(kNew));
  const int32_t banned = plain[0], raised = plain[kNew / 2];
  ASSERT_NE(banned, raised);
  const std::vector<int32_t> cli =
      RunIds(kSampled + "-l " + std::to_string(banned) + "-inf -l " + std::to_string(raised) +
             "+1.5 -l " + std::to_string(raised) + ":+0.75");
  auto model = kvq::Model::Load(kDir + "stories260K.bin",
                                {.tokenizer_path = kDir + "tok512.bin", .threads = 1});
  ASSERT_TRUE(model.ok()) << model.status().message();
  auto session = (*model)->NewSession();
  ASSERT_TRUE(session.ok()) << session.status().message();
  const kvq::SamplerOptions sampling{
      .temperature = 1.5f,
      .top_k = 0,
      .top_p = 1.0f,
      .min_p = 0.0f,
      .seed = 7,
      .logit_bias = {
          {banned, -std::numeric_limits<float>::infinity()}, {raised, 1.5f}, {raised, 0.75f}}};
  auto c = (*session)->Generate(kPrompt, {.max_tokens = kNew, .sampling = sampling});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(cli, c->tokens);
  EXPECT_NE(cli, plain);
}

// kvq chat shares the flag (generate_flags): a ban of the reply's most frequent id keeps it out.
TEST(LogitBiasCli, ChatTakesTheFlag) {
  const std::string input =
      testing::TempDir() + "/logit_bias_chat_" + std::to_string(getpid()) + ".txt";
  std::ofstream(input) << kPrompt << "\n";
  auto reply_ids = [&](const std::string& flags) {
    const KvqRun r = RunKvq("chat " + kModel + "-n 16 --temp 0 --json " + flags + " -f " + input);
    EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.err;
    return r.exit_code == 0 ? json::parse(r.out)["reply_ids"].get<std::vector<int32_t>>()
                            : std::vector<int32_t>{};
  };
  const std::vector<int32_t> plain = reply_ids("");
  ASSERT_FALSE(plain.empty());
  const int32_t banned = MostFrequent(plain);
  const std::vector<int32_t> biased = reply_ids("--logit-bias " + std::to_string(banned) + "-inf");
  EXPECT_NE(biased, plain);
  EXPECT_FALSE(Contains(biased, banned));
  std::remove(input.c_str());
}

TEST(LogitBiasCli, BadValuesAreRefusedNamingTheFlag) {
  const struct {
    std::string value, says;
  } cases[] = {
      {"15+x", "expected TOKEN_ID+BIAS"},             // not a number
      {"x+1", "expected TOKEN_ID+BIAS"},              // no token id
      {"15+1.5x", "expected TOKEN_ID+BIAS"},          // trailing text (llama.cpp's stof reads 1.5)
      {"15", "the bias has no sign"},                 // the sign missing
      {"15+-1", "expected TOKEN_ID+BIAS"},            // two signs
      {"15+nan", "must be a finite number or -inf"},  // NaN
      {"15:nan", "must be a finite number or -inf"},
      {"15+inf", "must be a finite number or -inf"},  // +inf: only -inf (a ban) is not finite
      {"15+1e39", "out of a float's range"},
      {std::to_string(kVocab) + "+1", "not in the model's vocabulary of 512 tokens"},  // id = vocab
      {"4294967296-1", "the token id is out of range"},
  };
  for (const char* command : {"run", "chat"}) {
    for (const auto& c : cases) {
      const KvqRun r = RunKvq(std::string(command) + " " + kModel + "-n 1 --logit-bias " + c.value);
      EXPECT_EQ(r.exit_code, 2) << command << " " << c.value;
      EXPECT_NE(r.err.find("--logit-bias " + c.value + ": "), std::string::npos)
          << command << " " << r.err;
      EXPECT_NE(r.err.find(c.says), std::string::npos)
          << command << " " << c.value << ": " << r.err;
    }
  }
  // Biases of one id add up (as the sampler adds them): a total of +inf is refused too.
  const KvqRun r = RunKvq("run " + kModel + "-n 1 -l 15+3e38 -l 15:3e38");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--logit-bias 15:3e38: token 15's biases add up to inf"), std::string::npos)
      << r.err;
}

}  // namespace
