// Plan files (see kv_plan.h): written and read with nlohmann-json without exceptions (parse with
// allow_exceptions = false, every field's type checked before it is read), so a damaged file is an
// error that names what was wrong, never a crash.
#include "plan/kv_plan.h"

#include <fmt/core.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kvq/units.h"

namespace kvq {
namespace {

using nlohmann::json;

std::string HashText(uint64_t h) { return fmt::format("{:016x}", h); }

std::string DescribeModel(const ModelFingerprint& m) {
  return fmt::format("{} layers x {} KV heads x head_dim {}, weights {}", m.n_layers, m.n_kv_heads, m.head_dim,
                     HashText(m.weights_hash));
}

// A field of `object` that must be present with a JSON type `is` accepts; `where` names it.
Result<const json*> Field(const json& object, const char* key, bool (json::*is)() const noexcept,
                          const char* expected, const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end()) return Status::Error(fmt::format("{}: no \"{}\" (expected {})", where, key, expected));
  if (!((*it).*is)()) {
    return Status::Error(fmt::format("{}: \"{}\" is {} (expected {})", where, key, it->dump(), expected));
  }
  return &*it;
}

Result<int64_t> IntField(const json& object, const char* key, const std::string& where, int64_t min) {
  const Result<const json*> f = Field(object, key, &json::is_number_integer, "an integer", where);
  if (!f.ok()) return f.status();
  const int64_t v = (*f)->is_number_unsigned() && (*f)->get<uint64_t>() > INT64_MAX ? -1 : (*f)->get<int64_t>();
  if (v < min) return Status::Error(fmt::format("{}: \"{}\" is {} (expected at least {})", where, key, (*f)->dump(), min));
  return v;
}

Result<double> NumberField(const json& object, const char* key, const std::string& where) {
  const Result<const json*> f = Field(object, key, &json::is_number, "a number", where);
  if (!f.ok()) return f.status();
  return (*f)->get<double>();
}

Result<KvSpec> SpecField(const json& layer, const char* key, size_t index) {
  const std::string where = fmt::format("layers[{}]", index);
  const Result<const json*> f = Field(layer, key, &json::is_string, "a KV spec string", where);
  if (!f.ok()) return f.status();
  Result<KvSpec> spec = ParseKvSpec((*f)->get<std::string>());
  if (!spec.ok()) return Status::Error(fmt::format("{} \"{}\": {}", where, key, spec.status().message()));
  return spec;
}

}  // namespace

int64_t KvPlanBudget::Bytes(KvShape shape, int64_t positions) const {
  if (bytes_per_token > 0) return bytes_per_token * positions;
  const double numbers = 2.0 * static_cast<double>(shape.n_layers) * static_cast<double>(positions) *
                         static_cast<double>(shape.row().elems());
  return static_cast<int64_t>(std::floor(kv_bits * numbers / 8.0));
}

std::string KvPlanBudget::Describe() const {
  if (bytes_per_token > 0) return fmt::format("{} bytes per token", FormatCount(bytes_per_token));
  return fmt::format("{:g} bits per number", kv_bits);
}

std::string KvPlanJson(const KvPlan& p) {
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const LayerFormats& l : p.layers) layers.push_back({{"k", KvSpecName(l.Key())}, {"v", KvSpecName(l.Value())}});
  nlohmann::ordered_json budget = p.budget.bytes_per_token > 0 ? nlohmann::ordered_json{{"bytes_per_token", p.budget.bytes_per_token}}
                                             : nlohmann::ordered_json{{"kv_bits", p.budget.kv_bits}};
  const nlohmann::ordered_json out = {{"kvq_plan", 1},
                    {"model", {{"n_layers", p.model.n_layers}, {"n_kv_heads", p.model.n_kv_heads},
                               {"head_dim", p.model.head_dim}, {"weights_hash", HashText(p.model.weights_hash)}}},
                    {"positions", p.positions},
                    {"budget", budget},
                    {"layers", layers},
                    {"kv_bytes", p.kv_bytes},
                    {"bits_per_number", p.bits_per_number},
                    {"predicted_kl", p.predicted_kl},
                    {"measured_kl", p.measured_kl}};
  return out.dump(2) + "\n";
}

