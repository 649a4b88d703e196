#include "parallel/fsdp/flat_layout.h"

#include <algorithm>

#include "base/error.h"

namespace loom::fsdp {

int64_t ParamSlot::rows_of(int rank) const {
  return std::clamp<int64_t>(rows - first_row(rank), 0, chunk_rows);
}

FlatLayout FlatLayout::make(const std::vector<Shape>& shapes, int world) {
  LOOM_CHECK(world >= 1, "FlatLayout: the world must have at least one rank, got {}", world);
  FlatLayout layout;
  layout.world = world;
  for (const Shape& shape : shapes) {
    ParamSlot slot;
    slot.shape = shape;
    slot.rows = shape.empty() ? 1 : shape[0];
    slot.row_numel = shape.empty() ? 1 : shape_numel(Shape(shape.begin() + 1, shape.end()));
    slot.chunk_rows = (slot.rows + world - 1) / world;
    slot.offset = layout.segment_numel;
    layout.segment_numel += slot.chunk_rows * slot.row_numel;
    layout.params.push_back(slot);
  }
  return layout;
}

}  // namespace loom::fsdp
