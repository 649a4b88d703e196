// A training job's settings (torchtitan's JobConfig): one struct, and one table of options
// that gives each setting its TOML section and key, its command-line flag, its help and its
// valid values. The job's flags, its config file (`--config job.toml`), the effective config it
// prints and writes, and every value check come from that table, so a setting is declared once.
//
//   [parallel]            <->  --dp 2, --tp 2, --sequence-parallel / --no-sequence-parallel
//   dp = 2
//   tp = 2
//
// Values are checked where they come from, naming it: "job.toml: [training] steps: expected a
// positive integer, got 0" or "--steps: expected a positive integer, got '0'". Unknown keys and
// sections are errors naming them (and the keys that exist).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "models/family.h"
#include "train/parallel_dims.h"

namespace loom::train {

struct JobConfig {
  // --config's path, where the job was read from (not a key of the file itself): an input no
  // output may overwrite.
  std::string config_file;
  // [model]
  std::string model = "tiny";  // a registered family's preset (models/family.h)
  int64_t n_layer = 0, n_head = 0, n_kv_heads = 0, n_embd = 0, ffn_dim = 0;  // 0: the preset's
  int64_t block_size = 0;  // the context; 0: the preset's
  int64_t vocab_size = 0;  // 0: the preset's (tiny, llama-tiny: the data's); larger pads
  double rope_theta = 0;   // 0: the preset's
  // Mixture of experts (Llama; models::MoESizes: "not given" keeps the preset's).
  int64_t moe_experts = 0, moe_top_k = 0, moe_hidden_dim = 0, moe_shared_experts = -1;
  std::string moe_score_func;
  int64_t moe_route_norm = -1;
  double moe_aux_loss_coeff = -1, moe_bias_update_rate = -1, moe_capacity_factor = -1;
  int64_t moe_dense_layers = -1;
  // Dropout in training (GPT; HF's resid_pdrop/embd_pdrop and attn_pdrop): 0 is off.
  double dropout = 0, attn_dropout = 0;
  // [parallel] (data_parallel_dims() resolves the data-parallel degrees)
  int64_t dp = 0;            // DDP's shorthand for dp_replicate; 0: not given
  int64_t dp_replicate = 0;  // 0: --dp's, else 1 (2 when no data-parallel degree is given at all)
  int64_t dp_shard = 1;      // FSDP's shards; -1: the ranks the other degrees leave of nproc
  int64_t tp = 2, pp = 1;
  int64_t cp = 1;               // context parallelism: each sequence over cp ranks
  int64_t ep = 1;               // expert parallelism: each MoE's experts over ep of dp_shard x cp
  bool cp_load_balance = true;  // the head-tail split of each sequence's chunks
  std::string cp_attention = "allgather";
  int64_t nproc = 0;  // ranks to start without a launcher; 0: the product of the degrees
  bool sequence_parallel = true;
  bool sequence_parallel_regather = true;
  int64_t grad_accum = 1;
  std::string schedule = "1f1b";
  int64_t microbatches = 0;  // 0: pp x virtual_stages
  int64_t virtual_stages = 1;
  std::string layers_per_stage;  // "3,5,5,3": each pipeline stage's layers; "": an even split
  // [training]
  int64_t steps = 300;
  int64_t batch_size = 16;  // global, in sequences per optimizer step
  int64_t seq_len = 64;
  double lr = 3e-3;
  double clip = 1.0;
  int64_t seed = 1337;
  std::string mixed_precision = "none";  // none | bf16
  std::string device = "auto";           // auto | cpu | cuda
  // none | full | selective-op | selective-layer:N: what recomputes its activations in backward
  std::string activation_checkpoint = "none";
  bool meta_init = true;  // build on meta, materialize each rank's shards (parallel/build_stage.h)
  // [comm]
  double collective_timeout_s = 0;  // store and collective timeout; 0: $LOOM_TIMEOUT_S, else 300 s
  // Fault tolerance across replicas (parallel/ft): this job is replica `replica` of `replicas`
  // jobs that share a quorum store at `replica_store` ("host:port", e.g. a `lighthouse`); each
  // step's gradient is averaged over the replicas that take part (CPU ranks). 1: off.
  int64_t replicas = 1;
  int64_t replica = 0;
  std::string replica_store;
  int64_t replica_join_window_ms = 1000;
  // A reference for replicas: replay the members a replica recorded per step (its --metrics-out)
  // on this one job, each step averaging the members' batches' gradients (no replicas of its own).
  std::string replica_replay;
  // [data]
  // Token shards and text files: a path, a folder, a glob, or several separated by commas
  // (data/token_corpus.h).
  std::string data = "/usr/share/common-licenses/GPL-3";
  std::string tokenizer;  // a Hugging Face tokenizer.json for text data; empty: byte tokens
  // Special tokens spelled in the text are encoded as text, as `loom tokenize` and llm.c do
  // (data/tokenizer.h's TokenizerOptions); false: matched, as HF's default encode does.
  bool split_special_tokens = true;
  // Sample only sequences inside one document (documents start at document_token).
  bool document_boundaries = false;
  int64_t document_token = -1;  // -1: the tokenizer's document_start(), or GPT-2's 50256
  std::string val_data;         // held-out tokens, read as --data is; empty: no validation
  int64_t val_every = 0;        // validate every N steps and after the last (0: after the last)
  int64_t val_steps = 0;        // batches per validation (0: all the val data holds, at most 20)
  // [checkpoint]
  std::string init_from;         // a Hugging Face checkpoint of the model's family to start from
  std::string save;              // ... to write after training
  std::string checkpoint_dir;    // distributed checkpoints (checkpoint/); empty: none
  int64_t checkpoint_every = 0;  // save every N steps and after the last (0: after the last)
  int64_t keep_last = 0;         // keep the newest K (0: all)
  bool resume = false;           // from the latest committed step in checkpoint_dir
  // When a rank fails, loomrun restarts the job up to this many times, which then resumes from
  // the latest committed checkpoint in checkpoint_dir (LOOM_RESTART_COUNT > 0 acts as resume).
  int64_t max_restarts = 0;
  bool async_checkpoint = false;  // stage to host memory, write and commit in the background
  // [output] (an empty path: not written)
  std::string metrics_out = "loom_train_metrics.jsonl";
  std::string plot_out = "loom_train_loss.png";
  int64_t sample_tokens = 200;
  int64_t log_every = 10;
  bool progress = true;
  // Time every op and scope (base/profiler.h) over the steps after the first; rank 0 prints
  // the table at the end (on a GPU each op waits for its kernels).
  bool profile_ops = false;
  // [plan] the machine `loom plan` predicts the step time on (0: this one's calibration)
  double plan_rank_tflops = 0;     // matrix-product TFLOP/s of one rank
  double plan_link_gbps = 0;       // GB/s of one link
  double plan_latency_us = 0;      // one collective step; 0: 10
  double plan_peak_tflops = 0;     // one rank's peak, for MFU
  double plan_memory_gbps = 0;     // one rank's memory bandwidth (elementwise ops)
  std::string plan_dim_link_gbps;  // "dp_shard=25,pp=25": links of these mesh dims
  // loom plan --search (train/layout_search.h): choose the layout over the job's ranks.
  bool search = false;
  int64_t search_top = 5;        // layouts printed in full
  double search_budget_s = 0;    // stop tracing after this long (0: none)
  double search_memory_gib = 0;  // per rank (0: no limit)
  int64_t search_jobs = 0;       // traces at once (0: one per core)
  bool search_cp = false;        // also vary context parallelism (long sequences)
  bool search_ep = true;         // also vary expert parallelism (MoE models)
  bool search_bound = true;      // skip layouts whose lower bound cannot beat the best
  bool search_cache = true;      // reuse and keep traces (train/trace_cache.h)

