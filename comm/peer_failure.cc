#include "comm/peer_failure.h"

namespace loom::comm {

bool is_peer_failure(const std::exception& error) {
  return dynamic_cast<const PeerFailure*>(&error) != nullptr;
}

void throw_in_context(const std::exception& cause, std::string message) {
  if (is_peer_failure(cause)) throw PeerFailure(message);
  if (dynamic_cast<const InputError*>(&cause) != nullptr) throw InputError(std::move(message));
  throw Error(std::move(message));
}

}  // namespace loom::comm
