#include "comm/in_memory_store.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>

#include "base/error.h"

namespace loom::comm {

namespace {

std::string quoted_list(const std::vector<std::string>& keys) {
  std::vector<std::string> quoted;
  quoted.reserve(keys.size());
  for (const auto& k : keys) quoted.push_back(fmt::format("'{}'", k));
  return fmt::format("[{}]", fmt::join(quoted, ", "));
}

}  // namespace

void InMemoryStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    values_[key] = value;
  }
  changed_.notify_all();
}

Bytes InMemoryStore::get(const std::string& key) {
  std::unique_lock<std::mutex> lock(mutex_);
  const Duration limit = timeout_;
  const bool found = changed_.wait_for(lock, limit, [&] { return values_.count(key) != 0; });
  LOOM_CHECK(found, "InMemoryStore::get: key '{}' did not appear within {} ms", key, limit.count());
  return values_.at(key);
}

int64_t InMemoryStore::add(const std::string& key, int64_t delta) {
  int64_t result = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = values_.find(key);
    int64_t current = 0;
    if (it != values_.end()) {
      const std::string text(it->second.begin(), it->second.end());
      const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), current);
      LOOM_CHECK(
          error == std::errc() && end == text.data() + text.size() && !text.empty(),
          "InMemoryStore add('{}'): the stored value '{}' is not an integer; add needs a key "
          "that is absent or was written by add",
          key, text);
    }
    result = current + delta;
    const std::string text = std::to_string(result);
    values_[key] = Bytes(text.begin(), text.end());
  }
  changed_.notify_all();
  return result;
}

bool InMemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  return missing_locked(keys).empty();
}

void InMemoryStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  const bool found = changed_.wait_for(lock, timeout, [&] { return missing_locked(keys).empty(); });
  if (!found) {
    LOOM_FAIL("InMemoryStore wait({}): keys {} were not set within the timeout of {} ms",
              quoted_list(keys), quoted_list(missing_locked(keys)), timeout.count());
  }
}

bool InMemoryStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return values_.erase(key) != 0;
}

Bytes InMemoryStore::compare_set(const std::string& key, const Bytes& expected,
                                 const Bytes& desired) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto it = values_.find(key);
  if (!holds_expected(it == values_.end() ? nullptr : &it->second, expected)) {
    return it == values_.end() ? Bytes() : it->second;
  }
  values_.insert_or_assign(key, desired);
  lock.unlock();
  changed_.notify_all();
  return desired;
}

size_t InMemoryStore::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return values_.size();
}

std::vector<std::string> InMemoryStore::missing_locked(const std::vector<std::string>& keys) const {
  std::vector<std::string> missing;
  for (const auto& k : keys) {
    if (values_.count(k) == 0) missing.push_back(k);
  }
  return missing;
}

}  // namespace loom::comm
