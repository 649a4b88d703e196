// The Gloo backend's algorithms, each a few rounds of Transfers (private to comm/gloo).
// Arguments are already validated by the ProcessGroup front end; tensors are contiguous CPU
// tensors. Every rank calls the same function with the same OpEnv::index.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/gloo/group_state.h"
#include "tensor/tensor.h"

namespace loom::comm::gloo_detail {

void all_reduce(const OpEnv& env, const Tensor& tensor, ReduceOp op);
void broadcast(const OpEnv& env, const Tensor& tensor, int root);
void all_gather(const OpEnv& env, const std::vector<Tensor>& outputs, const Tensor& input);
void reduce_scatter(const OpEnv& env, const Tensor& output, const std::vector<Tensor>& inputs,
                    ReduceOp op);
void all_to_all(const OpEnv& env, const std::vector<Tensor>& outputs,
                const std::vector<Tensor>& inputs);
void gather(const OpEnv& env, const std::vector<Tensor>& outputs, const Tensor& input, int root);
void scatter(const OpEnv& env, const Tensor& output, const std::vector<Tensor>& inputs, int root);
void barrier(const OpEnv& env);

// Point to point. `tag` and `message` (the n-th message on this (peer, tag) channel) pick the
// slots; a 16-byte header with dtype and element count goes first, and the receiver checks it
// against its tensor before accepting the payload.
void send(const OpEnv& env, const Tensor& tensor, int dst, int tag, uint32_t message);
void recv(const OpEnv& env, const Tensor& tensor, int src, int tag, uint32_t message);

}  // namespace loom::comm::gloo_detail
