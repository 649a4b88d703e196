#include "base/durable_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "base/error.h"

namespace loom {

namespace {

// Opens `path` for writing under an exclusive flock, then truncates it. Not O_TRUNC: the file may
// be another writer's, whose bytes must survive our failing to lock it. A lock taken on a file
// that was renamed or removed in between (its writer committed) locks a file no longer under
// this name: open the name again.
int open_locked(const std::string& path, std::string_view what) {
  for (;;) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
    LOOM_CHECK(fd >= 0, "{}: cannot create '{}': {}", what, path, std::strerror(errno));
    int rc;
    do rc = ::flock(fd, LOCK_EX | LOCK_NB);
    while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      const int error = errno;
      ::close(fd);
      if (error == EWOULDBLOCK) {
        throw PathBusyError(fmt::format(
            "{}: cannot write '{}': another writer (a process or thread) is writing it now and "
            "holds '{}'; give each job or rank its own path, or wait for the other to finish",
            what, path.substr(0, path.size() - (path.ends_with(".tmp") ? 4 : 0)), path));
      }
      LOOM_FAIL("{}: cannot lock '{}': {}", what, path, std::strerror(error));
    }
    struct stat opened {};
    struct stat named {};
    if (::fstat(fd, &opened) == 0 && ::stat(path.c_str(), &named) == 0 &&
        opened.st_dev == named.st_dev && opened.st_ino == named.st_ino) {
      if (::ftruncate(fd, 0) == 0) return fd;
      const int error = errno;
      ::close(fd);
      LOOM_FAIL("{}: cannot truncate '{}': {}", what, path, std::strerror(error));
    }
    ::close(fd);  // renamed or removed while we locked it
  }
}

}  // namespace

SyncedFileWriter::SyncedFileWriter(std::string path, std::string_view what, Mode mode)
    : path_(std::move(path)), what_(what) {
  if (mode == Mode::kLocked) {
    fd_ = open_locked(path_, what_);
    return;
  }
  // Not O_APPEND: it would make write_at's pwrite append too. The position starts at the end.
  const int truncate = mode == Mode::kTruncate ? O_TRUNC : 0;
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | truncate | O_CLOEXEC, 0666);
  LOOM_CHECK(fd_ >= 0, "{}: cannot create '{}': {}", what_, path_, std::strerror(errno));
  if (mode == Mode::kAppend && ::lseek(fd_, 0, SEEK_END) < 0) {
    const int error = errno;
    ::close(std::exchange(fd_, -1));
    LOOM_FAIL("{}: cannot go to the end of '{}': {}", what_, path_, std::strerror(error));
  }
}

