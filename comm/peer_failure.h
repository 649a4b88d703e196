// PeerFailure: a failure this rank saw in another rank, as opposed to one of its own.
//
// A process group fails an operation with a PeerFailure when a peer caused it: the peer left or
// broke its connection, or did not arrive within the group's timeout (or the group was poisoned
// by such a failure first). A rank that ends on one exits with comm::kExitPeerFailed
// (launch_env.h), so that its launcher blames the rank that failed first rather than whichever it
// happened to reap first: when one rank throws, its peers see its connections close while it is
// still unwinding, and often exit before it.
#pragma once

#include <exception>
#include <string>

#include "base/error.h"

namespace loom::comm {

class PeerFailure : public Error {
 public:
  explicit PeerFailure(const std::string& message) : Error(message) {}
};

// Whether `error` is a PeerFailure.
bool is_peer_failure(const std::exception& error);

// Throws `message` (`cause` with context added) as the same kind of error as `cause`: a
// PeerFailure stays one, an InputError too, anything else becomes a loom::Error. For code that
// catches to add context, such as a pipeline naming the action that failed.
[[noreturn]] void throw_in_context(const std::exception& cause, std::string message);

}  // namespace loom::comm
