"""Mamba-2 ReplaySSM verify, second implementation: plain fp32 FMA reductions, no tensor cores.

``mamba2_replay_verify_fma_kernel`` computes exactly what ``kernel.py``'s tensor-core kernel
computes (same arguments, same contract, same in-place writes; the launcher
``kernel.mamba2_replay_verify_fwd`` runs it when the launch configuration's ``impl`` is
``"fma"``, the default), laid out as the decode kernel
(``mamba2_decode/kernel.py``) instead: every product is an fp32 FMA / ``tl.sum`` in registers
(no ``tl.dot``, no tf32), and the checkpoint is walked in whole-N ``[BLOCK_P, BLOCK_N]`` tiles.

Launch layout: grid ``(H·P_SPLIT, batch)``; program ``(h·P_SPLIT + i_s, b)`` owns row ``b``,
head ``h`` and P-tiles ``[i_s·NUM_PT, (i_s+1)·NUM_PT)`` (``P_SPLIT`` from ``mamba2_decode``'s
``p_split_rule``, as the tensor-core kernel). Per program, once (math.md §5.1, the tensor-core
kernel's record index space ``J``: ``BLOCK_J = next_pow2(R)`` rows, the ``T`` window tokens first,
then the committed history newest first; none for flush rows):

- window ``Δ`` (``_window_delta``, the same expressions, so the appended ``Δ`` records are the
  same bits), ``cw_s`` (inclusive window prefix), ``e_j`` and ``Dg[s] = exp(A (Σ_hist Δ + cw_s))``;
- ``KᵀQ [BLOCK_J, BLOCK_T]``: ``B_j·C_s`` by ``tl.sum`` over ``BLOCK_K``-column chunks of N, one
  column per window token (static loop); the window's ``B`` records are appended from the same
  loads (the group's first head, its first split);
- ``W' = W ⊙ KᵀQ``: ``coef[j, s] = Δ_j exp(A (cw_s + e_j)) (B_j·C_s)`` masked to
  ``j`` history or ``j = t <= s``.

Then per ``[BLOCK_P, BLOCK_N]`` tile ``S`` (the checkpoint, or a non-flush row's read copy)::

    Y = (S·Q) Dg + V (W ⊙ KᵀQ) + D x        (then · silu(z)), Y [BLOCK_P, BLOCK_T]

with ``S·Q`` one fp32 ``tl.sum`` over N per window token (static loop over
``BLOCK_T = next_pow2(T)``, tokens ``>= T`` masked; ``C_s`` re-read per tile, from L1; an fp8
copy's row scale multiplies the sums) and the records' term for all tokens at once, the
``[BLOCK_P, BLOCK_J, BLOCK_T]`` broadcast of ``V = [x_j]`` (the tile's record columns: window x
from the input, history x from the ring, loaded once per tile) times ``coef`` summed over ``J``.
(The decode kernel's fused record term, joining the records to the S·C sum's groups, needs one
``coef`` column per token and tile here: a cross-thread extraction each, which cost more
registers and barriers offline, benchmarks/notes/verify.md.)

- Padding row (``slot < 0``): returns before touching memory.
- Non-flush row: the tile is the checkpoint or, with ``HAS_READ``, the read copy (fp8: times the
  row scale); the checkpoint is not written (nor read, with a copy).
- Flush row: the tile is first folded with the committed history ``[0, len)`` in
  ``selective_state_update``'s op order, ``fma(S, exp(A·Δ), (B·Δ)·x)`` oldest first, records read
  straight into the tile's layouts (``record_factors_lean``, ``FOLD_UNROLL`` per step: the decode
  kernel's flush), hence bit-identical to the tensor-core kernel's fold and to SGLang; stored once
  (``SR``: fp16 with stochastic rounding, ``sr_round_fp16``); with ``HAS_READ`` the copy's tile
  is refreshed from the tile as stored by ``store_read_tile`` (the whole N row is in the program,
  so the fp8 row max needs no second pass); then the outputs from the fp32 tile with ``h = 0``.
- Every row appends its ``T`` window records ``(x, Δ, B)`` at physical rows
  ``(ring_start + ring_len + t) % R``: x per tile, ``Δ`` once per head and ``B`` by the group's
  first head, by the first P-split program only.

Compiled builds (``PTX``) load fold records with ``ld_rec`` and, with ``L2_AHEAD > 0``, bulk-
prefetch checkpoint (flush rows) or copy (non-flush rows) tile ``t + L2_AHEAD`` into L2; the
interpreter takes ``tl.load`` and no hints. No autotune (the kernel writes the pool), no host
sync: CUDA-graph safe.

Shapes and dtypes are ``mamba2_replay_verify``'s: ``state [slots, H, P, N]`` fp32 / fp16 / bf16
(updated in place on flush rows), rings ``ring_x [slots, H, R, P]``, ``ring_dt [slots, H, R]``
fp32, ``ring_B [slots, G, R, N]`` (updated in place: the window rows), ``x``, ``z``, ``out``
``[batch, T, H, P]`` (``out`` written in place), ``dt [batch, T, H]`` (strides passed
explicitly), ``B``, ``C [batch, T, G, N]``, ``read_state [slots, H, P, N]`` and
``read_scale [slots, H, P]`` (refreshed in place on flush rows); every tensor by explicit strides.
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm_kernels.mamba2_decode._fold import record_factors_lean
from replayssm_kernels.mamba2_decode.kernel import _prefetch_l2_tile
from replayssm_kernels.mamba2_decode.read_copy import store_read_tile
from replayssm_kernels.mamba2_verify.kernel import _window_delta
from replayssm_kernels.stochastic_round import sr_key, sr_round_fp16

__all__ = ["mamba2_replay_verify_fma_kernel"]


@triton.jit
def _fold_tile(b_s, p_rx, p_rdt, p_rB, s0, n_full, length, R, A, m_p, m_n, stride_rx_row,
               stride_rdt_row, stride_rB_row, FOLD_UNROLL: tl.constexpr, PTX: tl.constexpr):
    """The committed records ``[0, length)`` folded into one ``[BLOCK_P, BLOCK_N]`` tile, oldest
    first (``s0 = start % R``): full steps of ``FOLD_UNROLL`` records (unrolled, their loads in
    flight together; ``n_full`` = length rounded down), then the rest one by one."""
    for c in range(0, n_full, FOLD_UNROLL):
        for jj in tl.static_range(FOLD_UNROLL):
            row = s0 + c + jj
            b_xj, dA, dB = record_factors_lean(
                p_rx, p_rdt, p_rB, tl.where(row >= R, row - R, row), A, m_p, m_n,
                stride_rx_row, stride_rdt_row, stride_rB_row, PTX)
            b_s = tl.fma(b_s, dA, dB * b_xj.to(tl.float32)[:, None])
    for j in range(n_full, length):
        row = s0 + j
        b_xj, dA, dB = record_factors_lean(
            p_rx, p_rdt, p_rB, tl.where(row >= R, row - R, row), A, m_p, m_n,
            stride_rx_row, stride_rdt_row, stride_rB_row, PTX)
        b_s = tl.fma(b_s, dA, dB * b_xj.to(tl.float32)[:, None])
    return b_s


@triton.jit
def _tile_outputs(
    b_s, o_p, m_p, o_n, m_n, o_t, m_t, o_j, is_w, is_h, row_j, row_w, coef, d_g, T,
    p_x_row, p_rx_head, p_C_row, p_o_row, p_rs_head, D_ptr, z_ptr, i_b64, i_h,
    stride_x_T, stride_x_p, stride_rx_row, stride_rx_p, stride_C_T, stride_C_n, stride_out_T,
    stride_out_p, stride_rs_p, stride_D_head, stride_D_p, stride_z_batch, stride_z_T,
    stride_z_head, stride_z_p,
    SCALED: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    """Outputs of the window tokens for rows ``o_p`` from the fp32 tile ``b_s`` (checkpoint,
    folded checkpoint, or read copy; ``SCALED``: times the fp8 copy's row scale), and the append
    of the tile's window x records. Outputs only: nothing here reaches a checkpoint."""
    # V: the tile's x columns of the window tokens (J < T) and the history records.
    p_v = tl.where(is_w[None, :], p_x_row + o_j[None, :] * stride_x_T + o_p[:, None] * stride_x_p,
                   p_rx_head + row_j[None, :] * stride_rx_row + o_p[:, None] * stride_rx_p)
    b_v = tl.load(p_v, mask=m_p[:, None] & (is_w | is_h)[None, :], other=0.0)
    # S·C_s, one fp32 sum over N per window token (C_s re-read: L1), into column s.
    b_sq = tl.zeros([BLOCK_P, BLOCK_T], dtype=tl.float32)
    for s in tl.static_range(BLOCK_T):
        b_c = tl.load(p_C_row + s * stride_C_T + o_n * stride_C_n, mask=m_n & (s < T),
                      other=0.0).to(tl.float32)
        b_sq = tl.where(o_t[None, :] == s, tl.sum(b_s * b_c[None, :], axis=1)[:, None], b_sq)
    if SCALED:
        b_sq = b_sq * tl.load(p_rs_head + o_p * stride_rs_p, mask=m_p, other=0.0)[:, None]
    # The records' term for every token at once: [BLOCK_P, BLOCK_J, BLOCK_T] summed over J.
    b_rec = tl.sum(b_v.to(tl.float32)[:, :, None] * coef[None, :, :], axis=1)
    b_y = b_sq * d_g[None, :] + b_rec
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


@triton.jit(do_not_specialize=["sr_layer"])
def mamba2_replay_verify_fma_kernel(
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
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_J: tl.constexpr,
    BLOCK_T: tl.constexpr,
    NUM_PT: tl.constexpr,
    FOLD_UNROLL: tl.constexpr,
    HAS_READ: tl.constexpr,
    READ_FP8: tl.constexpr,
    SR: tl.constexpr,
    P_SPLIT: tl.constexpr,
    L2_AHEAD: tl.constexpr,
    PTX: tl.constexpr,
):
    # P_SPLIT programs share one (row, head), adjacent in launch order (the tensor-core kernel's
    # split): program i_s owns rows p0 .. p0 + NUM_PT·BLOCK_P - 1 (rows >= P masked) and
    # recomputes the per-head terms with the same operations. P_SPLIT == 1: unsplit.
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

    p_s_head = state_ptr + slot * stride_state_slot + i_h * stride_state_head
    p_r_head = read_ptr
    p_rs_head = read_scale_ptr
    if HAS_READ:
        p_r_head = read_ptr + slot * stride_read_slot + i_h * stride_read_head
    if READ_FP8:
        p_rs_head = read_scale_ptr + slot * stride_rs_slot + i_h * stride_rs_head
    # The tile loops request tile t + L2_AHEAD; tiles 1 .. L2_AHEAD - 1 go into L2 now.
    if L2_AHEAD > 0:
        if HAS_READ and not do_flush:
            for tt in tl.static_range(1, L2_AHEAD):
                _prefetch_l2_tile(p_r_head, p0, tt, P, stride_read_p, NUM_PT, BLOCK_P)
        else:
            for tt in tl.static_range(1, L2_AHEAD):
                _prefetch_l2_tile(p_s_head, p0, tt, P, stride_state_p, NUM_PT, BLOCK_P)

    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < N
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
    p_C_row = C_ptr + i_b64 * stride_C_batch + i_g * stride_C_group
    p_o_row = out_ptr + i_b64 * stride_out_batch + i_h * stride_out_head

    # Record index space J (the tensor-core kernel's): J < T the window tokens, then the
    # committed history newest first (none for flush rows: it is folded into the tile).
    hist = tl.where(do_flush, 0, length)
    o_j = tl.arange(0, BLOCK_J)
    is_w = o_j < T
    is_h = (o_j >= T) & (o_j < T + hist)
    row_j = (start + tl.where(is_h, hist - 1 - (o_j - T), 0)) % R  # physical history rows
    d_j = tl.where(is_w, _window_delta(p_dt_row, o_j, is_w, stride_dt_T, dt_bias_ptr, i_h,
                                       stride_dt_bias_head, DT_SOFTPLUS, HAS_DT_BIAS),
                   tl.load(p_rdt + row_j * stride_rdt_row, mask=is_h, other=0.0))
    d_h = tl.where(is_h, d_j, 0.0)
    e_j = tl.where(is_w, -tl.cumsum(tl.where(is_w, d_j, 0.0), axis=0),
                   tl.cumsum(d_h, axis=0) - d_h)
    h_sum = tl.sum(d_h, axis=0)
    m_js = (is_h[:, None] | (is_w[:, None] & (o_j[:, None] <= o_t[None, :]))) & m_t[None, :]

    # KᵀQ [BLOCK_J, BLOCK_T] by fp32 sums over N-chunks, one column per window token; the
    # group's first head (its first split) appends the window's B records from the same loads.
    row_w = (start + length + o_j) % R  # physical rows of the window records (J < T)
    m_jn_w = is_w & (i_h % heads_per_group == 0) & (i_s == 0)
    o_k = tl.arange(0, BLOCK_K)
    kq = tl.zeros([BLOCK_J, BLOCK_T], dtype=tl.float32)
    for kc in tl.static_range(BLOCK_N // BLOCK_K):
        o_nk = kc * BLOCK_K + o_k
        m_nk = o_nk < N
        p_Bj = tl.where(is_w[:, None], p_B_row + o_j[:, None] * stride_B_T
                        + o_nk[None, :] * stride_B_n,
                        p_rB_grp + row_j[:, None] * stride_rB_row + o_nk[None, :] * stride_rB_n)
        b_Bj = tl.load(p_Bj, mask=(is_w | is_h)[:, None] & m_nk[None, :], other=0.0)
        b_Bf = b_Bj.to(tl.float32)
        for s in tl.static_range(BLOCK_T):
            b_c = tl.load(p_C_row + s * stride_C_T + o_nk * stride_C_n, mask=m_nk & (s < T),
                          other=0.0).to(tl.float32)
            kq += tl.where(o_t[None, :] == s, tl.sum(b_Bf * b_c[None, :], axis=1)[:, None], 0.0)
        tl.store(p_rB_grp + row_w[:, None] * stride_rB_row + o_nk[None, :] * stride_rB_n, b_Bj,
                 mask=m_jn_w[:, None] & m_nk[None, :])
    coef = tl.where(m_js, d_j[:, None] * tl.exp(A * (b_cw[None, :] + e_j[:, None])) * kq, 0.0)
    d_g = tl.exp(A * (h_sum + b_cw))  # [BLOCK_T]

    if do_flush:
        if SR:  # fp16 checkpoint, stochastic rounding: this (seed, layer, slot)'s key
            sr_k = sr_key(sr_seed_ptr, sr_layer, slot)
        n_full = (length // FOLD_UNROLL) * FOLD_UNROLL
        s0 = start % R  # record j's row is s0 + j, less R past the end: no % per record
        p_rB = p_rB_grp + o_n * stride_rB_n
        for t in range(NUM_PT):
            if L2_AHEAD > 0:
                _prefetch_l2_tile(p_s_head, p0, t + L2_AHEAD, P, stride_state_p, NUM_PT, BLOCK_P)
            o_p = p0 + t * BLOCK_P + tl.arange(0, BLOCK_P)
            m_p = o_p < P
            m_pn = m_p[:, None] & m_n[None, :]
            p_s = p_s_head + o_p[:, None] * stride_state_p + o_n[None, :] * stride_state_n
            b_s = tl.load(p_s, mask=m_pn, other=0.0).to(tl.float32)
            b_s = _fold_tile(b_s, p_rx_head + o_p * stride_rx_p, p_rdt, p_rB, s0, n_full, length,
                             R, A, m_p, m_n, stride_rx_row, stride_rdt_row, stride_rB_row,
                             FOLD_UNROLL, PTX)
            if SR:
                b_st = sr_round_fp16(b_s, sr_k, (i_h * P + o_p[:, None]) * N + o_n[None, :])
            else:
                b_st = b_s.to(p_s.dtype.element_ty)
            tl.store(p_s, b_st, mask=m_pn)
            if HAS_READ:  # whole N rows: the fp8 row max is the tile's
                store_read_tile(b_st, p_r_head, p_rs_head, o_p, o_n, m_p, m_n, stride_read_p,
                                stride_read_n, stride_rs_p, READ_FP8)
            _tile_outputs(
                b_s, o_p, m_p, o_n, m_n, o_t, m_t, o_j, is_w, is_h, row_j, row_w, coef, d_g, T,
                p_x_row, p_rx_head, p_C_row, p_o_row, p_rs_head, D_ptr, z_ptr, i_b64, i_h,
                stride_x_T, stride_x_p, stride_rx_row, stride_rx_p, stride_C_T, stride_C_n,
                stride_out_T, stride_out_p, stride_rs_p, stride_D_head, stride_D_p,
                stride_z_batch, stride_z_T, stride_z_head, stride_z_p,
                False, HAS_D, HAS_Z, BLOCK_P, BLOCK_T)
    else:
        # Tile source: the read copy if there is one (the checkpoint is not read at all).
        p_src_head = p_s_head
        stride_src_p = stride_state_p
        stride_src_n = stride_state_n
        if HAS_READ:
            p_src_head = p_r_head
            stride_src_p = stride_read_p
            stride_src_n = stride_read_n
        for t in range(NUM_PT):
            if L2_AHEAD > 0:
                _prefetch_l2_tile(p_src_head, p0, t + L2_AHEAD, P, stride_src_p, NUM_PT, BLOCK_P)
            o_p = p0 + t * BLOCK_P + tl.arange(0, BLOCK_P)
            m_p = o_p < P
            b_s = tl.load(p_src_head + o_p[:, None] * stride_src_p + o_n[None, :] * stride_src_n,
                          mask=m_p[:, None] & m_n[None, :], other=0.0).to(tl.float32)
            _tile_outputs(
                b_s, o_p, m_p, o_n, m_n, o_t, m_t, o_j, is_w, is_h, row_j, row_w, coef, d_g, T,
                p_x_row, p_rx_head, p_C_row, p_o_row, p_rs_head, D_ptr, z_ptr, i_b64, i_h,
                stride_x_T, stride_x_p, stride_rx_row, stride_rx_p, stride_C_T, stride_C_n,
                stride_out_T, stride_out_p, stride_rs_p, stride_D_head, stride_D_p,
                stride_z_batch, stride_z_T, stride_z_head, stride_z_p,
                READ_FP8, HAS_D, HAS_Z, BLOCK_P, BLOCK_T)
    tl.store(p_rdt + row_w * stride_rdt_row, d_j, mask=is_w & (i_s == 0))  # Δ: first split
