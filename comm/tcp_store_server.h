// TcpStoreServer: the key-value server behind TcpStore (run by rank 0).
//
// One thread multiplexes the listening socket and every client connection with poll(). A
// rendezvous store sees small, bursty traffic from up to a few thousand ranks, so one thread
// with no locks around the key map is simpler and fast enough, and it makes GET/WAIT cheap:
// a request whose keys are missing is *parked* (connection id + deadline) and answered when a
// SET/ADD supplies the keys, or with TIMEOUT at its deadline, while the thread keeps serving
// everyone else. A thread per connection would need a lock and a condition variable per
// waiting client for the same result.
//
// Sockets are non-blocking; each connection has an input buffer (requests are parsed as soon as
// complete; a header is validated as soon as its 12 bytes arrive, so a 1 GiB length claim is
// rejected before any body is read) and an output buffer flushed on POLLOUT. A malformed,
// truncated or oversized request closes only its own connection, with a LOOM_LOG(warn) naming
// the peer and the problem. Sends use MSG_NOSIGNAL (a vanished peer is EPIPE, not SIGPIPE).
//
// Destruction wakes the thread through a pipe, closes every connection and joins: no hang,
// even with parked requests (their clients see the connection close).
#pragma once

#include <memory>
#include <string>

#include "comm/tcp_store_protocol.h"

namespace loom::comm {

struct TcpStoreServerOptions {
  // Address to listen on; empty = every interface. Tests use "127.0.0.1".
  std::string bind_host;
  // 0 = pick a free port (see port()).
  int port = 0;
  tcp_store::Limits limits;
  int backlog = 2048;
  // The most the server holds at once, across every connection: requests being received plus
  // the stored keys and values. A connection whose next bytes would go over it is dropped with
  // a warning naming the limit, and a SET or ADD that would is refused (the client throws with
  // the reason), so no set of clients can grow the server (the launcher) without bound.
  size_t max_memory_bytes = 256 * 1024 * 1024;
};

class TcpStoreServer {
 public:
  // Binds and starts serving; throws loom::Error naming host:port when the bind fails.
  explicit TcpStoreServer(TcpStoreServerOptions options);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // The port actually bound (the picked one when options.port was 0).
  int port() const;
  // "bind_host:port", for messages.
  std::string address() const;
  // Open client connections right now (for tests and diagnostics).
  int num_connections() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::comm
