// Counter-based random numbers (Philox 4x32-10, Salmon et al. 2011).
//
// Element i of a tensor is a pure function of (seed, i), with i the element's row-major index
// in the *global* tensor. So a shard initialized alone equals the same slice of the whole
// tensor initialized at once, bit for bit, whatever the sharding: DTensor initialization
// relies on this. No hidden generator state; pass the seed.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace loom {

// The Philox4x32-10 block for (counter, key).
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// Which part of a larger logical tensor a local tensor holds: its global shape and the global
// index of its first element along each dim. Empty fields mean "the tensor is the whole".
//
// With runs (bernoulli_keep_mask only), dim `runs_dim` is not one block of the global dim but
// several: the positions of a larger local extent along it lie in the global tensor in runs
// (under context parallelism a rank's sequence is two chunks from the ends of the whole
// sequence), and global_offset[runs_dim] is where the tensor starts among those local
// positions. `runs` holds triples (local start, global start, length), covering the local
// extent in order from 0.
struct RngRegion {
  Shape global_shape;
  Shape global_offset;
  int64_t runs_dim = -1;
  std::vector<int64_t> runs;
  bool empty() const { return global_shape.empty() && global_offset.empty() && runs.empty(); }
};

// `region` with its defaults made explicit for a tensor of `shape`: no global shape is `shape`
// itself, no offset is zeros (runs kept). Sizes are not checked.
RngRegion resolved_region(const RngRegion& region, const Shape& shape);

// The region of a piece at `offset` in a tensor shaped `whole` that itself sits at `outer` (empty:
// `whole` is the whole tensor): how a shard of a block draws its slice of the whole's numbers,
// e.g. a tensor-parallel shard of one data-parallel rank's rows. Throws when `outer` does not
// match `whole`'s rank or `whole` does not fit in it.
RngRegion region_within(const RngRegion& outer, const Shape& whole, const Shape& offset);

namespace ops {
// Fill `out` (contiguous, floating; CPU or CUDA) in place. On CUDA uniform_ is bit-identical to the
// CPU; normal_ agrees to an f32 ulp (its double log/cos come from CUDA's libdevice, not glibc).
void normal_(const Tensor& out, uint64_t seed, double mean = 0.0, double std = 1.0,
             const RngRegion& region = {});
void uniform_(const Tensor& out, uint64_t seed, double low = 0.0, double high = 1.0,
              const RngRegion& region = {});
// New tensors on default_device() (tensor/device.h).
Tensor normal(const Shape& shape, uint64_t seed, double mean = 0.0, double std = 1.0,
              DType dtype = kFloat32);
Tensor uniform(const Shape& shape, uint64_t seed, double low = 0.0, double high = 1.0,
               DType dtype = kFloat32);
// Keep-mask for dropout (f32 on `device`): element is 1 with probability 1 - p. On CUDA the mask
// is bit-identical to the CPU's (same Philox counters), so a GPU rank drops what a CPU rank drops.
// A region with runs draws each run's block alone and joins them along runs_dim.
Tensor bernoulli_keep_mask(const Shape& shape, uint64_t seed, double p,
                           const RngRegion& region = {}, Device device = Device::cpu());
}  // namespace ops

}  // namespace loom
