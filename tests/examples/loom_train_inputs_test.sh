#!/usr/bin/env bash
# loom_train as a new user meets it: every bad flag, config file or path exits 2 with one line
# naming the flag (or file, section and key), the value and what is expected, before anything
# trains; nothing aborts ("terminate called"). A config file sets the job, flags override it, and
# the effective config written beside the metrics repeats the run exactly.
set -euo pipefail
train="$(realpath "$1")"
loomrun="$(realpath "$3")"
configs="$(realpath "$2")"
cd "${TEST_TMPDIR:-$(mktemp -d)}"

fail() { echo "FAIL: $*" >&2; exit 1; }

# expect_error CODE MESSAGE ARGS...: loom_train ARGS exits CODE and its stderr holds MESSAGE.
expect_error() {
  local code="$1" message="$2"
  shift 2
  local status=0
  "$train" --no-progress "$@" >out.log 2>err.log || status=$?
  [[ $status -eq $code ]] || { cat out.log err.log; fail "loom_train $* exited $status, expected $code"; }
  grep -qF -- "$message" err.log || { cat err.log; fail "loom_train $*: expected the message: $message"; }
  ! grep -q "terminate called" out.log err.log || fail "loom_train $* aborted"
  echo "ok ($code): loom_train $*"
}

expect_error 2 "loom_train: --dp: expected a non-negative integer, got 'abc'" --dp abc
expect_error 2 "loom_train: --dp-shard: expected a positive integer or -1 (the ranks the other degrees leave), got 0" \
  --dp-shard 0
expect_error 2 "loom_train: --dp-shard -1 takes the ranks the other degrees leave, but the number of ranks is not known: give --nproc N" \
  --dp-shard -1
expect_error 2 "loom_train: ParallelDims: dp_shard -1 takes the ranks the other degrees leave, but pp=1 x dp_replicate=1 x cp=1 x tp=4 = 4 does not divide the world of 6" \
  --dp-shard -1 --tp 4 --nproc 6
expect_error 2 "loom_train: --dp is --dp-replicate's shorthand, but they differ: --dp 2 and --dp-replicate 3" \
  --dp 2 --dp-replicate 3
expect_error 2 "loom_train: --nproc 8: the degrees dp_replicate=2 x tp=2 make 4 ranks" --nproc 8
expect_error 2 "loom_train: --resume: needs --checkpoint-dir" --resume
expect_error 2 "loom_train: --checkpoint-every, --keep-last and --async-checkpoint: need --checkpoint-dir" \
  --checkpoint-every 4
touch not_a_dir
expect_error 2 "loom_train: --checkpoint-dir: 'not_a_dir' exists and is not a directory" \
  --checkpoint-dir not_a_dir
expect_error 2 "loom_train: --lr: expected a positive number, got 'abc'" --lr abc
expect_error 2 "loom_train: --lr: expected a positive number, got '0'" --lr 0
expect_error 2 "loom_train: --seed: expected a non-negative integer, got '-5'" --seed -5
expect_error 2 "loom_train: --sample-tokens: expected a non-negative integer, got '-1'" \
  --sample-tokens -1
expect_error 2 "loom_train: --schedule: expected one of gpipe, 1f1b, zb-h1, interleaved, zbv, dualpipev, got 'zigzag'" \
  --schedule zigzag
expect_error 2 "loom_train: The following argument was not expected: --bogus" --bogus
mkdir -p empty_folder
expect_error 2 "loom_train: --data: the folder 'empty_folder' holds no files" --data empty_folder
expect_error 2 "loom_train: --data: '/no/such/file' does not exist" --data /no/such/file
expect_error 2 "loom_train: --metrics-out: cannot write '/missing/dir/m.jsonl': the folder '/missing/dir' does not exist" \
  --metrics-out /missing/dir/m.jsonl
expect_error 2 "loom_train: --plot-out: cannot write '/missing/dir/p.png'" --plot-out /missing/dir/p.png
expect_error 2 "loom_train: --save: cannot write '/missing/dir/m.safetensors'" \
  --save /missing/dir/m.safetensors
expect_error 2 "loom_train: --init-from: '/no/ckpt.safetensors' does not exist" \
  --init-from /no/ckpt.safetensors
