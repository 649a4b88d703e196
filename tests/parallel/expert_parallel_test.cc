// Expert parallelism (parallel/ep) on one MoE call against the MoE on one rank: each of ep
// ranks routes its own tokens and its experts are 1/ep of them; the reference runs the whole MoE
// on each rank's tokens (routing, capacity and the auxiliary-free bias are per call, so this is
// the same computation). Outputs and input gradients per rank within 1e-6, each rank's expert
// weights' gradients the reference's summed over every rank's tokens (their slice), the router's
// and shared experts' the rank's own; the all-to-alls counted exactly: 3 forward (counts,
// dispatch, combine), 2 backward, bytes from the routing's own slot counts.
#include "parallel/ep/expert_parallel.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/gather_rows.h"
#include "autograd/grouped_mm.h"
#include "base/error.h"
#include "comm/testing/multi_rank.h"
#include "dtensor/comm_debug_mode.h"
#include "dtensor/dtensor.h"
#include "mesh/device_mesh.h"
#include "nn/linear.h"
#include "nn/moe/moe.h"
#include "parallel/tp/parallelize.h"
#include "tensor/grad_mode.h"
#include "tensor/ops.h"
#include "tensor/rng.h"
#include "tests/testing/tensor_checks.h"

namespace loom::parallel::ep {
namespace {

constexpr int64_t kDim = 12, kTokens = 9;  // per rank

struct MoERun {
  Tensor out, dx;
  std::map<std::string, Tensor> grads;
};

// The message of the loom::Error `call` throws ("no error" when it throws none).
std::string message(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

MoERun run_moe(nn::MoE& moe, const Tensor& x0, const Tensor& g) {
  Tensor x = ops::clone(x0);
  x.set_requires_grad(true);
  const Tensor out = moe(x);
  backward(sum(mul(out, g)));
  MoERun r{out, x.grad(), {}};
  for (const auto& [name, p] : moe.named_parameters()) {
    r.grads[name] = is_dtensor(p.grad()) ? to_local(p.grad()) : p.grad();
  }
  return r;
}

void check(int ep, const nn::MoEOptions& options, const std::string& what, bool backwards = false) {
  SCOPED_TRACE(what);
  comm::testing::run_on_ranks(ep, [&](comm::ProcessGroup& pg) {
    // `backwards`: the mesh's rank list reversed, so coordinate c is world rank ep - 1 - c and
    // the experts of coordinate c live on another group rank than c.
    std::vector<int> ranks(ep);
    for (int r = 0; r < ep; ++r) ranks[r] = backwards ? ep - 1 - r : r;
    const auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"ep"}, std::vector<int64_t>{ep}, ranks);
    const int64_t coordinate = mesh->coordinate(0);
    const auto input = [](int rank) { return ops::normal({1, kTokens, kDim}, 100 + rank); };
    const auto upstream = [](int rank) { return ops::normal({1, kTokens, kDim}, 200 + rank); };
    // The reference: the whole MoE on each rank's tokens; expert gradients summed over ranks.
    nn::MoE whole(kDim, options, 7);
    std::map<std::string, Tensor> summed;
    MoERun mine;
    for (int r = 0; r < ep; ++r) {
      for (const auto& p : whole.parameters()) p.set_grad(Tensor());
      MoERun run = run_moe(whole, input(r), upstream(r));
      for (const auto& [name, grad] : run.grads) {
        summed[name] = summed.count(name) ? ops::add(summed[name], grad) : grad;
      }
      if (r == pg.rank()) mine = run;
    }
    whole.take_stats();
    // Expert parallel.
    nn::MoE moe(kDim, options, 7);
    expert_parallel(moe, mesh);
    CommDebugMode comm;
    const MoERun got = run_moe(moe, input(pg.rank()), upstream(pg.rank()));
    const testing::Tolerance tol{.rtol = 1e-6, .atol = 1e-6};
    testing::expect_close({.actual = got.out, .expected = mine.out, .tol = tol, .what = "output"});
    testing::expect_close({.actual = got.dx, .expected = mine.dx, .tol = tol, .what = "dx"});
    const int64_t local = options.num_experts / ep;
    for (const auto& [name, grad] : got.grads) {
      const bool expert = name.rfind("experts.", 0) == 0;
      const Tensor want =
          expert ? ops::narrow(summed.at(name), 0, coordinate * local, local) : mine.grads.at(name);
      testing::expect_close(
          {.actual = grad, .expected = want, .tol = tol, .what = "gradient of " + name});
    }
    // The all-to-alls: counts (E int64), then rows out and back, forward and backward.
    const nn::RouterStats stats = moe.take_stats();
    const int64_t kept = kTokens * options.top_k - stats.dropped;
    const auto groups = comm.by_group();
    ASSERT_TRUE(groups.count("mesh/ep")) << comm.summary();
    const auto& c = groups.at("mesh/ep");
    const auto a2a = static_cast<size_t>(comm::CollectiveKind::kAllToAll);
    EXPECT_EQ(c.calls[a2a], 5);
    EXPECT_EQ(c.total_calls(), 5) << "nothing but the all-to-alls on ep";
    // Rows this rank received (the slots other ranks sent to its experts) come out of the bytes:
    // E * 8 + 2 * kept * dim * 4 + 2 * received * dim * 4.
    const int64_t rest = c.bytes[a2a] - options.num_experts * 8 - 2 * kept * kDim * 4;
    EXPECT_EQ(rest % (2 * kDim * 4), 0);
    // Summed over ranks, every rank's kept slots are received somewhere exactly once.
    Tensor received = ops::full({1}, static_cast<double>(rest / (2 * kDim * 4)), kFloat32);
    Tensor sent = ops::full({1}, static_cast<double>(kept), kFloat32);
    pg.all_reduce(received)->wait();
    pg.all_reduce(sent)->wait();
    EXPECT_EQ(received.item<double>(), sent.item<double>());
  });
}

TEST(ExpertParallelTest, Ep2AndEp4EqualOneRank) {
  const nn::MoEOptions options{.num_experts = 8, .top_k = 2, .hidden_dim = 8};
  check(2, options, "ep2 softmax top-2");
  check(4, options, "ep4 softmax top-2");
}

TEST(ExpertParallelTest, AMeshWhoseRanksRunBackwards) {
  check(2, {.num_experts = 4, .top_k = 2, .hidden_dim = 8}, "ep2, ranks [1, 0]", true);
  check(4, {.num_experts = 8, .top_k = 2, .hidden_dim = 8}, "ep4, ranks [3, 2, 1, 0]", true);
}

TEST(ExpertParallelTest, SigmoidSharedExpertsCapacityAndTopKOfAll) {
  check(2,
        {.num_experts = 4,
         .top_k = 2,
         .hidden_dim = 8,
         .num_shared_experts = 1,
         .score_func = "sigmoid",
         .route_norm = true,
         .capacity_factor = 0.75},
        "ep2 DeepSeek-style with drops");
  check(4, {.num_experts = 4, .top_k = 4, .hidden_dim = 8}, "ep4 top-k = E (one expert each)");
}

TEST(ExpertParallelTest, AnExpertWithoutTokensAndEveryTokenOnOneRank) {
  // Every token of every rank on expert 2 (rank 1's at ep 2): rank 0's experts get nothing.
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    const auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"ep"}, std::vector<int64_t>{2});
    const nn::MoEOptions options{.num_experts = 4, .top_k = 1, .hidden_dim = 8};
    nn::MoE whole(kDim, options, 7), moe(kDim, options, 7);
    for (nn::MoE* m : {&whole, &moe}) {
      NoGradGuard no_grad;
      ops::fill_(m->gate->weight(), 0.0);
      ops::fill_(ops::narrow(m->gate->weight(), 0, 2, 1), 1.0);
    }
    expert_parallel(moe, mesh);
    const Tensor x = ops::add(ops::abs(ops::normal({1, kTokens, kDim}, 300 + pg.rank())), 0.1);
    const Tensor g = ops::normal({1, kTokens, kDim}, 400 + pg.rank());
    const MoERun want = run_moe(whole, x, g), got = run_moe(moe, x, g);
    EXPECT_EQ(moe.take_stats().tokens_per_expert, (std::vector<int64_t>{0, 0, kTokens, 0}));
    const testing::Tolerance tol{.rtol = 1e-6, .atol = 1e-6};
    testing::expect_close({.actual = got.out, .expected = want.out, .tol = tol, .what = "output"});
    testing::expect_close({.actual = got.dx, .expected = want.dx, .tol = tol, .what = "dx"});
    // Rank 0's experts (0 and 1) saw no token: zero gradients.
    if (pg.rank() == 0) {
      testing::expect_equal({.actual = got.grads.at("experts.w1"),
                             .expected = ops::zeros(got.grads.at("experts.w1").shape()),
                             .what = "an idle expert's gradient"});
    }
  });
}

