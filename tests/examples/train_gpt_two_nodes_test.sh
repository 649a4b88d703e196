#!/usr/bin/env bash
# Two loomrun "nodes" on this machine (--nnodes 2, node ranks 0 and 1, one master address and
# port, 2 ranks each) form one world of 4 and train the default job's layout (dp=2 x tp=2) to the
# one-rank losses (1e-4 absolute, as train_gpt_test). Both nodes reach each other over loopback
# (a test cannot count on creating network namespaces for its own veth pair).
set -euo pipefail
train="$(realpath "$1")"
loomrun="$(realpath "$2")"
cd "${TEST_TMPDIR:-$(mktemp -d)}"

common=(--steps 6 --log-every 1 --sample-tokens 0 --no-progress)
"$train" --launcher "$loomrun" --dp 1 --tp 1 "${common[@]}" --metrics-out single.jsonl \
  --plot-out single.png >single.log 2>&1 || { cat single.log; exit 1; }

# A port nobody listens on: node 0's loomrun serves the rendezvous store there. A collision
# with another program makes node 0 exit 1 naming the port; try another.
for attempt in 1 2 3; do
  port=$(( 20000 + RANDOM % 30000 ))
  node() {  # node RANK: one loomrun node of the two
    timeout 300 "$loomrun" --nnodes 2 --node-rank "$1" --nproc-per-node 2 \
      --master-addr 127.0.0.1 --master-port "$port" -- \
      "$train" --dp 2 --tp 2 "${common[@]}" --metrics-out "node$1.jsonl" --plot-out "node$1.png"
  }
  node 0 >node0.log 2>&1 &
  first=$!
  node 1 >node1.log 2>&1 &
  second=$!
  s0=0 s1=0
  wait "$first" || s0=$?
  wait "$second" || s1=$?
  if (( s0 == 0 && s1 == 0 )); then break; fi
  if grep -q "bind" node0.log && (( attempt < 3 )); then continue; fi
  cat node0.log node1.log
  echo "FAIL: node 0 exited $s0, node 1 exited $s1"
  exit 1
done
grep -q "DeviceMesh(pp=1, dp=2, tp=2" node0.log || { cat node0.log; echo "FAIL: not one world of 4"; exit 1; }

loss() { sed -e 's/.*"loss":\([-0-9.e+]*\).*/\1/' "$1"; }
[[ $(wc -l <node0.jsonl) -eq 6 ]] || { cat node0.log; echo "FAIL: expected 6 metric lines"; exit 1; }
paste <(loss single.jsonl) <(loss node0.jsonl) | awk '
  { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4) { print "step " NR-1 ": 1 rank " $1 " vs two nodes " $2; bad = 1 } }
  END { exit bad }'
echo "ok: two loomrun nodes of 2 ranks trained to the one-rank losses"
paste <(loss single.jsonl) <(loss node0.jsonl)
