"""PyTorch's side of tools/bench/side_by_side.sh: the same work Loom's benchmarks time.

Each subcommand prints one line `RESULT {json}` (rank 0 only) with the seconds the work took, and
nothing in it is compared with Loom's numbers: only the times are. The models are written the way
a PyTorch user writes them (nanoGPT's GPT-2, torchtitan's tensor-parallel plan), at the shapes
Loom's presets use, so that both sides do the same arithmetic:

  train      GPT-2 (tiny or small preset, byte vocabulary, tied embedding), AdamW, clip 1.0;
             on 1 rank, or under torchrun as dp x tp (tp: Colwise/Rowwise + SequenceParallel,
             dp: one all-reduce of the flattened gradients over the dp group)
  gemm       F.linear(x, w, b), one thread, (1024, K) @ (N, K)^T
  dispatch   a cached DTensor add on a 1-rank mesh (4 elements, Shard(0))
  allreduce  torch.distributed.all_reduce over Gloo, under torchrun (2 processes)
  cuda-train GPT-2 small (GPT-2's 50257 vocabulary, 1024 positions) on one GPU, bf16 autocast,
             SDPA, fused AdamW, eager or torch.compile: tools/gpu_check.sh's PyTorch row

This file needs torch; the driver installs it into a private virtual environment. It is not part
of Loom's tests.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {  # Loom's models/gpt/config.cc, with the byte vocabulary of loom_train's default data.
    "tiny": dict(n_layer=2, n_head=4, n_embd=64, block_size=64, vocab_size=256),
    "small": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=256),
}


def report(**fields):
    if not dist.is_initialized() or dist.get_rank() == 0:
        print("RESULT " + json.dumps(fields), flush=True)


class Attention(nn.Module):
    # q, k and v as three Linears (one fused c_attn does the same FLOPs) so the TP plan can shard
    # each by heads the way torchtitan does.
    def __init__(self, c, n_head):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(c, c), nn.Linear(c, c), nn.Linear(c, c)
        self.c_proj = nn.Linear(c, c)
        self.head_dim = c // n_head

    def forward(self, x):
        b, t, _ = x.shape
        split = lambda y: y.view(b, t, -1, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            split(self.q(x)), split(self.k(x)), split(self.v(x)), is_causal=True
        )
        return self.c_proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc, self.c_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, c, n_head):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(c), Attention(c, n_head)
        self.ln_2, self.mlp = nn.LayerNorm(c), MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, block_size, vocab_size):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.tp_mesh = None  # set by tensor_parallel()

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        if self.tp_mesh is not None:  # the residual stream runs on sequence shards
            from torch.distributed.tensor import DTensor, Replicate, Shard

            x = DTensor.from_local(x, self.tp_mesh, [Replicate()])
            x = x.redistribute(self.tp_mesh, [Shard(1)]).to_local()
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        if self.tp_mesh is not None:
            from torch.distributed.tensor import Replicate

            x = x.redistribute(self.tp_mesh, [Replicate()]).to_local()
        logits = F.linear(x, self.wte.weight)  # tied, as GPT-2's lm_head
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def tensor_parallel(model, tp_mesh):
    """torchtitan's plan for a GPT block, with sequence parallel norms."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    for block in model.blocks:
        parallelize_module(
            block,
            tp_mesh,
            {
                "ln_1": SequenceParallel(),
                "attn": gather,
                "attn.q": ColwiseParallel(),
                "attn.k": ColwiseParallel(),
                "attn.v": ColwiseParallel(),
                "attn.c_proj": RowwiseParallel(output_layouts=Shard(1)),
                "ln_2": SequenceParallel(),
                "mlp": gather,
                "mlp.c_fc": ColwiseParallel(),
                "mlp.c_proj": RowwiseParallel(output_layouts=Shard(1)),
            },
        )
    parallelize_module(model, tp_mesh, {"ln_f": SequenceParallel(use_local_output=False)})
    model.tp_mesh = tp_mesh


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def train(args):
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dp, tp = args.dp, args.tp
    if dp * tp != world:
        sys.exit(f"workloads.py train: dp {dp} x tp {tp} != WORLD_SIZE {world}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(1337)
    model = GPT(**PRESETS[args.model])
    dp_group = None
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh

        dist.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        if tp > 1:
            tensor_parallel(model, mesh["tp"])
        dp_group = mesh["dp"].get_group() if dp > 1 else None
    params = list(model.parameters())
    has_dtensor = any(hasattr(p, "to_local") for p in params)
    # The fused CPU AdamW where it applies (plain tensors), as Loom's fused update.
    optimizer = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.1, fused=not has_dtensor)
    micro = args.batch_size // dp
    generator = torch.Generator().manual_seed(dist.get_rank() // tp if world > 1 else 0)
    times = []
    for step in range(args.steps):
        idx = torch.randint(0, 256, (micro, args.seq_len + 1), generator=generator)
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        if dp_group is not None:  # DDP's all-reduce, as one bucket
            grads = [local(p.grad) for p in params]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=dp_group)
            flat /= dp
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()
        # The global norm's arithmetic (one pass over the gradients), then the clip.
        norm = math.sqrt(sum(float(local(p.grad).pow(2).sum()) for p in params))
        scale = min(1.0, 1.0 / (norm + 1e-6))
        for p in params:
            local(p.grad).mul_(scale)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        float(loss.detach())
        times.append(time.perf_counter() - start)
    if world > 1:
        slowest = torch.tensor(times)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        times = slowest.tolist()
    report(seconds=statistics.median(times[1:]), steps=times)
    if world > 1:
        dist.destroy_process_group()