SyncedFileWriter::SyncedFileWriter(SyncedFileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      what_(std::move(other.what_)),
      fd_(std::exchange(other.fd_, -1)) {}

SyncedFileWriter& SyncedFileWriter::operator=(SyncedFileWriter&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    what_ = std::move(other.what_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

SyncedFileWriter::~SyncedFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void SyncedFileWriter::write(const void* data, size_t bytes) {
  LOOM_CHECK(fd_ >= 0,
             "{}: cannot write '{}': it is not open (closed, or abandoned after an error)", what_,
             path_);
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    LOOM_CHECK(n > 0, "{}: cannot write '{}': {}", what_, path_,
               n < 0 ? std::strerror(errno) : "no progress");
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void SyncedFileWriter::write_at(size_t offset, const void* data, size_t bytes) {
  LOOM_CHECK(fd_ >= 0,
             "{}: cannot write '{}': it is not open (closed, or abandoned after an error)", what_,
             path_);
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd_, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    LOOM_CHECK(n > 0, "{}: cannot write '{}' at byte {}: {}", what_, path_, offset,
               n < 0 ? std::strerror(errno) : "no progress");
    p += n;
    offset += static_cast<size_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

namespace {

// fsync, where EINVAL means a special file that keeps nothing to sync (/dev/null, a pipe): done.
bool synced(int fd) { return ::fsync(fd) == 0 || errno == EINVAL; }

}  // namespace

void SyncedFileWriter::sync() {
  LOOM_CHECK(fd_ >= 0, "{}: cannot sync '{}': it is not open", what_, path_);
  LOOM_CHECK(synced(fd_), "{}: cannot fsync '{}': {}", what_, path_, std::strerror(errno));
}

void SyncedFileWriter::close() {
  LOOM_CHECK(fd_ >= 0, "{}: cannot close '{}': it is not open", what_, path_);
  const int fd = std::exchange(fd_, -1);
  if (!synced(fd)) {
    const int error = errno;
    ::close(fd);
    LOOM_FAIL("{}: cannot fsync '{}': {}", what_, path_, std::strerror(error));
  }
  // Linux closes the descriptor even when close() fails, so it is never retried.
  LOOM_CHECK(::close(fd) == 0, "{}: cannot close '{}': {}", what_, path_, std::strerror(errno));
}

void check_writable(const std::string& path, std::string_view what) {
  namespace fs = std::filesystem;
  LOOM_CHECK(!path.empty(), "{}: the path is empty", what);
  const fs::path target(path);
  const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  LOOM_CHECK(fs::exists(folder, ec), "{}: cannot write '{}': the folder '{}' does not exist", what,
             path, folder.string());
  LOOM_CHECK(fs::is_directory(folder, ec), "{}: cannot write '{}': '{}' is not a folder", what,
             path, folder.string());
  LOOM_CHECK(!fs::is_directory(target, ec), "{}: cannot write '{}': it is a folder", what, path);
  LOOM_CHECK(::access(folder.c_str(), W_OK | X_OK) == 0,
             "{}: cannot write '{}': the folder '{}' is not writable ({})", what, path,
             folder.string(), std::strerror(errno));
  if (fs::exists(target, ec)) {
    LOOM_CHECK(::access(target.c_str(), W_OK) == 0, "{}: cannot write '{}': {}", what, path,
               std::strerror(errno));
  }
}

void check_directory_writable(const std::string& path, std::string_view what) {
  LOOM_CHECK(!path.empty(), "{}: the path is empty", what);
  namespace fs = std::filesystem;
  std::error_code ec;
  LOOM_CHECK(!fs::exists(path, ec) || fs::is_directory(path, ec),
             "{}: '{}' exists and is not a directory", what, path);
  fs::path existing = fs::absolute(path, ec);
  while (!fs::exists(existing, ec) && existing.has_parent_path() &&
         existing != existing.parent_path()) {
    existing = existing.parent_path();
  }
  LOOM_CHECK(fs::is_directory(existing, ec),
             "{}: cannot make the folder '{}': '{}' is not a folder", what, path,
             existing.string());
  LOOM_CHECK(::access(existing.c_str(), W_OK | X_OK) == 0,
             "{}: cannot write into '{}': the folder '{}' is not writable ({})", what, path,
             existing.string(), std::strerror(errno));
}

void write_file_synced(const std::string& path, std::string_view bytes, std::string_view what) {
  SyncedFileWriter writer(path, what);
  writer.write(bytes.data(), bytes.size());
  writer.close();
}

void sync_directory(const std::string& path, std::string_view what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  LOOM_CHECK(fd >= 0, "{}: cannot open the directory '{}': {}", what, path, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  LOOM_CHECK(rc == 0, "{}: cannot fsync the directory '{}': {}", what, path, std::strerror(error));
}

void sync_parent_directory(const std::string& file_path, std::string_view what) {
  const std::filesystem::path parent = std::filesystem::path(file_path).parent_path();
  sync_directory(parent.empty() ? "." : parent.string(), what);
}

// The temporary file is registered for removal (cleanup_) before it is created (file_), so no
// signal between the two can leave it behind.
AtomicFileWriter::AtomicFileWriter(std::string path, std::string_view what)
    : path_(std::move(path)),
      temp_(path_ + ".tmp"),
      what_(what),
      cleanup_(temp_),
      file_(temp_, what_, SyncedFileWriter::Mode::kLocked) {}

AtomicFileWriter::~AtomicFileWriter() {
  if (!committed_) abandon();
}

// Once only: a second unlink could remove the temporary file of a later write of the same PATH.
void AtomicFileWriter::abandon() noexcept {
  if (abandoned_) return;
  abandoned_ = true;
  // Removed while still locked: closed first, another writer could take the name's file and
  // lose it to this unlink.
  ::unlink(temp_.c_str());
  file_ = SyncedFileWriter();  // closes without syncing
  cleanup_.release();
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  try {
    file_.write(data, bytes);
  } catch (...) {
    abandon();
    throw;
  }
}

void AtomicFileWriter::write_at(size_t offset, const void* data, size_t bytes) {
  try {
    file_.write_at(offset, data, bytes);
  } catch (...) {
    abandon();
    throw;
  }
}

void AtomicFileWriter::commit() {
  LOOM_CHECK(!committed_, "{}: '{}' was already committed", what_, path_);
  try {
    file_.sync();
    // The process survived a signal that removed the file (a chained handler returned).
    const int signal = cleanup_.removed_by_signal();
    LOOM_CHECK(signal == 0,
               "{}: writing '{}' was interrupted by signal {} ({}), which removed '{}'", what_,
               path_, signal, strsignal(signal), temp_);
    if (::rename(temp_.c_str(), path_.c_str()) != 0) {
      LOOM_FAIL("{}: cannot rename '{}' to '{}': {}", what_, temp_, path_, std::strerror(errno));
    }
  } catch (...) {
    abandon();
    throw;
  }
  // The temporary name is free again (another write of PATH may take it: nothing of this writer
  // may remove it now). Closed, letting the lock go, only after the rename: a writer waiting for
  // the lock would otherwise take this file and write over it under PATH.
  committed_ = true;
  cleanup_.release();
  file_.close();
  sync_parent_directory(path_, what_);
}

void write_file_atomically(const std::string& path, std::string_view bytes, std::string_view what) {
  AtomicFileWriter writer(path, what);
  writer.write(bytes.data(), bytes.size());
  writer.commit();
}

}  // namespace loom
