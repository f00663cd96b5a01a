"""Ring cursors: the one protocol shared by decode and (later) speculative verify.

Every state slot ``s`` owns one cursor pair ``cursors[s] = (start, len)`` (int32), shared by all
layers.  Logical ring row ``r`` of slot ``s`` lives at physical row ``(start + r) % R``; rows
``[0, len)`` are committed records not yet folded into the checkpoint.

A forward snapshots the cursors of its rows **once**, before any layer runs, and advances them at
the same time; the layers only read the snapshot.  Everything here is plain torch on device
tensors: no host sync, no boolean-mask indexing, so it runs inside or beside a CUDA graph and on
the CPU alike.  Padding rows (slot ``-1``) read slot 0 (the null slot, never allocated) and write
nothing back.
"""

from __future__ import annotations

import torch

__all__ = ["decode_cursor_step", "reset_cursors"]


def decode_cursor_step(
    cursors: torch.Tensor,
    slot_idx: torch.Tensor,
    force_flush: torch.Tensor | None,
    window: int,
    ring_size: int,
    out_start: torch.Tensor,
    out_len: torch.Tensor,
    out_flush: torch.Tensor,
) -> None:
    """Snapshot and advance the cursors of one decode forward.

    A row flushes when its ring is full (``len == window - 1``) or ``force_flush`` is set.  A flush
    row folds its ``len`` records and the current token into the checkpoint: its ring becomes empty
    (``start += len``, ``len = 0``).  A non-flush row appends the current token at logical row
    ``len`` (``len += 1``).  At ``window == 1`` every row flushes: the conventional update.

    Parameters
    ----------
    cursors : torch.Tensor
        ``[slots, 2]`` int32, ``(start, len)`` per slot.  Updated in place for rows with
        ``slot_idx >= 0``.
    slot_idx : torch.Tensor
        ``[batch]`` int32/int64 slot per row, ``-1`` for padding rows.
    force_flush : torch.Tensor or None
        ``[batch]`` bool, rows the caller wants flushed (radix track boundary, donation).
    window : int
        Ring window ``L >= 1``.
    ring_size : int
        Physical ring rows ``R >= window``.
    out_start, out_len : torch.Tensor
        ``[batch]`` int32, written in place with the snapshot (the kernels' ``ring_start`` and
        ``ring_len``).  Padding rows get 0.
    out_flush : torch.Tensor
        ``[batch]`` bool, written in place with the flush decision (padding rows: False).
    """
    if window < 1:
        raise ValueError(f"window: expected >= 1, got {window}")
    if ring_size < window:
        raise ValueError(f"ring_size: expected >= window ({window}), got {ring_size}")
    if cursors.dim() != 2 or cursors.shape[1] != 2 or cursors.dtype != torch.int32:
        raise ValueError(
            f"cursors: expected [slots, 2] int32, got {tuple(cursors.shape)} {cursors.dtype}"
        )
    valid = slot_idx >= 0
    safe = torch.where(valid, slot_idx, torch.zeros_like(slot_idx)).long()
    cur = cursors[safe]  # [batch, 2] gather (copy)
    start, length = cur[:, 0], cur[:, 1]
    flush = length >= window - 1
    if force_flush is not None:
        flush = flush | force_flush
    flush = flush & valid
    zero = torch.zeros_like(start)
    out_start.copy_(torch.where(valid, start, zero))
    out_len.copy_(torch.where(valid, length, zero))
    out_flush.copy_(flush)
    new_start = torch.where(flush, torch.remainder(start + length, ring_size), start)
    new_len = torch.where(flush, zero, length + 1)
    new = torch.stack([new_start, new_len], dim=1)
    # Padding rows write back what slot 0 already holds, so the scatter leaves slot 0 unchanged.
    new = torch.where(valid[:, None], new, cursors[0].expand_as(new))
    cursors.index_copy_(0, safe, new)


def reset_cursors(cursors: torch.Tensor, slots: torch.Tensor) -> None:
    """Empty the rings of ``slots`` (allocation, extend, copy-on-write destination, reload).

    Parameters
    ----------
    cursors : torch.Tensor
        ``[slots, 2]`` int32, updated in place.
    slots : torch.Tensor
        ``[n]`` int32/int64 slot indices (no padding).
    """
    cursors.index_fill_(0, slots.long(), 0)
