// `./loom train` and `./loom plan`: train a model of any registered family (GPT, Llama) with data
// parallelism (DDP over dp_replicate, FSDP over dp_shard, HSDP with both), tensor parallelism
// (Megatron-style over tp) and pipeline parallelism (stages over pp), on text that needs no
// download; or plan the job without starting a rank.
//
//   ./loom train                         # tiny GPT, dp=2 x tp=2 = 4 ranks, GPL-3 text
//   ./loom train --dp 2 --tp 2 --pp 2    # 3-D: 8 ranks, 1F1B over pp = 2 microbatches
//   ./loom train --dp-shard 2 --tp 2     # FSDP x TP: 4 ranks
//   ./loom train --model llama-tiny --dp-shard -1 --tp 2 --nproc 8
//   ./loom plan --model llama3-8b --dp-shard 8 --tp 1 --seq-len 8192 --batch-size 16
//
// The job is library code: the families registered by //models:families, and train/job_main.h
// (the command line, the checks before anything starts, the plan, starting the ranks under
// loomrun, the runner). A program for another family is the same main with its registration
// linked in (tests/train/third_family/).
#include "train/job_main.h"

int main(int argc, char** argv) { return loom::train::job_main(argc, argv, "loom_train"); }
