// Small POSIX TCP helpers for the TcpStore client and server: an owning socket, listen/connect
// with clear errors, and send/receive with a deadline. Every send uses MSG_NOSIGNAL, so a peer
// that has gone away yields EPIPE instead of a SIGPIPE that would kill the process.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom::comm::net {

using Clock = std::chrono::steady_clock;

// An owning file descriptor (closed on destruction); move-only.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { reset(); }
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// "host:port", with IPv6 literals bracketed ("[::1]:29500").
std::string format_host_port(const std::string& host, int port);
// strerror for `err`, thread-safe.
std::string errno_string(int err);
// The remote end of a connected socket as "address:port" ("?" when unknown).
std::string peer_name(int fd);
// The local port a bound socket listens on.
int local_port(int fd);

void set_nonblocking(int fd);
void set_nodelay(int fd);

// A non-blocking listening socket bound to `host:port` (`host` empty: every interface; `port`
// 0: a free port, see local_port). Throws loom::Error naming host:port and the reason.
Socket listen_tcp(const std::string& host, int port, int backlog);

// Connects to host:port, retrying (with backoff) on refusals and unresolvable names until
// `deadline`, since the server may start after its clients. The socket is non-blocking with
// TCP_NODELAY. Throws loom::Error naming host:port, the time waited, the last error and `hint`
// (what to look at).
inline constexpr std::string_view kServerListeningHint =
    "is the server (rank 0, is_server=true) listening there?";
Socket connect_tcp(const std::string& host, int port, Clock::time_point deadline,
                   std::chrono::milliseconds timeout_for_message,
                   std::string_view hint = kServerListeningHint);

enum class IoStatus { kOk, kTimeout, kClosed, kError };

// Sends/receives exactly `size` bytes on a non-blocking socket before `deadline`. On kError,
// `error` holds the reason; kClosed means the peer closed (mid-message for recv).
IoStatus send_all(int fd, const uint8_t* data, size_t size, Clock::time_point deadline,
                  std::string* error);
IoStatus recv_all(int fd, uint8_t* data, size_t size, Clock::time_point deadline,
                  std::string* error);

}  // namespace loom::comm::net
