#!/usr/bin/env bash
# Two loomrun nodes (--nnodes 2, node ranks 0 and 1, one master address and port, 2 ranks each)
# form one world of 4 and train the default job's layout (dp=2 x tp=2) to the one-rank losses
# (1e-4 absolute, as loom_train_test), each node in a network namespace of its own joined by a
# veth pair (10.213.N.1 and 10.213.N.2), as two hosts are: neither can reach the other over
# loopback, so the ranks must listen where the other node reaches them (Gloo's default follows
# MASTER_ADDR; each rank says which address it uses). Then the same two nodes with --max-restarts:
# a rank of node 1 killed mid-run, both nodes restart, the job resumes from its checkpoint.
# Creating the namespaces needs root (CI runs as root); without it the test says so and runs both
# nodes over loopback.
set -euo pipefail
train="$(realpath "$1")"
loomrun="$(realpath "$2")"
cd "${TEST_TMPDIR:-$(mktemp -d)}"

# Two namespaces and a veth pair between them; names unique to this run, removed on exit.
ns0="loom2n0_$$" ns1="loom2n1_$$" net=$(( $$ % 200 + 20 ))
cleanup() { ip netns del "$ns0" 2>/dev/null || true; ip netns del "$ns1" 2>/dev/null || true; }
trap cleanup EXIT
in_ns=()
master=127.0.0.1
if ip netns add "$ns0" 2>/dev/null && ip netns add "$ns1" 2>/dev/null &&
  ip link add "v0_$$" netns "$ns0" type veth peer name "v1_$$" netns "$ns1" 2>/dev/null; then
  ip -n "$ns0" addr add "10.213.$net.1/24" dev "v0_$$"
  ip -n "$ns1" addr add "10.213.$net.2/24" dev "v1_$$"
  for n in 0 1; do
    ns="ns$n"
    ip -n "${!ns}" link set "v${n}_$$" up
    ip -n "${!ns}" link set lo up
  done
  master="10.213.$net.1"
  echo "two nodes in network namespaces $ns0 (10.213.$net.1) and $ns1 (10.213.$net.2)"
else
  echo "NOTE: cannot create network namespaces here (not root?): both nodes run over loopback"
  cleanup
fi

common=(--steps 6 --log-every 1 --sample-tokens 0 --no-progress)
"$train" --launcher "$loomrun" --dp 1 --tp 1 "${common[@]}" --metrics-out single.jsonl \
  --plot-out single.png >single.log 2>&1 || { cat single.log; exit 1; }

