// The KV cache with a WebGPU device tier, for JS (the module's boundary, docs/architecture.md: ints, doubles and
// pointers; 0 / -1 on failure with kvq_web_last_error): a kvq::KvCache in this module's memory is
// the master copy (any format and transforms, encoded by kvq's codecs), and WebGpuKvDevice is its
// KvDevice (kvq/kv_device.h), forwarding each call to the JS object `Module.kvqDevice` (a
// web/gpu/kv_device.js GpuKvDevice the page made) — the cache's pages are written from this
// module's heap straight into the GPU slots. kvq_web_kv_rows gives the rows as attention reads
// them, through a KvDevice that decodes instead of attending, for a reference to compare with.
// kvq_web_kv_cpu_step runs a step of the model's C++ forward on the same cache: where the GPU
// path goes on when its device is lost and none comes back (web/gpu/gpu_engine.js).
#include <emscripten/emscripten.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvq/attention.h"
#include "kvq/format.h"
#include "kvq/kv_cache.h"
#include "kvq/kv_device.h"
#include "kvq/kv_spec.h"
#include "api/api_internal.h"
#include "formats/transforms/hadamard.h"
#include "model/cache_config.h"
#include "model/decoder.h"
#include "web/web_common.h"

// The JS side of WebGpuKvDevice: each returns 0, or 1 with the JS error kept for kvq_js_kv_error.
EM_JS(int, kvq_js_kv_begin, (const char* json), {
  try {
    Module.kvqDevice.Begin(JSON.parse(UTF8ToString(json)));
    return 0;
  } catch (e) {
    Module.kvqDeviceError = String(e);
    return 1;
  }
});
EM_JS(int, kvq_js_kv_upload, (int slot, const uint8_t* bytes, double n), {
  try {
    Module.kvqDevice.Upload(slot, HEAPU8.buffer, bytes, n);
    return 0;
  } catch (e) {
    Module.kvqDeviceError = String(e);
    return 1;
  }
});
EM_JS(int, kvq_js_kv_attend, (const char* json, const float* rope, int rope_floats), {
  try {
    Module.kvqDevice.Attend(JSON.parse(UTF8ToString(json)), HEAPF32.subarray(rope >> 2, (rope >> 2) + rope_floats));
    return 0;
  } catch (e) {
    Module.kvqDeviceError = String(e);
    return 1;
  }
});
EM_JS(int, kvq_js_kv_finish, (), {
  try {
    Module.kvqDevice.Finish();
    return 0;
  } catch (e) {
    Module.kvqDeviceError = String(e);
    return 1;
  }
});
// The kept JS error, in memory from malloc (the caller frees it).
EM_JS(char*, kvq_js_kv_error, (), {
  const text = 'WebGPU KV device: ' + (Module.kvqDeviceError || 'Module.kvqDevice is not set');
  const bytes = lengthBytesUTF8(text) + 1;
  const p = _malloc(bytes);
  stringToUTF8(text, p, bytes);
  return p;
});

