"""Speculative-verify cursors: the snapshot before a verify forward and the commit after sampling.

Both families (Mamba-2 and GDN) and both step kinds (plain decode, ``T = 1``, and verify of ``T``
tokens) share one cursor pair ``cursors[s] = (start, len)`` per slot (see ``kernels/README.md``).

- ``verify_cursor_step`` (one Triton launch, ``_verify_cursor_step_kernel``, like
  ``cursors.decode_cursor_step``; reference ``verify_cursor_step_ref``, the chain of ~14 small
  torch ops it replaced): snapshot ``(start, len)`` of the forward's rows and decide the flush:
  ``flush = len + T > window`` or forced. It does **not** advance the cursors: the accepted
  counts are not known yet.
- ``verify_commit`` (one Triton launch, ``_verify_commit_kernel``): after sampling, from the
  snapshot and the accepted counts ``a`` (``1 <= a <= T``, bonus token included; or ``a - 1``,
  SGLang's ``last_correct_step_indices``, with ``accepted_offset=1``) advance the cursors: flush
  rows ``start += len (mod R)``, ``len = a``; other rows ``len += a``. Rejected draft records stay
  in the ring past ``len``, are never read and are overwritten by the next step (rollback is this
  pointer move).

No host sync, no data-dependent shapes: both are CUDA-graph safe. Their validators read tensor
metadata only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_kernels._checks import check_launch_device, interpreting, launch_device
from replayssm_kernels.commit._validate import validate_commit, validate_cursor_step
from replayssm_kernels.commit.reference import cursor_step_torch, flush_limit

__all__ = ["verify_commit", "verify_commit_fwd", "verify_cursor_step"]


@triton.jit
def _verify_cursor_step_kernel(
    # Pointers
    cursors_ptr, slot_idx_ptr, force_ptr, out_start_ptr, out_len_ptr, out_flush_ptr,
    # Dimensions
    batch, window, T,
    # Strides
    stride_cur_s, stride_cur_c, stride_slot, stride_force, stride_os, stride_ol, stride_of,
    # Meta-parameters
    HAS_FORCE: tl.constexpr, FLUSH_NONEMPTY: tl.constexpr, BLOCK: tl.constexpr,
):
    # One row per lane: gather the row's cursors, decide the flush, write the snapshot. The
    # cursors are only read (``verify_commit`` moves them after sampling).
    o_b = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m_b = o_b < batch
    slot = tl.load(slot_idx_ptr + o_b * stride_slot, mask=m_b, other=-1).to(tl.int64)
    valid = m_b & (slot >= 0)
    p_cur = cursors_ptr + slot * stride_cur_s
    start = tl.load(p_cur, mask=valid, other=0)  # padding rows: 0, as the reference
    length = tl.load(p_cur + stride_cur_c, mask=valid, other=0)
    flush = length + T > window
    if HAS_FORCE:
        flush = flush | (tl.load(force_ptr + o_b * stride_force, mask=m_b, other=0) != 0)
    if FLUSH_NONEMPTY:
        flush = flush | (length > 0)
    flush = flush & valid
    tl.store(out_start_ptr + o_b * stride_os, start, mask=m_b)
    tl.store(out_len_ptr + o_b * stride_ol, length, mask=m_b)
    tl.store(out_flush_ptr + o_b * stride_of, flush, mask=m_b)


#: Rows per program of the cursor step (one program up to this batch).
_STEP_BLOCK = 256


_STEP_DOC = """Snapshot the cursors of one verify forward and decide its flush rows (cursors unchanged).

    A row flushes when ``len + num_tokens > window`` (early-flush rule: a non-flush verify keeps at
    most ``window`` rows in the ring, its ``len`` history plus its ``T`` window rows), when
    ``force_flush`` is set, or (``flush_nonempty``) when its ring holds records (``len > 0``: the
    snapshot path's materialising fold). A flush row folds its ``len`` committed records into the
    checkpoint (not the window); the verify kernels write the window at physical rows
    ``(start + len + t) % R`` in both cases. ``verify_commit`` advances the cursors afterwards.

    ``verify_cursor_step`` is one Triton launch (CUDA tensors, or any under ``TRITON_INTERPRET=1``;
    CPU tensors without the interpreter take the reference, the CPU serving path), no host sync:
    CUDA-graph safe. ``verify_cursor_step_ref`` is the plain-torch reference with the same
    signature and effects (a chain of small torch ops).

    Parameters
    ----------
    cursors : torch.Tensor
        ``[slots, 2]`` int32 ``(start, len)`` per slot, any strides. Read only.
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
    flush_nonempty : bool
        Also flush every valid row with ``len > 0`` (keyword only).
    late_flush : bool
        Flush when ``len + num_tokens > R0 = max(window, num_tokens) + num_tokens``
        (``min_ring_size``) instead of ``> window`` (keyword only): the history may grow to
        ``R0 - T`` committed records and a flush row's ``len`` to ``R0``. On a ring of ``R0`` rows
        a flush row's window rows ``(start + len + t) % R`` then wrap over its own folded history:
        valid for a verify that folds a flush row's records before it writes the row's window in
        a separate launch (``gdn_replay_verify``). ``mamba2_replay_verify`` (one launch, in which a
        row's window writes could overwrite records its other programs still fold) needs
        ``ring_size >= R0 + T``, where the window never meets the history.

    Raises
    ------
    ValueError
        On a wrong shape, dtype or device, or ``ring_size < max(window, num_tokens) + num_tokens``.
    """


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
    *,
    flush_nonempty: bool = False,
    late_flush: bool = False,
) -> None:
    validate_cursor_step(cursors, slot_idx, force_flush, window, ring_size, num_tokens,
                         out_start, out_len, out_flush)
    limit = flush_limit(window, num_tokens, late_flush)  # a row flushes when len + T > limit
    if cursors.device.type != "cuda" and not interpreting():
        cursor_step_torch(cursors, slot_idx, force_flush, limit, num_tokens, out_start,
                          out_len, out_flush, flush_nonempty)
        return
    batch = slot_idx.shape[0]
    if batch == 0:
        return
    force = force_flush if force_flush is not None else out_flush  # unused pointer when absent
    with launch_device(cursors):
        _verify_cursor_step_kernel[(triton.cdiv(batch, _STEP_BLOCK),)](
            cursors, slot_idx, force, out_start, out_len, out_flush,
            batch, limit, num_tokens,
            cursors.stride(0), cursors.stride(1), slot_idx.stride(0), force.stride(0),
            out_start.stride(0), out_len.stride(0), out_flush.stride(0),
            HAS_FORCE=force_flush is not None, FLUSH_NONEMPTY=bool(flush_nonempty),
            BLOCK=_STEP_BLOCK,
        )  # fmt: skip


verify_cursor_step.__doc__ = _STEP_DOC


@triton.jit
def _verify_commit_kernel(
    # Pointers
    cursors_ptr,
    slot_idx_ptr,
    ring_start_ptr,
    ring_len_ptr,
    flush_ptr,
    accepted_ptr,
    flush_next_ptr,
    # Dimensions
    batch,
    R,
    T,
    L,
    accepted_offset,
    # Strides
    stride_cur_s,
    stride_cur_c,
    stride_slot,
    stride_rs,
    stride_rl,
    stride_fl,
    stride_acc,
    stride_fn,
    # Meta-parameters
    HAS_FLUSH_NEXT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    o_b = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m_b = o_b < batch
    slot = tl.load(slot_idx_ptr + o_b * stride_slot, mask=m_b, other=-1).to(tl.int64)
    start = tl.load(ring_start_ptr + o_b * stride_rs, mask=m_b, other=0).to(tl.int32)
    length = tl.load(ring_len_ptr + o_b * stride_rl, mask=m_b, other=0).to(tl.int32)
    fl = tl.load(flush_ptr + o_b * stride_fl, mask=m_b, other=0) != 0
    # a = accepted + offset (offset 1: SGLang's last_correct_step_indices), cast here: no
    # separate `+ 1` and `.to(int32)` launches on the host path.
    a = (tl.load(accepted_ptr + o_b * stride_acc, mask=m_b, other=0) + accepted_offset).to(
        tl.int32)
    new_start = tl.where(fl, (start + length) % R, start)
    new_len = tl.where(fl, a, length + a)
    live = m_b & (slot >= 0)
    tl.store(cursors_ptr + slot * stride_cur_s, new_start, mask=live)
    tl.store(cursors_ptr + slot * stride_cur_s + stride_cur_c, new_len, mask=live)
    if HAS_FLUSH_NEXT:
        tl.store(flush_next_ptr + o_b * stride_fn, live & (new_len + T > L), mask=m_b)


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
    accepted_offset: int = 0,
    late_flush: bool = False,
) -> None:
    """Launch the commit on validated arguments (no checks, no device context; see
    ``verify_commit``). Rows are ``accepted``'s: ``slot_idx`` and the snapshot may be longer
    (their rows past ``accepted.shape[0]`` are not read), so a caller whose batch is padded
    needs no slicing. Launches on the current CUDA device."""
    batch = accepted.shape[0]
    if batch == 0:
        return
    block = min(1024, triton.next_power_of_2(batch))
    fn = out_flush_next if out_flush_next is not None else flush  # unused pointer when absent
    _verify_commit_kernel[(triton.cdiv(batch, block),)](
        cursors, slot_idx, ring_start, ring_len, flush, accepted, fn,
        batch, ring_size, num_tokens, flush_limit(window, num_tokens, late_flush),
        accepted_offset,
        cursors.stride(0), cursors.stride(1), slot_idx.stride(0), ring_start.stride(0),
        ring_len.stride(0), flush.stride(0), accepted.stride(0), fn.stride(0),
        HAS_FLUSH_NEXT=out_flush_next is not None, BLOCK=block, num_warps=4,
    )  # fmt: skip


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
    accepted_offset: int = 0,
    late_flush: bool = False,
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
        ``[batch]`` int32/int64 accepted tokens per row, bonus token included, minus
        ``accepted_offset``.
    window, ring_size, num_tokens : int
        ``L``, ``R`` and ``T`` as passed to ``verify_cursor_step``.
    out_flush_next : torch.Tensor, optional
        ``[batch]`` bool, written with ``new_len + T > L`` (padding rows: False): the flush decision
        ``verify_cursor_step`` will make for these slots at the next verify of ``T`` tokens
        (without forced flushes), for integrations that build the next metadata from this one.
    accepted_offset : int
        Added to ``accepted`` on the device (``a = accepted + accepted_offset``): ``1`` takes
        SGLang's ``last_correct_step_indices`` (``a - 1``) as it is, with no ``+ 1`` / cast
        launches on the host. ``0`` or ``1``.
    late_flush : bool
        ``out_flush_next`` by ``verify_cursor_step``'s late rule
        (``new_len + T > max(L, T) + T``). The cursor move is the same under both rules.

    Raises
    ------
    ValueError
        On a wrong shape, dtype or device, or ``ring_size < max(window, num_tokens) + num_tokens``.
    """
    validate_commit(cursors, slot_idx, ring_start, ring_len, flush, accepted, window, ring_size,
                    num_tokens, out_flush_next, accepted_offset)
    check_launch_device("cursors", cursors)
    kw = dict(window=window, ring_size=ring_size, num_tokens=num_tokens,
              out_flush_next=out_flush_next, accepted_offset=accepted_offset,
              late_flush=late_flush)
    with launch_device(cursors):  # only off the current device
        verify_commit_fwd(cursors, slot_idx, ring_start, ring_len, flush, accepted, **kw)
