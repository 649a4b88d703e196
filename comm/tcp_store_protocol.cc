#include "comm/tcp_store_protocol.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace loom::comm::tcp_store {

const char* op_name(Op op) {
  switch (op) {
    case Op::kSet:
      return "SET";
    case Op::kGet:
      return "GET";
    case Op::kAdd:
      return "ADD";
    case Op::kCheck:
      return "CHECK";
    case Op::kWait:
      return "WAIT";
    case Op::kDelete:
      return "DELETE";
    case Op::kCompareSet:
      return "COMPARE_SET";
  }
  return "?";
}

bool is_valid_op(uint8_t code) { return code >= 1 && code <= 7; }

uint64_t max_request_body(const Limits& limits) {
  const uint64_t compare_set = 4 + limits.max_key_bytes + 2 * (8 + limits.max_value_bytes);
  const uint64_t wait = 8 + 4 + uint64_t{limits.max_keys_per_request} * (4 + limits.max_key_bytes);
  return std::max(compare_set, wait);
}

uint64_t max_response_body(const Limits& limits) { return max_request_body(limits); }

namespace {
uint64_t load_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
}  // namespace

Header decode_header(const uint8_t* bytes) {
  Header h;
  h.magic = bytes[0];
  h.version = bytes[1];
  h.code = bytes[2];
  h.reserved = bytes[3];
  h.body_bytes = load_le(bytes + 4, 8);
  return h;
}

