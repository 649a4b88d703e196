// View-like ops: shards follow the dims they live on. reshape/view map dims through groups of
// input and output dims with equal element counts; a shard survives when it is on the first
// dim of its group and the group's first output dim splits evenly by the mesh. `view` refuses
// (it must not communicate) where `reshape` redistributes.
#include <fmt/ranges.h>

#include "base/error.h"
#include "dtensor/sharding/strategy.h"
#include "tensor/ops.h"

namespace loom::sharding {

namespace {

using comm::ReduceOp;

void add_partial_passthrough(OpSharding& s, size_t num_inputs) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    DimOption option{Placements(num_inputs, Replicate()), {Partial(op)}};
    option.inputs[0] = Partial(op);
    s.options.push_back(std::move(option));
  }
}

// Options where input dim d maps to output dim map[d] (-1: must be Replicate).
OpSharding mapped(const DTensorSpec& in, const std::vector<int64_t>& map, Shape out_shape,
                  bool linear) {
  OpSharding s;
  s.output_shapes = {std::move(out_shape)};
  s.options.push_back({{Replicate()}, {Replicate()}});
  for (size_t d = 0; d < map.size(); ++d) {
    if (map[d] >= 0) s.options.push_back({{Shard(static_cast<int64_t>(d))}, {Shard(map[d])}});
  }
  if (linear) add_partial_passthrough(s, 1);
  return s;
}

int64_t mesh_numel(const DTensorSpec& spec) { return spec.mesh->numel(); }

struct ViewMap {
  std::vector<int64_t> map;  // input dim -> output dim carrying its shard, or -1
};

ViewMap view_map(const Shape& in, const Shape& out, int64_t divisor) {
  ViewMap result{std::vector<int64_t>(in.size(), -1)};
  if (shape_numel(in) == 0) return result;
  size_t i = 0, j = 0;
  while (i < in.size() || j < out.size()) {
    // A size-1 dim with no size-1 partner carries nothing: step over it, so that it never
    // starts a group ((B, 1, C) -> (B, C) maps C to C).
    if (i < in.size() && in[i] == 1 && (j >= out.size() || out[j] != 1)) {
      ++i;
      continue;
    }
    if (j < out.size() && out[j] == 1 && (i >= in.size() || in[i] != 1)) {
      ++j;
      continue;
    }
    std::vector<size_t> gi, go;
    int64_t pi = 1, po = 1;
    if (i < in.size()) {
      pi *= in[i];
      gi.push_back(i++);
    }
    if (j < out.size()) {
      po *= out[j];
      go.push_back(j++);
    }
    while (pi != po) {
      if (pi < po && i < in.size()) {
        pi *= in[i];
        gi.push_back(i++);
      } else if (j < out.size()) {
        po *= out[j];
        go.push_back(j++);
      } else
        break;
    }
    if (gi.empty() || go.empty()) continue;
    const size_t d = gi.front(), c = go.front();
    if ((gi.size() == 1 && go.size() == 1) || (in[d] % divisor == 0 && out[c] % divisor == 0)) {
      result.map[d] = static_cast<int64_t>(c);
    }
  }
  return result;
}

}  // namespace

bool reshape_keeps_shards(const DTensorSpec& spec, const Shape& shape) {
  if (shape_numel(shape) != shape_numel(spec.shape)) return false;
  const ViewMap vm = view_map(spec.shape, shape, mesh_numel(spec));
  for (const Placement& p : spec.placements) {
    if (p.is_shard() && vm.map[p.dim()] < 0) return false;
  }
  return true;
}

