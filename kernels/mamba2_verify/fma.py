"""Mamba-2 ReplaySSM verify, second implementation: plain fp32 FMA reductions (no tensor cores
but for the ``kq_dot`` launch option's ``KᵀQ``).

``mamba2_replay_verify_fma_kernel`` computes exactly what ``kernel.py``'s tensor-core kernel
computes (same arguments, same contract, same in-place writes; the launcher
``kernel.mamba2_replay_verify_fwd`` runs it when the launch configuration's ``impl`` is
``"fma"``, the default), laid out as the decode kernel
(``mamba2_decode/kernel.py``) instead: every product is an fp32 FMA / ``tl.sum`` in registers
(no ``tl.dot``, no tf32), and the checkpoint is walked in ``BLOCK_P``-row tiles of the whole N
(held as N-chunks per thread by the default launch, "Layout options" below).

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

Layout options (``LaunchConfig`` fields, ``kernel.fma_layout``; the default launch,
``kernel.fma_launch_config``, takes ``n_chunks = 4`` for windows of up to 4 tokens and adds
``kq_dot = 1`` at 8 tokens with 16-bit activations, by the H200 sweep of benchmarks/RESULTS.md,
twelfth session; longer windows keep the whole-N ``[BLOCK_P, BLOCK_N]`` tile):

- ``n_chunks = NC > 1`` (``N_CHUNKS``): the tile is held as ``[CQ, BLOCK_P, NC, VEC]`` (column
  ``n = c·CQ·VEC + q·VEC + v``) instead of ``[BLOCK_P, BLOCK_N]``. Triton lays a load out by
  its shape (contiguous ``VEC`` first, then ``CQ`` lanes, then rows over lanes and warps, the
  ``NC`` chunks in registers), so a thread holds ``NC·VEC`` columns of 2 rows (``NC = 4``,
  16-row tiles, 2 warps) instead of 4 columns of 8 rows: each token's sum over N is 16 in-thread
  FMAs and 3 shuffle levels per row (6 shuffles per thread) instead of 4 and 5 (40 shuffles), and
  the records' term ``V (W ⊙ KᵀQ)[:, s]`` joins the same sum before the lanes are crossed
  (``_tile_outputs4``: no ``[BLOCK_P, BLOCK_J, BLOCK_T]`` broadcast, no layout conversion).
  ``C_s`` and the fold's B records are read in the tile's column layout (``_ld_cols``), outputs
  stored from it (``_st_rec``). Flush rows fold each element with the same expressions in the same
  order (``_fold_tile4``), so checkpoints, read copies and rings are bit-identical.
- ``kq_dot = 1`` (``KQ_DOT``, with ``n_chunks > 1``): ``KᵀQ`` as one ``tl.dot`` per N-chunk
  (16-bit activations: exact products on the tensor cores, fp32 sums; T padded to 16) instead of
  ``BLOCK_T`` cross-lane sums per chunk; outputs only.
- ``read_mma = 1`` (``READ_MMA``, with ``kq_dot = 1``, a bf16 or fp8 read copy and bf16
  activations): a non-flush row's tiles take their outputs from the copy on tensor cores
  (``mma_tile.py``: one exact bf16 ``S·C`` product and two tf32 products for the records' term per
  tile) instead of this layout's FMAs; flush rows and every stored bit are unchanged. The default
  launch takes it at 4 and 8 tokens with a bf16 / fp8 copy (timed on an H100: T = 8 cycle −32% /
  −16%, T = 4 bf16 −8%, T = 4 fp8 mixed launch −3% / −7%; ``kernel.fma_launch_config``).

- ``flush_split = 1`` (with ``read_mma = 1``): the flush rows in a launch of their own built
  without ``read_mma`` and with ``kq_dot = flush_kq_dot`` (``ROWS = 1``), the non-flush rows in a
  ``read_mma`` launch compiled for them alone (``ROWS = 2``); each launch's other rows return at
  once. The flush rows fold without ``read_mma``'s shared-memory carveout (its operand staging
  takes L1 from the whole kernel: ncu, benchmarks/notes/verify.md), and the non-flush build
  carries no fold code. The default launch takes it at 8 tokens and with an fp8 copy at 4 (H100:
  T = 8 cycle −7% bf16 / −26% fp8, T = 4 fp8 −4.5%; ``kernel.fma_launch_config``); the stored
  bits are the one launch's (CPU lockstep; on a GPU at T = 4 with an fp8 copy).

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

from replayssm_kernels.mamba2_decode._fold import ld_rec, record_factors_lean
from replayssm_kernels.mamba2_decode.read_copy import fp8_row_scale, store_read_tile
from replayssm_kernels.mamba2_verify.kernel import _window_delta
from replayssm_kernels.mamba2_verify.mma_tile import tile_outputs_mma
from replayssm_kernels.prefetch import prefetch_l2_tile
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


# --- The N-chunked layout (``N_CHUNKS > 1``) -------------------------------------------------
# The checkpoint tile is held as a 4-D tensor ``[CQ, BLOCK_P, NC, VEC]``, column
# ``n = c·CQ·VEC + q·VEC + v`` (``NC = N_CHUNKS``, ``VEC = min(4, BLOCK_N / NC)``,
# ``CQ = BLOCK_N / (NC·VEC)``). Triton's coalescing pass lays a load out from its shape and
# pointer contiguity (dims ordered by contiguity, ties by index): ``VEC`` contiguous columns per
# thread (one 16-byte fp32 vector), then lanes over ``CQ``, then lanes and warps over the rows,
# the rest (``NC``) in registers. So each thread holds ``NC`` column chunks of its rows, and a
# reduction over N is ``NC·VEC`` in-thread adds followed by ``log2(CQ)`` shuffle levels (the
# ``[BLOCK_P, BLOCK_N]`` tile: ``VEC`` adds, then ``log2(BLOCK_N / VEC)`` levels, for 4x the
# rows per thread at ``NC = 4``). The checkpoint and read-copy tiles (same shape) get the same
# layout; the N-vectors (``C_s``, B records) are read in its column layout (``_ld_cols``), the
# records' x in it (``ld_rec``), and outputs stored from the reduction's layout (``_st_rec``),
# so no shared-memory conversion sits in the tile loop. Layout only: each checkpoint element is
# folded by the same expressions in the same order as in the ``[BLOCK_P, BLOCK_N]`` tile.


@triton.jit
def _n_index4(NC: tl.constexpr, CQ: tl.constexpr, VEC: tl.constexpr):
    """Column index ``[CQ, 1, NC, VEC]`` of the N-chunked tile (also the record index ``J``)."""
    return (tl.arange(0, CQ)[:, None, None, None] * VEC
            + tl.arange(0, NC)[None, None, :, None] * (CQ * VEC)
            + tl.arange(0, VEC)[None, None, None, :])


@triton.jit
def _ld_cols(p_row, stride_n, N, m_row, CQ: tl.constexpr, NC: tl.constexpr, VEC: tl.constexpr,
             PTX: tl.constexpr):
    """One N-vector (``C_s``, a B record) as fp32 ``[CQ, 1, NC, VEC]``, in the N-chunked tile's
    column layout (0 where ``n >= N`` or not ``m_row``). Compiled builds with ``CQ·VEC < 64``:
    ``NC`` loads of ``[CQ, 1, 1, VEC]`` (fewer elements than two warps have threads, so each takes
    its consumer's layout, ``VEC``-wide vectors where the pointers allow), joined over the
    in-thread ``NC`` axis (constant selects, folded away); wider chunks: one ``ld_rec``-style
    load per value, which the compiler may not hoist out of the tile loop (``is_pure=False``).
    A ``tl.load`` of the whole ``[CQ, 1, NC, VEC]`` would get the coalescing pass's layout and
    a shared-memory conversion."""
    o_q = tl.arange(0, CQ)[:, None, None, None] * VEC
    o_v = tl.arange(0, VEC)[None, None, None, :]
    o_c = tl.arange(0, NC)[None, None, :, None]
    if (not PTX) or CQ * VEC < 64:
        b = tl.zeros([CQ, 1, NC, VEC], dtype=tl.float32)
        for c in tl.static_range(NC):
            n_c = c * (CQ * VEC) + o_q + o_v
            piece = tl.load(p_row + n_c * stride_n, mask=(n_c < N) & m_row, other=0.0)
            b = tl.where(o_c == c, piece.to(tl.float32), b)
    else:
        n4 = o_c * (CQ * VEC) + o_q + o_v
        ptrs = p_row + n4 * stride_n
        m = ((n4 < N) & m_row).to(tl.int32)
        if p_row.dtype.element_ty.primitive_bitwidth == 16:
            b = tl.inline_asm_elementwise(
                "{ .reg .pred p; setp.ne.b32 p, $2, 0; mov.b16 $0, 0; @p ld.global.b16 $0, [$1]; }",
                "=h,l,r", [ptrs, m], dtype=p_row.dtype.element_ty, is_pure=False, pack=1)
        else:
            b = tl.inline_asm_elementwise(
                "{ .reg .pred p; setp.ne.b32 p, $2, 0; mov.b32 $0, 0; @p ld.global.b32 $0, [$1]; }",
                "=r,l,r", [ptrs, m], dtype=p_row.dtype.element_ty, is_pure=False, pack=1)
        b = b.to(tl.float32)
    return b


@triton.jit
def _st_rec(ptrs, vals, mask):
    """``tl.store(ptrs, vals, mask)`` of 16- or 32-bit values written as elementwise PTX (compiled
    builds; ``ld_rec``'s store): the store takes its value's layout, where ``tl.store`` gets the
    coalescing pass's and a shared-memory conversion with two barriers. Lanes holding copies of
    one value store it alike."""
    if vals.dtype.primitive_bitwidth == 16:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p st.global.b16 [$1], $2; mov.u32 $0, 0; }",
            "=r,l,h,r", [ptrs, vals.to(tl.int16, bitcast=True), mask.to(tl.int32)],
            dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p st.global.b32 [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r,r", [ptrs, vals.to(tl.int32, bitcast=True), mask.to(tl.int32)],
            dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _record_factors4(p_rx, p_rdt, p_rB, row, A, N, m_x, stride_rx_row, stride_rdt_row,
                     stride_rB_row, stride_rB_n, CQ: tl.constexpr, NC: tl.constexpr,
                     VEC: tl.constexpr, PTX: tl.constexpr):
    """``record_factors_lean`` for the N-chunked tile: physical ring row ``row``'s x
    ``[1, BLOCK_P, 1, 1]`` (``p_rx`` / ``m_x``; compiled: ``ld_rec``), ``dA = exp(A·Δ)`` and
    ``dB = B·Δ`` with B ``[CQ, 1, NC, VEC]`` by ``_ld_cols`` from the group's ring ``p_rB``."""
    if PTX:
        b_xj = ld_rec(p_rx + row * stride_rx_row, m_x)
    else:
        b_xj = tl.load(p_rx + row * stride_rx_row, mask=m_x, other=0.0)
    dtj = tl.load(p_rdt + row * stride_rdt_row)
    b_Bj = _ld_cols(p_rB + row * stride_rB_row, stride_rB_n, N, True, CQ, NC, VEC, PTX)
    return b_xj, tl.exp(A * dtj), b_Bj * dtj


@triton.jit
def _fold_tile4(b_s, p_rx, p_rdt, p_rB, s0, n_full, length, R, A, N, m_x, stride_rx_row,
                stride_rdt_row, stride_rB_row, stride_rB_n, FOLD_UNROLL: tl.constexpr,
                CQ: tl.constexpr, NC: tl.constexpr, VEC: tl.constexpr, PTX: tl.constexpr):
    """``_fold_tile`` on the N-chunked tile (records by ``_record_factors4``): the update
    ``fma(S, dA, dB·x)`` per element, oldest record first: the ``[BLOCK_P, BLOCK_N]`` tile's
    bits."""
    for c in range(0, n_full, FOLD_UNROLL):
        for jj in tl.static_range(FOLD_UNROLL):
            row = s0 + c + jj
            b_xj, dA, dB = _record_factors4(
                p_rx, p_rdt, p_rB, tl.where(row >= R, row - R, row), A, N, m_x, stride_rx_row,
                stride_rdt_row, stride_rB_row, stride_rB_n, CQ, NC, VEC, PTX)
            b_s = tl.fma(b_s, dA, dB * b_xj.to(tl.float32))
    for j in range(n_full, length):
        row = s0 + j
        b_xj, dA, dB = _record_factors4(
            p_rx, p_rdt, p_rB, tl.where(row >= R, row - R, row), A, N, m_x, stride_rx_row,
            stride_rdt_row, stride_rB_row, stride_rB_n, CQ, NC, VEC, PTX)
        b_s = tl.fma(b_s, dA, dB * b_xj.to(tl.float32))
    return b_s


@triton.jit
def _store_read_tile4(b_st, p_r_head, p_rs_head, o_p, m_p, p4, n4, m_pn, stride_read_p,
                      stride_read_n, stride_rs_p, READ_FP8: tl.constexpr):
    """``store_read_tile`` on the N-chunked tile (the fp8 row max over all of N: exact in any
    order, so the copy and its scales are the ``[BLOCK_P, BLOCK_N]`` tile's bits)."""
    b_v = b_st.to(tl.float32)
    p_r = p_r_head + p4 * stride_read_p + n4 * stride_read_n
    if READ_FP8:
        amax = tl.max(tl.max(tl.max(tl.abs(b_v), axis=3), axis=2), axis=0)
        scale, inv = fp8_row_scale(amax)
        tl.store(p_rs_head + o_p * stride_rs_p, scale, mask=m_p)
        b_v = b_v * inv[None, :, None, None]
    tl.store(p_r, b_v.to(p_r.dtype.element_ty), mask=m_pn)


@triton.jit
def _tile_outputs4(
    b_s, o_p, m_p, o_t, o_tc, coef, d_g, T, N, start, length, hist, R,
    p_x_row, p_rx_head, p_C_row, p_o_row, p_rs_head, D_ptr, z_ptr, i_b64, i_h,
    stride_x_T, stride_x_p, stride_rx_row, stride_rx_p, stride_C_T, stride_C_n, stride_out_T,
    stride_out_p, stride_rs_p, stride_D_head, stride_D_p, stride_z_batch, stride_z_T,
    stride_z_head, stride_z_p,
    SCALED: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr, BLOCK_T: tl.constexpr,
    NC: tl.constexpr, JC: tl.constexpr, CQ: tl.constexpr, VEC: tl.constexpr,
    PTX: tl.constexpr,
):
    """``_tile_outputs`` on the N-chunked tile ``b_s [CQ, BLOCK_P, NC, VEC]``. Per window token
    ``s`` one reduction: the records' term joins the ``S·C_s`` sum before the lanes are crossed,
    ``y_s = Σ_q (Dg_s·Σ_{c,v} S·C_s + Σ_{c',v} V·coef[:, s])`` (records ``J`` in
    ``[CQ, ., JC, VEC]`` chunks, ``JC·CQ·VEC = BLOCK_J``), then ``D x``, ``silu(z)``, the store of
    row ``s``; and the append of the window's x records. Outputs only."""
    p4 = o_p[None, :, None, None]
    m_p4 = m_p[None, :, None, None]
    # V: the records' x in the tile's layout (compiled: ld_rec, whose layout is its consumer's;
    # tl.load would get the coalescing pass's P-major layout and a conversion per tile).
    o_j4 = _n_index4(JC, CQ, VEC)
    is_w4 = o_j4 < T
    is_h4 = (o_j4 >= T) & (o_j4 < T + hist)
    row_j4 = start % R + tl.where(is_h4, hist - 1 - (o_j4 - T), 0)  # history rows, as row_j
    row_j4 = tl.where(row_j4 >= R, row_j4 - R, row_j4)
    p_v = tl.where(is_w4, p_x_row + o_j4 * stride_x_T + p4 * stride_x_p,
                   p_rx_head + row_j4 * stride_rx_row + p4 * stride_rx_p)
    m_v = m_p4 & (is_w4 | is_h4)
    if PTX:
        b_v = ld_rec(p_v, m_v).to(tl.float32)
    else:
        b_v = tl.load(p_v, mask=m_v, other=0.0).to(tl.float32)
    if SCALED:
        b_rs = tl.load(p_rs_head + o_p * stride_rs_p, mask=m_p, other=0.0)
    if HAS_D:
        b_D = tl.load(D_ptr + i_h * stride_D_head + o_p * stride_D_p, mask=m_p,
                      other=0.0).to(tl.float32)
    # Append the window's x records (after this tile's history reads; disjoint rows anyway),
    # loaded again for the store in the store's own layout (no conversion).
    m_pt = m_p[:, None] & (o_t < T)[None, :]
    tl.store(p_rx_head + ((start + length + o_t[None, :]) % R) * stride_rx_row
             + o_p[:, None] * stride_rx_p,
             tl.load(p_x_row + o_t[None, :] * stride_x_T + o_p[:, None] * stride_x_p, mask=m_pt),
             mask=m_pt)
    for s in tl.static_range(BLOCK_T):
        m_ps = m_p & (s < T)
        # C_s [CQ, 1, NC, VEC]: each value once per thread, in the tile's column layout.
        b_c = _ld_cols(p_C_row + s * stride_C_T, stride_C_n, N, s < T, CQ, NC, VEC, PTX)
        b_sc = tl.sum(tl.sum(b_s * b_c, axis=3), axis=2)  # [CQ, BLOCK_P]: in-thread
        if SCALED:
            b_sc = b_sc * b_rs[None, :]
        # Column s of coef and Dg[s] (loop-invariant: hoisted out of the tile loop).
        coef_s = tl.permute(tl.reshape(tl.sum(tl.where(o_tc[None, :] == s, coef, 0.0), axis=1),
                                       (JC, CQ, VEC)), (1, 0, 2))[:, None, :, :]
        dg_s = tl.sum(tl.where(o_t == s, d_g, 0.0), axis=0)
        b_rec = tl.sum(tl.sum(b_v * coef_s, axis=3), axis=2)  # [CQ, BLOCK_P]: in-thread
        b_y = tl.sum(b_sc * dg_s + b_rec, axis=0)  # [BLOCK_P]: log2(CQ) shuffle levels
        b_x = tl.load(p_x_row + s * stride_x_T + o_p * stride_x_p, mask=m_ps, other=0.0)
        if HAS_D:
            b_y += b_x.to(tl.float32) * b_D
        if HAS_Z:
            b_z = tl.load(z_ptr + i_b64 * stride_z_batch + i_h * stride_z_head + s * stride_z_T
                          + o_p * stride_z_p, mask=m_ps, other=0.0).to(tl.float32)
            b_y *= b_z * tl.sigmoid(b_z)
        p_o = p_o_row + s * stride_out_T + o_p * stride_out_p
        if PTX:
            _st_rec(p_o, b_y.to(p_o.dtype.element_ty), m_ps)
        else:
            tl.store(p_o, b_y.to(p_o.dtype.element_ty), mask=m_ps)


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
    N_CHUNKS: tl.constexpr,
    KQ_DOT: tl.constexpr,
    READ_MMA: tl.constexpr = 0,
    ROWS: tl.constexpr = 0,
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
    if ROWS == 1:  # launch option flush_split: this launch takes the flush rows only
        if do_flush == 0:
            return
    if ROWS == 2:  # ... and this one the non-flush rows
        if do_flush != 0:
            return
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
                prefetch_l2_tile(p_r_head, p0, tt, P, stride_read_p, NUM_PT, BLOCK_P)
        else:
            for tt in tl.static_range(1, L2_AHEAD):
                prefetch_l2_tile(p_s_head, p0, tt, P, stride_state_p, NUM_PT, BLOCK_P)

    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < N
    o_t = tl.arange(0, BLOCK_T)
    m_t = o_t < T
    if N_CHUNKS > 1:  # the N-chunked tile [CQ, BLOCK_P, NC, VEC]; records in [CQ, ., JC, VEC]
        VEC: tl.constexpr = min(4, BLOCK_N // N_CHUNKS)
        CQ: tl.constexpr = BLOCK_N // (N_CHUNKS * VEC)
        JC: tl.constexpr = BLOCK_J // (CQ * VEC)
        n4 = _n_index4(N_CHUNKS, CQ, VEC)
        m_n4 = n4 < N
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
    # KQ_DOT: one tensor-core product per N-chunk instead ([BLOCK_J, BLOCK_K] x [BLOCK_K, 16+],
    # fp32 accumulation; the tokens' columns padded to tl.dot's 16, masked), so coef has
    # BLOCK_TC >= 16 columns (o_tc); outputs only.
    row_w = (start + length + o_j) % R  # physical rows of the window records (J < T)
    m_jn_w = is_w & (i_h % heads_per_group == 0) & (i_s == 0)
    o_k = tl.arange(0, BLOCK_K)
    if KQ_DOT:
        BLOCK_TC: tl.constexpr = max(16, BLOCK_T)
        o_tc = tl.arange(0, BLOCK_TC)
        m_tc = o_tc < T
        kq = tl.zeros([BLOCK_J, BLOCK_TC], dtype=tl.float32)
    else:
        o_tc = o_t
        kq = tl.zeros([BLOCK_J, BLOCK_T], dtype=tl.float32)
    NUM_KC: tl.constexpr = (BLOCK_N + BLOCK_K - 1) // BLOCK_K
    for kc in tl.static_range(NUM_KC):
        o_nk = kc * BLOCK_K + o_k
        m_nk = o_nk < N
        p_Bj = tl.where(is_w[:, None], p_B_row + o_j[:, None] * stride_B_T
                        + o_nk[None, :] * stride_B_n,
                        p_rB_grp + row_j[:, None] * stride_rB_row + o_nk[None, :] * stride_rB_n)
        b_Bj = tl.load(p_Bj, mask=(is_w | is_h)[:, None] & m_nk[None, :], other=0.0)
        if KQ_DOT:
            b_Ct = tl.load(p_C_row + o_tc[None, :] * stride_C_T + o_nk[:, None] * stride_C_n,
                           mask=m_nk[:, None] & m_tc[None, :], other=0.0)
            if PTX:  # 16-bit operands: exact products on the tensor cores, fp32 sums
                kq = tl.dot(b_Bj, b_Ct, kq, input_precision="ieee")
            else:  # the interpreter's tl.dot takes no 16-bit floats: fp32 products (exact)
                kq = tl.dot(b_Bj.to(tl.float32), b_Ct.to(tl.float32), kq,
                            input_precision="ieee")
        else:
            b_Bf = b_Bj.to(tl.float32)
            for s in tl.static_range(BLOCK_T):
                b_c = tl.load(p_C_row + s * stride_C_T + o_nk * stride_C_n, mask=m_nk & (s < T),
                              other=0.0).to(tl.float32)
                kq += tl.where(o_t[None, :] == s, tl.sum(b_Bf * b_c[None, :], axis=1)[:, None],
                               0.0)
        tl.store(p_rB_grp + row_w[:, None] * stride_rB_row + o_nk[None, :] * stride_rB_n, b_Bj,
                 mask=m_jn_w[:, None] & m_nk[None, :])
    if KQ_DOT:  # the window prefix and mask over the padded columns (same Δ expressions)
        b_cwc = tl.cumsum(_window_delta(p_dt_row, o_tc, m_tc, stride_dt_T, dt_bias_ptr, i_h,
                                        stride_dt_bias_head, DT_SOFTPLUS, HAS_DT_BIAS), axis=0)
        m_jsc = (is_h[:, None] | (is_w[:, None] & (o_j[:, None] <= o_tc[None, :]))) \
            & m_tc[None, :]
        coef = tl.where(m_jsc, d_j[:, None] * tl.exp(A * (b_cwc[None, :] + e_j[:, None])) * kq,
                        0.0)
    else:
        coef = tl.where(m_js, d_j[:, None] * tl.exp(A * (b_cw[None, :] + e_j[:, None])) * kq,
                        0.0)
    d_g = tl.exp(A * (h_sum + b_cw))  # [BLOCK_T]

    if do_flush:
        if SR:  # fp16 checkpoint, stochastic rounding: this (seed, layer, slot)'s key
            sr_k = sr_key(sr_seed_ptr, sr_layer, slot)
        n_full = (length // FOLD_UNROLL) * FOLD_UNROLL
        s0 = start % R  # record j's row is s0 + j, less R past the end: no % per record
        p_rB = p_rB_grp + o_n * stride_rB_n
        for t in range(NUM_PT):
            if L2_AHEAD > 0:
                prefetch_l2_tile(p_s_head, p0, t + L2_AHEAD, P, stride_state_p, NUM_PT, BLOCK_P)
            o_p = p0 + t * BLOCK_P + tl.arange(0, BLOCK_P)
            m_p = o_p < P
            if N_CHUNKS == 1:
                m_pn = m_p[:, None] & m_n[None, :]
                p_s = p_s_head + o_p[:, None] * stride_state_p + o_n[None, :] * stride_state_n
                b_s = tl.load(p_s, mask=m_pn, other=0.0).to(tl.float32)
                b_s = _fold_tile(b_s, p_rx_head + o_p * stride_rx_p, p_rdt, p_rB, s0, n_full,
                                 length, R, A, m_p, m_n, stride_rx_row, stride_rdt_row,
                                 stride_rB_row, FOLD_UNROLL, PTX)
                if SR:
                    b_st = sr_round_fp16(b_s, sr_k, (i_h * P + o_p[:, None]) * N + o_n[None, :])
                else:
                    b_st = b_s.to(p_s.dtype.element_ty)
                tl.store(p_s, b_st, mask=m_pn)
                if HAS_READ:  # whole N rows: the fp8 row max is the tile's
                    store_read_tile(b_st, p_r_head, p_rs_head, o_p, o_n, m_p, m_n,
                                    stride_read_p, stride_read_n, stride_rs_p, READ_FP8)
                _tile_outputs(
                    b_s, o_p, m_p, o_n, m_n, o_t, m_t, o_j, is_w, is_h, row_j, row_w, coef, d_g,
                    T, p_x_row, p_rx_head, p_C_row, p_o_row, p_rs_head, D_ptr, z_ptr, i_b64,
                    i_h, stride_x_T, stride_x_p, stride_rx_row, stride_rx_p, stride_C_T,
                    stride_C_n, stride_out_T, stride_out_p, stride_rs_p, stride_D_head,
                    stride_D_p, stride_z_batch, stride_z_T, stride_z_head, stride_z_p,
                    False, HAS_D, HAS_Z, BLOCK_P, BLOCK_T)
            else:  # the N-chunked tile: same fold per element, same stored bits
                p4 = o_p[None, :, None, None]
                m_p4 = m_p[None, :, None, None]
                m_pn4 = m_p4 & m_n4
                p_s = p_s_head + p4 * stride_state_p + n4 * stride_state_n
                b_s = tl.load(p_s, mask=m_pn4, other=0.0).to(tl.float32)
                b_s = _fold_tile4(b_s, p_rx_head + p4 * stride_rx_p, p_rdt, p_rB_grp, s0,
                                  n_full, length, R, A, N, m_p4, stride_rx_row, stride_rdt_row,
                                  stride_rB_row, stride_rB_n, FOLD_UNROLL, CQ, N_CHUNKS, VEC,
                                  PTX)
                if SR:
                    b_st = sr_round_fp16(b_s, sr_k, (i_h * P + p4) * N + n4)
                else:
                    b_st = b_s.to(p_s.dtype.element_ty)
                tl.store(p_s, b_st, mask=m_pn4)
                if HAS_READ:
                    _store_read_tile4(b_st, p_r_head, p_rs_head, o_p, m_p, p4, n4, m_pn4,
                                      stride_read_p, stride_read_n, stride_rs_p, READ_FP8)
                _tile_outputs4(
                    b_s, o_p, m_p, o_t, o_tc, coef, d_g, T, N, start, length, hist, R,
                    p_x_row, p_rx_head, p_C_row, p_o_row, p_rs_head, D_ptr, z_ptr, i_b64, i_h,
                    stride_x_T, stride_x_p, stride_rx_row, stride_rx_p, stride_C_T, stride_C_n,
                    stride_out_T, stride_out_p, stride_rs_p, stride_D_head, stride_D_p,
                    stride_z_batch, stride_z_T, stride_z_head, stride_z_p,
                    False, HAS_D, HAS_Z, BLOCK_T, N_CHUNKS, JC, CQ, VEC, PTX)
    else:
        # Tile source: the read copy if there is one (the checkpoint is not read at all).
        p_src_head = p_s_head
        stride_src_p = stride_state_p
        stride_src_n = stride_state_n
        if HAS_READ:
            p_src_head = p_r_head
            stride_src_p = stride_read_p
            stride_src_n = stride_read_n
        if READ_MMA:  # launch option read_mma (mma_tile.py): C's padded columns and Dg, once
            b_ct = tl.load(p_C_row + o_tc[None, :] * stride_C_T + o_n[:, None] * stride_C_n,
                           mask=m_n[:, None] & m_tc[None, :], other=0.0)
            d_gc = tl.exp(A * (h_sum + b_cwc))  # [BLOCK_TC]
        for t in range(NUM_PT):
            if L2_AHEAD > 0:
                prefetch_l2_tile(p_src_head, p0, t + L2_AHEAD, P, stride_src_p, NUM_PT, BLOCK_P)
            o_p = p0 + t * BLOCK_P + tl.arange(0, BLOCK_P)
            m_p = o_p < P
            if READ_MMA:
                tile_outputs_mma(
                    p_src_head, stride_src_p, stride_src_n, o_p, m_p, o_n, m_n, b_ct, coef, d_gc,
                    o_tc, m_tc, o_j, is_w, is_h, row_j, T, start, length, R, p_x_row, p_rx_head,
                    p_o_row, p_rs_head, D_ptr, z_ptr, i_b64, i_h, stride_x_T, stride_x_p,
                    stride_rx_row, stride_rx_p, stride_out_T, stride_out_p, stride_rs_p,
                    stride_D_head, stride_D_p, stride_z_batch, stride_z_T, stride_z_head,
                    stride_z_p, READ_FP8, HAS_D, HAS_Z, PTX)
            elif N_CHUNKS == 1:
                b_s = tl.load(p_src_head + o_p[:, None] * stride_src_p
                              + o_n[None, :] * stride_src_n,
                              mask=m_p[:, None] & m_n[None, :], other=0.0).to(tl.float32)
                _tile_outputs(
                    b_s, o_p, m_p, o_n, m_n, o_t, m_t, o_j, is_w, is_h, row_j, row_w, coef, d_g,
                    T, p_x_row, p_rx_head, p_C_row, p_o_row, p_rs_head, D_ptr, z_ptr, i_b64,
                    i_h, stride_x_T, stride_x_p, stride_rx_row, stride_rx_p, stride_C_T,
                    stride_C_n, stride_out_T, stride_out_p, stride_rs_p, stride_D_head,
                    stride_D_p, stride_z_batch, stride_z_T, stride_z_head, stride_z_p,
                    READ_FP8, HAS_D, HAS_Z, BLOCK_P, BLOCK_T)
            else:
                p4 = o_p[None, :, None, None]
                b_s = tl.load(p_src_head + p4 * stride_src_p + n4 * stride_src_n,
                              mask=m_p[None, :, None, None] & m_n4, other=0.0).to(tl.float32)
                _tile_outputs4(
                    b_s, o_p, m_p, o_t, o_tc, coef, d_g, T, N, start, length, hist, R,
                    p_x_row, p_rx_head, p_C_row, p_o_row, p_rs_head, D_ptr, z_ptr, i_b64, i_h,
                    stride_x_T, stride_x_p, stride_rx_row, stride_rx_p, stride_C_T, stride_C_n,
                    stride_out_T, stride_out_p, stride_rs_p, stride_D_head, stride_D_p,
                    stride_z_batch, stride_z_T, stride_z_head, stride_z_p,
                    READ_FP8, HAS_D, HAS_Z, BLOCK_T, N_CHUNKS, JC, CQ, VEC, PTX)
    tl.store(p_rdt + row_w * stride_rdt_row, d_j, mask=is_w & (i_s == 0))  # Δ: first split
