// Schedule: what every rank of a pipeline does in one training step, as data — a list of
// actions per rank (action.h) — so it can be printed, validated (validate.h) and tested
// without running a model. Generators for GPipe, 1F1B and interleaved 1F1B are in schedules.h.
//
// Stage placement (placement.h): stage s lives on rank s % num_ranks (torch's "loop" placement:
// one stage per rank, or v per rank for interleaved 1F1B), or, for the V schedules (ZBV,
// DualPipeV), rank r holds stages r and 2p - 1 - r.
//
// Printed (str()), one line per rank, actions in execution order:
//   rank 0: F0s0 SEND_F0s0 F1s0 SEND_F1s0 RECV_B0s0 B0s0 ...
//   rank 1: RECV_F0s1 F0s1 B0s1 SEND_B0s1 ...
#pragma once

#include <string>
#include <vector>

#include "parallel/pipeline/action.h"
#include "parallel/pipeline/placement.h"

namespace loom::pipeline {

struct Schedule {
  std::string name;  // "GPipe", "1F1B", "Interleaved1F1B", or the caller's
  int num_ranks = 0;
  int num_stages = 0;
  int num_microbatches = 0;
  std::vector<std::vector<Action>> actions;  // actions[rank], in execution order
  StagePlacement placement = StagePlacement::kLoop;

  int rank_of_stage(int stage) const {
    return pipeline::rank_of_stage(placement, stage, num_ranks, num_stages);
  }
  // The stages rank `rank` holds, ascending.
  std::vector<int> stages_of_rank(int rank) const {
    return pipeline::stages_of_rank(placement, rank, num_ranks, num_stages);
  }
  // One line per rank (see above).
  std::string str() const;

  // A schedule from one line of compact actions per rank ("F0s0 SEND_F0s0 ..."); for tests
  // and hand-written schedules. Does not validate (call validate_schedule).
  static Schedule from_text(int num_ranks, int num_stages, int num_microbatches,
                            const std::vector<std::string>& rank_lines, std::string name = "custom",
                            StagePlacement placement = StagePlacement::kLoop);
};

// The most microbatches whose forward has run on `rank` (on any of its stages) and whose
// backward has not: how many microbatches' saved activations the rank holds at its peak.
// GPipe holds all m; 1F1B at most p on rank 0 (p - r on rank r).
int peak_microbatches_in_flight(const Schedule& schedule, int rank);

// A compute action's place on the schedule's timeline (simulate_timeline).
struct TimedAction {
  Action action;
  double start = 0;
  double end = 0;
};

// The schedule's computes on a timeline: F takes `tf`, a whole B `tb`, its weight part W `tw`
// and its input part I `tb - tw`; messages are free; each action starts when its rank is free
// and its input is computed. Per rank, in list order.
std::vector<std::vector<TimedAction>> simulate_timeline(const Schedule& schedule, double tf,
                                                        double tb, double tw);

// The timeline drawn per rank, one column per unit of time with F = I = W = 1 and B = 2: each
// action's name on its first column ("F3", "I3", "W3"; a ' marks a rank's second stage), "-"
// continuing it, "." idle. E.g. ZB-H1 on 2 ranks, 2 microbatches:
//   rank 0: F0  F1  .   I0  W0  I1  W1
//   rank 1: .   F0  I0  F1  I1  W0  W1
std::string timeline_str(const Schedule& schedule);

// The schedule's own idle share: a timeline of its compute actions with these durations (F `tf`,
// a whole B `tb`, its weight part W `tw` and its input part I `tb - tw`) and free messages, each
// action starting when its rank is free and its input is computed; 1 - busy / step, averaged
// over ranks. GPipe and 1F1B give (p-1)/(m+p-1), ZB-H1 (p-1)(F+I-W)/(m(F+B)+(p-1)(F+I-W)).
double simulated_idle_share(const Schedule& schedule, double tf, double tb, double tw);

}  // namespace loom::pipeline
