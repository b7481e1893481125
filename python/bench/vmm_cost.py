#!/usr/bin/env python3
"""Cost of the CUDA VMM driver calls the lake makes, to calibrate its cost model.

    python3 python/bench/vmm_cost.py [--reps 60] [--json-out FILE]

Times, with `time.perf_counter_ns` around each single call (so the Python
binding's overhead is included; it is measured too, as `noop_binding`, a
`cuCtxGetCurrent` call, and can be subtracted):

  cuMemCreate         one 2 MiB chunk (device memory, pinned)
  cuMemAddressReserve a range of n chunks (n = 1, 16, 256)
  cuMemMap            one chunk into that range, n calls per repetition
                      (and their sum per repetition)
  cuMemSetAccess      the whole range of n mapped chunks as ONE call
  cuMemUnmap          one chunk, n calls per repetition (and, once per n,
                      one call over the whole range, reported if it works)
  cuMemRelease        one chunk handle
  cuMemAddressFree    the range
  cuEventRecord / cuEventQuery (completed event) on a created stream

Median, p10, p90 in microseconds per call over >= --reps repetitions after
--warmup repetitions. Prints a table and one "VMM_JSON {...}" line.
Uses `cuda.bindings.driver` (cuda-bindings >= 12.6), else `cuda.cuda`.
"""

import argparse
import json
import statistics
import sys
import time

CHUNK = 2 * 1024 * 1024

try:
    from cuda.bindings import driver as cu
    BINDING = "cuda.bindings.driver"
except ImportError:  # older cuda-python
    try:
        from cuda import cuda as cu
        BINDING = "cuda.cuda"
    except ImportError:  # no cuda-python: main() says so; tests use a fake
        cu = None
        BINDING = None


class DriverError(RuntimeError):
    pass


def check(ret, what):
    """Unpacks a binding's (CUresult, values...) tuple; raises with the driver's name."""
    if isinstance(ret, tuple):
        err, rest = ret[0], ret[1:]
    else:
        err, rest = ret, ()
    if int(err) != 0:
        try:
            name = cu.cuGetErrorName(err)[1]
            name = name.decode() if isinstance(name, bytes) else str(name)
        except Exception:
            name = str(err)
        raise DriverError(f"{what} failed: {name} ({int(err)})")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


def timed(fn, *args):
    t0 = time.perf_counter_ns()
    ret = fn(*args)
    return ret, (time.perf_counter_ns() - t0) / 1000.0


