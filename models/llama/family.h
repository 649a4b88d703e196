// The Llama family's ModelArgs for a config, for code that builds a Llama of its own sizes
// (tests, benchmarks): train::build_parallel_model(*models::llama_args(config), ...).
#pragma once

#include <memory>
#include <vector>

#include "models/family.h"
#include "models/llama/config.h"

namespace loom::models {

std::unique_ptr<ModelArgs> llama_args(const LlamaConfig& config);

// The parameters a Llama stage holds, from the config alone, with the dim torchtitan's plan
// (plans.h) shards over tp: q/k/v and w1/w3 rows, o and w2 columns, the embedding's and the
// head's vocabulary rows; norms replicated.
std::vector<PlannedParameter> llama_planned_parameters(const LlamaConfig& config,
                                                       const pipeline::StageRange& range);

}  // namespace loom::models
