"""gpumalloc's CUDA VMM pool as PyTorch's CUDA allocator.

    import gpumalloc_torch
    gpumalloc_torch.enable()          # before the first CUDA allocation
    ...
    torch.cuda.max_memory_reserved()  # PyTorch's own statistics work
    print(gpumalloc_torch.stats(0))   # ours, with more detail

Two pieces: the pool itself, a Rust shared library built by
`cargo build --release -p torch-alloc` (target/release/libgpumalloc_torch.so,
or $GPUMALLOC_TORCH_LIB), and a small C++ extension (csrc/gpumalloc_ext.cpp)
that makes it PyTorch's allocator. The extension is built the way PyTorch
extensions are: `pip install --no-build-isolation ./python` ahead of time, or,
if that was not done, by `enable()` itself through
`torch.utils.cpp_extension.load` (needs a C++ compiler, ninja and the CUDA
headers; the result is cached under ~/.cache/torch_extensions).
"""

import ctypes
import os
from pathlib import Path

_LIB_NAME = "libgpumalloc_torch.so"
_HERE = Path(__file__).resolve().parent
_lib = None
_ext = None


class GmStats(ctypes.Structure):
    """Mirror of the `#[repr(C)] GmStats` of torch-alloc/src/lib.rs."""

    _fields_ = [
        ("active", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64),
        ("peak_active", ctypes.c_uint64),
        ("peak_reserved", ctypes.c_uint64),
        ("fragmentation", ctypes.c_double),
        ("driver_calls", ctypes.c_uint64),
        ("allocated", ctypes.c_uint64),
        ("peak_allocated", ctypes.c_uint64),
        ("waiting", ctypes.c_uint64),
        ("split_free", ctypes.c_uint64),
        ("private_free", ctypes.c_uint64),
        ("largest_free", ctypes.c_uint64),
        ("limit", ctypes.c_uint64),
        ("live_allocations", ctypes.c_uint64),
        ("allocs", ctypes.c_uint64),
        ("frees", ctypes.c_uint64),
        ("alloc_retries", ctypes.c_uint64),
        ("ooms", ctypes.c_uint64),
        ("event_calls", ctypes.c_uint64),
        ("split_chunks", ctypes.c_uint64),
        ("private_pools", ctypes.c_uint64),
        ("small_rounding", ctypes.c_uint64),
        ("large_rounding", ctypes.c_uint64),
        ("lake_free", ctypes.c_uint64),
        ("driver_ns", ctypes.c_uint64),
        ("call_ns", ctypes.c_uint64),
        ("alloc_call_ns", ctypes.c_uint64),
        ("free_call_ns", ctypes.c_uint64),
        ("alloc_calls", ctypes.c_uint64),
        ("free_calls", ctypes.c_uint64),
        ("slow_calls", ctypes.c_uint64),
        ("slow_call_ns", ctypes.c_uint64),
        ("thread_switches", ctypes.c_uint64),
        ("planned_free", ctypes.c_uint64),
        ("planned_arena", ctypes.c_uint64),
        ("spilled", ctypes.c_uint64),
        ("peak_spilled", ctypes.c_uint64),
        ("spills", ctypes.c_uint64),
        ("placement_waits", ctypes.c_uint64),
    ]


class GmPlanStats(ctypes.Structure):
    """Mirror of the `#[repr(C)] GmPlanStats` of torch-alloc/src/lib.rs."""

    _fields_ = [
        ("loaded", ctypes.c_uint64),
        ("arena", ctypes.c_uint64),
        ("plan_hits", ctypes.c_uint64),
        ("dynamic_slot", ctypes.c_uint64),
        ("dynamic_idle", ctypes.c_uint64),
        ("fallbacks", ctypes.c_uint64),
        ("unmatched", ctypes.c_uint64),
        ("high_water", ctypes.c_uint64),
    ]


def default_path():
    """The library: $GPUMALLOC_TORCH_LIB, else the copy `pip install` put in the
    package, else the repository's target/release."""
    env = os.environ.get("GPUMALLOC_TORCH_LIB")
    if env:
        return env
    packaged = _HERE / _LIB_NAME
    if packaged.exists():
        return str(packaged)
    return str(_HERE.parents[1] / "target" / "release" / _LIB_NAME)


