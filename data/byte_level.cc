#include "data/byte_level.h"

#include <array>

namespace loom::data::byte_level {

namespace {

struct Alphabet {
  std::array<char32_t, 256> char_of{};
  // Byte of code point c < 0x144 (every code point of the alphabet is below it), or -1.
  std::array<int16_t, 0x144> byte_of{};

  Alphabet() {
    byte_of.fill(-1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      char_of[b] = printable ? b : next++;
      byte_of[char_of[b]] = static_cast<int16_t>(b);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet instance;
  return instance;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else {  // The alphabet stays below U+0800: two bytes.
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

}  // namespace

char32_t char_of_byte(uint8_t b) { return alphabet().char_of[b]; }

std::optional<std::string> to_bytes(std::string_view token) {
  const Alphabet& a = alphabet();
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    const auto c0 = static_cast<uint8_t>(token[i]);
    char32_t c;
    if (c0 < 0x80) {
      c = c0;
      i += 1;
    } else if ((c0 & 0xE0) == 0xC0 && i + 1 < token.size() &&
               (static_cast<uint8_t>(token[i + 1]) & 0xC0) == 0x80) {
      c = (char32_t{c0} & 0x1F) << 6 | (static_cast<uint8_t>(token[i + 1]) & 0x3F);
      if (c < 0x80) return std::nullopt;  // Overlong.
      i += 2;
    } else {
      return std::nullopt;  // Three- and four-byte characters are never in the alphabet.
    }
    if (c >= a.byte_of.size() || a.byte_of[c] < 0) return std::nullopt;
    out += static_cast<char>(a.byte_of[c]);
  }
  return out;
}

std::string from_bytes(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char b : bytes) append_utf8(out, char_of_byte(static_cast<uint8_t>(b)));
  return out;
}

}  // namespace loom::data::byte_level
