"""CPU tests of the benchmark's pure parts: PyTorch trace entries -> the lake's
binary trace ("GMLKTRC" v1, lake/src/trace.rs), result tables and the
loss check, and vmm_cost's call sequence against a fake driver. No torch, no
GPU:

    python3 -m pytest python/tests/test_bench.py
"""

import gzip
import json
import struct
import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import report  # noqa: E402
import tracefmt  # noqa: E402

GIB = 1024 ** 3


def entry(action, addr, size, stream=0, t=0.0):
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": t,
            "frames": []}


def synthetic_trace():
    """Two steps of a toy training loop as PyTorch's snapshot would list them."""
    e = [entry("segment_alloc", 0x1000_0000, 20 * 2 ** 20, t=1.0),
         entry("alloc", 0x1000_0000, 4096, t=2.0)]                       # weights, step -1
    for step in range(2):
        base = 10.0 + 100 * step
        m = tracefmt.marker_size(step)
        e += [entry("alloc", 0x2000_0000, m, t=base), entry("free_requested", 0x2000_0000, m, t=base + 1),
              entry("free_completed", 0x2000_0000, m, t=base + 1),
              entry("alloc", 0x3000_0000, 1000 + step, t=base + 2),
              entry("alloc", 0x4000_0000, 777, stream=555, t=base + 3),
              entry("free_requested", 0x3000_0000, 1000 + step, t=base + 4),
              entry("free_completed", 0x3000_0000, 1000 + step, t=base + 4.5),
              entry("free_requested", 0x4000_0000, 777, stream=555, t=base + 5)]
    e.append(entry("free_requested", 0x5000_0000, 64, t=300.0))              # never allocated
    e.append({"action": "oom", "size": 1 << 40, "device_free": 0, "stream": 0, "time_us": 301.0})
    return e


def test_marker_sizes_round_trip_and_are_512_multiples():
    for step in (0, 1, 5, 100):
        size = tracefmt.marker_size(step)
        assert size % 512 == 0
        assert tracefmt.marker_step(size) == step
    assert tracefmt.marker_step(tracefmt.MARKER_BASE - 512) is None
    assert tracefmt.marker_step(tracefmt.MARKER_BASE + 1) is None


def test_convert_maps_actions_phases_streams_and_drops_markers():
    recs, starts, info = tracefmt.convert(synthetic_trace(), first_stream=0)
    kinds = [r[0] for r in recs]
    # weights alloc + 2 steps x (2 allocs + 2 frees); markers, unmatched free, others dropped
    assert kinds == [1] + [1, 1, 2, 2] * 2
    assert info["markers"] == 2 and info["unmatched_frees"] == 1
    assert info["ignored_actions"] == {"segment_alloc": 1, "free_completed": 4, "oom": 1}
    assert starts == {0: 1, 1: 5}
    assert [r[4] for r in recs] == [0, 0, 0, 0, 0, 1, 1, 1, 1]          # phase = step
    assert {r[3] for r in recs if r[2] == 0x4000_0000} == {1}            # second stream -> 1
    assert {r[3] for r in recs if r[2] != 0x4000_0000} == {0}
    # a free carries its alloc's size; times are ns since the first kept entry
    assert recs[3][:3] == (2, 1000, 0x3000_0000)
    assert recs[0][5] == 0 and recs[1][5] == int((12.0 - 2.0) * 1000)
    assert info["live_at_end"] == 1                                     # the weights
    assert tracefmt.replay_peak(recs) == (4096 + 1001 + 777, 4096)


def test_binary_layout_matches_trace_rs():
    recs, _, _ = tracefmt.convert(synthetic_trace())
    data = tracefmt.encode(recs)
    assert data[:8] == b"GMLKTRC\0"
    version, rec_bytes, gran, count = struct.unpack_from("<IIQQ", data, 8)
    assert (version, rec_bytes, gran, count) == (1, 33, 2 * 2 ** 20, len(recs))
    assert len(data) == 32 + 33 * len(recs)
    kind, size, addr, stream, phase, t = struct.unpack_from("<BQQIIQ", data, 32 + 33 * 3)
    assert (kind, size, addr, stream, phase) == (2, 1000, 0x3000_0000, 0, 0)
    gran2, back = tracefmt.decode(data)
    assert gran2 == gran and back == [tuple(r) for r in recs]


