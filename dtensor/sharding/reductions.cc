// Reductions: a reduced dim that is sharded makes the result Partial; kept dims keep their
// shards (renumbered). mean over a sharded dim is computed as (local sum) / (global count), a
// Partial(sum) — exact for uneven shards, unlike averaging local means.
#include <algorithm>

#include "base/error.h"
#include "dtensor/sharding/strategy.h"
#include "tensor/ops.h"

namespace loom::sharding {

namespace {

using comm::ReduceOp;

std::vector<bool> reduced(const std::vector<int64_t>& dims, int64_t ndim, std::string_view op) {
  std::vector<bool> mask(ndim, dims.empty());
  for (int64_t d : dims) mask[normalize_dim(d, ndim, op)] = true;
  return mask;
}

// Output dim of input dim `d` (or -1 when reduced away).
int64_t output_dim(const std::vector<bool>& mask, int64_t d, bool keepdim) {
  if (keepdim) return d;
  if (mask[d]) return -1;
  return static_cast<int64_t>(std::count(mask.begin(), mask.begin() + d, false));
}

OpSharding reduce_sharding(const DTensorSpec& in, const std::vector<int64_t>& dims, bool keepdim,
                           std::string_view op, bool linear) {
  const int64_t ndim = static_cast<int64_t>(in.shape.size());
  const auto mask = reduced(dims, ndim, op);
  Shape out;
  for (int64_t d = 0; d < ndim; ++d) {
    if (!mask[d])
      out.push_back(in.shape[d]);
    else if (keepdim)
      out.push_back(1);
  }
  OpSharding s;
  s.output_shapes = {out};
  s.options.push_back({{Replicate()}, {Replicate()}});
  for (int64_t d = 0; d < ndim; ++d) {
    const int64_t od = output_dim(mask, d, keepdim);
    if (mask[d]) {
      if (linear) s.options.push_back({{Shard(d)}, {Partial(ReduceOp::kSum)}});
    } else {
      s.options.push_back({{Shard(d)}, {Shard(od)}});
    }
  }
  if (linear) {
    for (ReduceOp p : {ReduceOp::kSum, ReduceOp::kAvg})
      s.options.push_back({{Partial(p)}, {Partial(p)}});
  }
  return s;
}

}  // namespace

void register_reduction_strategies(StrategyTable& t) {
  t[OpId::sum] = [](const OpCall& call, const InputSpecs& in) {
    return reduce_sharding(*in[0], call.ints_attr(0), call.bool_attr(1), call.op, /*linear=*/true);
  };
  t[OpId::mean] = [](const OpCall& call, const InputSpecs& in) {
    OpSharding s =
        reduce_sharding(*in[0], call.ints_attr(0), call.bool_attr(1), call.op, /*linear=*/true);
    const Shape global = in[0]->shape;
    s.local = [global](const OpCall& local, const InputSpecs&) {
      const auto& dims = local.ints_attr(0);
      double count = 1;
      if (dims.empty()) {
        count = static_cast<double>(shape_numel(global));
      } else {
        for (int64_t d : dims)
          count *= static_cast<double>(global[normalize_dim(d, global.size(), "mean")]);
      }
      return std::vector<Tensor>{
          ops::div(ops::sum(local.inputs[0], dims, local.bool_attr(1)), count)};
    };
    return s;
  };
  // (grad, indices) -> grad scattered to the chosen positions of the input's shape: the reduced
  // dim must be whole; kept dims keep their shards; linear in grad.
  t[OpId::max_dim_backward] = [](const OpCall& call, const InputSpecs& in) {
    const Shape input_shape = call.ints_attr(0);
    const int64_t ndim = static_cast<int64_t>(input_shape.size());
    const int64_t dim = normalize_dim(call.int_attr(1), std::max<int64_t>(ndim, 1), call.op);
    const bool keepdim = call.bool_attr(2);
    // The grad/indices dim that input dim `d` (!= dim) comes from.
    const auto grad_dim = [dim, keepdim](int64_t d) { return keepdim || d < dim ? d : d - 1; };
    OpSharding s;
    s.output_shapes = {input_shape};
    s.options.push_back({{Replicate(), Replicate()}, {Replicate()}});
    for (int64_t d = 0; d < ndim; ++d) {
      if (d != dim) s.options.push_back({{Shard(grad_dim(d)), Shard(grad_dim(d))}, {Shard(d)}});
    }
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg})
      s.options.push_back({{Partial(op), Replicate()}, {Partial(op)}});
    s.local = [dim, keepdim, ndim, grad_dim](const OpCall& local, const InputSpecs&) {
      Shape local_shape = local.ints_attr(0);
      for (int64_t d = 0; d < ndim; ++d) {
        if (d != dim) local_shape[d] = local.inputs[0].shape()[grad_dim(d)];
      }
      return std::vector<Tensor>{
          ops::max_dim_backward(local.inputs[0], local.inputs[1], local_shape, dim, keepdim)};
    };
    return s;
  };
  t[OpId::max_dim] = [](const OpCall& call, const InputSpecs& in) {
    OpSharding s =
        reduce_sharding(*in[0], {call.int_attr(0)}, call.bool_attr(1), call.op, /*linear=*/false);
    s.output_shapes.push_back(s.output_shapes[0]);  // values and indices
    for (auto& option : s.options) option.outputs.push_back(option.outputs[0]);
    return s;
  };
}

}  // namespace loom::sharding
