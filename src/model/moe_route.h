// The routing rule of a mixture-of-experts feed-forward (MoeRows, moe.h): which experts a row runs
// and with what weights, on its own for what must reproduce it (the WebGPU routing is tested
// against it through src/web/web_moe.cc).
#pragma once

#include <cstdint>

namespace kvq {

/// The routing of one row: `probs` [n_experts] holds the router's logits and is left holding their
/// softmax; `order` [n_experts] is scratch; `chosen` [k] gets the k most probable experts, most
/// probable first, ties to the lower expert index; `weights` [k] their probabilities divided by
/// the chosen ones' sum (added in rank order). Not a softmax of the top k.
void RouteRow(float* probs, int64_t n_experts, int64_t k, int32_t* order, int32_t* chosen, float* weights);

}  // namespace kvq
