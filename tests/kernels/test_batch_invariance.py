"""Batch invariance (SGLang's ``--enable-deterministic-inference``): with ``batch_invariant=True`` a
request's outputs, records and checkpoint do not depend on the other rows of its launch.

Four launches choose their configuration by the batch size: the Mamba-2 decode and verify split a
head's P-tiles over programs at small batch (``p_split_rule``, by the GPU's SM count), the GDN decode
gives a program several value tiles from batch 64 (``TILES_BY_BATCH``), the GDN verify window takes a
half-head tile up to ``SMALL_BATCH`` rows.  On the GPU the GDN decode's tiles change the compiled
non-flush sums (benchmarks/RESULTS.md, twenty-fourth session: 3–5 output elements; an H100 ``u`` record
one bf16 ulp apart), so ``batch_invariant`` pins every one of them (kernels/README.md, "Batch
invariance").  The interpreter cannot show compiled rounding: the CPU tests check (1) that the pinned
launch is one configuration at every batch size, where the default's flips, and (2) with the driver
of ``batch_invariance.py``, that the same request at batch 1 and at batch 12 gives the same bits,
pinned, at shapes where the default's choice flips (small-batch thresholds scaled to the test shapes).
The ``gpu`` tests run (2) at the real shapes and thresholds (not yet run on a GPU).
"""

from __future__ import annotations

import pytest
import torch
from batch_invariance import Shape, compare_worlds, run_world

import replayssm_kernels as rk
import replayssm_kernels.gdn_decode.kernel as gdk
import replayssm_kernels.gdn_verify.kernel as gvk
import replayssm_kernels.mamba2_decode.kernel as m2d
import replayssm_kernels.mamba2_verify.kernel as m2v

DEV = "cuda" if torch.cuda.is_available() else "cpu"
M2 = Shape("mamba2", heads=2, groups=1, rows=48, cols=16)  # P 48: three 16-row tiles
GDN_DECODE = Shape("gdn", heads=2, groups=1, rows=64, cols=32)  # V 64: two 32-row value tiles
GDN_VERIFY = Shape("gdn", heads=2, groups=1, rows=128, cols=16)  # V 128: BV 64 vs 128
OPS = {  # name -> (wrapper, shape, T)
    "mamba2_decode": (rk.mamba2_replay_decode, M2, None),
    "mamba2_verify": (rk.mamba2_replay_verify, M2, 4),
    "gdn_decode": (rk.gdn_replay_decode, GDN_DECODE, None),
    "gdn_verify": (rk.gdn_replay_verify, GDN_VERIFY, 4),
}


@pytest.fixture
def small_batch_thresholds(monkeypatch):
    """Make the batch-dependent choices flip between batch 1 and 12 on the test shapes: the P-split
    rule as on a 4-SM GPU (CPU launches pass no SM count: always unsplit), two value tiles per GDN
    decode program from batch 12 with flush rows launched first from there (the serving backend's
    ``row_order``).  The GDN verify window flips at its own ``SMALL_BATCH`` (4)."""
    rule = m2d.p_split_rule

    def four_sms(n_tiles, heads, batch, sm_count):
        return rule(n_tiles, heads, batch, sm_count or 4)

    for mod in (m2d, m2v):
        monkeypatch.setattr(mod, "p_split_rule", four_sms)
    monkeypatch.setattr(gdk, "TILES_BY_BATCH", ((12, 2),))
    assert [four_sms(3, 2, b, None) for b in (1, 12)] == [3, 1]
    return 12  # row_order_from


class _Recorder:
    """Stands in for a Triton kernel: records each launch's grid without its batch dimension, and its
    constexpr keywords, and runs nothing."""

    def __init__(self, batch_axis: int):
        self.axis, self.launches = batch_axis, []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            g = [grid[i] for i in range(len(grid)) if i != self.axis]
            self.launches.append((tuple(g), {k: v for k, v in kw.items() if k.isupper() and k != "BLOCK_B"}))

        return launch


def _configs(monkeypatch, name: str, batches, **kw) -> list:
    """The launch configurations (grid less the batch axis, constexprs) of ``name`` at each batch."""
    op, shape, T = OPS[name]
    targets = {"mamba2_decode": [(m2d, "_mamba2_replay_decode_fwd_kernel", 1)],
               "mamba2_verify": [(m2v, "_launch_fma", None)],
               "gdn_decode": [(gdk, "gdn_replay_decode_fwd_kernel", 2)],
               "gdn_verify": [(gvk, "gdn_verify_window_kernel", 2)]}[name]
    out = []
    for batch in batches:
        recs = []
        for mod, attr, axis in targets:
            if axis is None:  # Mamba-2 verify: record the FMA launcher's arguments
                seen = []
                monkeypatch.setattr(mod, attr, lambda cfg, args, flags, grid, *a, _s=seen: _s.append(
                    ((grid[0],), {"P_SPLIT": a[-2], "NUM_PT": a[4]})))
                recs.append(seen)
            else:
                r = _Recorder(axis)
                monkeypatch.setattr(mod, attr, r)
                recs.append(r.launches)
        w = run_world(op, shape, batch, pos=batch - 1, steps=1, L=4, T=T, device=DEV, **kw)
        assert w.outputs
        out.append([launch for rec in recs for launch in rec])
    return out


