#include "parallel/ep/expert_parallel.h"

#include <numeric>
#include <vector>

#include "autograd/function.h"
#include "autograd/functions.h"
#include "autograd/functions_nn.h"
#include "base/error.h"
#include "base/profiler.h"
#include "dtensor/dtensor.h"
#include "tensor/ops.h"

namespace loom::parallel::ep {

namespace {

// Rows of `x` in pieces of `send` rows, piece j to rank j; the pieces received (`receive[j]` rows
// from rank j) concatenated in rank order. Backward: the gradient's rows the other way.
class AllToAllRows : public autograd::Function {
 public:
  AllToAllRows(std::shared_ptr<comm::ProcessGroup> group, std::vector<int64_t> send,
               std::vector<int64_t> receive)
      : group_(std::move(group)), send_(std::move(send)), receive_(std::move(receive)) {}
  std::string name() const override { return "ExpertParallelAllToAll"; }

  std::vector<Tensor> forward(const std::vector<Tensor>& inputs) override {
    return {exchange(inputs[0], send_, receive_)};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    return {exchange(grads[0], receive_, send_)};
  }

 private:
  Tensor exchange(const Tensor& x, const std::vector<int64_t>& send,
                  const std::vector<int64_t>& receive) const {
    // The exchange with its wait, forward or backward: the step's expert-parallel traffic in the
    // op profile (--profile-ops).
    profiler::Scope scope("ep::all_to_all (rows, with wait)");
    const Tensor rows = ops::contiguous(x);
    const int64_t width = rows.size(1);
    std::vector<Tensor> out, in;
    int64_t at = 0;
    for (size_t j = 0; j < send.size(); ++j) {
      out.push_back(ops::contiguous(ops::narrow(rows, 0, at, send[j])));
      at += send[j];
      in.push_back(ops::empty({receive[j], width}, rows.dtype(), rows.device()));
    }
    group_->all_to_all(in, out)->wait();
    return ops::cat(in, 0);
  }

  std::shared_ptr<comm::ProcessGroup> group_;
  std::vector<int64_t> send_, receive_;
};

Tensor all_to_all_rows(const Tensor& x, std::shared_ptr<comm::ProcessGroup> group,
                       std::vector<int64_t> send, std::vector<int64_t> receive) {
  return autograd::Function::apply(
      std::make_shared<AllToAllRows>(std::move(group), std::move(send), std::move(receive)),
      {x})[0];
}

class ExpertParallelDispatch : public nn::ExpertDispatch {
 public:
  ExpertParallelDispatch(std::shared_ptr<const DeviceMesh> mesh, int64_t experts)
      : mesh_(std::move(mesh)), experts_(experts) {}

  Tensor run(nn::GroupedExperts& experts, const Tensor& sorted,
             const std::vector<int64_t>& offsets) override {
    const auto& group = mesh_->group(0);
    const int64_t ep = group->size(), local = experts_ / ep;
    // The experts of coordinate c along ep (distribute_tensor's Shard(0)) live on group rank
    // group_ranks_by_coordinate(0)[c]: the same unless the mesh's rank list runs backwards.
    const std::vector<int>& rank_of = mesh_->group_ranks_by_coordinate(0);
    std::vector<int64_t> coordinate_of(ep);
    for (int64_t c = 0; c < ep; ++c) coordinate_of[rank_of[c]] = c;
    const int64_t me = mesh_->coordinate(0);
    const auto first_row = [&](int64_t c) { return offsets[c * local]; };
    // 1. Per-expert slot counts: to group rank j, this rank's counts for j's experts.
    std::vector<Tensor> counts_out, counts_in;
    for (int64_t j = 0; j < ep; ++j) {
      const int64_t c = coordinate_of[j];
      std::vector<int64_t> mine(local);
      for (int64_t l = 0; l < local; ++l) {
        mine[l] = offsets[c * local + l + 1] - offsets[c * local + l];
      }
      counts_out.push_back(ops::to(ops::from_vector_i64(mine, {local}), sorted.device()));
      counts_in.push_back(ops::empty({local}, kInt64, sorted.device()));
    }
    {
      profiler::Scope scope("ep::all_to_all (counts, with wait)");
      group->all_to_all(counts_in, counts_out)->wait();
    }
    std::vector<std::vector<int64_t>> from(ep);  // from[j][l]: rank j's slots for local expert l
    std::vector<int64_t> send(ep), receive(ep);
    for (int64_t j = 0; j < ep; ++j) {
      if (sorted.device().is_meta()) {
        // A traced step (loom plan) has no counts: every rank is taken to route as this one
        // does (the MoE's uniform routing on meta), so each sends this rank's own share.
        for (int64_t l = 0; l < local; ++l) {
          from[j].push_back(offsets[me * local + l + 1] - offsets[me * local + l]);
        }
      } else {
        const std::vector<double> c = ops::to_vector(counts_in[j]);
        from[j].assign(c.begin(), c.end());
      }
      receive[j] = std::accumulate(from[j].begin(), from[j].end(), int64_t{0});
      const int64_t c = coordinate_of[j];
      send[j] = first_row(c + 1) - first_row(c);
    }
    const auto gather = [&](const Tensor& x, const std::vector<int64_t>& rows) {
      return ops::embedding(
          x, ops::to(ops::from_vector_i64(rows, {static_cast<int64_t>(rows.size())}), x.device()));
    };
    // The rows in group-rank order of their experts' ranks (the expert order itself, unless the
    // ranks run backwards along ep), and the way back.
    bool in_order = true;
    for (int64_t j = 0; j < ep; ++j) in_order = in_order && coordinate_of[j] == j;
    std::vector<int64_t> to_group, from_group;
    if (!in_order) {
      for (int64_t j = 0; j < ep; ++j) {
        const int64_t c = coordinate_of[j];
        for (int64_t row = first_row(c); row < first_row(c + 1); ++row) to_group.push_back(row);
      }
      from_group.resize(to_group.size());
      for (size_t i = 0; i < to_group.size(); ++i)
        from_group[to_group[i]] = static_cast<int64_t>(i);
    }
    const Tensor outgoing = in_order ? sorted : gather(sorted, to_group);
    // 2. Dispatch: rows to their experts' ranks; received in (source rank, local expert) order.
    const Tensor received = all_to_all_rows(outgoing, group, send, receive);
    // 3. Into (local expert, source rank) order for the grouped GEMMs, and back afterwards.
    std::vector<int64_t> source_start(ep + 1, 0);
    for (int64_t j = 0; j < ep; ++j) source_start[j + 1] = source_start[j] + receive[j];
    std::vector<int64_t> by_expert, local_offsets(local + 1, 0);
    for (int64_t l = 0; l < local; ++l) {
      for (int64_t j = 0; j < ep; ++j) {
        int64_t row = source_start[j];
        for (int64_t m = 0; m < l; ++m) row += from[j][m];
        for (int64_t i = 0; i < from[j][l]; ++i) by_expert.push_back(row + i);
        local_offsets[l + 1] += from[j][l];
      }
      local_offsets[l + 1] += local_offsets[l];
    }
    std::vector<int64_t> back(by_expert.size());
    for (size_t i = 0; i < by_expert.size(); ++i) back[by_expert[i]] = static_cast<int64_t>(i);
    const Tensor expert_rows = gather(received, by_expert);
    experts.set_group_offsets(local_offsets);
    const Tensor out = experts(expert_rows);  // this rank's experts (their local shards)
    // 4. Combine: each output row back to the rank its token lives on.
    const Tensor returned = all_to_all_rows(gather(out, back), group, receive, send);
    return in_order ? returned : gather(returned, from_group);
  }

