// `kvq pull`, `kvq list` and `kvq run -hf` against a hub on 127.0.0.1: a cpp-httplib server in
// this process answering the hub's API (model info, tree listing) and /resolve/ with a redirect
// to a "CDN" path that serves the bytes, honours Range requests and can break a reply off
// halfway. The files are synth GGUFs (tiny random-weight Llamas); their SHA-256 is computed by
// coreutils' sha256sum, not by the code under test. Nothing leaves the machine.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "kvq/units.h"
#include "synth/synth.h"
#include "test_util/run_kvq.h"

namespace {
namespace fs = std::filesystem;
using kvq_test::RunKvq;
using nlohmann::json;

const std::string kCommit = "0123456789abcdef0123456789abcdef01234567";
const std::string kRepo = "kvq-test/tiny-GGUF";
const std::string kCorruptRepo = "kvq-test/corrupt-GGUF";

std::string Sha256Sum(const std::string& path) {
  FILE* p = popen(("sha256sum '" + path + "'").c_str(), "r");
  char hex[65] = {};
  const size_t n = p ? fread(hex, 1, 64, p) : 0;
  if (p) pclose(p);
  EXPECT_EQ(n, 64u) << path;
  return std::string(hex, n);
}

std::string WriteSynth(const std::string& path, uint32_t seed) {
  const kvq::SynthSpec spec{.arch = kvq::SynthArch::kLlama,
                            .dim = 64,
                            .n_layers = 2,
                            .n_heads = 4,
                            .n_kv_heads = 2,
                            .hidden_dim = 128,
                            .vocab_size = 512,
                            .context = 256,
                            .type = "f32",
                            .seed = seed};
  const kvq::Status s = kvq::WriteSynthModel(
      spec, std::string(KVQ_SOURCE_DIR) + "/models/stories260K/stories260K.gguf", path);
  EXPECT_TRUE(s.ok()) << s.message();
  return kvq_test::Slurp(path);
}

// One file a repository lists: its bytes and the SHA-256 the listing gives (the true one unless
// a test wants a corrupt listing).
struct HubFile {
  std::string bytes;
  std::string listed_sha256;
};

class FakeHub {
 public:
  // repo -> path -> file
  explicit FakeHub(std::map<std::string, std::map<std::string, HubFile>> repos)
      : repos_(std::move(repos)) {
    server_.Get(R"(/api/models/([^/]+/[^/]+))", [this](const httplib::Request& req,
                                                       httplib::Response& res) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        authorization_ = req.get_header_value("Authorization");
      }
      if (!repos_.count(req.matches[1])) return NotFound(res);
      res.set_content(json{{"id", req.matches[1]}, {"sha", kCommit}}.dump(), "application/json");
    });
    server_.Get(R"(/api/models/([^/]+/[^/]+)/tree/([0-9a-f]+))", [this](const httplib::Request& req,
                                                                        httplib::Response& res) {
      const auto repo = repos_.find(req.matches[1]);
      if (repo == repos_.end() || req.matches[2] != kCommit) return NotFound(res);
      json tree = json::array();
      for (const auto& [path, f] : repo->second) {
        json e = {
            {"type", "file"}, {"path", path}, {"oid", "not-a-sha256"}, {"size", f.bytes.size()}};
        if (!f.listed_sha256.empty())
          e["lfs"] = {{"oid", f.listed_sha256}, {"size", f.bytes.size()}, {"pointerSize", 134}};
        tree.push_back(e);
      }
      res.set_content(tree.dump(), "application/json");
    });
    server_.Get(R"(/([^/]+/[^/]+)/resolve/([0-9a-f]+)/(.+))", [this](const httplib::Request& req,
                                                                     httplib::Response& res) {
      ++resolve_requests;
      const auto repo = repos_.find(req.matches[1]);
      if (repo == repos_.end() || !repo->second.count(req.matches[3])) return NotFound(res);
      res.set_redirect("/cdn/" + std::string(req.matches[1]) + "/" + std::string(req.matches[3]));
    });
    server_.Get(R"(/cdn/([^/]+/[^/]+)/(.+))",
                [this](const httplib::Request& req, httplib::Response& res) {
                  const std::string* bytes = &repos_.at(req.matches[1]).at(req.matches[2]).bytes;
                  {
                    std::lock_guard<std::mutex> lock(mu_);
                    ranges_seen_.push_back(req.get_header_value("Range"));
                  }
                  // Breaking off: the reply promises every byte but the connection closes at the
                  // middle.
                  const bool cut = cut_next.exchange(false);
                  const size_t stop = cut ? bytes->size() / 2 : bytes->size();
                  res.set_content_provider(
                      bytes->size(), "application/octet-stream",
                      [bytes, stop](size_t offset, size_t length, httplib::DataSink& sink) {
                        if (offset >= stop) return false;
                        const size_t n = std::min({length, stop - offset, size_t{65536}});
                        return sink.write(bytes->data() + offset, n);
                      });
                });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeHub() {
    server_.stop();
    thread_.join();
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<std::string> ranges_seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return ranges_seen_;
  }