def gemm(args):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.rand(args.m, args.k) * 2 - 1
    w = (torch.rand(args.n, args.k) * 2 - 1) * 0.05
    b = (torch.rand(args.n) * 2 - 1) * 0.05
    report(seconds=best_of(lambda: F.linear(x, w, b), args.target_s))


def dispatch(args):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    a = distribute_tensor(torch.ones(4), mesh, [Shard(0)])
    b = distribute_tensor(torch.ones(4), mesh, [Shard(0)])
    report(seconds=best_of(lambda: a + b, args.target_s, batch=1000))
    dist.destroy_process_group()


def allreduce(args):
    dist.init_process_group("gloo")
    rows = []
    for size in args.sizes:
        buffer = torch.ones(size // 4)
        for _ in range(3):
            dist.all_reduce(buffer)
        # The same iteration count on every rank: rank 0's choice, broadcast.
        start = time.perf_counter()
        dist.all_reduce(buffer)
        iters = torch.tensor([max(3, int(args.target_s / (time.perf_counter() - start)))])
        dist.broadcast(iters, 0)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(int(iters)):
            dist.all_reduce(buffer)
        seconds = torch.tensor([(time.perf_counter() - start) / int(iters)])
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        rows.append({"bytes": size, "seconds": float(seconds)})
    report(rows=rows)
    dist.destroy_process_group()


def best_of(fn, target_s, batch=1):
    """Seconds per call: the best of 5 repeats, each about target_s / 5 long."""
    fn()
    start = time.perf_counter()
    fn()
    per_call = max(time.perf_counter() - start, 1e-7)
    calls = max(1, int(target_s / 5 / per_call / batch)) * batch
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def cuda_train(args):
    """GPT-2 small steps on one GPU as a PyTorch user trains it (nanoGPT's recipe): bf16 autocast
    over f32 weights, SDPA, fused AdamW, clip 1.0; the median step over steps 2.. ."""
    torch.manual_seed(0)
    device = torch.device("cuda")
    vocab, block = 50257, 1024
    model = GPT(n_layer=12, n_head=12, n_embd=768, block_size=block, vocab_size=vocab).to(device)
    step_model = torch.compile(model) if args.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    x = torch.randint(0, vocab, (args.batch_size, block), device=device)
    y = torch.randint(0, vocab, (args.batch_size, block), device=device)
    times = []
    for _ in range(args.steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times[2:])
    report(workload="cuda-train", compile=args.compile, batch_size=args.batch_size, seq_len=block,
           params=sum(p.numel() for p in model.parameters()), seconds_per_step=seconds,
           tokens_per_s=args.batch_size * block / seconds,
           peak_mem_bytes=torch.cuda.max_memory_allocated())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train")
    p.add_argument("--model", choices=PRESETS, default="tiny")
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--precision", choices=["f32", "bf16"], default="f32",
                   help="bf16: CPU autocast (bf16 matmuls over f32 weights)")
    p = sub.add_parser("gemm")
    for name, default in (("m", 1024), ("k", 768), ("n", 768)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--target-s", type=float, default=1.0)
    p = sub.add_parser("dispatch")
    p.add_argument("--target-s", type=float, default=1.0)
    p = sub.add_parser("allreduce")
    p.add_argument("--sizes", type=int, nargs="+", required=True)
    p.add_argument("--target-s", type=float, default=0.5)
    p = sub.add_parser("cuda-train")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = parser.parse_args()
    {"train": train, "gemm": gemm, "dispatch": dispatch, "allreduce": allreduce,
     "cuda-train": cuda_train}[args.command](args)


if __name__ == "__main__":
    main()
