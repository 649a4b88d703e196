// FileStore: a Store kept in one file, for processes on one host or on a shared filesystem
// (torch.distributed's FileStore).
//
// Format and atomicity: the file is an append-only log — an 8-byte header "LOOMFS1\n", then
// records `u8 kind (1 set, 2 delete), u32 key bytes, u64 value bytes, key, value` (little-endian).
// Every operation takes flock() on the file: readers (get/check/wait polls) a shared lock,
// writers (set/add/compare_set/delete) an exclusive one, so set, add and compare_set are atomic
// across processes and threads (an in-process mutex covers threads sharing one FileStore, since
// flock is per open file). Each instance caches the key map and reads only the records appended
// since its last look. A record cut short by a crashed writer is ignored by readers and truncated
// away (with a warning) by the next writer. flock on NFS is emulated with POSIX locks by Linux
// (2.6.12+); the file is not fsync'ed: a store lives for one job.
//
// get()/wait() poll with backoff (1 ms doubling to 50 ms) until the keys exist or the timeout
// passes, then throw naming the missing keys, the timeout and the file.
//
// Lifetime: with world_size > 0, every instance counts itself in (key "/loom/file_store/joined")
// and out ("/loom/file_store/left"); a construction beyond world_size fails (usually a stale file
// from an earlier run: delete it), and the last of world_size instances to be destroyed removes
// the file. With world_size <= 0 the file is left in place for the caller to remove.
//
// add() stores the integer as decimal text, so get() after add() reads e.g. "42".
#pragma once

#include <sys/types.h>

#include <mutex>
#include <string>
#include <unordered_map>

#include "comm/store.h"

namespace loom::comm {

class FileStore : public Store {
 public:
  // Opens (creating if needed) the store file at `path`; its directory must exist. Throws
  // loom::Error naming the path when it cannot be opened or is not a FileStore file.
  explicit FileStore(std::string path, int world_size = -1,
                     Duration timeout = kDefaultStoreTimeout);
  ~FileStore() override;
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool delete_key(const std::string& key) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  using Store::set;
  using Store::wait;

  const std::string& path() const { return path_; }

  static constexpr const char* kJoinedKey = "/loom/file_store/joined";
  static constexpr const char* kLeftKey = "/loom/file_store/left";

 private:
  class Lock;
  // Reads the records appended since the last sync into cache_; returns the offset where the
  // last complete record ends. Call with the file lock held.
  off_t sync_locked();
  // Appends one record at the end of the log (exclusive lock held, after sync_locked).
  void append_locked(uint8_t kind, const std::string& key, const Bytes& value);
  int64_t add_locked(const std::string& key, int64_t delta);
  std::vector<std::string> missing_locked(const std::vector<std::string>& keys);

  std::string path_;
  int world_size_;
  int fd_ = -1;
  std::mutex mutex_;
  off_t synced_ = 0;  // bytes of the file already in cache_
  std::unordered_map<std::string, Bytes> cache_;
};

}  // namespace loom::comm