TEST(ExpertParallelTest, EpThatDoesNotDivideTheExpertsIsNamed) {
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    const auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"ep"}, std::vector<int64_t>{2});
    nn::MoE moe(kDim, {.num_experts = 3, .top_k = 1, .hidden_dim = 8}, 7);
    try {
      expert_parallel(moe, mesh);
      ADD_FAILURE() << "ep 2 over 3 experts was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("ep 2 does not divide the 3 experts"), std::string::npos)
          << e.what();
    }
  });
}

// The style of a plan (torchtitan's ExpertParallel through parallelize_module) is the call's
// split, bit for bit; a module that is no MoE, and experts already split, are refused by name.
TEST(ExpertParallelTest, TheExpertParallelStyleOfAPlan) {
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    const auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"ep"}, std::vector<int64_t>{2});
    const nn::MoEOptions options{.num_experts = 4, .top_k = 2, .hidden_dim = 8};
    nn::MoE by_call(kDim, options, 7), by_plan(kDim, options, 7);
    expert_parallel(by_call, mesh);
    tp::parallelize_module(by_plan, mesh, std::make_shared<ExpertParallel>());
    ASSERT_TRUE(is_dtensor(by_plan.experts->w2()));
    const Tensor x = ops::normal({1, kTokens, kDim}, 100 + pg.rank());
    {
      NoGradGuard no_grad;
      testing::expect_equal({.actual = by_plan(x), .expected = by_call(x)});
    }
    EXPECT_THAT(
        message([&] { tp::parallelize_module(by_plan, mesh, std::make_shared<ExpertParallel>()); }),
        ::testing::HasSubstr("its experts are already split"));
    nn::Linear linear(kDim, kDim, nn::LinearOptions{.seed = 1});
    EXPECT_THAT(
        message([&] { tp::parallelize_module(linear, mesh, std::make_shared<ExpertParallel>()); }),
        ::testing::HasSubstr("ExpertParallel applies to a mixture of experts (nn::MoE)"));
  });
}

