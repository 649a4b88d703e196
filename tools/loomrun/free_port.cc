#include "tools/loomrun/free_port.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace loom::loomrun {

namespace {

int port_of(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port);
  }
  return ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port);
}

}  // namespace

int pick_free_port(const std::string& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int resolve_status = getaddrinfo(address.c_str(), "0", &hints, &found);
  LOOM_CHECK(resolve_status == 0, "cannot pick a free port: cannot resolve --master-addr '{}': {}",
             address, gai_strerror(resolve_status));
  std::string last_error = "no address";
  int port = 0;
  for (addrinfo* candidate = found; candidate != nullptr && port == 0;
       candidate = candidate->ai_next) {
    const int fd =
        socket(candidate->ai_family, candidate->ai_socktype | SOCK_CLOEXEC, candidate->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t length = sizeof(bound);
    if (bind(fd, candidate->ai_addr, candidate->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) == 0) {
      port = port_of(bound);
    } else {
      last_error = std::strerror(errno);
    }
    close(fd);
  }
  freeaddrinfo(found);
  LOOM_CHECK(port != 0,
             "cannot pick a free port on --master-addr '{}': {}; is it an address of this "
             "machine? Pass --master-port to choose the port yourself",
             address, last_error);
  return port;
}

}  // namespace loom::loomrun
