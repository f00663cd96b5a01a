"""Per-forward cursor metadata (``sglang_replayssm.metadata``): snapshot, advance, flush, reset, graph buffers."""

from __future__ import annotations

import pytest
import torch

from sglang_replayssm.metadata import GraphBuffers, build_eager, reset_extend_rows

L, R = 4, 4


def _cursors(n: int = 8) -> torch.Tensor:
    return torch.zeros(n, 2, dtype=torch.int32)


def test_decode_rows_advance_and_flush_every_L_steps():
    cur = _cursors()
    slots = torch.tensor([3, 5], dtype=torch.int32)
    flushes = []
    for step in range(2 * L + 1):
        s = build_eager(cursors=cur, slot_idx=slots, num_prefills=0, num_decodes=2, track_mask=None, window=L, rows=R)
        assert s.ring_len.tolist() == [step % L] * 2
        flushes.append(bool(s.flush[0]))
    # flush when len == L-1: steps 3 and 7
    assert flushes == [False, False, False, True, False, False, False, True, False]
    # each flush folds its L-1 records: start advances by L-1 (mod R)
    assert cur[3].tolist() == cur[5].tolist() == [(2 * (L - 1)) % R, 1]
    assert cur[0].tolist() == [0, 0] and cur[4].tolist() == [0, 0]  # untouched slots


def test_window_one_flushes_every_row():
    cur = _cursors()
    slots = torch.tensor([1, 2, 3], dtype=torch.int32)
    for _ in range(3):
        s = build_eager(cursors=cur, slot_idx=slots, num_prefills=0, num_decodes=3, track_mask=None, window=1, rows=1)
        assert s.flush.all() and (s.ring_len == 0).all()


def test_track_mask_forces_flush_of_exactly_those_rows():
    cur = _cursors()
    slots = torch.tensor([1, 2], dtype=torch.int32)
    build_eager(cursors=cur, slot_idx=slots, num_prefills=0, num_decodes=2, track_mask=None, window=L, rows=R)
    s = build_eager(
        cursors=cur, slot_idx=slots, num_prefills=0, num_decodes=2,
        track_mask=torch.tensor([False, True]), window=L, rows=R,
    )
    assert s.flush.tolist() == [False, True]
    assert cur[1].tolist() == [0, 2] and cur[2].tolist() == [1, 0]  # slot 2 folded its 1 record


def test_padding_rows_touch_nothing():
    cur = _cursors()
    cur[0] = torch.tensor([1, 2], dtype=torch.int32)  # null slot holds garbage; must stay as is
    slots = torch.tensor([2, -1, -1], dtype=torch.int32)
    s = build_eager(cursors=cur, slot_idx=slots, num_prefills=0, num_decodes=3, track_mask=None, window=L, rows=R)
    assert s.ring_len.tolist() == [0, 0, 0] and s.flush.tolist() == [False, False, False]
    assert cur[0].tolist() == [1, 2] and cur[2].tolist() == [0, 1]


def test_mixed_forward_resets_extend_rows_and_steps_decode_rows():
    cur = _cursors()
    cur[4] = torch.tensor([2, 3], dtype=torch.int32)  # stale cursor on a slot that now extends
    cur[6] = torch.tensor([1, 2], dtype=torch.int32)
    slots = torch.tensor([4, 6], dtype=torch.int32)  # extend row first, then the decode row
    s = build_eager(cursors=cur, slot_idx=slots, num_prefills=1, num_decodes=1, track_mask=None, window=L, rows=R)
    assert cur[4].tolist() == [0, 0]
    assert s.slot_idx.tolist() == [6] and s.ring_start.tolist() == [1] and s.ring_len.tolist() == [2]
    assert cur[6].tolist() == [1, 3]


def test_extend_only_forward_has_no_step_and_ignores_padding():
    cur = _cursors()
    cur[3] = torch.tensor([1, 1], dtype=torch.int32)
    assert build_eager(cursors=cur, slot_idx=torch.tensor([3, -1]), num_prefills=2, num_decodes=0,
                       track_mask=None, window=L, rows=R) is None
    assert cur[3].tolist() == [0, 0] and cur[7].tolist() == [0, 0]  # -1 must not wrap to the last slot
    reset_extend_rows(cur, torch.tensor([], dtype=torch.int64))


