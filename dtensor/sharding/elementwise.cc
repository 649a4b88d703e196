// Elementwise ops (with NumPy broadcasting): shard any output dim that every non-broadcast
// input has; Partial passes through ops that are linear in their Partial inputs.
#include "base/error.h"
#include "dtensor/sharding/strategy.h"

namespace loom::sharding {

namespace {

using comm::ReduceOp;

Shape broadcast_all(const InputSpecs& inputs, std::string_view op) {
  Shape out;
  for (const auto& spec : inputs) {
    if (spec) out = broadcast_shapes(out, spec->shape, op);
  }
  return out;
}

// Options for sharding each output dim, plus all-Replicate. `partial_patterns` lists which
// inputs may be Partial together (each pattern: one flag per input) for linear ops.
OpSharding elementwise_sharding(const OpCall& call, const InputSpecs& inputs, size_t num_outputs,
                                const std::vector<std::vector<bool>>& partial_patterns) {
  OpSharding s;
  const Shape out = broadcast_all(inputs, call.op);
  const int64_t ndim = static_cast<int64_t>(out.size());
  s.output_shapes.assign(num_outputs, out);
  s.options.push_back(
      {Placements(inputs.size(), Replicate()), Placements(num_outputs, Replicate())});
  for (int64_t d = 0; d < ndim; ++d) {
    DimOption option{Placements(inputs.size(), Replicate()), Placements(num_outputs, Shard(d))};
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!inputs[i]) continue;
      const int64_t lead = ndim - static_cast<int64_t>(inputs[i]->shape.size());
      const int64_t di = d - lead;
      if (di >= 0 && inputs[i]->shape[di] == out[d]) option.inputs[i] = Shard(di);
    }
    s.options.push_back(std::move(option));
  }
  for (const auto& pattern : partial_patterns) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      DimOption option{Placements(inputs.size(), Replicate()),
                       Placements(num_outputs, Partial(op))};
      for (size_t i = 0; i < inputs.size(); ++i) {
        if (pattern[i]) option.inputs[i] = Partial(op);
      }
      s.options.push_back(std::move(option));
    }
  }
  return s;
}

StrategyFn unary(bool linear) {
  return [linear](const OpCall& call, const InputSpecs& in) {
    return elementwise_sharding(
        call, in, 1,
        linear ? std::vector<std::vector<bool>>{{true}} : std::vector<std::vector<bool>>{});
  };
}

StrategyFn nary(std::vector<std::vector<bool>> partial_patterns) {
  return [partial_patterns](const OpCall& call, const InputSpecs& in) {
    return elementwise_sharding(call, in, 1, partial_patterns);
  };
}

// Which Partial reductions an in-place op keeps exact on a Partial self (self cannot move).
using PartialSelfOk = bool (*)(const OpCall& call, ReduceOp op);

bool no_partial(const OpCall&, ReduceOp) { return false; }
bool any_partial(const OpCall&, ReduceOp) { return true; }
// Adding partial sums (or means) term by term sums them; partial maxima do not add up.
bool additive_partial(const OpCall&, ReduceOp op) {
  return op == ReduceOp::kSum || op == ReduceOp::kAvg;
}
// Scaling commutes with a sum and a mean, and with a max or min only by a factor >= 0 (a negative
// one turns the max into the min, another placement).
bool scalable_partial(const OpCall& call, ReduceOp op) {
  return op == ReduceOp::kSum || op == ReduceOp::kAvg || call.double_attr(0) >= 0;
}

// In place on input 0 (self): self keeps its placements; the other inputs follow it.
StrategyFn in_place(PartialSelfOk partial_ok) {
  return [partial_ok](const OpCall& call, const InputSpecs& in) {
    OpSharding s;
    const DTensorSpec& self = *in[0];
    for (const Placement& p : self.placements) {
      LOOM_CHECK(!p.is_partial() || partial_ok(call, p.reduce_op()),
                 "{}: cannot write in place into a DTensor that is {} ({}): the result would not "
                 "be {}; redistribute it first (e.g. to Replicate) or use the out-of-place op",
                 call.op, p.str(), self.str(), p.str());
    }
    // One option per distinct placement of self (each mesh dim picks its own).
    for (const Placement& p : self.placements) {
      DimOption option{Placements(in.size(), p), {}};
      for (size_t i = 1; i < in.size(); ++i) {
        if (in[i] && in[i]->shape.size() < self.shape.size() && p.is_shard()) {
          // A broadcast operand: its dim for p, or Replicate when it lacks it.
          const int64_t lead = static_cast<int64_t>(self.shape.size() - in[i]->shape.size());
          const int64_t di = p.dim() - lead;
          option.inputs[i] =
              di >= 0 && in[i]->shape[di] == self.shape[p.dim()] ? Shard(di) : Replicate();
        }
      }
      s.options.push_back(std::move(option));
    }
    s.fixed_inputs = {0};
    return s;
  };
}

}  // namespace

