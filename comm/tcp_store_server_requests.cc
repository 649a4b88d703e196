// TcpStoreServer request handling: the key map, SET/GET/ADD/CHECK/WAIT/DELETE/COMPARE_SET, and
// parked GET/WAIT requests (indexed by the keys they miss and by deadline).
#include <algorithm>
#include <charconv>

#include "base/error.h"
#include "base/logging.h"
#include "comm/tcp_store_server_impl.h"

namespace loom::comm {

using namespace tcp_store_server;

std::string tcp_store_server::quoted_keys(const std::vector<std::string>& keys) {
  std::string out = "[";
  for (size_t i = 0; i < keys.size(); ++i) out += fmt::format("{}'{}'", i ? ", " : "", keys[i]);
  return out + "]";
}

void TcpStoreServer::Impl::track(Connection& c) {
  const uint64_t now = c.in.capacity() + c.out.capacity() + c.value_reserve;
  buffered_bytes_ = buffered_bytes_ - c.counted + now;
  c.counted = now;
}

void TcpStoreServer::Impl::resize_input(Connection& c, size_t size) {
  // Growing by doubling would hold up to twice a large request: allocate what it needs at once.
  if (size > c.in.capacity()) c.in.reserve(std::max(size, c.request_bytes + kReadChunk));
  c.in.resize(size);
  track(c);
}

void TcpStoreServer::Impl::clear_input(Connection& c) {
  if (c.in.capacity() > kKeptBufferBytes) {
    Bytes().swap(c.in);
  } else {
    c.in.clear();
  }
  c.in_offset = 0;
  track(c);
}

std::optional<std::string> TcpStoreServer::Impl::store(const std::string& key, Bytes value) {
  const auto it = data.find(key);
  const uint64_t old_bytes = it == data.end() ? 0 : key.size() + it->second.size();
  const uint64_t new_bytes = key.size() + value.size();
  const uint64_t total = stored_bytes - old_bytes + new_bytes + buffered_bytes();
  if (new_bytes > old_bytes && total > options.max_memory_bytes) {
    return fmt::format(
        "storing {} bytes would take the server to {} bytes, over its limit of {} bytes "
        "(TcpStoreServerOptions::max_memory_bytes; {} bytes are stored)",
        new_bytes, total, options.max_memory_bytes, stored_bytes);
  }
  stored_bytes = stored_bytes - old_bytes + new_bytes;
  if (it == data.end()) {
    data.emplace(key, std::move(value));
  } else {
    it->second = std::move(value);
  }
  return std::nullopt;
}

std::optional<std::string> TcpStoreServer::Impl::over_limit_to_reply(uint64_t value_bytes) const {
  const uint64_t total = stored_bytes + buffered_bytes() + value_bytes;
  if (total <= options.max_memory_bytes) return std::nullopt;
  return fmt::format(
      "its reply would copy {} bytes and take the server to {} bytes, over its limit of {} bytes "
      "(TcpStoreServerOptions::max_memory_bytes; {} bytes are stored)",
      value_bytes, total, options.max_memory_bytes, stored_bytes);
}

void TcpStoreServer::Impl::handle(Connection& c, ts::Request request) {
  ts::Writer w;
  const std::string& key = request.keys.empty() ? std::string() : request.keys[0];
  switch (request.op) {
    case ts::Op::kSet: {
      if (auto refused = store(key, std::move(request.value))) {
        w.key(fmt::format("set('{}'): {}", key, *refused));
        return reply(c, w.finish(static_cast<uint8_t>(ts::Status::kError)));
      }
      reply(c, w.finish(static_cast<uint8_t>(ts::Status::kOk)));
      notify(key);
      return;
    }
    case ts::Op::kGet:
    case ts::Op::kWait:
      if (missing_keys(request.keys).empty()) {
        if (request.op == ts::Op::kGet) {
          if (auto refused = over_limit_to_reply(data.at(key).size())) {
            w.key(fmt::format("get('{}'): {}", key, *refused));
            return reply(c, w.finish(static_cast<uint8_t>(ts::Status::kError)));
          }
          w.value(data.at(key));
        }
        return reply(c, w.finish(static_cast<uint8_t>(ts::Status::kOk)));
      }
      return park(c, std::move(request));
    case ts::Op::kAdd:
      return handle_add(c, request);
    case ts::Op::kCompareSet:
      return handle_compare_set(c, std::move(request));
    case ts::Op::kCheck:
      w.u8(missing_keys(request.keys).empty() ? 1 : 0);
      return reply(c, w.finish(static_cast<uint8_t>(ts::Status::kOk)));
    case ts::Op::kDelete: {
      const auto it = data.find(key);
      if (it != data.end()) {
        stored_bytes -= it->first.size() + it->second.size();
        data.erase(it);
      }
      w.u8(it != data.end() ? 1 : 0);
      return reply(c, w.finish(static_cast<uint8_t>(ts::Status::kOk)));
    }
  }
}

void TcpStoreServer::Impl::handle_add(Connection& c, const ts::Request& request) {
  const std::string& key = request.keys[0];
  ts::Writer w;
  int64_t current = 0;
  auto it = data.find(key);
  if (it != data.end()) {
    const char* begin = reinterpret_cast<const char*>(it->second.data());
    const char* end = begin + it->second.size();
    const auto [ptr, ec] = std::from_chars(begin, end, current);
    if (ec != std::errc() || ptr != end || begin == end) {
      w.key(fmt::format(
          "add('{}'): the stored value '{}' is not an integer; add needs a key that is absent or "
          "was written by add",
          key, std::string(begin, std::min<size_t>(it->second.size(), 64))));
      return reply(c, w.finish(static_cast<uint8_t>(ts::Status::kError)));
    }
  }
  int64_t result = 0;
  if (__builtin_add_overflow(current, request.delta, &result)) {
    w.key(fmt::format("add('{}'): {} + {} overflows int64", key, current, request.delta));
    return reply(c, w.finish(static_cast<uint8_t>(ts::Status::kError)));
  }
  const std::string text = std::to_string(result);
  if (auto refused = store(key, Bytes(text.begin(), text.end()))) {
    w.key(fmt::format("add('{}'): {}", key, *refused));
    return reply(c, w.finish(static_cast<uint8_t>(ts::Status::kError)));
  }
  w.i64(result);
  reply(c, w.finish(static_cast<uint8_t>(ts::Status::kOk)));
  notify(key);
}

void TcpStoreServer::Impl::handle_compare_set(Connection& c, ts::Request request) {
  const std::string& key = request.keys[0];
  ts::Writer w;
  const auto it = data.find(key);
  if (!holds_expected(it == data.end() ? nullptr : &it->second, request.expected)) {
    w.value(it == data.end() ? Bytes() : it->second);
    return reply(c, w.finish(static_cast<uint8_t>(ts::Status::kOk)));
  }
  if (auto refused = store(key, request.value)) {
    w.key(fmt::format("compare_set('{}'): {}", key, *refused));
    return reply(c, w.finish(static_cast<uint8_t>(ts::Status::kError)));
  }
  w.value(request.value);
  reply(c, w.finish(static_cast<uint8_t>(ts::Status::kOk)));
  notify(key);
}

std::vector<std::string> TcpStoreServer::Impl::missing_keys(
    const std::vector<std::string>& keys) const {
  std::vector<std::string> missing;
  for (const auto& k : keys) {
    if (data.find(k) == data.end()) missing.push_back(k);
  }
  return missing;
}

void TcpStoreServer::Impl::park(Connection& c, ts::Request request) {
  const uint64_t id = next_id++;
  Waiter waiter;
  waiter.connection = c.id;
  waiter.deadline =
      Clock::now() + std::chrono::milliseconds(std::min(request.timeout_ms, kMaxTimeoutMs));
  waiter.request = std::move(request);
  for (const auto& k : missing_keys(waiter.request.keys)) {
    if (waiter.registered.insert(k).second) waiters_by_key[k].push_back(id);
  }
  deadlines.emplace(waiter.deadline, id);
  waiters.emplace(id, std::move(waiter));
  c.parked = id;
}

void TcpStoreServer::Impl::notify(const std::string& key) {
  auto it = waiters_by_key.find(key);
  if (it == waiters_by_key.end()) return;
  std::vector<uint64_t> ids = std::move(it->second);
  waiters_by_key.erase(it);
  for (uint64_t id : ids) {
    auto w = waiters.find(id);
    if (w == waiters.end()) continue;
    w->second.registered.erase(key);
    if (try_complete(id)) continue;
    // Still waiting: make sure it hears about every key missing now (one may have been
    // deleted after it was set).
    Waiter& waiter = waiters.at(id);
    for (const auto& k : missing_keys(waiter.request.keys)) {
      if (waiter.registered.insert(k).second) waiters_by_key[k].push_back(id);
    }
  }
}

bool TcpStoreServer::Impl::try_complete(uint64_t waiter_id) {
  Waiter& waiter = waiters.at(waiter_id);
  if (!missing_keys(waiter.request.keys).empty()) return false;
  ts::Writer w;
  ts::Status status = ts::Status::kOk;
  if (waiter.request.op == ts::Op::kGet) {
    const std::string& key = waiter.request.keys[0];
    if (auto refused = over_limit_to_reply(data.at(key).size())) {
      w.key(fmt::format("get('{}'): {}", key, *refused));
      status = ts::Status::kError;
    } else {
      w.value(data.at(key));
    }
  }
  const uint64_t connection = waiter.connection;
  remove_waiter(waiter_id);
  if (Connection* c = find(connection)) {
    reply(*c, w.finish(static_cast<uint8_t>(status)));
    resume.push_back(connection);
  }
  return true;
}

void TcpStoreServer::Impl::remove_waiter(uint64_t waiter_id) {
  auto it = waiters.find(waiter_id);
  if (it == waiters.end()) return;
  for (const auto& k : it->second.registered) {
    auto list = waiters_by_key.find(k);
    if (list == waiters_by_key.end()) continue;
    std::erase(list->second, waiter_id);
    if (list->second.empty()) waiters_by_key.erase(list);
  }
  deadlines.erase({it->second.deadline, waiter_id});
  if (auto c = connections.find(it->second.connection); c != connections.end())
    c->second->parked = 0;
  waiters.erase(it);
}

void TcpStoreServer::Impl::expire_waiters() {
  const auto now = Clock::now();
  while (!deadlines.empty() && deadlines.begin()->first <= now) {
    const uint64_t id = deadlines.begin()->second;
    const Waiter& waiter = waiters.at(id);
    ts::Writer w;
    if (waiter.request.op == ts::Op::kWait) {
      const auto missing = missing_keys(waiter.request.keys);
      w.u32(static_cast<uint32_t>(missing.size()));
      for (const auto& k : missing) w.key(k);
    }
    const uint64_t connection = waiter.connection;
    LOOM_LOG(debug, "TcpStore server {}: {} of {} timed out", address,
             ts::op_name(waiter.request.op), quoted_keys(waiter.request.keys));
    remove_waiter(id);
    if (Connection* c = find(connection)) {
      reply(*c, w.finish(static_cast<uint8_t>(ts::Status::kTimeout)));
      resume.push_back(connection);
    }
  }
}

}  // namespace loom::comm