expect_error 2 "loom_train: --config: cannot read the job file '/no/job.toml'" --config /no/job.toml
printf '[training]\nstepz = 3\n' >typo.toml
expect_error 2 "loom_train: typo.toml: unknown key 'stepz' in [training]; its keys are steps" \
  --config typo.toml
printf '[training]\nsteps = "ten"\n' >typed.toml
expect_error 2 "loom_train: typed.toml: [training] steps: expected an integer, got a string ('ten')" \
  --config typed.toml
printf '[training]\nsteps = 3.0\n' >float.toml
expect_error 2 "loom_train: float.toml: [training] steps: expected a positive integer, got a float (3.0)" \
  --config float.toml
printf '[model]\nmodel = "nope"\n' >model.toml
expect_error 2 "loom_train: model.toml: [model] model: unknown model 'nope'; the registered models are gpt: tiny" \
  --config model.toml
expect_error 2 "loom_train: --dp-shard: expected an integer, got 'x'" --dp-shard x
printf '[training\n' >broken.toml
expect_error 2 "loom_train: broken.toml:1:" --config broken.toml

expect_error 2 "loom_train: --seq-len: 128 tokens per sequence is more than the model's context of 64 (--block-size, the preset's)" \
  --seq-len 128
expect_error 2 "loom_train: GPTConfig: n_embd=64 is not divisible by n_head=5" --n-head 5 --dp 1 --tp 1
WORLD_SIZE=4 expect_error 2 "loom_train: WORLD_SIZE=4 is set but RANK is not" --dp 1 --tp 1
OMPI_COMM_WORLD_SIZE=4 expect_error 2 "loom_train: OMPI_COMM_WORLD_SIZE=4 is set but OMPI_COMM_WORLD_RANK is not; mpirun sets both" --dp 1 --tp 1
OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=abc expect_error 2 "loom_train: OMPI_COMM_WORLD_RANK=0 is set, and OMPI_COMM_WORLD_SIZE is 'abc': mpirun sets both" --dp 1 --tp 1
OMPI_COMM_WORLD_RANK=0 expect_error 2 "loom_train: OMPI_COMM_WORLD_RANK=0 is set, and OMPI_COMM_WORLD_SIZE is not: mpirun sets both" --dp 1 --tp 1

# A checkpoint with a config.json beside it (Hugging Face's save_pretrained) loads with its own
# sizes, a context of 128 and a vocabulary padded to 300 included, and a flag that contradicts
# it is named.
mkdir -p ckpt
"$train" --no-progress --dp 1 --tp 1 --steps 1 --block-size 128 --vocab-size 300 --sample-tokens 0 \
  --save ckpt/model.safetensors --metrics-out ckpt.jsonl --plot-out ckpt.png >ckpt.log 2>&1 ||
  { cat ckpt.log; fail "saving a checkpoint with --block-size 128 --vocab-size 300"; }
printf '{"n_layer": 2, "n_head": 4, "n_embd": 64, "n_positions": 128, "vocab_size": 300}\n' \
  >ckpt/config.json
"$train" --no-progress --dp 1 --tp 1 --steps 1 --sample-tokens 3 --init-from ckpt/model.safetensors \
  --metrics-out loaded.jsonl --plot-out loaded.png >loaded.log 2>&1 ||
  { cat loaded.log; fail "loading a checkpoint with its config.json"; }
grep -q 'initialized from ckpt/model.safetensors' loaded.log || { cat loaded.log; fail "not loaded"; }
grep -q '^block_size = 0$' loaded.config.toml || fail "block_size should stay as given (0)"
expect_error 2 "loom_train: --n-head: 2 contradicts the checkpoint: 'ckpt/config.json' has n_head = 4" \
  --dp 1 --tp 1 --init-from ckpt/model.safetensors --n-head 2
expect_error 2 "more than the model's context of 128 (the checkpoint's config.json 'ckpt/config.json'); the checkpoint's positions fix it: pass a --seq-len of at most that" \
  --dp 1 --tp 1 --init-from ckpt/model.safetensors --seq-len 256
echo '{"n_layer": 2' >ckpt/config.json
expect_error 2 "config.json' is not valid JSON" --dp 1 --tp 1 --init-from ckpt/model.safetensors

