#include "checkpoint/sha256.h"

#include <openssl/evp.h>

#include "base/error.h"

namespace loom::checkpoint {

struct Sha256::State {
  EVP_MD_CTX* context = nullptr;
};

Sha256::Sha256() : state_(std::make_unique<State>()) {
  state_->context = EVP_MD_CTX_new();
  LOOM_CHECK(
      state_->context != nullptr && EVP_DigestInit_ex(state_->context, EVP_sha256(), nullptr) == 1,
      "Sha256: OpenSSL could not start a SHA-256 digest");
}

Sha256::~Sha256() { EVP_MD_CTX_free(state_->context); }

void Sha256::update(const void* data, size_t bytes) {
  LOOM_CHECK(EVP_DigestUpdate(state_->context, data, bytes) == 1,
             "Sha256: OpenSSL failed to hash {} bytes", bytes);
}

std::string Sha256::hex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  LOOM_CHECK(EVP_DigestFinal_ex(state_->context, digest, &length) == 1,
             "Sha256: OpenSSL failed to finish the digest");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < length; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 15]);
  }
  return out;
}

std::string sha256_hex(const void* data, size_t bytes) {
  Sha256 hasher;
  hasher.update(data, bytes);
  return hasher.hex();
}

}  // namespace loom::checkpoint
