"""GPU test of the pluggable allocator: tensors of random sizes on two
streams, contents checked, our statistics checked against the sizes asked.
Skips without CUDA or without the built library. Run in its own process
(the allocator can only be changed before CUDA's first allocation):

    cargo build --release -p torch-alloc && python -m pytest python/tests
"""

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

torch = pytest.importorskip("torch")
import gpumalloc_torch  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def test_random_tensors_on_two_streams():
    if not Path(gpumalloc_torch.default_path()).exists():
        pytest.skip("library not built")
    gpumalloc_torch.enable()
    rng = random.Random(1234)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    live = []
    asked = 0
    for step in range(400):
        s = streams[step % 2]
        with torch.cuda.stream(s):
            if live and rng.random() < 0.4:
                t, fill, stream, n = live.pop(rng.randrange(len(live)))
                with torch.cuda.stream(stream):
                    assert torch.all(t == fill).item(), "contents survive"
                asked -= n
                del t
            else:
                numel = rng.choice([1, 7, 300, 4096, 70_000, 600_000, 3_000_000])
                fill = float(step % 97)
                t = torch.full((numel,), fill, dtype=torch.float32, device="cuda")
                live.append((t, fill, s, t.untyped_storage().nbytes()))
                asked += t.untyped_storage().nbytes()
    torch.cuda.synchronize()
    st = gpumalloc_torch.stats(0)
    assert st["active"] == asked, (st, asked)
    assert st["reserved"] >= st["active"]
    assert st["peak_reserved"] >= st["peak_active"] >= st["active"]
    live.clear()
    torch.cuda.synchronize()
    assert gpumalloc_torch.stats(0)["active"] == 0
    gpumalloc_torch.empty_cache(0)
