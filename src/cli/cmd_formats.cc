// `kvq formats`: the format registry with each format's exact cost at a given head layout.
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/json_output.h"
#include "cli/flags.h"
#include "kvq/attention.h"
#include "kvq/format.h"
#include "kvq/kv_memory.h"
#include "kvq/kv_spec.h"

namespace kvq::cli {
namespace {

struct FormatsOptions {
  SharedOptions shared;  // --json
  int64_t head_dim = 128;
  int64_t kv_heads = 8;
};

nlohmann::json CodecJson(const Codec& c, RowShape shape, bool usable) {
  nlohmann::json j = {{"element", c.element}, {"scale", c.scale}, {"layout", c.layout},
                      {"rows_per_block", c.rows_per_block}};
  if (usable) {
    j["bits_per_number"] = BitsPerNumber(c, shape);
    j["block_bytes"] = c.block_bytes(shape);
  }
  return j;
}

int RunFormats(const FormatsOptions& o) {
  if (o.kv_heads <= 0 || o.kv_heads > 1 << 20) {
    return BadInput("formats", fmt::format("--kv-heads must be in 1..{} (got {})", 1 << 20,
                                           o.kv_heads));
  }
  const KvShape shape{.n_layers = 1, .n_kv_heads = static_cast<int32_t>(o.kv_heads),
                      .head_dim = static_cast<int32_t>(o.head_dim)};
  const double f16_bytes = static_cast<double>(PlanKvMemory(**FindFormat("f16"), shape)
                                                   ->bytes_per_layer_position);
  nlohmann::json list = nlohmann::json::array();
  if (!o.shared.json) {
    fmt::print("KV formats at {} KV heads x head_dim {} (SIMD target here: {})\n\n", o.kv_heads,
               o.head_dim, AttentionSimdTarget());
    fmt::print("{:>3}  {:<10} {:>20}  {:>8}  {}\n", "id", "name", "bits/number", "of f16",
               "element; scale");
  }
  for (const FormatDesc* f : Formats()) {
    const Result<KvMemory> m = PlanKvMemory(*f, shape);
    nlohmann::json j = {{"id", static_cast<int>(f->id)}, {"name", f->name},
                        {"summary", f->summary}, {"note", f->note}, {"usable", m.ok()}};
    j["key"] = CodecJson(f->key, shape.row(), m.ok());
    j["value"] = CodecJson(f->value, shape.row(), m.ok());
    if (m.ok()) {
      j["bits_per_number"] = m->bits_per_number;
      j["memory_vs_f16"] = static_cast<double>(m->bytes_per_layer_position) / f16_bytes;
    } else {
      j["why_not"] = m.status().message();
    }
    list.push_back(j);
    if (o.shared.json) continue;
    const std::string what =
        std::string_view(f->key.element) == f->value.element &&
                std::string_view(f->key.scale) == f->value.scale
            ? fmt::format("{}; {}", f->key.element, f->key.scale)
            : fmt::format("K {}; {} | V {}; {}", f->key.element, f->key.scale, f->value.element,
                          f->value.scale);
    if (!m.ok()) {
      fmt::print("{:>3}  {:<10} {:>20}  {:>8}  {}\n", static_cast<int>(f->id), f->name, "n/a", "",
                 m.status().message());
      continue;
    }
    const double kb = BitsPerNumber(f->key, shape.row()), vb = BitsPerNumber(f->value, shape.row());
    const std::string bits =
        kb == vb ? fmt::format("{:.4g}", kb) : fmt::format("{:.4g} (K {:.4g}, V {:.4g})",
                                                           m->bits_per_number, kb, vb);
    fmt::print("{:>3}  {:<10} {:>20}  {:>7.1f}%  {}\n", static_cast<int>(f->id), f->name, bits,
               100.0 * j["memory_vs_f16"].get<double>(), what);
  }
  if (o.shared.json) {
    nlohmann::json transforms = nlohmann::json::array();
    for (const auto& [name, what] : std::initializer_list<std::pair<const char*, const char*>>{
             {"rot", "randomized Hadamard rotation of each head before quantising"},
             {"sinkN", "the first N positions also kept in f32"},
             {"resN", "the newest N positions kept in f32, encoded as they age out"}}) {
      transforms.push_back({{"name", name}, {"summary", what}});
    }
    nlohmann::json out = {{"kv_heads", o.kv_heads}, {"head_dim", o.head_dim},
                          {"simd_target", AttentionSimdTarget()}, {"formats", list},
                          {"spec_grammar", "FORMAT[+TRANSFORM...]"}, {"transforms", transforms}};
    PrintJson(out);
    return 0;
  }
  fmt::print("\nByte layouts (full diagrams beside the code in src/format/<name>/):\n");
  for (const FormatDesc* f : Formats()) {
    if (std::string_view(f->key.layout) == f->value.layout) {
      fmt::print("  {:<10} {}\n", f->name, f->key.layout);
    } else {
      fmt::print("  {:<10} K: {}\n  {:<10} V: {}\n", f->name, f->key.layout, "", f->value.layout);
    }
    if (*f->note != '\0') fmt::print("  {:<10} note: {}\n", "", f->note);
  }
  fmt::print("\nTransforms: a KV spec is FORMAT[+TRANSFORM...] (e.g. int4+rot, int2-kivi+sink4+res64), "
             "wherever a format is taken (--kv, --kv-k, --kv-v, --format):\n{}",
             TransformsHelp());
  return 0;
}

}  // namespace

void AddFormatsCommand(CLI::App& app, int* exit_code) {
  auto options = std::make_shared<FormatsOptions>();
  CLI::App* cmd = app.add_subcommand("formats", "List the KV number formats and their exact cost");
  AddHeadDimFlag(cmd, &options->head_dim);
  cmd->add_option("--kv-heads", options->kv_heads, "KV heads per row")->capture_default_str();
  AddJsonFlag(cmd, &options->shared);
  cmd->callback([options, exit_code] { *exit_code = RunFormats(*options); });
}

}  // namespace kvq::cli
