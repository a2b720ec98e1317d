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

Result<std::shared_ptr<MappedFile>> MapFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Error(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return Status::Error(fmt::format("{} is not a regular file", path));
  }
  auto file = std::shared_ptr<MappedFile>(new MappedFile(), [](MappedFile* f) {
    if (f->data != nullptr && f->size > 0) munmap(const_cast<uint8_t*>(f->data), f->size);
    delete f;
  });
  file->size = st.st_size;
  if (file->size > 0) {
    void* p = mmap(nullptr, file->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      close(fd);
      return Status::Error(fmt::format("cannot map {}: {}", path, std::strerror(errno)));
    }
    file->data = static_cast<const uint8_t*>(p);
  }
  close(fd);
  return file;
}

}  // namespace kvq
