#!/usr/bin/env python3
"""Data-parallel GPT-2 on two GPUs: the same losses under our allocator as under PyTorch's.

    python3 python/bench/train_ddp.py [--allocators default,ours] [--json-out FILE]

For each allocator, this controller starts `--world` worker processes (one
per GPU, rank = local rank = GPU index) with a timeout and the environment
of `torchrun` (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), plus
NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
(no NVLink multicast). Each worker: picks its allocator before any CUDA
allocation (ours: `gpumalloc_torch.enable()`, one pool per process), joins a
NCCL process group, wraps the train_gpt2.py model (GPT-2 124M, bf16,
checkpointing, AdamW) in DistributedDataParallel and trains --steps steps on
its own random tokens (seed + rank; lengths the same on every rank, from
`seed`). The loss of each step is averaged over ranks (all_reduce).

Verdict: PASS when every allocator's averaged losses equal the first
allocator's within --tol (1e-3) at every step; printed and in the JSON.
The controller itself never imports torch.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}


def log(msg):
    print(f"[train_ddp {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(args):
    os.environ.update(NO_MULTICAST)
    import train_gpt2

    train_gpt2.set_allocator_env(args.allocator)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = int(os.environ["RANK"])
    local = int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    out = {"allocator": args.allocator, "rank": rank, "world": world, "status": "started"}
    device = torch.device("cpu") if args.cpu else torch.device("cuda", local)
    gm = None
    if args.allocator == "ours" and not args.cpu:
        # Before any CUDA call: set_device initialises PyTorch's allocator.
        sys.path.insert(0, str(REPO / "python"))
        import gpumalloc_torch

        gm = gpumalloc_torch
        gm.enable()
    if not args.cpu:
        torch.cuda.set_device(device)
    try:
        if args.cpu:
            dist.init_process_group("gloo")
        else:
            try:
                dist.init_process_group("nccl", device_id=device)
            except TypeError:  # older PyTorch without device_id
                dist.init_process_group("nccl")
        margs = train_gpt2.parse_args(["--allocator", args.allocator, "--batch", str(args.batch),
                                       "--seed", str(args.seed)] + (["--model", "tiny"] if args.tiny else []))
        model, cfg = train_gpt2.build_model(torch, margs)
        model.to(device)
        ddp = DDP(model) if args.cpu else DDP(model, device_ids=[local])
        opt = torch.optim.AdamW([p for p in ddp.parameters() if p.requires_grad], lr=margs.lr)
        lengths = train_gpt2.step_lengths(args.seed, args.steps, margs.seq, margs.seq_jitter)
        gen = torch.Generator().manual_seed(args.seed + 1000 * rank)
        losses, local_losses = [], []
        for step in range(args.steps):
            x = torch.randint(0, cfg.vocab_size, (args.batch, lengths[step]), generator=gen).to(device)
            loss = ddp(input_ids=x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            lv = loss.detach().float()
            local_losses.append(float(lv.item()))
            dist.all_reduce(lv, op=dist.ReduceOp.SUM)
            losses.append(float(lv.item()) / world)
            if rank == 0:
                log(f"{args.allocator} step {step} len {lengths[step]} mean loss {losses[-1]:.5f}")
        if not args.cpu:
            torch.cuda.synchronize(device)
        out.update(status="ok", losses=losses, local_losses=local_losses, seq_lens=lengths)
        if gm is not None:
            out["ours_stats"] = dict(gm.stats(local))
        elif not args.cpu:
            out["peak_active"] = torch.cuda.max_memory_allocated(device)
            out["peak_reserved"] = torch.cuda.max_memory_reserved(device)
        dist.barrier()
        dist.destroy_process_group()
    except Exception as e:
        out.update(status="error", error=repr(e)[:500], traceback=traceback.format_exc()[-2000:])
        log(f"rank {rank} error: {e!r}")
    with open(args.json_out, "w") as f:
        json.dump(out, f)
    print("RANK_RESULT " + json.dumps(out), flush=True)
    return 0 if out["status"] == "ok" else 1


def run_allocator(alloc, args, scratch):
    port = free_port()
    procs, files = [], []
    for rank in range(args.world):
        env = dict(os.environ)
        env.update(NO_MULTICAST)
        env.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(args.world),
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PYTHONUNBUFFERED": "1",
                    "TRANSFORMERS_VERBOSITY": "error"})
        f = scratch / f"ddp-{alloc}-rank{rank}.json"
        if f.exists():
            f.unlink()
        files.append(f)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--allocator", alloc,
               "--batch", str(args.batch), "--steps", str(args.steps), "--seed", str(args.seed),
               "--json-out", str(f)] + (["--tiny"] if args.tiny else []) + (["--cpu"] if args.cpu else [])
        log(f"start {alloc} rank {rank}: {' '.join(cmd)}")
        procs.append(subprocess.Popen(cmd, env=env))
    deadline = time.time() + args.timeout
    rcs = []
    for p in procs:
        try:
            rcs.append(p.wait(timeout=max(1, deadline - time.time())))
        except subprocess.TimeoutExpired:
            rcs.append("timeout")
    for p, rc in zip(procs, rcs):
        if rc == "timeout":
            p.kill()  # our own child, by its handle
            p.wait()
    ranks = []
    for f in files:
        ranks.append(json.loads(f.read_text()) if f.exists() else {"status": "crash"})
    log(f"{alloc}: return codes {rcs}")
    return {"allocator": alloc, "rcs": [str(r) for r in rcs], "ranks": ranks}


def verdict(runs, tol):
    """(PASS/FAIL, why) comparing each run's rank-0 mean losses with the first run's."""
    ref = runs[0]
    if any(r.get("status") != "ok" for r in ref["ranks"]):
        return "FAIL", f"{ref['allocator']} did not finish: {[r.get('status') for r in ref['ranks']]}"
    a = ref["ranks"][0]["losses"]
    worst = 0.0
    for run in runs[1:]:
        if any(r.get("status") != "ok" for r in run["ranks"]):
            return "FAIL", f"{run['allocator']} did not finish: {[r.get('error', r.get('status')) for r in run['ranks']]}"
        b = run["ranks"][0]["losses"]
        if len(a) != len(b):
            return "FAIL", f"{len(a)} vs {len(b)} steps"
        worst = max([worst] + [abs(x - y) for x, y in zip(a, b)])
    ok = worst <= tol
    names = " vs ".join(r["allocator"] for r in runs)
    return ("PASS" if ok else "FAIL"), f"{names}: max |mean loss diff| = {worst:.2e} (tolerance {tol:g})"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--allocators", default="default,ours")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--batch", type=int, default=16, help="per GPU")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--tol", type=float, default=1e-3)
    p.add_argument("--timeout", type=float, default=240, help="seconds per allocator")
    p.add_argument("--tiny", action="store_true", help="tiny model (quick checks)")
    p.add_argument("--cpu", action="store_true", help="gloo on the CPU, tiny model (logic check)")
    p.add_argument("--json-out", default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--allocator", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.cpu:
        args.tiny = True
    if args.worker:
        return worker(args)
    import tempfile

    scratch = Path(tempfile.mkdtemp(prefix="gm_ddp_"))
    runs = [run_allocator(a, args, scratch) for a in args.allocators.split(",") if a]
    v, why = verdict(runs, args.tol)
    out = {"verdict": v, "why": why, "runs": runs, "world": args.world, "batch_per_gpu": args.batch,
           "steps": args.steps, "seed": args.seed, "status": "ok" if v == "PASS" else "fail"}
    log(f"two-GPU loss check: {v}: {why}")
    line = json.dumps(out, sort_keys=True)
    print("DDP_RESULT " + line, flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(line + "\n")
    return 0 if v == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
