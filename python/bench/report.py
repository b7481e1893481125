"""Tables, CSV, loss check and memory plot of benchmark results (pure Python).

A result is the dict that `train_gpt2.py` prints after "RESULT " (or the
runner's stand-in for a crash/timeout). Only matplotlib is optional (PNG).
"""

import csv
import io
import json

GIB = 1024 ** 3
ALLOCATORS = ("default", "expandable", "ours")
LABEL = {"default": "PyTorch default", "expandable": "`expandable_segments:True`", "ours": "ours",
         "planned": "ours, planned"}
LOSS_TOL = 1e-3
CSV_COLUMNS = ["run", "allocator", "model", "batch", "status", "oom", "peak_active_gib",
               "peak_reserved_gib", "efficiency", "tokens_per_s", "measured_s", "probe_s", "losses",
               "seq_lens", "gpu"]


def _gib(res, key):
    v = res.get(key)
    return None if v in (None, 0) else v / GIB


def one_line(res):
    """A one-line human summary of one result."""
    s = f"{res.get('run', res.get('tag', '?'))}: {res.get('status')}"
    if res.get("peak_reserved"):
        s += (f" active {res['peak_active'] / GIB:.2f} GiB reserved {res['peak_reserved'] / GIB:.2f} GiB"
              f" eff {res.get('efficiency')}")
    if res.get("tokens_per_s"):
        s += f" {res['tokens_per_s']:.0f} tok/s"
    if res.get("losses"):
        s += f" last loss {res['losses'][-1]:.4f}"
    ps = res.get("plan_stats")
    if ps:
        s += (f" plan hits {ps.get('plan_hits')} slot {ps.get('dynamic_slot')}"
              f" idle {ps.get('dynamic_idle')} fallbacks {ps.get('fallbacks')}")
    pp = res.get("plan_profile")
    if pp:
        s += f" plan synthesized in {pp.get('synthesis_s')} s (arena {pp.get('plan_arena', 0) / GIB:.2f} GiB)"
    if res.get("error"):
        s += f" ({res['error'][:120]})"
    return s


def is_main(res):
    """Runs that go into the main table (not sweep, timeline or trace runs)."""
    run = str(res.get("run", res.get("tag", "")))
    return not run.startswith(("sweep-", "timeline-", "trace-", "ddp", "plan-profile-"))


def rows(results):
    """Flat rows (dicts of CSV_COLUMNS) of every training result."""
    out = []
    for r in results:
        if "batch" not in r:
            continue
        row = {c: r.get(c) for c in CSV_COLUMNS}
        row["run"] = r.get("run", r.get("tag"))
        row["losses"] = json.dumps(r.get("losses")) if r.get("losses") is not None else ""
        row["seq_lens"] = json.dumps(r.get("seq_lens")) if r.get("seq_lens") is not None else ""
        out.append(row)
    return out


def csv_text(rows_):
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for row in rows_:
        w.writerow(row)
    return buf.getvalue()


def _cell(res, ref=None):
    """"reserved GiB, efficiency, tokens/s (± % against `ref`, the default allocator's run)"."""
    if res is None:
        return "–"
    if res.get("status") == "oom":
        return "OOM"
    if res.get("status") != "ok" or not res.get("peak_reserved"):
        return str(res.get("status", "?"))
    tps = res.get("tokens_per_s")
    tps_s = f", {tps / 1000:.1f}k tok/s" if tps else ""
    if tps and ref is not None and ref is not res and ref.get("tokens_per_s"):
        tps_s += f" ({100 * (tps / ref['tokens_per_s'] - 1):+.1f}%)"
    return f"{res['peak_reserved'] / GIB:.2f}, {res['efficiency']:.3f}{tps_s}"


def largest_batch(results):
    """{allocator: (largest ok batch, smallest failing batch or None)} over runs without LoRA.

    Skipped runs (time budget) count as neither."""
    out = {}
    plain = [r for r in results if "batch" in r and "+lora" not in str(r.get("model", ""))
             and r.get("status") != "skipped"
             and not str(r.get("run", "")).startswith(("trace-", "plan-profile-"))]
    for a in ALLOCATORS + tuple(sorted({str(r.get("allocator")) for r in plain} - set(ALLOCATORS))):
        ok = [r["batch"] for r in plain if r.get("allocator") == a and r.get("status") == "ok"]
        bad = [r["batch"] for r in plain if r.get("allocator") == a and r.get("status") != "ok"]
        if ok or bad:
            out[a] = (max(ok) if ok else None, min(bad) if bad else None)
    return out


