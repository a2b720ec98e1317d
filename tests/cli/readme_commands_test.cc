// README's shell commands, read from README.md itself and run, so they cannot rot: every
// `./build/release/kvq ...` line of a ```sh block runs with this build's kvq (MODEL.gguf: a small synth
// qwen3 file), except the ones that need the network (`pull`, `-hf`); a `serve` line starts the server
// in the background and the block's `curl` lines then talk to it. The build and setup lines are what CI
// itself runs (command 2), so they are not repeated here.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "test_util/run_kvq.h"

namespace {

const std::string kReadmeKvq = "./build/release/kvq";

// One command per entry: a ```sh block's lines with backslash continuations joined and comments
// (whole-line or after two spaces and '#') removed, in README order; blocks are kept apart.
std::vector<std::vector<std::string>> ShellBlocks(const std::string& readme) {
  std::vector<std::vector<std::string>> blocks;
  std::istringstream in(readme);
  std::string line, pending;
  bool inside = false;
  while (std::getline(in, line)) {
    if (!inside && line.rfind("```sh", 0) == 0) {
      inside = true;
      blocks.emplace_back();
      continue;
    }
    if (inside && line.rfind("```", 0) == 0) {
      inside = false;
      continue;
    }
    if (!inside) continue;
    if (line.rfind('#', 0) == 0) continue;
    const size_t comment = line.find("  #");
    if (comment != std::string::npos) line.resize(comment);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    if (!line.empty() && line.back() == '\\') {
      line.pop_back();
      pending += line;
      continue;
    }
    pending += line;
    if (!pending.empty()) blocks.back().push_back(pending);
    pending.clear();
  }
  return blocks;
}

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

class ReadmeCommands : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir() + "/kvq_readme_" + std::to_string(getpid());
    std::filesystem::create_directories(dir_);
    model_ = dir_ + "/model.gguf";
    const kvq_test::KvqRun synth = kvq_test::RunKvq("synth --arch qwen3 --dim 64 --layers 2 --heads 4 --kv-heads 2 "
                                                    "--ffn 128 --context 512 --type q8_0 -t 1 -o " + model_);
    ASSERT_EQ(synth.exit_code, 0) << synth.err;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The README line with this build's kvq and the test's model, run in the temporary folder with
  // HOME and the Hugging Face cache inside it (README's ~/.cache paths land there).
  std::string Concrete(const std::string& line) const {
    std::string cmd = Replace(line, kReadmeKvq, KVQ_BINARY);
    cmd = Replace(cmd, "MODEL.gguf", model_);
    return cmd;
  }
  std::string Env() const {
    return "cd '" + dir_ + "' && HOME='" + dir_ + "' HF_HUB_CACHE='" + dir_ + "/hub' HF_HUB_OFFLINE=1 ";
  }
  int Run(const std::string& cmd, std::string* log) const {
    const std::string out = dir_ + "/out.txt";
    const std::string full = Env() + "timeout 120 sh -c '" + Replace(cmd, "'", "'\\''") + "' </dev/null >'" + out + "' 2>&1";
    const int status = std::system(full.c_str());
    *log = kvq_test::Slurp(out);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  std::string dir_, model_;
};

TEST_F(ReadmeCommands, EveryKvqCommandThatNeedsNoNetworkRuns) {
  const std::string readme = kvq_test::Slurp(std::string(KVQ_SOURCE_DIR) + "/README.md");
  ASSERT_FALSE(readme.empty());
  int ran = 0, served = 0, curled = 0;
  for (const std::vector<std::string>& block : ShellBlocks(readme)) {
    pid_t server = -1;
    int port = 0;
    for (std::string line : block) {
      // README command 1 ends by running kvq after setting up and building: that part runs here.
      const size_t after_build = line.find("&& " + kReadmeKvq);
      if (after_build != std::string::npos) line = line.substr(after_build + 3);
      const bool kvq = line.rfind(kReadmeKvq, 0) == 0 || line.find("| " + kReadmeKvq) != std::string::npos;
      const bool network = line.find(" pull ") != std::string::npos || line.find(" -hf ") != std::string::npos;
      if (kvq && network) continue;  // reaches huggingface.co: tests/hub runs that code against a local hub
      if (kvq && line.find(kReadmeKvq + " serve ") == 0) {
        // In the background on a free port; the block's curl lines get that port.
        const std::string log = dir_ + "/serve.log";
        server = fork();
        if (server == 0) {
          const std::string cmd = Env() + "exec " + Concrete(line) + " --port 0 -t 1 2>'" + log + "'";
          execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
          _exit(127);
        }
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        std::smatch m;
        static const std::regex listening("listening on http://127\\.0\\.0\\.1:(\\d+)");
        std::string text;
        while (std::chrono::steady_clock::now() < until) {
          text = kvq_test::Slurp(log);
          if (std::regex_search(text, m, listening)) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        ASSERT_TRUE(std::regex_search(text, m, listening)) << line << "\n" << text;
        port = std::stoi(m[1]);
        ++served;
        continue;
      }
      if (line.rfind("curl ", 0) == 0) {
        ASSERT_GT(port, 0) << "README runs `" << line << "` with no server started in its block";
        std::string log;
        const int rc = Run(Replace(line, "127.0.0.1:8080", "127.0.0.1:" + std::to_string(port)) + " --fail -sS", &log);
        EXPECT_EQ(rc, 0) << line << "\n" << log;
        EXPECT_NE(log.find("\"choices\""), std::string::npos) << line << "\n" << log;
        ++curled;
        continue;
      }
      if (!kvq) continue;  // setup, cmake, python3 -m http.server: the build CI runs, the page's own test
      std::string log;
      const int rc = Run(Concrete(line), &log);
      EXPECT_EQ(rc, 0) << "README's `" << line << "` failed:\n" << log;
      std::printf("ran: %s (exit %d, %zu bytes of output)\n", line.c_str(), rc, log.size());
      ++ran;
    }
    if (server > 0) {
      kill(server, SIGTERM);
      int status = 0;
      waitpid(server, &status, 0);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "serve ended with " << status;
    }
  }
  // What README holds today; fewer means the parse or README lost its examples.
  EXPECT_GE(ran, 5);
  EXPECT_GE(served, 1);
  EXPECT_GE(curled, 1);
}

}  // namespace
