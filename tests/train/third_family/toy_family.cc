// A third model family that lives only here, to show what a family takes: "toy", a small
// pre-norm transformer unlike GPT and Llama — no position embeddings at all (causal attention
// alone tells positions apart), RMSNorm, a bias-free ReLU MLP, an untied head — with its model,
// its stages, its tensor-parallel plan, its loss and its registration. Nothing outside this
// folder knows it: the job's runner, flags, checkpoints and `loom plan` serve it through
// models/family.h, and toy_family_test.sh trains it on 1 rank, dp2 x tp2 and pp2.
#include <fmt/format.h>

#include "autograd/functions.h"
#include "autograd/functions_nn.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "models/family.h"
#include "models/llama/llama.h"  // RMSNorm
#include "nn/layers.h"
#include "nn/linear.h"
#include "parallel/tp/loss_parallel.h"
#include "parallel/tp/parallelize.h"

namespace toy {

using namespace loom;
using pipeline::StageRange;

struct ToyConfig {
  int64_t n_layer = 2, n_head = 4, n_embd = 64, context = 64, vocab_size = 256;
};

std::shared_ptr<nn::Linear> linear(int64_t in, int64_t out, uint64_t seed) {
  return std::make_shared<nn::Linear>(in, out, nn::LinearOptions{.bias = false, .seed = seed});
}

class Attention : public nn::Module {
 public:
  Attention(const ToyConfig& c, uint64_t seed)
      : Module("ToyAttention"), head_dim_(c.n_embd / c.n_head) {
    q = register_module("q", linear(c.n_embd, c.n_embd, seed));
    k = register_module("k", linear(c.n_embd, c.n_embd, seed + 1));
    v = register_module("v", linear(c.n_embd, c.n_embd, seed + 2));
    o = register_module("o", linear(c.n_embd, c.n_embd, seed + 3));
  }
  Tensor forward(const Tensor& x) override {
    const int64_t batch = x.size(0), time = x.size(1);
    // -1 heads: a tensor-parallel rank's local heads run the same code.
    const auto heads = [&](const Tensor& t) {
      return transpose(reshape(t, {batch, time, -1, head_dim_}), 1, 2);
    };
    const Tensor y = scaled_dot_product_attention(heads((*q)(x)), heads((*k)(x)), heads((*v)(x)),
                                                  /*is_causal=*/true);
    return (*o)(reshape(transpose(y, 1, 2), {batch, time, -1}));
  }
  std::shared_ptr<nn::Linear> q, k, v, o;

 private:
  int64_t head_dim_;
};

class Block : public nn::Module {
 public:
  Block(const ToyConfig& c, uint64_t seed) : Module("ToyBlock") {
    attn_norm = register_module("attn_norm", std::make_shared<models::RMSNorm>(c.n_embd, 1e-5));
    attn = register_module("attn", std::make_shared<Attention>(c, seed));
    mlp_norm = register_module("mlp_norm", std::make_shared<models::RMSNorm>(c.n_embd, 1e-5));
    up = register_module("up", linear(c.n_embd, 4 * c.n_embd, seed + 4));
    down = register_module("down", linear(4 * c.n_embd, c.n_embd, seed + 5));
  }
  Tensor forward(const Tensor& x) override {
    const Tensor h = add(x, (*attn)((*attn_norm)(x)));
    return add(h, (*down)(relu((*up)((*mlp_norm)(h)))));
  }
  std::shared_ptr<models::RMSNorm> attn_norm, mlp_norm;
  std::shared_ptr<Attention> attn;
  std::shared_ptr<nn::Linear> up, down;
};

// The blocks of `range`, the embedding on the first stage, the norm and head on the last; every
// parameter's seed is a function of its place in the whole model, so stages equal the whole.
class Stage : public nn::Module {
 public:
  Stage(const ToyConfig& c, uint64_t seed, StageRange range) : Module("ToyStage"), range_(range) {
    if (range.first) {
      embed = register_module("embed",
                              std::make_shared<nn::Embedding>(c.vocab_size, c.n_embd, seed, 0.02));
    }
    auto list = register_module(
        "blocks", std::make_shared<nn::ModuleList>(static_cast<size_t>(range.first_block)));
    for (int64_t i = range.first_block; i < range.end_block; ++i) {
      blocks.push_back(list->append(std::make_shared<Block>(c, seed + 8 * (i + 1))));
    }
    if (range.last) {
      norm = register_module("norm", std::make_shared<models::RMSNorm>(c.n_embd, 1e-5));
      head = register_module("head", linear(c.n_embd, c.vocab_size, seed + 7));
    }
  }
  Tensor forward(const Tensor& input) override {
    Tensor h = range_.first ? (*embed)(input) : input;
    for (const auto& block : blocks) h = (*block)(h);
    return range_.last ? (*head)((*norm)(h)) : h;
  }
  const StageRange& range() const { return range_; }
  std::shared_ptr<nn::Embedding> embed;
  std::vector<std::shared_ptr<Block>> blocks;
  std::shared_ptr<models::RMSNorm> norm;
  std::shared_ptr<nn::Linear> head;

