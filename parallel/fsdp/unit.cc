#include "parallel/fsdp/unit.h"

#include <algorithm>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "autograd/hooks.h"
#include "dtensor/dtensor.h"
#include "tensor/ops.h"

namespace loom::fsdp {

namespace {

// A parameter's chunk on every rank, in a buffer of every rank's segment (world x segment_numel,
// flat): a [world, c * row_numel] view.
Tensor chunks_of(const Tensor& buffer, const ParamSlot& slot, const FlatLayout& layout) {
  return ops::narrow(ops::view(buffer, {layout.world, layout.segment_numel}), 1, slot.offset,
                     slot.chunk_rows * slot.row_numel);
}

// A parameter's chunks in such a buffer, each beside the rows of the whole parameter it holds
// (`rows`: the parameter as slot.rows x slot.row_numel). The ranks holding full chunks form one
// [ranks, c, row_numel] view on each side, the rank holding the remainder one more: copying a
// parameter in or out of the buffer takes at most two copy ops, not one per rank (a 128-way unit
// made 128 per parameter per gather, and the copies' dispatch was most of a traced step's time).
struct ChunkRun {
  Tensor in_buffer;
  Tensor in_whole;
};

std::vector<ChunkRun> chunk_runs(const Tensor& buffer, const Tensor& rows, const ParamSlot& slot,
                                 const FlatLayout& layout) {
  std::vector<ChunkRun> runs;
  const Tensor chunks = chunks_of(buffer, slot, layout);
  const int64_t full = slot.full_chunks();
  if (full > 0) {
    runs.push_back(
        {ops::view(ops::narrow(chunks, 0, 0, full), {full, slot.chunk_rows, slot.row_numel}),
         ops::view(ops::narrow(rows, 0, 0, full * slot.chunk_rows),
                   {full, slot.chunk_rows, slot.row_numel})});
  }
  const auto remainder_rank = static_cast<int>(full);
  if (const int64_t rest = slot.rows_of(remainder_rank); rest > 0) {
    runs.push_back(
        {ops::view(ops::narrow(ops::narrow(chunks, 0, full, 1), 1, 0, rest * slot.row_numel),
                   {rest, slot.row_numel}),
         ops::narrow(rows, 0, slot.first_row(remainder_rank), rest)});
  }
  return runs;
}

// The parts of a parameter's chunks in that buffer that hold none of its rows: the remainder
// rank's rows past the end, and the chunks of the ranks after it (all of its chunks with
// `whole_slot`, for a parameter without a gradient). At most two views.
std::vector<Tensor> padding_of(const Tensor& buffer, const ParamSlot& slot,
                               const FlatLayout& layout, bool whole_slot) {
  const Tensor chunks = chunks_of(buffer, slot, layout);
  if (whole_slot) return {chunks};
  std::vector<Tensor> padding;
  const int64_t chunk = chunks.shape()[1];
  int64_t first_empty = slot.full_chunks();
  if (const int64_t rest = slot.rows_of(static_cast<int>(first_empty)); rest > 0) {
    padding.push_back(ops::narrow(ops::narrow(chunks, 0, first_empty, 1), 1, rest * slot.row_numel,
                                  chunk - rest * slot.row_numel));
    ++first_empty;
  }
  if (first_empty < layout.world) {
    padding.push_back(ops::narrow(chunks, 0, first_empty, layout.world - first_empty));
  }
  return padding;
}

}  // namespace

Unit::Unit(std::shared_ptr<const std::string> name, std::shared_ptr<const DeviceMesh> mesh,
           std::vector<HeldParam> params, FSDPOptions options)
    : name_(std::move(name)),
      mesh_(std::move(mesh)),
      params_(std::move(params)),
      options_(options) {
  std::vector<Shape> shapes;
  for (const HeldParam& p : params_) shapes.push_back(p.unit_shape);
  // The last mesh dim shards (dp_shard); a first one, on a 2-D mesh, replicates (HSDP).
  shard_dim_ = mesh_->ndim() - 1;
  layout_ = FlatLayout::make(shapes, static_cast<int>(mesh_->size(shard_dim_)));
  rank_ = static_cast<int>(mesh_->coordinate(shard_dim_));
  if (!params_.empty()) {
    const DType master = params_[0].sharded.dtype();
    dtype_ = options_.mp_policy.param_dtype.value_or(master);
    reduce_dtype_ = options_.mp_policy.reduce_dtype.value_or(dtype_);
    device_ = mesh_->device();
  }
}

Unit* Unit::neighbour(int step) const {
  if (!group_) return nullptr;
  const auto& order = group_->forward_order;
  const auto it = std::find(order.begin(), order.end(), this);
  if (it == order.end()) return nullptr;
  const auto index = (it - order.begin()) + step;
  return index >= 0 && index < static_cast<std::ptrdiff_t>(order.size()) ? order[index] : nullptr;
}

void Unit::before_forward() {
  if (group_) {
    if (group_->owner == this) {
      // A new pass: the last one's order is the prefetch order, and a gather issued ahead that
      // nobody took holds shards the optimizer may have changed since.
      if (!group_->recording.empty()) group_->forward_order = std::move(group_->recording);
      group_->recording.clear();
      for (const auto& member : group_->members) {
        if (auto unit = member.lock()) unit->drop_prefetch();
      }
    }
    group_->recording.push_back(this);
  }
  const bool recording = GradMode::is_enabled();
  NoGradGuard no_grad;  // the communication and copies are not part of any graph
  std::vector<Tensor> whole;
  if (!params_.empty()) whole = gather();
  // Forward prefetch: the next unit's gather runs while this one computes.
  if (Unit* next = options_.prefetch ? neighbour(+1) : nullptr) next->prefetch();
  if (params_.empty()) return;
  std::shared_ptr<Call> call;
  if (recording) {
    call = std::make_shared<Call>();
    call->grads.resize(params_.size());
    // Handles without autograd state onto the whole parameters' memory, to release and refill
    // it (the whole leaves themselves hold the hooks that hold the call: no cycle).
    for (const Tensor& w : whole) call->memory.push_back(ops::alias(w));
  }
  current_call_ = call;
  for (size_t i = 0; i < params_.size(); ++i) {
    // Under TP the whole parameter is the gathered TP shard, as a DTensor on the tp mesh.
    Tensor w =
        params_[i].tp_spec ? make_dtensor(whole[i], with_dtype(*params_[i].tp_spec)) : whole[i];
    if (call && params_[i].sharded.requires_grad()) {
      w.set_requires_grad(true);
      ++call->pending;
      autograd::register_post_accumulate_grad_hook(
          w, [unit = shared_from_this(), call, i](const Tensor& leaf) {
            unit->on_gradient(call, i, leaf);
          });
    }
    for (const auto& [owner, name] : params_[i].slots) owner->set_parameter(name, w);
  }
}

void Unit::after_forward(const Tensor& output) {
  for (const HeldParam& p : params_) {
    for (const auto& [owner, name] : p.slots) owner->set_parameter(name, p.sharded);
  }
  std::shared_ptr<Call> call = std::move(current_call_);
  if (!call || call->pending == 0 || !output.defined() || !output.requires_grad()) return;
  if (options_.reshard_after_forward) {
    for (const Tensor& m : call->memory) m.storage()->release();
    call->released = true;
    ++released_calls_;
  }
  // Just before the unit's backward: its parameters again, and the previous unit's gather.
  autograd::register_hook(output, [unit = shared_from_this(), call](const Tensor&) {
    unit->before_backward(*call);
    return Tensor();
  });
}

void Unit::before_backward(Call& call) {
  if (call.released) refill(call);
  // Backward prefetch, in reverse forward order: the unit whose backward comes next.
  if (Unit* previous = options_.prefetch ? neighbour(-1) : nullptr;
      previous && previous->released_calls_ > 0) {
    previous->prefetch();
  }
}

void Unit::refill(Call& call) {
  NoGradGuard no_grad;
  for (const Tensor& m : call.memory) m.storage()->refill();
  gather(&call.memory);  // straight into the memory the forward's tensors still refer to
  call.released = false;
  --released_calls_;
}

void Unit::prefetch() {
  if (prefetched_ || params_.empty()) return;
  NoGradGuard no_grad;
  prefetched_ = start_gather();
}

void Unit::drop_prefetch() {
  if (!prefetched_) return;
  prefetched_->work->wait();  // every rank issued it: complete it, then forget it
  prefetched_.reset();
}

std::vector<Tensor> Unit::gather(const std::vector<Tensor>* into) {
  if (prefetched_) {
    Gather ahead = std::move(*prefetched_);
    prefetched_.reset();
    return finish_gather(std::move(ahead), into);
  }
  return finish_gather(start_gather(), into);
}

Unit::Gather Unit::start_gather() const {
  Tensor send = ops::empty({layout_.segment_numel}, dtype_, device_);
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamSlot& slot = layout_.params[i];
    const int64_t rows = slot.rows_of(rank_);
    if (rows > 0) {
      ops::copy_(ops::narrow(send, 0, slot.offset, rows * slot.row_numel),
                 ops::reshape(local_shard(params_[i].sharded), {-1}));
    }
    // The padding rows (never read) are zeros, so the buffer's bytes are deterministic.
    if (rows < slot.chunk_rows) {
      ops::fill_(ops::narrow(send, 0, slot.offset + rows * slot.row_numel,
                             (slot.chunk_rows - rows) * slot.row_numel),
                 0.0);
    }
  }
  Tensor received = ops::empty({layout_.total_numel()}, dtype_, device_);
  auto work = mesh_->group(shard_dim_)->all_gather_into_tensor(received, send);
  return {std::move(work), std::move(received), std::move(send)};
}

