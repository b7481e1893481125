"""CPU tests of the planned mode's Python side (issue 14), no torch, no GPU:
train_gpt2's --plan-profile/--plan options (parsing, what they call on the
library, what they put in the result), run.py's planned suite (order of runs,
skips, the report and its PLANNED lines), and, when the Rust library is built
(`cargo build --release -p torch-alloc`), the ctypes bindings that need no
device: plan synthesis from the repository's GPT-2 trace and the refusal of
a bad plan file.

    python3 -m pytest python/tests/test_plan_bench.py
"""

import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python" / "bench"))
sys.path.insert(0, str(ROOT / "python"))

import run  # noqa: E402
import train_gpt2  # noqa: E402  (imports torch only inside run())

GIB = 1024 ** 3


def test_plan_options_parse_and_refuse_bad_combinations(capsys):
    a = train_gpt2.parse_args(["--allocator", "ours", "--plan-profile", "3", "--plan-out", "p.plan",
                               "--steps", "4"])
    assert (a.plan_profile, a.plan_out, a.plan) == (3, "p.plan", None)
    a = train_gpt2.parse_args(["--allocator", "ours", "--plan", "p.plan"])
    assert (a.plan_profile, a.plan) == (0, "p.plan")
    bad = [
        (["--allocator", "default", "--plan", "p"], "need --allocator ours"),
        (["--allocator", "ours", "--plan-profile", "3"], "needs --plan-out"),
        (["--allocator", "ours", "--plan-out", "x"], "needs --plan-profile"),
        (["--allocator", "ours", "--plan-profile", "3", "--plan-out", "x", "--steps", "3"],
         "--steps must be at least 4"),
        (["--allocator", "ours", "--plan-profile", "2", "--plan-out", "x", "--plan", "y"],
         "separate runs"),
        (["--allocator", "ours", "--plan-profile", "-1", "--plan-out", "x"], "K >= 1"),
    ]
    for argv, why in bad:
        with pytest.raises(SystemExit):
            train_gpt2.parse_args(argv)
        assert why in capsys.readouterr().err, argv


PLAN_HEAD = """gpumalloc-plan 1
# plan: 3228 requests
# synthesis 0.200 s
small_below 1048576
prologue_steps 1
iterations 3
arena 12673654784
trace_peak_live 12673654784
unplanned 0
stats 94 9 16 18 1 2 requests largest 0.2
requests 1
r p l 0 0 s 512 512 0 0 1
end
"""


