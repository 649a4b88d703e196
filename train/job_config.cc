#include "train/job_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "base/error.h"
#include "models/family.h"
#include "parallel/activation_checkpoint.h"

namespace loom::train {

namespace {

using Range = JobOption::Range;
using C = JobConfig;

const std::vector<JobOption>& options() {
  static const std::vector<JobOption> table = {
      {"model", "model", "the model: a preset of a family the program registers (models/family.h)",
       &C::model},
      {"model", "n_layer", "layers (0: the preset's)", &C::n_layer, Range::kNonNegative},
      {"model", "n_head", "attention heads (0: the preset's)", &C::n_head, Range::kNonNegative},
      {"model", "n_kv_heads",
       "key/value heads of grouped-query attention (Llama; 0: the preset's, or n_head when it "
       "does not group)",
       &C::n_kv_heads, Range::kNonNegative},
      {"model", "n_embd", "width (Llama's dim; 0: the preset's)", &C::n_embd, Range::kNonNegative},
      {"model", "ffn_dim", "feed-forward width (Llama's intermediate size; 0: the preset's rule)",
       &C::ffn_dim, Range::kNonNegative},
      {"model", "block_size",
       "context length, the most tokens a sequence may have (0: the preset's)", &C::block_size,
       Range::kNonNegative},
      {"model", "vocab_size",
       "vocabulary size (0: the preset's, or the data's for tiny and llama-tiny; larger pads the "
       "embedding)",
       &C::vocab_size, Range::kNonNegative},
      {"model", "rope_theta", "RoPE base frequency (Llama; 0: the preset's)", &C::rope_theta,
       Range::kNonNegative},
      {"model", "moe_experts",
       "routed experts of each mixture-of-experts layer (Llama; 0: the preset's; on a dense "
       "preset, turns MoE on)",
       &C::moe_experts, Range::kNonNegative},
      {"model", "moe_top_k", "experts each token goes to (0: the preset's, or 2)", &C::moe_top_k,
       Range::kNonNegative},
      {"model", "moe_hidden_dim",
       "each expert's feed-forward width (0: the preset's, or the dense feed-forward's)",
       &C::moe_hidden_dim, Range::kNonNegative},
      {"model", "moe_shared_experts",
       "shared experts every token passes through (-1: the preset's, or 0)", &C::moe_shared_experts,
       Range::kPresetOrNonNegative},
      {"model", "moe_score_func",
       "the router's scores: softmax or sigmoid (DeepSeek-V3: the top-k weights then normalized "
       "to sum 1); empty: the preset's",
       &C::moe_score_func},
      {"model", "moe_aux_loss_coeff",
       "the load-balancing auxiliary loss's coefficient (0: off; -1: the preset's)",
       &C::moe_aux_loss_coeff, Range::kPresetOrNonNegative},
      {"model", "moe_bias_update_rate",
       "auxiliary-loss-free balancing: each step moves every expert's routing bias by this "
       "toward an even load (0: off; -1: the preset's)",
       &C::moe_bias_update_rate, Range::kPresetOrNonNegative},
      {"model", "moe_capacity_factor",
       "each expert takes at most factor x tokens x top_k / experts slots, the rest dropped (0: "
       "dropless; -1: the preset's)",
       &C::moe_capacity_factor, Range::kPresetOrNonNegative},
      {"model", "moe_dense_layers",
       "the first layers that keep a dense feed-forward (-1: the preset's, or 0)",
       &C::moe_dense_layers, Range::kPresetOrNonNegative},
      {"model", "dropout",
       "dropout on embeddings and residual branches in training (GPT: HF's resid_pdrop and "
       "embd_pdrop; 0: off)",
       &C::dropout, Range::kNonNegative},
      {"model", "attn_dropout",
       "dropout on attention probabilities in training, drawn inside the attention kernels "
       "(GPT: HF's attn_pdrop; 0: off)",
       &C::attn_dropout, Range::kNonNegative},
      {"parallel", "dp", "data-parallel replicas (DDP): dp_replicate's shorthand (0: not given)",
       &C::dp, Range::kNonNegative},
      {"parallel", "dp_replicate",
       "data-parallel replicas (DDP, or HSDP's replicate dim; 0: --dp's, else 1, and 2 when no "
       "data-parallel degree is given)",
       &C::dp_replicate, Range::kNonNegative},
      {"parallel", "dp_shard",
       "fully sharded data-parallel degree (FSDP; -1: the ranks the others leave of the world)",
       &C::dp_shard, Range::kAny},
      {"parallel", "tp", "tensor-parallel degree", &C::tp, Range::kPositive},
      {"parallel", "cp",
       "context-parallel degree: every sequence sharded over cp ranks for the whole model "
       "(parallel/cp; with FSDP over dp_shard x cp)",
       &C::cp, Range::kPositive},
      {"parallel", "ep",
       "expert-parallel degree: each mixture-of-experts layer's experts split over ep ranks "
       "taken from the dp_shard x cp ranks (tokens reach their experts by all-to-all; ep must "
       "divide dp_shard x cp and the experts)",
       &C::ep, Range::kPositive},
      {"parallel", "cp_load_balance",
       "with cp > 1, each rank holds two chunks of every sequence, one from each end, so causal "
       "attention's work is even (--no-cp-load-balance: one contiguous chunk per rank)",
       &C::cp_load_balance},
      {"parallel",
       "cp_attention",
       "with cp > 1, how attention reaches the other ranks' keys and values: allgather (K and V "
       "gathered), ring (K and V passed around the ring, overlapped) or alltoall (Ulysses: "
       "sequence <-> heads)",
       &C::cp_attention,
       Range::kAny,
       {"allgather", "alltoall", "ring"}},
      {"parallel", "pp", "pipeline-parallel degree (stages over ranks)", &C::pp, Range::kPositive},
      {"parallel", "nproc",
       "ranks to start without a launcher (0: the product of the degrees; needed for dp_shard "
       "-1)",
       &C::nproc, Range::kNonNegative},
      {"parallel", "sequence_parallel",
       "with tp > 1, norms and dropout on sequence shards (--no-sequence-parallel: off)",
       &C::sequence_parallel},
      {"parallel", "sequence_parallel_regather",
       "with sequence parallelism, attention and feed-forward keep their input's sequence shard "
       "and gather it again in backward, as Megatron does (--no-sequence-parallel-regather: keep "
       "the gathered input, one all-gather fewer per block and step)",
       &C::sequence_parallel_regather},
      {"parallel", "grad_accum",
       "micro-batches per optimizer step (with pp > 1: schedule runs per step, each splitting "
       "its share into the microbatches)",
       &C::grad_accum, Range::kPositive},
      {"parallel",
       "schedule",
       "with pp > 1: gpipe, 1f1b, zb-h1 (1F1B with the backward split into input and weight "
       "parts, the weights' filling the cool-down), interleaved, zbv (two stages per rank in a V, "
       "zero-bubble) or dualpipev (DeepSeek's DualPipe in a V; microbatches >= 2 x pp)",
       &C::schedule,
       Range::kAny,
       {"gpipe", "1f1b", "zb-h1", "interleaved", "zbv", "dualpipev"}},
      {"parallel", "microbatches", "with pp > 1: microbatches per step (0: pp x stages per rank)",
       &C::microbatches, Range::kNonNegative},
      {"parallel", "virtual_stages",
       "with the interleaved schedule: stages per rank (zbv and dualpipev place 2)",
       &C::virtual_stages, Range::kPositive},
      {"parallel", "layers_per_stage",
       "the pipeline's layers per stage in stage order, comma-separated (e.g. 3,5,5,3: lighter "
       "first and last stages, which also hold the embedding and the head; torchtitan's "
       "pipeline_parallel_split_points as counts); \"\": an even split",
       &C::layers_per_stage},
      {"training", "steps", "optimizer steps", &C::steps, Range::kPositive},
      {"training", "batch_size", "global batch in sequences per step", &C::batch_size,
       Range::kPositive},
      {"training", "seq_len", "tokens per sequence", &C::seq_len, Range::kPositive},
      {"training", "lr", "peak learning rate (warmup, then cosine)", &C::lr, Range::kPositive},
      {"training", "clip", "clip the global gradient norm to this", &C::clip, Range::kPositive},
      {"training", "seed", "seed for initialization and batches", &C::seed, Range::kNonNegative},
      {"training",
       "mixed_precision",
       "bf16: bf16 compute over f32 master weights; none: all f32",
       &C::mixed_precision,
       Range::kAny,
       {"none", "bf16"}},
      {"training",
       "activation_checkpoint",
       "recompute activations in backward instead of keeping them: none, full (every block), "
       "selective-op (every block, keeping matrix products and attention) or selective-layer:N "
       "(every N-th block)",
       &C::activation_checkpoint,
       Range::kAny,
       {},
       [](std::string_view text, std::string_view where) {
         parallel::ActivationCheckpointing::parse(text, where);
       }},
      {"training", "meta_init",
       "build the model on the meta device and give each rank only its own shards' memory and "
       "values (--no-meta-init: every rank builds the whole model first; the same values)",
       &C::meta_init},
      {"training",
       "device",
       "auto (cuda when every local rank has a GPU), cpu or cuda",
       &C::device,
       Range::kAny,
       {"auto", "cpu", "cuda"}},
      {"comm", "collective_timeout_s",
       "seconds a rank waits on a peer (rendezvous, every collective) before failing naming it; "
       "0: $LOOM_TIMEOUT_S, else 300",
       &C::collective_timeout_s, Range::kNonNegative},
      {"comm", "replicas",
       "fault tolerance across replicas: this job is one of N replica jobs (each its own launch, "
       "any layout alike) averaging their gradients per step over those that take part; a "
       "replica that fails is dropped, one that (re)starts joins with the others' state (1: off)",
       &C::replicas, Range::kPositive},
      {"comm", "replica", "with replicas: this job's replica index, 0..replicas-1", &C::replica,
       Range::kNonNegative},
      {"comm", "replica_store",
       "with replicas: the quorum store every replica shares, host:port (a `lighthouse`)",
       &C::replica_store},
      {"comm", "replica_replay",
       "the reference for replicas: a replica's metrics file, whose steps' members this job "
       "replays on its own (with --replicas N: each step averages the members' shares)",
       &C::replica_replay},
      {"comm", "replica_join_window_ms",
       "with replicas: how long each step's quorum waits for the replicas that have not joined",
       &C::replica_join_window_ms, Range::kPositive},
      {"data", "data",
       "training tokens: llm.c token shards (.bin, uint16 or uint32), nanoGPT's raw uint16 .bin, "
       "or text files (byte tokens, or --tokenizer's); a file, a folder, a glob, or several "
       "separated by commas, read as one stream",
       &C::data},
      {"data", "tokenizer",
       "a Hugging Face tokenizer.json (byte-level BPE: GPT-2's, Llama 3's) that tokenizes text "
       "data as the job starts and decodes the sample; empty: one token per byte",
       &C::tokenizer},
      {"data", "split_special_tokens",
       "encode special tokens spelled in the text (<|endoftext|>) as text, as `loom tokenize` and "
       "llm.c do; --no-split-special-tokens matches them, as Hugging Face's default encode does",
       &C::split_special_tokens},
      {"data", "document_boundaries",
       "sample only sequences that lie inside one document (documents start at the "
       "document token)",
       &C::document_boundaries},
      {"data", "document_token",
       "the token each document starts with (-1: the tokenizer's, as `loom tokenize` writes it: "
       "the token its post-processor puts first, e.g. Llama 3's <|begin_of_text|>, else its "
       "end-of-text; GPT-2's <|endoftext|> 50256 for uint16 shards without a tokenizer)",
       &C::document_token, Range::kDefaultOrNonNegative},
      {"data", "val_data",
       "held-out tokens for the validation loss, read as data is (\"\": no validation)",
       &C::val_data},
      {"data", "val_every",
       "with val_data: validate every N steps and after the last (0: after "
       "the last only)",
       &C::val_every, Range::kNonNegative},
      {"data", "val_steps",
       "with val_data: batches per validation (0: as many as the val data holds, at most 20)",
       &C::val_steps, Range::kNonNegative},
      {"checkpoint", "init_from",
       "a Hugging Face checkpoint of the model's family to start from (GPT-2 or Llama "
       "safetensors, a sharded index, or a folder; its config.json gives the sizes)",
       &C::init_from},
      {"checkpoint", "save",
       "a Hugging Face safetensors file of the model's family to write after training "
       "(config.json beside it)",
       &C::save},
      {"checkpoint", "checkpoint_dir",
       "distributed checkpoints of the whole training state go here (step_N directories)",
       &C::checkpoint_dir},
      {"checkpoint", "checkpoint_every",
       "with checkpoint_dir: save every N steps and after the last (0: after the last only)",
       &C::checkpoint_every, Range::kNonNegative},
      {"checkpoint", "keep_last", "with checkpoint_dir: keep the newest K checkpoints (0: all)",
       &C::keep_last, Range::kNonNegative},
      {"checkpoint", "async_checkpoint",
       "with checkpoint_dir: copy the state to host memory and write it in the background while "
       "training goes on",
       &C::async_checkpoint},
      {"checkpoint", "resume",
       "continue from the latest committed checkpoint in checkpoint_dir (any layout; none: "
       "start at step 0)",
       &C::resume},
      {"checkpoint", "max_restarts",
       "when a rank fails, stop the others and start the job again up to N times, resuming from "
       "the latest committed checkpoint in checkpoint_dir (loomrun --max-restarts; 0: none)",
       &C::max_restarts, Range::kNonNegative},
      {"output", "metrics_out", "JSONL metrics, one object per step (\"\": none)", &C::metrics_out},
      {"output", "plot_out", "loss-curve PNG (\"\": none)", &C::plot_out},
      {"output", "sample_tokens", "tokens to generate at the end", &C::sample_tokens,
       Range::kNonNegative},
      {"output", "log_every", "print every N steps", &C::log_every, Range::kPositive},
      {"output", "progress", "a progress bar on the terminal (--no-progress: off)", &C::progress},
      {"output", "profile_ops",
       "time every op over the steps after the first and print rank 0's table at the end (on a "
       "GPU each op waits for its kernels)",
       &C::profile_ops},
      {"plan", "plan_rank_tflops",
       "loom plan: predict the step on ranks of this many matrix-product TFLOP/s (another "
       "machine; 0: this one's calibration)",
       &C::plan_rank_tflops, Range::kNonNegative},
      {"plan", "plan_link_gbps", "loom plan, with plan_rank_tflops: the links' GB/s",
       &C::plan_link_gbps, Range::kNonNegative},
      {"plan", "plan_latency_us",
       "loom plan, with plan_rank_tflops: one collective step's latency in microseconds (0: 10)",
       &C::plan_latency_us, Range::kNonNegative},
      {"plan", "plan_peak_tflops", "loom plan: one rank's peak TFLOP/s, to print the MFU",
       &C::plan_peak_tflops, Range::kNonNegative},
      {"plan", "plan_memory_gbps",
       "loom plan, with plan_rank_tflops: one rank's memory GB/s (elementwise ops)",
       &C::plan_memory_gbps, Range::kNonNegative},
      {"plan", "plan_dim_link_gbps",
       "loom plan: the links of some mesh dims, where not plan_link_gbps, e.g. dp_shard=25,pp=25 "
       "(InfiniBand between hosts)",
       &C::plan_dim_link_gbps},
      {"plan", "search",
       "loom plan: search the layouts of the job's ranks (tp, pp, dp_shard, dp_replicate, cp and "
       "ep where asked, the pipeline's schedule and microbatches, activation checkpointing) and "
       "rank them by predicted step time",
       &C::search},
      {"plan", "search_top", "loom plan --search: the layouts printed in full", &C::search_top,
       Range::kPositive},
      {"plan", "search_budget_s",
       "loom plan --search: stop tracing after this many seconds (0: "
       "none)",
       &C::search_budget_s, Range::kNonNegative},
      {"plan", "search_memory_gib",
       "loom plan --search: drop the layouts whose traced peak exceeds this many GiB per rank "
       "(0: no limit)",
       &C::search_memory_gib, Range::kNonNegative},
      {"plan", "search_jobs",
       "loom plan --search: traces run at once (0: one per core of this machine)", &C::search_jobs,
       Range::kNonNegative},
      {"plan", "search_cp",
       "loom plan --search: also vary context parallelism (cp over the divisors; long sequences)",
       &C::search_cp},
      {"plan", "search_ep",
       "loom plan --search: also vary expert parallelism for an MoE model (ep over the divisors "
       "of dp_shard x cp)",
       &C::search_ep},
      {"plan", "search_bound",
       "loom plan --search: skip the layouts whose compute alone (known from a traced layout with "
       "the same matrix products) times their bubble cannot beat the best traced step",
       &C::search_bound},
      {"plan", "search_cache",
       "loom plan --search: read traces back from, and keep them in, the trace cache "
       "($LOOM_CACHE_DIR or ~/.cache/loom, plan_traces/; one folder per Loom build)",
       &C::search_cache},
  };
  return table;
}

// What a value of `range` must be, article included: "a positive integer", "an integer",
// "-1 (the preset's) or a non-negative number".
std::string expected_value(Range range, std::string_view noun) {
  switch (range) {
    case Range::kPositive:
      return fmt::format("a positive {}", noun);
    case Range::kNonNegative:
      return fmt::format("a non-negative {}", noun);
    case Range::kPresetOrNonNegative:
      return fmt::format("-1 (the preset's) or a non-negative {}", noun);
    case Range::kDefaultOrNonNegative:
      return fmt::format("-1 (the default) or a non-negative {}", noun);
    case Range::kAny:
      break;
  }
  return fmt::format("{} {}", noun.starts_with('i') ? "an" : "a", noun);
}

// A double as TOML and the messages write it: the shortest text that reads back to it, with
// ".0" when that looks like an integer (3.0, not 3).
std::string float_text(double v) {
  std::string text = fmt::format("{}", v);
  if (text.find_first_of(".eEni") == std::string::npos) text += ".0";
  return text;
}

std::string describe(const OptionValue& value) {
  return std::visit(
      [](const auto& v) -> std::string {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, std::string>) return fmt::format("'{}'", v);
        if constexpr (std::is_same_v<V, bool>) return v ? "true" : "false";
        if constexpr (std::is_same_v<V, double>) return float_text(v);
        if constexpr (std::is_same_v<V, int64_t>) return fmt::format("{}", v);
      },
      value);
}

std::string_view type_name(const OptionValue& value) {
  switch (value.index()) {
    case 0:
      return "an integer";
    case 1:
      return "a float";
    case 2:
      return "a boolean";
    default:
      return "a string";
  }
}

template <typename Number>
void check_range(const JobOption& option, Number value, const std::string& where,
                 const OptionValue& given) {
  const bool ok = option.range == Range::kAny || (option.range == Range::kPositive && value > 0) ||
                  (option.range == Range::kNonNegative && value >= 0) ||
                  ((option.range == Range::kPresetOrNonNegative ||
                    option.range == Range::kDefaultOrNonNegative) &&
                   (value >= 0 || value == -1));
  LOOM_CHECK(ok, "{}: expected {}, got {}", where,
             expected_value(option.range, std::is_integral_v<Number> ? "integer" : "number"),
             describe(given));
  // Counts the job keeps in an int (steps, micro-batches, degrees, ...): none may wrap. The seed
  // alone is any 64-bit value.
  if constexpr (std::is_integral_v<Number>) {
    LOOM_CHECK(option.key == "seed" || value <= std::numeric_limits<int32_t>::max(),
               "{}: expected an integer of at most {}, got {}", where,
               std::numeric_limits<int32_t>::max(), describe(given));
  }
}

int64_t to_int(const JobOption& option, const OptionValue& value, const std::string& where) {
  int64_t out = 0;
  if (const auto* text = std::get_if<std::string>(&value)) {
    const char* end = text->data() + text->size();
    const auto [ptr, ec] = std::from_chars(text->data(), end, out);
    LOOM_CHECK(!text->empty() && ec == std::errc() && ptr == end, "{}: expected {}, got {}", where,
               expected_value(option.range, "integer"), describe(value));
  } else {
    LOOM_CHECK(std::holds_alternative<int64_t>(value), "{}: expected {}, got {} ({})", where,
               expected_value(option.range, "integer"), type_name(value), describe(value));
    out = std::get<int64_t>(value);
  }
  check_range(option, out, where, value);
  return out;
}

double to_double(const JobOption& option, const OptionValue& value, const std::string& where) {
  double out = 0;
  if (const auto* text = std::get_if<std::string>(&value)) {
    char* end = nullptr;
    errno = 0;
    out = std::strtod(text->c_str(), &end);
    LOOM_CHECK(
        !text->empty() && end == text->c_str() + text->size() && errno == 0 && std::isfinite(out),
        "{}: expected {}, got {}", where, expected_value(option.range, "number"), describe(value));
  } else if (const auto* i = std::get_if<int64_t>(&value)) {
    out = static_cast<double>(*i);
  } else {
    LOOM_CHECK(std::holds_alternative<double>(value), "{}: expected {}, got {} ({})", where,
               expected_value(option.range, "number"), type_name(value), describe(value));
    out = std::get<double>(value);
    LOOM_CHECK(std::isfinite(out), "{}: expected a finite number, got {}", where, out);
  }
  check_range(option, out, where, value);
  return out;
}

bool to_bool(const OptionValue& value, const std::string& where) {
  if (const auto* text = std::get_if<std::string>(&value)) {
    LOOM_CHECK(*text == "true" || *text == "false", "{}: expected true or false, got {}", where,
               describe(value));
    return *text == "true";
  }
  LOOM_CHECK(std::holds_alternative<bool>(value), "{}: expected true or false, got {} ({})", where,
             type_name(value), describe(value));
  return std::get<bool>(value);
}

std::string to_string(const JobOption& option, const OptionValue& value, const std::string& where) {
  LOOM_CHECK(std::holds_alternative<std::string>(value), "{}: expected a string, got {} ({})",
             where, type_name(value), describe(value));
  const std::string& text = std::get<std::string>(value);
  // A flag given as a value ("--plot-out=--metrics-out=", or CLI11 giving "--plot-out" the next
  // flag): a run had written its plot to a file named "--metrics-out=.dat".
  LOOM_CHECK(!text.starts_with("--"),
             "{}: got '{}', which is a flag, not a value; give the value (\"\" for none: {} \"\")",
             where, text, option.flag());
  LOOM_CHECK(
      option.choices.empty() ||
          std::find(option.choices.begin(), option.choices.end(), text) != option.choices.end(),
      "{}: expected one of {}, got {}", where, fmt::join(option.choices, ", "), describe(value));
  if (option.check_text != nullptr) option.check_text(text, where);
  return text;
}

// A TOML string with the escapes TOML requires.
std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned char>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::vector<std::string_view> keys_of(std::string_view section) {
  std::vector<std::string_view> keys;
  for (const JobOption& o : options()) {
    if (o.section == section) keys.push_back(o.key);
  }
  return keys;
}

std::vector<std::string_view> sections() {
  std::vector<std::string_view> out;
  for (const JobOption& o : options()) {
    if (std::find(out.begin(), out.end(), o.section) == out.end()) out.push_back(o.section);
  }
  return out;
}

}  // namespace