void register_elementwise_strategies(StrategyTable& t) {
  for (OpId op : {OpId::neg, OpId::mul_scalar, OpId::div_scalar, OpId::clone}) {
    t[op] = unary(/*linear=*/true);
  }
  // A cast rounds each rank's partial sum on its own: to a floating type, to within that type's
  // precision of the cast sum (as torch keeps a Partial through a cast); to an integer type, by
  // whole units (0.5 + 0.5 cast on each rank summed to 0): that sum is cast whole.
  t[OpId::to_dtype] = [](const OpCall& call, const InputSpecs& in) {
    return unary(/*linear=*/is_floating(call.dtype_attr(0)))(call, in);
  };
  for (OpId op : {OpId::abs, OpId::exp, OpId::log, OpId::tanh, OpId::sigmoid, OpId::silu,
                  OpId::sqrt, OpId::rsqrt, OpId::pow, OpId::relu, OpId::gelu, OpId::add_scalar,
                  OpId::sub_scalar, OpId::rsub_scalar}) {
    t[op] = unary(/*linear=*/false);
  }
  // add/sub: linear when both are Partial; mul/div: when exactly the one side is Partial.
  t[OpId::add] = nary({{true, true}});
  t[OpId::sub] = nary({{true, true}});
  t[OpId::mul] = nary({{true, false}, {false, true}});
  t[OpId::div] = nary({{true, false}});
  t[OpId::maximum] = nary({});
  t[OpId::eq] = nary({});
  t[OpId::gt] = nary({});
  t[OpId::gelu_backward] = nary({{true, false}});  // linear in the incoming gradient
  t[OpId::silu_backward] = nary({{true, false}});
  t[OpId::silu_mul] = nary({{false, true}});  // linear in `up` only
  // Both gradients are linear in the incoming one.
  t[OpId::silu_mul_backward] = [](const OpCall& call, const InputSpecs& in) {
    return elementwise_sharding(call, in, 2, {{true, false, false}});
  };
  t[OpId::where] = nary({{false, true, true}});
  t[OpId::masked_fill] = [](const OpCall& call, const InputSpecs& in) {
    // Filling with 0 keeps a sum linear; any other value does not.
    const bool zero = call.double_attr(0) == 0.0;
    return elementwise_sharding(
        call, in, 1,
        zero ? std::vector<std::vector<bool>>{{true, false}} : std::vector<std::vector<bool>>{});
  };
  // A copy into a Partial self: the source is redistributed to that Partial, which holds it.
  t[OpId::copy_] = in_place(any_partial);
  // Factories shaped like a DTensor keep its layout; a Partial `like` gives Replicate (a
  // constant is not a partial sum).
  const auto like = [](const OpCall&, const InputSpecs& in) {
    OpSharding s;
    s.output_shapes = {in[0]->shape};
    for (const Placement& p : in[0]->placements)
      s.options.push_back({{p}, {p.is_partial() ? Replicate() : p}});
    s.fixed_inputs = {0};
    return s;
  };
  t[OpId::zeros_like] = like;
  t[OpId::ones_like] = like;
  // (value, like) -> value with like's placements: `like` never moves, `value` follows it.
  // Where `like` is Partial, `value` becomes Replicate: autograd uses this for a leaf's
  // gradient, and the gradient of a Partial value is Replicate (every contribution has the same
  // derivative; the adjoint rule of redistribute/to_local in dtensor.cc).
  t[OpId::match_layout] = [](const OpCall&, const InputSpecs& in) {
    OpSharding s;
    s.output_shapes = {in[1]->shape};
    for (const Placement& p : in[1]->placements) {
      const Placement q = p.is_partial() ? Replicate() : p;
      s.options.push_back({{q, p}, {q}});
    }
    s.local = [](const OpCall& local, const InputSpecs&) {
      return std::vector<Tensor>{local.inputs[0]};
    };
    s.fixed_inputs = {1};
    return s;
  };
  t[OpId::add_] = in_place(additive_partial);
  t[OpId::mul_scalar_] = in_place(scalable_partial);
  t[OpId::fill_] = in_place(no_partial);
}

}  // namespace loom::sharding
