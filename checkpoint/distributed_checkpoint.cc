#include "checkpoint/distributed_checkpoint.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>

#include "autograd/grad_mode.h"
#include "base/durable_file.h"
#include "base/error.h"
#include "base/logging.h"
#include "checkpoint/files.h"
#include "checkpoint/planner.h"
#include "checkpoint/sha256.h"
#include "dtensor/dtensor.h"
#include "tensor/ops.h"

namespace loom::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr const char* kMarker = "COMMITTED";
constexpr const char* kMetadataFile = "metadata.json";

// The rank's local tensor of `t` and the box of the global tensor it holds.
std::pair<Tensor, Box> local_part(const Tensor& t) {
  if (!is_dtensor(t)) return {t, {Shape(t.dim(), 0), t.shape()}};
  const DTensorSpec& spec = dtensor_spec(t);
  LOOM_CHECK(!spec.has_partial(),
             "checkpoint: a Partial DTensor ({}) has no value of its own to save; reduce it first",
             spec.str());
  return {local_shard(t), {spec.local_offset(), spec.local_shape()}};
}

Shape global_shape(const Tensor& t) { return is_dtensor(t) ? dtensor_spec(t).shape : t.shape(); }

// `box` (global) of a tensor whose local part starts at `origin`: narrowed per dim.
Tensor narrow_to(Tensor local, const Box& origin, const Box& box) {
  for (size_t d = 0; d < box.sizes.size(); ++d) {
    local = ops::narrow(local, static_cast<int64_t>(d), box.offsets[d] - origin.offsets[d],
                        box.sizes[d]);
  }
  return local;
}

// Every rank's string, in rank order (all-gathers of the lengths, then of the padded bytes
// packed in int64 elements).
std::vector<std::string> all_gather_strings(comm::ProcessGroup& world, const std::string& mine) {
  const int n = world.size();
  Tensor length = ops::from_vector_i64({static_cast<int64_t>(mine.size())}, {1});
  Tensor lengths = ops::empty({n}, kInt64);
  world.all_gather_into_tensor(lengths, length)->wait();
  int64_t longest = 0;
  std::vector<int64_t> sizes(n);
  for (int r = 0; r < n; ++r) longest = std::max(longest, sizes[r] = lengths.data<int64_t>()[r]);
  const int64_t words = (longest + 7) / 8;
  Tensor packed = ops::zeros({std::max<int64_t>(words, 1)}, kInt64);
  std::memcpy(packed.raw_data(), mine.data(), mine.size());
  Tensor all = ops::empty({n * std::max<int64_t>(words, 1)}, kInt64);
  world.all_gather_into_tensor(all, packed)->wait();
  std::vector<std::string> out(n);
  const char* base = static_cast<const char*>(all.raw_data());
  for (int r = 0; r < n; ++r) out[r].assign(base + r * std::max<int64_t>(words, 1) * 8, sizes[r]);
  return out;
}

// Leads the message of an InputError (a damaged checkpoint: the same on every try) in what
// error_of returns, so agree_on_success throws one too and a launcher does not restart the job.
constexpr char kInputErrorMark = '\x02';

// Every rank learns whether every rank got here without an error: throws on every rank naming
// the failing ranks and their messages (an InputError when any rank's was one).

void agree_on_success(comm::ProcessGroup& world, const std::string& what,
                      const std::string& my_error) {
  const std::vector<std::string> errors = all_gather_strings(world, my_error);
  std::string failures;
  bool input = false;
  for (size_t r = 0; r < errors.size(); ++r) {
    if (errors[r].empty()) continue;
    const bool marked = errors[r][0] == kInputErrorMark;
    input = input || marked;
    failures += fmt::format("\n  rank {}: {}", r, std::string_view(errors[r]).substr(marked));
  }
  if (failures.empty()) return;
  const std::string message = fmt::format("{} failed on some ranks:{}", what, failures);
  if (input) throw InputError(message);
  LOOM_FAIL("{}", message);
}

// Runs `body`, returning its error message (empty when it succeeded; an InputError's marked).
template <class Body>
std::string error_of(Body&& body) {
  try {
    body();
  } catch (const InputError& e) {
    return kInputErrorMark + std::string(e.what()[0] ? e.what() : "unknown error");
  } catch (const std::exception& e) {
    return e.what()[0] ? e.what() : "unknown error";
  }
  return "";
}

