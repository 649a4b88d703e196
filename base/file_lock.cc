#include "base/file_lock.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "base/error.h"

namespace loom {

FileLock::FileLock(FileLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), writable_(other.writable_) {}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    unlock();
    fd_ = std::exchange(other.fd_, -1);
    writable_ = other.writable_;
  }
  return *this;
}

FileLock::~FileLock() { unlock(); }

void FileLock::unlock() {
  if (fd_ < 0) return;
  // The note goes with the lock (a holder that cannot write it must not show this one's); best
  // effort: the lock, not the note, is what excludes.
  if (writable_ && ::ftruncate(fd_, 0) != 0) {
  }
  ::close(fd_);  // closing the descriptor releases its flock
  fd_ = -1;
}

FileLock::Result FileLock::try_lock(const std::string& path, std::string_view what,
                                    const std::string& note, std::string* detail) {
  unlock();
  // O_CLOEXEC: a process this one starts (loomrun's ranks) does not hold the lock on its behalf.
  // 0666 less the umask: others sharing the folder may write the note too.
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  const int open_error = errno;
  const bool writable = fd >= 0;
  if (fd < 0 && open_error == EACCES && ::access(path.c_str(), F_OK) == 0) {
    // Another user's lock file in a folder both write: flock takes a read-only descriptor too.
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  }
  // The same command would meet it again (the folder's or the file's permissions).
  if (fd < 0) {
    throw InputError(fmt::format("{}: cannot open the lock file '{}': {}", what, path,
                                 std::strerror(open_error)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    if (error != EWOULDBLOCK && !writable) {
      // NFS takes an exclusive flock only on a file open for writing: unlocked here, a job
      // holding it would not be seen.
      ::close(fd);
      throw InputError(fmt::format(
          "{}: cannot lock '{}', which this user may only read ({}); make it writable to the "
          "users who share the folder (chmod a+w), or remove it while no job runs",
          what, path, std::strerror(error)));
    }
    Result result = Result::kUnsupported;
    std::string text = std::strerror(error);
    if (error == EWOULDBLOCK) {
      result = Result::kHeld;
      char buffer[256];
      const ssize_t n = ::pread(fd, buffer, sizeof(buffer), 0);
      text.assign(buffer, n > 0 ? static_cast<size_t>(n) : 0);
      while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
    }
    ::close(fd);
    if (detail != nullptr) *detail = text;
    return result;
  }
  // Ours: say who holds it (best effort: the lock, not this text, is what excludes).
  if (writable) {
    const std::string text = note + "\n";
    if (::ftruncate(fd, 0) == 0) {
      [[maybe_unused]] const ssize_t written = ::pwrite(fd, text.data(), text.size(), 0);
    }
  }
  fd_ = fd;
  writable_ = writable;
  return Result::kLocked;
}

}  // namespace loom
