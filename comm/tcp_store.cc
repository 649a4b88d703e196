#include "comm/tcp_store.h"

#include <algorithm>

#include "base/error.h"
#include "comm/tcp_store_server.h"

namespace loom::comm {

namespace ts = tcp_store;
using net::Clock;

namespace {

// How long a client waits for a GET/WAIT reply beyond the timeout the server enforces, before
// it gives up on the connection itself (a server that hangs or a network that drops packets).
constexpr Duration kReplyGrace = std::chrono::seconds(2);

// How long a client retries connecting to a server it reached before (see borrow_connection).
constexpr Duration kReconnectWindow = std::chrono::seconds(2);

std::string quoted_keys(const std::vector<std::string>& keys) {
  std::string out = "[";
  for (size_t i = 0; i < keys.size(); ++i) out += fmt::format("{}'{}'", i ? ", " : "", keys[i]);
  return out + "]";
}

uint64_t to_wire_ms(Duration timeout) {
  return static_cast<uint64_t>(std::max<int64_t>(timeout.count(), 0));
}

}  // namespace

TcpStore::TcpStore(std::string host, int port, TcpStoreOptions options)
    : host_(std::move(host)), port_(port), options_(std::move(options)) {
  timeout_ = options_.timeout;
  LOOM_CHECK(!host_.empty(),
             "TcpStore: the host is empty; pass the server's address (MASTER_ADDR)");
  LOOM_CHECK(port_ >= 0 && port_ <= 65535, "TcpStore {}: port {} is outside 0..65535", address(),
             port_);
  if (options_.is_server) {
    TcpStoreServerOptions server_options;
    server_options.bind_host = options_.bind_host.empty()  ? host_
                               : options_.bind_host == "*" ? ""
                                                           : options_.bind_host;
    server_options.port = port_;
    server_options.limits = options_.limits;
    server_ = std::make_unique<TcpStoreServer>(std::move(server_options));
    port_ = server_->port();
  } else {
    LOOM_CHECK(
        port_ != 0,
        "TcpStore {}: a client needs the server's port, got 0 (port 0 only means 'pick a free "
        "port' for the server, is_server=true)",
        address());
  }
  // Connect now, so an unreachable server is reported by the constructor.
  return_connection(borrow_connection());
}

TcpStore::~TcpStore() = default;

net::Socket TcpStore::borrow_connection() {
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    if (!idle_connections_.empty()) {
      net::Socket socket = std::move(idle_connections_.back());
      idle_connections_.pop_back();
      return socket;
    }
  }
  // The first connection retries for the whole timeout: at start-up the server may not listen
  // yet. Once it has answered, a refused connection means it went away (rank 0 exited), so a
  // new connection gets a short window instead of waiting out the timeout; the message names the
  // window waited.
  if (server_gone_) LOOM_FAIL("TcpStore: {} (found earlier; not retried)", gone_reason_);
  const Duration timeout = this->timeout();
  const bool reconnecting = reached_server_;
  const Duration window = reconnecting ? std::min(timeout, kReconnectWindow) : timeout;
  try {
    net::Socket socket = net::connect_tcp(
        host_, port_, Clock::now() + window, window,
        reconnecting ? "the server answered before: has its process (rank 0, or the lighthouse) "
                       "exited?"
                     : net::kServerListeningHint);
    reached_server_ = true;
    return socket;
  } catch (const Error& e) {
    if (reconnecting) {
      std::lock_guard<std::mutex> lock(pool_mutex_);
      if (!server_gone_) {
        gone_reason_ = e.what();
        server_gone_ = true;
      }
    }
    LOOM_FAIL("TcpStore: {}", e.what());
  }
}

void TcpStore::return_connection(net::Socket socket) {
  std::lock_guard<std::mutex> lock(pool_mutex_);
  idle_connections_.push_back(std::move(socket));
}

