#include "parallel/ddp/reducer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <exception>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/hooks.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "tensor/ops.h"

namespace loom::ddp {

namespace {

// The tensor a parameter's gradient data lives in on this rank: the local shard for DTensors.
const Tensor& local_of(const Tensor& t) { return is_dtensor(t) ? local_shard(t) : t; }

}  // namespace

Reducer::Reducer(std::vector<std::pair<std::string, Tensor>> named_parameters,
                 std::shared_ptr<comm::ProcessGroup> group, ReducerOptions options)
    : group_(std::move(group)), options_(options), alive_(std::make_shared<bool>(true)) {
  LOOM_CHECK(group_ != nullptr, "DistributedDataParallel: the process group is null");
  int64_t total = 0;
  std::vector<ParameterInfo> infos;
  for (auto& [name, param] : named_parameters) {
    LOOM_CHECK(param.defined() && param.requires_grad() && param.is_leaf(),
               "DistributedDataParallel: parameter '{}' must be a leaf that requires grad", name);
    const Tensor& local = local_of(param);
    LOOM_CHECK(local.device() == group_->device(),
               "DistributedDataParallel: parameter '{}' is on {} but group '{}' ({}) works on {}; "
               "move the model "
               "there first (Module::to)",
               name, local.device().str(), group_->name(), group_->backend_name(),
               group_->device().str());
    infos.push_back({local.numel(), local.dtype()});
    total += local.numel();
    slots_.push_back({name, param, 0, Tensor()});
  }
  // Every rank must hold the same parameters: compare counts and sizes across the group.
  {
    NoGradGuard no_grad;
    Tensor mine =
        ops::from_vector_i64({static_cast<int64_t>(slots_.size()), total}, {2}, group_->device());
    std::vector<Tensor> all;
    for (int r = 0; r < group_->size(); ++r)
      all.push_back(ops::zeros({2}, kInt64, group_->device()));
    group_->all_gather(all, mine)->wait();
    for (int r = 0; r < group_->size(); ++r) {
      const auto theirs = ops::to_vector(all[r]);
      LOOM_CHECK(static_cast<int64_t>(theirs[0]) == static_cast<int64_t>(slots_.size()) &&
                     static_cast<int64_t>(theirs[1]) == total,
                 "DistributedDataParallel on group '{}': rank {} has {} parameters ({} elements) "
                 "but rank {} has {} "
                 "({} elements); every rank must build the same model",
                 group_->name(), group_->rank(), slots_.size(), total, r,
                 static_cast<int64_t>(theirs[0]), static_cast<int64_t>(theirs[1]));
    }
  }
  const auto assignment = assign_buckets(infos, options_.caps);
  bucket_of_slot_.assign(slots_.size(), 0);
  for (size_t b = 0; b < assignment.size(); ++b) {
    Bucket bucket;
    int64_t size = 0;
    for (size_t i : assignment[b]) {
      slots_[i].offset = size;
      size += infos[i].numel;
      bucket_of_slot_[i] = b;
    }
    bucket.buffer = ops::zeros({size}, infos[assignment[b].front()].dtype, group_->device());
    bucket.slots = assignment[b];
    for (size_t i : assignment[b]) {
      const Tensor& local = local_of(slots_[i].param);
      slots_[i].view =
          Tensor::from_storage(bucket.buffer.storage(), local.shape(),
                               contiguous_strides(local.shape()), slots_[i].offset, local.dtype());
    }
    buckets_.push_back(std::move(bucket));
  }
  ready_.assign(slots_.size(), false);
  reset_iteration();
  for (size_t i = 0; i < slots_.size(); ++i) {
    autograd::autograd_meta(slots_[i].param).accumulate_in_place = true;
    bind_grad(i);
    std::weak_ptr<bool> alive = alive_;
    autograd::register_post_accumulate_grad_hook(slots_[i].param, [this, alive, i](const Tensor&) {
      if (auto guard = alive.lock(); guard && *guard) mark_ready(i);
    });
  }
}

Reducer::~Reducer() {
  *alive_ = false;
  for (auto& bucket : buckets_) {
    if (bucket.work) {
      try {
        bucket.work->wait();
      } catch (...) {
        // Destruction must not throw; the error was (or will be) reported by finalize().
      }
    }
  }
}

void Reducer::bind_grad(size_t i) {
  Slot& slot = slots_[i];
  if (is_dtensor(slot.param)) {
    slot.param.set_grad(make_dtensor(slot.view, dtensor_spec(slot.param)));
  } else {
    slot.param.set_grad(slot.view);
  }
}

void Reducer::reset_iteration() {
  std::fill(ready_.begin(), ready_.end(), false);
  for (auto& bucket : buckets_) {
    bucket.pending = bucket.slots.size();
    if (bucket.work) {
      // Normally ordered already (finalize); on an error path, what comes next (zero_grad, the
      // next backward) must still follow the in-place all-reduce rather than race it.
      try {
        bucket.work->block_current_stream();
      } catch (...) {
        // Its error was or will be reported; the group is unusable either way.
      }
    }
    bucket.work = nullptr;
  }
  next_bucket_ = 0;
  in_backward_ = false;
}

void Reducer::mark_ready(size_t i) {
  Slot& slot = slots_[i];
  // A gradient that is not our view (e.g. after the optimizer set .grad to none): move it into
  // the bucket once, then keep accumulating there in place.
  const Tensor grad = slot.param.grad();
  if (!grad.defined() || local_of(grad).storage() != slot.view.storage() ||
      local_of(grad).offset() != slot.view.offset()) {
    NoGradGuard no_grad;
    ops::copy_(slot.view, local_of(grad));
    bind_grad(i);
  }
  if (!sync_enabled_) return;
  LOOM_CHECK(!ready_[i],
             "DistributedDataParallel: parameter '{}' received its gradient twice in one "
             "synchronized backward; "
             "accumulate gradients under no_sync() instead",
             slot.name);
  if (!in_backward_) {
    in_backward_ = true;
    launched_during_backward_ = 0;
    autograd::queue_backward_callback([this, alive = std::weak_ptr<bool>(alive_)] {
      if (auto guard = alive.lock(); guard && *guard) finalize();
    });
  }
  ready_[i] = true;
  Bucket& bucket = buckets_[bucket_of_slot_[i]];
  --bucket.pending;
  // Launch in bucket order, so every rank issues the same all-reduce sequence even if its
  // buckets complete in a different order.
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    launch(next_bucket_++);
    ++launched_during_backward_;
  }
}

