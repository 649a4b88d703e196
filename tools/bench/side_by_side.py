"""Loom against PyTorch on this machine: the same work, interleaved pairs of runs, a ratio table.

Run through tools/bench/side_by_side.sh, which builds Loom's programs and installs PyTorch into a
private virtual environment first. Each row runs Loom's program and PyTorch's
(tools/bench/pytorch/workloads.py) one after the other, `--repeats` times, alternating which goes
first; the ratio is the median over the pairs of Loom's time / PyTorch's (lower is better).

Rows (issue 18's table):
  dispatch          a cached DTensor add on a 1-rank mesh, whole call
                    (Loom: dtensor_dispatch_bench BM_DTensorAddCached)
  gemm KxN          Linear with bias, one thread, (1024, K) @ (N, K)^T, GPT-2 small's shapes
                    (Loom: linear_bench BM_LinearFusedBias)
  MODEL dpDxtpT     a training step's median time after the first step, batch 16 x 64 tokens
                    (Loom: loom_train's metrics, ms_per_step; threads: cores / ranks on both sides);
                    "bf16": bf16 compute over f32 master weights (Loom --mixed-precision bf16,
                    PyTorch torch.autocast("cpu", torch.bfloat16))
  all_reduce SIZE   2 ranks, f32 sum; Loom's ranks are threads of one process (comm_bench), each
                    with its own Gloo group, once over loopback TCP (like for like with PyTorch's
                    Gloo) and once over shared memory (what a same-host Loom job uses);
                    PyTorch's are 2 processes (torchrun) over Gloo TCP
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOADS = os.path.join(HERE, "pytorch", "workloads.py")

GEMM_SHAPES = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]
# (model, dp, tp, precision): f32, or bf16 compute over f32 master weights (Loom's
# --mixed-precision bf16, PyTorch's CPU autocast).
TRAIN_ROWS = [("tiny", 1, 1, "f32"), ("small", 1, 1, "f32"), ("tiny", 2, 2, "f32"),
              ("small", 2, 2, "f32"), ("small", 1, 1, "bf16")]
ALLREDUCE_SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20]
GOALS = {"dispatch": 0.05, "small dp1xtp1": 0.8, "small dp2xtp2": 0.7, "all_reduce": 1.0}


def run(cmd, env=None):
    merged = dict(os.environ, **(env or {}))
    done = subprocess.run(cmd, env=merged, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(
            f"side_by_side: {' '.join(cmd)} exited with {done.returncode}\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done.stdout


def torch_result(args, cmd, nproc=1, threads=None):
    launcher = [args.python]
    if nproc > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    env = {"OMP_NUM_THREADS": str(threads)} if threads else {}
    out = run(launcher + [WORKLOADS] + cmd, env)
    line = next(l for l in out.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def google_benchmark_seconds(binary, name, env=None):
    out = run(
        [binary, f"--benchmark_filter=^{name}$", "--benchmark_format=json",
         "--benchmark_min_time=0.5"],
        env,
    )
    bench = json.loads(out)["benchmarks"][0]
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[bench["time_unit"]]
    return bench["real_time"] * scale


class Row:
    def __init__(self, name, loom, torch, goal=None):
        self.name, self.loom, self.torch, self.goal = name, loom, torch, goal
        self.pairs = []


def train_rows(args):
    rows = []
    cores = os.cpu_count()
    for model, dp, tp, precision in TRAIN_ROWS:
        ranks = dp * tp
        threads = max(1, cores // ranks)
        steps = args.steps

        def loom(model=model, dp=dp, tp=tp, precision=precision):
            with tempfile.TemporaryDirectory() as out:
                metrics = os.path.join(out, "metrics.jsonl")
                run([os.path.join(args.bin, "examples/loom_train"),
                     "--launcher", os.path.join(args.bin, "tools/loomrun/loomrun"),
                     # The byte vocabulary on both sides (workloads.py's PRESETS).
                     "--model", model, "--vocab-size", "256",
                     "--dp", str(dp), "--tp", str(tp), "--steps", str(steps),
                     "--sample-tokens", "0", "--no-progress", "--log-every", "1000",
                     "--metrics-out", metrics, "--plot-out", os.path.join(out, "loss.png")]
                    + (["--mixed-precision", "bf16"] if precision == "bf16" else []))
                with open(metrics) as f:
                    lines = [json.loads(l) for l in f if l.strip()]
                    times = [l["ms_per_step"] / 1e3 for l in lines if "ms_per_step" in l]
                return statistics.median(times[1:])

        def torch(model=model, dp=dp, tp=tp, threads=threads, precision=precision):
            return torch_result(
                args,
                ["train", "--model", model, "--dp", str(dp), "--tp", str(tp),
                 "--steps", str(steps), "--threads", str(threads), "--precision", precision],
                nproc=dp * tp, threads=threads,
            )["seconds"]

        name = f"{model} dp{dp}xtp{tp}" + (" bf16" if precision == "bf16" else "")
        rows.append(Row(f"`{name}` training step ({ranks} rank{'s' if ranks > 1 else ''}, "
                        f"{threads} thread{'s' if threads > 1 else ''} each)",
                        loom, torch, GOALS.get(name)))
    return rows


def gemm_rows(args):
    rows = []
    for k, n in GEMM_SHAPES:
        def loom(k=k, n=n):
            return google_benchmark_seconds(
                os.path.join(args.bin, "tools/bench/linear_bench"),
                f"BM_LinearFusedBias/{k}/{n}", {"OMP_NUM_THREADS": "1"})

        def torch(k=k, n=n):
            return torch_result(args, ["gemm", "--k", str(k), "--n", str(n)])["seconds"]

        rows.append(Row(f"f32 Linear, 1 thread, 1024x{k} @ {k}x{n}", loom, torch))
    return rows


def dispatch_rows(args):
    def loom():
        return google_benchmark_seconds(
            os.path.join(args.bin, "tools/bench/dtensor_dispatch_bench"), "BM_DTensorAddCached")

    def torch():
        return torch_result(args, ["dispatch"])["seconds"]

    return [Row("DTensor add, cached, 1-rank mesh", loom, torch, GOALS["dispatch"])]


def allreduce_rows(args):
    # One run of each side measures every size; the rows share it.
    cache = {}

    def measure(side):
        if side not in cache:
            if side in ("tcp", "shm"):
                out = run([os.path.join(args.bin, "tools/bench/comm_bench"), "--worlds", "2",
                           "--transports", side,
                           "--collectives", "all_reduce", "--min-bytes", str(ALLREDUCE_SIZES[0]),
                           "--max-bytes", str(ALLREDUCE_SIZES[-1]), "--step", "4",
                           "--target-s", str(args.allreduce_s)])
                times = {}
                for line in out.splitlines():
                    fields = line.split()
                    # all_reduce <size> <unit> <iters> <time(us)> <algbw> <busbw> <memcpy>
                    if len(fields) == 8 and fields[0] == "all_reduce":
                        times[parse_size(fields[1] + fields[2])] = float(fields[4]) * 1e-6
                cache[side] = times
            else:
                result = torch_result(args, ["allreduce", "--target-s", str(args.allreduce_s),
                                             "--sizes"] + [str(s) for s in ALLREDUCE_SIZES],
                                      nproc=2, threads=1)
                cache[side] = {r["bytes"]: r["seconds"] for r in result["rows"]}
        return cache[side]

    rows = []
    for transport, label in (("tcp", "TCP"), ("shm", "shared memory")):
        for i, size in enumerate(ALLREDUCE_SIZES):
            first = i == 0

            def loom(size=size, first=first, transport=transport):
                if first:
                    cache.pop(transport, None)
                return measure(transport)[size]

            def torch(size=size, first=first):
                if first:
                    cache.pop("torch", None)
                return measure("torch")[size]

            rows.append(Row(f"all_reduce, 2 ranks, {human(size)}, Loom over {label}", loom, torch,
                            GOALS["all_reduce"]))
    return rows


def parse_size(text):
    units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for unit, scale in sorted(units.items(), key=lambda u: -len(u[0])):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * scale)
    return int(text)


def human(size):
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size // scale} {unit}"
    return f"{size} B"


def seconds_text(s):
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", required=True, help="Loom's bazel-bin")
    parser.add_argument("--python", required=True, help="the virtual environment's python")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved pairs per row")
    parser.add_argument("--steps", type=int, default=4, help="training steps per run (first dropped)")
    parser.add_argument("--allreduce-s", type=float, default=0.3, help="seconds per size")
    parser.add_argument("--only", nargs="*", default=["dispatch", "gemm", "train", "allreduce"],
                        choices=["dispatch", "gemm", "train", "allreduce"])
    args = parser.parse_args()

    builders = {"dispatch": dispatch_rows, "gemm": gemm_rows, "train": train_rows,
                "allreduce": allreduce_rows}
    rows = [row for group in args.only for row in builders[group](args)]
    for repeat in range(args.repeats):
        for row in rows:
            order = [("loom", row.loom), ("torch", row.torch)]
            if repeat % 2:
                order.reverse()
            times = dict((side, fn()) for side, fn in order)
            row.pairs.append((times["loom"], times["torch"]))
            print(f"[{repeat + 1}/{args.repeats}] {row.name}: Loom {seconds_text(times['loom'])}, "
                  f"PyTorch {seconds_text(times['torch'])}", file=sys.stderr, flush=True)

    import torch  # the venv's, for its version in the heading

    print(f"\nLoom / PyTorch {torch.__version__} on {os.cpu_count()} cores, median of "
          f"{args.repeats} interleaved pairs (lower is better)\n")
    print("| work | Loom | PyTorch | Loom / PyTorch | goal |")
    print("|---|---:|---:|---:|---|")
    for row in rows:
        ratio = statistics.median(l / t for l, t in row.pairs)
        loom = statistics.median(l for l, _ in row.pairs)
        torch_s = statistics.median(t for _, t in row.pairs)
        goal = "" if row.goal is None else (
            f"≤ {row.goal} ({'met' if ratio <= row.goal else 'not met'})")
        print(f"| {row.name} | {seconds_text(loom)} | {seconds_text(torch_s)} | "
              f"{ratio:.2f} | {goal} |")


if __name__ == "__main__":
    main()
