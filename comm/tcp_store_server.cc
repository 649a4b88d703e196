#include "comm/tcp_store_server.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "base/error.h"
#include "base/logging.h"
#include "comm/tcp_store_server_impl.h"

namespace loom::comm {

using namespace tcp_store_server;

namespace {
// Requests whose values are decoded out of the input buffer (both exist until it is freed).
bool copies_a_value(ts::Op op) { return op == ts::Op::kSet || op == ts::Op::kCompareSet; }
}  // namespace

TcpStoreServer::TcpStoreServer(TcpStoreServerOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.options = std::move(options);
  s.listener = net::listen_tcp(s.options.bind_host, s.options.port, s.options.backlog);
  s.port = net::local_port(s.listener.fd());
  s.address = net::format_host_port(s.options.bind_host, s.port);
  int pipe_fds[2];
  LOOM_CHECK(::pipe2(pipe_fds, O_NONBLOCK | O_CLOEXEC) == 0, "TcpStore server {}: pipe2 failed: {}",
             s.address, net::errno_string(errno));
  s.wake_read.reset(pipe_fds[0]);
  s.wake_write.reset(pipe_fds[1]);
  s.thread = std::thread([&s] { s.run(); });
}

TcpStoreServer::~TcpStoreServer() {
  impl_->stop.store(true);
  const uint8_t byte = 1;
  while (::write(impl_->wake_write.fd(), &byte, 1) < 0 && errno == EINTR) {
  }
  impl_->thread.join();
}

int TcpStoreServer::port() const { return impl_->port; }
std::string TcpStoreServer::address() const { return impl_->address; }
int TcpStoreServer::num_connections() const { return impl_->connection_count.load(); }

void TcpStoreServer::Impl::run() {
  try {
    while (!stop.load()) loop_once();
  } catch (const std::exception& e) {
    LOOM_LOG(error, "TcpStore server {}: stopped serving after an unexpected error: {}", address,
             e.what());
  }
  for (auto& [id, c] : connections) {
    if (c->open()) close(*c);
  }
  connections.clear();
}

void TcpStoreServer::Impl::loop_once() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  fds.reserve(connections.size() + 2);
  fds.push_back({wake_read.fd(), POLLIN, 0});
  fds.push_back({listener.fd(), POLLIN, 0});
  for (auto& [id, c] : connections) {
    short events = POLLIN;
    if (c->pending_output() > 0) events |= POLLOUT;
    fds.push_back({c->socket.fd(), events, 0});
    ids.push_back(id);
  }
  int timeout_ms = -1;
  if (!deadlines.empty()) {
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadlines.begin()->first - Clock::now());
    timeout_ms = static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30));
  }
  const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
  if (ready < 0) {
    if (errno == EINTR) return;
    LOOM_FAIL("poll failed: {}", net::errno_string(errno));
  }
  if (fds[0].revents != 0) {
    uint8_t buffer[64];
    while (::read(wake_read.fd(), buffer, sizeof(buffer)) > 0) {
    }
    if (stop.load()) return;
  }
  if (fds[1].revents & POLLIN) accept_all();
  for (size_t i = 0; i < ids.size(); ++i) {
    const short revents = fds[i + 2].revents;
    Connection* c = find(ids[i]);
    if (c == nullptr || revents == 0) continue;
    if (revents & (POLLIN | POLLHUP | POLLERR)) read_input(*c);
    if (c->open() && (revents & POLLOUT)) {
      flush(*c);
      if (c->open()) process_input(*c);  // output space freed: parse what was held back
    }
  }
  expire_waiters();
  while (!resume.empty()) {
    std::vector<uint64_t> batch;
    batch.swap(resume);
    for (uint64_t id : batch) {
      if (Connection* c = find(id)) process_input(*c);
    }
  }
  for (auto it = connections.begin(); it != connections.end();) {
    it = it->second->open() ? std::next(it) : connections.erase(it);
  }
}

void TcpStoreServer::Impl::accept_all() {
  while (true) {
    const int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if ((errno == EMFILE || errno == ENFILE) && !fd_exhaustion_logged) {
        fd_exhaustion_logged = true;
        LOOM_LOG(error,
                 "TcpStore server {}: cannot accept more clients ({} open): {}; raise `ulimit -n`",
                 address, connections.size(), net::errno_string(errno));
      } else if (errno != EMFILE && errno != ENFILE) {
        LOOM_LOG(warn, "TcpStore server {}: accept failed: {}", address, net::errno_string(errno));
      }
      return;
    }
    net::set_nodelay(fd);
    auto c = std::make_unique<Connection>();
    c->id = next_id++;
    c->socket.reset(fd);
    c->peer = net::peer_name(fd);
    LOOM_LOG(debug, "TcpStore server {}: client {} connected", address, c->peer);
    connections.emplace(c->id, std::move(c));
    connection_count.fetch_add(1);
  }
}

