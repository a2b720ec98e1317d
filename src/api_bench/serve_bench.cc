// kvq bench serve (see serve_bench.h).
#include "api_bench/serve_bench.h"

#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <regex>
#include <thread>
#include <unordered_set>

#include "server/http_server.h"
#include "api_bench/load_client.h"
#include "server/kv_blocks.h"

namespace kvq::server {
namespace {

using Clock = std::chrono::steady_clock;

// A server on a free loopback port, serving on its own thread until destroyed.
class RunningServer {
 public:
  static Result<std::unique_ptr<RunningServer>> Start(const Model& model, const EngineOptions& options) {
    std::unique_ptr<RunningServer> s(new RunningServer);
    Result<std::unique_ptr<Engine>> engine = Engine::Create(model, options, &s->metrics_);
    if (!engine.ok()) return engine.status();
    s->engine_ = std::move(engine).value();
    ServerOptions http{.port = 0, .model_id = "bench",
                       .http_threads = options.parallel + options.max_queue + 8};
    s->http_ = std::make_unique<HttpServer>(model, *s->engine_, s->metrics_, http);
    Result<int> port = s->http_->Bind();
    if (!port.ok()) return port.status();
    s->port_ = *port;
    s->thread_ = std::thread([raw = s.get()] { raw->http_->Serve(); });
    return s;
  }
  ~RunningServer() {
    http_->Stop();
    if (thread_.joinable()) thread_.join();
  }
  int port() const { return port_; }

 private:
  RunningServer() = default;
  Metrics metrics_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<HttpServer> http_;
  std::thread thread_;
  int port_ = 0;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Percentiles NearestRank(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  auto rank = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(std::ceil(q * v.size())) - 1)]; };
  p.p50 = rank(0.50);
  p.p99 = rank(0.99);
  p.max = v.back();
  return p;
}

// Distinct story openings for the load phase.
std::vector<std::string> LoadPrompts() {
  std::vector<std::string> prompts;
  for (const char* who : {"a little dog", "a big cat", "a small bird", "a happy girl"}) {
    for (const char* name : {"Max", "Lily", "Tom", "Sue", "Ben", "Mia", "Sam", "Zoe"}) {
      prompts.push_back(fmt::format("Once upon a time, there was {} named {}.", who, name));
    }
  }
  return prompts;
}

// Text of at least `tokens` tokens (for the model's tokenizer), cut at a word.
std::string TextOfTokens(const Model& model, int32_t tokens) {
  const std::string sentence = "The little girl went to the park with her mom and saw a big red ball. ";
  std::string text = "Once upon a time. ";
  while (static_cast<int32_t>(model.Tokenize(text).size()) < tokens) text += sentence;
  return text;
}

StreamRequest Request(int port, std::string prompt, int32_t max_tokens, bool ignore_eos) {
  return {.port = port, .prompt = std::move(prompt), .max_tokens = max_tokens, .ignore_eos = ignore_eos};
}

// Runs `n` requests at once (one thread each) and returns their results and the wall time.
std::pair<std::vector<StreamResult>, double> Concurrent(const std::vector<StreamRequest>& requests) {
  std::vector<StreamResult> results(requests.size());
  std::vector<std::thread> threads;
  const Clock::time_point start = Clock::now();
  for (size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = StreamCompletion(requests[i]); });
  }
  for (std::thread& t : threads) t.join();
  return {results, std::chrono::duration<double>(Clock::now() - start).count()};
}

Status LoadPhase(const Model& model, const ServeBenchConfig& c, ServeBenchResult& r) {
  EngineOptions options = c.engine;
  options.parallel = std::max(options.parallel, 1);
  Result<std::unique_ptr<RunningServer>> server = RunningServer::Start(model, options);
  if (!server.ok()) return server.status();
  const int port = (*server)->port();
  const std::vector<std::string> prompts = LoadPrompts();
  // The reference: every prompt alone on the idle server, one after another.
  std::map<std::string, std::string> alone;
  for (const std::string& p : prompts) {
    StreamResult one = StreamCompletion(Request(port, p, c.max_tokens, false));
    if (!one.error.empty()) return Status::Error(fmt::format("load: a request alone failed: {}", one.error));
    alone[p] = one.text;
  }
  if (c.progress) c.progress(fmt::format("load: {} prompts run alone", prompts.size()));
  std::vector<std::vector<std::pair<std::string, StreamResult>>> per_client(c.clients);  // (prompt, result)
  std::vector<std::thread> clients;
  const Clock::time_point start = Clock::now();
  for (int32_t i = 0; i < c.clients; ++i) {
    clients.emplace_back([&, i] {
      for (int32_t j = 0; j < c.requests_per_client; ++j) {
        const std::string& p = prompts[(i * c.requests_per_client + j) % prompts.size()];
        per_client[i].emplace_back(p, StreamCompletion(Request(port, p, c.max_tokens, false)));
      }
    });
  }
  for (std::thread& t : clients) t.join();
  r.load_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::vector<double> ttft;
  for (const auto& results : per_client) {
    for (const auto& [prompt, s] : results) {
      ++r.requests;
      if (s.status != 200 || !s.error.empty()) {
        ++r.failed;
        continue;
      }
      if (s.text != alone[prompt]) ++r.mismatched;
      ttft.push_back(s.ttft_seconds);
      r.load_tokens += s.completion_tokens;
    }
  }
  r.ttft_seconds = NearestRank(ttft);
  r.load_tokens_per_second = static_cast<double>(r.load_tokens) / r.load_seconds;
  if (c.progress) {
    c.progress(fmt::format("load: {} requests, {} failed, {} differ from alone", r.requests, r.failed, r.mismatched));
  }
  return Status::Ok();
}

