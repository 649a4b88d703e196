#include "train/job_checks.h"

#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/durable_file.h"
#include "base/error.h"
#include "base/logging.h"
#include "base/profiler.h"
#include "checkpoint/distributed_checkpoint.h"
#include "comm/flight_recorder.h"
#include "comm/gloo/process_group_gloo.h"
#include "comm/init.h"
#include "comm/launch_env.h"
#include "models/hf/checkpoint.h"
#include "models/hf/config_json.h"
#include "models/hf/token_settings.h"
#include "nn/layers.h"
#include "parallel/cp/context_parallel.h"
#include "tensor/device.h"
#include "train/checkpoint_fields.h"
#include "train/fault_injection.h"
#include "train/job_paths.h"
#include "train/launch.h"
#include "train/trainer.h"

namespace loom::train {

namespace fs = std::filesystem;

namespace {

// --init-from: the tensors' names, shapes and dtypes against the model, from headers only.
void check_init_from(const JobConfig& job, const models::ModelArgs& args) {
  const auto adapter = args.hf_adapter();
  LOOM_CHECK(adapter != nullptr, "--init-from: {}", args.no_hf_format());
  DefaultDeviceGuard on_meta(Device::meta());  // shapes, no values
  const std::shared_ptr<nn::Module> model = args.whole_model();
  const std::vector<std::string> names =
      args.spec(0, {}).parameter_names(pipeline::StageRange::whole(args.n_layers()));
  try {
    models::hf::check(*model, *adapter, job.init_from, names, "--init-from");
  } catch (const Error& e) {
    // Without config.json the sizes were the preset's and the flags': say so before the
    // mismatches.
    std::error_code ec;
    const std::string config_json = models::hf::config_json_path(job.init_from);
    if (fs::exists(config_json, ec)) throw;
    LOOM_FAIL(
        "--init-from: there is no config.json beside the weights ('{}'), so the model's sizes are "
        "--model {}'s and the flags', and the checkpoint does not fit them; put its config.json "
        "there, or give the sizes it was saved with. {}",
        config_json, job.model, e.what());
  }
}

// --init-from's dropout, which transformers trains with (GPT-2's released config says 0.1) and
// Loom does not read (a job's --dropout and --attn-dropout decide, and --save writes them): a
// warning for each key of its config.json that differs from the job's, naming the flag to give.
std::vector<std::string> dropout_warnings(const JobConfig& job) {
  const std::string path = models::hf::config_json_path(job.init_from);
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return {};
  const models::hf::ConfigJson json = models::hf::ConfigJson::read(path);
  // Each flag and the keys it stands for (GPT-2's resid and embd pdrops are one --dropout).
  struct Flag {
    const char* flag;
    double job;
    std::vector<const char*> keys;
  };
  std::vector<std::string> warnings;
  for (const Flag& f :
       {Flag{"--dropout", job.dropout, {"resid_pdrop", "embd_pdrop"}},
        Flag{"--attn-dropout", job.attn_dropout, {"attn_pdrop", "attention_dropout"}}}) {
    std::vector<std::string> said;
    std::optional<double> first;
    for (const char* key : f.keys) {
      if (!json.has(key) || json.number(key) == f.job) continue;
      said.push_back(fmt::format("\"{}\": {}", key, json.number(key)));
      if (!first) first = json.number(key);
    }
    if (said.empty()) continue;
    warnings.push_back(fmt::format(
        "WARNING: --init-from: '{}' says {} (transformers trains with it), but this job trains "
        "with {} {}: Loom's dropout is the job's option, not the file's (--save writes the job's); "
        "give {} {} to train as transformers would{}",
        path, fmt::join(said, ", "), f.flag, f.job, f.flag, *first,
        said.size() > 1 ? " (Loom takes one value for these keys)" : ""));
  }
  return warnings;
}

// With a config.json the model is --init-from's: --model picks only its family. A warning when
// --model names a preset of other sizes, which is not the model trained.
std::optional<std::string> preset_size_warning(const JobConfig& job, const JobModel& model) {
  std::error_code ec;
  // A family's default preset (what a job without --model takes) names no size the user chose.
  if (job.model == model.family->presets().front() ||
      !fs::exists(models::hf::config_json_path(job.init_from), ec)) {
    return std::nullopt;
  }
  const auto preset = model.family->from_preset(job.model, job.sizes());
  // A preset's vocabulary may be the data's (byte tokens): the file's is the one to compare.
  preset->set_vocab_size(model.args->vocab_size());
  if (preset->parameter_count() == model.args->parameter_count()) return std::nullopt;
  return fmt::format(
      "WARNING: --model {}: the model is --init-from's ({}), not the preset's sizes ({} "
      "parameters); --model picks only the family (any of its presets does)",
      job.model, model.args->summary(), preset->parameter_count());
}

// What tells one run's saves from another's: its model (what it is, not its `training` fields,
// which a resume may change) and what decides its batches (data, seed, batch, sequence,
// documents), as flat "key": value pairs.
std::map<std::string, std::string> run_identity(
    const checkpoint::Metadata& metadata, const std::vector<models::TrainingField>& training) {
  std::map<std::string, std::string> out;
  const auto model = metadata.extra.find("model");
  if (model != metadata.extra.end() && model->is_object()) {
    const nlohmann::json what_it_is = without_training_fields(*model, training);
    for (const auto& [key, value] : what_it_is.items()) out["model " + key] = value.dump();
  }
  const auto run = metadata.extra.find("run");
  if (run != metadata.extra.end() && run->is_object()) {
    if (run->contains("data") && run->at("data").is_object()) {
      out["data sha256"] = run->at("data").value("sha256", "");
    }
    for (const char* key : kRunBatchKeys) {
      if (run->contains(key)) out[key] = run->at(key).dump();
    }
  }
  return out;
}

// Every committed step under `root` is of the run that saved `latest`: a folder mixing two runs'
// steps is refused, as a new run into a used folder is, where a resume would take whichever is
// newest and a later fallback another run's step. Fields a step does not record (an older Loom)
// are not compared.
// An older step that is damaged (metadata that cannot be read, a rank file missing, short or
// unreadable) is a warning, not a refusal: the latest is whole.
void check_one_run(const std::string& root, int64_t latest, const checkpoint::Metadata& saved,
                   const std::vector<models::TrainingField>& training,
                   std::vector<std::string>& warnings) {
  const std::map<std::string, std::string> mine = run_identity(saved, training);
  for (int64_t step : checkpoint::committed_steps(root)) {
    if (step == latest) continue;
    std::map<std::string, std::string> other;
    try {
      const std::string dir = checkpoint::step_directory(root, step);
      const checkpoint::Metadata metadata = checkpoint::read_metadata(dir);
      other = run_identity(metadata, training);
      checkpoint::check_files(dir, metadata);  // its rank files there, whole and readable
    } catch (const Error& e) {
      warnings.push_back(fmt::format(
          "WARNING: --checkpoint-dir: step {} is damaged ({}); resuming from the latest step {}, "
          "but no resume could fall back to step {}",
          step, e.what(), latest, step));
      if (other.empty()) continue;  // its metadata unread: nothing to compare
    }
    std::vector<std::string> differences;
    for (const auto& [key, value] : other) {
      const auto it = mine.find(key);
      if (it != mine.end() && it->second != value) {
        differences.push_back(
            fmt::format("{} {} at step {}, {} at step {}", key, value, step, it->second, latest));
      }
    }
    LOOM_CHECK(differences.empty(),
               "--checkpoint-dir: '{}' mixes two runs' steps: step {} and the latest, step {}, "
               "differ in {}; keep one run's steps in a folder (move the others away)",
               root, step, latest, fmt::join(differences, "; "));
  }
}

// The model's parameters, their AdamW state and its modules' state (MoE routing biases, dropout
// counts) in a checkpoint (Trainer::parameter_entries, module_entries): the names, global shapes
// and dtypes of the model this job builds (whole, on the meta device).
// Each rank's load would refuse a difference too, but only once the ranks started, each saying
// so; a metadata file edited (its marker rewritten) to fit no model is refused here.
// Returns a warning naming the model's dropout modules whose state the checkpoint lacks (they start
// a fresh mask stream: Trainer::load_checkpoint), listed from the whole model, so every pipeline
// stage's are named, not only rank 0's.
std::optional<std::string> check_saved_parameters(const checkpoint::Metadata& metadata,
                                                  const models::ModelArgs& args,
                                                  const std::string& dir, std::string_view what) {
  DefaultDeviceGuard on_meta(Device::meta());  // shapes, no values
  const std::shared_ptr<nn::Module> model = args.whole_model();
  std::vector<Trainer::SavedEntry> wanted;
  for (const auto& [name, p] : model->named_parameters()) {
    for (Trainer::SavedEntry& entry : Trainer::parameter_entries(name, p.shape(), p.dtype())) {
      wanted.push_back(std::move(entry));
    }
  }
  for (Trainer::SavedEntry& entry : Trainer::module_entries(*model)) {
    wanted.push_back(std::move(entry));
  }
  std::vector<std::string> problems, fresh;
  std::set<std::string> expected;
  for (const Trainer::SavedEntry& want : wanted) {
    expected.insert(want.key);
    const auto it = metadata.entries.find(want.key);
    if (it == metadata.entries.end()) {
      // A dropout module the saving model lacked starts a fresh stream (warned about below).
      if (want.optional) {
        fresh.push_back(want.key);
      } else {
        problems.push_back(fmt::format("'{}' is missing", want.key));
      }
    } else if (it->second.shape != want.shape || it->second.dtype != want.dtype) {
      problems.push_back(fmt::format("'{}' is {} {} there, the model's is {} {}", want.key,
                                     checkpoint::dtype_key(it->second.dtype),
                                     shape_str(it->second.shape), checkpoint::dtype_key(want.dtype),
                                     shape_str(want.shape)));
    }
  }
  for (const auto& [key, entry] : metadata.entries) {
    if ((key.starts_with("model/") || key.starts_with("optim/")) && !expected.contains(key)) {
      problems.push_back(fmt::format("'{}' belongs to no parameter of the model", key));
    } else if (key.starts_with("moe/") && !expected.contains(key)) {
      problems.push_back(
          fmt::format("'{}' belongs to no mixture-of-experts layer of the model", key));
    }
  }
  const size_t shown = std::min<size_t>(problems.size(), 10);
  LOOM_CHECK(
      problems.empty(),
      "{}{}checkpoint '{}' does not hold this model's parameters ({} problem(s){}: "
      "{}); its metadata does not match the model its fields describe, so it was edited or "
      "damaged: resume from another step",
      what, what.empty() ? "" : ": ", dir, problems.size(),
      shown < problems.size() ? fmt::format(", the first {}", shown) : "",
      fmt::join(problems.begin(), problems.begin() + static_cast<std::ptrdiff_t>(shown), "; "));
  if (fresh.empty()) return std::nullopt;
  return fmt::format(
      "WARNING: {}{}checkpoint '{}' holds no state of {} dropout module(s) ({}; saved by a "
      "model without them, as without attention dropout, or by a Loom that saved none): their "
      "masks start a fresh stream",
      what, what.empty() ? "" : ": ", dir, fresh.size(),
      fresh.size() <= 3 ? fmt::format("{}", fmt::join(fresh, ", "))
                        : fmt::format("{}, {} and {} more", fresh[0], fresh[1], fresh.size() - 2));
}

// --resume: the latest committed step's model and run, and what no save committed.
void check_resume(const JobConfig& job, const models::ModelArgs& args, CheckedJob& out) {
  const nlohmann::json model_fields = args.fields();
  checkpoint::check_no_misnamed_steps(job.checkpoint_dir, "--checkpoint-dir");
  const std::vector<std::string> uncommitted =
      checkpoint::uncommitted_step_directories(job.checkpoint_dir);
  const auto latest = checkpoint::latest_committed_step(job.checkpoint_dir);
  if (!uncommitted.empty()) {
    out.warnings.push_back(fmt::format(
        "WARNING: --checkpoint-dir '{}' holds {} step folder(s) no save committed ({}){}; the next "
        "save deletes them",
        job.checkpoint_dir, uncommitted.size(), fmt::join(uncommitted, ", "),
        latest ? fmt::format(", resuming from the latest committed step {}", *latest)
               : ", and NO committed step: starting from step 0"));
  }
  if (!latest) {
    if (uncommitted.empty()) {
      out.warnings.push_back(
          fmt::format("WARNING: --resume: no committed checkpoint in '{}'; starting at step 0",
                      job.checkpoint_dir));
    }
    return;
  }
  const std::string dir = checkpoint::step_directory(job.checkpoint_dir, *latest);
  if (!job.init_from.empty()) {
    // The checkpoint's weights replace the file's: say so, where the file seemed to be used.
    out.warnings.push_back(fmt::format(
        "WARNING: --init-from '{}' gives the sizes and tokens only: --resume continues from "
        "step {} in '{}', whose weights replace the file's",
        job.init_from, *latest, job.checkpoint_dir));
  }
  const checkpoint::Metadata metadata = checkpoint::read_metadata(dir);
  checkpoint::check_files(dir, metadata);  // each rank's file there, whole and readable
  Trainer::saved_step(metadata, dir);
  for (std::string& warning :
       check_same_model(metadata, model_fields, dir, args.training_fields())) {
    out.warnings.push_back(std::move(warning));
  }
  if (auto warning = check_saved_parameters(metadata, args, dir, "--resume")) {
    out.warnings.push_back(std::move(*warning));
  }
  for (std::string& warning : check_same_run(metadata, out.run, dir)) {
    out.warnings.push_back(std::move(warning));
  }
  check_one_run(job.checkpoint_dir, *latest, metadata, args.training_fields(), out.warnings);
  out.resume_from = dir;
  out.saved_loss = saved_loss(metadata);
  // The run's Hugging Face settings travel with its checkpoints when --init-from is not given.
  if (const auto hf = metadata.extra.find("hf");
      job.init_from.empty() && hf != metadata.extra.end()) {
    out.hf_token_settings = *hf;
  }
}

// --replica-replay: the members of every step, from a replica's metrics ("replica_members").
// Throws naming the file and line when a line is not one, and the file when none is.
std::map<int, std::vector<int>> read_replica_members(const std::string& path) {
  std::ifstream in(path);
  LOOM_CHECK(in.good(), "--replica-replay: cannot read '{}'", path);
  std::map<int, std::vector<int>> members;
  int line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.empty()) continue;
    const nlohmann::json entry = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!entry.is_object() || !entry.contains("replica_members")) continue;
    const nlohmann::json& step = entry.value("step", nlohmann::json());
    const nlohmann::json& ids = entry.at("replica_members");
    bool valid = step.is_number_integer() && ids.is_array() && !ids.empty();
    for (const nlohmann::json& id : ids) valid = valid && id.is_number_integer();
    LOOM_CHECK(valid,
               "--replica-replay: '{}' line {}: expected an integer \"step\" and a non-empty "
               "list of replica ids in \"replica_members\", got {}",
               path, line_number, line.substr(0, 200));
    members[step.get<int>()] = ids.get<std::vector<int>>();
  }
  LOOM_CHECK(!members.empty(),
             "--replica-replay: '{}' records no step's members (a replica's --metrics-out has "
             "\"replica_members\" per step)",
             path);
  return members;
}

