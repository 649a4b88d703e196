// Distributed checkpoints against the values saved: a state of DTensors (uneven shards, several
// placements, bf16 and i64 entries) saved on one layout loads into another with every value
// equal, each rank writing only pieces it owns; corrupt, truncated and missing files and an
// unfinished save are detected and named; crashed saves are ignored and cleaned up.
#include "checkpoint/distributed_checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "comm/testing/multi_rank.h"
#include "dtensor/comm_debug_mode.h"
#include "dtensor/dtensor.h"
#include "tensor/memory_stats.h"
#include "tensor/ops.h"
#include "tensor/rng.h"
#include "tests/testing/errors.h"

namespace loom::checkpoint {
namespace {

namespace fs = std::filesystem;
using loom::testing::error_of;
using ::testing::HasSubstr;
using ::testing::Not;

std::string fresh_root(const std::string& name) {
  const std::string root = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  fs::remove_all(root);
  return root;
}

// The values every layout holds: whole tensors, the same on every rank.
std::map<std::string, Tensor> reference() {
  return {{"w", ops::uniform({9, 6}, 1, -1.0, 1.0)},
          {"b", ops::uniform({5}, 2, -1.0, 1.0)},
          {"emb", ops::to(ops::uniform({257, 4}, 3, -1.0, 1.0), kBFloat16)},
          {"steps", ops::from_vector_i64({7, 7}, {2})}};
}

// A layout: a mesh and each entry's placements on it (none: a plain tensor).
using Layout = std::map<std::string, std::optional<Placements>>;

// The state on `mesh` laid out as `layout`, holding the reference values (or zeros).
StateDict state_on(const std::shared_ptr<const DeviceMesh>& mesh, const Layout& layout,
                   bool zeros) {
  StateDict state;
  for (const auto& [name, value] : reference()) {
    const Tensor v = zeros ? ops::zeros(value.shape(), value.dtype()) : value;
    const auto& placements = layout.at(name);
    state.tensors.emplace_back(name, placements ? distribute_tensor(v, mesh, *placements) : v);
  }
  return state;
}

void expect_reference_values(const StateDict& state, const std::string& what) {
  const auto want = reference();
  for (const auto& [name, t] : state.tensors) {
    const Tensor whole = is_dtensor(t) ? full_tensor(t) : t;
    EXPECT_EQ(ops::to_vector(whole), ops::to_vector(want.at(name))) << what << ": " << name;
  }
}

std::shared_ptr<const DeviceMesh> mesh_of(comm::ProcessGroup& pg, std::vector<std::string> names,
                                          std::vector<int64_t> shape) {
  return std::make_shared<const DeviceMesh>(pg.shared_from_this(), std::move(names),
                                            std::move(shape));
}

const Layout kGrid = {{"w", Placements{Replicate(), Shard(0)}},
                      {"b", Placements{Replicate(), Replicate()}},
                      {"emb", Placements{Shard(0), Shard(1)}},
                      {"steps", std::nullopt}};
const Layout kTp = {{"w", Placements{Shard(1)}},
                    {"b", Placements{Shard(0)}},
                    {"emb", Placements{Shard(0)}},
                    {"steps", std::nullopt}};
const Layout kPlain = {
    {"w", std::nullopt}, {"b", std::nullopt}, {"emb", std::nullopt}, {"steps", std::nullopt}};

// Saves on dp2 x tp2 (4 ranks), then loads on 1 rank, on tp2 and on a 3-rank S(0) layout.
TEST(DistributedCheckpointTest, SavedOnOneLayoutLoadsIntoAnother) {
  const std::string root = fresh_root("grid");
  comm::testing::run_on_ranks(4, [&](comm::ProcessGroup& pg) {
    const auto mesh = mesh_of(pg, {"dp", "tp"}, {2, 2});
    const StateDict state = state_on(mesh, kGrid, false);
    CommDebugMode comm;
    const std::string dir = save(state, root, 3, pg, {.block_bytes = 64});
    EXPECT_EQ(dir, step_directory(root, 3));
    // Metadata only (what `loom plan` lists per save): all_gathers, none of tensors.
    EXPECT_EQ(comm.count(comm::CollectiveKind::kAllGather),
              kStageSaveAllGathers + kCommitSaveAllGathers)
        << comm.summary();
    EXPECT_EQ(comm.total_count(), kStageSaveAllGathers + kCommitSaveAllGathers) << comm.summary();
  });
  const Metadata metadata = read_metadata(step_directory(root, 3));
  // Each unique piece once: w's 2 row shards (replicated over dp), b once, emb's 4 pieces, steps
  // once; several ranks wrote.
  EXPECT_EQ(metadata.files.size(), 4u) << "every rank wrote a share";
  for (const auto& [name, entry] : metadata.entries) {
    int64_t covered = 0;
    for (const Chunk& c : entry.chunks) covered += c.box.numel();
    int64_t numel = 1;
    for (int64_t s : entry.shape) numel *= s;
    EXPECT_EQ(covered, numel) << name << ": every element written exactly once";
  }
  // 1 rank, plain tensors.
  StateDict one = state_on(nullptr, kPlain, true);
  load(one, step_directory(root, 3));
  expect_reference_values(one, "1 rank");
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    StateDict state = state_on(mesh_of(pg, {"tp"}, {2}), kTp, true);
    load(state, step_directory(root, 3), &pg);
    expect_reference_values(state, "tp2");
  });
  comm::testing::run_on_ranks(3, [&](comm::ProcessGroup& pg) {
    Layout rows = kPlain;
    for (auto& [name, p] : rows) p = Placements{Shard(0)};
    StateDict state = state_on(mesh_of(pg, {"dp_shard"}, {3}), rows, true);
    load(state, step_directory(root, 3), &pg);
    expect_reference_values(state, "dp_shard 3 (uneven)");
  });
}

