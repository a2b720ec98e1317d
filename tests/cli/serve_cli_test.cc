// `kvq serve` as a program: flags refused before anything starts (exit 2, naming the flag); a
// server started with a per-layer plan (--kv-plan) answering greedily what `kvq run` with the same
// plan prints, then stopping on SIGTERM with exit 0; a second server on a taken port refused while
// the first keeps serving (its /tokenize equal to `kvq tokenize`, a log line per request); /health
// 503 "draining" after SIGTERM while a running request finishes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "test_util/run_kvq.h"

namespace {

using nlohmann::json;
const std::string kPlan = std::string(KVQ_SOURCE_DIR) + "/data/plans/stories260K-4.5bits.json";

TEST(ServeCli, BadFlagsAreRefusedBeforeAnythingStarts) {
  struct Case {
    std::string args;
    std::string says;
  };
  const Case cases[] = {
      {"serve --parallel 0", "--parallel"},
      {"serve -np 0", "--parallel"},  // llama-server's spelling, read as --parallel
      {"serve -a", "--alias"},
      {"serve --port 70000", "--port"},
      {"serve --kv nope", "--kv"},
      {"serve --kv-plan /nonexistent/plan.json", "--kv-plan"},
      {"serve --kv int4 --kv-plan " + kPlan, "excludes"},
      {"serve --port 0 --kv-budget-per-session 100B", "--kv-budget-per-session"},
      {"serve --host 999.1.1.1 --port 1", "cannot listen"},
      {"serve -m /nonexistent.gguf", "nonexistent"},
      {"serve --spec draft", "--spec draft needs a draft model: --draft-model FILE"},
      {"serve --spec eagle", "--spec"},
  };
  for (const Case& c : cases) {
    const kvq_test::KvqRun r = kvq_test::RunKvq(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << c.args << "\n" << r.err;
  }
}

TEST(ServeCli, APlanServesWhatRunPrintsAndSigtermStopsIt) {
  int err_pipe[2];
  ASSERT_EQ(pipe(err_pipe), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(err_pipe[1], STDERR_FILENO);
    close(err_pipe[0]);
    execl(KVQ_BINARY, KVQ_BINARY, "serve", "--port", "0", "-t", "1", "--web", "", "--kv-plan", kPlan.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(err_pipe[1]);
  std::string log;
  int port = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (port == 0 && std::chrono::steady_clock::now() < until) {
    char buf[512];
    const ssize_t n = read(err_pipe[0], buf, sizeof(buf));
    if (n <= 0) break;
    log.append(buf, static_cast<size_t>(n));
    std::smatch m;
    if (std::regex_search(log, m, std::regex("listening on http://127\\.0\\.0\\.1:(\\d+)"))) port = std::stoi(m[1]);
  }
  ASSERT_GT(port, 0) << log;
  EXPECT_NE(log.find("KV plan"), std::string::npos) << log;
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(std::chrono::seconds(60));
  httplib::Result r = client.Post("/v1/completions",
                                  R"({"prompt":"Once upon a time","max_tokens":40,"temperature":0})", "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const kvq_test::KvqRun run =
      kvq_test::RunKvq("run -p 'Once upon a time' -n 40 --temp 0 -t 1 --json --kv-plan " + kPlan);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], json::parse(run.out)["completion"]);
  kill(pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  close(err_pipe[0]);
}

// A `kvq serve --port 0 ARGS...` child: its port read from its log, its stderr kept readable.
class ServeProcess {
 public:
  explicit ServeProcess(std::vector<std::string> args) {
    int err_pipe[2];
    EXPECT_EQ(pipe(err_pipe), 0);
    args.insert(args.begin(), {KVQ_BINARY, "serve", "--port", "0", "-t", "1", "--web", ""});
    pid_ = fork();
    if (pid_ == 0) {
      dup2(err_pipe[1], STDERR_FILENO);
      close(err_pipe[0]);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(KVQ_BINARY, argv.data());
      _exit(127);
    }
    close(err_pipe[1]);
    err_ = err_pipe[0];
    ReadUntil(std::regex("listening on http://127\\.0\\.0\\.1:(\\d+)"), &port);
  }
  ~ServeProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close(err_);
  }
  // Reads the log until `pattern` matches (its first group into *number, when given) or 30 s pass.
  bool ReadUntil(const std::regex& pattern, int* number = nullptr) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    std::smatch m;
    while (!std::regex_search(log, m, pattern)) {
      if (std::chrono::steady_clock::now() > until) return false;
      char buf[512];
      const ssize_t n = read(err_, buf, sizeof(buf));
      if (n <= 0) return false;
      log.append(buf, static_cast<size_t>(n));
    }
    if (number != nullptr) *number = std::stoi(m[1]);
    return true;
  }
  // SIGTERM, then the exit status.
  int Terminate() {
    kill(pid_, SIGTERM);
    int status = 0;
    EXPECT_EQ(waitpid(pid_, &status, 0), pid_);
    pid_ = -1;
    return status;
  }
  pid_t pid() const { return pid_; }

  int port = 0;
  std::string log;

 private:
  pid_t pid_ = -1;
  int err_ = -1;
};

TEST(ServeCli, ASecondServerOnATakenPortExitsNamingItAndTheFirstKeepsServing) {
  const std::string gguf = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/stories260K.gguf";
  ServeProcess first({"-m", gguf});
  ASSERT_GT(first.port, 0) << first.log;
  const std::string port = std::to_string(first.port);
  const kvq_test::KvqRun second = kvq_test::RunKvq("serve --web '' -t 1 -m " + gguf + " --port " + port);
  EXPECT_EQ(second.exit_code, 2) << second.err;
  EXPECT_NE(second.err.find("port " + port + " is in use"), std::string::npos) << second.err;

  // The first answers every request (none went to a second listener).
  httplib::Client client("127.0.0.1", first.port);
  client.set_read_timeout(std::chrono::seconds(60));
  for (int i = 0; i < 4; ++i) {
    httplib::Result r = client.Get("/health");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->get_header_value("X-Request-Id"), std::to_string(i + 1));
  }
  // /tokenize equals `kvq tokenize --ids` (no BOS) for the same file, and /detokenize undoes it.
  const std::string text = "Once upon a time, there was a big dog.";
  httplib::Result tok = client.Post("/tokenize", json{{"content", text}}.dump(), "application/json");
  ASSERT_TRUE(tok);
  ASSERT_EQ(tok->status, 200) << tok->body;
  const kvq_test::KvqRun cli = kvq_test::RunKvq("tokenize --ids -m " + gguf + " -p '" + text + "'");
  ASSERT_EQ(cli.exit_code, 0) << cli.err;
  std::string ids;
  const json tokens = json::parse(tok->body)["tokens"];
  ASSERT_FALSE(tokens.empty());
  for (const json& id : tokens) {
    if (!ids.empty()) ids += ' ';
    ids += std::to_string(id.get<int>());
  }
  EXPECT_EQ(ids + "\n", cli.out);
  httplib::Result detok = client.Post("/detokenize", tok->body, "application/json");
  ASSERT_TRUE(detok);
  EXPECT_EQ(json::parse(detok->body)["content"], text);

  // One log line per request, with its tokens and timings.
  httplib::Result done = client.Post("/v1/completions", R"({"prompt":"Once","max_tokens":6,"ignore_eos":true})",
                                     "application/json");
  ASSERT_TRUE(done);
  ASSERT_EQ(done->status, 200) << done->body;
  EXPECT_TRUE(first.ReadUntil(std::regex(
      "request 7 POST /v1/completions 200 in [0-9.]+ s; prompt 2 tokens \\(0 reused\\), generated 6, TTFT [0-9.]+ s")))
      << first.log;
  EXPECT_NE(first.log.find("request 5 POST /tokenize 200"), std::string::npos) << first.log;
  const int status = first.Terminate();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(ServeCli, HealthSaysDrainingWhileARunningRequestFinishes) {
  // A model slow enough that a long completion is still running when SIGTERM comes.
  const std::string model = testing::TempDir() + "/kvq_serve_drain_" + std::to_string(getpid()) + ".gguf";
  const kvq_test::KvqRun synth = kvq_test::RunKvq("synth --dim 256 --layers 4 --heads 4 --ffn 512 --context 4096 "
                                                  "--type f32 -t 1 -o " + model);
  ASSERT_EQ(synth.exit_code, 0) << synth.err;
  ServeProcess server({"-m", model, "--shutdown-grace", "120"});
  std::filesystem::remove(model);  // the server has it mapped
  ASSERT_GT(server.port, 0) << server.log;
  auto running = std::async(std::launch::async, [port = server.port] {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(std::chrono::seconds(300));
    httplib::Result r = c.Post("/v1/completions", R"({"prompt":"Once upon a time","max_tokens":3500,"ignore_eos":true})",
                               "application/json");
    return r ? r->status : -1;
  });
  httplib::Client client("127.0.0.1", server.port);
  bool busy = false;
  for (int i = 0; i < 3000 && !busy; ++i) {
    httplib::Result slots = client.Get("/slots");
    ASSERT_TRUE(slots);
    for (const json& s : json::parse(slots->body)) busy = busy || s["state"] != "idle";
    if (!busy) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(busy) << "the request never started";
  kill(server.pid(), SIGTERM);
  ASSERT_TRUE(server.ReadUntil(std::regex("signal 15"))) << server.log;
  httplib::Result health = client.Get("/health");
  ASSERT_TRUE(health) << "the server stopped before the running request finished";
  EXPECT_EQ(health->status, 503);
  EXPECT_EQ(json::parse(health->body)["status"], "draining");
  httplib::Result refused = client.Post("/v1/completions", R"({"prompt":"Once","max_tokens":2})", "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503);
  EXPECT_EQ(running.get(), 200);  // the running one finished
  const int status = server.Terminate();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

}  // namespace
