// The flight recorder: the ring keeps a group's last operations with their states; ranks made to
// diverge on purpose on Gloo (one skips a collective, one calls another size, one hangs past the
// timeout) with 2, 3 and 4 ranks dump their rings on the first failure, and the merged report
// names the operation and the ranks each time.
#include "comm/flight_recorder.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "base/error.h"
#include "comm/flight_report.h"
#include "comm/testing/multi_rank.h"
#include "tensor/ops.h"

namespace loom::comm {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(FlightRecorderTest, TheRingKeepsTheLastOperationsAndTheirStates) {
  FlightRecorder recorder("g", 1, 2, {5, 7}, 3);
  EXPECT_EQ(recorder.global_rank(), 7);
  std::vector<uint64_t> handles;
  for (uint64_t s = 0; s < 5; ++s) {
    handles.push_back(recorder.record(s, static_cast<int64_t>(s), CollectiveKind::kAllReduce,
                                      "n " + std::to_string(s)));
  }
  recorder.finish(handles[0], nullptr);  // evicted: ignored
  recorder.finish(handles[3], nullptr);
  recorder.finish(handles[4], std::make_exception_ptr(Error("boom")));
  const GroupRecords snapshot = recorder.snapshot();
  EXPECT_EQ(snapshot.name, "g");
  EXPECT_EQ(snapshot.global_ranks, (std::vector<int>{5, 7}));
  ASSERT_EQ(snapshot.records.size(), 3u);
  EXPECT_EQ(snapshot.records[0].sequence, 2u);
  EXPECT_EQ(snapshot.records[0].state, RecordState::kPending);
  EXPECT_EQ(snapshot.records[1].state, RecordState::kCompleted);
  EXPECT_EQ(snapshot.records[2].state, RecordState::kFailed);
  EXPECT_EQ(snapshot.records[2].error, "boom");
  EXPECT_EQ(snapshot.records[2].detail, "n 4");
}

// Dumps at once from several threads (a signal's, a failure's, the exit's) take turns: every one
// writes its file whole, none fails on another's temporary file.
TEST(FlightRecorderTest, DumpsAtOnceTakeTurns) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/at_once";
  auto recorder = std::make_shared<FlightRecorder>("g", 0, 1, std::vector<int>{42}, 1000);
  for (uint64_t s = 0; s < 1000; ++s) {
    recorder->record(s, static_cast<int64_t>(s), CollectiveKind::kAllReduce, "f32, 1024 elements");
  }
  flight_recorder::add(recorder);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      try {
        flight_recorder::dump(dir, "thread " + std::to_string(t));
      } catch (const Error&) {
        ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  flight_recorder::retire(*recorder);
  EXPECT_EQ(failures.load(), 0);
  std::vector<std::string> unreadable;
  const std::vector<RankDump> dumps = read_flight_dumps(dir, &unreadable);
  EXPECT_TRUE(unreadable.empty()) << (unreadable.empty() ? "" : unreadable[0]);
  ASSERT_EQ(dumps.size(), 1u);
  EXPECT_EQ(dumps[0].rank, 42);
}

enum class Divergence { kSkip, kSize, kHang };

// Every rank runs three all_reduces of 1024 f32 on a group with a 2 s timeout, except the last
// rank, which skips the third, calls the second with 2048 elements, or sleeps past the timeout
// before the third. Returns the merged report of the dumps the first failure wrote.
std::string diverge(int ranks, Divergence how, const std::string& name) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  std::filesystem::remove_all(dir);
  flight_recorder::set_dump_dir(dir);
  const int odd = ranks - 1;
  // The skipping rank leaves (its group destroyed) only once every other rank has completed the
  // second all_reduce: Gloo can complete it on one rank before the others, and a rank leaving
  // then would break the second, not skip the third (seen on a loaded machine).
  std::atomic<int> completed_second{0};
  const auto wait_for_the_others = [&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (completed_second.load() < ranks - 1 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  testing::run_on_ranks(ranks,
                        [&](ProcessGroup& pg) {
                          try {
                            for (int i = 0; i < 3; ++i) {
                              const bool me = pg.rank() == odd;
                              if (me && how == Divergence::kSkip && i == 2) {
                                wait_for_the_others();
                                return;
                              }
                              if (me && how == Divergence::kHang && i == 2) {
                                std::this_thread::sleep_for(std::chrono::milliseconds(3500));
                                return;
                              }
                              const int64_t n =
                                  me && how == Divergence::kSize && i == 1 ? 2048 : 1024;
                              pg.all_reduce(ops::ones({n}))->wait();
                              if (i == 1 && !me) ++completed_second;
                            }
                          } catch (const Error&) {
                            // the divergence's failures: what the dump records
                          }
                        },
                        {.timeout = std::chrono::seconds(2), .group_name = name});
  flight_recorder::set_dump_dir("");
  const std::string report = flight_report(read_flight_dumps(dir), ranks);
  std::printf("%s", report.c_str());  // the test log shows each report whole
  return report;
}

// "ranks 0, 1, 2" for ranks 0..count-1 ("rank 0" for one).
std::string ranks_text(int count) {
  std::vector<int> r;
  for (int i = 0; i < count; ++i) r.push_back(i);
  return fmt::format("{} {}", r.size() == 1 ? "rank" : "ranks", fmt::join(r, ", "));
}
std::string others(int ranks) { return ranks_text(ranks - 1); }

// The report names the last rank as the one that never entered the third all_reduce, having
// completed the second.
void expect_last_rank_missed_the_third(const std::string& report, int n, const std::string& name) {
  EXPECT_THAT(report,
              HasSubstr(fmt::format("first divergence at all_reduce #2 (sum, f32, 1024 "
                                    "elements) on group '{}': entered by {}; not by rank {}",
                                    name, others(n), n - 1)))
      << report;
  EXPECT_THAT(report, HasSubstr(fmt::format(
                          "rank {} did not; its last operation: all_reduce #1 (sum, f32, 1024 "
                          "elements) on group '{}', completed",
                          n - 1, name)))
      << report;
}

// A completed collective as a rank's ring holds it.
FlightRecord completed(int64_t collective, CollectiveKind kind, std::string detail) {
  return FlightRecord{.sequence = static_cast<uint64_t>(collective),
                      .collective = collective,
                      .kind = kind,
                      .detail = std::move(detail),
                      .state = RecordState::kCompleted};
}

// Two meshes over the same ranks (a MoE job's expert mesh beside the job's own) each make a
// "mesh/pp" group of ranks {0, 1}: the report pairs each rank's first with the others' first and
// its second with their second, instead of merging them (which had read "entered by ranks 0, 1;
// not by ranks 0, 1").
TEST(FlightReportTest, GroupsOfOneNameAndRanksArePairedInTheOrderMade) {
  std::vector<RankDump> dumps;
  for (int rank : {0, 1}) {
    RankDump dump{.rank = rank};
    dump.groups.push_back(GroupRecords{
        .name = "mesh/pp", .rank = rank, .size = 2, .global_ranks = {0, 1}, .created = 10});
    for (int64_t i = 0; i < 3; ++i) {
      dump.groups[0].records.push_back(
          completed(i, CollectiveKind::kBroadcast, "f32, 4 elements, root 0"));
    }
    // Its copy, made later, recorded nothing. Rank 1's dump lists it first (a group retired
    // before the dump is listed before the live ones): the order made pairs them, not the list.
    GroupRecords copy{
        .name = "mesh/pp", .rank = rank, .size = 2, .global_ranks = {0, 1}, .created = 20};
    if (rank == 1) {
      dump.groups.insert(dump.groups.begin(), copy);
    } else {
      dump.groups.push_back(copy);
    }
    dumps.push_back(std::move(dump));
  }
  const std::string report = flight_report(dumps, 2);
  EXPECT_THAT(report, HasSubstr("group 'mesh/pp' (global ranks 0, 1): consistent, 3 collectives "
                                "recorded on every rank"))
      << report;
  EXPECT_THAT(report, HasSubstr("group 'mesh/pp (copy 2)' (global ranks 0, 1): consistent"))
      << report;
  EXPECT_THAT(report, Not(HasSubstr("divergence"))) << report;
}

// A rank killed while it dumped leaves an empty or cut-off file: reading the folder names it, and
// (for loomrun's report) may list it and go on with the other ranks' dumps.
TEST(FlightReportTest, AnUnreadableDumpIsNamedOrListed) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/cut_dumps";
  std::filesystem::create_directories(dir);
  std::FILE* empty = std::fopen((dir + "/rank-0.json").c_str(), "w");
  ASSERT_NE(empty, nullptr);
  std::fclose(empty);
  try {
    read_flight_dumps(dir);
    ADD_FAILURE() << "an empty dump was read";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank-0.json' is not a flight recorder dump"));
  }
  std::vector<std::string> unreadable;
  EXPECT_TRUE(read_flight_dumps(dir, &unreadable).empty());
  ASSERT_EQ(unreadable.size(), 1u);
  EXPECT_THAT(unreadable[0], HasSubstr("rank-0.json' is not a flight recorder dump"));
}

// An all_to_all's sizes differ by rank by design (MoE dispatch): ranks agree when each sends each
// peer what the peer expects from it, and the first pair that does not is named.
TEST(FlightReportTest, AllToAllSizesAreComparedPairwise) {
  const auto report_of = [](const std::string& rank1_receives) {
    std::vector<RankDump> dumps;
    const std::vector<std::string> details = {
        "f32, sends [7424, 768], receives [7424, 5632]",
        "f32, sends [5632, 2560], receives " + rank1_receives};
    for (int rank : {0, 1}) {
      RankDump dump{.rank = rank};
      dump.groups.push_back(
          GroupRecords{.name = "mesh/ep", .rank = rank, .size = 2, .global_ranks = {0, 1}});
      dump.groups[0].records.push_back(
          completed(0, CollectiveKind::kAllToAll, details[static_cast<size_t>(rank)]));
      dumps.push_back(std::move(dump));
    }
    return flight_report(dumps, 2);
  };
  const std::string matching = report_of("[768, 2560]");
  EXPECT_THAT(matching, HasSubstr("group 'mesh/ep' (global ranks 0, 1): consistent")) << matching;
  const std::string mismatched = report_of("[700, 2560]");
  EXPECT_THAT(mismatched, HasSubstr("on every rank, but rank 0 sends rank 1 768 elements, and "
                                    "rank 1 expects 700 from it"))
      << mismatched;
}

class DivergenceTest : public ::testing::TestWithParam<int> {};

TEST_P(DivergenceTest, ARankThatSkipsACollectiveIsNamed) {
  const int n = GetParam();
  const std::string name = fmt::format("skip{}", n);
  const std::string report = diverge(n, Divergence::kSkip, name);
  // The group's line names its global ranks.
  EXPECT_THAT(report, HasSubstr(fmt::format("group '{}' (global {}): first divergence", name,
                                            ranks_text(n))))
      << report;
  expect_last_rank_missed_the_third(report, n, name);
}

TEST_P(DivergenceTest, ARankThatCallsAnotherSizeIsNamed) {
  const int n = GetParam();
  const std::string name = fmt::format("size{}", n);
  const std::string report = diverge(n, Divergence::kSize, name);
  EXPECT_THAT(report, HasSubstr(fmt::format("group '{}'", name))) << report;
  EXPECT_THAT(report, HasSubstr("the ranks called different operations as collective 1")) << report;
  EXPECT_THAT(report,
              HasSubstr(fmt::format("{} called all_reduce(sum, f32, 1024 elements)", others(n))))
      << report;
  EXPECT_THAT(report,
              HasSubstr(fmt::format("rank {} called all_reduce(sum, f32, 2048 elements)", n - 1)))
      << report;
}

TEST_P(DivergenceTest, ARankThatHangsIsNamedWithWhatItDidLast) {
  const int n = GetParam();
  const std::string name = fmt::format("hang{}", n);
  expect_last_rank_missed_the_third(diverge(n, Divergence::kHang, name), n, name);
}

INSTANTIATE_TEST_SUITE_P(Ranks, DivergenceTest, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return fmt::format("ranks{}", info.param); });

}  // namespace
}  // namespace loom::comm