// State a checkpoint predates (a dropout module added since) loads when marked optional, left as
// it is; unmarked, its absence is named.
TEST(DistributedCheckpointTest, AnOptionalEntryTheCheckpointLacksIsLeftAsItIs) {
  const std::string root = fresh_root("optional");
  comm::testing::run_on_ranks(
      1, [&](comm::ProcessGroup& pg) { save(state_on(nullptr, kPlain, false), root, 1, pg); });
  StateDict state = state_on(nullptr, kPlain, true);
  const Tensor extra = ops::from_vector_i64({5}, {1});
  state.tensors.emplace_back("rng/drop/calls", extra);
  EXPECT_THAT(error_of([&] { load(state, step_directory(root, 1)); }),
              HasSubstr("no entry 'rng/drop/calls' in the checkpoint"));
  state.optional.insert("rng/drop/calls");
  load(state, step_directory(root, 1));
  EXPECT_EQ(ops::to_vector(extra), std::vector<double>{5});
  state.tensors.pop_back();
  expect_reference_values(state, "with an optional entry absent");
}

// The reverse: one rank saves whole tensors, four ranks load their shards.
TEST(DistributedCheckpointTest, OneRankSavesFourLoad) {
  const std::string root = fresh_root("single");
  comm::testing::run_on_ranks(
      1, [&](comm::ProcessGroup& pg) { save(state_on(nullptr, kPlain, false), root, 1, pg); });
  comm::testing::run_on_ranks(4, [&](comm::ProcessGroup& pg) {
    StateDict state = state_on(mesh_of(pg, {"dp", "tp"}, {2, 2}), kGrid, true);
    load(state, step_directory(root, 1), &pg);
    expect_reference_values(state, "dp2 x tp2");
  });
}

// A synchronous save writes from the tensors themselves: it holds no copy of the state (it had
// copied every block to host memory first, +36 % to +69 % over a job's step peak at its first
// checkpoint). Staging::kCopy (an asynchronous save's) does copy, and loads back the same.
TEST(DistributedCheckpointTest, ASaveHoldsNoCopyOfTheState) {
  const std::string root = fresh_root("no_copy");
  comm::testing::run_on_ranks(1, [&](comm::ProcessGroup& pg) {
    StateDict state;
    const Tensor big = ops::full({1024, 1024}, 0.5);  // 4 MiB
    state.tensors.emplace_back("big", big);
    MemoryTracker tracker;
    {
      ScopedMemoryTracker scope(tracker);
      save(state, root, 1, pg, {.block_bytes = int64_t{1} << 20});
    }
    EXPECT_LT(tracker.stats().peak_bytes, 64 << 10)
        << "a synchronous save allocated " << tracker.stats().peak_bytes << " bytes";
    MemoryTracker copying;
    {
      ScopedMemoryTracker scope(copying);
      commit_save(stage_save(state, root, 2, pg, {}, Staging::kCopy), pg);
    }
    EXPECT_GE(copying.stats().peak_bytes, 4 << 20) << "an asynchronous save's staging copies";
  });
  for (const int64_t step : {1, 2}) {
    StateDict loaded;
    loaded.tensors.emplace_back("big", ops::zeros({1024, 1024}));
    load(loaded, step_directory(root, step));
    EXPECT_EQ(ops::to_vector(loaded.tensors[0].second), std::vector<double>(1024 * 1024, 0.5))
        << "step " << step;
  }
}

