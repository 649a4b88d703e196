#include "base/file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "base/error.h"

namespace loom {

FileLock::FileLock(FileLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    unlock();
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

FileLock::~FileLock() { unlock(); }

void FileLock::unlock() {
  if (fd_ >= 0) ::close(fd_);  // closing the descriptor releases its flock
  fd_ = -1;
}

bool FileLock::try_lock(const std::string& path, std::string_view what, const std::string& note,
                        std::string* holder) {
  unlock();
  // O_CLOEXEC: a process this one starts (loomrun's ranks) does not hold the lock on its behalf.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  LOOM_CHECK(fd >= 0, "{}: cannot open the lock file '{}': {}", what, path, std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    if (holder != nullptr) {
      holder->clear();
      char buffer[256];
      const ssize_t n = ::pread(fd, buffer, sizeof(buffer), 0);
      if (n > 0) holder->assign(buffer, static_cast<size_t>(n));
      while (!holder->empty() && (holder->back() == '\n' || holder->back() == '\0')) {
        holder->pop_back();
      }
    }
    ::close(fd);
    LOOM_CHECK(error == EWOULDBLOCK, "{}: cannot lock '{}': {}", what, path, std::strerror(error));
    return false;
  }
  // Ours: say who holds it (best effort: the lock, not this text, is what excludes).
  const std::string text = note + "\n";
  if (::ftruncate(fd, 0) == 0) {
    [[maybe_unused]] const ssize_t written = ::pwrite(fd, text.data(), text.size(), 0);
  }
  fd_ = fd;
  return true;
}

}  // namespace loom
