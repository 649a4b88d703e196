// Tensor-parallel styles (torch.distributed.tensor.parallel): how one module's parameters,
// inputs and outputs are laid out on a 1-D mesh, applied by parallelize_module().
//
//   ColwiseParallel   Linear weight (out, in) -> Shard(0), bias -> Shard(0). Input Replicate,
//                     output Shard(-1) (the module computes its slice of the features).
//   RowwiseParallel   Linear weight -> Shard(1), bias Replicate. Input Shard(-1), output
//                     Replicate (one all-reduce of the Partial product).
//
// Plain tensors entering a parallelized module are taken to have `input_layouts` (from_local);
// outputs are redistributed to `output_layouts` and, with use_local_output, returned as local
// tensors — the torch defaults. Everything is differentiable.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "dtensor/placement.h"
#include "mesh/device_mesh.h"
#include "nn/module.h"

namespace loom::tp {

class ParallelStyle {
 public:
  virtual ~ParallelStyle() = default;
  // Shards `module`'s parameters and installs its input/output hooks. `fqn` names the module in
  // errors. Throws when the style does not fit the module.
  virtual void apply(nn::Module& module, const std::string& fqn, std::shared_ptr<const DeviceMesh> mesh) const = 0;
  virtual std::string name() const = 0;
};

struct LayoutOptions {
  std::optional<Placement> input_layouts;   // how plain inputs are laid out
  std::optional<Placement> output_layouts;  // what outputs are redistributed to
  bool use_local_output = true;
};

class ColwiseParallel : public ParallelStyle {
 public:
  explicit ColwiseParallel(LayoutOptions options = {}) : options_(options) {}
  void apply(nn::Module& module, const std::string& fqn, std::shared_ptr<const DeviceMesh> mesh) const override;
  std::string name() const override { return "ColwiseParallel"; }

 private:
  LayoutOptions options_;
};

class RowwiseParallel : public ParallelStyle {
 public:
  explicit RowwiseParallel(LayoutOptions options = {}) : options_(options) {}
  void apply(nn::Module& module, const std::string& fqn, std::shared_ptr<const DeviceMesh> mesh) const override;
  std::string name() const override { return "RowwiseParallel"; }

 private:
  LayoutOptions options_;
};

}  // namespace loom::tp
