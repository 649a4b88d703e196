#include "checkpoint/planner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>

#include "base/error.h"

namespace loom::checkpoint {

namespace {

std::string shape_text(const Shape& shape) { return fmt::format("({})", fmt::join(shape, ", ")); }

// `box` split along dim 0 into blocks of at most `block_bytes` (at least one row each).
std::vector<Box> blocks_of(const Box& box, size_t element_bytes, int64_t block_bytes) {
  if (box.sizes.empty() || box.sizes[0] <= 1) return {box};
  const int64_t row_bytes = box.numel() / box.sizes[0] * static_cast<int64_t>(element_bytes);
  const int64_t rows = std::max<int64_t>(1, block_bytes / std::max<int64_t>(1, row_bytes));
  std::vector<Box> blocks;
  for (int64_t first = 0; first < box.sizes[0]; first += rows) {
    Box block = box;
    block.offsets[0] += first;
    block.sizes[0] = std::min(rows, box.sizes[0] - first);
    blocks.push_back(block);
  }
  return blocks;
}

}  // namespace

SavePlan plan_save(const std::vector<std::vector<LocalItem>>& items, int64_t block_bytes) {
  LOOM_CHECK(block_bytes > 0, "plan_save: block_bytes must be positive, got {}", block_bytes);
  SavePlan plan;
  plan.writes.resize(items.size());
  // Unique pieces per entry, in name order, each with the ranks holding it.
  struct Piece {
    Box box;
    std::vector<int> holders;
  };
  std::map<std::string, std::vector<Piece>> pieces;
  std::map<std::string, int> first_holder;  // the rank whose shape and dtype the entry takes
  for (size_t r = 0; r < items.size(); ++r) {
    for (const LocalItem& item : items[r]) {
      LOOM_CHECK(item.box.sizes.size() == item.shape.size() &&
                     item.box.offsets.size() == item.shape.size(),
                 "plan_save: rank {} holds a box {} of entry '{}' with shape {}", r, item.box.str(),
                 item.name, shape_text(item.shape));
      auto [it, inserted] = plan.metadata.entries.try_emplace(item.name);
      Entry& entry = it->second;
      if (inserted) {
        entry.dtype = item.dtype;
        entry.shape = item.shape;
        first_holder[item.name] = static_cast<int>(r);
      } else {
        LOOM_CHECK(entry.shape == item.shape && entry.dtype == item.dtype,
                   "checkpoint save: ranks disagree on entry '{}': rank {} holds {} {}, rank {} "
                   "holds {} {}",
                   item.name, first_holder[item.name], dtype_key(entry.dtype),
                   shape_text(entry.shape), r, dtype_key(item.dtype), shape_text(item.shape));
      }
      if (item.box.empty()) continue;
      std::vector<Piece>& list = pieces[item.name];
      bool found = false;
      for (Piece& piece : list) {
        if (piece.box == item.box) {
          piece.holders.push_back(static_cast<int>(r));
          found = true;
          break;
        }
        LOOM_CHECK(intersect(piece.box, item.box).empty(),
                   "checkpoint save: entry '{}': rank {} holds {}, which overlaps {} held by rank "
                   "{} without being equal; ranks must hold equal or disjoint pieces",
                   item.name, r, item.box.str(), piece.box.str(), piece.holders.front());
      }
      if (!found) list.push_back({item.box, {static_cast<int>(r)}});
    }
  }
  // Largest pieces first, each to the holder with the fewest bytes so far (ties: the lowest
  // rank): the longest-processing-time rule, so replicated state spreads evenly.
  struct Assignment {
    const std::string* name;
    const Piece* piece;
    int64_t bytes;
  };
  std::vector<Assignment> order;
  for (const auto& [name, list] : pieces) {
    const size_t element = element_size(plan.metadata.entries.at(name).dtype);
    for (const Piece& piece : list) {
      order.push_back({&name, &piece, piece.box.numel() * static_cast<int64_t>(element)});
    }
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const Assignment& a, const Assignment& b) { return a.bytes > b.bytes; });
  std::vector<int64_t> bytes(items.size(), 0);
  for (const Assignment& a : order) {
    Entry& entry = plan.metadata.entries.at(*a.name);
    const size_t element = element_size(entry.dtype);
    int writer = a.piece->holders.front();
    for (int h : a.piece->holders) {
      if (bytes[h] < bytes[writer]) writer = h;
    }
    for (const Box& block : blocks_of(a.piece->box, element, block_bytes)) {
      const int64_t length = block.numel() * static_cast<int64_t>(element);
      plan.writes[writer].push_back({*a.name, block, bytes[writer], length});
      entry.chunks.push_back(
          {block, rank_file_name(writer), bytes[writer], length, /*sha256=*/"", writer});
      bytes[writer] += length;
    }
  }
  for (size_t r = 0; r < items.size(); ++r) {
    if (!plan.writes[r].empty()) {
      plan.metadata.files[rank_file_name(static_cast<int>(r))] = {bytes[r], "",
                                                                  static_cast<int>(r)};
    }
  }
  return plan;
}

std::vector<ReadItem> plan_load(const Metadata& metadata, const std::vector<LoadRequest>& requests,
                                const std::string& where) {
  std::vector<ReadItem> reads;
  for (size_t i = 0; i < requests.size(); ++i) {
    const LoadRequest& request = requests[i];
    const auto it = metadata.entries.find(request.name);
    if (it == metadata.entries.end()) {
      std::vector<std::string> names;
      for (const auto& [name, unused] : metadata.entries) names.push_back(name);
      if (names.size() > 12) names.resize(12), names.push_back("...");
      LOOM_FAIL("{}: no entry '{}' in the checkpoint (it has {} entries: {})", where, request.name,
                metadata.entries.size(), fmt::join(names, ", "));
    }
    const Entry& entry = it->second;
    LOOM_CHECK(entry.shape == request.shape,
               "{}: entry '{}' was saved with shape {} but is loaded into shape {}", where,
               request.name, shape_text(entry.shape), shape_text(request.shape));
    LOOM_CHECK(entry.dtype == request.dtype, "{}: entry '{}' was saved as {} but is loaded into {}",
               where, request.name, dtype_key(entry.dtype), dtype_key(request.dtype));
    int64_t covered = 0;
    for (const Chunk& chunk : entry.chunks) {
      const Box overlap = intersect(chunk.box, request.box);
      if (overlap.empty()) continue;
      covered += overlap.numel();
      reads.push_back({i, chunk, overlap});
    }
    LOOM_CHECK(covered == request.box.numel(),
               "{}: entry '{}': the saved chunks cover {} of the {} elements of {}", where,
               request.name, covered, request.box.numel(), request.box.str());
  }
  return reads;
}

}  // namespace loom::checkpoint
