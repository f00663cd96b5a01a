"""Mamba-2 ReplaySSM decode: one Triton launch for a mixed batch of flush and non-flush rows.

Layers (fla style): ``_mamba2_replay_decode_fwd_kernel`` (jit) → ``mamba2_replay_decode_fwd``
(launcher, no checks) → ``mamba2_replay_decode`` (public, validated).

Launch layout: grid ``(H·P_SPLIT, batch)``; a program walks its share of one (row, head)'s
checkpoint in ``[BLOCK_P, N]`` tiles, reading each once where it is used (no tile held ahead in
registers); in compiled builds a bulk L2 prefetch of the tile ``L2_AHEAD`` ahead keeps the next
checkpoint bytes in flight instead (``cp.async.bulk.prefetch.L2``). ``P_SPLIT = 1`` (every batch
that fills the GPU: ``p_split_rule``) is one program per (row, head) over all its tiles; at small
batch the head's tiles are split over ``P_SPLIT`` adjacent programs, each recomputing the per-head
scalars (Δ, β_j = B_j·C, the decays): state rows are independent given x[p], so the fold's
operation order per element is the same either way. Heads of one row are adjacent in launch order,
so a slot's checkpoint ``[H, P, N]`` streams contiguously and the group's B records, read by
``H/G`` heads, hit L2. Record rows are requested into L1 up front (``prefetch.global.L1`` hints,
compiled code only) because every P-tile re-reads them.

- Padding row (``slot < 0``): the program returns before touching memory.
- Non-flush row: ``y = ā·(S0·C) + Σ_j λ_j Δ_j (B_j·C) x_j + D x`` (math.md §2), the current token
  being the last term, with β_j = B_j·C and the coefficients computed once per (row, head). The
  records' term joins the S·C reduction in the tile's own layout (``REC_FUSED``: ā is folded
  into C; an fp8 read copy's row scale multiplies the copy's partial sums before the records
  join); with ``BLOCK_N < BLOCK_L`` it is a separate ``[BLOCK_L, BLOCK_P]`` sum instead. Then the record ``(x, Δ, B)`` is appended at
  logical row ``ring_len`` (``x`` per tile, ``Δ`` once, ``B`` by the group's first head).
  The checkpoint is not written.
- Flush row: the records ``[0, ring_len)`` and the current token are folded into the tile in
  ``selective_state_update``'s own fp32 expressions (``dA = exp(A·Δ)``, ``dB = B·Δ``,
  ``S = S·dA + dB·x``), record rows loaded straight into the tile's row / column layouts
  (``_fold.record_factors_lean``), the tile is stored once (a 16-bit state is rounded once,
  here: to nearest, or for an fp16 state with ``SR`` stochastically, ``stochastic_round.py``),
  and ``y = S·C + D x``.

No autotune (the kernel writes the pool), no host sync, no data-dependent allocation: the launch is
CUDA-graph safe. ``launch_config`` is the fixed configuration measured fastest on the H200
(benchmarks/notes/mamba2_decode.md, "Round 3 result"); the variants that lost there (register-held
tile prefetch, the pipeliner, the fold through shared memory, the separate record term without a
read copy, the split flush launch) were deleted from this file after that measurement.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from replayssm_kernels._checks import check_launch_device, interpreting, launch_device
from replayssm_kernels.mamba2_decode._fold import ld_rec, record_factors_lean
from replayssm_kernels.mamba2_decode._validate import validate_mamba2_decode
from replayssm_kernels.mamba2_decode.read_copy import store_read_tile, validate_read_copy
from replayssm_kernels.prefetch import l2_tile_prefetch_ok, prefetch_l1, prefetch_l2_tile
from replayssm_kernels.stochastic_round import (
    sr_key,
    sr_round_fp16,
    validate_stochastic_rounding,
)

__all__ = ["mamba2_replay_decode", "mamba2_replay_decode_fwd", "launch_config", "p_split_rule"]


@triton.jit
def _softplus(dt):
    # Verbatim the conventional kernel's softplus (Triton >= 3 branch), so Δ is bit-identical.
    dt = tl.where(dt <= 20.0, tl.math.log(tl.math.exp(dt) + 1), dt)
    return dt


@triton.jit
def _load_tile(
    p_s_head, p_x_head, p_z_head, p_D_head, p0, t, P, N,
    stride_state_p, stride_state_n, stride_x_p, stride_z_p, stride_D_p,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, NUM_PT: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Loads of the program's P-tile ``t`` (rows ``p0 + t·BLOCK_P ..``) of one (row, head):
    checkpoint tile, current x, D, z (t >= NUM_PT, the program's tile count: all masked off, no
    memory traffic)."""
    o_p = p0 + t * BLOCK_P + tl.arange(0, BLOCK_P)
    o_n = tl.arange(0, BLOCK_N)
    m_p = (o_p < P) & (t < NUM_PT)
    m_pn = m_p[:, None] & (o_n < N)[None, :]
    p_s = p_s_head + o_p[:, None] * stride_state_p + o_n[None, :] * stride_state_n
    b_s = tl.load(p_s, mask=m_pn, other=0.0)
    b_x = tl.load(p_x_head + o_p * stride_x_p, mask=m_p, other=0.0)
    if HAS_D:
        b_D = tl.load(p_D_head + o_p * stride_D_p, mask=m_p, other=0.0).to(tl.float32)
    else:
        b_D = tl.zeros([BLOCK_P], dtype=tl.float32)
    if HAS_Z:
        b_z = tl.load(p_z_head + o_p * stride_z_p, mask=m_p, other=0.0).to(tl.float32)
    else:
        b_z = tl.zeros([BLOCK_P], dtype=tl.float32)
    return b_s, b_x, b_D, b_z