def _load(path):
    global _lib
    if _lib is None:
        if not Path(path).exists():
            raise FileNotFoundError(
                f"{path} not found: build it with `cargo build --release -p torch-alloc` "
                "or point $GPUMALLOC_TORCH_LIB at it"
            )
        lib = ctypes.CDLL(path)
        lib.gm_stats.argtypes = [ctypes.c_int, ctypes.POINTER(GmStats)]
        lib.gm_stats.restype = ctypes.c_int
        lib.gm_reset_peaks.argtypes = [ctypes.c_int]
        lib.gm_reset_peaks.restype = None
        lib.gm_empty_cache.argtypes = [ctypes.c_int]
        lib.gm_empty_cache.restype = ctypes.c_uint64
        lib.gm_last_error.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.gm_last_error.restype = ctypes.c_int
        lib.gm_trace_start.argtypes = [ctypes.c_int]
        lib.gm_trace_step.argtypes = [ctypes.c_int]
        lib.gm_trace_save.argtypes = [ctypes.c_int, ctypes.c_char_p]
        lib.gm_plan_synthesize.argtypes = [ctypes.c_char_p, ctypes.c_char_p,
                                           ctypes.c_uint32, ctypes.c_uint32]
        lib.gm_plan_synthesize.restype = ctypes.c_int64
        lib.gm_plan_load.argtypes = [ctypes.c_int, ctypes.c_char_p]
        lib.gm_plan_load.restype = ctypes.c_int
        lib.gm_plan_drop.argtypes = [ctypes.c_int]
        lib.gm_plan_drop.restype = ctypes.c_int
        lib.gm_plan_stats.argtypes = [ctypes.c_int, ctypes.POINTER(GmPlanStats)]
        lib.gm_plan_stats.restype = ctypes.c_int
        _lib = lib
    return _lib


def _last_error(lib):
    buf = ctypes.create_string_buffer(4096)
    lib.gm_last_error(buf, len(buf))
    return buf.value.decode(errors="replace")


def _extension(verbose=False):
    """The C++ extension: the one pip installed, else built now (cached)."""
    global _ext
    if _ext is not None:
        return _ext
    try:
        from . import _gpumalloc_ext as ext  # built by `pip install ./python`
    except ImportError:
        from torch.utils import cpp_extension

        ext = cpp_extension.load(
            name="_gpumalloc_ext",
            sources=[str(_HERE / "csrc" / "gpumalloc_ext.cpp")],
            extra_ldflags=["-ltorch_cuda", "-lc10_cuda"],
            with_cuda=True,
            verbose=verbose,
        )
    _ext = ext
    return ext


def enable(path=None, verbose=False):
    """Makes gpumalloc PyTorch's CUDA allocator; call before any CUDA call
    (torch.cuda.set_device and the first CUDA tensor initialise PyTorch's own).

    Out of memory then raises torch.cuda.OutOfMemoryError; CUDA graphs get
    private pools; torch.cuda.memory_stats(), empty_cache(), record_stream
    and set_per_process_memory_fraction reach the pool.
    """
    path = path or default_path()
    _load(path)
    try:
        _extension(verbose).install(path)
    except RuntimeError as e:
        if "already initialized" not in str(e):
            raise
        raise RuntimeError(
            "gpumalloc_torch.enable() must run before CUDA is initialised in this "
            "process: call it before torch.cuda.set_device, the first CUDA tensor or "
            "torch.distributed's NCCL set-up"
        ) from e


def is_enabled():
    """Whether gpumalloc is PyTorch's CUDA allocator now."""
    return _ext is not None and _ext.is_installed()


def _lib_or_default():
    return _lib if _lib is not None else _load(default_path())


def stats(device=0):
    """Our statistics of `device` as a dict.

    active: bytes in live tensors as requested; reserved: physical bytes held;
    peaks of both; fragmentation = 1 - peak active / peak reserved; waiting:
    bytes freed but waiting for other streams' events; split_free: free bytes
    in the small-request cache; private_free: free bytes held by CUDA graphs;
    driver_calls / event_calls: CUDA calls made; alloc_retries / ooms.
    driver_ns: time in VMM driver calls; call_ns: time inside malloc/free
    (driver calls included), the host time the allocator costs.
    Where reserved bytes are: active + small_rounding + large_rounding +
    (split_free - waiting in it) + private_free + planned_free + waiting +
    lake_free. planned_arena: physical bytes of the plan's arena (use_plan).
    spilled / peak_spilled / spills: bytes of chunks made in host memory when
    the GPU was full (GPUMALLOC_SPILL_TO_HOST=1), their peak and how many
    chunks were made so; not part of reserved, and the breakdown above sums to
    reserved + spilled. placement_waits: placements that first waited for
    the device (the event of a stitched view's last free) so that they could
    patch that view instead of stitching a new one.
    """
    lib = _lib_or_default()
    out = GmStats()
    if lib.gm_stats(device, ctypes.byref(out)) != 0:
        raise RuntimeError(f"gm_stats failed for device {device}: {_last_error(lib)}")
    return {name: getattr(out, name) for name, _ in GmStats._fields_}


