#!/usr/bin/env python3
"""Runs a benchmark suite, one configuration per process, into --out DIR.

    PYTHONUNBUFFERED=1 python3 python/bench/run.py --suite milestone1 --out "$OUT"
    PYTHONUNBUFFERED=1 python3 python/bench/run.py --suite full --out "$OUT"

Every run is `train_gpt2.py` (or `vmm_cost.py`, `train_ddp.py`) in its own
subprocess with a timeout; its output goes to DIR/log.txt, its RESULT line
to DIR/results.jsonl. A crash, a timeout or an OOM is a result line too.
DIR stays small (at most 8 files, each far under 16 MiB): per-run scratch
files live in a temporary folder and only merged files are copied.

Suites (each fits one 10-minute command on an H100; --budget-s stops
starting runs after that many seconds):
  milestone1  default + expandable at batch 16/32/64; traces of the default
              allocator at batch 16 (and 32 if time allows); VMM call costs.
  main        default, expandable, ours at batch 16/32/64 and GPT-2+LoRA at
              batch 32; the batch-32 runs also write a memory timeline ->
              memory_timeline.png; CSV, Markdown table, loss check.
  sweep       per allocator, batches 80, 88, 96, ... until the first run that
              is not ok (OOM, crash, timeout): the largest batch that fits.
  ddp         two-GPU data-parallel loss check, ours vs default (train_ddp.py;
              needs two GPUs).
  throughput  tokens/s without probes, 40 steps whose first 8 lengths repeat,
              at batch 16 (3 repetitions, allocators interleaved) and 32 (2):
              new-length and repeated-length windows; ours' time in
              malloc/free and in VMM calls per step -> throughput.md. The
              allocator `planned` (this suite only) is ours serving a plan:
              one profiling process per batch first (plan-profile-tp-bN),
              then interleaved like the others; throughput.md adds its plan
              counters per run, what the profile covered, and issue 14's
              "within 1% of the default" verdict (repeated lengths, pooled).
  planned     the planned mode (issue 14): per configuration (GPT-2 at batch
              16/32/64, GPT-2+LoRA at batch 32; --planned-configs) ours
              records steps 0..K (--plan-profile-steps, default 3; with
              --plan-profile-with, e.g. ours-c2) and synthesizes a plan
              in-process (plan-profile-*), then a fresh process trains 6
              steps with it (planned-*); then --allocators at the same
              configurations as long as the budget lasts -> planned.md
              (efficiency, tokens/s, plan hits / dynamic / fallbacks,
              synthesis time, how the profile ended, against
              default/expandable/ours) and one "PLANNED" line per config.
              Per allocator, a batch larger than one that ran out of memory
              is skipped, so `--planned-configs 112,113,114 --allocators
              expandable` probes the largest batch that fits (README_table.md;
              a profile that runs out of memory leaves no plan: no-plan).
              Profiles run with GPUMALLOC_SPILL_TO_HOST=1: where the GPU is
              full the pool maps host memory instead (same requests, slower),
              so the profile of a batch only the plan fits completes; the
              profile column says how much was spilled.
  full        main + sweep + ddp in one command (about 15-20 minutes).
  smoke       CPU-only check of this runner (tiny model, --device cpu).
--allocators picks a subset; --merge DIR... combines folders into one report.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import report  # noqa: E402  (pure Python)
import train_gpt2  # noqa: E402  (imports torch only inside run())

PY = sys.executable
T_START = time.time()


def log(msg, logf=None):
    line = f"[run {time.strftime('%H:%M:%S')} +{time.time() - T_START:5.0f}s] {msg}"
    print(line, flush=True)
    if logf is not None:
        logf.write(line + "\n")
        logf.flush()


class Runner:
    def __init__(self, out, budget_s, device="cuda", extra=()):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.scratch = Path(tempfile.mkdtemp(prefix="gm_bench_"))
        self.logf = open(self.out / "log.txt", "a")
        self.results_path = self.out / "results.jsonl"
        self.results = []
        self.budget_s = budget_s
        self.device = device
        self.extra = list(extra)
        log(f"out={self.out} scratch={self.scratch} python={PY} budget={budget_s}s", self.logf)

    def left(self):
        return self.budget_s - (time.time() - T_START)

    def subprocess(self, name, cmd, timeout, env_extra=None):
        """Runs `cmd`; returns (rc, stdout text). Output is appended to log.txt."""
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env.setdefault("TRANSFORMERS_VERBOSITY", "error")
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.update(env_extra or {})
        log(f"start {name}: {' '.join(cmd)} (timeout {timeout:.0f}s)", self.logf)
        self.logf.write(f"----- {name} -----\n")
        self.logf.flush()
        t0 = time.time()
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                               timeout=timeout, text=True, errors="replace", cwd=str(HERE.parents[1]))
            rc, text = p.returncode, p.stdout
        except subprocess.TimeoutExpired as e:
            rc = "timeout"
            text = e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode("utf-8", "replace")
        self.logf.write(text + "\n")
        self.logf.flush()
        log(f"end {name}: rc={rc} in {time.time() - t0:.1f}s", self.logf)
        return rc, text

    def record(self, res):
        self.results.append(res)
        with open(self.results_path, "a") as f:
            f.write(json.dumps(res, sort_keys=True) + "\n")

    def train(self, name, allocator, batch, timeout=150, lora=False, args=(), keep=(), label=None,
              env=None):
        """One train_gpt2.py run; returns its result dict (status crash/timeout if none).
        `label` names the allocator in the result (default: `allocator`); `env` adds
        environment variables to the allocator variant's."""
        if self.left() < 20:
            res = {"allocator": allocator, "batch": batch, "model": "gpt2" + ("+lora" if lora else ""),
                   "run": name, "status": "skipped", "why": "time budget of this command spent"}
            log(f"skip {name}: time budget spent", self.logf)
            self.record(res)
            return res
        timeout = max(20, min(timeout, self.left()))
        base, variant_env = allocator_variant(allocator)
        env = {**variant_env, **(env or {})}
        cmd = [PY, str(HERE / "train_gpt2.py"), "--allocator", base, "--batch", str(batch),
               "--tag", name] + (["--lora"] if lora else []) + list(args) + self.extra
        if self.device != "cuda":
            cmd += ["--device", self.device]
        rc, text = self.subprocess(name, cmd, timeout, env_extra=env)
        res = None
        for line in text.splitlines():
            if line.startswith("RESULT "):
                try:
                    res = json.loads(line[len("RESULT "):])
                except json.JSONDecodeError:
                    pass
        if res is None:
            res = {"allocator": allocator, "batch": batch, "model": "gpt2" + ("+lora" if lora else ""),
                   "tag": name, "status": "timeout" if rc == "timeout" else "crash", "rc": str(rc),
                   "oom": "out of memory" in text.lower(), "tail": text[-1500:]}
        res["run"] = name
        res["allocator"] = label or allocator
        self.record(res)
        log(f"  -> {report.one_line(res)}", self.logf)
        return res

    def keep(self, src, name):
        """Copies a scratch file into DIR if it exists and is under 15 MiB."""
        src = Path(src)
        if not src.exists():
            log(f"  (no {src.name} to keep)", self.logf)
            return None
        size = src.stat().st_size
        if size > 15 * 2 ** 20:
            log(f"  {src.name} is {size / 2**20:.1f} MiB: too large to bring back, not kept", self.logf)
            return None
        dst = self.out / name
        shutil.copyfile(src, dst)
        log(f"  kept {dst.name} ({size / 2**20:.2f} MiB)", self.logf)
        return dst

    def trace(self, name, batch, lora=False, timeout=200):
        bin_path = self.scratch / f"{name}.trace.gz"
        raw_path = self.scratch / f"{name}.raw.json.gz"
        res = self.train(name, "default", batch, timeout=timeout, lora=lora,
                         args=["--trace-out", str(bin_path), "--raw-trace-out", str(raw_path)])
        self.keep(bin_path, bin_path.name)
        self.keep(raw_path, raw_path.name)
        return res

    def vmm(self, timeout=120):
        path = self.scratch / "vmm_cost.json"
        rc, text = self.subprocess("vmm_cost", [PY, str(HERE / "vmm_cost.py"), "--json-out", str(path)],
                                   timeout)
        self.keep(path, "vmm_cost.json")

    def finish(self, markdown_name="summary.md"):
        md = report.markdown(self.results)
        (self.out / markdown_name).write_text(md)
        log("summary:\n" + md, self.logf)
        log(f"done in {time.time() - T_START:.0f}s; files: {sorted(p.name for p in self.out.iterdir())}",
            self.logf)
        shutil.rmtree(self.scratch, ignore_errors=True)


