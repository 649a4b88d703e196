#include "data/utf8.h"

#include <cstdint>

namespace loom::data {

Utf8Char decode_utf8(std::string_view text, size_t at) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[at + k]); };
  const uint8_t b0 = byte(0);
  if (b0 < 0x80) return {b0, 1, true};
  // The lead byte fixes the length and the range of the second byte (Unicode Table 3-7): that
  // range is what rules out overlong forms, surrogates and code points past U+10FFFF.
  size_t n;
  uint8_t low = 0x80, high = 0xBF;
  char32_t c;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2, c = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3, c = b0 & 0x0F;
    if (b0 == 0xE0) low = 0xA0;
    if (b0 == 0xED) high = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4, c = b0 & 0x07;
    if (b0 == 0xF0) low = 0x90;
    if (b0 == 0xF4) high = 0x8F;
  } else {
    return {0xFFFD, 1, false};
  }
  for (size_t k = 1; k < n; ++k) {
    // A byte that cannot continue the character ends the maximal subpart before it.
    if (at + k >= text.size()) return {0xFFFD, k, false};
    const uint8_t b = byte(k);
    const bool fits = k == 1 ? b >= low && b <= high : (b & 0xC0) == 0x80;
    if (!fits) return {0xFFFD, k, false};
    c = c << 6 | (b & 0x3F);
  }
  return {c, n, true};
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t at = 0; at < bytes.size();) {
    const Utf8Char c = decode_utf8(bytes, at);
    if (c.valid) {
      out.append(bytes.substr(at, c.length));
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
    }
    at += c.length;
  }
  return out;
}

}  // namespace loom::data