# A config file sets the job; a flag overrides it; the effective config repeats it.
"$train" --no-progress --config "$configs/default.toml" --dp 1 --tp 1 --steps 3 \
  --sample-tokens 0 --metrics-out first.jsonl --plot-out first.png >first.log 2>&1 ||
  { cat first.log; fail "training from default.toml"; }
grep -q '^steps = 3$' first.config.toml || { cat first.config.toml; fail "the flag did not override the file"; }
grep -q '^batch_size = 16$' first.config.toml || fail "the file's batch_size is not in the effective config"
grep -q 'effective config (also in first.config.toml)' first.log || { cat first.log; fail "the effective config was not printed"; }
"$train" --no-progress --config first.config.toml --metrics-out again.jsonl --plot-out again.png \
  >again.log 2>&1 || { cat again.log; fail "training from the effective config"; }
losses() { sed -n 's/.*"loss":\([-0-9.e+]*\).*/\1/p' "$1"; }
[[ "$(losses first.jsonl)" == "$(losses again.jsonl)" ]] ||
  fail "the effective config did not repeat the run: $(losses first.jsonl) vs $(losses again.jsonl)"
# As the README replays it: --config on the effective config, beside the same metrics (which
# the replay writes again, the effective config over the file it read).
cp first.config.toml replay.config.toml
"$train" --no-progress --config replay.config.toml --metrics-out replay.jsonl --plot-out "" \
  >replay.log 2>&1 || { cat replay.log; fail "replaying the effective config in place"; }
[[ "$(losses first.jsonl)" == "$(losses replay.jsonl)" ]] || fail "the in-place replay differs"
cmp <(grep -v '^metrics_out\|^plot_out' first.config.toml) \
  <(grep -v '^metrics_out\|^plot_out' replay.config.toml) || fail "the replay's effective config differs"
echo "ok: a config file, a flag over it, and the effective config repeating the run (in place too)"

# Issue 30's defects, found from outside, each named before anything trains (exit 2).
# --checkpoint-dir is checked with the other outputs: under a file, not a folder.
expect_error 2 "loom_train: --checkpoint-dir: cannot make the folder 'not_a_dir/sub': " \
  --dp 1 --tp 1 --checkpoint-dir not_a_dir/sub
# An unknown model lists the registered families' models.
expect_error 2 "loom_train: --model: unknown model 'gpt5'; the registered models are gpt: tiny, small, gpt3-175b; llama: llama-tiny" \
  --model gpt5
# A tp that does not divide the kv heads is refused before any rank starts.
expect_error 2 "loom_train: parallelize_llama: tp 4 must divide n_heads 4 and n_kv_heads 2" \
  --model llama-tiny --dp 1 --tp 4
# A size a family does not have.
expect_error 2 "loom_train: --n-kv-heads: the gpt family has no such size" --n-kv-heads 2
# Dropout a family does not have, and one out of range.
expect_error 2 "loom_train: --dropout 0.1: the llama family has no dropout; use --dropout 0" \
  --model llama-tiny --dropout 0.1
expect_error 2 "loom_train: --attn-dropout 1.5: a dropout probability must be in [0, 1)" \
  --attn-dropout 1.5
expect_error 2 "loom_train: --attn-dropout 1: a dropout probability must be in [0, 1)" \
  --model llama-tiny --attn-dropout 1
# Data shorter than one sequence.
printf 'short text' >short.txt
expect_error 2 "loom_train: --data: short.txt (10 bytes, byte-level tokens) holds 10 tokens, too few for sequences of 64" \
  --data short.txt
# A Llama checkpoint's config.json: wrong types and missing nested keys name the file and the key;
# features Loom does not compute are refused by key, never loaded as another model.
mkdir -p llama_ckpt
"$train" --no-progress --dp 1 --tp 1 --steps 1 --model llama-tiny --sample-tokens 0 \
  --save llama_ckpt/model.safetensors --metrics-out l.jsonl --plot-out l.png >l.log 2>&1 ||
  { cat l.log; fail "saving a Llama checkpoint"; }
