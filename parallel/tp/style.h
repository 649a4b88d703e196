// Tensor-parallel styles (torch.distributed.tensor.parallel): how one module's parameters,
// inputs and outputs are laid out on a 1-D mesh, applied by parallelize_module().
//
//   ColwiseParallel      Linear weight (out, in) -> Shard(0), bias -> Shard(0); Embedding weight
//                        (V, C) -> Shard(1). Input Replicate, output Shard(-1).
//   RowwiseParallel      Linear weight -> Shard(1), bias Replicate: input Shard(-1), output
//                        Replicate (one all-reduce of the Partial product). Embedding weight ->
//                        Shard(0) (vocab-parallel: each rank looks up its own rows, a Partial
//                        sum): input Replicate, output Replicate.
//   SequenceParallel     For norms and dropout: parameters Replicate, activations Shard(1) (the
//                        sequence dim) in and out, so the per-token work is split across ranks.
//   PrepareModuleInput   Only converts a module's input: `input_layouts` says how a plain input
//   PrepareModuleOutput  is laid out, `desired_input_layouts` what it is redistributed to (and
//                        likewise for the output).
//
// Plain tensors entering a parallelized module are taken to have the input layout (from_local);
// outputs are redistributed to the output layout and, with use_local_output, returned as local
// tensors — the torch defaults (true for Colwise/Rowwise/PrepareModuleOutput, false for
// SequenceParallel/PrepareModuleInput). Everything is differentiable. A parameter's gradient
// always has the parameter's placements (autograd matches a distributed leaf's layout: a
// Replicate norm weight used on sequence shards gets its Partial gradient all-reduced).
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
  // Checks that the style fits `module`, changing nothing: parallelize_module validates every
  // entry of a plan before applying any, so a plan that does not fit leaves the model as it was.
  // Throws naming the module (`fqn`) and the style. Default: nothing to check.
  virtual void validate(const nn::Module& module, const std::string& fqn,
                        const DeviceMesh& mesh) const {}
  // Shards `module`'s parameters and installs its input/output hooks. `fqn` names the module in
  // errors. Throws when the style does not fit the module.
  virtual void apply(nn::Module& module, const std::string& fqn,
                     std::shared_ptr<const DeviceMesh> mesh) const = 0;
  virtual std::string name() const = 0;
  // Whether apply changes the module's parameters (shards or distributes them). A module takes
  // at most one such style per plan (a second would be validated against the parameters as they
  // were); styles that only install hooks (PrepareModuleInput/Output) combine with one.
  virtual bool changes_parameters() const { return true; }
};

struct LayoutOptions {
  std::optional<Placement> input_layouts;   // how plain inputs are laid out
  std::optional<Placement> output_layouts;  // what outputs are redistributed to
  bool use_local_output = true;
};

class ColwiseParallel : public ParallelStyle {
 public:
  explicit ColwiseParallel(LayoutOptions options = {}) : options_(options) {}
  void validate(const nn::Module& module, const std::string& fqn,
                const DeviceMesh& mesh) const override;
  void apply(nn::Module& module, const std::string& fqn,
             std::shared_ptr<const DeviceMesh> mesh) const override;
  std::string name() const override { return "ColwiseParallel"; }

 private:
  LayoutOptions options_;
};

class RowwiseParallel : public ParallelStyle {
 public:
  explicit RowwiseParallel(LayoutOptions options = {}) : options_(options) {}
  void validate(const nn::Module& module, const std::string& fqn,
                const DeviceMesh& mesh) const override;
  void apply(nn::Module& module, const std::string& fqn,
             std::shared_ptr<const DeviceMesh> mesh) const override;
  std::string name() const override { return "RowwiseParallel"; }

 private:
  LayoutOptions options_;
};

struct SequenceParallelOptions {
  int64_t sequence_dim = 1;
  bool use_local_output = false;
};

class SequenceParallel : public ParallelStyle {
 public:
  explicit SequenceParallel(SequenceParallelOptions options = {}) : options_(options) {}
  void validate(const nn::Module& module, const std::string& fqn,
                const DeviceMesh& mesh) const override;
  void apply(nn::Module& module, const std::string& fqn,
             std::shared_ptr<const DeviceMesh> mesh) const override;
  std::string name() const override { return "SequenceParallel"; }

 private:
  SequenceParallelOptions options_;
};

struct PrepareInputOptions {
  Placement input_layouts;          // how a plain input is laid out (a DTensor keeps its own)
  Placement desired_input_layouts;  // what the module receives
  bool use_local_output = false;    // hand the module a local tensor instead of a DTensor
  // Megatron's sequence parallelism: when the conversion gathers (Shard -> Replicate), the
  // gathered input's memory is freed once the module's forward has run and gathered again from
  // the kept shard when the gradient reaches the module's output, just before its backward. The
  // module's layers then keep 1/tp of their input between forward and backward, for one more
  // all-gather per call in backward. Not done inside a checkpoint's recompute (its backward
  // follows at once). The gathered input must not be kept outside the module.
  bool regather_in_backward = false;
};

class PrepareModuleInput : public ParallelStyle {
 public:
  explicit PrepareModuleInput(PrepareInputOptions options) : options_(options) {}
  void validate(const nn::Module& module, const std::string& fqn,
                const DeviceMesh& mesh) const override;
  void apply(nn::Module& module, const std::string& fqn,
             std::shared_ptr<const DeviceMesh> mesh) const override;
  std::string name() const override { return "PrepareModuleInput"; }
  bool changes_parameters() const override { return false; }

 private:
  PrepareInputOptions options_;
};

struct PrepareOutputOptions {
  Placement output_layouts;          // how a plain output is laid out (a DTensor keeps its own)
  Placement desired_output_layouts;  // what the caller receives
  bool use_local_output = true;
};

class PrepareModuleOutput : public ParallelStyle {
 public:
  explicit PrepareModuleOutput(PrepareOutputOptions options) : options_(options) {}
  void validate(const nn::Module& module, const std::string& fqn,
                const DeviceMesh& mesh) const override;
  void apply(nn::Module& module, const std::string& fqn,
             std::shared_ptr<const DeviceMesh> mesh) const override;
  std::string name() const override { return "PrepareModuleOutput"; }
  bool changes_parameters() const override { return false; }

 private:
  PrepareOutputOptions options_;
};

}  // namespace loom::tp
