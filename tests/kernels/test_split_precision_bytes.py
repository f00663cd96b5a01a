"""Byte model of the split-precision Mamba-2 decode (``benchmarks/bytes_read_copy.py``) and the
``--read-dtype`` option of ``benchmarks/bench_decode.py``."""

from __future__ import annotations

import pytest

from benchmarks import bench_decode as bd
from benchmarks import bytes_model as bm
from benchmarks.bytes_read_copy import mamba2_read_copy_bytes, read_copy_bytes
from benchmarks.shapes import NANO_4B


@pytest.mark.parametrize("rd,elem,scales", [("bf16", 2, 0), ("fp16", 2, 0), ("fp8", 1, 4)])
def test_read_copy_phases(rd, elem, scales):
    H, P, N, L = NANO_4B.H, NANO_4B.P, NANO_4B.N, 16
    S_r = H * P * N * elem + scales * H * P
    assert read_copy_bytes(NANO_4B, rd) == S_r
    base = bm.mamba2_replay_bytes(NANO_4B, L, 4, 2)
    m = mamba2_read_copy_bytes(NANO_4B, L, rd, 4, 2)
    for w in range(L - 1):  # non-flush: the copy instead of the checkpoint, rest unchanged
        p, p0 = m.phase(w), base.phase(w)
        assert (p.state_read, p.state_write) == (S_r, 0)
        assert (p.ring_read, p.ring_write, p.io) == (p0.ring_read, p0.ring_write, p0.io)
    p, p0 = m.phase(L - 1), base.phase(L - 1)  # flush: checkpoint read + write, copy written
    assert (p.state_read, p.state_write) == (p0.state_read, p0.state_write + S_r)
    assert m.cycle_mean() < base.cycle_mean()


def test_bench_cli_read_dtype(tmp_path):
    cfg = bd.parse_args(["--family", "mamba2", "--read-dtype", "fp8", "--dry-run",
                         "--out", str(tmp_path)])
    assert cfg.read_dtype == "fp8"
    assert isinstance(bd.byte_models(cfg, "mamba2")["ours"], type(
        mamba2_read_copy_bytes(NANO_4B, 16, "fp8")))
    assert bd.parse_args(["--dry-run", "--out", str(tmp_path)]).read_dtype == "same"
    # GDN takes the copy too (tests/benchmarks/test_bench_read_copy.py)
    cfg = bd.parse_args(["--family", "all", "--read-dtype", "bf16", "--dry-run",
                         "--out", str(tmp_path)])
    assert cfg.families == ["mamba2", "gdn"] and cfg.read_dtype == "bf16"
    with pytest.raises(SystemExit):  # a copy in the checkpoint's own dtype: refused, not ignored
        bd.parse_args(["--family", "mamba2", "--state-dtype", "fp16", "--read-dtype", "fp16",
                       "--dry-run", "--out", str(tmp_path)])
