#include "parallel/cp/context_parallel.h"

#include <fmt/format.h>

#include "autograd/function.h"
#include "autograd/functions.h"
#include "autograd/functions_nn.h"
#include "base/error.h"
#include "parallel/cp/dropout_placement.h"
#include "parallel/cp/ring_attention.h"

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

// All-to-all over the cp group: `split_dim` cut into cp pieces, piece j to rank j, the pieces
// received from every rank concatenated along `cat_dim` in rank order; backward: the inverse
// exchange (Ulysses' sequence <-> heads reshard).
class AllToAll : public autograd::Function {
 public:
  AllToAll(std::shared_ptr<comm::ProcessGroup> group, int64_t split_dim, int64_t cat_dim)
      : group_(std::move(group)), split_dim_(split_dim), cat_dim_(cat_dim) {}
  std::string name() const override { return "ContextParallelAllToAll"; }

  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    return {exchange(inputs[0], split_dim_, cat_dim_)};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    return {exchange(grads[0], cat_dim_, split_dim_)};
  }

 private:
  Tensor exchange(const Tensor& x, int64_t split_dim, int64_t cat_dim) const {
    const int64_t n = group_->size();
    LOOM_CHECK(x.size(split_dim) % n == 0,
               "context-parallel all-to-all: dim {} of size {} does not split over cp {}",
               split_dim, x.size(split_dim), n);
    const int64_t piece = x.size(split_dim) / n;
    std::vector<Tensor> send, receive;
    for (int64_t j = 0; j < n; ++j) {
      send.push_back(ops::contiguous(ops::narrow(x, split_dim, j * piece, piece)));
      receive.push_back(ops::empty(send.back().shape(), x.dtype(), x.device()));
    }
    group_->all_to_all(receive, send)->wait();
    return ops::cat(receive, cat_dim);
  }

  std::shared_ptr<comm::ProcessGroup> group_;
  int64_t split_dim_, cat_dim_;
};

// Rank order (rank 0's chunks, rank 1's, ...) along dim 2 into global chunk order, or back.
Tensor reorder(const Tensor& x, const SequenceLayout& seq, bool to_global) {
  if (seq.chunks_per_rank() == 1) return x;
  const int64_t len = seq.chunk_len();
  std::vector<Tensor> pieces(static_cast<size_t>(2 * seq.cp));
  for (int64_t r = 0; r < seq.cp; ++r) {
    const std::vector<int64_t> held = seq.chunks_of(r);
    for (size_t slot = 0; slot < held.size(); ++slot) {
      const int64_t rank_at = r * seq.chunks_per_rank() + static_cast<int64_t>(slot);
      const int64_t from = to_global ? rank_at : held[slot];
      const int64_t to = to_global ? held[slot] : rank_at;
      pieces[static_cast<size_t>(to)] = narrow(x, 2, from * len, len);
    }
  }
  return cat(pieces, 2);
}

}  // namespace

void ContextParallelOptions::validate() const {
  LOOM_CHECK(attention == "allgather" || attention == "alltoall" || attention == "ring",
             "--cp-attention: '{}' is not a context-parallel attention; expected allgather, "
             "alltoall or ring",
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

int64_t ContextParallel::sequence_length(int64_t local_len) const {
  return local_len * mesh_->size(0);
}

Tensor ContextParallel::attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal,
                                  double scale, bool enable_gqa, const AttentionDropout& dropout) {
  SequenceContextGuard plain(nullptr);  // the local attention below, not this again
  LOOM_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
             "context-parallel attention: expected q, k, v of shape (B, H, T_local, D), got {}, "
             "{}, {} dims",
             q.dim(), k.dim(), v.dim());
  const SequenceLayout seq = layout(q.size(2) * mesh_->size(0));
  if (options_.attention == "alltoall") {
    return ulysses(q, k, v, is_causal, scale, enable_gqa, dropout, seq);
  }
  if (options_.attention == "ring") {
    return ring_attention(q, k, v, is_causal, scale, seq, mesh_->group(0), nullptr, enable_gqa,
                          dropout);
  }
  const DropoutPlacement placed(dropout, q, seq.seq_len);
  const auto gather = [&](const Tensor& x) {
    return autograd::Function::apply(std::make_shared<AllGatherSequence>(mesh_->group(0)), {x})[0];
  };
  Tensor keys = gather(k), values = gather(v);  // (B, H, T, D), rank order
  const int64_t len = seq.chunk_len();
  // Rank order [r0's chunks, r1's chunks, ...] into global order.
  keys = reorder(keys, seq, /*to_global=*/true);
  values = reorder(values, seq, /*to_global=*/true);
  // Each of this rank's query chunks against the keys up to its end, the causal mask shifted to
  // its first position.
  std::vector<Tensor> outputs;
  const std::vector<int64_t> chunks = seq.chunks();
  for (size_t j = 0; j < chunks.size(); ++j) {
    const Tensor queries = narrow(q, 2, static_cast<int64_t>(j) * len, len);
    if (!is_causal) {
      outputs.push_back(scaled_dot_product_attention(queries, keys, values, false, scale, 0,
                                                     placed.at(0, chunks[j] * len, 0), enable_gqa));
      continue;
    }
    const int64_t first = chunks[j] * len, end = first + len;
    outputs.push_back(scaled_dot_product_attention(
        queries, narrow(keys, 2, 0, end), narrow(values, 2, 0, end), true, scale,
        /*causal_offset=*/first, placed.at(0, first, 0), enable_gqa));
  }
  return outputs.size() == 1 ? outputs.front() : cat(outputs, 2);
}

