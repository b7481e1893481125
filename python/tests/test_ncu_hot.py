"""CPU tests of scripts/ncu-hot.py, which ranks the SASS lines of an Nsight
Compute source page by warp stall samples (scripts/ncu-alloc.sh). No GPU:

    python3 -m pytest python/tests/test_ncu_hot.py
"""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ncu-hot.py"


def load():
    spec = importlib.util.spec_from_file_location("ncu_hot", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# What `ncu -i R --page source --csv --print-source sass` writes: a line
# naming the kernel, then the table (abridged to the columns the script reads
# and one it does not).
PAGE = '''"Kernel Name","heap_alloc",
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","Instructions Executed"
"0x7f0000002680","      ATOMG.E.ADD.64.STRONG.GPU PT, R38, desc[UR8][R44.64], R38","20","10","41,143"
"0x7f00000029b0","      NANOSLEEP R3","5","2","345,170"
"0x7f00000029c0","      LDG.E.64.STRONG.GPU R12, desc[UR8][R44.64]","1,500","900","345,170"
"0x7f0000002a10","@!P0  BRA 0x7f0000002940","75","30","345,170"
'''


def test_ranks_lines_and_sums_opcodes(tmp_path, capsys):
    page = tmp_path / "single-16.source.csv"
    page.write_text(PAGE)
    assert load().main(str(page), top=2) == 0
    out = capsys.readouterr().out
    assert out.startswith("1600 stall samples; by opcode:")
    # Opcodes summed, the predicate of a guarded branch skipped.
    assert "LDG         93.8%" in out
    assert "BRA          4.7%" in out
    lines = out.split("top 2 lines:\n")[1].splitlines()
    assert len(lines) == 2
    assert "LDG.E.64.STRONG.GPU" in lines[0] and "93.8%" in lines[0]
    assert "BRA" in lines[1]


def test_a_page_without_stall_samples_prints_its_columns(tmp_path, capsys):
    page = tmp_path / "other.csv"
    page.write_text('"Kernel Name","heap_alloc",\n"Address","Source","Instructions Executed"\n')
    assert load().main(str(page)) == 1
    assert "columns:" in capsys.readouterr().out
