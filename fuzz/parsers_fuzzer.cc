// Fuzz target: the text parsers kvq takes from users and files, each given the whole input: byte
// sizes (ParseByteSize: --device-mem, --host-mem, ...), KV specs (ParseKvSpec: --kv, --kv-k, plan
// layers, snapshot names) and plan files (ReadKvPlan: --kv-plan), and the first 8 bytes as an int64
// through FormatCount and FormatBytesIec. Properties: an accepted size is
// positive; an accepted spec prints canonically and parses back to itself; an accepted plan prints
// (KvPlanJson) and parses back with the same model, positions and layers.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "kvq/kv_spec.h"
#include "kvq/units.h"
#include "plan/kv_plan.h"

namespace kvq::fuzz {

namespace {

void CheckByteSize(std::string_view text) {
  Result<int64_t> bytes = ParseByteSize(text);
  if (!bytes.ok()) return;
  if (*bytes <= 0) Fail("parsers", "ParseByteSize accepted a size <= 0");
  (void)FormatCount(*bytes);
  (void)FormatBytesIec(*bytes);
}

void CheckSpec(std::string_view text) {
  Result<KvSpec> spec = ParseKvSpec(text);
  if (!spec.ok()) return;
  const std::string name = KvSpecName(*spec);
  Result<KvSpec> again = ParseKvSpec(name);
  if (!again.ok() || !(*again == *spec)) Fail("parsers", "ParseKvSpec(KvSpecName(s)) != s for " + name);
  (void)CheckKvSpec(*spec, RowShape{.n_kv_heads = 2, .head_dim = 8});
  (void)CheckValueSpec(*spec, RowShape{.n_kv_heads = 3, .head_dim = 6});
}

void CheckPlan(const uint8_t* data, size_t size) {
  const std::string path = WriteInput(data, size, "plan.json");
  // The bundled plan's model (data/plans/stories260K-4.5bits.json), so a mutated seed gets past
  // the model check.
  const ModelFingerprint model{.n_layers = 5, .n_kv_heads = 4, .head_dim = 8, .weights_hash = 0x9cbb112387575cfcull};
  Result<KvPlan> plan = ReadKvPlan(path, model);
  if (!plan.ok()) {
    // The parser alone (any model): what ReadKvPlan refused may still parse.
    plan = ParseKvPlan(std::string_view(reinterpret_cast<const char*>(data), size));
    if (!plan.ok()) return;
  }
  (void)CheckKvPlanBits(*plan, 4.5);
  (void)plan->budget.Describe();
  Result<KvPlan> again = ParseKvPlan(KvPlanJson(*plan));
  if (!again.ok()) Fail("parsers", "a parsed plan does not parse back: " + again.status().message());
  if (!(again->model == plan->model) || again->positions != plan->positions || again->layers != plan->layers) {
    Fail("parsers", "ParseKvPlan(KvPlanJson(p)) holds another model, length or layers");
  }
}

}  // namespace

int FuzzParsers(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (size >= 8) {
    // The printers take any int64 (counts and sizes in messages may come straight from a file).
    int64_t n = 0;
    std::memcpy(&n, data, 8);
    (void)FormatCount(n);
    (void)FormatBytesIec(n);
  }
  CheckByteSize(text);
  CheckSpec(text);
  CheckPlan(data, size);
  return 0;
}

}  // namespace kvq::fuzz

KVQ_FUZZ_TARGET(FuzzParsers)
