// ColwiseParallel and RowwiseParallel on nn::Linear and nn::Embedding.
#include "base/error.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "parallel/tp/layouts.h"
#include "parallel/tp/style.h"

namespace loom::tp {

namespace {

using detail::distribute_parameter;
using detail::prepare_input;
using detail::prepare_output;

enum class Kind { kLinear, kEmbedding };

Kind kind_of(const nn::Module& module, const std::string& fqn, const std::string& style) {
  if (dynamic_cast<const nn::Linear*>(&module) != nullptr) return Kind::kLinear;
  if (dynamic_cast<const nn::Embedding*>(&module) != nullptr) return Kind::kEmbedding;
  LOOM_FAIL("parallelize_module: {} applies to Linear and Embedding modules, but '{}' is a {}",
            style, fqn, module.type_name());
}

// Installs the input and output conversions. A Linear's input keeps its global last dim
// (in_features) so uneven feature shards come out right; token ids have no such dim.
void install_hooks(nn::Module& module, const std::shared_ptr<const DeviceMesh>& mesh,
                   Placement input_layout, Placement desired_input, Placement output_layout,
                   bool use_local_output) {
  std::optional<int64_t> in_features;
  if (auto* linear = dynamic_cast<nn::Linear*>(&module)) in_features = linear->in_features();
  module.register_forward_pre_hook([=](nn::Module&, const Tensor& input) {
    return prepare_input(input, mesh, input_layout, desired_input, in_features);
  });
  module.register_forward_hook([=](nn::Module&, const Tensor&, const Tensor& output) {
    return prepare_output(output, mesh, output_layout, output_layout, use_local_output);
  });
}

}  // namespace

void ColwiseParallel::validate(const nn::Module& module, const std::string& fqn,
                               const DeviceMesh& mesh) const {
  check_one_dim(mesh, name());
  if (kind_of(module, fqn, name()) == Kind::kLinear) {
    check_parameter(module, fqn, "weight", mesh, Shard(0), name(), /*required=*/true);
    check_parameter(module, fqn, "bias", mesh, Shard(0), name(), /*required=*/false);
  } else {
    check_parameter(module, fqn, "weight", mesh, Shard(1), name(), /*required=*/true);
  }
}

void ColwiseParallel::apply(nn::Module& module, const std::string& fqn,
                            std::shared_ptr<const DeviceMesh> mesh) const {
  validate(module, fqn, *mesh);
  const Placement input_layout = options_.input_layouts.value_or(Replicate());
  if (kind_of(module, fqn, name()) == Kind::kLinear) {
    distribute_parameter(module, fqn, "weight", mesh, Shard(0));
    distribute_parameter(module, fqn, "bias", mesh, Shard(0));
  } else {
    // Each rank holds a slice of every embedding vector: its lookups give Shard(-1) outputs.
    distribute_parameter(module, fqn, "weight", mesh, Shard(1));
  }
  install_hooks(module, mesh, input_layout, Replicate(),
                options_.output_layouts.value_or(Shard(-1)), options_.use_local_output);
}

void RowwiseParallel::validate(const nn::Module& module, const std::string& fqn,
                               const DeviceMesh& mesh) const {
  check_one_dim(mesh, name());
  if (kind_of(module, fqn, name()) == Kind::kLinear) {
    check_parameter(module, fqn, "weight", mesh, Shard(1), name(), /*required=*/true);
    check_parameter(module, fqn, "bias", mesh, Replicate(), name(), /*required=*/false);
  } else {
    check_parameter(module, fqn, "weight", mesh, Shard(0), name(), /*required=*/true);
  }
}

void RowwiseParallel::apply(nn::Module& module, const std::string& fqn,
                            std::shared_ptr<const DeviceMesh> mesh) const {
  validate(module, fqn, *mesh);
  if (kind_of(module, fqn, name()) == Kind::kLinear) {
    distribute_parameter(module, fqn, "weight", mesh, Shard(1));
    distribute_parameter(module, fqn, "bias", mesh, Replicate());
    install_hooks(module, mesh, options_.input_layouts.value_or(Shard(-1)), Shard(-1),
                  options_.output_layouts.value_or(Replicate()), options_.use_local_output);
  } else {
    // Vocab-parallel: each rank holds a range of rows (uneven when the vocabulary does not divide);
    // ids outside it look up zeros, and the Partial sum of all ranks is the embedding.
    distribute_parameter(module, fqn, "weight", mesh, Shard(0));
    const Placement ids = options_.input_layouts.value_or(Replicate());
    install_hooks(module, mesh, ids, Replicate(), options_.output_layouts.value_or(Replicate()),
                  options_.use_local_output);
  }
}

}  // namespace loom::tp