def test_decode_rejects_bad_bytes():
    data = tracefmt.encode([(1, 8, 16, 0, 0, 0)])
    with pytest.raises(ValueError):
        tracefmt.decode(b"XMLKTRC\0" + data[8:])
    with pytest.raises(ValueError):
        tracefmt.decode(data[:-1])
    bad = bytearray(data)
    bad[32] = 3
    with pytest.raises(ValueError):
        tracefmt.decode(bytes(bad))


def test_gzip_files(tmp_path):
    entries = synthetic_trace()
    recs, _, _ = tracefmt.convert(entries)
    p = tmp_path / "t.trace.gz"
    tracefmt.write_binary_gz(p, recs)
    assert tracefmt.decode(gzip.decompress(p.read_bytes()))[1] == [tuple(r) for r in recs]
    q = tmp_path / "t.raw.json.gz"
    tracefmt.write_raw_gz(q, entries, {"batch": 16})
    doc = json.loads(gzip.decompress(q.read_bytes()))
    assert doc["meta"] == {"batch": 16} and len(doc["rows"]) == len(entries)
    assert doc["rows"][1] == ["alloc", 0x1000_0000, 4096, 0, 2.0]


def result(alloc, batch, reserved, active, losses, status="ok", model="gpt2", run=None):
    return {"allocator": alloc, "batch": batch, "model": model, "status": status,
            "peak_reserved": int(reserved * GIB), "peak_active": int(active * GIB),
            "efficiency": round(active / reserved, 4) if reserved else None,
            "tokens_per_s": 100000.0, "losses": losses, "run": run or f"{alloc}-b{batch}",
            "gpu": "NVIDIA H100 80GB HBM3"}


def test_markdown_table_and_largest_batch():
    res = [result("default", 16, 15.03, 11.04, [1.0, 2.0]),
           result("expandable", 16, 13.25, 11.04, [1.0, 2.0]),
           result("default", 96, 0, 0, [], status="oom", run="sweep-default-b96"),
           result("default", 80, 70, 50, [1.0], run="sweep-default-b80")]
    md = report.markdown(res)
    assert "| gpt2 | 16 | 11.04 | 15.03, 0.735, 100.0k tok/s | 13.25, 0.833, 100.0k tok/s (+0.0%) |" in md
    assert "sweep" not in md
    assert report.largest_batch(res) == {"default": (80, 96), "expandable": (16, None)}
    assert "80 (96: oom)" in md and "16 (none failed)" in md
    text = report.csv_text(report.rows(res))
    assert text.splitlines()[0].startswith("run,allocator,model,batch")
    assert len(text.splitlines()) == 5


def test_loss_check_pass_fail_and_skip():
    base = [1.0, 2.0, 3.0]
    res = [result("default", 16, 15, 11, base),
           result("ours", 16, 12, 11, [1.0, 2.0, 3.0005]),
           result("expandable", 16, 13, 11, [1.0, 2.0, 3.01]),
           result("ours", 32, 0, 0, [], status="crash")]
    check = report.loss_check(res)
    assert check["pass"] is False
    by = {i["name"]: i["pass"] for i in check["items"]}
    assert by == {"ours gpt2 b16": True, "expandable gpt2 b16": False, "ours gpt2 b32": None}
    assert report.loss_check(res[:2])["pass"] is True
    assert "PASS" in report.loss_check(res[:2])["text"]


def test_one_line_survives_a_crash_result():
    assert "crash" in report.one_line({"run": "x", "status": "crash", "error": "boom"})


def test_timeline_png(tmp_path):
    pytest.importorskip("matplotlib")
    tl = tmp_path / "tl.json"
    tl.write_text(json.dumps({"batch": 16, "step_start_s": [0.0, 1.0], "samples": [
        {"t": 0.1, "active": GIB, "reserved": 2 * GIB}, {"t": 1.2, "active": 3 * GIB, "reserved": 4 * GIB}]}))
    png = tmp_path / "m.png"
    assert report.plot_timelines({"default": tl}, png) == 1
    assert png.read_bytes()[:4] == b"\x89PNG"