int64_t ulysses_kv_repeat(int64_t q_heads, int64_t kv_heads, int64_t cp) {
  // Grouped key/value heads that do not split over cp are repeated r times (the fewest that
  // split, r dividing the group), each query head then using the copy of its own: (r Hkv) heads
  // of group g / r.
  int64_t r = 1;
  if (kv_heads > 0 && kv_heads % cp != 0 && q_heads % kv_heads == 0) {
    const int64_t group = q_heads / kv_heads;
    while (r < group && (group % r != 0 || kv_heads * r % cp != 0)) ++r;
  }
  LOOM_CHECK(
      q_heads % cp == 0 && kv_heads * r % cp == 0,
      "--cp-attention alltoall: this rank's {} query heads and {} key/value heads (after "
      "tp{}) must both split over cp {}; use allgather, or a cp that divides the heads",
      q_heads, kv_heads,
      r > 1 ? fmt::format("; {} when repeated for grouped-query attention", kv_heads * r) : "", cp);
  return r;
}

Tensor ContextParallel::ulysses(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal,
                                double scale, bool enable_gqa, const AttentionDropout& dropout,
                                const SequenceLayout& seq) {
  const int64_t cp = seq.cp;
  Tensor keys = k, values = v;  // grouped heads repeated where they do not split over cp
  const int64_t r = ulysses_kv_repeat(q.size(1), k.size(1), cp);
  LOOM_INTERNAL_ASSERT(r == 1 || enable_gqa,
                       "ulysses: {} key/value heads for {} query heads "
                       "without grouped-query attention",
                       k.size(1), q.size(1));
  if (r > 1) {
    keys = ops::repeat_interleave(k, r, 1);
    values = ops::repeat_interleave(v, r, 1);
  }
  const auto& group = mesh_->group(0);
  // Sequence-sharded, all heads -> all of the sequence, heads / cp (in global order).
  const auto to_heads = [&](const Tensor& x) {
    const Tensor whole = autograd::Function::apply(
        std::make_shared<AllToAll>(group, /*split=*/1, /*cat=*/2), {x})[0];
    return reorder(whole, seq, /*to_global=*/true);
  };
  // Rank r gets query heads [r Hq / cp, ...) of this rank's, over the whole sequence, and
  // key/value heads [r H'kv / cp, ...) of the (repeated) H'kv: the same groups, so grouped-query
  // attention stays grouped. Its dropout is placed at its first query head.
  const AttentionDropout mine =
      DropoutPlacement(dropout, q, seq.seq_len).at(seq.rank * (q.size(1) / cp), 0, 0);
  const Tensor y = scaled_dot_product_attention(to_heads(q), to_heads(keys), to_heads(values),
                                                is_causal, scale, 0, mine, enable_gqa);
  // Back: this rank's tokens, all heads.
  return autograd::Function::apply(std::make_shared<AllToAll>(group, /*split=*/2, /*cat=*/1),
                                   {reorder(y, seq, /*to_global=*/false)})[0];
}

}  // namespace loom::parallel::cp