std::vector<Tensor> Unit::finish_gather(Gather gather, const std::vector<Tensor>* into) const {
  gather.work->block_current_stream();
  std::vector<Tensor> whole;
  for (size_t i = 0; i < layout_.params.size(); ++i) {
    const ParamSlot& slot = layout_.params[i];
    // The TP-local shape under TP.
    Tensor w = into ? (*into)[i] : ops::empty(slot.shape, dtype_, device_);
    // A view: the copies land in `w` (`into`'s tensors are contiguous).
    const Tensor rows = ops::view(w, {slot.rows, slot.row_numel});
    for (const ChunkRun& run : chunk_runs(gather.received, rows, slot, layout_)) {
      ops::copy_(run.in_whole, run.in_buffer);
    }
    whole.push_back(w);
  }
  return whole;
}

DTensorSpec Unit::with_dtype(DTensorSpec spec) const {
  spec.dtype = dtype_;
  return spec;
}

Tensor Unit::plain_gradient(size_t i, const Tensor& grad) const {
  if (!params_[i].tp_spec || !grad.defined()) return grad;
  // Under TP: the local shard once laid out as the parameter (a gradient still Partial over tp
  // is reduced first).
  const Placements& want = params_[i].tp_spec->placements;
  const Tensor laid_out = dtensor_spec(grad).placements == want ? grad : redistribute(grad, want);
  return local_shard(laid_out);
}

