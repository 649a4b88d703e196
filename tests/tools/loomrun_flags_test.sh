#!/usr/bin/env bash
# Bad command lines exit 2 with a message naming what was given and what was expected.
LOOMRUN="$1"; HELPER="$2"; source "$3"

# expect_usage_error MESSAGE ARGS...
expect_usage_error() {
  local message="$1"
  shift
  run_loomrun "$@"
  expect_eq "$RC" 2 "exit code of: loomrun $*"
  expect_line "$WORK/err" "loomrun: $message"
  [[ ! -s "$WORK/out" ]] || fail "loomrun $* wrote to stdout"
}

expect_usage_error "--nproc-per-node must be at least 1, got 0" \
  --nproc-per-node 0 -- "$HELPER"
expect_usage_error "Could not convert: --nproc-per-node = x: expected a whole number (--nproc-per-node, --nnodes, --node-rank, --master-port, --max-restarts) or a number of seconds (--timeout-s, --grace-s); run 'loomrun --help' for the flags" \
  --nproc-per-node x -- "$HELPER"
expect_usage_error "--node-rank 2 is out of range for --nnodes 2; expected 0 <= node-rank < 2" \
  --nnodes 2 --node-rank 2 --master-port 29500 -- "$HELPER"
expect_usage_error "--nnodes 2 needs --master-port: every node must be given the same port (a free port is picked only for a single-node job)" \
  --nnodes 2 --node-rank 0 -- "$HELPER"
expect_usage_error "missing the program to run; usage: loomrun [flags] -- PROGRAM [ARGS...]" \
  --nproc-per-node 2
expect_usage_error "missing the program to run; usage: loomrun [flags] -- PROGRAM [ARGS...]" \
  --nproc-per-node 2 --
expect_usage_error "--master-port must be in 0..65535 (0: a free port), got 70000" \
  --master-port 70000 -- "$HELPER"
expect_usage_error "unknown flag '--bogus'; run 'loomrun --help' for the flags, and put the program after '--' if its name starts with '-'" \
  --bogus 3 -- "$HELPER"
run_loomrun --nproc-per-node three -- "$HELPER"
expect_eq "$RC" 2 "exit code for a non-numeric --nproc-per-node"
expect_grep "$WORK/err" "^loomrun: .*--nproc-per-node.*three"

# --help prints the flags on stdout and exits 0.
run_loomrun --help
expect_eq "$RC" 0 "exit code of --help"
expect_grep "$WORK/out" "--nproc-per-node"
expect_grep "$WORK/out" "--master-port"
echo PASS
