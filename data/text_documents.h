// Text inputs as documents, read the same way by `loom tokenize` (tokenize_files.h) and by a job
// that tokenizes its text as it starts (token_corpus.h): a text file is one document; a .jsonl
// file holds one per non-blank line, its `field` string (as Hugging Face datasets export them).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace loom::data {

// Whether `path` names a JSON-lines file (one JSON document per line): .jsonl, .ndjson or .json
// (Hugging Face datasets' to_json), in any case.
bool is_jsonl(std::string_view path);

// Throws loom::Error naming `path` when `text` is not text: compressed (gzip, zstd, bzip2, xz,
// zip, 7z, parquet: named, with how to decompress it) or binary (a NUL byte in its first 64 KiB:
// a token shard, UTF-16 text, ...). Tokenizing either would succeed and train on noise. `what`
// starts the message (the tool or the flag).
void check_is_text(std::string_view text, std::string_view path, std::string_view what);

// Calls `document` with the `field` string of each non-blank line of text[begin, stop) (whole
// lines of a .jsonl file at `path`). Throws loom::Error naming the file, the line's byte offset
// and the field when a line is not JSON or has no such string.
void for_each_jsonl_document(std::string_view text, size_t begin, size_t stop,
                             std::string_view path, const std::string& field, std::string_view what,
                             const std::function<void(std::string_view)>& document);

}  // namespace loom::data