cp llama_ckpt/config.json llama_config.json
edit_config() {  # edit_config SED_SCRIPT: config.json from the saved one (one key a line), edited
  sed -e "$1" llama_config.json >llama_ckpt/config.json
}
llama_error() {  # llama_error MESSAGE: the saved Llama with the edited config.json exits 2 naming it
  expect_error 2 "$1" --model llama-tiny --dp 1 --tp 1 --init-from llama_ckpt/model.safetensors
}
edit_config 's/"hidden_size": 64/"hidden_size": "64"/'
llama_error "llama_ckpt/config.json': \"hidden_size\" must be a positive integer, got \"64\""
edit_config '/"factor":/d'
llama_error "llama_ckpt/config.json': \"rope_scaling\" has no \"factor\""
edit_config 's/"attention_bias": false/"attention_bias": true/'
llama_error "\"attention_bias\" = true: Loom's Llama attention projections have no biases"
edit_config 's/"mlp_bias": false/"mlp_bias": true/'
llama_error "\"mlp_bias\" = true"
edit_config 's/"hidden_act": "silu"/"hidden_act": "gelu"/'
llama_error "\"hidden_act\" = \"gelu\""
edit_config 's/"head_dim": 16/"head_dim": 32/'
llama_error "\"head_dim\" = 32: Loom's Llama heads are hidden_size / num_attention_heads = 16 wide"
edit_config 's/"num_hidden_layers": 2/"num_hidden_layers": 3/'
llama_error "--init-from 'llama_ckpt/model.safetensors': 9 problem(s); the model is unchanged"
edit_config ''
expect_error 2 "loom_train: --n-layer: 3 contradicts the checkpoint: 'llama_ckpt/config.json' has num_hidden_layers = 2" \
  --model llama-tiny --dp 1 --tp 1 --init-from llama_ckpt/model.safetensors --n-layer 3
# Without --model the family is the file's model_type's (transformers' AutoModel picks so); a
# --model of another family, or a model_type no family reads, is named.
"$train" --no-progress --dp 1 --tp 1 --steps 1 --sample-tokens 0 --metrics-out "" --plot-out "" \
  --init-from llama_ckpt/model.safetensors >inferred.log 2>&1 || { cat inferred.log; fail "--init-from a Llama without --model"; }
grep -q "llama-tiny on DeviceMesh" inferred.log || { cat inferred.log; fail "the Llama family was not taken from config.json"; }
! grep -q "WARNING: --model" inferred.log || { cat inferred.log; fail "a warning about a --model not given"; }
expect_error 2 "loom_train: --model tiny: the gpt family reads model_type \"gpt2\", but --init-from's 'llama_ckpt/config.json' is \"llama\", the llama family's; leave --model out" \
  --model tiny --dp 1 --tp 1 --init-from llama_ckpt/model.safetensors
edit_config 's/"model_type": "llama"/"model_type": "mistral"/'
expect_error 2 "loom_train: --init-from: 'llama_ckpt/config.json': model_type \"mistral\" is no registered family's; this program reads \"gpt2\" (gpt), \"llama\" (llama)" \
  --dp 1 --tp 1 --init-from llama_ckpt/model.safetensors
edit_config ''
# --sample-tokens 0 prints no sample.
"$train" --no-progress --dp 1 --tp 1 --steps 1 --sample-tokens 0 --metrics-out s.jsonl \
  --plot-out s.png >s.log 2>&1 || { cat s.log; fail "a one-step job"; }
! grep -q '^sample:' s.log || fail "--sample-tokens 0 printed a sample"
# --metrics-out "" and --plot-out "" write neither.
"$train" --no-progress --dp 1 --tp 1 --steps 1 --sample-tokens 0 --metrics-out "" --plot-out "" \
  >none.log 2>&1 || { cat none.log; fail "a job without output files"; }
! grep -q 'loss curve' none.log || fail "--plot-out \"\" drew a plot"
echo "ok: issue 30's defects are named before anything trains"

# Found from outside (2026-12-07): input the job let through to its ranks, or took silently.
expect_error 2 "loom_train: --cp-attention alltoall: this rank's 3 query heads and 3 key/value heads (after tp) must both split over cp 2" \
  --n-head 3 --n-embd 48 --cp 2 --cp-attention alltoall --dp 1 --tp 1
