"""gpumalloc's CUDA VMM pool as PyTorch's CUDA allocator.

    import gpumalloc_torch
    gpumalloc_torch.enable()          # before the first CUDA allocation
    ...
    print(gpumalloc_torch.stats(0))

The shared library is built by `cargo build --release -p torch-alloc`
(target/release/libgpumalloc_torch.so).
"""

import ctypes
import os
from pathlib import Path

_LIB_NAME = "libgpumalloc_torch.so"
_lib = None


class GmStats(ctypes.Structure):
    """Mirror of the `#[repr(C)] GmStats` of torch-alloc/src/lib.rs."""

    _fields_ = [
        ("active", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64),
        ("peak_active", ctypes.c_uint64),
        ("peak_reserved", ctypes.c_uint64),
        ("fragmentation", ctypes.c_double),
        ("driver_calls", ctypes.c_uint64),
    ]


def default_path():
    """The library under the repository's target/release (or $GPUMALLOC_TORCH_LIB)."""
    env = os.environ.get("GPUMALLOC_TORCH_LIB")
    if env:
        return env
    root = Path(__file__).resolve().parents[2]
    return str(root / "target" / "release" / _LIB_NAME)


def _load(path):
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL(path)
        _lib.gm_stats.argtypes = [ctypes.c_int, ctypes.POINTER(GmStats)]
        _lib.gm_stats.restype = ctypes.c_int
        _lib.gm_reset_peaks.argtypes = [ctypes.c_int]
        _lib.gm_reset_peaks.restype = None
        _lib.gm_empty_cache.argtypes = [ctypes.c_int]
        _lib.gm_empty_cache.restype = ctypes.c_uint64
    return _lib


def enable(path=None):
    """Installs gpumalloc as the CUDA allocator; call before any CUDA allocation."""
    import torch

    path = path or default_path()
    if not Path(path).exists():
        raise FileNotFoundError(
            f"{path} not found: build it with `cargo build --release -p torch-alloc`"
        )
    _load(path)
    alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "gm_malloc", "gm_free")
    torch.cuda.memory.change_current_allocator(alloc)
    return alloc


def stats(device=0):
    """Our statistics of `device` as a dict (fragmentation = 1 - peak active / peak reserved)."""
    lib = _load(default_path()) if _lib is None else _lib
    out = GmStats()
    if lib.gm_stats(device, ctypes.byref(out)) != 0:
        raise RuntimeError(f"gm_stats failed for device {device} (see stderr)")
    return {name: getattr(out, name) for name, _ in GmStats._fields_}


def reset_peaks(device=0):
    """Sets the peaks to the current values."""
    _lib.gm_reset_peaks(device)


def empty_cache(device=0):
    """Returns cached memory to the driver; the bytes released."""
    return _lib.gm_empty_cache(device)
