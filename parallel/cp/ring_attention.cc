#include "parallel/cp/ring_attention.h"

#include <chrono>
#include <limits>
#include <optional>
#include <vector>

#include "autograd/function.h"
#include "base/error.h"
#include "parallel/cp/dropout_placement.h"
#include "tensor/ops.h"

namespace loom::parallel::cp {

namespace {

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

constexpr int kBlockTag = 0;     // K, V: tags 0 and 1
constexpr int kGradientTag = 2;  // dK, dV: tags 2 and 3

// How query chunk `a` sees key chunk `b` (global chunk indices).
enum class Visibility { kNone, kDiagonal, kFull };

Visibility visibility(int64_t a, int64_t b, bool is_causal) {
  if (!is_causal || b < a) return Visibility::kFull;
  return b == a ? Visibility::kDiagonal : Visibility::kNone;
}

// Which way a ring exchange goes: forward sends to the next rank and receives from the previous;
// backward the other way round.
enum class Direction { kForward, kBackward };

// Sends `out` to the neighbour on one side and receives `in` from the other, started together
// (each rank sends while it receives, so no order deadlocks); wait() finishes both. Tags from
// `first_tag`: K/V and gradient exchanges in flight at once between the same pair stay apart.
class Exchange {
 public:
  Exchange(comm::ProcessGroup& group, Direction direction, const std::vector<Tensor>& out,
           std::vector<Tensor>& in, int first_tag, RingAttentionProfile* profile)
      : profile_(profile) {
    const int n = group.size(), r = group.rank();
    const int next = (r + 1) % n, previous = (r + n - 1) % n;
    const int to = direction == Direction::kForward ? next : previous;
    const int from = direction == Direction::kForward ? previous : next;
    for (size_t i = 0; i < out.size(); ++i) {
      works_.push_back(group.send(out[i], to, first_tag + static_cast<int>(i)));
      works_.push_back(group.recv(in[i], from, first_tag + static_cast<int>(i)));
      if (profile_ != nullptr)
        profile_->sent_bytes += out[i].numel() * element_size(out[i].dtype());
    }
  }
  // The time spent here is communication the compute did not hide.
  void wait() {
    const auto start = std::chrono::steady_clock::now();
    for (auto& work : works_) work->wait();
    works_.clear();
    if (profile_ != nullptr) profile_->wait_ms += ms_since(start);
  }