def suite_milestone1(r):
    # Files in DIR: log.txt results.jsonl summary.md vmm_cost.json + up to 4 trace files = 8.
    for batch in (16, 32, 64):
        for alloc in ("default", "expandable"):
            r.train(f"{alloc}-b{batch}", alloc, batch, timeout=min(150, max(30, r.left() - 60)))
    r.trace("trace-default-b16", 16, timeout=min(200, max(30, r.left() - 40)))
    r.vmm(timeout=min(120, max(20, r.left() - 30)))
    if r.left() > 110:
        r.trace("trace-default-b32", 32, timeout=min(150, r.left() - 20))
    else:
        log("skipping the batch-32 trace: not enough time left", r.logf)


def suite_main(r, allocs):
    """GPT-2 at batch 16/32/64 and GPT-2+LoRA at batch 32; batch-32 runs keep a timeline."""
    tl_files = {}
    for batch in (16, 32, 64):
        for alloc in allocs:
            args = []
            if batch == 32:
                path = r.scratch / f"timeline-{alloc}.json"
                args = ["--timeline-out", str(path)]
            r.train(f"{alloc}-b{batch}", alloc, batch, timeout=180, args=args)
            if args and Path(args[1]).exists():
                tl_files[alloc] = Path(args[1])
    for alloc in allocs:
        r.train(f"{alloc}-lora-b32", alloc, 32, lora=True, timeout=180)
    png = r.out / "memory_timeline.png"
    try:
        if tl_files:
            report.plot_timelines(tl_files, png)
            log(f"  wrote {png.name}", r.logf)
    except Exception as e:
        log(f"  timeline plot failed: {e!r}", r.logf)