// Saved on 2 ranks with small blocks: the files and their metadata, then damaged copies.
class CorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fresh_root("corrupt");
    comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
      save(state_on(mesh_of(pg, {"tp"}, {2}), kTp, false), root_, 5, pg, {.block_bytes = 32});
    });
    dir_ = step_directory(root_, 5);
  }
  std::string load_error() {
    StateDict state = state_on(nullptr, kPlain, true);
    return error_of([&] { load(state, dir_); });
  }
  std::string root_, dir_;
};

TEST_F(CorruptionTest, AFlippedByteIsNamedWithEntryFileAndRank) {
  const std::string file = dir_ + "/rank_00001.bin";
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(10);
  char c = 0;
  f.read(&c, 1);
  c ^= 0x10;
  f.seekp(10);
  f.write(&c, 1);
  f.close();
  const std::string error = load_error();
  EXPECT_THAT(error, HasSubstr("in rank_00001.bin (written by rank 1): SHA-256 mismatch"));
  EXPECT_THAT(error, HasSubstr("entry '"));
  // Damaged on disk is damaged on every try: an InputError (a job exits 2 and is not restarted),
  // on every rank of a load over a world too, whichever rank read the block.
  StateDict plain = state_on(nullptr, kPlain, true);
  EXPECT_THROW(load(plain, dir_), InputError);
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    StateDict state = state_on(mesh_of(pg, {"tp"}, {2}), kTp, true);
    try {
      load(state, dir_, &pg);
      ADD_FAILURE() << "rank " << pg.rank() << ": the damaged checkpoint loaded";
    } catch (const InputError& e) {
      EXPECT_THAT(e.what(), HasSubstr("SHA-256 mismatch")) << "rank " << pg.rank();
      EXPECT_THAT(e.what(), Not(HasSubstr("\x02")));
    }
  });
}

TEST_F(CorruptionTest, TruncatedAndMissingFilesAreNamed) {
  fs::resize_file(dir_ + "/rank_00000.bin", fs::file_size(dir_ + "/rank_00000.bin") - 3);
  EXPECT_THAT(load_error(), HasSubstr("file rank_00000.bin (written by rank 0) has"));
  EXPECT_THAT(load_error(), HasSubstr("it is truncated"));
  fs::remove(dir_ + "/rank_00000.bin");
  EXPECT_THAT(load_error(), HasSubstr("file rank_00000.bin (written by rank 0) is missing"));
}

TEST_F(CorruptionTest, AnUnfinishedSaveIsIgnoredAndCleanedUp) {
  // A save that crashed before its marker: step 6 without COMMITTED (killed while writing it:
  // the marker is written atomically, so only its temporary is there, half written), and a
  // partial step 7.
  EXPECT_FALSE(fs::exists(dir_ + "/COMMITTED.tmp"));  // a finished save leaves none
  fs::copy(dir_, step_directory(root_, 6));
  fs::remove(step_directory(root_, 6) + "/COMMITTED");
  std::ofstream(step_directory(root_, 6) + "/COMMITTED.tmp") << "{\"step\":6,\"metad";
  fs::create_directories(step_directory(root_, 7) + ".partial");
  EXPECT_EQ(committed_steps(root_), (std::vector<int64_t>{5}));
  EXPECT_EQ(latest_committed_step(root_), 5);
  EXPECT_THAT(error_of([&] { read_metadata(step_directory(root_, 6)); }),
              HasSubstr("has no COMMITTED marker: its save did not finish"));
  // The next save removes both and keeps the last 2 committed steps.
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    for (int64_t step : {8, 9}) {
      save(state_on(mesh_of(pg, {"tp"}, {2}), kTp, false), root_, step, pg, {.keep_last = 2});
    }
  });
  EXPECT_EQ(committed_steps(root_), (std::vector<int64_t>{8, 9}));
  EXPECT_FALSE(fs::exists(step_directory(root_, 6)));
  EXPECT_FALSE(fs::exists(step_directory(root_, 7) + ".partial"));
}

// Sets or clears the immutable attribute of `path` (ext4 and most filesystems; root only):
// false when the filesystem or the user cannot.
bool set_immutable(const std::string& path, bool on) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  int flags = 0;
  bool ok = ::ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0;
  if (ok) {
    flags = on ? (flags | FS_IMMUTABLE_FL) : (flags & ~FS_IMMUTABLE_FL);
    ok = ::ioctl(fd, FS_IOC_SETFLAGS, &flags) == 0;
  }
  ::close(fd);
  return ok;
}

