#include "parallel/cp/ring_attention.h"

#include <limits>
#include <optional>
#include <vector>

#include "autograd/function.h"
#include "base/error.h"
#include "tensor/ops.h"

namespace loom::parallel::cp {

namespace {

// How query chunk `a` sees key chunk `b` (global chunk indices).
enum class Visibility { kNone, kDiagonal, kFull };

Visibility visibility(int64_t a, int64_t b, bool is_causal) {
  if (!is_causal || b < a) return Visibility::kFull;
  return b == a ? Visibility::kDiagonal : Visibility::kNone;
}

// Sends `out` to the next rank of the ring and receives `in` from the previous, started together
// (each rank sends while it receives, so no order deadlocks); wait() finishes both.
class Exchange {
 public:
  Exchange(comm::ProcessGroup& group, const std::vector<Tensor>& out, std::vector<Tensor>& in) {
    const int n = group.size(), r = group.rank();
    const int next = (r + 1) % n, previous = (r + n - 1) % n;
    for (size_t i = 0; i < out.size(); ++i) {
      works_.push_back(group.send(out[i], next, static_cast<int>(i)));
      works_.push_back(group.recv(in[i], previous, static_cast<int>(i)));
    }
  }
  void wait() {
    for (auto& work : works_) work->wait();
    works_.clear();
  }

 private:
  std::vector<std::shared_ptr<comm::Work>> works_;
};

std::vector<Tensor> empty_like_all(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> out;
  for (const Tensor& t : tensors) out.push_back(ops::empty(t.shape(), t.dtype(), t.device()));
  return out;
}

class RingAttention : public autograd::Function {
 public:
  RingAttention(bool is_causal, double scale, SequenceLayout layout,
                std::shared_ptr<comm::ProcessGroup> group)
      : is_causal_(is_causal), scale_(scale), layout_(layout), group_(std::move(group)) {}
  std::string name() const override { return "RingAttention"; }

  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    q_ = inputs[0];
    k_ = ops::contiguous(inputs[1]);
    v_ = ops::contiguous(inputs[2]);
    const int64_t len = layout_.chunk_len();
    const std::vector<int64_t> mine = layout_.chunks();
    // Per query chunk, FlashAttention's running state (f32): the largest block log-sum-exp so
    // far, and the output and the softmax's denominator both scaled by exp(-that), normalized
    // once at the end (one rounding per merge, not a division per merge).
    std::vector<Tensor> acc(mine.size()), den(mine.size()), top(mine.size());
    std::vector<Tensor> block = {k_, v_};
    const int n = group_->size();
    for (int step = 0; step < n; ++step) {
      std::vector<Tensor> next = empty_like_all(block);
      std::optional<Exchange> exchange;
      if (step + 1 < n) exchange.emplace(*group_, block, next);  // overlaps the compute below
      const int64_t source = (layout_.rank - step + n) % n;
      const std::vector<int64_t> theirs = layout_.chunks_of(source);
      for (size_t a = 0; a < mine.size(); ++a) {
        const Tensor qa = ops::narrow(q_, 2, static_cast<int64_t>(a) * len, len);
        for (size_t b = 0; b < theirs.size(); ++b) {
          const Visibility seen = visibility(mine[a], theirs[b], is_causal_);
          if (seen == Visibility::kNone) continue;
          const auto part = ops::scaled_dot_product_attention(
              qa, ops::narrow(block[0], 2, static_cast<int64_t>(b) * len, len),
              ops::narrow(block[1], 2, static_cast<int64_t>(b) * len, len),
              seen == Visibility::kDiagonal, scale_);
          merge(acc[a], den[a], top[a], ops::to(part.out, kFloat32), part.logsumexp);
        }
      }
      if (exchange) {
        exchange->wait();
        block = std::move(next);
      }
    }
    std::vector<Tensor> out, lse;
    for (size_t a = 0; a < mine.size(); ++a) {
      out.push_back(ops::div(acc[a], ops::unsqueeze(den[a], -1)));
      lse.push_back(ops::add(top[a], ops::log(den[a])));
    }
    out_ = ops::to(mine.size() == 1 ? out[0] : ops::cat(out, 2), q_.dtype());
    lse_ = mine.size() == 1 ? lse[0] : ops::cat(lse, 2);
    return {out_};
  }

  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor grad = ops::contiguous(ops::to(grads[0], q_.dtype()));
    const int64_t len = layout_.chunk_len();
    const std::vector<int64_t> mine = layout_.chunks();
    Tensor dq = ops::zeros(q_.shape(), kFloat32, q_.device());
    // The block held (K, V) and its gradient accumulators (f32), travelling together.
    std::vector<Tensor> block = {k_, v_, ops::zeros(k_.shape(), kFloat32, k_.device()),
                                 ops::zeros(v_.shape(), kFloat32, v_.device())};
    const int n = group_->size();
    for (int step = 0; step < n; ++step) {
      const int64_t source = (layout_.rank - step + n) % n;
      const std::vector<int64_t> theirs = layout_.chunks_of(source);
      for (size_t a = 0; a < mine.size(); ++a) {
        const auto rows = [&](const Tensor& t) {
          return ops::narrow(t, 2, static_cast<int64_t>(a) * len, len);
        };
        for (size_t b = 0; b < theirs.size(); ++b) {
          const Visibility seen = visibility(mine[a], theirs[b], is_causal_);
          if (seen == Visibility::kNone) continue;
          const auto cols = [&](const Tensor& t) {
            return ops::narrow(t, 2, static_cast<int64_t>(b) * len, len);
          };
          const auto g = ops::scaled_dot_product_attention_backward(
              rows(grad), rows(q_), cols(block[0]), cols(block[1]), rows(out_), rows(lse_),
              seen == Visibility::kDiagonal, scale_, /*causal_offset=*/0,
              /*delta_from_out=*/true);
          ops::add_(rows(dq), ops::to(g.dq, kFloat32));
          ops::add_(cols(block[2]), ops::to(g.dk, kFloat32));
          ops::add_(cols(block[3]), ops::to(g.dv, kFloat32));
        }
      }
      // Pass the block on with its accumulators; after the last step only the gradients travel,
      // one hop, back to the block's owner.
      const bool last = step + 1 == n;
      std::vector<Tensor> send = last ? std::vector<Tensor>{block[2], block[3]} : block;
      std::vector<Tensor> receive = empty_like_all(send);
      if (n > 1) Exchange(*group_, send, receive).wait();
      if (last) {
        block[2] = receive[0];
        block[3] = receive[1];
      } else {
        block = std::move(receive);
      }
    }
    return {ops::to(dq, q_.dtype()), ops::to(block[2], k_.dtype()), ops::to(block[3], v_.dtype())};
  }

