// The GPT family's ModelArgs for a config, for code that builds a GPT of its own sizes
// (tests, benchmarks): train::build_parallel_model(*models::gpt_args(config), ...).
#pragma once

#include <memory>

#include "models/family.h"
#include "models/gpt/config.h"

namespace loom::models {

std::unique_ptr<ModelArgs> gpt_args(const GPTConfig& config);

}  // namespace loom::models
