// `kvq bench batch`: total decode tok/s when N sessions step together through Session::RunBatch
// (issue 17's engine: each weight matrix read once per step for all of them), per session count.
// Every session is filled to the same context (one prefill, copied into the others through a
// prefix snapshot), then the counts run as interleaved arms — round after round, each arm a run of
// timed decode steps, the order rotated every round — so a shared machine's load spreads over all
// of them. Medians and the spread over rounds are reported, with each count's speed over the
// 1-session arm's. With `concurrent`, an arm's sessions instead decode at once, each on its own OS
// thread and pool (aggregate tok/s of N independent sessions against one alone). The correctness signal: every session of every arm has run the same tokens, so
// their logits after the run must be bit-identical to the 1-session arm's (a session run alone).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvq/model.h"
#include "kvq/status.h"

namespace kvq {

struct BatchBenchConfig {
  std::vector<int32_t> sessions = {1, 2, 4,
                                   8};  ///< the arms: sessions stepping together (distinct, ≥ 1)
  std::vector<int64_t> contexts = {256};  ///< positions each session holds before the timed steps
  int32_t steps = 16;                     ///< timed decode steps per arm and round
  int32_t rounds = 5;  ///< each round runs every arm once (after one untimed warm-up step per arm)
  KvOptions kv;        ///< every session's cache
  /// How an arm's sessions step. false: together, one Session::RunBatch per step (each weight
  /// matrix read once for all of them), on the model's threads. true: concurrently, each session
  /// on its own OS thread decoding on its own, with `session_threads` threads of its own pool
  /// (Session::SetThreads) — what separate users of one model see; an arm's tok/s is then the
  /// sessions' aggregate.
  bool concurrent = false;
  int32_t session_threads = 1;  ///< concurrent arms: each session's thread count, 1..1024
};

struct BatchBenchRow {
  int64_t context = 0;
  int32_t sessions = 0;
  double tokens_per_second = 0;     ///< median over rounds of sessions · steps / the arm's seconds
  double tps_min = 0, tps_max = 0;  ///< the slowest and fastest round
  double ms_per_step = 0;      ///< median over rounds: one RunBatch of `sessions` decode tokens (concurrent: wall
                               ///< time per step of the sessions stepping at once)
  double per_session_tps = 0;  ///< tokens_per_second / sessions: what each session sees
  double vs_first = 1;         ///< tokens_per_second / that of the first arm (1 session by default)
  /// Every session's logits after the run equal those of the first arm's session, bit for bit.
  bool bit_identical = false;
};

/// Positions each session needs: the context, the warm-up step and every timed step.
int64_t BatchBenchPositions(const BatchBenchConfig& config, int64_t context);

/// Runs the benchmark on `model` (its threads, or session_threads per session when concurrent).
/// Errors: an empty or non-positive arm list, session_threads outside 1..1024, a context past the
/// model's, a session or snapshot that cannot be made. `progress` (may be empty)
/// gets a line per stage.
Result<std::vector<BatchBenchRow>> RunBatchBench(
    const Model& model, const BatchBenchConfig& config,
    const std::function<void(const std::string&)>& progress);

}  // namespace kvq
