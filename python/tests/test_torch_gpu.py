"""GPU tests of gpumalloc as PyTorch's CUDA allocator (issue 10): each case
of `gpu_cases.py` in its own process. Skipped, with the reason, without
torch, without a CUDA device, or without the built library.

    cargo build --release -p torch-alloc && python -m pytest python/tests
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpumalloc_torch  # noqa: E402

HERE = Path(__file__).resolve().parent

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    pytest.mark.skipif(
        not Path(gpumalloc_torch.default_path()).exists(),
        reason="libgpumalloc_torch.so not built (cargo build --release -p torch-alloc)",
    ),
]

CASES = {
    "oom_raises_and_training_continues": 300,
    "graph_capture_basic": 120,
    "graph_shared_pool_and_graphed_callables": 120,
    "context_and_device_restored": 120,
    "stats_empty_cache_fraction": 120,
    "record_stream_protects_memory": 120,
    "random_three_streams": 180,
    "fork_dataloader": 120,
    "compile_reduce_overhead": 300,
    "trace_recording": 120,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_case(case):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    r = subprocess.run(
        [sys.executable, str(HERE / "gpu_cases.py"), case],
        capture_output=True,
        text=True,
        timeout=CASES[case],
        env=env,
    )
    print(r.stdout[-4000:])
    print(r.stderr[-4000:], file=sys.stderr)
    assert r.returncode == 0 and f"PASS {case}" in r.stdout, (
        f"{case} failed (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    )


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_devices():
    r = subprocess.run(
        [sys.executable, str(HERE / "gpu_cases.py"), "two_devices"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    print(r.stdout[-2000:])
    assert r.returncode == 0 and "PASS two_devices" in r.stdout, (
        f"two_devices failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    )


def _gpt2(allocator, mode):
    pytest.importorskip("transformers", reason="transformers is not installed")
    r = subprocess.run(
        [sys.executable, str(HERE / "gpt2_graph.py"), "--allocator", allocator, "--mode", mode],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    assert r.returncode == 0, f"gpt2 {allocator} {mode} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    import json

    return json.loads(r.stdout.strip().splitlines()[-1])["losses"]


def test_gpt2_step_captured_in_a_graph_matches_eager():
    eager = _gpt2("default", "eager")
    graphed = _gpt2("ours", "graph")
    print("eager (PyTorch allocator):", eager)
    print("graph replays (gpumalloc):", graphed)
    assert len(eager) == len(graphed) == 20
    for i, (e, g) in enumerate(zip(eager, graphed)):
        assert abs(e - g) <= 1e-3 * max(1.0, abs(e)), f"step {i + 3}: {e} vs {g}"