Bytes TcpStore::encode(const ts::Request& request, const std::string& what) const {
  try {
    return ts::encode_request(request, options_.limits);
  } catch (const ts::ProtocolError& e) {
    LOOM_FAIL("TcpStore {} on {}: {}", what, address(), e.what());
  }
}

TcpStore::Response TcpStore::roundtrip(const ts::Request& request, const std::string& what,
                                       Duration reply_within) {
  const Bytes frame = encode(request, what);
  net::Socket socket = borrow_connection();
  const auto deadline = Clock::now() + reply_within;
  std::string error;
  auto fail = [&](net::IoStatus status, const char* stage) {
    // The socket is dropped (closed) here, never returned to the pool.
    if (status == net::IoStatus::kTimeout) {
      LOOM_FAIL(
          "TcpStore {} on {}: no reply from the server within {} ms (while {}); the connection was "
          "closed",
          what, address(), reply_within.count(), stage);
    }
    if (status == net::IoStatus::kClosed) {
      LOOM_FAIL(
          "TcpStore {} on {}: the server closed the connection while {}; is the server (rank 0) "
          "still "
          "running?",
          what, address(), stage);
    }
    LOOM_FAIL("TcpStore {} on {}: {} while {}", what, address(), error, stage);
  };
  net::IoStatus status = net::send_all(socket.fd(), frame.data(), frame.size(), deadline, &error);
  if (status != net::IoStatus::kOk) fail(status, "sending the request");
  uint8_t header_bytes[ts::kHeaderBytes];
  status = net::recv_all(socket.fd(), header_bytes, sizeof(header_bytes), deadline, &error);
  if (status != net::IoStatus::kOk) fail(status, "waiting for the reply");
  const ts::Header header = ts::decode_header(header_bytes);
  LOOM_CHECK(header.magic == ts::kMagic,
             "TcpStore {} on {}: the reply starts with byte 0x{:02x}, not the TcpStore "
             "magic 0x{:02x}; is something else listening on that port?",
             what, address(), header.magic, ts::kMagic);
  const uint64_t limit = ts::max_response_body(options_.limits);
  LOOM_CHECK(header.body_bytes <= limit,
             "TcpStore {} on {}: the reply claims {} bytes, over the limit of {} bytes", what,
             address(), header.body_bytes, limit);
  Response response;
  response.status = static_cast<ts::Status>(header.code);
  response.body.resize(header.body_bytes);
  status = net::recv_all(socket.fd(), response.body.data(), response.body.size(), deadline, &error);
  if (status != net::IoStatus::kOk) fail(status, "reading the reply");
  // A refused request may leave the server discarding the rest of this connection's input:
  // only a connection that got a normal answer goes back to the pool.
  if (header.version == ts::kVersion && response.status != ts::Status::kError) {
    return_connection(std::move(socket));
  }
  if (response.status == ts::Status::kError) throw_server_error(response, what);
  LOOM_CHECK(header.version == ts::kVersion && header.code <= 2,
             "TcpStore {} on {}: the server replied with protocol version {} status {}; this "
             "client speaks "
             "version {}",
             what, address(), header.version, header.code, ts::kVersion);
  return response;
}

void TcpStore::throw_server_error(const Response& response, const std::string& what) const {
  std::string message = "(unreadable message)";
  try {
    ts::Reader r(response.body.data(), response.body.size());
    message = r.key(response.body.size());
  } catch (const ts::ProtocolError&) {
  }
  LOOM_FAIL("TcpStore {} on {}: the server refused: {}", what, address(), message);
}

Bytes TcpStore::value_of(const Response& response, const std::string& what) const {
  ts::Reader r(response.body.data(), response.body.size());
  try {
    Bytes value = r.value(response.body.size());
    r.expect_end();
    return value;
  } catch (const ts::ProtocolError& e) {
    LOOM_FAIL("TcpStore {} on {}: malformed reply: {}", what, address(), e.what());
  }
}

