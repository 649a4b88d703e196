// Store: the key-value rendezvous every process group bootstraps through (torch.distributed's
// Store). Implementations: InMemoryStore (threads in one process, tests), FileStore (processes
// on one host or a shared filesystem), TcpStore (served by rank 0 at MASTER_ADDR:MASTER_PORT),
// and PrefixStore (a key space per process group over any of them).
//
// All operations are thread-safe. Values are byte strings.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace loom::comm {

using Bytes = std::vector<uint8_t>;
using Duration = std::chrono::milliseconds;

inline constexpr Duration kDefaultStoreTimeout = std::chrono::minutes(5);

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Waits (up to timeout()) for `key` to exist, then returns its value.
  virtual Bytes get(const std::string& key) = 0;
  // Atomically adds `delta` to the integer stored at `key` (0 when absent); returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // True when every key exists (does not wait).
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Waits until every key exists; throws loom::Error naming the missing keys after `timeout`.
  virtual void wait(const std::vector<std::string>& keys, Duration timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  // Returns whether the key existed.
  virtual bool delete_key(const std::string& key) = 0;
  // Atomically: when the key holds `expected` (an absent key counts as holding an empty value),
  // stores `desired`; either way returns what the key holds afterwards (empty when absent). So
  // compare_set(k, {}, mine) writes `mine` only when nobody wrote k before, and every caller
  // reads back the one value that won (torch.distributed's Store.compare_set, except that an
  // absent key with a non-empty `expected` reads back empty, not `expected`).
  virtual Bytes compare_set(const std::string& key, const Bytes& expected,
                            const Bytes& desired) = 0;

  Duration timeout() const { return timeout_; }
  void set_timeout(Duration timeout) { timeout_ = timeout; }

  // Convenience for text values.
  void set(const std::string& key, const std::string& value) {
    set(key, Bytes(value.begin(), value.end()));
  }
  std::string get_string(const std::string& key) {
    Bytes value = get(key);
    return std::string(value.begin(), value.end());
  }

 protected:
  Duration timeout_ = kDefaultStoreTimeout;
};

// compare_set's rule, for every store: does a key holding `current` (null: absent) hold
// `expected`? An absent key holds an empty value.
inline bool holds_expected(const Bytes* current, const Bytes& expected) {
  return current == nullptr ? expected.empty() : *current == expected;
}

}  // namespace loom::comm
