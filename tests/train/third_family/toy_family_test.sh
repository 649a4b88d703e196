#!/usr/bin/env bash
# A third model family, registered from this folder only (tests/train/third_family/: 3 files —
# toy_family.cc with its one LOOM_REGISTER_MODEL_FAMILY line, this BUILD's program and this test;
# no edit outside it), trains through the library's own runner and flags: --model toy-tiny on
# 1 rank, dp2 x tp2 and pp2 (1F1B, 2 microbatches). Its losses fall, and every layout's losses
# equal one rank's to 1e-4 (f32 rounding of sums in other orders; the values are ~3-6).
set -euo pipefail
train="$(realpath "$1")"
loomrun="$(realpath "$2")"
cd "${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*" >&2; exit 1; }

run() {  # run NAME FLAGS...
  local name="$1"
  shift
  "$train" --launcher "$loomrun" --model toy-tiny --steps 8 --batch-size 8 --seq-len 32 \
    --log-every 1 --sample-tokens 0 --no-progress --metrics-out "$name.jsonl" --plot-out "" \
    "$@" >"$name.log" 2>&1 || { cat "$name.log"; fail "$name failed"; }
  grep -q "Toy n_layer=2\|toy-tiny on" "$name.log" || { cat "$name.log"; fail "$name: not the toy model"; }
}
losses() { sed -n 's/.*"loss":\([-0-9.e+]*\).*/\1/p' "$1.jsonl"; }

run single --dp 1 --tp 1
run grid --dp 2 --tp 2
run piped --dp 1 --tp 1 --pp 2 --microbatches 2
awk -v a="$(losses single | head -1)" -v b="$(losses single | tail -1)" \
  'BEGIN { if (b >= a) { print "the loss did not fall: " a " -> " b; exit 1 } }'
for layout in grid piped; do
  paste <(losses single) <(losses "$layout") | awk -v layout="$layout" '{ d = $1 - $2; if (d < 0) d = -d;
    if (d > 1e-4) { print layout " step " NR - 1 ": " $2 " vs " $1 " on one rank"; bad = 1 } }
    END { exit bad }' || fail "$layout differs from one rank"
done
# The registry lists it (the program links this family alone), and --save, which needs a Hugging
# Face format the family does not have, is refused by name before anything trains.
if "$train" --model nope --no-progress 2>err.log; then fail "an unknown model trained"; fi
grep -q "toy: toy-tiny" err.log || { cat err.log; fail "the registry does not list toy"; }
if "$train" --model toy-tiny --dp 1 --tp 1 --save x.safetensors --steps 1 --no-progress \
    --sample-tokens 0 --metrics-out "" --plot-out "" >save.log 2>&1; then
  fail "--save of a family without a Hugging Face format succeeded"
fi
grep -q -- "--save: the toy family has no Hugging Face checkpoint format (--model toy-tiny)" save.log || { cat save.log; fail "not named"; }
# A family that does not declare context parallelism (ModelArgs::supports_context_parallel) is
# refused by name for --cp 2, before anything trains.
if "$train" --model toy-tiny --dp 1 --tp 1 --cp 2 --steps 1 --no-progress --sample-tokens 0 \
    --metrics-out "" --plot-out "" >cp.log 2>&1; then
  fail "--cp 2 on a family without context parallelism succeeded"
fi
grep -q -- "--cp 2: the toy family does not take context parallelism" cp.log || { cat cp.log; fail "cp not named"; }
# A family that does not declare dropout (ModelFamily::takes_dropout) is refused by name for it.
if "$train" --model toy-tiny --dp 1 --tp 1 --attn-dropout 0.1 --steps 1 --no-progress \
    --sample-tokens 0 --metrics-out "" --plot-out "" >dropout.log 2>&1; then
  fail "--attn-dropout 0.1 on a family without dropout succeeded"
fi
grep -q -- "--attn-dropout 0.1: the toy family has no attention dropout" dropout.log ||
  { cat dropout.log; fail "dropout not named"; }
echo "ok: a third family in 3 files of its own folder, on 1 rank, dp2 x tp2 and pp2; --cp and --attn-dropout refused by name"
