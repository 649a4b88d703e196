// One training run of a tiny GPT under any parallel layout, for the equivalence tests: 4 AdamW
// steps (gradient norm clipped) on fixed global batches, returning the global losses, gradient
// norms, final parameters and the last step's gradients (gathered), which must not depend on the
// layout (tolerances in expect_same).
// A run on a mesh is the job's own code (train/: build_parallel_model and Trainer, as loom_train
// runs it); the one-rank reference is a plain loop written independently of it.
// The run lives on the mesh's device (DeviceMesh::device()): the CPU over Gloo
// (gpt_equivalence_test), the GPU over NCCL (gpt_cuda_equivalence_test); without a mesh, one CPU
// rank, the reference.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "data/token_corpus.h"
#include "mesh/device_mesh.h"
#include "models/gpt/config.h"
#include "models/gpt/plans.h"
#include "train/parallel_dims.h"
#include "train/parallel_model.h"
#include "train/trainer.h"

namespace loom::models::gpt_run {

inline constexpr int kSteps = 4;
inline constexpr int64_t kGlobalBatch = 8, kSeqLen = 32;
inline constexpr double kClip =
    0.5;  // below the tiny model's early gradient norms, so clipping acts

// 2 layers, 4 heads, width 32, and an odd vocabulary (257, as GPT-2's 50257), so the
// vocab-parallel embedding and the loss-parallel head split it unevenly. `dropout`: in training,
// on embeddings, residual branches and attention probabilities alike (GPT-2's three pdrops).
GPTConfig config(double dropout = 0.0);

struct Result {
  std::vector<double> losses;
  std::vector<double> grad_norms;  // before clipping
  std::vector<double> lrs;         // each step's learning rate
  std::map<std::string, std::vector<double>> params;
  // The last step's gradients (clipped), gathered whole.
  std::map<std::string, std::vector<double>> grads;
  // Every step's (record_step with the model): what AdamW saw at each step.
  std::vector<std::map<std::string, std::vector<double>>> step_grads;
  // How each parameter is held on the mesh: "DeviceMesh(tp=2, dp_shard=2, cpu) [S(0), S(0)]",
  // or "plain".
  std::map<std::string, std::string> layouts;
};

// A step's loss and gradient norm appended to `result`; and the final parameters and gradients
// `model` holds on this rank, gathered whole (DTensors' full values), with their layouts.
// With `model`, the step's gradients too (gathered whole: collective, every rank calls it).
void record_step(Result& result, const train::StepResult& step,
                 const train::ParallelModel* model = nullptr);
void record_final_state(Result& result, const train::ParallelModel& model);

// How the run is parallelized beyond the mesh's degrees (train::ParallelConfig's fields):
// gradient accumulation (without pipelining), the TP plan, and the pipeline's schedule.
struct Layout {
  int accum = 1;
  GPTPlanOptions plan = {};
  std::string schedule = "1f1b";
  int microbatches = 1;
  int virtual_stages = 1;
  parallel::ActivationCheckpointing activation_checkpoint = {};
  double dropout = 0.0;  // config(dropout); the reference to match is then reference(dropout)
};

// One training run on `mesh` with `layout`; every rank returns the global losses and gradient
// norms, and the full final values of the parameters it holds (all of them without pipeline
// parallelism; its stages' with it).
Result train(std::shared_ptr<const DeviceMesh> mesh, Layout layout = {});

// The one-rank reference run (train(nullptr)), computed once per test binary; with `dropout`,
// of config(dropout) (train(nullptr, {.dropout = dropout}), once per value).
const Result& reference(double dropout = 0.0);

// A run under `layout` and the run it must match (the one-rank reference).
// A repetitive byte text the models learn in a few steps (the pangrams, 40 times), as tokens of a
// `vocab_size` vocabulary (256 bytes, or 257 so that no tp divides it).
data::TokenCorpus fox_corpus(int64_t vocab_size);

struct Runs {
  Result actual;
  Result expected;
  std::string layout;
  // The parameters' tolerance, a share of the model's largest parameter magnitude. A caller that
  // raises it says why: a layout that rounds its gradients differently from one rank (not
  // merely in another order) moves the parameters of near-zero gradients further under AdamW.
  double param_rtol = 1e-5;
  // Whether to compare the parameters at all. A caller that turns it off says why: a run where
  // some element's gradient is at f32 noise level near AdamW's eps in a step, so that the
  // optimizer turns that noise into a visible step; its losses, gradient norms and gradients,
  // which the computation under test decides, are compared still.
  bool compare_params = true;
};
// Losses and gradient norms within 1e-5 relative, gradients within 1e-5 of the largest
// gradient, parameters within param_rtol of the model's largest parameter magnitude plus what
// AdamW makes of each element's gradient difference (why, in the .cc); checks from
// tests/testing/tensor_checks.h.
void expect_same(const Runs& runs);

// The job's ("pp", "dp_replicate", "dp_shard", "tp") mesh of `dims` over every rank of `pg`
// (train::ParallelDims::build_mesh); the short form takes DDP's dp (dp_replicate).
std::shared_ptr<const DeviceMesh> mesh_of(comm::ProcessGroup& pg, const train::ParallelDims& dims);
std::shared_ptr<const DeviceMesh> mesh_of(comm::ProcessGroup& pg, int64_t dp, int64_t tp,
                                          int64_t pp = 1);

}  // namespace loom::models::gpt_run
