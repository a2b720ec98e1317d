// `kvq serve`: the OpenAI-compatible HTTP server (src/server/): POST /v1/completions and
// /v1/chat/completions (streamed as Server-Sent Events with "stream": true), GET /v1/models,
// /health, /metrics, /tokenize, /detokenize, /apply-template, /props, /slots, the chat page at /
// (compiled in) and the web bundle's files beside it when there is one. This file maps flags onto the engine's and the server's
// options, binds the port (refusing one in use), loads the model and its chat template while
// /health says "loading", and runs until SIGINT or SIGTERM, on which /health says "draining", new
// requests get 503, running ones finish (up to --shutdown-grace seconds) and it exits.
#include <fmt/format.h>
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/hub_flag.h"
#include "kvq/log.h"
#include "kvq/model.h"
#include "kvq/reasoning.h"
#include "kvq/units.h"
#include "server/engine.h"
#include "server/http_server.h"

#ifndef KVQ_WEB_BUNDLE_DIR
#define KVQ_WEB_BUNDLE_DIR ""
#endif

namespace kvq::cli {
namespace {

struct ServeOptions {
  SharedOptions shared{.threads = static_cast<int32_t>(std::clamp(std::thread::hardware_concurrency(), 1u, 1024u))};
  server::ServerOptions http;
  server::EngineOptions engine;
  int64_t context = 0;
  std::string alias;
  std::string web = "auto";
  std::string chat_template_file;  // --chat-template FILE: Jinja source replacing the model's
  std::string reasoning_format = "deepseek";
  double shutdown_grace_seconds = 30;
  DraftModelFlags draft;  // --draft-model: what requests with spec "draft" draft with
};

std::atomic<int> g_signal{0};
void OnSignal(int sig) { g_signal = sig; }

int RunServe(ServeOptions& o) {
  auto bad = [](const std::string& m) { return BadInput("serve", m); };
  const SharedOptions& so = o.shared;
  Result<LayerFormats> kv = so.KvLayer();
  if (!kv.ok()) return bad(kv.status().message());
  o.engine.kv.key_format = KvSpecName(kv->Key());
  o.engine.kv.value_format = KvSpecName(kv->Value());
  o.engine.kv.budgets = so.budgets;
  const std::string model_path = so.ModelPath();
  // Paths are checked before the port is taken and the model loads.
  if (!std::filesystem::is_regular_file(model_path)) return bad(fmt::format("-m {}: no such file", model_path));
  if (const std::string tok = so.TokenizerPath(); !tok.empty() && !std::filesystem::is_regular_file(tok)) {
    return bad(fmt::format("--tokenizer {}: no such file", tok));
  }
  if (!o.chat_template_file.empty()) {
    Result<std::string> source = ReadChatTemplateFile("--chat-template", o.chat_template_file);
    if (!source.ok()) return bad(source.status().message());
    o.http.chat_template = std::move(source).value();
    o.http.chat_template_origin = fmt::format("{} (--chat-template)", o.chat_template_file);
  }
  Result<ReasoningFormat> reasoning = ParseReasoningFormat(o.reasoning_format);
  if (!reasoning.ok()) return bad("--reasoning-format: " + reasoning.status().message());
  o.http.reasoning_format = *reasoning;
  if (o.web == "auto") o.web = std::filesystem::is_directory(KVQ_WEB_BUNDLE_DIR) ? KVQ_WEB_BUNDLE_DIR : "";
  o.http.web_root = o.web;
  o.http.model_id = o.alias.empty() ? std::filesystem::path(model_path).stem().string() : o.alias;
  o.http.http_threads = o.engine.parallel + o.engine.max_queue + 8;  // each waiting request holds one

  // The port first: a taken one is refused before the model loads, and while it loads /health
  // says so (503 "loading") to whoever polls it.
  server::Metrics metrics;
  server::HttpServer http(metrics, o.http);
  Result<int> port = http.Bind();
  if (!port.ok()) return bad(port.status().message());
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that went away is an error on its write, not a crash
  std::thread serving([&] { http.Serve(); });
  std::atomic<server::Engine*> running_engine{nullptr};
  std::thread watcher([&] {
    while (g_signal == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    // Draining before the log line says so: whoever reads the line and asks finds it true.
    http.SetDraining();  // /health: 503 "draining" from now on
    server::Engine* e = running_engine.load();
    if (e != nullptr) e->StopAccepting();
    if (g_signal > 0) {
      fmt::print(stderr, "kvq serve: signal {}: not accepting new requests, finishing running ones (up to {} s)\n",
                 g_signal.load(), o.shutdown_grace_seconds);
    }
    if (e != nullptr) {
      e->Drain(std::chrono::milliseconds(static_cast<int64_t>(o.shutdown_grace_seconds * 1e3)));
    }
    http.Stop();
  });
  // Ends both threads (Serve returns once the watcher has stopped the server).
  auto finish = [&](int code) {
    if (g_signal == 0) g_signal = -1;  // no signal: let the watcher go
    watcher.join();
    serving.join();
    return code;
  };
  fmt::print(stderr, "kvq serve: loading {} (GET http://{}:{}/health says \"loading\" until it is ready)\n",
             model_path, o.http.host, *port);

  ModelOptions load = so.LoadOptions();
  load.context = o.context;
  load.kv = o.engine.kv;
  Result<std::unique_ptr<Model>> model = Model::Load(model_path, load);
  if (!model.ok()) return finish(bad(model.status().message()));
  const ModelInfo& info = (*model)->info();
  if (!so.kv_plan.empty()) {
    // A per-layer plan (kvq plan --auto), checked against this model; its specs for every session.
    Result<std::vector<LayerFormats>> layers = so.KvLayers((*model)->fingerprint());
    if (!layers.ok()) return finish(bad(layers.status().message()));
    for (const LayerFormats& l : *layers) {
      o.engine.kv.layers.push_back({.key = KvSpecName(l.Key()), .value = KvSpecName(l.Value())});
    }
  }
  // The chat template (the file's own when kvq can run it, else ChatML): the log says which.
  const std::string chat_origin =
      o.http.chat_template.empty() ? (*model)->chat_template_choice().origin : o.http.chat_template_origin;
  // --spec draft --draft-model FILE: every slot drafts with a session of it (checked to share the
  // vocabulary); it outlives the engine, declared before it.
  Result<std::unique_ptr<Model>> draft_model = LoadDraftModel(o.draft, **model, so.threads, &o.engine.speculation);
  if (!draft_model.ok()) return finish(bad(draft_model.status().message()));
  Result<std::unique_ptr<server::Engine>> engine = server::Engine::Create(**model, o.engine, &metrics);
  if (!engine.ok()) return finish(bad(engine.status().message()));
  running_engine = engine->get();
  http.Attach(**model, **engine);
  if (g_signal > 0) (*engine)->Drain(std::chrono::milliseconds(0));  // a signal came while it loaded

  fmt::print(stderr,
             "kvq serve: model {} ({}, {} layers, context {}), KV {}, {} sessions, {} threads\n"
             "kvq serve: chat template: {}\n"
             "kvq serve: listening on http://{}:{}/v1{}; the chat page at http://{}:{}/{}\n",
             o.http.model_id, info.architecture, info.n_layers, info.context, so.KvFormatName(), o.engine.parallel,
             info.threads, chat_origin, o.http.host, *port, o.http.api_key.empty() ? "" : " (API key required)",
             o.http.host, *port,
             o.http.web_root.empty() ? "" : fmt::format(", the in-tab runtime at http://{}:{}/index.html", o.http.host, *port));
  serving.join();
  if (g_signal == 0) g_signal = -1;
  watcher.join();
  fmt::print(stderr, "kvq serve: stopped\n");
  return 0;
}

}  // namespace

void AddServeCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions (SSE streaming), /v1/models, "
               "/health, /metrics, /tokenize, /detokenize, /apply-template, /props, /slots, /reset_prefix_cache");
  AddModelFlag(cmd, &o->shared);
  AddRepackFlags(cmd, &o->shared);
  AddHfRepoFlag(cmd, &o->shared);
  AddTokenizerFlag(cmd, &o->shared);
  cmd->add_option("--host", o->http.host, "Address to listen on (loopback by default)")
      ->capture_default_str()
      ->type_name("HOST");
  cmd->add_option("--port", o->http.port, "Port to listen on (0: any free port)")
      ->check(IntInRange(0, 65535))->capture_default_str();
  cmd->add_option("--parallel", o->engine.parallel, "Sessions generating at once; more requests queue (also -np)")
      ->check(IntInRange(1, 256))->capture_default_str();
  cmd->add_option("--queue", o->engine.max_queue, "Requests waiting for a session at most; beyond: 429")
      ->check(IntInRange(0, 4096))->capture_default_str();
  AddKvFormatFlags(cmd, &o->shared);
  AddKvPlanFlags(cmd, &o->shared);
  AddBudgetFlags(cmd, &o->shared, "Each session's cache: ");
  AddByteSizeFlag(cmd, "--kv-budget-per-session", &o->engine.kv_budget_per_session_bytes,
                  "KV bytes one request may need (prompt + max_tokens positions); beyond: 413");
  AddByteSizeFlag(cmd, "--kv-budget", &o->engine.kv_budget_bytes,
                  "KV bytes of all sessions together; a request waits for room (413 if it alone needs more)");
  cmd->add_option("--prefix-cache", o->engine.prefix_cache_dir,
                  "Folder of prompt-prefix snapshots: prompts that extend a saved one skip its prefill, across "
                  "restarts")
      ->type_name("DIR");
  AddByteSizeFlag(cmd, "--prefix-cache-size", &o->engine.prefix_cache_max_bytes,
                  "Bytes the prefix-cache folder may hold (oldest snapshots go first; default 4GiB)");
  cmd->add_option("--prefix-store", o->engine.prefix_store_url,
                  "redis://HOST:PORT[/DB]: prefix snapshots shared by every replica of this model (behind "
                  "--prefix-cache when both are given); bound its size with Redis's maxmemory (allkeys-lru)")
      ->type_name("URL");
  cmd->add_option("--kv-block-size", o->engine.kv_blocks.block_size,
                  "Tokens per block that --prefix-store keys and --kv-events announce (match the router's)")
      ->check(IntInRange(1, 1 << 16))->capture_default_str();
  cmd->add_option("--kv-hash-seed", o->engine.kv_blocks.hash_seed,
                  "Seed of the chained block hashes (match the router's)")->capture_default_str();
  cmd->add_option("--kv-events", o->engine.kv_events.endpoint,
                  "ZeroMQ endpoint to publish KV events on (vLLM's KVEventBatch), e.g. tcp://*:5557")
      ->type_name("ENDPOINT");
  cmd->add_option("--kv-events-replay", o->engine.kv_events.replay_endpoint,
                  "ZeroMQ endpoint answering requests for missed KV event batches, e.g. tcp://*:5558")
      ->type_name("ENDPOINT");
  cmd->add_option("--kv-events-topic", o->engine.kv_events.topic, "Topic frame of every KV event message")
      ->type_name("TOPIC");
  cmd->add_option("--api-key", o->http.api_key,
                  "Require 'Authorization: Bearer KEY' on /v1/* and /metrics (default: $KVQ_API_KEY if set)")
      ->envname("KVQ_API_KEY")
      ->type_name("KEY");
  cmd->add_option("-c,--ctx-size,--context", o->context, "Positions a session holds at most (0: the model's)")
      ->check(IntInRange(0, int64_t{1} << 31))->capture_default_str();
  cmd->add_option("--max-tokens", o->http.limits.max_tokens_limit, "The most max_tokens a request may ask for")
      ->check(IntInRange(1, 1 << 24))->capture_default_str();
  AddByteSizeFlag(cmd, "--max-body", &o->http.max_body_bytes, "Largest request body (default 8MiB); beyond: 413");
  cmd->add_option("--timeout", o->http.request_timeout_seconds, "Seconds a request may wait and run; then 504")
      ->check(CLI::Range(0.001, 1e7))->capture_default_str();
  cmd->add_option("--read-timeout", o->http.read_timeout_seconds,
                  "Seconds a client may take to send its request before the connection is dropped")
      ->check(IntInRange(1, 3600))->capture_default_str();
  cmd->add_option("--shutdown-grace", o->shutdown_grace_seconds,
                  "On SIGTERM/SIGINT, seconds running requests get to finish")
      ->check(CLI::Range(0.0, 86400.0))->capture_default_str();
  cmd->add_option("--reasoning-format", o->reasoning_format,
                  "How chat replies' thoughts (<think>...</think>) are returned: 'deepseek' (or 'auto') in "
                  "message.reasoning_content and delta.reasoning_content, 'none' left in the content; a "
                  "request's reasoning_format overrides it")
      ->capture_default_str()->type_name("FORMAT");
  cmd->add_option("--chat-template,--chat-template-file", o->chat_template_file,
                  "Jinja chat template FILE rendering chat requests instead of the model's (its tool-call format "
                  "too; default: the model's tokenizer.chat_template, or ChatML when it has none)")
      ->type_name("FILE");
  cmd->add_option("-a,--alias", o->alias, "The model id /v1/models lists (default: the model file's name)")
      ->type_name("NAME");
  cmd->add_option("--web", o->web,
                  "Folder of the web bundle (the in-tab runtime) served beside the chat page, which is built in "
                  "('auto': the build's bundle if it exists; '': none)")
      ->capture_default_str()
      ->type_name("DIR");
  // The default for requests that do not set spec / speculative.n_max themselves.
  AddSpeculationFlags(cmd, &o->engine.speculation, &o->draft);
  cmd->add_option("--spec-index-tokens", o->engine.spec_index_tokens,
                  "Suffix drafts also continue recent requests' prompts and replies: a server-wide suffix index of "
                  "at most this many tokens, oldest dropped first (0: off)")
      ->check(IntInRange(0, int64_t{1} << 30))
      ->capture_default_str();
  AddThreadsFlag(cmd, &o->shared);
  cmd->callback([o, exit_code] {
    *exit_code = ResolveModelFlag("serve", &o->shared);
    if (*exit_code == 0) *exit_code = RunServe(*o);
  });
}

}  // namespace kvq::cli
