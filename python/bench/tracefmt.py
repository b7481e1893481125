"""PyTorch allocation traces -> the lake's binary trace format ("GMLKTRC" v1).

Pure Python (no torch): `train_gpt2.py` hands in the `device_traces[0]` list of
`torch.cuda.memory._snapshot()`, the tests hand in dicts of the same shape.

Binary format, as lake/src/trace.rs reads it, all little-endian:

    header  magic b"GMLKTRC\\0" (8) | version u32 = 1 | record bytes u32 = 33
            | granularity u64 | record count u64
    record  kind u8 (1 alloc, 2 free) | size u64 | addr u64 | stream u32
            | phase u32 | time ns since the first kept entry u64

Mapping of PyTorch's trace actions:
  * 'alloc'          -> kind 1 (alloc)
  * 'free_requested' -> kind 2 (free): the moment the tensor was freed
  * every other action ('free_completed', 'segment_alloc', 'segment_free',
    'segment_map', 'segment_unmap', 'snapshot', 'oom', ...) is dropped.

Sizes: the entry's `size` as PyTorch recorded it. For the caching allocator
of PyTorch 2.x an 'alloc' entry carries the size the caller asked for
(`orig_size`, not rounded to 512 bytes); a 'free_requested' entry carries the
block's requested size too. Which one it is cannot be seen from Python, so
`convert` gives a free the size of its matching alloc (the pairing is by
address), and the raw dump keeps PyTorch's own numbers.

Step marks: the training script allocates, at the start of each step, one
marker tensor of `marker_size(step)` bytes and frees it at once. `convert`
finds each alloc of a marker size that is followed immediately by the free of
the same address, drops both, and tags every later record with that step as
its phase (records before the first mark get phase 0). Step start indices
into the kept records come back too.
"""

import gzip
import json
import struct

MAGIC = b"GMLKTRC\0"
VERSION = 1
RECORD_BYTES = 33
HEADER_BYTES = 32
GRANULARITY = 2 * 1024 * 1024
KIND_ALLOC = 1
KIND_FREE = 2

_HEADER = struct.Struct("<8sIIQQ")
_RECORD = struct.Struct("<BQQIIQ")
assert _HEADER.size == HEADER_BYTES and _RECORD.size == RECORD_BYTES

# Marker tensors: a multiple of 512 (PyTorch's rounding, so the recorded size
# is the same whether or not it is rounded), odd enough never to be a real
# tensor of GPT-2 (6,510 * 512 bytes + 512 per step).
MARKER_BASE = 6510 * 512
MARKER_STEPS = 4096


def marker_size(step):
    """Bytes of the marker tensor allocated at the start of `step`."""
    return MARKER_BASE + 512 * step


def marker_step(size):
    """The step a marker of `size` bytes marks, or None if it is no marker size."""
    off = size - MARKER_BASE
    if off < 0 or off % 512 or off // 512 >= MARKER_STEPS:
        return None
    return off // 512


