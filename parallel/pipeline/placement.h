// Which pp rank holds which pipeline stage. Two placements, torch.distributed.pipelining's
// "loop" and "v" styles:
//   kLoop: stage s on rank s % p. One stage per rank (GPipe, 1F1B, ZB-H1) or v per rank,
//          r, r + p, r + 2p, ... (interleaved 1F1B).
//   kV:    two stages per rank, down then back up: rank r holds stages r and 2p - 1 - r (ZBV,
//          DualPipeV). The last rank holds the middle two stages (p - 1 and p), which hand their
//          tensors over locally; rank 0 holds the first stage and the last, so the loss is
//          computed on the rank that reads the inputs.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace loom::pipeline {

enum class StagePlacement { kLoop, kV };

// "loop" or "v".
std::string_view placement_name(StagePlacement placement);

// The rank holding `stage` of `num_stages` over `num_ranks` ranks (kV needs num_stages =
// 2 num_ranks; callers check that where a schedule is built).
int rank_of_stage(StagePlacement placement, int stage, int num_ranks, int num_stages);

// The stages `rank` holds, ascending.
std::vector<int> stages_of_rank(StagePlacement placement, int rank, int num_ranks, int num_stages);

// The rule in words, for errors: "stage s on rank s % 4", "stage s on rank s for s < 4 and on
// rank 7 - s after (a V)".
std::string placement_rule(StagePlacement placement, int num_ranks);

}  // namespace loom::pipeline
