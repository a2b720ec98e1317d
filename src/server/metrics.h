// kvq serve's counters and gauges, written by the HTTP threads and the scheduler, read by
// GET /metrics as Prometheus text (exposition format 0.0.4).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace kvq::server {

class Metrics {
 public:
  /// A finished HTTP request: its route ("/v1/completions", "other"...) and status code.
  void CountRequest(const std::string& route, int status);

  std::atomic<int64_t> prompt_tokens{0};        ///< prompt tokens of admitted requests
  std::atomic<int64_t> prompt_tokens_reused{0};  ///< of which a cached prefix skipped
  std::atomic<int64_t> generated_tokens{0};
  std::atomic<int64_t> prefix_hits_live{0};      ///< requests that reused an idle session's prefix
  std::atomic<int64_t> prefix_hits_disk{0};      ///< requests that loaded a prefix snapshot
  std::atomic<int64_t> prefix_misses{0};
  std::atomic<int64_t> prefix_snapshots_saved{0};
  std::atomic<int64_t> prefix_snapshots_refused{0};  ///< damaged snapshots deleted
  /// The shared prefix store (--prefix-store): requests that restored a prefix from it, whether
  /// it is reachable now (1/0), failed commands and outages, and per medium ("disk": the
  /// --prefix-cache folder, "remote": the shared store) lookups that found nothing and bytes moved.
  std::atomic<int64_t> prefix_hits_remote{0};
  std::atomic<int64_t> prefix_misses_disk{0};
  std::atomic<int64_t> prefix_misses_remote{0};
  std::atomic<int64_t> prefix_snapshots_saved_remote{0};
  std::atomic<int64_t> prefix_store_up{0};
  std::atomic<int64_t> prefix_store_errors{0};
  std::atomic<int64_t> prefix_store_bytes_read_disk{0};
  std::atomic<int64_t> prefix_store_bytes_written_disk{0};
  std::atomic<int64_t> prefix_store_bytes_read_remote{0};
  std::atomic<int64_t> prefix_store_bytes_written_remote{0};
  std::atomic<int64_t> kv_events_published{0};  ///< KV event batches sent (--kv-events)
  std::atomic<int64_t> kv_events_subscriptions{0};  ///< subscribe messages received (--kv-events)
  std::atomic<int64_t> active_sessions{0};
  std::atomic<int64_t> queued_requests{0};
  std::atomic<int64_t> steps{0};                 ///< batched forward passes
  std::atomic<int64_t> spec_drafts{0};           ///< decode steps of a session that ran a draft
  std::atomic<int64_t> spec_draft_tokens{0};     ///< drafted tokens run
  std::atomic<int64_t> spec_accepted_tokens{0};  ///< of those, kept
  std::atomic<int64_t> spec_gated_steps{0};      ///< steps where the gate shortened or dropped a draft
  std::atomic<int64_t> spec_gates_resumed{0};    ///< requests whose gate began with their slot's last one
  std::atomic<int64_t> spec_index_drafts{0};     ///< steps whose draft came from the server-wide suffix index
  std::atomic<int64_t> spec_index_tokens{0};     ///< tokens that index holds now
  /// Forward passes of the draft model (spec "draft"): one per round of drafted tokens for every
  /// slot drafting then, and one catching their sessions up.
  std::atomic<int64_t> spec_draft_model_passes{0};
  std::atomic<int64_t> kv_bytes_host{0};         ///< every session's KV contents, master in RAM
  std::atomic<int64_t> kv_bytes_disk{0};         ///< the same with a disk master (--kv-disk)
  std::atomic<int64_t> kv_bytes_device{0};       ///< device working sets allocated
  /// KV bytes held or promised: running requests' reservations (prompt + max_tokens positions)
  /// plus idle sessions' caches — what --kv-budget bounds — now and at most so far.
  std::atomic<int64_t> kv_bytes_reserved{0};
  std::atomic<int64_t> kv_bytes_reserved_peak{0};
  /// Draft-model sessions (requests with spec "draft"): the KV bytes they hold now (counted in
  /// the tiers above too) and the part of kv_bytes_reserved that is theirs.
  std::atomic<int64_t> kv_bytes_draft{0};
  std::atomic<int64_t> kv_bytes_reserved_draft{0};
  /// What kv_bytes_reserved is a fraction of: --kv-budget, or every session at full context.
  std::atomic<int64_t> kv_bytes_capacity{0};
  std::atomic<int64_t> kv_bytes_folder{0};           ///< snapshot bytes in the --prefix-cache folder
  std::atomic<int64_t> kv_bytes_folder_capacity{0};  ///< --prefix-cache-size; 0: no folder
  /// Decode tokens per second over the last few seconds (the scheduler updates it each step).
  std::atomic<double> decode_tokens_per_second{0};
  std::atomic<double> step_seconds_total{0};

  /// The Prometheus text of everything above; a few also under the names vLLM gives them
  /// (vllm:num_requests_running, ...), which load balancers and autoscalers for LLM servers read.
  std::string Render() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> requests_;  // (route, status) → count
};

}  // namespace kvq::server
