// Picking MASTER_PORT for a single-node job.
#pragma once

#include <string>

namespace loom::loomrun {

// Binds a TCP socket to port 0 on `address` (an IPv4/IPv6 literal or a host name), reads the
// port the kernel chose and closes the socket, so the port is free for rank 0's store to bind a
// moment later. (Another process could take it in between; torchrun accepts the same race.)
// Throws loom::Error naming the address when it cannot be resolved or bound, e.g. when it is
// not an address of this machine.
int pick_free_port(const std::string& address);

}  // namespace loom::loomrun