def reset_peaks(device=0):
    """Sets the peaks to the current values (also torch.cuda.reset_peak_memory_stats)."""
    _lib_or_default().gm_reset_peaks(device)


def start_trace(device=0):
    """Starts recording every allocation and free of `device` (size, stream, order, step)."""
    lib = _lib_or_default()
    if lib.gm_trace_start(device) != 0:
        raise RuntimeError(f"gm_trace_start failed: {_last_error(lib)}")


def step(device=0):
    """Marks the start of the next training step: in the recording
    (start_trace) and in the plan (use_plan), which moves to its next
    iteration. Call it at the start of every step after the first (the
    set-up and the first step are the plan's prologue)."""
    lib = _lib_or_default()
    if lib.gm_trace_step(device) != 0:
        raise RuntimeError(f"gm_trace_step failed: {_last_error(lib)}")


def synthesize_plan(trace_path, plan_path, iterations=3, warmup=1):
    """Makes a plan file from a trace saved with save_trace (no GPU needed):
    `warmup` steps (set-up and the first step) planned as recorded, the next
    `iterations` steps overlaid into the iteration every later step repeats.
    The trace needs at least warmup + 1 steps (marked with step()). Returns
    the synthesis time in seconds."""
    lib = _lib_or_default()
    ms = lib.gm_plan_synthesize(os.fsencode(str(trace_path)), os.fsencode(str(plan_path)),
                                int(iterations), int(warmup))
    if ms < 0:
        raise RuntimeError(f"gm_plan_synthesize failed: {_last_error(lib)}")
    return ms / 1000.0


def use_plan(path, device=0):
    """Serves `device`'s allocations from the plan file at `path` (planned
    mode): call it after enable() and before the first CUDA tensor, at the
    point where the profiled run started its trace, and call step() at the
    start of every step after the first, as that run did. Requests the plan
    does not foresee fall back to the pool; plan_stats() counts them.
    Raises RuntimeError if the file is bad or the pool holds allocations."""
    lib = _lib_or_default()
    if lib.gm_plan_load(device, os.fsencode(str(path))) != 0:
        raise RuntimeError(f"gm_plan_load failed: {_last_error(lib)}")


def drop_plan(device=0):
    """Turns the planned mode of `device` off (no planned tensor may be alive)."""
    lib = _lib_or_default()
    if lib.gm_plan_drop(device) != 0:
        raise RuntimeError(f"gm_plan_drop failed: {_last_error(lib)}")


def plan_stats(device=0):
    """The planned mode's counters of `device` as a dict: loaded (0/1), arena
    (physical bytes), plan_hits (planned offset), dynamic_slot (smaller than
    planned, in its slot), dynamic_idle (in planned space idle during its
    window), fallbacks (served by the pool; unmatched: no planned request at
    that position), high_water (highest arena byte handed out)."""
    lib = _lib_or_default()
    out = GmPlanStats()
    if lib.gm_plan_stats(device, ctypes.byref(out)) != 0:
        raise RuntimeError(f"gm_plan_stats failed for device {device}: {_last_error(lib)}")
    return {name: getattr(out, name) for name, _ in GmPlanStats._fields_}


def save_trace(path, device=0):
    """Stops the recording and writes it to `path` (GMLKTRC; replay it with
    `cargo run -p lake --release --example replay -- PATH`)."""
    lib = _lib_or_default()
    if lib.gm_trace_save(device, os.fsencode(str(path))) != 0:
        raise RuntimeError(f"gm_trace_save failed: {_last_error(lib)}")


def empty_cache(device=-1):
    """Returns cached memory to the driver (all devices by default); the bytes released."""
    return _lib_or_default().gm_empty_cache(device)
