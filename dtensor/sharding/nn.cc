// Strategies for the nn kernels (tensor/ops_nn.h): softmax and layer norm keep shards on the
// dims they do not normalize; rope shards every dim but the rotated one; attention shards batch
// and head dims; the embedding table may be sharded by vocabulary (masked lookup -> Partial(sum))
// or by embedding dim; cross entropy on vocabulary-sharded logits is loss parallel: the
// single-device kernels on each shard (ops::ClassShard) and three small all-reduces per call,
// never the full logits.
// Dropout draws each shard's slice of the global mask, so it runs sharded.
#include "base/error.h"
#include "comm/process_group.h"
#include "dtensor/sharding/strategy.h"
#include "tensor/attention_attrs.h"
#include "tensor/ops.h"

namespace loom::sharding {

namespace {

using comm::ReduceOp;

// Options sharding leading dims [0, count) of all `inputs` flagged in `sharded` together,
// outputs sharded the same way (or as `output_for` says), plus all-Replicate.
OpSharding leading_dims(size_t num_inputs, const std::vector<bool>& sharded, int64_t count,
                        std::vector<Shape> outputs,
                        const std::vector<Placement>& output_when_sharded_override = {}) {
  OpSharding s;
  s.output_shapes = std::move(outputs);
  const size_t num_outputs = s.output_shapes.size();
  s.options.push_back({Placements(num_inputs, Replicate()), Placements(num_outputs, Replicate())});
  for (int64_t d = 0; d < count; ++d) {
    DimOption option{Placements(num_inputs, Replicate()), Placements(num_outputs, Shard(d))};
    for (size_t i = 0; i < num_inputs; ++i) {
      if (sharded[i]) option.inputs[i] = Shard(d);
    }
    for (size_t j = 0; j < output_when_sharded_override.size(); ++j) {
      if (!output_when_sharded_override[j].is_replicate())
        option.outputs[j] = output_when_sharded_override[j];
    }
    s.options.push_back(std::move(option));
  }
  return s;
}

// The dropout of an attention call on shards: the call's own (from attr `own` on), placed by the
// spec of its q (input `q_input`): the call's mask is (batch..., Tq, Tk) of q's and k's global
// shapes (at the call's region, if it has one), and this shard's probabilities start at q's local
// offset on the batch dims (the strategies never shard the sequence dims).
AttentionDropout attention_dropout_on_shard(const OpCall& local, size_t own,
                                            const InputSpecs& specs, size_t q_input) {
  AttentionDropout dropout = ops::attention_dropout_of(local, own);
  if (dropout.p == 0.0) return dropout;
  const DTensorSpec& q = *specs[q_input];
  const DTensorSpec& k = *specs[q_input + 1];
  Shape whole(q.shape.begin(), q.shape.end() - 1);
  whole.push_back(k.shape[k.shape.size() - 2]);
  Shape offset = q.local_offset();
  offset.back() = 0;  // the key dim: every shard holds all keys (offset[-2] is 0 too)
  // The call's own region says where the whole call's probabilities sit (a data-parallel rank's
  // rows of the global batch); this shard's place in them is added.
  dropout.region = region_within(dropout.region, whole, offset);
  return dropout;
}

// Grouped-query attention on shards (k's and v's heads fewer than q's) keeps each rank's query
// heads with their key/value heads only where both split alike: on every mesh coordinate the
// local query heads must be the local key/value heads times the group. Checked over the whole
// mesh from the specs, so every rank reaches the same answer and a bad split is named on all of
// them (torch.chunk's uneven shards would otherwise regroup heads silently).
void check_groups_split_alike(const OpCall& local, const InputSpecs& specs, size_t q_input) {
  const DTensorSpec& q = *specs[q_input];
  const DTensorSpec& k = *specs[q_input + 1];
  if (q.shape.size() < 3) return;
  const size_t head = q.shape.size() - 3;
  if (q.shape[head] == k.shape[head] || k.shape[head] == 0) return;
  const int64_t group = q.shape[head] / k.shape[head];
  const DeviceMesh& mesh = *q.mesh;
  std::vector<int64_t> coordinate(static_cast<size_t>(mesh.ndim()), 0);
  while (true) {
    const int64_t hq = q.local_size_at(head, coordinate), hkv = k.local_size_at(head, coordinate);
    LOOM_CHECK(hq == hkv * group,
               "{}: grouped-query attention's {} query heads over {} key/value heads (group {}) "
               "split as {} over {} on mesh coordinate {} ({} and {}): shard the heads over a "
               "mesh whose size divides the key/value heads, or replicate them",
               local.op, q.shape[head], k.shape[head], group, hq, hkv,
               shape_str(Shape(coordinate.begin(), coordinate.end())), q.str(), k.str());
    size_t d = coordinate.size();
    while (d > 0 && ++coordinate[d - 1] == mesh.size(static_cast<int64_t>(d - 1))) {
      coordinate[--d] = 0;
    }
    if (d == 0) return;
  }
}

// The mesh dim (if any) on which `spec` shards `tensor_dim`; throws when several do.
int64_t mesh_dim_sharding(const DTensorSpec& spec, int64_t tensor_dim, std::string_view op) {
  int64_t found = -1;
  for (size_t md = 0; md < spec.placements.size(); ++md) {
    if (!spec.placements[md].is_shard(tensor_dim)) continue;
    LOOM_CHECK(found < 0, "{}: dim {} sharded by two mesh dims ({}) is not supported here", op,
               tensor_dim, placements_str(spec.placements));
    found = static_cast<int64_t>(md);
  }
  return found;
}

// 1 where the target is not ignore_index, else 0 (f32, on the targets' device).
Tensor valid_rows(const Tensor& targets, int64_t ignore_index) {
  return ops::to(
      ops::gt(ops::abs(ops::sub(ops::to(targets, kFloat32), static_cast<double>(ignore_index))),
              ops::full({}, 0.5)),
      kFloat32);
}

struct LossParallelRows {
  Tensor losses;     // (N,) f32: 0 on ignored rows
  Tensor logsumexp;  // (N,) f32: the whole rows', the backward's
};

// Per-row loss and logsumexp for logits sharded by vocabulary on `group` (Megatron's
// vocab-parallel cross entropy): each shard's kernel pass (ops::cross_entropy with its ClassShard:
// the shard's logsumexp and its part of the target term, targets checked against every class)
// and three all-reduces of N floats — the max of the shards' logsumexps, the sum of their
// exponentials, the sum of the parts. No (N, V) temporary.
LossParallelRows loss_parallel_rows(const Tensor& logits_local, const Tensor& targets,
                                    const ops::ClassShard& shard, int64_t ignore_index,
                                    comm::ProcessGroup& group) {
  const ops::CrossEntropyResult part =
      ops::cross_entropy(logits_local, targets, ignore_index, Reduction::kNone, shard);
  Tensor row_max = ops::clone(part.logsumexp);
  group.all_reduce(row_max, ReduceOp::kMax)->wait();
  Tensor sum_exp = ops::contiguous(ops::exp(ops::sub(part.logsumexp, row_max)));
  group.all_reduce(sum_exp, ReduceOp::kSum)->wait();
  const Tensor lse = ops::add(ops::log(sum_exp), row_max);
  Tensor target_term = ops::clone(part.loss);  // -logits[n, target] on its shard, 0 elsewhere
  group.all_reduce(target_term, ReduceOp::kSum)->wait();
  return {ops::mul(ops::add(lse, target_term), valid_rows(targets, ignore_index)), lse};
}

StrategyFn cross_entropy_strategy() {
  return [](const OpCall& call, const InputSpecs& in) {
    const DTensorSpec& logits = *in[0];
    const auto reduction = static_cast<Reduction>(call.int_attr(1));
    const int64_t n = logits.shape.at(0);
    OpSharding s;
    s.output_shapes = {reduction == Reduction::kNone ? Shape{n} : Shape{}, Shape{n}};
    s.options.push_back({{Replicate(), Replicate()}, {Replicate(), Replicate()}});
    s.options.push_back({{Shard(1), Replicate()}, {Replicate(), Replicate()}});  // loss parallel
    if (reduction == Reduction::kNone)
      s.options.push_back({{Shard(0), Shard(0)}, {Shard(0), Shard(0)}});
    if (reduction == Reduction::kSum)
      s.options.push_back({{Shard(0), Shard(0)}, {Partial(), Shard(0)}});
    s.local = [](const OpCall& local, const InputSpecs& specs) {
      const DTensorSpec& spec = *specs[0];
      const int64_t vocab_md = mesh_dim_sharding(spec, 1, "cross_entropy");
      if (vocab_md < 0) return call_op(local);
      const int64_t ignore_index = local.int_attr(0);
      const auto reduction = static_cast<Reduction>(local.int_attr(1));
      const Tensor& targets = local.inputs[1];
      auto [rows, lse] = loss_parallel_rows(
          local.inputs[0], targets, {.offset = spec.local_offset()[1], .classes = spec.shape[1]},
          ignore_index, *spec.mesh->group(vocab_md));
      Tensor loss = rows;
      if (reduction == Reduction::kSum) loss = ops::sum(rows);
      // The mean over the rows not ignored, counted on the device (0 / 0 = NaN when all are).
      if (reduction == Reduction::kMean)
        loss = ops::div(ops::sum(rows), ops::sum(valid_rows(targets, ignore_index)));
      return std::vector<Tensor>{loss, lse};  // f32, as ops::cross_entropy's
    };
    return s;
  };
}

StrategyFn cross_entropy_backward_strategy() {
  // Inputs: (grad_loss, logits, targets, logsumexp).
  return [](const OpCall& call, const InputSpecs& in) {
    const DTensorSpec& logits = *in[1];
    const auto reduction = static_cast<Reduction>(call.int_attr(1));
    OpSharding s;
    s.output_shapes = {logits.shape};
    s.options.push_back({Placements(4, Replicate()), {Replicate()}});
    s.options.push_back({{Replicate(), Shard(1), Replicate(), Replicate()}, {Shard(1)}});
    if (reduction != Reduction::kMean) {
      const Placement grad = reduction == Reduction::kNone ? Shard(0) : Replicate();
      s.options.push_back({{grad, Shard(0), Shard(0), Shard(0)}, {Shard(0)}});
    }
    s.local = [](const OpCall& local, const InputSpecs& specs) {
      const DTensorSpec& spec = *specs[1];
      const int64_t vocab_md = mesh_dim_sharding(spec, 1, "cross_entropy_backward");
      if (vocab_md < 0) return call_op(local);
      const int64_t ignore_index = local.int_attr(0);
      const auto reduction = static_cast<Reduction>(local.int_attr(1));
      LOOM_CHECK(local.inputs[3].defined(),
                 "cross_entropy_backward: loss parallel needs the forward's logsumexp");
      // The single-device kernel on the shard: softmax from the rows' logsumexp, the one-hot
      // where this shard holds the target (one pass, the logits' dtype).
      return std::vector<Tensor>{ops::cross_entropy_backward(
          local.inputs[0], local.inputs[1], local.inputs[2], ignore_index, reduction,
          local.inputs[3], {.offset = spec.local_offset()[1], .classes = spec.shape[1]},
          /*over_logits=*/local.attrs.size() > 4 && local.bool_attr(4))};
    };
    return s;
  };
}

// Indices into a vocabulary shard of `rows` rows starting at `offset`: `safe` is each index less
// the offset, or 0 where it falls outside; masked(t) zeroes t's last-dim vectors at those.
struct VocabularySlice {
  Tensor inside;  // f32: 1 inside the shard, 0 outside
  Tensor safe;    // i64, in [0, rows)

