#include "train/parallel_model.h"

#include <fmt/ranges.h>

#include "autograd/engine.h"
#include "autograd/functions.h"
#include "autograd/grad_mode.h"
#include "autograd/sequence_context.h"
#include "base/error.h"
#include "dtensor/dtensor.h"
#include "models/hf/checkpoint.h"
#include "nn/auxiliary_loss.h"
#include "nn/batch_part.h"
#include "nn/moe/moe.h"
#include "optim/clip_grad.h"
#include "parallel/cp/context_parallel.h"
#include "parallel/data_parallel.h"
#include "tensor/ops.h"

namespace loom::train {

namespace {

// What both runners share: the family's Hugging Face adapter and the whole model's names.
class HFFiles {
 public:
  explicit HFFiles(const models::ModelArgs& args)
      : family_(args.family()),
        no_hf_format_(args.no_hf_format()),
        adapter_(args.hf_adapter()),
        names_(args.spec(0, {}).parameter_names(pipeline::StageRange::whole(args.n_layers()))) {}

  models::hf::LoadStats load(nn::Module& module, const std::string& path) const {
    return models::hf::load(module, adapter(), path, names_,
                            fmt::format("load ({} family)", family_));
  }
  // Every rank checks the format first, before any collective: all fail alike, none waits.
  void check_format() const { adapter(); }
  void save(const nn::Module& whole, const std::string& path, bool write) const {
    const auto parameters = models::hf::whole_parameters(whole, adapter(), write);  // collective
    if (write) models::hf::save(parameters, adapter(), path);
  }

 private:
  const models::hf::StateDictAdapter& adapter() const {
    LOOM_CHECK(adapter_ != nullptr, "{} (--init-from and --save need one)", no_hf_format_);
    return *adapter_;
  }

  std::string family_;
  std::string no_hf_format_;
  std::unique_ptr<models::hf::StateDictAdapter> adapter_;
  std::vector<std::string> names_;
};

// pp = 1: the whole model as one stage, run with gradient accumulation over micro-batches
// (data parallelism synchronizing on the last only).
class OneStageModel : public ParallelModel {
 public:
  OneStageModel(const models::ModelArgs& args, pipeline::PipelineModelSpec spec,
                std::shared_ptr<nn::Module> module,
                std::shared_ptr<parallel::DataParallel> data_parallel, int grad_accum,
                std::shared_ptr<SequenceContext> sequence, nn::BatchPart::Place data_share)
      : files_(args),
        num_experts_(args.num_experts()),
        spec_(std::move(spec)),
        module_(std::move(module)),
        data_parallel_(std::move(data_parallel)),
        grad_accum_(grad_accum),
        sequence_(std::move(sequence)),
        data_share_(data_share) {}

  void zero_grad() override { data_parallel_->zero_grad(); }

  double forward_backward(const Tensor& inputs, const Tensor& targets) override {
    SequenceContextGuard sharded(sequence_.get());  // context parallelism, when on
    // Dropout draws one forward's masks of the global batch at this rank's and micro-batch's
    // rows, from the same call counts in every micro-batch (nn/batch_part.h).
    const nn::BatchPart share(data_share_.index, data_share_.count);
    const nn::BatchParts micro_batches(nn::DropoutCalls::of(*module_), grad_accum_);
    double total = 0;
    for_each_micro_batch(
        inputs, targets, "forward_backward", [&](int m, const Tensor& x, const Tensor& y) {
          const nn::BatchPart micro_batch = micro_batches.part(m);
          // Auxiliary losses (MoE load balancing) enter as the micro-batch's loss does: / m.
          nn::AuxiliaryLossScale scale(1.0 / grad_accum_);
          Tensor loss = div(spec_.loss((*module_)(x), y), static_cast<double>(grad_accum_));
          data_parallel_->backward(m + 1 == grad_accum_, [&] { backward(loss); });
          total += loss.item<double>();
        });
    return total;
  }

  double evaluate(const Tensor& inputs, const Tensor& targets) override {
    NoGradGuard no_grad;
    SequenceContextGuard sharded(sequence_.get());
    double total = 0;
    for_each_micro_batch(inputs, targets, "evaluate", [&](int, const Tensor& x, const Tensor& y) {
      total += spec_.loss((*module_)(x), y).item<double>();
    });
    return total / grad_accum_;
  }

