// UTF-8 decoding by the Unicode standard's rules (no overlong forms, no surrogates, nothing past
// U+10FFFF), and the lossy conversion Hugging Face's decode applies to a tokenizer's bytes.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace loom::data {

// The character that starts at text[at] (at < text.size()).
struct Utf8Char {
  char32_t code_point = 0;  // U+FFFD where the bytes are no character
  size_t length = 1;        // bytes read: a character's, or an invalid sequence's maximal
                            // subpart (at least 1), the unit that one U+FFFD replaces
  bool valid = false;
};
Utf8Char decode_utf8(std::string_view text, size_t at);

// `bytes` with each invalid sequence's maximal subpart replaced by U+FFFD, as Rust's
// String::from_utf8_lossy (what HF's ByteLevel decoder returns) and Python's
// bytes.decode("utf-8", "replace") give: a tokenizer's decode of ids that end mid-character,
// or of bytes that were never text, prints as transformers prints it.
std::string utf8_lossy(std::string_view bytes);

}  // namespace loom::data
