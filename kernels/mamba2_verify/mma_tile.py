"""Mamba-2 FMA verify, launch option ``read_mma``: a non-flush row's tile outputs on tensor cores.

A non-flush row with a split-precision read copy (``HAS_READ``) computes its outputs from the copy
only. In the default FMA layout that is fp32 FMAs and lane shuffles per element and token, and
the step is bound by instruction issue (ncu, benchmarks/notes/verify.md: 72% of issue slots, 29%
of DRAM peak with an fp8 copy). A bf16 or fp8 (e4m3) copy and bf16 activations are exact bf16
values, so ``S·C`` is exactly one bf16 tensor-core product per tile with fp32 accumulation::

    Y = (S_r·C_padᵀ) ⊙ scale_p ⊙ Dg + V (W ⊙ KᵀQ) + D x      (then · silu(z))

``S_r [BLOCK_P, BLOCK_N]`` the copy's tile (fp8: times its row scale, a power of two), ``C_pad
[BLOCK_N, BLOCK_TC]`` the window's C columns padded to ``tl.dot``'s 16 tokens (loaded once per
program by the caller), ``V [BLOCK_P, BLOCK_J]`` the records' x (bf16: exact in tf32) and
``W ⊙ KᵀQ`` the fp32 coefficients (``coef``, ``BLOCK_TC`` columns: the ``kq_dot`` layout) as
two tf32 products of its hi / lo split (``kernel._dot_fp32_right``), so every product is exact
and the sums are fp32 (tensor-core order). Outputs only: the checkpoint, the copy and the rings
are as in the FMA layout (the window's x records are appended here, as ``_tile_outputs4`` does).
The interpreter takes fp32 operands (its ``tl.dot`` takes no 16-bit floats; same products).
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm_kernels.mamba2_verify.kernel import _dot_fp32_right

__all__ = ["tile_outputs_mma"]


@triton.jit
def tile_outputs_mma(
    p_src_head, stride_src_p, stride_src_n, o_p, m_p, o_n, m_n, b_ct, coef, d_gc, o_tc, m_tc,
    o_j, is_w, is_h, row_j, T, start, length, R, p_x_row, p_rx_head, p_o_row, p_rs_head, D_ptr,
    z_ptr, i_b64, i_h, stride_x_T, stride_x_p, stride_rx_row, stride_rx_p, stride_out_T,
    stride_out_p, stride_rs_p, stride_D_head, stride_D_p, stride_z_batch, stride_z_T,
    stride_z_head, stride_z_p,
    SCALED: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr, PTX: tl.constexpr,
):  # fmt: skip
    """Outputs ``[BLOCK_P, T]`` of one non-flush tile (rows ``o_p``) from the read copy at
    ``p_src_head`` (strides ``stride_src_*``), and the append of the window's x records.
    ``b_ct [BLOCK_N, BLOCK_TC]`` bf16 (interpreter: any float), ``coef [BLOCK_J, BLOCK_TC]`` and
    ``d_gc [BLOCK_TC]`` fp32, tokens ``>= T`` zero or masked."""
    b_r = tl.load(p_src_head + o_p[:, None] * stride_src_p + o_n[None, :] * stride_src_n,
                  mask=m_p[:, None] & m_n[None, :], other=0.0)
    if PTX:  # bf16 / e4m3 values and bf16 C: exact bf16 operands, fp32 accumulation
        b_y = tl.dot(b_r.to(tl.bfloat16), b_ct)
    else:
        b_y = tl.dot(b_r.to(tl.float32), b_ct.to(tl.float32), input_precision="ieee")
    if SCALED:  # the fp8 copy's row scale (a power of two: exact)
        b_y = b_y * tl.load(p_rs_head + o_p * stride_rs_p, mask=m_p, other=0.0)[:, None]
    b_y = b_y * d_gc[None, :]
    # V: the window tokens' x from the input, the history's from the ring (newest first).
    p_v = tl.where(is_w[None, :], p_x_row + o_j[None, :] * stride_x_T + o_p[:, None] * stride_x_p,
                   p_rx_head + row_j[None, :] * stride_rx_row + o_p[:, None] * stride_rx_p)
    b_v = tl.load(p_v, mask=m_p[:, None] & (is_w | is_h)[None, :], other=0.0)
    if PTX:
        b_y = _dot_fp32_right(b_v.to(tl.float32), coef, b_y, True)
    else:
        b_y = tl.dot(b_v.to(tl.float32), coef, b_y, input_precision="ieee")
    # Append the window's x records (after this tile's history reads; disjoint rows anyway).
    m_pw = m_p[:, None] & (o_j < T)[None, :]
    tl.store(p_rx_head + ((start + length + o_j[None, :]) % R) * stride_rx_row
             + o_p[:, None] * stride_rx_p, b_v, mask=m_pw)
    m_pt = m_p[:, None] & m_tc[None, :]
    if HAS_D:
        b_D = tl.load(D_ptr + i_h * stride_D_head + o_p * stride_D_p, mask=m_p,
                      other=0.0).to(tl.float32)
        b_xw = tl.load(p_x_row + o_tc[None, :] * stride_x_T + o_p[:, None] * stride_x_p,
                       mask=m_pt, other=0.0).to(tl.float32)
        b_y += b_xw * b_D[:, None]
    if HAS_Z:
        b_z = tl.load(z_ptr + i_b64 * stride_z_batch + i_h * stride_z_head
                      + o_tc[None, :] * stride_z_T + o_p[:, None] * stride_z_p, mask=m_pt,
                      other=0.0).to(tl.float32)
        b_y *= b_z * tl.sigmoid(b_z)
    p_o = p_o_row + o_tc[None, :] * stride_out_T + o_p[:, None] * stride_out_p
    tl.store(p_o, b_y.to(p_o.dtype.element_ty), mask=m_pt)