def test_graph_buffers_are_refreshed_in_place():
    cur = _cursors()
    g = GraphBuffers(4, "cpu")
    ptrs = (g.ring_start[2].data_ptr(), g.ring_len[2].data_ptr(), g.flush[2].data_ptr())
    slots = torch.tensor([1, 2, -1], dtype=torch.int32)  # bs 3, one padded row
    for step in range(L + 1):
        s = g.step(bs=3, cursors=cur, slots=slots, track_mask=None, window=L, rows=R)
        assert (s.ring_start.data_ptr(), s.ring_len.data_ptr(), s.flush.data_ptr()) == ptrs
        assert g.ring_len[2].tolist() == [step % L, step % L, 0]
        assert g.flush[2].tolist() == [step % L == L - 1] * 2 + [False]
    # a padded track mask of full length is sliced to bs
    s = g.step(bs=3, cursors=cur, slots=slots, track_mask=torch.tensor([True, False, True, True]), window=L, rows=R)
    assert s.flush.tolist() == [True, False, False]


def test_extend_rows_with_a_prefix_must_have_empty_rings():
    """Radix invariant E: a prefix row resumes from its checkpoint, so records in its ring would be
    lost; rows without a prefix start from zero and are only reset.  Padding past the requests is
    not checked against the prefix lengths."""
    cur = _cursors()
    cur[3] = torch.tensor([1, 2], dtype=torch.int32)  # stale: a fresh prefill (no prefix) may see it
    slots = torch.tensor([3, 5, -1], dtype=torch.int32)
    build_eager(cursors=cur, slot_idx=slots, num_prefills=3, num_decodes=0, track_mask=None, window=L, rows=R,
                extend_prefix_lens=torch.tensor([0, 7]))
    assert cur[3].tolist() == [0, 0]
    cur[5] = torch.tensor([2, 1], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="radix invariant E"):
        build_eager(cursors=cur, slot_idx=slots, num_prefills=3, num_decodes=0, track_mask=None, window=L,
                    rows=R, extend_prefix_lens=torch.tensor([0, 7]))
    assert cur[5].tolist() == [2, 1]  # refused before any reset


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_row_order_flush_rows_first_from_the_threshold(graph):
    """With ``order_rows_from``, batches of at least that many decode rows carry the flush-first
    launch order of this step's flush flags (forced and ring-full rows); smaller batches none."""
    cur = _cursors()
    buffers = GraphBuffers(4, "cpu", order_rows_from=3) if graph else None

    def step(slots, track):
        slots = torch.tensor(slots, dtype=torch.int32)
        track = torch.tensor(track)
        if graph:
            return buffers.step(bs=len(slots), cursors=cur, slots=slots, track_mask=track, window=L, rows=R)
        return build_eager(cursors=cur, slot_idx=slots, num_prefills=0, num_decodes=len(slots),
                           track_mask=track, window=L, rows=R, order_rows_from=3)

    assert step([1, 2], [True, False]).row_order is None  # below the threshold
    s = step([3, 4, 5, 2], [False, True, False, True])
    assert s.flush.tolist() == [False, True, False, True]
    assert s.row_order.tolist() == [1, 3, 0, 2]
    if graph:
        first = s.row_order
        s = step([3, 4, 5, 2], [True, False, False, False])
        assert s.row_order is first  # the static buffer, refreshed in place
        assert s.row_order.tolist() == [0, 1, 2, 3]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA-graph capture needs a GPU")
def test_row_order_refreshed_by_graph_replay():
    """Captured in a CUDA graph, the cursor step and ``flush_first_order`` refresh the static
    ``row_order`` on every replay (the force mask read by address)."""
    dev = torch.device("cuda")
    cur = torch.zeros(8, 2, dtype=torch.int32, device=dev)
    g = GraphBuffers(4, dev, order_rows_from=4)
    slots = torch.tensor([3, 4, 5, 2], dtype=torch.int32, device=dev)
    track = torch.zeros(4, dtype=torch.bool, device=dev)
    kw = dict(bs=4, cursors=cur, slots=slots, track_mask=track, window=L, rows=R)
    g.step(**kw)  # warm-up (compiles the kernels) outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g.step(**kw)
    for mask, want in (([False, True, False, True], [1, 3, 0, 2]), ([True, False, False, False], [0, 1, 2, 3]),
                       ([False, False, True, False], [2, 0, 1, 3])):
        track.copy_(torch.tensor(mask))
        graph.replay()
        torch.cuda.synchronize()
        assert g.flush[3].tolist() == mask and g.row_order[3].tolist() == want
