// Distributed checkpoints (PyTorch DCP's save / load, with Megatron's atomic commit): every rank
// writes only the pieces it owns and reads only the pieces that overlap what it holds, so a
// checkpoint saved on one layout (any mesh, any plan, 1 rank) loads into any other.
//
//   checkpoint::StateDict state{{{"wte.weight", model.wte->weight()}, ...}, extra};
//   checkpoint::save(state, "ckpt", step, *world);   // -> ckpt/step_00000008
//   checkpoint::load(state, checkpoint::step_directory("ckpt", 8), world.get());
//
// On disk, a step directory holds metadata.json (checkpoint/metadata.h), one rank_NNNNN.bin per
// rank that wrote something, and a COMMITTED marker. A save writes into step_N.partial/: each
// rank writes and fsyncs its file; the checksums are gathered; rank 0 writes the metadata, fsyncs
// the directory, renames it to step_N (one rename) and writes COMMITTED last. A crash at any
// moment leaves every earlier committed step loadable; a directory without the marker is
// ignored, and removed by the next save. Every chunk and file carries a SHA-256 in the metadata,
// verified on load: a flipped byte, a truncated or missing file fails naming the entry, the file
// and the rank that wrote it.
//
// Collective contract: save() is collective over `world` (every rank of the job, same order):
// an all-gather of the local plans, one of the checksums, a barrier, and one more all-gather that
// tells every rank whether every rank succeeded (a rank that cannot write makes all of them throw,
// naming it). load() reads files only; with `world` it also agrees on success the same way.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "checkpoint/metadata.h"
#include "checkpoint/planner.h"
#include "comm/process_group.h"
#include "tensor/tensor.h"

namespace loom::checkpoint {

// A named training state: tensors (plain, or DTensors: each rank its shards) and the job's own
// fields (JSON, stored in the metadata's `extra`). A load writes into the tensors in place.
struct StateDict {
  std::vector<std::pair<std::string, Tensor>> tensors;
  nlohmann::json extra = nlohmann::json::object();
  // Names of `tensors` a load leaves as they are when the checkpoint lacks them (state a model
  // saved before it had it: a dropout module's draws); a save writes them as any other.
  std::set<std::string> optional;
};

struct SaveOptions {
  int64_t block_bytes = 4 << 20;  // pieces are split into checksummed blocks of at most this
  int keep_last = 0;              // after committing, keep this many newest steps (0: all)
};

// "root/step_00000008".
std::string step_directory(const std::string& root, int64_t step);
// The committed steps under `root`, ascending (an absent root has none).
std::vector<int64_t> committed_steps(const std::string& root);
std::optional<int64_t> latest_committed_step(const std::string& root);
// What a crashed or interrupted save left under `root` (partial directories, step directories
// without the marker), sorted: the next save removes them. An absent root has none.
std::vector<std::string> uncommitted_step_directories(const std::string& root);
// Folders under `root` named like a step ("step...") that hold one (metadata.json or the marker)
// under a name no save gives ("step_4", a copy "step_00000004_x"), sorted: neither listed as steps
// nor removed by a save. Other folders are not looked into.
std::vector<std::string> misnamed_step_directories(const std::string& root);
// Throws, naming `what` (the flag or tool) and each folder, when `root` has misnamed steps: a
// resume would silently skip them.
void check_no_misnamed_steps(const std::string& root, std::string_view what);
// Every file `metadata` lists is in `directory` as recorded: a regular file of its size that
// this process can read (stat and access only, no byte read: what a job checks before it starts
// its ranks). Throws naming the file, its writer and what is wrong.
void check_files(const std::string& directory, const Metadata& metadata);
// Whether `path` is one step's folder (it holds metadata.json or the COMMITTED marker), not a
// folder of steps.
bool is_step_directory(const std::string& path);
// `path` when it is a step directory (it has metadata.json), else the latest committed step
// directory under it; throws naming `path` when it is neither.
std::string resolve_step_directory(const std::string& path);

// Saves `state` as step `step` under `root` (created if needed); returns the step directory once
// it is committed on every rank.
std::string save(const StateDict& state, const std::string& root, int64_t step,
                 comm::ProcessGroup& world, const SaveOptions& options = {});

// The two halves of save(): stage_save (collective over `world`: the plan, and this rank's
// pieces) and commit_save (collective over `group`, any group over the same ranks: files,
// checksums, the atomic commit). With Staging::kCopy the pieces are copied to host memory, after
// which training may change the tensors (an asynchronous save: the copy is the rank's whole
// state, held until written); with kViews they stay views of the tensors, each made contiguous on
// the host one at a time as it is written (save(): nothing changes them before the commit, and a
// checkpoint costs no more memory than one block).
enum class Staging { kCopy, kViews };
struct StagedSave {
  std::string root;
  int64_t step = 0;
  int keep_last = 0;
  SavePlan plan;
  std::vector<Tensor> blocks;  // this rank's writes, in plan order: host copies, or views
};
StagedSave stage_save(const StateDict& state, const std::string& root, int64_t step,
                      comm::ProcessGroup& world, const SaveOptions& options = {},
                      Staging staging = Staging::kCopy);
std::string commit_save(StagedSave staged, comm::ProcessGroup& group);
// The collectives each half makes, every one an all_gather of metadata (success or an error,
// the ranks' items, their checksums; a few KiB), never of tensors: what `loom plan` says one save
// adds to a job's communication. distributed_checkpoint_test counts them on a real save.
inline constexpr int kStageSaveAllGathers = 6;
inline constexpr int kCommitSaveAllGathers = 8;

// Asynchronous saves (DCP's async_save): save() stages on the caller's thread (the training
// stalls for the copy to host memory only) and commits on a background thread over a group of
// its own (made at construction, collectively over `world`), so the training's collectives and
// the checkpoint's never share a group. One save is in flight at a time: the next save(), and
// wait(), first wait for the previous one and rethrow its error.
class AsyncSaver {
 public:
  explicit AsyncSaver(std::shared_ptr<comm::ProcessGroup> world);
  ~AsyncSaver();
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  void save(const StateDict& state, const std::string& root, int64_t step,
            const SaveOptions& options = {});
  // Waits for the save in flight; returns the last committed directory ("" before any).
  std::string wait();

 private:
  std::shared_ptr<comm::ProcessGroup> world_, group_;
  std::thread writer_;
  std::string committed_;
  std::exception_ptr error_;
};

// Reads the metadata of a committed step directory (verifying the marker and the version).
Metadata read_metadata(const std::string& directory);

// Checks a committed step directory whole, reading every file once: the marker's metadata
// SHA-256, each file's size and SHA-256, each chunk's SHA-256. Throws naming what is wrong (the
// entry, the file, the rank that wrote it); returns what it checked.
struct VerifySummary {
  int64_t entries = 0, files = 0, bytes = 0;
};
VerifySummary verify(const std::string& directory);

// Loads the committed checkpoint in `directory` into `state.tensors` in place and returns its
// metadata (`extra` holds the job's fields). Each rank reads only the blocks overlapping what it
// holds and verifies their checksums. With `world`, every rank learns whether every rank
// succeeded.
Metadata load(StateDict& state, const std::string& directory, comm::ProcessGroup* world = nullptr);

}  // namespace loom::checkpoint