std::string JobOption::flag() const {
  std::string name(key);
  std::replace(name.begin(), name.end(), '_', '-');
  return "--" + name;
}

std::span<const JobOption> job_options() { return options(); }

models::ModelSizes JobConfig::sizes() const {
  return {.n_layer = n_layer,
          .n_head = n_head,
          .n_kv_heads = n_kv_heads,
          .n_embd = n_embd,
          .ffn_dim = ffn_dim,
          .block_size = block_size,
          .vocab_size = vocab_size,
          .rope_theta = rope_theta,
          .dropout = dropout,
          .attn_dropout = attn_dropout,
          .moe = {.experts = moe_experts,
                  .top_k = moe_top_k,
                  .hidden_dim = moe_hidden_dim,
                  .shared_experts = moe_shared_experts,
                  .score_func = moe_score_func,
                  .aux_loss_coeff = moe_aux_loss_coeff,
                  .bias_update_rate = moe_bias_update_rate,
                  .capacity_factor = moe_capacity_factor,
                  .dense_layers = moe_dense_layers}};
}

ParallelDims data_parallel_dims(const JobConfig& config, int64_t world_size) {
  LOOM_CHECK(config.dp == 0 || config.dp_replicate == 0 || config.dp == config.dp_replicate,
             "--dp is --dp-replicate's shorthand, but they differ: --dp {} and --dp-replicate {}; "
             "give one",
             config.dp, config.dp_replicate);
  LOOM_CHECK(config.dp_shard == -1 || config.dp_shard >= 1,
             "--dp-shard: expected a positive integer or -1 (the ranks the other degrees leave), "
             "got {}",
             config.dp_shard);
  ParallelDims dims{.pp = config.pp, .cp = config.cp, .tp = config.tp, .ep = config.ep};
  const bool none_given = config.dp == 0 && config.dp_replicate == 0 && config.dp_shard == 1;
  dims.dp_replicate = config.dp_replicate > 0 ? config.dp_replicate
                      : config.dp > 0         ? config.dp
                      : none_given            ? 2
                                              : 1;
  dims.dp_shard = config.dp_shard;
  if (dims.dp_shard == -1) {
    LOOM_CHECK(world_size > 0,
               "--dp-shard -1 takes the ranks the other degrees leave, but the number of ranks is "
               "not known: give --nproc N (or run under a launcher, which sets WORLD_SIZE)");
    dims = dims.resolved(world_size);
  }
  return dims;
}

