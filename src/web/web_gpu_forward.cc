// The WebGPU path's boundary (docs/architecture.md, "The WebAssembly module's boundary"): the
// step program of a loaded model (web/gpu_program.h) for the page to run with its WGSL kernels
// (web/gpu/step_program.js), and the RoPE cos/sin of a position, computed here by kvq's
// RopeCosSin so the GPU rotates by the bits the CPU forward does. The KV cache the program's
// attention ops use is kvq_web_kv_new_for_model's (web_kv.cc).
#include <emscripten/emscripten.h>

#include <vector>

#include "api/api_internal.h"
#include "model/decoder.h"
#include "web/gpu_program.h"
#include "web/web_common.h"

using kvq_web::Fail;
using kvq_web::ModelOf;

extern "C" {

// {config, tensors, buffers, ops} (web/gpu_program.h), or 0 with kvq_web_last_error saying why the
// GPU path cannot run this model. Valid while the model lives.
EMSCRIPTEN_KEEPALIVE const char* kvq_web_gpu_program(int model) {
  kvq_web::WebModel* m = ModelOf(model);
  if (m->gpu_program_json.empty()) {
    const kvq::Model::Impl& impl = m->model->impl();
    // A header-only load's weights are views of the GGUF header it mapped (DecoderWeights::storage).
    const kvq::GgufFile* header =
        impl.header_only ? std::static_pointer_cast<const kvq::GgufFile>(impl.weights.storage).get() : nullptr;
    kvq::Result<kvq_web::GpuProgram> p = kvq_web::BuildGpuProgram(impl.weights, header);
    if (!p.ok()) {
      Fail(p.status().message());
      return nullptr;
    }
    m->gpu_program_json = kvq_web::GpuProgramJson(*p);
  }
  return m->gpu_program_json.c_str();
}

// cos_sin [rotary_dims / 2][2]: what the model's ApplyRope rotates pair i by at `pos`.
EMSCRIPTEN_KEEPALIVE int kvq_web_gpu_rope(int model, double pos, float* cos_sin) {
  const kvq::DecoderConfig& c = ModelOf(model)->model->impl().weights.config;
  if (!(pos >= 0) || pos > 9.0e15) return Fail("rope: the position must be a non-negative integer");
  kvq::RopeCosSin(c.head_dim(), static_cast<int64_t>(pos), kvq::ModelRopeParams(c), cos_sin);
  return 0;
}

}  // extern "C"
