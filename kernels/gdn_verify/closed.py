"""Gated DeltaNet ReplaySSM speculative verify, closed form (second implementation, not default).

Layers (fla style): ``gdn_replay_verify_closed_fwd_kernel`` (Triton jit),
``gdn_replay_verify_closed_fwd`` (launcher, no checks); the validated public function is
``gdn_replay_verify(..., impl="closed")`` (``kernel.py``), which takes the same arguments and
writes the same tensors as the default ``impl="recurrent"``.

Same contract as the recurrent kernel (``kernel.py``): the same ring tensors and cursors, the same
records ``(u_s, raw k_s, raw v_s, g_s, β_s)`` at logical rows ``len .. len + T − 1``, padding rows
(``slot_idx = -1``) touch nothing, flush rows fold and store the checkpoint exactly as the
recurrent kernel does (same code: ``fold_records``, rounding, stochastic rounding, read-copy
refresh; the stored bits are identical), non-flush rows never write the checkpoint and, with a
read copy, never read it.  What differs is how the outputs and the window's corrected updates u
are computed: nothing but the checkpoint tile ``S0 [BV, K]`` is ever a matrix.

Closed form, per program (one ``[BV, K]`` tile of one value head; ``P`` the inclusive prefix of the
gates g over history and window, ``h`` the committed history length, 0 on flush rows; math.md
§4-5):

* ``HK[s] = S0·k̂_s`` and ``HQ[s] = S0·q̃_s`` for the T window tokens: ``2T`` reductions over K of
  the tile (the only work proportional to ``BV·K``);
* per history record j, oldest first (``u_j`` as stored), the recurrence projected on the window
  vectors: ``HK[s] ← e^{g_j} HK[s] + (k̂_j·k̂_s) u_j``, ``HQ[s] ← e^{g_j} HQ[s] + (k̂_j·q̃_s) u_j``
  (the dots are ``[T, K]`` reductions per record and program; nothing of size ``BV·K``), so that
  afterwards ``HK[s] = S_h k̂_s = e^{P_h} S0·k̂_s + Σ_{j ≤ h} e^{P_h−P_j} (k̂_j·k̂_s) u_j``;
* times ``e^{P_{h+s}−P_h}``, ``HK[s]`` is the decayed state before token s applied to ``k̂_s``
  (``e^{g_s} S_{s−1} k̂_s`` without the window's own updates: decay first, as the recurrence
  does); the window runs as a forward substitution over value vectors:
  ``u_s = β_s (v_s − HK[s])``, then ``HK[s'] += e^{P_{h+s'}−P_{h+s}} (k̂_s·k̂_{s'}) u_s`` for
  ``s' > s`` and ``HQ[s'] += e^{P_{h+s'}−P_{h+s}} (k̂_s·q̃_{s'}) u_s`` for ``s' ≥ s``;
* ``y_s = HQ[s] = e^{P_{h+s}} S0·q̃_s + Σ_{j ≤ h+s} e^{P_{h+s}−P_j} (k̂_j·q̃_s) u_j``.

In exact arithmetic this is the sequential recurrence (``S ← e^g S``, ``u = β(v − S k̂)``,
``S ← S + u k̂ᵀ``, ``y = S q̃``).  In floating point the u records and outputs differ from the
recurrent kernel's in the last bits (other summation order); u records only ever feed outputs
(a later flush folds the raw ``k, v, g, β``, never u), so the checkpoint is unaffected.  Flush
rows use the same closed form with ``h = 0`` from the stored checkpoint (one code path; the
window needs its ``2T`` reductions instead of T sequential rank-1 steps over the tile).

Launch layout: grid ``(cdiv(V, BV), HV, batch)``, ``BV = 16``, one warp per program, the
checkpoint tile ``[16, K]`` on SGLang's ``[1, 4] x [1, 32]`` lane layout: every row's reduction
over K is then SGLang's tree, and the flush rows' fold compiles to the recurrent kernel's fp32 ops
on the same layouts (``test_closed_fold_codegen_matches_recurrent``).  One warp: with two, the 1-D
norm of k would be reduced on another layout (other bits).  ``BV = 16`` rather than 32: at 32 the
program spills (sm_90a ptxas, Qwen3.5-4B, T = 4: 255 registers, 112 B spill stores); at 16 it
does not, at T = 2, 4, 8 with and without a read copy.  The per-token value vectors (``S0·k̂_s``,
``S0·q̃_s``, the running sums) live as rows of ``[TP, BV]`` tensors, value rows across the lanes,
not as columns of the tile's layout, where every lane would hold all of them.
``benchmarks/notes/verify.md`` has the ptxas table.  Not timed on a GPU.  Not autotuned (writes
the checkpoint); no host sync; CUDA-graph safe.

Shapes and dtypes: those of ``gdn_replay_verify`` (``kernel.py``): ``state [slots, HV, V, K]``
(fp32 / fp16 / bf16, updated in place on flush rows), rings ``[slots, HV|Hk, R, V|K]`` and
``[slots, HV, R]`` (window rows updated in place), ``q, k [batch, T, Hk, K]``,
``v, out [batch, T, HV, V]``, ``a, b [batch, T, HV]``, any strides.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_kernels.gdn_decode._fold import fold_records
from replayssm_kernels.mamba2_decode.read_copy import store_read_tile
from replayssm_kernels.stochastic_round import sr_key, sr_round_fp16

__all__ = [
    "gdn_replay_verify_closed_fwd",
    "gdn_replay_verify_closed_fwd_kernel",
    "CLOSED_BLOCK_V",
    "CLOSED_NUM_WARPS",
]

CLOSED_BLOCK_V = 16  # value rows per program: no spills at one warp (32 spills; notes/verify.md)
CLOSED_NUM_WARPS = 1  # one warp: the fold's reduction trees


@triton.jit
def _row(x, o_t, s):
    """Row ``s`` of ``x [TP, cols]`` as a ``[cols]`` vector (exact: one nonzero term)."""
    return tl.sum(tl.where(o_t[:, None] == s, x, 0.0), 0)


@triton.jit
def _set_row(x, o_t, s, r):
    """``x [TP, cols]`` with row ``s`` replaced by ``r [cols]``."""
    return tl.where(o_t[:, None] == s, r[None, :], x)


@triton.jit
def _fold_and_store(
    state, p_s, p_rk, p_rv, p_rg, p_rb, read_ptr, read_scale_ptr, sr_seed, sr_layer,
    i_s, i_hv, r_start, r_len, R, o_k, o_v, o_kr, mask_k, mask_v, mask_h,
    stride_rk_r, stride_rk_k, stride_rv_r, stride_rv_v, stride_g_r, stride_beta_r,
    stride_rd_n, stride_rd_h, stride_rd_v, stride_rd_k, stride_rs_n, stride_rs_h, stride_rs_v,
    V: tl.constexpr, K: tl.constexpr, USE_QK_L2NORM: tl.constexpr, HAS_READ: tl.constexpr,
    READ_FP8: tl.constexpr, SR: tl.constexpr,
):  # fmt: skip
    """Flush rows: the recurrent kernel's fold and store, expression for expression (the exact
    fold of records ``[0, r_len)`` from the raw inputs, rounded once (``SR``: stochastically),
    stored, the read copy refreshed from the stored bits); returns the stored tile in fp32."""
    b_h = tl.load(p_s, mask=mask_h, other=0).to(tl.float32)
    b_h = fold_records(
        b_h, p_rk, p_rv, p_rg, p_rb, r_start, r_len, R, o_k, o_v, mask_k, mask_v,
        stride_rk_r, stride_rk_k, stride_rv_r, stride_rv_v, stride_g_r, stride_beta_r,
        USE_QK_L2NORM,
    )  # fmt: skip
    if SR:
        b_h = sr_round_fp16(b_h, sr_key(sr_seed, sr_layer, i_s),
                            (i_hv * V + o_v[:, None]) * K + o_k[None, :])
    else:
        b_h = b_h.to(state.dtype.element_ty)
    tl.store(p_s, b_h, mask=mask_h)
    if HAS_READ:
        p_rs_head = read_scale_ptr
        if READ_FP8:
            p_rs_head = read_scale_ptr + i_s * stride_rs_n + i_hv * stride_rs_h
        store_read_tile(
            b_h, read_ptr + i_s * stride_rd_n + i_hv * stride_rd_h, p_rs_head, o_v, o_kr,
            mask_v, mask_k, stride_rd_v, stride_rd_k, stride_rs_v, READ_FP8,
        )  # fmt: skip
    return b_h.to(tl.float32)


@triton.jit
def _history(b_hk, b_hq, b_kw, b_qw, p_rk, p_ru, p_rg, r_start, h_len, R, o_k, o_v, mask_k,
             mask_v, stride_rk_r, stride_rk_k, stride_u_r, stride_u_v, stride_g_r,
             USE_QK_L2NORM: tl.constexpr):  # fmt: skip
    """The committed records ``[0, h_len)``, oldest first, applied to the projections
    ``b_hk[s] = S·k̂_s`` and ``b_hq[s] = S·q̃_s`` (``[TP, BV]``, from ``S = S0``):
    ``S ← e^{g_j} S + u_j k̂_jᵀ`` projected is ``b_hk ← e^{g_j} b_hk + (k̂_j·k̂_s) u_j`` (and the
    same with q̃_s); returns the projections of the state after the history.  The next record's
    loads are in flight during each update."""
    row = r_start % R
    pf = h_len > 0
    n_k = tl.load(p_rk + row * stride_rk_r + o_k * stride_rk_k, mask=mask_k & pf, other=0)
    n_u = tl.load(p_ru + row * stride_u_r + o_v * stride_u_v, mask=mask_v & pf, other=0)
    n_g = tl.load(p_rg + row * stride_g_r, mask=pf, other=0.0)
    for i_r in range(0, h_len):
        b_k = n_k.to(tl.float32)
        b_u = n_u.to(tl.float32)
        b_g = n_g
        row = (r_start + i_r + 1) % R
        pf = i_r + 1 < h_len
        n_k = tl.load(p_rk + row * stride_rk_r + o_k * stride_rk_k, mask=mask_k & pf, other=0)
        n_u = tl.load(p_ru + row * stride_u_r + o_v * stride_u_v, mask=mask_v & pf, other=0)
        n_g = tl.load(p_rg + row * stride_g_r, mask=pf, other=0.0)
        if USE_QK_L2NORM:
            b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
        b_dk = tl.sum(b_kw * b_k[None, :], 1)  # [TP]: k̂_j·k̂_s
        b_dq = tl.sum(b_qw * b_k[None, :], 1)  # [TP]: k̂_j·q̃_s
        b_a = tl.exp(b_g)
        b_hk = b_a * b_hk + b_dk[:, None] * b_u[None, :]
        b_hq = b_a * b_hq + b_dq[:, None] * b_u[None, :]
    return b_hk, b_hq


@triton.jit(do_not_specialize=["sr_layer"])
def gdn_replay_verify_closed_fwd_kernel(
    # Pointers
    state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, o,
    slot_idx, ring_start, ring_len, flush, scale, read_ptr, read_scale_ptr, sr_seed,
    # Matrix dimensions
    R, sr_layer,
    # Strides
    stride_s_n, stride_s_h, stride_s_v, stride_s_k,
    stride_u_n, stride_u_h, stride_u_r, stride_u_v,
    stride_rk_n, stride_rk_h, stride_rk_r, stride_rk_k,
    stride_rv_n, stride_rv_h, stride_rv_r, stride_rv_v,
    stride_g_n, stride_g_h, stride_g_r,
    stride_beta_n, stride_beta_h, stride_beta_r,
    stride_q_b, stride_q_t, stride_q_h, stride_q_k,
    stride_k_b, stride_k_t, stride_k_h, stride_k_k,
    stride_v_b, stride_v_t, stride_v_h, stride_v_v,
    stride_a_b, stride_a_t, stride_a_h,
    stride_b_b, stride_b_t, stride_b_h,
    stride_o_b, stride_o_t, stride_o_h, stride_o_v,
    stride_rd_n, stride_rd_h, stride_rd_v, stride_rd_k,
    stride_rs_n, stride_rs_h, stride_rs_v,
    # Meta-parameters
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr,
    TP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SOFTPLUS_THRESHOLD: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr, HAS_READ: tl.constexpr, READ_FP8: tl.constexpr,
    SR: tl.constexpr,
):  # fmt: skip
    """One program: one ``[BV, K]`` tile of one value head of one row (module docstring).
    ``TP = next_pow2(T)``; ``HAS_READ``: non-flush rows read ``S0`` from the read copy
    (``read_ptr``, fp8: times ``read_scale_ptr``'s per-row scale), flush rows refresh it;
    ``SR``: flush rows store the fp16 checkpoint stochastically rounded."""
    i_v, i_hv, i_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (HV // H)

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
    o_t = tl.arange(0, TP)
    mask_k = o_k < K
    mask_v = o_v < V
    mask_h = mask_v[:, None] & mask_k[None, :]

    p_s = (state + i_s * stride_s_n + i_hv * stride_s_h + o_v[:, None] * stride_s_v
           + o_k[None, :] * stride_s_k)
    p_q = q + i_n * stride_q_b + i_h * stride_q_h + o_k * stride_q_k
    p_k = k + i_n * stride_k_b + i_h * stride_k_h + o_k * stride_k_k
    p_v = v + i_n * stride_v_b + i_hv * stride_v_h + o_v * stride_v_v
    p_a = a + i_n * stride_a_b + i_hv * stride_a_h
    p_b = b + i_n * stride_b_b + i_hv * stride_b_h
    p_o = o + i_n * stride_o_b + i_hv * stride_o_h
    p_rk = ring_k + i_s * stride_rk_n + i_h * stride_rk_h
    p_rv = ring_v + i_s * stride_rv_n + i_hv * stride_rv_h
    p_ru = ring_u + i_s * stride_u_n + i_hv * stride_u_h
    p_rg = ring_g + i_s * stride_g_n + i_hv * stride_g_h
    p_rb = ring_beta + i_s * stride_beta_n + i_hv * stride_beta_h
    # The copy's columns in runs of the checkpoint's 16-byte vector, as the recurrent kernel
    # declares them (the fold's layout stays the checkpoint tile's).
    o_kr = tl.max_contiguous(o_k, 128 // state.dtype.element_ty.primitive_bitwidth)

    # ---- S0: flush rows fold, store, and continue from the stored tile with an empty history.
    if is_flush:
        b_h = _fold_and_store(
            state, p_s, p_rk, p_rv, p_rg, p_rb, read_ptr, read_scale_ptr, sr_seed, sr_layer,
            i_s, i_hv, r_start, r_len, R, o_k, o_v, o_kr, mask_k, mask_v, mask_h,
            stride_rk_r, stride_rk_k, stride_rv_r, stride_rv_v, stride_g_r, stride_beta_r,
            stride_rd_n, stride_rd_h, stride_rd_v, stride_rd_k, stride_rs_n, stride_rs_h,
            stride_rs_v, V, K, USE_QK_L2NORM, HAS_READ, READ_FP8, SR,
        )  # fmt: skip
    else:
        if HAS_READ:
            b_h = tl.load(read_ptr + i_s * stride_rd_n + i_hv * stride_rd_h
                          + o_v[:, None] * stride_rd_v + o_kr[None, :] * stride_rd_k,
                          mask=mask_h, other=0.0).to(tl.float32)
            if READ_FP8:
                b_rs = tl.load(read_scale_ptr + i_s * stride_rs_n + i_hv * stride_rs_h
                               + o_v * stride_rs_v, mask=mask_v, other=0.0)
                b_h = b_h * b_rs[:, None]
        else:
            b_h = tl.load(p_s, mask=mask_h, other=0).to(tl.float32)
    h_len = tl.where(is_flush, 0, r_len)

    # ---- Window inputs, the records but u, S0·k̂_s, S0·q̃_s and the window's Gram coefficients.
    # Per-token value vectors are rows of [TP, BV] tensors (value rows across the lanes).
    b_kw = tl.zeros([TP, BK], dtype=tl.float32)  # k̂_s
    b_qw = tl.zeros([TP, BK], dtype=tl.float32)  # q̃_s
    b_hk = tl.zeros([TP, BV], dtype=tl.float32)  # S0·k̂_s
    b_hq = tl.zeros([TP, BV], dtype=tl.float32)  # S0·q̃_s
    b_ck = tl.zeros([TP, TP], dtype=tl.float32)  # [t, s]: e^{Gw_s−Gw_t} k̂_t·k̂_s, t < s
    b_cq = tl.zeros([TP, TP], dtype=tl.float32)  # [t, s]: e^{Gw_s−Gw_t} k̂_t·q̃_s, t <= s
    b_gw = tl.zeros([TP], dtype=tl.float32)  # Gw_s: inclusive prefix of the window gates
    b_bw = tl.zeros([TP], dtype=tl.float32)  # β_s
    g_run = tl.sum(tl.zeros([TP], dtype=tl.float32), 0)
    for s in tl.static_range(T):
        # Gates: the recurrent kernel's (and the decode kernel's) expressions: the ring's g and β
        # carry the bits a later fold replays.
        x_g = tl.load(p_a + s * stride_a_t).to(tl.float32) + dt_bias_val
        softplus_x = tl.where(x_g <= SOFTPLUS_THRESHOLD, tl.log(1.0 + tl.exp(x_g)), x_g)
        g_val = -tl.exp(A_log_val) * softplus_x
        b_in = tl.load(p_b + s * stride_b_t)
        beta_val = tl.sigmoid(b_in.to(tl.float32)).to(b.dtype.element_ty).to(tl.float32)
        b_q = tl.load(p_q + s * stride_q_t, mask=mask_k, other=0).to(tl.float32)
        b_k_raw = tl.load(p_k + s * stride_k_t, mask=mask_k, other=0)
        b_v_raw = tl.load(p_v + s * stride_v_t, mask=mask_v, other=0)
        b_k = b_k_raw.to(tl.float32)
        if USE_QK_L2NORM:
            b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
            b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
        b_q = b_q * scale
        g_run += g_val
        b_gw = tl.where(o_t == s, g_run, b_gw)
        b_bw = tl.where(o_t == s, beta_val, b_bw)
        b_kw = _set_row(b_kw, o_t, s, b_k)
        b_qw = _set_row(b_qw, o_t, s, b_q)
        b_hk = _set_row(b_hk, o_t, s, tl.sum(b_h * b_k[None, :], 1))
        b_hq = _set_row(b_hq, o_t, s, tl.sum(b_h * b_q[None, :], 1))
        # Coefficients of the window tokens t <= s (rows of b_kw beyond s are still zero).
        b_dec = tl.exp(g_run - b_gw)
        b_dk = tl.where(o_t < s, b_dec * tl.sum(b_kw * b_k[None, :], 1), 0.0)
        b_dq = tl.where(o_t <= s, b_dec * tl.sum(b_kw * b_q[None, :], 1), 0.0)
        b_ck = tl.where(o_t[None, :] == s, b_dk[:, None], b_ck)
        b_cq = tl.where(o_t[None, :] == s, b_dq[:, None], b_cq)
        # The window record at logical row len + s (u below).
        w_row = (r_start + r_len + s) % R
        tl.store(p_rv + w_row * stride_rv_r + o_v * stride_rv_v,
                 b_v_raw.to(ring_v.dtype.element_ty), mask=mask_v)
        if i_v == 0:
            tl.store(p_rg + w_row * stride_g_r, g_val)
            tl.store(p_rb + w_row * stride_beta_r, beta_val)
            if i_hv % (HV // H) == 0:
                tl.store(p_rk + w_row * stride_rk_r + o_k * stride_rk_k,
                         b_k_raw.to(ring_k.dtype.element_ty), mask=mask_k)

    # ---- History: the projections of the state after the committed records, then the window's
    # decay e^{Gw_s}: b_hk[s] = e^{g_s} S_{s−1} k̂_s before any window update (decay first).
    b_hk, b_hq = _history(
        b_hk, b_hq, b_kw, b_qw, p_rk, p_ru, p_rg, r_start, h_len, R, o_k, o_v, mask_k, mask_v,
        stride_rk_r, stride_rk_k, stride_u_r, stride_u_v, stride_g_r, USE_QK_L2NORM,
    )  # fmt: skip
    b_e = tl.exp(b_gw)[:, None]
    b_hk = b_e * b_hk
    b_hq = b_e * b_hq

    # ---- Window: forward substitution over value vectors; u_s goes to the ring.
    for s in tl.static_range(T):
        beta_s = tl.sum(tl.where(o_t == s, b_bw, 0.0), 0)
        b_v = tl.load(p_v + s * stride_v_t, mask=mask_v, other=0).to(tl.float32)
        b_u = beta_s * (b_v - _row(b_hk, o_t, s))
        b_hk += _row(b_ck, o_t, s)[:, None] * b_u[None, :]
        b_hq += _row(b_cq, o_t, s)[:, None] * b_u[None, :]
        w_row = (r_start + r_len + s) % R
        tl.store(p_ru + w_row * stride_u_r + o_v * stride_u_v, b_u.to(ring_u.dtype.element_ty),
                 mask=mask_v)
    tl.store(p_o + o_t[:, None] * stride_o_t + o_v[None, :] * stride_o_v,
             b_hq.to(o.dtype.element_ty), mask=(o_t[:, None] < T) & mask_v[None, :])


def gdn_replay_verify_closed_fwd(
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
    read_state: torch.Tensor | None = None,
    read_scale: torch.Tensor | None = None,
    sr_seed: torch.Tensor | None = None,
    sr_layer: int = 0,
) -> None:
    """Launch the closed-form kernel without checks (caller: ``gdn_replay_verify``).

    Grid ``(cdiv(V, CLOSED_BLOCK_V), HV, batch)``, ``CLOSED_NUM_WARPS`` warps, ``num_stages=1``.
    ``read_state`` (and ``read_scale`` for fp8): split precision (``HAS_READ`` compiled in);
    ``sr_seed`` (fp16 ``state``): stochastic rounding of the flush store (``SR`` compiled in).
    """
    batch, T, Hk, K = q.shape
    HV, V = state.shape[1], state.shape[2]
    R = ring_k.shape[2]
    if batch == 0:
        return
    BK = triton.next_power_of_2(K)
    BV = min(triton.next_power_of_2(V), CLOSED_BLOCK_V)
    grid = (triton.cdiv(V, BV), HV, batch)
    has_read = read_state is not None
    read_strides = (*(read_state.stride() if has_read else (0, 0, 0, 0)),
                    *(read_scale.stride() if read_scale is not None else (0, 0, 0)))
    gdn_replay_verify_closed_fwd_kernel[grid](
        state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, out,
        slot_idx, ring_start, ring_len, flush, float(scale), read_state, read_scale, sr_seed,
        R, sr_layer,
        *state.stride(), *ring_u.stride(), *ring_k.stride(), *ring_v.stride(),
        *ring_g.stride(), *ring_beta.stride(), *q.stride(), *k.stride(), *v.stride(),
        *a.stride(), *b.stride(), *out.stride(), *read_strides,
        H=Hk, HV=HV, K=K, V=V, T=T, TP=triton.next_power_of_2(T), BK=BK, BV=BV,
        SOFTPLUS_THRESHOLD=20.0, USE_QK_L2NORM=use_qk_l2norm, HAS_READ=has_read,
        READ_FP8=read_scale is not None, SR=sr_seed is not None,
        num_warps=CLOSED_NUM_WARPS, num_stages=1,
    )  # fmt: skip
