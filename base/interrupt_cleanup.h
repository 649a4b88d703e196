// Removing temporary files when SIGINT or SIGTERM ends the process (a private header of
// //base:durable_file; the contract is written in base/durable_file.h).
//
// The registry is a fixed array of slots, each a path buffer and an atomic state, so that the
// signal handler allocates nothing, takes no lock and calls only async-signal-safe functions
// (unlink, getpid, sigaction, raise).
#pragma once

#include <string>

namespace loom::detail {

// While alive, `path` (made absolute, so a later chdir does not redirect it) is unlinked if
// SIGINT or SIGTERM arrives. The first one installs the handlers.
class InterruptCleanup {
 public:
  explicit InterruptCleanup(const std::string& path);
  ~InterruptCleanup() { release(); }
  InterruptCleanup(const InterruptCleanup&) = delete;
  InterruptCleanup& operator=(const InterruptCleanup&) = delete;

  // False when the path is not protected: every slot busy, or the path too long for one.
  bool protects() const { return slot_ >= 0; }
  // The signal that removed the file while the process survived it (a chained handler that
  // returned), or 0.
  int removed_by_signal() const;
  // Forgets the path (after it was renamed away or removed); idempotent.
  void release();

 private:
  int slot_ = -1;
};

}  // namespace loom::detail