namespace {

OpSharding reshape_sharding(const OpCall& call, const InputSpecs& in, bool is_view) {
  const DTensorSpec& spec = *in[0];
  const Shape out =
      ops::infer_shape(call.ints_attr(0), shape_numel(spec.shape), spec.shape, call.op);
  const ViewMap vm = view_map(spec.shape, out, mesh_numel(spec));
  if (is_view) {
    for (size_t md = 0; md < spec.placements.size(); ++md) {
      const Placement& p = spec.placements[md];
      LOOM_CHECK(!p.is_shard() || vm.map[p.dim()] >= 0,
                 "view: a DTensor of shape {} with placements {} cannot be viewed as {}: its shard "
                 "on dim {} "
                 "(mesh dim '{}') would cross shard boundaries; use reshape, which redistributes",
                 shape_str(spec.shape), placements_str(spec.placements), shape_str(out), p.dim(),
                 spec.mesh->dim_names()[md]);
    }
  }
  OpSharding s = mapped(spec, vm.map, out, /*linear=*/true);
  const Shape global_in = spec.shape;
  const std::vector<int64_t> map = vm.map;
  s.local = [global_in, out, map](const OpCall& local, const InputSpecs&) {
    Shape local_out = out;
    const Shape& local_in = local.inputs[0].shape();
    for (size_t d = 0; d < map.size(); ++d) {
      // Multiply first: when a dim splits (C -> H, D), out[map[d]] / global_in[d] is a fraction.
      if (map[d] >= 0 && local_in[d] != global_in[d])
        local_out[map[d]] = out[map[d]] * local_in[d] / global_in[d];
    }
    return std::vector<Tensor>{ops::reshape(local.inputs[0], local_out)};
  };
  return s;
}

}  // namespace

