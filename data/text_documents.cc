#include "data/text_documents.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/error.h"

namespace loom::data {

namespace {

// How far a text is searched for a NUL byte: enough for any binary header, bounded for a
// memory-mapped corpus of many GiB.
constexpr size_t kBinaryProbeBytes = size_t{64} << 10;

struct Compression {
  std::string_view magic;
  std::string_view name;
  std::string_view undo;
  std::string_view block_magic = {};  // bzip2's, after its level digit: "BZh" alone is a word
};

constexpr std::string_view kGzip("\x1f\x8b", 2);
constexpr std::string_view kZstd("\x28\xb5\x2f\xfd", 4);
constexpr std::string_view kXz("\xfd\x37\x7a\x58\x5a\x00", 6);
constexpr std::string_view k7z("\x37\x7a\xbc\xaf\x27\x1c", 6);
constexpr std::array<Compression, 7> kCompressions{{
    {kGzip, "gzip-compressed", "gunzip -k"},
    {kZstd, "zstd-compressed", "zstd -d"},
    {"BZh", "bzip2-compressed", "bunzip2 -k", "\x31\x41\x59\x26\x53\x59"},
    {kXz, "xz-compressed", "unxz -k"},
    {"PK\x03\x04", "a zip archive", "unzip"},
    {k7z, "a 7z archive", "7z x"},
    {"PAR1", "a Parquet file", "export its text column to .jsonl"},
}};

// The 1-based number of the line holding byte `at` (only for messages: it counts from the start).
size_t line_number(std::string_view text, size_t at) {
  return static_cast<size_t>(std::count(text.begin(), text.begin() + at, '\n')) + 1;
}

}  // namespace

bool is_jsonl(std::string_view path) {
  // Any case: F0.JSONL. `.json` too: what Hugging Face datasets' to_json writes (JSON lines by
  // default); a .json file of one document is refused line by line, never trained on as syntax.
  std::string extension = std::filesystem::path(path).extension().string();
  std::transform(extension.begin(), extension.end(), extension.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return extension == ".jsonl" || extension == ".ndjson" || extension == ".json";
}

void check_is_text(std::string_view text, std::string_view path, std::string_view what) {
  for (const Compression& c : kCompressions) {
    const bool match =
        text.starts_with(c.magic) &&
        (c.block_magic.empty() ||
         text.substr(std::min(text.size(), c.magic.size() + 1)).starts_with(c.block_magic));
    LOOM_CHECK(!match, "{}: '{}' is {}, not text: {} it first, and give the text (or .jsonl) file",
               what, path, c.name, c.undo);
  }
  const std::string_view probe = text.substr(0, std::min(text.size(), kBinaryProbeBytes));
  const size_t nul = probe.find('\0');
  LOOM_CHECK(nul == std::string_view::npos,
             "{}: '{}' holds a NUL byte at offset {}: it is not text (a token shard is read as "
             "one only when its name ends in .bin; UTF-16 text must be converted to UTF-8)",
             what, path, nul);
}

void for_each_jsonl_document(std::string_view text, size_t begin, size_t stop,
                             std::string_view path, const std::string& field, std::string_view what,
                             const std::function<void(std::string_view)>& document) {
  size_t line = begin;
  while (line < stop) {
    size_t next = text.find('\n', line);
    next = next == std::string_view::npos || next >= stop ? stop : next + 1;
    const std::string_view body = text.substr(line, next - line);
    if (body.find_first_not_of(" \t\r\n") != std::string_view::npos) {
      nlohmann::json parsed;
      try {
        // Without its line end: the parser's "line 1, column N" is then this line's.
        parsed = nlohmann::json::parse(body.substr(0, body.find_last_not_of("\r\n") + 1));
      } catch (const nlohmann::json::exception& e) {
        LOOM_FAIL("{}: '{}': line {} (at byte {}) is not JSON: {}", what, path,
                  line_number(text, line), line, e.what());
      }
      const auto value = parsed.is_object() ? parsed.find(field) : parsed.end();
      LOOM_CHECK(parsed.is_object() && value != parsed.end() && value->is_string(),
                 "{}: '{}': line {} (at byte {}) has no string field \"{}\" ({})", what, path,
                 line_number(text, line), line, field,
                 what.starts_with("--")
                     ? "a job reads \"text\": make shards with `loom tokenize --text-field NAME`"
                     : "--text-field names another");
      document(value->get_ref<const std::string&>());
    }
    line = next;
  }
}

}  // namespace loom::data
