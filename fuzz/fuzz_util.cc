// The fuzz targets' shared helpers (fuzz_util.h).
#include "fuzz/fuzz_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#ifndef KVQ_FUZZ_NO_MAIN
#include <sanitizer/allocator_interface.h>
#endif

namespace kvq::fuzz {

namespace {

// Never destroyed (a heap string the atexit handler below still reads after statics are gone).
const std::string* g_scratch_dir = nullptr;

const std::string& ScratchDir() {
  if (g_scratch_dir == nullptr) {
    // $TMPDIR, else /dev/shm (a file per execution on a disk-backed /tmp made the file-reading
    // targets 7 times slower: 5000 parsers runs, 11.0 s against 1.6 s), else /tmp.
    const char* tmp = std::getenv("TMPDIR");
    std::error_code ec;
    const char* base = tmp != nullptr && *tmp != '\0'                      ? tmp
                       : std::filesystem::is_directory("/dev/shm", ec) ? "/dev/shm"
                                                                       : "/tmp";
    const std::filesystem::path p = std::filesystem::path(base) / ("kvq_fuzz_" + std::to_string(getpid()));
    std::filesystem::create_directories(p, ec);
    if (ec) Fail("fuzz_util", "cannot create the scratch folder " + p.string() + ": " + ec.message());
    g_scratch_dir = new std::string(p.string());
    // Removed at exit (libFuzzer exits through exit() after -runs; a crash leaves it for the report).
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(*g_scratch_dir, ignored);
    });
  }
  return *g_scratch_dir;
}

}  // namespace

std::string WriteInput(const uint8_t* data, size_t size, std::string_view name) {
  const std::string path = ScratchDir() + "/" + std::string(name);
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) Fail("fuzz_util", "cannot create " + path);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = write(fd, data + done, size - done);
    if (n <= 0) Fail("fuzz_util", "cannot write " + path);
    done += static_cast<size_t>(n);
  }
  close(fd);
  return path;
}

void Fail(std::string_view target, std::string_view what) {
  std::fprintf(stderr, "kvq fuzz %.*s: property violated: %.*s\n", static_cast<int>(target.size()),
               target.data(), static_cast<int>(what.size()), what.data());
  std::fflush(stderr);
  std::abort();
}

std::string SourcePath(std::string_view relative) {
  return std::string(KVQ_SOURCE_DIR) + "/" + std::string(relative);
}

#ifndef KVQ_FUZZ_NO_MAIN
namespace {

std::atomic<bool> g_recording{false};
std::atomic<size_t> g_largest{0};

// ASan calls these for every allocation and free, from any thread.
void OnMalloc(const volatile void* /*ptr*/, size_t bytes) {
  if (!g_recording.load(std::memory_order_relaxed)) return;
  size_t seen = g_largest.load(std::memory_order_relaxed);
  while (bytes > seen && !g_largest.compare_exchange_weak(seen, bytes, std::memory_order_relaxed)) {
  }
}
void OnFree(const volatile void* /*ptr*/) {}

}  // namespace

int RunWithAllocationLimit(int (*fn)(const uint8_t*, size_t), const char* target, const uint8_t* data,
                           size_t size) {
  static const bool ready = [fn] {
    if (__sanitizer_install_malloc_and_free_hooks(OnMalloc, OnFree) == 0) {
      Fail("fuzz_util", "cannot install the allocation hooks (not an ASan build?)");
    }
    fn(nullptr, 0);  // one-time setup, unrecorded
    return true;
  }();
  (void)ready;
  g_largest.store(0, std::memory_order_relaxed);
  g_recording.store(true, std::memory_order_relaxed);
  const int rc = fn(data, size);
  g_recording.store(false, std::memory_order_relaxed);
  const size_t largest = g_largest.load(std::memory_order_relaxed);
  if (largest > AllocationLimit(size)) {
    Fail(target, "one allocation of " + std::to_string(largest) + " bytes for an input of " + std::to_string(size) +
                     " bytes (limit " + std::to_string(AllocationLimit(size)) + ")");
  }
  return rc;
}
#endif

}  // namespace kvq::fuzz
