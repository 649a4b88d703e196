#include "comm/prefix_store.h"

#include "base/error.h"

namespace loom::comm {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  LOOM_CHECK(base_ != nullptr, "PrefixStore '{}': the base store is null", prefix_);
  timeout_ = base_->timeout();
}

void PrefixStore::set(const std::string& key, const Bytes& value) {
  base_->set(with_prefix(key), value);
}
Bytes PrefixStore::get(const std::string& key) { return base_->get(with_prefix(key)); }
int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return base_->add(with_prefix(key), delta);
}
bool PrefixStore::check(const std::vector<std::string>& keys) {
  return base_->check(with_prefix(keys));
}
void PrefixStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  base_->wait(with_prefix(keys), timeout);
}
bool PrefixStore::delete_key(const std::string& key) { return base_->delete_key(with_prefix(key)); }
Bytes PrefixStore::compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) {
  return base_->compare_set(with_prefix(key), expected, desired);
}

std::vector<std::string> PrefixStore::with_prefix(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(prefix_ + k);
  return out;
}

}  // namespace loom::comm