 private:
  StageRange range_;
};

// Megatron's plan: q/k/v and up column-parallel, o and down row-parallel, the embedding's and
// the head's vocabulary sharded (loss parallel); with sequence parallelism the norms on
// sequence shards.
void parallelize(Stage& stage, std::shared_ptr<const DeviceMesh> tp_mesh, bool sp) {
  using namespace tp;
  const Placement stream = sp ? Placement(Shard(1)) : Placement(Replicate());
  ParallelizePlan plan;
  if (stage.range().first) {
    plan.push_back({"embed", std::make_shared<RowwiseParallel>(LayoutOptions{
                                 .input_layouts = Replicate(), .output_layouts = stream})});
  }
  if (stage.range().last) {
    plan.push_back(
        {"head",
         std::make_shared<ColwiseParallel>(LayoutOptions{
             .input_layouts = stream, .output_layouts = Shard(-1), .use_local_output = false})});
    if (sp) plan.push_back({"norm", std::make_shared<SequenceParallel>()});
  }
  if (stage.range().has_blocks()) {
    for (const char* name :
         {"blocks.*.attn.q", "blocks.*.attn.k", "blocks.*.attn.v", "blocks.*.up"}) {
      plan.push_back(
          {name, std::make_shared<ColwiseParallel>(LayoutOptions{.input_layouts = stream})});
    }
    for (const char* name : {"blocks.*.attn.o", "blocks.*.down"}) {
      plan.push_back(
          {name, std::make_shared<RowwiseParallel>(LayoutOptions{.output_layouts = stream})});
    }
    if (sp) {
      for (const char* name : {"blocks.*.attn_norm", "blocks.*.mlp_norm"}) {
        plan.push_back({name, std::make_shared<SequenceParallel>()});
      }
    }
  }
  parallelize_module(stage, std::move(tp_mesh), plan);
}

class ToyArgs : public models::ModelArgs {
 public:
  explicit ToyArgs(const ToyConfig& c) : c_(c) {}
  std::unique_ptr<models::ModelArgs> clone() const override {
    return std::make_unique<ToyArgs>(*this);
  }
  std::string family() const override { return "toy"; }
  std::string summary() const override {
    return fmt::format("Toy n_layer={} n_head={} n_embd={} vocab_size={} ({} parameters)",
                       c_.n_layer, c_.n_head, c_.n_embd, c_.vocab_size, parameter_count());
  }
  int64_t parameter_count() const override {
    const int64_t c = c_.n_embd;
    return 2 * c_.vocab_size * c + c_.n_layer * (12 * c * c + 2 * c) + c;
  }
  int64_t n_layers() const override { return c_.n_layer; }
  int64_t context() const override { return c_.context; }
  int64_t vocab_size() const override { return c_.vocab_size; }
  void set_vocab_size(int64_t vocab) override { c_.vocab_size = vocab; }
  nlohmann::json fields() const override {
    return {{"family", "toy"},     {"n_layer", c_.n_layer}, {"n_head", c_.n_head},
            {"n_embd", c_.n_embd}, {"context", c_.context}, {"vocab_size", c_.vocab_size}};
  }
  void validate() const override {
    LOOM_CHECK(c_.n_layer > 0 && c_.n_head > 0 && c_.n_embd % c_.n_head == 0,
               "toy: n_embd {} must split into n_head {} (and sizes be positive)", c_.n_embd,
               c_.n_head);
  }
  void validate_tp(int64_t tp) const override {
    LOOM_CHECK(c_.n_head % tp == 0, "toy: tp {} must divide n_head {}", tp, c_.n_head);
  }
  pipeline::PipelineModelSpec spec(uint64_t seed,
                                   const models::TPPlanOptions& plan) const override {
    pipeline::PipelineModelSpec spec;
    spec.name = "toy";
    spec.n_layers = c_.n_layer;
    spec.hidden_size = c_.n_embd;
    spec.vocab_size = c_.vocab_size;
    const ToyConfig c = c_;
    spec.make_stage = [c, seed](const StageRange& range) {
      return std::make_shared<Stage>(c, seed, range);
    };
    spec.parallelize = [sp = plan.sequence_parallel](nn::Module& stage,
                                                     std::shared_ptr<const DeviceMesh> tp) {
      parallelize(dynamic_cast<Stage&>(stage), std::move(tp), sp);
    };
    spec.blocks = [](nn::Module& stage) {
      std::vector<parallel::DataParallel::Block> out;
      const Stage& s = dynamic_cast<Stage&>(stage);
      for (size_t i = 0; i < s.blocks.size(); ++i) {
        out.push_back({fmt::format("blocks.{}", s.range().first_block + static_cast<int64_t>(i)),
                       s.blocks[i].get()});
      }
      return out;
    };
    spec.loss = [](const Tensor& logits, const Tensor& targets) {
      const Tensor flat = reshape(logits, {-1, logits.size(-1)});
      const Tensor flat_targets = reshape(targets, {-1});
      return is_dtensor(logits) ? tp::loss_parallel_cross_entropy(flat, flat_targets)
                                : cross_entropy(flat, flat_targets);
    };
    spec.parameter_names = [c](const StageRange& range) {
      DefaultDeviceGuard on_meta(Device::meta());  // names only: no values
      std::vector<std::string> names;
      for (const auto& [name, p] : Stage(c, 0, range).named_parameters()) names.push_back(name);
      return names;
    };
    return spec;
  }

