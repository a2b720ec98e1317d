// `kvq bench serve`: kvq serve measured over loopback HTTP in one process (src/api_bench/serve_bench.h):
// a load test (concurrent streaming clients: failures, outputs vs the same request alone, time to
// first token, tokens/s), batching (decode tokens/s with 1 and with N sessions, interleaved) and
// prefix reuse (time to first token cold, warm, and after a restart from --prefix-cache), and two
// replicas under a round-robin and a prefix-affinity client.
#include <fmt/format.h>

#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/json_output.h"
#include "kvq/model.h"
#include "api_bench/serve_bench.h"

namespace kvq::cli {
namespace {

struct BenchServeOptions {
  SharedOptions shared;  // -m, --tokenizer, --kv*, -t, --json
  server::ServeBenchConfig config;
  int64_t context = 0;
};

int RunBenchServe(BenchServeOptions& o) {
  auto bad = [](const std::string& m) { return BadInput("bench serve", m); };
  Result<LayerFormats> kv = o.shared.KvLayer();
  if (!kv.ok()) return bad(kv.status().message());
  server::ServeBenchConfig& c = o.config;
  c.engine.kv.key_format = KvSpecName(kv->Key());
  c.engine.kv.value_format = KvSpecName(kv->Value());
  c.engine.parallel = std::max(c.engine.parallel, c.clients);
  c.engine.max_queue = std::max(c.engine.max_queue, c.clients * 2);
  if (c.prefix_dir.empty()) {
    c.prefix_dir = (std::filesystem::temp_directory_path() / fmt::format("kvq-bench-serve-{}", getpid())).string();
  }
  ModelOptions load = o.shared.LoadOptions();
  load.context = o.context;
  load.kv = c.engine.kv;
  Result<std::unique_ptr<Model>> model = Model::Load(o.shared.ModelPath(), load);
  if (!model.ok()) return bad(model.status().message());
  const ModelInfo& info = (*model)->info();
  c.progress = [](const std::string& line) { fmt::print(stderr, "kvq bench serve: {}\n", line); };
  Result<server::ServeBenchResult> result = server::RunServeBench(**model, c);
  std::error_code ec;
  std::filesystem::remove_all(c.prefix_dir, ec);
  if (!result.ok()) {
    fmt::print(stderr, "kvq bench serve: error: {}\n", result.status().message());
    return 1;
  }
  const server::ServeBenchResult& r = *result;
  if (o.shared.json) {
    nlohmann::json j = {{"model", info.path}, {"kv", o.shared.KvFormatName()}, {"threads", info.threads},
                        {"clients", c.clients}, {"requests_per_client", c.requests_per_client},
                        {"max_tokens", c.max_tokens}, {"requests", r.requests}, {"failed", r.failed},
                        {"mismatched", r.mismatched}, {"ttft_p50_s", r.ttft_seconds.p50},
                        {"ttft_p99_s", r.ttft_seconds.p99}, {"load_tokens_per_second", r.load_tokens_per_second},
                        {"one_session_tps", r.one_session_tps}, {"n_sessions_tps", r.n_sessions_tps},
                        {"batch_sessions", c.batch_sessions}, {"batch_ratio", r.batch_ratio},
                        {"prefix_tokens", r.prefix_tokens}, {"ttft_cold_s", r.ttft_cold},
                        {"ttft_warm_s", r.ttft_warm}, {"ttft_restart_s", r.ttft_restart},
                        {"restart_start_s", r.restart_start_seconds},
                        {"cached_warm", r.cached_warm}, {"cached_restart", r.cached_restart},
                        {"prefix_outputs_equal", r.prefix_outputs_equal}};
    if (!r.replica_arms.empty()) {
      j["replicas"] = {{"conversations", c.conversations}, {"system_prompts", c.system_prompts},
                       {"system_tokens", r.system_tokens}, {"turns", c.turns},
                       {"outputs_equal", r.replica_outputs_equal}, {"arms", nlohmann::json::array()}};
      for (const auto& a : r.replica_arms) {
        j["replicas"]["arms"].push_back({{"client", a.client}, {"requests", a.requests}, {"failed", a.failed},
                                         {"ttft_p50_s", a.ttft_seconds.p50}, {"ttft_p99_s", a.ttft_seconds.p99},
                                         {"tokens_per_second", a.tokens_per_second},
                                         {"prompt_tokens", a.prompt_tokens},
                                         {"prefix_hit_tokens", a.prefix_hit_tokens},
                                         {"requests_per_replica", a.per_replica}});
      }
    }
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  fmt::print("kvq bench serve: {} ({} layers, context {}), KV {}, {} threads, loopback HTTP\n", info.path,
             info.n_layers, info.context, o.shared.KvFormatName(), info.threads);
  auto has = [&](const char* phase) { return std::find(c.phases.begin(), c.phases.end(), phase) != c.phases.end(); };
  if (has("load")) {
    fmt::print("\nload: {} clients x {} requests, greedy, max_tokens {}, {} sessions\n", c.clients,
               c.requests_per_client, c.max_tokens, c.engine.parallel);
    fmt::print("  requests {}   failed {}   output differs from the same request alone {}\n", r.requests, r.failed,
               r.mismatched);
    fmt::print("  time to first token: p50 {:.1f} ms   p99 {:.1f} ms   max {:.1f} ms\n", r.ttft_seconds.p50 * 1e3,
               r.ttft_seconds.p99 * 1e3, r.ttft_seconds.max * 1e3);
    fmt::print("  generated {} tokens in {:.2f} s: {:.0f} tok/s in total\n", r.load_tokens, r.load_seconds,
               r.load_tokens_per_second);
  }
  if (has("batch")) {
    fmt::print("\nbatch: decode tok/s in total, {} tokens per request (ignore_eos), rounds interleaved\n",
               c.batch_tokens);
    fmt::print("  {:>6} {:>14} {:>14}\n", "round", "1 session", fmt::format("{} sessions", c.batch_sessions));
    for (size_t i = 0; i < r.one_session_tps.size(); ++i) {
      fmt::print("  {:>6} {:>14.0f} {:>14.0f}\n", i + 1, r.one_session_tps[i], r.n_sessions_tps[i]);
    }
    fmt::print("  {} sessions / 1 session (medians): {:.2f}x\n", c.batch_sessions, r.batch_ratio);
  }
  if (has("prefix")) {
    fmt::print("\nprefix: a prompt extending a {}-token prefix, time to first token (median of 3)\n",
               r.prefix_tokens);
    fmt::print("  cold (nothing cached)           {:8.1f} ms\n", r.ttft_cold * 1e3);
    fmt::print("  warm (an idle session has it)   {:8.1f} ms   {:5.1f}x sooner, {} tokens reused\n",
               r.ttft_warm * 1e3, r.ttft_cold / r.ttft_warm, r.cached_warm);
    fmt::print("  after a restart (--prefix-cache){:8.1f} ms   {:5.1f}x sooner, {} tokens reused\n",
               r.ttft_restart * 1e3, r.ttft_cold / r.ttft_restart, r.cached_restart);
    fmt::print("  (the restarted server took {:.1f} ms to start: it loads the newest snapshots into its idle "
               "sessions before it listens)\n", r.restart_start_seconds * 1e3);
    fmt::print("  outputs cold == warm == restart: {}\n", r.prefix_outputs_equal ? "yes" : "NO");
  }
  bool replicas_ok = true;
  if (has("replicas")) {
    fmt::print("\nreplicas: 2 replicas x {} sessions; {} conversations over {} system prompts of {} tokens, {} turns "
               "each, greedy, max_tokens {}; fresh replicas per client\n", c.conversations, c.conversations,
               c.system_prompts, r.system_tokens, c.turns, c.max_tokens);
    fmt::print("  {:<16} {:>9} {:>7} {:>14} {:>14} {:>9} {:>22} {:>10}\n", "client", "requests", "failed",
               "TTFT p50 ms", "TTFT p99 ms", "tok/s", "prefix hits (tokens)", "per replica");
    for (const auto& a : r.replica_arms) {
      replicas_ok = replicas_ok && a.failed == 0;
      fmt::print("  {:<16} {:>9} {:>7} {:>14.1f} {:>14.1f} {:>9.1f} {:>22} {:>10}\n", a.client, a.requests, a.failed,
                 a.ttft_seconds.p50 * 1e3, a.ttft_seconds.p99 * 1e3, a.tokens_per_second,
                 fmt::format("{} of {}", a.prefix_hit_tokens, a.prompt_tokens),
                 fmt::format("{} / {}", a.per_replica[0], a.per_replica[1]));
    }
    fmt::print("  outputs equal under both clients: {}\n", r.replica_outputs_equal ? "yes" : "NO");
    replicas_ok = replicas_ok && r.replica_outputs_equal;
  }
  return r.failed == 0 && r.mismatched == 0 && (!has("prefix") || r.prefix_outputs_equal) && replicas_ok ? 0 : 1;
}

}  // namespace

void AddBenchServeCommand(CLI::App& bench, int* exit_code) {
  auto o = std::make_shared<BenchServeOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "serve", "kvq serve over loopback HTTP: a load test, batching (1 vs N sessions), prefix reuse (cold, warm, "
               "after a restart), two replicas under a round-robin and a prefix-affinity client (--phases replicas)");
  AddModelFlag(cmd, &o->shared);
  AddRepackFlags(cmd, &o->shared);
  AddTokenizerFlag(cmd, &o->shared);
  AddKvFormatFlags(cmd, &o->shared);
  server::ServeBenchConfig& c = o->config;
  cmd->add_option("--phases", c.phases, "Which measurements: load, batch, prefix, replicas")->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--clients", c.clients, "Load: concurrent streaming clients")->check(IntInRange(1, 256))
      ->capture_default_str();
  cmd->add_option("--requests", c.requests_per_client, "Load: requests per client")->check(IntInRange(1, 10000))
      ->capture_default_str();
  cmd->add_option("--max-tokens", c.max_tokens, "Load and prefix: max_tokens per request")
      ->check(IntInRange(1, 100000))->capture_default_str();
  cmd->add_option("--sessions", c.batch_sessions, "Batch: sessions generating at once (against 1)")
      ->check(IntInRange(2, 256))->capture_default_str();
  cmd->add_option("--rounds", c.batch_rounds, "Batch: rounds of (1 session, N sessions)")
      ->check(IntInRange(1, 100))->capture_default_str();
  cmd->add_option("--batch-tokens", c.batch_tokens, "Batch: tokens each request generates")
      ->check(IntInRange(1, 100000))->capture_default_str();
  cmd->add_option("--prefix-tokens", c.prefix_tokens, "Prefix: tokens of the shared prefix (clamped to the context)")
      ->check(IntInRange(64, 1 << 24))->capture_default_str();
  cmd->add_option("--conversations", c.conversations, "Replicas: conversations at once")
      ->check(IntInRange(1, 256))->capture_default_str();
  cmd->add_option("--system-prompts", c.system_prompts, "Replicas: distinct system prompts the conversations share")
      ->check(IntInRange(1, 64))->capture_default_str();
  cmd->add_option("--system-tokens", c.system_tokens, "Replicas: tokens of each system prompt (clamped to the context)")
      ->check(IntInRange(32, 1 << 24))->capture_default_str();
  cmd->add_option("--turns", c.turns, "Replicas: requests per conversation, each extending the one before")
      ->check(IntInRange(1, 100))->capture_default_str();
  cmd->add_option("-c,--ctx-size,--context", o->context, "Positions a session holds at most (0: the model's)")
      ->check(IntInRange(0, int64_t{1} << 31))->capture_default_str();
  AddThreadsFlag(cmd, &o->shared);
  AddJsonFlag(cmd, &o->shared);
  cmd->callback([o, exit_code] { *exit_code = RunBenchServe(*o); });
}

}  // namespace kvq::cli