// Replicas (--replicas, --replica, --replica-store, --replica-replay): before any rank starts.
// Returns --replica-replay's members per step (none without it).
std::map<int, std::vector<int>> check_replicas(const JobConfig& job) {
  if (!job.replica_replay.empty()) {
    check_readable_file(job.replica_replay, "--replica-replay");
    // A replay is one job: a replica job's flags would be ignored.
    LOOM_CHECK(job.replica_store.empty() && job.replica == 0,
               "--replica-replay: replays the replicas on this one job; --replica-store and "
               "--replica are a replica job's (got '{}' and {}): drop them",
               job.replica_store, job.replica);
    std::map<int, std::vector<int>> replay = read_replica_members(job.replica_replay);
    for (const auto& [step, members] : replay) {
      for (const int id : members) {
        LOOM_CHECK(id >= 0 && id < job.replicas,
                   "--replica-replay: '{}' has replica {} among step {}'s members, not in [0, "
                   "{}) (--replicas {}): give the replicas' count that run had",
                   job.replica_replay, id, step, job.replicas, job.replicas);
      }
    }
    return replay;
  }
  // Checked with one replica too: the replica's index picks its share of the batch, so a stray
  // --replica 5 would train on other sequences than the job's.
  LOOM_CHECK(job.replica >= 0 && job.replica < job.replicas,
             "--replica {} is not in [0, {}) (--replicas {}){}", job.replica, job.replicas,
             job.replicas,
             job.replicas == 1 ? "; a job that is one of several replicas needs --replicas N" : "");
  if (job.replicas <= 1) {
    LOOM_CHECK(job.replica_store.empty() &&
                   job.replica_join_window_ms == JobConfig{}.replica_join_window_ms,
               "--replica-store and --replica-join-window-ms: need --replicas N > 1 (this job "
               "is one replica of N that share the store); got --replicas {}",
               job.replicas);
    return {};
  }
  LOOM_CHECK(job.device != "cuda",
             "--replicas: fault tolerance across replicas runs on CPU ranks (Gloo), not with "
             "--device cuda");
  parse_host_port(job.replica_store, "--replica-store");
  return {};
}

