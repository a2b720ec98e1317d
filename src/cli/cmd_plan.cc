// `kvq plan`: KV memory for a model shape and a KV spec, in exact bytes (sinks and residual rows
// included), and — given the weight bytes a decode step reads — the KV share of those bytes and each
// format's speed ceiling. `kvq plan --auto` (plan_auto.cc) chooses specs per layer instead.
#include <fmt/core.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <optional>
#include <span>

#include "cli/commands.h"
#include "cli/json_output.h"
#include "cli/flags.h"
#include "cli/plan_auto.h"
#include "kvq/format.h"
#include "kvq/kv_cache.h"
#include "kvq/kv_memory.h"
#include "kvq/model_shape.h"
#include "kvq/units.h"

namespace kvq::cli {
namespace {

struct PlanOptions {
  SharedOptions shared;  // --context list, budgets, --json
  int64_t layers = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  std::string format = "f16";             // the spec RunPlan plans
  std::vector<std::string> formats = {"f16"};  // --format: one plan per spec, in order
  bool json_lines = false;  // several specs with --json: each plan one compact line (JSON Lines)
  int64_t kv_bytes = 0;      // 0: not given
  int64_t weight_bytes = 0;  // 0: not given
  int64_t page = 256;
  AutoPlanOptions automatic;  // --auto and its flags
};

struct CeilingRow {
  std::optional<int64_t> context;  // absent when KV bytes were given directly
  int64_t kv_bytes;
  int64_t weight_bytes;
};

int RunPlan(const PlanOptions& given) {
  auto bad = [](const std::string& m) { return BadInput("plan", m); };
  PlanOptions o = given;
  // -m without --auto: the model file's KV shape (kvq/model_shape.h: its metadata and tensor table only).
  std::optional<ModelFile> model_file;
  const ModelShape* model = nullptr;
  if (!o.shared.model.empty()) {
    if (o.layers != 0 || o.kv_heads != 0 || o.head_dim != 0) {
      return bad("-m takes the shape from the model file: leave out --layers, --kv-heads and --head-dim");
    }
    Result<ModelFile> file = ModelFile::Read(o.shared.model);
    if (!file.ok()) {
      fmt::print(stderr, "kvq plan: error: -m {}: {}\n", o.shared.model, file.status().message());
      return 1;
    }
    model_file = std::move(file).value();
    model = &model_file->shape();
    o.layers = model->n_attention_layers;
    o.kv_heads = model->n_kv_heads;
    o.head_dim = model->head_dim;
  }
  if (model && o.shared.contexts.empty() && o.kv_bytes == 0) {
    if (model->trained_context <= 0) {
      return bad(fmt::format("-m {}: the file states no context length; give --context N", o.shared.model));
    }
    o.shared.contexts = {model->trained_context};  // the model's own context, as kvq run sizes it
  }
  const std::vector<int64_t>& contexts = o.shared.contexts;
  if (o.layers == 0 || o.kv_heads == 0 || o.head_dim == 0) {
    return bad("give the shape: --layers, --kv-heads and --head-dim, or -m MODEL (or --auto -m MODEL to plan "
               "a model's specs)");
  }
  if (o.layers <= 0) return bad(fmt::format("--layers must be positive (got {})", o.layers));
  if (o.kv_heads <= 0 || o.kv_heads > INT32_MAX) {
    return bad(fmt::format("--kv-heads must be in 1..{} (got {})", INT32_MAX, o.kv_heads));
  }
  const Result<KvSpec> spec = ParseKvSpec(o.format);
  if (!spec.ok()) return bad("--format: " + spec.status().message());
  const FormatDesc* const* format = &spec->format;  // the element format: per-position costs, ceilings
  const std::string spec_name = KvSpecName(*spec);
  const LayerFormats layer = LayerFormats::Both(*spec);
  const KvShape shape{.n_layers = o.layers, .n_kv_heads = static_cast<int32_t>(o.kv_heads),
                      .head_dim = static_cast<int32_t>(o.head_dim)};
  const Result<KvMemory> mem = PlanKvMemory(**format, shape);
  if (!mem.ok()) return bad(mem.status().message());
  if (Status s = CheckKvSpec(*spec, shape.row()); !s.ok()) return bad("--format: " + s.message());
  if (contexts.empty() && o.kv_bytes == 0) {
    return bad("give --context N[,N...] (positions to size), or --kv-bytes with --weight-bytes");
  }
  // Exact totals of the spec: the format's blocks, f32 residual and sink rows, per-tensor state.
  std::vector<std::pair<int64_t, int64_t>> totals;  // (context, total bytes)
  // What int8 with the same transforms would save at each context (seed 002's "8-bit saves"),
  // shown when int8 is the smaller: [contexts.size()], else empty.
  std::vector<int64_t> int8_saves;
  KvSpec int8_spec = *spec;
  int8_spec.format = *FindFormat("int8");
  const LayerFormats int8_layer = LayerFormats::Both(int8_spec);
  for (int64_t n : contexts) {
    const Result<int64_t> total = KvBytesForContext(std::span(&layer, 1), shape, n);
    if (!total.ok()) return bad("--context: " + total.status().message());
    totals.emplace_back(n, *total);
    const Result<int64_t> int8_total = KvBytesForContext(std::span(&int8_layer, 1), shape, n);
    if (int8_total.ok() && *int8_total < *total) int8_saves.push_back(*total - *int8_total);
  }
  if (int8_saves.size() != totals.size()) int8_saves.clear();

  // Tiers: with any budget flag, where the cache for the largest context would live.
  std::optional<KvTierPlan> tiers;
  const KvBudgets& budgets = o.shared.budgets;
  if (budgets.device_bytes != 0 || budgets.host_bytes != 0 || !budgets.disk_dir.empty()) {
    if (contexts.empty()) return bad("budgets need --context (the context to plan the tiers for)");
    const int64_t largest = *std::max_element(contexts.begin(), contexts.end());
    const int32_t page = static_cast<int32_t>(std::clamp<int64_t>(o.page, 0, INT32_MAX));
    // A model's cache as its sessions get it (a hybrid's state is host memory too); a shape's by hand.
    const KvOptions kv{.key_format = KvSpecName(layer.Key()), .value_format = KvSpecName(layer.Value()),
                       .budgets = budgets, .page_positions = page};
    Result<KvCacheConfig> config =
        model ? model_file->CacheConfig(largest, kv)
              : Result<KvCacheConfig>(KvCacheConfig{.n_layers = o.layers, .n_kv_heads = shape.n_kv_heads,
                                                    .head_dim = shape.head_dim, .layers = {layer},
                                                    .max_positions = largest, .page_positions = page,
                                                    .budgets = budgets});
    if (!config.ok()) return bad(config.status().message());
    const Result<KvTierPlan> plan = KvCache::Plan(*config);
    if (!plan.ok()) return bad(plan.status().message());
    tiers = *plan;
  }

  std::vector<CeilingRow> ceiling_rows;
  if (o.kv_bytes != 0 && o.weight_bytes == 0) {
    return bad("--kv-bytes needs --weight-bytes (the weight bytes read per decode step)");
  }
  if (o.weight_bytes != 0) {
    if (o.kv_bytes != 0) {
      ceiling_rows.push_back({std::nullopt, o.kv_bytes, o.weight_bytes});
    } else {
      for (auto [n, total] : totals) ceiling_rows.push_back({n, total, o.weight_bytes});
    }
  }

  // Each format's bytes as a fraction of the plan's format (the reference for ceilings).
  struct Ratio {
    const FormatDesc* format;
    double bytes_ratio;
  };
  std::vector<Ratio> ratios;
  for (const FormatDesc* f : Formats()) {
    const Result<KvMemory> m = PlanKvMemory(*f, shape);
    if (m.ok()) {
      ratios.push_back({f, static_cast<double>(m->bytes_per_layer_position) /
                               static_cast<double>(mem->bytes_per_layer_position)});
    }
  }
  const double f16_bytes = 4.0 * static_cast<double>(shape.row().elems());  // K + V, 2 B each

  if (o.shared.json) {
    nlohmann::json out = {
        {"format", spec_name},
        {"transforms", {{"rot", spec->transforms.rotate}, {"sinks", spec->transforms.sinks},
                        {"residual", spec->transforms.residual}}},
        {"layers", o.layers},
        {"kv_heads", o.kv_heads},
        {"head_dim", o.head_dim},
        {"key_bytes_per_layer_position", mem->key_bytes_per_layer_position},
        {"value_bytes_per_layer_position", mem->value_bytes_per_layer_position},
        {"bytes_per_layer_position", mem->bytes_per_layer_position},
        {"bytes_per_token", mem->bytes_per_token},
        {"fixed_bytes", mem->fixed_bytes},
        {"bits_per_number", mem->bits_per_number},
        {"memory_vs_f16", static_cast<double>(mem->bytes_per_layer_position) / f16_bytes},
        {"contexts", nlohmann::json::array()}};
    for (size_t i = 0; i < totals.size(); ++i) {
      const auto [n, total] = totals[i];
      nlohmann::json row = {{"context", n}, {"total_bytes", total},
                            {"bits_per_number", *KvBitsPerNumber(std::span(&layer, 1), shape, n)}};
      if (!int8_saves.empty()) row["int8_saves_bytes"] = int8_saves[i];
      out["contexts"].push_back(row);
    }
    if (model) {
      out["model"] = {{"path", o.shared.model}, {"arch", model->architecture}, {"layers", model->n_layers},
                      {"attention_layers", model->n_attention_layers},
                      {"recurrent_layers", model->n_layers - model->n_attention_layers},
                      {"state_bytes_per_sequence", model->state_bytes}};
    }
    if (!ceiling_rows.empty()) {
      out["ceiling"] = nlohmann::json::array();
      for (const CeilingRow& row : ceiling_rows) {
        const double share = static_cast<double>(row.kv_bytes) /
                             (static_cast<double>(row.kv_bytes) + static_cast<double>(row.weight_bytes));
        nlohmann::json r = {{"reference", (*format)->name}, {"kv_bytes", row.kv_bytes},
                            {"weight_bytes", row.weight_bytes}, {"kv_share", share},
                            {"formats", nlohmann::json::array()}};
        r["context"] = row.context ? nlohmann::json(*row.context) : nlohmann::json(nullptr);
        for (const Ratio& ratio : ratios) {
          r["formats"].push_back({{"format", ratio.format->name},
                                  {"bytes_ratio", ratio.bytes_ratio},
                                  {"ceiling", SpeedupCeiling(share, ratio.bytes_ratio)}});
        }
        out["ceiling"].push_back(r);
      }
    }
    if (tiers) {
      out["tiers"] = {{"total_bytes", tiers->total_bytes}, {"slot_bytes", tiers->slot_bytes},
                      {"device_slots", tiers->device_slots}, {"device_bytes", tiers->device_bytes},
                      {"device_positions", tiers->device_positions}, {"host_bytes", tiers->host_bytes},
                      {"state_bytes", tiers->state_bytes},
                      {"host_positions", tiers->host_positions}, {"disk_bytes", tiers->disk_bytes},
                      {"disk_positions", tiers->disk_positions}};
    }
    if (o.json_lines) {
      fmt::print("{}\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    } else {
      PrintJson(out);
    }
    return 0;
  }

  if (model) {
    fmt::print("Model {} ({}): {} layers, {} with a KV cache{}\n", o.shared.model, model->architecture,
               model->n_layers, model->n_attention_layers,
               model->n_attention_layers < model->n_layers
                   ? fmt::format(", {} recurrent (Gated DeltaNet) with a fixed state", model->n_layers - model->n_attention_layers)
                   : "");
  }
  fmt::print("KV cache: {} layers x {} KV heads x head_dim {}, format {}\n", o.layers, o.kv_heads,
             o.head_dim, spec_name);
  fmt::print("  K: {}; {}\n", (*format)->key.element, (*format)->key.scale);
  fmt::print("  V: {}; {}\n", (*format)->value.element, (*format)->value.scale);
  fmt::print("  bytes per layer-position  {} (K {} + V {})\n",
             FormatCount(mem->bytes_per_layer_position),
             FormatCount(mem->key_bytes_per_layer_position),
             FormatCount(mem->value_bytes_per_layer_position));
  fmt::print("  bytes per token           {}\n", FormatCount(mem->bytes_per_token));
  fmt::print("  bits per number           {:.4g} ({:.1f}% of f16)\n", mem->bits_per_number,
             100.0 * static_cast<double>(mem->bytes_per_layer_position) / f16_bytes);
  if (mem->fixed_bytes > 0) {
    fmt::print("  fixed bytes               {} (per-tensor scales)\n", FormatCount(mem->fixed_bytes));
  }
  if (*(*format)->note != '\0') fmt::print("  note: {}\n", (*format)->note);
  if (spec->transforms.any()) {
    const KvTransforms& t = spec->transforms;
    fmt::print("  transforms                {}{}{} (K and V); the totals count their f32 rows\n",
               t.rotate ? "rotation (no bytes)" : "",
               t.sinks > 0 ? fmt::format("{}{} sink rows in f32", t.rotate ? ", " : "", t.sinks) : "",
               t.residual > 0 ? fmt::format("{}newest {} rows in f32", t.rotate || t.sinks > 0 ? ", " : "", t.residual)
                              : "");
  }
  if (!totals.empty()) {
    fmt::print("\n  {:>12}  {:>22}  {:>12}  {:>11}{}\n", "context", "total bytes", "", "bits/number",
               int8_saves.empty() ? "" : fmt::format("  {:>12}", "int8 saves"));
    for (size_t i = 0; i < totals.size(); ++i) {
      const auto [n, total] = totals[i];
      fmt::print("  {:>12}  {:>22}  {:>12}  {:>11.4f}{}\n", FormatCount(n), FormatCount(total),
                 FormatBytesIec(total), *KvBitsPerNumber(std::span(&layer, 1), shape, n),
                 int8_saves.empty() ? "" : fmt::format("  {:>12}", FormatBytesIec(int8_saves[i])));
    }
  }
  if (model && model->state_bytes > 0) {
    fmt::print("\n  fixed state per sequence  {} bytes ({}), f32: the {} recurrent layers' conv and delta-rule\n"
               "  state, the same at every context (held beside the KV; not in the totals above)\n",
               FormatCount(model->state_bytes), FormatBytesIec(model->state_bytes),
               model->n_layers - model->n_attention_layers);
  }
  if (tiers) fmt::print("\nTiers at {} positions: {}\n", *std::max_element(contexts.begin(), contexts.end()), tiers->Describe());
  for (const CeilingRow& row : ceiling_rows) {
    const double share = static_cast<double>(row.kv_bytes) /
                         (static_cast<double>(row.kv_bytes) + static_cast<double>(row.weight_bytes));
    fmt::print("\nDecode-speed ceiling against {}{}: KV {} B + weights {} B read per step, "
               "KV share {:.1f}%\n",
               (*format)->name, row.context ? fmt::format(" at {} positions", FormatCount(*row.context)) : "",
               FormatCount(row.kv_bytes), FormatCount(row.weight_bytes), 100.0 * share);
    fmt::print("  (1 / (1 - kv_share x (1 - r)): an upper bound, dequantisation assumed free)\n");
    fmt::print("  {:<10} {:>12} {:>9}\n", "format", "bytes ratio", "ceiling");
    for (const Ratio& ratio : ratios) {
      fmt::print("  {:<10} {:>12.4f} {:>8.3f}x\n", ratio.format->name, ratio.bytes_ratio,
                 SpeedupCeiling(share, ratio.bytes_ratio));
    }
  }
  return 0;
}

}  // namespace

void AddPlanCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "KV memory for a model shape and KV spec; with --weight-bytes, KV share and ceilings;\n"
              "with --auto, KV specs per layer chosen from a model's measured fidelity under a budget");
  CLI::Option* layers = cmd->add_option("--layers", o->layers, "Layers that hold a KV cache");
  CLI::Option* heads = cmd->add_option("--kv-heads", o->kv_heads, "KV heads per layer");
  CLI::Option* dim = AddHeadDimFlag(cmd, &o->head_dim);
  CLI::Option* format = cmd->add_option("--format,--formats", o->formats,
                                        "KV specs, FORMAT[+rot][+sinkN][+resN] (see `kvq formats`), "
                                        "comma-separated: one plan each, in order (with --json, one "
                                        "object per line); a spec's element format is the reference for "
                                        "its ceilings")
      ->delimiter(',')
      ->check(KvFormatName())
      ->type_name("SPEC")
      ->capture_default_str();
  // No upper bound here: KvBytesForContext refuses a context whose bytes overflow, naming it.
  AddContextListFlag(cmd, &o->shared, "--context", "Positions to size, comma-separated (default with -m: the model's context)", 1, INT64_MAX);
  AddByteSizeFlag(cmd, "--kv-bytes", &o->kv_bytes,
                  "KV bytes read per decode step in --format (e.g. 718MB), for the KV share");
  AddByteSizeFlag(cmd, "--weight-bytes", &o->weight_bytes,
                  "Weight bytes read per decode step (e.g. 566MB, 1.2GiB)");
  AddBudgetFlags(cmd, &o->shared, "Plan tiers: ");
  cmd->add_option("--page", o->page, "Positions per cache page (multiple of 32)")->capture_default_str();
  AddJsonFlag(cmd, &o->shared, "Print JSON (exact integers) instead of a table");
  CLI::Option* automatic = AddAutoPlanFlags(cmd, &o->shared, &o->automatic);
  for (CLI::Option* shape_flag : {layers, heads, dim, format}) automatic->excludes(shape_flag);
  cmd->callback([o, exit_code] {
    if (o->automatic.enabled) {
      *exit_code = RunAutoPlan(o->shared, o->automatic);
      return;
    }
    for (size_t i = 0; i < o->formats.size(); ++i) {
      if (i > 0 && !o->shared.json) fmt::print("\n");
      PlanOptions one = *o;
      one.format = o->formats[i];
      one.json_lines = o->formats.size() > 1;
      if ((*exit_code = RunPlan(one)) != 0) return;
    }
  });
}

}  // namespace kvq::cli
