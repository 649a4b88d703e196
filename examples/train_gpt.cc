// `./loom train`: Loom's main job.
//
// For now (issue 2) this is the stand-in the GPT job will replace: a one-hidden-layer MLP
// trained on one rank with Loom's own tensors, autograd and AdamW, on a synthetic three-arm
// spiral (generated from a seed: nothing to download). It prints the loss as it falls and the
// final training accuracy.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cmath>
#include <numbers>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/functions_nn.h"
#include "base/error.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "optim/optimizer.h"
#include "tensor/ops.h"

namespace {

using namespace loom;

struct Flags {
  int steps = 300;
  int hidden = 64;
  int points_per_class = 200;
  double lr = 1e-2;
  uint64_t seed = 1;
  int log_every = 25;
};

// Three interleaved spiral arms in 2-D (x: (3n, 2) f32, y: (3n,) i64), noise from the seed.
std::pair<Tensor, Tensor> make_spiral(int per_class, uint64_t seed) {
  constexpr int kClasses = 3;
  const int n = per_class * kClasses;
  const std::vector<double> noise = ops::to_vector(ops::normal({n}, seed, 0.0, 0.2));
  std::vector<float> xs(2 * n);
  std::vector<int64_t> ys(n);
  for (int c = 0; c < kClasses; ++c) {
    for (int i = 0; i < per_class; ++i) {
      const int k = c * per_class + i;
      const double r = static_cast<double>(i) / per_class;
      const double t = c * 4.0 + 4.0 * r + noise[k];
      xs[2 * k] = static_cast<float>(r * std::sin(t));
      xs[2 * k + 1] = static_cast<float>(r * std::cos(t));
      ys[k] = c;
    }
  }
  return {ops::from_vector(xs, {n, 2}), ops::from_vector_i64(ys, {n})};
}

class Mlp : public nn::Module {
 public:
  Mlp(int hidden, uint64_t seed) : Module("Mlp") {
    fc1_ = register_module("fc1", std::make_shared<nn::Linear>(2, hidden, nn::LinearOptions{.seed = seed}));
    fc2_ = register_module("fc2", std::make_shared<nn::Linear>(hidden, 3, nn::LinearOptions{.seed = seed + 2}));
  }
  Tensor forward(const Tensor& x) override { return (*fc2_)(gelu((*fc1_)(x))); }

 private:
  std::shared_ptr<nn::Linear> fc1_, fc2_;
};

int run(const Flags& flags) {
  auto [x, y] = make_spiral(flags.points_per_class, flags.seed);
  Mlp model(flags.hidden, flags.seed);
  optim::AdamW optimizer(model.parameters(), optim::AdamWOptions{.lr = flags.lr, .weight_decay = 0.0});
  fmt::print("train_gpt (stand-in): MLP 2 -> {} -> 3 on a {}-point spiral, AdamW lr {}\n",
             flags.hidden, x.size(0), flags.lr);
  double first_loss = 0, loss_value = 0;
  for (int step = 0; step <= flags.steps; ++step) {
    Tensor loss = cross_entropy(model(x), y);
    loss_value = loss.item<double>();
    if (step == 0) first_loss = loss_value;
    if (step % flags.log_every == 0 || step == flags.steps) {
      fmt::print("step {:4d}  loss {:.4f}\n", step, loss_value);
    }
    if (step == flags.steps) break;
    optimizer.zero_grad();
    backward(loss);
    optimizer.step();
  }
  const auto predicted = ops::max(model(x), 1).second;
  const double accuracy =
      ops::sum(ops::eq(predicted, y)).item<double>() / static_cast<double>(y.size(0));
  fmt::print("loss {:.4f} -> {:.4f}, training accuracy {:.1f}%\n", first_loss, loss_value,
             100.0 * accuracy);
  return loss_value < first_loss ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app{"Train a model with Loom (stand-in: an MLP on a synthetic spiral)"};
  app.add_option("--steps", flags.steps, "optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--hidden", flags.hidden, "hidden width")->check(CLI::PositiveNumber);
  app.add_option("--points-per-class", flags.points_per_class, "spiral points per class")->check(CLI::PositiveNumber);
  app.add_option("--lr", flags.lr, "AdamW learning rate")->check(CLI::PositiveNumber);
  app.add_option("--seed", flags.seed, "seed for data and initialization");
  app.add_option("--log-every", flags.log_every, "print the loss every N steps")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    return run(flags);
  } catch (const loom::Error& error) {
    fmt::print(stderr, "train_gpt: {}\n", error.what());
    return 1;
  }
}