def suite_sweep(r, allocs, sweep_batches, sweep_timeout):
    """Per allocator: batches in order until the first run that is not ok (OOM, crash, timeout)."""
    for alloc in allocs:
        for batch in sweep_batches:
            if r.left() < sweep_timeout + 30:
                log(f"sweep {alloc}: stopping before batch {batch}, time budget", r.logf)
                break
            res = r.train(f"sweep-{alloc}-b{batch}", alloc, batch, timeout=sweep_timeout)
            if res.get("status") != "ok":
                break


PLANNED_CONFIGS = "16,32,64,lora32"


def planned_configs(text):
    """[(batch, lora)] from "16,32,lora32" (lora32: GPT-2+LoRA at batch 32)."""
    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        lora = item.startswith("lora")
        digits = item[4:] if lora else item
        if not digits.isdigit() or int(digits) <= 0:
            raise ValueError(f"bad planned configuration {item!r}: expected N or loraN")
        out.append((int(digits), lora))
    return out


def config_tag(batch, lora):
    return f"{'lora-' if lora else ''}b{batch}"


# The profiling process spills to host memory when the GPU is full (torch-alloc's
# GPUMALLOC_SPILL_TO_HOST): it records the same requests, only slower, so a batch that
# only the plan fits can still be profiled.
PROFILE_ENV = {"GPUMALLOC_SPILL_TO_HOST": "1"}


def profile_plan(r, tag, batch, lora=False, steps=3, args=(), profiler="ours", timeout=180):
    """The planned mode's profiling process: `profiler` (ours or a variant such as
    `ours-c2`; the requests PyTorch makes do not depend on the pool's settings) records
    steps 0..`steps` and synthesizes a plan into the scratch folder. The pool spills to
    host memory where the GPU runs out (PROFILE_ENV): the online pool reserves a few
    percent more than the plan, and the profile must not fail where the plan would fit.
    Returns (plan path or None, the profile's result, why there is no plan)."""
    plan = r.scratch / f"plan-{tag}.plan"
    prof = r.train(f"plan-profile-{tag}", profiler, batch, lora=lora, timeout=timeout,
                   args=["--plan-profile", str(steps), "--plan-out", str(plan)] + list(args)
                   + ["--steps", str(steps + 1)], env=PROFILE_ENV)
    if prof.get("status") == "ok" and plan.exists():
        return plan, prof, None
    why = f"profile run ({profiler}) {prof.get('status')}"
    if prof.get("oom_step") is not None:
        why += f" at step {prof['oom_step']}"
    if prof.get("status") == "ok":
        why += ", no plan file"
    return None, prof, why


def no_plan_result(tag, batch, lora, prof, why):
    """The planned run that could not be made: "skipped" when the profile was skipped for
    time, else "no-plan" (a batch the planned mode cannot train, e.g. ours itself runs out
    of memory while profiling), so the largest-batch table counts it as a failure."""
    status = "skipped" if prof.get("status") == "skipped" else "no-plan"
    return {"allocator": "planned", "batch": batch, "model": "gpt2" + ("+lora" if lora else ""),
            "run": tag, "status": status, "why": why, "profile_status": prof.get("status")}


def out_of_memory(res):
    """Whether a run failed for memory: an OOM, or a plan that could not be made because
    its profile ran out of memory."""
    return res.get("status") == "oom" or (res.get("status") == "no-plan"
                                          and res.get("profile_status") == "oom")


def suite_planned(r, allocs, configs, profile_steps=3, steps=6, timeout=180, profiler="ours",
                  spill=False):
    """Per configuration: a profile run (`profiler` records steps 0..K and synthesizes the
    plan), then a planned run from it in a fresh process; then the baselines `allocs`.
    With `spill`, the planned run too may place chunks in host memory where the GPU has
    none (GPUMALLOC_SPILL_TO_HOST=1; spilled bytes are reported apart from reserved).
    Per allocator and model, a batch larger than one that ran out of memory is skipped
    (so `--planned-configs 113,114` probes the boundary without wasting runs)."""
    kept = False
    failed = {}  # (allocator, lora) -> smallest batch that ran out of memory

    def already_failed(alloc, batch, lora, name):
        b = failed.get((alloc, lora))
        if b is None or batch <= b:
            return False
        why = f"batch {b} already ran out of memory"
        log(f"skip {name}: {why}", r.logf)
        r.record({"allocator": alloc, "batch": batch, "model": "gpt2" + ("+lora" if lora else ""),
                  "run": name, "status": "skipped", "why": why})
        return True

    def note(alloc, batch, lora, res):
        if out_of_memory(res):
            failed[(alloc, lora)] = min(batch, failed.get((alloc, lora), batch))

    for n, (batch, lora) in enumerate(configs):
        tag = config_tag(batch, lora)
        if already_failed("planned", batch, lora, f"planned-{tag}"):
            continue
        # The first run of ours may build the C++ extension (a minute or two, then cached).
        plan, prof, why = profile_plan(r, tag, batch, lora, profile_steps, profiler=profiler,
                                       timeout=timeout + (150 if n == 0 else 0))
        if plan is None:
            res = no_plan_result(f"planned-{tag}", batch, lora, prof, why)
            log(f"{res['status']} planned-{tag}: {why}", r.logf)
            r.record(res)
            note("planned", batch, lora, res)
            continue
        res = r.train(f"planned-{tag}", "ours", batch, lora=lora, timeout=timeout,
                      args=["--plan", str(plan), "--steps", str(steps)], label="planned",
                      env=PROFILE_ENV if spill else None)
        note("planned", batch, lora, res)
        if not kept:
            kept = r.keep(plan, plan.name) is not None  # one plan file, for the record
    for batch, lora in configs:
        for alloc in allocs:
            name = f"{alloc}-{config_tag(batch, lora)}"
            if already_failed(alloc, batch, lora, name):
                continue
            res = r.train(name, alloc, batch, lora=lora, timeout=timeout,
                          args=["--steps", str(steps)])
            note(alloc, batch, lora, res)
    text = planned_report(r.results, configs)
    (r.out / "planned.md").write_text(text)
    log("planned:\n" + text, r.logf)


