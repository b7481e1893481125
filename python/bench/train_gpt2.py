#!/usr/bin/env python3
"""One training run of GPT-2 124M under one allocator; prints one JSON line.

The workload of issue 11, the same for every allocator:
  * GPT-2 124M from `GPT2LMHeadModel(GPT2Config())` with random weights
    (`torch.manual_seed(seed)` before construction, nothing downloaded);
  * bf16: the MODEL IS CAST TO bf16 (`model.to(torch.bfloat16)`), no autocast,
    so parameters, gradients and AdamW states are bf16. (The peak-active
    figures of the issue, 11.04/21.31/41.86 GiB at batch 16/32/64, extrapolate
    to ~0.8 GiB at batch 0, which fits bf16 weights + AdamW states, not fp32
    master weights.) The loss is computed in fp32 by transformers.
  * gradient checkpointing on (non-reentrant: `use_reentrant=False`), AdamW
    (PyTorch defaults, lr 1e-4), dropout as in GPT2Config() (0.1);
  * batch B; step i uses length 1024 - r_i, r_i uniform in 0..255 drawn from
    `random.Random(seed)`, and random token ids from a seeded CPU generator,
    so every allocator sees the same lengths and tokens; loss = LM loss
    (labels = input ids);
  * 6 steps, numbered 0..5. Peaks are reset after step 1, so peaks and
    tokens/s cover steps 2..5 (CUDA-synchronised wall clock).

Allocators (chosen before torch is imported, one per process):
  default     PyTorch's caching allocator (PYTORCH_CUDA_ALLOC_CONF unset)
  expandable  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  ours        gpumalloc_torch.enable() (target/release/libgpumalloc_torch.so)

Efficiency = peak active / peak reserved: max_memory_allocated /
max_memory_reserved for PyTorch's allocators, stats()['peak_active'] /
stats()['peak_reserved'] for ours. An out-of-memory error is a result
(`"oom": true`), not a crash. Ours with GPUMALLOC_SPILL_TO_HOST=1 (the
planned mode's profile) may hold chunks in host memory when the GPU is full:
reserved stays GPU memory, the result adds "peak_spilled" (measured steps)
and "spilled_peak" / "spills" (whole run: most bytes in host memory, chunks
made there), and the efficiency of such a run counts the spilled bytes too
(peak active / (peak reserved + peak spilled)), so a spill never reads as a
better layout.

Options for the other outputs: --trace-out (default allocator only: the
allocation trace in the lake's binary format, gzip'd, plus the raw entries),
--timeline-out (memory samples after every transformer block's forward and
recomputation and after each step's phases, as JSON).

Planned mode (ours only, issue 14): --plan-profile K --plan-out FILE records
the pool's trace from just after set-up begins (before the model is built)
through step K, with a step mark at the start of every step after the first,
then synthesizes the plan in this process through the C ABI
(gm_plan_synthesize: step 0 with the set-up is the prologue, steps 1..K the
profiled iterations) and writes FILE; the run goes on unplanned. --plan FILE
loads such a plan at the same point and marks steps the same way, so a run
with the same seed, batch and model asks for what was profiled; its result
has "plan_stats" (hits, dynamic placements, fallbacks). Both need --steps of
at least K + 1 (profile) and use the pool's own counters for peaks.

CPU smoke test of the logic (no peaks): --device cpu --model tiny.
"""

import argparse
import json
import os
import random
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import tracefmt  # noqa: E402  (pure Python, no torch)

GIB = 1024 ** 3


