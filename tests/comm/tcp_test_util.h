// Helpers for TcpStore tests: a free loopback port, and a raw client that speaks bytes rather
// than the protocol (for misbehaving-client tests).
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::comm::testing {

// A port nobody listens on right now (bound to 127.0.0.1:0, then released).
inline int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t length = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// A blocking TCP connection to 127.0.0.1:port that sends whatever it is given.
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    EXPECT_TRUE(connected_) << "raw client could not connect to port " << port;
  }
  ~RawClient() { close(); }

  void send(const std::vector<uint8_t>& bytes) {
    ASSERT_EQ(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
  void send(const std::string& text) { send(std::vector<uint8_t>(text.begin(), text.end())); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // "127.0.0.1:<local port>": how the server names this peer.
  std::string name() const {
    sockaddr_in addr{};
    socklen_t length = sizeof(addr);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &length);
    return "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  }
  // Reads until the server closes the connection (true) or `timeout` passes (false); the bytes
  // read are appended to `received`.
  bool wait_for_close(std::chrono::milliseconds timeout, std::vector<uint8_t>* received = nullptr) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd pfd{fd_, POLLIN, 0};
      if (::poll(&pfd, 1, 20) <= 0) continue;
      uint8_t buffer[4096];
      const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
      if (n <= 0) return true;  // EOF or reset
      if (received != nullptr) received->insert(received->end(), buffer, buffer + n);
    }
    return false;
  }
  bool connected() const { return connected_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

// A 12-byte TcpStore header with the given fields (see comm/tcp_store_protocol.h).
inline std::vector<uint8_t> raw_header(uint8_t magic, uint8_t version, uint8_t code,
                                       uint64_t body_bytes) {
  std::vector<uint8_t> h = {magic, version, code, 0};
  for (int i = 0; i < 8; ++i) h.push_back(static_cast<uint8_t>(body_bytes >> (8 * i)));
  return h;
}

}  // namespace loom::comm::testing
