#include "models/gpt/gpt.h"

#include <cmath>
#include <functional>

#include "autograd/functions.h"
#include "autograd/functions_nn.h"
#include "autograd/grad_mode.h"
#include "autograd/sequence_context.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "nn/batch_part.h"
#include "parallel/tp/loss_parallel.h"
#include "tensor/ops.h"

namespace loom::models {

namespace {

// A stable 64-bit hash (FNV-1a) of a parameter name, mixed with the seed.
uint64_t parameter_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The seeds a GPT built from `seed` gives its submodules (dropout masks depend on them); a
// pipeline stage gives the same ones to the modules it holds.
struct GPTModuleSeeds {
  uint64_t seed;
  uint64_t wte() const { return seed; }
  uint64_t wpe() const { return seed + 1; }
  uint64_t drop() const { return seed + 2; }
  uint64_t block(int64_t i) const { return seed + 16 * static_cast<uint64_t>(i + 1); }
};

}  // namespace

CausalSelfAttention::CausalSelfAttention(const GPTConfig& config, uint64_t seed)
    : Module("CausalSelfAttention"), head_dim_(config.head_dim()) {
  c_attn = register_module("c_attn", std::make_shared<nn::Linear>(config.n_embd, 3 * config.n_embd,
                                                                  nn::LinearOptions{.seed = seed}));
  c_proj =
      register_module("c_proj", std::make_shared<nn::Linear>(config.n_embd, config.n_embd,
                                                             nn::LinearOptions{.seed = seed + 2}));
  // Only a model that drops attention has the module (and a checkpoint its RNG state), so
  // checkpoints of models without it load as before.
  if (config.attn_dropout > 0.0) {
    attn_dropout_ = register_module("attn_dropout",
                                    std::make_shared<nn::Dropout>(config.attn_dropout, seed + 6));
  }
  resid_dropout_ =
      register_module("resid_dropout", std::make_shared<nn::Dropout>(config.dropout, seed + 4));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  const int64_t batch = x.size(0), time = x.size(1);
  const Tensor qkv = (*c_attn)(x);  // (B, T, 3C), head-major: [h0: q k v][h1: q k v]...
  // (B, T, H, 3, D); H is -1 so the same code runs on a tensor-parallel rank's local heads.
  const Tensor heads = reshape(qkv, {batch, time, -1, 3, head_dim_});
  // One node for the three slices: their gradients are stacked back in one write.
  const std::vector<Tensor> q_k_v = unbind(heads, 3);
  auto take = [&](int64_t which) { return transpose(q_k_v[which], 1, 2); };
  // c_attn's rows are head-major, 3 D per head (q, k, v): a tp rank's first names its heads.
  const AttentionDropout dropout = nn::attention_dropout(
      attn_dropout_.get(), c_attn->weight(), 3 * head_dim_, {batch, heads.size(2), time, time});
  const Tensor y = scaled_dot_product_attention(take(0), take(1), take(2), /*is_causal=*/true,
                                                /*scale=*/0.0, /*causal_offset=*/0,
                                                dropout);  // (B, H, T, D)
  const Tensor merged = reshape(transpose(y, 1, 2), {batch, time, -1});
  return (*resid_dropout_)((*c_proj)(merged));
}

MLP::MLP(const GPTConfig& config, uint64_t seed) : Module("MLP") {
  c_fc = register_module("c_fc", std::make_shared<nn::Linear>(config.n_embd, 4 * config.n_embd,
                                                              nn::LinearOptions{.seed = seed}));
  c_proj =
      register_module("c_proj", std::make_shared<nn::Linear>(4 * config.n_embd, config.n_embd,
                                                             nn::LinearOptions{.seed = seed + 2}));
  dropout_ = register_module("dropout", std::make_shared<nn::Dropout>(config.dropout, seed + 4));
}

Tensor MLP::forward(const Tensor& x) { return (*dropout_)((*c_proj)(gelu((*c_fc)(x)))); }

Block::Block(const GPTConfig& config, uint64_t seed) : Module("Block") {
  ln_1 = register_module("ln_1", std::make_shared<nn::LayerNorm>(Shape{config.n_embd}));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(config, seed));
  ln_2 = register_module("ln_2", std::make_shared<nn::LayerNorm>(Shape{config.n_embd}));
  mlp = register_module("mlp", std::make_shared<MLP>(config, seed + 8));
}