# A port nobody listens on: node 0's loomrun serves the rendezvous store there. Node 0 starts
# first; if the port was taken (it exits at once naming the port), try another before node 1
# waits on it. A short collective timeout ends a broken run well within the test's.
export LOOM_TIMEOUT_S=60
# node RANK PORT NAME [LOOMRUN FLAGS -- TRAIN FLAGS]: one loomrun node of the two, in its
# namespace when there are some; its metrics in NAME<RANK>.jsonl.
node() {
  local rank="$1" port="$2" name="$3" ns=() launcher_flags=() train_flags=()
  shift 3
  while (( $# )) && [[ $1 != -- ]]; do launcher_flags+=("$1"); shift; done
  (( $# )) && shift
  train_flags=("$@")
  [[ $master != 127.0.0.1 ]] && { local nsname="ns$rank"; ns=(ip netns exec "${!nsname}"); }
  timeout 240 "${ns[@]}" "$loomrun" --nnodes 2 --node-rank "$rank" --nproc-per-node 2 \
    --master-addr "$master" --master-port "$port" "${launcher_flags[@]}" -- \
    "$train" --dp 2 --tp 2 "${train_flags[@]:-${common[@]}}" --metrics-out "$name$rank.jsonl" \
    --plot-out ""
}
# two_nodes NAME [FLAGS]: both nodes, node 0 first (another port if its port was taken); sets s0,
# s1 (their exit codes) and first, second (their pids, for a test to act on meanwhile: with
# AFTER_START set, that command runs while they do).
two_nodes() {
  local name="$1"
  shift
  for attempt in 1 2 3 4 5; do
    port=$(( 20000 + RANDOM % 30000 ))
    node 0 "$port" "$name" "$@" >"${name}0.log" 2>&1 &
    first=$!
    sleep 1
    if ! kill -0 "$first" 2>/dev/null; then
      s0=0
      wait "$first" || s0=$?
      (( s0 != 0 )) && (( attempt < 5 )) && continue  # the port was taken
    fi
    node 1 "$port" "$name" "$@" >"${name}1.log" 2>&1 &
    second=$!
    [[ -n ${AFTER_START:-} ]] && eval "$AFTER_START"
    s0=0 s1=0
    wait "$first" || s0=$?
    wait "$second" || s1=$?
    break
  done
}
two_nodes node
if (( s0 != 0 || s1 != 0 )); then
  cat node0.log node1.log
  echo "FAIL: node 0 exited $s0, node 1 exited $s1"
  exit 1
fi
grep -q "DeviceMesh(pp=1, dp_replicate=2, dp_shard=1, cp=1, tp=2" node0.log || { cat node0.log; echo "FAIL: not one world of 4"; exit 1; }
if [[ $master != 127.0.0.1 ]]; then
  # Every rank names the address it listens on: its own node's end of the veth pair.
  for n in 0 1; do
    want="10.213.$net.$(( n + 1 ))"
    [[ $(grep -c "gloo: this rank's endpoints listen on hostname '$want' (the local address that routes to MASTER_ADDR $master)" "node$n.log") -eq 2 ]] ||
      { cat "node$n.log"; echo "FAIL: node $n's 2 ranks do not say they listen on $want"; exit 1; }
  done
fi

loss() { sed -n 's/.*"loss":\([-0-9.e+]*\).*/\1/p' "$1"; }
[[ $(loss node0.jsonl | wc -l) -eq 6 ]] || { cat node0.log; echo "FAIL: expected 6 steps' losses"; exit 1; }
paste <(loss single.jsonl) <(loss node0.jsonl) | awk '
  { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4) { print "step " NR-1 ": 1 rank " $1 " vs two nodes " $2; bad = 1 } }
  END { exit bad }'
echo "ok: two loomrun nodes of 2 ranks trained to the one-rank losses"
paste <(loss single.jsonl) <(loss node0.jsonl)

# Restarts across the two nodes (--max-restarts on both): a rank of node 1 killed after step 4 of
# 40;
# node 1's loomrun restarts its ranks, node 0's ranks fail as their peers vanish and node 0's
# loomrun restarts them too; the job resumes from its checkpoint (every 2 steps, one folder for
# all ranks) and ends with the one-rank losses (1e-4, as above).
mkdir -p ck flight0
long=(--steps 40 --log-every 1 --sample-tokens 0 --no-progress)
"$train" --launcher "$loomrun" --dp 1 --tp 1 "${long[@]}" --metrics-out single40.jsonl \
  --plot-out "" >single40.log 2>&1 || { cat single40.log; exit 1; }
descendants() {  # descendants PID: every process below PID, one pid per line
  local child
  for child in $(pgrep -P "$1"); do
    echo "$child"
    descendants "$child"
  done
}
kill_node1_rank() {
  for _ in $(seq 1 1200); do
    done_step=$(cat flight0/progress 2>/dev/null || echo -1)
    if [[ $done_step =~ ^[0-9]+$ ]] && (( done_step >= 4 )); then
      # Node 1's loomrun itself (not the timeout(1) that started it), among this test's own
      # processes (another test may run loomrun at the same time): its children are ranks.
      parents=$( { echo "$second"; descendants "$second"; } | paste -sd,)
      launcher1=$(pgrep -P "$parents" -f -- "^$loomrun --nnodes 2 --node-rank 1 " | head -1)
      victim=$(pgrep -P "$launcher1" | sort -n | head -1)
      if [[ -n $victim ]] && kill -9 "$victim"; then
        echo "killed node 1's rank (pid $victim) after step $done_step"
      else
        echo "found no rank of node 1's loomrun (pid '${launcher1}') to kill after step $done_step"
      fi
      return
    fi
    sleep 0.01
  done
}
AFTER_START=kill_node1_rank LOOM_FLIGHT_RECORDER_DIR="$PWD/flight0" two_nodes restarted \
  --max-restarts 2 -- "${long[@]}" --checkpoint-dir "$PWD/ck" --checkpoint-every 2
if (( s0 != 0 || s1 != 0 )); then
  cat restarted0.log restarted1.log
  echo "FAIL: with restarts, node 0 exited $s0, node 1 exited $s1"
  exit 1
fi
for n in 0 1; do
  grep -q "^loomrun: restart 1 of 2: " "restarted$n.log" || { cat "restarted$n.log"; echo "FAIL: node $n did not restart"; exit 1; }
done
grep -Eq "resumed from .* at step [0-9]+ \(same layout\)" restarted0.log || { cat restarted0.log; echo "FAIL: no resume"; exit 1; }
[[ $(sed -n 's/.*"step":\([0-9]*\).*/\1/p' restarted0.jsonl | tail -1) == 39 ]] ||
  { cat restarted0.jsonl; echo "FAIL: the restarted job did not reach step 39"; exit 1; }
# The steps the last attempt ran against one rank's (1e-4 absolute, as above).
join <(sed -n 's/.*"loss":\([-0-9.e+]*\).*"step":\([0-9]*\).*/\2 \1/p' single40.jsonl | sort -k1,1) \
  <(sed -n 's/.*"loss":\([-0-9.e+]*\).*"step":\([0-9]*\).*/\2 \1/p' restarted0.jsonl | sort -k1,1) |
  awk '{ d = $2 - $3; if (d < 0) d = -d; if (d > 1e-4) { print "step " $1 ": 1 rank " $2 " vs restarted two nodes " $3; bad = 1 } }
       END { exit bad }' || { echo "FAIL: the restarted losses differ"; exit 1; }
echo "ok: both nodes restarted after a rank of node 1 was killed; the losses are one rank's"

