"""Gated DeltaNet ReplaySSM speculative verify: one Triton launch for a mixed flush/non-flush batch.

Layers (fla style): ``gdn_replay_verify_fwd_kernel`` (Triton jit, the chunkwise form below),
``gdn_replay_verify_fwd`` (its launcher, no checks), ``gdn_replay_verify`` (validated public
function, which launches the **recurrent form** of ``recurrent.py``).  The chunkwise form was timed
on the H200 at 4.2x slower than SGLang's snapshot verify (T = 4, batch 256, commit f114327); it is
kept, reachable through its launcher (``benchmarks/bench_verify.py --gdn-verify-form chunkwise``,
``benchmarks/sweep_gdn_verify.py``), until the recurrent form has been timed against it.

Each row verifies a linear chain of ``T`` tokens (the last accepted token plus ``T - 1`` drafts) on
the ring protocol of ``gdn_decode`` (same ring tensors, same cursors; ``../README.md``).

Launch layout: grid ``(cdiv(V, BV), HV, batch)``, one warp per program, ``BV = 32``: the tile and
warp count of ``gdn_replay_decode`` and of SGLang's packed decode, so the fold below compiles to the
same reductions as theirs.  A program owns one ``[BV, K]`` tile of one value head's checkpoint.

* flush row: the exact fold.  Committed records ``[0, len)`` are replayed into the checkpoint tile
  from the raw inputs (pre-norm k, raw v, g, β), with the decode kernel's fold loop verbatim (the
  conventional packed-decode op order), and the tile is stored once.  The window then runs from the
  folded tile with no history term.
* non-flush row: ``hq_s = S_h q̃_s`` and ``hk_s = S_h k̂_s`` by the inner-product form (math.md §4):
  one pass over the checkpoint tile plus ``Σ_j ω_j (k̂_j·z) u_j`` over the committed records.
  ``S_h`` is never built.

Window (math.md §5.2), for both kinds of row, with local cumulative gates ``G_s = Σ_{i<=s} g_i``::

    A[s, s'] = β_s e^{G_s − G_s'} (k̂_s·k̂_s')       s' < s
    R_s      = β_s (v_s − e^{G_s} hk_s)
    U        = (I + A)^{-1} R                        forward substitution in registers
    y_s      = e^{G_s} hq_s + Σ_{s'<=s} e^{G_s − G_s'} (k̂_s'·q̃_s) U_s'

Every window product is a plain fp32 elementwise product and ``tl.sum`` (no ``tl.dot``: T <= 16).
The records ``(U_s, raw k_s, raw v_s, g_s, β_s)`` of all T tokens are written at logical rows
``len .. len + T − 1`` (physical ``(start + len + s) % R``), accepted or not; the commit advances
the cursors by the accepted count and later steps overwrite the rest.  g and β are computed with
the decode kernel's expressions, β rounded to ``b.dtype`` (see the README: the fold is the
decode path's, so the ring's β is the packed-decode β).

Not autotuned (the kernel writes the checkpoint in place).  No host sync; CUDA-graph safe.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_kernels.gdn_decode._fold import fold_records
from replayssm_kernels.gdn_decode._validate import validate_gdn_verify
from replayssm_kernels.gdn_verify.recurrent import gdn_replay_verify_recurrent_fwd

__all__ = ["gdn_replay_verify", "gdn_replay_verify_fwd", "gdn_replay_verify_fwd_kernel"]


@triton.jit
def gdn_replay_verify_fwd_kernel(
    # Pointers
    state,
    ring_u,
    ring_k,
    ring_v,
    ring_g,
    ring_beta,
    q,
    k,
    v,
    a,
    b,
    A_log,
    dt_bias,
    o,
    slot_idx,
    ring_start,
    ring_len,
    flush,
    scale,
    # Matrix dimensions
    R,
    # Strides
    stride_s_n,
    stride_s_h,
    stride_s_v,
    stride_s_k,
    stride_u_n,
    stride_u_h,
    stride_u_r,
    stride_u_v,
    stride_rk_n,
    stride_rk_h,
    stride_rk_r,
    stride_rk_k,
    stride_rv_n,
    stride_rv_h,
    stride_rv_r,
    stride_rv_v,
    stride_g_n,
    stride_g_h,
    stride_g_r,
    stride_beta_n,
    stride_beta_h,
    stride_beta_r,
    stride_q_b,
    stride_q_t,
    stride_q_h,
    stride_q_k,
    stride_k_b,
    stride_k_t,
    stride_k_h,
    stride_k_k,
    stride_v_b,
    stride_v_t,
    stride_v_h,
    stride_v_v,
    stride_a_b,
    stride_a_t,
    stride_a_h,
    stride_b_b,
    stride_b_t,
    stride_b_h,
    stride_o_b,
    stride_o_t,
    stride_o_h,
    stride_o_v,
    # Meta-parameters
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    T: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BT: tl.constexpr,
    BR: tl.constexpr,
    SOFTPLUS_THRESHOLD: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
):
    i_v, i_hv, i_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (HV // H)

    # Per-row scalars first (one round trip); padding rows read their own batch-shaped entries.
    i_s = tl.load(slot_idx + i_n).to(tl.int64)
    r_start = tl.load(ring_start + i_n).to(tl.int32)
    r_len = tl.load(ring_len + i_n).to(tl.int32)
    is_flush = tl.load(flush + i_n).to(tl.int32) != 0
    A_log_val = tl.load(A_log + i_hv).to(tl.float32)
    dt_bias_val = tl.load(dt_bias + i_hv).to(tl.float32)

    # Padding row: touches nothing, not even its output rows.
    if i_s < 0:
        return

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_t = tl.arange(0, BT)
    mask_k = o_k < K
    mask_v = o_v < V
    mask_t = o_t < T
    mask_h = mask_v[:, None] & mask_k[None, :]
    mask_vt = mask_v[:, None] & mask_t[None, :]

    # Window gates: the decode kernel's (and the conventional packed decode's) expressions per
    # token, so the g and β written to the ring carry the bits a later fold must replay.
    p_a = a + i_n * stride_a_b + i_hv * stride_a_h
    p_b = b + i_n * stride_b_b + i_hv * stride_b_h
    a_in = tl.load(p_a + o_t * stride_a_t, mask=mask_t, other=0)
    b_in = tl.load(p_b + o_t * stride_b_t, mask=mask_t, other=0)
    x = a_in.to(tl.float32) + dt_bias_val
    softplus_x = tl.where(x <= SOFTPLUS_THRESHOLD, tl.log(1.0 + tl.exp(x)), x)
    g_w = tl.where(mask_t, -tl.exp(A_log_val) * softplus_x, 0.0)
    # β rounded to b.dtype, as the packed decode (not fp32 as SGLang's verify kernel): README.
    beta_w = tl.sigmoid(b_in.to(tl.float32)).to(b.dtype.element_ty).to(tl.float32)
    beta_w = tl.where(mask_t, beta_w, 0.0)
    G_w = tl.cumsum(g_w, 0)  # local cumulative gates, restarting at 0 in the window

    p_s = (
        state
        + i_s * stride_s_n
        + i_hv * stride_s_h
        + o_v[:, None] * stride_s_v
        + o_k[None, :] * stride_s_k
    )
    p_q = q + i_n * stride_q_b + i_h * stride_q_h
    p_k = k + i_n * stride_k_b + i_h * stride_k_h
    p_v = v + i_n * stride_v_b + i_hv * stride_v_h
    p_o = o + i_n * stride_o_b + i_hv * stride_o_h
    p_rk = ring_k + i_s * stride_rk_n + i_h * stride_rk_h
    p_rv = ring_v + i_s * stride_rv_n + i_hv * stride_rv_h
    p_ru = ring_u + i_s * stride_u_n + i_hv * stride_u_h
    p_rg = ring_g + i_s * stride_g_n + i_hv * stride_g_h
    p_rb = ring_beta + i_s * stride_beta_n + i_hv * stride_beta_h

    b_h = tl.load(p_s, mask=mask_h, other=0).to(tl.float32)
    n_rec = r_len
    if is_flush:
        # ---- Exact fold of the committed records: gdn_replay_decode's fold loop verbatim. ----
        b_h = fold_records(
            b_h, p_rk, p_rv, p_rg, p_rb, r_start, r_len, R, o_k, o_v, mask_k, mask_v,
            stride_rk_r, stride_rk_k, stride_rv_r, stride_rv_v, stride_g_r, stride_beta_r,
            USE_QK_L2NORM,
        )
        b_h = b_h.to(state.dtype.element_ty)
        tl.store(p_s, b_h, mask=mask_h)
        # The window runs from the stored (possibly 16-bit) checkpoint: what later steps read.
        b_h = b_h.to(tl.float32)
        n_rec = 0

    # ---- Window vectors: normalised keys / scaled queries, checkpoint mat-vecs, Gram parts. ----
    b_Kw = tl.zeros([BT, BK], dtype=tl.float32)  # k̂_s rows
    b_Qw = tl.zeros([BT, BK], dtype=tl.float32)  # q̃_s rows
    b_HK = tl.zeros([BV, BT], dtype=tl.float32)  # S k̂_s
    b_HQ = tl.zeros([BV, BT], dtype=tl.float32)  # S q̃_s
    b_KK = tl.zeros([BT, BT], dtype=tl.float32)  # [s, s'] = k̂_s·k̂_s', s' <= s
    b_KQ = tl.zeros([BT, BT], dtype=tl.float32)  # [s', s] = k̂_s'·q̃_s, s' <= s
    for s in tl.static_range(T):
        b_q = tl.load(p_q + s * stride_q_t + o_k * stride_q_k, mask=mask_k, other=0).to(tl.float32)
        b_k = tl.load(p_k + s * stride_k_t + o_k * stride_k_k, mask=mask_k, other=0).to(tl.float32)
        if USE_QK_L2NORM:
            b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
            b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
        b_q = b_q * scale
        sel_r = (o_t == s)[:, None]
        sel_c = (o_t == s)[None, :]
        b_Kw = tl.where(sel_r, b_k[None, :], b_Kw)
        b_Qw = tl.where(sel_r, b_q[None, :], b_Qw)
        b_HK = tl.where(sel_c, tl.sum(b_h * b_k[None, :], 1)[:, None], b_HK)
        b_HQ = tl.where(sel_c, tl.sum(b_h * b_q[None, :], 1)[:, None], b_HQ)
        # Rows s' > s of b_Kw are still zero, so these are the causal parts only.
        b_KK = tl.where(sel_r, tl.sum(b_Kw * b_k[None, :], 1)[None, :], b_KK)
        b_KQ = tl.where(sel_c, tl.sum(b_Kw * b_q[None, :], 1)[:, None], b_KQ)

    # ---- Committed records (non-flush rows): S_h z = e^{G_h} S0 z + Σ_j ω_j (k̂_j·z) u_j. ----
    # Newest chunk first, so that ω_j = exp(Σ_{i>j} g_i) is a suffix sum (no cancellation).
    b_acc_k = tl.zeros([BV, BT], dtype=tl.float32)
    b_acc_q = tl.zeros([BV, BT], dtype=tl.float32)
    b_gsum = tl.sum(tl.zeros([BR], dtype=tl.float32), 0)  # Σ g of the later records
    n_chunks = tl.cdiv(n_rec, BR)
    for i_c in range(0, n_chunks):
        o_rc = (n_chunks - 1 - i_c) * BR + tl.arange(0, BR)
        mask_r = o_rc < n_rec
        rows = (r_start + o_rc) % R
        c_g = tl.load(p_rg + rows * stride_g_r, mask=mask_r, other=0.0)
        c_k = tl.load(
            p_rk + rows[:, None] * stride_rk_r + o_k[None, :] * stride_rk_k,
            mask=mask_r[:, None] & mask_k[None, :],
            other=0,
        ).to(tl.float32)
        c_u = tl.load(
            p_ru + rows[:, None] * stride_u_r + o_v[None, :] * stride_u_v,
            mask=mask_r[:, None] & mask_v[None, :],
            other=0,
        ).to(tl.float32)
        b_w = tl.where(mask_r, tl.exp(tl.cumsum(c_g, 0, reverse=True) - c_g + b_gsum), 0.0)
        b_gsum += tl.sum(c_g, 0)
        if USE_QK_L2NORM:
            b_w = b_w / tl.sqrt(tl.sum(c_k * c_k, 1) + 1e-6)
        for s in tl.static_range(T):
            sel_r = (o_t == s)[:, None]
            sel_c = (o_t == s)[None, :]
            b_ks = tl.sum(tl.where(sel_r, b_Kw, 0.0), 0)
            b_qs = tl.sum(tl.where(sel_r, b_Qw, 0.0), 0)
            b_ck = tl.sum(c_k * b_ks[None, :], 1) * b_w  # [BR]
            b_cq = tl.sum(c_k * b_qs[None, :], 1) * b_w
            b_acc_k += tl.where(sel_c, tl.sum(c_u * b_ck[:, None], 0)[:, None], 0.0)
            b_acc_q += tl.where(sel_c, tl.sum(c_u * b_cq[:, None], 0)[:, None], 0.0)
    b_decay = tl.exp(b_gsum)  # e^{G_h}: decay of the checkpoint through the committed history
    b_HK = b_decay * b_HK + b_acc_k
    b_HQ = b_decay * b_HQ + b_acc_q

    # ---- Window: A, R, forward substitution U = (I + A)^{-1} R, outputs. ----
    b_eG = tl.exp(G_w)
    lower = o_t[:, None] > o_t[None, :]
    b_A = tl.where(lower, beta_w[:, None] * tl.exp(G_w[:, None] - G_w[None, :]) * b_KK, 0.0)
    causal = (o_t[:, None] <= o_t[None, :]) & mask_t[:, None] & mask_t[None, :]
    b_F = tl.where(causal, tl.exp(G_w[None, :] - G_w[:, None]) * b_KQ, 0.0)  # [s', s]
    b_v_raw = tl.load(
        p_v + o_t[None, :] * stride_v_t + o_v[:, None] * stride_v_v, mask=mask_vt, other=0
    )
    b_R = beta_w[None, :] * (b_v_raw.to(tl.float32) - b_eG[None, :] * b_HK)  # [BV, BT]
    b_U = tl.zeros([BV, BT], dtype=tl.float32)
    b_Y = b_eG[None, :] * b_HQ
    for s in tl.static_range(T):
        sel_r = (o_t == s)[:, None]
        sel_c = (o_t == s)[None, :]
        b_a = tl.sum(tl.where(sel_r, b_A, 0.0), 0)  # A[s, :], zero for s' >= s
        b_r = tl.sum(tl.where(sel_c, b_R, 0.0), 1)
        b_u = b_r - tl.sum(b_U * b_a[None, :], 1)
        b_U = tl.where(sel_c, b_u[:, None], b_U)
    for s in tl.static_range(T):
        sel_c = (o_t == s)[None, :]
        b_f = tl.sum(tl.where(sel_c, b_F, 0.0), 1)  # F[:, s]
        b_Y += tl.where(sel_c, tl.sum(b_U * b_f[None, :], 1)[:, None], 0.0)
    tl.store(
        p_o + o_t[None, :] * stride_o_t + o_v[:, None] * stride_o_v,
        b_Y.to(o.dtype.element_ty),
        mask=mask_vt,
    )

    # ---- Append the T window records at logical rows len .. len + T - 1. ----
    w_rows = (r_start + r_len + o_t) % R
    tl.store(
        p_ru + w_rows[None, :] * stride_u_r + o_v[:, None] * stride_u_v,
        b_U.to(ring_u.dtype.element_ty),
        mask=mask_vt,
    )
    tl.store(
        p_rv + w_rows[None, :] * stride_rv_r + o_v[:, None] * stride_rv_v,
        b_v_raw.to(ring_v.dtype.element_ty),
        mask=mask_vt,
    )
    if i_v == 0:
        tl.store(p_rg + w_rows * stride_g_r, g_w, mask=mask_t)
        tl.store(p_rb + w_rows * stride_beta_r, beta_w, mask=mask_t)
        if i_hv % (HV // H) == 0:
            b_k_raw = tl.load(
                p_k + o_t[:, None] * stride_k_t + o_k[None, :] * stride_k_k,
                mask=mask_t[:, None] & mask_k[None, :],
                other=0,
            )
            tl.store(
                p_rk + w_rows[:, None] * stride_rk_r + o_k[None, :] * stride_rk_k,
                b_k_raw.to(ring_k.dtype.element_ty),
                mask=mask_t[:, None] & mask_k[None, :],
            )


def gdn_replay_verify_fwd(
    state: torch.Tensor,
    ring_u: torch.Tensor,
    ring_k: torch.Tensor,
    ring_v: torch.Tensor,
    ring_g: torch.Tensor,
    ring_beta: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    out: torch.Tensor,
    slot_idx: torch.Tensor,
    ring_start: torch.Tensor,
    ring_len: torch.Tensor,
    flush: torch.Tensor,
    *,
    scale: float,
    use_qk_l2norm: bool = True,
    block_v: int = 32,
    block_r: int = 16,
    num_warps: int = 1,
) -> None:
    """Launch the kernel without checks (callers: the validated wrapper, benchmarks).

    ``block_v=32, num_warps=1`` is the tile and warp count of ``gdn_replay_decode``'s fold and of
    SGLang's packed decode; the bitwise checkpoint claim is made for this configuration only.
    ``block_r`` is the record chunk of the non-flush history term.
    """
    batch, T, Hk, K = q.shape
    HV, V = state.shape[1], state.shape[2]
    R = ring_k.shape[2]
    if batch == 0:
        return
    BK = triton.next_power_of_2(K)
    BV = min(triton.next_power_of_2(V), block_v)
    BT = max(triton.next_power_of_2(T), 2)
    BR = min(triton.next_power_of_2(R), block_r)
    grid = (triton.cdiv(V, BV), HV, batch)
    gdn_replay_verify_fwd_kernel[grid](
        state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, out,
        slot_idx, ring_start, ring_len, flush, float(scale), R,
        *state.stride(), *ring_u.stride(), *ring_k.stride(), *ring_v.stride(),
        *ring_g.stride(), *ring_beta.stride(), *q.stride(), *k.stride(), *v.stride(),
        *a.stride(), *b.stride(), *out.stride(),
        H=Hk, HV=HV, K=K, V=V, T=T, BK=BK, BV=BV, BT=BT, BR=BR, SOFTPLUS_THRESHOLD=20.0,
        USE_QK_L2NORM=use_qk_l2norm, num_warps=num_warps, num_stages=1,
    )  # fmt: skip


def gdn_replay_verify(
    state: torch.Tensor,
    ring_u: torch.Tensor,
    ring_k: torch.Tensor,
    ring_v: torch.Tensor,
    ring_g: torch.Tensor,
    ring_beta: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    out: torch.Tensor,
    slot_idx: torch.Tensor,
    ring_start: torch.Tensor,
    ring_len: torch.Tensor,
    flush: torch.Tensor,
    *,
    scale: float,
    use_qk_l2norm: bool = True,
) -> None:
    """Verify ``T`` tokens per row (linear draft chain) on the Gated DeltaNet ReplaySSM ring.

    Per row ``b`` with slot ``s = slot_idx[b]`` (``-1``: padding, touches nothing, ``out[b]``
    untouched) and cursor snapshot ``(ring_start[b], ring_len[b], flush[b])``:

    * non-flush: ``out[b, t]`` for every window token from the checkpoint ``state[s]``, the
      committed records ``[0, ring_len[b])`` and the window, in registers (the recurrent form,
      ``recurrent.py``: the history's stored updates, then the window's delta-rule steps).
      ``state[s]`` is not written.
    * flush: the committed records ``[0, ring_len[b])`` are folded sequentially into ``state[s]``
      from the raw inputs in the conventional packed-decode op order (``gdn_replay_decode``'s fold)
      and ``state[s]`` is written once; the window then runs from the folded checkpoint.

    Both write the T window records ``(u, raw k, raw v, g, β)`` at physical ring rows
    ``(ring_start[b] + ring_len[b] + t) % R``, ``t < T``, accepted or not (the commit keeps the
    accepted ones).  The caller guarantees ``ring_len[b] + T <= R`` (not checked: on device).
    β is ``sigmoid(b)`` rounded to ``b.dtype``, as ``gdn_replay_decode`` and SGLang's packed decode
    use it, so a later fold of these records reproduces that kernel's checkpoint.

    Parameters
    ----------
    state : torch.Tensor
        ``[slots, HV, V, K]`` checkpoint, fp32 / fp16 / bf16, any strides.  Updated in place on
        flush rows only.
    ring_u, ring_k, ring_v, ring_g, ring_beta : torch.Tensor
        The ``gdn_decode`` ring: ``[slots, HV, R, V]`` u (``v.dtype`` or fp32),
        ``[slots, Hk, R, K]`` raw k (``k.dtype``), ``[slots, HV, R, V]`` raw v (``v.dtype``),
        ``[slots, HV, R]`` fp32 g and β.  Updated in place (window rows).
    q, k : torch.Tensor
        ``[batch, T, Hk, K]`` post-conv query / key, any strides.
    v : torch.Tensor
        ``[batch, T, HV, V]`` post-conv value, any strides.
    a, b : torch.Tensor
        ``[batch, T, HV]`` gate inputs, any strides.
    A_log, dt_bias : torch.Tensor
        ``[HV]``, contiguous.
    out : torch.Tensor
        ``[batch, T, HV, V]`` output, any strides; written for non-padding rows only.
    slot_idx : torch.Tensor
        ``[batch]`` int32 / int64 state slot per row, ``-1`` for padding.
    ring_start, ring_len : torch.Tensor
        ``[batch]`` int32 / int64 cursor snapshot of each row.
    flush : torch.Tensor
        ``[batch]`` bool, rows that fold their committed records this step.
    scale : float
        Query scale (``K ** -0.5`` in the models).
    use_qk_l2norm : bool
        Normalise q and k in-kernel (division form), as SGLang does (``True``).

    Raises
    ------
    ValueError
        On any shape, dtype or device mismatch (the message names expected and actual).
    """
    validate_gdn_verify(
        state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, out,
        slot_idx, ring_start, ring_len, flush, scale,
    )  # fmt: skip
    gdn_replay_verify_recurrent_fwd(
        state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, out,
        slot_idx, ring_start, ring_len, flush, scale=scale, use_qk_l2norm=use_qk_l2norm,
    )  # fmt: skip
