// Splits a byte stream into lines and writes each with a prefix ("[rank 2] ").
//
// Bytes arrive in arbitrary chunks (whatever a pipe read returned); only whole lines are written,
// so lines of different ranks never interleave mid-line. finish() writes a last line that had no
// newline, adding one. A line longer than `max_line_bytes` is written in pieces of that size, so
// a rank printing without newlines cannot grow loomrun's memory without bound.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace loom::loomrun {

class LinePrefixer {
 public:
  // Receives prefixed, newline-terminated lines (possibly several per call).
  using Sink = std::function<void(std::string_view)>;

  static constexpr std::size_t kDefaultMaxLineBytes = 64 * 1024;

  LinePrefixer(std::string prefix, Sink sink, std::size_t max_line_bytes = kDefaultMaxLineBytes);

  // Writes every line completed by `bytes`; keeps the unfinished rest.
  void feed(std::string_view bytes);

  // Writes the unfinished rest, if any, as a line of its own. Idempotent.
  void finish();

  // Bytes held back waiting for a newline.
  std::size_t pending_bytes() const { return partial_.size(); }

 private:
  void append_line(std::string& out, std::string_view line) const;

  std::string prefix_;
  Sink sink_;
  std::size_t max_line_bytes_;
  std::string partial_;  // the current line so far, without prefix
};

}  // namespace loom::loomrun
