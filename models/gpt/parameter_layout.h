// The parameters a GPT stage holds, from its config alone (no tensor is made): what `loom plan`
// (train/job_plan.h) sizes a job from before any rank starts.
//
// Names are those of GPTStage::named_parameters() (the tied LM head's weight is wte's, listed
// once), shapes are whole (unsharded), and `tp_shard_dim` is the dim the GPT tensor-parallel
// plan (plans.h) shards over "tp": ColwiseParallel Linears (c_attn, c_fc) their weight's and
// bias's dim 0, RowwiseParallel Linears (c_proj) their weight's dim 1 (bias replicated), the
// vocab-parallel wte its dim 0 (uneven when tp does not divide the vocabulary), the rest
// replicated. //tests/train:job_plan_test builds the real model on every layout it plans and
// checks each parameter's name, shape and local shard against this list.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "models/family.h"
#include "models/gpt/config.h"
#include "parallel/pipeline/stage_range.h"
#include "tensor/shape.h"

namespace loom::models {

using pipeline::StageRange;

std::vector<PlannedParameter> gpt_planned_parameters(const GPTConfig& config,
                                                     const StageRange& range);

}  // namespace loom::models
