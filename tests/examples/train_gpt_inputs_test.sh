#!/usr/bin/env bash
# train_gpt as a new user meets it: every bad flag, config file or path exits 2 with one line
# naming the flag (or file, section and key), the value and what is expected, before anything
# trains; nothing aborts ("terminate called"). A config file sets the job, flags override it, and
# the effective config written beside the metrics repeats the run exactly.
set -euo pipefail
train="$(realpath "$1")"
configs="$(realpath "$2")"
cd "${TEST_TMPDIR:-$(mktemp -d)}"

fail() { echo "FAIL: $*" >&2; exit 1; }

# expect_error CODE MESSAGE ARGS...: train_gpt ARGS exits CODE and its stderr holds MESSAGE.
expect_error() {
  local code="$1" message="$2"
  shift 2
  local status=0
  "$train" --no-progress "$@" >out.log 2>err.log || status=$?
  [[ $status -eq $code ]] || { cat out.log err.log; fail "train_gpt $* exited $status, expected $code"; }
  grep -qF -- "$message" err.log || { cat err.log; fail "train_gpt $*: expected the message: $message"; }
  ! grep -q "terminate called" out.log err.log || fail "train_gpt $* aborted"
  echo "ok ($code): train_gpt $*"
}

expect_error 2 "train_gpt: --dp: expected a non-negative integer, got 'abc'" --dp abc
expect_error 2 "train_gpt: --dp-shard: expected a positive integer or -1 (the ranks the other degrees leave), got 0" \
  --dp-shard 0
expect_error 2 "train_gpt: --dp-shard -1 takes the ranks the other degrees leave, but the number of ranks is not known: give --nproc N" \
  --dp-shard -1
expect_error 2 "train_gpt: --dp-shard -1: 6 ranks do not split over pp 1 x dp_replicate 1 x tp 4 = 4" \
  --dp-shard -1 --tp 4 --nproc 6
expect_error 2 "train_gpt: --dp is --dp-replicate's shorthand, but they differ: --dp 2 and --dp-replicate 3" \
  --dp 2 --dp-replicate 3
expect_error 2 "train_gpt: --nproc 8: the degrees dp_replicate=2 x tp=2 make 4 ranks" --nproc 8
expect_error 2 "train_gpt: --resume: needs --checkpoint-dir" --resume
expect_error 2 "train_gpt: --checkpoint-every, --keep-last and --async-checkpoint: need --checkpoint-dir" \
  --checkpoint-every 4
touch not_a_dir
expect_error 2 "train_gpt: --checkpoint-dir: 'not_a_dir' exists and is not a directory" \
  --checkpoint-dir not_a_dir
expect_error 2 "train_gpt: --lr: expected a positive number, got 'abc'" --lr abc
expect_error 2 "train_gpt: --lr: expected a positive number, got '0'" --lr 0
expect_error 2 "train_gpt: --seed: expected a non-negative integer, got '-5'" --seed -5
expect_error 2 "train_gpt: --sample-tokens: expected a non-negative integer, got '-1'" \
  --sample-tokens -1
expect_error 2 "train_gpt: --schedule: expected one of gpipe, 1f1b, interleaved, got 'zigzag'" \
  --schedule zigzag
expect_error 2 "train_gpt: The following argument was not expected: --bogus" --bogus
expect_error 2 "train_gpt: --data: '$PWD' is not a file" --data "$PWD"
expect_error 2 "train_gpt: --data: '/no/such/file' does not exist" --data /no/such/file
expect_error 2 "train_gpt: --metrics-out: cannot write '/missing/dir/m.jsonl': the folder '/missing/dir' does not exist" \
  --metrics-out /missing/dir/m.jsonl
expect_error 2 "train_gpt: --plot-out: cannot write '/missing/dir/p.png'" --plot-out /missing/dir/p.png
expect_error 2 "train_gpt: --save: cannot write '/missing/dir/m.safetensors'" \
  --save /missing/dir/m.safetensors
expect_error 2 "train_gpt: --init-from: '/no/ckpt.safetensors' does not exist" \
  --init-from /no/ckpt.safetensors
expect_error 2 "train_gpt: --config: cannot read the job file '/no/job.toml'" --config /no/job.toml
printf '[training]\nstepz = 3\n' >typo.toml
expect_error 2 "train_gpt: typo.toml: unknown key 'stepz' in [training]; its keys are steps" \
  --config typo.toml
printf '[training]\nsteps = "ten"\n' >typed.toml
expect_error 2 "train_gpt: typed.toml: [training] steps: expected an integer, got a string ('ten')" \
  --config typed.toml
printf '[training\n' >broken.toml
expect_error 2 "train_gpt: broken.toml:1:" --config broken.toml

expect_error 2 "train_gpt: --seq-len: 128 tokens per sequence is more than the model's context of 64 (--block-size, the preset's)" \
  --seq-len 128
expect_error 2 "train_gpt: GPTConfig: n_embd=64 is not divisible by n_head=5" --n-head 5 --dp 1 --tp 1
WORLD_SIZE=4 expect_error 1 "train_gpt: WORLD_SIZE=4 is set but RANK is not" --dp 1 --tp 1

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
expect_error 2 "train_gpt: --n-head: 2 contradicts the checkpoint 'ckpt/model.safetensors', whose config.json has n_head = 4" \
  --dp 1 --tp 1 --init-from ckpt/model.safetensors --n-head 2
expect_error 2 "more than the model's context of 128 (n_positions of the checkpoint's config.json)" \
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
losses() { sed -e 's/.*"loss":\([-0-9.e+]*\).*/\1/' "$1"; }
[[ "$(losses first.jsonl)" == "$(losses again.jsonl)" ]] ||
  fail "the effective config did not repeat the run: $(losses first.jsonl) vs $(losses again.jsonl)"
echo "ok: a config file, a flag over it, and the effective config repeating the run"