expect_error 2 "loom_train: --cp-attention alltoall: this rank's 3 query heads and 1 key/value heads (after tp; 3 when repeated for grouped-query attention) must both split over cp 2" \
  --model llama-tiny --n-head 6 --n-kv-heads 2 --n-embd 48 --tp 2 --cp 2 --cp-attention alltoall --dp 1
expect_error 2 "loom_train: --replica-store: expected host:port with a port in [1, 65535]" \
  --replicas 2 --replica 0 --replica-store 127.0.0.1:abc --dp 1 --tp 1
expect_error 2 "loom_train: --replica 5 is not in [0, 2) (--replicas 2)" \
  --replicas 2 --replica 5 --replica-store 127.0.0.1:1 --dp 1 --tp 1
expect_error 2 "loom_train: --batch-size 8: a global batch of 8 sequences does not split over 3 replicas x dp 1 x grad_accum 1 = 3" \
  --replicas 3 --replica 0 --replica-store 127.0.0.1:1 --dp 1 --tp 1 --batch-size 8
expect_error 2 "loom_train: --replica-replay: '/nonexistent' does not exist" \
  --replica-replay /nonexistent --dp 1 --tp 1
expect_error 2 "loom_train: --collective-timeout-s 0.0001: expected 0 (the default) or from 0.001 to 1000000 seconds" \
  --collective-timeout-s 0.0001
expect_error 2 "loom_train: --config: '.' is a folder; give the job file (TOML) itself" --config .
expect_error 2 "loom_train: --grad-accum: expected an integer of at most 2147483647, got '4294967297'" \
  --grad-accum 4294967297
expect_error 2 "loom_train: --moe-shared-experts: expected -1 (the preset's) or a non-negative integer, got '-5'" \
  --model llama-moe-tiny --moe-shared-experts -5
mkdir -p empty_folder
expect_error 2 "loom_train: --init-from: " --init-from empty_folder --dp 1 --tp 1
LOOM_INJECT_FAULT=bogus expect_error 2 "loom_train: LOOM_INJECT_FAULT: expected \"rank=R,step=S\"" --steps 2
LOOM_TIMEOUT_S=abc expect_error 2 "loom_train: LOOM_TIMEOUT_S: expected a number of seconds from 0.001 to 1000000, got 'abc'" --steps 2
# Beyond the clock's range every rank's deadline would come at once; below a millisecond, none.
LOOM_TIMEOUT_S=1e10 expect_error 2 "loom_train: LOOM_TIMEOUT_S: expected a number of seconds from 0.001 to 1000000, got '1e10'" --steps 2
LOOM_TIMEOUT_S=1e-4 expect_error 2 "loom_train: LOOM_TIMEOUT_S: expected a number of seconds from 0.001 to 1000000, got '1e-4'" --steps 2
echo "ok: replicas, timeouts, job-file folders, counts beyond int, preset sentinels and the ranks' environment are checked first"

# True/false flags: --flag=VALUE must be true or false; plan-only flags are checked even when
# their figures go unused; --search belongs to `loom plan`.
expect_error 2 "loom_train: --meta-init: expected true or false, got 'maybe'" --meta-init=maybe
expect_error 2 "loom_train: --search: it searches the layouts of \`loom plan\` (--plan --search); add --plan" \
  --search
expect_error 2 "loom_train --plan: --plan-dim-link-gbps: expected DIM=GBPS items separated by commas" \
  --plan --plan-dim-link-gbps dp_shard=abc
expect_error 2 "loom_train --plan: --plan-peak-tflops 1e-06: below the rank's rate, 1 TFLOP/s" \
  --plan --plan-peak-tflops 0.000001 --plan-rank-tflops 1 --plan-link-gbps 1
# A Llama with no layer left to route (every one kept dense) has no experts to split over ep; a
# MoE Llama routed otherwise than Mixtral has no Hugging Face format (a dense one has Llama's,
# a Mixtral-routed one Mixtral's), said with what differs.
expect_error 2 "--ep 2: the model (llama) has no mixture-of-experts layers to split (--moe-dense-layers keeps all 2 layers dense: give fewer)" \
  --plan --model llama-moe-tiny --n-layer 2 --moe-dense-layers 2 --ep 2 --dp-shard 2 --dp 0 --tp 1
