// UTF-8 decoding and the lossy conversion against Python's bytes.decode("utf-8", "replace")
// (which, like Rust's from_utf8_lossy behind HF's decode, replaces each maximal subpart).
#include "data/utf8.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace loom::data {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

TEST(Utf8Test, LossyEqualsPythonsReplace) {
  // (bytes, what Python's decode("utf-8", "replace") gives), printed by Python 3.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"caf\xC3\xA9", "caf\xC3\xA9"},
      {"\xC3", kFffd},                                      // truncated at the end
      {"\xE2\x82", kFffd},                                  // one U+FFFD for the whole subpart
      {"\xE2\x82x", kFffd + "x"},                           // the next character survives
      {"\xF0\x9F\x98", kFffd},                              //
      {"\xF0\x9F\x98\x80", "\xF0\x9F\x98\x80"},             // U+1F600
      {"\xED\xA0\x80", kFffd + kFffd + kFffd},              // a surrogate
      {"\xE0\x80\xAF", kFffd + kFffd + kFffd},              // overlong (3 bytes)
      {"\xC0\xAF", kFffd + kFffd},                          // overlong (2 bytes)
      {"\xF4\x90\x80\x80", kFffd + kFffd + kFffd + kFffd},  // past U+10FFFF
      {"\xF0\x80\x80\x80", kFffd + kFffd + kFffd + kFffd},  // overlong (4 bytes)
      {"\xF5\x80", kFffd + kFffd},
      {"\x80\x80", kFffd + kFffd},  // lone continuation bytes
      {"a\xFF"
       "b\xFE",
       "a" + kFffd + "b" + kFffd},
      {kFffd, kFffd},
      {"", ""},
      {std::string("a\0b", 3), std::string("a\0b", 3)},  // NUL is a character
  };
  for (const auto& [bytes, want] : cases) {
    EXPECT_EQ(utf8_lossy(bytes), want) << "bytes of length " << bytes.size();
  }
}

std::string encode(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | c >> 6);
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | c >> 12);
    s += static_cast<char>(0x80 | (c >> 6 & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | c >> 18);
    s += static_cast<char>(0x80 | (c >> 12 & 0x3F));
    s += static_cast<char>(0x80 | (c >> 6 & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

TEST(Utf8Test, EveryScalarValueDecodesAndEverySurrogateDoesNot) {
  for (char32_t c = 0; c <= 0x10FFFF; ++c) {
    const std::string bytes = encode(c);
    const Utf8Char read = decode_utf8(bytes, 0);
    const bool surrogate = c >= 0xD800 && c <= 0xDFFF;
    ASSERT_EQ(read.valid, !surrogate) << "U+" << std::hex << static_cast<uint32_t>(c);
    if (!surrogate) {
      ASSERT_EQ(read.code_point, c);
      ASSERT_EQ(read.length, bytes.size());
      ASSERT_EQ(utf8_lossy(bytes), bytes);
    }
  }
}

}  // namespace
}  // namespace loom::data
