// The checkpoint planners (PyTorch DCP's SavePlanner / LoadPlanner), pure: no files, no
// communication, so they are tested alone.
//
// Save: every rank's local items (what it holds of each entry: a DTensor's local shard, or a
// whole plain tensor) go in; out comes, for every rank, the blocks it writes and where, and the
// checkpoint's metadata (checksums still empty). Each unique piece is written exactly once:
// replicas (dp replicas, tp-replicated norms, a pipeline's tied embedding copies) hold identical
// boxes; largest pieces first, the holder with the fewest bytes so far writes each, so writes
// spread evenly over ranks instead of all landing on rank 0. Pieces are split along dim 0 into
// blocks of at most `block_bytes`, each with its own checksum, so a load reads (and verifies) only
// the blocks that overlap what it needs. Every rank runs the planner on the same gathered input and
// gets the same plan.
//
// Load: the requests (what this rank holds of each entry, in the layout it loads into) are
// matched against the saved chunks; out comes, per request, the chunks that overlap it and the
// overlap. Errors name what does not fit: a missing entry, a shape or dtype mismatch, a box the
// saved chunks do not cover.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/metadata.h"

namespace loom::checkpoint {

// What a rank holds of one entry.
struct LocalItem {
  std::string name;
  DType dtype = kFloat32;
  Shape shape;  // global
  Box box;      // the part this rank holds (may be empty: an uneven shard)
};

// One block a rank writes: its box (global coordinates) and where its bytes go in the rank's
// file.
struct WriteItem {
  std::string name;
  Box box;
  int64_t offset = 0;
  int64_t length = 0;
};

struct SavePlan {
  std::vector<std::vector<WriteItem>> writes;  // per rank, in file order
  Metadata metadata;                           // chunks and files, checksums empty
};

// `items[r]` are rank r's local items. Throws loom::Error naming the entry and the ranks when two
// ranks disagree on an entry's shape or dtype, or hold boxes that overlap without being equal.
SavePlan plan_save(const std::vector<std::vector<LocalItem>>& items, int64_t block_bytes);

// What a rank wants of one entry in the layout it loads into.
struct LoadRequest {
  std::string name;
  DType dtype = kFloat32;
  Shape shape;  // global
  Box box;
};

// A saved chunk that overlaps a request, and the overlap (global coordinates).
struct ReadItem {
  size_t request = 0;  // index into the requests
  Chunk chunk;
  Box overlap;
};

// Throws loom::Error naming `where` (the checkpoint) and the entry for a missing entry, a shape
// or dtype mismatch, or a requested box the saved chunks do not cover.
std::vector<ReadItem> plan_load(const Metadata& metadata, const std::vector<LoadRequest>& requests,
                                const std::string& where);

}  // namespace loom::checkpoint