void Writer::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void Writer::u64(uint64_t v) {
  for (int i = 0; i < 8; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void Writer::key(const std::string& k) {
  u32(static_cast<uint32_t>(k.size()));
  out_.insert(out_.end(), k.begin(), k.end());
}
void Writer::value(const Bytes& v) {
  u64(v.size());
  out_.insert(out_.end(), v.begin(), v.end());
}

Bytes Writer::finish(uint8_t code) {
  Bytes frame;
  frame.reserve(kHeaderBytes + out_.size());
  frame.push_back(kMagic);
  frame.push_back(kVersion);
  frame.push_back(code);
  frame.push_back(0);
  const uint64_t size = out_.size();
  for (int i = 0; i < 8; ++i) frame.push_back(static_cast<uint8_t>(size >> (8 * i)));
  frame.insert(frame.end(), out_.begin(), out_.end());
  out_.clear();
  return frame;
}

void Reader::need(uint64_t bytes, const char* what) const {
  if (bytes > size_ - offset_) {
    throw ProtocolError(fmt::format("{} of {} bytes at offset {} overruns the {}-byte body", what,
                                    bytes, offset_, size_));
  }
}
uint8_t Reader::u8() {
  need(1, "u8");
  return data_[offset_++];
}
uint32_t Reader::u32() {
  need(4, "u32");
  const auto v = static_cast<uint32_t>(load_le(data_ + offset_, 4));
  offset_ += 4;
  return v;
}
uint64_t Reader::u64() {
  need(8, "u64");
  const uint64_t v = load_le(data_ + offset_, 8);
  offset_ += 8;
  return v;
}
std::string Reader::key(size_t max_bytes) {
  const uint32_t length = u32();
  if (length > max_bytes) {
    throw ProtocolError(
        fmt::format("key of {} bytes exceeds the limit of {} bytes", length, max_bytes));
  }
  need(length, "key");
  std::string k(reinterpret_cast<const char*>(data_ + offset_), length);
  offset_ += length;
  return k;
}
Bytes Reader::value(size_t max_bytes) {
  const uint64_t length = u64();
  if (length > max_bytes) {
    throw ProtocolError(
        fmt::format("value of {} bytes exceeds the limit of {} bytes", length, max_bytes));
  }
  need(length, "value");
  Bytes v(data_ + offset_, data_ + offset_ + length);
  offset_ += length;
  return v;
}
void Reader::expect_end() const {
  if (offset_ != size_) {
    throw ProtocolError(fmt::format("{} unexpected bytes after the last field", size_ - offset_));
  }
}

namespace {
void check_key(const std::string& key, const Limits& limits) {
  if (key.size() > limits.max_key_bytes) {
    throw ProtocolError(fmt::format("key of {} bytes exceeds the limit of {} bytes (starts '{}')",
                                    key.size(), limits.max_key_bytes, key.substr(0, 32)));
  }
}
void check_key_count(size_t n, const Limits& limits) {
  if (n > limits.max_keys_per_request) {
    throw ProtocolError(fmt::format("{} keys in one request exceed the limit of {}", n,
                                    limits.max_keys_per_request));
  }
}
}  // namespace

Bytes encode_request(const Request& request, const Limits& limits) {
  Writer w;
  for (const auto& key : request.keys) check_key(key, limits);
  const bool multi = request.op == Op::kCheck || request.op == Op::kWait;
  if (!multi && request.keys.size() != 1) {
    throw ProtocolError(
        fmt::format("{} takes one key, got {}", op_name(request.op), request.keys.size()));
  }
  if (multi) check_key_count(request.keys.size(), limits);
  const auto check_value = [&](const Bytes& value) {
    if (value.size() > limits.max_value_bytes) {
      throw ProtocolError(
          fmt::format("value of {} bytes for key '{}' exceeds the limit of {} bytes", value.size(),
                      request.keys[0], limits.max_value_bytes));
    }
  };
  switch (request.op) {
    case Op::kSet:
      check_value(request.value);
      w.key(request.keys[0]);
      w.value(request.value);
      break;
    case Op::kCompareSet:
      check_value(request.expected);
      check_value(request.value);
      w.key(request.keys[0]);
      w.value(request.expected);
      w.value(request.value);
      break;
    case Op::kGet:
      w.u64(request.timeout_ms);
      w.key(request.keys[0]);
      break;
    case Op::kAdd:
      w.key(request.keys[0]);
      w.i64(request.delta);
      break;
    case Op::kWait:
      w.u64(request.timeout_ms);
      [[fallthrough]];
    case Op::kCheck:
      w.u32(static_cast<uint32_t>(request.keys.size()));
      for (const auto& key : request.keys) w.key(key);
      break;
    case Op::kDelete:
      w.key(request.keys[0]);
      break;
  }
  return w.finish(static_cast<uint8_t>(request.op));
}

Request decode_request(Op op, const uint8_t* body, size_t size, const Limits& limits) {
  Reader r(body, size);
  Request request;
  request.op = op;
  switch (op) {
    case Op::kSet:
      request.keys.push_back(r.key(limits.max_key_bytes));
      request.value = r.value(limits.max_value_bytes);
      break;
    case Op::kGet:
      request.timeout_ms = r.u64();
      request.keys.push_back(r.key(limits.max_key_bytes));
      break;
    case Op::kAdd:
      request.keys.push_back(r.key(limits.max_key_bytes));
      request.delta = r.i64();
      break;
    case Op::kWait:
      request.timeout_ms = r.u64();
      [[fallthrough]];
    case Op::kCheck: {
      const uint32_t n = r.u32();
      check_key_count(n, limits);
      request.keys.reserve(n);
      for (uint32_t i = 0; i < n; ++i) request.keys.push_back(r.key(limits.max_key_bytes));
      break;
    }
    case Op::kDelete:
      request.keys.push_back(r.key(limits.max_key_bytes));
      break;
    case Op::kCompareSet:
      request.keys.push_back(r.key(limits.max_key_bytes));
      request.expected = r.value(limits.max_value_bytes);
      request.value = r.value(limits.max_value_bytes);
      break;
    default:
      throw ProtocolError(fmt::format("unknown op code {}", static_cast<int>(op)));
  }
  r.expect_end();
  return request;
}

}  // namespace loom::comm::tcp_store
