#include "models/llama/llama.h"

#include <cmath>
#include <mutex>
#include <numbers>
#include <optional>
#include <tuple>
#include <vector>

#include "autograd/functions.h"
#include "autograd/functions_nn.h"
#include "autograd/sequence_context.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "nn/batch_part.h"
#include "parallel/tp/loss_parallel.h"
#include "tensor/memory_stats.h"
#include "tensor/ops.h"

namespace loom::models {

RMSNorm::RMSNorm(int64_t dim, double eps)
    : Module("RMSNorm"), eps_(eps), weight_(register_parameter("weight", ops::empty({dim}))) {
  reset_parameters();
}

void RMSNorm::reset_parameters() { ops::fill_(weight_, 1.0); }

Tensor RMSNorm::forward(const Tensor& x) { return rms_norm(x, weight_, eps_); }

RopeTables rope_tables(const LlamaConfig& config) {
  const int64_t half = config.rotary_dim() / 2;
  std::vector<double> freqs(half);
  for (int64_t i = 0; i < half; ++i) {
    freqs[i] = 1.0 / std::pow(config.rope_theta, static_cast<double>(2 * i) / config.rotary_dim());
  }
  double magnitude = 1.0;  // YaRN's attention factor scales cos and sin
  if (config.rope_yarn) {
    freqs = config.rope_yarn->frequencies(config.rotary_dim(), config.rope_theta);
    magnitude = config.rope_yarn->cos_sin_factor();
  }
  if (config.rope_scaling) {
    // Llama 3's scaling: long wavelengths slowed by `factor`, short ones kept, a smooth blend in
    // between (Meta's apply_scaling, HF's rope_type "llama3").
    const RopeScaling& s = *config.rope_scaling;
    const double old_context = static_cast<double>(s.original_max_position_embeddings);
    const double low_wavelen = old_context / s.low_freq_factor;
    const double high_wavelen = old_context / s.high_freq_factor;
    for (double& f : freqs) {
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen < high_wavelen) continue;
      if (wavelen > low_wavelen) {
        f /= s.factor;
        continue;
      }
      const double smooth =
          (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = (1 - smooth) * f / s.factor + smooth * f;
    }
  }
  std::vector<float> cos(config.max_seq_len * half), sin(config.max_seq_len * half);
  for (int64_t t = 0; t < config.max_seq_len; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(t) * freqs[i];
      cos[t * half + i] = static_cast<float>(magnitude * std::cos(angle));
      sin[t * half + i] = static_cast<float>(magnitude * std::sin(angle));
    }
  }
  return {ops::from_vector(cos, {config.max_seq_len, half}),
          ops::from_vector(sin, {config.max_seq_len, half})};
}

struct RopeTables::Copies {
  std::mutex mutex;
  std::vector<std::tuple<Device, Tensor, Tensor>> on_device;
};

std::shared_ptr<RopeTables::Copies> RopeTables::new_copies() { return std::make_shared<Copies>(); }

std::pair<Tensor, Tensor> RopeTables::on(Device device) const {
  if (device == cos.device()) return {cos, sin};
  std::lock_guard<std::mutex> lock(copies->mutex);
  for (const auto& [d, c, s] : copies->on_device) {
    if (d == device) return {c, s};
  }
  // Outlives every copy charged to it (a storage credits its tracker when it is freed).
  static MemoryTracker not_counted;
  std::optional<ScopedMetaPlaceholderTracker> uncounted;
  if (device.is_meta() && allocates_like_cpu(device)) uncounted.emplace(not_counted);
  const Tensor c = ops::to(cos, device), s = ops::to(sin, device);
  copies->on_device.emplace_back(device, c, s);
  return {c, s};
}

Tensor apply_rope(const Tensor& x, const RopeTables& tables) {
  const int64_t time = x.size(1);
  LOOM_CHECK(time <= tables.cos.size(0),
             "apply_rope: a sequence of {} positions, but the tables cover {} (max_seq_len)", time,
             tables.cos.size(0));
  // The rows of this rank's positions (0..T-1, a view; or its chunks' under context parallelism:
  // autograd/sequence_context.h), from the tables on the input's device: the fused rope op.
  const auto [cos, sin] = tables.on(x.device());
  const auto rows = [&](const Tensor& t) { return ops::contiguous(sequence_rows(t, time)); };
  return rope(x, rows(cos), rows(sin));
}