void resolve_parallel_degrees(JobConfig& config, int64_t world_size) {
  // The launcher's world is the caller's to give (train/launch.h reads every launcher's).
  if (world_size <= 0) world_size = config.nproc;
  const ParallelDims dims = data_parallel_dims(config, world_size);
  config.dp = 0;
  config.dp_replicate = dims.dp_replicate;
  config.dp_shard = dims.dp_shard;
  LOOM_CHECK(config.nproc == 0 || config.nproc == dims.world_size(),
             "--nproc {}: the degrees {} make {} ranks; give degrees whose product is {} (or "
             "--dp-shard -1 to take what the others leave)",
             config.nproc, dims.str(), dims.world_size(), config.nproc);
}

std::vector<int64_t> parse_layers_per_stage(const std::string& text, const std::string& where) {
  std::vector<int64_t> out;
  if (text.empty()) return out;
  size_t begin = 0;
  while (true) {
    const size_t comma = text.find(',', begin);
    const std::string item = text.substr(begin, comma == std::string::npos ? comma : comma - begin);
    int64_t n = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), n);
    LOOM_CHECK(!item.empty() && ec == std::errc() && end == item.data() + item.size() && n >= 1,
               "{} '{}': expected positive layer counts separated by commas, one per pipeline "
               "stage (e.g. 3,5,5,3), got '{}'",
               where, text, item);
    out.push_back(n);
    if (comma == std::string::npos) return out;
    begin = comma + 1;
  }
}

