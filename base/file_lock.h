// An exclusive lock on a file, held by this process (flock): two jobs that would write one
// folder (a checkpoint directory) find each other instead of deleting each other's work. The
// kernel releases the lock when the holder closes it or ends, however it ends (a kill -9
// included), so a lock is never left behind by a crash; the file itself stays (removing it
// would let a third process lock a file the second already opened).
#pragma once

#include <string>
#include <string_view>

namespace loom {

class FileLock {
 public:
  FileLock() = default;
  FileLock(FileLock&& other) noexcept;
  FileLock& operator=(FileLock&& other) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();

  enum class Result {
    kLocked,       // this process holds it
    kHeld,         // another process does: `detail` is what it wrote
    kUnsupported,  // the filesystem takes no flock (NFS without lockd, Lustre without -o flock):
                   // `detail` is the error; nothing is held
  };
  // Locks `path` (created if missing) for this process, writing `note` into it for whoever finds
  // it held (when the file is writable: another user's lock file is locked read-only, and finds
  // it empty then, since a holder clears its note as it unlocks). Throws loom::InputError naming
  // `what`, the path and the cause when the file can be neither created nor opened, or is
  // read-only here on a filesystem that locks only files open for writing (NFS).
  Result try_lock(const std::string& path, std::string_view what, const std::string& note,
                  std::string* detail);
  bool locked() const { return fd_ >= 0; }
  void unlock();

 private:
  int fd_ = -1;
  bool writable_ = false;  // the note was written, and is cleared on unlock
};

}  // namespace loom