Status BatchPhase(const Model& model, const ServeBenchConfig& c, ServeBenchResult& r) {
  EngineOptions options = c.engine;
  options.parallel = std::max(options.parallel, c.batch_sessions);
  Result<std::unique_ptr<RunningServer>> server = RunningServer::Start(model, options);
  if (!server.ok()) return server.status();
  const int port = (*server)->port();
  auto arm = [&](int32_t sessions) -> Result<double> {
    std::vector<StreamRequest> requests;
    for (int32_t i = 0; i < sessions; ++i) {
      requests.push_back(Request(port, fmt::format("Once upon a time, {} friends", i + 1), c.batch_tokens, true));
    }
    auto [results, seconds] = Concurrent(requests);
    int64_t tokens = 0;
    for (const StreamResult& s : results) {
      if (!s.error.empty()) return Status::Error("batch: a request failed: " + s.error);
      tokens += s.completion_tokens;
    }
    return static_cast<double>(tokens) / seconds;
  };
  // One untimed run of each arm first (sessions' pages and attention states allocated).
  if (Result<double> warm = arm(1); !warm.ok()) return warm.status();
  if (Result<double> warm = arm(c.batch_sessions); !warm.ok()) return warm.status();
  for (int32_t round = 0; round < c.batch_rounds; ++round) {
    Result<double> one = arm(1);  // interleaved: 1, N, 1, N, ...
    if (!one.ok()) return one.status();
    Result<double> many = arm(c.batch_sessions);
    if (!many.ok()) return many.status();
    r.one_session_tps.push_back(*one);
    r.n_sessions_tps.push_back(*many);
    if (c.progress) c.progress(fmt::format("batch: round {}: 1 session {:.0f} tok/s, {} sessions {:.0f} tok/s",
                                           round + 1, *one, c.batch_sessions, *many));
  }
  r.batch_ratio = Median(r.n_sessions_tps) / Median(r.one_session_tps);
  return Status::Ok();
}

Status PrefixPhase(const Model& model, const ServeBenchConfig& c, ServeBenchResult& r) {
  const int64_t room = model.info().context - 2 * c.max_tokens - 16;
  const int32_t prefix_tokens = static_cast<int32_t>(std::min<int64_t>(c.prefix_tokens, room));
  if (prefix_tokens < 64) return Status::Error(fmt::format("prefix: the context ({}) is too short", model.info().context));
  const std::string prefix = TextOfTokens(model, prefix_tokens);
  r.prefix_tokens = static_cast<int32_t>(model.Tokenize(prefix).size());
  const std::string first = prefix + "Then the dog ran home.";
  EngineOptions options = c.engine;
  options.parallel = 1;
  auto ask = [&](RunningServer& s, const std::string& prompt) -> Result<StreamResult> {
    StreamResult got = StreamCompletion(Request(s.port(), prompt, c.max_tokens, false));
    if (!got.error.empty()) return Status::Error("prefix: a request failed: " + got.error);
    return got;
  };
  auto start = [&](const EngineOptions& o) { return RunningServer::Start(model, o); };
  // The restart arm's folder: one server saves the first prompt's prefix, then goes away.
  std::error_code ec;
  std::filesystem::remove_all(c.prefix_dir, ec);
  EngineOptions saving = options;
  saving.prefix_cache_dir = c.prefix_dir;
  {
    Result<std::unique_ptr<RunningServer>> saver = start(saving);
    if (!saver.ok()) return saver.status();
    if (Result<StreamResult> saved = ask(**saver, first); !saved.ok()) return saved.status();
  }
  // Repetitions with different endings of the shared prefix; each arm on a server of its own state:
  // cold (fresh, nothing cached), warm (its idle session holds the first prompt), restart (fresh,
  // on the saved folder).
  std::vector<double> cold, warm, restart, ready;
  r.prefix_outputs_equal = true;
  for (const char* ending : {"The cat sat on the mat.", "A bird sang a song.", "The sun came out."}) {
    const std::string prompt = prefix + ending;
    Result<std::unique_ptr<RunningServer>> a = start(options), b = start(options);
    const Clock::time_point t0 = Clock::now();
    Result<std::unique_ptr<RunningServer>> d = start(saving);
    ready.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (!a.ok()) return a.status();
    if (!b.ok()) return b.status();
    if (!d.ok()) return d.status();
    if (Result<StreamResult> hold = ask(**b, first); !hold.ok()) return hold.status();
    Result<StreamResult> x = ask(**a, prompt), y = ask(**b, prompt), z = ask(**d, prompt);
    for (const Result<StreamResult>* res : {&x, &y, &z}) {
      if (!res->ok()) return res->status();
    }
    cold.push_back(x->ttft_seconds);
    warm.push_back(y->ttft_seconds);
    restart.push_back(z->ttft_seconds);
    r.cached_warm = y->cached_tokens;
    r.cached_restart = z->cached_tokens;
    r.prefix_outputs_equal = r.prefix_outputs_equal && x->text == y->text && x->text == z->text;
    if (c.progress) {
      c.progress(fmt::format("prefix: time to first token cold {:.1f} ms, warm {:.1f} ms, after a restart {:.1f} ms",
                             x->ttft_seconds * 1e3, y->ttft_seconds * 1e3, z->ttft_seconds * 1e3));
    }
  }
  r.ttft_cold = Median(cold);
  r.ttft_warm = Median(warm);
  r.ttft_restart = Median(restart);
  r.restart_start_seconds = Median(ready);
  return Status::Ok();
}

