// What `kvq run` says on stderr around a generation: the banner after loading (gone with
// --quiet), the tokens generated counted as -n counts them, why the run stopped; a long prompt's
// progress as a bar redrawn in place on a terminal (a pseudo-terminal here) and as lines in a pipe;
// Ctrl-C during a reply prints the stats so far; and `kvq synth` interrupted while writing leaves
// no temporary file.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>

#include "test_util/run_kvq.h"

namespace {

namespace fs = std::filesystem;
using kvq_test::KvqRun;
using kvq_test::RunKvq;

std::string Temp(const std::string& name) {
  return testing::TempDir() + "/kvq_progress_" + std::to_string(getpid()) + "_" + name;
}

TEST(RunReport, BannerDecodeCountAndWhyItStopped) {
  const KvqRun r = RunKvq("run -p Once -n 10 --temp 0 -t 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // stories260K.bin: llama2.c f32 weights, 5 layers, f16 KV at 4 KV heads x 8: 2 x 5 x 4 x 8 x 2 B.
  EXPECT_NE(r.err.find("kvq run: stories260K.bin: llama, "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" parameters (f32 100%), 5 layers, context 512; KV f16, 640 bytes per token; 1 thread, "),
            std::string::npos) << r.err;
  EXPECT_NE(r.err.find("decode 10 tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("kvq run: finish: length (-n 10 tokens generated)"), std::string::npos) << r.err;
  const KvqRun quiet = RunKvq("run -p Once -n 10 --temp 0 -t 1 --quiet");
  ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_EQ(quiet.err.find("parameters"), std::string::npos) << quiet.err;
  EXPECT_EQ(quiet.out, r.out);
}

// A model and a prompt whose prefill takes well over the second before progress shows.
class LongPrompt : public testing::Test {
 protected:
  void SetUp() override {
    const KvqRun synth = RunKvq("synth --dim 512 --layers 4 --heads 8 --ffn 1024 --context 4096 --type f32 -t 1 -o " +
                                model_);
    ASSERT_EQ(synth.exit_code, 0) << synth.err;
    std::ofstream prompt(prompt_);
    for (int i = 0; i < 450; ++i) prompt << "Once upon a time ";
  }
  void TearDown() override {
    fs::remove(model_);
    fs::remove(prompt_);
  }
  std::string Args() const { return "run -m " + model_ + " -f " + prompt_ + " -n 2 --temp 0 -t 1"; }
  const std::string model_ = Temp("model.gguf"), prompt_ = Temp("prompt.txt");
};

// "kvq run: prompt 640/1801 tokens (35%) at 512.0 tok/s"
const std::regex kProgressLine("kvq run: prompt [0-9]+/[0-9]+ tokens \\([0-9]+%\\) at ");

TEST_F(LongPrompt, ABarOnATerminalAndLinesInAPipe) {
  // On a pseudo-terminal: the bar, redrawn in place ("\r[###...] prompt N/M tokens").
  int master = -1;
  const std::string args = Args();
  const pid_t pid = forkpty(&master, nullptr, nullptr, nullptr);
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", (std::string(KVQ_BINARY) + " " + args + " </dev/null").c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  std::string terminal;
  char buf[4096];
  for (ssize_t n; (n = read(master, buf, sizeof(buf))) > 0;) terminal.append(buf, static_cast<size_t>(n));
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  close(master);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << terminal;
  EXPECT_NE(terminal.find("\r[#"), std::string::npos) << terminal;
  EXPECT_TRUE(std::regex_search(terminal, std::regex("\r\\[#+ *\\] prompt [0-9]+/[0-9]+ tokens \\("))) << terminal;
  EXPECT_NE(terminal.find("\r\x1b[K"), std::string::npos) << "the bar is not erased:\n" << terminal;

  // In a pipe: lines, never a carriage return.
  const KvqRun piped = RunKvq(args);
  ASSERT_EQ(piped.exit_code, 0) << piped.err;
  EXPECT_TRUE(std::regex_search(piped.err, kProgressLine)) << piped.err;
  EXPECT_EQ(piped.err.find('\r'), std::string::npos) << piped.err;
  EXPECT_TRUE(piped.out.starts_with("Once upon a time Once")) << piped.out.substr(0, 100);
}

// Ctrl-C during the reply: the stats so far, why it stopped, exit 0 (the text printed is kept).
// A synth model decodes a few ms a token with a context of 4096, so the reply is still going when
// the signal comes (-n -1: until an end token or the context is full).
TEST(RunInterrupted, CtrlCPrintsTheStatsSoFar) {
  const std::string model = Temp("interrupt.gguf");
  const KvqRun synth = RunKvq("synth --dim 256 --layers 4 --heads 4 --ffn 512 --context 4096 --type f32 -t 1 -o " + model);
  ASSERT_EQ(synth.exit_code, 0) << synth.err;
  int out_pipe[2], err_pipe[2];
  ASSERT_EQ(pipe(out_pipe), 0);
  ASSERT_EQ(pipe(err_pipe), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    const int null = open("/dev/null", O_RDONLY);
    dup2(null, STDIN_FILENO);
    close(out_pipe[0]);
    close(err_pipe[0]);
    execl(KVQ_BINARY, KVQ_BINARY, "run", "-m", model.c_str(), "-p", "Once", "-n", "-1", "--temp", "0", "-t", "1",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  // Once 200 bytes of reply have come (the prompt is echoed first), SIGINT; then read to the end.
  std::string out, err;
  char buf[4096];
  bool sent = false;
  for (ssize_t n; (n = read(out_pipe[0], buf, sizeof(buf))) > 0;) {
    out.append(buf, static_cast<size_t>(n));
    if (!sent && out.size() > 200) {
      kill(pid, SIGINT);
      sent = true;
    }
  }
  for (ssize_t n; (n = read(err_pipe[0], buf, sizeof(buf))) > 0;) err.append(buf, static_cast<size_t>(n));
  close(out_pipe[0]);
  close(err_pipe[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  fs::remove(model);
  ASSERT_TRUE(sent) << "the reply ended before it could be interrupted:\n" << err;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << err;
  EXPECT_TRUE(out.starts_with("Once")) << out.substr(0, 100);
  EXPECT_NE(err.find("kvq run: finish: cancelled (Ctrl-C); the stats above are those so far"), std::string::npos) << err;
  // The stats line counts the tokens decoded before the signal: at least one, fewer than the context.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(err, m, std::regex("decode ([0-9]+) tokens at [0-9.]+ tok/s"))) << err;
  const int decoded = std::stoi(m[1]);
  EXPECT_GT(decoded, 0) << err;
  EXPECT_LT(decoded, 4096) << err;
}

TEST(SynthInterrupted, LeavesNoTemporaryFile) {
  const fs::path dir = Temp("synth");
  fs::create_directories(dir);
  const std::string out = (dir / "big.gguf").string();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, STDOUT_FILENO);
    dup2(null, STDERR_FILENO);
    execl(KVQ_BINARY, KVQ_BINARY, "synth", "--dim", "1024", "--layers", "16", "--heads", "8", "--ffn", "4096",
          "--type", "q4_0",
          "-t", "1", "-o", out.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Once the temporary file exists (the write is under way), SIGINT.
  bool writing = false;
  int status = 0;
  for (int i = 0; i < 6000 && !writing; ++i) {
    ASSERT_EQ(waitpid(pid, &status, WNOHANG), 0) << "synth ended before it was interrupted: " << status;
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) writing = writing || e.path().string().find(".tmp-") != std::string::npos;
    if (!writing) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(writing) << "synth never started writing";
  kill(pid, SIGINT);
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGINT) << status;
  std::string left;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) left += e.path().string() + "\n";
  EXPECT_EQ(left, "");
  fs::remove_all(dir);
}

}  // namespace