def planned_report(results, configs):
    """Markdown: per configuration the planned run against the others (efficiency, tokens/s),
    the plan's counters and synthesis time; and one "PLANNED ..." line per configuration
    for grep."""
    def find(prefix, tag):
        return next((x for x in results if x.get("run") == f"{prefix}-{tag}"), None)

    def eff(res):
        if not res:
            return "-"
        if res.get("status") != "ok":
            return str(res.get("status"))
        return f"{res.get('efficiency')}"

    def tps(res):
        return f"{res['tokens_per_s']:.0f}" if res and res.get("tokens_per_s") else "-"

    others = [a for a in ("default", "expandable", "ours")
              if any(str(x.get("run", "")).startswith(f"{a}-") for x in results)]
    lines = ["Planned mode (issue 14): efficiency = peak active / peak reserved over steps 2-5 "
             "(the pool's own counters for ours and planned), tokens/s over steps 2-5. Plan: "
             "hits / dynamic slot / dynamic idle / fallbacks over the whole planned run; synthesis "
             "on the profiling run's CPU. Profile: that run's status (ours unplanned, steps 0..K; "
             "where it failed there is no plan, so the planned mode cannot train the "
             "configuration: status no-plan).", "",
             "| config | planned eff | planned tok/s | " + " | ".join(f"{a} eff | {a} tok/s" for a in others)
             + " | hits / slot / idle / fallbacks | arena GiB | synthesis s | profile |",
             "|---|---|---|" + "---|---|" * len(others) + "---|---|---|---|"]
    summary = []
    for batch, lora in configs:
        tag = config_tag(batch, lora)
        res, prof = find("planned", tag), find("plan-profile", tag)
        ps = (res or {}).get("plan_stats") or {}
        pp = (prof or {}).get("plan_profile") or {}
        counts = (f"{ps.get('plan_hits')} / {ps.get('dynamic_slot')} / {ps.get('dynamic_idle')} / "
                  f"{ps.get('fallbacks')}" if ps else "-")
        arena = f"{ps['arena'] / report.GIB:.2f}" if ps.get("arena") else "-"
        synth = f"{pp['synthesis_s']}" if pp.get("synthesis_s") is not None else "-"
        cells = []
        for a in others:
            o = find(a, tag)
            cells += [eff(o), tps(o)]
        lines.append(f"| {tag} | {eff(res)} | {tps(res)} | " + " | ".join(cells)
                     + f" | {counts} | {arena} | {synth} | {profile_cell(prof)} |")
        status = (res or {}).get("status", "missing")
        if (res or {}).get("why"):
            status += f" ({res['why']})"
        line = (f"PLANNED {tag}: status {status} eff {eff(res)} "
                f"tok/s {tps(res)} plan {counts} synthesis {synth} s")
        for a in others:
            o = find(a, tag)
            line += f"; {a} eff {eff(o)} tok/s {tps(o)}"
        summary.append(line)
    return "\n".join(lines + [""] + summary) + "\n"


def profile_cell(prof):
    """A profile run in a few words: 'ok (ours, steps 0..3)', 'oom at step 2 (ours-c2)',
    'ok, spilled 1.25 GiB to host (ours-c2, steps 0..2)'."""
    if not prof:
        return "-"
    text = str(prof.get("status"))
    if prof.get("oom_step") is not None:
        text += f" at step {prof['oom_step']}"
    if prof.get("spilled_peak"):
        text += f", spilled {prof['spilled_peak'] / report.GIB:.2f} GiB to host"
    where = [str(prof.get("allocator", "ours"))]
    steps = (prof.get("plan_profile") or {}).get("profiled_steps")
    if steps:
        where.append(f"steps 0..{steps}")
    return f"{text} ({', '.join(where)})"