void set_option(JobConfig& config, const JobOption& option, const OptionValue& value,
                const std::string& where) {
  std::visit(
      [&](auto member) {
        using T = std::remove_reference_t<decltype(config.*member)>;
        if constexpr (std::is_same_v<T, int64_t>) config.*member = to_int(option, value, where);
        if constexpr (std::is_same_v<T, double>) config.*member = to_double(option, value, where);
        if constexpr (std::is_same_v<T, bool>) config.*member = to_bool(value, where);
        if constexpr (std::is_same_v<T, std::string>) {
          config.*member = to_string(option, value, where);
        }
      },
      option.field);
  if (option.key == "layers_per_stage") parse_layers_per_stage(config.layers_per_stage, where);
  // Named where it was given (a flag, or a job file's section and key), not later as --model;
  // in a program that registers families (a job file's reader alone checks nothing here).
  if (option.key == "model" && !models::model_families().empty()) {
    try {
      models::family_of_model(config.model);
    } catch (const Error&) {
      LOOM_FAIL("{}: unknown model '{}'; the registered models are {}", where, config.model,
                models::registered_models());
    }
  }
}

std::string option_toml(const JobConfig& config, const JobOption& option) {
  return std::visit(
      [&](auto member) -> std::string {
        const auto& v = config.*member;
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) return toml_string(v);
        if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
        if constexpr (std::is_same_v<T, int64_t>) return fmt::format("{}", v);
        if constexpr (std::is_same_v<T, double>) return float_text(v);
      },
      option.field);
}

