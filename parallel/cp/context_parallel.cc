#include "parallel/cp/context_parallel.h"

#include <fmt/format.h>

#include "autograd/function.h"
#include "autograd/functions.h"
#include "autograd/functions_nn.h"
#include "base/error.h"

namespace loom::parallel::cp {

namespace {

// All-gather of this rank's tokens (dim 2 of (B, H, T_local, D)) over the cp group, in rank
// order; backward: the gradient reduce-scattered back (every rank's queries used every key).
class AllGatherSequence : public autograd::Function {
 public:
  explicit AllGatherSequence(std::shared_ptr<comm::ProcessGroup> group)
      : group_(std::move(group)) {}
  std::string name() const override { return "ContextParallelAllGather"; }

  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    // The sequence dim first, so the gathered ranks' pieces are contiguous slabs.
    const Tensor local = ops::contiguous(ops::transpose(inputs[0], 0, 2));  // (T_l, H, B, D)
    Shape shape = local.shape();
    shape[0] *= group_->size();
    Tensor gathered = ops::empty(shape, local.dtype(), local.device());
    group_->all_gather_into_tensor(gathered, local)->wait();
    return {ops::transpose(gathered, 0, 2)};  // (B, H, T, D)
  }

  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor whole = ops::contiguous(ops::transpose(grads[0], 0, 2));  // (T, H, B, D)
    Shape shape = whole.shape();
    shape[0] /= group_->size();
    Tensor mine = ops::empty(shape, whole.dtype(), whole.device());
    group_->reduce_scatter_tensor(mine, whole, comm::ReduceOp::kSum)->wait();
    return {ops::transpose(mine, 0, 2)};
  }

 private:
  std::shared_ptr<comm::ProcessGroup> group_;
};

}  // namespace

void ContextParallelOptions::validate() const {
  LOOM_CHECK(attention == "allgather",
             "--cp-attention: '{}' is not a context-parallel attention; expected allgather",
             attention);
}

ContextParallel::ContextParallel(std::shared_ptr<const DeviceMesh> mesh,
                                 ContextParallelOptions options)
    : mesh_(std::move(mesh)), options_(std::move(options)) {
  LOOM_CHECK(mesh_ != nullptr && mesh_->ndim() == 1,
             "ContextParallel: expected the 1-D cp mesh (ParallelMeshes::cp)");
  options_.validate();
}

SequenceLayout ContextParallel::layout(int64_t seq_len) const {
  return {.cp = mesh_->size(0),
          .rank = mesh_->coordinate(0),
          .seq_len = seq_len,
          .load_balance = options_.load_balance};
}

std::vector<int64_t> ContextParallel::positions(int64_t local_len) const {
  return layout(local_len * mesh_->size(0)).positions();
}

Tensor ContextParallel::attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal,
                                  double scale) {
  SequenceContextGuard plain(nullptr);  // the local attention below, not this again
  LOOM_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
             "context-parallel attention: expected q, k, v of shape (B, H, T_local, D), got {}, "
             "{}, {} dims",
             q.dim(), k.dim(), v.dim());
  const SequenceLayout seq = layout(q.size(2) * mesh_->size(0));
  const auto gather = [&](const Tensor& x) {
    return autograd::Function::apply(std::make_shared<AllGatherSequence>(mesh_->group(0)), {x})[0];
  };
  Tensor keys = gather(k), values = gather(v);  // (B, H, T, D), rank order
  const int64_t len = seq.chunk_len();
  if (seq.chunks_per_rank() > 1) {
    // Rank order [r0's chunks, r1's chunks, ...] into global order.
    std::vector<Tensor> k_chunks(static_cast<size_t>(2 * seq.cp)),
        v_chunks(static_cast<size_t>(2 * seq.cp));
    for (int64_t r = 0; r < seq.cp; ++r) {
      const std::vector<int64_t> held = seq.chunks_of(r);
      for (size_t slot = 0; slot < held.size(); ++slot) {
        const int64_t at = (r * seq.chunks_per_rank() + static_cast<int64_t>(slot)) * len;
        k_chunks[static_cast<size_t>(held[slot])] = narrow(keys, 2, at, len);
        v_chunks[static_cast<size_t>(held[slot])] = narrow(values, 2, at, len);
      }
    }
    keys = cat(k_chunks, 2);
    values = cat(v_chunks, 2);
  }
  // Each of this rank's query chunks against the keys up to its end, the causal mask shifted to
  // its first position.
  std::vector<Tensor> outputs;
  const std::vector<int64_t> chunks = seq.chunks();
  for (size_t j = 0; j < chunks.size(); ++j) {
    const Tensor queries = narrow(q, 2, static_cast<int64_t>(j) * len, len);
    if (!is_causal) {
      outputs.push_back(scaled_dot_product_attention(queries, keys, values, false, scale));
      continue;
    }
    const int64_t first = chunks[j] * len, end = first + len;
    outputs.push_back(scaled_dot_product_attention(queries, narrow(keys, 2, 0, end),
                                                   narrow(values, 2, 0, end), true, scale,
                                                   /*causal_offset=*/first));
  }
  return outputs.size() == 1 ? outputs.front() : cat(outputs, 2);
}

}  // namespace loom::parallel::cp
