// Where each parameter of an FSDP unit lives in the unit's flat communication buffers (pure
// arithmetic, no tensors).
//
// Every parameter is sharded along dim 0 as torch.chunk does it (rank r holds rows
// [r * c, min((r + 1) * c, rows)) with c = ceil(rows / N), so the last ranks may hold fewer rows,
// or none). In the flat buffers each rank's segment holds, parameter after parameter, that
// parameter's chunk padded to c rows: the segments have one size, so the unit's parameters
// travel in one all_gather_into_tensor (forward) and their gradients in one
// reduce_scatter_tensor (backward), whatever the uneven first dims.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/shape.h"

namespace loom::fsdp {

struct ParamSlot {
  Shape shape;             // the whole parameter's shape
  int64_t rows = 0;        // shape[0] (1 for a 0-dim parameter)
  int64_t row_numel = 1;   // elements per row
  int64_t chunk_rows = 0;  // c = ceil(rows / N): the padded rows of every rank's chunk
  int64_t offset = 0;      // where this parameter's chunk starts in a rank's segment (elements)

  // Rows rank `rank` really holds (0 for a rank past the end).
  int64_t rows_of(int rank) const;
  // The first row rank `rank` holds.
  int64_t first_row(int rank) const { return static_cast<int64_t>(rank) * chunk_rows; }
  // Ranks 0 .. full_chunks() - 1 hold c rows each; the next one holds the remaining
  // rows - full_chunks() * c (possibly none), and the rest hold nothing.
  int64_t full_chunks() const { return chunk_rows > 0 ? rows / chunk_rows : 0; }
};

struct FlatLayout {
  int world = 1;  // ranks sharing the unit (the dp_shard degree)
  std::vector<ParamSlot> params;
  int64_t segment_numel = 0;  // one rank's segment: the sum of every padded chunk

  // The layout of parameters of `shapes` over `world` ranks.
  static FlatLayout make(const std::vector<Shape>& shapes, int world);
  int64_t total_numel() const { return segment_numel * world; }
};

}  // namespace loom::fsdp
