// `kvq pull user/name[:quant]`: a GGUF from a Hugging Face repository into the Hugging Face cache
// (src/hub/), printing its path; `kvq list`: the GGUF models in that cache.
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/hub_flag.h"
#include "cli/json_output.h"
#include "hub/hf_cache.h"
#include "hub/hub_client.h"
#include "kvq/units.h"

namespace kvq::cli {
namespace {

struct PullOptions {
  std::string ref;
  bool quiet = false;
  bool json = false;
};

nlohmann::json JsonOf(const hub::CachedGguf& g) {
  return {{"repo", g.repo},     {"file", g.file},   {"quant", g.quant},
          {"commit", g.commit}, {"bytes", g.bytes}, {"path", g.path}};
}

int RunPull(const PullOptions& o) {
  const Result<hub::RepoRef> ref = hub::ParseRepoRef(o.ref);
  if (!ref.ok()) return BadInput("pull", ref.status().message());
  const hub::HubOptions hub_options = hub::HubOptionsFromEnv();
  Result<hub::PullResult> pulled =
      hub::PullGguf(*ref, hub_options, DownloadMessages("pull", o.quiet));
  if (!pulled.ok()) {
    fmt::print(stderr, "kvq pull: error: {}\n", pulled.status().message());
    return 1;
  }
  const hub::PullResult& p = *pulled;
  if (o.json) {
    nlohmann::json doc = JsonOf(p.model);
    doc["downloaded"] = p.downloaded;
    doc["resumed_from_bytes"] = p.resumed_from;
    doc["offline_reason"] = p.offline_reason;
    PrintJson(doc);
    return 0;
  }
  if (!o.quiet) {
    const std::string resumed =
        p.resumed_from > 0 ? fmt::format(" (resumed after {} bytes)", FormatCount(p.resumed_from))
                           : "";
    const std::string how = !p.offline_reason.empty() ? "in the cache; " + p.offline_reason
                            : p.downloaded ? "downloaded" + resumed + " and verified (SHA-256)"
                                           : "already in the cache";
    fmt::print(stderr, "kvq pull: {} {} ({}): {}\n", p.model.repo, p.model.file,
               FormatBytesIec(p.model.bytes), how);
  }
  fmt::print("{}\n", p.model.path);
  return 0;
}

int RunList(bool json) {
  const std::string cache = hub::CacheDirFromEnv();
  const std::vector<hub::CachedGguf> models = hub::ListCachedGgufs(cache);
  if (json) {
    nlohmann::json doc = {{"cache", cache}, {"models", nlohmann::json::array()}};
    for (const hub::CachedGguf& g : models) doc["models"].push_back(JsonOf(g));
    PrintJson(doc);
    return 0;
  }
  if (models.empty()) {
    fmt::print("No GGUF models in {} (kvq pull user/name[:quant] fetches one)\n", cache);
    return 0;
  }
  size_t repo_w = 4, file_w = 4;
  for (const hub::CachedGguf& g : models) {
    repo_w = std::max(repo_w, g.repo.size());
    file_w = std::max(file_w, g.file.size());
  }
  fmt::print("{:<{}}  {:<{}}  {:>10}  {}\n", "repo", repo_w, "file", file_w, "size", "path");
  for (const hub::CachedGguf& g : models) {
    fmt::print("{:<{}}  {:<{}}  {:>10}  {}\n", g.repo, repo_w, g.file, file_w,
               FormatBytesIec(g.bytes), g.path);
  }
  return 0;
}

}  // namespace

void AddPullCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<PullOptions>();
  CLI::App* cmd = app.add_subcommand(
      "pull",
      "Download a GGUF from a Hugging Face repository into the Hugging Face cache ($HF_HUB_CACHE, "
      "$HF_HOME/hub or ~/.cache/huggingface/hub; $HF_ENDPOINT, $HF_TOKEN) and print its path");
  cmd->add_option("repo", o->ref,
                  "user/name[:quant]; the quant (e.g. Q8_0, case-insensitive) defaults to Q4_K_M, "
                  "else the first Q4, else the first GGUF")
      ->required();
  cmd->add_flag("-q,--quiet", o->quiet, "No progress or messages: only the path (or the error)");
  cmd->add_flag("--json", o->json,
                "Print one JSON document (repo, file, quant, commit, bytes, path, downloaded)");
  cmd->callback([o, exit_code] { *exit_code = RunPull(*o); });

  auto json = std::make_shared<bool>(false);
  CLI::App* list = app.add_subcommand(
      "list", "The GGUF models in the Hugging Face cache: repo, file, size, path");
  list->add_flag("--json", *json, "Print one JSON document");
  list->callback([json, exit_code] { *exit_code = RunList(*json); });
}

}  // namespace kvq::cli
