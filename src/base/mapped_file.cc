// MapFile (see mapped_file.h).
#include "base/mapped_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kvq {

Result<std::shared_ptr<MappedFile>> MapFile(const std::string& path, std::string_view what) {
  if (what.empty()) what = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Error(fmt::format("cannot open {}: {}", what, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::Error(fmt::format("cannot open {}: not a regular file", what));
  }
  auto file = std::shared_ptr<MappedFile>(new MappedFile(), [](MappedFile* f) {
    if (f->data != nullptr && f->size > 0) ::munmap(const_cast<uint8_t*>(f->data), static_cast<size_t>(f->size));
    delete f;
  });
  file->size = st.st_size;
  if (file->size > 0) {
#if defined(__EMSCRIPTEN__)
    // Read-only either way; Emscripten's in-memory files copy a private map into the heap but
    // hand out a shared one in place when the file's bytes already lie there (src/web/web_load.cc
    // puts a page's model file in the heap so that it is held once).
    constexpr int kMapFlags = MAP_SHARED;
#else
    constexpr int kMapFlags = MAP_PRIVATE;
#endif
    void* p = ::mmap(nullptr, static_cast<size_t>(file->size), PROT_READ, kMapFlags, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;  // close may overwrite errno
      ::close(fd);
      return Status::Error(fmt::format("cannot map {}: {}", what, std::strerror(err)));
    }
    file->data = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return file;
}

}  // namespace kvq