LlamaAttention::LlamaAttention(const LlamaConfig& config, uint64_t seed,
                               std::shared_ptr<const RopeTables> rope)
    : Module("LlamaAttention"),
      head_dim_(config.head_dim()),
      group_(config.n_heads / config.n_kv_heads),
      rope_(std::move(rope)) {
  const int64_t kv_dim = config.n_kv_heads * head_dim_;
  const auto linear = [](int64_t in, int64_t out, uint64_t s) {
    return std::make_shared<nn::Linear>(in, out, nn::LinearOptions{.bias = false, .seed = s});
  };
  wq = register_module("wq", linear(config.dim, config.dim, seed));
  wk = register_module("wk", linear(config.dim, kv_dim, seed + 1));
  wv = register_module("wv", linear(config.dim, kv_dim, seed + 2));
  wo = register_module("wo", linear(config.dim, config.dim, seed + 3));
  if (config.attention_dropout > 0.0) {
    attn_dropout_ = register_module(
        "attn_dropout", std::make_shared<nn::Dropout>(config.attention_dropout, seed + 5));
  }
}

Tensor LlamaAttention::forward(const Tensor& x) {
  const RopeTables& tables = *rope_;
  const int64_t batch = x.size(0), time = x.size(1);
  const Tensor q = apply_rope(reshape((*wq)(x), {batch, time, -1, head_dim_}), tables);
  const Tensor k = apply_rope(reshape((*wk)(x), {batch, time, -1, head_dim_}), tables);
  const Tensor v = reshape((*wv)(x), {batch, time, -1, head_dim_});
  // Grouped-query attention: kv head j serves query heads [j * group, (j + 1) * group), read in
  // place by the attention kernels (no copy of k and v per query head).
  const AttentionDropout dropout = nn::attention_dropout(attn_dropout_.get(), wq->weight(),
                                                         head_dim_, {batch, q.size(2), time, time});
  const Tensor y = scaled_dot_product_attention(transpose(q, 1, 2), transpose(k, 1, 2),
                                                transpose(v, 1, 2), /*is_causal=*/true,
                                                /*scale=*/0.0, /*causal_offset=*/0, dropout,
                                                /*enable_gqa=*/group_ > 1);  // (B, H, T, D)
  return (*wo)(reshape(transpose(y, 1, 2), {batch, time, -1}));
}

LatentAttention::LatentAttention(const LlamaConfig& config, uint64_t seed,
                                 std::shared_ptr<const RopeTables> rope)
    : Module("LatentAttention"),
      options_(*config.mla),
      softmax_scale_((config.rope_yarn ? config.rope_yarn->softmax_factor() : 1.0) /
                     std::sqrt(static_cast<double>(config.mla->qk_nope_head_dim +
                                                   config.mla->qk_rope_head_dim))),
      rope_(std::move(rope)) {
  const MLAOptions& m = options_;
  const int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
  const auto linear = [](int64_t in, int64_t out, uint64_t s) {
    return std::make_shared<nn::Linear>(in, out, nn::LinearOptions{.bias = false, .seed = s});
  };
  if (m.q_lora_rank > 0) {
    wq_a = register_module("wq_a", linear(config.dim, m.q_lora_rank, seed));
    q_norm = register_module("q_norm", std::make_shared<RMSNorm>(m.q_lora_rank, kLatentNormEps));
    wq_b = register_module("wq_b", linear(m.q_lora_rank, config.n_heads * qk, seed + 1));
  } else {
    wq = register_module("wq", linear(config.dim, config.n_heads * qk, seed + 1));
  }
  wkv_a =
      register_module("wkv_a", linear(config.dim, m.kv_lora_rank + m.qk_rope_head_dim, seed + 2));
  kv_norm = register_module("kv_norm", std::make_shared<RMSNorm>(m.kv_lora_rank, kLatentNormEps));
  wkv_b = register_module(
      "wkv_b",
      linear(m.kv_lora_rank, config.n_heads * (m.qk_nope_head_dim + m.v_head_dim), seed + 3));
  wo = register_module("wo", linear(config.n_heads * m.v_head_dim, config.dim, seed + 4));
  if (config.attention_dropout > 0.0) {
    attn_dropout_ = register_module(
        "attn_dropout", std::make_shared<nn::Dropout>(config.attention_dropout, seed + 7));
  }
}