// A new run (no --resume) into a folder holding another run's committed steps would mix them:
// its saves beside those steps, a later --resume taking whichever is newest. Refused.
void check_fresh_checkpoint_dir(const JobConfig& job) {
  checkpoint::check_no_misnamed_steps(job.checkpoint_dir, "--checkpoint-dir");
  const std::vector<int64_t> steps = checkpoint::committed_steps(job.checkpoint_dir);
  LOOM_CHECK(steps.empty(),
             "--checkpoint-dir: '{}' already holds {} committed step(s) of a run (the latest, "
             "step {}, in '{}'); pass --resume to continue that run, or give an empty or new "
             "folder (or remove those steps) to start a new one",
             job.checkpoint_dir, steps.size(), steps.back(),
             checkpoint::step_directory(job.checkpoint_dir, steps.back()));
}

}  // namespace

HostPort parse_host_port(const std::string& text, std::string_view flag) {
  const size_t colon = text.rfind(':');
  const std::string port = colon == std::string::npos ? "" : text.substr(colon + 1);
  const bool digits =
      !port.empty() && port.size() <= 5 &&
      std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
  const int number = digits ? std::stoi(port) : 0;
  LOOM_CHECK(colon != std::string::npos && colon > 0 && number >= 1 && number <= 65535,
             "{}: expected host:port with a port in [1, 65535] (where the replicas' quorum store "
             "is served, e.g. by `lighthouse`), got '{}'",
             flag, text);
  return {text.substr(0, colon), number};
}