def convert(entries, first_stream=None):
    """PyTorch trace entries -> (records, step_starts, info).

    records: list of (kind, size, addr, stream, phase, time_ns) tuples.
    step_starts: {step: index of its first record in `records`}.
    info: counts of what was dropped and why.
    `first_stream`: the raw stream handle to number 0 (the current stream).
    """
    streams = {}
    if first_stream is not None:
        streams[int(first_stream)] = 0
    kept = []
    info = {"entries": len(entries), "ignored_actions": {}, "unmatched_frees": 0,
            "markers": 0, "live_at_end": 0}
    # Pass 1: keep allocs and frees; find markers (alloc immediately followed
    # by the free of the same address, of a marker size).
    acts = [e for e in entries if e.get("action") in ("alloc", "free_requested")]
    for e in entries:
        a = e.get("action")
        if a not in ("alloc", "free_requested"):
            info["ignored_actions"][a] = info["ignored_actions"].get(a, 0) + 1
    marks = {}  # index in acts of a marker alloc -> step
    for i in range(len(acts) - 1):
        e, nxt = acts[i], acts[i + 1]
        step = marker_step(int(e.get("size", 0)))
        if (step is not None and e["action"] == "alloc" and nxt["action"] == "free_requested"
                and nxt.get("addr") == e.get("addr")):
            marks[i] = step
    skip = set(marks) | {i + 1 for i in marks}
    t0 = None
    phase = 0
    live = {}  # addr -> size of the live alloc
    step_starts = {}
    for i, e in enumerate(acts):
        if i in marks:
            phase = marks[i]
            info["markers"] += 1
            step_starts.setdefault(phase, len(kept))
            continue
        if i in skip:
            continue
        addr = int(e.get("addr", 0))
        size = int(e.get("size", 0))
        t_us = e.get("time_us", 0) or 0
        if t0 is None:
            t0 = t_us
        time_ns = max(0, int(round((t_us - t0) * 1000)))
        s = int(e.get("stream", 0))
        if s not in streams:
            streams[s] = len(streams)
        if e["action"] == "alloc":
            live[addr] = size
            kept.append((KIND_ALLOC, size, addr, streams[s], phase, time_ns))
        else:
            if addr not in live:
                info["unmatched_frees"] += 1
                continue
            kept.append((KIND_FREE, live.pop(addr), addr, streams[s], phase, time_ns))
    info["live_at_end"] = len(live)
    info["streams"] = {str(k): v for k, v in streams.items()}
    info["records"] = len(kept)
    return kept, step_starts, info


def encode(records, granularity=GRANULARITY):
    """The binary trace (uncompressed bytes) of `records`."""
    out = bytearray(_HEADER.pack(MAGIC, VERSION, RECORD_BYTES, granularity, len(records)))
    for r in records:
        out += _RECORD.pack(*r)
    return bytes(out)


def decode(data):
    """(granularity, records) of a binary trace; raises ValueError on bad bytes."""
    if len(data) < HEADER_BYTES:
        raise ValueError("shorter than the header")
    magic, version, rec_bytes, gran, count = _HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise ValueError("wrong magic")
    if version != VERSION or rec_bytes != RECORD_BYTES:
        raise ValueError(f"version {version}, record bytes {rec_bytes}")
    if len(data) != HEADER_BYTES + count * RECORD_BYTES:
        raise ValueError(f"{len(data)} bytes for {count} records")
    recs = [_RECORD.unpack_from(data, HEADER_BYTES + i * RECORD_BYTES) for i in range(count)]
    for i, r in enumerate(recs):
        if r[0] not in (KIND_ALLOC, KIND_FREE):
            raise ValueError(f"event kind {r[0]} at record {i}")
    return gran, recs


def write_binary_gz(path, records, granularity=GRANULARITY):
    """Writes the gzip-compressed binary trace; returns its size in bytes."""
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(encode(records, granularity))
    import os
    return os.path.getsize(path)


def raw_rows(entries):
    """Compact rows [action, addr, size, stream, time_us] of every entry."""
    return [[e.get("action"), int(e.get("addr", 0) or 0), int(e.get("size", 0) or 0),
             int(e.get("stream", 0) or 0), e.get("time_us", 0)] for e in entries]


def write_raw_gz(path, entries, meta):
    """Writes every trace entry (no frames) plus `meta` as gzip'd JSON."""
    doc = {"columns": ["action", "addr", "size", "stream", "time_us"],
           "meta": meta, "rows": raw_rows(entries)}
    with gzip.open(path, "wt", compresslevel=9) as f:
        json.dump(doc, f, separators=(",", ":"))
    import os
    return os.path.getsize(path)


def replay_peak(records):
    """(peak live bytes, live bytes at the end) of `records` (a sanity check)."""
    live = cur = peak = 0
    for kind, size, *_ in records:
        cur += size if kind == KIND_ALLOC else -size
        peak = max(peak, cur)
    live = cur
    return peak, live
