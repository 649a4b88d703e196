#include "checkpoint/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace loom::checkpoint {

std::vector<char> read_range(const std::string& path, int64_t offset, int64_t length) {
  // O_NONBLOCK: a FIFO in a file's place would block open() until a writer came; it is refused
  // below instead (a regular file reads the same either way).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  LOOM_CHECK(fd >= 0, "checkpoint: cannot open '{}': {}", path, std::strerror(errno));
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    LOOM_FAIL(
        "checkpoint: '{}' is not a regular file; a checkpoint's files are the ones its save "
        "wrote",
        path);
  }
  std::vector<char> out(static_cast<size_t>(length));
  int64_t done = 0;
  while (done < length) {
    const ssize_t n = ::pread(fd, out.data() + done, static_cast<size_t>(length - done),
                              static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      ::close(fd);
      LOOM_CHECK(n == 0, "checkpoint: cannot read '{}': {}", path, std::strerror(error));
      LOOM_FAIL(
          "checkpoint: '{}' ends before byte {} (wanted bytes {} to {}): the file is "
          "truncated",
          path, offset + done, offset, offset + length);
    }
    done += n;
  }
  ::close(fd);
  return out;
}

std::string read_text(const std::string& path) {
  struct stat info {};
  LOOM_CHECK(::stat(path.c_str(), &info) == 0, "checkpoint: cannot read '{}': {}", path,
             std::strerror(errno));
  LOOM_CHECK(S_ISREG(info.st_mode),
             "checkpoint: '{}' is not a regular file; a checkpoint's files are the ones its save "
             "wrote",
             path);
  const std::vector<char> bytes = read_range(path, 0, info.st_size);
  return std::string(bytes.begin(), bytes.end());
}

}  // namespace loom::checkpoint