void Unit::on_gradient(const std::shared_ptr<Call>& call, size_t i, const Tensor& leaf) {
  if (call->reduced) return;
  call->grads[i] = plain_gradient(i, leaf.grad());
  leaf.set_grad(Tensor());  // the whole gradient is only needed until it is reduced
  if (!call->queued) {
    // When backward ends: reduce with zeros for parameters the forward did not use (so that
    // every rank runs the same collective), and finish the reduce-scatters in flight.
    call->queued = true;
    autograd::queue_backward_callback([unit = shared_from_this(), call] {
      unit->reduce_gradients(*call);
      unit->finish_reductions();
    });
  }
  if (--call->pending == 0) reduce_gradients(*call);
}

void Unit::reduce_gradients(Call& call) {
  if (call.reduced) return;
  call.reduced = true;
  NoGradGuard no_grad;
  // Every gradient of the call is in: its whole parameters are no longer needed (FSDP2's reshard
  // after backward), freed now rather than when the backward's graph goes at its end, which kept
  // every unit's whole parameters at once.
  if (!call.released) {
    for (const Tensor& m : call.memory) m.storage()->release();
  }
  // Without gradient sync the whole gradients add up here, and the next synchronizing backward
  // reduces their sum with its own: one reduce-scatter per step whatever the microbatches.
  if (accumulated_.empty()) accumulated_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& sum = accumulated_[i];
    const Tensor& grad = call.grads[i];
    if (!grad.defined()) continue;
    sum = sum.defined() ? ops::add(sum, grad) : grad;
  }
  call.grads.clear();
  if (!sync_gradients_) return;
  const std::vector<Tensor> grads = std::move(accumulated_);
  accumulated_.clear();
  // Written once: each gradient's rows copied in, and only what they leave (the padding, or a
  // parameter without a gradient) zeroed, not the whole buffer zeroed first.
  Tensor send = ops::empty({layout_.total_numel()}, reduce_dtype_, device_);
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& grad = grads[i];
    const ParamSlot& slot = layout_.params[i];
    if (grad.defined()) {
      const Tensor rows = ops::reshape(grad, {slot.rows, slot.row_numel});
      for (const ChunkRun& run : chunk_runs(send, rows, slot, layout_)) {
        ops::copy_(run.in_buffer, run.in_whole);
      }
    }
    for (const Tensor& zeros : padding_of(send, slot, layout_, !grad.defined())) {
      ops::fill_(zeros, 0.0);
    }
  }
  Tensor received = ops::empty({layout_.segment_numel}, reduce_dtype_, device_);
  // One reduce-scatter in flight per group: the previous one (another unit's, issued while this
  // unit's backward ran) is finished first, freeing its whole-size send buffer.
  if (group_) {
    if (group_->reducing && group_->reducing != this) group_->reducing->finish_reductions();
    group_->reducing = this;
  }
  // Asynchronous: backward goes on; finish_reductions() completes it.
  auto work = mesh_->group(shard_dim_)->reduce_scatter_tensor(received, send, comm::ReduceOp::kAvg);
  reductions_.push_back({std::move(work), std::move(received), std::move(send)});
}

