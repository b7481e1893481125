#!/usr/bin/env python3
"""Runs a benchmark suite, one configuration per process, into --out DIR.

    PYTHONUNBUFFERED=1 python3 python/bench/run.py --suite milestone1 --out "$OUT"
    PYTHONUNBUFFERED=1 python3 python/bench/run.py --suite full --out "$OUT"

Every run is `train_gpt2.py` (or `vmm_cost.py`, `train_ddp.py`) in its own
subprocess with a timeout; its output goes to DIR/log.txt, its RESULT line
to DIR/results.jsonl. A crash, a timeout or an OOM is a result line too.
DIR stays small (at most 8 files, each far under 16 MiB): per-run scratch
files live in a temporary folder and only merged files are copied.

Suites:
  milestone1  default + expandable at batch 16/32/64; traces of the default
              allocator at batch 16 (and 32 and LoRA if time allows); VMM
              call costs. Under 7 minutes on an H100.
  full        default, expandable, ours at batch 16/32/64 and GPT-2+LoRA at
              batch 32; batch sweep to the first OOM per allocator; one
              memory timeline per allocator (batch 32) and its PNG; loss check
              against the default allocator; CSV + Markdown table; two-GPU
              data-parallel loss check if two GPUs are present.
  smoke       CPU-only check of this runner (tiny model, --device cpu).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import report  # noqa: E402  (pure Python)

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

    def train(self, name, allocator, batch, timeout=150, lora=False, args=(), keep=()):
        """One train_gpt2.py run; returns its result dict (status crash/timeout if none)."""
        cmd = [PY, str(HERE / "train_gpt2.py"), "--allocator", allocator, "--batch", str(batch),
               "--tag", name] + (["--lora"] if lora else []) + list(args) + self.extra
        if self.device != "cuda":
            cmd += ["--device", self.device]
        rc, text = self.subprocess(name, cmd, timeout)
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


def suite_full(r, sweep_batches, sweep_timeout):
    allocs = ("default", "expandable", "ours")
    for batch in (16, 32, 64):
        for alloc in allocs:
            r.train(f"{alloc}-b{batch}", alloc, batch, timeout=180)
    for alloc in allocs:
        r.train(f"{alloc}-lora-b32", alloc, 32, lora=True, timeout=180)
    # Batch sweep up to the first OOM (or crash) per allocator.
    for alloc in allocs:
        for batch in sweep_batches:
            if r.left() < sweep_timeout + 120:
                log(f"sweep {alloc}: stopping before batch {batch}, time budget", r.logf)
                break
            res = r.train(f"sweep-{alloc}-b{batch}", alloc, batch, timeout=sweep_timeout)
            if res.get("status") != "ok":
                break
    # Timelines (one per allocator, batch 32) -> one PNG.
    tl_files = {}
    for alloc in allocs:
        path = r.scratch / f"timeline-{alloc}.json"
        r.train(f"timeline-{alloc}-b32", alloc, 32, timeout=180, args=["--timeline-out", str(path)])
        if path.exists():
            tl_files[alloc] = path
    png = r.out / "memory_timeline.png"
    try:
        report.plot_timelines(tl_files, png)
        log(f"  wrote {png.name}", r.logf)
    except Exception as e:
        log(f"  timeline plot failed: {e!r}", r.logf)
    # Two-GPU loss check.
    ngpu = 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
        ngpu = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    except Exception:
        pass
    if ngpu >= 2 and r.left() > 240:
        ddp_json = r.scratch / "ddp.json"
        rc, text = r.subprocess("ddp", [PY, str(HERE / "train_ddp.py"), "--json-out", str(ddp_json)],
                                timeout=min(420, r.left() - 30))
        if ddp_json.exists():
            r.record(json.loads(ddp_json.read_text()))
    else:
        log(f"skipping the two-GPU check: {ngpu} GPU(s), {r.left():.0f}s left", r.logf)


def write_full_reports(r):
    rows = report.rows(r.results)
    (r.out / "results.csv").write_text(report.csv_text(rows))
    check = report.loss_check(r.results)
    text = report.markdown(r.results) + "\n" + check["text"] + "\n"
    (r.out / "README_table.md").write_text(text)
    log("loss check:\n" + check["text"], r.logf)


def suite_smoke(r):
    for alloc in ("default", "expandable", "ours"):
        r.train(f"{alloc}-b2", alloc, 2, timeout=120)
    r.train("default-lora-b2", "default", 2, lora=True, timeout=120)
    path = r.scratch / "timeline-default.json"
    r.train("timeline-default-b2", "default", 2, args=["--timeline-out", str(path)])
    report.plot_timelines({"default": path}, r.out / "memory_timeline.png")
    write_full_reports(r)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--suite", choices=["milestone1", "full", "smoke"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--budget-s", type=float, default=None, help="stop starting runs after this")
    p.add_argument("--sweep", default="64,80,96,112,128,144,160,192,224,256",
                   help="batches of the OOM sweep (full suite), in order")
    p.add_argument("--sweep-timeout", type=float, default=150)
    args = p.parse_args(argv)
    if args.suite == "smoke":
        r = Runner(args.out, args.budget_s or 900, device="cpu",
                   extra=["--model", "tiny", "--seq", "64", "--seq-jitter", "16"])
        suite_smoke(r)
    elif args.suite == "milestone1":
        r = Runner(args.out, args.budget_s or 400)
        suite_milestone1(r)
    else:
        r = Runner(args.out, args.budget_s or 3000)
        suite_full(r, [int(b) for b in args.sweep.split(",") if b], args.sweep_timeout)
        write_full_reports(r)
    r.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
