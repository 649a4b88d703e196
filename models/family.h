// A model family (torchtitan's TrainSpec) and one model of it with its sizes fixed
// (torchtitan's ModelArgs): everything a job does with a model goes through these two
// interfaces, so the job, `loom plan`, checkpoints and the Hugging Face loader are written once
// for every family. A family registers itself with one line:
//
//   LOOM_REGISTER_MODEL_FAMILY(GPTFamily);   // in models/gpt/family.cc (alwayslink)
//
// and `--model NAME` finds it by one of its presets ("tiny", "llama3-8b"); an unknown name lists
// every registered family's presets. A family provides:
//   - its presets and sizes from flags (ModelSizes), or from a Hugging Face config.json;
//   - per model (ModelArgs): the summary, parameter count, context and vocabulary, the fields a
//     checkpoint records (and the model back from them: ModelFamily::from_fields), its checks
//     (sizes; what tp must divide), and its parts for every layout (pipeline::PipelineModelSpec: a
//     stage of any StageRange — the whole model is the stage holding everything — its TP plan, its
//     blocks, its loss), its Hugging Face adapter, and optionally its parameters from the config
//     alone (for `loom plan`'s model-state table).
// ARCHITECTURE.md, "How to add a model family", lists the files a new family touches.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "models/hf/config_json.h"
#include "models/hf/state_dict_adapter.h"
#include "models/tp_plan_options.h"
#include "parallel/pipeline/pipeline_model.h"
#include "parallel/pipeline/stage_range.h"
#include "tensor/shape.h"

namespace loom::models {

// A mixture of experts' settings a job may give (--moe-*, the [model] section's moe_* keys); a
// value "not given" (0, -1 or empty, as commented) keeps the preset's. --moe-experts on a preset
// without MoE turns it on, with each expert as wide as the dense feed-forward, top-2, softmax.
struct MoESizes {
  int64_t experts = 0;          // 0: not given
  int64_t top_k = 0;            // 0: not given
  int64_t hidden_dim = 0;       // 0: not given
  int64_t shared_experts = -1;  // -1: not given
  std::string score_func;       // empty: not given
  int64_t route_norm = -1;      // the top-k weights normalized: 1, not: 0; -1: not given
  double aux_loss_coeff = -1;   // below 0: not given
  double bias_update_rate = -1;
  double capacity_factor = -1;
  int64_t dense_layers = -1;  // -1: not given
  // The flag of the first setting given ("--moe-top-k"), or empty when none is.
  std::string first_given() const;
};

// Sizes a job may give any family (flags, a job file's [model] section); 0 keeps the preset's
// (or the checkpoint's, which they must then equal).
struct ModelSizes {
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_kv_heads = 0;  // grouped-query attention's key/value heads
  int64_t n_embd = 0;      // the width (Llama's dim)
  int64_t ffn_dim = 0;     // the feed-forward width
  int64_t block_size = 0;  // the context: the most tokens a sequence may have
  int64_t vocab_size = 0;
  double rope_theta = 0;
  // Training dropout (0: off); a family without it refuses a non-zero value.
  double dropout = 0;       // embeddings and residual branches
  double attn_dropout = 0;  // attention probabilities
  MoESizes moe;
};

// A parameter a stage holds, from the config alone (no tensor is made): its whole shape and the
// dim its family's TP plan shards over tp.
struct PlannedParameter {
  std::string name;
  Shape shape;
  std::optional<int64_t> tp_shard_dim;  // none: replicated over tp
  int64_t block = -1;                   // the block holding it (FSDP's unit); -1: the root's
  // A MoE's experts (dim 0 the experts): split over ep by expert parallelism, outside FSDP.
  bool expert = false;
};

// An entry of ModelArgs::fields() that a resume may change: its JSON pointer
// ("/moe/aux_loss_coeff") and the flag that sets it ("--moe-aux-loss-coeff").
struct TrainingField {
  std::string pointer;
  std::string flag;
  bool operator==(const TrainingField&) const = default;
};

class ModelArgs {
 public:
  virtual ~ModelArgs() = default;
  virtual std::unique_ptr<ModelArgs> clone() const = 0;