expect_error 2 "--save: a Llama with dense feed-forwards in the first 1 layers (--moe-dense-layers; Mixtral's every layer is a mixture of experts) has no Hugging Face checkpoint format in Loom yet" \
  --plan --model llama-moe-tiny --save model.safetensors
expect_error 2 "--save: a Llama with sigmoid router scores (--moe-score-func; Mixtral's are softmax) has no Hugging Face" \
  --plan --model llama-moe-tiny --moe-dense-layers 0 --moe-score-func sigmoid --save model.safetensors
expect_error 2 "--moe-route-norm: expected -1 (the preset's), 0 (off) or 1 (on), got '2'" \
  --plan --model llama-moe-tiny --moe-route-norm 2
echo "ok: flag values, plan-only flags, --search without --plan, all-dense MoE and MoE saves are named"
# A flag given as a value is refused, where a run had written its plot to a file named
# "--metrics-out=.dat".
expect_error 2 "loom_train: --plot-out: got '--metrics-out=', which is a flag, not a value" \
  --plot-out=--metrics-out= --dp 1 --tp 1
[[ ! -e "--metrics-out=.dat" ]] || fail "a file named after a flag was written"
echo "ok: a flag given as a value is refused"
# "--plot-out= --metrics-out= --steps 1" is two empty values (none of either) and one step: CLI11
# alone reads "--x=" as no value and takes the next argument as it.
mkdir -p empty_values && (cd empty_values &&
  "$train" --no-progress --dp 1 --tp 1 --plot-out= --metrics-out= --steps 1 --sample-tokens 0 \
    >out.log 2>&1) || { cat empty_values/out.log; fail "--plot-out= --metrics-out= --steps 1"; }
grep -q "final loss" empty_values/out.log || fail "--plot-out= --metrics-out=: no final loss"
[[ -z "$(ls empty_values | grep -v '^out.log$')" ]] || fail "--x= wrote: $(ls empty_values)"
echo "ok: --x= is an empty value"
expect_error 2 "loom_train: --plot-out: got '--metrics-out', which is a flag, not a value" \
  --plot-out --metrics-out= --steps 1
# Two outputs at one path would overwrite each other (a PNG over the metrics, over the effective
# config, over the saved config.json); an output at an input's path would overwrite the input.
expect_error 2 "loom_train: --metrics-out and --plot-out both write 'm.jsonl'" \
  --metrics-out m.jsonl --plot-out m.jsonl --dp 1 --tp 1
expect_error 2 "loom_train: --metrics-out (the effective config beside it) and --plot-out both write 'm.config.toml'" \
  --metrics-out m.jsonl --plot-out m.config.toml --dp 1 --tp 1
expect_error 2 "loom_train: --plot-out and --save (the config.json beside it) both write 'out/config.json'" \
  --plot-out ./out/../out/config.json --save out/model.safetensors --dp 1 --tp 1
printf 'some text to train on, long enough for a batch or two of tokens.%.0s' {1..200} >corpus.txt
expect_error 2 "loom_train: --metrics-out writes './corpus.txt', the file --data reads" \
  --data corpus.txt --metrics-out ./corpus.txt --dp 1 --tp 1
[[ $(head -c 4 corpus.txt) == "some" ]] || fail "the data was overwritten"
# The data's folders and patterns are expanded, hard links are one file, the job file is an input,
# and --init-from's files beside its model; a name with a newline (gnuplot reads the plot's name
# in its script: the next line would be a command) is refused.
mkdir -p dd && cp corpus.txt dd/a.txt && ln -f corpus.txt hard.txt
expect_error 2 "loom_train: --metrics-out writes 'dd/a.txt', the file --data reads" \
  --data dd --metrics-out dd/a.txt --dp 1 --tp 1
expect_error 2 "loom_train: --metrics-out writes 'dd/a.txt', the file --data reads" \
  --data 'dd/*.txt' --metrics-out dd/a.txt --dp 1 --tp 1
expect_error 2 "loom_train: --metrics-out writes 'hard.txt', the file --data reads" \
  --data corpus.txt --metrics-out hard.txt --dp 1 --tp 1
