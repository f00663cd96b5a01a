"""Ring cursors: the one protocol shared by decode and (later) speculative verify.

Every state slot ``s`` owns one cursor pair ``cursors[s] = (start, len)`` (int32), shared by all
layers.  Logical ring row ``r`` of slot ``s`` lives at physical row ``(start + r) % R``; rows
``[0, len)`` are committed records not yet folded into the checkpoint.

A forward snapshots the cursors of its rows **once**, before any layer runs, and advances them at
the same time; the layers only read the snapshot.  ``decode_cursor_step`` does it in one Triton
launch instead of a chain of about a dozen small torch ops (33–44 us per forward measured eager on
the H200; the saving inside a CUDA graph has not been timed);
``decode_cursor_step_ref`` is the plain-torch reference (the CPU serving path).  Neither syncs with
the host, so both run inside or beside a CUDA graph.  Padding rows (slot ``-1``) write nothing
back.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_kernels._checks import check_int, check_tensor, interpreting, launch_device

__all__ = ["decode_cursor_step", "decode_cursor_step_ref", "reset_cursors"]

_BLOCK = 256


def _validate(cursors: torch.Tensor, slot_idx: torch.Tensor, force_flush: torch.Tensor | None, window: int,
              ring_size: int, out_start: torch.Tensor, out_len: torch.Tensor, out_flush: torch.Tensor) -> None:
    check_int("window", window, 1)
    check_int("ring_size", ring_size, 1)
    if ring_size < window:
        raise ValueError(f"ring_size: expected >= window ({window}), got {ring_size}")
    check_step_tensors(cursors, slot_idx, force_flush, out_start, out_len, out_flush)


def check_step_tensors(cursors: torch.Tensor, slot_idx: torch.Tensor, force_flush: torch.Tensor | None,
                       out_start: torch.Tensor, out_len: torch.Tensor, out_flush: torch.Tensor) -> None:
    """Shapes, dtypes and devices of a cursor step's tensors (decode and verify); no device sync."""
    for name, t in (("cursors", cursors), ("slot_idx", slot_idx), ("out_start", out_start), ("out_len", out_len),
                    ("out_flush", out_flush), ("force_flush", force_flush)):
        if not isinstance(t, torch.Tensor) and not (name == "force_flush" and t is None):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if cursors.dim() != 2 or cursors.shape[1] != 2 or cursors.dtype != torch.int32:
        raise ValueError(
            f"cursors: expected [slots, 2] int32, got {tuple(cursors.shape)} {cursors.dtype}"
        )
    if slot_idx.dim() != 1 or slot_idx.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slot_idx: expected [batch] int32 or int64, got "
                         f"{tuple(slot_idx.shape)} {slot_idx.dtype}")
    batch = slot_idx.shape[0]
    want = {"out_start": (out_start, torch.int32), "out_len": (out_len, torch.int32),
            "out_flush": (out_flush, torch.bool)}
    if force_flush is not None:
        want["force_flush"] = (force_flush, torch.bool)
    for name, (t, dtype) in want.items():
        if tuple(t.shape) != (batch,) or t.dtype != dtype:
            raise ValueError(f"{name}: expected [{batch}] {dtype}, got {tuple(t.shape)} {t.dtype}")
    for name, t in (("slot_idx", slot_idx), *((k, v[0]) for k, v in want.items())):
        if t.device != cursors.device:
            raise ValueError(f"{name}: expected device {cursors.device}, got {t.device}")


