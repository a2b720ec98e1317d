// AutoPlanModel (see auto_plan.h): the loaded model's weights on a forward pass of their own.
#include "plan_search/auto_plan.h"

#include "api/api_internal.h"
#include "measure/kv_plan_auto.h"

namespace kvq {

Result<AutoPlanResult> AutoPlanModel(const Model& model, std::span<const int32_t> tokens,
                                     const AutoPlanConfig& config,
                                     const std::function<void(const std::string&)>& progress) {
  const Model::Impl& m = model.impl();
  DecoderModel forward(m.weights, m.info.threads);  // a copy of the weight views, as a Session's
  return AutoPlan(forward, tokens, model.fingerprint(), config, progress);
}

}  // namespace kvq
