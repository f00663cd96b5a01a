"""One committed Mamba-2 ring record, ready to be folded into a checkpoint tile.

``record_factors`` loads record ``row`` (``x_j``, ``Δ_j``, ``B_j``) and forms
``selective_state_update``'s fp32 factors ``dA = exp(A·Δ_j)`` and ``dB = B_j·Δ_j``; the verify
kernel (flush rows) folds with it. ``record_factors_lean`` is the same with the record rows loaded
by ``ld_rec``; the decode kernel (flush rows) folds with it. Triton inlines both at every site.
The update itself, ``S = fma(S, dA, dB·x_j)``, stays written out at each fold site
in the kernels: the offline sm_90a codegen tests (tests/kernels/test_mamba2_decode.py and
test_mamba2_verify.py) find each site by its source line in its kernel file and check that it
compiles to SGLang's ``state * dA + dB * x[:, None]``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def record_factors(p_rx, p_rdt, p_rB, row, A, m_p, m_n, stride_rx_row, stride_rdt_row,
                   stride_rB_row):
    """Record ``row``: ``(x_j`` as stored (P-tile), ``dA = exp(A·Δ_j)``, ``dB = B_j·Δ_j``)."""
    b_xj = tl.load(p_rx + row * stride_rx_row, mask=m_p, other=0.0)
    dtj = tl.load(p_rdt + row * stride_rdt_row)
    b_Bj = tl.load(p_rB + row * stride_rB_row, mask=m_n, other=0.0)
    dA = tl.exp(A * dtj)
    dB = b_Bj.to(tl.float32) * dtj
    return b_xj, dA, dB


@triton.jit
def ld_rec(ptrs, mask):
    """``tl.load(ptrs, mask, other=0)`` of 16- or 32-bit records, written as elementwise PTX.

    An elementwise op takes the layout its consumer wants, so a record row lands directly in the
    checkpoint tile's row (x_j) or column (B_j) layout; ``tl.load`` gets the coalescing pass's
    layout instead and a shared-memory conversion with two barriers per record (as in the verify
    kernel's fold, and the decode kernel's before 2026-11-30). Masked-off lanes read 0 (+0.0), as ``other=0.0``. Compiled
    builds only (the kernels' ``LD_ASM``); the interpreter takes ``tl.load``.
    """
    if ptrs.dtype.element_ty.primitive_bitwidth == 16:
        return tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; mov.b16 $0, 0; @p ld.global.b16 $0, [$1]; }",
            "=h,l,r", [ptrs, mask.to(tl.int32)], dtype=ptrs.dtype.element_ty, is_pure=True,
            pack=1)
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; mov.b32 $0, 0; @p ld.global.b32 $0, [$1]; }",
            "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=ptrs.dtype.element_ty, is_pure=True,
            pack=1)


@triton.jit
def record_factors_lean(p_rx, p_rdt, p_rB, row, A, m_p, m_n, stride_rx_row, stride_rdt_row,
                        stride_rB_row, LD_ASM: tl.constexpr):
    """``record_factors`` with ``x_j`` and ``B_j`` loaded by ``ld_rec`` when ``LD_ASM`` (straight
    into the fold tile's row / column layout). Same values, same ``dA`` / ``dB`` expressions."""
    if LD_ASM:
        b_xj = ld_rec(p_rx + row * stride_rx_row, m_p)
    else:
        b_xj = tl.load(p_rx + row * stride_rx_row, mask=m_p, other=0.0)
    dtj = tl.load(p_rdt + row * stride_rdt_row)
    if LD_ASM:
        b_Bj = ld_rec(p_rB + row * stride_rB_row, m_n)
    else:
        b_Bj = tl.load(p_rB + row * stride_rB_row, mask=m_n, other=0.0)
    dA = tl.exp(A * dtj)
    dB = b_Bj.to(tl.float32) * dtj
    return b_xj, dA, dB