nlohmann::json items_to_json(const std::vector<LocalItem>& items) {
  nlohmann::json out = nlohmann::json::array();
  for (const LocalItem& item : items) {
    out.push_back({item.name, dtype_key(item.dtype), item.shape, item.box.offsets, item.box.sizes});
  }
  return out;
}

std::vector<LocalItem> items_from_json(const nlohmann::json& json) {
  std::vector<LocalItem> items;
  for (const auto& j : json) {
    items.push_back({j[0].get<std::string>(),
                     dtype_from_key(j[1].get<std::string>(), "plan"),
                     j[2].get<Shape>(),
                     {j[3].get<std::vector<int64_t>>(), j[4].get<std::vector<int64_t>>()}});
  }
  return items;
}

// The state's tensors by name, each once (a name listed twice must be the same piece).
std::map<std::string, Tensor> by_name(const StateDict& state) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, tensor] : state.tensors) {
    LOOM_CHECK(tensor.defined(), "checkpoint: entry '{}' is an undefined tensor", name);
    const auto [it, inserted] = out.emplace(name, tensor);
    if (!inserted) {
      LOOM_CHECK(local_part(it->second).second == local_part(tensor).second &&
                     global_shape(it->second) == global_shape(tensor),
                 "checkpoint: entry '{}' is listed twice with different pieces", name);
    }
  }
  return out;
}

bool is_step_name(const std::string& name, int64_t* step) {
  if (name.rfind("step_", 0) != 0 || name.size() != 13) return false;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return false;
  }
  *step = std::stoll(name.substr(5));
  return true;
}

// The COMMITTED marker's exact text: the step and the metadata's SHA-256. A load accepts exactly
// this text, so any change to the marker is detected too.
std::string marker_text(int64_t step, const std::string& metadata_sha256) {
  return nlohmann::json{{"step", step}, {"metadata_sha256", metadata_sha256}}.dump() + "\n";
}

// Whether `path` exists; a folder that cannot be looked into (permissions) is named, where
// std::filesystem's own error would say only "status: Permission denied".
bool path_exists(const fs::path& path) {
  std::error_code error;
  const bool found = fs::exists(path, error);
  LOOM_CHECK(!error,
             "checkpoint: cannot look for '{}': {}; make its folder readable and "
             "searchable (chmod u+rx) or move it away",
             path.string(), error.message());
  return found;
}

// Whether `dir` is what a crashed save left: a partial directory, or a step directory without
// the marker.
bool is_uncommitted(const fs::directory_entry& dir) {
  const std::string name = dir.path().filename().string();
  int64_t step = 0;
  const bool partial = name.size() > 8 && name.substr(name.size() - 8) == ".partial";
  const bool unmarked = is_step_name(name, &step) && !path_exists(dir.path() / kMarker);
  return dir.is_directory() && (partial || unmarked);
}

// Removes `path` (a folder a save no longer needs) or warns naming it and why: a folder that
// cannot go (a read-only or immutable file in it, another owner's) costs disk space, never the
// save or the next ones.
void remove_or_warn(const std::string& path, std::string_view why) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (!ec) return;
  LOOM_LOG(warn,
           "checkpoint: cannot remove '{}' ({}): {}; the save goes on without removing it: "
           "remove it by hand (checkpoints before it, kept or not, are not needed to resume)",
           path, why, ec.message());
}

// Deletes a committed step (keep_last). It is renamed to an uncommitted name first, durably: a
// rank killed while the files go leaves a folder the next save removes, never a committed step
// with files missing (remove_all deletes in no set order, the marker maybe last).
void remove_committed_step(const std::string& root, int64_t step) {
  const std::string dir = step_directory(root, step);
  const std::string removing = dir + ".removed.partial";
  remove_or_warn(removing, "a step --keep-last removes");  // an earlier removal's leftover
  std::error_code ec;
  fs::rename(dir, removing, ec);
  if (ec) {
    LOOM_LOG(warn, "checkpoint: cannot remove step {} ('{}') for --keep-last: {}; it stays", step,
             dir, ec.message());
    return;
  }
  sync_directory(root, "checkpoint");
  remove_or_warn(removing, "a step --keep-last removes");
}