// What a user's own code gets wrong is named with the call to fix: expert_parallel twice on one
// MoE, a DTensor handed to the MoE, to gather_rows or to grouped_mm (each takes local tensors).
TEST(ExpertParallelTest, MisusesNameTheCallToFix) {
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    const auto mesh = std::make_shared<const DeviceMesh>(
        pg.shared_from_this(), std::vector<std::string>{"ep"}, std::vector<int64_t>{2});
    nn::MoE moe(kDim, {.num_experts = 4, .top_k = 2, .hidden_dim = 8}, 7);
    expert_parallel(moe, mesh);
    EXPECT_NE(message([&] { expert_parallel(moe, mesh); })
                  .find("this MoE's experts are already split by expert ([S(0)] on "
                        "DeviceMesh(ep=2, cpu)): call expert_parallel once per MoE"),
              std::string::npos);
    const Tensor rows = distribute_tensor(ops::normal({4, kDim}, 1), mesh, {Shard(0)});
    EXPECT_NE(message([&] { moe(rows); }).find("MoE: the input is a wrapper tensor (a DTensor: "),
              std::string::npos);
    const std::vector<int64_t> index = {1, -1};
    EXPECT_NE(
        message([&] { gather_rows(rows, index, {2}); }).find("gather_rows: x is a wrapper tensor"),
        std::string::npos);
    EXPECT_NE(message([&] {
                loom::grouped_mm(ops::normal({4, kDim}, 1), moe.experts->w1(), {0, 2, 4});
              }).find("grouped_mm: w is a wrapper tensor"),
              std::string::npos);
  });
}

}  // namespace
}  // namespace loom::parallel::ep
