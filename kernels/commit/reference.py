"""Plain-torch references of ``verify_commit`` and ``verify_cursor_step``: same signatures, same
in-place semantics.

``verify_commit_ref`` is a readable per-row loop (it syncs on the row metadata; never use it on a
hot path); ``verify_cursor_step_ref`` is the chain of small torch ops the cursor-step kernel
replaced (no sync; the CPU serving path).
"""

from __future__ import annotations

import torch

from replayssm_kernels.commit._validate import min_ring_size, validate_commit, validate_cursor_step

__all__ = ["verify_commit_ref", "verify_cursor_step_ref"]


def flush_limit(window: int, num_tokens: int, late_flush: bool) -> int:
    """A verify row flushes when ``len + T`` exceeds this: the window ``L`` (early rule) or
    ``min_ring_size(L, T) = max(L, T) + T`` (``late_flush``), the fewest ring rows a verify of
    ``T`` tokens needs."""
    return min_ring_size(window, num_tokens) if late_flush else window


def verify_commit_ref(
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
    accepted_offset: int = 0,
    late_flush: bool = False,
) -> None:
    """Reference of ``replayssm_kernels.verify_commit`` (see its docstring; same contract).

    Raises
    ------
    ValueError
        On a wrong shape, dtype, device or an inconsistent ``window`` / ``ring_size`` /
        ``num_tokens``.
    """
    validate_commit(cursors, slot_idx, ring_start, ring_len, flush, accepted, window, ring_size,
                    num_tokens, out_flush_next, accepted_offset)
    for b in range(slot_idx.shape[0]):
        s = int(slot_idx[b])
        if s < 0:
            if out_flush_next is not None:
                out_flush_next[b] = False
            continue
        start, length, a = int(ring_start[b]), int(ring_len[b]), int(accepted[b]) + accepted_offset
        if bool(flush[b]):
            start, length = (start + length) % ring_size, a
        else:
            length = length + a
        cursors[s, 0] = start
        cursors[s, 1] = length
        if out_flush_next is not None:
            out_flush_next[b] = length + num_tokens > flush_limit(window, num_tokens, late_flush)


def cursor_step_torch(cursors, slot_idx, force_flush, limit, num_tokens, out_start, out_len,
                      out_flush, flush_nonempty) -> None:
    """``verify_cursor_step_ref``'s body on validated arguments: a row flushes when
    ``len + num_tokens > limit`` (``flush_limit``)."""
    valid = slot_idx >= 0
    safe = torch.where(valid, slot_idx, torch.zeros_like(slot_idx)).long()
    cur = cursors[safe]  # [batch, 2] gather (copy)
    start, length = cur[:, 0], cur[:, 1]
    flush = length + num_tokens > limit
    if force_flush is not None:
        flush = flush | force_flush
    if flush_nonempty:
        flush = flush | (length > 0)
    zero = torch.zeros_like(start)
    out_start.copy_(torch.where(valid, start, zero))
    out_len.copy_(torch.where(valid, length, zero))
    out_flush.copy_(flush & valid)


def verify_cursor_step_ref(
    cursors: torch.Tensor,
    slot_idx: torch.Tensor,
    force_flush: torch.Tensor | None,
    window: int,
    ring_size: int,
    num_tokens: int,
    out_start: torch.Tensor,
    out_len: torch.Tensor,
    out_flush: torch.Tensor,
    *,
    flush_nonempty: bool = False,
    late_flush: bool = False,
) -> None:
    """Reference of ``replayssm_kernels.verify_cursor_step`` (same signature, same effects)."""
    validate_cursor_step(cursors, slot_idx, force_flush, window, ring_size, num_tokens,
                         out_start, out_len, out_flush)
    cursor_step_torch(cursors, slot_idx, force_flush, flush_limit(window, num_tokens, late_flush),
                      num_tokens, out_start, out_len, out_flush, flush_nonempty)