@triton.jit
def _decode_cursor_step_kernel(
    # Pointers
    cursors_ptr, slot_idx_ptr, force_ptr, out_start_ptr, out_len_ptr, out_flush_ptr,
    # Dimensions
    batch, window, ring_size,
    # Strides
    stride_cur_s, stride_cur_c, stride_slot, stride_force, stride_os, stride_ol, stride_of,
    # Meta-parameters
    HAS_FORCE: tl.constexpr, BLOCK: tl.constexpr,
):
    o_b = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m_b = o_b < batch
    slot = tl.load(slot_idx_ptr + o_b * stride_slot, mask=m_b, other=-1).to(tl.int64)
    valid = m_b & (slot >= 0)
    p_cur = cursors_ptr + slot * stride_cur_s
    start = tl.load(p_cur, mask=valid, other=0)
    length = tl.load(p_cur + stride_cur_c, mask=valid, other=0)
    flush = length >= window - 1
    if HAS_FORCE:
        flush = flush | (tl.load(force_ptr + o_b * stride_force, mask=m_b, other=0) != 0)
    flush = flush & valid
    tl.store(out_start_ptr + o_b * stride_os, start, mask=m_b)
    tl.store(out_len_ptr + o_b * stride_ol, length, mask=m_b)
    tl.store(out_flush_ptr + o_b * stride_of, flush, mask=m_b)
    new_start = tl.where(flush, (start + length) % ring_size, start)
    new_len = tl.where(flush, 0, length + 1)
    tl.store(p_cur, new_start, mask=valid)
    tl.store(p_cur + stride_cur_c, new_len, mask=valid)


_DOC = """Snapshot and advance the cursors of one decode forward.

    A row flushes when its ring is full (``len == window - 1``) or ``force_flush`` is set.  A flush
    row folds its ``len`` records and the current token into the checkpoint: its ring becomes empty
    (``start += len``, ``len = 0``).  A non-flush row appends the current token at logical row
    ``len`` (``len += 1``).  At ``window == 1`` every row flushes: the conventional update.
    No host synchronisation (CUDA-graph safe).  ``decode_cursor_step`` is one Triton launch;
    ``decode_cursor_step_ref`` is the torch reference with the same signature and effects.

    Parameters
    ----------
    cursors : torch.Tensor
        ``[slots, 2]`` int32, ``(start, len)`` per slot (any strides).  Updated in place for rows
        with ``slot_idx >= 0``; each slot appears at most once in ``slot_idx``.
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

    Raises
    ------
    ValueError
        On a window below 1, a ring smaller than the window, or a shape, dtype or device mismatch.
    """


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
    _validate(cursors, slot_idx, force_flush, window, ring_size, out_start, out_len, out_flush)
    if cursors.device.type != "cuda" and not interpreting():
        raise ValueError(f"cursors: expected a CUDA tensor (or TRITON_INTERPRET=1), got {cursors.device}")
    batch = slot_idx.shape[0]
    if batch == 0:
        return
    force = force_flush if force_flush is not None else out_flush
    with launch_device(cursors):
        _decode_cursor_step_kernel[(triton.cdiv(batch, _BLOCK),)](
            cursors, slot_idx, force, out_start, out_len, out_flush,
            batch, window, ring_size,
            cursors.stride(0), cursors.stride(1), slot_idx.stride(0), force.stride(0),
            out_start.stride(0), out_len.stride(0), out_flush.stride(0),
            HAS_FORCE=force_flush is not None, BLOCK=_BLOCK,
        )  # fmt: skip


def decode_cursor_step_ref(
    cursors: torch.Tensor,
    slot_idx: torch.Tensor,
    force_flush: torch.Tensor | None,
    window: int,
    ring_size: int,
    out_start: torch.Tensor,
    out_len: torch.Tensor,
    out_flush: torch.Tensor,
) -> None:
    _validate(cursors, slot_idx, force_flush, window, ring_size, out_start, out_len, out_flush)
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


decode_cursor_step.__doc__ = _DOC
decode_cursor_step_ref.__doc__ = _DOC


def reset_cursors(cursors: torch.Tensor, slots: torch.Tensor) -> None:
    """Empty the rings of ``slots`` (allocation, extend, copy-on-write destination, reload).

    Parameters
    ----------
    cursors : torch.Tensor
        ``[slots, 2]`` int32, updated in place.
    slots : torch.Tensor
        ``[n]`` int32/int64 slot indices (no padding: ``-1`` would reset the last slot; values are
        not read on the host, which would sync).

    Raises
    ------
    ValueError
        ``cursors`` not ``[slots, 2]`` int32, ``slots`` not a 1-D integer tensor, or another device.
    """
    check_tensor("cursors", cursors, (None, 2), (torch.int32,))
    check_tensor("slots", slots, (None,), (torch.int32, torch.int64))
    if slots.device != cursors.device:
        raise ValueError(f"slots: expected device {cursors.device}, got {slots.device}")
    cursors.index_fill_(0, slots.long(), 0)
