// kvq bench serve: kvq serve measured from outside, over loopback HTTP, in one process (the server
// on its own threads, clients on theirs). Three measurements:
//   load     C concurrent streaming clients × R requests each (greedy): failures, whether every
//            output equals the same request run alone on an idle server, time to first token
//            (p50, p99) and total generated tokens per second.
//   batch    total decode tokens/s with 1 session and with N sessions generating at once
//            (ignore_eos, so every request runs max_tokens), arms interleaved over rounds.
//   prefix   time to first token of a request whose prompt extends a P-token prefix: cold (nothing
//            cached), warm (an idle session holds the prefix) and after a restart (a new server
//            on the same --prefix-cache folder).
//   replicas two servers, each with its own sessions, and conversations sharing long system prompts
//            sent by two clients in turn on fresh replicas: round-robin, and prefix affinity (each
//            request to the replica whose blocks, by the chained block hashes of server/kv_blocks.h,
//            cover the longest prefix of its prompt, as llm-d's approximate prefix scorer does from
//            what it routed): time to first token (p50, p99), tokens/s, and the prefix cache hits
//            the replicas report on /metrics.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvq/model.h"
#include "kvq/status.h"
#include "server/engine.h"

namespace kvq::server {

struct ServeBenchConfig {
  EngineOptions engine;           ///< the server under test (parallel = max(clients, batch sessions))
  int32_t clients = 16;
  int32_t requests_per_client = 8;
  int32_t max_tokens = 64;
  int32_t batch_sessions = 8;
  int32_t batch_rounds = 5;
  int32_t batch_tokens = 64;
  int32_t prefix_tokens = 1000;   ///< clamped to what the context allows
  std::string prefix_dir;         ///< a scratch folder for the restart measurement
  int32_t conversations = 8;      ///< replicas: conversations at once, one client thread each
  int32_t system_prompts = 2;     ///< replicas: distinct system prompts the conversations share
  int32_t system_tokens = 1000;   ///< replicas: tokens of each system prompt (clamped to the context)
  int32_t turns = 3;              ///< replicas: requests per conversation, each extending the last
  std::vector<std::string> phases{"load", "batch", "prefix"};
  std::function<void(const std::string&)> progress;  ///< one line per step, or empty
};

struct Percentiles {
  double p50 = 0, p99 = 0, max = 0;
};

struct ServeBenchResult {
  // load
  int32_t requests = 0, failed = 0, mismatched = 0;
  Percentiles ttft_seconds;
  double load_seconds = 0;
  int64_t load_tokens = 0;
  double load_tokens_per_second = 0;
  // batch: per round, tokens/s with 1 session and with N
  std::vector<double> one_session_tps, n_sessions_tps;
  double batch_ratio = 0;  ///< median(N) / median(1)
  // prefix
  int32_t prefix_tokens = 0;
  double ttft_cold = 0, ttft_warm = 0, ttft_restart = 0;
  double restart_start_seconds = 0;  ///< starting the restarted server (it loads snapshots first)
  int64_t cached_warm = 0, cached_restart = 0;  ///< prompt tokens the server reported reusing
  bool prefix_outputs_equal = false;            ///< cold, warm and restart gave the same text
  // replicas: one arm per client, round-robin first
  struct ReplicaArm {
    std::string client;             ///< "round-robin", "prefix-affinity"
    int32_t requests = 0, failed = 0;
    Percentiles ttft_seconds;
    double tokens_per_second = 0;   ///< generated tokens over the arm's wall time
    int64_t prompt_tokens = 0;      ///< vllm:prefix_cache_queries_total, both replicas
    int64_t prefix_hit_tokens = 0;  ///< vllm:prefix_cache_hits_total, both replicas
    std::vector<int32_t> per_replica;  ///< requests each replica was sent
  };
  std::vector<ReplicaArm> replica_arms;
  int32_t system_tokens = 0;             ///< tokens of a system prompt as run
  bool replica_outputs_equal = false;    ///< every turn's text the same under both clients
};

/// Runs the phases on `model`. Errors: the server cannot start, a phase's request fails outright.
Result<ServeBenchResult> RunServeBench(const Model& model, const ServeBenchConfig& config);

}  // namespace kvq::server