def log(msg):
    print(f"[train_gpt2 {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--allocator", choices=["default", "expandable", "ours"], required=True)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--measure-from", type=int, default=2,
                   help="first step (0-based) of the measured window; peaks reset before it")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--seq-jitter", type=int, default=256,
                   help="each step is shortened by a random 0..jitter-1 tokens")
    p.add_argument("--length-cycle", type=int, default=0,
                   help="if N > 0, step i uses the length of step i %% N: after the first N "
                        "steps every length has been seen, as in a long run where the data "
                        "loader's lengths repeat (PyTorch and cuBLAS cache per shape)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--lora", action="store_true", help="LoRA r=16 on attn.c_attn/attn.c_proj")
    p.add_argument("--model", choices=["gpt2", "tiny"], default="gpt2",
                   help="tiny: 2 layers, 64 wide, for CPU smoke tests")
    p.add_argument("--precision", choices=["bf16", "autocast"], default="bf16",
                   help="bf16: model cast to bf16 (the default, see above); autocast: fp32 model "
                        "under torch.autocast(bfloat16)")
    p.add_argument("--device", default="cuda", help="cuda or cpu (smoke test)")
    p.add_argument("--mem-fraction", type=float, default=None,
                   help="torch.cuda.set_per_process_memory_fraction (PyTorch allocators only)")
    p.add_argument("--trace-out", default=None,
                   help="write the binary trace (gz) here; raw entries to --raw-trace-out")
    p.add_argument("--raw-trace-out", default=None)
    p.add_argument("--trace-max-entries", type=int, default=2_000_000)
    p.add_argument("--timeline-out", default=None, help="JSON of memory samples over time")
    p.add_argument("--json-out", default=None, help="also write the result JSON here")
    p.add_argument("--no-probes", action="store_true",
                   help="no memory samples inside the step (forward hooks): for throughput runs; "
                        "peaks still come from the allocator's own counters")
    p.add_argument("--tag", default="", help="free text copied into the result")
    p.add_argument("--plan-profile", type=int, default=0, metavar="K",
                   help="ours: record steps 0..K, synthesize a plan from steps 1..K into "
                        "--plan-out (step 0 and the set-up are its prologue)")
    p.add_argument("--plan-out", default=None, metavar="FILE",
                   help="where --plan-profile writes the plan (the trace goes to FILE.trace)")
    p.add_argument("--plan", default=None, metavar="FILE",
                   help="ours: serve allocations from this plan file (planned mode)")
    args = p.parse_args(argv)
    err = plan_args_error(args)
    if err:
        p.error(err)
    return args


def plan_args_error(args):
    """Why the planned-mode options do not fit together, or None."""
    if args.plan_profile < 0:
        return "--plan-profile K needs K >= 1"
    if (args.plan_profile or args.plan) and args.allocator != "ours":
        return "--plan-profile and --plan need --allocator ours"
    if args.plan_profile and not args.plan_out:
        return "--plan-profile needs --plan-out FILE"
    if args.plan_out and not args.plan_profile:
        return "--plan-out needs --plan-profile K"
    if args.plan_profile and args.plan:
        return "--plan-profile and --plan are separate runs (profile first, then train with the plan)"
    if args.plan_profile and args.steps < args.plan_profile + 1:
        return (f"--plan-profile {args.plan_profile} records steps 0..{args.plan_profile}: "
                f"--steps must be at least {args.plan_profile + 1}")
    return None


