// `kvq serve` as a program: flags refused before anything starts (exit 2, naming the flag), and a
// server started with a per-layer plan (--kv-plan) answering greedily what `kvq run` with the same
// plan prints, then stopping on SIGTERM with exit 0.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

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
      {"serve --port 70000", "--port"},
      {"serve --kv nope", "--kv"},
      {"serve --kv-plan /nonexistent/plan.json", "--kv-plan"},
      {"serve --kv int4 --kv-plan " + kPlan, "excludes"},
      {"serve --port 0 --kv-budget-per-session 100B", "--kv-budget-per-session"},
      {"serve --host 999.1.1.1 --port 1", "cannot listen"},
      {"serve -m /nonexistent.gguf", "nonexistent"},
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

}  // namespace