  VocabularySlice(const Tensor& indices, int64_t offset, int64_t rows) {
    const Tensor shifted = ops::sub(ops::to(indices, kFloat32), static_cast<double>(offset));
    inside = ops::mul(ops::gt(shifted, ops::full({}, -0.5)),
                      ops::gt(ops::full({}, static_cast<double>(rows) - 0.5), shifted));
    safe = ops::to(ops::mul(shifted, inside), kInt64);
  }
  Tensor masked(const Tensor& t) const {
    return ops::mul(t, ops::to(ops::unsqueeze(inside, -1), t.dtype()));
  }
};

StrategyFn embedding_strategy() {
  // Inputs: (weight (V, C), indices).
  return [](const OpCall&, const InputSpecs& in) {
    const DTensorSpec& weight = *in[0];
    const DTensorSpec& indices = *in[1];
    const int64_t index_dims = static_cast<int64_t>(indices.shape.size());
    Shape out = indices.shape;
    out.push_back(weight.shape.at(1));
    OpSharding s;
    s.output_shapes = {out};
    s.options.push_back({{Replicate(), Replicate()}, {Replicate()}});
    for (int64_t d = 0; d < index_dims; ++d)
      s.options.push_back({{Replicate(), Shard(d)}, {Shard(d)}});
    s.options.push_back({{Shard(1), Replicate()}, {Shard(index_dims)}});
    s.options.push_back({{Shard(0), Replicate()}, {Partial()}});  // vocabulary parallel
    s.local = [](const OpCall& local, const InputSpecs& specs) {
      const DTensorSpec& spec = *specs[0];
      if (mesh_dim_sharding(spec, 0, "embedding") < 0) return call_op(local);
      // Masked lookup: rows outside this rank's vocabulary slice contribute zeros.
      const VocabularySlice slice(local.inputs[1], spec.local_offset()[0], local.inputs[0].size(0));
      return std::vector<Tensor>{slice.masked(ops::embedding(local.inputs[0], slice.safe))};
    };
    return s;
  };
}

StrategyFn embedding_backward_strategy() {
  // Inputs (grad_out (..., C), indices, weight (V, C): its layout only); output (V, C). Rows
  // split across ranks sum up. The weight is a template, never moved: the gradient takes its
  // layout where it can, so a vocabulary-sharded table's gradient is computed for its own rows
  // on each rank (Megatron's VocabParallelEmbedding) rather than whole and sliced.
  return [](const OpCall& call, const InputSpecs& in) {
    const Shape& grad = in[0]->shape;
    const int64_t index_dims = static_cast<int64_t>(in[1]->shape.size());
    const bool has_weight = in.size() > 2 && in[2].has_value();
    OpSharding s;
    s.output_shapes = {{call.int_attr(0), grad.back()}};
    auto add = [&](Placement g, Placement indices, Placement weight, Placement out) {
      s.options.push_back(has_weight ? DimOption{{g, indices, weight}, {out}}
                                     : DimOption{{g, indices}, {out}});
    };
    // A Partial weight (a table computed as a sum of parts, which the forward looks up
    // whole: its output Partial) takes the gradient of its whole value, as a Replicate one.
    const std::vector<Placement> whole_weights = {
        Replicate(), Partial(comm::ReduceOp::kSum), Partial(comm::ReduceOp::kAvg),
        Partial(comm::ReduceOp::kMax), Partial(comm::ReduceOp::kMin)};
    for (const Placement& w : has_weight ? whole_weights : std::vector<Placement>{Replicate()}) {
      add(Replicate(), Replicate(), w, Replicate());
      for (int64_t d = 0; d < index_dims; ++d) add(Shard(d), Shard(d), w, Partial());
      add(Shard(index_dims), Replicate(), w, Shard(1));
      add(Partial(), Replicate(), w, Partial());
    }
    add(Shard(index_dims), Replicate(), Shard(1), Shard(1));
    if (!has_weight) return s;
    add(Replicate(), Replicate(), Shard(0), Shard(0));  // vocabulary parallel
    s.fixed_inputs = {2};
    s.local = [](const OpCall& local, const InputSpecs& specs) {
      const DTensorSpec& weight = *specs[2];
      if (mesh_dim_sharding(weight, 0, "embedding_backward") < 0) return call_op(local);
      // This rank's rows: indices outside its slice add (zeros) to row 0.
      const int64_t rows = local.inputs[2].size(0);
      const VocabularySlice slice(local.inputs[1], weight.local_offset()[0], rows);
      return std::vector<Tensor>{
          ops::embedding_backward(slice.masked(local.inputs[0]), slice.safe, rows)};
    };
    return s;
  };
}

}  // namespace

void register_nn_strategies(StrategyTable& t) {
  t[OpId::softmax] = [](const OpCall& call, const InputSpecs& in) {
    const int64_t ndim = static_cast<int64_t>(in[0]->shape.size());
    const int64_t dim = normalize_dim(call.int_attr(0), ndim, call.op);
    OpSharding s = leading_dims(1, {true}, ndim, {in[0]->shape});
    s.options.erase(s.options.begin() + 1 + dim);  // the normalized dim cannot stay sharded
    return s;
  };
  t[OpId::log_softmax] = t[OpId::softmax];
  const auto softmax_backward = [](const OpCall& call, const InputSpecs& in) {
    const int64_t ndim = static_cast<int64_t>(in[0]->shape.size());
    const int64_t dim = normalize_dim(call.int_attr(0), ndim, call.op);
    OpSharding s = leading_dims(2, {true, true}, ndim, {in[0]->shape});
    s.options.erase(s.options.begin() + 1 + dim);
    return s;
  };
  t[OpId::softmax_backward] = softmax_backward;
  t[OpId::log_softmax_backward] = softmax_backward;
  t[OpId::layer_norm] = [](const OpCall& call, const InputSpecs& in) {
    const Shape& x = in[0]->shape;
    const int64_t lead = static_cast<int64_t>(x.size() - call.ints_attr(0).size());
    const Shape stats(x.begin(), x.begin() + lead);
    return leading_dims(3, {true, false, false}, lead, {x, stats, stats});
  };
  t[OpId::layer_norm_backward] = [](const OpCall& call, const InputSpecs& in) {
    // Inputs: (grad_out, x, mean, rstd, weight); outputs: (grad_x, grad_weight, grad_bias).
    const Shape& x = in[1]->shape;
    const Shape normalized = call.ints_attr(0);
    const int64_t lead = static_cast<int64_t>(x.size() - normalized.size());
    return leading_dims(5, {true, true, true, true, false}, lead, {x, normalized, normalized},
                        {Replicate(), Partial(), Partial()});
  };
  // RMS norm over the last dim: rows shard freely, the normalized dim never.
  t[OpId::rms_norm] = [](const OpCall&, const InputSpecs& in) {
    const Shape& x = in[0]->shape;
    const int64_t lead = static_cast<int64_t>(x.size()) - 1;
    return leading_dims(2, {true, false}, lead, {x, Shape(x.begin(), x.end() - 1)});
  };
  t[OpId::rms_norm_backward] = [](const OpCall&, const InputSpecs& in) {
    // Inputs: (grad_out, x, rstd, weight); outputs: (grad_x, grad_weight).
    const Shape& x = in[1]->shape;
    const int64_t lead = static_cast<int64_t>(x.size()) - 1;
    return leading_dims(4, {true, true, true, false}, lead, {x, Shape{x.back()}},
                        {Replicate(), Partial()});
  };
  // Rotary embedding of x (..., T, heads, head_dim) by tables (T, head_dim / 2): batch and head
  // dims shard freely (tables replicated), the sequence dim shards with the tables' rows, the
  // rotated pairs never split. It is linear in x, so a Partial(sum|avg) x stays Partial.
  t[OpId::rope] = [](const OpCall&, const InputSpecs& in) {
    const Shape& x = in[0]->shape;
    const int64_t ndim = static_cast<int64_t>(x.size()), time_dim = ndim - 3;
    OpSharding s;
    s.output_shapes = {x};
    s.options.push_back({Placements(3, Replicate()), {Replicate()}});
    for (int64_t d = 0; d < ndim - 1; ++d) {
      const Placement table = d == time_dim ? Shard(0) : Replicate();
      s.options.push_back({{Shard(d), table, table}, {Shard(d)}});
    }
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg})
      s.options.push_back({{Partial(op), Replicate(), Replicate()}, {Partial(op)}});
    return s;
  };
  // Attention shards only the leading (batch, head) dims: every shard holds whole sequences, so
  // the attrs (is_causal, scale, causal_offset, enable_gqa; the backward's delta_from_out, a
  // per-row sum) reach each local call unchanged (propagator.cc passes call.attrs through) and mean
  // there what they mean for the whole tensor (grouped-query attention's groups checked to split
  // alike on every rank). Under dropout (attrs after the op's own,
  // tensor/attention_attrs.h) each local call is given where its heads and batch entries sit in the
  // whole (batch..., Tq, Tk) mask, so a shard drops exactly its slice of what one rank drops.
  t[OpId::scaled_dot_product_attention] = [](const OpCall& call, const InputSpecs& in) {
    const Shape& q = in[0]->shape;
    const int64_t lead = static_cast<int64_t>(q.size()) - 2;
    Shape out = q;
    out.back() = in[2]->shape.back();
    OpSharding s = leading_dims(3, {true, true, true}, lead, {out, Shape(q.begin(), q.end() - 1)});
    if (call.attrs.size() > 3) {  // enable_gqa (and dropout's attrs after it) given
      s.local = [](const OpCall& local, const InputSpecs& specs) {
        check_groups_split_alike(local, specs, 0);
        const AttentionDropout dropout =
            attention_dropout_on_shard(local, ops::kAttentionDropoutAttrs, specs, 0);
        auto r = ops::scaled_dot_product_attention(
            local.inputs[0], local.inputs[1], local.inputs[2], local.bool_attr(0),
            local.double_attr(1), local.int_attr(2), dropout, local.bool_attr(3));
        return std::vector<Tensor>{r.out, r.logsumexp};
      };
    }
    return s;
  };
  t[OpId::scaled_dot_product_attention_backward] = [](const OpCall& call, const InputSpecs& in) {
    // Inputs: (grad_out, q, k, v, out, logsumexp); outputs (dq, dk, dv).
    const int64_t lead = static_cast<int64_t>(in[1]->shape.size()) - 2;
    OpSharding s = leading_dims(6, {true, true, true, true, true, true}, lead,
                                {in[1]->shape, in[2]->shape, in[3]->shape});
    if (call.attrs.size() > 4) {  // enable_gqa (and dropout's attrs after it) given
      s.local = [](const OpCall& local, const InputSpecs& specs) {
        check_groups_split_alike(local, specs, 1);
        const AttentionDropout dropout =
            attention_dropout_on_shard(local, ops::kAttentionBackwardDropoutAttrs, specs, 1);
        const auto& x = local.inputs;
        auto g = ops::scaled_dot_product_attention_backward(
            x[0], x[1], x[2], x[3], x[4], x[5], local.bool_attr(0), local.double_attr(1),
            local.int_attr(2), local.bool_attr(3), dropout, local.bool_attr(4));
        return std::vector<Tensor>{g.dq, g.dk, g.dv};
      };
    }
    return s;
  };
  t[OpId::dropout] = [](const OpCall&, const InputSpecs& in) {
    // The keep-mask is a pure function of (seed, global element index), so a shard draws exactly
    // its slice of the whole tensor's mask: dropout runs on any Shard (sequence-parallel
    // activations) with no communication. It is linear for a fixed mask, so Partial(sum|avg)
    // inputs stay Partial (the mask itself, 0/1, is then Replicate).
    const int64_t ndim = static_cast<int64_t>(in[0]->shape.size());
    OpSharding s = leading_dims(1, {true}, ndim, {in[0]->shape, in[0]->shape});
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg})
      s.options.push_back({{Partial(op)}, {Partial(op), Replicate()}});
    s.local = [](const OpCall& local, const InputSpecs& specs) {
      // The call's own region (where the whole distributed tensor sits, e.g. a data-parallel
      // rank's rows of the global batch) with this shard's place in it.
      const DTensorSpec& spec = *specs[0];
      const RngRegion region =
          region_within(ops::dropout_region_of(local), spec.shape, spec.local_offset());
      auto r = ops::dropout(local.inputs[0], local.double_attr(0),
                            static_cast<uint64_t>(local.int_attr(1)), local.bool_attr(2), region);
      return std::vector<Tensor>{r.out, r.mask};
    };
    return s;
  };
  t[OpId::dropout_backward] = [](const OpCall&, const InputSpecs& in) {
    const int64_t ndim = static_cast<int64_t>(in[0]->shape.size());
    OpSharding s = leading_dims(2, {true, true}, ndim, {in[0]->shape});
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg})
      s.options.push_back({{Partial(op), Replicate()}, {Partial(op)}});
    return s;
  };
  t[OpId::embedding] = embedding_strategy();
  t[OpId::embedding_backward] = embedding_backward_strategy();
  t[OpId::cross_entropy] = cross_entropy_strategy();
  t[OpId::cross_entropy_backward] = cross_entropy_backward_strategy();
}

}  // namespace loom::sharding
