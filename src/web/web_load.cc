// Loading a model from bytes the page already put in this module's memory (kvq_web_file_alloc,
// filled by JS a chunk at a time from the picked File or the fetched body), so the file's bytes
// are not also kept in JS or in a MEMFS file: a MEMFS node is made whose contents *are* those heap
// bytes, and kvq's MapFile maps it without copying (base/mapped_file.cc maps shared under
// Emscripten; MEMFS copies private maps).
// The bytes belong to the loaded model and are freed with it (kvq_web_model_free).
// Also: the threads this build runs (pthreads or not) and the KV formats' bits for a model's shape.
#include <emscripten/emscripten.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <thread>

#include "api/api_internal.h"
#include "gguf/gguf_reader.h"
#include "kvq/kv_memory.h"
#include "kvq/kv_spec.h"
#include "kvq/model.h"
#include "web/web_common.h"

// Makes PATH a MEMFS file whose contents view [bytes, bytes + n) of the module's memory.
EM_JS(int, kvq_js_file_over_heap, (const char* path, uint8_t* bytes, double n), {
  try {
    const name = UTF8ToString(path);
    FS.writeFile(name, new Uint8Array(0));
    const node = FS.lookupPath(name).node;
    node.contents = HEAPU8.subarray(bytes, bytes + n);
    node.usedBytes = n;
    return 0;
  } catch (e) {
    return 1;
  }
});

EM_JS(void, kvq_js_unlink, (const char* path), {
  try {
    FS.unlink(UTF8ToString(path));
  } catch (e) {
    // already gone
  }
});

namespace {

using kvq_web::Fail;

// Page alignment, as a mapping has: GGUF tensor offsets are aligned relative to the file start.
constexpr size_t kFileAlignment = 65536;

// kvq_web_model_load_bytes and kvq_web_model_load_header: the n bytes at `bytes` (taken: the model
// frees them, or this does when the load fails) are the whole file, or with header_only_file_bytes
// > 0 the first bytes of a GGUF file of that size (Model::Impl::Load). A handle, or 0.
int LoadHeld(uint8_t* bytes, double n, int64_t header_only_file_bytes, const char* name, const char* tokenizer_path,
             int threads) {
  std::unique_ptr<uint8_t, void (*)(void*)> owned(bytes, &std::free);
  if (threads < 1 || threads > kvq_web_max_threads()) {
    Fail("threads must be between 1 and " + std::to_string(kvq_web_max_threads()) + " in this build");
    return 0;
  }
  // The picked name without folders, so a path in it cannot leave /models.
  std::string file = name;
  std::replace(file.begin(), file.end(), '/', '_');
  const std::string path = "/models/" + file;
  if (kvq_js_file_over_heap(path.c_str(), bytes, n) != 0) {
    kvq_web::Fail(path + ": could not be made in the module's file system");
    return 0;
  }
  kvq::ModelOptions options{.tokenizer_path = tokenizer_path != nullptr ? tokenizer_path : "", .threads = threads};
  // kvq repacks Q4_0 / Q8_0 matrices over these bytes at load (RepackWeightsInPlace, as a
  // WebAssembly heap cannot release a mapped copy), a tied classifier too, so the file is held once.
  kvq::Result<std::unique_ptr<kvq::Model>> model = kvq::Model::Impl::Load(path, options, header_only_file_bytes);
  // The mapping holds the heap bytes, not the node: the name goes at once.
  kvq_js_unlink(path.c_str());
  if (!model.ok()) {
    // The file as the user named it, not the module's internal path.
    std::string message = model.status().message();
    for (size_t at = message.find(path); at != std::string::npos; at = message.find(path, at + file.size())) {
      message.replace(at, path.size(), file);
    }
    Fail(message);
    return 0;
  }
  auto web = std::make_unique<kvq_web::WebModel>();
  web->model = std::move(model).value();
  web->file_bytes = header_only_file_bytes > 0 ? header_only_file_bytes : static_cast<int64_t>(n);
  web->file_data = std::move(owned);
  return kvq_web::Handle(web.release());
}

}  // namespace

