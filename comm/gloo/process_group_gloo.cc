#include "comm/gloo/process_group_gloo.h"

#include <fmt/format.h>

#include "base/error.h"
#include "comm/gloo/algorithms.h"
#include "comm/gloo/connect.h"
#include "comm/gloo/group_state.h"
#include "comm/gloo/host_staging.h"
#include "comm/gloo/op_runner.h"
#include "comm/gloo/shm_connect.h"

namespace loom::comm {

using gloo_detail::HostStaging;
using gloo_detail::OpEnv;
using gloo_detail::OpSpec;

struct ProcessGroupGloo::Token {};

std::shared_ptr<ProcessGroupGloo> ProcessGroupGloo::create(std::shared_ptr<Store> store, int rank,
                                                           int size, ProcessGroupOptions options,
                                                           GlooOptions gloo) {
  std::vector<int> global_ranks(size > 0 ? size : 0);
  for (int r = 0; r < size; ++r) global_ranks[r] = r;
  return create(std::move(store), rank, size, std::move(global_ranks), std::move(options),
                std::move(gloo));
}

std::shared_ptr<ProcessGroupGloo> ProcessGroupGloo::create(std::shared_ptr<Store> store, int rank,
                                                           int size, std::vector<int> global_ranks,
                                                           ProcessGroupOptions options,
                                                           GlooOptions gloo) {
  LOOM_CHECK(store != nullptr, "ProcessGroupGloo::create: group '{}': the store is null",
             options.name);
  LOOM_CHECK(size >= 1 && rank >= 0 && rank < size,
             "ProcessGroupGloo::create: group '{}': rank {} is not in [0, {})", options.name, rank,
             size);
  LOOM_CHECK(gloo.device.type == DeviceType::kCPU || gloo.device.is_cuda(),
             "ProcessGroupGloo::create: group '{}': GlooOptions::device is {}; a Gloo group's "
             "tensors live on the CPU or on a CUDA device (staged through host memory)",
             options.name, gloo.device.str());
  auto device = gloo_detail::open_device(gloo, options.name);
  return std::make_shared<ProcessGroupGloo>(Token{}, std::move(store), rank, size,
                                            std::move(global_ranks), std::move(options),
                                            std::move(gloo), std::move(device));
}

ProcessGroupGloo::ProcessGroupGloo(const Token&, std::shared_ptr<Store> store, int rank, int size,
                                   std::vector<int> global_ranks, ProcessGroupOptions options,
                                   GlooOptions gloo,
                                   std::shared_ptr<::gloo::transport::Device> device)
    : ProcessGroup(store, rank, size, global_ranks, options),
      gloo_options_(std::move(gloo)),
      device_(std::move(device)),
      sends_issued_(size),
      recvs_issued_(size) {
  const std::string what = fmt::format("ProcessGroupGloo: connecting group '{}' (rank {} of {})",
                                       options.name, rank, size);
  auto context = gloo_detail::connect_full_mesh(*store, rank, size, options.timeout, device_, what);
  auto shared_memory =
      gloo_detail::connect_shared_memory(*store, rank, size, options.timeout, gloo_options_, what);
  state_ = std::make_shared<gloo_detail::GroupState>(
      store, std::move(context), std::move(shared_memory), options.name, global_ranks);
  runner_ = std::make_unique<gloo_detail::OpRunner>(options.name);
}

ProcessGroupGloo::~ProcessGroupGloo() {
  // Queued ops still run (bounded by their deadlines; after a failure they fail at once). The
  // threads' jobs hold `state_`, which closes the connections when the last holder lets go.
  runner_->stop();
  state_->mark_destroyed();
}

void ProcessGroupGloo::abort(const std::string& reason) { state_->abort(reason); }

std::string ProcessGroupGloo::failure() const { return state_->failure().value_or(""); }

bool ProcessGroupGloo::uses_shared_memory() const { return state_->uses_shared_memory(); }

ProcessGroupGloo::Body ProcessGroupGloo::copying_back(HostStaging host, Body body) {
  return [host = std::move(host), body = std::move(body)](const OpEnv& env) {
    body(env);
    host.copy_back();
  };
}

std::shared_ptr<Work> ProcessGroupGloo::enqueue(const OpInfo& info, HostStaging host, Body body) {
  body = copying_back(std::move(host), std::move(body));
  auto work = std::make_shared<Work>();
  OpSpec op{info.description, info.kind, /*collective=*/true, collectives_issued_++, timeout(), -1};
  runner_->enqueue([state = state_, op = std::move(op), work, body = std::move(body)]() mutable {
    state->run(op, *work, std::move(body));
  });
  return work;
}

HostStaging ProcessGroupGloo::staging() const {
  return HostStaging(gloo_options_.device.is_cuda());
}

std::shared_ptr<Work> ProcessGroupGloo::post_p2p(const OpInfo& info, int peer, HostStaging host,
                                                 Body body) {
  body = copying_back(std::move(host), std::move(body));
  auto work = std::make_shared<Work>();
  OpSpec op{info.description, info.kind, /*collective=*/false, 0, timeout(), peer};
  runner_->run_concurrently(
      [state = state_, op = std::move(op), work, body = std::move(body)]() mutable {
        state->run(op, *work, std::move(body));
      });
  return work;
}

// Each op stages its tensors (a CUDA group's host copies, host_staging.h) and hands the staging
// to enqueue/post_p2p, which copy what the op wrote back once it has run.
std::shared_ptr<Work> ProcessGroupGloo::run_all_reduce(const OpInfo& info, const Tensor& tensor,
                                                       ReduceOp op) {
  HostStaging host = staging();
  const Tensor staged = host.in_place(tensor);
  return enqueue(info, std::move(host),
                 [staged, op](const OpEnv& env) { gloo_detail::all_reduce(env, staged, op); });
}

std::shared_ptr<Work> ProcessGroupGloo::run_broadcast(const OpInfo& info, const Tensor& tensor,
                                                      int root) {
  HostStaging host = staging();
  const Tensor staged = host.in_place(tensor);
  return enqueue(info, std::move(host),
                 [staged, root](const OpEnv& env) { gloo_detail::broadcast(env, staged, root); });
}

std::shared_ptr<Work> ProcessGroupGloo::run_all_gather(const OpInfo& info,
                                                       const std::vector<Tensor>& outputs,
                                                       const Tensor& input) {
  HostStaging host = staging();
  std::vector<Tensor> staged_outputs = host.outputs(outputs);
  const Tensor staged_input = host.input(input);
  return enqueue(info, std::move(host), [staged_outputs, staged_input](const OpEnv& env) {
    gloo_detail::all_gather(env, staged_outputs, staged_input);
  });
}

std::shared_ptr<Work> ProcessGroupGloo::run_reduce_scatter(const OpInfo& info, const Tensor& output,
                                                           const std::vector<Tensor>& inputs,
                                                           ReduceOp op) {
  HostStaging host = staging();
  const Tensor staged_output = host.output(output);
  std::vector<Tensor> staged_inputs = host.inputs(inputs);
  return enqueue(info, std::move(host), [staged_output, staged_inputs, op](const OpEnv& env) {
    gloo_detail::reduce_scatter(env, staged_output, staged_inputs, op);
  });
}

std::shared_ptr<Work> ProcessGroupGloo::run_all_to_all(const OpInfo& info,
                                                       const std::vector<Tensor>& outputs,
                                                       const std::vector<Tensor>& inputs) {
  HostStaging host = staging();
  std::vector<Tensor> staged_outputs = host.outputs(outputs);
  std::vector<Tensor> staged_inputs = host.inputs(inputs);
  return enqueue(info, std::move(host), [staged_outputs, staged_inputs](const OpEnv& env) {
    gloo_detail::all_to_all(env, staged_outputs, staged_inputs);
  });
}

std::shared_ptr<Work> ProcessGroupGloo::run_gather(const OpInfo& info,
                                                   const std::vector<Tensor>& outputs,
                                                   const Tensor& input, int root) {
  HostStaging host = staging();
  std::vector<Tensor> staged_outputs = host.outputs(outputs);
  const Tensor staged_input = host.input(input);
  return enqueue(info, std::move(host), [staged_outputs, staged_input, root](const OpEnv& env) {
    gloo_detail::gather(env, staged_outputs, staged_input, root);
  });
}

std::shared_ptr<Work> ProcessGroupGloo::run_scatter(const OpInfo& info, const Tensor& output,
                                                    const std::vector<Tensor>& inputs, int root) {
  HostStaging host = staging();
  const Tensor staged_output = host.output(output);
  std::vector<Tensor> staged_inputs = host.inputs(inputs);
  return enqueue(info, std::move(host), [staged_output, staged_inputs, root](const OpEnv& env) {
    gloo_detail::scatter(env, staged_output, staged_inputs, root);
  });
}

std::shared_ptr<Work> ProcessGroupGloo::run_barrier(const OpInfo& info) {
  return enqueue(info, staging(), [](const OpEnv& env) { gloo_detail::barrier(env); });
}

std::shared_ptr<Work> ProcessGroupGloo::run_send(const OpInfo& info, const Tensor& tensor, int dst,
                                                 int tag) {
  HostStaging host = staging();
  const Tensor staged = host.input(tensor);
  // Numbered once staged: a staging copy that throws leaves the peers' numbering as it was.
  const uint32_t message = sends_issued_[dst][tag]++;
  return post_p2p(info, dst, std::move(host), [staged, dst, tag, message](const OpEnv& env) {
    gloo_detail::send(env, staged, dst, tag, message);
  });
}

std::shared_ptr<Work> ProcessGroupGloo::run_recv(const OpInfo& info, const Tensor& tensor, int src,
                                                 int tag) {
  HostStaging host = staging();
  const Tensor staged = host.output(tensor);
  const uint32_t message = recvs_issued_[src][tag]++;
  return post_p2p(info, src, std::move(host), [staged, src, tag, message](const OpEnv& env) {
    gloo_detail::recv(env, staged, src, tag, message);
  });
}

std::shared_ptr<ProcessGroup> ProcessGroupGloo::make_group(std::shared_ptr<Store> store, int rank,
                                                           std::vector<int> group_ranks_global,
                                                           ProcessGroupOptions options) {
  const int size = static_cast<int>(group_ranks_global.size());
  return std::make_shared<ProcessGroupGloo>(Token{}, std::move(store), rank, size,
                                            std::move(group_ranks_global), std::move(options),
                                            gloo_options_, device_);
}

}  // namespace loom::comm