void TcpStore::set(const std::string& key, const Bytes& value) {
  ts::Request request;
  request.op = ts::Op::kSet;
  request.keys = {key};
  request.value = value;
  const std::string what = fmt::format("set('{}')", key);
  const Response response = roundtrip(request, what, timeout());
  LOOM_CHECK(response.status == ts::Status::kOk, "TcpStore {} on {}: unexpected status {}", what,
             address(), static_cast<int>(response.status));
}

Bytes TcpStore::get(const std::string& key) {
  const Duration timeout = this->timeout();
  ts::Request request;
  request.op = ts::Op::kGet;
  request.keys = {key};
  request.timeout_ms = to_wire_ms(timeout);
  const std::string what = fmt::format("get('{}')", key);
  Response response = roundtrip(request, what, timeout + kReplyGrace);
  LOOM_CHECK(response.status != ts::Status::kTimeout,
             "TcpStore {} on {}: key '{}' was not set within the timeout of {} ms", what, address(),
             key, timeout.count());
  return value_of(response, what);
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  ts::Request request;
  request.op = ts::Op::kAdd;
  request.keys = {key};
  request.delta = delta;
  const std::string what = fmt::format("add('{}', {})", key, delta);
  const Response response = roundtrip(request, what, timeout());
  LOOM_CHECK(response.status == ts::Status::kOk && response.body.size() == 8,
             "TcpStore {} on {}: malformed reply (status {}, {} bytes)", what, address(),
             static_cast<int>(response.status), response.body.size());
  return ts::Reader(response.body.data(), response.body.size()).i64();
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  ts::Request request;
  request.op = ts::Op::kCheck;
  request.keys = keys;
  const std::string what = fmt::format("check({})", quoted_keys(keys));
  const Response response = roundtrip(request, what, timeout());
  LOOM_CHECK(response.status == ts::Status::kOk && response.body.size() == 1,
             "TcpStore {} on {}: malformed reply", what, address());
  return response.body[0] != 0;
}

void TcpStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  ts::Request request;
  request.op = ts::Op::kWait;
  request.keys = keys;
  request.timeout_ms = to_wire_ms(timeout);
  const std::string what = fmt::format("wait({})", quoted_keys(keys));
  const Response response = roundtrip(request, what, timeout + kReplyGrace);
  if (response.status == ts::Status::kOk) return;
  std::vector<std::string> missing;
  try {
    ts::Reader r(response.body.data(), response.body.size());
    const uint32_t n = r.u32();
    for (uint32_t i = 0; i < n; ++i) missing.push_back(r.key(response.body.size()));
  } catch (const ts::ProtocolError& e) {
    LOOM_FAIL("TcpStore {} on {}: malformed reply: {}", what, address(), e.what());
  }
  LOOM_FAIL("TcpStore {} on {}: keys {} were not set within the timeout of {} ms", what, address(),
            quoted_keys(missing), timeout.count());
}

Bytes TcpStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  ts::Request request;
  request.op = ts::Op::kCompareSet;
  request.keys = {key};
  request.expected = expected;
  request.value = desired;
  const std::string what = fmt::format("compare_set('{}')", key);
  const Response response = roundtrip(request, what, timeout());
  LOOM_CHECK(response.status == ts::Status::kOk, "TcpStore {} on {}: unexpected status {}", what,
             address(), static_cast<int>(response.status));
  return value_of(response, what);
}

bool TcpStore::delete_key(const std::string& key) {
  ts::Request request;
  request.op = ts::Op::kDelete;
  request.keys = {key};
  const std::string what = fmt::format("delete_key('{}')", key);
  const Response response = roundtrip(request, what, timeout());
  LOOM_CHECK(response.status == ts::Status::kOk && response.body.size() == 1,
             "TcpStore {} on {}: malformed reply", what, address());
  return response.body[0] != 0;
}

}  // namespace loom::comm
