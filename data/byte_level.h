// GPT-2's byte-level alphabet: the bijection between the 256 byte values and 256 printable code
// points that byte-level BPE vocabularies (GPT-2, Llama 3, tokenizer.json's ByteLevel) spell
// their tokens with: printable Latin-1 bytes map to themselves, the others to U+0100.. in order
// (so a space is "Ġ", U+0120, and a newline "Ċ", U+010A).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace loom::data::byte_level {

// The code point that spells byte `b`.
char32_t char_of_byte(uint8_t b);

// The bytes a byte-level token string (UTF-8) spells, or nullopt when it is not valid UTF-8 or
// holds a character outside the alphabet.
std::optional<std::string> to_bytes(std::string_view token);

// The byte-level spelling (UTF-8) of raw bytes.
std::string from_bytes(std::string_view bytes);

}  // namespace loom::data::byte_level