 private:
  ToyConfig c_;
};

class ToyFamily : public models::ModelFamily {
 public:
  std::string name() const override { return "toy"; }
  std::vector<std::string> presets() const override { return {"toy-tiny"}; }
  bool vocab_from_data(const std::string&) const override { return true; }
  std::unique_ptr<models::ModelArgs> from_fields(const nlohmann::json& fields,
                                                 const std::string& where) const override {
    ToyConfig c;
    c.n_layer = models::int_field(fields, "n_layer", where);
    c.n_head = models::int_field(fields, "n_head", where);
    c.n_embd = models::int_field(fields, "n_embd", where);
    c.context = models::int_field(fields, "context", where);
    c.vocab_size = models::int_field(fields, "vocab_size", where);
    return std::make_unique<ToyArgs>(c);
  }
  std::unique_ptr<models::ModelArgs> from_preset(const std::string&,
                                                 const models::ModelSizes& sizes) const override {
    ToyConfig c;
    models::refuse_size(sizes.n_kv_heads, "--n-kv-heads", name());
    models::refuse_size(sizes.ffn_dim, "--ffn-dim", name());
    if (sizes.n_layer) c.n_layer = sizes.n_layer;
    if (sizes.n_head) c.n_head = sizes.n_head;
    if (sizes.n_embd) c.n_embd = sizes.n_embd;
    if (sizes.block_size) c.context = sizes.block_size;
    if (sizes.vocab_size) c.vocab_size = sizes.vocab_size;
    return std::make_unique<ToyArgs>(c);
  }
};

// The one registration line.
LOOM_REGISTER_MODEL_FAMILY(ToyFamily);

}  // namespace toy
