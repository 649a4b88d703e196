// The TcpStoreServer's internals, shared by its two source files: tcp_store_server.cc (sockets:
// the poll loop, accepting, reading and parsing, writing, closing) and
// tcp_store_server_requests.cc (the key map, request handling, parked GET/WAIT requests).
// Everything here is used by the server thread only, except the atomics.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "comm/tcp_socket.h"
#include "comm/tcp_store_protocol.h"
#include "comm/tcp_store_server.h"

namespace loom::comm {

namespace ts = tcp_store;
using Clock = net::Clock;

namespace tcp_store_server {

inline constexpr size_t kReadChunk = 64 * 1024;
// Stop parsing a connection's requests while this much of its output is unsent (backpressure
// against a client that sends GETs without reading the replies).
inline constexpr size_t kMaxPendingOutput = 4 * 1024 * 1024;
inline constexpr uint64_t kMaxTimeoutMs = uint64_t{1000} * 60 * 60 * 24 * 365;
// A connection's buffers above this capacity are freed once empty (smaller ones are kept for the
// next request): an idle connection holds at most this much, not its largest request's size.
inline constexpr size_t kKeptBufferBytes = 1024 * 1024;

struct Connection {
  uint64_t id = 0;
  net::Socket socket;
  std::string peer;
  Bytes in;  // unparsed input starts at in_offset
  size_t in_offset = 0;
  Bytes out;  // unsent output starts at out_offset
  size_t out_offset = 0;
  uint64_t parked = 0;  // id of this connection's parked request, 0 when none
  // The whole current request's size once its header is read (its input buffer is allocated for
  // it at once, not grown by doubling), 0 between requests.
  size_t request_bytes = 0;
  // A SET or COMPARE_SET being received: the bytes its values will take when decoded from the
  // buffer (both exist until the buffer is freed), counted from its header on, so requests arriving
  // meanwhile cannot claim that room.
  uint64_t value_reserve = 0;
  uint64_t counted = 0;  // its buffers' capacities and value_reserve, in Impl::buffered_bytes_
  // Set after an ERROR that ends the conversation: input is discarded, and once the reply is
  // flushed the write side is shut down (closing at once could turn into a RST that destroys
  // the reply before the client reads it); the connection closes when the client does.
  bool draining = false;

  bool open() const { return socket.valid(); }
  size_t pending_input() const { return in.size() - in_offset; }
  size_t pending_output() const { return out.size() - out_offset; }
};

struct Waiter {
  uint64_t connection = 0;
  ts::Request request;
  Clock::time_point deadline;
  std::unordered_set<std::string> registered;  // keys whose waiter lists hold this waiter
};

// ['a', 'b'], for log lines.
std::string quoted_keys(const std::vector<std::string>& keys);

}  // namespace tcp_store_server

struct TcpStoreServer::Impl {
  using Connection = tcp_store_server::Connection;
  using Waiter = tcp_store_server::Waiter;

  TcpStoreServerOptions options;
  std::string address;
  net::Socket listener;
  int port = 0;
  net::Socket wake_read;
  net::Socket wake_write;
  std::atomic<bool> stop{false};
  std::atomic<int> connection_count{0};
  std::thread thread;

  // Everything below belongs to the server thread.
  std::unordered_map<std::string, Bytes> data;
  std::map<uint64_t, std::unique_ptr<Connection>> connections;
  uint64_t stored_bytes = 0;  // keys and values in `data`
  // The memory of every connection's buffers (requests being received, replies being sent): the
  // sum of their capacities — what the process holds, not their sizes — and of the values SETs
  // being received will decode, kept as they change (track), so that checking the memory bound
  // on each read costs nothing per connection.
  uint64_t buffered_bytes() const { return buffered_bytes_; }
  uint64_t buffered_bytes_ = 0;
  // Counts c's buffers' capacities anew in buffered_bytes_.
  void track(Connection& c);
  // Sets c.in's size, allocating the current request's whole size at once when it grows.
  void resize_input(Connection& c, size_t size);
  // Empties c's input (freeing it when large) once its requests are handled.
  void clear_input(Connection& c);
  // Replaces (or inserts) `key`'s value, keeping stored_bytes; refuses (returns the reason) when
  // the server would go over options.max_memory_bytes, counting everything it holds (the
  // request still in its buffer too: it and the value exist together until the request's
  // buffer is freed).
  std::optional<std::string> store(const std::string& key, Bytes value);
  // Why a reply carrying `value_bytes` would take the server over its limit, or nothing.
  std::optional<std::string> over_limit_to_reply(uint64_t value_bytes) const;
  uint64_t next_id = 1;
  std::unordered_map<uint64_t, Waiter> waiters;
  std::unordered_map<std::string, std::vector<uint64_t>> waiters_by_key;
  std::set<std::pair<Clock::time_point, uint64_t>> deadlines;
  std::vector<uint64_t> resume;  // connections whose parked request was answered
  bool fd_exhaustion_logged = false;

  void run();
  void loop_once();
  void accept_all();
  void read_input(Connection& c);
  void process_input(Connection& c);
  bool check_header(Connection& c, const ts::Header& header);
  void handle(Connection& c, ts::Request request);
  void handle_add(Connection& c, const ts::Request& request);
  void handle_compare_set(Connection& c, ts::Request request);
  void park(Connection& c, ts::Request request);
  void notify(const std::string& key);
  bool try_complete(uint64_t waiter_id);
  void remove_waiter(uint64_t waiter_id);
  void expire_waiters();
  std::vector<std::string> missing_keys(const std::vector<std::string>& keys) const;
  void reply(Connection& c, Bytes frame);
  void flush(Connection& c);
  void reject(Connection& c, const std::string& problem);
  void close(Connection& c);
  Connection* find(uint64_t id) {
    auto it = connections.find(id);
    return it == connections.end() || !it->second->open() ? nullptr : it->second.get();
  }
};

}  // namespace loom::comm
