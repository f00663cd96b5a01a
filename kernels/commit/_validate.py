"""Argument validation shared by ``verify_commit`` / ``verify_commit_ref`` and
``verify_cursor_step``. Every check raises ``ValueError`` naming expected and actual."""

from __future__ import annotations

import torch

from replayssm_kernels._checks import check_index, check_int, check_same_device, check_tensor
from replayssm_kernels.cursors import check_step_tensors

__all__ = ["validate_commit", "validate_cursor_step", "validate_ring_sizes", "min_ring_size"]


def min_ring_size(window: int, num_tokens: int) -> int:
    """Physical ring rows a slot needs for verify windows of ``num_tokens`` at ``window``.

    The longest committed history at a verify step is ``max(window, num_tokens)`` (a non-flush
    verify leaves ``len + a <= window``, a flush verify leaves ``len = a <= num_tokens``, a decode
    step leaves ``len <= window - 1``), and a flush verify holds that history plus its window.
    Under the late rule (``verify_cursor_step(late_flush=True)``, which flushes past this size) a
    flush row's history itself reaches it: the GDN verify then writes its window over the folded
    history, the Mamba-2 verify needs ``num_tokens`` more rows (kernels/README.md, "Late rule").
    ``num_tokens = 0`` (no speculative decoding) gives ``window``. ``ValueError`` unless ``window`` is
    an int ``>= 1`` and ``num_tokens`` an int ``>= 0``.
    """
    check_int("window", window, 1)
    check_int("num_tokens", num_tokens, 0)
    return max(window, num_tokens) + num_tokens


def validate_ring_sizes(window: int, ring_size: int, num_tokens: int) -> None:
    check_int("num_tokens", num_tokens, 1)
    need = min_ring_size(window, num_tokens)
    check_int("ring_size", ring_size, 1)
    if ring_size < need:
        raise ValueError(
            f"ring_size: expected >= max(window, num_tokens) + num_tokens = {need} "
            f"(window={window}, num_tokens={num_tokens}), got {ring_size}"
        )


def validate_commit(
    cursors: torch.Tensor,
    slot_idx: torch.Tensor,
    ring_start: torch.Tensor,
    ring_len: torch.Tensor,
    flush: torch.Tensor,
    accepted: torch.Tensor,
    window: int,
    ring_size: int,
    num_tokens: int,
    out_flush_next: torch.Tensor | None,
    accepted_offset: int = 0,
) -> int:
    """Check a commit call (metadata only, no device sync); return the batch size."""
    validate_ring_sizes(window, ring_size, num_tokens)
    if accepted_offset not in (0, 1):
        raise ValueError(f"accepted_offset: expected 0 or 1, got {accepted_offset!r}")
    check_tensor("cursors", cursors, (None, 2), (torch.int32,))
    if cursors.stride(1) != 1 or cursors.stride(0) != 2:
        raise ValueError(f"cursors: expected a contiguous [slots, 2] tensor, got strides "
                         f"{cursors.stride()}")
    check_tensor("slot_idx", slot_idx, (None,), (torch.int32, torch.int64))
    batch = slot_idx.shape[0]
    check_index("ring_start", ring_start, batch)
    check_index("ring_len", ring_len, batch)
    check_tensor("flush", flush, (batch,), (torch.bool,))
    check_index("accepted", accepted, batch)
    if out_flush_next is not None:
        check_tensor("out_flush_next", out_flush_next, (batch,), (torch.bool,))
    check_same_device(cursors=cursors, slot_idx=slot_idx, ring_start=ring_start,
                      ring_len=ring_len, flush=flush, accepted=accepted,
                      out_flush_next=out_flush_next)
    return batch


def validate_cursor_step(cursors, slot_idx, force_flush, window, ring_size, num_tokens,
                          out_start, out_len, out_flush) -> None:
    """Metadata-only checks (no device sync): sizes, shapes, dtypes, devices."""
    validate_ring_sizes(window, ring_size, num_tokens)
    check_step_tensors(cursors, slot_idx, force_flush, out_start, out_len, out_flush)