void Unit::finish_reductions() {
  NoGradGuard no_grad;
  for (Reduction& reduction : reductions_) {
    reduction.work->block_current_stream();
    Tensor& received = reduction.received;
    // HSDP: the replicas of each shard average their reduced shards.
    if (shard_dim_ > 0) {
      mesh_->group(0)->all_reduce(received, comm::ReduceOp::kAvg)->block_current_stream();
    }
    if (options_.gradient_scale != 1.0) ops::mul_(received, options_.gradient_scale);
    for (size_t i = 0; i < params_.size(); ++i) {
      Tensor& sharded = params_[i].sharded;
      if (!sharded.requires_grad()) continue;
      const ParamSlot& slot = layout_.params[i];
      const DTensorSpec& spec = dtensor_spec(sharded);
      // A view of the reduced shard (a fresh buffer per reduction): no copy.
      const Tensor local =
          ops::reshape(ops::narrow(received, 0, slot.offset, slot.rows_of(rank_) * slot.row_numel),
                       spec.local_shape());
      const Tensor grad = make_dtensor(local, spec);
      sharded.set_grad(sharded.grad().defined() ? ops::add(sharded.grad(), grad) : grad);
    }
  }
  reductions_.clear();
  if (group_ && group_->reducing == this) group_->reducing = nullptr;
}

}  // namespace loom::fsdp
