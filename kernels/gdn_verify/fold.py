"""Gated DeltaNet verify, launch 1: the exact fold of the flush rows' committed records.

``gdn_verify_fold_kernel`` (and ``gdn_verify_fold_read_kernel`` with a split-precision read copy;
both inline ``_fold_program``) runs before the window launch (``window.py``). One warp per program.
Two grids (``kernel._fold_grid``):

* the work list (default up to ``kernel.FOLD_WORK_LIST_MAX_BATCH`` rows): a fixed grid of ``P``
  programs (``kernel.FOLD_PROGRAMS_PER_SM`` per SM) over the flush rows only. Every program counts
  the flush rows ``n`` from the flags; the items are the ``n · HV`` (row, head) pairs, each all
  of the head's ``[BV, K]`` tiles in turn, when there are at least ``HEAD_ITEMS`` per program,
  else the ``n · HV · tiles`` single tiles, so a few flush rows' folds still spread over every
  program; program ``z`` takes items ``z, z + P, ...``. A step without flush rows costs ``P``
  programs that count and exit, not a program per (row, head) or per (row, head, tile) as the
  other grid.
* a program per (row, head, ``TILES`` tiles) (``fold_tiles``, or above the work list's batch):
  grid ``(cdiv(V, BV) / TILES, HV, batch)``; padding and non-flush rows' programs return at once
  (32,768 such one-warp programs took 24.7 us on the H200, ``benchmarks/notes/gdn_decode.md``).

The arithmetic of a tile does not depend on the grid. For ``K <= 128`` (``RL > 0``) the
decode kernel's flush path (``_tree.flush_tree`` without a current token: ``RL`` rows on lanes,
SGLang's reduction tree written out); above, ``BV = 32``, SGLang's packed-decode tile, so
``fold_records`` compiles to that kernel's reduction trees
(``tests/kernels/test_gdn_verify.py::test_fold_codegen_matches_sglang``). Both give the packed
decode's bits. A flush row folds its records ``[0, len)`` from the raw inputs in the packed
decode's op order and stores the tile once (fp16 with ``SR``: stochastically rounded); with a read
copy the stored tile also rewrites the copy. Not autotuned (writes the checkpoint); no host sync.

An ncu profile of the flush launch (H200, twentieth session): 2 warps per scheduler, a third of the
stall cycles on memory; of those, ~44% at each tile's start and most of the rest at the records' gate
/ β loads. Cache hints for those loads (next tile into L2, records into L2 or L1) made the flush step
2.5–3% slower and were removed (twenty-first session, ``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm_kernels.gdn_decode._fold import fold_records
from replayssm_kernels.gdn_decode._tree import flush_tree
from replayssm_kernels.mamba2_decode.read_copy import store_read_tile
from replayssm_kernels.stochastic_round import sr_key, sr_round_fp16


@triton.jit
def _fold_program(
    state, ring_k, ring_v, ring_g, ring_beta, slot_idx, ring_start, ring_len, flush,
    read_ptr, read_scale_ptr, sr_seed, R, sr_layer, batch,
    stride_s_n, stride_s_h, stride_s_v, stride_s_k,
    stride_rk_n, stride_rk_h, stride_rk_r, stride_rk_k,
    stride_rv_n, stride_rv_h, stride_rv_r, stride_rv_v,
    stride_g_n, stride_g_h, stride_g_r,
    stride_beta_n, stride_beta_h, stride_beta_r,
    stride_rd_n, stride_rd_h, stride_rd_v, stride_rd_k,
    stride_rs_n, stride_rs_h, stride_rs_v,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, RL: tl.constexpr, USE_QK_L2NORM: tl.constexpr, HAS_READ: tl.constexpr,
    READ_FP8: tl.constexpr, SR: tl.constexpr, TILES: tl.constexpr, WORK_LIST: tl.constexpr,
    BLOCK_B: tl.constexpr, HEAD_ITEMS: tl.constexpr,
):  # fmt: skip
    """One program of the fold launch (kernels below).  ``WORK_LIST``: a fixed grid of programs
    over the flush rows' (row, head, tiles) items (``_work_list``); else program
    ``(i_g, i_hv, i_n)`` folds ``TILES`` value tiles of head ``i_hv`` of row ``i_n`` in turn (a
    non-flush or padding row's program returns at once)."""
    if WORK_LIST:
        _work_list(
            state, ring_k, ring_v, ring_g, ring_beta, slot_idx, ring_start, ring_len, flush,
            read_ptr, read_scale_ptr, sr_seed, R, sr_layer, batch,
            stride_s_n, stride_s_h, stride_s_v, stride_s_k,
            stride_rk_n, stride_rk_h, stride_rk_r, stride_rk_k,
            stride_rv_n, stride_rv_h, stride_rv_r, stride_rv_v,
            stride_g_n, stride_g_h, stride_g_r,
            stride_beta_n, stride_beta_h, stride_beta_r,
            stride_rd_n, stride_rd_h, stride_rd_v, stride_rd_k,
            stride_rs_n, stride_rs_h, stride_rs_v,
            H, HV, K, V, BK, BV, RL, USE_QK_L2NORM, HAS_READ, READ_FP8, SR, BLOCK_B, HEAD_ITEMS,
        )  # fmt: skip
    else:
        i_g, i_hv, i_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        i_s = tl.load(slot_idx + i_n).to(tl.int64)
        is_flush = tl.load(flush + i_n).to(tl.int32)
        if (i_s < 0) | (is_flush == 0):
            return
        _fold_head_tiles(
            state, ring_k, ring_v, ring_g, ring_beta, ring_start, ring_len, read_ptr,
            read_scale_ptr, sr_seed, R, sr_layer, i_n, i_s, i_hv, i_g, TILES,
            stride_s_n, stride_s_h, stride_s_v, stride_s_k,
            stride_rk_n, stride_rk_h, stride_rk_r, stride_rk_k,
            stride_rv_n, stride_rv_h, stride_rv_r, stride_rv_v,
            stride_g_n, stride_g_h, stride_g_r,
            stride_beta_n, stride_beta_h, stride_beta_r,
            stride_rd_n, stride_rd_h, stride_rd_v, stride_rd_k,
            stride_rs_n, stride_rs_h, stride_rs_v,
            H, HV, K, V, BK, BV, RL, USE_QK_L2NORM, HAS_READ, READ_FP8, SR,
        )  # fmt: skip


@triton.jit
def _flush_rows(slot_idx, flush, batch, BLOCK_B: tl.constexpr):
    """``[BLOCK_B]`` int32: 1 for the batch's flush rows with a slot, else 0."""
    o_b = tl.arange(0, BLOCK_B)
    m_b = o_b < batch
    f = tl.load(flush + o_b, mask=m_b, other=0) != 0
    s = tl.load(slot_idx + o_b, mask=m_b, other=-1)
    return (f & (s >= 0)).to(tl.int32)


@triton.jit
def _work_list(
    state, ring_k, ring_v, ring_g, ring_beta, slot_idx, ring_start, ring_len, flush,
    read_ptr, read_scale_ptr, sr_seed, R, sr_layer, batch,
    stride_s_n, stride_s_h, stride_s_v, stride_s_k,
    stride_rk_n, stride_rk_h, stride_rk_r, stride_rk_k,
    stride_rv_n, stride_rv_h, stride_rv_r, stride_rv_v,
    stride_g_n, stride_g_h, stride_g_r,
    stride_beta_n, stride_beta_h, stride_beta_r,
    stride_rd_n, stride_rd_h, stride_rd_v, stride_rd_k,
    stride_rs_n, stride_rs_h, stride_rs_v,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, RL: tl.constexpr, USE_QK_L2NORM: tl.constexpr, HAS_READ: tl.constexpr,
    READ_FP8: tl.constexpr, SR: tl.constexpr, BLOCK_B: tl.constexpr, HEAD_ITEMS: tl.constexpr,
):  # fmt: skip
    """The work-list launch: the ``n`` flush rows (counted here, every program alike) give
    ``n · HV`` (row, head) items of all the head's value tiles when that is at least
    ``HEAD_ITEMS`` per program, else ``n · HV · tiles`` items of one tile (a few rows' folds
    spread over every program); program ``z`` takes items ``z, z + P, ...`` (``P`` programs).
    Item ``w``'s row is the ``w // (HV · groups)``-th flush row in batch order (a rank over the
    flush flags, recomputed per item so nothing batch-sized stays live across the fold)."""
    NT: tl.constexpr = (V + BV - 1) // BV
    n_flush = tl.sum(_flush_rows(slot_idx, flush, batch, BLOCK_B), 0)
    n_prog = tl.num_programs(0)
    if n_flush * HV >= HEAD_ITEMS * n_prog:  # (row, head) items
        _work_items(
            state, ring_k, ring_v, ring_g, ring_beta, slot_idx, ring_start, ring_len, flush,
            read_ptr, read_scale_ptr, sr_seed, R, sr_layer, batch, n_flush, n_prog,
            stride_s_n, stride_s_h, stride_s_v, stride_s_k,
            stride_rk_n, stride_rk_h, stride_rk_r, stride_rk_k,
            stride_rv_n, stride_rv_h, stride_rv_r, stride_rv_v,
            stride_g_n, stride_g_h, stride_g_r,
            stride_beta_n, stride_beta_h, stride_beta_r,
            stride_rd_n, stride_rd_h, stride_rd_v, stride_rd_k,
            stride_rs_n, stride_rs_h, stride_rs_v,
            H, HV, K, V, BK, BV, RL, USE_QK_L2NORM, HAS_READ, READ_FP8, SR, BLOCK_B, NT,
        )  # fmt: skip
    else:  # one-tile items
        _work_items(
            state, ring_k, ring_v, ring_g, ring_beta, slot_idx, ring_start, ring_len, flush,
            read_ptr, read_scale_ptr, sr_seed, R, sr_layer, batch, n_flush, n_prog,
            stride_s_n, stride_s_h, stride_s_v, stride_s_k,
            stride_rk_n, stride_rk_h, stride_rk_r, stride_rk_k,
            stride_rv_n, stride_rv_h, stride_rv_r, stride_rv_v,
            stride_g_n, stride_g_h, stride_g_r,
            stride_beta_n, stride_beta_h, stride_beta_r,
            stride_rd_n, stride_rd_h, stride_rd_v, stride_rd_k,
            stride_rs_n, stride_rs_h, stride_rs_v,
            H, HV, K, V, BK, BV, RL, USE_QK_L2NORM, HAS_READ, READ_FP8, SR, BLOCK_B, 1,
        )  # fmt: skip


@triton.jit
def _work_items(
    state, ring_k, ring_v, ring_g, ring_beta, slot_idx, ring_start, ring_len, flush,
    read_ptr, read_scale_ptr, sr_seed, R, sr_layer, batch, n_flush, n_prog,
    stride_s_n, stride_s_h, stride_s_v, stride_s_k,
    stride_rk_n, stride_rk_h, stride_rk_r, stride_rk_k,
    stride_rv_n, stride_rv_h, stride_rv_r, stride_rv_v,
    stride_g_n, stride_g_h, stride_g_r,
    stride_beta_n, stride_beta_h, stride_beta_r,
    stride_rd_n, stride_rd_h, stride_rd_v, stride_rd_k,
    stride_rs_n, stride_rs_h, stride_rs_v,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, RL: tl.constexpr, USE_QK_L2NORM: tl.constexpr, HAS_READ: tl.constexpr,
    READ_FP8: tl.constexpr, SR: tl.constexpr, BLOCK_B: tl.constexpr, TILES: tl.constexpr,
):  # fmt: skip
    """This program's items of ``TILES`` value tiles each (the tile count a constant, as in the
    program grid): items ``z, z + P, ...`` of the ``n_flush · HV · groups``."""
    NT: tl.constexpr = (V + BV - 1) // BV
    GROUPS: tl.constexpr = NT // TILES
    per_row = HV * GROUPS
    for w in range(tl.program_id(0), n_flush * per_row, n_prog):
        rank = w // per_row
        i_hv = (w % per_row) // GROUPS
        i_g = w % GROUPS
        incl = tl.cumsum(_flush_rows(slot_idx, flush, batch, BLOCK_B), 0)
        i_n = tl.sum((incl <= rank).to(tl.int32), 0)
        i_s = tl.load(slot_idx + i_n).to(tl.int64)
        _fold_head_tiles(
            state, ring_k, ring_v, ring_g, ring_beta, ring_start, ring_len, read_ptr,
            read_scale_ptr, sr_seed, R, sr_layer, i_n, i_s, i_hv, i_g, TILES,
            stride_s_n, stride_s_h, stride_s_v, stride_s_k,
            stride_rk_n, stride_rk_h, stride_rk_r, stride_rk_k,
            stride_rv_n, stride_rv_h, stride_rv_r, stride_rv_v,
            stride_g_n, stride_g_h, stride_g_r,
            stride_beta_n, stride_beta_h, stride_beta_r,
            stride_rd_n, stride_rd_h, stride_rd_v, stride_rd_k,
            stride_rs_n, stride_rs_h, stride_rs_v,
            H, HV, K, V, BK, BV, RL, USE_QK_L2NORM, HAS_READ, READ_FP8, SR,
        )  # fmt: skip


@triton.jit
def _fold_head_tiles(
    state, ring_k, ring_v, ring_g, ring_beta, ring_start, ring_len, read_ptr, read_scale_ptr,
    sr_seed, R, sr_layer, i_n, i_s, i_hv, i_g,
    TILES: tl.constexpr,
    stride_s_n, stride_s_h, stride_s_v, stride_s_k,
    stride_rk_n, stride_rk_h, stride_rk_r, stride_rk_k,
    stride_rv_n, stride_rv_h, stride_rv_r, stride_rv_v,
    stride_g_n, stride_g_h, stride_g_r,
    stride_beta_n, stride_beta_h, stride_beta_r,
    stride_rd_n, stride_rd_h, stride_rd_v, stride_rd_k,
    stride_rs_n, stride_rs_h, stride_rs_v,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, RL: tl.constexpr, USE_QK_L2NORM: tl.constexpr, HAS_READ: tl.constexpr,
    READ_FP8: tl.constexpr, SR: tl.constexpr,
):  # fmt: skip
    """Fold value tiles ``i_g · TILES .. + TILES - 1`` of head ``i_hv`` of flush row ``i_n``
    (slot ``i_s``) one after another.  ``RL > 0`` (``K <= 128``): the decode kernel's tree-form
    fold with ``RL`` rows on lanes (``_tree.flush_tree`` without a current token); ``RL = 0``:
    the fold on SGLang's tile (``fold_records``)."""
    i_h = i_hv // (HV // H)
    r_start = tl.load(ring_start + i_n).to(tl.int32)
    r_len = tl.load(ring_len + i_n).to(tl.int32)

    p_s_head = state + i_s * stride_s_n + i_hv * stride_s_h
    p_rk = ring_k + i_s * stride_rk_n + i_h * stride_rk_h
    p_rv = ring_v + i_s * stride_rv_n + i_hv * stride_rv_h
    p_rg = ring_g + i_s * stride_g_n + i_hv * stride_g_h
    p_rb = ring_beta + i_s * stride_beta_n + i_hv * stride_beta_h
    p_rd = read_ptr
    p_rs = read_scale_ptr
    if HAS_READ:
        p_rd = read_ptr + i_s * stride_rd_n + i_hv * stride_rd_h
        if READ_FP8:
            p_rs = read_scale_ptr + i_s * stride_rs_n + i_hv * stride_rs_h
    for i_t in range(TILES):
        i_v = i_g * TILES + i_t
        if RL > 0:
            flush_tree(
                state, p_s_head, p_rk, p_rv, p_rg, p_rb, None, None, None, None, p_rd, p_rs,
                sr_seed, sr_layer, i_s, i_hv, i_v, r_start, r_len, R, 0.0, 0.0, 0.0,
                stride_s_v, stride_s_k, stride_rk_r, stride_rk_k, stride_rv_r, stride_rv_v,
                stride_g_r, stride_beta_r, 0, 0, 0, 0, stride_rd_v, stride_rd_k, stride_rs_v,
                K, V, BK, BV, RL, USE_QK_L2NORM, HAS_READ, READ_FP8, SR, tl.float32, False,
            )  # fmt: skip
        else:
            _fold_sglang_tile(
                state, p_s_head, p_rk, p_rv, p_rg, p_rb, p_rd, p_rs, sr_seed, sr_layer, i_s, i_hv,
                i_v, r_start, r_len, R, stride_s_v, stride_s_k, stride_rk_r, stride_rk_k,
                stride_rv_r, stride_rv_v, stride_g_r, stride_beta_r, stride_rd_v, stride_rd_k,
                stride_rs_v, K, V, BK, BV, USE_QK_L2NORM, HAS_READ, READ_FP8, SR,
            )  # fmt: skip


@triton.jit
def _fold_sglang_tile(
    state, p_s_head, p_rk, p_rv, p_rg, p_rb, p_rd, p_rs, sr_seed, sr_layer, i_s, i_hv, i_v,
    r_start, r_len, R, stride_s_v, stride_s_k, stride_rk_r, stride_rk_k, stride_rv_r,
    stride_rv_v, stride_g_r, stride_beta_r, stride_rd_v, stride_rd_k, stride_rs_v,
    K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr, HAS_READ: tl.constexpr, READ_FP8: tl.constexpr,
    SR: tl.constexpr,
):  # fmt: skip
    """``K > 128``: fold records ``[0, r_len)`` into the ``[BV, BK]`` tile of rows ``i_v·BV ..``
    on SGLang's packed-decode tile, store it once and refresh the read copy from it."""
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    mask_k = o_k < K
    mask_v = o_v < V
    mask_h = mask_v[:, None] & mask_k[None, :]
    p_s = p_s_head + o_v[:, None] * stride_s_v + o_k[None, :] * stride_s_k

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
        # Refresh the copy from the checkpoint as stored (masked lanes of b_h are zeros). Copy
        # accesses are declared contiguous only in runs of the checkpoint's 16-byte vector, so
        # the copy's stores take the checkpoint tile's layout instead of a wider one of their own,
        # which would spread to the fold and change its reduction trees.
        o_kr = tl.max_contiguous(o_k, 128 // state.dtype.element_ty.primitive_bitwidth)
        store_read_tile(b_h, p_rd, p_rs, o_v, o_kr, mask_v, mask_k, stride_rd_v, stride_rd_k,
                        stride_rs_v, READ_FP8)


@triton.jit(do_not_specialize=["sr_layer", "batch"])
def gdn_verify_fold_kernel(
    state, ring_k, ring_v, ring_g, ring_beta, slot_idx, ring_start, ring_len, flush, sr_seed,
    R, sr_layer, batch,
    stride_s_n, stride_s_h, stride_s_v, stride_s_k,
    stride_rk_n, stride_rk_h, stride_rk_r, stride_rk_k,
    stride_rv_n, stride_rv_h, stride_rv_r, stride_rv_v,
    stride_g_n, stride_g_h, stride_g_r,
    stride_beta_n, stride_beta_h, stride_beta_r,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, RL: tl.constexpr, USE_QK_L2NORM: tl.constexpr, TILES: tl.constexpr,
    WORK_LIST: tl.constexpr, BLOCK_B: tl.constexpr, HEAD_ITEMS: tl.constexpr,
    SR: tl.constexpr = False,
):  # fmt: skip
    """The fold launch without a read copy (see the module docstring)."""
    _fold_program(
        state, ring_k, ring_v, ring_g, ring_beta, slot_idx, ring_start, ring_len, flush,
        None, None, sr_seed, R, sr_layer, batch,
        stride_s_n, stride_s_h, stride_s_v, stride_s_k,
        stride_rk_n, stride_rk_h, stride_rk_r, stride_rk_k,
        stride_rv_n, stride_rv_h, stride_rv_r, stride_rv_v,
        stride_g_n, stride_g_h, stride_g_r,
        stride_beta_n, stride_beta_h, stride_beta_r,
        0, 0, 0, 0, 0, 0, 0,
        H, HV, K, V, BK, BV, RL, USE_QK_L2NORM, False, False, SR, TILES, WORK_LIST, BLOCK_B,
        HEAD_ITEMS,
    )  # fmt: skip


@triton.jit(do_not_specialize=["sr_layer", "batch"])
def gdn_verify_fold_read_kernel(
    state, ring_k, ring_v, ring_g, ring_beta, slot_idx, ring_start, ring_len, flush,
    read_ptr, read_scale_ptr, sr_seed, R, sr_layer, batch,
    stride_s_n, stride_s_h, stride_s_v, stride_s_k,
    stride_rk_n, stride_rk_h, stride_rk_r, stride_rk_k,
    stride_rv_n, stride_rv_h, stride_rv_r, stride_rv_v,
    stride_g_n, stride_g_h, stride_g_r,
    stride_beta_n, stride_beta_h, stride_beta_r,
    stride_rd_n, stride_rd_h, stride_rd_v, stride_rd_k,
    stride_rs_n, stride_rs_h, stride_rs_v,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, RL: tl.constexpr, USE_QK_L2NORM: tl.constexpr, READ_FP8: tl.constexpr,
    TILES: tl.constexpr, WORK_LIST: tl.constexpr, BLOCK_B: tl.constexpr,
    HEAD_ITEMS: tl.constexpr, SR: tl.constexpr = False,
):  # fmt: skip
    """The fold launch with a split-precision read copy (``read_ptr``, fp8 scales
    ``read_scale_ptr``), rewritten from the stored tile."""
    _fold_program(
        state, ring_k, ring_v, ring_g, ring_beta, slot_idx, ring_start, ring_len, flush,
        read_ptr, read_scale_ptr, sr_seed, R, sr_layer, batch,
        stride_s_n, stride_s_h, stride_s_v, stride_s_k,
        stride_rk_n, stride_rk_h, stride_rk_r, stride_rk_k,
        stride_rv_n, stride_rv_h, stride_rv_r, stride_rv_v,
        stride_g_n, stride_g_h, stride_g_r,
        stride_beta_n, stride_beta_h, stride_beta_r,
        stride_rd_n, stride_rd_h, stride_rd_v, stride_rd_k,
        stride_rs_n, stride_rs_h, stride_rs_v,
        H, HV, K, V, BK, BV, RL, USE_QK_L2NORM, True, READ_FP8, SR, TILES, WORK_LIST, BLOCK_B,
        HEAD_ITEMS,
    )  # fmt: skip
