// DefaultKvPlanCandidates (see kv_plan_search.h).
#include "plan/kv_plan_search.h"

namespace kvq {

std::vector<KvSpec> DefaultKvPlanCandidates() {
  std::vector<KvSpec> out;
  for (const char* name : {"int8", "fp8-e4m3", "int4", "int4+rot", "int4+rot+sink4", "int4-kivi", "int4-kivi+sink4",
                           "fp4-e2m1", "int2", "int2+rot", "int2+rot+sink4", "int2-kivi", "int2-kivi+sink4",
                           "int2-kivi+rot+sink4"}) {
    out.push_back(*ParseKvSpec(name));
  }
  return out;
}

}  // namespace kvq
