"""Records one PyTorch training step as an op trace for the rematerialization
executor (issue 16; read by remat/src/recorded.rs, format described there).

    python3 python/remat/record.py --model gpt2 --out traces/gpt2.remat.gz
    python3 python/remat/record.py --model bert --batch 4 --seq 256 --out bert.remat.gz
    python3 python/remat/record.py --model resnet50 --tiny --device cpu --out r.remat.gz

A `TorchDispatchMode` sees every aten op of the step (forward, backward, the
optimizer) after autograd. For each op it records:

* its inputs and outputs as *storages*, not tensors: a view shares its base's
  storage, so a pure view op (view, transpose, slice, detach...) makes nothing
  and is left out; an output whose storage is new is a new tensor whose size is
  the storage's byte count;
* in-place writes: an argument the op's schema marks as written (`Tensor(a!)`)
  gets a new version of its storage, recorded as an in-place op (`i` flag)
  whose first input is the old version; `_foreach_*` ops are split into one op
  per list element (cost shared evenly), and an op that writes several
  storages into one op per written storage;
* its time: CUDA events around the op on the GPU, `time.perf_counter_ns` on
  the CPU. On the GPU a short spin kernel (`torch.cuda._sleep`) goes before
  the start event, so that the device is still busy while the CPU dispatches
  the op and the events time the op's kernels, not the launch gap;
* lifetimes: a `weakref.finalize` on each storage (PyTorch keeps a storage's
  Python object alive as long as the storage) says when the program drops it;
  the drop goes after the last recorded op.

Pinned (never evicted): every storage that existed before the step
(parameters, buffers, optimizer state, the input batch), any storage first
seen as an input, and whatever is a parameter's gradient or an optimizer's
state when the step ends. Only storages on the recorded device count; CPU
scalars of a CUDA step are left out.

The step recorded is the second one: the first (not recorded) makes the
optimizer state and warms up the kernels. Random weights, random data, fixed
seed; nothing is downloaded.
"""

import argparse
import gc
import gzip
import sys
import threading
import time
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # noqa: E402

MAGIC = "gpumalloc-remat-trace 1"
# About 50-100 µs of spinning at 1-2 GHz: longer than dispatching one op.
SLEEP_CYCLES = 100_000
# Out of GPU memory: halve the batch and try again, this many times.
OOM_RETRIES = 2


class _Op:
    __slots__ = ("name", "cost", "in_place", "inputs", "outputs", "frees")

    def __init__(self, name, cost, in_place, inputs, outputs):
        self.name, self.cost, self.in_place = name, cost, in_place
        self.inputs, self.outputs, self.frees = inputs, outputs, []