class FakeDriver:
    """Just enough of cuda.bindings.driver for vmm_cost's sequence, with checks."""

    def __init__(self):
        self.mapped = {}
        self.reserved = {}
        self.handles = set()
        self.next_va = 1 << 40
        self.next_h = 1
        ns = types.SimpleNamespace
        self.CUmemAllocationType = ns(CU_MEM_ALLOCATION_TYPE_PINNED=1)
        self.CUmemLocationType = ns(CU_MEM_LOCATION_TYPE_DEVICE=1)
        self.CUmemAllocationGranularity_flags = ns(CU_MEM_ALLOC_GRANULARITY_MINIMUM=0)
        self.CUmemAccess_flags = ns(CU_MEM_ACCESS_FLAGS_PROT_READWRITE=3)
        self.CUevent_flags = ns(CU_EVENT_DISABLE_TIMING=2)

    def __getattr__(self, name):
        if name in ("CUmemAllocationProp", "CUmemAccessDesc"):
            return lambda: types.SimpleNamespace(location=types.SimpleNamespace())
        if name.startswith("cu"):
            return lambda *a: (0, None)
        raise AttributeError(name)

    def cuDeviceGetName(self, n, dev):
        return 0, b"Fake GPU\0\0"

    def cuMemGetAllocationGranularity(self, prop, flag):
        return 0, 2 * 2 ** 20

    def cuMemCreate(self, size, prop, flags):
        assert size % (2 * 2 ** 20) == 0 and prop.location.type == 1
        self.next_h += 1
        self.handles.add(self.next_h)
        return 0, self.next_h

    def cuMemAddressReserve(self, size, align, addr, flags):
        va = self.next_va
        self.next_va += size
        self.reserved[va] = size
        return 0, va

    def cuMemMap(self, ptr, size, off, h, flags):
        assert h in self.handles and ptr not in self.mapped
        self.mapped[ptr] = size
        return (0,)

    def cuMemSetAccess(self, ptr, size, descs, count):
        assert count == len(descs) == 1 and ptr in self.reserved and size == self.reserved[ptr]
        return (0,)

    def cuMemUnmap(self, ptr, size):
        if ptr not in self.mapped or self.mapped[ptr] != size:
            return (1,)  # the real driver's answer to a range over several mappings is unknown
        del self.mapped[ptr]
        return (0,)

    def cuMemRelease(self, h):
        self.handles.remove(h)
        return (0,)

    def cuMemAddressFree(self, ptr, size):
        assert self.reserved.pop(ptr) == size
        return (0,)


def test_vmm_cost_sequence_on_a_fake_driver(capsys):
    import vmm_cost

    fake = FakeDriver()
    real = vmm_cost.cu
    vmm_cost.cu = fake
    try:
        out = vmm_cost.bench(0, reps=3, warmup=1, event_reps=5)
    finally:
        vmm_cost.cu = real
    assert not fake.mapped and not fake.reserved and not fake.handles
    assert out["calls"]["cuMemSetAccess[256 chunks, one call]"]["n"] == 3
    assert out["calls"]["cuMemMap[1 of 16]"]["n"] == 16 * 3
    assert out["calls"]["cuMemCreate"]["n"] == (1 + 16 + 256) * 3
    assert out["calls"]["cuMemSetAccess[one mapping of 256 chunks]"]["n"] == 5
    assert out["calls"]["cuMemMap[one chunk at an offset of a 16-chunk handle]"]["n"] == 16 * 5
    assert "Fake GPU" in vmm_cost.table(out)


def test_step_lengths_are_seeded_and_in_range():
    import train_gpt2  # imports torch only inside run()

    a = train_gpt2.step_lengths(1234, 6, 1024, 256)
    assert a == train_gpt2.step_lengths(1234, 6, 1024, 256)
    assert len(a) == 6 and all(769 <= n <= 1024 for n in a)
    assert train_gpt2.step_lengths(1234, 3, 1024, 0) == [1024] * 3


