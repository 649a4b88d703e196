#include "checkpoint/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace loom::checkpoint {

FileWriter::FileWriter(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  LOOM_CHECK(fd_ >= 0, "checkpoint: cannot create '{}': {}", path, std::strerror(errno));
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void FileWriter::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    LOOM_CHECK(n > 0, "checkpoint: cannot write '{}': {}", path_,
               n < 0 ? std::strerror(errno) : "no progress");
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void FileWriter::close() {
  LOOM_CHECK(::fsync(fd_) == 0, "checkpoint: cannot fsync '{}': {}", path_, std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  LOOM_CHECK(::close(fd) == 0, "checkpoint: cannot close '{}': {}", path_, std::strerror(errno));
}

void write_file_synced(const std::string& path, const std::string& text) {
  FileWriter writer(path);
  writer.write(text.data(), text.size());
  writer.close();
}

void sync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  LOOM_CHECK(fd >= 0, "checkpoint: cannot open the directory '{}': {}", path, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  LOOM_CHECK(rc == 0, "checkpoint: cannot fsync the directory '{}': {}", path,
             std::strerror(error));
}

std::vector<char> read_range(const std::string& path, int64_t offset, int64_t length) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  LOOM_CHECK(fd >= 0, "checkpoint: cannot open '{}': {}", path, std::strerror(errno));
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
  const std::vector<char> bytes = read_range(path, 0, info.st_size);
  return std::string(bytes.begin(), bytes.end());
}

}  // namespace loom::checkpoint
