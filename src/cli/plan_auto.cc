// `kvq plan --auto` (see plan_auto.h): loads the model and the text, runs the plan search
// (plan_search/auto_plan.h: one fidelity arm per layer, K|V and candidate, then the chosen plan),
// prints the sensitivity table and the plan (or JSON), and writes the plan file.
#include "cli/plan_auto.h"

#include <fmt/core.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <vector>

#include "cli/commands.h"
#include "cli/eval_text.h"
#include "cli/json_output.h"
#include "kvq/model.h"
#include "kvq/units.h"
#include "plan_search/auto_plan.h"

namespace kvq::cli {
namespace {

constexpr const char* kCommand = "plan --auto";

// Bits per number of one tensor's `bytes` at n positions.
double TensorBits(int64_t bytes, int64_t n, RowShape row) {
  return 8.0 * static_cast<double>(bytes) / (static_cast<double>(n) * static_cast<double>(row.elems()));
}

void PrintResult(const AutoPlanResult& r, const ModelInfo& info, const std::string& model, const std::string& text,
                 const std::string& output) {
  const KvPlan& p = r.plan;
  const RowShape row{.n_kv_heads = info.n_kv_heads, .head_dim = info.head_dim};
  // The plan's tensors are the cache's (a hybrid's attention layers), named by their model layer.
  const std::vector<int32_t>& model_layer = r.model_layers;  // [cache layer]
  const size_t cache_layers = model_layer.size();
  fmt::print("Automatic KV plan: model {}, text {}, {} positions; budget {} = {} bytes at {} positions "
             "(every byte held there, f32 residual/sink rows and scales included)\n",
             model, text, p.positions, p.budget.Describe(), FormatCount(r.budget_bytes), p.positions);
  for (const std::string& s : r.skipped) fmt::print("  skipped candidate {}\n", s);
  fmt::print("\nSensitivity: mean KL (nats) with one tensor in the spec and every other f32; bits per number of "
             "that tensor\n\n| spec | K bits | V bits |");
  for (int32_t l : model_layer) fmt::print(" L{} K | L{} V |", l, l);
  fmt::print("\n| --- | ---: | ---: |");
  for (size_t l = 0; l < cache_layers; ++l) fmt::print(" ---: | ---: |");
  fmt::print("\n");
  const size_t per_tensor = r.costs.size() / (2 * cache_layers);  // candidates
  for (size_t i = 0; i < per_tensor; ++i) {
    const KvTensorCost& k0 = r.costs[i];
    const KvTensorCost& v0 = r.costs[per_tensor + i];
    fmt::print("| {} | {:.4g} | {:.4g} |", KvSpecName(k0.spec), TensorBits(k0.bytes, p.positions, row),
               TensorBits(v0.bytes, p.positions, row));
    for (size_t t = 0; t < 2 * cache_layers; ++t) fmt::print(" {:.3g} |", r.costs[t * per_tensor + i].kl);
    fmt::print("\n");
  }
  fmt::print("\nPlan ({}):\n\n| layer | K | V |\n| ---: | --- | --- |\n",
             r.exact ? "exact knapsack over bytes" : "knapsack with bytes rounded up to a coarser unit");
  for (size_t l = 0; l < p.layers.size(); ++l) {
    fmt::print("| {} | {} | {} |\n", model_layer[l], KvSpecName(p.layers[l].Key()), KvSpecName(p.layers[l].Value()));
  }
  const FidelityRow& m = r.measured;
  fmt::print("\nbits per number {:.4f} ({} bytes, {:.1f}% of f16); predicted KL (sum over tensors) {:.4g}, measured KL "
             "{:.4g}; top-1 agree {}/{} ({:.1f}%), ppl {:.4f}\n",
             p.bits_per_number, FormatCount(p.kv_bytes), 100.0 * m.memory_vs_f16, p.predicted_kl, p.measured_kl,
             m.top1_agree, m.positions, 100.0 * static_cast<double>(m.top1_agree) / static_cast<double>(m.positions),
             m.ppl);
  if (!output.empty()) fmt::print("wrote {} (use it with --kv-plan)\n", output);
}

nlohmann::json ResultJson(const AutoPlanResult& r, const std::string& model, const std::string& text,
                          const std::string& output) {
  nlohmann::json costs = nlohmann::json::array();
  for (const KvTensorCost& c : r.costs) {
    costs.push_back({{"layer", c.layer}, {"tensor", c.value ? "v" : "k"}, {"spec", KvSpecName(c.spec)},
                     {"bytes", c.bytes}, {"kl", c.kl}, {"top1_agree_count", c.top1_agree}});
  }
  nlohmann::json plan = nlohmann::json::parse(KvPlanJson(r.plan));
  const FidelityRow& m = r.measured;
  return {{"model", model}, {"text", text}, {"positions", r.plan.positions}, {"budget_bytes", r.budget_bytes},
          {"exact", r.exact}, {"skipped", r.skipped}, {"sensitivity", costs}, {"plan", plan},
          {"measured", {{"kl", m.kl}, {"logit_drift", m.logit_drift}, {"top1_agree_count", m.top1_agree},
                        {"memory_vs_f16", m.memory_vs_f16}, {"ppl", m.ppl}}},
          {"output", output.empty() ? nlohmann::json() : nlohmann::json(output)}};
}

}  // namespace

CLI::Option* AddAutoPlanFlags(CLI::App* cmd, SharedOptions* shared, AutoPlanOptions* o) {
  CLI::Option* automatic = cmd->add_flag(
      "--auto", o->enabled,
      "Choose KV specs per layer and per K/V for a model (-m) from measured fidelity: each candidate\n"
      "on each tensor alone (every other tensor f32), then the least summed KL within --kv-bits or\n"
      "--bytes-per-token; prints the plan with its predicted and measured KL; -o writes the plan file");
  std::vector<CLI::Option*> only_auto;
  // -m also works without --auto: the shape of the model file (cmd_plan.cc).
  AddModelFlag(cmd, shared,
               "GGUF (.gguf) or llama2.c checkpoint (.bin): without --auto, plan its KV shape (the layers with a\n"
               "KV cache, KV heads, head_dim) and show its fixed state; with --auto, the model to plan specs for\n"
               "(default: the bundled stories260K)");
  only_auto.push_back(AddTokenizerFlag(cmd, shared));
  for (CLI::Option* repack : AddRepackFlags(cmd, shared)) only_auto.push_back(repack);
  only_auto.push_back(cmd->add_option("-f,--file", o->text, "--auto: text to evaluate on (default: data/eval/tinystories-eval.txt)")
                          ->type_name("FILE"));
  only_auto.push_back(cmd->add_option("-c,--ctx-size", o->context, "--auto: positions to evaluate (default: the whole text, up to the "
                                               "model's context)")
      ->check(IntInRange(2, int64_t{1} << 30)));
  only_auto.push_back(AddKvBitsFlag(cmd, shared, "--auto: the budget, average bits per number over every K and V number held at the "
                             "evaluated length"));
  only_auto.push_back(AddByteSizeFlag(cmd, "--bytes-per-token", &o->bytes_per_token,
                  "--auto: the budget, KV bytes (all layers, K + V) per position held at the evaluated length"));
  only_auto.push_back(cmd->add_option("-o,--output", o->output, "--auto: write the plan file (JSON) here")->check(OutputFilePath())->type_name("PLAN"));
  only_auto.push_back(AddFormatListFlag(cmd, shared, "--candidates",
                    "--auto: KV specs to try on each tensor, comma-separated (default: int8, fp8-e4m3, int4,\n"
                    "int4+rot, int4+rot+sink4, int4-kivi, int4-kivi+sink4, fp4-e2m1, int2, int2+rot,\n"
                    "int2+rot+sink4, int2-kivi, int2-kivi+sink4, int2-kivi+rot+sink4)"));
  only_auto.push_back(AddThreadsFlag(cmd, shared, "--auto: threads (the numbers do not depend on it)"));
  for (CLI::Option* opt : only_auto) opt->needs(automatic);  // the shape mode would ignore them
  return automatic;
}

int RunAutoPlan(const SharedOptions& shared, const AutoPlanOptions& o) {
  auto bad = [](const std::string& m) { return BadInput(kCommand, m); };
  auto fail = [](const std::string& m) {
    fmt::print(stderr, "kvq {}: error: {}\n", kCommand, m);
    return 1;
  };
  if ((shared.kv_bits > 0) == (o.bytes_per_token > 0)) {
    return bad("give one budget: --kv-bits B (bits per number) or --bytes-per-token N");
  }
  AutoPlanConfig config{.budget = {.kv_bits = shared.kv_bits, .bytes_per_token = o.bytes_per_token}};
  const Result<std::vector<KvSpec>> candidates = shared.FormatList();
  if (!candidates.ok()) return bad(candidates.status().message());
  config.candidates = candidates->empty() ? DefaultKvPlanCandidates() : *candidates;

  const std::string text_path = o.text.empty() ? BundledEvalText() : o.text;
  const Result<std::string> text = ReadEvalText(text_path);
  if (!text.ok()) return bad(text.status().message());
  const std::string model_path = shared.ModelPath();
  Result<std::unique_ptr<Model>> model =
      Model::Load(model_path, shared.LoadOptions());
  if (!model.ok()) return bad(model.status().message());
  const ModelInfo& info = (*model)->info();
  if (o.context > info.trained_context) {
    return bad(fmt::format("-c {}: more than the model's context of {} positions", o.context, info.trained_context));
  }
  // The text as the vocabulary encodes it (BOS first when it asks for one), cut to the positions evaluated.
  std::vector<int32_t> tokens = (*model)->Tokenize(*text);
  const size_t full_count = tokens.size();
  tokens.resize(std::min(full_count, static_cast<size_t>(o.context > 0 ? o.context : info.trained_context)));
  if (tokens.size() < 2) {
    return bad(fmt::format("-f {}: the text gives {} token(s); at least 2 are needed", text_path, tokens.size()));
  }
  if (full_count > tokens.size()) {
    fmt::print(stderr, "kvq {}: {} gives {} tokens; using the first {}\n", kCommand, text_path, full_count,
               tokens.size());
  }
  Result<AutoPlanResult> r = AutoPlanModel(**model, tokens, config, [](const std::string& line) {
    fmt::print(stderr, "kvq {}: {}\n", kCommand, line);
  });
  if (!r.ok()) return fail(r.status().message());
  if (!o.output.empty()) {
    if (Status s = WriteKvPlan(o.output, r->plan); !s.ok()) return fail("-o " + s.message());
  }
  const std::string model_name = DisplayPath(model_path), text_name = DisplayPath(text_path);
  if (shared.json) {
    PrintJson(ResultJson(*r, model_name, text_name, o.output));
  } else {
    PrintResult(*r, info, model_name, text_name, o.output);
  }
  return 0;
}

}  // namespace kvq::cli