class Recorder(TorchDispatchMode):
    """Records the ops of the code run under it. Holds no tensor (so it does
    not change lifetimes), only storage keys, tensor numbers and timing."""

    def __init__(self, device, sleep_cycles=SLEEP_CYCLES):
        super().__init__()
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.sleep_cycles = sleep_cycles
        self.ops = []
        self.sizes = []      # tensor id -> bytes
        self.pinned = []     # tensor id -> bool
        self.live = {}       # storage key -> id of its current version
        self.versions = {}   # storage key -> ids of all its versions
        self.events = []     # (op, share, start, end) on the GPU
        self.seen_ops = 0
        self.phases = {}     # ops (leaves included) per phase of the step
        # Backward ops run on autograd's device thread and storages may die
        # on any thread: the bookkeeping (not the ops) runs under this lock.
        self.lock = threading.RLock()

    # -- storages -----------------------------------------------------------

    def _storage(self, t):
        """(storage, key, bytes) of a tensor's storage on the recorded device,
        or None (another device, no storage, or an empty one)."""
        if not isinstance(t, torch.Tensor) or t.device.type != self.device.type:
            return None
        try:
            s = t.untyped_storage()
        except (NotImplementedError, RuntimeError):
            return None
        if s.nbytes() == 0:
            return None
        return s, s._cdata, s.nbytes()

    def _new_tensor(self, key, size, pinned):
        tid = len(self.sizes)
        self.sizes.append(size)
        self.pinned.append(pinned)
        self.live[key] = tid
        self.versions.setdefault(key, []).append(tid)
        return tid

    def _track(self, storage, key):
        weakref.finalize(storage, self._died, key)

    def _died(self, key):
        with self.lock:
            tid = self.live.pop(key, None)
            self.versions.pop(key, None)
            if tid is not None and self.ops:
                self.ops[-1].frees.append(tid)

    def leaf(self, t):
        """Registers an existing tensor's storage as pinned, made by a cost-0
        op with no inputs; returns its key (None when not on the device)."""
        info = self._storage(t)
        if info is None:
            return None
        storage, key, size = info
        if key not in self.live:
            tid = self._new_tensor(key, size, True)
            self.ops.append(_Op("leaf", 0, False, [], [tid]))
            self._track(storage, key)
        return key

    # -- ops ------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with self.lock:
            self.seen_ops += 1
            pieces = self._pieces(func, args, kwargs)
            for piece in pieces:
                for t in piece["reads"]:
                    self.leaf(t)
        if self.cuda and self.sleep_cycles:
            torch.cuda._sleep(self.sleep_cycles)
        start = self._clock()
        out = func(*args, **kwargs)
        end = self._clock()
        with self.lock:
            self._emit(str(func._schema.name) + _overload(func), pieces, out, start, end)
        return out

    def _clock(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter_ns()

    def _pieces(self, func, args, kwargs):
        """The op as one or more pieces, each with the tensors it reads and
        writes; `_foreach_*` ops give one piece per list element."""
        schema = func._schema
        values = []
        for i, arg in enumerate(schema.arguments):
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            writes = arg.alias_info is not None and arg.alias_info.is_write
            values.append((value, writes))
        lists = [(v, w) for v, w in values if isinstance(v, (list, tuple))
                 and v and all(isinstance(x, torch.Tensor) for x in v)]
        single = [(v, w) for v, w in values if isinstance(v, torch.Tensor)]
        nested = [x for v, _ in values if isinstance(v, (list, tuple))
                  for x in tree_flatten(v)[0] if isinstance(x, torch.Tensor)]
        if schema.name.startswith("aten::_foreach_") and lists:
            n = len(lists[0][0])
            pieces = []
            for j in range(n):
                same = [(v[j], w) for v, w in lists if len(v) == n]
                pieces.append(_piece(same + single, index=j))
            return pieces
        return [_piece(single + [(x, w) for v, w in lists for x in v]
                       + [(x, False) for x in nested], index=None)]

    def _emit(self, name, pieces, out, start, end):
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        foreach = len(pieces) > 1 or pieces[0]["index"] is not None
        if foreach and isinstance(out, (list, tuple)) and len(out) == len(pieces):
            per_piece = [[t] if isinstance(t, torch.Tensor) else [] for t in out]
        else:
            per_piece = [outs] + [[] for _ in pieces[1:]]
        emitted = []
        for piece, piece_outs in zip(pieces, per_piece):
            emitted += self._emit_piece(name, piece, piece_outs)
        if not emitted:
            return
        each = 1.0 / len(emitted)
        for op in emitted:
            if self.cuda:
                self.events.append((op, each, start, end))
            else:
                op.cost = (end - start) * each

    def _emit_piece(self, name, piece, outs):
        """Appends the piece's ops: one per written storage (in place) or,
        when it writes nothing, one op making its new storages."""
        reads = _unique(self._key(t) for t in piece["reads"])
        # A written storage that was empty before the op (an `out=` tensor
        # resized by it) is not known yet: it is a new output, not a version.
        written = [k for k in _unique(self._key(t) for t in piece["writes"]) if k in self.live]
        new = []
        for t in outs:
            info = self._storage(t)
            if info is not None and info[1] not in self.live and info[1] not in [k for k, _ in new]:
                new.append((info[1], info[2]))
                self._track(info[0], info[1])
        others = [self.live[k] for k in reads if k not in written and k in self.live]
        ops = []
        if not written and not new:
            return ops
        if not written:
            ids = [self._new_tensor(k, size, False) for k, size in new]
            ops.append(_Op(name, 0, False, others, ids))
        for n, key in enumerate(written):
            old = self.live[key]
            size = self._storage_size(piece["writes"], key)
            made = [] if n else new
            if size <= self.sizes[old]:
                tid = self._new_tensor(key, self.sizes[old], self.pinned[old])
                op = _Op(name, 0, True, [old] + others, [tid])
            else:   # resized: a new storage that replaces the old one
                tid = self._new_tensor(key, size, self.pinned[old])
                op = _Op(name, 0, False, [old] + others, [tid])
            op.outputs += [self._new_tensor(k, s, False) for k, s in made]
            op.frees.append(old)
            ops.append(op)
        self.ops += ops
        return ops

    def _key(self, t):
        info = self._storage(t)
        return None if info is None else info[1]

    def _storage_size(self, tensors, key):
        for t in tensors:
            info = self._storage(t)
            if info is not None and info[1] == key:
                return info[2]
        return 0

    # -- the end --------------------------------------------------------------

    def pin(self, tensors):
        """Pins every version of these tensors' storages (gradients and
        optimizer state at the end of the step)."""
        for t in tensors:
            key = self._key(t)
            for tid in self.versions.get(key, []):
                self.pinned[tid] = True

    def finish(self):
        """Resolves the GPU timings (waits for the device)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            for op, share, start, end in self.events:
                op.cost = start.elapsed_time(end) * 1e6 * share
            self.events.clear()

    def write(self, path, meta):
        lines = [MAGIC]
        lines += [f"meta {k} {v}" for k, v in meta.items()]
        for op in self.ops:
            outs = " ".join(f"{self.sizes[t]}{'p' if self.pinned[t] else ''}" for t in op.outputs)
            lines.append(f"op {op.name} {round(op.cost)} {'i' if op.in_place else '-'}"
                         f" | {' '.join(map(str, op.inputs))} | {outs}"
                         f" | {' '.join(map(str, op.frees))}")
        data = ("\n".join(lines) + "\n").encode()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".gz":
            data = gzip.compress(data, compresslevel=9, mtime=0)
        path.write_bytes(data)
        return len(data)


def _overload(func):
    name = func._overloadname
    return "" if name == "default" else "." + name


def _piece(pairs, index):
    tensors = [(t, w) for t, w in pairs if isinstance(t, torch.Tensor)]
    return {"reads": [t for t, _ in tensors], "writes": [t for t, w in tensors if w],
            "index": index}


def _unique(keys):
    out = []
    for k in keys:
        if k is not None and k not in out:
            out.append(k)
    return out


def record_step(model, batch, loss_fn, optimizer, device, sleep_cycles=SLEEP_CYCLES):
    """Runs one step untraced, then records the next; returns the recorder
    and the measured wall time of the recorded step in seconds."""
    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model, batch)
        loss.backward()
        optimizer.step()

    step()
    optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    recorder = Recorder(device, sleep_cycles)
    for t in list(model.parameters()) + list(model.buffers()) + _state_tensors(optimizer) \
            + [t for t in tree_flatten(batch)[0] if isinstance(t, torch.Tensor)]:
        recorder.leaf(t)
    started = time.perf_counter()
    with recorder:
        loss = loss_fn(model, batch)
        recorder.phases["forward_ops"] = len(recorder.ops)
        loss.backward()
        recorder.phases["backward_ops"] = len(recorder.ops) - recorder.phases["forward_ops"]
        optimizer.step()
        del loss
    recorder.phases["optimizer_ops"] = len(recorder.ops) - sum(recorder.phases.values())
    recorder.finish()
    seconds = time.perf_counter() - started
    recorder.pin([p.grad for p in model.parameters() if p.grad is not None]
                 + _state_tensors(optimizer))
    return recorder, seconds


def _state_tensors(optimizer):
    return [t for state in optimizer.state.values() for t in tree_flatten(state)[0]
            if isinstance(t, torch.Tensor)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, choices=sorted(models.MODELS))
    p.add_argument("--out", required=True, help="trace file (.gz: gzip)")
    p.add_argument("--batch", type=int, help="batch size (default: per model)")
    p.add_argument("--seq", type=int, help="sequence length (transformers)")
    p.add_argument("--image", type=int, help="image side (vision models)")
    p.add_argument("--tiny", action="store_true", help="a few-layer model for CPU tests")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sleep-cycles", type=int, default=SLEEP_CYCLES,
                   help="GPU spin before each op, so events time kernels only (0: off)")
    a = p.parse_args(argv)

    device = torch.device(a.device)
    batch = a.batch
    for attempt in range(OOM_RETRIES + 1):
        torch.manual_seed(a.seed)
        built = None
        try:
            built = models.build(a.model, tiny=a.tiny, batch=batch, seq=a.seq, image=a.image,
                                 device=device)
            recorder, seconds = record_step(built.model, built.batch, built.loss_fn,
                                            built.optimizer, device, a.sleep_cycles)
            break
        except torch.cuda.OutOfMemoryError:
            # Out of memory while building: a smaller batch does not help.
            if attempt == OOM_RETRIES or built is None or built.batch_size == 1:
                raise
            batch = built.batch_size // 2
            print(f"{a.model}: out of GPU memory, trying batch {batch}", file=sys.stderr)
            built = None
            gc.collect()
            torch.cuda.empty_cache()
    meta = {"model": a.model, "config": built.describe, "device": str(device),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "seed": a.seed, "unit": "ns",
            "step_wall_s": f"{seconds:.3f}", "aten_ops_seen": recorder.seen_ops,
            "pinned_count": sum(recorder.pinned), "sleep_cycles": a.sleep_cycles}
    meta.update(recorder.phases)
    if device.type == "cuda":
        meta["peak_allocated"] = torch.cuda.max_memory_allocated(device)
    if recorder.phases["backward_ops"] == 0:
        # The dispatch mode did not reach autograd's thread: a forward-only
        # trace would look valid and mean nothing.
        sys.exit(f"{a.model}: no backward op was recorded; not writing {a.out}")
    size = recorder.write(a.out, meta)
    print(f"{a.model}: {len(recorder.ops)} ops ({recorder.seen_ops} aten ops seen), "
          f"{len(recorder.sizes)} tensors, step {seconds:.2f} s, {size / 1e6:.2f} MB -> {a.out}")


if __name__ == "__main__":
    main()
