#include "tensor/rng.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "base/error.h"
#include "tensor/cpu/element_types.h"
#include "tensor/cpu/strided_loop.h"
#include "tensor/cuda/kernels/nn.h"
#include "tensor/ops_copy.h"
#include "tensor/philox.h"

namespace loom {

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  const philox::Words w = philox::block(c[0], c[1], c[2], c[3], k[0], k[1]);
  return {w.w[0], w.w[1], w.w[2], w.w[3]};
}

namespace {

// Random words for global element `index` under `seed`; `stream` separates distributions.
std::array<uint32_t, 4> element_words(uint64_t seed, uint64_t index, uint32_t stream) {
  const philox::Words w = philox::element_words(seed, index, stream);
  return {w.w[0], w.w[1], w.w[2], w.w[3]};
}

// 24 random bits -> [0, 1) exactly representable in f32.
double unit_open_right(uint32_t word) { return (word >> 8) * 0x1.0p-24; }
// -> (0, 1], safe for log().
double unit_open_left(uint32_t word) { return ((word >> 8) + 1) * 0x1.0p-24; }

// Where `out`'s elements sit in the global tensor: global index of local row-major element i is
// base + sum_d coord_d(i) * global_strides[d].
struct GlobalIndexMap {
  int64_t base = 0;
  Strides global_strides;
};

GlobalIndexMap global_index_map(const Tensor& out, const RngRegion& region, const char* op) {
  const Shape& local = out.shape();
  const RngRegion resolved = resolved_region(region, local);
  const Shape &global = resolved.global_shape, &offset = resolved.global_offset;
  LOOM_CHECK(global.size() == local.size() && offset.size() == local.size(),
             "{}: region of global shape {} and offset {} does not match the local shape {}", op,
             shape_str(global), shape_str(offset), shape_str(local));
  for (size_t d = 0; d < local.size(); ++d) {
    LOOM_CHECK(offset[d] >= 0 && offset[d] + local[d] <= global[d],
               "{}: local shape {} at offset {} does not fit in global shape {}", op,
               shape_str(local), shape_str(offset), shape_str(global));
  }
  GlobalIndexMap map;
  map.global_strides = contiguous_strides(global);
  for (size_t d = 0; d < local.size(); ++d) map.base += offset[d] * map.global_strides[d];
  return map;
}

// Calls fill(local_linear_index, global_linear_index) for each element of `out`.
template <typename Fill>
void for_each_global_index(const Tensor& out, const RngRegion& region, const char* op,
                           Fill&& fill) {
  const GlobalIndexMap map = global_index_map(out, region, op);
  const int64_t base = map.base;
  // Iterate local elements in row-major order, tracking the global linear index alongside.
  int64_t local_index = 0;
  cpu::for_each_run<1>(out.shape(), {map.global_strides},
                       [&](const auto& offsets, int64_t count, const auto& inner) {
                         for (int64_t j = 0; j < count; ++j)
                           fill(local_index++, base + offsets[0] + j * inner[0]);
                       });
}

// `kind` and (a, b) say the same distribution as `sample` does, for the CUDA kernel.
template <typename Sample>
void fill_floating(const Tensor& out, const RngRegion& region, const char* op, uint64_t seed,
                   cuda::kernels::RandomKind kind, double a, double b, Sample&& sample) {
  LOOM_CHECK(region.runs.empty(),
             "{}: a region in runs (along dim {}) is drawn run by run; give each run's block "
             "its own region",
             op, region.runs_dim);
  if (out.extension()) {
    // A distributed tensor: each process fills its own piece from the pieces' global indices,
    // so every layout holds the values one process would draw for the whole tensor.
    const std::optional<LocalPiece> piece = out.extension()->local_piece();
    LOOM_CHECK(piece.has_value(), "{}: {} has no local piece of the global tensor to fill", op,
               out.description());
    LOOM_CHECK(region.global_shape.empty(),
               "{}: a distributed tensor fills its own piece's region; pass no RngRegion", op);
    fill_floating(piece->local, RngRegion{piece->global_shape, piece->global_offset}, op, seed,
                  kind, a, b, std::forward<Sample>(sample));
    return;
  }
  LOOM_CHECK(out.is_contiguous(), "{}: expected a contiguous tensor, got {}", op,
             out.description());
  if (out.device().is_meta()) return;  // shapes only (tensor/device.h)
  if (out.device().is_cuda()) {
    LOOM_CHECK(is_floating(out.dtype()), "{}: expected a floating dtype (f32, bf16, f16), got {}",
               op, dtype_name(out.dtype()));
    LOOM_CHECK(out.dim() <= cuda::kernels::kMaxDims, "{}: CUDA takes at most {} dims, got {}", op,
               cuda::kernels::kMaxDims, out.description());
    const GlobalIndexMap map = global_index_map(out, region, op);
    cuda::kernels::StridedArg global;
    global.ndim = static_cast<int>(out.dim());
    for (int64_t d = 0; d < out.dim(); ++d) {
      global.sizes[d] = out.shape()[d];
      global.strides[d] = map.global_strides[d];
    }
    cuda::kernels::philox_fill(out.dtype(), out.raw_data(), global, map.base, seed, kind, a, b,
                               out.device().index);
    return;
  }
  cpu::visit_floating_dtype(out.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    T* data = static_cast<T*>(out.raw_data());
    for_each_global_index(out, region, op, [&](int64_t local, int64_t global) {
      data[local] = cpu::from_compute<T>(sample(static_cast<uint64_t>(global)));
    });
  });
}

}  // namespace

