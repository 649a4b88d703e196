// SHA-256 (OpenSSL's libcrypto, a maintained implementation using the CPU's SHA extensions where
// it has them) for the checksums a checkpoint records and verifies.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace loom::checkpoint {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void update(const void* data, size_t bytes);
  // The digest as 64 lowercase hex digits; the hasher is done after it.
  std::string hex();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The SHA-256 of `bytes` bytes at `data`, as hex.
std::string sha256_hex(const void* data, size_t bytes);

}  // namespace loom::checkpoint
