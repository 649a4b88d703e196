// Matrix products, derived from einsum-style dim labels: a label shared by the operands and
// the output may be sharded on all of them (a batch/broadcast operand that lacks it stays
// Replicate); a contracted label sharded on both operands makes the output Partial(sum).
// matmul is bilinear, so one Partial operand with the other Replicate gives Partial.
#include <string>

#include "base/error.h"
#include "dtensor/sharding/strategy.h"
#include "tensor/shape.h"

namespace loom::sharding {

namespace {

using comm::ReduceOp;

// One letter per dim: operands and output, torch.matmul's broadcasting folded in.
struct Labels {
  std::string a, b, out;
  Shape out_shape;
};

Labels matmul_labels(const Shape& a, const Shape& b, std::string_view op) {
  LOOM_CHECK(!a.empty() && !b.empty(),
             "{}: both operands need at least 1 dim, got shapes {} and {}", op, shape_str(a),
             shape_str(b));
  Labels l;
  const bool a_vec = a.size() == 1, b_vec = b.size() == 1;
  // The global shapes must fit as the plain op's do: a shard's local shapes may fit when the
  // whole does not, and then only some ranks would fail (the others waiting for them).
  const int64_t a_k = a.back(), b_k = b_vec ? b[0] : b[b.size() - 2];
  LOOM_CHECK(a_k == b_k, "{}: shapes {} and {} cannot be multiplied ({} != {})", op, shape_str(a),
             shape_str(b), a_k, b_k);
  const size_t a_batch = a_vec ? 0 : a.size() - 2, b_batch = b_vec ? 0 : b.size() - 2;
  broadcast_shapes(Shape(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(a_batch)),
                   Shape(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(b_batch)), op);
  const size_t batch = std::max(a_batch, b_batch);
  // Batch labels 'A'.. aligned from the right; 'm', 'k', 'n' for the matrix dims.
  Shape batch_shape(batch, 1);
  for (size_t i = 0; i < batch; ++i) {
    const char label = static_cast<char>('A' + i);
    l.out += label;
    if (i + a_batch >= batch) {
      l.a += label;
      batch_shape[i] = std::max(batch_shape[i], a[i + a_batch - batch]);
    }
    if (i + b_batch >= batch) {
      l.b += label;
      batch_shape[i] = std::max(batch_shape[i], b[i + b_batch - batch]);
    }
  }
  l.out_shape = batch_shape;
  if (!a_vec) {
    l.a += 'm';
    l.out += 'm';
    l.out_shape.push_back(a[a.size() - 2]);
  }
  l.a += 'k';
  l.b += 'k';
  if (!b_vec) {
    l.b += 'n';
    l.out += 'n';
    l.out_shape.push_back(b.back());
  }
  return l;
}

}  // namespace

void register_matmul_strategies(StrategyTable& t) {
  t[OpId::matmul] = [](const OpCall& call, const InputSpecs& in) {
    const Shape& a = in[0]->shape;
    const Shape& b = in[1]->shape;
    const Labels l = matmul_labels(a, b, call.op);
    OpSharding s;
    s.output_shapes = {l.out_shape};
    s.options.push_back({{Replicate(), Replicate()}, {Replicate()}});
    std::string all = l.out + "k";
    for (char label : all) {
      DimOption option{{Replicate(), Replicate()}, {Replicate()}};
      bool any = false;
      const auto place = [&](const std::string& labels, const Shape& shape, Placement& slot) {
        const size_t pos = labels.find(label);
        if (pos == std::string::npos) return;
        // A broadcast batch dim (size 1 against a larger output) stays Replicate.
        const size_t out_pos = l.out.find(label);
        if (out_pos != std::string::npos && shape[pos] != l.out_shape[out_pos]) return;
        slot = Shard(static_cast<int64_t>(pos));
        any = true;
      };
      place(l.a, a, option.inputs[0]);
      place(l.b, b, option.inputs[1]);
      if (!any) continue;
      const size_t out_pos = l.out.find(label);
      if (out_pos == std::string::npos) {
        if (!option.inputs[0].is_shard() || !option.inputs[1].is_shard())
          continue;  // contraction needs both
        option.outputs[0] = Partial(ReduceOp::kSum);
      } else {
        option.outputs[0] = Shard(static_cast<int64_t>(out_pos));
      }
      s.options.push_back(std::move(option));
    }
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      s.options.push_back({{Partial(op), Replicate()}, {Partial(op)}});
      s.options.push_back({{Replicate(), Partial(op)}, {Partial(op)}});
    }
    return s;
  };
}

}  // namespace loom::sharding