Tensor LatentAttention::forward(const Tensor& x) {
  const MLAOptions& m = options_;
  const int64_t batch = x.size(0), time = x.size(1);
  const int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
  // Queries: (B, T, H, nope + rope), the rope part rotated. -1 heads: a tp rank's local heads.
  const Tensor q_flat = wq ? (*wq)(x) : (*wq_b)((*q_norm)((*wq_a)(x)));
  const Tensor q = reshape(q_flat, {batch, time, -1, qk});
  const int64_t heads = q.size(2);
  const Tensor q_rot =
      apply_rope(contiguous(narrow(q, 3, m.qk_nope_head_dim, m.qk_rope_head_dim)), *rope_);
  // The latent and the key's rotary part shared by every head.
  const Tensor kv_a = (*wkv_a)(x);
  const Tensor latent = narrow(kv_a, 2, 0, m.kv_lora_rank);
  Tensor k_rot = apply_rope(reshape(contiguous(narrow(kv_a, 2, m.kv_lora_rank, m.qk_rope_head_dim)),
                                    {batch, time, 1, m.qk_rope_head_dim}),
                            *rope_);
  if (shared_key_region_) k_rot = shared_key_region_(k_rot);
  const Tensor kv = reshape((*wkv_b)((*kv_norm)(contiguous(latent))),
                            {batch, time, -1, m.qk_nope_head_dim + m.v_head_dim});
  const Tensor k_nope = narrow(kv, 3, 0, m.qk_nope_head_dim);
  const Tensor v = narrow(kv, 3, m.qk_nope_head_dim, m.v_head_dim);
  const Tensor q_all = cat(std::vector<Tensor>{narrow(q, 3, 0, m.qk_nope_head_dim), q_rot}, 3);
  const Tensor k_all =
      cat(std::vector<Tensor>{k_nope, expand(k_rot, {batch, time, heads, m.qk_rope_head_dim})}, 3);
  const AttentionDropout dropout = nn::attention_dropout(
      attn_dropout_.get(), (wq ? wq : wq_b)->weight(), qk, {batch, heads, time, time});
  const Tensor y = scaled_dot_product_attention(transpose(q_all, 1, 2), transpose(k_all, 1, 2),
                                                transpose(v, 1, 2), /*is_causal=*/true,
                                                softmax_scale_, /*causal_offset=*/0,
                                                dropout);  // (B, H, T, v_head_dim)
  return (*wo)(reshape(transpose(y, 1, 2), {batch, time, -1}));
}

LlamaFeedForward::LlamaFeedForward(const LlamaConfig& config, uint64_t seed)
    : Module("LlamaFeedForward") {
  const int64_t hidden = config.ffn_hidden_dim();
  const auto linear = [](int64_t in, int64_t out, uint64_t s) {
    return std::make_shared<nn::Linear>(in, out, nn::LinearOptions{.bias = false, .seed = s});
  };
  w1 = register_module("w1", linear(config.dim, hidden, seed));
  w2 = register_module("w2", linear(hidden, config.dim, seed + 1));
  w3 = register_module("w3", linear(config.dim, hidden, seed + 2));
}

// silu_mul: silu(w1 x) * w3 x in one pass each way (tensor/ops_elementwise.h).
Tensor LlamaFeedForward::forward(const Tensor& x) { return (*w2)(silu_mul((*w1)(x), (*w3)(x))); }

