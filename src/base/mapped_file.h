// A read-only memory mapping of a whole file; errors name the file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kvq/status.h"

namespace kvq {

struct MappedFile {
  const uint8_t* data = nullptr;
  int64_t size = 0;
};

/// Maps `path`; the shared_ptr unmaps when the last owner goes.
Result<std::shared_ptr<MappedFile>> MapFile(const std::string& path);

}  // namespace kvq