extern "C" {

// Threads a model can run with in this build: 1 without pthreads (kvq's pool then runs every job on
// the caller's thread), else the hardware threads the browser reports.
EMSCRIPTEN_KEEPALIVE int kvq_web_max_threads(void) {
#if defined(__EMSCRIPTEN_PTHREADS__)
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
#else
  return 1;
#endif
}

// What the module's heap may hold beyond a loaded model's file and its session's KV: the initial
// memory (code's data, stacks, the bundled model) and one growth step past a request (the geometric
// step's cap), both set by cmake/wasm_module.cmake's link flags. The page states it beside its bound.
EMSCRIPTEN_KEEPALIVE double kvq_web_memory_scratch_bytes(void) {
  return static_cast<double>(KVQ_WASM_INITIAL_MEMORY) + static_cast<double>(KVQ_WASM_GROWTH_CAP);
}

// [n] bytes for a file, aligned as a mapping; 0 with kvq_web_last_error when the module cannot hold them.
EMSCRIPTEN_KEEPALIVE uint8_t* kvq_web_file_alloc(double n) {
  constexpr double kMax = 2147483648.0;  // the module's memory (MAXIMUM_MEMORY)
  if (!(n > 0) || n >= kMax) {
    Fail("the file is empty or larger than this page's 2 GiB memory");
    return nullptr;
  }
  const size_t bytes = (static_cast<size_t>(n) + kFileAlignment - 1) / kFileAlignment * kFileAlignment;
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(kFileAlignment, bytes));
  if (p == nullptr) Fail("the file does not fit this page's memory (2 GiB at most, less what is in use)");
  return p;
}

EMSCRIPTEN_KEEPALIVE void kvq_web_file_free(uint8_t* bytes) { std::free(bytes); }

// The length of a GGUF file's header (metadata and tensor table: GgufFile::HeaderBytes) from its
// first n bytes at `bytes`, the whole file being file_bytes long; 0 when more bytes are needed,
// -1 with kvq_web_last_error when the bytes are not a GGUF header (named `name`).
EMSCRIPTEN_KEEPALIVE double kvq_web_gguf_header_bytes(const uint8_t* bytes, double n, double file_bytes,
                                                      const char* name) {
  kvq::Result<int64_t> header = kvq::GgufFile::HeaderBytes(
      std::span<const uint8_t>(bytes, static_cast<size_t>(n)), static_cast<int64_t>(file_bytes), name);
  if (!header.ok()) return Fail(header.status().message());
  return static_cast<double>(*header);
}

// Loads the model file held at [bytes, bytes + n) (named `name` in errors), with the tokenizer file
// at tokenizer_path ('' for none), running `threads` threads (1..kvq_web_max_threads()). Takes the
// bytes: the model frees them, or this call does when the load fails. Returns a handle, or 0.
EMSCRIPTEN_KEEPALIVE int kvq_web_model_load_bytes(uint8_t* bytes, double n, const char* name,
                                                  const char* tokenizer_path, int threads) {
  return LoadHeld(bytes, n, 0, name, tokenizer_path, threads);
}

// As kvq_web_model_load_bytes, for the first n bytes of a GGUF file of file_bytes bytes, at least
// its header (kvq_web_gguf_header_bytes): the model's shape, vocabulary and step program, whose
// tensors the page uploads to the GPU from the file by their file_offset, so the weights never
// enter this module's memory. Its CPU forward refuses to run (Model::NewSession, kvq_web_kv_cpu_step).
EMSCRIPTEN_KEEPALIVE int kvq_web_model_load_header(uint8_t* bytes, double n, double file_bytes, const char* name,
                                                   const char* tokenizer_path, int threads) {
  if (!(file_bytes >= n)) {
    std::free(bytes);
    Fail(std::string(name) + ": the header's bytes are more than the file's");
    return 0;
  }
  return LoadHeld(bytes, n, static_cast<int64_t>(file_bytes), name, tokenizer_path, threads);
}

// [{name, bits_per_value}]: bits per stored number (K and V averaged) for heads of head_dim numbers
// (a format's scales make this shape-dependent); head_dim <= 0 means 64, a common head size.
EMSCRIPTEN_KEEPALIVE const char* kvq_web_formats(int head_dim) {
  static std::string json;
  nlohmann::json list = nlohmann::json::array();
  const kvq::RowShape shape{.n_kv_heads = 1, .head_dim = head_dim > 0 ? head_dim : 64};
  for (const kvq::FormatDesc* f : kvq::Formats()) {
    if (!kvq::CheckKvSpec(kvq::KvSpec(f), shape).ok()) continue;  // cannot store this head size
    const double bits = (kvq::BitsPerNumber(f->key, shape) + kvq::BitsPerNumber(f->value, shape)) / 2;
    list.push_back({{"name", f->name}, {"bits_per_value", bits}});
  }
  json = list.dump();
  return json.c_str();
}

}  // extern "C"