// Removes what a crashed save left under `root` (rank 0, before a save), but for `keep`: the
// save's own partial folder, which must go.
void remove_uncommitted(const std::string& root, const std::string& partial_dir) {
  for (const auto& dir : fs::directory_iterator(root)) {
    if (!is_uncommitted(dir)) continue;
    if (dir.path() == fs::path(partial_dir)) {
      fs::remove_all(dir.path());
    } else {
      remove_or_warn(dir.path().string(), "a folder no save committed");
    }
  }
}

}  // namespace

bool is_step_directory(const std::string& path) {
  return path_exists(fs::path(path) / kMetadataFile) || path_exists(fs::path(path) / kMarker);
}

std::string resolve_step_directory(const std::string& path) {
  if (is_step_directory(path)) return path;
  check_no_misnamed_steps(path, "checkpoint");
  const auto latest = latest_committed_step(path);
  LOOM_CHECK(latest.has_value(),
             "checkpoint: '{}' is neither a step directory (no {}) nor a checkpoint directory "
             "with a committed step",
             path, kMetadataFile);
  return step_directory(path, *latest);
}

std::string step_directory(const std::string& root, int64_t step) {
  return (fs::path(root) / fmt::format("step_{:08d}", step)).string();
}

std::vector<int64_t> committed_steps(const std::string& root) {
  std::vector<int64_t> steps;
  std::error_code error;
  if (!fs::is_directory(root, error)) return steps;
  for (const auto& dir : fs::directory_iterator(root)) {
    int64_t step = 0;
    if (dir.is_directory() && is_step_name(dir.path().filename().string(), &step) &&
        path_exists(dir.path() / kMarker)) {
      steps.push_back(step);
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::vector<std::string> uncommitted_step_directories(const std::string& root) {
  std::vector<std::string> out;
  std::error_code error;
  if (!fs::is_directory(root, error)) return out;
  for (const auto& dir : fs::directory_iterator(root)) {
    if (is_uncommitted(dir)) out.push_back(dir.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> misnamed_step_directories(const std::string& root) {
  std::vector<std::string> out;
  std::error_code error;
  if (!fs::is_directory(root, error)) return out;
  // Only folders named like a step are looked into: any other folder (lost+found at a disk's
  // root, unreadable) is none of the checkpoint's business.
  const auto holds = [](const fs::path& dir, const char* file) {
    std::error_code ec;
    return fs::exists(dir / file, ec);  // an unreadable folder holds no step
  };
  for (const auto& dir : fs::directory_iterator(root)) {
    const std::string name = dir.path().filename().string();
    int64_t step = 0;
    if (dir.is_directory() && name.starts_with("step") && !is_step_name(name, &step) &&
        !name.ends_with(".partial") &&
        (holds(dir.path(), kMetadataFile) || holds(dir.path(), kMarker))) {
      out.push_back(dir.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

void check_no_misnamed_steps(const std::string& root, std::string_view what) {
  const std::vector<std::string> misnamed = misnamed_step_directories(root);
  LOOM_CHECK(misnamed.empty(),
             "{}: '{}' holds {} step folder(s) under a name no save gives ({}); a save names its "
             "folder step_ and the step in 8 digits (step 4: step_00000004): rename each to its "
             "step's name (its metadata.json's \"step\"), or move it away",
             what, root, misnamed.size(), fmt::join(misnamed, ", "));
}

std::optional<int64_t> latest_committed_step(const std::string& root) {
  const auto steps = committed_steps(root);
  if (steps.empty()) return std::nullopt;
  return steps.back();
}

StagedSave stage_save(const StateDict& state, const std::string& root, int64_t step,
                      comm::ProcessGroup& world, const SaveOptions& options, Staging staging) {
  NoGradGuard no_grad;
  const int rank = world.rank();
  StagedSave staged;
  staged.root = root;
  staged.step = step;
  staged.keep_last = options.keep_last;
  const std::string what =
      fmt::format("checkpoint save of step {} to '{}'", step, step_directory(root, step));
  // 1. The plan: every rank's local items, gathered; every rank plans alike.
  std::map<std::string, Tensor> tensors;
  std::vector<LocalItem> mine;
  std::string error = error_of([&] {
    tensors = by_name(state);
    for (const auto& [name, tensor] : tensors) {
      mine.push_back({name, tensor.dtype(), global_shape(tensor), local_part(tensor).second});
    }
  });
  agree_on_success(world, what, error);
  std::vector<std::vector<LocalItem>> all;
  for (const std::string& text : all_gather_strings(world, items_to_json(mine).dump())) {
    all.push_back(items_from_json(nlohmann::json::parse(text)));
  }
  SavePlan plan = plan_save(all, options.block_bytes);
  plan.metadata.step = step;
  plan.metadata.extra = state.extra;
  // 2. This rank's blocks: copied to host memory (training may change the tensors from here on),
  // or views of them that the commit writes one at a time.
  error = error_of([&] {
    for (const WriteItem& item : plan.writes[rank]) {
      const auto [local, origin] = local_part(tensors.at(item.name));
      const Tensor block = narrow_to(local, origin, item.box);
      if (staging == Staging::kViews) {
        staged.blocks.push_back(block);
      } else {
        staged.blocks.push_back(block.device().is_cpu()
                                    ? ops::contiguous(ops::clone(block))
                                    : ops::contiguous(ops::to(block, Device::cpu())));
      }
    }
  });
  agree_on_success(world, what, error);
  staged.plan = std::move(plan);
  return staged;
}

std::string commit_save(StagedSave staged, comm::ProcessGroup& group) {
  const int rank = group.rank();
  const std::string root = staged.root;
  const int64_t step = staged.step;
  SavePlan& plan = staged.plan;
  const std::string final_dir = step_directory(root, step);
  const std::string partial_dir = final_dir + ".partial";
  const std::string what = fmt::format("checkpoint save of step {} to '{}'", step, final_dir);
  // 3. Rank 0 clears what crashed saves left and makes the partial directory.
  std::string error = error_of([&] {
    if (rank != 0) return;
    fs::create_directories(root);
    remove_uncommitted(root, partial_dir);
    fs::create_directories(partial_dir);
  });
  agree_on_success(group, what, error);
  // 4. Every rank writes its blocks, hashing each and the whole file.
  nlohmann::json my_hashes = nlohmann::json::object();
  error = error_of([&] {
    const std::vector<WriteItem>& writes = plan.writes[rank];
    if (writes.empty()) return;
    SyncedFileWriter writer((fs::path(partial_dir) / rank_file_name(rank)).string(), "checkpoint");
    Sha256 whole;
    nlohmann::json chunks = nlohmann::json::array();
    for (size_t i = 0; i < writes.size(); ++i) {
      // A staged copy as it is; a view made a contiguous host tensor (a copy only when it is not
      // one already), and dropped after its write.
      Tensor block = staged.blocks[i];
      if (!block.device().is_cpu()) block = ops::to(block, Device::cpu());
      block = ops::contiguous(block);
      staged.blocks[i] = Tensor();
      const size_t bytes = static_cast<size_t>(writes[i].length);
      LOOM_INTERNAL_ASSERT(
          block.numel() * static_cast<int64_t>(element_size(block.dtype())) == writes[i].length,
          "block of '{}' has {} elements for {} bytes", writes[i].name, block.numel(),
          writes[i].length);
      writer.write(block.raw_data(), bytes);
      whole.update(block.raw_data(), bytes);
      chunks.push_back(sha256_hex(block.raw_data(), bytes));
    }
    writer.close();
    my_hashes = {{"file", whole.hex()}, {"chunks", chunks}};
  });
  staged.blocks.clear();  // written (copies or views): nothing of the state is held any more
  agree_on_success(group, what, error);
  // 5. The checksums, gathered into the metadata (the same on every rank).
  const std::vector<std::string> hashes = all_gather_strings(group, my_hashes.dump());
  std::map<std::pair<std::string, int64_t>, std::string> hash_at;  // (file, offset) -> hash
  for (int r = 0; r < group.size(); ++r) {
    const nlohmann::json h = nlohmann::json::parse(hashes[r]);
    if (h.empty()) continue;
    const std::string file = rank_file_name(r);
    plan.metadata.files.at(file).sha256 = h.at("file").get<std::string>();
    const auto chunks = h.at("chunks").get<std::vector<std::string>>();
    for (size_t i = 0; i < plan.writes[r].size(); ++i) {
      hash_at[{file, plan.writes[r][i].offset}] = chunks.at(i);
    }
  }
  for (auto& [name, entry] : plan.metadata.entries) {
    for (Chunk& chunk : entry.chunks) chunk.sha256 = hash_at.at({chunk.file, chunk.offset});
  }
  // 6. Rank 0 commits: metadata, fsync, one rename, the marker last; then keep_last.
  error = error_of([&] {
    if (rank != 0) return;
    const std::string metadata_text = to_json(plan.metadata).dump(1);
    write_file_synced((fs::path(partial_dir) / kMetadataFile).string(), metadata_text,
                      "checkpoint");
    sync_directory(partial_dir, "checkpoint");
    if (fs::exists(final_dir)) {
      // A step saved again (a resumed run passing it): the old one goes once the new is whole.
      const std::string old_dir = final_dir + ".old.partial";
      fs::remove_all(old_dir);
      fs::rename(final_dir, old_dir);
    }
    fs::rename(partial_dir, final_dir);
    sync_directory(root, "checkpoint");
    // The marker, last, records the metadata's SHA-256: a metadata file changed after the
    // commit (a flipped byte in a number, a name) is detected too. Written atomically (a
    // temporary renamed over it, the folder synced): a rank killed while writing it leaves no
    // marker, so the step counts as uncommitted and a restart resumes from the one before; an
    // empty marker would have made every restart refuse the step as damaged.
    write_file_atomically((fs::path(final_dir) / kMarker).string(),
                          marker_text(step, sha256_hex(metadata_text.data(), metadata_text.size())),
                          "checkpoint");
    // Committed: what follows only frees space, and warns where it cannot.
    remove_or_warn(final_dir + ".old.partial", "the step's earlier save, replaced");
    if (staged.keep_last > 0) {
      const std::vector<int64_t> steps = committed_steps(root);
      for (size_t i = 0; i + staged.keep_last < steps.size(); ++i) {
        if (steps[i] != step) remove_committed_step(root, steps[i]);
      }
    }
  });
  agree_on_success(group, what, error);
  return final_dir;
}

std::string save(const StateDict& state, const std::string& root, int64_t step,
                 comm::ProcessGroup& world, const SaveOptions& options) {
  // Nothing changes the tensors before the commit: write from them, holding no copy of the state.
  return commit_save(stage_save(state, root, step, world, options, Staging::kViews), world);
}

AsyncSaver::AsyncSaver(std::shared_ptr<comm::ProcessGroup> world) {
  LOOM_CHECK(world != nullptr, "AsyncSaver: the world group is null");
  std::vector<int> everyone(world->size());
  for (int r = 0; r < world->size(); ++r) everyone[r] = r;
  group_ = world->new_group(everyone, {.name = "checkpoint", .timeout = world->timeout()});
  world_ = std::move(world);
}

AsyncSaver::~AsyncSaver() {
  if (writer_.joinable()) writer_.join();  // an error nobody waited for is dropped here
}

void AsyncSaver::save(const StateDict& state, const std::string& root, int64_t step,
                      const SaveOptions& options) {
  wait();  // one save in flight: the previous one is committed (or its error thrown) first
  StagedSave staged = stage_save(state, root, step, *world_, options);
  writer_ = std::thread([this, staged = std::move(staged)]() mutable {
    try {
      committed_ = commit_save(std::move(staged), *group_);
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

std::string AsyncSaver::wait() {
  if (writer_.joinable()) writer_.join();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  return committed_;
}

Metadata read_metadata(const std::string& directory) {
  LOOM_CHECK(fs::is_directory(directory), "checkpoint: '{}' is not a directory", directory);
  LOOM_CHECK(path_exists(fs::path(directory) / kMarker),
             "checkpoint: '{}' has no {} marker: its save did not finish (a crash or a save in "
             "progress); load an earlier committed step",
             directory, kMarker);
  const std::string path = (fs::path(directory) / kMetadataFile).string();
  LOOM_CHECK(path_exists(path), "checkpoint: '{}' has no {}", directory, kMetadataFile);
  const std::string marker_path = (fs::path(directory) / kMarker).string();
  const std::string marker = read_text(marker_path);
  std::string recorded;
  int64_t marked_step = -1;
  try {
    const nlohmann::json json = nlohmann::json::parse(marker);
    recorded = json.at("metadata_sha256").get<std::string>();
    marked_step = json.at("step").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    LOOM_FAIL("checkpoint: '{}' is damaged (expected the step and the metadata's SHA-256): {}",
              marker_path, e.what());
  }
  LOOM_CHECK(marker == marker_text(marked_step, recorded),
             "checkpoint: '{}' is damaged: it is not the marker a commit writes", marker_path);
  const std::string text = read_text(path);
  LOOM_CHECK(sha256_hex(text.data(), text.size()) == recorded,
             "checkpoint: '{}' does not match the SHA-256 its {} marker records: the metadata "
             "was changed after the commit",
             path, kMarker);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    LOOM_FAIL("checkpoint: '{}' is not valid JSON: {}", path, e.what());
  }
  Metadata metadata = metadata_from_json(json, path);
  LOOM_CHECK(metadata.step == marked_step,
             "checkpoint: '{}' marks step {} but its metadata is of step {}", marker_path,
             marked_step, metadata.step);
  // A step folder is found by its name (latest_committed_step): a copied or renamed one would be
  // resumed from in place of the step its name says.
  const fs::path normal = fs::path(directory).lexically_normal();
  const std::string name =
      (normal.has_filename() ? normal : normal.parent_path()).filename().string();
  int64_t named_step = 0;
  LOOM_CHECK(!is_step_name(name, &named_step) || named_step == metadata.step,
             "checkpoint: '{}' holds step {} (its {} and metadata say so), not the step {} its "
             "name says: a step folder was copied or renamed; rename it {} or remove it",
             directory, metadata.step, kMarker, named_step,
             fs::path(step_directory(".", metadata.step)).filename().string());
  return metadata;
}

namespace {

// File `file` of the checkpoint in `directory` as `info` records it: there, a regular file of
// its size, readable by this process (stat and access only: no byte read). `needed_by` says
// which entry needs it, where one does.
void check_file(const std::string& directory, const std::string& file, const FileInfo& info,
                const std::string& needed_by = "") {
  const fs::path path = fs::path(directory) / file;
  const std::string need = needed_by.empty() ? "" : fmt::format("; entry '{}' needs it", needed_by);
  LOOM_CHECK(path_exists(path), "checkpoint '{}': file {} (written by rank {}) is missing{}",
             directory, file, info.writer, need);
  std::error_code error;
  LOOM_CHECK(fs::is_regular_file(path, error),
             "checkpoint '{}': file {} (written by rank {}) is not a regular file{}", directory,
             file, info.writer, need);
  const auto bytes = fs::file_size(path, error);
  LOOM_CHECK(!error && static_cast<int64_t>(bytes) == info.bytes,
             "checkpoint '{}': file {} (written by rank {}) has {} bytes, the metadata records "
             "{}: it is truncated or was overwritten{}",
             directory, file, info.writer, error ? -1 : static_cast<int64_t>(bytes), info.bytes,
             need);
  LOOM_CHECK(::access(path.c_str(), R_OK) == 0,
             "checkpoint '{}': file {} (written by rank {}) cannot be read: {}{}", directory, file,
             info.writer, std::strerror(errno), need);
}

}  // namespace

void check_files(const std::string& directory, const Metadata& metadata) {
  for (const auto& [file, info] : metadata.files) check_file(directory, file, info);
}

VerifySummary verify(const std::string& directory) {
  const Metadata metadata = read_metadata(directory);
  VerifySummary summary{.entries = static_cast<int64_t>(metadata.entries.size())};
  // Each file whole: its size and SHA-256, then every chunk in it.
  std::map<std::string, std::vector<const Chunk*>> chunks_of;
  std::map<const Chunk*, std::string> entry_of;
  for (const auto& [name, entry] : metadata.entries) {
    for (const Chunk& chunk : entry.chunks) {
      LOOM_CHECK(metadata.files.count(chunk.file),
                 "checkpoint '{}': entry '{}' has a chunk in {}, which the metadata does not list",
                 directory, name, chunk.file);
      chunks_of[chunk.file].push_back(&chunk);
      entry_of[&chunk] = name;
    }
  }
  for (const auto& [file, info] : metadata.files) {
    const std::string path = (fs::path(directory) / file).string();
    check_file(directory, file, info);
    const std::vector<char> bytes = read_range(path, 0, info.bytes);
    LOOM_CHECK(sha256_hex(bytes.data(), bytes.size()) == info.sha256,
               "checkpoint '{}': file {} (written by rank {}): SHA-256 mismatch, the bytes on "
               "disk are not the bytes saved",
               directory, file, info.writer);
    for (const Chunk* chunk : chunks_of[file]) {
      LOOM_CHECK(chunk->offset >= 0 && chunk->offset + chunk->length <= info.bytes &&
                     sha256_hex(bytes.data() + chunk->offset, chunk->length) == chunk->sha256,
                 "checkpoint '{}': entry '{}', block {} in {} (written by rank {}): SHA-256 "
                 "mismatch",
                 directory, entry_of[chunk], chunk->box.str(), file, chunk->writer);
    }
    summary.files += 1;
    summary.bytes += info.bytes;
  }
  return summary;
}

Metadata load(StateDict& state, const std::string& directory, comm::ProcessGroup* world) {
  NoGradGuard no_grad;
  Metadata metadata;
  const std::string error = error_of([&] {
    metadata = read_metadata(directory);
    by_name(state);  // checks that a name listed twice is the same piece
    // Every listed tensor is a destination, a name listed twice included (a pipeline rank holding
    // both copies of a tied embedding loads both).
    std::vector<LoadRequest> requests;
    std::vector<const Tensor*> destinations;
    for (const auto& [name, tensor] : state.tensors) {
      if (state.optional.contains(name) && !metadata.entries.contains(name)) continue;
      requests.push_back({name, tensor.dtype(), global_shape(tensor), local_part(tensor).second});
      destinations.push_back(&tensor);
    }
    const std::vector<ReadItem> reads = plan_load(metadata, requests, directory);
    // Every file read: it exists with the size the metadata records.
    std::map<std::string, bool> checked;
    for (const ReadItem& read : reads) {
      if (checked[read.chunk.file]) continue;
      checked[read.chunk.file] = true;
      check_file(directory, read.chunk.file, metadata.files.at(read.chunk.file),
                 requests[read.request].name);
    }
    for (const ReadItem& read : reads) {
      const LoadRequest& request = requests[read.request];
      const Chunk& chunk = read.chunk;
      const std::vector<char> bytes =
          read_range((fs::path(directory) / chunk.file).string(), chunk.offset, chunk.length);
      if (sha256_hex(bytes.data(), bytes.size()) != chunk.sha256) {
        // Damaged on disk: the same on every try (an InputError: a job exits 2, not restarted).
        throw InputError(fmt::format(
            "checkpoint '{}': entry '{}', block {} in {} (written by rank {}): SHA-256 mismatch, "
            "the bytes on disk are not the bytes saved",
            directory, request.name, chunk.box.str(), chunk.file, chunk.writer));
      }
      Tensor saved = ops::empty(chunk.box.sizes, request.dtype);
      std::memcpy(saved.raw_data(), bytes.data(), bytes.size());
      const auto [local, origin] = local_part(*destinations[read.request]);
      ops::copy_(narrow_to(local, origin, read.overlap),
                 ops::to(narrow_to(saved, chunk.box, read.overlap), local.device()));
    }
  });
  if (world) {
    agree_on_success(*world, fmt::format("checkpoint load of '{}'", directory), error);
  } else if (!error.empty()) {
    if (error[0] == kInputErrorMark) throw InputError(error.substr(1));
    LOOM_FAIL("{}", error);
  }
  return metadata;
}

}  // namespace loom::checkpoint
