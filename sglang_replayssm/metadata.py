"""Per-forward ReplaySSM metadata: the cursor snapshot and advance, once per forward.

Every forward that runs decode rows through the ring kernels snapshots the cursors of those rows
and advances them **once**, before any layer runs (``replayssm_kernels.decode_cursor_step``).  The
layers only read the snapshot (``ReplayStep``).  Extend rows (prefill, chunked prefill including a
final one-token chunk, radix-hit suffixes) write a fresh checkpoint, so their rings are emptied here;
those that resume from a checkpoint (a prefix) must find their ring empty (``radix.py``, invariant E).

Force-flush rows: SGLang's decode radix tracking (``extra_buffer``) copies ``temporal`` and ``conv``
of the rows in ``forward_batch.mamba_track_mask`` to their track slots after the layer ran.  The copy
knows nothing of the ring, so exactly those rows must flush in this step; we pass that mask (a
device tensor, no host sync) as ``force_flush``.

Row order: a backend whose decode kernel takes a launch order (GDN, ``row_order``) sets
``order_rows_from`` (a batch size); from that many decode rows the snapshot also carries
``flush_first_order`` of the flush flags (one tiny launch per forward, the flush rows' long programs
launched first; ``replayssm_kernels.row_order``).

Two builders:

- ``build_eager``: eager forwards (decode, extend, mixed); allocates small tensors per forward.
- ``GraphBuffers``: CUDA-graph decode; per-batch-size static buffers that the captured kernels read
  by address, refreshed in place (``copy_``) on every replay; padded rows carry slot ``-1``.
  Nothing here synchronises with the host.
"""

from __future__ import annotations

import dataclasses

import torch
from replayssm_kernels import (
    decode_cursor_step,
    decode_cursor_step_ref,
    flush_first_order,
    flush_first_order_ref,
)

from sglang_replayssm.radix import check_extend_index, extend_index
from sglang_replayssm.read_copy_check import check_forward

