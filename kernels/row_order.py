"""A launch order for a mixed decode batch: the flush rows first.

In a decode launch a flush row's programs fold the ring (many times a non-flush row's work); the
GPU starts programs in launch order, so a flush row near the end of the batch starts late and
stretches the step's tail.  ``flush_first_order`` writes a permutation of the batch's rows with
the flush rows first (both groups in batch order), once per forward; a decode kernel that takes
it (``gdn_replay_decode(row_order=...)``) runs program ``z`` on row ``row_order[z]``, so the long
programs start in the first wave.  The rows' results do not depend on the order.

``flush_first_order`` is one Triton program (a prefix sum over the batch, no host sync, CUDA-graph
safe); ``flush_first_order_ref`` is the torch reference with the same signature and effect.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_kernels._checks import check_launch_device, launch_device

__all__ = ["MAX_BATCH", "flush_first_order", "flush_first_order_ref", "validate_row_order"]

#: Rows ``flush_first_order`` takes: one program holds the whole batch (Triton's largest block).
MAX_BATCH = 1 << 20


def _validate(flush: torch.Tensor, out_order: torch.Tensor) -> None:
    if flush.dim() != 1 or flush.dtype != torch.bool:
        raise ValueError(f"flush: expected [batch] bool, got {tuple(flush.shape)} {flush.dtype}")
    validate_row_order(out_order, flush.shape[0], flush.device)


def validate_row_order(row_order: torch.Tensor, batch: int, device: torch.device, *,
                       unit_stride: bool = False) -> None:
    """Check a row order's shape, dtype and device (not its contents: that would sync); ``unit_stride``:
    also stride 1 (a kernel that reads ``row_order[z]`` as ``ptr + z``).

    Raises
    ------
    ValueError
        ``row_order`` not ``[batch]`` int32 on ``device`` (with ``unit_stride``: or strided).
    """
    if tuple(row_order.shape) != (batch,) or row_order.dtype != torch.int32:
        raise ValueError(f"row_order: expected [{batch}] int32, got {tuple(row_order.shape)} "
                         f"{row_order.dtype}")
    if row_order.device != device:
        raise ValueError(f"row_order: expected device {device}, got {row_order.device}")
    if unit_stride and batch > 1 and row_order.stride(0) != 1:
        raise ValueError(f"row_order: expected stride 1 (the kernel reads row_order[z] as ptr + z), got strides "
                         f"{row_order.stride()}")


@triton.jit
def _flush_first_order_kernel(flush_ptr, order_ptr, batch, stride_f, stride_o,
                              BLOCK: tl.constexpr):
    o_b = tl.arange(0, BLOCK)
    m_b = o_b < batch
    f = (tl.load(flush_ptr + o_b * stride_f, mask=m_b, other=0) != 0).to(tl.int32)
    before = tl.cumsum(f, 0) - f  # flush rows before row b
    n_flush = tl.sum(f, 0)
    pos = tl.where(f != 0, before, n_flush + o_b - before)
    tl.store(order_ptr + pos * stride_o, o_b, mask=m_b)


_DOC = """Write ``out_order``: the rows with ``flush`` set, then the others, each group in batch order.

    Parameters
    ----------
    flush : torch.Tensor
        ``[batch]`` bool (a cursor step's ``out_flush``; padding rows are not flush rows).
    out_order : torch.Tensor
        ``[batch]`` int32, written in place: a permutation of ``0 .. batch - 1``.

    Raises
    ------
    ValueError
        On a shape, dtype or device mismatch.
    """


def flush_first_order(flush: torch.Tensor, out_order: torch.Tensor) -> None:
    _validate(flush, out_order)
    check_launch_device("flush", flush)
    batch = flush.shape[0]
    if batch > MAX_BATCH:
        raise ValueError(f"flush: expected at most {MAX_BATCH} rows (one program sorts them), got {batch}")
    if batch == 0:
        return
    with launch_device(flush):
        _flush_first_order_kernel[(1,)](
            flush, out_order, batch, flush.stride(0), out_order.stride(0),
            BLOCK=max(triton.next_power_of_2(batch), 16),
        )  # fmt: skip


def flush_first_order_ref(flush: torch.Tensor, out_order: torch.Tensor) -> None:
    _validate(flush, out_order)
    out_order.copy_(torch.argsort((~flush).to(torch.int8), stable=True).to(torch.int32))


flush_first_order.__doc__ = _DOC
flush_first_order_ref.__doc__ = _DOC