// An old step or a crashed save's folder that cannot be removed (a file in it immutable, another
// owner's) costs disk space, never the save: it commits, the folder stays with a warning, and
// the saves after it commit too (before: every later save failed on it, and a job restarted from
// its last step failed again at its next save).
TEST_F(CorruptionTest, AFolderThatCannotBeRemovedDoesNotFailTheSave) {
  fs::create_directories(step_directory(root_, 6) + ".partial");
  const std::string stuck_file = step_directory(root_, 6) + ".partial/stuck";
  std::ofstream(stuck_file) << "x";
  const std::string stuck_step_file = dir_ + "/rank_00000.bin";  // step 5, for --keep-last
  if (!set_immutable(stuck_file, true) || !set_immutable(stuck_step_file, true)) {
    set_immutable(stuck_file, false);
    GTEST_SKIP() << "this filesystem or user cannot make a file immutable";
  }
  ::testing::internal::CaptureStderr();
  std::string error;
  comm::testing::run_on_ranks(2, [&](comm::ProcessGroup& pg) {
    try {
      for (int64_t step : {8, 9}) {
        save(state_on(mesh_of(pg, {"tp"}, {2}), kTp, false), root_, step, pg, {.keep_last = 1});
      }
    } catch (const std::exception& e) {
      if (pg.rank() == 0) error = e.what();
    }
  });
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  set_immutable(stuck_file, false);
  set_immutable(step_directory(root_, 5) + ".removed.partial/rank_00000.bin", false);
  EXPECT_EQ(error, "");
  EXPECT_EQ(committed_steps(root_), (std::vector<int64_t>{9}));
  EXPECT_THAT(warnings, HasSubstr("cannot remove '" + step_directory(root_, 6) + ".partial'"));
  EXPECT_THAT(warnings, HasSubstr("cannot remove '" + step_directory(root_, 5) +
                                  ".removed.partial' (a step --keep-last removes)"));
  StateDict loaded = state_on(nullptr, kPlain, true);
  load(loaded, step_directory(root_, 9));
  expect_reference_values(loaded, "step 9");
}

// A step folder is found by its name: a copy under another step's name is refused, not resumed
// from in place of that step.
TEST_F(CorruptionTest, AStepFolderUnderAnotherStepsNameIsRefused) {
  fs::copy(dir_, step_directory(root_, 9));
  EXPECT_EQ(latest_committed_step(root_), 9);
  EXPECT_EQ(error_of([&] { read_metadata(step_directory(root_, 9)); }),
            fmt::format("checkpoint: '{}' holds step 5 (its COMMITTED and metadata say so), not "
                        "the step 9 its name says: a step folder was copied or renamed; rename it "
                        "step_00000005 or remove it",
                        step_directory(root_, 9)));
  EXPECT_NO_THROW(read_metadata(dir_ + "/"));
}

// What stat tells (check_files: the job's check before its ranks start), and a FIFO in a file's
// place refused instead of blocking the reader.
TEST_F(CorruptionTest, FilesAreCheckedWithoutReadingAndAFifoIsRefused) {
  const Metadata metadata = read_metadata(dir_);
  EXPECT_NO_THROW(check_files(dir_, metadata));
  fs::resize_file(dir_ + "/rank_00001.bin", 10);
  EXPECT_THAT(error_of([&] { check_files(dir_, metadata); }),
              HasSubstr("file rank_00001.bin (written by rank 1) has 10 bytes, the metadata "
                        "records"));
  fs::remove(dir_ + "/rank_00001.bin");
  ASSERT_EQ(::mkfifo((dir_ + "/rank_00001.bin").c_str(), 0600), 0);
  EXPECT_THAT(error_of([&] { check_files(dir_, metadata); }),
              HasSubstr("file rank_00001.bin (written by rank 1) is not a regular file"));
  fs::remove(dir_ + "/COMMITTED");
  ASSERT_EQ(::mkfifo((dir_ + "/COMMITTED").c_str(), 0600), 0);
  EXPECT_THAT(error_of([&] { read_metadata(dir_); }),
              HasSubstr("COMMITTED' is not a regular file"));
}

TEST_F(CorruptionTest, WhatDoesNotFitIsNamed) {
  StateDict wrong;
  wrong.tensors.emplace_back("w", ops::zeros({9, 7}));
  EXPECT_THAT(error_of([&] { load(wrong, dir_); }),
              HasSubstr("entry 'w' was saved with shape (9, 6) but is loaded into shape (9, 7)"));
  StateDict missing;
  missing.tensors.emplace_back("nope", ops::zeros({1}));
  EXPECT_THAT(error_of([&] { load(missing, dir_); }), HasSubstr("no entry 'nope'"));
}

}  // namespace
}  // namespace loom::checkpoint
