#!/usr/bin/env bash
# loom_train's ranks under the launchers README names, each setting its own variables
# (comm/launch_env.h): torchrun's RANK/WORLD_SIZE, mpirun's OMPI_COMM_WORLD_*, and srun's
# SLURM_PROCID/SLURM_NTASKS within a job step. Two processes started by hand with each set form
# one dp2 job whose losses equal loomrun's bit for bit, and their world decides --dp-shard -1. An
# sbatch script's own shell (SLURM_PROCID 0, no step) and one srun or mpirun task are not ranks of
# a job: a job started there starts its own.
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
    (( try < 3 )) || { cat "$name".*.log; fail "$name: 3 ports in a row were taken"; }
  done
  [[ $(losses "$name.0.log") == "$want" ]] ||
    { cat "$name.0.log"; fail "$name: losses $(losses "$name.0.log"), loomrun's $want"; }
  echo "ok: $name: two ranks by hand, losses equal loomrun's ($want)"
}

by_hand torchrun RANK WORLD_SIZE
by_hand mpirun OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE
by_hand srun SLURM_PROCID SLURM_NTASKS SLURM_STEP_ID=0 SLURM_LOCALID=0 SLURM_NTASKS_PER_NODE=2
# The launcher's world decides --dp-shard -1 (2 FSDP shards here, where dp 2 replicated): the
# ranks by hand equal loomrun's bit for bit.
job=(--dp 0 --dp-shard -1 --tp 1 --steps 3 --log-every 1 --sample-tokens 0 --no-progress --plot-out "")
"$train" --launcher "$loomrun" --nproc 2 "${job[@]}" --metrics-out "" >fsdp.log 2>&1 ||
  { cat fsdp.log; fail "dp_shard -1 under loomrun"; }
want=$(losses fsdp.log)
by_hand mpirun_fsdp OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE
job=(--dp 2 --tp 1 --steps 3 --log-every 1 --sample-tokens 0 --no-progress --plot-out "")
want=$(losses loomrun.log)

# One task of srun or mpirun (an interactive `srun --pty bash`, `srun -n1 ./loom train`) is no
# launcher of ranks: the job starts its own 2, as from a plain shell.
SLURM_PROCID=0 SLURM_NTASKS=1 SLURM_STEP_NUM_TASKS=1 SLURM_STEP_ID=3 SLURM_LOCALID=0 \
  "$train" --launcher "$loomrun" "${job[@]}" --metrics-out "" >srun_one.log 2>&1 ||
  { cat srun_one.log; fail "the job in a one-task srun step"; }
[[ $(losses srun_one.log) == "$want" ]] || { cat srun_one.log; fail "one-task srun: other losses"; }
OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=1 "$train" --launcher "$loomrun" "${job[@]}" \
  --metrics-out "" >mpirun_one.log 2>&1 || { cat mpirun_one.log; fail "the job under mpirun -n 1"; }
[[ $(losses mpirun_one.log) == "$want" ]] || { cat mpirun_one.log; fail "mpirun -n 1: other losses"; }
echo "ok: one srun or mpirun task starts the job's own ranks"

# An sbatch script's shell: SLURM_PROCID 0 of 2 tasks but no step. The job is not rank 0 of a
# world of 2 (which would wait for a rank 1 that never comes): it starts its own 2 ranks.
SLURM_PROCID=0 SLURM_NTASKS=2 SLURM_LOCALID=0 "$train" --launcher "$loomrun" "${job[@]}" \
  --metrics-out "" >sbatch.log 2>&1 || { cat sbatch.log; fail "the job in an sbatch script's shell"; }
[[ $(losses sbatch.log) == "$want" ]] || { cat sbatch.log; fail "sbatch shell: other losses"; }
echo "ok: in an sbatch script's shell the job starts its own ranks"
