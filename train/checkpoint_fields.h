// The job's own fields in a distributed checkpoint's metadata (its `extra`): the model's sizes,
// the layout it was saved on, and what makes the run (its data, seed, batch and schedule), so a
// resume checks the model and the run and says when the layout changed.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/metadata.h"
#include "data/token_data.h"
#include "mesh/device_mesh.h"
#include "models/family.h"
#include "train/job_config.h"
#include "train/metrics_history.h"

namespace loom::train {

// The fields of run_fields besides the data that decide a run's batches: a resume with others
// trains on other batches (check_same_run), and two steps differing in them are two runs'.
inline constexpr const char* kRunBatchKeys[] = {"seed", "batch_size", "seq_len",
                                                "document_boundaries", "document_token"};

// The fields of run_fields a resume may change, with a warning each (as --steps and --lr): they
// change how the run trains from the saved step on, not its batches.
inline constexpr const char* kRunTrainingKeys[] = {"clip", "mixed_precision", "dropout",
                                                   "attn_dropout"};

// What makes a run besides its model and layout:
//   {"data": {"tokens": N, "vocab_size": V, "sha256": "...", "path": "..."}, "seed": S,
//    "batch_size": B, "seq_len": T, "steps": N, "lr": LR, "clip": C, "mixed_precision": "bf16",
//    "dropout": P, "attn_dropout": P}
// (the data by its content: a moved file is the same data).
nlohmann::json run_fields(const JobConfig& job, const data::TokenCorpus& data);

// {"model": `model` (ModelArgs::fields), "layout": "DeviceMesh(...)", "run": `run`, "metrics":
// `last` (the step's loss as rank 0 logged it: how a resume knows this run's --metrics-out lines),
// and "hf": `hf_token_settings` (models/hf/token_settings.h) unless it is empty}.
nlohmann::json job_checkpoint_fields(const nlohmann::json& model, const DeviceMesh& mesh,
                                     const nlohmann::json& run,
                                     const nlohmann::json& hf_token_settings,
                                     const SavedLoss& last);

// The "metrics" record job_checkpoint_fields writes; nullopt for a checkpoint of a Loom that did
// not record it.
std::optional<SavedLoss> saved_loss(const checkpoint::Metadata& metadata);

// Throws loom::Error naming the checkpoint and every size that differs ("n_layer 4 there, 2
// here") when `metadata` was saved from another model config. Fields only later Looms record
// (absent there) are not compared, so older checkpoints resume. `training` fields
// (ModelArgs::training_fields) may differ: a warning each, naming its flag.
std::vector<std::string> check_same_model(const checkpoint::Metadata& metadata,
                                          const nlohmann::json& model, const std::string& directory,
                                          const std::vector<models::TrainingField>& training = {});

// `fields` (ModelArgs::fields, or a checkpoint's record of them) without the `training` ones:
// what says what the model is, for comparing two runs' steps.
nlohmann::json without_training_fields(nlohmann::json fields,
                                       const std::vector<models::TrainingField>& training);

// Throws loom::Error naming the checkpoint and each difference when `metadata` was saved by a run
// on other data, another seed, another batch size or sequence length: continuing would train on
// other batches than the saved run's next ones. Returns warnings for what a run may change on
// purpose (more steps, another peak learning rate: the schedule continues from the saved step),
// and one when the checkpoint does not record its run (saved before runs were recorded).
std::vector<std::string> check_same_run(const checkpoint::Metadata& metadata,
                                        const nlohmann::json& run, const std::string& directory);

// The layout the checkpoint was saved on ("" when it does not say).
std::string saved_layout(const checkpoint::Metadata& metadata);

// The model the checkpoint in `directory` records (its family and sizes, extra.model, rebuilt by
// ModelFamily::from_fields): what consolidate writes and verify_checkpoint checks the entries
// against. Throws naming `what` (a flag; empty for a tool that names itself) and the directory
// when it records none (not a Loom job's).
std::unique_ptr<models::ModelArgs> saved_model(const checkpoint::Metadata& metadata,
                                               const std::string& directory, std::string_view what);

}  // namespace loom::train
