#!/usr/bin/env bash
# loom_train's ranks under the launchers README names, each setting its own variables
# (comm/launch_env.h): torchrun's RANK/WORLD_SIZE, mpirun's OMPI_COMM_WORLD_*, and srun's
# SLURM_PROCID/SLURM_NTASKS within a job step. Two processes started by hand with each set form
# one dp2 job whose losses equal loomrun's bit for bit. An sbatch script's own shell (SLURM_PROCID
# 0, no step) is not a rank: a job started there starts its own.
set -euo pipefail
train="$(realpath "$1")"
loomrun="$(realpath "$2")"
cd "${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*" >&2; exit 1; }
export LOOM_TIMEOUT_S=60

job=(--dp 2 --tp 1 --steps 3 --log-every 1 --sample-tokens 0 --no-progress --plot-out "")
losses() { grep -o "loss [0-9.]*" "$1" | tr '\n' ' '; }

"$train" --launcher "$loomrun" "${job[@]}" --metrics-out "" >loomrun.log 2>&1 ||
  { cat loomrun.log; fail "the job under loomrun"; }
want=$(losses loomrun.log)
[[ -n $want ]] || { cat loomrun.log; fail "no losses under loomrun"; }

# by_hand NAME RANK_VARIABLE SIZE_VARIABLE [VAR=VALUE...]: two processes, ranks 0 and 1, with
# NAME's variables; rank 0 serves the store at MASTER_PORT (a free port: another try if taken).
by_hand() {
  local name="$1" rank_var="$2" size_var="$3"
  shift 3
  for try in 1 2 3; do
    local port=$(( 20000 + RANDOM % 20000 )) pids=()
    for rank in 0 1; do
      env "$rank_var=$rank" "$size_var=2" MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$@" \
        "$train" "${job[@]}" --metrics-out "" >"$name.$rank.log" 2>&1 &
      pids+=($!)
    done
    local status=0
    for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
    (( status == 0 )) && break
    grep -q "already in use" "$name".*.log || { cat "$name".*.log; fail "$name: exit $status"; }
  done
  [[ $(losses "$name.0.log") == "$want" ]] ||
    { cat "$name.0.log"; fail "$name: losses $(losses "$name.0.log"), loomrun's $want"; }
  echo "ok: $name: two ranks by hand, losses equal loomrun's ($want)"
}

by_hand torchrun RANK WORLD_SIZE
by_hand mpirun OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE
by_hand srun SLURM_PROCID SLURM_NTASKS SLURM_STEP_ID=0 SLURM_LOCALID=0 SLURM_NTASKS_PER_NODE=2

# An sbatch script's shell: SLURM_PROCID 0 of 2 tasks but no step. The job is not rank 0 of a
# world of 2 (which would wait for a rank 1 that never comes): it starts its own 2 ranks.
SLURM_PROCID=0 SLURM_NTASKS=2 SLURM_LOCALID=0 "$train" --launcher "$loomrun" "${job[@]}" \
  --metrics-out "" >sbatch.log 2>&1 || { cat sbatch.log; fail "the job in an sbatch script's shell"; }
[[ $(losses sbatch.log) == "$want" ]] || { cat sbatch.log; fail "sbatch shell: other losses"; }
echo "ok: in an sbatch script's shell the job starts its own ranks"