 private:
  std::vector<std::shared_ptr<comm::Work>> works_;
  RingAttentionProfile* profile_;
};

std::vector<Tensor> empty_like_all(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> out;
  for (const Tensor& t : tensors) out.push_back(ops::empty(t.shape(), t.dtype(), t.device()));
  return out;
}

class RingAttention : public autograd::Function {
 public:
  RingAttention(bool is_causal, double scale, SequenceLayout layout,
                std::shared_ptr<comm::ProcessGroup> group, RingAttentionProfile* profile,
                bool enable_gqa, DropoutPlacement dropout)
      : is_causal_(is_causal),
        enable_gqa_(enable_gqa),
        dropout_(std::move(dropout)),
        scale_(scale),
        layout_(layout),
        group_(std::move(group)),
        profile_(profile) {}
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
      if (step + 1 < n) {  // overlaps the compute below
        exchange.emplace(*group_, Direction::kForward, block, next, kBlockTag, profile_);
      }
      const auto compute_start = std::chrono::steady_clock::now();
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
              seen == Visibility::kDiagonal, scale_, 0,
              dropout_.at(0, mine[a] * len, theirs[b] * len), enable_gqa_);
          merge(acc[a], den[a], top[a], ops::to(part.out, kFloat32), part.logsumexp);
        }
      }
      if (profile_ != nullptr) profile_->compute_ms += ms_since(compute_start);
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
    last_block_ = std::move(block);  // the next rank's K and V (this rank's own when cp is 1)
    return {out_};
  }

  // The ring turned around, so that no exchange is left with nothing to hide behind. Step s:
  // this rank holds the block of rank (rank + 1 + s) — the first the one forward ended with
  // (kept), the last its own — and adds its queries' part of that block's dK and dV to the
  // accumulators the next rank passed back (its part of the same block, one step earlier), then
  // passes them to the previous rank. The next block's K and V travel while a step computes, the
  // accumulators while the next step computes; the last step is the owner's, whose accumulators
  // are then complete at home.
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const Tensor grad = ops::contiguous(ops::to(grads[0], q_.dtype()));
    const int64_t len = layout_.chunk_len();
    const std::vector<int64_t> mine = layout_.chunks();
    Tensor dq = ops::zeros(q_.shape(), kFloat32, q_.device());
    std::vector<Tensor> block = std::move(last_block_);
    std::vector<Tensor> passed;   // the accumulators (f32) of the block held, once received
    std::vector<Tensor> sending;  // those in flight to the previous rank, alive until they arrive
    std::optional<Exchange> gradients;
    const int n = group_->size();
    for (int step = 0; step < n; ++step) {
      // The block after the next-to-last is this rank's own, here already.
      std::vector<Tensor> next_block;
      std::optional<Exchange> exchange;
      if (step + 2 < n) {
        next_block = empty_like_all(block);
        exchange.emplace(*group_, Direction::kBackward, block, next_block, kBlockTag, profile_);
      }
      const auto compute_start = std::chrono::steady_clock::now();
      const int64_t source = (layout_.rank + 1 + step) % n;
      const std::vector<int64_t> theirs = layout_.chunks_of(source);
      std::vector<Tensor> part = {ops::zeros(k_.shape(), kFloat32, k_.device()),
                                  ops::zeros(v_.shape(), kFloat32, v_.device())};
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
              /*delta_from_out=*/true, dropout_.at(0, mine[a] * len, theirs[b] * len), enable_gqa_);
          ops::add_(rows(dq), ops::to(g.dq, kFloat32));
          ops::add_(cols(part[0]), ops::to(g.dk, kFloat32));
          ops::add_(cols(part[1]), ops::to(g.dv, kFloat32));
        }
      }
      if (profile_ != nullptr) profile_->compute_ms += ms_since(compute_start);
      if (gradients) {  // the next ranks' parts of this block, sent during this step
        gradients->wait();
        ops::add_(part[0], passed[0]);
        ops::add_(part[1], passed[1]);
      }
      if (step + 1 == n) {  // this rank's own block: complete
        return {ops::to(dq, q_.dtype()), ops::to(part[0], k_.dtype()),
                ops::to(part[1], v_.dtype())};
      }
      sending = std::move(part);
      passed = empty_like_all(sending);
      gradients.emplace(*group_, Direction::kBackward, sending, passed, kGradientTag, profile_);
      if (exchange) {
        exchange->wait();
        block = std::move(next_block);
      }
      if (step + 2 == n) block = {k_, v_};
    }
    LOOM_CHECK(false, "ring_attention: backward ran {} steps without reaching its own block", n);
    return {};
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
  bool enable_gqa_;
  DropoutPlacement dropout_;  // each block's piece of the mask
  double scale_;
  SequenceLayout layout_;
  std::shared_ptr<comm::ProcessGroup> group_;
  RingAttentionProfile* profile_;
  Tensor q_, k_, v_, out_, lse_;
  std::vector<Tensor> last_block_;  // K and V of the block forward ended with, backward's first
};

}  // namespace

Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal,
                      double scale, const SequenceLayout& layout,
                      std::shared_ptr<comm::ProcessGroup> group, RingAttentionProfile* profile,
                      bool enable_gqa, const AttentionDropout& dropout) {
  LOOM_CHECK(group != nullptr && group->size() == layout.cp && group->rank() == layout.rank,
             "ring_attention: the group must be the cp group of the layout (cp {}, rank {})",
             layout.cp, layout.rank);
  return autograd::Function::apply(
      std::make_shared<RingAttention>(is_causal, scale, layout, std::move(group), profile,
                                      enable_gqa, DropoutPlacement(dropout, q, layout.seq_len)),
      {q, k, v})[0];
}

}  // namespace loom::parallel::cp