  // The [model] sizes as every family takes them.
  models::ModelSizes sizes() const;
};

// A value as a source gives it: TOML's own types, or a command line's text.
using OptionValue = std::variant<int64_t, double, bool, std::string>;

struct JobOption {
  // kPresetOrNonNegative: -1 (keep the preset's value) or >= 0; kDefaultOrNonNegative: -1 (a
  // value the job works out, e.g. the tokenizer's document token) or >= 0.
  // kPresetOrSwitch: -1 (the preset's), 0 (off) or 1 (on).
  enum class Range {
    kAny,
    kPositive,
    kNonNegative,
    kPresetOrNonNegative,
    kDefaultOrNonNegative,
    kPresetOrSwitch
  };
  using Field = std::variant<int64_t JobConfig::*, double JobConfig::*, bool JobConfig::*,
                             std::string JobConfig::*>;
  std::string_view section;
  std::string_view key;  // also the flag: --key with '-' for '_'
  std::string_view help;
  Field field;
  Range range = Range::kAny;
  std::vector<std::string_view> choices = {};  // a string option's allowed values (empty: any)
  // A string option's form, when choices cannot list it ("selective-layer:N"): throws naming
  // `where` (the flag, or the job file's section and key) as the job's own parser would.
  void (*check_text)(std::string_view text, std::string_view where) = nullptr;