@pytest.mark.parametrize("name", list(OPS))
def test_pinned_launch_is_one_configuration(monkeypatch, small_batch_thresholds, name):
    """``batch_invariant=True``: the same grid (less the batch axis) and constexprs at batch 1, 12 and
    64, i.e. the same compiled kernel and the same program for each row; the default's differ."""
    default = _configs(monkeypatch, name, (1, 12))
    assert default[0] != default[1], f"{name}: the default launch does not flip between batch 1 and 12"
    pinned = _configs(monkeypatch, name, (1, 12, 64), batch_invariant=True)
    assert pinned[0] == pinned[1] == pinned[2], f"{name}: pinned launches differ: {pinned}"


@pytest.mark.parametrize("name", list(OPS))
def test_batch1_equals_batch12_bitwise(small_batch_thresholds, interpreter_bf16_rtne, name):
    """The same request (inputs, slot, initial checkpoint) at batch 1 and at position 5 of batch 12
    (other rows random, random forced flushes and accepted counts): its output after every step and
    its slot's checkpoint and ring rows, bit for bit, with ``batch_invariant=True``."""
    op, shape, T = OPS[name]
    kw = dict(T=T, L=6 if T else 4, steps=10, device=DEV, batch_invariant=True,
              row_order_from=small_batch_thresholds)
    w1 = run_world(op, shape, 1, pos=0, **kw)
    w12 = run_world(op, shape, 12, pos=5, **kw)
    assert w1.flushes >= 2 and w12.mixed >= 5, (w1.flushes, w12.mixed)  # both row kinds, mixed batches
    assert compare_worlds(w1, w12) == []


def test_driver_sees_a_changed_row():
    """The comparison is not vacuous: a different target request (its stream moved by one step) differs."""
    op, shape, T = OPS["mamba2_decode"]
    a = run_world(op, shape, 1, steps=3, L=4, device=DEV)
    b = run_world(op, shape, 1, steps=3, L=4, device=DEV)
    assert compare_worlds(a, b) == []
    b.outputs[1], b.slot[2]["ring_x"] = b.outputs[0], b.slot[2]["ring_x"].nan_to_num(1.0)
    diffs = compare_worlds(a, b)
    assert any("step 1: output" in d for d in diffs) and any("step 2: ring_x" in d for d in diffs)


def test_pin_keeps_the_default_launch_without_the_flag(monkeypatch, small_batch_thresholds):
    """``batch_invariant=False`` (the default) is the measured launch: P-split at small batch, tiles
    and window tile by batch."""
    assert _configs(monkeypatch, "gdn_decode", (12,))[0][0][1]["TILES"] == 2
    assert _configs(monkeypatch, "gdn_decode", (12,), batch_invariant=True)[0][0][1]["TILES"] == 1
    assert _configs(monkeypatch, "gdn_verify", (1,))[0][0][1]["BV"] == gvk.SMALL_BLOCK_V
    assert _configs(monkeypatch, "gdn_verify", (1,), batch_invariant=True)[0][0][1]["BV"] == gvk.WINDOW_BLOCK_V
    assert _configs(monkeypatch, "mamba2_decode", (1,))[0][0][1]["P_SPLIT"] == 3
    assert _configs(monkeypatch, "mamba2_decode", (1,), batch_invariant=True)[0][0][1]["P_SPLIT"] == 1


# ------------------------------------------------------------------ GPU: the real shapes and thresholds

NANO_4B = Shape("mamba2", heads=96, groups=8, rows=80, cols=128)
QWEN35_4B = Shape("gdn", heads=32, groups=16, rows=128, cols=128)


@pytest.mark.gpu
@pytest.mark.parametrize("name,shape,T,batch,pos", [
    ("mamba2_decode", NANO_4B, None, 12, 5),  # P-split 5 at batch 1 on 132 SMs, none at 12
    ("mamba2_verify", NANO_4B, 4, 12, 5),
    ("gdn_decode", QWEN35_4B, None, 64, 37),  # two tiles per program and flush-first order at 64
    ("gdn_decode", QWEN35_4B, None, 256, 200),  # four from 256
    ("gdn_verify", QWEN35_4B, 4, 12, 5),  # window BV 64 at batch 1, 128 at 12
], ids=["mamba2-decode-b12", "mamba2-verify-b12", "gdn-decode-b64", "gdn-decode-b256", "gdn-verify-b12"])
def test_gpu_batch1_equals_batch_n_bitwise(name, shape, T, batch, pos):
    """Compiled, at the real shapes, with the launches' own thresholds: the request at batch 1 and at
    ``pos`` of ``batch`` rows gives the same bits with ``batch_invariant=True`` (L = 16, two ring cycles)."""
    op = OPS[name][0]
    kw = dict(T=T, L=16, steps=24 if T else 36, device="cuda", batch_invariant=True,
              row_order_from=gdk.FLUSH_FIRST_MIN_BATCH)
    w1 = run_world(op, shape, 1, pos=0, **kw)
    wn = run_world(op, shape, batch, pos=pos, **kw)
    assert w1.flushes >= 2
    assert compare_worlds(w1, wn) == []
