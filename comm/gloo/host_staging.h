// The host copies a CUDA Gloo group works on (private to comm/gloo), as torch's Gloo backend does
// for CUDA tensors: several ranks sharing one GPU cannot form an NCCL communicator, so a group
// made with GlooOptions::device = cuda:k stages every operation through host memory.
//
// When the op is issued (the caller's thread): each tensor the op reads is copied to the host,
// which synchronizes the device's compute stream (tensor/cuda/stream.h), so the copy holds what
// the caller's queued kernels wrote; each tensor it only writes gets fresh host memory. When the
// op has run (the group's thread, before its Work completes): copy_back() queues the host copies
// of the written tensors onto the device on the compute stream, so the caller's next kernels,
// queued after wait(), read the results. On a CPU group every call hands the tensor through.
// Because inputs are read when the op is issued, a tensor that a pending op writes must not be
// an input of a later op before the pending op's Work is waited for.
#pragma once

#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace loom::comm::gloo_detail {

class HostStaging {
 public:
  // `active`: the group's tensors are on a GPU.
  explicit HostStaging(bool active) : active_(active) {}

  // A tensor the op reads only (a send, a collective's input).
  Tensor input(const Tensor& t);
  // A tensor the op writes only (a receive, a gather's outputs).
  Tensor output(const Tensor& t);
  // A tensor the op reads and writes (all_reduce, broadcast).
  Tensor in_place(const Tensor& t);
  std::vector<Tensor> inputs(const std::vector<Tensor>& ts);
  std::vector<Tensor> outputs(const std::vector<Tensor>& ts);

  // Copies the written host tensors to their device tensors (nothing on a CPU group).
  void copy_back() const;

 private:
  bool active_;
  std::vector<std::pair<Tensor, Tensor>> written_;  // (device tensor, its host copy)
};

}  // namespace loom::comm::gloo_detail
