#include "comm/tcp_socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "base/error.h"

namespace loom::comm::net {

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

void Socket::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string format_host_port(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host.empty() ? "*" : host, port);
}

std::string errno_string(int err) {
  char buffer[256];
  // GNU strerror_r returns the message (possibly not in `buffer`).
  return std::string(strerror_r(err, buffer, sizeof(buffer)));
}

namespace {

std::string address_string(const sockaddr* addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (addr->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(addr);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
  } else if (addr->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
  } else {
    return "?";
  }
  return format_host_port(host, port);
}

struct AddrInfoList {
  addrinfo* head = nullptr;
  ~AddrInfoList() {
    if (head != nullptr) freeaddrinfo(head);
  }
};

// getaddrinfo for TCP; returns 0 or the gai error code.
int resolve(const std::string& host, int port, bool passive, AddrInfoList* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  const std::string service = std::to_string(port);
  return getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &out->head);
}

int milliseconds_until(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

// Waits for `events` on `fd` until `deadline`; returns kOk when ready.
IoStatus wait_for(int fd, short events, Clock::time_point deadline, std::string* error) {
  while (true) {
    pollfd pfd{fd, events, 0};
    const int timeout_ms = milliseconds_until(deadline);
    const int ready = ::poll(&pfd, 1, timeout_ms);
    if (ready > 0) return IoStatus::kOk;  // errors surface from the following send/recv
    if (ready == 0) {
      if (Clock::now() >= deadline) return IoStatus::kTimeout;
      continue;
    }
    if (errno == EINTR) continue;
    *error = "poll: " + errno_string(errno);
    return IoStatus::kError;
  }
}

}  // namespace

std::string peer_name(int fd) {
  sockaddr_storage addr{};
  socklen_t length = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) return "?";
  return address_string(reinterpret_cast<const sockaddr*>(&addr));
}

int local_port(int fd) {
  sockaddr_storage addr{};
  socklen_t length = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) return -1;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return -1;
}

void set_nonblocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  LOOM_CHECK(flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0,
             "socket: cannot make fd {} non-blocking: {}", fd, errno_string(errno));
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // best effort
}

Socket listen_tcp(const std::string& host, int port, int backlog) {
  const std::string where = format_host_port(host, port);
  LOOM_CHECK(port >= 0 && port <= 65535, "listen on {}: port {} is outside 0..65535", where, port);
  AddrInfoList addresses;
  const int gai = resolve(host, port, /*passive=*/true, &addresses);
  LOOM_CHECK(gai == 0, "listen on {}: cannot resolve '{}': {}", where, host, gai_strerror(gai));
  std::string last_error = "no addresses";
  for (addrinfo* ai = addresses.head; ai != nullptr; ai = ai->ai_next) {
    Socket sock(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!sock.valid()) {
      last_error = "socket: " + errno_string(errno);
      continue;
    }
    int one = 1;
    setsockopt(sock.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(sock.fd(), ai->ai_addr, ai->ai_addrlen) != 0) {
      last_error = fmt::format("bind {}: {}", address_string(ai->ai_addr), errno_string(errno));
      continue;
    }
    if (::listen(sock.fd(), backlog) != 0) {
      last_error = "listen: " + errno_string(errno);
      continue;
    }
    set_nonblocking(sock.fd());
    return sock;
  }
  LOOM_FAIL("listen on {}: {} (is another process using the port?)", where, last_error);
}

Socket connect_tcp(const std::string& host, int port, Clock::time_point deadline,
                   std::chrono::milliseconds timeout_for_message, std::string_view hint) {
  const std::string where = format_host_port(host, port);
  LOOM_CHECK(port > 0 && port <= 65535, "connect to {}: port {} is outside 1..65535", where, port);
  std::string last_error = "no attempt made";
  auto backoff = std::chrono::milliseconds(5);
  int attempts = 0;
  while (true) {
    ++attempts;
    AddrInfoList addresses;
    const int gai = resolve(host, port, /*passive=*/false, &addresses);
    if (gai != 0) last_error = fmt::format("cannot resolve '{}': {}", host, gai_strerror(gai));
    for (addrinfo* ai = gai == 0 ? addresses.head : nullptr; ai != nullptr; ai = ai->ai_next) {
      Socket sock(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
      if (!sock.valid()) {
        last_error = "socket: " + errno_string(errno);
        continue;
      }
      set_nonblocking(sock.fd());
      int rc = ::connect(sock.fd(), ai->ai_addr, ai->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        std::string poll_error;
        const IoStatus status = wait_for(sock.fd(), POLLOUT, deadline, &poll_error);
        if (status != IoStatus::kOk) {
          last_error = status == IoStatus::kTimeout ? "connection attempt timed out" : poll_error;
          continue;
        }
        int so_error = 0;
        socklen_t length = sizeof(so_error);
        getsockopt(sock.fd(), SOL_SOCKET, SO_ERROR, &so_error, &length);
        rc = so_error == 0 ? 0 : -1;
        errno = so_error;
      }
      if (rc != 0) {
        last_error = errno_string(errno);
        continue;
      }
      set_nodelay(sock.fd());
      return sock;
    }
    const auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  LOOM_FAIL("could not connect to {} within {} ms ({} attempts; last error: {}); {}", where,
            timeout_for_message.count(), attempts, last_error, hint);
}

IoStatus send_all(int fd, const uint8_t* data, size_t size, Clock::time_point deadline,
                  std::string* error) {
  size_t sent = 0;
  while (sent < size) {
    const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const IoStatus status = wait_for(fd, POLLOUT, deadline, error);
      if (status != IoStatus::kOk) return status;
      continue;
    }
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) return IoStatus::kClosed;
    *error = "send: " + errno_string(errno);
    return IoStatus::kError;
  }
  return IoStatus::kOk;
}

IoStatus recv_all(int fd, uint8_t* data, size_t size, Clock::time_point deadline,
                  std::string* error) {
  size_t received = 0;
  while (received < size) {
    const ssize_t n = ::recv(fd, data + received, size - received, MSG_DONTWAIT);
    if (n > 0) {
      received += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return IoStatus::kClosed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      const IoStatus status = wait_for(fd, POLLIN, deadline, error);
      if (status != IoStatus::kOk) return status;
      continue;
    }
    if (errno == ECONNRESET) return IoStatus::kClosed;
    *error = "recv: " + errno_string(errno);
    return IoStatus::kError;
  }
  return IoStatus::kOk;
}

}  // namespace loom::comm::net