def markdown(results):
    """The README table: per model and batch, reserved GiB, efficiency, tokens/s."""
    main = [r for r in results if is_main(r) and "batch" in r]
    # Profile runs of the planned mode are steps of the planned runs, not a column.
    results = [r for r in results if not str(r.get("run", "")).startswith("plan-profile-")]
    allocs = [a for a in ALLOCATORS if any(r.get("allocator") == a for r in results)]
    # Variants such as `ours-c16` (ours with 16 MiB chunks), in order met.
    for r in results:
        a = r.get("allocator")
        if a and a not in allocs:
            allocs.append(a)
    keys = []
    for r in main:
        k = (r.get("model", "gpt2"), r["batch"])
        if k not in keys:
            keys.append(k)
    gpu = next((r["gpu"] for r in results if r.get("gpu")), "unknown GPU")
    lines = [f"GPU: {gpu}. Cells: peak reserved GiB, efficiency (peak active / peak reserved), "
             "tokens/s over steps 2-5 (change against PyTorch default).", "",
             "| model | batch | peak active GiB | " + " | ".join(LABEL.get(a, a) for a in allocs) + " |",
             "|---|---|---|" + "---|" * len(allocs)]
    for model, batch in keys:
        by = {a: next((r for r in main if r.get("allocator") == a and r.get("model", "gpt2") == model
                       and r["batch"] == batch), None) for a in allocs}
        actives = sorted({f"{r['peak_active'] / GIB:.2f}" for r in by.values()
                          if r and r.get("status") == "ok" and r.get("peak_active")})
        lines.append(f"| {model} | {batch} | {' / '.join(actives) or '–'} | "
                     + " | ".join(_cell(by[a], by.get("default")) for a in allocs) + " |")
    ours = [r for r in main if r.get("allocator") == "ours" and r.get("at_peak_reserved_sample")]
    if ours:
        lines += ["", "Ours, every `stats()` key at the highest-reserved sample of steps 2-5 "
                  "(byte counts in GiB):", ""]
        for r in ours:
            sample = r["at_peak_reserved_sample"]
            parts = []
            for k in sorted(sample):
                v = sample[k]
                if k == "label":
                    continue
                if isinstance(v, int) and k not in ("driver_calls",) and abs(v) >= 2 ** 20:
                    parts.append(f"{k} {v / GIB:.2f}")
                else:
                    parts.append(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}")
            lines.append(f"- {r.get('model')} b{r['batch']} (at {sample.get('label')}): " + ", ".join(parts))
    lb = largest_batch(results)
    if lb:
        lines += ["", "| largest batch that fits (no LoRA) | " + " | ".join(LABEL.get(a, a) for a in lb) + " |",
                  "|---|" + "---|" * len(lb),
                  "| batch (first failing: why) | " + " | ".join(
                      largest_batch_cell(results, a, ok, bad) for a, (ok, bad) in lb.items()) + " |"]
    return "\n".join(lines) + "\n"


def largest_batch_cell(results, alloc, ok, bad):
    """'112 (120: oom)', 'none (113: no-plan)' or '64 (none failed)': the largest batch
    tried that fits (none if every batch tried failed) and the first failing one with its
    status (oom; no-plan where the planned mode's profile could not run; crash ...)."""
    if bad is None:
        return f"{ok} (none failed)"
    status = next((str(r.get("status")) for r in results if r.get("allocator") == alloc
                   and r.get("batch") == bad and "+lora" not in str(r.get("model", ""))
                   and r.get("status") not in ("ok", "skipped")
                   and not str(r.get("run", "")).startswith(("trace-", "plan-profile-"))), "?")
    return f"{ok if ok is not None else 'none'} ({bad}: {status})"


def loss_check(results, tol=LOSS_TOL):
    """Compares every allocator's losses with the default allocator's, same model and batch.

    Returns {"pass": bool or None, "items": [...], "text": str}.
    """
    main = [r for r in results if is_main(r) and "batch" in r]
    items = []
    for r in main:
        if r.get("allocator") == "default":
            continue
        ref = next((d for d in main if d.get("allocator") == "default"
                    and d.get("model") == r.get("model") and d.get("batch") == r.get("batch")), None)
        name = f"{r.get('allocator')} {r.get('model')} b{r.get('batch')}"
        if ref is None or ref.get("status") != "ok" or r.get("status") != "ok":
            items.append({"name": name, "pass": None,
                          "why": "not comparable (a run missing or not ok)"})
            continue
        a, b = ref.get("losses") or [], r.get("losses") or []
        if len(a) != len(b) or not a:
            items.append({"name": name, "pass": False, "why": f"{len(a)} vs {len(b)} losses"})
            continue
        diff = max(abs(x - y) for x, y in zip(a, b))
        items.append({"name": name, "pass": diff <= tol, "max_abs_diff": diff,
                      "why": f"max |loss - default| = {diff:.2e} over {len(a)} steps"})
    verdicts = [i["pass"] for i in items if i["pass"] is not None]
    ok = all(verdicts) if verdicts else None
    text = [f"Loss check (tolerance {tol:g}): "
            + ("PASS" if ok else "FAIL" if ok is False else "NOT RUN")]
    text += [f"  {'PASS' if i['pass'] else 'FAIL' if i['pass'] is False else 'SKIP'} {i['name']}: {i['why']}"
             for i in items]
    return {"pass": ok, "items": items, "text": "\n".join(text)}


def plot_timelines(files, png_path):
    """PNG of active (solid) and reserved (dashed) GiB over time, one colour per allocator.

    `files`: {allocator: path of a --timeline-out JSON}. Returns the number of series drawn.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5))
    drawn = 0
    for i, (alloc, path) in enumerate(sorted(files.items())):
        with open(path) as f:
            doc = json.load(f)
        samples = doc.get("samples") or []
        if not samples:
            continue
        starts = doc.get("step_start_s") or [0.0]
        t = [s["t"] - starts[0] for s in samples]
        color = f"C{i}"
        ax.plot(t, [s.get("active", 0) / GIB for s in samples], color=color, lw=1,
                label=f"{alloc} active")
        ax.plot(t, [s.get("reserved", 0) / GIB for s in samples], color=color, lw=1.5, ls="--",
                label=f"{alloc} reserved")
        drawn += 1
        for ts in starts[1:]:
            ax.axvline(ts - starts[0], color=color, lw=0.3, alpha=0.4)
    batch = next((json.load(open(p)).get("batch") for p in files.values()), "?")
    ax.set_xlabel("seconds since step 0 began (thin lines: step starts)")
    ax.set_ylabel("GiB")
    ax.set_title(f"GPT-2 124M, batch {batch}: active and reserved memory")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return drawn
