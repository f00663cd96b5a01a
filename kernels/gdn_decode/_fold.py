"""Committed GDN ring records folded into a checkpoint tile: the exact fold on SGLang's tile.

``fold_records`` is inlined by Triton into ``gdn_verify_fold_kernel`` (the verify's flush
rows, ``gdn_verify/fold.py``): each record is the conventional packed-decode step (SGLang's
``fused_recurrent_gated_delta_rule_packed_decode_kernel``) without q and the output, in the same
expressions, order and tile layout (``[32, next_pow2(K)]``, one warp, so each ``tl.sum`` compiles
to SGLang's reduction tree); ``tests/kernels/test_gdn_verify.py`` compiles the verify kernel for
sm_90a and checks the loop's TTGIR against SGLang's step.  The decode kernel folds with the same
arithmetic in tree form (``_tree.flush_tree``: the reduction tree written out, rows on lanes), so
both give SGLang's bits.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def fold_records(
    b_h,
    p_rk,
    p_rv,
    p_rg,
    p_rb,
    r_start,
    r_len,
    R,
    o_k,
    o_v,
    mask_k,
    mask_v,
    stride_rk_r,
    stride_rk_k,
    stride_rv_r,
    stride_rv_v,
    stride_g_r,
    stride_beta_r,
    USE_QK_L2NORM: tl.constexpr,
):
    """Replay the records at logical rows ``[0, r_len)`` (physical ``(r_start + j) % R``) into the
    fp32 tile ``b_h [BV, BK]``; returns the folded tile."""
    # Raw records are prefetched two ahead (plain loads into the same layouts as in the
    # conventional kernel), so the sequential replay does not wait on memory every step.
    row = r_start % R
    pf = r_len > 0
    n0_k = tl.load(p_rk + row * stride_rk_r + o_k * stride_rk_k, mask=mask_k & pf, other=0)
    n0_v = tl.load(p_rv + row * stride_rv_r + o_v * stride_rv_v, mask=mask_v & pf, other=0)
    n0_g = tl.load(p_rg + row * stride_g_r, mask=pf, other=0.0)
    n0_b = tl.load(p_rb + row * stride_beta_r, mask=pf, other=0.0)
    row = (r_start + 1) % R
    pf = r_len > 1
    n1_k = tl.load(p_rk + row * stride_rk_r + o_k * stride_rk_k, mask=mask_k & pf, other=0)
    n1_v = tl.load(p_rv + row * stride_rv_r + o_v * stride_rv_v, mask=mask_v & pf, other=0)
    n1_g = tl.load(p_rg + row * stride_g_r, mask=pf, other=0.0)
    n1_b = tl.load(p_rb + row * stride_beta_r, mask=pf, other=0.0)
    for i_r in range(0, r_len):
        b_k = n0_k.to(tl.float32)
        b_v = n0_v.to(tl.float32)
        b_g = n0_g
        b_beta = n0_b
        n0_k, n0_v, n0_g, n0_b = n1_k, n1_v, n1_g, n1_b
        row = (r_start + i_r + 2) % R
        pf = i_r + 2 < r_len
        n1_k = tl.load(p_rk + row * stride_rk_r + o_k * stride_rk_k, mask=mask_k & pf, other=0)
        n1_v = tl.load(p_rv + row * stride_rv_r + o_v * stride_rv_v, mask=mask_v & pf, other=0)
        n1_g = tl.load(p_rg + row * stride_g_r, mask=pf, other=0.0)
        n1_b = tl.load(p_rb + row * stride_beta_r, mask=pf, other=0.0)
        if USE_QK_L2NORM:
            b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
        b_h *= tl.exp(b_g)
        b_v -= tl.sum(b_h * b_k[None, :], 1)
        b_v *= b_beta
        b_h += b_v[:, None] * b_k[None, :]
    return b_h