 private:
  std::shared_ptr<const DeviceMesh> mesh_;
  int64_t experts_;
};

}  // namespace

void ExpertParallel::validate(const nn::Module& module, const std::string& fqn,
                              const DeviceMesh& mesh) const {
  const auto* moe = dynamic_cast<const nn::MoE*>(&module);
  LOOM_CHECK(moe != nullptr,
             "parallelize_module: ExpertParallel applies to a mixture of experts (nn::MoE), but "
             "'{}' is a {}",
             fqn, module.type_name());
  LOOM_CHECK(mesh.ndim() == 1,
             "parallelize_module: ExpertParallel needs a 1-D mesh (e.g. mesh[\"ep\"]), got {}",
             mesh.str());
  LOOM_CHECK(moe->options().num_experts % mesh.size(0) == 0,
             "parallelize_module: ExpertParallel on '{}': ep {} does not divide its {} experts",
             fqn, mesh.size(0), moe->options().num_experts);
  LOOM_CHECK(!is_dtensor(moe->experts->w1()),
             "parallelize_module: ExpertParallel on '{}': its experts are already split ({})", fqn,
             moe->experts->w1().description());
}

void ExpertParallel::apply(nn::Module& module, const std::string& fqn,
                           std::shared_ptr<const DeviceMesh> mesh) const {
  validate(module, fqn, *mesh);
  expert_parallel(dynamic_cast<nn::MoE&>(module), std::move(mesh));
}

void expert_parallel(nn::MoE& moe, std::shared_ptr<const DeviceMesh> ep_mesh) {
  LOOM_CHECK(ep_mesh != nullptr && ep_mesh->ndim() == 1,
             "expert_parallel: needs a 1-D expert-parallel mesh, got {}",
             ep_mesh ? ep_mesh->str() : "null");
  const int64_t ep = ep_mesh->size(0), experts = moe.options().num_experts;
  LOOM_CHECK(experts % ep == 0,
             "expert_parallel: ep {} does not divide the {} experts (--moe-experts); each rank "
             "holds experts / ep of them",
             ep, experts);
  if (ep == 1) return;
  for (const Tensor& w : {moe.experts->w1(), moe.experts->w2(), moe.experts->w3()}) {
    if (!is_dtensor(w)) continue;
    const DTensorSpec& spec = dtensor_spec(w, "expert_parallel");
    // Split by experts (dim 0) already: this MoE had expert_parallel (or fully_shard) applied.
    LOOM_CHECK(!spec.placements.at(0).is_shard(0),
               "expert_parallel: this MoE's experts are already split by expert ({} on {}): "
               "call expert_parallel once per MoE, before fully_shard",
               placements_str(spec.placements), spec.mesh->str());
    LOOM_FAIL(
        "expert_parallel: the experts are already split within each expert ({}); expert "
        "parallelism takes whole experts — lay out the model with expert tensor parallelism off "
        "(TPPlanOptions::expert_tensor_parallel = false) when ep > 1",
        w.description());
  }
  // Every rank built all E experts alike (the same seed): each keeps its own slice, no message.
  const std::vector<std::pair<const char*, Tensor>> weights = {
      {"w1", moe.experts->w1()}, {"w2", moe.experts->w2()}, {"w3", moe.experts->w3()}};
  for (const auto& [name, whole] : weights) {
    Tensor sharded = distribute_tensor(detach(whole), ep_mesh, {Shard(0)},
                                       /*src_data_rank=*/std::nullopt);
    sharded.set_requires_grad(true);
    moe.experts->set_parameter(name, sharded);
  }
  moe.experts->set_weight_view([](const Tensor& w) { return is_dtensor(w) ? to_local(w) : w; });
  moe.set_expert_dispatch(std::make_shared<ExpertParallelDispatch>(ep_mesh, experts));
}

}  // namespace loom::parallel::ep
