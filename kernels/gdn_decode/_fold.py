"""Committed GDN ring records applied to a checkpoint tile: the exact fold, and the update replay.

``fold_records`` is inlined by Triton into ``gdn_replay_verify_recurrent_fwd_kernel`` (flush
rows): each record is the conventional packed-decode step (SGLang's
``fused_recurrent_gated_delta_rule_packed_decode_kernel``) without q and the output, in the same
expressions, order and tile layout (``[32, next_pow2(K)]``, one warp, so each ``tl.sum`` compiles
to SGLang's reduction tree); ``tests/kernels/test_gdn_verify.py`` compiles the verify kernel for
sm_90a and checks the loop's TTGIR against SGLang's step.  The decode kernel folds with the same
arithmetic in tree form (``_tree.flush_tree``: the reduction tree written out, rows on lanes), so
both give SGLang's bits.

``replay_updates`` rebuilds the state after the records in registers from their stored corrected
updates (``S ← e^{g_j} S + u_j k̂_jᵀ``, no reduction per record): the non-flush path of
``gdn_replay_verify``. It is not the conventional op order (u was computed by the step that wrote
it), so it never feeds a checkpoint.
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


@triton.jit
def replay_updates(b_h, p_rk, p_ru, p_rg, r_start, r_len, R, o_k, o_v, mask_k, mask_v,
                   stride_rk_r, stride_rk_k, stride_u_r, stride_u_v, stride_g_r,
                   USE_QK_L2NORM: tl.constexpr):
    """``S ← e^{g_j} S + u_j k̂_jᵀ`` for the records at logical rows ``[0, r_len)``, oldest first,
    on the fp32 tile ``b_h [BV, BK]``; the next record's loads are in flight during each update."""
    row = r_start % R
    pf = r_len > 0
    n_k = tl.load(p_rk + row * stride_rk_r + o_k * stride_rk_k, mask=mask_k & pf, other=0)
    n_u = tl.load(p_ru + row * stride_u_r + o_v * stride_u_v, mask=mask_v & pf, other=0)
    n_g = tl.load(p_rg + row * stride_g_r, mask=pf, other=0.0)
    for i_r in range(0, r_len):
        b_k = n_k.to(tl.float32)
        b_u = n_u.to(tl.float32)
        b_g = n_g
        row = (r_start + i_r + 1) % R
        pf = i_r + 1 < r_len
        n_k = tl.load(p_rk + row * stride_rk_r + o_k * stride_rk_k, mask=mask_k & pf, other=0)
        n_u = tl.load(p_ru + row * stride_u_r + o_v * stride_u_v, mask=mask_v & pf, other=0)
        n_g = tl.load(p_rg + row * stride_g_r, mask=pf, other=0.0)
        if USE_QK_L2NORM:
            b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
        b_h *= tl.exp(b_g)
        b_h += b_u[:, None] * b_k[None, :]
    return b_h