namespace {

// How far the local positions a region's runs map reach along runs_dim.
int64_t runs_extent(const RngRegion& region) {
  LOOM_CHECK(region.runs.size() % 3 == 0 && region.runs_dim >= 0,
             "RngRegion: runs are (local start, global start, length) triples along a dim >= 0, "
             "got {} numbers along dim {}",
             region.runs.size(), region.runs_dim);
  int64_t extent = 0;
  for (size_t r = 0; r < region.runs.size(); r += 3) {
    LOOM_CHECK(region.runs[r] == extent && region.runs[r + 2] > 0,
               "RngRegion: run {} starts at local position {} with length {}; runs must cover "
               "the local positions from 0 in order",
               r / 3, region.runs[r], region.runs[r + 2]);
    extent += region.runs[r + 2];
  }
  return extent;
}

// A region in runs cut into plain regions: for each run `shape` meets along runs_dim, in order,
// the block's length there and its region.
std::vector<std::pair<int64_t, RngRegion>> plain_blocks(const Shape& shape,
                                                        const RngRegion& region) {
  const size_t d = static_cast<size_t>(region.runs_dim);
  runs_extent(region);
  LOOM_CHECK(d < shape.size() && region.global_shape.size() == shape.size() &&
                 region.global_offset.size() == shape.size(),
             "bernoulli: a region in runs along dim {} of global shape {} at offset {} for a "
             "tensor of shape {}",
             region.runs_dim, shape_str(region.global_shape), shape_str(region.global_offset),
             shape_str(shape));
  const int64_t begin = region.global_offset[d], end = begin + shape[d];
  std::vector<std::pair<int64_t, RngRegion>> blocks;
  int64_t covered = 0;
  for (size_t r = 0; r < region.runs.size(); r += 3) {
    const int64_t local = region.runs[r], global = region.runs[r + 1], length = region.runs[r + 2];
    const int64_t first = std::max(begin, local), last = std::min(end, local + length);
    if (first >= last) continue;
    RngRegion block{region.global_shape, region.global_offset};
    block.global_offset[d] = global + (first - local);
    blocks.emplace_back(last - first, std::move(block));
    covered += last - first;
  }
  LOOM_CHECK(covered == shape[d],
             "bernoulli: a tensor of shape {} at local positions [{}, {}) along dim {}, but the "
             "region's runs cover {} of them",
             shape_str(shape), begin, end, region.runs_dim, covered);
  return blocks;
}

}  // namespace

RngRegion resolved_region(const RngRegion& region, const Shape& shape) {
  RngRegion resolved = region;
  if (resolved.global_shape.empty()) resolved.global_shape = shape;
  if (resolved.global_offset.empty()) resolved.global_offset.assign(shape.size(), 0);
  return resolved;
}

