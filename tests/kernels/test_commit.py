"""Speculative-verify cursors: ``verify_cursor_step`` and ``verify_commit`` (kernel and reference).

The cursor protocol is checked on its own here (no SSM): a per-slot model of the ring
(``(start, len)`` and the flush rule) is driven over many steps with random accepted counts
(``a = 1``, partial, ``a = T``), forced flushes and plain decode steps
(``decode_cursor_step``) mixed in, and every step checks the snapshot, the flush decision, the
cursors after the commit, that untouched slots (and slot 0) keep their cursors, and that no row
ever needs more than ``R`` ring rows. The SSM outputs on top of this protocol are checked in
``test_mamba2_verify.py``.
"""

from __future__ import annotations

import pytest
import torch

from replayssm_kernels import (
    decode_cursor_step,
    min_ring_size,
    verify_commit,
    verify_commit_ref,
    verify_cursor_step,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
COMMITS = {"kernel": verify_commit, "ref": verify_commit_ref}


@pytest.mark.parametrize("impl", ["kernel", "ref"])
@pytest.mark.parametrize("T", [1, 2, 4, 8], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("L", [1, 4, 16], ids=lambda v: f"L{v}")
def test_protocol_model(impl, T, L):
    gen = torch.Generator().manual_seed(17 * T + L)
    R = min_ring_size(L, T) + int(torch.randint(0, 3, (1,), generator=gen))
    slots, active, pads = 9, 5, 2
    cursors = torch.zeros(slots, 2, dtype=torch.int32, device=DEVICE)
    act = (torch.randperm(slots - 1, generator=gen)[:active] + 1).tolist()
    model = {s: [0, 0] for s in act}  # start, len
    batch = active + pads
    n_flush = n_decode = 0
    seen_a = set()
    for step in range(60):
        rows = torch.tensor(act + [-1] * pads)[torch.randperm(batch, generator=gen)]
        slot_idx = rows.to(device=DEVICE, dtype=torch.int32)
        force = (torch.rand(batch, generator=gen) < 0.1).to(DEVICE)
        rs = torch.full((batch,), 99, dtype=torch.int32, device=DEVICE)
        rl = rs.clone()
        fl = torch.ones(batch, dtype=torch.bool, device=DEVICE)
        before = cursors.clone()
        if torch.rand(1, generator=gen).item() < 0.25:  # plain decode step on the same ring
            n_decode += 1
            decode_cursor_step(cursors, slot_idx, force, L, R, rs, rl, fl)
            for b, s in enumerate(rows.tolist()):
                if s < 0:
                    continue
                st, ln = model[s]
                want_fl = ln >= L - 1 or bool(force[b])
                assert (int(rs[b]), int(rl[b]), bool(fl[b])) == (st, ln, want_fl)
                if want_fl:
                    model[s] = [(st + ln) % R, 0]
                else:
                    assert ln + 1 <= R  # the appended row fits
                    model[s] = [st, ln + 1]
        else:
            verify_cursor_step(cursors, slot_idx, force, L, R, T, rs, rl, fl)
            assert torch.equal(cursors, before), "verify_cursor_step must not move the cursors"
            a = torch.randint(1, T + 1, (batch,), generator=gen)
            a[torch.rand(batch, generator=gen) < 0.3] = 1  # all-reject
            a[torch.rand(batch, generator=gen) < 0.3] = T  # all-accept
            flush_next = torch.ones(batch, dtype=torch.bool, device=DEVICE)
            COMMITS[impl](cursors, slot_idx, rs, rl, fl, a.to(DEVICE), window=L, ring_size=R,
                          num_tokens=T, out_flush_next=flush_next)
            for b, s in enumerate(rows.tolist()):
                if s < 0:
                    assert (int(rs[b]), int(rl[b]), bool(fl[b])) == (0, 0, False)
                    assert not bool(flush_next[b])
                    continue
                st, ln = model[s]
                want_fl = ln + T > L or bool(force[b])
                assert (int(rs[b]), int(rl[b]), bool(fl[b])) == (st, ln, want_fl)
                assert ln + T <= R, "history + window must fit the ring"
                if not want_fl:
                    assert ln + T <= L, "a non-flush verify keeps at most L rows"
                ai = int(a[b])
                seen_a.add((ai == 1, ai == T))
                n_flush += want_fl
                model[s] = [(st + ln) % R, ai] if want_fl else [st, ln + ai]
                assert bool(flush_next[b]) == (model[s][1] + T > L)
        for s in range(slots):
            want = model.get(s, [0, 0])
            assert cursors[s].tolist() == want, f"slot {s}: {cursors[s].tolist()} != {want}"
    assert n_flush > 0 and n_decode > 0
    assert (True, False) in seen_a or T == 1  # all-reject seen
    assert (False, True) in seen_a or T <= 2  # all-accept seen


def test_commit_padding_and_empty_batch():
    cursors = torch.tensor([[0, 0], [3, 2], [5, 1]], dtype=torch.int32, device=DEVICE)
    e = torch.empty(0, dtype=torch.int32, device=DEVICE)
    verify_commit(cursors, e, e, e, e.bool(), e, window=4, ring_size=8, num_tokens=2)
    slot_idx = torch.tensor([-1, 2, -1], dtype=torch.int64, device=DEVICE)
    rs = torch.tensor([7, 5, 7], dtype=torch.int32, device=DEVICE)
    rl = torch.tensor([7, 1, 7], dtype=torch.int32, device=DEVICE)
    fl = torch.tensor([True, True, True], device=DEVICE)
    a = torch.tensor([2, 2, 2], dtype=torch.int64, device=DEVICE)
    verify_commit(cursors, slot_idx, rs, rl, fl, a, window=4, ring_size=8, num_tokens=2)
    assert cursors.tolist() == [[0, 0], [3, 2], [6, 2]]


@pytest.mark.parametrize("impl", ["kernel", "ref"])
def test_commit_value_errors(impl):
    fn = COMMITS[impl]
    c = torch.zeros(4, 2, dtype=torch.int32, device=DEVICE)
    i = torch.zeros(3, dtype=torch.int32, device=DEVICE)
    f = torch.zeros(3, dtype=torch.bool, device=DEVICE)
    ok = dict(window=4, ring_size=8, num_tokens=4)
    with pytest.raises(ValueError, match="ring_size"):
        fn(c, i, i, i, f, i, window=4, ring_size=7, num_tokens=4)
    with pytest.raises(ValueError, match="num_tokens"):
        fn(c, i, i, i, f, i, window=4, ring_size=8, num_tokens=0)
    with pytest.raises(ValueError, match="cursors"):
        fn(c.long(), i, i, i, f, i, **ok)
    with pytest.raises(ValueError, match="cursors"):
        fn(torch.zeros(2, 4, dtype=torch.int32)[:, ::2], i, i, i, f, i, **ok)
    with pytest.raises(ValueError, match="flush"):
        fn(c, i, i, i, f.int(), i, **ok)
    with pytest.raises(ValueError, match="accepted"):
        fn(c, i, i, i, f, i[:2], **ok)
    with pytest.raises(ValueError, match="accepted"):
        fn(c, i, i, i, f, i.float(), **ok)
    with pytest.raises(ValueError, match="out_flush_next"):
        fn(c, i, i, i, f, i, out_flush_next=i, **ok)
    with pytest.raises(ValueError, match="ring_size"):
        verify_cursor_step(c, i, None, 4, 7, 4, i, i, f)
    with pytest.raises(ValueError, match="cursors"):
        verify_cursor_step(c.long(), i, None, 4, 8, 4, i, i, f)


# --------------------------------------------------------------------------------------------
# verify_cursor_step: the one-launch kernel vs its torch reference (bitwise)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("T", [1, 2, 4, 8], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("late", [False, True], ids=["early", "late"])
def test_cursor_step_kernel_vs_reference(T, layout, late):
    """Random cursors (starts anywhere in ``[0, R)``, so the window wraps the ring; lengths from 0
    to the largest history), ``-1`` padding rows, forced flushes, ``flush_nonempty``, int32 and
    int64 slots, strided views of every tensor, and a batch over one program (300 rows): the
    kernel's snapshot and flush decisions equal the reference's bitwise, the cursors never
    move, and untouched output entries of a strided view stay as they were; under both flush
    rules (``late_flush``: ``len + T > max(L, T) + T``, lengths then up to ``R``)."""
    from replayssm_kernels.commit import verify_cursor_step_ref

    gen = torch.Generator().manual_seed(T)
    for L in (1, 4, 16):
        R = min_ring_size(L, T) + int(torch.randint(0, 3, (1,), generator=gen))
        slots = 400
        for batch, idx_dtype, force_on, nonempty in ((7, torch.int32, True, False),
                                                     (300, torch.int64, False, False),
                                                     (33, torch.int32, True, True),
                                                     (1, torch.int64, False, True)):
            hist = R if late else max(L, T)
            cur = torch.stack([torch.randint(0, R, (slots,), generator=gen),
                               torch.randint(0, hist + 1, (slots,), generator=gen)], 1)
            perm = torch.randperm(slots - 1, generator=gen)[:batch] + 1
            perm[torch.rand(batch, generator=gen) < 0.25] = -1  # padding rows
            force = torch.rand(batch, generator=gen) < 0.2
            got = []
            for fn in (verify_cursor_step, verify_cursor_step_ref):
                if layout == "strided":  # every tensor a view with non-unit strides
                    cursors = torch.zeros(2, slots, dtype=torch.int32, device=DEVICE).t()
                    cursors.copy_(cur)
                    slot_idx = torch.full((2 * batch,), 7, dtype=idx_dtype,
                                          device=DEVICE)[::2]
                    slot_idx.copy_(perm)
                    f = torch.zeros(2 * batch, dtype=torch.bool, device=DEVICE)[1::2]
                    f.copy_(force)
                    backing = [torch.full((3 * batch,), 99, dtype=torch.int32, device=DEVICE),
                               torch.full((3 * batch,), 99, dtype=torch.int32, device=DEVICE),
                               torch.ones(3 * batch, dtype=torch.bool, device=DEVICE)]
                    rs, rl, fl = (b[1::3] for b in backing)
                else:
                    cursors = cur.to(device=DEVICE, dtype=torch.int32)
                    slot_idx = perm.to(device=DEVICE, dtype=idx_dtype)
                    f = force.to(DEVICE)
                    rs = torch.full((batch,), 99, dtype=torch.int32, device=DEVICE)
                    rl = rs.clone()
                    fl = torch.ones(batch, dtype=torch.bool, device=DEVICE)
                    backing = [rs, rl, fl]
                before = cursors.clone()
                fn(cursors, slot_idx, f if force_on else None, L, R, T, rs, rl, fl,
                   flush_nonempty=nonempty, late_flush=late)
                assert torch.equal(cursors, before), "the cursor step moved the cursors"
                got.append([b.clone() for b in backing])
            for a, b in zip(*got):
                assert torch.equal(a, b), f"L={L} batch={batch}: kernel != reference"
            rs, rl, fl = got[0] if layout == "contiguous" else (b[1::3] for b in got[0])
            pad = perm < 0
            assert (rs.cpu()[pad] == 0).all() and (rl.cpu()[pad] == 0).all()
            assert not fl.cpu()[pad].any()
            live = ~pad
            want = cur[perm.clamp(min=0)]
            want_fl = want[:, 1] + T > (min_ring_size(L, T) if late else L)
            if force_on:
                want_fl |= force
            if nonempty:
                want_fl |= want[:, 1] > 0
            assert torch.equal(rs.cpu()[live], want[live, 0].int())
            assert torch.equal(rl.cpu()[live], want[live, 1].int())
            assert torch.equal(fl.cpu()[live], want_fl[live])
            if layout == "strided":  # the entries between the views' rows were not written
                for b, fill in zip(got[0], (99, 99, True)):
                    assert (b.cpu()[0::3] == fill).all() and (b.cpu()[2::3] == fill).all()


def test_cursor_step_value_errors():
    from replayssm_kernels.commit import verify_cursor_step_ref

    c = torch.zeros(4, 2, dtype=torch.int32, device=DEVICE)
    i = torch.zeros(3, dtype=torch.int32, device=DEVICE)
    f = torch.zeros(3, dtype=torch.bool, device=DEVICE)
    for fn in (verify_cursor_step, verify_cursor_step_ref):
        with pytest.raises(ValueError, match="out_start: expected"):
            fn(c, i, None, 4, 8, 4, i[:2], i, f)
        with pytest.raises(ValueError, match="out_flush: expected"):
            fn(c, i, None, 4, 8, 4, i, i, i)
        with pytest.raises(ValueError, match="force_flush: expected"):
            fn(c, i, i, 4, 8, 4, i, i, f)
        with pytest.raises(ValueError, match="slot_idx: expected"):
            fn(c, i.float(), None, 4, 8, 4, i, i, f)
        fn(c, i[:0], None, 4, 8, 4, i[:0], i[:0], f[:0])  # empty batch: a no-op


@pytest.mark.parametrize("impl", ["kernel", "ref"])
def test_commit_accepted_offset(impl):
    """``accepted_offset=1`` on ``a - 1`` (int64, SGLang's last_correct_step_indices) gives the
    same cursors and flush_next as ``a``; the kernel's rows are ``accepted``'s (a longer
    snapshot's extra rows are not read)."""
    from replayssm_kernels.commit.kernel import verify_commit_fwd

    gen = torch.Generator().manual_seed(5)
    L, T = 4, 4
    R = min_ring_size(L, T)
    cur = torch.stack([torch.randint(0, R, (12,), generator=gen),
                       torch.randint(0, L + 1, (12,), generator=gen)], 1).int()
    slot_idx = torch.tensor([3, -1, 7, 1, 9, 2], dtype=torch.int32)
    rs, rl = cur[slot_idx.clamp(min=0).long(), 0].clone(), cur[slot_idx.clamp(min=0).long(), 1].clone()
    fl = torch.tensor([True, False, False, True, False, True])
    a = torch.randint(1, T + 1, (6,), generator=gen)
    outs = []
    for acc, off in ((a.int(), 0), (a - 1, 1)):
        c = cur.clone().to(DEVICE)
        fn_next = torch.zeros(6, dtype=torch.bool, device=DEVICE)
        args = [t.to(DEVICE) for t in (slot_idx, rs, rl, fl, acc)]
        COMMITS[impl](c, *args, window=L, ring_size=R, num_tokens=T, out_flush_next=fn_next,
                      accepted_offset=off)
        outs.append((c, fn_next))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    if impl == "kernel":  # 4 of 6 rows: rows 4, 5 (slots 9, 2) keep their cursors
        c = cur.clone().to(DEVICE)
        args = [t.to(DEVICE) for t in (slot_idx, rs, rl, fl)]
        verify_commit_fwd(c, *args, (a - 1)[:4].to(DEVICE), window=L, ring_size=R,
                          num_tokens=T, accepted_offset=1)
        want = outs[1][0].clone()
        want[[9, 2]] = cur[[9, 2]].to(DEVICE)
        assert torch.equal(c, want)
    with pytest.raises(ValueError, match="accepted_offset"):
        COMMITS[impl](cur.clone().to(DEVICE), *(t.to(DEVICE) for t in (slot_idx, rs, rl, fl, a)),
                      window=L, ring_size=R, num_tokens=T, accepted_offset=2)


@pytest.mark.parametrize("impl", ["kernel", "ref"])
def test_commit_late_flush(impl):
    """``late_flush=True``: the same cursor move (flush rows ``start += len``, ``len = a``; others
    ``len += a``) from snapshots whose flush rows hold up to ``R`` records, and ``out_flush_next``
    by the late rule (``new_len + T > R``) where the early one says ``> L``."""
    gen = torch.Generator().manual_seed(9)
    L, T = 6, 3
    R = min_ring_size(L, T)
    slots, batch = 16, 10
    cur = torch.stack([torch.randint(0, R, (slots,), generator=gen),
                       torch.randint(0, R + 1, (slots,), generator=gen)], 1).int()
    slot_idx = torch.randperm(slots - 1, generator=gen)[:batch].int() + 1
    slot_idx[3] = -1
    snap = cur[slot_idx.clamp(min=0).long()]
    rs, rl = snap[:, 0].clone(), snap[:, 1].clone()
    rl[:2] = torch.tensor([R, R - 1], dtype=rl.dtype)  # flush rows past R - T
    fl = rl + T > R  # the late rule's decisions
    rl = torch.where(fl, rl, rl.clamp(max=R - T))  # non-flush rows: len + T <= R
    a = torch.randint(1, T + 1, (batch,), generator=gen).int()
    c = cur.clone().to(DEVICE)
    nxt = torch.zeros(batch, dtype=torch.bool, device=DEVICE)
    COMMITS[impl](c, *(t.to(DEVICE) for t in (slot_idx, rs, rl, fl, a)), window=L, ring_size=R,
                  num_tokens=T, out_flush_next=nxt, late_flush=True)
    c, nxt = c.cpu(), nxt.cpu()
    for b in range(batch):
        s = int(slot_idx[b])
        if s < 0:
            assert not nxt[b]
            continue
        want = ((int(rs[b]) + int(rl[b])) % R, int(a[b])) if fl[b] else (int(rs[b]),
                                                                           int(rl[b]) + int(a[b]))
        assert tuple(c[s].tolist()) == want, (b, tuple(c[s].tolist()), want)
        assert bool(nxt[b]) == (want[1] + T > R), b
    assert bool(fl.any()) and bool((rl[fl] + T > R).any())
