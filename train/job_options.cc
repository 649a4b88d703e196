// Every option of a job, by section: its key, help, field of JobConfig and the values it takes.
// The command line (train/job_command_line.h), job files and the effective config
// (train/job_config.h) are all read and written through this one table.
#include <string_view>
#include <vector>

#include "parallel/activation_checkpoint.h"
#include "train/job_config.h"

namespace loom::train {

namespace {
using Range = JobOption::Range;
using C = JobConfig;
}  // namespace

std::span<const JobOption> job_options() {
  static const std::vector<JobOption> table = {
      {"model", "model",
       "the model: a preset of a family the program registers (models/family.h); not given, the "
       "family --init-from's config.json names (its default preset), else the default",
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
      {"model", "moe_route_norm",
       "the top-k weights normalized to sum 1 (Mixtral, DeepSeek-V3): 1, or not: 0 (-1: the "
       "preset's, or the score function's: 1 with sigmoid)",
       &C::moe_route_norm, Range::kPresetOrSwitch},
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
       "all on one layout) averaging their gradients per step over those that take part; a "
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

}  // namespace loom::train