def count_gpus():
    """GPUs visible (nvidia-smi, else torch in a child process so this one keeps no CUDA context)."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
        n = sum(1 for line in out.splitlines() if line.startswith("GPU "))
        if n:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            return min(n, len(visible.split(","))) if visible else n
    except Exception:
        pass
    try:
        out = subprocess.run([PY, "-c", "import torch; print(torch.cuda.device_count())"],
                             capture_output=True, text=True, timeout=120).stdout
        return int(out.strip().splitlines()[-1])
    except Exception:
        return 0


def suite_ddp(r, allocs):
    """Two-GPU data-parallel loss check (train_ddp.py), ours against PyTorch's default."""
    ngpu = count_gpus()
    if ngpu < 2:
        log(f"skipping the two-GPU check: {ngpu} GPU(s) visible", r.logf)
        return
    ddp_json = r.scratch / "ddp.json"
    pair = ",".join(a for a in ("default", "ours") if a in allocs) or "default,ours"
    r.subprocess("ddp", [PY, str(HERE / "train_ddp.py"), "--allocators", pair,
                         "--json-out", str(ddp_json)], timeout=max(60, min(560, r.left() - 10)))
    if ddp_json.exists():
        res = json.loads(ddp_json.read_text())
        res["run"] = "ddp"
        r.record(res)
        log(f"  -> ddp: {res.get('verdict')} {res.get('why', '')}", r.logf)
    else:
        r.record({"run": "ddp", "status": "crash", "verdict": "FAIL", "why": "no result file"})


def window_tokens_per_s(res, lo, hi, batch):
    """Tokens/s over steps lo..hi (inclusive) from the per-step times (each
    step ends synchronised, so their sum is the window's wall time)."""
    tm = window_tokens_ms(res, lo, hi, batch)
    return tm[0] / (tm[1] / 1000.0) if tm and tm[1] else None


def suite_throughput(r, allocs, steps=40, cycle=8, plan=((16, 3), (32, 2)), profile_steps=3,
                     profiler="ours"):
    """Tokens/s with no probes inside the step, allocators interleaved per
    repetition, and where ours spends host time (malloc/free, VMM calls) per
    step. The first `cycle` sequence lengths repeat (`--length-cycle`), so
    each run has two windows: steps 1..cycle-1, where every length is new
    (PyTorch and cuBLAS set up each new shape on the host, the pools grow),
    and steps cycle..steps-1, where every length has been seen before, as in
    a long run whose lengths repeat: the steady state, bound by the GPU.
    Steps 2-5 (the main suite's window) are reported too.

    The allocator `planned` is ours serving a plan: per batch, before the
    repetitions, one profiling process (as in the planned suite, with the
    same lengths) records steps 0..K, K at least `profile_steps` and large
    enough to include the run's longest length after step 0 (the plan's
    dynamic slots are sized by the longest profiled step; a longer one would
    fall back); then every repetition trains from that plan like the others."""
    args = ["--steps", str(steps), "--measure-from", str(cycle), "--no-probes",
            "--length-cycle", str(cycle)]
    windows = ((1, cycle - 1, "new lengths"), (2, 5, "2-5"), (cycle, steps - 1, "repeated"))
    runs, profiles = [], {}
    for batch, reps in plan:
        plan_file = None
        if "planned" in allocs:
            k = covering_profile_steps(run_lengths(r, steps, cycle), profile_steps)
            plan_file, prof, why = profile_plan(
                r, f"tp-b{batch}", batch, steps=k, profiler=profiler, timeout=240,
                args=["--no-probes", "--length-cycle", str(cycle)])
            profiles[batch] = prof
            if plan_file is None:
                log(f"planned at batch {batch}: {why}", r.logf)
        for rep in range(1, reps + 1):
            # Rotate the order per repetition so that no allocator always runs first.
            order = list(allocs[rep - 1:]) + list(allocs[:rep - 1]) if allocs else []
            for alloc in order:
                name = f"tp-{alloc}-b{batch}-r{rep}"
                if alloc != "planned":
                    res = r.train(name, alloc, batch, timeout=150, args=args)
                elif plan_file is not None:
                    res = r.train(name, "ours", batch, timeout=150, label="planned",
                                  args=args + ["--plan", str(plan_file)])
                else:
                    res = no_plan_result(name, batch, False, profiles[batch], why)
                    r.record(res)
                runs.append((batch, rep, alloc, res))
    text = throughput_report(runs, windows, cycle, profiles)
    (r.out / "throughput.md").write_text(text)
    log("throughput:\n" + text, r.logf)


def run_lengths(r, steps, cycle):
    """The sequence lengths train_gpt2.py will use for these runs (its own defaults and
    the runner's extra options: seed, --seq, --seq-jitter)."""
    a = train_gpt2.parse_args(["--allocator", "ours"] + list(getattr(r, "extra", [])))
    return train_gpt2.step_lengths(a.seed, steps, a.seq, a.seq_jitter, cycle)


def covering_profile_steps(lengths, k):
    """The number of steps to profile, at least `k`: enough that steps 1..K include the
    first step of the longest length after step 0 (step 0 is the plan's prologue)."""
    later = lengths[1:]
    if not later:
        return k
    return max(k, 1 + later.index(max(later)))