// A counter's value on a server's /metrics (`name` is a regex-safe metric name); -1: not found.
int64_t MetricValue(int port, const std::string& name) {
  httplib::Result got = httplib::Client("127.0.0.1", port).Get("/metrics");
  std::smatch m;
  const std::regex line("\n" + name + " ([0-9.e+]+)\n");
  if (!got || got->status != 200 || !std::regex_search(got->body, m, line)) return -1;
  return static_cast<int64_t>(std::stod(m[1]));
}

// Picks the replica for each request of one arm; thread-safe.
class ReplicaRouter {
 public:
  ReplicaRouter(bool affinity, KvBlockOptions blocks) : affinity_(affinity), blocks_(blocks) {}
  // Affinity: the replica holding the most leading blocks of `tokens` (ties: fewer requests in
  // flight, then the lower index), which is then taken to hold all of them. It counts what it
  // routed, not what the replica kept (an approximation: sessions evict, the index never does).
  int Pick(std::span<const int32_t> tokens) {
    std::lock_guard<std::mutex> lock(mu_);
    int best = static_cast<int>(next_++ % kReplicas);
    if (affinity_) {
      const std::vector<uint64_t> hashes = KvBlockHashes(tokens, blocks_);
      size_t best_blocks = 0;
      best = -1;
      for (int r = 0; r < kReplicas; ++r) {
        size_t n = 0;
        while (n < hashes.size() && held_[r].count(hashes[n])) ++n;
        if (best < 0 || n > best_blocks || (n == best_blocks && in_flight_[r] < in_flight_[best])) {
          best = r;
          best_blocks = n;
        }
      }
      held_[best].insert(hashes.begin(), hashes.end());
    }
    ++in_flight_[best];
    ++sent_[best];
    return best;
  }
  void Done(int replica) {
    std::lock_guard<std::mutex> lock(mu_);
    --in_flight_[replica];
  }
  std::vector<int32_t> Sent() const { return {sent_, sent_ + kReplicas}; }
  static constexpr int kReplicas = 2;

 private:
  const bool affinity_;
  const KvBlockOptions blocks_;
  std::mutex mu_;
  uint64_t next_ = 0;
  std::unordered_set<uint64_t> held_[kReplicas];  // block hashes routed to each replica
  int32_t in_flight_[kReplicas] = {};
  int32_t sent_[kReplicas] = {};
};

// The system prompts: distinct from their first token (no blocks shared between them).
std::vector<std::string> SystemPrompts(const Model& model, int32_t count, int32_t tokens) {
  static const char* const kNames[] = {"Lily", "Tom", "Sue", "Ben", "Mia", "Sam", "Zoe", "Max"};
  std::vector<std::string> out;
  for (int32_t k = 0; k < count; ++k) {
    const char* name = kNames[k % 8];
    std::string text = fmt::format("{} lived in house number {}. ", name, k + 1);
    while (static_cast<int32_t>(model.Tokenize(text).size()) < tokens) {
      text += fmt::format("{} went to the park with a friend and played with a big red ball. ", name);
    }
    out.push_back(std::move(text));
  }
  return out;
}