def summary(samples):
    s = sorted(samples)
    n = len(s)
    return {"median_us": round(statistics.median(s), 3), "p10_us": round(s[n // 10], 3),
            "p90_us": round(s[(9 * n) // 10], 3), "n": n}


def setup(device):
    check(cu.cuInit(0), "cuInit")
    dev = check(cu.cuDeviceGet(device), "cuDeviceGet")
    ctx = check(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    name = check(cu.cuDeviceGetName(256, dev), "cuDeviceGetName")
    name = name.split(b"\0")[0].decode() if isinstance(name, bytes) else str(name)
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device
    gran = check(cu.cuMemGetAllocationGranularity(
        prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "cuMemGetAllocationGranularity")
    desc = cu.CUmemAccessDesc()
    desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = device
    desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    return dev, ctx, name, prop, int(gran), desc


def one_rep(n, prop, desc, acc, try_range_unmap=False):
    """Creates n chunks, maps them into one range, sets access, tears down; appends timings."""
    handles = []
    for _ in range(n):
        h, us = timed(cu.cuMemCreate, CHUNK, prop, 0)
        handles.append(check(h, "cuMemCreate"))
        acc["cuMemCreate"].append(us)
    ret, us = timed(cu.cuMemAddressReserve, n * CHUNK, CHUNK, 0, 0)
    base = int(check(ret, "cuMemAddressReserve"))
    acc[f"cuMemAddressReserve[{n}]"].append(us)
    total = 0.0
    for i, h in enumerate(handles):
        ret, us = timed(cu.cuMemMap, base + i * CHUNK, CHUNK, 0, h, 0)
        check(ret, "cuMemMap")
        acc[f"cuMemMap[1 of {n}]"].append(us)
        total += us
    if n > 1:
        acc[f"cuMemMap[all {n}, sum per rep]"].append(total)
    ret, us = timed(cu.cuMemSetAccess, base, n * CHUNK, [desc], 1)
    check(ret, "cuMemSetAccess")
    acc[f"cuMemSetAccess[{n} chunks, one call]"].append(us)
    # Touch the range so the mapping is really in use.
    check(cu.cuMemsetD8(base, 1, n * CHUNK), "cuMemsetD8")
    check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    unmapped = False
    if try_range_unmap and n > 1:
        ret, us = timed(cu.cuMemUnmap, base, n * CHUNK)
        err = ret[0] if isinstance(ret, tuple) else ret
        if int(err) == 0:
            acc[f"cuMemUnmap[{n} chunks, one call]"].append(us)
            unmapped = True
        else:
            acc.setdefault("notes", []).append(f"cuMemUnmap over {n} mappings in one call: error {int(err)}")
    if not unmapped:
        total = 0.0
        for i in range(n):
            ret, us = timed(cu.cuMemUnmap, base + i * CHUNK, CHUNK)
            check(ret, "cuMemUnmap")
            acc[f"cuMemUnmap[1 of {n}]"].append(us)
            total += us
        if n > 1:
            acc[f"cuMemUnmap[all {n}, sum per rep]"].append(total)
    for h in handles:
        ret, us = timed(cu.cuMemRelease, h)
        check(ret, "cuMemRelease")
        acc["cuMemRelease"].append(us)
    ret, us = timed(cu.cuMemAddressFree, base, n * CHUNK)
    check(ret, "cuMemAddressFree")
    acc[f"cuMemAddressFree[{n}]"].append(us)


def big_handle_rep(n, prop, desc, acc):
    """One handle of n chunks: created once, mapped (a) whole in one call and
    (b) chunk by chunk through the offset argument; access set over the
    range. Tells whether cuMemSetAccess costs per mapping or per byte."""
    size = n * CHUNK
    h, us = timed(cu.cuMemCreate, size, prop, 0)
    h = check(h, "cuMemCreate")
    acc[f"cuMemCreate[one handle of {n} chunks]"].append(us)
    base = int(check(cu.cuMemAddressReserve(size, CHUNK, 0, 0), "cuMemAddressReserve"))
    ret, us = timed(cu.cuMemMap, base, size, 0, h, 0)
    check(ret, "cuMemMap")
    acc[f"cuMemMap[one handle of {n} chunks, whole]"].append(us)
    ret, us = timed(cu.cuMemSetAccess, base, size, [desc], 1)
    check(ret, "cuMemSetAccess")
    acc[f"cuMemSetAccess[one mapping of {n} chunks]"].append(us)
    check(cu.cuMemsetD8(base, 1, size), "cuMemsetD8")
    check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    ret, us = timed(cu.cuMemUnmap, base, size)
    check(ret, "cuMemUnmap")
    acc[f"cuMemUnmap[one mapping of {n} chunks]"].append(us)
    # (b) the same handle mapped chunk by chunk at offsets.
    try:
        for i in range(n):
            ret, us = timed(cu.cuMemMap, base + i * CHUNK, CHUNK, i * CHUNK, h, 0)
            check(ret, "cuMemMap(offset)")
            acc[f"cuMemMap[one chunk at an offset of a {n}-chunk handle]"].append(us)
        ret, us = timed(cu.cuMemSetAccess, base, size, [desc], 1)
        check(ret, "cuMemSetAccess")
        acc[f"cuMemSetAccess[{n} offset mappings of one handle]"].append(us)
        check(cu.cuMemsetD8(base, 2, size), "cuMemsetD8")
        check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        for i in range(n):
            check(cu.cuMemUnmap(base + i * CHUNK, CHUNK), "cuMemUnmap")
    except DriverError as e:
        acc.setdefault("notes", []).append(f"offset mapping of a {n}-chunk handle: {e}")
        check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    ret, us = timed(cu.cuMemRelease, h)
    check(ret, "cuMemRelease")
    acc[f"cuMemRelease[one handle of {n} chunks]"].append(us)
    check(cu.cuMemAddressFree(base, size), "cuMemAddressFree")


class Acc(dict):
    def __missing__(self, key):
        self[key] = []
        return self[key]


def bench(device, reps, warmup, event_reps):
    dev, ctx, name, prop, gran, desc = setup(device)
    out = {"device": name, "binding": BINDING, "granularity": gran, "chunk": CHUNK,
           "reps": reps, "warmup": warmup}
    if gran > CHUNK or CHUNK % gran:
        raise DriverError(f"granularity {gran} does not divide the 2 MiB chunk")
    acc = Acc()
    for _ in range(max(200, reps)):
        _, us = timed(cu.cuCtxGetCurrent)
        acc["noop_binding(cuCtxGetCurrent)"].append(us)
    for n in (1, 16, 256):
        scratch = Acc()
        for _ in range(warmup):
            one_rep(n, prop, desc, scratch)
        reps_n = reps
        t0 = time.time()
        for r in range(reps_n):
            one_rep(n, prop, desc, acc, try_range_unmap=(r == reps_n - 1))
        print(f"  n={n}: {reps_n} reps in {time.time() - t0:.1f}s", flush=True)
        out.setdefault("notes", []).extend(scratch.get("notes", []))
    for n in (16, 256):
        scratch = Acc()
        big_handle_rep(n, prop, desc, scratch)
        for _ in range(max(5, reps // 6)):
            big_handle_rep(n, prop, desc, acc)
        out.setdefault("notes", []).extend(scratch.get("notes", []))
        out["notes"].extend(acc.pop("notes", []))
    # Events on a non-default stream.
    stream = check(cu.cuStreamCreate(1), "cuStreamCreate")  # CU_STREAM_NON_BLOCKING
    ev = check(cu.cuEventCreate(int(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)), "cuEventCreate")
    for i in range(event_reps + 100):
        ret, us_rec = timed(cu.cuEventRecord, ev, stream)
        check(ret, "cuEventRecord")
        check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
        ret, us_q = timed(cu.cuEventQuery, ev)
        check(ret, "cuEventQuery")
        if i >= 100:
            acc["cuEventRecord"].append(us_rec)
            acc["cuEventQuery(completed)"].append(us_q)
    for i in range(event_reps):
        ret, us = timed(cu.cuEventRecord, ev, stream)
        check(ret, "cuEventRecord")
        ret, us2 = timed(cu.cuEventQuery, ev)  # usually complete already: empty stream
        acc["cuEventRecord+cuEventQuery(back to back)"].append(us + us2)
    check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
    check(cu.cuEventDestroy(ev), "cuEventDestroy")
    check(cu.cuStreamDestroy(stream), "cuStreamDestroy")
    notes = acc.pop("notes", [])
    out["notes"] = out.get("notes", []) + notes
    out["calls"] = {k: summary(v) for k, v in acc.items()}
    check(cu.cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease")
    return out


def table(out):
    lines = [f"VMM call costs on {out['device']} ({out['binding']}, granularity {out['granularity']} B),"
             " microseconds per call incl. Python binding overhead", "",
             f"{'call':48s} {'median':>9s} {'p10':>9s} {'p90':>9s} {'n':>7s}"]
    for k, s in out["calls"].items():
        lines.append(f"{k:48s} {s['median_us']:9.2f} {s['p10_us']:9.2f} {s['p90_us']:9.2f} {s['n']:7d}")
    for note in out.get("notes", []):
        lines.append(f"note: {note}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--reps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--event-reps", type=int, default=1000)
    p.add_argument("--json-out", default=None)
    if cu is None:
        sys.exit("vmm_cost: needs cuda-python (pip install cuda-python): no cuda.bindings here")
    args = p.parse_args(argv)
    try:
        out = bench(args.device, args.reps, args.warmup, args.event_reps)
        out["status"] = "ok"
        print(table(out), flush=True)
    except Exception as e:  # the runner records the failure as a result
        out = {"status": "error", "error": repr(e), "binding": BINDING}
        print(f"vmm_cost failed: {e!r}", flush=True)
    line = json.dumps(out, sort_keys=True)
    print("VMM_JSON " + line, flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(line + "\n")
    return 0 if out["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