void Reducer::launch(size_t b) {
  buckets_[b].work = group_->all_reduce(buckets_[b].buffer, comm::ReduceOp::kAvg);
}

void Reducer::finalize() {
  if (!sync_enabled_ || !in_backward_) return;
  std::vector<std::string> unused;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!ready_[i]) unused.push_back(slots_[i].name);
  }
  if (!unused.empty() && !options_.find_unused_parameters) {
    reset_iteration();
    LOOM_FAIL(
        "DistributedDataParallel: parameters [{}] received no gradient in this backward; every "
        "parameter must "
        "take part in the loss, or construct with find_unused_parameters = true",
        fmt::join(unused, ", "));
  }
  // An unused parameter contributes zeros (or a gradient set outside backward), never the stale
  // bucket contents left under a .grad the optimizer reset; and .grad views the averaged result.
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (ready_[i]) continue;
    const Tensor grad = slots_[i].param.grad();
    if (!grad.defined() || local_of(grad).storage() != slots_[i].view.storage() ||
        local_of(grad).offset() != slots_[i].view.offset()) {
      NoGradGuard no_grad;
      if (grad.defined()) {
        ops::copy_(slots_[i].view, local_of(grad));
      } else {
        ops::fill_(slots_[i].view, 0.0);
      }
      bind_grad(i);
    }
  }
  while (next_bucket_ < buckets_.size()) launch(next_bucket_++);  // buckets with unused parameters
  // On GPU ranks the compute stream waits for each all-reduce (the host goes on to queue the
  // optimizer step); on CPU ranks this blocks until they finished. Every bucket is ordered and
  // the iteration reset even when one failed; the first error is rethrown after.
  std::exception_ptr first_error;
  for (auto& bucket : buckets_) {
    try {
      bucket.work->block_current_stream();
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  reset_iteration();
  if (first_error) std::rethrow_exception(first_error);
}

void Reducer::zero_grad() {
  // A backward that threw never reached finalize(): order its launched buckets before zeroing.
  if (in_backward_) reset_iteration();
  NoGradGuard no_grad;
  for (auto& bucket : buckets_) ops::fill_(bucket.buffer, 0.0);
  for (size_t i = 0; i < slots_.size(); ++i) bind_grad(i);
}

std::vector<std::vector<std::string>> Reducer::bucket_names() const {
  std::vector<std::vector<std::string>> names;
  for (const auto& bucket : buckets_) {
    names.emplace_back();
    for (size_t i : bucket.slots) names.back().push_back(slots_[i].name);
  }
  return names;
}

}  // namespace loom::ddp