def test_write_trace_with_a_fake_torch(tmp_path):
    """train_gpt2.write_trace end to end on a stand-in for torch.cuda's snapshot API."""
    import train_gpt2

    calls = []
    memory = types.SimpleNamespace(
        _snapshot=lambda: {"segments": [], "device_traces": [synthetic_trace()]},
        _record_memory_history=lambda *a, **k: calls.append((a, k)))
    cuda = types.SimpleNamespace(memory=memory, current_device=lambda: 0,
                                 current_stream=lambda: types.SimpleNamespace(cuda_stream=0))
    torch = types.SimpleNamespace(cuda=cuda)
    args = types.SimpleNamespace(trace_out=str(tmp_path / "t.trace.gz"),
                                 raw_trace_out=str(tmp_path / "t.raw.json.gz"), trace_max_entries=100)
    result = {"allocator": "default", "batch": 16, "losses": [1.0]}
    train_gpt2.write_trace(torch, args, result, [0.0, 1.0])
    assert calls == [((), {"enabled": None})]
    assert result["trace"]["records"] == 9 and result["trace"]["markers"] == 2
    gran, recs = tracefmt.decode(gzip.decompress((tmp_path / "t.trace.gz").read_bytes()))
    assert len(recs) == 9
    doc = json.loads(gzip.decompress((tmp_path / "t.raw.json.gz").read_bytes()))
    assert doc["meta"]["step_starts_in_records"] == {"0": 1, "1": 5}
    assert train_gpt2.start_history(torch, 5).startswith("enabled='all'")
    assert calls[-1] == ((), {"enabled": "all", "context": None, "stacks": "python", "max_entries": 5})


def test_markdown_lists_ours_breakdown_at_peak():
    r = result("ours", 16, 12, 11, [1.0])
    r["at_peak_reserved_sample"] = {"active": 11 * GIB, "reserved": 12 * GIB, "label": "attn3",
                                    "fragmentation": 0.08, "driver_calls": 12345}
    md = report.markdown([r])
    assert "- gpt2 b16 (at attn3): active 11.00, driver_calls 12345, fragmentation 0.08, reserved 12.00" in md


def test_allocator_variants_set_the_pool_environment():
    import run
    assert run.allocator_variant("ours") == ("ours", {})
    assert run.allocator_variant("ours-c16") == ("ours", {"GPUMALLOC_CHUNK_MIB": "16"})
    assert run.allocator_variant("ours-c16-r0") == (
        "ours", {"GPUMALLOC_CHUNK_MIB": "16", "GPUMALLOC_REUSE_ENTRIES": "0"})
    # Unknown suffixes and other allocators are left as they are (and refused by main()).
    assert run.allocator_variant("ours-x1") == ("ours-x1", {})
    assert run.allocator_variant("default-c16") == ("default-c16", {})


def test_step_lengths_cycle():
    import train_gpt2
    a = train_gpt2.step_lengths(1234, 20, 1024, 256, cycle=8)
    assert a[:8] == train_gpt2.step_lengths(1234, 8, 1024, 256)
    assert all(a[i] == a[i % 8] for i in range(20))


def test_throughput_report_shows_ours_call_detail():
    import run

    def result(detail):
        r = {"step_ms": [100.0] * 12, "seq_lens": [1000] * 12}
        if detail:
            r["step_call_detail"] = {
                "alloc_call_ns": [2000] * 12, "free_call_ns": [1000] * 12, "alloc_calls": [2] * 12,
                "free_calls": [1] * 12, "slow_calls": [0] * 12, "slow_call_ns": [0] * 12,
                "thread_switches": [1] * 12}
        return r
    runs = [(16, 1, "default", result(False)), (16, 1, "ours", result(True))]
    text = run.throughput_report(runs, ((1, 3, "new lengths"), (4, 11, "repeated")), 4)
    # 2000 ns over 2 allocations = 1.00 µs; 1000 ns over 1 free = 1.00 µs; 3 calls per step.
    assert "| 16 | 1 | ours | 1.00 | 1.00 | 3 | 0.0 | 0.00 | 1 |" in text
    assert run.call_detail_line(16, 1, "default", result(False), 4) is None