Tensor Block::forward(const Tensor& x) {
  const Tensor after_attn = add(x, (*attn)((*ln_1)(x)));
  return add(after_attn, (*mlp)((*ln_2)(after_attn)));
}

GPTStage::GPTStage(GPTConfig config, uint64_t seed, GPTStageRange range, std::string type_name)
    : Module(std::move(type_name)), config_(std::move(config)), range_(range), seed_(seed) {
  config_.validate();
  LOOM_CHECK(0 <= range_.first_block && range_.first_block <= range_.end_block &&
                 range_.end_block <= config_.n_layer,
             "GPTStage: blocks [{}, {}) are not a range of the model's {} blocks",
             range_.first_block, range_.end_block, config_.n_layer);
  const GPTModuleSeeds seeds{seed};
  if (range_.first || range_.last) {
    wte = register_module(
        "wte", std::make_shared<nn::Embedding>(config_.vocab_size, config_.n_embd, seeds.wte()));
  }
  if (range_.first) {
    wpe = register_module(
        "wpe", std::make_shared<nn::Embedding>(config_.block_size, config_.n_embd, seeds.wpe()));
    drop_ = register_module("drop", std::make_shared<nn::Dropout>(config_.dropout, seeds.drop()));
  }
  auto blocks = register_module(
      "h", std::make_shared<nn::ModuleList>(static_cast<size_t>(range_.first_block)));
  for (int64_t i = range_.first_block; i < range_.end_block; ++i) {
    h.push_back(blocks->append(std::make_shared<Block>(config_, seeds.block(i))));
  }
  if (range_.last) {
    ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(Shape{config_.n_embd}));
    lm_head = register_module("lm_head", std::make_shared<TiedHead>(wte));
  }
  init_weights();
}

void GPTStage::init_weights() { init_gpt_weights(*this, config_.n_layer, seed_); }

GPT::GPT(GPTConfig config, uint64_t seed)
    : GPTStage(config, seed, GPTStageRange{0, config.n_layer, true, true}, "GPT") {}

void init_gpt_weights(nn::Module& module, int64_t n_layer, uint64_t seed) {
  NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(n_layer));
  for (auto& [name, p] : module.named_parameters()) {
    if (ends_with(name, ".bias")) {
      ops::fill_(p, 0.0);
    } else if (name.find("ln_") != std::string::npos) {
      ops::fill_(p, 1.0);
    } else {
      const double std = ends_with(name, "c_proj.weight") ? residual_std : 0.02;
      ops::normal_(p, parameter_seed(seed, name), 0.0, std);
    }
  }
}

Tensor GPTStage::forward(const Tensor& input) {
  Tensor x = input;
  if (range_.first) {
    LOOM_CHECK(input.dim() == 2, "GPT: expected token ids of shape (B, T), got {}",
               shape_str(input.shape()));
    const int64_t time = input.size(1);
    LOOM_CHECK(time <= config_.block_size, "GPT: sequence length {} exceeds block_size {}", time,
               config_.block_size);
    // Positions on the ids' device (a CUDA model gets CUDA ids).
    // Global positions: this rank's chunks' under context parallelism (sequence_context.h).
    const Tensor positions = ops::from_vector_i64(sequence_positions(time), {time});
    x = (*drop_)(add((*wte)(input), (*wpe)(ops::to(positions, input.device()))));
  }
  for (const auto& block : h) x = (*block)(x);
  return range_.last ? (*lm_head)((*ln_f)(x)) : x;
}

Tensor gpt_loss(const Tensor& logits, const Tensor& targets) {
  const int64_t vocab = logits.size(-1);
  const Tensor flat_logits = reshape(logits, {-1, vocab});
  const Tensor flat_targets = reshape(targets, {-1});
  return is_dtensor(logits) ? tp::loss_parallel_cross_entropy(flat_logits, flat_targets)
                            : cross_entropy(flat_logits, flat_targets);
}

// Through operator(), so hooks on the model (mixed precision) run.
Tensor GPT::loss(const Tensor& idx, const Tensor& targets) {
  return gpt_loss((*this)(idx), targets);
}

}  // namespace loom::models