Result<KvPlan> ParseKvPlan(std::string_view text) {
  const json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::Error("not valid JSON (a damaged or truncated plan file?)");
  if (!j.is_object()) return Status::Error("not a kvq plan (expected a JSON object)");
  const Result<int64_t> version = IntField(j, "kvq_plan", "plan", 0);
  if (!version.ok()) return Status::Error(version.status().message() + " — not a kvq plan file?");
  if (*version != 1) return Status::Error(fmt::format("plan version {} (this kvq reads version 1)", *version));
  KvPlan p;
  const Result<const json*> model = Field(j, "model", &json::is_object, "an object", "plan");
  if (!model.ok()) return model.status();
  const Result<int64_t> layers = IntField(**model, "n_layers", "model", 1);
  const Result<int64_t> heads = IntField(**model, "n_kv_heads", "model", 1);
  const Result<int64_t> dim = IntField(**model, "head_dim", "model", 1);
  for (const Status& s : {layers.status(), heads.status(), dim.status()}) {
    if (!s.ok()) return s;
  }
  if (*heads > INT32_MAX || *dim > INT32_MAX) return Status::Error("model: n_kv_heads or head_dim out of range");
  const Result<const json*> hash = Field(**model, "weights_hash", &json::is_string, "16 hex digits", "model");
  if (!hash.ok()) return hash.status();
  const std::string h = (*hash)->get<std::string>();
  uint64_t hash_value = 0;
  bool hex = h.size() == 16;
  for (char ch : h) {
    const int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
    hex = hex && d >= 0;
    hash_value = hash_value << 4 | static_cast<uint64_t>(d < 0 ? 0 : d);
  }
  if (!hex) return Status::Error(fmt::format("model: \"weights_hash\" is \"{}\" (expected 16 lower-case hex digits)", h));
  p.model = {.n_layers = *layers, .n_kv_heads = static_cast<int32_t>(*heads),
             .head_dim = static_cast<int32_t>(*dim), .weights_hash = hash_value};
  const Result<int64_t> positions = IntField(j, "positions", "plan", 1);
  if (!positions.ok()) return positions.status();
  p.positions = *positions;
  const Result<const json*> budget = Field(j, "budget", &json::is_object, "an object", "plan");
  if (!budget.ok()) return budget.status();
  if ((*budget)->contains("bytes_per_token")) {
    const Result<int64_t> b = IntField(**budget, "bytes_per_token", "budget", 1);
    if (!b.ok()) return b.status();
    p.budget.bytes_per_token = *b;
  } else {
    const Result<double> b = NumberField(**budget, "kv_bits", "budget");
    if (!b.ok()) return Status::Error(b.status().message() + " or \"bytes_per_token\"");
    if (!(*b > 0)) return Status::Error(fmt::format("budget: \"kv_bits\" is {} (expected > 0)", *b));
    p.budget.kv_bits = *b;
  }
  const Result<const json*> list = Field(j, "layers", &json::is_array, "an array of {\"k\": SPEC, \"v\": SPEC}", "plan");
  if (!list.ok()) return list.status();
  for (size_t i = 0; i < (*list)->size(); ++i) {
    const json& layer = (**list)[i];
    if (!layer.is_object()) return Status::Error(fmt::format("layers[{}] is {} (expected {{\"k\": SPEC, \"v\": SPEC}})", i, layer.dump()));
    const Result<KvSpec> k = SpecField(layer, "k", i);
    if (!k.ok()) return k.status();
    const Result<KvSpec> v = SpecField(layer, "v", i);
    if (!v.ok()) return v.status();
    p.layers.push_back(LayerFormats::Of(*k, *v));
  }
  // The recorded figures are informational (CheckKvPlanBits recounts the bits); absent is 0.
  for (auto [key, out] : {std::pair{"bits_per_number", &p.bits_per_number}, std::pair{"predicted_kl", &p.predicted_kl},
                          std::pair{"measured_kl", &p.measured_kl}}) {
    if (!j.contains(key)) continue;
    const Result<double> v = NumberField(j, key, "plan");
    if (!v.ok()) return v.status();
    *out = *v;
  }
  if (j.contains("kv_bytes")) {
    const Result<int64_t> b = IntField(j, "kv_bytes", "plan", 0);
    if (!b.ok()) return b.status();
    p.kv_bytes = *b;
  }
  return p;
}

Status CheckKvPlanModel(const KvPlan& plan, const ModelFingerprint& model) {
  if (plan.model != model) {
    return Status::Error(fmt::format("the plan is for another model ({}); this model is {}", DescribeModel(plan.model),
                                     DescribeModel(model)));
  }
  if (static_cast<int64_t>(plan.layers.size()) != model.n_layers) {
    return Status::Error(fmt::format("the plan lists {} layers; the model has {}", plan.layers.size(), model.n_layers));
  }
  const RowShape row{.n_kv_heads = model.n_kv_heads, .head_dim = model.head_dim};
  for (size_t l = 0; l < plan.layers.size(); ++l) {
    for (const KvSpec& spec : {plan.layers[l].Key(), plan.layers[l].Value()}) {
      if (Status s = CheckKvSpec(spec, row); !s.ok()) return Status::Error(fmt::format("layers[{}]: {}", l, s.message()));
    }
  }
  return Status::Ok();
}

Status CheckKvPlanBits(const KvPlan& plan, double max_bits) {
  const KvShape shape{.n_layers = plan.model.n_layers, .n_kv_heads = plan.model.n_kv_heads,
                      .head_dim = plan.model.head_dim};
  const Result<double> bits = KvBitsPerNumber(plan.layers, shape, plan.positions);
  if (!bits.ok()) return bits.status();
  if (*bits > max_bits) {
    return Status::Error(fmt::format("the plan holds {:.4f} bits per number at its {} positions, over the budget of "
                                     "{:g} given", *bits, plan.positions, max_bits));
  }
  return Status::Ok();
}

Result<KvPlan> ReadKvPlan(const std::string& path, const ModelFingerprint& model) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error(fmt::format("{}: cannot open the plan file", path));
  std::stringstream text;
  text << in.rdbuf();
  Result<KvPlan> plan = ParseKvPlan(text.str());
  if (!plan.ok()) return Status::Error(fmt::format("{}: {}", path, plan.status().message()));
  if (Status s = CheckKvPlanModel(*plan, model); !s.ok()) return Status::Error(fmt::format("{}: {}", path, s.message()));
  return plan;
}

Status WriteKvPlan(const std::string& path, const KvPlan& plan) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << KvPlanJson(plan);
  out.close();
  if (!out.good()) return Status::Error(fmt::format("{}: cannot write the plan file", path));
  return Status::Ok();
}

}  // namespace kvq
