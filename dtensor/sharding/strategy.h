// Sharding strategies: for an op call on DTensors, which placements its inputs may have and
// which placements its outputs then get.
//
// A strategy describes ONE mesh dim: a list of options, each giving a placement per tensor
// input and per output ("matmul: (S(0), R) -> S(0); (R, S(1)) -> S(1); (S(1), S(0)) -> P(sum);
// (R, R) -> R"). The propagator picks, independently for every mesh dim, the option that moves
// the fewest bytes from the inputs' current placements, redistributes the inputs, and runs the
// local op on the shards. Strategies are pure functions of the input specs and attributes.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "dtensor/placement.h"
#include "dtensor/spec.h"
#include "tensor/dispatch.h"

namespace loom::sharding {

struct DimOption {
  Placements inputs;   // one per tensor input of the call (ignored for undefined inputs)
  Placements outputs;  // one per output
};

// What an input looks like to a strategy: its spec (nullopt for an undefined optional input).
using InputSpecs = std::vector<std::optional<DTensorSpec>>;

// Runs the op on local shards. `local_call` is the original call with inputs replaced by their
// (redistributed) local shards; `specs` are the inputs' specs after redistribution.
using LocalFn =
    std::function<std::vector<Tensor>(const OpCall& local_call, const InputSpecs& specs)>;

struct OpSharding {
  std::vector<DimOption> options;    // candidates for each mesh dim
  std::vector<Shape> output_shapes;  // global shapes of the outputs
  LocalFn local;                     // default: call_op(local_call)
  // Inputs that must keep their placements (in-place targets, layout templates): options that
  // would move them are skipped.
  std::vector<size_t> fixed_inputs;
};

// A strategy may read integer, bool and dtype attributes freely, but of a floating attribute
// only whether it is zero: decisions are cached without the value (see propagator.cc).
using StrategyFn = std::function<OpSharding(const OpCall& call, const InputSpecs& inputs)>;
using StrategyTable = PerOp<StrategyFn>;  // indexed by OpId (tensor/op_list.h)

// Registration entry points, one per file under dtensor/sharding/; index.cc calls them all.
void register_elementwise_strategies(StrategyTable& table);
void register_matmul_strategies(StrategyTable& table);
void register_reduction_strategies(StrategyTable& table);
void register_view_strategies(StrategyTable& table);
void register_nn_strategies(StrategyTable& table);

// Whether reshaping a DTensor with `spec` to `shape` keeps every shard on a dim of the result
// (reshape's strategy then needs no redistribute).
bool reshape_keeps_shards(const DTensorSpec& spec, const Shape& shape);

// The full table (built once, on first use, from the calls above; every kExtended op of
// tensor/op_list.h has an entry).
const StrategyTable& strategy_table();

}  // namespace loom::sharding