LlamaBlock::LlamaBlock(const LlamaConfig& config, uint64_t seed,
                       std::shared_ptr<const RopeTables> rope, int64_t layer)
    : Module("LlamaBlock") {
  if (config.mla) {
    latent_attention = register_module(
        "attention", std::make_shared<LatentAttention>(config, seed, std::move(rope)));
  } else {
    attention = register_module("attention",
                                std::make_shared<LlamaAttention>(config, seed, std::move(rope)));
  }
  if (config.is_moe_layer(layer)) {
    moe = register_module("moe", std::make_shared<nn::MoE>(config.dim, *config.moe, seed + 8));
  } else {
    feed_forward =
        register_module("feed_forward", std::make_shared<LlamaFeedForward>(config, seed + 8));
  }
  attention_norm =
      register_module("attention_norm", std::make_shared<RMSNorm>(config.dim, config.norm_eps));
  ffn_norm = register_module("ffn_norm", std::make_shared<RMSNorm>(config.dim, config.norm_eps));
}

Tensor LlamaBlock::forward(const Tensor& x) {
  const Tensor normed_x = (*attention_norm)(x);
  const Tensor h = add(x, attention ? (*attention)(normed_x) : (*latent_attention)(normed_x));
  const Tensor normed = (*ffn_norm)(h);
  return add(h, moe ? (*moe)(normed) : (*feed_forward)(normed));
}

LlamaStage::LlamaStage(const LlamaConfig& config, uint64_t seed, StageRange range,
                       std::string type_name)
    : Module(std::move(type_name)),
      config_(config),
      range_(range),
      rope_(std::make_shared<const RopeTables>((config.validate(), rope_tables(config)))) {
  LOOM_CHECK(0 <= range.first_block && range.first_block <= range.end_block &&
                 range.end_block <= config.n_layers,
             "LlamaStage: blocks [{}, {}) are not a range of the model's {} layers",
             range.first_block, range.end_block, config.n_layers);
  // Every parameter's seed is a function of the model's seed and its place in the whole model,
  // so a stage initializes its parameters exactly as the whole model does.
  if (range.first || (range.last && config.tie_word_embeddings)) {
    tok_embeddings = register_module(
        "tok_embeddings",
        std::make_shared<nn::Embedding>(config.vocab_size, config.dim, seed, /*init_std=*/0.02));
  }
  if (range.has_blocks()) {
    auto list = register_module(
        "layers", std::make_shared<nn::ModuleList>(static_cast<size_t>(range.first_block)));
    for (int64_t i = range.first_block; i < range.end_block; ++i) {
      layers.push_back(list->append(std::make_shared<LlamaBlock>(
          config, seed + 16 * static_cast<uint64_t>(i + 1), rope_, i)));
    }
  }
  if (range.last) {
    norm = register_module("norm", std::make_shared<RMSNorm>(config.dim, config.norm_eps));
    if (config.tie_word_embeddings) {
      output = register_module("output", std::make_shared<TiedHead>(tok_embeddings));
    } else {
      output = register_module("output", std::make_shared<nn::Linear>(
                                             config.dim, config.vocab_size,
                                             nn::LinearOptions{.bias = false, .seed = seed + 7}));
    }
  }
}

Tensor LlamaStage::forward(const Tensor& input) {
  Tensor h = range_.first ? (*tok_embeddings)(input) : input;
  for (const auto& layer : layers) h = (*layer)(h);
  return range_.last ? (*output)((*norm)(h)) : h;
}

Llama::Llama(const LlamaConfig& config, uint64_t seed)
    : LlamaStage(config, seed, StageRange{0, config.n_layers, true, true}, "Llama") {}

Tensor Llama::loss(const Tensor& ids, const Tensor& targets) {
  return llama_loss((*this)(ids), targets);
}

Tensor llama_loss(const Tensor& logits, const Tensor& targets) {
  const Tensor flat_logits = reshape(logits, {-1, logits.size(-1)});
  const Tensor flat_targets = reshape(targets, {-1});
  return is_dtensor(logits) ? tp::loss_parallel_cross_entropy(flat_logits, flat_targets)
                            : cross_entropy(flat_logits, flat_targets);
}

}  // namespace loom::models
