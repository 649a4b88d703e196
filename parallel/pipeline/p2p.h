// Messages between adjacent stages (private to parallel/pipeline): the shape metadata a receiver
// needs before it can allocate a buffer.
//
// No tags: the stages send and receive with tag 0 on every backend, so messages between two
// ranks pair up in the order each issues them — what NCCL (which has no tags) does, and what the
// Gloo backend does for equal tags. validate_schedule (rule 4b) proves both ranks issue them in
// the same order, so the CPU tests run exactly the message order GPU ranks run.
//
// Metadata: a receiver learns the shape and dtype of a stage boundary's activations from one
// small message (kMetaElements i64: dtype, ndim, dims..., zero-padded) sent right before the
// first activation crossing that boundary in each step. Gradients need none: the gradient of a
// stage's output has the output's shape, which the receiving stage computed itself.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace loom::pipeline::detail {

inline constexpr int64_t kMaxMetaDims = 8;
inline constexpr int64_t kMetaElements = 2 + kMaxMetaDims;

// What crosses a stage boundary: every microbatch's activation has this shape and dtype.
struct BoundaryShape {
  Shape shape;
  DType dtype;
};

// (kMetaElements,) i64 on `device` describing `tensor`; throws for more than kMaxMetaDims dims.
Tensor encode_metadata(const Tensor& tensor, Device device);
// The shape and dtype `metadata` (on any device; a GPU rank copies it back) describes; throws
// naming the values when they are not metadata.
BoundaryShape decode_metadata(const Tensor& metadata);

}  // namespace loom::pipeline::detail
