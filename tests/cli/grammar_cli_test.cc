// kvq run's grammar flags: --grammar, --grammar-file, --json-schema and --json-schema-file
// constrain the bundled model's output (sampled, so the grammar, not luck, decides its shape), and
// bad grammars, schemas and flag combinations are refused with exit 2 and the flag named.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "test_util/run_kvq.h"

namespace {

using kvq_test::KvqRun;
using kvq_test::RunKvq;

const kvq_test::TempFilesRemovedAtExit kRemoved{testing::TempDir() + "/kvq_grammar_cli_" + std::to_string(getpid())};

std::string TempFile(const std::string& name, const std::string& text) {
  const std::string path = kRemoved.stem + "_" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// The generated text of `kvq run ... --json`.
std::string Generated(const std::string& args) {
  const KvqRun r = RunKvq("run -p 'Once upon a time' -n 200 --seed 5 --temp 1 " + args + " --json");
  EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j.value("finish_reason", ""), "stop") << r.out;
  return j.is_discarded() ? "" : j.value("completion", "");
}

TEST(RunGrammar, GrammarFlagsConstrainTheOutput) {
  EXPECT_EQ(Generated("--grammar 'root ::= \"The end.\"'"), "The end.");
  const std::string word = Generated("--grammar 'root ::= \"<\" [a-z]{3,5} \">\"'");
  EXPECT_TRUE(word.size() >= 5 && word.size() <= 7 && word.front() == '<' && word.back() == '>') << word;
  const std::string file = TempFile("g.gbnf", "# yes or no\nroot ::= answer\nanswer ::= \"yes\" | \"no\"\n");
  const std::string answer = Generated("--grammar-file " + file);
  EXPECT_TRUE(answer == "yes" || answer == "no") << answer;
  std::remove(file.c_str());
}

TEST(RunGrammar, JsonSchemaFlagsGiveValidJson) {
  const std::string schema =
      R"({"type":"object","properties":{"n":{"type":"integer"},"ok":{"type":"boolean"}},"required":["n","ok"]})";
  for (const std::string& flag : {"--json-schema '" + schema + "'", "--json-schema-file " + TempFile("s.json", schema)}) {
    const std::string text = Generated(flag);
    const nlohmann::json v = nlohmann::json::parse(text, nullptr, false);
    ASSERT_FALSE(v.is_discarded()) << flag << ": " << text;
    EXPECT_TRUE(v["n"].is_number_integer() && v["ok"].is_boolean() && v.size() == 2) << text;
  }
}

TEST(RunGrammar, BadInputNamesTheFlag) {
  KvqRun r = RunKvq("run -p x --grammar 'root ::= (\"a\"'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--grammar: GeneratorOptions::grammar: line 1, column 14: expected ')'"), std::string::npos) << r.err;
  r = RunKvq("run -p x --json-schema '{\"type\":\"string\",\"format\":\"date\"}'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--json-schema: at '/': unsupported keyword 'format'"), std::string::npos) << r.err;
  r = RunKvq("run -p x --grammar 'root ::= \"a\"' --json-schema '{}'");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--grammar and --json-schema: give at most one grammar"), std::string::npos) << r.err;
  r = RunKvq("run -p x --grammar-file /nonexistent/g.gbnf");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--grammar-file /nonexistent/g.gbnf: cannot read the file"), std::string::npos) << r.err;
}

}  // namespace
