// A read-only memory mapping of a whole file, the one kvq uses for every file it maps (GGUF,
// llama2.c checkpoints); errors name the file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "kvq/status.h"

namespace kvq {

struct MappedFile {
  const uint8_t* data = nullptr;  ///< null for an empty file
  int64_t size = 0;
};

/// Maps `path`; the shared_ptr unmaps when the last owner goes. Errors read "cannot open
/// <what>: <reason>" (or "cannot map ..."), where `what` names the file for the reader ("GGUF
/// file 'x.gguf'"); empty: the path itself.
Result<std::shared_ptr<MappedFile>> MapFile(const std::string& path, std::string_view what = {});

}  // namespace kvq
