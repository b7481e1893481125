"""CPU tests of the rematerialization recorder (python/remat/record.py, issue
16): a hand-made step shows how views, in-place ops, lifetimes and pinned
tensors are written; each of the four models records a tiny step whose trace
obeys the rules remat/src/recorded.rs checks. Skipped, with the reason,
without torch (and per model without transformers or timm). No GPU needed:

    python3 -m pytest -rs python/tests/test_remat_record.py
"""

import gzip
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "remat"))
import models  # noqa: E402
import record  # noqa: E402


def parse(path):
    """The trace as (meta, ops), each op (name, cost, in_place, inputs,
    outputs [(bytes, pinned)], frees), checked as the Rust reader checks it."""
    opener = gzip.open if str(path).endswith(".gz") else open
    lines = opener(path, "rt").read().splitlines()
    assert lines[0] == record.MAGIC
    meta, ops, made, freed = {}, [], 0, set()
    for line in lines[1:]:
        if line.startswith("meta "):
            key, _, value = line[5:].partition(" ")
            meta[key] = value
            continue
        head, ins, outs, frees = line[3:].split("|")
        name, cost, flag = head.split()
        ins, frees = [int(x) for x in ins.split()], [int(x) for x in frees.split()]
        outs = [(int(o.rstrip("p")), o.endswith("p")) for o in outs.split()]
        assert float(cost) >= 0 and flag in "i-", line
        assert all(i < made and i not in freed for i in ins) and len(set(ins)) == len(ins), line
        assert all(size > 0 for size, _ in outs), line
        if flag == "i":
            assert ins and outs and ins[0] in frees, line
        made += len(outs)
        assert all(f < made and f not in freed for f in frees), line
        freed |= set(frees)
        ops.append((name, float(cost), flag == "i", ins, outs, frees))
    return meta, ops


def test_views_in_place_lifetimes_and_pins_of_a_small_step(tmp_path):
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 32)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    x = torch.randn(16, 64)

    def loss_fn(m, batch):
        h = m(batch).view(16, 2, 16)       # a view: no op of its own
        h = h.relu_()                      # in place on the linear's output
        return h.transpose(0, 1).sum()

    rec, _ = record.record_step(layer, x, loss_fn, opt, torch.device("cpu"))
    path = tmp_path / "small.remat.gz"
    rec.write(path, {"model": "small"})
    meta, ops = parse(path)
    assert meta["model"] == "small"
    names = [op[0] for op in ops]
    assert names[:3] == ["leaf"] * 3, "weight, bias, batch"
    assert all(op[4][0][1] for op in ops[:3]), "leaves are pinned"
    views = {"aten::view", "aten::transpose.int", "aten::t", "aten::detach", "aten::expand"}
    assert not views & set(names), "views make no storage and are left out"
    addmm = names.index("aten::addmm")
    assert ops[addmm][4] == [(16 * 32 * 4, False)]
    relu = ops[names.index("aten::relu_")]
    assert relu[2] and relu[3][0] == len(ops[:addmm]) and relu[4] == [(16 * 32 * 4, False)]
    # The step ends with SGD updating both parameters in place: pinned versions.
    updates = [op for op in ops if op[2] and op[4][0][1]]
    assert len(updates) >= 2
    # Every activation dies; what lives at the end is pinned.
    made = [out for op in ops for out in op[4]]
    freed = {f for op in ops for f in op[5]}
    assert all(made[t][1] for t in range(len(made)) if t not in freed)
    assert any(op[1] > 0 for op in ops), "ops are timed"


@pytest.mark.parametrize("model", sorted(models.MODELS))
def test_each_model_records_a_tiny_step(model, tmp_path):
    needs = {"gpt2": "transformers", "bert": "transformers", "swin_t": "timm"}
    if model in needs:
        pytest.importorskip(needs[model], reason=f"{needs[model]} is not installed")
    out = tmp_path / f"{model}.remat.gz"
    record.main(["--model", model, "--tiny", "--device", "cpu", "--out", str(out)])
    meta, ops = parse(out)
    assert meta["model"] == model and meta["device"] == "cpu"
    phases = [int(meta[k]) for k in ("forward_ops", "backward_ops", "optimizer_ops")]
    assert all(n > 0 for n in phases) and sum(phases) == len(ops), phases
    assert len(ops) > 100
    assert any(op[2] for op in ops), "in-place ops (optimizer updates at least)"
    assert sum(op[1] for op in ops) > 0
    assert out.stat().st_size < 200_000


def test_local_resnet50_matches_torchvision_in_parameters():
    model = models.LocalResNet50()
    assert sum(p.numel() for p in model.parameters()) == 25_557_032


def test_out_variant_into_an_empty_tensor_is_a_new_tensor(tmp_path):
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    rec = record.Recorder("cpu")
    rec.leaf(a)
    rec.leaf(b)
    with rec:
        out = torch.empty(0)
        torch.mm(a, b, out=out)     # resizes the empty storage: a new tensor
        out.add_(1.0)               # then an in-place version of it
    path = tmp_path / "out.remat"
    rec.write(path, {})
    _, ops = parse(path)
    mm = next(op for op in ops if op[0] == "aten::mm.out")
    assert not mm[2] and mm[4] == [(8 * 8 * 4, False)] and mm[3] == [0, 1]
    add = next(op for op in ops if op[0] == "aten::add_.Tensor")
    assert add[2] and add[3][0] == 2
