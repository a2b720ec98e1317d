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

/// The resource property (issue 18): no single allocation made while a target reads an input of
/// `size` bytes may exceed 16 x size + 1 MiB. The factor covers a loader's legitimate expansion
/// (a zero-length GGUF string, 8 bytes in the file, becomes a 32-byte std::string and a table
/// entry; an empty nested array, 12 bytes, an 88-byte GgufValue); the 1 MiB covers what does not
/// grow with the input (a cache page, a model's small buffers). A length or count believed before
/// it is checked against the file breaks it at once. Checked around every call by KVQ_FUZZ_TARGET
/// (through ASan's allocation hooks) and by tests/fuzz/ (through operator new).
inline size_t AllocationLimit(size_t size) { return 16 * size + (size_t{1} << 20); }

/// Runs `fn` on the input with the largest single allocation recorded (ASan's malloc hook) and
/// fails when it exceeds AllocationLimit(size). The first call runs `fn` once on an empty input
/// first, unrecorded, so a target's one-time setup (a vocabulary loaded into a static) is not
/// counted against the first input.
int RunWithAllocationLimit(int (*fn)(const uint8_t*, size_t), const char* target, const uint8_t* data,
                           size_t size);

}  // namespace kvq::fuzz

// KVQ_FUZZ_TARGET(FuzzGguf) after `int FuzzGguf(const uint8_t*, size_t)`: the libFuzzer entry
// point, unless KVQ_FUZZ_NO_MAIN (the regression test, which calls every target by name).
#ifdef KVQ_FUZZ_NO_MAIN
#define KVQ_FUZZ_TARGET(fn)
#else
#define KVQ_FUZZ_TARGET(fn)                                                         \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {         \
    return ::kvq::fuzz::RunWithAllocationLimit(::kvq::fuzz::fn, #fn, data, size);   \
  }
#endif
