// Processes the scale-out tests start and stop on 127.0.0.1: `kvq serve` replicas and a
// redis-server, each stopped by its destructor (a replica by SIGTERM as a user stops it, then SIGKILL
// if it has not exited in 10 s; redis-server by SIGKILL), every wait bounded.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace kvq::test {

/// A TCP port nobody listens on now (the kernel's pick for port 0).
inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

/// A child process whose stderr (and stdout) the test reads.
class Child {
 public:
  explicit Child(std::vector<std::string> argv) {
    int out[2];
    EXPECT_EQ(pipe(out), 0);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDERR_FILENO);
      dup2(out[1], STDOUT_FILENO);
      close(out[0]);
      std::vector<char*> args;
      for (std::string& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(out[1]);
    fd_ = out[0];
  }
  ~Child() {
    Kill();
    close(fd_);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  /// SIGTERM, then up to `seconds` for the process to exit on its own (cleaning up as it does on a
  /// user's Ctrl-C), then Kill.
  void Stop(double seconds = 10) {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < until) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    Kill();
  }
  /// Reads the output until `pattern` matches after offset `from` (its first group into *group,
  /// every group into *groups) or `seconds` pass.
  bool ReadUntil(const std::regex& pattern, std::string* group = nullptr, size_t from = 0, int seconds = 30,
                 std::vector<std::string>* groups = nullptr) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    std::smatch m;
    for (;;) {
      const std::string tail = log.substr(std::min(from, log.size()));
      if (std::regex_search(tail, m, pattern)) {
        if (group != nullptr) *group = m[1];
        if (groups != nullptr) groups->assign(m.begin(), m.end());
        return true;
      }
      if (std::chrono::steady_clock::now() > until) return false;
      fd_set set;
      FD_ZERO(&set);
      FD_SET(fd_, &set);
      timeval tv{.tv_sec = 0, .tv_usec = 100 * 1000};
      if (select(fd_ + 1, &set, nullptr, nullptr, &tv) <= 0) continue;
      char buf[4096];
      const ssize_t n = read(fd_, buf, sizeof(buf));
      if (n <= 0) return false;
      log.append(buf, static_cast<size_t>(n));
    }
  }
  std::string log;

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
};

/// `kvq serve --port 0 -t 1 --web '' ARGS...`, its port read from its log.
class Replica : public Child {
 public:
  explicit Replica(std::vector<std::string> args) : Child(Argv(std::move(args))) {
    std::string p;
    if (ReadUntil(std::regex("listening on http://127\\.0\\.0\\.1:(\\d+)"), &p)) port = std::stoi(p);
  }
  // Stopped as a user stops a server (SIGTERM: it drains and exits), so it removes what it made
  // (temporary files, ZeroMQ socket files); killed only if it does not exit in time.
  ~Replica() { Stop(); }
  int port = 0;

 private:
  static std::vector<std::string> Argv(std::vector<std::string> args) {
    args.insert(args.begin(), {KVQ_BINARY, "serve", "--port", "0", "-t", "1", "--web", ""});
    return args;
  }
};

/// redis-server on a free port, nothing saved to disk, bounded memory with LRU eviction.
class RedisServer {
 public:
  // Another process may take a free port before redis-server binds it (CTest runs tests side by
  // side, and replicas listen on port 0): a few ports are tried.
  RedisServer() {
    for (int attempt = 0; attempt < 4; ++attempt) {
      port = FreePort();
      if (Start(/*report=*/attempt == 3)) return;
    }
  }
  /// Starts it on `port` (again, after Kill); false when it did not say it was ready.
  bool Start(bool report = true) {
    dir_ = std::filesystem::path(::testing::TempDir()) / ("kvq_redis_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    child_ = std::make_unique<Child>(std::vector<std::string>{
        "/usr/bin/redis-server", "--port", std::to_string(port), "--bind", "127.0.0.1", "--save", "",
        "--appendonly", "no", "--dir", dir_.string(), "--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru"});
    const bool ready = child_->ReadUntil(std::regex("Ready to accept connections"), nullptr, 0, 10);
    if (report) {
      EXPECT_TRUE(ready) << child_->log;
    }
    if (!ready) child_.reset();
    return ready;
  }
  void Kill() { child_.reset(); }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port); }
  /// A connection for the test's own commands (null on failure, with a test failure added).
  redisContext* Connect() const {
    redisContext* c = redisConnect("127.0.0.1", port);
    EXPECT_TRUE(c != nullptr && c->err == 0);
    return c;
  }
  ~RedisServer() {
    child_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  int port = 0;

 private:
  std::filesystem::path dir_;
  std::unique_ptr<Child> child_;
};

}  // namespace kvq::test