namespace {

using kvq_web::Fail;

kvq::Status JsStatus(int rc) {
  if (rc == 0) return kvq::Status::Ok();
  char* text = kvq_js_kv_error();
  kvq::Status s = kvq::Status::Error(text);
  std::free(text);
  return s;
}

nlohmann::json TensorJson(const kvq::KvDeviceWindow::Tensor& t) {
  return {{"blocks_offset", t.blocks_offset}, {"head_offset", t.head_offset}, {"residual_offset", t.residual_offset},
          {"n_head", t.n_head}, {"n_block", t.n_block}};
}

class WebGpuKvDevice final : public kvq::KvDevice {
 public:
  kvq::Status Begin(const kvq::KvDeviceLayer& d) override {
    const kvq::RowShape shape{.n_kv_heads = d.n_kv_heads, .head_dim = d.head_dim};
    nlohmann::json j{{"layer", d.layer}, {"first_query_position", d.first_query_position}, {"n_tokens", d.n_tokens},
                     {"scale", d.scale}, {"softcap", d.softcap}, {"n_kv_heads", d.n_kv_heads},
                     {"head_dim", d.head_dim}, {"key_format", d.key_format->name},
                     {"value_format", d.value_format->name}, {"k_block_bytes", d.key_format->key.block_bytes(shape)},
                     {"v_block_bytes", d.value_format->value.block_bytes(shape)},
                     {"rotate_queries", d.rotate_queries}, {"unrotate_output", d.unrotate_output},
                     {"pre_rope", d.pre_rope},
                     {"rope_pairing", d.rope_pairing == kvq::RopePairing::kAdjacent ? "adjacent" : "halves"},
                     {"rotary_dims", d.rotary_dims}, {"slots", d.slots}, {"slot_bytes", d.slot_bytes},
                     {"window_rows", d.window_rows},
                     // The positions per chunk whose states are merged in a fixed order, as kvq's CPU
                     // attention splits them (its default: the forward passes use it).
                     {"position_chunk", kvq::kDefaultPositionChunk}};
    if (d.key_args.tensor_scale != 1.0f || d.value_args.tensor_scale != 1.0f) {
      return kvq::Status::Error("WebGPU KV device: calibrated (tensor-scaled) codecs are not decoded on the GPU");
    }
    if (d.rotation_signs != nullptr) j["rotation_signs"] = std::vector<float>(d.rotation_signs, d.rotation_signs + d.head_dim);
    return JsStatus(kvq_js_kv_begin(j.dump().c_str()));
  }
  kvq::Status Upload(int32_t slot, const uint8_t* bytes, int64_t n) override {
    return JsStatus(kvq_js_kv_upload(slot, bytes, static_cast<double>(n)));
  }
  kvq::Status Attend(const kvq::KvDeviceWindow& w) override {
    const nlohmann::json j{{"slot", w.slot}, {"page", w.page}, {"first_position", w.first_position},
                           {"n_rows", w.n_rows}, {"bytes", w.bytes}, {"k", TensorJson(w.k)}, {"v", TensorJson(w.v)}};
    return JsStatus(kvq_js_kv_attend(j.dump().c_str(), w.key_rope.data(), static_cast<int>(w.key_rope.size())));
  }
  kvq::Status Finish() override { return JsStatus(kvq_js_kv_finish()); }
};

// A device that decodes every row as attention reads it (prerope keys roped with the window's
// cos/sin, exactly as kvq's CPU attention ropes them) into k and v: [positions][n_kv_heads][head_dim].
class RowsDevice final : public kvq::KvDevice {
 public:
  RowsDevice(float* k, float* v) : out_{k, v} {}
  kvq::Status Begin(const kvq::KvDeviceLayer& d) override {
    d_ = d;
    slots_.assign(static_cast<size_t>(d.slots), std::vector<uint8_t>(static_cast<size_t>(d.slot_bytes)));
    return kvq::Status::Ok();
  }
  kvq::Status Upload(int32_t slot, const uint8_t* bytes, int64_t n) override {
    std::memcpy(slots_[slot].data(), bytes, static_cast<size_t>(n));
    return kvq::Status::Ok();
  }
  kvq::Status Attend(const kvq::KvDeviceWindow& w) override {
    const uint8_t* slot = slots_[w.slot].data();
    const int64_t elems = int64_t{d_.n_kv_heads} * d_.head_dim;
    const kvq::KvDeviceWindow::Tensor* t[2] = {&w.k, &w.v};
    for (int which = 0; which < 2; ++which) {
      const kvq::Codec& codec = which == 0 ? d_.key_format->key : d_.value_format->value;
      const kvq::CodecArgs& args = which == 0 ? d_.key_args : d_.value_args;
      for (int64_t r = 0; r < w.n_rows; ++r) {
        float* row = out_[which] + (w.first_position + r) * elems;
        if (r < t[which]->n_head) {
          std::memcpy(row, slot + t[which]->head_offset + r * elems * 4, elems * 4);
        } else if (r < t[which]->n_block) {
          const int32_t g = codec.rows_per_block;
          codec.decode_row(slot + t[which]->blocks_offset + (r / g) * codec.block_bytes(args.shape),
                           static_cast<int32_t>(r % g), row, args);
        } else {
          std::memcpy(row, slot + t[which]->residual_offset + (r - t[which]->n_block) * elems * 4, elems * 4);
        }
        if (which == 0 && d_.pre_rope) {  // kvq's ApplyRope with the window's cos/sin
          kvq::RotateByCosSin(row, static_cast<int32_t>(elems), d_.head_dim, w.key_rope.data() + r * d_.rotary_dims,
                              d_.rope_pairing, d_.rotary_dims);
        }
      }
    }
    return kvq::Status::Ok();
  }
  kvq::Status Finish() override { return kvq::Status::Ok(); }