class FakeGm:
    """Stands in for gpumalloc_torch: records calls, writes the files the library would."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def call(*a):
            self.calls.append((name,) + a)
            if name == "save_trace":
                Path(a[0]).write_bytes(b"GMLKTRC\0" + bytes(24))
            if name == "synthesize_plan":
                Path(a[1]).write_text(PLAN_HEAD)
                return 0.25
            if name == "plan_stats":
                return {"loaded": 1, "arena": 12 * GIB, "plan_hits": 4108, "dynamic_slot": 4680,
                        "dynamic_idle": 0, "fallbacks": 0, "unmatched": 0, "high_water": 1}
            return None
        return call


def drive(hooks, steps):
    """Runs `hooks` through `steps` training steps as train_gpt2 does; the result dict."""
    hooks.start()
    for i in range(steps):
        hooks.step(i)
        hooks.after_step(i)
    result = {}
    hooks.finish(result)
    return result


def test_profile_hooks_record_mark_save_and_synthesize(tmp_path):
    plan = tmp_path / "b16.plan"
    args = train_gpt2.parse_args(["--allocator", "ours", "--plan-profile", "3", "--plan-out",
                                  str(plan), "--steps", "6"])
    gm = FakeGm()
    hooks = train_gpt2.PlanHooks(args, gm, cuda=True)
    result = drive(hooks, 6)
    names = [c[0] for c in gm.calls]
    # Trace from the start; a mark before steps 1..5 (none before step 0, which shares
    # the prologue with the set-up); saved and synthesized right after step 3.
    assert names == ["start_trace", "step", "step", "step", "save_trace", "synthesize_plan",
                     "step", "step"]
    assert gm.calls[4] == ("save_trace", str(plan) + ".trace", 0)
    assert gm.calls[5] == ("synthesize_plan", str(plan) + ".trace", str(plan), 3, 1)
    info = result["plan_profile"]
    assert info["synthesis_s"] == 0.25 and info["profiled_steps"] == 3
    assert info["plan_arena"] == 12673654784 and info["plan_iterations"] == 3
    assert "plan_gpumalloc-plan" not in info and "plan_stats" not in info
    assert "plan_stats" not in result


def test_planned_hooks_load_mark_and_report(tmp_path):
    args = train_gpt2.parse_args(["--allocator", "ours", "--plan", "x.plan"])
    gm = FakeGm()
    hooks = train_gpt2.PlanHooks(args, gm, cuda=True)
    result = drive(hooks, 6)
    assert [c[0] for c in gm.calls] == ["use_plan"] + ["step"] * 5 + ["plan_stats"]
    assert gm.calls[0] == ("use_plan", "x.plan", 0)
    assert result["plan_stats"]["plan_hits"] == 4108 and result["plan"]["file"] == "x.plan"
    # On the CPU (smoke runs) the hooks do nothing.
    gm = FakeGm()
    cpu = train_gpt2.PlanHooks(args, gm, cuda=False)
    cpu.start()
    cpu.step(1)
    cpu.finish({})
    assert gm.calls == []


def test_planned_configs_parse():
    assert run.planned_configs("16,32,64,lora32") == [(16, False), (32, False), (64, False),
                                                      (32, True)]
    for bad in ("x", "lora", "0", "16,lorax"):
        with pytest.raises(ValueError):
            run.planned_configs(bad)


class FakeRunner:
    """Runner.train/record/keep without subprocesses: statuses from `outcome`."""

    def __init__(self, tmp_path, outcome):
        self.scratch = tmp_path / "scratch"
        self.scratch.mkdir()
        self.out = tmp_path / "out"
        self.out.mkdir()
        self.logf = None
        self.results, self.cmds, self.kept = [], [], []
        self.envs = {}
        self.outcome = outcome

    def train(self, name, allocator, batch, timeout=150, lora=False, args=(), keep=(), label=None,
              env=None):
        self.cmds.append((name, allocator, batch, lora, list(args)))
        self.envs[name] = dict(env or {})
        status = self.outcome(name)
        res = {"run": name, "allocator": label or allocator, "batch": batch,
               "model": "gpt2" + ("+lora" if lora else ""), "status": status}
        if status == "ok":
            res.update(efficiency=0.99 if label == "planned" else 0.9, tokens_per_s=100000.0,
                       peak_active=11 * GIB, peak_reserved=12 * GIB)
            if "--plan-out" in args:
                Path(args[args.index("--plan-out") + 1]).write_text(PLAN_HEAD)
                res["plan_profile"] = {"synthesis_s": 0.2, "plan_arena": 12 * GIB}
            if label == "planned":
                res["plan_stats"] = {"loaded": 1, "arena": 12 * GIB, "plan_hits": 4108,
                                     "dynamic_slot": 4680, "dynamic_idle": 0, "fallbacks": 0}
        self.record(res)
        return res

    def record(self, res):
        self.results.append(res)

    def keep(self, src, name):
        self.kept.append(name)
        return self.out / name


def test_planned_suite_runs_profile_then_plan_then_baselines(tmp_path):
    r = FakeRunner(tmp_path, lambda name: "oom" if name == "plan-profile-b64" else "ok")
    run.suite_planned(r, ("default", "ours"), run.planned_configs("16,64,lora32"))
    names = [c[0] for c in r.cmds]
    assert names == ["plan-profile-b16", "planned-b16", "plan-profile-b64", "plan-profile-lora-b32",
                     "planned-lora-b32", "default-b16", "ours-b16", "default-b64", "ours-b64",
                     "default-lora-b32", "ours-lora-b32"]
    prof = r.cmds[0]
    assert prof[4][:2] == ["--plan-profile", "3"] and prof[4][-2:] == ["--steps", "4"]
    planned = r.cmds[1]
    assert planned[1] == "ours" and planned[4][0] == "--plan" and planned[4][-2:] == ["--steps", "6"]
    assert planned[4][1] == prof[4][3]  # the plan the profile wrote
    assert r.cmds[4][3] is True  # LoRA
    # No plan is a failure of the planned mode at that batch (not a skip for time).
    no_plan = next(x for x in r.results if x["run"] == "planned-b64")
    assert no_plan["status"] == "no-plan" and "profile run (ours) oom" in no_plan["why"]
    assert r.kept == ["plan-b16.plan"]
    text = (r.out / "planned.md").read_text()
    lines = [x for x in text.splitlines() if x.startswith("PLANNED ")]
    assert len(lines) == 3
    assert lines[0] == ("PLANNED b16: status ok eff 0.99 tok/s 100000 plan 4108 / 4680 / 0 / 0 "
                        "synthesis 0.2 s; default eff 0.9 tok/s 100000; ours eff 0.9 tok/s 100000")
    assert lines[1].startswith("PLANNED b64: status no-plan (profile run (ours) oom) eff no-plan")
    assert ("| lora-b32 | 0.99 | 100000 | 0.9 | 100000 | 0.9 | 100000 | 4108 / 4680 / 0 / 0 | 12.00 "
            "| 0.2 | ok (ours) |") in text


def test_report_keeps_profile_runs_out_of_the_main_table():
    import report
    prof = {"run": "plan-profile-b16", "allocator": "ours", "batch": 16, "status": "ok",
            "peak_active": GIB, "peak_reserved": GIB, "efficiency": 1.0, "gpu": "H100"}
    planned = dict(prof, run="planned-b16", allocator="planned",
                   plan_stats={"plan_hits": 1, "dynamic_slot": 2, "dynamic_idle": 3, "fallbacks": 4})
    md = report.markdown([prof, planned])
    assert "ours, planned" in md and "| ours |" not in md
    assert "plan hits 1 slot 2 idle 3 fallbacks 4" in report.one_line(planned)


LIB = ROOT / "target" / "release" / "libgpumalloc_torch.so"


@pytest.mark.skipif(not LIB.exists(), reason="cargo build --release -p torch-alloc first")
def test_bindings_synthesize_and_refuse_bad_plans_without_a_gpu(tmp_path):
    import ctypes

    import gpumalloc_torch as gm

    gm._load(str(LIB))
    assert ctypes.sizeof(gm.GmStats) == 39 * 8 and ctypes.sizeof(gm.GmPlanStats) == 8 * 8
    trace = ROOT / "lake" / "tests" / "data" / "gpt2-b16-6steps.trace.gz"
    plan = tmp_path / "b16.plan"
    seconds = gm.synthesize_plan(trace, plan, 3, 1)
    assert 0 <= seconds < 10
    head = train_gpt2.plan_summary(plan)
    assert head["plan_iterations"] == 3 and 11 * GIB < head["plan_arena"] < 13 * GIB
    with pytest.raises(RuntimeError, match="at least one profiled step"):
        gm.synthesize_plan(ROOT / "lake" / "tests" / "data" / "gpt2-b16-2steps.trace.gz",
                           tmp_path / "x.plan", 3, 2)
    bad = tmp_path / "bad.plan"
    bad.write_text(plan.read_text()[:1000])
    with pytest.raises(RuntimeError, match="gm_plan_load: .*bad.plan"):
        gm.use_plan(bad)


def test_merge_puts_planned_runs_next_to_the_main_suites(tmp_path):
    import json

    planned_dir, main_dir, out = tmp_path / "p", tmp_path / "m", tmp_path / "out"
    planned_dir.mkdir()
    main_dir.mkdir()
    ok = {"status": "ok", "peak_active": 11 * GIB, "peak_reserved": 12 * GIB,
          "tokens_per_s": 1000.0, "gpu": "H100"}
    planned = [dict(ok, run="plan-profile-b16", allocator="ours", batch=16, model="gpt2",
                    plan_profile={"synthesis_s": 0.2}),
               dict(ok, run="planned-b16", allocator="planned", batch=16, model="gpt2",
                    efficiency=0.995, plan_stats={"plan_hits": 1, "dynamic_slot": 2,
                                                  "dynamic_idle": 0, "fallbacks": 0, "arena": GIB}),
               dict(ok, run="planned-lora-b32", allocator="planned", batch=32, model="gpt2+lora",
                    efficiency=0.99)]
    main = [dict(ok, run="default-b16", allocator="default", batch=16, model="gpt2", efficiency=0.72),
            dict(ok, run="default-lora-b32", allocator="default", batch=32, model="gpt2+lora",
                 efficiency=0.74)]
    (planned_dir / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in planned))
    (main_dir / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in main))
    run.merge([planned_dir, main_dir], out)
    text = (out / "planned.md").read_text()
    assert ("PLANNED b16: status ok eff 0.995 tok/s 1000 plan 1 / 2 / 0 / 0 synthesis 0.2 s; "
            "default eff 0.72 tok/s 1000") in text
    assert "PLANNED lora-b32: status ok eff 0.99" in text and "default eff 0.74" in text
    assert "ours, planned" in (out / "README_table.md").read_text()


def test_profile_covers_the_longest_length_after_step_0():
    lengths = train_gpt2.step_lengths(1234, 40, 1024, 256, cycle=8)
    assert lengths[:8] == [799, 965, 1021, 978, 1007, 982, 974, 843]
    assert run.covering_profile_steps(lengths, 3) == 3  # 1021 is step 2
    assert run.covering_profile_steps([500, 600, 700, 800, 900], 3) == 4
    # Step 0 is the prologue: when it is the longest, its next occurrence must be profiled.
    assert run.covering_profile_steps([900, 600, 700, 900, 600, 700], 1) == 3
    assert run.covering_profile_steps([900], 3) == 3


class FakeThroughputRunner(FakeRunner):
    """FakeRunner whose ok runs have per-step times and lengths; planned runs take 1% longer."""

    def train(self, name, allocator, batch, timeout=150, lora=False, args=(), keep=(), label=None,
              env=None):
        res = super().train(name, allocator, batch, timeout, lora, args, keep, label, env)
        if res["status"] == "ok":
            steps = int(args[args.index("--steps") + 1])
            slow = 1.01 if label == "planned" else 1.0
            res.update(step_ms=[100.0 * slow] * steps, seq_lens=[1000] * steps)
            if "--plan-out" in args:
                res["plan_profile"]["profiled_steps"] = steps - 1
            if label == "planned":
                res["plan_stats"]["unmatched"] = 0
        return res


def test_throughput_suite_profiles_once_per_batch_then_interleaves_planned(tmp_path):
    r = FakeThroughputRunner(tmp_path, lambda name: "oom" if name == "plan-profile-tp-b32" else "ok")
    run.suite_throughput(r, ("default", "planned"), plan=((16, 2), (32, 2)))
    names = [c[0] for c in r.cmds]
    # The profile runs before the batch's repetitions; the order rotates per repetition.
    assert names == ["plan-profile-tp-b16", "tp-default-b16-r1", "tp-planned-b16-r1",
                     "tp-planned-b16-r2", "tp-default-b16-r2",
                     "plan-profile-tp-b32", "tp-default-b32-r1", "tp-default-b32-r2"]
    prof = r.cmds[0]
    assert prof[1] == "ours" and prof[4][:2] == ["--plan-profile", "3"]
    assert prof[4][4:] == ["--no-probes", "--length-cycle", "8", "--steps", "4"]
    planned = r.cmds[2]
    assert planned[1] == "ours" and planned[4][-2:] == ["--plan", prof[4][3]]
    assert planned[4][:2] == ["--steps", "40"] and "--length-cycle" in planned[4]
    # Batch 32 has no plan: each repetition's planned run says why, nothing is started.
    no_plan = [x for x in r.results if x["run"].startswith("tp-planned-b32")]
    assert [x["status"] for x in no_plan] == ["no-plan", "no-plan"]
    assert "profile run (ours) oom" in no_plan[0]["why"]
    text = (r.out / "throughput.md").read_text()
    assert "| 16 | 1 | ok | 4108 | 4680 | 0 | 0 | 0 | 12.00 | 11.00 | 12.00 | 0.99 |" in text
    assert "| 32 | 2 | no-plan (profile run (ours) oom) | - | - | - | - | - | - |" in text
    assert ("- batch 16: ok (ours, steps 0..3), lengths 1000, 1000, 1000, 1000; the runs' longest "
            "length after step 0 is 1000: covered; synthesis 0.2 s, arena 12.00 GiB") in text
    assert "- batch 16, planned, steps repeated: median -1.0%, pooled -1.0%" in text
    assert "- batch 16: planned -1.0% against the default: met" in text
    assert "- batch 32: not measured" in text


def test_boundary_probe_reports_which_batches_fit(tmp_path):
    """`--suite planned --planned-configs 113,114 --allocators expandable`: per allocator the
    first batch that runs out of memory ends its climb; the largest-batch table says why."""
    import report

    fails = {"plan-profile-b114", "expandable-b113"}
    r = FakeRunner(tmp_path, lambda name: "oom" if name in fails else "ok")
    run.suite_planned(r, ("expandable",), run.planned_configs("113,114"), profile_steps=2,
                      profiler="ours-c2")
    assert [c[0] for c in r.cmds] == ["plan-profile-b113", "planned-b113", "plan-profile-b114",
                                      "expandable-b113"]
    prof = r.cmds[0]
    assert prof[1] == "ours-c2" and prof[4][:2] == ["--plan-profile", "2"]
    assert prof[4][-2:] == ["--steps", "3"]
    by_run = {x["run"]: x for x in r.results}
    assert by_run["planned-b114"]["status"] == "no-plan"
    assert by_run["expandable-b114"]["status"] == "skipped"
    assert "113 already ran out of memory" in by_run["expandable-b114"]["why"]
    assert report.largest_batch(r.results) == {"expandable": (None, 113), "planned": (113, 114)}
    md = report.markdown(r.results)
    assert "| batch (first failing: why) | none (113: oom) | 113 (114: no-plan) |" in md
    text = (r.out / "planned.md").read_text()
    assert "PLANNED b114: status no-plan (profile run (ours-c2) oom) eff no-plan" in text
    assert "| b114 | no-plan |" in text and "| oom (ours-c2) |" in text


def test_planned_options_are_checked_before_any_run(tmp_path, capsys):
    for argv, why in [
        (["--suite", "main", "--allocators", "default,planned"], "belongs to --suite throughput"),
        (["--suite", "planned", "--plan-profile-with", "default"], "ours or a variant"),
        (["--suite", "throughput", "--plan-profile-steps", "0"], "K >= 1"),
    ]:
        with pytest.raises(SystemExit):
            run.main(argv + ["--out", str(tmp_path / "x")])
        assert why in capsys.readouterr().err, argv
    assert not (tmp_path / "x").exists()


def test_merge_leaves_throughput_planned_runs_to_throughput_md(tmp_path):
    import json

    tp = tmp_path / "tp"
    tp.mkdir()
    res = {"run": "tp-planned-b16-r1", "allocator": "planned", "batch": 16, "model": "gpt2",
           "status": "ok", "peak_active": 11 * GIB, "peak_reserved": 12 * GIB, "efficiency": 0.99}
    (tp / "results.jsonl").write_text(json.dumps(res) + "\n")
    run.merge([tp], tmp_path / "out")
    assert not (tmp_path / "out" / "planned.md").exists()
    assert "ours, planned" in (tmp_path / "out" / "README_table.md").read_text()


def test_boundary_profiles_spill_so_a_batch_only_the_plan_fits_is_profiled(tmp_path):
    """The profiling process (and only it) runs with the spill on; a profile that spilled
    still gives a plan, and planned.md says how much it spilled. At 113 the online pool
    needs more than the GPU but the plan does not: the boundary search goes on to 114."""
    fails = {"plan-profile-b115", "expandable-b113"}
    r = FakeRunner(tmp_path, lambda name: "oom" if name in fails else "ok")
    train = r.train

    def spilling(name, *a, **k):
        res = train(name, *a, **k)
        if name == "plan-profile-b113" and res["status"] == "ok":
            res.update(spilled_peak=int(2.5 * GIB), spills=160)
        return res

    r.train = spilling
    run.suite_planned(r, ("expandable",), run.planned_configs("112,113,114,115"),
                      profile_steps=2, profiler="ours-c2")
    names = [c[0] for c in r.cmds]
    assert names == ["plan-profile-b112", "planned-b112", "plan-profile-b113", "planned-b113",
                     "plan-profile-b114", "planned-b114", "plan-profile-b115",
                     "expandable-b112", "expandable-b113"]
    for name in names:
        want = {"GPUMALLOC_SPILL_TO_HOST": "1"} if name.startswith("plan-profile-") else {}
        assert r.envs[name] == want, name
    text = (r.out / "planned.md").read_text()
    assert "| ok, spilled 2.50 GiB to host (ours-c2) |" in text
    assert "| ok (ours-c2) |" in text  # b112: nothing spilled, nothing said
    assert "PLANNED b113: status ok" in text
