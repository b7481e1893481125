"""GPU cases of the PyTorch allocator, one per function; `test_torch_gpu.py`
runs each in its own process (the allocator can be installed only before
CUDA's first allocation, and a failing case must not take the others down).

    python python/tests/gpu_cases.py CASE [ours|default]   # one case; exit 0 if it passes

Every case enables gpumalloc first, checks tensor contents, and prints one
line per fact it checked.
"""

import ctypes
import random
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import gpumalloc_torch  # noqa: E402

GiB = 1 << 30


def ours():
    return gpumalloc_torch.stats(0)


def case_oom_raises_and_training_continues():
    # A request larger than the GPU.
    try:
        torch.empty(200 * GiB, dtype=torch.uint8, device="cuda")
        raise AssertionError("200 GiB did not raise")
    except torch.cuda.OutOfMemoryError as e:
        msg = str(e)
        assert "gpumalloc: out of memory" in msg, msg
        assert "200.00 GiB" in msg, msg
        print("200 GiB raised OutOfMemoryError:", msg[:160])
    # Fill the GPU with 1 GiB tensors until it refuses, then go on.
    held = []
    try:
        while True:
            held.append(torch.full((GiB,), len(held) % 251, dtype=torch.uint8, device="cuda"))
            assert len(held) < 1000, "no OutOfMemoryError after 1000 GiB"
    except torch.cuda.OutOfMemoryError:
        pass
    n = len(held)
    assert n >= 40, f"only {n} GiB before OOM on an 80 GiB GPU"
    print(f"filled {n} GiB, then OutOfMemoryError")
    for i in range(0, n, max(1, n // 8)):
        assert int(held[i][12345]) == i % 251, "contents survive"
    del held[n // 2 :]
    x = torch.ones(4096, 4096, device="cuda")
    assert float((x @ x)[0, 0]) == 4096.0
    print("after freeing half, kernels run and allocate:", ours()["active"] // GiB, "GiB active")
    held.clear()
    # Training continues with a smaller batch after an OOM.
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = 4_000_000  # activations of ~64 GiB per layer: too large
    losses = []
    while len(losses) < 3:
        try:
            x = torch.randn(batch, 4096, device="cuda")
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(float(loss))
        except torch.cuda.OutOfMemoryError:
            print(f"batch {batch}: OutOfMemoryError, halving")
            batch //= 2
    assert batch < 4_000_000
    print(f"trained 3 steps at batch {batch}: losses {losses}")
    st = ours()
    assert st["ooms"] >= 2 and st["alloc_retries"] >= st["ooms"], st


def case_graph_capture_basic():
    a = torch.full((1 << 20,), 3.0, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            b = a * 2
            c = b + 1
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        b = a * 2
        c = b + 1
    g.replay()
    torch.cuda.synchronize()
    assert torch.all(c == 7.0), "first replay"
    # Eager memory taken after the capture never aliases the graph's.
    eager = [torch.full((1 << 20,), float(i), device="cuda") for i in range(16)]
    a.fill_(5.0)
    g.replay()
    torch.cuda.synchronize()
    assert torch.all(c == 11.0), "replay after eager allocations"
    for i, t in enumerate(eager):
        assert torch.all(t == float(i)), "eager tensor untouched by replay"
    print("capture and replay correct; eager tensors untouched")
    assert ours()["private_pools"] >= 1
    del b, c
    del g
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    st = ours()
    assert st["private_pools"] == 0 and st["private_free"] == 0, st
    print("graph deleted: its pool is gone", st["reserved"])


def case_graph_shared_pool_and_graphed_callables():
    pool = torch.cuda.graph_pool_handle()
    x = torch.randn(256, 512, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            y = (x * 2).relu()
            z = y.sum(dim=1)
    torch.cuda.current_stream().wait_stream(s)
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1, pool=pool):
        y = (x * 2).relu()
    with torch.cuda.graph(g2, pool=pool):
        z = y.sum(dim=1)
    for _ in range(5):
        x.copy_(torch.randn_like(x))
        g1.replay()
        g2.replay()
        torch.cuda.synchronize()
        assert torch.allclose(z, (x * 2).relu().sum(dim=1)), "shared-pool graphs"
    print("two graphs sharing a pool replay correctly")
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8)).cuda()
    ref = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8)).cuda()
    ref.load_state_dict(model.state_dict())
    sample = torch.randn(32, 64, device="cuda", requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(model, (sample,))
    for i in range(5):
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        inp = torch.randn(32, 64, device="cuda", requires_grad=True)
        out = graphed(inp)
        out.sum().backward()
        ref_inp = inp.detach().requires_grad_()
        want = ref(ref_inp)
        want.sum().backward()
        assert torch.allclose(out, want, atol=1e-5), f"forward {i}"
        assert torch.allclose(inp.grad, ref_inp.grad, rtol=1e-4, atol=1e-5), f"input grad {i}"
        for p, q in zip(model.parameters(), ref.parameters()):
            assert torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-4), f"param grad {i}"
    print("make_graphed_callables matches eager")


def case_context_and_device_restored():
    libcuda = ctypes.CDLL("libcuda.so.1")
    t = torch.ones(1 << 20, device="cuda")

    def current():
        ctx = ctypes.c_void_p()
        libcuda.cuCtxGetCurrent(ctypes.byref(ctx))
        return ctx.value

    seen = {}

    def worker():
        seen["before"] = current()
        box.pop()  # frees the tensor on this thread
        seen["after_free"] = current()

    box = [t]
    del t
    th = threading.Thread(target=worker)
    th.start()
    th.join()
    assert seen["before"] is None, seen
    assert seen["after_free"] is None, f"a free left a context bound on a fresh thread: {seen}"
    before = (current(), torch.cuda.current_device())
    x = torch.empty(3 << 20, device="cuda")
    del x
    assert (current(), torch.cuda.current_device()) == before
    print("context and device unchanged by malloc and free")


def case_stats_empty_cache_fraction():
    torch.cuda.reset_peak_memory_stats()
    ts = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (1000, 5 << 20, 300 << 20)]
    want = sum((t.numel() + 511) // 512 * 512 for t in ts)
    assert torch.cuda.memory_allocated() == want, (torch.cuda.memory_allocated(), want)
    assert torch.cuda.max_memory_allocated() >= want
    st = torch.cuda.memory_stats()
    assert st["requested_bytes.all.current"] == sum(t.numel() for t in ts), st
    assert torch.cuda.memory_reserved() >= want
    print("memory_allocated / memory_stats agree:", want)
    del ts
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == 0
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() == 0, torch.cuda.memory_reserved()
    print("empty_cache returns everything")
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_reserved() == 0
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(0.1)
    try:
        torch.empty(int(total * 0.2), dtype=torch.uint8, device="cuda")
        raise AssertionError("fraction not enforced")
    except torch.cuda.OutOfMemoryError as e:
        print("fraction 0.1 enforced:", str(e)[:120])
    ok = torch.empty(int(total * 0.05), dtype=torch.uint8, device="cuda")
    del ok
    torch.cuda.set_per_process_memory_fraction(1.0)
    print("stats, empty_cache, fraction: ok")


def case_record_stream_protects_memory():
    s0 = torch.cuda.current_stream()
    s1 = torch.cuda.Stream()
    n = 16 << 20
    for trial in range(5):
        t = torch.full((n,), 7.0, device="cuda")
        s1.wait_stream(s0)
        with torch.cuda.stream(s1):
            torch.cuda._sleep(50_000_000)
            out = t * 1.0
        t.record_stream(s1)
        del t
        t2 = torch.full((n,), -1.0, device="cuda")  # on s0, same size
        torch.cuda.synchronize()
        assert torch.all(out == 7.0), f"trial {trial}: memory reused before s1 finished"
        del t2, out
    print("record_stream kept the memory until the other stream finished")


def case_random_three_streams():
    rng = random.Random(4321)
    streams = [torch.cuda.Stream() for _ in range(3)]
    live = []
    for step in range(1500):
        s = streams[rng.randrange(3)]
        with torch.cuda.stream(s):
            if live and rng.random() < 0.45:
                t, fill, home, n = live.pop(rng.randrange(len(live)))
                user = streams[rng.randrange(3)]
                user.wait_stream(home)
                with torch.cuda.stream(user):
                    ok = torch.all(t == fill)
                    t.record_stream(user)
                assert ok.item(), f"step {step}: contents"
                del t, ok
            else:
                numel = rng.choice([1, 100, 3000, 70_000, 600_000, 3_000_000, 9_000_000])
                fill = float(step % 97)
                t = torch.full((numel,), fill, dtype=torch.float32, device="cuda")
                live.append((t, fill, s, numel * 4))
                del t
    torch.cuda.synchronize()
    st = ours()
    want = sum(n for *_, n in live)
    assert st["active"] == want, (st["active"], want)
    assert torch.cuda.memory_stats()["requested_bytes.all.current"] == want
    live.clear()
    torch.cuda.synchronize()
    assert ours()["active"] == 0
    print("1500 random steps on three streams: contents and statistics agree")


def case_fork_dataloader():
    keep = torch.ones(1 << 20, device="cuda")

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return torch.full((16,), float(i))

    loader = torch.utils.data.DataLoader(Data(), batch_size=8, num_workers=2, multiprocessing_context="fork")
    total = 0.0
    for batch in loader:
        total += float(batch.cuda().sum())
    assert total == 16 * sum(range(64)), total
    assert float(keep.sum()) == float(1 << 20)
    x = torch.empty(8 << 20, device="cuda")
    del x
    print("DataLoader with forked workers: fine")


def case_compile_reduce_overhead():
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)).cuda()
    compiled = torch.compile(model, mode="reduce-overhead")
    for i in range(6):
        x = torch.randn(64, 256, device="cuda")
        with torch.no_grad():
            got = compiled(x)
            want = model(x)
        assert torch.allclose(got, want, atol=1e-4), i
    print("torch.compile(mode='reduce-overhead') matches eager")


