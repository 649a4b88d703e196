// TcpStore: a Store served over TCP by one process (rank 0, `is_server = true`) to every rank
// (torch.distributed's TCPStore). Every rank, the server's own included, talks to the server
// through client connections; see tcp_store_protocol.h for the wire format and
// tcp_store_server.h for how the server works.
//
//   TcpStoreOptions options;
//   options.is_server = rank == 0;
//   auto store = std::make_shared<TcpStore>("10.0.0.1", 29500, options);
//
// Clients:
//   - connect with retries until `timeout` (the server may start after its clients); the error
//     names host:port, the time waited and the last connect error.
//   - keep a small pool of connections: each call borrows an idle one or opens a new one, so a
//     thread blocked in get()/wait() never blocks another thread's set() on the same TcpStore.
//   - get()/wait() are answered by the server when the keys exist, or after the timeout with an
//     error naming the key(s), host:port and the timeout. A connection that fails or stops
//     answering is closed, never reused; the next call opens a fresh one.
//   - add() stores the integer as decimal text, so get() after add() reads e.g. "42".
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/store.h"
#include "comm/tcp_socket.h"
#include "comm/tcp_store_protocol.h"

namespace loom::comm {

class TcpStoreServer;

struct TcpStoreOptions {
  // Start the server in this process (rank 0) before connecting to it.
  bool is_server = false;
  // Server only: the address to listen on. Empty = the `host` given to TcpStore; "*" = every
  // interface (what a multi-node job's rank 0 usually wants).
  std::string bind_host;
  // Store timeout: connecting, get() and wait().
  Duration timeout = kDefaultStoreTimeout;
  // Per-request caps, enforced by the client before sending and by the server on receipt.
  tcp_store::Limits limits;
};

class TcpStore : public Store {
 public:
  // Starts the server when options.is_server (port 0 = pick a free one, see port()), then
  // connects (retrying until options.timeout). Throws loom::Error naming host:port.
  TcpStore(std::string host, int port, TcpStoreOptions options = {});
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  bool delete_key(const std::string& key) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  using Store::set;
  using Store::wait;

  const std::string& host() const { return host_; }
  // The server's port (the picked one when constructed with port 0 and is_server).
  int port() const { return port_; }
  // "host:port", as errors print it.
  std::string address() const { return net::format_host_port(host_, port_); }
  // The server this TcpStore runs, or null on clients.
  const TcpStoreServer* server() const { return server_.get(); }

 private:
  struct Response {
    tcp_store::Status status;
    Bytes body;
  };
  // Sends `request` and reads the response; `what` describes the call for errors ("get('k')").
  // `reply_within` bounds the wait for the response (on top of the server-side timeout).
  Response roundtrip(const tcp_store::Request& request, const std::string& what,
                     Duration reply_within);
  net::Socket borrow_connection();
  void return_connection(net::Socket socket);
  Bytes encode(const tcp_store::Request& request, const std::string& what) const;
  // The one value a GET or COMPARE_SET reply carries.
  Bytes value_of(const Response& response, const std::string& what) const;
  [[noreturn]] void throw_server_error(const Response& response, const std::string& what) const;

  std::string host_;
  int port_;
  TcpStoreOptions options_;
  std::unique_ptr<TcpStoreServer> server_;  // declared first: destroyed after the connections
  std::mutex pool_mutex_;
  std::vector<net::Socket> idle_connections_;
  // Set once a connection succeeded; later reconnects retry only briefly. Atomic: connections
  // are made outside pool_mutex_, from several threads.
  std::atomic<bool> reached_server_{false};
  // A server this client reached before and then could not reach again for the reconnect
  // window: gone (its process exited). Later connections fail at once with `gone_reason_`
  // instead of each waiting out the window (a rank's process groups each report a failure
  // through the store: one wait, not one per group).
  std::atomic<bool> server_gone_{false};
  std::string gone_reason_;  // written once, before server_gone_ is set
};

}  // namespace loom::comm
