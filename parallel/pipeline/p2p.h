// Messages between adjacent stages (private to parallel/pipeline): tags, and the shape
// metadata a receiver needs before it can allocate a buffer.
//
// Tags: every (channel, boundary, microbatch) has its own tag, so a receive can only match the
// send meant for it whatever order the two ranks post them in (the Gloo backend matches sends
// and receives with equal tags in issue order). The boundary between stages s and s+1 is s.
//
// Metadata: a receiver learns the shape and dtype of a stage boundary's activations from one
// small message (kMetaElements i64: dtype, ndim, dims..., zero-padded) sent before the first
// activation crossing that boundary in each step. Gradients need none: the gradient of a
// stage's output has the output's shape, which the receiving stage computed itself.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace loom::pipeline::detail {

enum class Channel : int { kActivation = 0, kGradient = 1, kMetadata = 2 };

// Throws when the tag would not fit an int (huge stage or microbatch counts).
int p2p_tag(Channel channel, int boundary, int microbatch, int num_stages);

inline constexpr int64_t kMaxMetaDims = 8;
inline constexpr int64_t kMetaElements = 2 + kMaxMetaDims;

// (kMetaElements,) i64 describing `tensor`; throws for more than kMaxMetaDims dims.
Tensor encode_metadata(const Tensor& tensor);
// An empty contiguous CPU tensor of the shape and dtype `metadata` describes; throws naming the
// values when they are not metadata.
Tensor allocate_from_metadata(const Tensor& metadata);

}  // namespace loom::pipeline::detail
