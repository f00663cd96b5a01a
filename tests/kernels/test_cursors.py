"""``decode_cursor_step`` (Triton; the interpreter on CPU) against ``decode_cursor_step_ref``.

Random decode steps over a pool of slots: live rows in random order, padding rows (``-1``), forced
flushes, window 1 (every row flushes) and non-contiguous cursor views.  After every step the
snapshot, the flush decision and the whole cursor table must equal the reference's exactly, and
slots not in the batch (the null slot included) must be unchanged.
"""

from __future__ import annotations

import pytest
import torch
from replayssm_kernels import decode_cursor_step, decode_cursor_step_ref

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _step(fn, cursors, slot_idx, force, L, R):
    B = slot_idx.shape[0]
    outs = (torch.full((B,), -7, dtype=torch.int32, device=cursors.device),
            torch.full((B,), -7, dtype=torch.int32, device=cursors.device),
            torch.ones(B, dtype=torch.bool, device=cursors.device))
    fn(cursors, slot_idx, force, L, R, *outs)
    return outs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("L,R,noncontig,idx64", [(16, 16, False, False), (4, 7, True, True), (1, 1, False, True),
                                                 (16, 24, True, False)])
def test_kernel_equals_reference(device, L, R, noncontig, idx64):
    g = torch.Generator().manual_seed(L * 100 + R)
    slots = 12
    base = torch.zeros(slots, 4 if noncontig else 2, dtype=torch.int32, device=device)
    cur_k = base[:, ::2] if noncontig else base
    cur_r = cur_k.clone()
    for step in range(3 * L + 5):
        live = torch.randperm(slots - 1, generator=g)[: 1 + step % 8] + 1
        rows = live.tolist() + [-1] * (step % 3)
        rows = [rows[i] for i in torch.randperm(len(rows), generator=g).tolist()]
        slot_idx = torch.tensor(rows, dtype=torch.int64 if idx64 else torch.int32, device=device)
        force = (torch.rand(len(rows), generator=g) < 0.2).to(device) if step % 2 else None
        untouched = [s for s in range(slots) if s not in rows]
        before = cur_k.clone()
        got = _step(decode_cursor_step, cur_k, slot_idx, force, L, R)
        want = _step(decode_cursor_step_ref, cur_r, slot_idx, force, L, R)
        for a, b, name in zip(got, want, ("start", "len", "flush")):
            assert torch.equal(a, b), f"step {step}: {name} {a.tolist()} != {b.tolist()}"
        assert torch.equal(cur_k, cur_r), f"step {step}: cursor tables differ"
        assert torch.equal(cur_k[untouched], before[untouched]), f"step {step}: untouched slots changed"
        pad = slot_idx < 0
        assert not got[2][pad].any() and not got[0][pad].any() and not got[1][pad].any()
        if L == 1:
            assert bool(got[2][~pad].all()), "window 1: every live row flushes"
        assert int(cur_k[:, 1].max()) <= L - 1
    if noncontig:
        assert not base[:, 1::2].any(), "the other half of the allocation was written"


@pytest.mark.parametrize("fn", [decode_cursor_step, decode_cursor_step_ref])
@pytest.mark.parametrize("bad,match", [
    (dict(cursors=torch.zeros(4, 3, dtype=torch.int32)), "cursors: expected \\[slots, 2\\] int32"),
    (dict(cursors=torch.zeros(4, 2, dtype=torch.int64)), "cursors: expected \\[slots, 2\\] int32"),
    (dict(slot_idx=torch.zeros(3)), "slot_idx: expected \\[batch\\] int32 or int64"),
    (dict(out_len=torch.zeros(2, dtype=torch.int32)), "out_len: expected \\[3\\] torch.int32"),
    (dict(out_flush=torch.zeros(3, dtype=torch.int32)), "out_flush: expected \\[3\\] torch.bool"),
    (dict(force_flush=torch.zeros(3, dtype=torch.int32)), "force_flush: expected \\[3\\] torch.bool"),
    (dict(window=0), "window: expected >= 1"),
    (dict(ring_size=3), "ring_size: expected >= window"),
])
def test_value_errors(fn, bad, match):
    args = dict(cursors=torch.zeros(4, 2, dtype=torch.int32), slot_idx=torch.tensor([1, -1, 2], dtype=torch.int32),
                force_flush=None, window=4, ring_size=4, out_start=torch.zeros(3, dtype=torch.int32),
                out_len=torch.zeros(3, dtype=torch.int32), out_flush=torch.zeros(3, dtype=torch.bool))
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        fn(**args)
