// The fuzz targets' shared helpers (fuzz_util.h).
#include "fuzz/fuzz_util.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

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

}  // namespace kvq::fuzz
