"""Cache hints by inline PTX (sm_90, compiled builds only): nothing waits on them, no register holds
their data, and a kernel's arithmetic and stored bits do not depend on them.

Users: the Mamba-2 kernels (decode: ring ``x`` / ``B`` rows and Δ into L1; decode and verify:
``L2_AHEAD``, the program's next checkpoint tiles into L2). The interpreter cannot run inline
assembly: launchers pass a constexpr that leaves these calls out under ``TRITON_INTERPRET=1``
(``_checks.interpreting``).  Each returns a dummy int32 that callers drop; ``is_pure=False`` keeps
the instruction.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["l2_tile_prefetch_ok", "prefetch_l1", "prefetch_l2_tile"]


@triton.jit
def prefetch_l1(ptrs):
    """``prefetch.global.L1`` of the line holding each address of ``ptrs`` (any shape)."""
    return tl.inline_asm_elementwise(
        "prefetch.global.L1 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
        is_pure=False, pack=1,
    )


@triton.jit
def prefetch_l2_tile(p_s_head, p0, t, P, stride_state_p, NUM_PT: tl.constexpr,
                     BLOCK_P: tl.constexpr):
    """Bulk L2 prefetch (sm_90 ``cp.async.bulk.prefetch.L2``, one TMA request issued by thread 0)
    of the program's checkpoint tile ``t`` (rows ``p0 + t·BLOCK_P ..``, at most ``NUM_PT`` tiles
    from ``p0``, none past row ``P``). The launcher enables it only when a tile's rows are
    contiguous and 16-byte aligned (``l2_tile_prefetch_ok``)."""
    row0 = p0 + t * BLOCK_P
    rows = tl.minimum(tl.minimum(P, p0 + NUM_PT * BLOCK_P) - row0, BLOCK_P)
    nbytes = rows * stride_state_p * p_s_head.dtype.element_ty.primitive_bitwidth // 8
    go = (t < NUM_PT) & (rows > 0)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b32 i; mov.u32 i, %tid.x; setp.eq.u32 p, i, 0; "
        "setp.ne.and.b32 p, $2, 0, p; @p cp.async.bulk.prefetch.L2.global [$1], $3; "
        "mov.u32 $0, 0; }",
        "=r,l,r,r", [p_s_head + row0 * stride_state_p, go.to(tl.int32), nbytes],
        dtype=tl.int32, is_pure=False, pack=1)


def l2_tile_prefetch_ok(state: torch.Tensor) -> bool:
    """Whole row tiles of a 4-D pool ``state`` (a checkpoint or a read copy, last dimension
    contiguous) can be bulk-prefetched: rows back to back, 16-byte aligned rows and bases
    (``cp.async.bulk.prefetch.L2``'s size and address rules)."""
    es = state.element_size()
    ss, sh, sp, sn = state.stride()
    return (sn == 1 and sp == state.shape[3] and (sp * es) % 16 == 0 and (sh * es) % 16 == 0
            and (ss * es) % 16 == 0 and state.data_ptr() % 16 == 0)