class PlanHooks:
    """What the planned-mode options do around the training loop (no torch here):
    `start()` after the allocator is set up and before the model is built, `step(i)` at
    the start of step i, `after_step(i)` at its end, `finish(result)` at the end."""

    def __init__(self, args, gm, cuda):
        self.args, self.gm = args, gm
        self.active = gm is not None and cuda
        self.info = {}

    def start(self):
        if not self.active:
            return
        a = self.args
        if a.plan:
            t0 = time.perf_counter()
            self.gm.use_plan(a.plan, 0)
            self.info["plan"] = {"file": a.plan, "load_s": round(time.perf_counter() - t0, 3)}
            log(f"planned mode: serving from {a.plan}")
        elif a.plan_profile:
            self.gm.start_trace(0)
            log(f"plan profile: recording steps 0..{a.plan_profile}")

    def step(self, i):
        # Step 0 and the set-up are one phase (the plan's prologue), as the profile saw them.
        if self.active and i > 0:
            self.gm.step(0)

    def after_step(self, i):
        a = self.args
        if not (self.active and a.plan_profile and i == a.plan_profile):
            return
        trace = a.plan_out + ".trace"
        self.gm.save_trace(trace, 0)
        t0 = time.perf_counter()
        synth_s = self.gm.synthesize_plan(trace, a.plan_out, a.plan_profile, 1)
        wall = time.perf_counter() - t0
        info = {"file": a.plan_out, "trace": trace, "profiled_steps": a.plan_profile,
                "synthesis_s": round(synth_s, 3), "synthesis_wall_s": round(wall, 3),
                "trace_bytes": os.path.getsize(trace), "plan_bytes": os.path.getsize(a.plan_out)}
        info.update(plan_summary(a.plan_out))
        self.info["plan_profile"] = info
        log(f"plan profile: synthesized {a.plan_out} in {synth_s:.2f} s "
            f"(with reading and writing {wall:.2f} s): {json.dumps(info, sort_keys=True)}")

    def finish(self, result):
        result.update(self.info)
        if self.active and self.args.plan:
            result["plan_stats"] = dict(self.gm.plan_stats(0))
            log("planned mode: " + json.dumps(result["plan_stats"], sort_keys=True))


def plan_summary(path):
    """The scalar lines of a plan file's head (`arena`, `peak`, ... as written by
    lake/src/plan/file.rs) as numbers where they are numbers."""
    out = {}
    try:
        with open(path) as f:
            for n, line in enumerate(f):
                if n > 200 or line.startswith("r "):
                    break
                if n == 0 or line.startswith("#"):
                    continue  # the magic line and the summary
                parts = line.split()
                if len(parts) == 2:
                    key, val = parts
                    try:
                        out["plan_" + key] = int(val)
                    except ValueError:
                        out["plan_" + key] = val
    except OSError as e:
        out["plan_read_error"] = repr(e)
    return out


def set_allocator_env(allocator):
    """Sets or clears the allocator's environment; must run before `import torch`."""
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        if var in os.environ:
            log(f"clearing {var}={os.environ[var]!r} (the allocator flag decides)")
            del os.environ[var]
    if allocator == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"


def step_lengths(seed, steps, seq, jitter, cycle=0):
    """The sequence length of every step (same for every allocator); with
    `cycle` > 0 the first `cycle` lengths repeat."""
    rng = random.Random(seed)
    drawn = [seq - (rng.randrange(jitter) if jitter > 0 else 0) for _ in range(steps)]
    return [drawn[i % cycle] for i in range(steps)] if cycle > 0 else drawn


class Memory:
    """Reads active/reserved bytes and peaks for the chosen allocator."""

    def __init__(self, torch, allocator, device, gm=None):
        self.torch, self.allocator, self.device, self.gm = torch, allocator, device, gm
        self.cuda = device.type == "cuda"

    def sample(self):
        """Current bytes: dict with at least active and reserved (ours: every key)."""
        if not self.cuda:
            return {"active": 0, "reserved": 0}
        if self.gm is not None:
            return dict(self.gm.stats(0))
        return {"active": self.torch.cuda.memory_allocated(self.device),
                "reserved": self.torch.cuda.memory_reserved(self.device)}

    def reset_peaks(self):
        if not self.cuda:
            return
        if self.gm is not None:
            self.gm.reset_peaks(0)
        else:
            self.torch.cuda.reset_peak_memory_stats(self.device)

    def peaks(self):
        if not self.cuda:
            return 0, 0
        if self.gm is not None:
            s = self.gm.stats(0)
            return int(s["peak_active"]), int(s["peak_reserved"])
        return (int(self.torch.cuda.max_memory_allocated(self.device)),
                int(self.torch.cuda.max_memory_reserved(self.device)))


