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
};

/// Runs the phases on `model`. Errors: the server cannot start, a phase's request fails outright.
Result<ServeBenchResult> RunServeBench(const Model& model, const ServeBenchConfig& config);

}  // namespace kvq::server