def case_trace_recording():
    import tempfile

    gpumalloc_torch.start_trace(0)
    for step in range(3):
        xs = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (1000, 3 << 20, 40 << 20)]
        del xs
        gpumalloc_torch.step(0)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "trace.bin"
        gpumalloc_torch.save_trace(path, 0)
        data = path.read_bytes()
    assert data[:8] == b"GMLKTRC\0", data[:8]
    count = int.from_bytes(data[24:32], "little")
    assert count == 18, count  # 3 steps x (3 allocs + 3 frees)
    print("trace recorded:", count, "events")


def case_two_devices():
    libcuda = ctypes.CDLL("libcuda.so.1")

    def current():
        ctx = ctypes.c_void_p()
        libcuda.cuCtxGetCurrent(ctypes.byref(ctx))
        return ctx.value

    assert torch.cuda.device_count() >= 2, "needs two GPUs"
    a = torch.full((1 << 22,), 3.0, device="cuda:0")
    b = torch.full((1 << 22,), 5.0, device="cuda:1")
    torch.cuda.set_device(0)
    ctx0 = current()
    box = [b]

    def worker():
        # A thread working on cuda:0 frees a cuda:1 tensor.
        torch.cuda.set_device(0)
        x = torch.ones(16, device="cuda:0")
        before = current()
        box.pop()
        seen["after"] = current()
        seen["before"] = before
        seen["device"] = torch.cuda.current_device()
        del x

    seen = {}
    del b
    th = threading.Thread(target=worker)
    th.start()
    th.join()
    assert seen["after"] == seen["before"] and seen["device"] == 0, seen
    assert current() == ctx0 and torch.cuda.current_device() == 0
    c = a.to("cuda:1") + 1.0
    assert torch.all(c == 4.0) and c.device.index == 1
    assert torch.all(c.to("cuda:0") == 4.0)
    s0, s1 = gpumalloc_torch.stats(0), gpumalloc_torch.stats(1)
    assert s0["active"] >= a.numel() * 4 and s1["active"] >= c.numel() * 4, (s0, s1)
    assert torch.cuda.memory_allocated(1) >= c.numel() * 4
    print("two devices: separate pools, contexts kept, copies correct")


CASES = {name[len("case_") :]: f for name, f in globals().items() if name.startswith("case_")}


def main():
    name = sys.argv[1]
    allocator = sys.argv[2] if len(sys.argv) > 2 else "ours"
    if allocator == "ours":
        gpumalloc_torch.enable()
        assert gpumalloc_torch.is_enabled()
    else:
        # PyTorch's own allocator: checks that a case tests the allocator,
        # not PyTorch (cases reading our statistics fail here by design).
        globals()["ours"] = lambda: {"private_pools": 0, "private_free": 0, "reserved": 0, "ooms": 9, "alloc_retries": 9, "active": 0}
    CASES[name]()
    print(f"PASS {name}")


if __name__ == "__main__":
    main()