def start_history(torch, max_entries):
    """Starts PyTorch's allocation history without stack frames (old and new signatures)."""
    rec = torch.cuda.memory._record_memory_history
    try:
        rec(enabled="all", context=None, stacks="python", max_entries=max_entries)
        return "enabled='all', context=None, stacks='python'"
    except TypeError:
        rec(True, record_context=False, trace_alloc_max_entries=max_entries,
            trace_alloc_record_context=False)
        return "legacy enabled=True, record_context=False"


def stop_history(torch):
    try:
        torch.cuda.memory._record_memory_history(enabled=None)
    except TypeError:
        torch.cuda.memory._record_memory_history(False)


def build_model(torch, args):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(args.seed)
    if args.model == "tiny":
        cfg = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=1000, n_positions=args.seq)
    else:
        cfg = GPT2Config()
    cfg.use_cache = False
    model = GPT2LMHeadModel(cfg)
    if args.precision == "bf16":
        model.to(torch.bfloat16)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.lora:
        from peft import LoraConfig, get_peft_model

        lcfg = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                          target_modules=r".*\.attn\.(c_attn|c_proj)",
                          fan_in_fan_out=True, task_type="CAUSAL_LM")
        model = get_peft_model(model, lcfg)
    model.train()
    return model, cfg


def run(args):
    set_allocator_env(args.allocator)
    import torch

    result = {
        "allocator": args.allocator, "model": args.model + ("+lora" if args.lora else ""),
        "batch": args.batch, "steps": args.steps, "measure_from": args.measure_from,
        "seed": args.seed, "device": args.device, "tag": args.tag,
        "torch": torch.__version__,
        "dtype": "bf16 model (no autocast)" if args.precision == "bf16" else "fp32 model, bf16 autocast",
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "oom": False, "status": "started",
    }
    try:
        import transformers
        result["transformers"] = transformers.__version__
    except Exception:  # reported by build_model
        pass
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and device.index is None:
        device = torch.device("cuda", 0)  # set_device and the memory calls want an index
    gm = None
    if args.allocator == "ours":
        sys.path.insert(0, str(REPO / "python"))
        import gpumalloc_torch

        gm = gpumalloc_torch
        if cuda:
            gm.enable()
            log(f"gpumalloc_torch enabled from {gm.default_path()}")
    if cuda:
        torch.cuda.set_device(device)
        result["gpu"] = torch.cuda.get_device_name(device)
        if args.mem_fraction and gm is None:
            torch.cuda.set_per_process_memory_fraction(args.mem_fraction, device)
            result["mem_fraction"] = args.mem_fraction
    mem = Memory(torch, args.allocator, device, gm)
    hooks = PlanHooks(args, gm, cuda)
    try:
        hooks.start()
    except RuntimeError as e:
        # A plan whose arena the device cannot hold is this batch not fitting in planned
        # mode (at the memory boundary), not a crash of the benchmark.
        msg = str(e)
        result["oom"] = "cannot hold the plan's arena" in msg
        result["status"] = "oom" if result["oom"] else "error"
        if result["oom"]:
            result["oom_step"] = -1  # before step 0
        result["error"] = msg.splitlines()[0][:300]
        log(f"{result['status']} before step 0 (loading the plan): {result['error']}")
        return result
    tracing = bool(args.trace_out) and cuda
    if args.trace_out and args.allocator != "default":
        log("warning: --trace-out is meant for the default allocator")
    if tracing:
        result["history_call"] = start_history(torch, args.trace_max_entries)
        log(f"recording allocation history: {result['history_call']}")

    lengths = step_lengths(args.seed, args.steps, args.seq, args.seq_jitter, args.length_cycle)
    result["seq_lens"] = lengths
    timeline = []
    t_origin = time.perf_counter()
    at_peak = {"reserved": -1}

    probe_s = [0.0]  # time spent in probes (reported, so its share of tokens/s is visible)

    def probe(label):
        tp = time.perf_counter()
        s = mem.sample()
        s["t"] = time.perf_counter() - t_origin
        s["label"] = label
        if args.timeline_out:
            timeline.append(s)
        if s.get("reserved", 0) > at_peak.get("reserved", -1):
            at_peak.clear()
            at_peak.update(s)
        probe_s[0] += time.perf_counter() - tp

    t0 = time.perf_counter()
    model, cfg = build_model(torch, args)
    result["attn_implementation"] = getattr(cfg, "_attn_implementation", None)
    blocks = [m for n, m in model.named_modules() if type(m).__name__ == "GPT2Block"]
    result["checkpointed_blocks"] = sum(bool(getattr(b, "gradient_checkpointing", False))
                                        for b in blocks)
    result["blocks"] = len(blocks)
    for i, blk in enumerate([] if args.no_probes else blocks):
        # Hooks on the block's children, not the block: transformers may checkpoint the
        # block's forward() only, so only hooks inside it fire again in the recomputation
        # during backward.
        for part in ("attn", "mlp"):
            sub = getattr(blk, part, None)
            if sub is not None:
                sub.register_forward_hook(lambda mod, inp, out, i=i, part=part: probe(f"{part}{i}"))
    model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    result["params"] = sum(p.numel() for p in model.parameters())
    result["trainable_params"] = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=args.lr)
    log(f"model ready in {time.perf_counter() - t0:.1f}s: {result['params'] / 1e6:.1f}M params "
        f"({result['trainable_params'] / 1e6:.2f}M trainable), attn={result['attn_implementation']}, "
        f"lengths={lengths}")
    gen = torch.Generator().manual_seed(args.seed)
    losses, step_times = [], []
    step_wall = []
    # Ours: host time inside malloc/free and in VMM driver calls, per step.
    alloc_ms, driver_ms = [], []
    last_ns = [0, 0]
    # Where that host time goes, per step: deltas of these stats() keys.
    detail_keys = ("alloc_call_ns", "free_call_ns", "alloc_calls", "free_calls", "slow_calls",
                   "slow_call_ns", "thread_switches")
    call_detail = {k: [] for k in detail_keys}
    last_detail = {k: 0 for k in detail_keys}
    # Ours' most bytes spilled to host memory over the whole run: the peak
    # since the last reset, read at every step's end (before the reset at
    # --measure-from).
    spilled_peak = [0]

    def alloc_times():
        if mem.gm is None or not cuda:  # on the CPU (smoke runs) ours is never enabled
            return
        st = mem.gm.stats(0)
        spilled_peak[0] = max(spilled_peak[0], int(st.get("peak_spilled", 0)))
        call, drv = int(st.get("call_ns", 0)), int(st.get("driver_ns", 0))
        alloc_ms.append(round((call - last_ns[0]) / 1e6, 2))
        driver_ms.append(round((drv - last_ns[1]) / 1e6, 2))
        last_ns[:] = [call, drv]
        for k in detail_keys:
            v = int(st.get(k, 0))
            call_detail[k].append(v - last_detail[k])
            last_detail[k] = v

    t_measure = None
    tokens_measured = 0

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    step = -1
    try:
        for step in range(args.steps):
            if step == args.measure_from:
                sync()
                mem.reset_peaks()
                at_peak.clear()
                at_peak["reserved"] = -1
                probe_s[0] = 0.0
                t_measure = time.perf_counter()
            hooks.step(step)
            ts = time.perf_counter()
            step_wall.append(ts - t_origin)
            if tracing:
                marker = torch.empty(tracefmt.marker_size(step), dtype=torch.uint8, device=device)
                del marker
            L = lengths[step]
            x = torch.randint(0, cfg.vocab_size, (args.batch, L), generator=gen).to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16,
                                enabled=args.precision == "autocast"):
                out = model(input_ids=x, labels=x)
                loss = out.loss
            if not args.no_probes:
                probe("forward")
            loss.backward()
            if not args.no_probes:
                probe("backward")
            opt.step()
            if not args.no_probes:
                probe("optimizer")
            opt.zero_grad(set_to_none=True)
            lv = float(loss.detach().float().item())  # synchronises
            del out, loss, x
            losses.append(lv)
            if step >= args.measure_from:
                tokens_measured += args.batch * L
            step_times.append(time.perf_counter() - ts)
            alloc_times()
            extra = f" (allocator {alloc_ms[-1]} ms, driver {driver_ms[-1]} ms)" if alloc_ms else ""
            log(f"step {step} len {L} loss {lv:.4f} {step_times[-1] * 1000:.0f} ms{extra}")
            hooks.after_step(step)
        sync()
        t_end = time.perf_counter()
        result["status"] = "ok"
    except torch.cuda.OutOfMemoryError as e:
        result["oom"], result["status"] = True, "oom"
        result["error"] = str(e).splitlines()[0][:300] if str(e) else "OutOfMemoryError"
        result["oom_step"] = step
        log(f"OOM at step {step}: {result['error']}")
        t_end = None
    except Exception as e:  # a pluggable allocator's null surfaces as a RuntimeError (e.g. illegal address)
        msg = str(e)
        if "out of memory" in msg.lower() or "outofmemory" in msg.lower():
            result["oom"], result["status"] = True, "oom"
            result["oom_step"] = step
        else:
            result["status"] = "error"
            result["traceback"] = traceback.format_exc()[-2000:]
        result["error"] = msg.splitlines()[0][:300] if msg else type(e).__name__
        log(f"{result['status']} at step {step}: {result['error']}")
        t_end = None

    try:
        hooks.finish(result)
    except Exception as e:  # the plan's statistics are extras
        result["plan_error"] = repr(e)[:300]
    result["losses"] = losses
    result["step_ms"] = [round(t * 1000, 2) for t in step_times]
    if alloc_ms:
        result["step_alloc_ms"] = alloc_ms
        result["step_driver_ms"] = driver_ms
        result["step_call_detail"] = call_detail
    peak_active, peak_reserved = mem.peaks()
    result["peak_active"] = peak_active
    result["peak_reserved"] = peak_reserved
    result["peak_active_gib"] = round(peak_active / GIB, 3)
    result["peak_reserved_gib"] = round(peak_reserved / GIB, 3)
    result["efficiency"] = round(peak_active / peak_reserved, 4) if peak_reserved else None
    if gm is not None and cuda:
        end = gm.stats(0)
        peak_spilled = int(end.get("peak_spilled", 0))
        result["spilled_peak"] = max(spilled_peak[0], peak_spilled)
        result["spills"] = int(end.get("spills", 0))
        if peak_spilled:
            result["peak_spilled"] = peak_spilled
            result["efficiency"] = round(peak_active / (peak_reserved + peak_spilled), 4)
        if result["spills"]:
            log(f"spilled to host memory: {result['spills']} chunks, at most "
                f"{result['spilled_peak'] / GIB:.3f} GiB at once (not in reserved)")
    if result["status"] == "ok" and t_measure is not None and t_end is not None:
        result["tokens_per_s"] = round(tokens_measured / (t_end - t_measure), 1)
        result["measured_tokens"] = tokens_measured
        result["measured_s"] = round(t_end - t_measure, 4)
        result["probe_s"] = round(probe_s[0], 4)
    else:
        result["tokens_per_s"] = None
    result["at_peak_reserved_sample"] = {k: v for k, v in at_peak.items() if k != "t"}
    if gm is not None and cuda:
        result["ours_stats_end"] = dict(gm.stats(0))
        log("ours, stats at the end: " + json.dumps(result["ours_stats_end"], sort_keys=True))
    log(f"peak active {peak_active / GIB:.3f} GiB, peak reserved {peak_reserved / GIB:.3f} GiB, "
        f"efficiency {result['efficiency']}, tokens/s {result['tokens_per_s']}")
    log("sample at the highest reserved of the measured steps (every key): "
        + json.dumps(result["at_peak_reserved_sample"], sort_keys=True))
    if cuda and gm is None:
        try:
            ms = torch.cuda.memory_stats(device)
            result["num_alloc_retries"] = ms.get("num_alloc_retries")
            result["num_device_alloc"] = ms.get("num_device_alloc")
            result["num_ooms"] = ms.get("num_ooms")
        except Exception as e:  # stats are extras
            result["memory_stats_error"] = repr(e)
        if not tracing:
            # Proof that the allocator flag took effect: expandable segments say so.
            try:
                try:
                    snap = torch.cuda.memory.memory_snapshot(include_traces=False)
                except TypeError:
                    snap = torch.cuda.memory.memory_snapshot()
                segs = snap.get("segments", []) if isinstance(snap, dict) else snap
                result["segments"] = len(segs)
                result["expandable_segments_seen"] = any(sg.get("is_expandable") for sg in segs)
            except Exception as e:
                result["snapshot_error"] = repr(e)[:300]

    if tracing:
        try:
            write_trace(torch, args, result, step_wall)
        except Exception as e:
            result["trace_error"] = repr(e)
            result["trace_traceback"] = traceback.format_exc()[-2000:]
            log(f"trace conversion failed: {e!r}")
    if args.timeline_out:
        with open(args.timeline_out, "w") as f:
            json.dump({"allocator": args.allocator, "batch": args.batch,
                       "step_start_s": step_wall, "samples": timeline}, f)
        result["timeline_samples"] = len(timeline)
    return result