  virtual std::string family() const = 0;   // the registered name: "gpt"
  virtual std::string summary() const = 0;  // "GPT n_layer=2 n_head=4 ... (120576 parameters)"
  virtual int64_t parameter_count() const = 0;
  virtual int64_t n_layers() const = 0;
  virtual int64_t context() const = 0;  // the most tokens a sequence may have
  virtual int64_t vocab_size() const = 0;
  virtual void set_vocab_size(int64_t vocab_size) = 0;
  // The sizes a checkpoint records ({"family": "llama", "dim": 64, ...}): a resume compares them.
  virtual nlohmann::json fields() const = 0;
  // The entries of fields() that say how the model trains, not what it is: a resume may change
  // them (a warning names each change), as it may the learning rate. Every other field must be
  // the checkpoint's.
  virtual std::vector<TrainingField> training_fields() const { return {}; }
  // Throws loom::Error naming the size when the model cannot be built.
  virtual void validate() const = 0;
  // Throws loom::Error naming the sizes a tp degree must divide (heads, kv heads) when `tp` does
  // not divide them: before any rank starts.
  virtual void validate_tp(int64_t tp) const = 0;
  // Whether the model runs on a sequence sharded over cp ranks (parallel/cp): its attention goes
  // through loom::scaled_dot_product_attention and its positions (if any) come from
  // sequence_positions / sequence_rows (autograd/sequence_context.h). A family says so; the
  // default is no, so a family computing positions its own way is refused by name, not trained
  // silently wrong.
  virtual bool supports_context_parallel() const { return false; }
  // The routed experts of the model's MoE layers (0: a dense model): what --ep must divide.
  virtual int64_t num_experts() const { return 0; }
  // What in the model's math depends on how a step is split over microbatches and ranks (a
  // mixture of experts' balancing loss and capacity), in words for `loom plan`; empty: nothing
  // (every layout trains as one rank does).
  virtual std::string layout_dependence() const { return ""; }
  // The attention's (query heads, key/value heads) per layer, as loom::scaled_dot_product_attention
  // gets them on one rank: what tp and Ulysses context parallelism split. {0, 0}: not stated
  // (the job then leaves the split to the attention, which names it when it runs).
  virtual std::pair<int64_t, int64_t> attention_heads() const { return {0, 0}; }
  // The model's parts for every layout (one rank or many, one stage or a pipeline), initialized
  // from `seed` the same on every layout.
  virtual pipeline::PipelineModelSpec spec(uint64_t seed, const TPPlanOptions& plan) const = 0;
  // The whole model (every layer in one stage, no parallel plan) from `seed`, on the current
  // default device (under a meta DefaultDeviceGuard: shapes only): what a job's checks, a
  // consolidation and a gathered save build.
  std::shared_ptr<nn::Module> whole_model(uint64_t seed = 0) const;
  // How its parameters appear in Hugging Face checkpoints; null when the family has no such
  // format (--init-from and --save are then refused naming the family).
  virtual std::unique_ptr<hf::StateDictAdapter> hf_adapter() const { return nullptr; }
  // Why hf_adapter() is null, for the error that refuses --init-from, --save or consolidate.
  virtual std::string no_hf_format() const {
    return fmt::format("the {} family has no Hugging Face checkpoint format", family());
  }
  // The parameters a stage holds, from the config alone; empty when the family does not list
  // them (`loom plan` then sizes model states from its traced step only).
  virtual std::vector<PlannedParameter> planned_parameters(
      const pipeline::StageRange& range) const {
    (void)range;
    return {};
  }
};

class ModelFamily {
 public:
  virtual ~ModelFamily() = default;
  virtual std::string name() const = 0;  // "gpt"
  // Its model names for --model, the default first.
  virtual std::vector<std::string> presets() const = 0;
  // Whether the preset takes the data's vocabulary (test sizes) rather than its own (a published
  // model's, which the data must fit).
  virtual bool vocab_from_data(const std::string& preset) const = 0;
  // The preset with `sizes` applied (0: the preset's). A size the family does not have
  // (n_kv_heads on GPT) throws naming its flag.
  virtual std::unique_ptr<ModelArgs> from_preset(const std::string& preset,
                                                 const ModelSizes& sizes) const = 0;
  // The model whose fields (ModelArgs::fields) a checkpoint recorded, e.g. to consolidate it;
  // throws naming `where` and the field when one is missing or of another type.
  virtual std::unique_ptr<ModelArgs> from_fields(const nlohmann::json& fields,
                                                 const std::string& where) const = 0;
  // The model a Hugging Face config.json describes; `sizes` given must agree with it (a
  // contradiction names the flag and the file's key). Null when the family reads no such file.
  virtual std::unique_ptr<ModelArgs> from_hf_config(const hf::ConfigJson& json,
                                                    const ModelSizes& sizes) const {
    (void)json;
    (void)sizes;
    return nullptr;
  }
  // The config.json "model_type"s from_hf_config reads ({"llama", "mixtral", "deepseek_v3"});
  // none when it reads none. A job whose --init-from names one and no --model takes this
  // family's default preset. By default the one hf_model_type() names (a family of one type
  // may override either).
  virtual std::vector<std::string> hf_model_types() const {
    std::string type = hf_model_type();
    if (type.empty()) return {};
    return {std::move(type)};
  }
  virtual std::string hf_model_type() const { return ""; }
  // Whether its models take ModelSizes' dropout (--dropout: embeddings and residual branches)
  // and attn_dropout (--attn-dropout: attention probabilities; by default as dropout). A family
  // that does not is refused by name when it is given, before anything is built, so no family
  // trains without the dropout a job asked for.
  virtual bool takes_dropout() const { return false; }
  virtual bool takes_attention_dropout() const { return takes_dropout(); }
};

// The registry. register_model_family throws naming a family or preset registered twice.
void register_model_family(std::unique_ptr<ModelFamily> family);
std::vector<const ModelFamily*> model_families();
// The family with `model` among its presets; throws listing every family's presets otherwise.
const ModelFamily& family_of_model(const std::string& model);
// "gpt: tiny, small, gpt3-175b; llama: llama-tiny, llama3-8b, llama3-70b".
std::string registered_models();
// The family whose hf_model_types hold `model_type`; throws naming `where`, the type and every
// registered family's type otherwise.
const ModelFamily& family_of_hf_model_type(const std::string& model_type, const std::string& where);
// The family a checkpoint's model fields name ("family"; a GPT's recorded none before Looms
// recorded it); throws naming `where` and the registered families otherwise.
const ModelFamily& family_of_fields(const nlohmann::json& fields, const std::string& where);
// A recorded field as an integer or a number; throws naming `where` and the field otherwise.
int64_t int_field(const nlohmann::json& fields, const char* key, const std::string& where);
double number_field(const nlohmann::json& fields, const char* key, const std::string& where);

// A flag that must agree with a checkpoint's config.json: its value (0: not given), its flag and
// the file's key and value. Throws naming all three on the first that differs.
struct SizeAgreement {
  int64_t flag_value;
  const char* flag;  // "--n-layer"
  const char* key;   // "num_hidden_layers"
  int64_t file_value;
};
void check_sizes_agree(const hf::ConfigJson& json, const std::vector<SizeAgreement>& sizes);
// Throws naming `flag` when it was given (nonzero) to a family without such a size.
void refuse_size(int64_t value, const char* flag, const std::string& family);
// Throws naming --dropout or --attn-dropout when given to a family that does not take it
// (ModelFamily::takes_dropout, takes_attention_dropout; the job checks it before building the
// model).
void refuse_dropout(const ModelSizes& sizes, const ModelFamily& family);
// `p`, checked to be a dropout probability in [0, 1); throws naming `flag` otherwise.
double dropout_probability(double p, const char* flag);

namespace detail {
struct FamilyRegistrar {
  explicit FamilyRegistrar(std::unique_ptr<ModelFamily> family);
};
}  // namespace detail

}  // namespace loom::models

// Registers a ModelFamily subclass (default-constructible) at static initialization. The
// library holding it must be linked whole (Bazel: alwayslink = True).
#define LOOM_REGISTER_MODEL_FAMILY(Type)                                              \
  static const ::loom::models::detail::FamilyRegistrar loom_family_registrar_##Type { \
    std::make_unique<Type>()                                                          \
  }
