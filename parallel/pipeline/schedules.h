// Schedule generators: GPipe, 1F1B and interleaved 1F1B, with the orders torch.distributed.
// pipelining (and Megatron-LM) use. Each returns a complete schedule (compute order from the
// generator, sends and receives from add_communication) for p = num_ranks ranks and
// m = num_microbatches microbatches; stage s lives on rank s % p, except under ZBV and DualPipeV,
// whose two stages per rank are placed in a V (placement.h).
#pragma once

#include <string>

#include "parallel/pipeline/schedule.h"

namespace loom::pipeline {

// GPipe: p stages (one per rank). Every rank runs all m forwards, then all m backwards in
// microbatch order. Holds m microbatches' activations at its peak; bubble (p-1)/(m+p-1).
Schedule gpipe_schedule(int num_ranks, int num_microbatches);

// 1F1B (PipeDream-flush): p stages. Rank r warms up with min(p-1-r, m) forwards, then
// alternates one forward and one backward, then drains the remaining backwards. Same bubble as
// GPipe, but rank r holds at most p-r microbatches' activations at once.
Schedule one_f_one_b_schedule(int num_ranks, int num_microbatches);

// Interleaved 1F1B (Megatron-LM; torch's ScheduleInterleaved1F1B): p*v stages, rank r holds
// stages r, r+p, ..., r+(v-1)p. Microbatches go through a rank's stages in max(1, m / p)
// rounds of r = m / rounds (p when m % p == 0): the k-th forward on a rank is on its local
// stage (k / r) % v, the k-th backward on local stage v-1 - (k / r) % v. Rank r warms up with
// min((v-1)r + 2(p-1-r), m v) forwards. Bubble (p-1)/(v m) of the ideal time (v times smaller
// than 1F1B's) when m is a multiple of p, for more messages. Requires m % rounds == 0 (equal
// rounds, torch's rule: m = 6 or 2 on 4 ranks, not 9); throws naming m and p otherwise.
Schedule interleaved_one_f_one_b_schedule(int num_ranks, int num_microbatches, int stages_per_rank);

// ZB-H1 (zero-bubble, Qi et al. 2023; torch's ZB1P with one stage per rank): 1F1B with each
// backward split into I (the input's gradient) and W (the weights', autograd::backward_input),
// rank r running each W r microbatches after its I, so the W's fill the idle slots the
// gradients' way back leaves. Every rank holds at most p microbatches (1F1B's peak, on rank 0).
Schedule zb_h1_schedule(int num_ranks, int num_microbatches);

// ZBV (the zero-bubble V schedule; torch's ScheduleZBVZeroBubble): 2p stages in a V, rank r
// holding r and 2p - 1 - r, every backward split into I and W. With F = I = W its bubble is
// (near) zero once m >= 2p, for 1F1B's peak activation memory (2p half-size stages' microbatches
// on rank 0, as 1F1B's p whole ones). Any m >= 1 runs (fewer than 2p - 1 leave bubbles).
Schedule zbv_schedule(int num_ranks, int num_microbatches);

// DualPipeV (DeepSeek's DualPipe in a V; torch's ScheduleDualPipeV): the same V placement, its
// main phase pairing a forward on one stage with a whole backward on the other (the pairs whose
// compute and all-to-alls overlap on GPUs; run in order here), split backwards only in warm-up
// and cool-down. Needs m >= 2p (throws naming both otherwise).
Schedule dualpipev_schedule(int num_ranks, int num_microbatches);

// Stages per rank a named schedule places: 2 for "zbv" and "dualpipev", `virtual_stages` for the
// others (1 unless interleaved; schedule_by_name refuses anything else).
int stages_per_rank_of(const std::string& name, int virtual_stages);
// Where a named schedule puts its stages: a V for "zbv" and "dualpipev", a loop for the others.
StagePlacement placement_of(const std::string& name);

// The schedule a command line names: "gpipe", "1f1b", "zb-h1", "interleaved" (which takes
// stages_per_rank; the others need it to be 1), "zbv" or "dualpipev" (two stages per rank:
// stages_per_rank 1, the default, or 2). Throws naming the choices otherwise.
Schedule schedule_by_name(const std::string& name, int num_ranks, int num_microbatches,
                          int stages_per_rank = 1);

}  // namespace loom::pipeline
