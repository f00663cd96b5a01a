"""The verify window of ``T`` tokens in the inner-product form, every row sum rows-on-lanes.

``verify_window`` is inlined by Triton into ``gdn_replay_verify_fwd_kernel`` for both row kinds:
after a flush the tile is the folded checkpoint as stored and there is no history; otherwise the
tile is the checkpoint (or its read copy) and the committed records ``[0, len)`` are the history.
``S`` is never updated in registers: with ``S_h = e^{Σg} S0 + Σ_j ω_j u_j k̂_jᵀ`` (the history,
``_tree.history_terms``) and window gates ``G_s = g_0 + … + g_s``, the conventional step
``S ← e^{g_s} S; u_s = β_s (v_s − S k̂_s); S ← S + u_s k̂_sᵀ; y_s = S q̃_s`` is, per value row,

    u_s = β_s (v_s − e^{G_s} S_h k̂_s − Σ_{r<s} e^{G_s − G_r} (k̂_r·k̂_s) u_r)
    y_s = e^{G_s} S_h q̃_s + Σ_{r<s} e^{G_s − G_r} (k̂_r·q̃_s) u_r + (k̂_s·q̃_s) u_s

(math.md §4 with the window's own records), so a token costs two mat-vecs with the tile
(``_tree._rows``: one shuffle level per row), the history's dots and ``T`` scalar-weighted sums of
earlier ``u``; no state leaves or changes in registers.  Outputs and ``u`` only: the checkpoint is
folded from raw inputs (``_tree.fold_tree_records``), never from these sums, so their order is free.
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm_kernels.gdn_decode._tree import _col8, _cols, _norm, _rows, history_terms


@triton.jit
def verify_window(
    b_h0,
    row2,
    p_ru,
    p_rk,
    p_rv,
    p_rg,
    p_rb,
    p_q,
    p_k,
    p_v,
    p_a,
    p_b,
    p_o,
    i_hv,
    i_v,
    r_start,
    hist_len,
    w_base,
    R,
    A_log_val,
    dt_bias_val,
    scale,
    stride_u_r,
    stride_u_v,
    stride_rk_r,
    stride_rk_k,
    stride_rv_r,
    stride_rv_v,
    stride_g_r,
    stride_beta_r,
    stride_q_t,
    stride_q_k,
    stride_k_t,
    stride_k_k,
    stride_v_t,
    stride_v_v,
    stride_a_t,
    stride_b_t,
    stride_o_t,
    stride_o_v,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    T: tl.constexpr,
    TW: tl.constexpr,
    BK: tl.constexpr,
    BR: tl.constexpr,
    RL: tl.constexpr,
    SOFTPLUS_THRESHOLD: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
):
    """Outputs and ring records of the ``T`` window tokens of one ``[BV, K]`` tile (module docstring).

    ``b_h0``: the fp32 tile in ``_tree``'s ``[RL, b0, b1, RH, b2, b3, b4, 4]`` view of value rows
    ``row2 [RL, RH]``; ``hist_len`` committed records on top of it (0 after a flush); the window's
    records go to logical rows ``w_base + s`` (``(r_start + w_base + s) % R``).  ``TW``: ``T``
    rounded up to a power of two (the window buffers)."""
    RH: tl.constexpr = row2.shape[1]
    mask_v2 = row2 < V
    col8 = _col8(BK)
    mask_c8 = col8 < K
    o_k = tl.arange(0, BK)
    mask_k = o_k < K
    o_t = tl.arange(0, TW)
    b_U = tl.zeros([RL, RH, TW], dtype=tl.float32)  # the window's u_r, r < s
    b_KW = tl.zeros([TW, BK], dtype=tl.float32)  # its k̂_r
    b_GW = tl.zeros([TW], dtype=tl.float32)  # its G_r
    b_G = tl.sum(tl.zeros([TW], dtype=tl.float32), 0)
    for s in tl.static_range(T):
        # Gates: the decode kernel's expressions (a later fold replays the ring's g and β bits).
        x_g = tl.load(p_a + s * stride_a_t).to(tl.float32) + dt_bias_val
        softplus_x = tl.where(x_g <= SOFTPLUS_THRESHOLD, tl.log(1.0 + tl.exp(x_g)), x_g)
        g_val = -tl.exp(A_log_val) * softplus_x
        b_in = tl.load(p_b + s * stride_b_t)
        beta_val = tl.sigmoid(b_in.to(tl.float32)).to(b_in.dtype).to(tl.float32)
        b_q_raw = tl.load(p_q + s * stride_q_t + o_k * stride_q_k, mask=mask_k, other=0)
        b_k_raw = tl.load(p_k + s * stride_k_t + o_k * stride_k_k, mask=mask_k, other=0)
        b_v_raw = tl.load(p_v + s * stride_v_t + row2 * stride_v_v, mask=mask_v2, other=0)
        b_q = _norm(b_q_raw.to(tl.float32), USE_QK_L2NORM) * scale
        b_k = _norm(b_k_raw.to(tl.float32), USE_QK_L2NORM)
        k8 = _cols(b_k, BK)
        q8 = _cols(b_q, BK)
        # S_h k̂_s and S_h q̃_s: the tile's two mat-vecs, then the history's records.
        b_hk = _rows(b_h0 * k8)
        b_hq = _rows(b_h0 * q8)
        b_acc_k, b_acc_q, b_gsum = history_terms(
            k8, q8, p_rk, p_ru, p_rg, r_start, hist_len, R, row2, mask_v2, col8, mask_c8,
            stride_rk_r, stride_rk_k, stride_u_r, stride_u_v, stride_g_r, BR, RL, USE_QK_L2NORM,
        )  # fmt: skip
        b_decay = tl.exp(b_gsum)
        b_hk = b_decay * b_hk + b_acc_k
        b_hq = b_decay * b_hq + b_acc_q
        # The window's earlier tokens.
        b_G += g_val
        b_P = tl.exp(b_G)
        b_cw = tl.where(o_t < s, tl.exp(b_G - b_GW), 0.0)
        b_ck = b_cw * tl.sum(b_KW * b_k[None, :], 1)
        b_cq = b_cw * tl.sum(b_KW * b_q[None, :], 1)
        b_u = beta_val * (b_v_raw.to(tl.float32) - b_P * b_hk
                          - tl.sum(b_U * b_ck[None, None, :], 2))
        b_o = b_P * b_hq + tl.sum(b_U * b_cq[None, None, :], 2) + tl.sum(b_k * b_q) * b_u
        tl.store(p_o + s * stride_o_t + row2 * stride_o_v, b_o.to(p_o.dtype.element_ty),
                 mask=mask_v2)
        b_U = tl.where(o_t[None, None, :] == s, b_u[:, :, None], b_U)
        b_KW = tl.where(o_t[:, None] == s, b_k[None, :], b_KW)
        b_GW = tl.where(o_t == s, b_G, b_GW)
        # The window record at logical row w_base + s.
        w_row = (r_start + w_base + s) % R
        tl.store(p_ru + w_row * stride_u_r + row2 * stride_u_v, b_u.to(p_ru.dtype.element_ty),
                 mask=mask_v2)
        tl.store(p_rv + w_row * stride_rv_r + row2 * stride_rv_v,
                 b_v_raw.to(p_rv.dtype.element_ty), mask=mask_v2)
        if i_v == 0:
            tl.store(p_rg + w_row * stride_g_r, g_val)
            tl.store(p_rb + w_row * stride_beta_r, beta_val)
            if i_hv % (HV // H) == 0:
                tl.store(p_rk + w_row * stride_rk_r + o_k * stride_rk_k,
                         b_k_raw.to(p_rk.dtype.element_ty), mask=mask_k)
