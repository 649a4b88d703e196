// The collectives a same-host group runs over its shared-memory channel (private to comm/gloo):
// the ones data and tensor parallelism lean on. The others (all_to_all, gather, scatter,
// send/recv) stay on TCP. Same contracts as algorithms.h: every rank calls the same function
// with the same OpEnv::index, and the results are bit-identical to the TCP algorithms' (each
// element reduced by the same reduce_pieces, in rank order).
//
// Each round moves at most one slot per rank through the segment (shm_channel.h); a collective
// larger than that takes several rounds, each a copy in, a barrier and a copy out (all_reduce:
// copy in, barrier, each rank reduces its 1/W of the round, barrier, copy out).
#pragma once

#include <vector>

#include "comm/gloo/group_state.h"
#include "comm/gloo/shm_channel.h"
#include "tensor/tensor.h"

namespace loom::comm::gloo_detail {

void shm_all_reduce(ShmChannel& channel, const OpEnv& env, const Tensor& tensor, ReduceOp op);
void shm_broadcast(ShmChannel& channel, const OpEnv& env, const Tensor& tensor, int root);
void shm_all_gather(ShmChannel& channel, const OpEnv& env, const std::vector<Tensor>& outputs,
                    const Tensor& input);
void shm_reduce_scatter(ShmChannel& channel, const OpEnv& env, const Tensor& output,
                        const std::vector<Tensor>& inputs, ReduceOp op);
void shm_barrier(ShmChannel& channel, const OpEnv& env);

}  // namespace loom::comm::gloo_detail
