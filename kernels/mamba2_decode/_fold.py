"""One committed Mamba-2 ring record, ready to be folded into a checkpoint tile.

``record_factors`` loads record ``row`` (``x_j``, ``Δ_j``, ``B_j``) and forms
``selective_state_update``'s fp32 factors ``dA = exp(A·Δ_j)`` and ``dB = B_j·Δ_j``. The decode
kernel (flush rows) and the verify kernel (flush rows) both fold with it, Triton inlining it at
every site. The update itself, ``S = fma(S, dA, dB·x_j)``, stays written out at each fold site
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
