#include "parallel/tp/gradient_regions.h"

#include "autograd/function.h"
#include "base/error.h"
#include "tensor/ops.h"

namespace loom::tp {

namespace {

class CopyToTensorParallelRegion : public autograd::Function {
 public:
  explicit CopyToTensorParallelRegion(std::shared_ptr<const DeviceMesh> mesh)
      : mesh_(std::move(mesh)) {}
  std::string name() const override { return "CopyToTensorParallelRegion"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    return {ops::clone(inputs[0])};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    Tensor summed = ops::contiguous(ops::clone(grads[0]));
    mesh_->group(0)->all_reduce(summed, comm::ReduceOp::kSum)->wait();
    return {summed};
  }

 private:
  std::shared_ptr<const DeviceMesh> mesh_;
};

class ReduceFromTensorParallelRegion : public autograd::Function {
 public:
  explicit ReduceFromTensorParallelRegion(std::shared_ptr<const DeviceMesh> mesh)
      : mesh_(std::move(mesh)) {}
  std::string name() const override { return "ReduceFromTensorParallelRegion"; }
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    Tensor summed = ops::contiguous(ops::clone(inputs[0]));
    mesh_->group(0)->all_reduce(summed, comm::ReduceOp::kSum)->wait();
    return {summed};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override { return {grads[0]}; }

 private:
  std::shared_ptr<const DeviceMesh> mesh_;
};

void check_tp_mesh(const std::shared_ptr<const DeviceMesh>& mesh, const char* op) {
  LOOM_CHECK(mesh != nullptr && mesh->ndim() == 1, "{}: needs the 1-D tp mesh, got {}", op,
             mesh ? mesh->str() : "null");
}

}  // namespace

Tensor reduce_from_tensor_parallel_region(const Tensor& x,
                                          std::shared_ptr<const DeviceMesh> tp_mesh) {
  check_tp_mesh(tp_mesh, "reduce_from_tensor_parallel_region");
  return autograd::Function::apply(
      std::make_shared<ReduceFromTensorParallelRegion>(std::move(tp_mesh)), {x})[0];
}

Tensor copy_to_tensor_parallel_region(const Tensor& x, std::shared_ptr<const DeviceMesh> tp_mesh) {
  check_tp_mesh(tp_mesh, "copy_to_tensor_parallel_region");
  return autograd::Function::apply(std::make_shared<CopyToTensorParallelRegion>(std::move(tp_mesh)),
                                   {x})[0];
}

}  // namespace loom::tp