void TcpStoreServer::Impl::read_input(Connection& c) {
  const uint64_t max_buffered =
      ts::kHeaderBytes + ts::max_request_body(options.limits) + kReadChunk;
  while (c.open()) {
    if (c.pending_input() > max_buffered) {
      return reject(c, fmt::format("sent {} bytes of requests without waiting for replies",
                                   c.pending_input()));
    }
    // Across connections too: what the next read allocates must fit beside everything held.
    const uint64_t held = stored_bytes + buffered_bytes();
    const size_t needed = c.in.size() + kReadChunk;
    const uint64_t growth = needed > c.in.capacity()
                                ? std::max(needed, c.request_bytes + kReadChunk) - c.in.capacity()
                                : 0;
    if (held + growth > options.max_memory_bytes) {
      return reject(c, fmt::format("its request would take the server over its limit of {} bytes "
                                   "(TcpStoreServerOptions::max_memory_bytes; {} bytes held: {} "
                                   "stored, the rest requests being received)",
                                   options.max_memory_bytes, held, stored_bytes));
    }
    const size_t old_size = c.in.size();
    resize_input(c, old_size + kReadChunk);
    const ssize_t n = ::recv(c.socket.fd(), c.in.data() + old_size, kReadChunk, MSG_DONTWAIT);
    resize_input(c, old_size + std::max<ssize_t>(n, 0));
    if (n > 0) {
      if (c.draining) {
        clear_input(c);  // a rejected client: discard whatever else it sends
      } else {
        process_input(c);
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    const std::string how = n == 0 ? "closed the connection"
                                   : "reset the connection (" + net::errno_string(errno) + ")";
    if (c.pending_input() > 0 && !c.draining) {
      std::string expected = "a 12-byte header";
      if (c.pending_input() >= ts::kHeaderBytes) {
        expected = fmt::format(
            "{} bytes", ts::kHeaderBytes + ts::decode_header(c.in.data() + c.in_offset).body_bytes);
      }
      LOOM_LOG(
          warn,
          "TcpStore server {}: client {} {} in the middle of a request ({} bytes received of {}); "
          "dropped it",
          address, c.peer, how, c.pending_input(), expected);
    } else if (c.parked != 0) {
      LOOM_LOG(debug, "TcpStore server {}: client {} {} while waiting", address, c.peer, how);
    } else {
      LOOM_LOG(debug, "TcpStore server {}: client {} {}", address, c.peer, how);
    }
    return close(c);
  }
}

void TcpStoreServer::Impl::process_input(Connection& c) {
  while (c.open() && !c.draining && c.parked == 0 && c.pending_output() < kMaxPendingOutput) {
    if (c.pending_input() < ts::kHeaderBytes) break;
    const ts::Header header = ts::decode_header(c.in.data() + c.in_offset);
    if (!check_header(c, header)) return;
    c.request_bytes = c.in_offset + ts::kHeaderBytes + header.body_bytes;
    if (copies_a_value(static_cast<ts::Op>(header.code)) && c.value_reserve == 0) {
      c.value_reserve = header.body_bytes;
      track(c);
    }
    if (c.pending_input() - ts::kHeaderBytes < header.body_bytes) break;
    const uint8_t* body = c.in.data() + c.in_offset + ts::kHeaderBytes;
    const auto op = static_cast<ts::Op>(header.code);
    ts::Request request;
    try {
      request = ts::decode_request(op, body, header.body_bytes, options.limits);
    } catch (const ts::ProtocolError& e) {
      return reject(c, fmt::format("malformed {} request: {}", ts::op_name(op), e.what()));
    }
    c.in_offset += ts::kHeaderBytes + header.body_bytes;
    c.request_bytes = 0;
    c.value_reserve = 0;  // the value exists now (request.value): store() counts it
    track(c);
    handle(c, std::move(request));
  }
  if (c.in_offset == c.in.size()) {
    clear_input(c);
  } else if (c.in_offset > (1u << 20)) {
    c.request_bytes = c.request_bytes > c.in_offset ? c.request_bytes - c.in_offset : 0;
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(c.in_offset));
    c.in_offset = 0;
  }
}

bool TcpStoreServer::Impl::check_header(Connection& c, const ts::Header& header) {
  if (header.magic != ts::kMagic) {
    reject(c, fmt::format("bad magic byte 0x{:02x} (expected 0x{:02x}); not a TcpStore client?",
                          header.magic, ts::kMagic));
    return false;
  }
  if (header.version != ts::kVersion) {
    const std::string problem =
        fmt::format("the client speaks TcpStore protocol version {}, this server version {}",
                    header.version, ts::kVersion);
    LOOM_LOG(warn, "TcpStore server {}: closing the connection from {}: {}", address, c.peer,
             problem);
    ts::Writer w;
    w.key(problem);
    reply(c, w.finish(static_cast<uint8_t>(ts::Status::kError)));
    c.draining = true;
    flush(c);
    return false;
  }
  if (!ts::is_valid_op(header.code)) {
    reject(c, fmt::format("unknown op code {} (expected 1..6)", header.code));
    return false;
  }
  if (header.reserved != 0) {
    reject(c, fmt::format("reserved header byte is {} (expected 0)", header.reserved));
    return false;
  }
  const uint64_t limit = ts::max_request_body(options.limits);
  if (header.body_bytes > limit) {
    reject(
        c,
        fmt::format(
            "{} request claims a body of {} bytes, over the limit of {} bytes (max_value_bytes={}, "
            "max_key_bytes={})",
            ts::op_name(static_cast<ts::Op>(header.code)), header.body_bytes, limit,
            options.limits.max_value_bytes, options.limits.max_key_bytes));
    return false;
  }
  // Room for the whole request beside what the server holds for everyone else — its buffer,
  // and for a SET the value decoded from it, which exist together until the buffer is freed:
  // otherwise refuse it with the reason (the client throws it) and discard its body as it
  // arrives.
  const uint64_t others = stored_bytes + buffered_bytes() - c.in.capacity() - c.value_reserve;
  const uint64_t request = ts::kHeaderBytes + header.body_bytes;
  const bool copies_value = copies_a_value(static_cast<ts::Op>(header.code));
  const uint64_t needs = request + kReadChunk + (copies_value ? header.body_bytes : 0);
  if (others + needs > options.max_memory_bytes) {
    const std::string problem = fmt::format(
        "a {} request of {} bytes would take the server over its limit of {} bytes "
        "(TcpStoreServerOptions::max_memory_bytes; it needs {} bytes{}, and {} are held: {} "
        "stored, the rest other clients' requests and replies)",
        ts::op_name(static_cast<ts::Op>(header.code)), request, options.max_memory_bytes, needs,
        copies_value ? " for its buffer and the value decoded from it" : "", others, stored_bytes);
    LOOM_LOG(warn, "TcpStore server {}: refusing a request from {}: {}", address, c.peer, problem);
    ts::Writer w;
    w.key(problem);
    reply(c, w.finish(static_cast<uint8_t>(ts::Status::kError)));
    c.draining = true;
    flush(c);
    return false;
  }
  return true;
}

void TcpStoreServer::Impl::reply(Connection& c, Bytes frame) {
  if (c.pending_output() == 0) {
    c.out = std::move(frame);
    c.out_offset = 0;
  } else {
    c.out.insert(c.out.end(), frame.begin(), frame.end());
  }
  track(c);
  flush(c);
}

void TcpStoreServer::Impl::flush(Connection& c) {
  while (c.open() && c.pending_output() > 0) {
    const ssize_t n = ::send(c.socket.fd(), c.out.data() + c.out_offset, c.pending_output(),
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out_offset += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    LOOM_LOG(warn,
             "TcpStore server {}: client {} went away before reading its reply ({}); dropped it",
             address, c.peer, n < 0 ? net::errno_string(errno) : "send returned 0");
    return close(c);
  }
  if (c.pending_output() == 0) {
    if (c.out.capacity() > tcp_store_server::kKeptBufferBytes) {
      Bytes().swap(c.out);
    } else {
      c.out.clear();
    }
    c.out_offset = 0;
    track(c);
    if (c.draining && c.open()) ::shutdown(c.socket.fd(), SHUT_WR);
  }
}

void TcpStoreServer::Impl::reject(Connection& c, const std::string& problem) {
  LOOM_LOG(warn, "TcpStore server {}: closing the connection from {}: {}", address, c.peer,
           problem);
  close(c);
}

void TcpStoreServer::Impl::close(Connection& c) {
  if (!c.open()) return;
  if (c.parked != 0) remove_waiter(c.parked);
  c.socket.reset();
  Bytes().swap(c.in);  // free the buffers now: they count against max_memory_bytes
  Bytes().swap(c.out);
  c.in_offset = c.out_offset = 0;
  c.request_bytes = 0;
  c.value_reserve = 0;
  track(c);
  connection_count.fetch_sub(1);
}

}  // namespace loom::comm