  std::string flag() const;  // "--batch-size"
  bool is_bool() const { return std::holds_alternative<bool JobConfig::*>(field); }
};

// The job's parallel degrees (torchtitan's data_parallel_replicate_degree / _shard_degree):
//   - dp is dp_replicate's shorthand (giving both, differently, is an error naming both);
//   - no data-parallel degree given at all (dp, dp_replicate 0 and dp_shard 1): dp_replicate 2,
//     the default job's dp 2 x tp 2;
//   - dp_shard -1: the ranks the others leave of `world_size` (the launcher's WORLD_SIZE, or
//     nproc; 0 when neither is known, an error naming --nproc).
// Throws loom::Error naming the flag and the value for degrees below 1 (dp_shard -1 aside).
ParallelDims data_parallel_dims(const JobConfig& config, int64_t world_size);

// The data-parallel degrees resolved into `config` (so the effective config repeats the run):
// --dp as dp_replicate, the default dp 2, --dp-shard -1 against `world_size` (a launcher's
// world, train/launch.h; 0: --nproc). A --nproc that is not the degrees' product is an error
// naming both. Idempotent.
void resolve_parallel_degrees(JobConfig& config, int64_t world_size = 0);

// --layers-per-stage "3,5,5,3": the counts, each a positive integer; "" none. Throws naming
// `where` (the flag, or the job file's section and key) and the part that is not a count. How
// many stages and layers they must make is checked against the schedule and the model by
// ParallelConfig.
std::vector<int64_t> parse_layers_per_stage(const std::string& text, const std::string& where);

// Every option, in the order the config prints them (by section).
std::span<const JobOption> job_options();

// Sets `option`'s field of `config` from a value. `where` names the source in errors
// ("job.toml: [training] steps" or "--steps"). A string value is parsed to the option's kind
// (the command line's case); a TOML value must have the option's type (an integer is accepted
// for a float). Throws loom::Error naming `where`, what was expected and what was given.
void set_option(JobConfig& config, const JobOption& option, const OptionValue& value,
                const std::string& where);

// The option's value in `config`, as TOML text ("2", "3.0e-03", "true", "\"1f1b\"").
std::string option_toml(const JobConfig& config, const JobOption& option);

// Reads a TOML job file into `config` (keys it lacks keep their values). Throws loom::Error
// naming the path for a missing or unreadable file or a TOML syntax error (with line and column),
// and naming the section and key for an unknown one or a bad value.
void load_job_toml(JobConfig& config, const std::string& path);

// The path the effective config is written to, beside the metrics: m.jsonl -> m.config.toml.
std::string effective_config_path(const std::string& metrics_out);

// The whole config as a TOML document, one section per group, every key present: what the job
// prints at start and writes beside its metrics, and what `--config` reads back to repeat a run.
std::string to_toml(const JobConfig& config);

}  // namespace loom::train