void register_view_strategies(StrategyTable& t) {
  t[OpId::view] = [](const OpCall& call, const InputSpecs& in) {
    return reshape_sharding(call, in, true);
  };
  t[OpId::reshape] = [](const OpCall& call, const InputSpecs& in) {
    return reshape_sharding(call, in, false);
  };
  t[OpId::transpose] = [](const OpCall& call, const InputSpecs& in) {
    const DTensorSpec& spec = *in[0];
    const int64_t ndim = static_cast<int64_t>(spec.shape.size());
    const int64_t d0 = normalize_dim(call.int_attr(0), ndim, call.op),
                  d1 = normalize_dim(call.int_attr(1), ndim, call.op);
    std::vector<int64_t> map(ndim);
    for (int64_t d = 0; d < ndim; ++d) map[d] = d == d0 ? d1 : d == d1 ? d0 : d;
    Shape out = spec.shape;
    if (ndim > 0) std::swap(out[d0], out[d1]);
    return mapped(spec, map, out, true);
  };
  t[OpId::permute] = [](const OpCall& call, const InputSpecs& in) {
    const DTensorSpec& spec = *in[0];
    const auto& dims = call.ints_attr(0);
    const int64_t ndim = static_cast<int64_t>(spec.shape.size());
    std::vector<int64_t> map(ndim);
    Shape out(ndim);
    for (int64_t i = 0; i < ndim; ++i) {
      const int64_t d = normalize_dim(dims.at(i), ndim, call.op);
      map[d] = i;
      out[i] = spec.shape[d];
    }
    return mapped(spec, map, out, true);
  };
  t[OpId::unsqueeze] = [](const OpCall& call, const InputSpecs& in) {
    const DTensorSpec& spec = *in[0];
    const int64_t ndim = static_cast<int64_t>(spec.shape.size());
    const int64_t at = normalize_dim(call.int_attr(0), ndim + 1, call.op);
    std::vector<int64_t> map(ndim);
    for (int64_t d = 0; d < ndim; ++d) map[d] = d < at ? d : d + 1;
    Shape out = spec.shape;
    out.insert(out.begin() + at, 1);
    return mapped(spec, map, out, true);
  };
  t[OpId::squeeze] = [](const OpCall& call, const InputSpecs& in) {
    const DTensorSpec& spec = *in[0];
    const int64_t ndim = static_cast<int64_t>(spec.shape.size());
    const int64_t at = normalize_dim(call.int_attr(0), ndim, call.op);
    const bool removes = ndim > 0 && spec.shape[at] == 1;
    std::vector<int64_t> map(ndim);
    Shape out;
    for (int64_t d = 0; d < ndim; ++d) {
      if (removes && d == at) {
        map[d] = -1;
        continue;
      }
      map[d] = static_cast<int64_t>(out.size());
      out.push_back(spec.shape[d]);
    }
    return mapped(spec, map, out, true);
  };
  t[OpId::expand] = [](const OpCall& call, const InputSpecs& in) {
    const DTensorSpec& spec = *in[0];
    Shape out = call.ints_attr(0);
    const int64_t lead = static_cast<int64_t>(out.size() - spec.shape.size());
    std::vector<int64_t> map(spec.shape.size());
    for (size_t d = 0; d < spec.shape.size(); ++d) {
      if (out[d + lead] == -1) out[d + lead] = spec.shape[d];
      map[d] = spec.shape[d] == out[d + lead] ? static_cast<int64_t>(d + lead) : -1;
    }
    OpSharding s = mapped(spec, map, out, true);
    s.local = [out, map, lead](const OpCall& local, const InputSpecs&) {
      Shape local_out = out;
      for (size_t d = 0; d < map.size(); ++d) {
        if (map[d] >= 0) local_out[map[d]] = local.inputs[0].shape()[d];
      }
      return std::vector<Tensor>{ops::expand(local.inputs[0], local_out)};
    };
    return s;
  };
  // narrow/slice: any dim but the one cut may stay sharded.
  const auto cut = [](const OpCall& call, const InputSpecs& in, int64_t dim, int64_t new_size) {
    const DTensorSpec& spec = *in[0];
    const int64_t ndim = static_cast<int64_t>(spec.shape.size());
    dim = normalize_dim(dim, ndim, call.op);
    std::vector<int64_t> map(ndim);
    for (int64_t d = 0; d < ndim; ++d) map[d] = d == dim ? -1 : d;
    Shape out = spec.shape;
    out[dim] = new_size;
    return mapped(spec, map, out, true);
  };
  t[OpId::narrow] = [cut](const OpCall& call, const InputSpecs& in) {
    return cut(call, in, call.int_attr(0), call.int_attr(2));
  };
  t[OpId::slice] = [cut](const OpCall& call, const InputSpecs& in) {
    const DTensorSpec& spec = *in[0];
    const int64_t dim = normalize_dim(call.int_attr(0), spec.shape.size(), call.op);
    // Same size arithmetic as ops::slice.
    const int64_t size = spec.shape[dim];
    int64_t start = call.int_attr(1), end = call.int_attr(2);
    const int64_t step = call.int_attr(3);
    if (start < 0) start += size;
    if (end < 0) end += size;
    start = std::clamp<int64_t>(start, 0, size);
    end = std::clamp<int64_t>(end, start, size);
    return cut(call, in, dim, (end - start + step - 1) / step);
  };
  // (grad) -> zeros of the input's shape with grad in the sliced positions: like slice, any dim
  // but the cut one may stay sharded (it has the same size in grad and output), and it is linear.
  t[OpId::slice_backward] = [](const OpCall& call, const InputSpecs& in) {
    const DTensorSpec& grad = *in[0];
    const Shape input_shape = call.ints_attr(0);
    const int64_t ndim = static_cast<int64_t>(input_shape.size());
    const int64_t dim = normalize_dim(call.int_attr(1), ndim, call.op);
    std::vector<int64_t> map(ndim);
    for (int64_t d = 0; d < ndim; ++d) map[d] = d == dim ? -1 : d;
    OpSharding s = mapped(grad, map, input_shape, /*linear=*/true);
    s.local = [dim](const OpCall& local, const InputSpecs&) {
      Shape local_shape = local.inputs[0].shape();  // the local grad; only `dim` differs
      local_shape[dim] = local.ints_attr(0)[dim];
      return std::vector<Tensor>{ops::slice_backward(local.inputs[0], local_shape, dim,
                                                     local.int_attr(2), local.int_attr(3),
                                                     local.int_attr(4))};
    };
    return s;
  };
  t[OpId::cat] = [](const OpCall& call, const InputSpecs& in) {
    const int64_t ndim = static_cast<int64_t>(in[0]->shape.size());
    const int64_t dim = normalize_dim(call.int_attr(0), ndim, call.op);
    Shape out = in[0]->shape;
    out[dim] = 0;
    for (const auto& spec : in) out[dim] += spec->shape[dim];
    OpSharding s;
    s.output_shapes = {out};
    s.options.push_back({Placements(in.size(), Replicate()), {Replicate()}});
    for (int64_t d = 0; d < ndim; ++d) {
      if (d != dim) s.options.push_back({Placements(in.size(), Shard(d)), {Shard(d)}});
    }
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg})
      s.options.push_back({Placements(in.size(), Partial(op)), {Partial(op)}});
    return s;
  };
}

}  // namespace loom::sharding