RngRegion region_within(const RngRegion& outer, const Shape& whole, const Shape& offset) {
  if (outer.empty()) return {whole, offset};
  const RngRegion resolved = resolved_region(outer, whole);
  const Shape &global = resolved.global_shape, &start = resolved.global_offset;
  LOOM_CHECK(global.size() == whole.size() && start.size() == whole.size() &&
                 offset.size() == whole.size(),
             "region_within: a tensor of shape {} (a piece at offset {}) cannot sit in the region "
             "of global shape {} at offset {}: the ranks differ",
             shape_str(whole), shape_str(offset), shape_str(global), shape_str(start));
  Shape placed(whole.size());
  for (size_t d = 0; d < whole.size(); ++d) {
    // Along a dim in runs, `whole` sits among the runs' local positions.
    const bool in_runs = !outer.runs.empty() && static_cast<int64_t>(d) == outer.runs_dim;
    const int64_t extent = in_runs ? runs_extent(outer) : global[d];
    LOOM_CHECK(start[d] >= 0 && start[d] + whole[d] <= extent,
               "region_within: a tensor of shape {} at offset {} does not fit in global shape {}{}",
               shape_str(whole), shape_str(start), shape_str(global),
               in_runs ? fmt::format(" (dim {}: {} positions in runs)", d, extent) : "");
    placed[d] = start[d] + offset[d];
  }
  return {global, placed, outer.runs_dim, outer.runs};
}

namespace ops {

void normal_(const Tensor& out, uint64_t seed, double mean, double std, const RngRegion& region) {
  fill_floating(out, region, "normal_", seed, cuda::kernels::RandomKind::kNormal, mean, std,
                [&](uint64_t index) {
                  const auto words = element_words(seed, index, /*stream=*/1);
                  // Box-Muller, one normal per element so each element depends on its own index
                  // only.
                  const double radius = std::sqrt(-2.0 * std::log(unit_open_left(words[0])));
                  const double angle = 2.0 * std::numbers::pi * unit_open_right(words[1]);
                  return static_cast<float>(mean + std * radius * std::cos(angle));
                });
}

void uniform_(const Tensor& out, uint64_t seed, double low, double high, const RngRegion& region) {
  fill_floating(out, region, "uniform_", seed, cuda::kernels::RandomKind::kUniform, low, high,
                [&](uint64_t index) {
                  const auto words = element_words(seed, index, /*stream=*/2);
                  return static_cast<float>(low + (high - low) * unit_open_right(words[0]));
                });
}

Tensor normal(const Shape& shape, uint64_t seed, double mean, double std, DType dtype) {
  Tensor out = Tensor::empty(shape, dtype, default_device());
  normal_(out, seed, mean, std);
  return out;
}

Tensor uniform(const Shape& shape, uint64_t seed, double low, double high, DType dtype) {
  Tensor out = Tensor::empty(shape, dtype, default_device());
  uniform_(out, seed, low, high);
  return out;
}

Tensor bernoulli_keep_mask(const Shape& shape, uint64_t seed, double p, const RngRegion& region,
                           Device device) {
  LOOM_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability must be in [0, 1], got {}", p);
  if (!region.runs.empty()) {
    const auto pieces = plain_blocks(shape, region);
    if (pieces.empty()) return Tensor::empty(shape, kFloat32, device);  // no positions here
    std::vector<Tensor> blocks;
    Shape block_shape = shape;
    for (const auto& [length, block] : pieces) {
      block_shape[static_cast<size_t>(region.runs_dim)] = length;
      blocks.push_back(bernoulli_keep_mask(block_shape, seed, p, block, device));
    }
    return blocks.size() == 1 ? blocks.front() : cat(blocks, region.runs_dim);
  }
  Tensor out = Tensor::empty(shape, kFloat32, device);
  fill_floating(out, region, "bernoulli", seed, cuda::kernels::RandomKind::kBernoulliKeep, p, 0.0,
                [&, threshold = philox::keep_threshold(p)](uint64_t index) {
                  return philox::keep(seed, index, threshold) ? 1.0f : 0.0f;
                });
  return out;
}

}  // namespace ops
}  // namespace loom
