// Merging the ranks' flight-recorder dumps (comm/flight_recorder.h) into one report that names
// where they diverged (c10d's flight recorder analyzer, `torchfrtrace`).
//
// For each group (by name and ranks), the ranks' collectives are lined up by the group's count of
// collectives (every rank numbers them alike; send and recv are left out of the line-up, their
// numbers differing by rank). The first collective where the ranks disagree is reported:
//   - some ranks entered it and others never did: which ranks did not, and what each was doing
//     instead (its last operation on any group, with its state);
//   - ranks called different operations in that slot (kind, dtype or sizes): each rank's call;
//   - every rank entered it and it did not complete on some: which are still in it or failed.
// A group whose ranks all agree and completed everything is reported as consistent. Ranks whose
// dumps are missing are named as such.
#pragma once

#include <string>
#include <vector>

#include "comm/flight_recorder.h"

namespace loom::comm {

// One rank's dump.
struct RankDump {
  int rank = 0;
  std::string reason;  // what made it dump ("SIGTERM", "failure: ...")
  std::vector<GroupRecords> groups;
};

// Reads DIR/rank-*.json (written by flight_recorder::dump). A file it cannot read throws naming it;
// with `unreadable`, it is listed there instead ("'rank-0.json' is not a flight recorder dump:
// ..."), so one rank's empty or cut-off dump does not lose the others' report.
std::vector<RankDump> read_flight_dumps(const std::string& dir,
                                        std::vector<std::string>* unreadable = nullptr);

// The report (lines of text); `world_size` > 0 names ranks without a dump.
std::string flight_report(const std::vector<RankDump>& dumps, int world_size = 0);

}  // namespace loom::comm
