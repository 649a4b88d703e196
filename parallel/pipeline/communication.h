// Inserting the sends and receives into a compute-only schedule (torch.distributed.pipelining's
// _add_send_recv): the generators in schedules.h decide the order of forwards and backwards on
// each rank; this pass decides where each SEND and RECV goes.
#pragma once

#include <string>
#include <vector>

#include "parallel/pipeline/schedule.h"

namespace loom::pipeline {

// compute[r] lists rank r's F and B actions in order. Returns the schedule with:
//   - SEND_F right after every forward whose next stage is on another rank, SEND_B right after
//     every backward whose previous stage is on another rank;
//   - the matching RECV placed on the receiving rank at the point the send happens in a timed
//     simulation (each rank runs its computes in order, each starting once the rank is free and
//     its input computed; F 1, B 2, I and W 1 unit; messages free): right before the first
//     compute that starts at or after the send. Receives are so posted as early as they can
//     complete and no earlier — a receive that waits (the step's first activation across a
//     boundary waits for its shape, p2p.h) does not hold back computes the rank could run
//     before its data exists — and each rank's list is in the order of that timeline, which
//     makes the result deadlock-free with blocking receives and asynchronous sends (what
//     validate_schedule checks).
// Stages on the same rank hand tensors over locally: no SEND/RECV between them.
// Throws when the compute order can never run (e.g. a forward that needs an input no rank
// produces first), naming each rank's stuck action.
// `placement` says which rank holds each stage (placement.h).
Schedule add_communication(std::string name, int num_ranks, int num_stages, int num_microbatches,
                           const std::vector<std::vector<Action>>& compute,
                           StagePlacement placement = StagePlacement::kLoop);

}  // namespace loom::pipeline