def throughput_report(runs, windows, measure_from, profiles=None):
    """Markdown: per run tokens/s in each window and the change against the
    default of the same repetition; ours' host ms per step; then per batch,
    allocator and window the median of those ratios and the pooled ratio
    (all repetitions' tokens over all their time). With `planned` runs, their
    plan counters, what each batch's profile (`profiles`: {batch: result})
    covered, and issue 14's tokens/s criterion."""
    names = [w[2] for w in windows]
    lines = ["Tokens/s (no probes; each step ends synchronised), allocators interleaved per "
             "repetition; change against PyTorch's default of the same repetition. Ours: host ms "
             f"per step inside malloc/free and in VMM driver calls, mean over steps {measure_from}-.",
             "",
             "| batch | rep | allocator | " + " | ".join(f"tok/s {n} | vs default" for n in names)
             + " | median step ms (repeated) | ours alloc ms/step | ours driver ms/step |",
             "|---|---|---|" + "---|---|" * len(windows) + "---|---|---|"]
    ratios, pooled = {}, {}
    for batch, rep, alloc, res in runs:
        base = next((x for b, rp, a, x in runs if (b, rp, a) == (batch, rep, "default")), None)
        cells = []
        for lo, hi, name in windows:
            t = window_tokens_per_s(res, lo, hi, batch)
            t0 = window_tokens_per_s(base, lo, hi, batch) if base else None
            cells.append(f"{t:.0f}" if t else "-")
            if t and t0:
                cells.append(f"{100 * (t / t0 - 1):+.1f}%")
                ratios.setdefault((batch, alloc, name), []).append(t / t0)
            else:
                cells.append("-")
            tok_ms = window_tokens_ms(res, lo, hi, batch)
            if tok_ms:
                acc = pooled.setdefault((batch, alloc, name), [0.0, 0.0])
                acc[0] += tok_ms[0]
                acc[1] += tok_ms[1]
        ms = sorted(res.get("step_ms", [])[measure_from:])
        med = f"{ms[len(ms) // 2]:.0f}" if ms else "-"
        am = res.get("step_alloc_ms", [])[measure_from:]
        dm = res.get("step_driver_ms", [])[measure_from:]
        a = f"{sum(am) / len(am):.1f}" if am else "-"
        d = f"{sum(dm) / len(dm):.1f}" if dm else "-"
        lines.append(f"| {batch} | {rep} | {alloc} | {' | '.join(cells)} | {med} | {a} | {d} |")
    detail = [call_detail_line(batch, rep, alloc, res, measure_from) for batch, rep, alloc, res in runs]
    detail = [d for d in detail if d]
    if detail:
        lines += ["", f"Ours' calls, steps {measure_from}- (per step: where the host time goes):", "",
                  "| batch | rep | allocator | alloc µs/call | free µs/call | calls/step | "
                  "slow (>10 µs) calls/step | slow ms/step | thread switches/step |",
                  "|---|---|---|---|---|---|---|---|---|"] + detail
    lines += ["", "Against the default: median over repetitions of the ratio, and the pooled "
              "ratio (all repetitions' tokens over all their time):", ""]
    for (batch, alloc, name), rs in sorted(ratios.items()):
        if alloc == "default":
            continue
        rs = sorted(rs)
        p, p0 = pooled.get((batch, alloc, name)), pooled.get((batch, "default", name))
        pooled_txt = (f", pooled {100 * ((p[0] / p[1]) / (p0[0] / p0[1]) - 1):+.1f}%"
                      if p and p0 and p[1] and p0[1] else "")
        lines.append(f"- batch {batch}, {alloc}, steps {name}: median {100 * (statistics.median(rs) - 1):+.1f}%"
                     f"{pooled_txt} (each: {', '.join(f'{100 * (x - 1):+.1f}%' for x in rs)})")
    if any(alloc == "planned" for _, _, alloc, _ in runs):
        lines += planned_throughput_lines(runs, profiles or {}, pooled)
    return "\n".join(lines) + "\n"


