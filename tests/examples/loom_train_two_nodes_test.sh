#!/usr/bin/env bash
# Two loomrun "nodes" on this machine (--nnodes 2, node ranks 0 and 1, one master address and
# port, 2 ranks each) form one world of 4 and train the default job's layout (dp=2 x tp=2) to the
# one-rank losses (1e-4 absolute, as loom_train_test). Both nodes reach each other over loopback
# (a test cannot count on creating network namespaces for its own veth pair).
set -euo pipefail
train="$(realpath "$1")"
loomrun="$(realpath "$2")"
cd "${TEST_TMPDIR:-$(mktemp -d)}"

common=(--steps 6 --log-every 1 --sample-tokens 0 --no-progress)
"$train" --launcher "$loomrun" --dp 1 --tp 1 "${common[@]}" --metrics-out single.jsonl \
  --plot-out single.png >single.log 2>&1 || { cat single.log; exit 1; }

# A port nobody listens on: node 0's loomrun serves the rendezvous store there. Node 0 starts
# first; if the port was taken (it exits at once naming the port), try another before node 1
# waits on it. A short collective timeout ends a broken run well within the test's.
export LOOM_TIMEOUT_S=60
node() {  # node RANK PORT: one loomrun node of the two
  timeout 240 "$loomrun" --nnodes 2 --node-rank "$1" --nproc-per-node 2 \
    --master-addr 127.0.0.1 --master-port "$2" -- \
    "$train" --dp 2 --tp 2 "${common[@]}" --metrics-out "node$1.jsonl" --plot-out "node$1.png"
}
for attempt in 1 2 3 4 5; do
  port=$(( 20000 + RANDOM % 30000 ))
  node 0 "$port" >node0.log 2>&1 &
  first=$!
  sleep 1
  if ! kill -0 "$first" 2>/dev/null; then
    s0=0
    wait "$first" || s0=$?
    (( s0 != 0 )) && (( attempt < 5 )) && continue  # the port was taken
  fi
  node 1 "$port" >node1.log 2>&1 &
  second=$!
  s0=0 s1=0
  wait "$first" || s0=$?
  wait "$second" || s1=$?
  break
done
if (( s0 != 0 || s1 != 0 )); then
  cat node0.log node1.log
  echo "FAIL: node 0 exited $s0, node 1 exited $s1"
  exit 1
fi
grep -q "DeviceMesh(pp=1, dp_replicate=2, dp_shard=1, cp=1, tp=2" node0.log || { cat node0.log; echo "FAIL: not one world of 4"; exit 1; }

loss() { sed -n 's/.*"loss":\([-0-9.e+]*\).*/\1/p' "$1"; }
[[ $(wc -l <node0.jsonl) -eq 6 ]] || { cat node0.log; echo "FAIL: expected 6 metric lines"; exit 1; }
paste <(loss single.jsonl) <(loss node0.jsonl) | awk '
  { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4) { print "step " NR-1 ": 1 rank " $1 " vs two nodes " $2; bad = 1 } }
  END { exit bad }'
echo "ok: two loomrun nodes of 2 ranks trained to the one-rank losses"
paste <(loss single.jsonl) <(loss node0.jsonl)
