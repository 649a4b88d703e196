// Durable file writes (POSIX), one implementation for every layer that writes files.
//
// Two kinds of write:
//   atomic (write_file_atomically, AtomicFileWriter): PATH.tmp is written, fsynced, renamed over
//     PATH and PATH's folder fsynced. A reader sees the old PATH or the whole new one, never a
//     part; once the call returns the new file and its name survive a crash or power loss.
//   in place (SyncedFileWriter, write_file_synced, sync_directory): the file is written where it
//     stands and fsynced on close; for files inside a folder that is itself committed by one
//     rename (the distributed checkpoint's `step_N.partial/`) or appended line by line (metrics).
//
// Errors are loom::Error whose message names `what` (the caller's flag or purpose: "--save",
// "checkpoint"), the file and the system's reason (strerror). A failed atomic write removes its
// temporary file and leaves PATH as it was.
//
// Interrupted writes: while an atomic write's temporary file exists, SIGINT or SIGTERM removes
// it before the process dies of the signal (its exit status is the one the signal gives). The
// first atomic write installs a handler for both that unlinks the registered temporary files,
// puts back the disposition it found and re-raises the signal: the default action ends the
// process; a handler installed before the first write still runs (after the removal), and if the
// process survives it, the interrupted write fails naming the signal and the next write installs
// the cleanup again. A signal ignored at the first write stays ignored (nothing is removed; the
// write goes on).
// Not guaranteed: SIGKILL cannot be caught, and it, a crash (SIGSEGV, abort) or power loss leave
// PATH.tmp behind (PATH is intact; the next write of PATH replaces the temporary file). A handler
// installed after the first write replaces the cleanup unless it chains to the handler it found.
// At most 64 temporary files are protected at once (more are written unprotected). In-place
// files are never removed: a partial one is the caller's to clean (the checkpoint's next save
// removes `.partial` folders). Two writers of one PATH at once (two jobs given one --save, two
// threads): the temporary file is held under an exclusive lock (flock) from its creation until it
// is renamed or removed, so the second writer fails at once naming PATH and the other writer,
// and the first one's file is untouched. A temporary file left by a killed writer holds no lock
// and is replaced. Durability is what the filesystem and drive make of fsync.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "base/error.h"
#include "base/interrupt_cleanup.h"

namespace loom {

// Another writer (a process or thread) holds the file being written: two jobs or ranks given one
// path. An InputError: a job exits 2 on it and launchers do not restart it.
class PathBusyError : public InputError {
 public:
  explicit PathBusyError(const std::string& message) : InputError(message) {}
};

// A file written in place: created or truncated (or, kAppend, created or continued at its end),
// fsynced on close(). Destroyed without close() (an abandoned write), it is closed without
// syncing.
class SyncedFileWriter {
 public:
  // kTruncate: created or truncated. kAppend: created or continued at its end. kLocked: as
  // kTruncate, but under an exclusive lock held until close: throws PathBusyError naming the file
  // when another open of it holds the lock (a file replaced under its name while this one waited
  // for it is opened again, so the lock is always the name's current file's).
  enum class Mode { kTruncate, kAppend, kLocked };
  SyncedFileWriter() = default;
  SyncedFileWriter(std::string path, std::string_view what, Mode mode = Mode::kTruncate);
  SyncedFileWriter(SyncedFileWriter&& other) noexcept;
  SyncedFileWriter& operator=(SyncedFileWriter&& other) noexcept;
  ~SyncedFileWriter();

  bool is_open() const { return fd_ >= 0; }
  void write(const void* data, size_t bytes);
  // Overwrites bytes already written at `offset` (a header whose count is known only at the end);
  // the append position stays where it was.
  void write_at(size_t offset, const void* data, size_t bytes);
  // fsync, the file staying open (what is written so far survives a crash or power loss).
  void sync();
  // fsync, then close. Does not sync the folder: a new file's name needs sync_directory too.
  void close();
  const std::string& path() const { return path_; }

 private:
  std::string path_, what_;
  int fd_ = -1;
};

// Throws loom::Error naming `what` (the flag, key or tool) and the path unless a file can be
// created or replaced at `path`: its folder exists, is a folder and is writable, and the path
// itself is not a folder. Creates nothing: what a program checks before it works.
void check_writable(const std::string& path, std::string_view what);

// Throws naming `what` unless a folder can be made or written at `path`: every part of it that
// exists is a folder, and the deepest one that exists is writable. Creates nothing.
void check_directory_writable(const std::string& path, std::string_view what);

// Writes `bytes` to `path` in place and fsyncs it.
void write_file_synced(const std::string& path, std::string_view bytes, std::string_view what);

// fsyncs a folder: its entries (new files, renames, removals) are durable afterwards.
void sync_directory(const std::string& path, std::string_view what);
// sync_directory on the folder holding `file_path` ("." for a bare name): a new file's name.
void sync_parent_directory(const std::string& file_path, std::string_view what);

// A file built by streaming into PATH.tmp and committed by one rename (see the top of this file);
// for large files (safetensors) that must not be built in memory first.
class AtomicFileWriter {
 public:
  AtomicFileWriter(std::string path, std::string_view what);
  // Uncommitted (an exception, an early return): removes the temporary file, PATH untouched.
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t bytes);
  void write_at(size_t offset, const void* data, size_t bytes);  // as SyncedFileWriter's
  // fsync, rename over PATH, fsync PATH's folder. Once only.
  void commit();
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_; }

 private:
  void abandon() noexcept;

  std::string path_, temp_, what_;
  detail::InterruptCleanup cleanup_;  // registered before the file exists, released after
  SyncedFileWriter file_;
  bool committed_ = false;
  bool abandoned_ = false;
};

// Replaces `path` with `bytes` atomically and durably (AtomicFileWriter in one call).
void write_file_atomically(const std::string& path, std::string_view bytes, std::string_view what);

}  // namespace loom