@triton.jit
def _nonflush_tile(
    b_s, b_x_raw, b_D, b_z, b_C, b_coef, a_bar, c_cur, p0, t, P, row_l, m_l, row_w, p_rx_head,
    p_o_head, stride_rx_row, stride_rx_p, stride_out_p, p_rs_head, stride_rs_p,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, BLOCK_P: tl.constexpr, READ_FP8: tl.constexpr,
    REC_FUSED: tl.constexpr, PTX: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
):
    """Output of P-tile ``t`` on the inner-product route, and the append of its x. ``b_s`` is the
    tile as read (checkpoint or read copy); an fp8 copy's per-row scale is applied to ``S0·C``.

    ``REC_FUSED`` (``BLOCK_N >= BLOCK_L``): ``b_C`` comes in already scaled by
    ``ā`` and the record term joins the S·C reduction: the tile's N columns are viewed as
    ``BLOCK_L`` groups of ``BLOCK_N / BLOCK_L``, each group is summed in place (an fp8 copy's
    groups are then multiplied by the row's scale), record ``j``'s
    ``coef_j·x_j[p]`` is added to group ``j``, and one more reduction over the groups gives
    ``ā·(S0·C) + Σ_j coef_j x_j``. The ``[BLOCK_P, BLOCK_L]`` record tile then lives in the
    checkpoint tile's layout (with ``PTX``: ``ld_rec``), instead of a layout of its own with a
    cross-warp reduction and conversions per tile (sm_90a, Nano-4B, non-flush rows alone:
    72 registers without a cap and no spill at 72, against 125 and 48 B of spills at 80).
    Otherwise the record term is its own ``[BLOCK_L, BLOCK_P]`` sum."""
    o_p = p0 + t * BLOCK_P + tl.arange(0, BLOCK_P)
    m_p = o_p < P
    if REC_FUSED:
        b_x = b_x_raw.to(tl.float32)
        b_sg = tl.sum(tl.reshape(b_s * b_C[None, :], [BLOCK_P, BLOCK_L, BLOCK_N // BLOCK_L]),
                      axis=2)
        if READ_FP8:  # the row scale multiplies the copy's groups, before the records join
            b_sg = b_sg * tl.load(p_rs_head + o_p * stride_rs_p, mask=m_p, other=0.0)[:, None]
        p_xt = p_rx_head + row_l[None, :] * stride_rx_row + o_p[:, None] * stride_rx_p
        if PTX:
            b_xt = ld_rec(p_xt, m_p[:, None] & m_l[None, :]).to(tl.float32)
        else:
            b_xt = tl.load(p_xt, mask=m_p[:, None] & m_l[None, :], other=0.0).to(tl.float32)
        b_y = tl.sum(b_sg + b_xt * b_coef[None, :], axis=1) + c_cur * b_x
    else:
        p_xj = p_rx_head + row_l[:, None] * stride_rx_row + o_p[None, :] * stride_rx_p
        b_xj = tl.load(p_xj, mask=m_l[:, None] & m_p[None, :], other=0.0).to(tl.float32)
        b_x = b_x_raw.to(tl.float32)
        b_acc = c_cur * b_x
        b_acc += tl.sum(b_coef[:, None] * b_xj, axis=0)
        b_sc = tl.sum(b_s * b_C[None, :], axis=1)
        if READ_FP8:
            b_sc = b_sc * tl.load(p_rs_head + o_p * stride_rs_p, mask=m_p, other=0.0)
        b_y = a_bar * b_sc + b_acc
    if HAS_D:
        b_y += b_x * b_D
    if HAS_Z:
        b_y *= b_z * tl.sigmoid(b_z)
    p_o = p_o_head + o_p * stride_out_p
    tl.store(p_o, b_y.to(p_o.dtype.element_ty), mask=m_p)
    # Append the current record's x at logical row `length`.
    tl.store(p_rx_head + row_w * stride_rx_row + o_p * stride_rx_p, b_x_raw, mask=m_p)


@triton.jit(do_not_specialize=["sr_layer"])
def _mamba2_replay_decode_fwd_kernel(
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
    stride_x_head,
    stride_x_p,
    stride_dt_batch,
    stride_dt_head,
    stride_A_head,
    stride_B_batch,
    stride_B_group,
    stride_B_n,
    stride_C_batch,
    stride_C_group,
    stride_C_n,
    stride_D_head,
    stride_D_p,
    stride_z_batch,
    stride_z_head,
    stride_z_p,
    stride_dt_bias_head,
    stride_out_batch,
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
    BLOCK_L: tl.constexpr,
    NUM_PT: tl.constexpr,
    FOLD_UNROLL: tl.constexpr,
    PF_X: tl.constexpr,
    PF_B: tl.constexpr,
    HAS_READ: tl.constexpr,
    READ_FP8: tl.constexpr,
    P_SPLIT: tl.constexpr,
    SR: tl.constexpr,
    REC_FUSED: tl.constexpr,
    L2_AHEAD: tl.constexpr,
    PTX: tl.constexpr,
):
    # PTX: a compiled build (inline PTX: L1 prefetch hints, record loads by `ld_rec`); off under
    # the interpreter, which takes tl.load and no hints. L2_AHEAD > 0 only in compiled builds.
    # P_SPLIT programs share one (row, head): program i_s owns the head's P-tiles
    # [i_s·NUM_PT, (i_s+1)·NUM_PT), i.e. rows p0 .. p0 + NUM_PT·BLOCK_P - 1 (rows >= P masked).
    # Splits of one head are adjacent in launch order. P_SPLIT == 1 is the unsplit launch, with
    # p0 the literal 0.
    if P_SPLIT > 1:
        i_h = tl.program_id(0) // P_SPLIT
        i_s = tl.program_id(0) % P_SPLIT
        p0 = i_s * (NUM_PT * BLOCK_P)
    else:
        i_h = tl.program_id(0)
        p0 = 0
    i_b = tl.program_id(1)

    slot = tl.load(slot_idx_ptr + i_b).to(tl.int64)
    start = tl.load(ring_start_ptr + i_b).to(tl.int32)
    length = tl.load(ring_len_ptr + i_b).to(tl.int32)
    do_flush = tl.load(flush_ptr + i_b)
    if slot < 0:
        return  # padding row: touches nothing, not even its output row
    i_g = i_h // heads_per_group

    p_s_head = state_ptr + slot * stride_state_slot + i_h * stride_state_head
    p_x_head = x_ptr + i_b * stride_x_batch + i_h * stride_x_head
    p_z_head = z_ptr
    if HAS_Z:
        p_z_head = z_ptr + i_b * stride_z_batch + i_h * stride_z_head
    p_D_head = D_ptr
    if HAS_D:
        p_D_head = D_ptr + i_h * stride_D_head
    # No checkpoint tile is held in registers ahead: each is loaded where it is used. With
    # L2_AHEAD the tiles 1 .. L2_AHEAD-1 go into L2 now (tile 0 is loaded right away) and the
    # tile loops below request tile t + L2_AHEAD, so checkpoint bytes stay in flight.
    if L2_AHEAD > 0:
        for tt in tl.static_range(1, L2_AHEAD):
            prefetch_l2_tile(p_s_head, p0, tt, P, stride_state_p, NUM_PT, BLOCK_P)

    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < N
    # Current token scalars and group vectors, exactly as selective_state_update's TIE_HDIM path.
    dt = tl.load(dt_ptr + i_b * stride_dt_batch + i_h * stride_dt_head).to(tl.float32)
    if HAS_DT_BIAS:
        dt += tl.load(dt_bias_ptr + i_h * stride_dt_bias_head).to(tl.float32)
    if DT_SOFTPLUS:
        dt = _softplus(dt)
    A = tl.load(A_ptr + i_h * stride_A_head).to(tl.float32)
    p_B = B_ptr + i_b * stride_B_batch + i_g * stride_B_group + o_n * stride_B_n
    b_B_raw = tl.load(p_B, mask=m_n, other=0.0)
    b_B = b_B_raw.to(tl.float32)
    p_C = C_ptr + i_b * stride_C_batch + i_g * stride_C_group + o_n * stride_C_n
    b_C = tl.load(p_C, mask=m_n, other=0.0).to(tl.float32)

    p_rx_head = ring_x_ptr + slot * stride_rx_slot + i_h * stride_rx_head
    p_rdt = ring_dt_ptr + slot * stride_rdt_slot + i_h * stride_rdt_head
    p_rB = ring_B_ptr + slot * stride_rB_slot + i_g * stride_rB_group + o_n * stride_rB_n
    p_o_head = out_ptr + i_b * stride_out_batch + i_h * stride_out_head
    p_r_head = read_ptr
    p_rs_head = read_scale_ptr
    if HAS_READ:
        p_r_head = read_ptr + slot * stride_read_slot + i_h * stride_read_head
    if READ_FP8:
        p_rs_head = read_scale_ptr + slot * stride_rs_slot + i_h * stride_rs_head
    if PTX:
        # Both routes read this head's committed x rows once per P-tile: request their lines
        # into L1 once, up front (a hint: no register, no wait), so those loads hit L1.
        o_l = tl.arange(0, BLOCK_L)
        row_l = (start + tl.where(o_l < length, o_l, 0)) % R
        if P_SPLIT > 1:
            o_px = tl.minimum(p0 + tl.arange(0, PF_X) * 64,
                              tl.minimum(P, p0 + NUM_PT * BLOCK_P) - 1)
        else:
            o_px = tl.minimum(tl.arange(0, PF_X) * 64, P - 1)
        prefetch_l1(p_rx_head + row_l[:, None] * stride_rx_row + o_px[None, :] * stride_rx_p)

    if do_flush:
        # Exact fold, one P-tile at a time: replay the committed raw records, then the current
        # token, in the conventional kernel's op order; the tile stays fp32 in registers.
        # `S = S·dA + dB·x` is written as fma(S, dA, dB·x) because that is what
        # selective_state_update's `state * dA + dB * x[:, None]` compiles to (sm_90, Triton 3.6;
        # tests/kernels/test_mamba2_decode.py checks both kernels' PTX). Left to LLVM, the same
        # expression was contracted the other way, fma(dB, x, S·dA), at one site. The
        # interpreter evaluates tl.fma unfused, as it evaluates SGLang's kernel.
        if PTX:
            # The fold reads every record once per P-tile: B rows and Δ are requested into L1
            # up front too (x rows above), so the fold's loads hit L1 on every tile.
            o_nb = tl.minimum(tl.arange(0, PF_B) * 64, N - 1)
            prefetch_l1(ring_B_ptr + slot * stride_rB_slot + i_g * stride_rB_group
                         + row_l[:, None] * stride_rB_row + o_nb[None, :] * stride_rB_n)
            prefetch_l1(p_rdt + row_l * stride_rdt_row)
        if SR:  # fp16 checkpoint, stochastic rounding: this (seed, layer, slot)'s key
            sr_k = sr_key(sr_seed_ptr, sr_layer, slot)
        dA_c = tl.exp(A * dt)
        dB_c = b_B * dt
        n_full = (length // FOLD_UNROLL) * FOLD_UNROLL
        s0 = start % R  # record j's row is s0 + j, less R past the end: no % per record
        for t in range(NUM_PT):
            if L2_AHEAD > 0:
                prefetch_l2_tile(p_s_head, p0, t + L2_AHEAD, P, stride_state_p, NUM_PT, BLOCK_P)
            s_n1, b_x_raw, b_D, b_z = _load_tile(
                p_s_head, p_x_head, p_z_head, p_D_head, p0, t, P, N, stride_state_p,
                stride_state_n, stride_x_p, stride_z_p, stride_D_p, HAS_D, HAS_Z, NUM_PT,
                BLOCK_P, BLOCK_N)
            b_s = s_n1.to(tl.float32)
            o_p = p0 + t * BLOCK_P + tl.arange(0, BLOCK_P)
            m_p = o_p < P
            p_rx = p_rx_head + o_p * stride_rx_p
            # Full chunks of FOLD_UNROLL records (their loads do not depend on the state, so they
            # are in flight together), then the remainder one by one; no masked fold steps.
            # Records are read straight into the tile's layouts (`record_factors_lean`).
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
            b_x = b_x_raw.to(tl.float32)
            dA = dA_c
            dB = dB_c
            b_s = tl.fma(b_s, dA, dB * b_x[:, None])
            p_s = (p_s_head + o_p[:, None] * stride_state_p + o_n[None, :] * stride_state_n)
            if SR:
                b_st = sr_round_fp16(b_s, sr_k, (i_h * P + o_p[:, None]) * N + o_n[None, :])
            else:
                b_st = b_s.to(p_s.dtype.element_ty)
            tl.store(p_s, b_st, mask=m_p[:, None] & m_n[None, :])
            if HAS_READ:
                store_read_tile(b_st, p_r_head, p_rs_head, o_p, o_n,
                                m_p, m_n, stride_read_p, stride_read_n, stride_rs_p, READ_FP8)
            b_y = tl.sum(b_s * b_C[None, :], axis=1)
            if HAS_D:
                b_y += b_x * b_D
            if HAS_Z:
                b_y *= b_z * tl.sigmoid(b_z)
            p_o = p_o_head + o_p * stride_out_p
            tl.store(p_o, b_y.to(p_o.dtype.element_ty), mask=m_p)
    else:
        # Inner-product route (math.md §2), all committed records in one [BLOCK_L] chunk
        # (BLOCK_L >= R), newest first: λ_j = exp(A·s_j), s_j = Δ-sum of every newer token (the
        # current one included); ā = exp(A·(all Δ)). β_j = B_j·C and the per-record
        # coefficients λ_j Δ_j β_j are computed once per (row, head), not per P-tile.
        o_l = tl.arange(0, BLOCK_L)
        j = length - 1 - o_l  # logical rows, newest first
        m_l = j >= 0
        row_l = (start + tl.where(m_l, j, 0)) % R
        b_d = tl.load(p_rdt + row_l * stride_rdt_row, mask=m_l, other=0.0)
        p_Bj = ring_B_ptr + slot * stride_rB_slot + i_g * stride_rB_group
        p_Bj += row_l[:, None] * stride_rB_row + o_n[None, :] * stride_rB_n
        b_Bj = tl.load(p_Bj, mask=m_l[:, None] & m_n[None, :], other=0.0).to(tl.float32)
        b_beta = tl.sum(b_Bj * b_C[None, :], axis=1)  # B_j·C, [BLOCK_L]
        b_lam = tl.exp(A * (dt + (tl.cumsum(b_d, axis=0) - b_d)))
        b_coef = b_lam * b_d * b_beta
        s_all = dt + tl.sum(b_d, axis=0)
        a_bar = tl.exp(A * s_all)
        c_cur = dt * tl.sum(b_B * b_C)
        row_w = (start + length) % R
        b_Cy = b_C
        if REC_FUSED:
            b_Cy = a_bar * b_C  # ā joins C: the records' term shares the S·C reduction
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
                prefetch_l2_tile(p_src_head, p0, t + L2_AHEAD, P, stride_src_p, NUM_PT,
                                  BLOCK_P)
            c_n1, b_x_raw, b_D, b_z = _load_tile(
                p_src_head, p_x_head, p_z_head, p_D_head, p0, t, P, N, stride_src_p,
                stride_src_n, stride_x_p, stride_z_p, stride_D_p, HAS_D, HAS_Z, NUM_PT,
                BLOCK_P, BLOCK_N)
            b_s = c_n1.to(tl.float32)
            _nonflush_tile(
                b_s, b_x_raw, b_D, b_z, b_Cy, b_coef, a_bar, c_cur, p0, t, P, row_l, m_l,
                row_w, p_rx_head, p_o_head, stride_rx_row, stride_rx_p, stride_out_p,
                p_rs_head, stride_rs_p, HAS_D, HAS_Z, BLOCK_P, READ_FP8, REC_FUSED, PTX,
                BLOCK_N, BLOCK_L)
        # Δ once per head, B once per group: by the head's first split only.
        if P_SPLIT > 1:
            tl.store(p_rdt + row_w * stride_rdt_row, dt, mask=i_s == 0)
            tl.store(p_rB + row_w * stride_rB_row, b_B_raw,
                     mask=m_n & (i_h % heads_per_group == 0) & (i_s == 0))
        else:
            tl.store(p_rdt + row_w * stride_rdt_row, dt)
            tl.store(p_rB + row_w * stride_rB_row, b_B_raw,
                     mask=m_n & (i_h % heads_per_group == 0))


class LaunchConfig(NamedTuple):
    block_p: int  # P rows per tile (power of two); a program loops over cdiv(P, block_p) tiles
    block_l: int  # records per chunk, >= R: all committed records in one chunk
    fold_unroll: int  # records per unrolled fold step (flush rows)
    num_warps: int
    l2_ahead: int  # bulk L2 prefetch of checkpoint tile t + l2_ahead (0: none; compiled only)
    maxnreg: int | None = None  # register cap per thread (ptxas), None: the compiler's choice


def launch_config(P: int, N: int, R: int) -> LaunchConfig:
    """Fixed launch parameters; no autotune (the kernel writes the pool).

    Chosen from the H200 sweep of 2026-11-30 at commit 42bdf52 (``benchmarks.sweep_mamba2``,
    Nemotron-3-Nano-4B layer, fp32 state, bf16 activations, L = 16; benchmarks/notes/
    mamba2_decode.md, "Round 3 result"): variant RFw2, the fastest of 15 at batch 256
    (300.9 us cycle mean, 2.25x ``selective_state_update``), 64 (2.07x) and 1 (1.18x).
    ``BLOCK_P = min(16, P)``, ``BLOCK_L = next_pow2(R)``, two records per unrolled fold step,
    a bulk L2 prefetch one tile ahead, and a 96-register cap. Two warps for tiles of up to
    2,048 elements (the measured ``[16, 128]`` tile: 32 state values a thread; ptxas sm_90a:
    96 registers, no spill, 10 CTAs per SM); larger tiles (N > 128, not measured) keep the
    earlier rule's 4 warps, i.e. no more than 32 values a thread up to N = 256.
    """
    block_p = min(16, triton.next_power_of_2(P))
    block_l = triton.next_power_of_2(R)
    num_warps = 2 if triton.next_power_of_2(N) * block_p <= 2048 else 4
    return LaunchConfig(block_p, block_l, fold_unroll=2, num_warps=num_warps, l2_ahead=1,
                        maxnreg=96)


# The P-split's target: at least this many programs per SM. Set when the default was 4 warps at
# the 96-register cap (5 CTAs per SM: 4 per SM was about one resident wave); with 2 warps 10
# CTAs fit an SM, so the target is now under half a resident wave. Fixed, not retuned since
# (batch 1 measured with this target and the 2-warp launch: 8.0 us, 1.18x SGLang).
SPLIT_PROGRAMS_PER_SM = 4


def p_split_rule(n_tiles: int, heads: int, batch: int, sm_count: int | None) -> int:
    """How many programs share one (row, head): the fixed small-batch rule (no autotune).

    A launch of ``heads · batch`` programs that is short of ``SPLIT_PROGRAMS_PER_SM · sm_count``
    splits each head's ``n_tiles`` P-tiles over ``s`` programs: the smallest ``s`` that reaches
    the target (at most one tile per program) among the splits that leave no program empty
    (``s = cdiv(n_tiles, k)``: ``k`` tiles per program, the last program possibly fewer).
    Otherwise (and without an SM count, i.e. off CUDA) ``1``: the unsplit launch.
    Nemotron-3-Nano-4B (96 heads, 5 tiles) on 132 SMs: batch 1 → 5, batch 2 → 3, batch 3-5 → 2,
    batch >= 6 → 1.

    Parameters
    ----------
    n_tiles : int
        ``cdiv(P, BLOCK_P)``, the P-tiles of one head.
    heads, batch : int
        ``H`` and the launch's rows (padding rows included: they are programs too).
    sm_count : int or None
        Streaming multiprocessors of the device; ``None`` off CUDA.

    Returns
    -------
    int
        ``P_SPLIT`` in ``[1, n_tiles]``; a value ``cdiv(n_tiles, k)`` for some ``k``.
    """
    target = SPLIT_PROGRAMS_PER_SM * (sm_count or 0)
    if heads * batch >= target:
        return 1
    want = min(n_tiles, triton.cdiv(target, heads * batch))
    # k = 1 (one tile per program) gives n_tiles >= want, so the set is never empty.
    return min(s for s in (triton.cdiv(n_tiles, k) for k in range(1, n_tiles + 1)) if s >= want)


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def mamba2_replay_decode_fwd(
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
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    dt_softplus: bool,
    stride_dt: tuple[int, int],
    stride_A_head: int,
    stride_D: tuple[int, int],
    stride_dt_bias_head: int,
    read_state: torch.Tensor | None = None,
    read_scale: torch.Tensor | None = None,
    sr_seed: torch.Tensor | None = None,
    sr_layer: int = 0,
    config: LaunchConfig | None = None,
    block_p: int | None = None,
    p_split: int | None = None,
) -> None:
    """Launch the kernel on validated arguments (no checks; see ``mamba2_replay_decode``).

    ``config`` replaces ``launch_config``'s result and ``block_p`` then overrides its tile
    height; ``p_split`` overrides ``p_split_rule`` (tests, benchmarks and tuning only).
    ``p_split`` must be ``cdiv(n_tiles, k)`` for some ``k`` (every program owns at least one
    tile), with ``n_tiles = cdiv(P, block_p)``; otherwise ``ValueError``.
    """
    batch, H, P = x.shape
    N = state.shape[3]
    G = B.shape[1]
    R = ring_x.shape[2]
    if batch == 0:
        return
    cfg = launch_config(P, N, R) if config is None else config
    if block_p is not None:
        cfg = cfg._replace(block_p=block_p)
    block_p, block_l = cfg.block_p, cfg.block_l
    extra = {} if cfg.maxnreg is None or interpreting() else {"maxnreg": cfg.maxnreg}
    if block_l < R:
        raise AssertionError(f"block_l ({block_l}) must be >= R ({R})")
    block_n = triton.next_power_of_2(N)
    # Where the default code does not apply: the fused record term needs BLOCK_N >= BLOCK_L; the
    # L2 prefetch (compiled only) needs whole contiguous tiles of the checkpoint and of the read
    # copy if there is one (non-flush rows prefetch the copy, flush rows the checkpoint).
    rec_fused = block_n >= block_l
    l2_ahead = cfg.l2_ahead
    if interpreting() or not l2_tile_prefetch_ok(state) or (
            read_state is not None and not l2_tile_prefetch_ok(read_state)):
        l2_ahead = 0
    z_strides = (z.stride(0), z.stride(1), z.stride(2)) if z is not None else (0, 0, 0)
    read_strides = read_state.stride() if read_state is not None else (0, 0, 0, 0)
    rs_strides = read_scale.stride() if read_scale is not None else (0, 0, 0)
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
    rows_per_program = min(P, tiles * block_p)
    grid = (H * p_split, batch)
    _mamba2_replay_decode_fwd_kernel[grid](
        state, ring_x, ring_dt, ring_B, x, dt, A, B, C, D, z, dt_bias, out,
        slot_idx, ring_start, ring_len, flush, read_state, read_scale, sr_seed,
        P, N, R, H // G, sr_layer,
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
        DT_SOFTPLUS=dt_softplus,
        HAS_DT_BIAS=dt_bias is not None,
        HAS_D=D is not None,
        HAS_Z=z is not None,
        BLOCK_P=block_p,
        BLOCK_N=block_n,
        BLOCK_L=block_l,
        NUM_PT=tiles,
        FOLD_UNROLL=cfg.fold_unroll,
        PF_X=triton.next_power_of_2(triton.cdiv(rows_per_program * x.element_size(), 128) + 1),
        PF_B=triton.next_power_of_2(triton.cdiv(N * B.element_size(), 128)),
        HAS_READ=read_state is not None,
        READ_FP8=read_scale is not None,
        P_SPLIT=p_split,
        SR=sr_seed is not None,
        REC_FUSED=rec_fused,
        L2_AHEAD=l2_ahead,
        PTX=not interpreting(),
        num_warps=cfg.num_warps,
        **extra,
    )


def mamba2_replay_decode(
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
    """One Mamba-2 ReplaySSM decode step (``T = 1``) for a batch of rows; see kernels/README.md.

    Per row ``b`` with slot ``s = slot_idx[b]``:

    - ``s == -1`` (padding): nothing is read or written (``out[b]`` untouched).
    - ``flush[b]`` false: ``out[b]`` from checkpoint ``state[s]`` + committed records
      ``[0, ring_len[b])`` + the current token (inner-product route); the record ``(x, Δ, B)`` is
      written at physical row ``(ring_start[b] + ring_len[b]) % R``. ``state[s]`` is not written.
    - ``flush[b]`` true: the records and the current token are folded sequentially into
      ``state[s]`` in ``selective_state_update``'s op order and written once (a 16-bit state is
      rounded once); ``out[b] = S_new·C + D x`` (times ``silu(z)``).

    Split precision (optional ``read_state``): non-flush rows read ``S0`` from the low-precision
    read copy ``read_state[s]`` instead of the checkpoint (which they do not read at all); flush
    rows fold into ``state[s]`` exactly as without a copy and then refresh ``read_state[s]`` (and
    ``read_scale[s]``) from the checkpoint as stored (``read_copy.py``). Without a copy the launch
    is the same as before (the copy's code is compiled out).

    Stochastic rounding (optional ``sr_seed``, fp16 ``state`` only): flush rows store the folded
    fp32 state with unbiased stochastic rounding instead of round to nearest, bits keyed by
    ``(sr_seed[0], sr_layer, s)`` and the element's index (``stochastic_round.py``); the fold,
    the outputs and the records are unchanged, and a read copy is refreshed from the value as
    stored. Without ``sr_seed`` the SR code is compiled out.

    Parameters
    ----------
    state : torch.Tensor
        ``[slots, H, P, N]`` checkpoint, fp32/fp16/bf16, any strides (e.g. a layer view of the
        ``[layers, slots, H, P, N]`` pool). Updated in place on flush rows only.
    ring_x : torch.Tensor
        ``[slots, H, R, P]``, dtype of ``x``, any strides. Updated in place (non-flush rows).
    ring_dt : torch.Tensor
        ``[slots, H, R]`` fp32 processed Δ. Updated in place (non-flush rows).
    ring_B : torch.Tensor
        ``[slots, G, R, N]``, dtype of ``B``. Updated in place (non-flush rows).
    x : torch.Tensor
        ``[batch, H, P]`` post-conv activations.
    dt : torch.Tensor
        ``[batch, H]``, or ``[batch, H, P]`` with stride 0 on P (raw dt, as the mixer passes it).
    A : torch.Tensor
        ``[H]``, or ``[H, P, N]`` with stride 0 on P and N (already ``-exp(A_log)``).
    B, C : torch.Tensor
        ``[batch, G, N]``; head ``h`` uses group ``h // (H // G)``.
    out : torch.Tensor
        ``[batch, H, P]``. Written in place for non-padding rows.
    slot_idx : torch.Tensor
        ``[batch]`` int32/int64, ``-1`` = padding row.
    ring_start, ring_len : torch.Tensor
        ``[batch]`` int32/int64 cursor snapshot (``cursors.decode_cursor_step``).
    flush : torch.Tensor
        ``[batch]`` bool flush decision.
    D : torch.Tensor, optional
        ``[H]`` or ``[H, P]`` (any strides).
    z : torch.Tensor, optional
        ``[batch, H, P]`` gate: ``out = y * silu(z)``.
    dt_bias : torch.Tensor, optional
        ``[H]`` or ``[H, P]`` with stride 0 on P.
    dt_softplus : bool
        ``Δ = softplus(dt + dt_bias)`` (threshold 20) instead of ``dt + dt_bias``.
    read_state : torch.Tensor, optional
        ``[slots, H, P, N]`` read copy, bf16 / fp16 / fp8 e4m3 (not ``state``'s dtype), any
        strides. Read by non-flush rows; rewritten in place on flush rows.
    read_scale : torch.Tensor, optional
        ``[slots, H, P]`` fp32 per-row scales, required with (and only with) an fp8 copy; rewritten
        in place on flush rows.
    sr_seed : torch.Tensor, optional
        ``[1]`` int64 counter on ``state``'s device: stochastic rounding of the fp16 checkpoint
        on flush rows. Read on the device (no host sync); the caller advances it between steps
        (a slot's stores of one step and layer must not share a key). Not written.
    sr_layer : int
        Stream id mixed into the bits (the layer index), ``[0, 2^31)``; compiled as a runtime
        argument, so every layer shares one kernel.
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
        actual; ``sr_seed`` with a non-fp16 ``state``.
    """
    dims = validate_mamba2_decode(
        state, ring_x, ring_dt, ring_B, x, dt, A, B, C, out, slot_idx, ring_start, ring_len,
        flush, D, z, dt_bias,
    )
    validate_read_copy(state, read_state, read_scale)
    validate_stochastic_rounding(state, sr_seed, sr_layer)
    check_launch_device("state", state)
    launch = lambda: mamba2_replay_decode_fwd(  # noqa: E731
        state, ring_x, ring_dt, ring_B, x, dt, A, B, C, out, slot_idx, ring_start, ring_len,
        flush, D=D, z=z, dt_bias=dt_bias, dt_softplus=bool(dt_softplus),
        stride_dt=(dims.stride_dt_batch, dims.stride_dt_head),
        stride_A_head=dims.stride_A_head,
        stride_D=(dims.stride_D_head, dims.stride_D_p),
        stride_dt_bias_head=dims.stride_dt_bias_head,
        read_state=read_state, read_scale=read_scale, sr_seed=sr_seed, sr_layer=sr_layer,
        p_split=1 if batch_invariant else None,
    )
    with launch_device(state):
        launch()
