// The mixture-of-experts feed-forward at the module's boundary, for the page's tests of the GPU's
// MoE ops (tests/web/gpu/gpu_moe_page.js): kvq's routing of given logits (RouteRow), a layer's MoE
// feed-forward as DecoderModel runs it for one row, and that layer's step-program ops alone.
#include <emscripten/emscripten.h>

#include <algorithm>
#include <string>
#include <vector>

#include "api/api_internal.h"
#include "base/thread_pool.h"
#include "model/moe.h"
#include "model/moe_route.h"
#include "web/gpu_moe.h"
#include "web/web_common.h"
#include "weights/matvec.h"
#include "weights/ops.h"

using kvq_web::Fail;
using kvq_web::ModelOf;

extern "C" {

// RouteRow of logits [n_experts]: probs [n_experts] their softmax, chosen [k] the experts, weights
// [k] theirs. 0, or -1 with kvq_web_last_error.
EMSCRIPTEN_KEEPALIVE int kvq_web_moe_route(const float* logits, int n_experts, int k, float* probs, int* chosen,
                                           float* weights) {
  if (n_experts <= 0 || k <= 0 || k > n_experts) {
    return Fail("moe_route: needs 0 < k <= n_experts (k " + std::to_string(k) + ", n_experts " +
                std::to_string(n_experts) + ")");
  }
  std::vector<int32_t> order(n_experts);
  std::copy_n(logits, n_experts, probs);
  kvq::RouteRow(probs, n_experts, k, order.data(), chosen, weights);
  return 0;
}

// Layer `layer`'s MoE feed-forward of one normed row xb [dim] as DecoderModel::ForwardBatch runs
// it (the shared expert's MatVecs and SwiGLU, then MoeRows): out [dim] (before the residual add),
// chosen [k] the experts MoeRows chose. 0, or -1 with kvq_web_last_error.
EMSCRIPTEN_KEEPALIVE int kvq_web_moe_ffn(int model, int layer, const float* xb, float* out, int* chosen) {
  const kvq::DecoderWeights& w = ModelOf(model)->model->impl().weights;
  const kvq::DecoderConfig& c = w.config;
  if (c.moe.n_experts <= 0 || layer < 0 || layer >= c.n_layers) {
    return Fail("moe_ffn: layer " + std::to_string(layer) + " of this " + c.arch + " model has no MoE feed-forward");
  }
  const kvq::LayerWeights& L = w.layers[layer];
  kvq::ThreadPool pool(1);
  std::vector<float> gate(c.hidden_dim), up(c.hidden_dim), shared(c.dim);  // [hidden], [hidden], [dim]
  kvq::MatVec(L.w1, xb, gate.data(), pool);
  kvq::MatVec(L.w3, xb, up.data(), pool);
  kvq::SwiGlu(gate.data(), up.data(), c.hidden_dim);
  kvq::MatVec(L.w2, gate.data(), shared.data(), pool);
  kvq::MoeScratch scratch;
  kvq::MoeRows(c, L, xb, 1, shared.data(), out, &scratch, pool);
  std::copy_n(scratch.chosen.data(), c.moe.n_experts_used, chosen);
  return 0;
}

// Layer `layer`'s MoE feed-forward ops alone (BuildMoeFfnProgram) as step-program JSON, or 0 with
// kvq_web_last_error. Valid until the next call.
EMSCRIPTEN_KEEPALIVE const char* kvq_web_gpu_moe_program(int model, int layer) {
  static std::string json;
  kvq::Result<kvq_web::GpuProgram> p = kvq_web::BuildMoeFfnProgram(ModelOf(model)->model->impl().weights, layer);
  if (!p.ok()) {
    Fail(p.status().message());
    return nullptr;
  }
  json = kvq_web::GpuProgramJson(*p);
  return json.c_str();
}

}  // extern "C"