 private:
  // Adds a block's normalized output `o` and log-sum-exp `l` to the running state: with m the
  // largest log-sum-exp, acc = sum_b exp(l_b - m) o_b and den = sum_b exp(l_b - m).
  static void merge(Tensor& acc, Tensor& den, Tensor& top, const Tensor& o, const Tensor& l) {
    if (!acc.defined()) {
      acc = o;
      den = ops::exp(ops::sub(l, l));  // ones (and the row's own shape)
      top = l;
      return;
    }
    const Tensor next = ops::maximum(top, l);
    const Tensor old_scale = ops::exp(ops::sub(top, next)), new_scale = ops::exp(ops::sub(l, next));
    acc = ops::add(ops::mul(acc, ops::unsqueeze(old_scale, -1)),
                   ops::mul(o, ops::unsqueeze(new_scale, -1)));
    den = ops::add(ops::mul(den, old_scale), new_scale);
    top = next;
  }

  bool is_causal_;
  double scale_;
  SequenceLayout layout_;
  std::shared_ptr<comm::ProcessGroup> group_;
  Tensor q_, k_, v_, out_, lse_;
};

}  // namespace

Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal,
                      double scale, const SequenceLayout& layout,
                      std::shared_ptr<comm::ProcessGroup> group) {
  LOOM_CHECK(group != nullptr && group->size() == layout.cp && group->rank() == layout.rank,
             "ring_attention: the group must be the cp group of the layout (cp {}, rank {})",
             layout.cp, layout.rank);
  return autograd::Function::apply(
      std::make_shared<RingAttention>(is_causal, scale, layout, std::move(group)), {q, k, v})[0];
}

}  // namespace loom::parallel::cp
