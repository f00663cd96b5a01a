"""Mamba-2 ReplaySSM verify: outputs of T window tokens from checkpoint + ring, one launch.

This file holds the tensor-core implementation (``impl="dot"``), the launcher and the public
function; the default implementation is ``fma.py``'s (``IMPLS``, ``launch_config``).

Layers (fla style): ``_mamba2_replay_verify_fwd_kernel`` (jit) → ``mamba2_replay_verify_fwd``
(launcher, no checks) → ``mamba2_replay_verify`` (public, validated).

Launch layout: grid ``(H·P_SPLIT, batch)``, as the decode kernel; one program per (row, head)
forms the per-head coefficient matrix once, then walks the head's checkpoint in ``[BLOCK_P, N]``
tiles, reading each once. At small batch (``heads · batch`` programs short of the decode kernel's
target per SM: ``mamba2_decode``'s ``p_split_rule``, the same fixed rule) each head's P-tiles are
split over ``P_SPLIT`` adjacent programs, each recomputing the per-head terms (Δ, ``KᵀQ``, the
coefficients; identical operations, so identical values) and owning whole P rows of the state:
every output, checkpoint, read-copy (fp8 row max included: a row's N columns stay in one program)
and record element is computed by the same operations in the same order as unsplit. Δ and the
group's B records are appended by the head's first split only. Nemotron-3-Nano-4B (96 heads,
P = 80: 5 tiles) on 132 SMs: batch 1 → 5 programs per head, batch 2 → 3, batch 3-5 → 2,
batch >= 6 → unsplit. Per head (math.md §5.1), with ``h`` committed records, window tokens
``s = 0..T-1``, ``cw_s`` the inclusive Δ prefix of the window and ``sh_j`` the Δ-sum of the
history records newer than ``j``::

    O = (S0·Q) Dg + V (W ⊙ KᵀQ) + D x
    Dg[s]    = exp(A (Σ_hist Δ + cw_s))
    W[j, s]  = Δ_j exp(A (cw_s + e_j)),  e_j = sh_j (history j), −cw_t · 1[t <= s] (window t)

with one record index space ``J`` (``BLOCK_J = next_pow2(R)`` rows: the ``T`` window tokens, then
the history newest first; ``len + T <= R``). Every product runs on tensor cores (``tl.dot``,
about fp32 accuracy: ``launch_config``; operands padded to 16): ``KᵀQ [BLOCK_J, BLOCK_T]`` once
per (row, head) (the group's heads each recompute it: O(R·T·N), small next to the state), and per
P-tile ``[BLOCK_P, N]×[N, BLOCK_T]`` (N in ``BLOCK_K`` chunks, which bounds the registers of the
operands every warp holds) plus ``[BLOCK_P, BLOCK_J]×[BLOCK_J, BLOCK_T]``. No per-draft state.

- Padding row (``slot < 0``): returns before touching memory.
- Non-flush row: ``S0`` + history ``[0, len)`` + window; no state write.
- Flush row: each ``[BLOCK_P, BLOCK_K]`` chunk first folds the history ``[0, len)`` in
  ``selective_state_update``'s op order (``fma(S, exp(A·Δ), (B·Δ)·x)``, as the decode kernel's
  fold, hence bit-identical to it and to SGLang), stores it once (an fp16 state with ``SR``:
  stochastically rounded, ``stochastic_round.py``), then uses the fp32 chunk with ``h = 0``
  (only the intra-window term).
- Every row appends its ``T`` window records ``(x, Δ, B)`` at physical rows
  ``(ring_start + ring_len + t) % R`` (logical ``len + t`` before the commit; for a flush row
  logical ``t`` after the commit moves ``start`` past the folded history).

Split precision (``HAS_READ``, as the decode kernel; ``read_copy.py`` of ``mamba2_decode``):
non-flush rows take ``S0`` for ``S·Q`` from the bf16 / fp16 / fp8 read copy and never read the
checkpoint; the copy's values are exact tf32 operands, so with 16-bit activations ``S·Q`` is one
tf32 product per chunk (fp32 activations: two, the ``Q`` side split), and an fp8 copy's per-row
power-of-two scale multiplies the row's ``S·Q`` after the N-sum (exact). Flush rows fold and
store the checkpoint exactly as without a copy (their outputs too), then refresh the copy from the
checkpoint as stored: per chunk for 16-bit copies (``store_read_tile``); for fp8 the row scale
needs the max over all N, so the chunks' maxima are gathered while folding and, once the whole
tile is stored, a second pass re-reads the tile's checkpoint chunks (as stored) and writes the
scales and the quantised chunks (``READ_FP8``). Without a copy both flags are off and the
compiled kernel is the no-copy one.

No autotune (the kernel writes the pool), no host sync: CUDA-graph safe.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from replayssm_kernels._checks import check_launch_device, interpreting, launch_device
from replayssm_kernels.mamba2_decode._fold import record_factors
from replayssm_kernels.mamba2_decode.kernel import (
    _sm_count,
    _softplus,
    p_split_rule,
)
from replayssm_kernels.mamba2_decode.read_copy import (
    fp8_row_scale,
    store_read_tile,
    validate_read_copy,
)
from replayssm_kernels.mamba2_verify._validate import validate_mamba2_verify
from replayssm_kernels.prefetch import l2_tile_prefetch_ok
from replayssm_kernels.stochastic_round import (
    sr_key,
    sr_round_fp16,
    validate_stochastic_rounding,
)

__all__ = [
    "IMPLS",
    "fma_launch_config",
    "launch_config",
    "mamba2_replay_verify",
    "mamba2_replay_verify_fwd",
]


@triton.jit
def _fold_record(b_s, p_rx, p_rdt, p_rB, row, A, m_p, m_n, stride_rx_row, stride_rdt_row,
                 stride_rB_row):
    # One committed record, exactly as the decode kernel's fold (and selective_state_update).
    b_xj, dA, dB = record_factors(p_rx, p_rdt, p_rB, row, A, m_p, m_n, stride_rx_row,
                                  stride_rdt_row, stride_rB_row)
    return tl.fma(b_s, dA, dB * b_xj.to(tl.float32)[:, None])


@triton.jit
def _fold_history(b_s, p_rx, p_rdt, p_rB, start, n_full, length, R, A, m_p, m_n, stride_rx_row,
                  stride_rdt_row, stride_rB_row, FOLD_UNROLL: tl.constexpr):
    # The committed records [0, length) folded into one [BLOCK_P, BLOCK_K] chunk, oldest first:
    # full chunks of FOLD_UNROLL records (unrolled; n_full = length rounded down), then the rest.
    for c in range(0, n_full, FOLD_UNROLL):
        for jj in tl.static_range(FOLD_UNROLL):
            b_s = _fold_record(b_s, p_rx, p_rdt, p_rB, (start + c + jj) % R, A, m_p, m_n,
                               stride_rx_row, stride_rdt_row, stride_rB_row)
    for jr in range(n_full, length):
        b_s = _fold_record(b_s, p_rx, p_rdt, p_rB, (start + jr) % R, A, m_p, m_n, stride_rx_row,
                           stride_rdt_row, stride_rB_row)
    return b_s


@triton.jit
def _store_read_rows_fp8(p_s_head, p_r_head, p_rs_head, amax, o_p, m_p, o_k, N, stride_state_p,
                         stride_state_n, stride_read_p, stride_read_n, stride_rs_p,
                         BLOCK_K: tl.constexpr, NUM_NK: tl.constexpr):
    """fp8 refresh of rows ``o_p`` of the read copy from the checkpoint as stored, with
    ``amax`` the rows' max |value| over all N: ``fp8_row_scale`` (as ``store_read_tile``) on
    whole rows whose chunks are re-read from the checkpoint. The caller has stored the chunks and
    synchronised the program (``tl.debug_barrier``) so every thread sees them."""
    scale, inv = fp8_row_scale(amax)
    tl.store(p_rs_head + o_p * stride_rs_p, scale, mask=m_p)
    for kc in tl.static_range(NUM_NK):
        o_n = kc * BLOCK_K + o_k
        m_pn = m_p[:, None] & (o_n < N)[None, :]
        b_v = tl.load(p_s_head + o_p[:, None] * stride_state_p + o_n[None, :] * stride_state_n,
                      mask=m_pn, other=0.0).to(tl.float32)
        p_r = p_r_head + o_p[:, None] * stride_read_p + o_n[None, :] * stride_read_n
        tl.store(p_r, (b_v * inv[:, None]).to(p_r.dtype.element_ty), mask=m_pn)


@triton.jit
def _window_delta(p_dt_row, o_t, m_t, stride_dt_T, dt_bias_ptr, i_h, stride_dt_bias_head,
                  DT_SOFTPLUS: tl.constexpr, HAS_DT_BIAS: tl.constexpr):
    # Window Δ of tokens o_t exactly as selective_state_update's TIE_HDIM path; 0 where masked.
    b_dw = tl.load(p_dt_row + o_t * stride_dt_T, mask=m_t, other=0.0).to(tl.float32)
    if HAS_DT_BIAS:
        b_dw += tl.load(dt_bias_ptr + i_h * stride_dt_bias_head).to(tl.float32)
    if DT_SOFTPLUS:
        b_dw = _softplus(b_dw)
    return tl.where(m_t, b_dw, 0.0)


@triton.jit
def _tf32_split(a):
    """``a = hi + lo`` exactly (fp32): ``hi`` keeps tf32's 10 mantissa bits, so a tf32 operand
    conversion of ``hi`` is exact and that of ``lo`` loses at most ``2^-21 |a|``."""
    hi = (a.to(tl.uint32, bitcast=True) & 0xFFFFE000).to(tl.float32, bitcast=True)
    return hi, a - hi


@triton.jit
def _dot_fp32_left(a, b, acc, EXACT_B: tl.constexpr):
    """``acc + a @ b`` to about fp32 accuracy, ``a`` fp32. ``EXACT_B`` (``b`` holds 16-bit
    activation values, exact in tf32): two tf32 products of ``a``'s split, small part first;
    otherwise tf32x3 (three products of both splits)."""
    if EXACT_B:
        hi, lo = _tf32_split(a)
        acc = tl.dot(lo, b, acc=acc, input_precision="tf32")
        acc = tl.dot(hi, b, acc=acc, input_precision="tf32")
    else:
        acc = tl.dot(a, b, acc=acc, input_precision="tf32x3")
    return acc


@triton.jit
def _dot_fp32_right(a, b, acc, EXACT_A: tl.constexpr):
    """``acc + a @ b`` to about fp32 accuracy, ``b`` fp32; ``_dot_fp32_left`` mirrored."""
    if EXACT_A:
        hi, lo = _tf32_split(b)
        acc = tl.dot(a, lo, acc=acc, input_precision="tf32")
        acc = tl.dot(a, hi, acc=acc, input_precision="tf32")
    else:
        acc = tl.dot(a, b, acc=acc, input_precision="tf32x3")
    return acc


@triton.jit(do_not_specialize=["sr_layer"])
def _mamba2_replay_verify_fwd_kernel(
    # Pointers
    state_ptr,
    ring_x_ptr,
    ring_dt_ptr,
    ring_B_ptr,
    x_ptr,
    dt_ptr,
    A_ptr,
    B_ptr,
    C_ptr,
    D_ptr,
    z_ptr,
    dt_bias_ptr,
    out_ptr,
    slot_idx_ptr,
    ring_start_ptr,
    ring_len_ptr,
    flush_ptr,
    read_ptr,
    read_scale_ptr,
    sr_seed_ptr,
    # Dimensions
    T,
    P,
    N,
    R,
    heads_per_group,
    sr_layer,
    # Strides
    stride_state_slot,
    stride_state_head,
    stride_state_p,
    stride_state_n,
    stride_rx_slot,
    stride_rx_head,
    stride_rx_row,
    stride_rx_p,
    stride_rdt_slot,
    stride_rdt_head,
    stride_rdt_row,
    stride_rB_slot,
    stride_rB_group,
    stride_rB_row,
    stride_rB_n,
    stride_x_batch,
    stride_x_T,
    stride_x_head,
    stride_x_p,
    stride_dt_batch,
    stride_dt_T,
    stride_dt_head,
    stride_A_head,
    stride_B_batch,
    stride_B_T,
    stride_B_group,
    stride_B_n,
    stride_C_batch,
    stride_C_T,
    stride_C_group,
    stride_C_n,
    stride_D_head,
    stride_D_p,
    stride_z_batch,
    stride_z_T,
    stride_z_head,
    stride_z_p,
    stride_dt_bias_head,
    stride_out_batch,
    stride_out_T,
    stride_out_head,
    stride_out_p,
    stride_read_slot,
    stride_read_head,
    stride_read_p,
    stride_read_n,
    stride_rs_slot,
    stride_rs_head,
    stride_rs_p,
    # Meta-parameters
    DT_SOFTPLUS: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr,
    HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_NK: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_T: tl.constexpr,
    NUM_PT: tl.constexpr,
    FOLD_UNROLL: tl.constexpr,
    ACT_TF32_EXACT: tl.constexpr,
    HAS_READ: tl.constexpr,
    READ_FP8: tl.constexpr,
    SR: tl.constexpr,
    P_SPLIT: tl.constexpr,
):
    # P_SPLIT programs share one (row, head), adjacent in launch order: program i_s owns the
    # head's P-tiles [i_s·NUM_PT, (i_s+1)·NUM_PT), i.e. whole P rows p0 .. p0 + NUM_PT·BLOCK_P - 1
    # (rows >= P masked), and recomputes the per-head terms (Δ, KᵀQ, the coefficients) exactly as
    # the unsplit program does. Every state / output / record element is still computed by one
    # program with the same operations in the same order. P_SPLIT == 1 is the unsplit launch.
    if P_SPLIT > 1:
        i_h = tl.program_id(0) // P_SPLIT
        i_s = tl.program_id(0) % P_SPLIT
        p0 = i_s * (NUM_PT * BLOCK_P)
    else:
        i_h = tl.program_id(0)
        i_s = 0
        p0 = 0
    i_b = tl.program_id(1)

    slot = tl.load(slot_idx_ptr + i_b).to(tl.int64)
    start = tl.load(ring_start_ptr + i_b).to(tl.int32)
    length = tl.load(ring_len_ptr + i_b).to(tl.int32)
    do_flush = tl.load(flush_ptr + i_b)
    if slot < 0:
        return  # padding row: touches nothing, not even its output rows
    i_g = i_h // heads_per_group
    i_b64 = i_b.to(tl.int64)  # row offsets in 64 bits: batch × row stride may pass 2^31

    o_k = tl.arange(0, BLOCK_K)  # one N-chunk: every [., N] operand is walked in BLOCK_K columns
    o_t = tl.arange(0, BLOCK_T)
    m_t = o_t < T
    A = tl.load(A_ptr + i_h * stride_A_head).to(tl.float32)
    p_dt_row = dt_ptr + i_b64 * stride_dt_batch + i_h * stride_dt_head
    b_dw = _window_delta(p_dt_row, o_t, m_t, stride_dt_T, dt_bias_ptr, i_h, stride_dt_bias_head,
                         DT_SOFTPLUS, HAS_DT_BIAS)
    b_cw = tl.cumsum(b_dw, axis=0)  # inclusive window prefix cw_s

    p_rx_head = ring_x_ptr + slot * stride_rx_slot + i_h * stride_rx_head
    p_rdt = ring_dt_ptr + slot * stride_rdt_slot + i_h * stride_rdt_head
    p_rB_grp = ring_B_ptr + slot * stride_rB_slot + i_g * stride_rB_group
    p_x_row = x_ptr + i_b64 * stride_x_batch + i_h * stride_x_head
    p_B_row = B_ptr + i_b64 * stride_B_batch + i_g * stride_B_group
    # Q = Cᵀ [N, BLOCK_T] (one column per window token), read in [BLOCK_K, BLOCK_T] chunks.
    p_Q = (C_ptr + i_b64 * stride_C_batch + i_g * stride_C_group + o_k[:, None] * stride_C_n
           + o_t[None, :] * stride_C_T)

    # The records that feed the outputs, one index space J: J < T the window tokens, then the
    # committed history newest first (none for flush rows: it is in the new S). len + T <= R.
    hist = tl.where(do_flush, 0, length)
    o_j = tl.arange(0, BLOCK_J)
    is_w = o_j < T
    is_h = (o_j >= T) & (o_j < T + hist)
    row_j = (start + tl.where(is_h, hist - 1 - (o_j - T), 0)) % R  # physical history rows
    d_j = tl.where(is_w, _window_delta(p_dt_row, o_j, is_w, stride_dt_T, dt_bias_ptr, i_h,
                                       stride_dt_bias_head, DT_SOFTPLUS, HAS_DT_BIAS),
                   tl.load(p_rdt + row_j * stride_rdt_row, mask=is_h, other=0.0))
    d_h = tl.where(is_h, d_j, 0.0)
    # e_j: -cw_t for window token t, the Δ-sum of the newer history records for history j, so
    # W[j, s] = Δ_j exp(A (cw_s + e_j)) is math.md's W_w (t <= s) and W_h in one matrix.
    e_j = tl.where(is_w, -tl.cumsum(tl.where(is_w, d_j, 0.0), axis=0),
                   tl.cumsum(d_h, axis=0) - d_h)
    h_sum = tl.sum(d_h, axis=0)
    m_js = (is_h[:, None] | (is_w[:, None] & (o_j[:, None] <= o_t[None, :]))) & m_t[None, :]

    # KᵀQ (B_j·C_s) [BLOCK_J, BLOCK_T], N-chunk by N-chunk; the group's first head (its first
    # split) appends the window's B records from the same loads.
    row_w = (start + length + o_j) % R  # physical rows of the window records (J < T)
    m_jn_w = is_w & (i_h % heads_per_group == 0) & (i_s == 0)
    kq = tl.zeros([BLOCK_J, BLOCK_T], dtype=tl.float32)
    for kc in tl.static_range(NUM_NK):
        o_n = kc * BLOCK_K + o_k
        m_n = o_n < N
        p_Bj = tl.where(is_w[:, None], p_B_row + o_j[:, None] * stride_B_T
                        + o_n[None, :] * stride_B_n,
                        p_rB_grp + row_j[:, None] * stride_rB_row + o_n[None, :] * stride_rB_n)
        b_Bj = tl.load(p_Bj, mask=(is_w | is_h)[:, None] & m_n[None, :], other=0.0)
        b_q = tl.load(p_Q + kc * BLOCK_K * stride_C_n, mask=m_n[:, None] & m_t[None, :],
                      other=0.0).to(tl.float32)
        if ACT_TF32_EXACT:  # B and C values: both operands exact in tf32, one product
            kq = tl.dot(b_Bj.to(tl.float32), b_q, acc=kq, input_precision="tf32")
        else:
            kq = tl.dot(b_Bj.to(tl.float32), b_q, acc=kq, input_precision="tf32x3")
        tl.store(p_rB_grp + row_w[:, None] * stride_rB_row + o_n[None, :] * stride_rB_n, b_Bj,
                 mask=m_jn_w[:, None] & m_n[None, :])
    coef = tl.where(m_js, d_j[:, None] * tl.exp(A * (b_cw[None, :] + e_j[:, None])) * kq, 0.0)
    d_g = tl.exp(A * (h_sum + b_cw))  # [BLOCK_T]

    p_s_head = state_ptr + slot * stride_state_slot + i_h * stride_state_head
    p_o_row = out_ptr + i_b64 * stride_out_batch + i_h * stride_out_head
    p_r_head = read_ptr
    p_rs_head = read_scale_ptr
    if HAS_READ:
        p_r_head = read_ptr + slot * stride_read_slot + i_h * stride_read_head
    if READ_FP8:
        p_rs_head = read_scale_ptr + slot * stride_rs_slot + i_h * stride_rs_head
    n_full = (length // FOLD_UNROLL) * FOLD_UNROLL
    if SR:  # fp16 checkpoint, stochastic rounding: this (seed, layer, slot)'s key
        sr_k = sr_key(sr_seed_ptr, sr_layer, slot)
    for pt in range(NUM_PT):
        o_p = p0 + pt * BLOCK_P + tl.arange(0, BLOCK_P)
        m_p = o_p < P
        p_rx = p_rx_head + o_p * stride_rx_p
        # (S·Q) over N-chunks of the checkpoint tile (non-flush rows with a read copy: of the
        # copy), on tensor cores. A flush row first folds the committed history into the chunk
        # (decode kernel's order and expressions, the same per element whatever the chunking)
        # and stores it once; the window is not folded.
        b_y = tl.zeros([BLOCK_P, BLOCK_T], dtype=tl.float32)
        if READ_FP8:
            amax = tl.zeros([BLOCK_P], dtype=tl.float32)  # flush rows: the stored rows' max |S|
        for kc in tl.static_range(NUM_NK):
            o_n = kc * BLOCK_K + o_k
            m_n = o_n < N
            m_pn = m_p[:, None] & m_n[None, :]
            p_s = p_s_head + o_p[:, None] * stride_state_p + o_n[None, :] * stride_state_n
            if HAS_READ:
                b_q = tl.load(p_Q + kc * BLOCK_K * stride_C_n, mask=m_n[:, None] & m_t[None, :],
                              other=0.0).to(tl.float32)
                if do_flush:  # as without a copy, then the copy's refresh from the stored chunk
                    b_s = _fold_history(tl.load(p_s, mask=m_pn, other=0.0).to(tl.float32), p_rx,
                                        p_rdt, p_rB_grp + o_n * stride_rB_n, start, n_full,
                                        length, R, A, m_p, m_n, stride_rx_row, stride_rdt_row,
                                        stride_rB_row, FOLD_UNROLL)
                    if SR:
                        b_st = sr_round_fp16(b_s, sr_k, (i_h * P + o_p[:, None]) * N
                                             + o_n[None, :])
                    else:
                        b_st = b_s.to(p_s.dtype.element_ty)
                    tl.store(p_s, b_st, mask=m_pn)
                    if READ_FP8:
                        amax = tl.maximum(amax, tl.max(tl.where(m_pn, tl.abs(b_st.to(tl.float32)),
                                                                0.0), axis=1))
                    else:
                        store_read_tile(b_st, p_r_head, p_rs_head, o_p, o_n, m_p, m_n,
                                        stride_read_p, stride_read_n, stride_rs_p, False)
                    b_y = _dot_fp32_left(b_s, b_q, b_y, ACT_TF32_EXACT)
                else:  # the copy only: its values are exact tf32 operands
                    b_c = tl.load(p_r_head + o_p[:, None] * stride_read_p
                                  + o_n[None, :] * stride_read_n, mask=m_pn,
                                  other=0.0).to(tl.float32)
                    if ACT_TF32_EXACT:
                        b_y = tl.dot(b_c, b_q, acc=b_y, input_precision="tf32")
                    else:
                        b_y = _dot_fp32_right(b_c, b_q, b_y, True)
            else:
                b_s = tl.load(p_s, mask=m_pn, other=0.0).to(tl.float32)
                if do_flush:
                    b_s = _fold_history(b_s, p_rx, p_rdt, p_rB_grp + o_n * stride_rB_n, start,
                                        n_full, length, R, A, m_p, m_n, stride_rx_row,
                                        stride_rdt_row, stride_rB_row, FOLD_UNROLL)
                    if SR:
                        b_st = sr_round_fp16(b_s, sr_k, (i_h * P + o_p[:, None]) * N
                                             + o_n[None, :])
                    else:
                        b_st = b_s.to(p_s.dtype.element_ty)
                    tl.store(p_s, b_st, mask=m_pn)
                b_q = tl.load(p_Q + kc * BLOCK_K * stride_C_n, mask=m_n[:, None] & m_t[None, :],
                              other=0.0).to(tl.float32)
                b_y = _dot_fp32_left(b_s, b_q, b_y, ACT_TF32_EXACT)
        if READ_FP8:
            if do_flush:
                tl.debug_barrier()  # the tile's stored chunks, visible to every thread
                _store_read_rows_fp8(p_s_head, p_r_head, p_rs_head, amax, o_p, m_p, o_k, N,
                                     stride_state_p, stride_state_n, stride_read_p,
                                     stride_read_n, stride_rs_p, BLOCK_K, NUM_NK)
            else:  # S·Q of the fp8 copy times the row's power-of-two scale (exact)
                b_y = b_y * tl.load(p_rs_head + o_p * stride_rs_p, mask=m_p, other=0.0)[:, None]
        # Outputs only (never fed back into a checkpoint): (S·Q) Dg + V (W ⊙ KᵀQ), V [BLOCK_P,
        # BLOCK_J] the tile's x columns of the window tokens and the history records.
        b_y = b_y * d_g[None, :]
        p_v = tl.where(is_w[None, :], p_x_row + o_j[None, :] * stride_x_T
                       + o_p[:, None] * stride_x_p,
                       p_rx_head + row_j[None, :] * stride_rx_row + o_p[:, None] * stride_rx_p)
        b_v = tl.load(p_v, mask=m_p[:, None] & (is_w | is_h)[None, :], other=0.0)
        b_y = _dot_fp32_right(b_v.to(tl.float32), coef, b_y, ACT_TF32_EXACT)
        # Append the window's x records (after this tile's history reads; disjoint rows anyway).
        tl.store(p_rx_head + row_w[None, :] * stride_rx_row + o_p[:, None] * stride_rx_p, b_v,
                 mask=m_p[:, None] & is_w[None, :])
        m_pt = m_p[:, None] & m_t[None, :]
        if HAS_D:
            b_D = tl.load(D_ptr + i_h * stride_D_head + o_p * stride_D_p, mask=m_p,
                          other=0.0).to(tl.float32)
            b_xw = tl.load(p_x_row + o_t[None, :] * stride_x_T + o_p[:, None] * stride_x_p,
                           mask=m_pt, other=0.0).to(tl.float32)
            b_y += b_xw * b_D[:, None]
        if HAS_Z:
            b_z = tl.load(z_ptr + i_b64 * stride_z_batch + i_h * stride_z_head
                          + o_t[None, :] * stride_z_T + o_p[:, None] * stride_z_p, mask=m_pt,
                          other=0.0).to(tl.float32)
            b_y *= b_z * tl.sigmoid(b_z)
        p_o = p_o_row + o_t[None, :] * stride_out_T + o_p[:, None] * stride_out_p
        tl.store(p_o, b_y.to(p_o.dtype.element_ty), mask=m_pt)
    tl.store(p_rdt + row_w * stride_rdt_row, d_j, mask=is_w & (i_s == 0))  # Δ: first split


#: Smallest tile edge of ``tl.dot`` (tensor-core products): window tokens, history rows, N and the
#: P-tile are padded (masked) up to it.
MIN_DOT = 16
#: N columns per chunk: a ``tl.dot`` operand of ``[16, K]`` fp32 is held whole by each of the 4
#: warps (an M = 16 product is not split across warps), so K bounds the registers.
BLOCK_K_MAX = 32


class LaunchConfig(NamedTuple):
    block_p: int  # P rows per tile (>= MIN_DOT); a program loops over cdiv(P, block_p) tiles
    block_j: int  # output records per row (window + history), next_pow2(R) (>= MIN_DOT)
    block_t: int  # window tokens, next_pow2(T) (>= MIN_DOT)
    block_k: int  # N columns per chunk of every [., N] operand (>= MIN_DOT)
    fold_unroll: int  # records per unrolled fold step (flush rows)
    num_warps: int
    act_tf32_exact: bool  # x, B, C are 16-bit (exact tf32 operands): split only the fp32 side
    num_stages: int  # software pipelining of the P-tile loop (1: none)
    maxnreg: int | None  # register cap per thread (ptxas), None: the compiler's choice
    impl: str = "dot"  # "dot": this file's tensor-core kernel; "fma": fma.py's (see IMPLS)
    l2_ahead: int = 0  # "fma": bulk L2 prefetch of tile t + l2_ahead (0: none; compiled only)
    # "fma" (fma_layout): the checkpoint tile as n_chunks column chunks per thread (1: the
    # decode kernel's [block_p, N] tile); kq_dot = 1 (needs n_chunks > 1): KᵀQ on tensor cores.
    # Layout and output products only: the stored bits are the same for every value.
    n_chunks: int = 1
    kq_dot: int = 0
    # "fma": 1 (needs kq_dot = 1, a bf16 or fp8 read copy and bf16 activations): non-flush rows'
    # outputs from the copy on tensor cores (mma_tile.py); 0: this layout's FMAs. Outputs only.
    read_mma: int = 0
    # "fma" with read_mma = 1: the flush rows in a launch of their own, built without read_mma
    # and with kq_dot = flush_kq_dot, the non-flush rows in a read_mma launch built for them
    # alone; each launch's other rows return at once. Flush outputs: FMA order.
    flush_split: int = 0
    flush_kq_dot: int = 0


#: The two implementations of one contract: ``"fma"`` (fp32 FMA reductions over whole-N tiles,
#: ``fma.py``; the default since the H200 A/B of benchmarks/RESULTS.md, eighth session: T = 4,
#: batch 256: 711 vs 1485 us) and ``"dot"`` (this file's tensor-core kernel; within 15% of
#: ``"fma"`` only at T = 8, batch 1).
IMPLS = ("dot", "fma")


def launch_config(P: int, N: int, R: int, T: int, act_dtype: torch.dtype,
                  impl: str = "fma", read_dtype: torch.dtype | None = None) -> LaunchConfig:
    """Fixed launch parameters of implementation ``impl`` (``IMPLS``; ``"fma"``:
    ``fma_launch_config``, which takes the read copy's dtype ``read_dtype``, ``None`` for none;
    otherwise ``ValueError``).

    ``"dot"`` (no autotune: the kernel writes the pool), chosen offline from ptxas'
    register counts (sm_90a, Nano-4B shape, T = 8; see benchmarks/notes/verify.md):
    ``BLOCK_K = 32``, no pipelining and a 128-register cap give 128 registers with a 4-byte spill
    (4 CTAs of 4 warps per SM); pipelining takes 226-250 registers.

    Precision of the output products (tensor cores, about fp32 accuracy for every output dtype):
    plain ``"tf32"`` products of the fp32 checkpoint and coefficients flipped many bf16 output
    roundings on the H200 (commit f114327: 1.1e-3 from the torch reference; greedy speculative
    decoding parted from stock's snapshot verify at token 3 of one request), and ``"tf32x3"`` on
    every product cost 58% (T = 4, batch 256: 2137 vs 1352 us, commit 1d8d1f8). With 16-bit
    activations (``act_dtype`` bf16 / fp16) the x, B and C operands are exact in tf32, so only the
    fp32 side is split: ``KᵀQ`` is one tf32 product, ``S·Q`` and ``V (W ⊙ KᵀQ)`` two each
    (``_tf32_split``), the same accuracy as tf32x3 with 2/3 of its products. fp32 activations keep
    tf32x3. The flush fold into the checkpoint never goes through ``tl.dot``.
    """
    if impl == "fma":
        return fma_launch_config(P, N, R, T, act_dtype, read_dtype)
    if impl != "dot":
        raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")
    block_k = max(MIN_DOT, min(BLOCK_K_MAX, triton.next_power_of_2(N)))
    num_warps = 4 if triton.next_power_of_2(N) * MIN_DOT >= 1024 else 2
    act_exact = act_dtype in (torch.bfloat16, torch.float16)
    return LaunchConfig(MIN_DOT, max(MIN_DOT, triton.next_power_of_2(R)),
                        max(MIN_DOT, triton.next_power_of_2(T)), block_k, 4, num_warps, act_exact,
                        1, 128)


def _read_mma_operands_ok(read_dtype: torch.dtype | None, act_dtype: torch.dtype, block_p: int,
                         N: int) -> bool:
    """Whether ``read_mma``'s tensor-core ``S·C`` applies: exact bf16 operands (a bf16 or e4m3
    read copy, bf16 activations) and ``tl.dot``'s tile (``block_p`` and ``next_pow2(N)`` at least
    ``MIN_DOT``)."""
    return (read_dtype in (torch.bfloat16, torch.float8_e4m3fn) and act_dtype == torch.bfloat16
            and min(block_p, triton.next_power_of_2(N)) >= MIN_DOT)


def fma_launch_config(P: int, N: int, R: int, T: int, act_dtype: torch.dtype,
                      read_dtype: torch.dtype | None = None) -> LaunchConfig:
    """Fixed launch parameters of the FMA implementation (``fma.py``; no autotune), chosen by H200
    launch sweeps at the Nano-4B shape without a read copy (benchmarks/RESULTS.md, eighth and
    twelfth sessions; offline ptxas counts in benchmarks/notes/verify.md, "FMA implementation").

    ``BLOCK_P``-row tiles of the whole N (``BLOCK_N = next_pow2(N)``), two warps for tiles of up
    to 2,048 elements (four above), two records per unrolled fold step, a bulk L2 prefetch one
    tile ahead; ``block_j`` and ``block_t`` without the tensor cores' 16 minimum
    (``next_pow2(R)``, ``next_pow2(T)``); ``block_k`` is the N-chunk of the once-per-head ``KᵀQ``
    sums (at most 32 columns). By window (``fma_layout`` for ``n_chunks`` / ``kq_dot``; cycle
    means at batch 256, a = T / 2 accepted, L = 16, twelfth session):

    - up to 4 tokens: 16-row tiles held as 4 N-chunks per thread, 128-register cap (T = 4:
      486.1 us; the decode kernel's whole-N tile 662.3, with ``KᵀQ`` on tensor cores 494.7, at a
      160 cap 571.0);
    - 8 tokens, 16-bit activations: 16-row tiles, 4 N-chunks, ``KᵀQ`` on tensor cores, no cap
      (T = 8: 1111.5 us; the whole-N 8-row tile 1218.0, 8-row chunked 1474.8, a 168 cap
      1125.1);
    - otherwise (longer windows, or fp32 activations at 8 tokens: not timed in this form) the
      decode kernel's whole-N tile in 8-row tiles, no cap (T = 8, eighth session: 1210.5 us
      against 1437.2 for 16-row tiles).

    With a bf16 or fp8 read copy (``read_dtype``) and bf16 activations, ``read_mma`` (non-flush
    rows' outputs on tensor cores, ``mma_tile.py``; ``kq_dot`` turned on for it) at 4 (3) and 8
    tokens, where it was timed faster (H100, batch 256, against the same launch without it):
    T = 8 cycle means 738.2 vs 1079.6 us (bf16 copy), 904.7 vs 1076.8 (fp8); T = 4 bf16 461.1 vs
    502.3 (thirty-ninth session); T = 4 fp8 by the mixed launch, the served form (rows spread
    over their cycles): 491.4 vs 504.7 and 470.7 vs 504.1 (thirty-ninth / fortieth session),
    while its cycle mean, every row in one phase, is 1% slower (469.5 vs 464.8, 468.6 vs 464.6:
    ``kq_dot``'s flush step). Not below 4 tokens (not timed), nor below ``tl.dot``'s 16
    checkpoint rows per tile or 16 columns of N.

    ``flush_split`` with ``read_mma`` at 8 tokens and with an fp8 copy at 4 (3): the flush rows
    in a launch built as without a copy (no ``read_mma``; ``kq_dot`` as without a copy:
    ``flush_kq_dot``), the non-flush rows in a ``read_mma`` launch built for them alone. H100,
    batch 256, against the one launch (forty-second session; cycle means, mixed launch in
    brackets): T = 8 bf16 copy 682.6 vs 734.5 us (702.6 vs 761.8), fp8 671.5 vs 902.3 (691.9 vs
    937.1): the non-flush-only build's step is 322 vs 378 / 495 us; T = 4 fp8 448.3 vs 469.4
    (470.2 vs 476.7): its flush step 1420 vs 1548 (``read_mma``'s shared-memory carveout).
    Not with a bf16 copy at 4 tokens: 450.3 vs 454.4 us, but the mixed launch 469.6 vs 454.5.
    """
    block_n = triton.next_power_of_2(N)
    block_t = triton.next_power_of_2(T)
    chunked = block_t <= 4 or (block_t == 8 and act_dtype in (torch.bfloat16, torch.float16))
    block_p = min(16 if chunked else 8, triton.next_power_of_2(P))
    num_warps = 2 if block_n * block_p <= 2048 else 4
    maxnreg = FMA_MAXNREG_SHORT if block_t <= 4 else None
    n_chunks = min(FMA_N_CHUNKS, block_n) if chunked else 1
    kq_dot = int(chunked and block_t == 8 and n_chunks > 1)
    read_mma = int(n_chunks > 1 and block_t in (4, 8)
                   and _read_mma_operands_ok(read_dtype, act_dtype, block_p, N))
    flush_split = int(read_mma and (block_t == 8 or read_dtype == torch.float8_e4m3fn))
    return LaunchConfig(block_p, triton.next_power_of_2(R), block_t, min(BLOCK_K_MAX, block_n),
                        2, num_warps, False, 1, maxnreg, impl="fma", l2_ahead=1,
                        n_chunks=n_chunks, kq_dot=max(kq_dot, read_mma), read_mma=read_mma,
                        flush_split=flush_split, flush_kq_dot=kq_dot if flush_split else 0)


def fma_layout(cfg: LaunchConfig, N: int) -> dict[str, int]:
    """Layout constexprs of an FMA launch of ``cfg`` at state dimension ``N``: ``BLOCK_J``,
    ``BLOCK_K``, ``N_CHUNKS``, ``KQ_DOT`` (``fma.py``'s kernel arguments).

    ``n_chunks = 1`` (the whole-N tile): ``cfg``'s blocks and the decode kernel's ``[BLOCK_P,
    BLOCK_N]`` tile. ``n_chunks = c > 1`` (a power of two, at most ``BLOCK_N = next_pow2(N)``):
    the tile is held as ``[CQ, BLOCK_P, c, VEC]`` (``VEC = min(4, BLOCK_N / c)``, ``CQ = BLOCK_N /
    (c·VEC)``): each thread keeps ``c`` chunks of ``VEC`` columns of its rows, a sum over N is
    ``c·VEC`` in-thread adds and ``log2(CQ)`` shuffle levels (``log2(BLOCK_N / 4)`` over 4x the
    rows per thread in the whole-N tile at ``BLOCK_P = 16``), and the records' term joins each
    token's sum in the same layout (``BLOCK_J`` rounded up to one chunk, ``CQ·VEC``).
    ``kq_dot = 1`` (with ``n_chunks > 1``): ``KᵀQ`` as ``tl.dot`` per N-chunk (``BLOCK_J``,
    ``BLOCK_K`` at least 16; with 16-bit activations the products are exact and the sums fp32,
    on tensor cores; fp32 activations get ``input_precision="ieee"``, FMA loops, slower) instead
    of one cross-lane fp32 sum per token and chunk. Either way every checkpoint element is folded
    by the same expressions in the same order: checkpoints, read copies and rings are
    bit-identical to the whole-N tile's; outputs differ by summation order. Raises ``ValueError`` for other values.
    """
    c, kq_dot = cfg.n_chunks, cfg.kq_dot
    block_n = triton.next_power_of_2(N)
    if c < 1 or c & (c - 1) or c > block_n:
        raise ValueError(f"n_chunks: expected a power of two in [1, {block_n}] (BLOCK_N at "
                         f"N = {N}), got {c}")
    if kq_dot not in (0, 1) or (kq_dot and c == 1):
        raise ValueError(f"kq_dot: expected 0, or 1 with n_chunks > 1, got kq_dot={kq_dot} "
                         f"with n_chunks={c}")
    block_j, block_k = cfg.block_j, cfg.block_k
    if c > 1:
        block_j = max(block_j, block_n // c)
    if kq_dot:
        block_j, block_k = max(block_j, MIN_DOT), max(block_k, MIN_DOT)
    return dict(BLOCK_J=block_j, BLOCK_K=block_k, N_CHUNKS=c, KQ_DOT=kq_dot)


#: Register cap of the FMA launch for windows of up to 4 tokens (ptxas ``maxnreg``; longer
#: windows: the compiler's choice): the H200 sweep's fastest at T = 4 (8 CTAs of 2 warps per SM;
#: offline, 8-16 B of spill stores, benchmarks/notes/verify.md's table).
FMA_MAXNREG_SHORT = 128

#: N-chunks per thread of the FMA launch's checkpoint tile (``fma_layout``) where it is chunked
#: (the H200 sweep's fastest at T = 4 and, with ``kq_dot``, at T = 8; benchmarks/RESULTS.md,
#: twelfth session).
FMA_N_CHUNKS = 4


def mamba2_replay_verify_fwd(
    state, ring_x, ring_dt, ring_B, x, dt, A, B, C, out, slot_idx, ring_start, ring_len, flush,
    *, D, z, dt_bias, dt_softplus: bool, stride_dt: tuple[int, int, int], stride_A_head: int,
    stride_D: tuple[int, int], stride_dt_bias_head: int, block_p: int | None = None,
    fold_unroll: int | None = None, read_state: torch.Tensor | None = None,
    read_scale: torch.Tensor | None = None, sr_seed: torch.Tensor | None = None,
    sr_layer: int = 0,
    p_split: int | None = None,
    impl: str | None = None,
) -> None:
    """Launch the kernel on validated arguments (no checks; see ``mamba2_replay_verify``).

    ``stride_dt`` is ``(batch, T, head)``; ``block_p`` / ``fold_unroll`` override
    ``launch_config`` (tests only); ``p_split`` overrides the small-batch split rule
    (``mamba2_decode``'s ``p_split_rule``: tests, benchmarks and tuning only). ``p_split`` must be
    ``cdiv(n_tiles, k)`` for some ``k`` (every program owns at least one P-tile), with
    ``n_tiles = cdiv(P, block_p)``; otherwise ``ValueError``. ``impl`` (``IMPLS``) overrides
    ``launch_config``'s implementation (default: ``"fma"``, ``fma.py``'s kernel with
    ``fma_launch_config``); ``"dot"`` launches this file's tensor-core kernel.
    """
    batch, T, H, P = x.shape
    N = state.shape[3]
    G = B.shape[2]
    R = ring_x.shape[2]
    if batch == 0:
        return
    read_dtype = None if read_state is None else read_state.dtype
    if impl is None:
        cfg = launch_config(P, N, R, T, x.dtype, read_dtype=read_dtype)
    else:
        cfg = launch_config(P, N, R, T, x.dtype, impl=impl, read_dtype=read_dtype)
    block_p = cfg.block_p if block_p is None else block_p
    if cfg.impl == "dot" and block_p < MIN_DOT:
        raise ValueError(f"block_p: expected >= {MIN_DOT} (tl.dot tile), got {block_p}")
    if cfg.impl == "dot" and (cfg.n_chunks, cfg.kq_dot, cfg.read_mma) != (1, 0, 0):
        raise ValueError(f"n_chunks / kq_dot / read_mma: FMA launch options, expected 1 / 0 / 0 "
                         f"with impl='dot', got {cfg.n_chunks} / {cfg.kq_dot} / {cfg.read_mma}")
    if cfg.read_mma not in (0, 1):
        raise ValueError(f"read_mma: expected 0 or 1, got {cfg.read_mma}")
    if cfg.read_mma and (not cfg.kq_dot
                         or not _read_mma_operands_ok(read_dtype, C.dtype, block_p, N)):
        raise ValueError(
            f"read_mma=1: expected kq_dot=1, a bf16 or float8_e4m3fn read copy, bf16 activations "
            f"(exact bf16 tensor-core operands) and block_p, next_pow2(N) >= {MIN_DOT} (tl.dot "
            f"tile), got kq_dot={cfg.kq_dot}, read copy {read_dtype}, activations {C.dtype}, "
            f"block_p {block_p}, N {N}")
    fold_unroll = cfg.fold_unroll if fold_unroll is None else fold_unroll
    z_strides = tuple(z.stride()) if z is not None else (0, 0, 0, 0)
    read_strides = read_state.stride() if read_state is not None else (0, 0, 0, 0)
    rs_strides = read_scale.stride() if read_scale is not None else (0, 0, 0)
    extra = {} if cfg.maxnreg is None or interpreting() else {"maxnreg": cfg.maxnreg}
    n_tiles = triton.cdiv(P, block_p)
    if p_split is None:
        sms = None
        if state.device.type == "cuda":
            idx = state.device.index
            sms = _sm_count(torch.cuda.current_device() if idx is None else idx)
        p_split = p_split_rule(n_tiles, H, batch, sms)
    tiles = triton.cdiv(n_tiles, p_split) if 1 <= p_split <= n_tiles else 0
    if tiles == 0 or triton.cdiv(n_tiles, tiles) != p_split:
        valid = sorted({triton.cdiv(n_tiles, k) for k in range(1, n_tiles + 1)})
        raise ValueError(f"p_split: expected one of {valid} ({n_tiles} P-tiles of {block_p} "
                         f"rows), got {p_split}")
    args = (
        state, ring_x, ring_dt, ring_B, x, dt, A, B, C, D, z, dt_bias, out,
        slot_idx, ring_start, ring_len, flush, read_state, read_scale, sr_seed,
        T, P, N, R, H // G, sr_layer,
        *state.stride(),
        *ring_x.stride(),
        *ring_dt.stride(),
        *ring_B.stride(),
        *x.stride(),
        *stride_dt,
        stride_A_head,
        *B.stride(),
        *C.stride(),
        *stride_D,
        *z_strides,
        stride_dt_bias_head,
        *out.stride(),
        *read_strides,
        *rs_strides,
    )
    flags = dict(DT_SOFTPLUS=dt_softplus, HAS_DT_BIAS=dt_bias is not None, HAS_D=D is not None,
                 HAS_Z=z is not None)
    if cfg.impl == "fma":
        _launch_fma(cfg, args, flags, (H * p_split, batch), state, read_state, N, block_p, tiles,
                    fold_unroll, read_scale is not None, sr_seed is not None, p_split, extra)
        return
    _mamba2_replay_verify_fwd_kernel[(H * p_split, batch)](
        *args,
        **flags,
        BLOCK_P=block_p,
        BLOCK_K=cfg.block_k,
        NUM_NK=triton.cdiv(N, cfg.block_k),
        BLOCK_J=cfg.block_j,
        BLOCK_T=cfg.block_t,
        NUM_PT=tiles,
        FOLD_UNROLL=fold_unroll,
        ACT_TF32_EXACT=cfg.act_tf32_exact,
        HAS_READ=read_state is not None,
        READ_FP8=read_scale is not None,
        SR=sr_seed is not None,
        P_SPLIT=p_split,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **extra,
    )


def flush_launch_config(cfg: LaunchConfig) -> LaunchConfig:
    """The launch configuration of ``cfg``'s flush rows under ``flush_split``: no ``read_mma``,
    ``kq_dot = cfg.flush_kq_dot``, no split (``fma.py``'s ``ROWS = 1`` build)."""
    return cfg._replace(read_mma=0, kq_dot=cfg.flush_kq_dot, flush_split=0, flush_kq_dot=0)


def _launch_fma(cfg: LaunchConfig, args: tuple, flags: dict, grid: tuple[int, int],
                state: torch.Tensor, read_state: torch.Tensor | None, N: int, block_p: int,
                tiles: int, fold_unroll: int, read_fp8: bool, sr: bool, p_split: int,
                extra: dict) -> None:
    """Launch ``fma.py``'s kernel with the tensor-core kernel's arguments ``args`` and flags."""
    # fma.py imports this module's Δ helper, so it is imported here, at the first FMA launch.
    from replayssm_kernels.mamba2_verify.fma import mamba2_replay_verify_fma_kernel

    block_n = triton.next_power_of_2(N)
    if cfg.flush_split not in (0, 1) or cfg.flush_kq_dot not in (0, 1):
        raise ValueError(f"flush_split / flush_kq_dot: expected 0 or 1, got {cfg.flush_split} / "
                         f"{cfg.flush_kq_dot}")
    if cfg.flush_kq_dot and not cfg.flush_split:
        raise ValueError("flush_kq_dot=1: expected flush_split=1 (it is the flush launch's kq_dot)")
    if cfg.flush_split:
        if not cfg.read_mma:
            raise ValueError("flush_split=1: expected read_mma=1 (it splits off the flush rows of a "
                             "read_mma launch); for read_mma=0 set flush_split=0,flush_kq_dot=0")
        _launch_fma(flush_launch_config(cfg), args, flags, grid, state, read_state, N, block_p,
                    tiles, fold_unroll, read_fp8, sr, p_split, {**extra, "ROWS": 1})
        extra = {**extra, "ROWS": 2}
    layout = fma_layout(cfg, N)
    # The L2 prefetch (compiled only) needs whole contiguous tiles of the checkpoint and, if
    # there is one, of the read copy (flush rows prefetch the checkpoint, non-flush the copy).
    l2_ahead = cfg.l2_ahead
    if interpreting() or not l2_tile_prefetch_ok(state) or (
            read_state is not None and not l2_tile_prefetch_ok(read_state)):
        l2_ahead = 0
    mamba2_replay_verify_fma_kernel[grid](
        *args,
        **flags,
        BLOCK_P=block_p,
        BLOCK_N=block_n,
        BLOCK_T=cfg.block_t,
        NUM_PT=tiles,
        FOLD_UNROLL=fold_unroll,
        HAS_READ=read_state is not None,
        READ_FP8=read_fp8,
        READ_MMA=cfg.read_mma,
        SR=sr,
        P_SPLIT=p_split,
        L2_AHEAD=l2_ahead,
        PTX=not interpreting(),
        **layout,
        num_warps=cfg.num_warps,
        **extra,
    )


def mamba2_replay_verify(
    state: torch.Tensor,
    ring_x: torch.Tensor,
    ring_dt: torch.Tensor,
    ring_B: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    out: torch.Tensor,
    slot_idx: torch.Tensor,
    ring_start: torch.Tensor,
    ring_len: torch.Tensor,
    flush: torch.Tensor,
    *,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    read_state: torch.Tensor | None = None,
    read_scale: torch.Tensor | None = None,
    sr_seed: torch.Tensor | None = None,
    sr_layer: int = 0,
    batch_invariant: bool = False,
) -> None:
    """One Mamba-2 ReplaySSM verify step of ``T`` window tokens per row; see kernels/README.md.

    Per row ``b`` with slot ``s = slot_idx[b]`` and snapshot ``(start, len, flush)`` from
    ``verify_cursor_step``:

    - ``s == -1`` (padding): nothing is read or written (``out[b]`` untouched).
    - ``flush[b]`` false: ``out[b, t]`` for every window token from checkpoint ``state[s]`` +
      committed records ``[0, len)`` + window tokens ``0..t`` (chunkwise, math.md §5.1). No state
      write.
    - ``flush[b]`` true: records ``[0, len)`` are folded sequentially into ``state[s]`` in
      ``selective_state_update``'s op order and written once; ``out[b, t]`` from the new
      checkpoint + window tokens ``0..t``.
    - Every non-padding row writes its ``T`` window records ``(x, Δ, B)`` at physical ring rows
      ``(start + len + t) % R``, accepted or not (``verify_commit`` decides which stay).

    Split precision (optional ``read_state``, as ``mamba2_replay_decode``): non-flush rows read
    ``S0`` for the ``S0·Q`` term from the low-precision read copy ``read_state[s]`` (times
    ``read_scale[s]`` per row for fp8) and do not read the checkpoint at all; flush rows fold and
    store ``state[s]`` exactly as without a copy (same bits, same outputs), then refresh
    ``read_state[s]`` (and ``read_scale[s]``) from the checkpoint as stored
    (``mamba2_decode/read_copy.py``). Without a copy the launch is the no-copy kernel.

    Stochastic rounding (optional ``sr_seed``, fp16 ``state`` only, as ``mamba2_replay_decode``):
    flush rows store the folded state with unbiased stochastic rounding (bits keyed by
    ``(sr_seed[0], sr_layer, s)`` and the element's index in ``[H, P, N]``); outputs and records
    are unchanged (the window's ``S·Q`` uses the fp32 fold, as it does without ``sr_seed``).

    The caller guarantees ``len + T <= R`` (``verify_cursor_step`` with
    ``R >= min_ring_size(L, T)``) and that each slot appears at most once per batch.

    Parameters
    ----------
    state : torch.Tensor
        ``[slots, H, P, N]`` checkpoint, fp32/fp16/bf16, any strides. Updated in place on flush
        rows only.
    ring_x : torch.Tensor
        ``[slots, H, R, P]``, dtype of ``x``, any strides. Updated in place.
    ring_dt : torch.Tensor
        ``[slots, H, R]`` fp32 processed Δ. Updated in place.
    ring_B : torch.Tensor
        ``[slots, G, R, N]``, dtype of ``B``. Updated in place.
    x : torch.Tensor
        ``[batch, T, H, P]`` post-conv activations, any strides.
    dt : torch.Tensor
        ``[batch, T, H]``, or ``[batch, T, H, P]`` with stride 0 on P (raw dt).
    A : torch.Tensor
        ``[H]``, or ``[H, P, N]`` with stride 0 on P and N (already ``-exp(A_log)``).
    B, C : torch.Tensor
        ``[batch, T, G, N]``; head ``h`` uses group ``h // (H // G)``.
    out : torch.Tensor
        ``[batch, T, H, P]``. Written in place for non-padding rows.
    slot_idx : torch.Tensor
        ``[batch]`` int32/int64, ``-1`` = padding row.
    ring_start, ring_len : torch.Tensor
        ``[batch]`` int32/int64 cursor snapshot.
    flush : torch.Tensor
        ``[batch]`` bool flush decision.
    D : torch.Tensor, optional
        ``[H]`` or ``[H, P]``.
    z : torch.Tensor, optional
        ``[batch, T, H, P]`` gate: ``out = y * silu(z)``.
    dt_bias : torch.Tensor, optional
        ``[H]`` or ``[H, P]`` with stride 0 on P.
    dt_softplus : bool
        ``Δ = softplus(dt + dt_bias)`` (threshold 20) instead of ``dt + dt_bias``.
    read_state : torch.Tensor, optional
        ``[slots, H, P, N]`` read copy, bf16 / fp16 / fp8 e4m3 (not ``state``'s dtype), any
        strides. Read by non-flush rows; rewritten in place on flush rows.
    read_scale : torch.Tensor, optional
        ``[slots, H, P]`` fp32 per-row scales, required with (and only with) an fp8 copy, any
        strides; rewritten in place on flush rows.
    sr_seed : torch.Tensor, optional
        ``[1]`` int64 counter on ``state``'s device: stochastic rounding of the fp16 checkpoint
        on flush rows. Read on the device (no host sync); the caller advances it between steps.
        Not written.
    sr_layer : int
        Stream id mixed into the bits (the layer index), ``[0, 2^31)``; a runtime argument.
    batch_invariant : bool
        Pin the launch to the configuration of no particular batch size: no small-batch P-split
        (``P_SPLIT = 1``, one program per (row, head) at every batch). A row's outputs, records
        and checkpoint then come from the same compiled kernel and the same program whatever else
        is in the batch (SGLang's ``--enable-deterministic-inference``; kernels/README.md, "Batch
        invariance"). Default ``False``: ``p_split_rule`` splits at small batch.

    Raises
    ------
    ValueError
        On a wrong shape, dtype, stride (untied A / dt / dt_bias) or device, naming expected and
        actual; on a read copy of the wrong shape or dtype, or an fp8 copy without its scales (or
        scales without an fp8 copy); ``sr_seed`` with a non-fp16 ``state``.
    """
    vd = validate_mamba2_verify(
        state, ring_x, ring_dt, ring_B, x, dt, A, B, C, out, slot_idx, ring_start, ring_len,
        flush, D, z, dt_bias,
    )
    validate_read_copy(state, read_state, read_scale)
    validate_stochastic_rounding(state, sr_seed, sr_layer)
    check_launch_device("state", state)
    d = vd.dims
    launch = lambda: mamba2_replay_verify_fwd(  # noqa: E731
        state, ring_x, ring_dt, ring_B, x, dt, A, B, C, out, slot_idx, ring_start, ring_len,
        flush, D=D, z=z, dt_bias=dt_bias, dt_softplus=bool(dt_softplus),
        stride_dt=(d.stride_dt_batch, vd.stride_dt_T, d.stride_dt_head),
        stride_A_head=d.stride_A_head, stride_D=(d.stride_D_head, d.stride_D_p),
        stride_dt_bias_head=d.stride_dt_bias_head, read_state=read_state, read_scale=read_scale,
        sr_seed=sr_seed, sr_layer=sr_layer, p_split=1 if batch_invariant else None,
    )
    with launch_device(state):
        launch()