Status ReplicasPhase(const Model& model, const ServeBenchConfig& c, ServeBenchResult& r) {
  // Room for the system prompt, every turn's question and reply.
  const int64_t room = model.info().context - c.turns * (c.max_tokens + 24) - 16;
  const int32_t system_tokens = static_cast<int32_t>(std::min<int64_t>(c.system_tokens, room));
  if (system_tokens < 32) {
    return Status::Error(fmt::format("replicas: the context ({}) is too short for {} turns of {} tokens",
                                     model.info().context, c.turns, c.max_tokens));
  }
  const std::vector<std::string> systems = SystemPrompts(model, c.system_prompts, system_tokens);
  r.system_tokens = static_cast<int32_t>(model.Tokenize(systems[0]).size());
  EngineOptions options = c.engine;
  options.parallel = c.conversations;  // no request waits for a session: the arms differ in routing only
  options.max_queue = std::max(options.max_queue, c.conversations);
  std::vector<std::vector<std::string>> texts_by_arm;  // [arm][conversation * turns + turn]
  for (const bool affinity : {false, true}) {
    ServeBenchResult::ReplicaArm arm{.client = affinity ? "prefix-affinity" : "round-robin"};
    std::vector<std::unique_ptr<RunningServer>> replicas;  // fresh: nothing cached from the other arm
    for (int i = 0; i < ReplicaRouter::kReplicas; ++i) {
      Result<std::unique_ptr<RunningServer>> s = RunningServer::Start(model, options);
      if (!s.ok()) return s.status();
      replicas.push_back(std::move(s).value());
    }
    ReplicaRouter router(affinity, options.kv_blocks);
    std::vector<std::vector<StreamResult>> results(c.conversations);  // [conversation][turn]
    std::vector<std::thread> clients;
    const Clock::time_point start = Clock::now();
    for (int32_t j = 0; j < c.conversations; ++j) {
      clients.emplace_back([&, j] {
        std::string prompt = systems[j % systems.size()];
        for (int32_t t = 0; t < c.turns; ++t) {
          prompt += fmt::format("Then friend {} asked question {}. ", j + 1, t + 1);
          const int replica = router.Pick(model.Tokenize(prompt));
          results[j].push_back(StreamCompletion(Request(replicas[replica]->port(), prompt, c.max_tokens, false)));
          router.Done(replica);
          prompt += results[j].back().text + " ";
        }
      });
    }
    for (std::thread& t : clients) t.join();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    std::vector<double> ttft;
    int64_t generated = 0;
    std::vector<std::string> texts;
    for (const std::vector<StreamResult>& conversation : results) {
      for (const StreamResult& s : conversation) {
        ++arm.requests;
        texts.push_back(s.text);
        if (s.status != 200 || !s.error.empty()) {
          ++arm.failed;
          continue;
        }
        ttft.push_back(s.ttft_seconds);
        generated += s.completion_tokens;
      }
    }
    arm.ttft_seconds = NearestRank(ttft);
    arm.tokens_per_second = static_cast<double>(generated) / seconds;
    for (const std::unique_ptr<RunningServer>& s : replicas) {
      const int64_t queries = MetricValue(s->port(), "vllm:prefix_cache_queries_total");
      const int64_t hits = MetricValue(s->port(), "vllm:prefix_cache_hits_total");
      if (queries < 0 || hits < 0) return Status::Error("replicas: /metrics lacks vllm:prefix_cache_*_total");
      arm.prompt_tokens += queries;
      arm.prefix_hit_tokens += hits;
    }
    arm.per_replica = router.Sent();
    if (c.progress) {
      c.progress(fmt::format("replicas: {}: {} requests ({} / {}), {} failed, {} of {} prompt tokens from a cached "
                             "prefix", arm.client, arm.requests, arm.per_replica[0], arm.per_replica[1], arm.failed,
                             arm.prefix_hit_tokens, arm.prompt_tokens));
    }
    r.replica_arms.push_back(std::move(arm));
    texts_by_arm.push_back(std::move(texts));
  }
  r.replica_outputs_equal = texts_by_arm[0] == texts_by_arm[1];
  return Status::Ok();
}

}  // namespace

Result<ServeBenchResult> RunServeBench(const Model& model, const ServeBenchConfig& config) {
  ServeBenchResult r;
  for (const std::string& phase : config.phases) {
    Status s = phase == "load"     ? LoadPhase(model, config, r)
               : phase == "batch"  ? BatchPhase(model, config, r)
               : phase == "prefix" ? PrefixPhase(model, config, r)
               : phase == "replicas"
                   ? ReplicasPhase(model, config, r)
                   : Status::Error("unknown phase '" + phase + "' (load, batch, prefix, replicas)");
    if (!s.ok()) return s;
  }
  return r;
}

}  // namespace kvq::server
