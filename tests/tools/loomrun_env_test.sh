#!/usr/bin/env bash
# Each rank gets the launcher's variables; its output comes out line by line with "[rank R] ".
LOOMRUN="$1"; HELPER="$2"; source "$3"

# Three ranks on one node; a stale RANK in loomrun's own environment must not leak through.
RANK=99 run_loomrun --nproc-per-node 3 -- "$HELPER" --print-env
expect_eq "$RC" 0 "exit code"
ports=()
for r in 0 1 2; do
  expect_line "$WORK/out" "[rank $r] RANK=$r"
  expect_line "$WORK/out" "[rank $r] WORLD_SIZE=3"
  expect_line "$WORK/out" "[rank $r] LOCAL_RANK=$r"
  expect_line "$WORK/out" "[rank $r] LOCAL_WORLD_SIZE=3"
  expect_line "$WORK/out" "[rank $r] GROUP_RANK=0"
  expect_line "$WORK/out" "[rank $r] MASTER_ADDR=127.0.0.1"
  expect_line "$WORK/out" "[rank $r] LOOM_AGENT_STORE=1"
  # The last line has no newline: flushed, prefixed, when the rank exits.
  expect_line "$WORK/out" "[rank $r] no newline at the end of rank $r"
  # stderr goes to stderr, prefixed too, and not to stdout.
  expect_line "$WORK/err" "[rank $r] stderr line of rank $r"
  ports+=("$(sed -n "s/^\[rank $r\] MASTER_PORT=//p" "$WORK/out")")
done
grep -q "stderr line" "$WORK/out" && fail "stderr lines reached stdout"
# Every stdout line carries a prefix: 3 ranks x 9 lines.
expect_eq "$(grep -c '^\[rank [0-2]\] ' "$WORK/out")" 27 "prefixed stdout lines"
expect_eq "$(wc -l <"$WORK/out")" 27 "stdout lines"
[[ "${ports[0]}" =~ ^[0-9]+$ && "${ports[0]}" -gt 0 && "${ports[0]}" -le 65535 ]] ||
  fail "MASTER_PORT '${ports[0]}' is not a port number"
expect_eq "${ports[1]}" "${ports[0]}" "MASTER_PORT of rank 1 vs rank 0"
expect_eq "${ports[2]}" "${ports[0]}" "MASTER_PORT of rank 2 vs rank 0"

# Second node of a 2-node job: ranks 2 and 3 of 4, the given address and port.
run_loomrun --nnodes 2 --node-rank 1 --nproc-per-node 2 --master-addr 127.0.0.1 \
  --master-port 29512 "$HELPER" --print-env
expect_eq "$RC" 0 "exit code (2 nodes)"
for local_rank in 0 1; do
  r=$((2 + local_rank))
  expect_line "$WORK/out" "[rank $r] RANK=$r"
  expect_line "$WORK/out" "[rank $r] WORLD_SIZE=4"
  expect_line "$WORK/out" "[rank $r] LOCAL_RANK=$local_rank"
  expect_line "$WORK/out" "[rank $r] LOCAL_WORLD_SIZE=2"
  expect_line "$WORK/out" "[rank $r] GROUP_RANK=1"
  expect_line "$WORK/out" "[rank $r] MASTER_PORT=29512"
done
grep -q '^\[rank [01]\]' "$WORK/out" && fail "node 1 started ranks 0 or 1"
# Many lines at once from several ranks (more than a pipe holds): none torn, none lost.
run_loomrun --nproc-per-node 4 -- "$HELPER" --lines 5000
expect_eq "$RC" 0 "exit code (many lines)"
for r in 0 1 2 3; do
  count=$(grep -cE "^\[rank $r\] line $r-[0-9]+ $r+\$" "$WORK/out" || true)
  expect_eq "$count" 5000 "whole lines of rank $r"
  expect_eq "$(grep "^\[rank $r\] line $r-" "$WORK/out" | awk '{print length($0)}' | sort -u)" \
    109 "line length of rank $r (prefix + 100 bytes)"
done
expect_eq "$(wc -l <"$WORK/out")" 20000 "stdout lines (many lines)"
echo PASS