void load_job_toml(JobConfig& config, const std::string& path) {
  std::error_code error;
  LOOM_CHECK(!std::filesystem::is_directory(path, error),
             "--config: '{}' is a folder; give the job file (TOML) itself", path);
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in.good(), "--config: cannot read the job file '{}': {}", path, std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  LOOM_CHECK(!in.bad(), "--config: cannot read the job file '{}'", path);
  toml::table root;
  try {
    root = toml::parse(text.str(), path);
  } catch (const toml::parse_error& e) {
    LOOM_FAIL("{}:{}:{}: not valid TOML: {}", path, e.source().begin.line, e.source().begin.column,
              e.description());
  }
  const std::vector<std::string_view> known_sections = sections();
  for (const auto& [section_key, section_node] : root) {
    const std::string section(section_key.str());
    LOOM_CHECK(
        std::find(known_sections.begin(), known_sections.end(), section) != known_sections.end(),
        "{}: unknown {} '{}'; the sections are [{}]", path,
        section_node.is_table() ? "section" : "top-level key", section,
        fmt::join(known_sections, "], ["));
    const toml::table* table = section_node.as_table();
    LOOM_CHECK(table != nullptr, "{}: '{}' must be a section ([{}]), got a value", path, section,
               section);
    for (const auto& [key_node, node] : *table) {
      const std::string key(key_node.str());
      const auto option = std::find_if(options().begin(), options().end(), [&](const JobOption& o) {
        return o.section == section && o.key == key;
      });
      LOOM_CHECK(option != options().end(), "{}: unknown key '{}' in [{}]; its keys are {}", path,
                 key, section, fmt::join(keys_of(section), ", "));
      const std::string where = fmt::format("{}: [{}] {}", path, section, key);
      OptionValue value;
      if (const auto i = node.value_exact<int64_t>()) {
        value = *i;
      } else if (const auto d = node.value_exact<double>()) {
        value = *d;
      } else if (const auto b = node.value_exact<bool>()) {
        value = *b;
      } else if (const auto s = node.value_exact<std::string>()) {
        value = *s;
      } else if (const auto* counts = node.as_array(); counts && key == "layers_per_stage") {
        // [parallel] layers_per_stage = [3, 5, 5, 3], as torchtitan's job files write lists: the
        // flag's "3,5,5,3" (parse_layers_per_stage names anything that is not a count).
        std::vector<std::string> parts;
        for (const auto& count : *counts) {
          const auto n = count.value_exact<int64_t>();
          LOOM_CHECK(n.has_value(),
                     "{}: expected an array of integers (layers per stage), got an element "
                     "that is not one",
                     where);
          parts.push_back(std::to_string(*n));
        }
        value = fmt::format("{}", fmt::join(parts, ","));
      } else {
        LOOM_FAIL("{}: expected a single value, got {}", where,
                  node.is_table()   ? "a table"
                  : node.is_array() ? "an array"
                                    : "a date or time");
      }
      if (std::holds_alternative<std::string>(value) &&
          !std::holds_alternative<std::string JobConfig::*>(option->field)) {
        // A quoted number or boolean in a file is a type error, not text to parse.
        LOOM_FAIL("{}: expected {}, got a string ({})", where,
                  option->is_bool()                                            ? "true or false"
                  : std::holds_alternative<double JobConfig::*>(option->field) ? "a number"
                                                                               : "an integer",
                  describe(value));
      }
      set_option(config, *option, value, where);
    }
  }
}

std::string effective_config_path(const std::string& metrics_out) {
  const std::filesystem::path path(metrics_out);
  return (path.parent_path() / (path.stem().string() + ".config.toml")).string();
}

std::string to_toml(const JobConfig& config) {
  std::string out;
  for (std::string_view section : sections()) {
    out += fmt::format("{}[{}]\n", out.empty() ? "" : "\n", section);
    for (const JobOption& o : options()) {
      if (o.section == section) out += fmt::format("{} = {}\n", o.key, option_toml(config, o));
    }
  }
  return out;
}

}  // namespace loom::train