ParallelConfig parallel_config(const JobConfig& given) {
  JobConfig job = given;
  resolve_parallel_degrees(job);  // --dp, the default dp 2, --dp-shard -1
  return {.dims = {.pp = job.pp,
                   .dp_replicate = job.dp_replicate,
                   .dp_shard = job.dp_shard,
                   .cp = job.cp,
                   .tp = job.tp,
                   .ep = job.ep},
          .tp_plan = {.sequence_parallel = job.sequence_parallel,
                      .regather_in_backward = job.sequence_parallel_regather},
          .grad_accum = static_cast<int>(job.grad_accum),
          .pipeline = {.schedule = job.schedule,
                       .microbatches = static_cast<int>(job.microbatches),
                       .virtual_stages = static_cast<int>(job.virtual_stages),
                       .layers_per_stage =
                           parse_layers_per_stage(job.layers_per_stage, "--layers-per-stage")},
          // Logits stay bf16 (torch FSDP2's default, output_dtype None): the loss reads them as
          // they are and computes in f32 (ops::cross_entropy), and pipeline stages send bf16
          // activations; both bit-identical to f32 outputs, since bf16 -> f32 -> bf16 is exact.
          .mixed_precision = job.mixed_precision == "bf16"
                                 ? std::optional<nn::MixedPrecisionPolicy>(nn::MixedPrecisionPolicy{
                                       .param_dtype = kBFloat16, .output_dtype = kBFloat16})
                                 : std::nullopt,
          .activation_checkpoint = parallel::ActivationCheckpointing::parse(
              job.activation_checkpoint, "--activation-checkpoint"),
          .meta_init = job.meta_init,
          .cp = {.load_balance = job.cp_load_balance, .attention = job.cp_attention}};
}

