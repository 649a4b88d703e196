#include "nn/batch_part.h"

#include <unordered_set>

#include "autograd/sequence_context.h"
#include "base/error.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace loom::nn {

namespace {
thread_local BatchPart::Place current_place;
}  // namespace

BatchPart::BatchPart(int64_t index, int64_t count) : previous_(current_place) {
  LOOM_CHECK(count >= 1 && index >= 0 && index < count,
             "BatchPart: part {} of {} equal parts: expected 0 <= index < count", index, count);
  current_place = {previous_.index * count + index, previous_.count * count};
}

BatchPart::~BatchPart() { current_place = previous_; }

BatchPart::Place BatchPart::current() { return current_place; }

BatchPart::Reopen::Reopen(Place place) : previous_(current_place) { current_place = place; }

BatchPart::Reopen::~Reopen() { current_place = previous_; }

RngRegion batch_region(const Shape& shape, const RngRegion& region) {
  LOOM_CHECK(region.runs.empty(),
             "batch_region: a region in runs (along dim {}) cannot be placed in the batch; pass "
             "its blocks one by one",
             region.runs_dim);
  const BatchPart::Place place = current_place;
  if (place.count == 1) return region;
  LOOM_CHECK(!shape.empty(),
             "batch_region: a tensor with no dims has no rows to place in part {} of {} of the "
             "batch",
             place.index, place.count);
  RngRegion placed = resolved_region(region, shape);
  Shape &global = placed.global_shape, &offset = placed.global_offset;
  LOOM_CHECK(offset.size() == global.size() && global.size() == shape.size(),
             "batch_region: region of global shape {} at offset {} for a tensor of shape {}",
             shape_str(global), shape_str(offset), shape_str(shape));
  const int64_t rows = global[0];
  global[0] = rows * place.count;
  offset[0] += rows * place.index;
  return placed;
}

namespace {

// Where a rank's heads sit among every head's: empty when `projection` is not distributed.
RngRegion heads_region(const Tensor& projection, int64_t rows_per_head, const Shape& shape) {
  const auto& extension = projection.extension();
  const std::optional<LocalPiece> piece =
      extension != nullptr ? extension->local_piece() : std::nullopt;
  if (!piece.has_value()) return {};
  LOOM_CHECK(shape.size() == 4 && rows_per_head > 0 && piece->global_offset[0] % rows_per_head == 0,
             "heads_region: probabilities {} (expected (B, H, Tq, Tk)) of a projection shard at "
             "row {} with {} rows per head",
             shape_str(shape), piece->global_offset[0], rows_per_head);
  return {{shape[0], piece->global_shape[0] / rows_per_head, shape[2], shape[3]},
          {0, piece->global_offset[0] / rows_per_head, 0, 0}};
}

}  // namespace

AttentionDropout attention_dropout(Dropout* dropout, const Tensor& projection,
                                   int64_t rows_per_head, const Shape& shape) {
  if (dropout == nullptr) return {};
  return dropout->next_mask(shape, heads_region(projection, rows_per_head, shape));
}

RngRegion activation_region(const Shape& shape) {
  RngRegion region = batch_region(shape);
  // (batch, sequence, features...): a tensor of two dims (a pooled head's (B, C)) holds no
  // sequence to place.
  const SequenceContext* context = current_sequence_context();
  if (context == nullptr || shape.size() < 3) return region;
  region = resolved_region(region, shape);
  region.global_shape[1] = context->sequence_length(shape[1]);
  region.runs_dim = 1;
  for (const PositionRun& run : sequence_runs(shape[1])) {
    region.runs.insert(region.runs.end(), {run.local, run.global, run.length});
  }
  return region;
}

DropoutCalls DropoutCalls::of(Module& root) { return of(std::vector<Module*>{&root}); }

DropoutCalls DropoutCalls::of(const std::vector<Module*>& roots) {
  DropoutCalls calls;
  std::unordered_set<Dropout*> seen;  // roots may nest (a model's named modules)
  for (Module* root : roots) {
    for (auto& [path, module] : root->named_modules()) {
      auto* dropout = dynamic_cast<Dropout*>(module);
      if (dropout != nullptr && seen.insert(dropout).second) {
        calls.calls_.emplace_back(dropout, dropout->calls());
      }
    }
  }
  return calls;
}

void DropoutCalls::restore() const {
  for (const auto& [dropout, calls] : calls_) dropout->set_calls(calls);
}

}  // namespace loom::nn