  // The Authorization header of the last model-info request ("" when none came).
  std::string authorization() {
    std::lock_guard<std::mutex> lock(mu_);
    return authorization_;
  }

  std::atomic<int> resolve_requests{0};
  std::atomic<bool> cut_next{false};

 private:
  static void NotFound(httplib::Response& res) {
    res.status = 404;
    res.set_content(R"({"error":"Repository not found"})", "application/json");
  }
  std::map<std::string, std::map<std::string, HubFile>> repos_;
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::mutex mu_;
  std::vector<std::string> ranges_seen_;
  std::string authorization_;
};

class PullCli : public testing::Test {
 protected:
  void SetUp() override {
    const std::string name = testing::UnitTest::GetInstance()->current_test_info()->name();
    dir_ = fs::path(testing::TempDir()) / ("kvq_pull_" + std::to_string(getpid()) + "_" + name);
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "files");
    q4_ = WriteSynth((dir_ / "files" / "q4.gguf").string(), 1);
    q8_ = WriteSynth((dir_ / "files" / "q8.gguf").string(), 2);
    q4_sha_ = Sha256Sum((dir_ / "files" / "q4.gguf").string());
    const std::string q8_sha = Sha256Sum((dir_ / "files" / "q8.gguf").string());
    hub_ = std::make_unique<FakeHub>(std::map<std::string, std::map<std::string, HubFile>>{
        {kRepo,
         {{"tiny-Q4_K_M.gguf", {q4_, q4_sha_}},
          {"tiny-Q8_0.gguf", {q8_, q8_sha}},
          {"tiny-F16-00001-of-00002.gguf", {"split", ""}},
          {"mmproj-tiny-F16.gguf", {"projector", ""}},
          {"README.md", {"# tiny\n", ""}}}},
        // Lists the SHA-256 of other bytes than it serves.
        {kCorruptRepo, {{"tiny-Q4_K_M.gguf", {q4_, q8_sha}}}}});
    cache_ = dir_ / "hf-cache";
    setenv("HF_ENDPOINT", hub_->endpoint().c_str(), 1);
    setenv("HF_HUB_CACHE", cache_.c_str(), 1);
    unsetenv("HF_TOKEN");
    unsetenv("HF_HUB_OFFLINE");
  }
  void TearDown() override {
    hub_.reset();
    fs::remove_all(dir_);
  }
  fs::path RepoDir(const std::string& folder = "models--kvq-test--tiny-GGUF") const {
    return cache_ / folder;
  }
  // Regular files and links under the cache, but for .locks/ (lock files stay, as
  // huggingface_hub's do).
  int FilesInCache() const {
    int n = 0;
    if (fs::exists(cache_)) {
      for (const auto& e : fs::recursive_directory_iterator(cache_)) {
        n += !e.is_directory() && e.path().string().find("/.locks/") == std::string::npos;
      }
    }
    return n;
  }

  fs::path dir_, cache_;
  std::string q4_, q8_, q4_sha_;
  std::unique_ptr<FakeHub> hub_;
};

