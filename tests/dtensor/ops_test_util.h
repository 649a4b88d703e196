// Helpers for the per-op sharding tests (ops_*_test.cc): run a differentiable op once on plain
// tensors (the single-rank reference, the same values on every rank) and once on DTensors
// distributed with given placements, then compare the forward output, its placements, every
// input's gradient and the collectives each direction issued.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "dtensor/comm_debug_mode.h"
#include "dtensor/dtensor.h"
#include "tests/dtensor/dtensor_test_util.h"
#include "tests/testing/collectives.h"
#include "tests/testing/tensor_checks.h"

namespace loom::testing {

// A float tensor with values in [-1, 1) (for ops whose results are not integers anyway).
inline Tensor float_tensor(const Shape& shape, uint64_t seed) {
  return ops::uniform(shape, seed, -1.0, 1.0);
}

// (full tensor, how to distribute it). Floating inputs get requires_grad on both sides.
struct OpInput {
  Tensor full;
  Placements placements;
};

// The collectives one rank issues running the op on DTensors (forward: the op's redistributes
// and any collective inside it) and backpropagating through it (backward: its backward
// formulas, and each input gradient taking its input's placements). Counted around op(inputs)
// and around backward() only: the checks' own full_tensor calls are not in them.
//
// Two things shape the counts. The propagator prices gathering a shard (all-gather: local bytes
// times mesh size - 1) and moving it to another dim (all-to-all: local bytes) alike on 2 ranks
// and then takes its first option, Replicate; on 3 ranks it moves the shard. And a backward
// formula gets the op's inputs as they were, not as the forward redistributed them, so it
// redistributes them again.
struct OpCollectives {
  Collectives forward;
  Collectives backward;
};
// The most common: a replicated input whose gradient comes back sharded (all-gathered into its
// layout) or Partial (all-reduced).
inline constexpr OpCollectives kGatherGrad{.backward = {.all_gather = 1}};
inline constexpr OpCollectives kReduceGrad{.backward = {.all_reduce = 1}};

struct OpCheck {
  std::string name;
  std::vector<OpInput> inputs;
  // The op under test; called with plain tensors (reference) and with DTensors.
  std::function<Tensor(const std::vector<Tensor>&)> op;
  // The placements a PyTorch DTensor user expects on the output (unchecked when nullopt).
  std::optional<Placements> expected_output;
  // Derived from the op's sharding strategy; {} is none in either direction.
  OpCollectives collectives;
  Tolerance forward = kExact;
  Tolerance backward = kExact;
};

// Forward: full_tensor(op(distributed inputs)) == op(full inputs). Backward through the scalar
// loss sum(full_tensor(y) * W) (W integer-valued, fixed seed): each floating input's gradient is
// a DTensor with the input's own placements whose full tensor equals the reference gradient.
inline void check_op(const std::shared_ptr<const DeviceMesh>& mesh, const OpCheck& check) {
  SCOPED_TRACE(check.name + " on " + mesh->str());
  // Reference.
  std::vector<Tensor> reference_inputs;
  for (const OpInput& input : check.inputs) {
    Tensor t = ops::clone(input.full);
    if (is_floating(t.dtype())) t.set_requires_grad(true);
    reference_inputs.push_back(t);
  }
  const Tensor reference = check.op(reference_inputs);
  const Tensor weights = integer_tensor(reference.shape(), 1234);
  if (reference.requires_grad()) backward(sum(mul(reference, weights)));

  // Distributed (no broadcast: every rank passes the same values).
  std::vector<Tensor> inputs;
  for (const OpInput& input : check.inputs) {
    Tensor t = distribute_tensor(input.full, mesh, input.placements, std::nullopt);
    if (is_floating(t.dtype())) t.set_requires_grad(true);
    inputs.push_back(t);
  }
  Tensor out;
  {
    CommDebugMode comm;
    out = check.op(inputs);
    expect_collectives(comm, check.collectives.forward, check.name + " forward");
  }
  ASSERT_TRUE(is_dtensor(out)) << check.name;
  if (check.expected_output) {
    EXPECT_EQ(placements_str(dtensor_spec(out).placements), placements_str(*check.expected_output))
        << check.name;
  }
  const Tensor full = full_tensor(out);
  expect_close({.actual = full,
                .expected = reference,
                .tol = check.forward,
                .what = check.name + " forward"});
  if (!reference.requires_grad()) {
    EXPECT_EQ(collectives_str(check.collectives.backward), "none")
        << check.name << ": the output has no gradient, so no backward runs";
    return;
  }
  {
    CommDebugMode comm;
    backward(sum(mul(full, weights)));
    expect_collectives(comm, check.collectives.backward, check.name + " backward");
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].requires_grad()) continue;
    const std::string what = check.name + " grad of input " + std::to_string(i);
    const Tensor grad = inputs[i].grad();
    if (!reference_inputs[i].grad().defined()) {
      EXPECT_FALSE(grad.defined()) << what;
      continue;
    }
    ASSERT_TRUE(grad.defined()) << what;
    ASSERT_TRUE(is_dtensor(grad)) << what;
    // A gradient takes its parameter's placements (autograd's match_layout); a Partial input's
    // gradient is left unchecked here (the adjoint of Partial is Replicate).
    if (!dtensor_spec(inputs[i]).has_partial()) {
      EXPECT_EQ(placements_str(dtensor_spec(grad).placements),
                placements_str(dtensor_spec(inputs[i]).placements))
          << what;
    }
    expect_close({.actual = full_tensor(grad),
                  .expected = reference_inputs[i].grad(),
                  .tol = check.backward,
                  .what = what});
  }
}

// The meshes most checks run on: 1-D over 2 and 3 ranks, and 2x2.
inline std::shared_ptr<const DeviceMesh> mesh_1d(comm::ProcessGroup& pg) {
  return make_mesh(pg, {"tp"}, {pg.size()});
}
inline std::shared_ptr<const DeviceMesh> mesh_2x2(comm::ProcessGroup& pg) {
  return make_mesh(pg, {"dp", "tp"}, {2, 2});
}

}  // namespace loom::testing