def write_trace(torch, args, result, step_wall):
    snap = torch.cuda.memory._snapshot()
    stop_history(torch)
    traces = snap.get("device_traces") or [[]]
    dev = torch.cuda.current_device()
    entries = traces[dev] if dev < len(traces) else traces[0]
    log(f"trace: {len(entries)} entries")
    first_stream = torch.cuda.current_stream().cuda_stream
    records, step_starts, info = tracefmt.convert(entries, first_stream=first_stream)
    peak, live_end = tracefmt.replay_peak(records)
    result["trace"] = {
        "entries": len(entries), "records": len(records), "step_starts": step_starts,
        "replay_peak_requested": peak, "replay_live_end": live_end,
        "hit_max_entries": len(entries) >= args.trace_max_entries, **info,
    }
    nbytes = tracefmt.write_binary_gz(args.trace_out, records)
    result["trace"]["binary_gz_bytes"] = nbytes
    log(f"trace: {len(records)} records, {nbytes / 2**20:.2f} MiB -> {args.trace_out}")
    if args.raw_trace_out:
        meta = {k: result.get(k) for k in ("allocator", "model", "batch", "seed", "seq_lens",
                                            "losses", "peak_active", "peak_reserved", "torch")}
        meta["step_start_perf_s"] = step_wall
        meta["step_starts_in_records"] = step_starts
        meta["marker_base"] = tracefmt.MARKER_BASE
        meta["first_stream"] = first_stream
        raw = tracefmt.write_raw_gz(args.raw_trace_out, entries, meta)
        result["trace"]["raw_gz_bytes"] = raw
        log(f"raw trace: {raw / 2**20:.2f} MiB -> {args.raw_trace_out}")


def main(argv=None):
    args = parse_args(argv)
    try:
        result = run(args)
    except Exception as e:  # report, never die silently
        # The model too, so a LoRA run that failed is not taken for a plain one (largest batch).
        result = {"allocator": args.allocator, "batch": args.batch, "status": "error",
                  "model": args.model + ("+lora" if args.lora else ""),
                  "oom": False, "error": repr(e)[:500], "traceback": traceback.format_exc()[-3000:]}
        log(f"error: {e!r}")
    line = json.dumps(result, sort_keys=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(line + "\n")
    print("RESULT " + line, flush=True)
    return 0 if result.get("status") in ("ok", "oom") else 1


if __name__ == "__main__":
    sys.exit(main())