// Settings the job was given that nothing reads on its layout: a warning each, since a job file
// may carry them from another layout (a flag alone would be refused, as --microbatches is).
std::vector<std::string> unused_setting_warnings(const JobConfig& job, const ParallelDims& dims) {
  const JobConfig defaults;
  std::vector<std::string> out;
  const auto unused = [&](bool given, std::string_view what, std::string_view why) {
    if (given) out.push_back(fmt::format("WARNING: {}: no effect {}", what, why));
  };
  unused(dims.pp == 1 && job.schedule != defaults.schedule,
         fmt::format("--schedule {}", job.schedule), "without a pipeline (--pp 1)");
  unused(dims.pp == 1 && !job.layers_per_stage.empty(),
         fmt::format("--layers-per-stage {}", job.layers_per_stage), "without a pipeline (--pp 1)");
  unused(dims.cp == 1 && job.cp_attention != defaults.cp_attention,
         fmt::format("--cp-attention {}", job.cp_attention),
         "without context parallelism (--cp 1)");
  unused(dims.cp == 1 && job.cp_load_balance != defaults.cp_load_balance, "--no-cp-load-balance",
         "without context parallelism (--cp 1)");
  unused(!job.search &&
             (job.search_top != defaults.search_top ||
              job.search_budget_s != defaults.search_budget_s ||
              job.search_memory_gib != defaults.search_memory_gib ||
              job.search_jobs != defaults.search_jobs || job.search_cp != defaults.search_cp ||
              job.search_ep != defaults.search_ep || job.search_bound != defaults.search_bound ||
              job.search_cache != defaults.search_cache),
         "--search-*", "without --search (loom plan --search reads them)");
  unused(job.tokenizer.empty() && job.init_from.empty() &&
             job.split_special_tokens != defaults.split_special_tokens,
         "--no-split-special-tokens", "without a tokenizer (--tokenizer or --init-from's)");
  return out;
}

