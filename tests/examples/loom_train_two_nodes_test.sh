#!/usr/bin/env bash
# Two loomrun nodes (--nnodes 2, node ranks 0 and 1, one master address and port, 2 ranks each)
# form one world of 4 and train the default job's layout (dp=2 x tp=2) to the one-rank losses
# (1e-4 absolute, as loom_train_test), each node in a network namespace of its own joined by a
# veth pair (10.213.N.1 and 10.213.N.2), as two hosts are: neither can reach the other over
# loopback, so the ranks must listen where the other node reaches them (Gloo's default follows
# MASTER_ADDR; each rank says which address it uses). Creating the namespaces needs root (CI runs
# as root); without it the test says so and runs both nodes over loopback.
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
node() {  # node RANK PORT: one loomrun node of the two, in its namespace when there are some
  local ns=()
  [[ $master != 127.0.0.1 ]] && { local name="ns$1"; ns=(ip netns exec "${!name}"); }
  timeout 240 "${ns[@]}" "$loomrun" --nnodes 2 --node-rank "$1" --nproc-per-node 2 \
    --master-addr "$master" --master-port "$2" -- \
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
