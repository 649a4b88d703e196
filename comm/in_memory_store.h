// InMemoryStore: a Store for threads of one process (tests, run_on_ranks).
//
// Thread-safe; get() and wait() block on a condition variable until the keys exist or the
// timeout passes, then throw a loom::Error that names the missing keys and the timeout.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "comm/store.h"

namespace loom::comm {

class InMemoryStore : public Store {
 public:
  InMemoryStore() = default;
  explicit InMemoryStore(Duration timeout) { timeout_ = timeout; }

  void set(const std::string& key, const Bytes& value) override;
  // Waits up to timeout() for `key`.
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool delete_key(const std::string& key) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  using Store::set;
  using Store::wait;

  // Number of keys held (for tests).
  size_t size() const;

 private:
  std::vector<std::string> missing_locked(const std::vector<std::string>& keys) const;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, Bytes> values_;
};

}  // namespace loom::comm
