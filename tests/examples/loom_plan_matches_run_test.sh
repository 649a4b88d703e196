#!/usr/bin/env bash
# `loom plan`'s communication table against the real job's operations, as a user would check it:
# the job runs twice (2 and 3 steps) with the flight recorder dumping every operation of every
# rank at exit, and the difference — one step — must have, rank by rank, group by group and kind
# by kind, exactly the calls the plan lists for that rank. Everything the job's step does counts
# (its hooks and the router statistics of a mixture of experts included), not only what a
# Trainer on thread ranks does (tests/train/step_trace_test.cc checks bytes there). And the
# plan's build peak is the job's, with meta initialization and without.
set -euo pipefail
train="$(realpath "$1")"
launcher="$(realpath "$2")"
cd "${TEST_TMPDIR:-$(mktemp -d)}"

fail() { echo "FAIL: $*" >&2; exit 1; }
common=(--seq-len 32 --sample-tokens 0 --metrics-out "" --plot-out "" --no-progress)

# "rank group kind calls" lines of the plan's communication table $2 (its heading's start), ranks
# expanded, sorted.
planned_calls() {
  awk -F'|' -v heading="$2" '
    index($0, heading) == 1 { table = 1; next }
    table && /^$/ && seen { exit }
    table && /^\| [0-9]/ {
      seen = 1
      gsub(/ /, "", $2); gsub(/ /, "", $3); gsub(/ /, "", $4); gsub(/ /, "", $5)
      if ($4 == "none") next
      n = split($2, runs, ",")
      for (i = 1; i <= n; ++i) {
        m = split(runs[i], ends, "-")
        for (r = ends[1]; r <= ends[m]; ++r) print r, $3, $4, $5
      }
    }' "$1" | sort
}

# "rank group kind count" of every operation the flight recorder dumped into folder $1.
recorded_calls() {
  jq -r '.rank as $r | .groups[] | .name as $g | .records[] | "\($r) \($g) \(.op)"' "$1"/rank-*.json |
    sort | uniq -c | awk '{ print $2, $3, $4, $1 }'
}

# check NAME FLAGS...: plans the job, runs it for 2 and 3 steps, compares one step's calls.
check() {
  local name="$1"
  shift
  "$train" --plan "${common[@]}" --steps 3 "$@" >"$name.plan" 2>&1 ||
    { cat "$name.plan"; fail "$name: loom plan failed"; }
  for steps in 2 3; do
    rm -rf "$name.$steps" && mkdir "$name.$steps"
    LOOM_FLIGHT_RECORDER_DIR="$PWD/$name.$steps" LOOM_FLIGHT_RECORDER_ENTRIES=100000 \
      "$train" --launcher "$launcher" "${common[@]}" --steps "$steps" "$@" >"$name.$steps.log" 2>&1 ||
      { cat "$name.$steps.log"; fail "$name: the $steps-step job failed"; }
    ls "$name.$steps"/rank-*.json >/dev/null 2>&1 || fail "$name: no flight record in $name.$steps"
  done
  # With --val-every 1 --val-steps 1, a step is also one validation batch's operations.
  { planned_calls "$name.plan" "Communication per step and rank"
    if [[ " $* " == *" --val-data "* ]]; then
      planned_calls "$name.plan" "Communication per validation batch and rank"
    fi
  } | awk '{ calls[$1 " " $2 " " $3] += $4 } END { for (k in calls) print k, calls[k] }' |
    sort >"$name.planned"
  [[ -s "$name.planned" ]] || { cat "$name.plan"; fail "$name: no communication table in the plan"; }
  # One step: what the 3-step job did beyond the 2-step one.
  join -a 2 -e 0 -o 2.1,1.2,2.2 \
    <(recorded_calls "$name.2" | awk '{ print $1 "|" $2 "|" $3, $4 }' | sort) \
    <(recorded_calls "$name.3" | awk '{ print $1 "|" $2 "|" $3, $4 }' | sort) |
    awk '{ d = $3 - $2; if (d != 0) { split($1, k, "|"); print k[1], k[2], k[3], d } }' |
    sort >"$name.measured"
  if ! diff "$name.planned" "$name.measured" >"$name.diff"; then
    echo "$name: rank group kind calls, planned (<) against one step of the job (>):"
    cat "$name.diff"
    fail "$name: the plan's operations are not the job's"
  fi
  echo "ok: $name, $(wc -l <"$name.planned") (rank, group, kind) rows equal"
}

# A mixture of experts over ep inside HSDP: the all-to-all dispatch and the router statistics.
check moe-hsdp-ep --model llama-moe-tiny --dp-replicate 2 --dp-shard 2 --ep 2 --tp 1 --batch-size 4
# A 1F1B pipeline over tensor parallelism with sequence parallelism, Llama.
check llama-pp-tp --model llama-tiny --pp 2 --tp 2 --dp-replicate 1 --microbatches 2 --batch-size 4
# Context parallelism (ring attention) under FSDP, GPT.
check gpt-cp-ring --model tiny --cp 2 --dp-shard 2 --tp 1 --dp-replicate 1 --cp-attention ring
# A zero-bubble schedule over FSDP with gradient accumulation and bf16 compute.
check gpt-zbv-fsdp --model tiny --n-layer 4 --pp 2 --dp-shard 2 --tp 1 --dp-replicate 1 --schedule zbv \
  --microbatches 4 --grad-accum 2 --batch-size 16 --mixed-precision bf16

# Validation under FSDP: its forward all-gathers and the loss's average, every step.
check gpt-fsdp-validation --model tiny --dp-shard 2 --tp 1 --dp-replicate 1 --batch-size 4 \
  --val-data /usr/share/common-licenses/GPL-2 --val-every 1 --val-steps 1

# The plan's "peak building the model" of rank 0 is the job's "model built holding at most" line,
# with meta initialization and without (every rank building the whole model first: the plan had
# left out the copy each parameter's broadcast from rank 0 fills, a third of the peak under tp).
check_build_peak() {
  local name="$1"
  shift
  "$train" --plan --nproc 4 "${common[@]}" "$@" >"$name.plan" 2>&1 || { cat "$name.plan"; fail "$name: plan"; }
  "$train" --launcher "$launcher" --nproc 4 --steps 1 "${common[@]}" "$@" >"$name.run" 2>&1 ||
    { cat "$name.run"; fail "$name: run"; }
  local planned measured
  planned=$(awk -F'|' '/^Traced step per rank/ { t = 1; next } t && /^\| [0-9]/ { gsub(/ /, "", $8); print $8; exit }' "$name.plan")
  measured=$(grep -oE "model built holding at most [0-9.]+ MiB" "$name.run" | grep -oE "[0-9.]+")
  [[ -n "$planned" && "$planned" == "$measured" ]] ||
    { cat "$name.plan" "$name.run"; fail "$name: build peak planned '$planned' MiB, measured '$measured' MiB"; }
  echo "ok: $name, rank 0 builds at most $measured MiB, as planned"
}
check_build_peak build-tp-whole --model tiny --dp-shard 2 --tp 2 --dp-replicate 1 --batch-size 4 --no-meta-init
check_build_peak build-tp-meta --model tiny --dp-shard 2 --tp 2 --dp-replicate 1 --batch-size 4
check_build_peak build-pp-tp-whole --model llama-tiny --pp 2 --tp 2 --dp-replicate 1 --microbatches 2 \
  --batch-size 4 --no-meta-init
