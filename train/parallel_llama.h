// A Llama laid out over the job's (pp, dp_replicate, dp_shard, tp) mesh, as the training loop
// sees it: torchtitan's parallelize_llama over "tp" (models/llama/plans.h), then data
// parallelism (DDP, FSDP per layer then the root, or HSDP: models/data_parallel.h) with mixed
// precision, run with gradient accumulation; with pp > 1, this rank's pipeline stages
// (models/llama/pipeline.h), each laid out so, driven by the pipeline schedule. --save writes
// Hugging Face LlamaForCausalLM files (a pipeline gathers the whole model on the first rank).
#pragma once

#include <memory>

#include "mesh/device_mesh.h"
#include "models/llama/config.h"
#include "train/parallel_gpt.h"

namespace loom::train {

std::unique_ptr<ParallelModel> build_parallel_llama(const models::LlamaConfig& config,
                                                    uint64_t seed,
                                                    std::shared_ptr<const DeviceMesh> mesh,
                                                    const ParallelConfig& parallel);

}  // namespace loom::train