  double clip_grad_norm(double max_norm) override {
    return optim::clip_grad_norm_(module_->parameters(), max_norm);
  }
  std::vector<std::pair<std::string, Tensor>> named_parameters() const override {
    return module_->named_parameters();
  }
  std::vector<std::pair<std::string, nn::Module*>> named_modules() const override {
    return module_->named_modules();
  }
  Tensor logits(const Tensor& ids) override {
    NoGradGuard no_grad;
    const Tensor out = (*module_)(ids);
    return is_dtensor(out) ? full_tensor(out) : out;  // vocab-sharded under tp
  }
  models::hf::LoadStats load_hf(const std::string& path) override {
    return files_.load(*module_, path);
  }
  void save_hf(const std::string& path, bool write) override {
    files_.check_format();
    files_.save(*module_, path, write);
  }
  int64_t num_experts() const override { return num_experts_; }

 private:
  // fn(m, inputs, targets) of each of the grad_accum micro-batches, in order.
  template <typename Fn>
  void for_each_micro_batch(const Tensor& inputs, const Tensor& targets, std::string_view what,
                            Fn&& fn) {
    LOOM_CHECK(inputs.size(0) % grad_accum_ == 0,
               "{}: {} sequences do not split into grad_accum {} micro-batches", what,
               inputs.size(0), grad_accum_);
    const int64_t micro = inputs.size(0) / grad_accum_;
    for (int m = 0; m < grad_accum_; ++m) {
      fn(m, ops::narrow(inputs, 0, m * micro, micro), ops::narrow(targets, 0, m * micro, micro));
    }
  }

  HFFiles files_;
  int64_t num_experts_;
  pipeline::PipelineModelSpec spec_;
  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<parallel::DataParallel> data_parallel_;
  int grad_accum_;
  std::shared_ptr<SequenceContext> sequence_;  // context parallelism; null without
  nn::BatchPart::Place data_share_;            // this dp rank's share of the global batch
};

// pp > 1: this rank's stages, driven by the schedule; checkpoints load per stage and save the
// whole model gathered on the mesh's first rank.
class PipelinedModel : public ParallelModel {
 public:
  PipelinedModel(const models::ModelArgs& args, std::unique_ptr<pipeline::PipelineModel> model,
                 std::shared_ptr<SequenceContext> sequence, int grad_accum,
                 nn::BatchPart::Place data_share)
      : files_(args),
        args_(args.clone()),
        model_(std::move(model)),
        sequence_(std::move(sequence)),
        grad_accum_(grad_accum),
        data_share_(data_share) {}

  void zero_grad() override { model_->zero_grad(); }
  // grad_accum > 1: that many runs of the schedule, each on its share of the batch (in order),
  // data parallelism and tied copies synchronizing after the last; the loss is their mean.
  double forward_backward(const Tensor& inputs, const Tensor& targets) override {
    SequenceContextGuard sharded(sequence_.get());
    // As OneStageModel's; each stage places its microbatches within a share (stage.h).
    const nn::BatchPart data_share(data_share_.index, data_share_.count);
    if (grad_accum_ == 1) return model_->step(inputs, targets);
    LOOM_CHECK(inputs.size(0) % grad_accum_ == 0,
               "forward_backward: {} sequences do not split into grad_accum {} pipeline steps",
               inputs.size(0), grad_accum_);
    const int64_t share = inputs.size(0) / grad_accum_;
    std::vector<nn::Module*> stages;
    for (const auto& stage : model_->stages()) stages.push_back(stage.get());
    const nn::BatchParts shares(nn::DropoutCalls::of(stages), grad_accum_);
    double total = 0;
    for (int k = 0; k < grad_accum_; ++k) {
      const nn::BatchPart accumulated = shares.part(k);
      total += model_->step(ops::narrow(inputs, 0, k * share, share),
                            ops::narrow(targets, 0, k * share, share),
                            {.sync_gradients = k + 1 == grad_accum_,
                             .loss_scale = 1.0 / static_cast<double>(grad_accum_)});
    }
    return total / grad_accum_;
  }
  double evaluate(const Tensor& inputs, const Tensor& targets) override {
    SequenceContextGuard sharded(sequence_.get());
    if (grad_accum_ == 1 || inputs.size(0) % grad_accum_ != 0) {
      return model_->evaluate(inputs, targets);
    }
    // In the training step's microbatches: the grad_accum shares, each split by the schedule.
    const int64_t share = inputs.size(0) / grad_accum_;
    double total = 0;
    for (int k = 0; k < grad_accum_; ++k) {
      total += model_->evaluate(ops::narrow(inputs, 0, k * share, share),
                                ops::narrow(targets, 0, k * share, share));
    }
    return total / grad_accum_;
  }
  double clip_grad_norm(double max_norm) override { return model_->clip_grad_norm(max_norm); }
  std::vector<std::pair<std::string, Tensor>> named_parameters() const override {
    return model_->named_parameters();
  }
  std::vector<std::pair<std::string, nn::Module*>> named_modules() const override {
    std::vector<std::pair<std::string, nn::Module*>> out;
    for (const auto& stage : model_->stages()) {
      for (const auto& named : stage->named_modules()) out.push_back(named);
    }
    return out;
  }
  Tensor logits(const Tensor& ids) override { return model_->logits(ids); }
  models::hf::LoadStats load_hf(const std::string& path) override {
    models::hf::LoadStats total;
    for (const auto& stage : model_->stages()) {
      const models::hf::LoadStats stats = files_.load(*stage, path);
      total.bytes_read += stats.bytes_read;
      total.file_bytes = stats.file_bytes;  // the same file for every stage
    }
    return total;
  }
  void save_hf(const std::string& path, bool write) override {
    files_.check_format();
    // The whole model on the CPU (any values) on the first rank, which gathers every stage.
    std::shared_ptr<nn::Module> whole;
    if (model_->on_first_rank()) {
      whole = args_->whole_model();
    }
    model_->gather_whole(whole.get());  // collective
    if (whole) files_.save(*whole, path, write);
  }
  int64_t num_experts() const override { return args_->num_experts(); }