TEST_F(PullCli, PullsIntoTheHfCacheLayoutThenHitsTheCache) {
  const kvq_test::KvqRun r = RunKvq("pull " + kRepo);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const fs::path link = RepoDir() / "snapshots" / kCommit / "tiny-Q4_K_M.gguf";
  EXPECT_EQ(r.out, link.string() + "\n");
  // The messages: the file named, progress ending at 100% (a line, as stderr is not a terminal).
  EXPECT_NE(r.err.find("downloading tiny-Q4_K_M.gguf ("), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(100%)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("downloaded and verified"), std::string::npos) << r.err;
  ASSERT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(fs::read_symlink(link), fs::path("../../blobs") / q4_sha_);
  EXPECT_EQ(kvq_test::Slurp((RepoDir() / "blobs" / q4_sha_).string()), q4_);
  EXPECT_EQ(kvq_test::Slurp((RepoDir() / "refs" / "main").string()), kCommit);
  EXPECT_EQ(FilesInCache(), 3);  // the blob, the link, refs/main: no .incomplete left
  EXPECT_EQ(hub_->resolve_requests, 1);
  EXPECT_TRUE(fs::exists(cache_ / ".locks" / "models--kvq-test--tiny-GGUF" / (q4_sha_ + ".lock")));

  const kvq_test::KvqRun again = RunKvq("pull " + kRepo + ":q4_k_m --json");
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(hub_->resolve_requests, 1);  // no download request
  const json doc = json::parse(again.out);
  EXPECT_EQ(doc["path"], link.string());
  EXPECT_EQ(doc["downloaded"], false);
  EXPECT_EQ(doc["bytes"], q4_.size());
  EXPECT_EQ(doc["quant"], "Q4_K_M");

  const kvq_test::KvqRun quiet = RunKvq("pull --quiet " + kRepo + ":Q8_0");
  ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_EQ(quiet.err, "");
  EXPECT_EQ(kvq_test::Slurp(quiet.out.substr(0, quiet.out.size() - 1)), q8_);

  const kvq_test::KvqRun list = RunKvq("list --json");
  ASSERT_EQ(list.exit_code, 0) << list.err;
  const json models = json::parse(list.out)["models"];
  ASSERT_EQ(models.size(), 2u) << list.out;
  EXPECT_EQ(models[0]["repo"], kRepo);
  EXPECT_EQ(models[0]["file"], "tiny-Q4_K_M.gguf");
  EXPECT_EQ(models[0]["bytes"], q4_.size());
  EXPECT_EQ(models[0]["path"], link.string());
  EXPECT_EQ(models[1]["file"], "tiny-Q8_0.gguf");
  const kvq_test::KvqRun table = RunKvq("list");
  EXPECT_NE(table.out.find(kRepo + "  tiny-Q8_0.gguf"), std::string::npos) << table.out;
}

TEST_F(PullCli, AnInterruptedDownloadResumesFromTheBytesItHas) {
  hub_->cut_next = true;
  const kvq_test::KvqRun cut = RunKvq("pull " + kRepo);
  EXPECT_EQ(cut.exit_code, 1) << cut.err;
  EXPECT_NE(cut.err.find("run the same command again to resume"), std::string::npos) << cut.err;
  const fs::path part = RepoDir() / "blobs" / (q4_sha_ + ".incomplete");
  ASSERT_TRUE(fs::exists(part));
  const size_t half = q4_.size() / 2;
  EXPECT_EQ(fs::file_size(part), half);
  EXPECT_EQ(FilesInCache(), 1);  // the partial file only: no link, no ref

  const kvq_test::KvqRun resumed = RunKvq("pull " + kRepo);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("asking for the rest after the " +
                             kvq::FormatCount(static_cast<int64_t>(half)) + " bytes already held"),
            std::string::npos)
      << resumed.err;
  EXPECT_NE(resumed.err.find("downloaded (resumed after " +
                             kvq::FormatCount(static_cast<int64_t>(half)) + " bytes) and verified"),
            std::string::npos)
      << resumed.err;
  const std::vector<std::string> ranges = hub_->ranges_seen();
  ASSERT_EQ(ranges.size(), 2u);
  EXPECT_EQ(ranges[0], "");
  EXPECT_EQ(ranges[1], "bytes=" + std::to_string(half) + "-");
  EXPECT_FALSE(fs::exists(part));
  EXPECT_EQ(Sha256Sum((RepoDir() / "blobs" / q4_sha_).string()), q4_sha_);
}

TEST_F(PullCli, AWrongSha256IsRefusedAndLeavesNothingInTheCache) {
  const kvq_test::KvqRun r = RunKvq("pull " + kCorruptRepo);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(kCorruptRepo), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("has SHA-256 " + q4_sha_), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("corrupt"), std::string::npos) << r.err;
  EXPECT_EQ(FilesInCache(), 0);
  EXPECT_FALSE(fs::exists(RepoDir("models--kvq-test--corrupt-GGUF")));
}

