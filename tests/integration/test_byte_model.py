"""The shared byte model (``sglang_replayssm.byte_model``): the steady verify cycle, the verify
cycle mean, the dims types the benchmarks' shape presets extend, and the read copy's sizes. Its per-kernel numbers are
checked against math.md and kernels/README.md in ``tests/benchmarks/test_bytes_model.py`` and
``test_bench_verify.py`` (the benchmarks re-export it) and at the serving shapes in
``tests/integration/test_heuristic.py``."""

from __future__ import annotations

import pytest

from benchmarks.shapes import GDN_TINY, MAMBA2_TINY, NANO_4B, QWEN35_4B
from sglang_replayssm.byte_model import (
    GDNDims,
    Mamba2Dims,
    gdn_replay_verify_bytes,
    mamba2_replay_verify_bytes,
    verify_cycle,
)


def test_verify_cycle_at_full_acceptance() -> None:
    assert verify_cycle(16, 4, 4) == [(4, False), (8, False), (12, False), (16, True)]
    # F = floor(max(L - T, 0)/a) + 1 steps, integral here
    for L, t in ((16, 4), (16, 8), (8, 2), (4, 4), (2, 4)):
        assert len(verify_cycle(L, t, t)) == max(L - t, 0) / t + 1
    assert verify_cycle(2, 4, 4) == [(4, True)]  # T > L: every verify flushes
    assert verify_cycle(16, 4, 3) == [(3, False), (6, False), (9, False), (12, False), (15, True)]
    for L, t in ((16, 4), (16, 8), (5, 3)):
        assert all(n + t <= max(L, t) + t for n, _ in verify_cycle(L, t, t))  # fits R = max(L, T) + T


@pytest.mark.parametrize(("args", "match"), [((16, 4, 5), "expected 1 <= a <= T = 4, got a = 5"),
                                             ((16, 4, 0), "expected 1 <= a <= T = 4, got a = 0"),
                                             ((0, 4, 4), "L, T: expected >= 1, got 0, 4"),
                                             ((16, 0, 1), "L, T: expected >= 1, got 16, 0")])
def test_verify_cycle_refuses(args: tuple[int, int, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        verify_cycle(*args)


def test_verify_cycle_mean() -> None:
    model = gdn_replay_verify_bytes(GDN_TINY, 2, 4, 2, 4)
    cycle = verify_cycle(8, 2, 1)
    assert model.cycle_mean(cycle) == sum(model.step(h, f).total for h, f in cycle) / len(cycle)
    # mean history a·(F+1)/2 over F = 7 steps; S written once, and read once more on the flush row (GDN)
    S, I = model.S, model.I  # noqa: E741
    want = (S + 2 * S / 7 + (21 * model.ring_read_nonflush + 7 * model.ring_read_flush) / 7
            + 2 * model.ring_write + 2 * I)
    assert model.cycle_mean(cycle) == pytest.approx(want)
    m2 = mamba2_replay_verify_bytes(MAMBA2_TINY, 2)  # one launch: S read once on the flush row too
    assert m2.cycle_mean([(1, False), (2, True)]) == (3 * m2.S + 3 * m2.ring_read_flush) / 2 + 2 * (
        m2.ring_write + m2.I)


def test_benchmark_shapes_are_dims() -> None:
    assert isinstance(NANO_4B, Mamba2Dims) and isinstance(QWEN35_4B, GDNDims)
    assert mamba2_replay_verify_bytes(NANO_4B, 4) == mamba2_replay_verify_bytes(
        Mamba2Dims(H=96, P=80, N=128, G=8), 4)
    assert gdn_replay_verify_bytes(QWEN35_4B, 4) == gdn_replay_verify_bytes(GDNDims(HV=32, Hk=16, K=128, V=128), 4)


def test_read_copy_sizes_and_refresh() -> None:
    """``read_copy_size`` from element sizes is ``read_copy_bytes`` by dtype name (fp8: e4m3 values and
    one fp32 scale per state row); a refresh outside the kernels reads ``S`` and writes ``S_r``; only a
    ring (phased) verify model takes a copy."""
    from sglang_replayssm.byte_model import (
        READ_COPY_BYTES,
        READ_COPY_SCALE_BYTES,
        mamba2_snapshot_verify_bytes,
        read_copy_bytes,
        read_copy_refresh_bytes,
        read_copy_size,
        verify_read_copy_bytes,
    )

    for shape in (NANO_4B, QWEN35_4B, MAMBA2_TINY, GDN_TINY):
        for rd in READ_COPY_BYTES:
            assert read_copy_bytes(shape, rd) == read_copy_size(shape, READ_COPY_BYTES[rd], READ_COPY_SCALE_BYTES[rd])
    assert read_copy_size(NANO_4B, 1, 4) == 96 * 80 * (128 + 4) == 1_013_760
    assert read_copy_size(QWEN35_4B, 2) == 32 * 128 * 128 * 2 == 1_048_576
    assert read_copy_size(GDNDims(HV=32, Hk=16, K=128, V=128), 1, 4) == 540_672  # rows HV·V, scaled over K
    step = read_copy_refresh_bytes(2_097_152, 540_672)
    assert (step.state_read, step.state_write, step.ring_read, step.ring_write, step.io) == (2_097_152, 540_672, 0,
                                                                                             0, 0)
    with pytest.raises(ValueError, match="expected a phased"):
        verify_read_copy_bytes(mamba2_snapshot_verify_bytes(NANO_4B, 4), 1_013_760, "fp8")
