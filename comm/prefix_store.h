// A Store view that prepends a prefix to every key: each process group gets its own key space
// over one underlying store.
#pragma once

#include <memory>
#include <string>

#include "comm/store.h"

namespace loom::comm {

class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool delete_key(const std::string& key) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  using Store::set;
  using Store::wait;

  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  std::string with_prefix(const std::string& key) const { return prefix_ + key; }
  std::vector<std::string> with_prefix(const std::vector<std::string>& keys) const;
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace loom::comm
