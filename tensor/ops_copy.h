// Copies and conversions (loom::ops). clone, to and cat record autograd (tensor/dispatch.h);
// the in-place copy_ does not.
#pragma once

#include <span>
#include <vector>

#include "tensor/tensor.h"

namespace loom::ops {

// Copies `src` into `dst` elementwise, broadcasting src to dst's shape and converting dtype, on
// one device or across devices (any layouts; staged through a contiguous copy when needed).
void copy_(const Tensor& dst, const Tensor& src);
// copy_ whose bytes a trace counts elsewhere, so FlopCounter does not count it as an in-place
// write: into an output the calling op has just allocated (clone, cat, a product's bias rows:
// the allocation stands for those bytes), or a message a fake transport delivers (comm/fake: the
// communication's bytes, not compute's).
void copy_uncounted_(const Tensor& dst, const Tensor& src);
// `self` when already contiguous, else a contiguous copy.
Tensor contiguous(const Tensor& self);
// A contiguous copy that shares nothing with `self`.
Tensor clone(const Tensor& self);
// torch.repeat_interleave(self, repeats, dim) for a count: each index of `dim` repeated
// `repeats` times in a row ([a, b] -> [a, a, b, b]), a contiguous copy (`self` itself when
// repeats is 1). Composed of expand and contiguous, so it is differentiable and runs on DTensors.
Tensor repeat_interleave(const Tensor& self, int64_t repeats, int64_t dim);
// Converted copy (or `self` when dtype/device already match).
Tensor to(const Tensor& self, DType dtype);
Tensor to(const Tensor& self, Device device);
// Concatenates along an existing dim; all other dims must match.
Tensor cat(std::span<const Tensor> tensors, int64_t dim);
// `value` laid out like `like`: for plain tensors, `value` itself (shapes must match); for
// DTensors (through dispatch), `value` redistributed to `like`'s placements, Replicate where
// `like` is Partial (a Partial tensor's gradient is Replicate). Autograd uses it so a
// parameter's gradient always has the parameter's layout.
Tensor match_layout(const Tensor& value, const Tensor& like);
// Stacks along a new dim; all shapes must match.
Tensor stack(std::span<const Tensor> tensors, int64_t dim);
// The stack of `tensors` along a new dim as a view, without a copy, when they already lie that
// way: plain tensors of one storage, shape and strides, at offsets one step apart, together
// non-overlapping and dense (the q, k and v slices of a fused projection, or gradients the
// attention backward wrote like them). Undefined otherwise: then stack copies. Not recorded by
// autograd (for backward functions, which run without grad mode).
Tensor stacked_view(std::span<const Tensor> tensors, int64_t dim);

}  // namespace loom::ops
