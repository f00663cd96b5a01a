"""Plain-torch reference of ``verify_commit``: same signature, same in-place semantics.

A readable per-row loop (it syncs on the row metadata; never use it on a hot path).
"""

from __future__ import annotations

import torch

from replayssm_kernels.commit._validate import validate_commit

__all__ = ["verify_commit_ref"]


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
) -> None:
    """Reference of ``replayssm_kernels.verify_commit`` (see its docstring; same contract).

    Raises
    ------
    ValueError
        On a wrong shape, dtype, device or an inconsistent ``window`` / ``ring_size`` /
        ``num_tokens``.
    """
    validate_commit(cursors, slot_idx, ring_start, ring_len, flush, accepted, window, ring_size,
                    num_tokens, out_flush_next)
    for b in range(slot_idx.shape[0]):
        s = int(slot_idx[b])
        if s < 0:
            if out_flush_next is not None:
                out_flush_next[b] = False
            continue
        start, length, a = int(ring_start[b]), int(ring_len[b]), int(accepted[b])
        if bool(flush[b]):
            start, length = (start + length) % ring_size, a
        else:
            length = length + a
        cursors[s, 0] = start
        cursors[s, 1] = length
        if out_flush_next is not None:
            out_flush_next[b] = length + num_tokens > window