void check_run_environment() {
  comm::check_endpoint_env();  // LOOM_GLOO_IFNAME, LOOM_GLOO_HOSTNAME
  if (const char* dir = std::getenv("LOOM_FLIGHT_RECORDER_DIR"); dir != nullptr && *dir != '\0') {
    check_directory_writable(dir, "LOOM_FLIGHT_RECORDER_DIR");  // loomrun's dumps go there
  }
}

CheckedJob check_job(const JobConfig& job) {
  const std::vector<JobFile> read = check_paths(job);
  std::map<int, std::vector<int>> replay_members = check_replicas(job);
  // The environment the ranks read, once here rather than an error from every rank.
  if (job.collective_timeout_s == 0) comm::timeout_from_env();           // LOOM_TIMEOUT_S
  const std::optional<InjectedFault> fault = injected_fault_from_env();  // LOOM_INJECT_FAULT
  comm::shared_memory_allowed_by_env();                                  // LOOM_GLOO_SHM
  comm::FlightRecorder::capacity_from_env();  // LOOM_FLIGHT_RECORDER_ENTRIES (a plan's groups too)
  profiler::environment_options();            // LOOM_PROFILE
  check_log_level_env();                      // LOOM_LOG_LEVEL
  LOOM_CHECK(
      job.collective_timeout_s == 0 || (job.collective_timeout_s >= comm::kMinTimeoutSeconds &&
                                        job.collective_timeout_s <= comm::kMaxTimeoutSeconds),
      "--collective-timeout-s {}: expected 0 (the default) or from {:g} to {:.0f} seconds",
      job.collective_timeout_s, comm::kMinTimeoutSeconds, comm::kMaxTimeoutSeconds);
  CheckedJob out{.parallel = parallel_config(job)};
  out.replay_members = std::move(replay_members);
  out.parallel.validate(out.parallel.dims.world_size(), job.batch_size, job.seq_len);
  if (job.replicas > 1 && job.replica_replay.empty()) {
    // Each replica trains its share of the global batch (train::local_batch's ReplicaShare).
    const int64_t ways = job.replicas * out.parallel.dims.dp() * out.parallel.grad_accum;
    LOOM_CHECK(job.batch_size % ways == 0,
               "--batch-size {}: a global batch of {} sequences does not split over {} replicas "
               "x dp {} x grad_accum {} = {}",
               job.batch_size, job.batch_size, job.replicas, out.parallel.dims.dp(),
               out.parallel.grad_accum, ways);
    LOOM_CHECK(
        out.parallel.dims.pp == 1 || (job.batch_size / ways) % out.parallel.microbatches() == 0,
        "--batch-size {}: each replica's dp rank's {} sequences per grad_accum step do not "
        "split into {} microbatches",
        job.batch_size, job.batch_size / ways, out.parallel.microbatches());
  }
  // A probe that can never fire would make a fault test pass for nothing.
  LOOM_CHECK(!fault || (fault->rank < out.parallel.dims.world_size() && fault->step < job.steps),
             "LOOM_INJECT_FAULT: rank {}, step {} never comes: the job has {} ranks (0 to {}) "
             "and --steps {} (0 to {})",
             fault ? fault->rank : 0, fault ? fault->step : 0, out.parallel.dims.world_size(),
             out.parallel.dims.world_size() - 1, job.steps, job.steps - 1);
  out.model = resolve_job_model(job);
  out.parallel.stage_ranges(out.model.args->n_layers());  // every stage gets a block
  // Ulysses splits each tp rank's heads over cp: checked here, not in the first forward.
  const auto [q_heads, kv_heads] = out.model.args->attention_heads();
  const ParallelDims& dims = out.parallel.dims;
  if (dims.cp > 1 && out.parallel.cp.attention == "alltoall" && q_heads > 0 &&
      q_heads % dims.tp == 0 && kv_heads % dims.tp == 0) {
    parallel::cp::ulysses_kv_repeat(q_heads / dims.tp, kv_heads / dims.tp, dims.cp);
  }
  for (std::string& warning : unused_setting_warnings(job, out.parallel.dims)) {
    out.warnings.push_back(std::move(warning));
  }
  for (std::string& warning : repeated_data_warnings(read)) {
    out.warnings.push_back(std::move(warning));
  }
  // Replicas exchange only gradients (and the loads that move expert biases): a balancing loss
  // or a capacity is over each replica's share of the batch.
  if (const std::string dependence = out.model.args->layout_dependence();
      job.replicas > 1 && !dependence.empty()) {
    out.warnings.push_back(
        fmt::format("--replicas {}: each replica's ranks are a layout of their own: {}",
                    job.replicas, dependence));
  }
  out.data = open_job_data(job, out.model);
  out.run = run_fields(job, out.data.train);
  if (!job.init_from.empty()) {
    check_init_from(job, *out.model.args);
    for (std::string& warning : dropout_warnings(job)) out.warnings.push_back(std::move(warning));
    if (auto warning = preset_size_warning(job, out.model)) out.warnings.push_back(*warning);
    try {
      out.hf_token_settings = models::hf::read_token_settings(job.init_from);
    } catch (const Error& e) {
      throw Error(fmt::format("--init-from: {}", e.what()));
    }
  }
  // Trained with a tokenizer but started from no checkpoint that names its ids: the tokenizer's,
  // so --save's config.json says where a document starts and ends (transformers would otherwise
  // take GPT-2's 50256, outside a smaller vocabulary, and generate() would never stop).
  // Only ids the model has (an explicit --vocab-size may be smaller than the tokenizer's).
  if (!out.hf_token_settings.contains("token_ids") && out.data.tokenizer) {
    nlohmann::json ids = nlohmann::json::object();
    const int64_t vocab = out.model.args->vocab_size();
    for (const auto& [key, id] : {std::pair{"bos_token_id", out.data.tokenizer->document_start()},
                                  {"eos_token_id", out.data.tokenizer->end_of_text()}}) {
      if (id && *id < vocab) ids[key] = *id;
    }
    if (!ids.empty()) out.hf_token_settings["token_ids"] = ids;
  }
  if (!job.save.empty() && fs::path(job.save).filename() != "model.safetensors") {
    out.warnings.push_back(fmt::format(
        "--save: '{}': transformers' from_pretrained(folder) reads model.safetensors only; this "
        "file loads by its own name (--init-from {})",
        job.save, job.save));
  }
  LOOM_CHECK(job.save.empty() || out.model.args->hf_adapter() != nullptr,
             "--save: {} (--model {}); use --checkpoint-dir for its checkpoints",
             out.model.args->no_hf_format(), job.model);
  // A restarted job (loomrun --max-restarts) resumes from its latest checkpoint, if any.
  if (job.resume || (restart_count() > 0 && !job.checkpoint_dir.empty())) {
    check_resume(job, *out.model.args, out);
  } else if (!job.checkpoint_dir.empty()) {
    check_fresh_checkpoint_dir(job);
  }
  return out;
}

std::vector<std::string> check_checkpoint_contents(const checkpoint::Metadata& metadata,
                                                   const std::string& dir, std::string_view what) {
  const std::unique_ptr<models::ModelArgs> args = saved_model(metadata, dir, what);
  Trainer::saved_step(metadata, dir);
  std::vector<std::string> warnings;
  if (auto warning = check_saved_parameters(metadata, *args, dir, what)) {
    warnings.push_back(std::move(*warning));
  }
  return warnings;
}

}  // namespace loom::train
