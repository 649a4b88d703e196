#include "models/tied_embedding_pipeline.h"

#include "autograd/grad_mode.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "tensor/ops.h"

namespace loom::models {

namespace {

Tensor local_of(const Tensor& t) { return is_dtensor(t) ? local_shard(t) : t; }

}  // namespace

void sum_tied_embedding_gradients(pipeline::PipelineModel& model, const TiedCopyOf& copy_of) {
  const pipeline::Schedule& schedule = model.schedule();
  if (schedule.num_stages == 1) return;  // one module holds the embedding and the head
  NoGradGuard no_grad;
  std::vector<Tensor> copies;  // this rank's copies' gradients (local shards), first stage's first
  for (const auto& stage : model.stages()) {
    if (const nn::Embedding* embedding = copy_of(*stage).embedding) {
      copies.push_back(local_of(embedding->weight().grad()));
    }
  }
  for (const Tensor& grad : copies) {
    LOOM_CHECK(grad.defined(), "pipeline: the tied embedding has no gradient after the step");
  }
  if (copies.empty()) return;
  if (copies.size() == 2) {  // both ends of the pipeline on this rank (one pp rank, interleaved)
    ops::add_(copies[0], copies[1]);
    ops::copy_(copies[1], copies[0]);
    return;
  }
  // first + last on the first stage's rank, last + first on the last's: float addition of two
  // operands commutes, so both copies get the same bits.
  const DeviceMesh& pp_mesh = *model.meshes().pp;
  const bool holds_first = model.local_ranges().front().first;
  const int peer_coordinate = schedule.rank_of_stage(holds_first ? schedule.num_stages - 1 : 0);
  const int peer = pp_mesh.group_ranks_by_coordinate(0)[peer_coordinate];
  const auto& group = pp_mesh.group(0);
  const Tensor mine = ops::contiguous(ops::clone(copies[0]));
  Tensor theirs = ops::empty(mine.shape(), mine.dtype(), mine.device());
  // The first stage's rank sends first and the last's receives first: never two sends facing
  // each other, which would deadlock a transport whose sends wait for the receiver (NCCL).
  std::shared_ptr<comm::Work> sent;
  if (holds_first) sent = group->send(mine, peer);
  group->recv(theirs, peer)->wait();
  if (!holds_first) sent = group->send(mine, peer);
  sent->wait();
  ops::add_(copies[0], theirs);
}

std::vector<Tensor> tied_copies_not_counted(const pipeline::PipelineModel& model,
                                            const TiedCopyOf& copy_of) {
  std::vector<Tensor> out;
  for (const auto& stage : model.stages()) {
    const TiedCopy copy = copy_of(*stage);
    if (copy.embedding && copy.range.last && !copy.range.first) {
      out.push_back(copy.embedding->weight());
    }
  }
  return out;
}

}  // namespace loom::models