 private:
  HFFiles files_;
  std::unique_ptr<models::ModelArgs> args_;
  std::unique_ptr<pipeline::PipelineModel> model_;
  std::shared_ptr<SequenceContext> sequence_;  // context parallelism; null without
  int grad_accum_;
  nn::BatchPart::Place data_share_;  // this dp rank's share of the global batch
};

}  // namespace

std::vector<nn::MoE*> moe_layers(const ParallelModel& model) {
  std::vector<nn::MoE*> out;
  for (const auto& [name, module] : model.named_modules()) {
    if (auto* moe = dynamic_cast<nn::MoE*>(module)) out.push_back(moe);
  }
  return out;
}

EvalMode::EvalMode(const ParallelModel& model) {
  // Every mode is recorded before any is switched: Module::train recurses into the children, so
  // switching a parent first would record its children as already evaluating (and leave them so).
  for (const auto& [name, module] : model.named_modules()) {
    modes_.emplace_back(module, module->is_training());
  }
  for (auto& [module, training] : modes_) module->train(false);
}

EvalMode::~EvalMode() {
  // named_modules lists a parent before its children, so each child's own mode, set after its
  // parent's recursive one, is the one that stays.
  for (auto& [module, training] : modes_) module->train(training);
}

void check_expert_parallel(const models::ModelArgs& args, int64_t ep) {
  if (ep == 1) return;
  // A MoE config whose every layer is dense (--moe-dense-layers) routes nothing either.
  const bool moe_configured = args.fields().contains("moe");
  LOOM_CHECK(
      args.num_experts() > 0,
      "--ep {}: the model ({}) has no mixture-of-experts layers to split{}; use --ep 1, or a "
      "MoE model (--moe-experts, llama-moe-tiny)",
      ep, args.family(),
      moe_configured ? fmt::format(" (--moe-dense-layers keeps all {} layers dense: give fewer)",
                                   args.n_layers())
                     : "");
  LOOM_CHECK(args.num_experts() % ep == 0,
             "--ep {} does not divide the {} experts (--moe-experts); each rank holds experts / "
             "ep of them",
             ep, args.num_experts());
}

void check_context_parallel(const models::ModelArgs& args, int64_t cp) {
  LOOM_CHECK(cp == 1 || args.supports_context_parallel(),
             "--cp {}: the {} family does not take context parallelism (its ModelArgs does not "
             "declare supports_context_parallel: its positions must come from "
             "sequence_positions / sequence_rows and its attention from "
             "loom::scaled_dot_product_attention); use --cp 1",
             cp, args.family());
}

namespace {

// The model laid out (defined below); build_parallel_model adds the MoE layers' span.
std::unique_ptr<ParallelModel> build_parallel_model_layout(const models::ModelArgs& args,
                                                           uint64_t seed,
                                                           std::shared_ptr<const DeviceMesh> mesh,
                                                           const ParallelConfig& parallel);

// Every MoE layer's auxiliary loss over the batch of all ranks that average gradients with this
// one (nn::MoEDataParallel): their counts summed over the data-parallel groups.
void span_moe_over_data_parallel(const ParallelModel& model,
                                 std::shared_ptr<const DeviceMesh> mesh) {
  const auto groups = data_parallel_groups(*mesh);
  int64_t size = 1;
  for (const auto& group : groups) size *= group->size();
  if (size == 1) return;
  const auto sum = [mesh](const std::vector<double>& values) {
    const std::vector<int64_t> summed =
        sum_over_data_parallel(std::vector<int64_t>(values.begin(), values.end()), *mesh);
    return std::vector<double>(summed.begin(), summed.end());
  };
  for (nn::MoE* moe : moe_layers(model)) moe->set_data_parallel({sum, size});
}

}  // namespace

std::unique_ptr<ParallelModel> build_parallel_model(const models::ModelArgs& args, uint64_t seed,
                                                    std::shared_ptr<const DeviceMesh> mesh,
                                                    const ParallelConfig& parallel) {
  auto model = build_parallel_model_layout(args, seed, mesh, parallel);
  span_moe_over_data_parallel(*model, mesh);
  return model;
}

namespace {

std::unique_ptr<ParallelModel> build_parallel_model_layout(const models::ModelArgs& args,
                                                           uint64_t seed,
                                                           std::shared_ptr<const DeviceMesh> mesh,
                                                           const ParallelConfig& parallel) {
  LOOM_CHECK(mesh != nullptr, "build_parallel_model: the mesh is null");
  LOOM_CHECK(mesh->dim_names() == parallel.dims.names() && mesh->shape() == parallel.dims.sizes(),
             "build_parallel_model: the mesh {} is not the ({}) mesh of {}; build it with "
             "ParallelDims::build_mesh",
             mesh->str(), fmt::join(parallel.dims.names(), ", "), parallel.dims.str());
  args.validate();
  if (parallel.dims.tp > 1) args.validate_tp(parallel.dims.tp);
  check_context_parallel(args, parallel.dims.cp);
  check_expert_parallel(args, parallel.dims.ep);
  const parallel::ParallelMeshes meshes = parallel.dims.meshes_with_experts(mesh);
  models::TPPlanOptions tp_plan = parallel.tp_plan;
  tp_plan.expert_tensor_parallel = parallel.dims.ep == 1;  // ep splits the experts instead
  pipeline::PipelineModelSpec spec = args.spec(seed, tp_plan);
  // Context parallelism: every forward and backward runs under it (autograd/sequence_context.h).
  std::shared_ptr<SequenceContext> sequence;
  if (parallel.dims.cp > 1) {
    sequence = std::make_shared<parallel::cp::ContextParallel>(meshes.cp, parallel.cp);
  }
  // This rank's share of the global batch, as local_batch cuts it: dropout's masks are placed
  // at its rows.
  const nn::BatchPart::Place data_share{data_parallel_rank(*mesh), data_parallel_size(*mesh)};
  if (parallel.dims.pp > 1) {
    auto model = std::make_unique<pipeline::PipelineModel>(
        std::move(spec), meshes,
        pipeline::PipelineModelOptions{.schedule = parallel.pipeline,
                                       .mixed_precision = parallel.mixed_precision,
                                       .activation_checkpoint = parallel.activation_checkpoint,
                                       .meta_init = parallel.meta_init});
    return std::make_unique<PipelinedModel>(args, std::move(model), std::move(sequence),
                                            parallel.grad_accum, data_share);
  }
  parallel::BuiltStage built = parallel::build_stage(
      {.make = [&] { return spec.make_stage(pipeline::StageRange::whole(args.n_layers())); },
       .blocks = spec.blocks,
       .parallelize = spec.parallelize},
      meshes,
      {.activation_checkpoint = parallel.activation_checkpoint,
       .mixed_precision = parallel.mixed_precision,
       .meta_init = parallel.meta_init});
  return std::make_unique<OneStageModel>(args, std::move(spec), std::move(built.module),
                                         std::move(built.data_parallel), parallel.grad_accum,
                                         std::move(sequence), data_share);
}

}  // namespace

}  // namespace loom::train
