#include "tools/loomrun/line_prefixer.h"

#include "base/error.h"

namespace loom::loomrun {

LinePrefixer::LinePrefixer(std::string prefix, Sink sink, std::size_t max_line_bytes)
    : prefix_(std::move(prefix)), sink_(std::move(sink)), max_line_bytes_(max_line_bytes) {
  LOOM_INTERNAL_ASSERT(max_line_bytes_ > 0);
  LOOM_INTERNAL_ASSERT(static_cast<bool>(sink_));
}

void LinePrefixer::append_line(std::string& out, std::string_view line) const {
  out.append(prefix_);
  out.append(line);
  out.push_back('\n');
}

void LinePrefixer::feed(std::string_view bytes) {
  std::string out;
  while (!bytes.empty()) {
    const std::size_t newline = bytes.find('\n');
    const std::size_t room = max_line_bytes_ - partial_.size();
    if (newline != std::string_view::npos && newline <= room) {
      partial_.append(bytes.substr(0, newline));
      append_line(out, partial_);
      partial_.clear();
      bytes.remove_prefix(newline + 1);
    } else if (bytes.size() >= room) {
      // No newline within the line limit: write a full-length piece.
      partial_.append(bytes.substr(0, room));
      append_line(out, partial_);
      partial_.clear();
      bytes.remove_prefix(room);
    } else {
      partial_.append(bytes);
      bytes = {};
    }
  }
  if (!out.empty()) sink_(out);
}

void LinePrefixer::finish() {
  if (partial_.empty()) return;
  std::string out;
  append_line(out, partial_);
  partial_.clear();
  sink_(out);
}

}  // namespace loom::loomrun