def planned_throughput_lines(runs, profiles, pooled, window="repeated", tolerance=0.01):
    """Markdown lines on the throughput suite's planned runs: the plan's counters and
    memory per run, what each batch's profile covered, and issue 14's criterion
    (tokens/s within `tolerance` of the default's, pooled over the `window` steps)."""
    gib = lambda v: f"{v / report.GIB:.2f}" if v else "-"  # noqa: E731
    lines = ["", "Planned runs (ours serving the plan of one profiling process per batch). Plan "
             "counters over the whole run; unmatched: the fallbacks with no planned request at "
             "their position; peaks and efficiency over the measured steps:", "",
             "| batch | rep | status | plan hits | dynamic slot | dynamic idle | fallbacks | "
             "unmatched | arena GiB | peak active GiB | peak reserved GiB | efficiency |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    longest = {}
    for batch, rep, alloc, res in runs:
        if alloc != "planned":
            continue
        ps = res.get("plan_stats") or {}
        status = str(res.get("status")) + (f" ({res['why']})" if res.get("why") else "")
        counts = " | ".join(str(ps.get(k, "-")) for k in
                            ("plan_hits", "dynamic_slot", "dynamic_idle", "fallbacks", "unmatched"))
        lines.append(f"| {batch} | {rep} | {status} | {counts} | {gib(ps.get('arena'))} | "
                     f"{gib(res.get('peak_active'))} | {gib(res.get('peak_reserved'))} | "
                     f"{res.get('efficiency') if res.get('efficiency') is not None else '-'} |")
        if len(res.get("seq_lens") or []) > 1:
            longest[batch] = max(longest.get(batch, 0), max(res["seq_lens"][1:]))
    lines += ["", "Profiles (step 0 is the plan's prologue; steps 1..K its template):", ""]
    for batch, prof in sorted(profiles.items()):
        lens = prof.get("seq_lens") or []
        info = prof.get("plan_profile") or {}
        text = f"- batch {batch}: {profile_cell(prof)}"
        if lens:
            text += f", lengths {', '.join(map(str, lens))}"
        if len(lens) > 1 and batch in longest:
            covered = max(lens[1:]) >= longest[batch]
            text += (f"; the runs' longest length after step 0 is {longest[batch]}: "
                     + ("covered" if covered else "NOT covered (longer steps fall back)"))
        if info.get("synthesis_s") is not None:
            text += f"; synthesis {info['synthesis_s']} s, arena {gib(info.get('plan_arena'))} GiB"
        lines.append(text)
    lines += ["", f"Issue 14 (tokens/s within {100 * tolerance:.0f}% of PyTorch's default once "
              f"planned), pooled over the {window} steps of every repetition:", ""]
    for batch in sorted({b for b, _, a, _ in runs if a == "planned"}):
        p, p0 = pooled.get((batch, "planned", window)), pooled.get((batch, "default", window))
        if not (p and p0 and p[1] and p0[1]):
            lines.append(f"- batch {batch}: not measured (a planned or default run missing or not ok)")
            continue
        change = (p[0] / p[1]) / (p0[0] / p0[1]) - 1
        verdict = "met" if change >= -tolerance else "NOT met"
        lines.append(f"- batch {batch}: planned {change * 100:+.1f}% against the default: {verdict}")
    return lines


def call_detail_line(batch, rep, alloc, res, lo):
    """A Markdown row of ours' per-call detail over steps lo.., or None."""
    d = (res or {}).get("step_call_detail")
    if not d or len(d.get("alloc_calls", [])) <= lo:
        return None
    tot = {k: sum(v[lo:]) for k, v in d.items()}
    steps = len(d["alloc_calls"]) - lo
    per_call = lambda ns, n: f"{ns / n / 1000:.2f}" if n else "-"  # noqa: E731
    return (f"| {batch} | {rep} | {alloc} | {per_call(tot['alloc_call_ns'], tot['alloc_calls'])} | "
            f"{per_call(tot['free_call_ns'], tot['free_calls'])} | "
            f"{(tot['alloc_calls'] + tot['free_calls']) / steps:.0f} | {tot['slow_calls'] / steps:.1f} | "
            f"{tot['slow_call_ns'] / steps / 1e6:.2f} | {tot['thread_switches'] / steps:.0f} |")


def window_tokens_ms(res, lo, hi, batch):
    """(tokens, ms) over steps lo..hi inclusive, or None."""
    ms, lens = (res or {}).get("step_ms", []), (res or {}).get("seq_lens", [])
    if len(ms) <= hi or len(lens) <= hi:
        return None
    return batch * sum(lens[lo:hi + 1]), sum(ms[lo:hi + 1])


def write_full_reports(r, results=None):
    results = r.results if results is None else results
    (r.out / "results.csv").write_text(report.csv_text(report.rows(results)))
    check = report.loss_check(results)
    ddp = [x for x in results if x.get("run") == "ddp"]
    text = report.markdown(results) + "\n" + check["text"] + "\n"
    for d in ddp:
        text += f"Two-GPU data-parallel loss check: {d.get('verdict')} ({d.get('why', '')})\n"
    (r.out / "README_table.md").write_text(text)
    log("report:\n" + text, r.logf)


def suite_smoke(r):
    suite_main(r, ALLOCS)
    suite_sweep(r, ("default",), [2, 4], 120)
    write_full_reports(r)


def merge(dirs, out):
    """Combines results.jsonl of several output folders into one report in `out`."""
    results = []
    for d in dirs:
        p = Path(d) / "results.jsonl"
        if p.exists():
            results += [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
        else:
            log(f"no {p}")
    r = Runner(out, 60)
    for res in results:
        r.record(res)
    write_full_reports(r)
    # The planned suite's runs (the throughput suite's tp-planned-* have their own report).
    planned = [x for x in results if x.get("allocator") == "planned" and "batch" in x
               and str(x.get("run", "")).startswith("planned-")]
    if planned:
        configs = []
        for x in planned:
            c = (x["batch"], "+lora" in str(x.get("model", "")))
            if c not in configs:
                configs.append(c)
        # Baselines of the main suite are named alloc-bN / alloc-lora-bN as well.
        text = planned_report(results, configs)
        (r.out / "planned.md").write_text(text)
        log("planned:\n" + text, r.logf)
    r.finish()


ALLOCS = ("default", "expandable", "ours")


VARIANT_ENV = {"c": "GPUMALLOC_CHUNK_MIB", "r": "GPUMALLOC_REUSE_ENTRIES"}


def allocator_variant(name):
    """Splits an allocator name into (allocator, environment), so settings
    can be compared in one run: `ours-c16` is ours with 16 MiB chunks
    (`GPUMALLOC_CHUNK_MIB`), `ours-r0` without the reuse cache
    (`GPUMALLOC_REUSE_ENTRIES`), `ours-c16-r0` both; every other name is
    itself (an unknown suffix leaves the name as it is, and is refused)."""
    base, *parts = name.split("-")
    env = {}
    for part in parts:
        key, value = part[:1], part[1:]
        if key not in VARIANT_ENV or not value.isdigit():
            return name, {}
        env[VARIANT_ENV[key]] = value
    return (base, env) if base == "ours" else (name, {})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--suite", choices=["milestone1", "main", "sweep", "ddp", "full", "smoke",
                                       "throughput", "planned"])
    p.add_argument("--out", required=True)
    p.add_argument("--allocators", default=",".join(ALLOCS),
                   help="comma-separated subset of default,expandable,ours; ours-cN is ours "
                        "with N MiB chunks; planned (throughput suite): ours serving a plan")
    p.add_argument("--budget-s", type=float, default=None,
                   help="start no run after this many seconds (default: per suite)")
    p.add_argument("--sweep", default="80,88,96,104,112,120,128,144,160,192,256",
                   help="batches of the OOM sweep, in order (batch 64 is in the main suite)")
    p.add_argument("--sweep-timeout", type=float, default=150)
    p.add_argument("--throughput-plan", default="16:3,32:2",
                   help="throughput suite: batch:repetitions, comma-separated")
    p.add_argument("--precision", choices=["bf16", "autocast"], default="bf16",
                   help="passed to every train_gpt2.py run")
    p.add_argument("--planned-configs", default=PLANNED_CONFIGS,
                   help="planned suite: comma-separated batches, loraN for GPT-2+LoRA at batch N")
    p.add_argument("--plan-profile-steps", type=int, default=3, metavar="K",
                   help="planned mode: profile steps 0..K (step 0 is the prologue; the template "
                        "needs the longest step, step 2 at the default seed)")
    p.add_argument("--plan-profile-with", default="ours", metavar="VARIANT",
                   help="planned mode: the allocator of the profiling process, ours or a variant "
                        "(ours-c2: 2 MiB chunks reserve less, for batches at the memory boundary)")
    p.add_argument("--planned-spill", action="store_true",
                   help="planned suite: the planned runs may spill chunks to host memory "
                        "(GPUMALLOC_SPILL_TO_HOST=1), as the profiles do: a batch whose live "
                        "tensors exceed the GPU's free memory then trains, slower")
    p.add_argument("--merge", nargs="+", metavar="DIR",
                   help="only combine the results.jsonl of these folders into --out")
    args = p.parse_args(argv)
    allocs = tuple(a for a in args.allocators.split(",") if a and a != "none")
    if args.suite == "planned":
        allocs = tuple(a for a in allocs if a != "planned")  # its planned runs are always made
    elif "planned" in allocs and args.suite != "throughput":
        p.error("the allocator planned belongs to --suite throughput (and the planned suite)")
    bad = [a for a in allocs if a != "planned" and allocator_variant(a)[0] not in ALLOCS]
    if bad:
        p.error(f"unknown allocators {bad}")
    if allocator_variant(args.plan_profile_with)[0] != "ours":
        p.error("--plan-profile-with takes ours or a variant of it (ours-c2, ...)")
    if args.plan_profile_steps < 1:
        p.error("--plan-profile-steps needs K >= 1")
    planning = {"profile_steps": args.plan_profile_steps, "profiler": args.plan_profile_with}
    if args.merge:
        merge(args.merge, args.out)
        return 0
    if not args.suite:
        p.error("--suite or --merge is required")
    sweep = [int(b) for b in args.sweep.split(",") if b]
    budgets = {"milestone1": 400, "main": 540, "sweep": 540, "ddp": 560, "full": 3000, "smoke": 900,
               "throughput": 540, "planned": 540}
    try:
        configs = planned_configs(args.planned_configs)
    except ValueError as e:
        p.error(str(e))
    if args.suite == "smoke":
        r = Runner(args.out, args.budget_s or budgets["smoke"], device="cpu",
                   extra=["--model", "tiny", "--seq", "64", "--seq-jitter", "16"])
        suite_smoke(r)
    else:
        r = Runner(args.out, args.budget_s or budgets[args.suite],
                   extra=["--precision", args.precision] if args.precision != "bf16" else [])
        if args.suite == "milestone1":
            suite_milestone1(r)
        elif args.suite == "planned":
            suite_planned(r, allocs, configs, spill=args.planned_spill, **planning)
            write_full_reports(r)
        elif args.suite == "throughput":
            plan = tuple((int(b), int(n)) for b, n in
                         (x.split(":") for x in args.throughput_plan.split(",") if x))
            suite_throughput(r, allocs, plan=plan, **planning)
        else:
            if args.suite in ("main", "full"):
                suite_main(r, allocs)
            if args.suite in ("sweep", "full"):
                suite_sweep(r, allocs, sweep, args.sweep_timeout)
            if args.suite in ("ddp", "full"):
                suite_ddp(r, allocs)
            write_full_reports(r)
    r.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