__all__ = ["ReplayStep", "build_eager", "reset_extend_rows", "GraphBuffers", "GraphMetadataMixin"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplayStep:
    """The ring snapshot of the decode rows of one forward (read by every layer).

    Attributes
    ----------
    slot_idx : torch.Tensor
        ``[num_decodes]`` int32 physical slot per decode row, ``-1`` for padding.
    ring_start, ring_len : torch.Tensor
        ``[num_decodes]`` int32 cursor snapshot (padding rows 0).
    flush : torch.Tensor
        ``[num_decodes]`` bool, rows that fold their ring into the checkpoint this step.
    row_order : torch.Tensor or None
        ``[num_decodes]`` int32 launch order, flush rows first (``flush_first_order``), or None
        (batch order).
    """

    slot_idx: torch.Tensor
    ring_start: torch.Tensor
    ring_len: torch.Tensor
    flush: torch.Tensor
    row_order: torch.Tensor | None = None


def reset_extend_rows(cursors: torch.Tensor, extend_slots: torch.Tensor) -> None:
    """Empty the rings of the slots an extend forward writes (padding ``-1`` goes to null slot 0)."""
    if extend_slots.numel() == 0:
        return
    cursors.index_fill_(0, extend_index(cursors, extend_slots), 0)


def _check_extend(
    cursors: torch.Tensor,
    index: torch.Tensor,
    prefix_lens: torch.Tensor | None,
    prefix_lens_cpu,
) -> None:
    """Invariant E for the extend rows of one forward (``radix.check_extend_index``), choosing the rows on
    the host when SGLang gives their prefix lengths there (``forward_batch.extend_prefix_lens_cpu``):
    no row with a prefix (radix off, a fresh prefill) launches nothing, every row with one (a batch
    of radix hits) checks ``index`` without a device mask; otherwise the device lengths pick them.
    Rows past the given lengths (padding) are not checked."""
    n = index.shape[0]
    if prefix_lens_cpu is not None:
        m = min(n, len(prefix_lens_cpu))
        flags = [int(p) > 0 for p in prefix_lens_cpu[:m]]
        if not any(flags):
            return
        if all(flags):
            check_extend_index(cursors, index[:m])
            return
    if prefix_lens is None:
        return
    m = min(n, prefix_lens.shape[0])
    check_extend_index(cursors, index[:m], prefix_lens[:m])


def _step_into(
    cursors: torch.Tensor,
    slots: torch.Tensor,
    force_flush: torch.Tensor | None,
    window: int,
    rows: int,
    out_start: torch.Tensor,
    out_len: torch.Tensor,
    out_flush: torch.Tensor,
    out_order: torch.Tensor | None = None,
) -> None:
    if force_flush is not None:
        force_flush = force_flush.to(device=slots.device, dtype=torch.bool)
    step = decode_cursor_step if cursors.is_cuda else decode_cursor_step_ref
    step(cursors, slots, force_flush, window, rows, out_start, out_len, out_flush)
    if out_order is not None:
        order = flush_first_order if cursors.is_cuda else flush_first_order_ref
        order(out_flush, out_order)


def _orders(batch: int, order_rows_from: int | None) -> bool:
    return order_rows_from is not None and batch >= order_rows_from


def build_eager(
    *,
    cursors: torch.Tensor,
    slot_idx: torch.Tensor,
    num_prefills: int,
    num_decodes: int,
    track_mask: torch.Tensor | None,
    window: int,
    rows: int,
    extend_prefix_lens: torch.Tensor | None = None,
    extend_prefix_lens_cpu=None,
    order_rows_from: int | None = None,
) -> ReplayStep | None:
    """Cursor work of one eager forward; returns the decode rows' snapshot (None without decode rows).

    Parameters
    ----------
    cursors : torch.Tensor
        The pool's ``[slots, 2]`` int32 cursors (updated in place).
    slot_idx : torch.Tensor
        ``Mamba2Metadata.mamba_cache_indices``: extend rows first, then decode rows; ``-1`` padding.
    num_prefills, num_decodes : int
        Row counts (a mixed batch has both).
    track_mask : torch.Tensor or None
        ``forward_batch.mamba_track_mask`` (bool, one per row, decode rows last) or None.
    window, rows : int
        ``L`` and ``R``.
    extend_prefix_lens : torch.Tensor or None
        ``forward_batch.extend_prefix_lens`` (extend rows first): rows with a prefix resume from their
        checkpoint, so their rings must be empty (``radix.check_extend_index``, device-side assert).
        None (and no host lengths): nothing is checked.
    extend_prefix_lens_cpu : sequence of int or None
        ``forward_batch.extend_prefix_lens_cpu``, the same lengths on the host (SGLang's main path
        sets it): picks the checked rows without device work (``_check_extend``).
    order_rows_from : int or None
        From this many decode rows the snapshot carries a flush-first ``row_order``; None: never.

    Extend rows cost one index (conversion + clamp), the check (none without a prefix; index, compare,
    assert for a batch of one radix hit) and the reset (one ``index_fill_``).
    """
    if num_prefills:
        index = extend_index(cursors, slot_idx[:num_prefills])  # rows past the requests: padding (-1)
        _check_extend(cursors, index, extend_prefix_lens, extend_prefix_lens_cpu)
        cursors.index_fill_(0, index, 0)
    if not num_decodes:
        return None
    slots = slot_idx[num_prefills : num_prefills + num_decodes]
    force = track_mask[-num_decodes:] if track_mask is not None else None
    dev = slots.device
    out_start = torch.empty(num_decodes, dtype=torch.int32, device=dev)
    out_len = torch.empty(num_decodes, dtype=torch.int32, device=dev)
    out_flush = torch.empty(num_decodes, dtype=torch.bool, device=dev)
    out_order = (torch.empty(num_decodes, dtype=torch.int32, device=dev)
                 if _orders(num_decodes, order_rows_from) else None)
    _step_into(cursors, slots, force, window, rows, out_start, out_len, out_flush, out_order)
    return ReplayStep(slot_idx=slots, ring_start=out_start, ring_len=out_len, flush=out_flush,
                      row_order=out_order)


class GraphBuffers:
    """Static per-batch-size cursor and flush buffers for CUDA-graph decode.

    ``step(bs, slots, track_mask)`` refreshes the buffers of batch size ``bs`` in place and returns
    a ``ReplayStep`` whose tensors are those buffers, so a graph captured with it reads the new
    values on replay.  ``slots`` is SGLang's static ``state_indices_list[bs - 1]`` (already refreshed
    in place, padded rows ``-1``).  With ``order_rows_from``, batch sizes from it on also carry a
    static flush-first ``row_order`` buffer, refreshed by the same step.
    """

    def __init__(self, max_bs: int, device: torch.device | str, order_rows_from: int | None = None) -> None:
        self.max_bs = max_bs
        self.ring_start = [torch.zeros(i + 1, dtype=torch.int32, device=device) for i in range(max_bs)]
        self.ring_len = [torch.zeros(i + 1, dtype=torch.int32, device=device) for i in range(max_bs)]
        self.flush = [torch.zeros(i + 1, dtype=torch.bool, device=device) for i in range(max_bs)]
        self.row_order = [
            torch.arange(i + 1, dtype=torch.int32, device=device) if _orders(i + 1, order_rows_from) else None
            for i in range(max_bs)
        ]

    def snapshot(self, bs: int, slots: torch.Tensor) -> ReplayStep:
        """The ``ReplayStep`` of batch size ``bs`` over its static buffers."""
        i = bs - 1
        return ReplayStep(slot_idx=slots, ring_start=self.ring_start[i], ring_len=self.ring_len[i],
                          flush=self.flush[i], row_order=self.row_order[i])

    def step(
        self,
        *,
        bs: int,
        cursors: torch.Tensor,
        slots: torch.Tensor,
        track_mask: torch.Tensor | None,
        window: int,
        rows: int,
    ) -> ReplayStep:
        if not 1 <= bs <= self.max_bs:
            raise ValueError(f"bs: expected 1..{self.max_bs}, got {bs}")
        if slots.shape[0] != bs:
            raise ValueError(f"slots: expected [{bs}], got {tuple(slots.shape)}")
        i = bs - 1
        force = track_mask[:bs] if track_mask is not None else None
        _step_into(cursors, slots, force, window, rows, self.ring_start[i], self.ring_len[i], self.flush[i],
                   self.row_order[i])
        return self.snapshot(bs, slots)


class GraphMetadataMixin:
    """CUDA-graph metadata of both ReplaySSM backends (put before SGLang's backend in the bases).

    The host expects ``pool`` (``ReplayMambaPool``), ``window``, ``rows``, ``device`` and SGLang's
    ``state_indices_list``, and initialises ``_graph = None``, ``_graph_bs = None`` and ``_step``.
    ``init_forward_metadata_out_graph`` hands the layers the static buffers of the batch size;
    ``init_forward_metadata_in_graph``, recorded inside the captured graph, runs the cursor step
    into them, so every replay advances the cursors on the device with no host sync (and, with
    stochastic rounding, the pool's rounding counter: ``pool.advance_rounding``).  A backend
    whose decode takes a launch order sets ``order_rows_from`` (module docstring).
    """

    order_rows_from: int | None = None

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        super().init_cuda_graph_state(max_bs, max_num_tokens)
        self._graph = GraphBuffers(max_bs, self.device, self.order_rows_from)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        super().init_forward_metadata_out_graph(forward_batch, in_capture=in_capture)
        if not forward_batch.forward_mode.is_decode_or_idle():
            raise NotImplementedError(
                f"ReplaySSM: graph forward mode {forward_batch.forward_mode} is not supported"
            )
        if self._graph is None:
            raise RuntimeError("ReplaySSM: init_cuda_graph_state was not called before a graph forward")
        bs = forward_batch.batch_size
        i = bs - 1
        # SGLang refreshed state_indices_list[i] in place just now.
        self._graph_bs = bs
        self._step = self._graph.snapshot(bs, self.state_indices_list[i])
        if not in_capture:  # debug only ($SGLANG_REPLAYSSM_CHECK_READ_COPY)
            check_forward(self, self.state_indices_list[i], "decode graph")

    def init_forward_metadata_in_graph(self, forward_batch):
        super().init_forward_metadata_in_graph(forward_batch)
        bs = self._graph_bs
        if bs is None:
            return
        self.pool.advance_rounding()
        self._graph.step(
            bs=bs,
            cursors=self.pool.cursors,
            slots=self.state_indices_list[bs - 1],
            track_mask=getattr(forward_batch, "mamba_track_mask", None),
            window=self.window,
            rows=self.rows,
        )