TEST_F(PullCli, RunTakesHfAndRunsWhatMWould) {
  const std::string args = " -p 'Once upon' -n 4 --temp 0 -t 1 --json";
  setenv("HF_TOKEN", "hf_kvq_test_token", 1);
  const kvq_test::KvqRun hf = RunKvq("run -hf " + kRepo + ":q8_0" + args);
  ASSERT_EQ(hf.exit_code, 0) << hf.err;
  EXPECT_NE(hf.err.find("downloading tiny-Q8_0.gguf"), std::string::npos) << hf.err;
  const fs::path link = RepoDir() / "snapshots" / kCommit / "tiny-Q8_0.gguf";
  const kvq_test::KvqRun m = RunKvq("run -m " + link.string() + args);
  ASSERT_EQ(m.exit_code, 0) << m.err;
  const json a = json::parse(hf.out), b = json::parse(m.out);
  EXPECT_EQ(a["tokens"], b["tokens"]);
  EXPECT_EQ(a["tokens"].size(), b["tokens"].size());
  EXPECT_EQ(a["model"], link.string());
  EXPECT_EQ(hub_->authorization(), "Bearer hf_kvq_test_token");

  // Offline, the pick is made in the cache: no request reaches the hub.
  hub_.reset();
  setenv("HF_HUB_OFFLINE", "1", 1);
  const kvq_test::KvqRun offline = RunKvq("run --hf-repo " + kRepo + ":Q8_0" + args);
  ASSERT_EQ(offline.exit_code, 0) << offline.err;
  EXPECT_EQ(json::parse(offline.out)["tokens"], b["tokens"]);
  EXPECT_NE(offline.err.find("HF_HUB_OFFLINE"), std::string::npos) << offline.err;
}

TEST_F(PullCli, ServeTakesHfAndServesTheDownloadedModel) {
  int err_pipe[2];
  ASSERT_EQ(pipe(err_pipe), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(err_pipe[1], STDERR_FILENO);
    close(err_pipe[0]);
    const std::string ref = kRepo + ":Q8_0";
    execl(KVQ_BINARY, KVQ_BINARY, "serve", "-hf", ref.c_str(), "--port", "0", "-t", "1", "--web",
          "", static_cast<char*>(nullptr));
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
    if (std::regex_search(log, m, std::regex("listening on http://127\\.0\\.0\\.1:(\\d+)"))) {
      port = std::stoi(m[1]);
    }
  }
  ASSERT_GT(port, 0) << log;
  EXPECT_NE(log.find("kvq serve: downloading tiny-Q8_0.gguf"), std::string::npos) << log;
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(std::chrono::seconds(30));
  const httplib::Result r = client.Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(json::parse(r->body)["data"][0]["id"], "tiny-Q8_0") << r->body;
  kill(pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  close(err_pipe[0]);
}

TEST_F(PullCli, ErrorsNameTheRepositoryTheQuantAndWhatThereIs) {
  const kvq_test::KvqRun both = RunKvq("run -m x.gguf -hf " + kRepo);
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.err.find("-m x.gguf and -hf " + kRepo), std::string::npos) << both.err;

  for (const std::string bad : {"noslash", "a/b/c", "a/b:"}) {
    const kvq_test::KvqRun r = RunKvq("pull '" + bad + "'");
    EXPECT_EQ(r.exit_code, 2) << bad;
    EXPECT_NE(r.err.find("'" + bad + "' is not a model repository"), std::string::npos) << r.err;
    const kvq_test::KvqRun run = RunKvq("run -hf '" + bad + "'");
    EXPECT_EQ(run.exit_code, 2) << bad;
    EXPECT_NE(run.err.find("-hf"), std::string::npos) << run.err;
  }

  const kvq_test::KvqRun quant = RunKvq("pull " + kRepo + ":Q5_K_S");
  EXPECT_EQ(quant.exit_code, 1);
  EXPECT_NE(quant.err.find(kRepo + " has no GGUF with quant 'Q5_K_S' (available: Q4_K_M, Q8_0)"),
            std::string::npos)
      << quant.err;
  const kvq_test::KvqRun run_quant = RunKvq("run -hf " + kRepo + ":Q5_K_S");
  EXPECT_EQ(run_quant.exit_code, 1);
  EXPECT_NE(run_quant.err.find("kvq run: error: -hf " + kRepo + " has no GGUF with quant 'Q5_K_S'"),
            std::string::npos)
      << run_quant.err;

  const kvq_test::KvqRun missing = RunKvq("pull kvq-test/missing-GGUF");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(
      missing.err.find("kvq-test/missing-GGUF: no such model repository on " + hub_->endpoint()),
      std::string::npos)
      << missing.err;
  EXPECT_EQ(hub_->resolve_requests, 0);
  EXPECT_EQ(FilesInCache(), 0);
}

}  // namespace
