// Prometheus text for kvq serve (see metrics.h).
#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace kvq::server {
namespace {

void Metric(std::string& out, const char* name, const char* type, const char* help, double value) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
}

}  // namespace

void Metrics::CountRequest(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{route, status}];
}

std::string Metrics::Render() const {
  std::string out;
  out += "# HELP kvq_requests_total HTTP requests by route and status code.\n# TYPE kvq_requests_total counter\n";
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, count] : requests_) {
      out += fmt::format("kvq_requests_total{{route=\"{}\",code=\"{}\"}} {}\n", key.first, key.second, count);
    }
  }
  Metric(out, "kvq_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", prompt_tokens.load());
  Metric(out, "kvq_prompt_tokens_reused_total", "counter", "Prompt tokens whose prefill a cached prefix skipped.",
         prompt_tokens_reused.load());
  Metric(out, "kvq_generated_tokens_total", "counter", "Tokens generated.", generated_tokens.load());
  Metric(out, "kvq_decode_tokens_per_second", "gauge", "Tokens generated per second over the last few seconds.",
         decode_tokens_per_second.load());
  Metric(out, "kvq_steps_total", "counter", "Batched forward passes.", steps.load());
  Metric(out, "kvq_step_seconds_total", "counter", "Seconds spent in batched forward passes.",
         step_seconds_total.load());
  out += "# HELP kvq_prefix_hits_total Requests whose prompt reused a cached prefix, by where it was.\n"
         "# TYPE kvq_prefix_hits_total counter\n";
  out += fmt::format("kvq_prefix_hits_total{{source=\"live\"}} {}\n", prefix_hits_live.load());
  out += fmt::format("kvq_prefix_hits_total{{source=\"disk\"}} {}\n", prefix_hits_disk.load());
  // With its family: the exposition format wants a metric's lines in one group.
  out += fmt::format("kvq_prefix_hits_total{{source=\"remote\"}} {}\n", prefix_hits_remote.load());
  Metric(out, "kvq_prefix_misses_total", "counter", "Requests with no cached prefix.", prefix_misses.load());
  Metric(out, "kvq_prefix_snapshots_saved_total", "counter", "Prompt prefixes saved to the prefix cache.",
         prefix_snapshots_saved.load());
  Metric(out, "kvq_prefix_snapshots_refused_total", "counter",
         "Prefix snapshots refused as damaged or mismatched (and deleted).", prefix_snapshots_refused.load());
  Metric(out, "kvq_active_sessions", "gauge", "Sessions generating now.", active_sessions.load());
  Metric(out, "kvq_queued_requests", "gauge", "Requests waiting for a session.", queued_requests.load());
  Metric(out, "kvq_kv_bytes_reserved", "gauge",
         "KV bytes running requests may reach plus idle sessions' caches (what --kv-budget bounds).",
         kv_bytes_reserved.load());
  Metric(out, "kvq_kv_bytes_reserved_peak", "gauge", "The most kvq_kv_bytes_reserved has been.",
         kv_bytes_reserved_peak.load());
  Metric(out, "kvq_kv_bytes_reserved_draft", "gauge",
         "The part of kvq_kv_bytes_reserved that draft-model sessions (spec \"draft\") hold or may reach.",
         kv_bytes_reserved_draft.load());
  Metric(out, "kvq_kv_bytes_draft", "gauge", "KV bytes draft-model sessions hold now (in kvq_kv_bytes too).",
         kv_bytes_draft.load());
  out += "# HELP kvq_kv_bytes KV cache bytes held, by tier.\n# TYPE kvq_kv_bytes gauge\n";
  out += fmt::format("kvq_kv_bytes{{tier=\"device\"}} {}\n", kv_bytes_device.load());
  out += fmt::format("kvq_kv_bytes{{tier=\"host\"}} {}\n", kv_bytes_host.load());
  out += fmt::format("kvq_kv_bytes{{tier=\"disk\"}} {}\n", kv_bytes_disk.load());
  out += fmt::format("kvq_kv_bytes{{tier=\"folder\"}} {}\n", kv_bytes_folder.load());
  // Each tier's use of what it may hold, where that is bounded: the device working set (reserved
  // KV bytes over --kv-budget or every session at full context, vllm:kv_cache_usage_perc's
  // definition) and the --prefix-cache folder (over --prefix-cache-size). Host RAM and a disk
  // master hold what the sessions spill, bounded by the sessions' contexts rather than a budget of
  // their own; the shared store is bounded by Redis's maxmemory, which kvq does not read.
  const int64_t device_capacity = kv_bytes_capacity.load(), folder_capacity = kv_bytes_folder_capacity.load();
  out += "# HELP kvq_kv_usage_perc KV bytes held over what the tier may hold, in [0, 1], by tier.\n"
         "# TYPE kvq_kv_usage_perc gauge\n";
  auto share = [](int64_t held, int64_t capacity) {
    return capacity > 0 ? std::min(1.0, static_cast<double>(held) / static_cast<double>(capacity)) : 0.0;
  };
  out += fmt::format("kvq_kv_usage_perc{{tier=\"device\"}} {}\n", share(kv_bytes_reserved.load(), device_capacity));
  out += fmt::format("kvq_kv_usage_perc{{tier=\"folder\"}} {}\n", share(kv_bytes_folder.load(), folder_capacity));
  out += "# HELP kvq_prefix_store_lookups_total Prefix lookups in a store, by medium and result.\n"
         "# TYPE kvq_prefix_store_lookups_total counter\n";
  out += fmt::format("kvq_prefix_store_lookups_total{{medium=\"disk\",result=\"hit\"}} {}\n", prefix_hits_disk.load());
  out += fmt::format("kvq_prefix_store_lookups_total{{medium=\"disk\",result=\"miss\"}} {}\n",
                     prefix_misses_disk.load());
  out += fmt::format("kvq_prefix_store_lookups_total{{medium=\"remote\",result=\"hit\"}} {}\n",
                     prefix_hits_remote.load());
  out += fmt::format("kvq_prefix_store_lookups_total{{medium=\"remote\",result=\"miss\"}} {}\n",
                     prefix_misses_remote.load());
  out += "# HELP kvq_prefix_store_bytes_total Snapshot bytes moved to and from a store, by medium.\n"
         "# TYPE kvq_prefix_store_bytes_total counter\n";
  out += fmt::format("kvq_prefix_store_bytes_total{{medium=\"disk\",direction=\"read\"}} {}\n",
                     prefix_store_bytes_read_disk.load());
  out += fmt::format("kvq_prefix_store_bytes_total{{medium=\"disk\",direction=\"written\"}} {}\n",
                     prefix_store_bytes_written_disk.load());
  out += fmt::format("kvq_prefix_store_bytes_total{{medium=\"remote\",direction=\"read\"}} {}\n",
                     prefix_store_bytes_read_remote.load());
  out += fmt::format("kvq_prefix_store_bytes_total{{medium=\"remote\",direction=\"written\"}} {}\n",
                     prefix_store_bytes_written_remote.load());
  Metric(out, "kvq_prefix_store_snapshots_saved_total", "counter", "Snapshots written to the shared prefix store.",
         prefix_snapshots_saved_remote.load());
  Metric(out, "kvq_prefix_store_up", "gauge", "1 when the shared prefix store (--prefix-store) is reachable.",
         prefix_store_up.load());
  Metric(out, "kvq_prefix_store_errors_total", "counter",
         "Shared prefix store commands that failed (outages included); requests went on without it.",
         prefix_store_errors.load());
  Metric(out, "kvq_kv_event_batches_total", "counter", "KV event batches published (--kv-events).",
         kv_events_published.load());
  Metric(out, "kvq_kv_event_subscriptions_total", "counter",
         "Subscriptions received on the KV event socket (--kv-events): a subscriber receives the batches sent "
         "after its subscription arrived.", kv_events_subscriptions.load());
  Metric(out, "kvq_spec_drafts_total", "counter", "Decode steps in which a session ran a draft (speculation).",
         spec_drafts.load());
  Metric(out, "kvq_spec_draft_tokens_total", "counter", "Drafted tokens run (speculation).", spec_draft_tokens.load());
  Metric(out, "kvq_spec_accepted_tokens_total", "counter", "Drafted tokens kept: equal to the tokens drawn at their "
         "positions.", spec_accepted_tokens.load());
  Metric(out, "kvq_spec_gated_steps_total", "counter",
         "Decode steps in which the speculation gate shortened or dropped an available draft (a step it wanted none in and looked none up: at the rate lookups found one).", spec_gated_steps.load());
  Metric(out, "kvq_spec_gates_resumed_total", "counter",
         "Requests whose speculation gate began with what their slot's last request learnt (the same source and "
         "draft settings), instead of timing a plain pass and probing drafts again.", spec_gates_resumed.load());
  Metric(out, "kvq_spec_index_drafts_total", "counter",
         "Decode steps whose draft came from the server-wide suffix index (--spec-index-tokens).",
         spec_index_drafts.load());
  Metric(out, "kvq_spec_index_tokens", "gauge", "Tokens of recent requests the server-wide suffix index holds.",
         spec_index_tokens.load());
  Metric(out, "kvq_spec_draft_model_passes_total", "counter",
         "Forward passes of the draft model (spec \"draft\"), every slot drafting at the time in each.",
         spec_draft_model_passes.load());
  // vLLM's names for the same facts. Its prefix-cache counters count tokens: queries are prompt
  // tokens looked up, hits those found cached.
  Metric(out, "vllm:num_requests_running", "gauge", "Requests generating now (kvq_active_sessions).",
         active_sessions.load());
  Metric(out, "vllm:num_requests_waiting", "gauge", "Requests waiting for a session (kvq_queued_requests).",
         queued_requests.load());
  const int64_t capacity = kv_bytes_capacity.load();
  Metric(out, "vllm:kv_cache_usage_perc", "gauge",
         "KV cache use as a fraction in [0, 1]: kvq_kv_bytes_reserved over --kv-budget (or every session at "
         "full context).",
         capacity > 0 ? std::min(1.0, static_cast<double>(kv_bytes_reserved.load()) / capacity) : 0.0);
  Metric(out, "vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
         prompt_tokens.load());
  Metric(out, "vllm:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.",
         prompt_tokens_reused.load());
  Metric(out, "vllm:spec_decode_num_drafts_total", "counter", "Drafts run (kvq_spec_drafts_total).", spec_drafts.load());
  Metric(out, "vllm:spec_decode_num_draft_tokens_total", "counter", "Drafted tokens run (kvq_spec_draft_tokens_total).",
         spec_draft_tokens.load());
  Metric(out, "vllm:spec_decode_num_accepted_tokens_total", "counter",
         "Drafted tokens kept (kvq_spec_accepted_tokens_total).", spec_accepted_tokens.load());
  // llama-server's names for the same three counts (its verification steps are kvq's drafts).
  Metric(out, "llamacpp:spec_decode_num_drafts_total", "counter", "Drafts run (kvq_spec_drafts_total).",
         spec_drafts.load());
  Metric(out, "llamacpp:spec_decode_num_draft_tokens_total", "counter",
         "Drafted tokens run (kvq_spec_draft_tokens_total).", spec_draft_tokens.load());
  Metric(out, "llamacpp:spec_decode_num_accepted_tokens_total", "counter",
         "Drafted tokens kept (kvq_spec_accepted_tokens_total).", spec_accepted_tokens.load());
  return out;
}

}  // namespace kvq::server
