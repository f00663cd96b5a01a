"""Device-side work lists over a batch's flush rows (Triton helpers, inlined by the kernels).

A launch that folds only the flush rows of a step cannot size its grid by their count (no host
sync: the count is on the device, and a CUDA graph fixes the grid), and a program per batch row
pays one empty program per non-flush row (tens of microseconds at batch 256). A work-list launch
instead runs a fixed grid whose programs count the flush rows (``flush_rows``) and take the
``rank``-th of them in batch order (``flush_row_of_rank``) for each item they own. Both helpers
recompute from the flags (``BLOCK_B`` wide), so nothing batch-sized stays live across an item.
Users: the Gated DeltaNet verify fold (``gdn_verify/fold.py``) and the Mamba-2 FMA verify's flush
launch (``mamba2_verify/fma.py``, launch option ``flush_list``).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["flush_row_of_rank", "flush_rows"]


@triton.jit
def flush_rows(slot_idx, flush, batch, BLOCK_B: tl.constexpr):
    """``[BLOCK_B]`` int32: 1 for the batch's flush rows with a slot (``slot_idx >= 0``), else 0."""
    o_b = tl.arange(0, BLOCK_B)
    m_b = o_b < batch
    f = tl.load(flush + o_b, mask=m_b, other=0) != 0
    s = tl.load(slot_idx + o_b, mask=m_b, other=-1)
    return (f & (s >= 0)).to(tl.int32)


@triton.jit
def flush_row_of_rank(slot_idx, flush, batch, rank, BLOCK_B: tl.constexpr):
    """The batch row of the ``rank``-th flush row (0-based, batch order; ``rank`` below the count
    of ``flush_rows``)."""
    incl = tl.cumsum(flush_rows(slot_idx, flush, batch, BLOCK_B), 0)
    return tl.sum((incl <= rank).to(tl.int32), 0)
