// The TcpStore wire protocol (version 1), shared by client and server.
//
// Every message is a 12-byte header followed by a body:
//
//   offset 0  u8   magic 0xB7 (not printable ASCII, so stray text/HTTP is rejected at once)
//          1  u8   protocol version (1)
//          2  u8   request: Op; response: Status
//          3  u8   reserved, 0
//          4  u64  body length in bytes, little-endian
//
// Integers are little-endian; a string/key is u32 length + bytes; a value is u64 length + bytes.
//
//   request   body                                   OK response body
//   SET       key, value                             (empty)
//   GET       u64 timeout_ms, key                    value            (TIMEOUT: empty)
//   ADD       key, i64 delta                         i64 new value    (ERROR: message)
//   CHECK     u32 n, n keys                          u8 all present
//   WAIT      u64 timeout_ms, u32 n, n keys          (empty)          (TIMEOUT: u32 n, missing
//   keys) DELETE    key                                    u8 existed
//   COMPARE_SET key, expected value, desired value   value held afterwards (empty: absent)
//
// The client sends one request per connection at a time and reads its response. GET and WAIT
// are answered by the server when the keys exist or when timeout_ms has passed (TIMEOUT), so a
// waiting client costs the server nothing but a parked entry. ERROR carries a message (e.g.
// ADD on a value that is not an integer, or a protocol version the server does not speak).
//
// A request the server cannot parse (bad magic, unknown op, a length over the limits, fields
// that overrun the body or leave bytes over) closes that one connection.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/store.h"

namespace loom::comm::tcp_store {

inline constexpr uint8_t kMagic = 0xB7;
inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kHeaderBytes = 12;

enum class Op : uint8_t {
  kSet = 1,
  kGet = 2,
  kAdd = 3,
  kCheck = 4,
  kWait = 5,
  kDelete = 6,
  kCompareSet = 7,
};
enum class Status : uint8_t { kOk = 0, kTimeout = 1, kError = 2 };

const char* op_name(Op op);
bool is_valid_op(uint8_t code);

// Caps on what one request may carry (checked by the client before sending and by the server
// on receipt). The largest request body follows from these (max_request_body).
struct Limits {
  size_t max_key_bytes = 4 * 1024;
  size_t max_value_bytes = 64 * 1024 * 1024;
  size_t max_keys_per_request = 4096;
};
uint64_t max_request_body(const Limits& limits);
// Responses carry at most one value plus keys; the client caps what it will accept.
uint64_t max_response_body(const Limits& limits);

struct Header {
  uint8_t magic = kMagic;
  uint8_t version = kVersion;
  uint8_t code = 0;
  uint8_t reserved = 0;
  uint64_t body_bytes = 0;
};
Header decode_header(const uint8_t* bytes);  // reads kHeaderBytes

// A malformed message: the text says what was wrong ("key of 5000 bytes exceeds 4096").
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Request {
  Op op = Op::kSet;
  std::vector<std::string> keys;  // one key except CHECK/WAIT
  Bytes value;                    // SET; COMPARE_SET's desired value
  Bytes expected;                 // COMPARE_SET
  int64_t delta = 0;              // ADD
  uint64_t timeout_ms = 0;        // GET/WAIT
};

// Header + body, ready to send. Throws ProtocolError when a key/value exceeds `limits`.
Bytes encode_request(const Request& request, const Limits& limits);
// Parses a body whose header said `op`. Throws ProtocolError on any inconsistency.
Request decode_request(Op op, const uint8_t* body, size_t size, const Limits& limits);

// Body builder and bounds-checked reader.
class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(v); }
  void u32(uint32_t v);
  void u64(uint64_t v);
  void i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
  void key(const std::string& k);
  void value(const Bytes& v);
  // Prepends the header; the Writer is empty afterwards.
  Bytes finish(uint8_t code);

 private:
  Bytes out_;
};

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t u8();
  uint32_t u32();
  uint64_t u64();
  int64_t i64() { return static_cast<int64_t>(u64()); }
  std::string key(size_t max_bytes);
  Bytes value(size_t max_bytes);
  // Throws when bytes are left over.
  void expect_end() const;

 private:
  void need(uint64_t bytes, const char* what) const;
  const uint8_t* data_;
  size_t size_;
  size_t offset_ = 0;
};

}  // namespace loom::comm::tcp_store
