"""Speculative-verify cursors: the snapshot before a verify forward and the commit after sampling.

Both families (Mamba-2 and GDN) and both step kinds (plain decode, ``T = 1``, and verify of ``T``
tokens) share one cursor pair ``cursors[s] = (start, len)`` per slot (see ``kernels/README.md``).

- ``verify_cursor_step`` (plain torch, like ``cursors.decode_cursor_step``): snapshot
  ``(start, len)`` of the forward's rows and decide the flush: ``flush = len + T > window`` or
  forced. It does **not** advance the cursors: the accepted counts are not known yet.
- ``verify_commit`` (one Triton launch, ``_verify_commit_kernel``): after sampling, from the
  snapshot and the accepted counts ``a`` (``1 <= a <= T``, bonus token included) advance the
  cursors: flush rows ``start += len (mod R)``, ``len = a``; other rows ``len += a``. Rejected draft
  records stay in the ring past ``len``, are never read and are overwritten by the next step
  (rollback is this pointer move).

No host sync, no data-dependent shapes: both are CUDA-graph safe.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_kernels._checks import check_launch_device
from replayssm_kernels.commit._validate import validate_commit, validate_ring_sizes

__all__ = ["verify_commit", "verify_commit_fwd", "verify_cursor_step"]


def verify_cursor_step(
    cursors: torch.Tensor,
    slot_idx: torch.Tensor,
    force_flush: torch.Tensor | None,
    window: int,
    ring_size: int,
    num_tokens: int,
    out_start: torch.Tensor,
    out_len: torch.Tensor,
    out_flush: torch.Tensor,
) -> None:
    """Snapshot the cursors of one verify forward and decide its flush rows (cursors unchanged).

    A row flushes when ``len + num_tokens > window`` (early-flush rule: a non-flush verify keeps at
    most ``window`` rows in the ring, its ``len`` history plus its ``T`` window rows) or
    ``force_flush`` is set. A flush row folds its ``len`` committed records into the checkpoint
    (not the window); the verify kernels write the window at physical rows
    ``(start + len + t) % R`` in both cases. ``verify_commit`` advances the cursors afterwards.

    Parameters
    ----------
    cursors : torch.Tensor
        ``[slots, 2]`` int32 ``(start, len)`` per slot. Read only.
    slot_idx : torch.Tensor
        ``[batch]`` int32/int64 slot per row, ``-1`` for padding rows.
    force_flush : torch.Tensor or None
        ``[batch]`` bool, rows the caller wants flushed.
    window : int
        Ring window ``L >= 1`` (the decode window of ``decode_cursor_step``).
    ring_size : int
        Physical ring rows ``R >= max(L, T) + T``.
    num_tokens : int
        ``T``, tokens per verify row (last accepted token + drafts).
    out_start, out_len : torch.Tensor
        ``[batch]`` int32, written in place with the snapshot (padding rows: 0).
    out_flush : torch.Tensor
        ``[batch]`` bool, written in place with the flush decision (padding rows: False).

    Raises
    ------
    ValueError
        On a wrong shape or dtype, or ``ring_size < max(window, num_tokens) + num_tokens``.
    """
    validate_ring_sizes(window, ring_size, num_tokens)
    if cursors.dim() != 2 or cursors.shape[1] != 2 or cursors.dtype != torch.int32:
        raise ValueError(
            f"cursors: expected [slots, 2] int32, got {tuple(cursors.shape)} {cursors.dtype}"
        )
    valid = slot_idx >= 0
    safe = torch.where(valid, slot_idx, torch.zeros_like(slot_idx)).long()
    cur = cursors[safe]  # [batch, 2] gather (copy)
    start, length = cur[:, 0], cur[:, 1]
    flush = length + num_tokens > window
    if force_flush is not None:
        flush = flush | force_flush
    zero = torch.zeros_like(start)
    out_start.copy_(torch.where(valid, start, zero))
    out_len.copy_(torch.where(valid, length, zero))
    out_flush.copy_(flush & valid)


@triton.jit
def _verify_commit_kernel(
    cursors_ptr,
    slot_idx_ptr,
    ring_start_ptr,
    ring_len_ptr,
    flush_ptr,
    accepted_ptr,
    flush_next_ptr,
    batch,
    R,
    T,
    L,
    HAS_FLUSH_NEXT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    o_b = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m_b = o_b < batch
    slot = tl.load(slot_idx_ptr + o_b, mask=m_b, other=-1).to(tl.int64)
    start = tl.load(ring_start_ptr + o_b, mask=m_b, other=0).to(tl.int32)
    length = tl.load(ring_len_ptr + o_b, mask=m_b, other=0).to(tl.int32)
    fl = tl.load(flush_ptr + o_b, mask=m_b, other=0) != 0
    a = tl.load(accepted_ptr + o_b, mask=m_b, other=0).to(tl.int32)
    new_start = tl.where(fl, (start + length) % R, start)
    new_len = tl.where(fl, a, length + a)
    live = m_b & (slot >= 0)
    tl.store(cursors_ptr + slot * 2, new_start, mask=live)
    tl.store(cursors_ptr + slot * 2 + 1, new_len, mask=live)
    if HAS_FLUSH_NEXT:
        tl.store(flush_next_ptr + o_b, live & (new_len + T > L), mask=m_b)


def verify_commit_fwd(
    cursors: torch.Tensor,
    slot_idx: torch.Tensor,
    ring_start: torch.Tensor,
    ring_len: torch.Tensor,
    flush: torch.Tensor,
    accepted: torch.Tensor,
    *,
    window: int,
    ring_size: int,
    num_tokens: int,
    out_flush_next: torch.Tensor | None = None,
) -> None:
    """Launch the commit on validated arguments (no checks; see ``verify_commit``)."""
    batch = slot_idx.shape[0]
    if batch == 0:
        return
    block = min(1024, triton.next_power_of_2(batch))
    fn = out_flush_next if out_flush_next is not None else flush  # unused pointer when absent
    _verify_commit_kernel[(triton.cdiv(batch, block),)](
        cursors, slot_idx, ring_start, ring_len, flush, accepted, fn, batch, ring_size,
        num_tokens, window, HAS_FLUSH_NEXT=out_flush_next is not None, BLOCK=block, num_warps=4,
    )


def verify_commit(
    cursors: torch.Tensor,
    slot_idx: torch.Tensor,
    ring_start: torch.Tensor,
    ring_len: torch.Tensor,
    flush: torch.Tensor,
    accepted: torch.Tensor,
    *,
    window: int,
    ring_size: int,
    num_tokens: int,
    out_flush_next: torch.Tensor | None = None,
) -> None:
    """Commit one verify step: advance each row's cursors by its accepted count (one launch).

    Per row ``b`` with slot ``s = slot_idx[b] >= 0`` and snapshot ``(start, len, flush)`` from
    ``verify_cursor_step``:

    - flush row: ``cursors[s] = ((start + len) % R, a)``: the folded history leaves the ring, the
      ``a`` accepted window records (at physical rows ``(start + len + t) % R``) become logical rows
      ``0 .. a-1``;
    - other rows: ``cursors[s] = (start, len + a)``.

    Rows ``a .. T-1`` of the window (rejected drafts) are left in place, never read, and
    overwritten by the next step. Padding rows (``-1``) write nothing. Each slot may appear at most
    once per batch. ``a`` is not range-checked on the device (no sync): the caller guarantees
    ``1 <= a <= num_tokens``.

    Parameters
    ----------
    cursors : torch.Tensor
        ``[slots, 2]`` int32, contiguous. Updated in place.
    slot_idx : torch.Tensor
        ``[batch]`` int32/int64, ``-1`` = padding row.
    ring_start, ring_len : torch.Tensor
        ``[batch]`` int32/int64 snapshot of the verify step (``verify_cursor_step``).
    flush : torch.Tensor
        ``[batch]`` bool flush decision of the verify step.
    accepted : torch.Tensor
        ``[batch]`` int32/int64 accepted tokens per row, bonus token included.
    window, ring_size, num_tokens : int
        ``L``, ``R`` and ``T`` as passed to ``verify_cursor_step``.
    out_flush_next : torch.Tensor, optional
        ``[batch]`` bool, written with ``new_len + T > L`` (padding rows: False): the flush decision
        ``verify_cursor_step`` will make for these slots at the next verify of ``T`` tokens
        (without forced flushes), for integrations that build the next metadata from this one.

    Raises
    ------
    ValueError
        On a wrong shape, dtype or device, or ``ring_size < max(window, num_tokens) + num_tokens``.
    """
    validate_commit(cursors, slot_idx, ring_start, ring_len, flush, accepted, window, ring_size,
                    num_tokens, out_flush_next)
    check_launch_device("cursors", cursors)
    kw = dict(window=window, ring_size=ring_size, num_tokens=num_tokens,
              out_flush_next=out_flush_next)
    if cursors.device.type == "cuda":
        with torch.cuda.device(cursors.device):
            verify_commit_fwd(cursors, slot_idx, ring_start, ring_len, flush, accepted, **kw)
    else:
        verify_commit_fwd(cursors, slot_idx, ring_start, ring_len, flush, accepted, **kw)
