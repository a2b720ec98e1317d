// What the fuzz targets share: the entry-point macro (libFuzzer's LLVMFuzzerTestOneInput, or a
// plain named function when tests/fuzz/fuzz_regression_test.cc links the same sources), the input
// written to a file for loaders that take a path, and a property check that aborts loudly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvq::fuzz {

/// Writes `size` bytes to `name` in this process's scratch folder (created once, under $TMPDIR,
/// else /dev/shm, else /tmp, named after the pid; removed at exit) and returns its path. Aborts
/// if it cannot.
std::string WriteInput(const uint8_t* data, size_t size, std::string_view name);

/// A violated property: prints `what` and aborts, which libFuzzer reports as a crash (and saves
/// the input) and a gtest run reports as a death.
[[noreturn]] void Fail(std::string_view target, std::string_view what);

/// Where the bundled model and test vocabularies live (KVQ_SOURCE_DIR at build time).
std::string SourcePath(std::string_view relative);

}  // namespace kvq::fuzz

// KVQ_FUZZ_TARGET(FuzzGguf) after `int FuzzGguf(const uint8_t*, size_t)`: the libFuzzer entry
// point, unless KVQ_FUZZ_NO_MAIN (the regression test, which calls every target by name).
#ifdef KVQ_FUZZ_NO_MAIN
#define KVQ_FUZZ_TARGET(fn)
#else
#define KVQ_FUZZ_TARGET(fn)                                                         \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {         \
    return ::kvq::fuzz::fn(data, size);                                             \
  }
#endif
