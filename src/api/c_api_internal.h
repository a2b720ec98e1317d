// What the C API's files (c_api*.cc) share: the handles behind kvq.h's opaque
// types, the thread's last error, and the checks every entry point makes.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kvq.h"
#include "kvq/model.h"
#include "kvq/generator.h"
#include "kvq/session.h"

// Shared so that a session's chat calls may reach its model after kvq_model_free.
struct kvq_model {
  std::shared_ptr<const kvq::Model> model;
};
struct kvq_session {
  std::shared_ptr<const kvq::Model> model;
  std::unique_ptr<kvq::Session> session;
  int last_finish = -1;  // kvq_finish_reason of the last successful generate; -1: none
  // kvq_session_set_speculation's (c_api_speculation.cc): what every generate runs with, the draft
  // model it points to kept alive here, and the last successful generate's counts.
  kvq::SpeculationOptions speculation;
  std::shared_ptr<const kvq::Model> draft_model;
  kvq::SpeculationStats last_speculation;
};

namespace kvq::capi {

/// Sets the calling thread's kvq_last_error() to `message`; returns KVQ_ERROR.
int Fail(const std::string& message);
/// KVQ_OK, or Fail(s.message()).
int Check(const Status& s);

/// Runs an entry point's body: a C++ exception (std::bad_alloc, a throwing callback) never crosses
/// into C; it becomes the call's error and `on_error` is returned.
template <typename T, typename F>
T Guard(const char* what, T on_error, F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    Fail(std::string(what) + ": " + e.what());
  } catch (...) {
    Fail(std::string(what) + ": unknown C++ exception");
  }
  return on_error;
}

/// For handles and option structs: NULL is an error with a message, not a crash. True if missing.
bool Missing(const void* p, const char* what);

/// `s`, or `fallback` when s is NULL.
inline std::string Str(const char* s, const char* fallback = "") {
  return s != nullptr ? s : fallback;
}

/// The size-then-fill buffer contracts of kvq_tokenize and kvq_detokenize: copies what fits
/// (text: with a terminating NUL) and returns the whole count, which may exceed capacity.
int64_t CopyIds(const std::vector<int32_t>& ids, int32_t* out, int64_t capacity);
int64_t CopyText(const std::string& text, char* out, int64_t capacity);

/// Checks a caller's struct_size against what this library knows of struct `name`: at least
/// `first_size` (the struct's first version), at most sizeof. The message names the call (`what`),
/// the struct and both sizes. True if it is acceptable.
bool CheckStructSize(const char* what, const char* name, size_t got, size_t first_size,
                     size_t size);

/// A caller's input struct read as this library's T: `defaults` (from the struct's *_init) with the
/// fields the caller's struct_size covers copied over, so a caller built against an older kvq.h
/// gets defaults for the fields appended since. False (error set) for a size CheckStructSize
/// refuses.
template <typename T>
bool ReadStruct(const char* what, const char* name, size_t first_size, const T& in, T& defaults) {
  if (!CheckStructSize(what, name, in.struct_size, first_size, sizeof(T))) return false;
  std::memcpy(static_cast<void*>(&defaults), &in, in.struct_size);
  defaults.struct_size = sizeof(T);
  return true;
}

/// The first version's sizes: every field up to and including the last one the first kvq.h with
/// struct_size declared. When fields are appended these stay, and ReadStruct fills the new ones.
inline constexpr size_t kModelOptionsFirstSize = offsetof(kvq_model_options, repack);
inline constexpr size_t kModelInfoFirstSize = sizeof(kvq_model_info);
inline constexpr size_t kGenerateOptionsFirstSize = sizeof(kvq_generate_options);
inline constexpr size_t kChatOptionsFirstSize = sizeof(kvq_chat_options);

// kvq_generate_options as the C++ API reads them (c_api_generate.cc), for every call that takes them.
/// The sampler fields (temperature .. seed).
kvq::SamplerOptions Sampling(const kvq_generate_options& o);
/// A kvq_finish_reason.
int FinishToC(kvq::FinishReason reason);
/// The caller's options (NULL: the defaults) read as this library's struct; false with the error
/// set.
bool ReadGenerateOptions(const char* what, const kvq_generate_options* in, kvq_generate_options& out);
/// The GenerateRequest of `o`; false with the error set (naming the field) for a bad stop list,
/// grammar or schema.
bool RequestFromC(const char* what, const kvq_generate_options& o, kvq::GenerateRequest& request);

}  // namespace kvq::capi