printf '[training]\nsteps = 1\n' >x.toml
expect_error 2 "loom_train: --metrics-out writes 'x.toml', the file --config reads" \
  --config x.toml --metrics-out x.toml --dp 1 --tp 1
expect_error 2 "loom_train: --metrics-out writes 'm2.jsonl', the folder --checkpoint-dir saves in" \
  --checkpoint-dir m2.jsonl --metrics-out m2.jsonl --dp 1 --tp 1
expect_error 2 "loom_train: --plot-out: 'p\x0a!touch INJECTED\x0a.png' holds a control character" \
  --plot-out $'p\n!touch INJECTED\n.png' --dp 1 --tp 1
[[ $(cat dd/a.txt) == "$(cat corpus.txt)" && ! -e INJECTED ]] || fail "a refused job wrote"
[[ ! -e m.jsonl && ! -e m.config.toml && ! -e out ]] || fail "a refused job wrote: $(ls)"
echo "ok: outputs at one path, or at an input's, are refused before anything is written"
# --replica picks the batch's share: out of range is refused with one replica too, and the
# replicas' store and window need --replicas.
expect_error 2 "loom_train: --replica 5 is not in [0, 1) (--replicas 1); a job that is one of several replicas needs --replicas N" \
  --replica 5 --dp 1 --tp 1
expect_error 2 "loom_train: --replica-store and --replica-join-window-ms: need --replicas N > 1" \
  --replica-store 127.0.0.1:29400 --dp 1 --tp 1
echo "ok: replica flags without --replicas are refused"
# Settings nothing reads on the job's layout are named (a job file may carry them from another).
"$train" --no-progress --dp 1 --tp 1 --steps 1 --sample-tokens 0 --metrics-out "" --plot-out "" \
  --schedule gpipe --cp-attention ring --search-top 3 >unused.log 2>&1 || { cat unused.log; fail "unused settings"; }
for line in "--schedule gpipe: no effect without a pipeline (--pp 1)" \
  "--cp-attention ring: no effect without context parallelism (--cp 1)" \
  "--search-*: no effect without --search"; do
  grep -qF -- "loom_train: WARNING: $line" unused.log || { cat unused.log; fail "no warning: $line"; }
done
echo "ok: settings without effect on the layout are named"
# A fault probe that can never fire is refused: a fault test would pass for nothing.
LOOM_GLOO_SHM=nope expect_error 2 "loom_train: LOOM_GLOO_SHM='nope': expected 0, false or off" --steps 3
LOOM_LOG_LEVEL=warning expect_error 2 "loom_train: LOOM_LOG_LEVEL='warning': expected debug, info, warn or error" --steps 3
LOOM_PROFILE=bogus expect_error 2 "loom_train: LOOM_PROFILE='bogus': 'bogus' is not a profiler setting" --steps 3
LOOM_GLOO_IFNAME=nonexist0 expect_error 2 "loom_train: the ranks' Gloo groups: cannot open a TCP endpoint on interface 'nonexist0' (LOOM_GLOO_IFNAME): this host has no such interface with an address (it has: " --steps 3
LOOM_GLOO_HOSTNAME=no.such.host.invalid expect_error 2 "(LOOM_GLOO_HOSTNAME): the name does not resolve" --steps 3
LOOM_FLIGHT_RECORDER_ENTRIES=-1 expect_error 2 "loom_train: LOOM_FLIGHT_RECORDER_ENTRIES must be a number of entries from 0 (off) to 10000000, got '-1'" --steps 3
LOOM_FLIGHT_RECORDER_DIR=/proc/nope expect_error 2 "LOOM_FLIGHT_RECORDER_DIR: cannot create '/proc/nope'" \
  --launcher "$loomrun" --steps 3
echo "ok: LOOM_GLOO_SHM, LOOM_LOG_LEVEL, LOOM_PROFILE, LOOM_GLOO_IFNAME/HOSTNAME and the flight recorder's are checked before any rank starts"
LOOM_INJECT_FAULT="rank=9,step=2" expect_error 2 "loom_train: LOOM_INJECT_FAULT: rank 9, step 2 never comes: the job has 4 ranks (0 to 3)" --steps 3
echo "ok: a fault probe outside the job is refused"