 private:
  kvq::KvDeviceLayer d_;
  float* out_[2];
  std::vector<std::vector<uint8_t>> slots_;
};

struct WebKv {
  std::unique_ptr<kvq::KvCache> cache;
  std::string plan_json;  // the last JSON returned (kvq_web_kv_plan, kvq_web_kv_page_layout), alive
                          // until the next
  // The CPU forward over `cache` (kvq_web_kv_cpu_step), made on first use, and its logits [vocab].
  std::unique_ptr<kvq::DecoderModel> cpu;
  std::vector<float> logits;
};

WebKv* KvOf(int handle) { return reinterpret_cast<WebKv*>(static_cast<intptr_t>(handle)); }

}  // namespace

extern "C" {

// A cache of n_layers layers (key and value specs as kvq's --kv-k/--kv-v), RoPE parameters for
// prerope keys (pairing 0: adjacent, 1: halves; rotary_dims 0: the whole head), a device budget in
// bytes (0: none — the device then gets two slots). Returns a handle, or 0.
EMSCRIPTEN_KEEPALIVE int kvq_web_kv_new(const char* key_spec, const char* value_spec, int n_layers, int n_kv_heads,
                                        int head_dim, int max_positions, int page_positions,
                                        double device_budget_bytes, double rope_theta, int rope_pairing,
                                        int rotary_dims) {
  kvq::Result<kvq::KvSpec> k = kvq::ParseKvSpec(key_spec);
  kvq::Result<kvq::KvSpec> v = kvq::ParseKvSpec(value_spec);
  if (!k.ok() || !v.ok()) {
    Fail((k.ok() ? v.status() : k.status()).message());
    return 0;
  }
  if (!(device_budget_bytes >= 0) || device_budget_bytes > 9.0e15 || (rope_pairing != 0 && rope_pairing != 1)) {
    Fail("device_budget_bytes must be 0 (none) or a positive byte count, rope_pairing 0 or 1");
    return 0;
  }
  kvq::KvCacheConfig config{.n_layers = n_layers, .n_kv_heads = n_kv_heads, .head_dim = head_dim,
                            // One spec for both: a key-only transform (prerope) goes to K alone.
                            .layers = {std::string(key_spec) == value_spec ? kvq::LayerFormats::Both(*k)
                                                                           : kvq::LayerFormats::Of(*k, *v)},
                            .key_rope = kvq::RopeConfig{.theta = static_cast<float>(rope_theta),
                                                        .pairing = rope_pairing == 0 ? kvq::RopePairing::kAdjacent
                                                                                     : kvq::RopePairing::kHalves,
                                                        .rotary_dims = rotary_dims},
                            .max_positions = max_positions, .page_positions = page_positions};
  config.budgets.device_bytes = static_cast<int64_t>(device_budget_bytes);
  kvq::Result<std::unique_ptr<kvq::KvCache>> cache = kvq::KvCache::Create(config);
  if (!cache.ok()) {
    Fail(cache.status().message());
    return 0;
  }
  auto web = std::make_unique<WebKv>();
  web->cache = std::move(cache).value();
  return kvq_web::Handle(web.release());
}

// The cache a loaded model's sessions would make (model/cache_config.h: its attention layers,
// its RoPE for a "prerope" key spec, its context) with these specs, device budget and page size
// (page_positions 0: the default; else a multiple of 32) — the cache of the WebGPU path's
// attention ops. Returns a handle, or 0.
EMSCRIPTEN_KEEPALIVE int kvq_web_kv_new_for_model(int model, const char* key_spec, const char* value_spec,
                                                  double device_budget_bytes, int page_positions) {
  kvq::Result<kvq::KvSpec> k = kvq::ParseKvSpec(key_spec);
  kvq::Result<kvq::KvSpec> v = kvq::ParseKvSpec(value_spec);
  if (!k.ok() || !v.ok()) {
    Fail((k.ok() ? v.status() : k.status()).message());
    return 0;
  }
  if (!(device_budget_bytes >= 0) || device_budget_bytes > 9.0e15) {
    Fail("device_budget_bytes must be 0 (none) or a positive byte count");
    return 0;
  }
  const kvq::Model& m = *kvq_web::ModelOf(model)->model;
  kvq::CacheChoice choice{.layers = {std::string(key_spec) == value_spec ? kvq::LayerFormats::Both(*k)
                                                                         : kvq::LayerFormats::Of(*k, *v)}};
  choice.budgets.device_bytes = static_cast<int64_t>(device_budget_bytes);
  choice.page_positions = page_positions;
  kvq::Result<std::unique_ptr<kvq::KvCache>> cache =
      kvq::CreateModelCache(m.impl().weights.config, m.info().context, choice);
  if (!cache.ok()) {
    Fail(cache.status().message());
    return 0;
  }
  auto web = std::make_unique<WebKv>();
  web->cache = std::move(cache).value();
  return kvq_web::Handle(web.release());
}

EMSCRIPTEN_KEEPALIVE void kvq_web_kv_free(int kv) { delete KvOf(kv); }

// {total_bytes, slot_bytes, device_slots, device_bytes, positions}
EMSCRIPTEN_KEEPALIVE const char* kvq_web_kv_plan(int kv) {
  WebKv* w = KvOf(kv);
  const kvq::KvTierPlan& p = w->cache->plan();
  w->plan_json = nlohmann::json{{"total_bytes", p.total_bytes}, {"slot_bytes", p.slot_bytes},
                                {"device_slots", p.device_slots}, {"device_bytes", p.device_bytes},
                                {"positions", w->cache->positions(0)}}
                     .dump();
  return w->plan_json.c_str();
}

// k, v: [n][n_kv_heads][head_dim] f32 (keys before RoPE for a prerope key spec).
EMSCRIPTEN_KEEPALIVE int kvq_web_kv_append(int kv, int layer, const float* k, const float* v, int n) {
  if (n < 0) return Fail("append: negative row count");
  const kvq::Status s = KvOf(kv)->cache->Append(layer, k, v, n);
  return s.ok() ? 0 : Fail(s.message());
}

// {page_bytes, value_offset, page_positions, max_positions, key_block_bytes, value_block_bytes[,
// rotation_signs]}: one page of `layer` as the cache stores it (K blocks from 0, V blocks from value_offset, each
// region and the page padded: a block's bytes are the codec's, not the region over its blocks), the
// layout pages written behind by the GPU's encoders take; rotation_signs ([head_dim] ±1) when the
// layer's K or V spec has "rot".
EMSCRIPTEN_KEEPALIVE const char* kvq_web_kv_page_layout(int kv, int layer) {
  WebKv* w = KvOf(kv);
  const kvq::KvCache::PageLayout l = w->cache->LayerPageLayout(layer);
  const kvq::KvCacheConfig& c = w->cache->config();
  nlohmann::json j{{"page_bytes", l.page_bytes}, {"value_offset", l.value_offset},
                   {"page_positions", c.page_positions}, {"max_positions", c.max_positions}};
  // The signs as the cache draws them (KvCache::Create: RotationSigns of its seed and head_dim): a
  // resident GPU cache rotates the rows it encodes, and its queries, with them (kv_resident.js).
  const size_t i = c.layers.size() == 1 ? 0 : static_cast<size_t>(layer);
  if (layer >= 0 && i < c.layers.size()) {
    const kvq::RowShape shape{.n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim};
    j["key_block_bytes"] = c.layers[i].key->key.block_bytes(shape);
    j["value_block_bytes"] = c.layers[i].value->value.block_bytes(shape);
  }
  if (layer >= 0 && i < c.layers.size() && (c.layers[i].key_transforms.rotate || c.layers[i].value_transforms.rotate)) {
    j["rotation_signs"] = kvq::RotationSigns(c.rotation_seed, c.head_dim);
  }
  w->plan_json = j.dump();
  return w->plan_json.c_str();
}

// n_pages whole pages of encoded bytes ([n_pages][page_bytes]) onto `layer`
// (KvCache::AppendEncodedPages).
EMSCRIPTEN_KEEPALIVE int kvq_web_kv_append_pages(int kv, int layer, const uint8_t* pages,
                                                 int n_pages) {
  const kvq::Status s = KvOf(kv)->cache->AppendEncodedPages(layer, pages, n_pages);
  return s.ok() ? 0 : Fail(s.message());
}

// Page `page` of `layer` as the master holds it, into out ([page_bytes]).
EMSCRIPTEN_KEEPALIVE int kvq_web_kv_read_page(int kv, int layer, int page, uint8_t* out) {
  const kvq::Status s = KvOf(kv)->cache->ReadPage(layer, page, out);
  return s.ok() ? 0 : Fail(s.message());
}

// Attention on Module.kvqDevice of the queries it holds (n_tokens positions from
// first_query_position), scale 1/√head_dim, over every cached position of `layer`.
EMSCRIPTEN_KEEPALIVE int kvq_web_kv_attend_device(int kv, int layer, int first_query_position, int n_tokens) {
  kvq::KvCache& cache = *KvOf(kv)->cache;
  // DecoderModel::attention_options' scale, computed as it computes it (f32 sqrt and division).
  const float scale = 1.0f / std::sqrt(static_cast<float>(cache.config().head_dim));
  WebGpuKvDevice device;
  const kvq::Status s = cache.AttendOnDevice(layer, {.scale = scale}, first_query_position, n_tokens, device);
  return s.ok() ? 0 : Fail(s.message());
}

// The rows of `layer` as attention reads them: k and v [positions][n_kv_heads][head_dim] f32.
EMSCRIPTEN_KEEPALIVE int kvq_web_kv_rows(int kv, int layer, float* k, float* v) {
  RowsDevice device(k, v);
  kvq::KvCache& cache = *KvOf(kv)->cache;
  if (layer < 0 || layer >= cache.config().n_layers) return Fail("rows: no such layer");
  const int64_t n = cache.positions(layer);
  if (n == 0) return 0;
  // A query at the last position reads every row as the cache holds it now.
  const kvq::Status s = cache.AttendOnDevice(layer, {.scale = 1.0f}, n - 1, 1, device);
  return s.ok() ? 0 : Fail(s.message());
}

// Positions `layer` holds (the GPU path checks it to redo a step its lost device left half done).
EMSCRIPTEN_KEEPALIVE double kvq_web_kv_positions(int kv, int layer) {
  kvq::KvCache& cache = *KvOf(kv)->cache;
  if (layer < 0 || layer >= cache.config().n_layers) return Fail("positions: no such layer");
  return static_cast<double>(cache.positions(layer));
}

// Drops every layer back to at most n positions, where the formats can drop rows in place
// (KvCache::TruncationPoint: n itself for per-token formats, a group boundary for grouped ones, 0
// for sinks and residuals). Returns the positions kept: the caller runs the ids after them again.
EMSCRIPTEN_KEEPALIVE double kvq_web_kv_rewind(int kv, double n) {
  kvq::KvCache& cache = *KvOf(kv)->cache;
  if (!(n >= 0) || n > static_cast<double>(cache.positions(0))) return Fail("rewind: n must be in [0, positions]");
  const int64_t keep = cache.TruncationPoint(static_cast<int64_t>(n));
  const kvq::Status s = cache.Truncate(keep);
  return s.ok() ? static_cast<double>(keep) : Fail(s.message());
}

// One decode step of the model's C++ forward (DecoderModel::Forward) on this cache: `token` at the
// cache's next position. Returns the greedy next id (the first largest logit: the GPU's argmax
// rule), or -1. logits: [vocab_size] out, or null. Scores run in f32 (ScoreArithmetic::kF32) for
// the call, as the GPU scores, so a conversation the GPU began goes on in the GPU's arithmetic
// as far as the CPU can give it (the setting is the process's, restored on return).
EMSCRIPTEN_KEEPALIVE int kvq_web_kv_cpu_step(int model, int kv, int token, float* logits) {
  WebKv& w = *KvOf(kv);
  const kvq::Model& m = *kvq_web::ModelOf(model)->model;
  if (m.impl().header_only) {
    return Fail("cpu step: the model was loaded from its header alone (its weights are the GPU's): load the whole file");
  }
  const int32_t vocab = m.info().vocab_size;
  if (token < 0 || token >= vocab) return Fail("cpu step: token outside the vocabulary");
  if (!w.cpu) w.cpu = std::make_unique<kvq::DecoderModel>(m.impl().weights, std::max(1, m.info().threads));
  w.logits.resize(static_cast<size_t>(vocab));
  const kvq::ScoreArithmetic before = kvq::GetScoreArithmetic();
  kvq::SetScoreArithmetic(kvq::ScoreArithmetic::kF32);
  const kvq::Status s = w.cpu->Forward(token, w.cache->positions(0), *w.cache, w.logits.data());
  kvq::SetScoreArithmetic(before);
  if (!s.ok()) return Fail(s.message());
  if (logits != nullptr) std::copy(w.logits.begin(), w.logits.end(), logits);
  return static_cast<int>(std::max_element(w.logits.begin(), w.logits.end()) - w.logits.begin());
}

}  // extern "C"
