"""Gated DeltaNet ReplaySSM decode: one Triton launch for a mixed flush / non-flush batch.

Layers (fla style): ``gdn_replay_decode_fwd_kernel`` (Triton jit), ``gdn_replay_decode_fwd``
(launcher, no checks), ``gdn_replay_decode`` (validated public function).

Launch layout: grid ``(cdiv(V, BV), HV, batch)``, one warp per program; a program owns one
``[BV, K]`` tile of one value head's checkpoint, so the checkpoint is read exactly once per row and
head and the flush writes it exactly once.  Per row the program branches on ``flush[b]``:

* flush: the exact fold.  Records ``[0, len)`` and then the current token are replayed into the
  checkpoint tile from the raw inputs (pre-norm k, raw v, g, β), with the same expressions, the same
  tile shape ``[32, next_pow2(K)]`` and the same warp count as SGLang's
  ``fused_recurrent_gated_delta_rule_packed_decode_kernel``, so each step compiles to the same
  reductions (layouts) and the same fp32 operations; the tile is stored once (a 16-bit state is
  rounded once per flush: to nearest, or for an fp16 state with ``SR`` stochastically,
  ``stochastic_round.py``).
* non-flush: the inner-product form (math.md §4).  ``S_w`` is never built: one pass over the
  checkpoint tile gives ``S0·k̂_c`` and ``S0·q̃_c``; the records add
  ``Σ_j ω_j (k̂_j·k̂_c) u_j`` and ``Σ_j ω_j (k̂_j·q̃_c) u_j``, where ``ω_j = exp(Σ_{i>j} g_i)``.
  That costs ``O(R·(K + BV))`` per program instead of the ``O(R·BV·K)`` of rebuilding ``S_w`` in
  registers (SGLang's built-in ReplaySSM kernel), and it is plain fp32 (no TF32 / bf16 dot).  The
  current record ``(u_c, raw k_c, raw v_c, g_c, β_c)`` is appended at physical row
  ``(start + len) % R``; the checkpoint is not written.

Not autotuned: the kernel writes the checkpoint in place.  No host sync; CUDA-graph safe (all
per-row decisions are read on the device).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_kernels.gdn_decode._fold import fold_records
from replayssm_kernels.gdn_decode._tree import flush_tree, nonflush_rows
from replayssm_kernels.gdn_decode._validate import validate_gdn_decode
from replayssm_kernels.mamba2_decode.read_copy import store_read_tile, validate_read_copy
from replayssm_kernels.stochastic_round import (
    sr_key,
    sr_round_fp16,
    validate_stochastic_rounding,
)

__all__ = [
    "gdn_replay_decode",
    "gdn_replay_decode_fwd",
    "gdn_replay_decode_fwd_kernel",
    "gdn_replay_decode_read_fwd_kernel",
    "gdn_replay_decode_tree_fwd_kernel",
]


@triton.jit
def _gdn_decode_program(
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
    read_ptr,
    read_scale_ptr,
    sr_seed,
    # Matrix dimensions
    R,
    sr_layer,
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
    stride_q_h,
    stride_q_k,
    stride_k_b,
    stride_k_h,
    stride_k_k,
    stride_v_b,
    stride_v_h,
    stride_v_v,
    stride_a_b,
    stride_a_h,
    stride_b_b,
    stride_b_h,
    stride_o_b,
    stride_o_h,
    stride_o_v,
    stride_rd_n,
    stride_rd_h,
    stride_rd_v,
    stride_rd_k,
    stride_rs_n,
    stride_rs_h,
    stride_rs_v,
    # Meta-parameters
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BR: tl.constexpr,
    SOFTPLUS_THRESHOLD: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    MODE: tl.constexpr,
    HAS_READ: tl.constexpr,
    READ_FP8: tl.constexpr,
    SR: tl.constexpr,
    FOLD: tl.constexpr,
    NFL: tl.constexpr,
):
    """One program of the decode launch (kernels below); ``HAS_READ``: split precision, non-flush
    rows read ``S0`` from the read copy (``read_ptr``, fp8: times ``read_scale_ptr``'s per-row
    scale) and flush rows refresh it after storing the checkpoint.  ``SR``: flush rows store the
    fp16 checkpoint with stochastic rounding (``sr_seed`` counter, ``sr_layer`` stream).
    ``FOLD``: 0, the flush rows' fold on SGLang's tile (``_fold.fold_records``); ``RL`` > 0, the
    same arithmetic with the reduction tree spelled out, ``RL`` rows on lanes (``_tree.py``).
    ``NFL``: 0, the non-flush rows' code below; ``RL`` > 0, ``_tree.nonflush_rows`` (the same
    outputs, summed rows-on-lanes)."""
    # MODE 0: one launch serves every row (both branches).  MODE 1: flush rows only (the fold;
    # other rows return at once).  MODE 2: non-flush rows only (flush rows return at once).
    i_v, i_hv, i_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (HV // H)
    if MODE != 0:
        # Split launches: the row's flush bit is the first thing read, so the rows this launch
        # does not serve cost one scalar load.
        is_flush0 = tl.load(flush + i_n).to(tl.int32) != 0
        if MODE == 1:
            if not is_flush0:
                return
        else:
            if is_flush0:
                return

    # Every per-row scalar is requested at once (one memory round trip); padding rows read their
    # own (unused) cursor and gate entries, which exist since they are batch-shaped.
    i_s = tl.load(slot_idx + i_n).to(tl.int64)
    r_start = tl.load(ring_start + i_n).to(tl.int32)
    r_len = tl.load(ring_len + i_n).to(tl.int32)
    if MODE == 0:
        is_flush = tl.load(flush + i_n).to(tl.int32) != 0
    elif MODE == 1:
        is_flush: tl.constexpr = True
    else:
        is_flush: tl.constexpr = False
    a_val = tl.load(a + i_n * stride_a_b + i_hv * stride_a_h).to(tl.float32)
    b_val = tl.load(b + i_n * stride_b_b + i_hv * stride_b_h).to(tl.float32)
    A_log_val = tl.load(A_log + i_hv).to(tl.float32)
    dt_bias_val = tl.load(dt_bias + i_hv).to(tl.float32)

    # Padding row: touches nothing, not even its output row.
    if i_s < 0:
        return

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    mask_k = o_k < K
    mask_v = o_v < V
    mask_h = mask_v[:, None] & mask_k[None, :]
    o_kr = o_k
    if HAS_READ:
        # Copy accesses are declared contiguous only in runs of the checkpoint's 16-byte vector,
        # so the copy's loads and stores take the checkpoint tile's layout ([1, 4] x [1, 32] per
        # warp for fp32) instead of a wider one of their own (bf16: [1, 8] x [2, 16]), which would
        # spread to the fold and change its reduction trees (test_fold_codegen_matches_sglang
        # compiles the copy variants too).
        o_kr = tl.max_contiguous(o_k, 128 // state.dtype.element_ty.primitive_bitwidth)

    # Gates of the current token: the conventional kernel's expressions, so g and β (stored in
    # the ring and replayed by a later flush) carry the bits that kernel would have used.
    x = a_val + dt_bias_val
    softplus_x = tl.where(x <= SOFTPLUS_THRESHOLD, tl.log(1.0 + tl.exp(x)), x)
    g_val = -tl.exp(A_log_val) * softplus_x
    beta_val = tl.sigmoid(b_val).to(b.dtype.element_ty).to(tl.float32)

    p_s = (
        state
        + i_s * stride_s_n
        + i_hv * stride_s_h
        + o_v[:, None] * stride_s_v
        + o_k[None, :] * stride_s_k
    )
    p_q = q + i_n * stride_q_b + i_h * stride_q_h + o_k * stride_q_k
    p_k = k + i_n * stride_k_b + i_h * stride_k_h + o_k * stride_k_k
    p_v = v + i_n * stride_v_b + i_hv * stride_v_h + o_v * stride_v_v
    p_o = o + i_n * stride_o_b + i_hv * stride_o_h + o_v * stride_o_v
    p_rk = ring_k + i_s * stride_rk_n + i_h * stride_rk_h
    p_rv = ring_v + i_s * stride_rv_n + i_hv * stride_rv_h
    p_ru = ring_u + i_s * stride_u_n + i_hv * stride_u_h
    p_rg = ring_g + i_s * stride_g_n + i_hv * stride_g_h
    p_rb = ring_beta + i_s * stride_beta_n + i_hv * stride_beta_h

    if is_flush:
        if FOLD != 0:
            # ---- Exact fold, tree form (_tree.py): the default's arithmetic, element for element.
            tl.static_assert(not HAS_READ, "FOLD > 0 has no read-copy path")
            flush_tree(
                state, state + i_s * stride_s_n + i_hv * stride_s_h, p_rk, p_rv, p_rg, p_rb,
                q + i_n * stride_q_b + i_h * stride_q_h, k + i_n * stride_k_b + i_h * stride_k_h,
                v + i_n * stride_v_b + i_hv * stride_v_h, o + i_n * stride_o_b + i_hv * stride_o_h,
                sr_seed, sr_layer, i_s, i_hv, i_v, r_start, r_len, R, g_val, beta_val, scale,
                stride_s_v, stride_s_k, stride_rk_r, stride_rk_k, stride_rv_r, stride_rv_v,
                stride_g_r, stride_beta_r, stride_q_k, stride_k_k, stride_v_v, stride_o_v,
                K, V, BK, BV, FOLD, USE_QK_L2NORM, SR, o.dtype.element_ty,
            )  # fmt: skip
        else:
            # ---- Exact fold: the arithmetic mirrors the conventional packed-decode kernel. ----
            b_h = tl.load(p_s, mask=mask_h, other=0).to(tl.float32)
            b_h = fold_records(
                b_h, p_rk, p_rv, p_rg, p_rb, r_start, r_len, R, o_k, o_v, mask_k, mask_v,
                stride_rk_r, stride_rk_k, stride_rv_r, stride_rv_v, stride_g_r, stride_beta_r,
                USE_QK_L2NORM,
            )
            # The current token, then the output from the folded state.
            b_q = tl.load(p_q, mask=mask_k, other=0).to(tl.float32)
            b_k = tl.load(p_k, mask=mask_k, other=0).to(tl.float32)
            b_v = tl.load(p_v, mask=mask_v, other=0).to(tl.float32)
            if USE_QK_L2NORM:
                b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
                b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
            b_q = b_q * scale
            b_h *= tl.exp(g_val)
            b_v -= tl.sum(b_h * b_k[None, :], 1)
            b_v *= beta_val
            b_h += b_v[:, None] * b_k[None, :]
            b_o = tl.sum(b_h * b_q[None, :], 1)
            tl.store(p_o, b_o.to(o.dtype.element_ty), mask=mask_v)
            if SR:
                b_st = sr_round_fp16(b_h, sr_key(sr_seed, sr_layer, i_s),
                                     (i_hv * V + o_v[:, None]) * K + o_k[None, :])
            else:
                b_st = b_h.to(state.dtype.element_ty)
            tl.store(p_s, b_st, mask=mask_h)
            if HAS_READ:
                p_rs_head = read_scale_ptr
                if READ_FP8:
                    p_rs_head = read_scale_ptr + i_s * stride_rs_n + i_hv * stride_rs_h
                store_read_tile(
                    b_st, read_ptr + i_s * stride_rd_n + i_hv * stride_rd_h,
                    p_rs_head, o_v, o_kr, mask_v, mask_k, stride_rd_v, stride_rd_k, stride_rs_v,
                    READ_FP8,
                )
    elif NFL != 0:
        tl.static_assert(not HAS_READ, "NFL > 0 has no read-copy path")
        nonflush_rows(
            state + i_s * stride_s_n + i_hv * stride_s_h, p_ru, p_rk, p_rv, p_rg, p_rb,
            q + i_n * stride_q_b + i_h * stride_q_h, k + i_n * stride_k_b + i_h * stride_k_h,
            v + i_n * stride_v_b + i_hv * stride_v_h, o + i_n * stride_o_b + i_hv * stride_o_h,
            i_hv, i_v, r_start, r_len, R, g_val, beta_val, scale,
            stride_s_v, stride_s_k, stride_u_r, stride_u_v, stride_rk_r, stride_rk_k,
            stride_rv_r, stride_rv_v, stride_g_r, stride_beta_r, stride_q_k, stride_k_k,
            stride_v_v, stride_o_v, H, HV, K, V, BK, BV, BR, NFL, USE_QK_L2NORM,
            o.dtype.element_ty, ring_u.dtype.element_ty, ring_k.dtype.element_ty,
            ring_v.dtype.element_ty,
        )  # fmt: skip
    else:
        # ---- Output from S0 + committed records + current token; append the record. ----
        # All loads first (checkpoint tile, the newest chunk of records, the token), then math.
        if HAS_READ:
            # Split precision: the read copy instead of the checkpoint (not read at all).
            p_rd = (read_ptr + i_s * stride_rd_n + i_hv * stride_rd_h
                    + o_v[:, None] * stride_rd_v + o_kr[None, :] * stride_rd_k)
            b_h0 = tl.load(p_rd, mask=mask_h, other=0.0).to(tl.float32)
            if READ_FP8:
                b_rs = tl.load(read_scale_ptr + i_s * stride_rs_n + i_hv * stride_rs_h
                               + o_v * stride_rs_v, mask=mask_v, other=0.0)
        else:
            b_h0 = tl.load(p_s, mask=mask_h, other=0).to(tl.float32)
        n_chunks = tl.cdiv(r_len, BR)
        o_rc = (n_chunks - 1) * BR + tl.arange(0, BR)
        mask_r = (o_rc < r_len) & (o_rc >= 0)
        rows = (r_start + o_rc) % R
        c_g = tl.load(p_rg + rows * stride_g_r, mask=mask_r, other=0.0)
        c_k = tl.load(
            p_rk + rows[:, None] * stride_rk_r + o_k[None, :] * stride_rk_k,
            mask=mask_r[:, None] & mask_k[None, :],
            other=0,
        )
        c_u = tl.load(
            p_ru + rows[:, None] * stride_u_r + o_v[None, :] * stride_u_v,
            mask=mask_r[:, None] & mask_v[None, :],
            other=0,
        )
        b_q_raw = tl.load(p_q, mask=mask_k, other=0)
        b_k_raw = tl.load(p_k, mask=mask_k, other=0)
        b_v_raw = tl.load(p_v, mask=mask_v, other=0)

        b_q = b_q_raw.to(tl.float32)
        b_k = b_k_raw.to(tl.float32)
        b_v = b_v_raw.to(tl.float32)
        if USE_QK_L2NORM:
            b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
            b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
        b_q = b_q * scale
        # Checkpoint: one read, two mat-vecs.
        b_hk = tl.sum(b_h0 * b_k[None, :], 1)
        b_hq = tl.sum(b_h0 * b_q[None, :], 1)
        if READ_FP8:
            b_hk = b_hk * b_rs
            b_hq = b_hq * b_rs

        # Records, newest chunk first, so that ω_j = exp(Σ_{i>j} g_i) is a suffix sum (no
        # cancellation).  With R <= BR (decode) there is exactly one chunk and no loop.
        b_acc_k = tl.zeros([BV], dtype=tl.float32)
        b_acc_q = tl.zeros([BV], dtype=tl.float32)
        b_gsum = tl.sum(tl.zeros([BR], dtype=tl.float32), 0)  # Σ g of the later records
        for i_c in range(0, n_chunks):
            if i_c > 0:
                o_rc = (n_chunks - 1 - i_c) * BR + tl.arange(0, BR)
                mask_r = o_rc < r_len
                rows = (r_start + o_rc) % R
                c_g = tl.load(p_rg + rows * stride_g_r, mask=mask_r, other=0.0)
                c_k = tl.load(
                    p_rk + rows[:, None] * stride_rk_r + o_k[None, :] * stride_rk_k,
                    mask=mask_r[:, None] & mask_k[None, :],
                    other=0,
                )
                c_u = tl.load(
                    p_ru + rows[:, None] * stride_u_r + o_v[None, :] * stride_u_v,
                    mask=mask_r[:, None] & mask_v[None, :],
                    other=0,
                )
            b_w = tl.where(mask_r, tl.exp(tl.cumsum(c_g, 0, reverse=True) - c_g + b_gsum), 0.0)
            b_gsum += tl.sum(c_g, 0)
            b_kr = c_k.to(tl.float32)
            b_kk = tl.sum(b_kr * b_k[None, :], 1)
            b_kq = tl.sum(b_kr * b_q[None, :], 1)
            if USE_QK_L2NORM:
                b_rn = 1.0 / tl.sqrt(tl.sum(b_kr * b_kr, 1) + 1e-6)
                b_kk = b_kk * b_rn
                b_kq = b_kq * b_rn
            b_u = c_u.to(tl.float32)
            b_acc_k += tl.sum(b_u * (b_w * b_kk)[:, None], 0)
            b_acc_q += tl.sum(b_u * (b_w * b_kq)[:, None], 0)

        b_decay = tl.exp(b_gsum)  # e^{G_w}: total decay of the checkpoint
        b_hk = b_decay * b_hk + b_acc_k
        b_hq = b_decay * b_hq + b_acc_q
        b_alpha = tl.exp(g_val)
        b_u_c = beta_val * (b_v - b_alpha * b_hk)
        b_o = b_alpha * b_hq + tl.sum(b_k * b_q) * b_u_c
        tl.store(p_o, b_o.to(o.dtype.element_ty), mask=mask_v)

        # Append the current record at logical row len.
        w_row = (r_start + r_len) % R
        p_uw = p_ru + w_row * stride_u_r + o_v * stride_u_v
        tl.store(p_uw, b_u_c.to(ring_u.dtype.element_ty), mask=mask_v)
        p_vw = p_rv + w_row * stride_rv_r + o_v * stride_rv_v
        tl.store(p_vw, b_v_raw.to(ring_v.dtype.element_ty), mask=mask_v)
        if i_v == 0:
            tl.store(p_rg + w_row * stride_g_r, g_val)
            tl.store(p_rb + w_row * stride_beta_r, beta_val)
            if i_hv % (HV // H) == 0:
                tl.store(
                    p_rk + w_row * stride_rk_r + o_k * stride_rk_k,
                    b_k_raw.to(ring_k.dtype.element_ty),
                    mask=mask_k,
                )


@triton.jit(do_not_specialize=["sr_layer"])
def gdn_replay_decode_fwd_kernel(
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
    sr_seed,
    R,
    sr_layer,
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
    stride_q_h,
    stride_q_k,
    stride_k_b,
    stride_k_h,
    stride_k_k,
    stride_v_b,
    stride_v_h,
    stride_v_v,
    stride_a_b,
    stride_a_h,
    stride_b_b,
    stride_b_h,
    stride_o_b,
    stride_o_h,
    stride_o_v,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BR: tl.constexpr,
    SOFTPLUS_THRESHOLD: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    MODE: tl.constexpr = 0,
    SR: tl.constexpr = False,
):
    """The decode launch without a read copy (see the module docstring)."""
    _gdn_decode_program(
        state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, o,
        slot_idx, ring_start, ring_len, flush, scale, None, None, sr_seed, R, sr_layer,
        stride_s_n, stride_s_h,
        stride_s_v, stride_s_k, stride_u_n, stride_u_h, stride_u_r, stride_u_v, stride_rk_n,
        stride_rk_h, stride_rk_r, stride_rk_k, stride_rv_n, stride_rv_h, stride_rv_r, stride_rv_v,
        stride_g_n, stride_g_h, stride_g_r, stride_beta_n, stride_beta_h, stride_beta_r,
        stride_q_b, stride_q_h, stride_q_k, stride_k_b, stride_k_h, stride_k_k, stride_v_b,
        stride_v_h, stride_v_v, stride_a_b, stride_a_h, stride_b_b, stride_b_h, stride_o_b,
        stride_o_h, stride_o_v, 0, 0, 0, 0, 0, 0, 0, H, HV, K, V, BK, BV, BR, SOFTPLUS_THRESHOLD,
        USE_QK_L2NORM, MODE, False, False, SR, 0, 0,
    )


@triton.jit(do_not_specialize=["sr_layer"])
def gdn_replay_decode_tree_fwd_kernel(
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
    sr_seed,
    R,
    sr_layer,
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
    stride_q_h,
    stride_q_k,
    stride_k_b,
    stride_k_h,
    stride_k_k,
    stride_v_b,
    stride_v_h,
    stride_v_v,
    stride_a_b,
    stride_a_h,
    stride_b_b,
    stride_b_h,
    stride_o_b,
    stride_o_h,
    stride_o_v,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BR: tl.constexpr,
    SOFTPLUS_THRESHOLD: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    MODE: tl.constexpr,
    SR: tl.constexpr,
    FOLD: tl.constexpr,
    NFL: tl.constexpr,
):
    """The decode launch without a read copy, with the flush rows folded in tree form
    (``FOLD = RL`` rows on lanes) and / or the non-flush rows summed rows-on-lanes (``NFL``),
    ``_tree.py``; benchmark variants (``FOLD = NFL = 0`` compiles the default program)."""
    _gdn_decode_program(
        state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, o,
        slot_idx, ring_start, ring_len, flush, scale, None, None, sr_seed, R, sr_layer,
        stride_s_n, stride_s_h,
        stride_s_v, stride_s_k, stride_u_n, stride_u_h, stride_u_r, stride_u_v, stride_rk_n,
        stride_rk_h, stride_rk_r, stride_rk_k, stride_rv_n, stride_rv_h, stride_rv_r, stride_rv_v,
        stride_g_n, stride_g_h, stride_g_r, stride_beta_n, stride_beta_h, stride_beta_r,
        stride_q_b, stride_q_h, stride_q_k, stride_k_b, stride_k_h, stride_k_k, stride_v_b,
        stride_v_h, stride_v_v, stride_a_b, stride_a_h, stride_b_b, stride_b_h, stride_o_b,
        stride_o_h, stride_o_v, 0, 0, 0, 0, 0, 0, 0, H, HV, K, V, BK, BV, BR, SOFTPLUS_THRESHOLD,
        USE_QK_L2NORM, MODE, False, False, SR, FOLD, NFL,
    )


@triton.jit(do_not_specialize=["sr_layer"])
def gdn_replay_decode_read_fwd_kernel(
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
    read_ptr,
    read_scale_ptr,
    sr_seed,
    R,
    sr_layer,
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
    stride_q_h,
    stride_q_k,
    stride_k_b,
    stride_k_h,
    stride_k_k,
    stride_v_b,
    stride_v_h,
    stride_v_v,
    stride_a_b,
    stride_a_h,
    stride_b_b,
    stride_b_h,
    stride_o_b,
    stride_o_h,
    stride_o_v,
    stride_rd_n,
    stride_rd_h,
    stride_rd_v,
    stride_rd_k,
    stride_rs_n,
    stride_rs_h,
    stride_rs_v,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BR: tl.constexpr,
    SOFTPLUS_THRESHOLD: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    MODE: tl.constexpr,
    READ_FP8: tl.constexpr,
    SR: tl.constexpr = False,
):
    """The decode launch with a split-precision read copy (``read_ptr``, fp8 scales
    ``read_scale_ptr``)."""
    _gdn_decode_program(
        state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, o,
        slot_idx, ring_start, ring_len, flush, scale, read_ptr, read_scale_ptr, sr_seed, R,
        sr_layer, stride_s_n,
        stride_s_h, stride_s_v, stride_s_k, stride_u_n, stride_u_h, stride_u_r, stride_u_v,
        stride_rk_n, stride_rk_h, stride_rk_r, stride_rk_k, stride_rv_n, stride_rv_h, stride_rv_r,
        stride_rv_v, stride_g_n, stride_g_h, stride_g_r, stride_beta_n, stride_beta_h,
        stride_beta_r, stride_q_b, stride_q_h, stride_q_k, stride_k_b, stride_k_h, stride_k_k,
        stride_v_b, stride_v_h, stride_v_v, stride_a_b, stride_a_h, stride_b_b, stride_b_h,
        stride_o_b, stride_o_h, stride_o_v, stride_rd_n, stride_rd_h, stride_rd_v, stride_rd_k,
        stride_rs_n, stride_rs_h, stride_rs_v, H, HV, K, V, BK, BV, BR, SOFTPLUS_THRESHOLD,
        USE_QK_L2NORM, MODE, True, READ_FP8, SR, 0, 0,
    )


def gdn_replay_decode_fwd(
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
    split: bool | str = False,
    out_block_v: int = 32,
    out_num_warps: int = 4,
    read_state: torch.Tensor | None = None,
    read_scale: torch.Tensor | None = None,
    sr_seed: torch.Tensor | None = None,
    sr_layer: int = 0,
    fold: int = 0,
    nonflush: int = 0,
) -> None:
    """Launch the kernel without checks (callers: the validated wrapper, benchmarks).

    ``block_v=32, num_warps=1`` is the tile and warp count of SGLang's packed decode; the bitwise
    checkpoint claim is made for this configuration only (another tile changes the compiled
    reduction trees of the fold).

    ``split=True`` (default): two launches on the same rows, each data-driven (no host sync,
    CUDA-graph safe): the fold (``MODE=1``, ``block_v`` / ``num_warps`` as above; non-flush rows
    return after one scalar load) and the non-flush outputs (``MODE=2``, tile ``out_block_v``
    rows with ``out_num_warps`` warps, free of the fold's layout; flush rows return at once).
    ``split=False``: the single launch ``MODE=0`` with both branches (``block_v`` / ``num_warps``).

    ``read_state`` (and ``read_scale`` for fp8): split precision, launched as
    ``gdn_replay_decode_read_fwd_kernel`` (same program, read-copy code compiled in).
    ``sr_seed`` (fp16 ``state``): stochastic rounding of the flush store (``SR`` compiled in).

    ``fold`` (benchmark variants, not used by the server yet): ``0`` the default fold;
    ``8`` / ``16`` / ``32`` the tree-form fold (``_tree.py``: the same fp32 operations, with
    SGLang's reduction tree written out and ``fold`` rows on lanes; ``K <= 128``, no read copy,
    ``fold <= block_v``).  It applies to the flush rows of the one launch and of the split's fold
    launch.
    """
    batch, Hk, K = q.shape
    HV, V = state.shape[1], state.shape[2]
    R = ring_k.shape[2]
    if batch == 0:
        return
    BK = triton.next_power_of_2(K)
    BR = min(triton.next_power_of_2(R), block_r)
    kernel = gdn_replay_decode_fwd_kernel
    read_args: tuple = ()
    read_strides: tuple = ()
    meta = dict(H=Hk, HV=HV, K=K, V=V, BK=BK, BR=BR, SOFTPLUS_THRESHOLD=20.0,
                USE_QK_L2NORM=use_qk_l2norm, SR=sr_seed is not None, num_stages=1)  # fmt: skip
    if fold:
        if fold not in (8, 16, 32) or fold > min(triton.next_power_of_2(V), block_v):
            raise ValueError(f"fold must be 0, 8, 16 or 32 and <= block_v, got {fold}")
    if nonflush:
        nf_bv = out_block_v if split else block_v
        if nonflush not in (4, 8, 16) or nonflush > min(triton.next_power_of_2(V), nf_bv):
            raise ValueError(f"nonflush must be 0, 4, 8 or 16 and <= the block, got {nonflush}")
    if fold or nonflush:
        if BK > 128 or read_state is not None:
            raise ValueError("fold / nonflush > 0 need K <= 128 and no read copy")
        kernel = gdn_replay_decode_tree_fwd_kernel
    if read_state is not None:
        kernel = gdn_replay_decode_read_fwd_kernel
        read_args = (read_state, read_scale)
        read_strides = (*read_state.stride(),
                        *(read_scale.stride() if read_scale is not None else (0, 0, 0)))
        meta["READ_FP8"] = read_scale is not None
    args = (
        state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, out,
        slot_idx, ring_start, ring_len, flush, float(scale), *read_args, sr_seed, R, sr_layer,
        *state.stride(), *ring_u.stride(), *ring_k.stride(), *ring_v.stride(),
        *ring_g.stride(), *ring_beta.stride(), *q.stride(), *k.stride(), *v.stride(),
        *a.stride(), *b.stride(), *out.stride(), *read_strides,
    )  # fmt: skip
    launches = [(1, block_v, num_warps), (2, out_block_v, out_num_warps)] if split else [
        (0, block_v, num_warps)]
    if split in ("fold", "out"):  # benchmarks only: time one of the two launches
        launches = launches[:1] if split == "fold" else launches[1:]
    for mode, bv, nw in launches:
        BV = min(triton.next_power_of_2(V), bv)
        grid = (triton.cdiv(V, BV), HV, batch)
        kern, extra = kernel, {}
        if kernel is gdn_replay_decode_tree_fwd_kernel:
            extra = dict(FOLD=fold if mode != 2 else 0, NFL=nonflush if mode != 1 else 0)
            if not extra["FOLD"] and not extra["NFL"]:  # this launch is the default program
                kern, extra = gdn_replay_decode_fwd_kernel, {}
        kern[grid](*args, BV=BV, MODE=mode, num_warps=nw, **meta, **extra)


def gdn_replay_decode(
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
    """One Gated DeltaNet ReplaySSM decode step for a batch of rows (one token per row).

    Per row ``b`` with slot ``s = slot_idx[b]`` (``-1``: padding, touches nothing, ``out[b]``
    untouched) and cursor snapshot ``(ring_start[b], ring_len[b], flush[b])`` from
    ``replayssm_kernels.cursors.decode_cursor_step``:

    * non-flush: ``out[b]`` from the checkpoint ``state[s]``, the committed records
      ``[0, ring_len[b])`` and the current token (inner-product form, math.md §4); the record
      ``(u, raw k, raw v, g, β)`` of the current token is written at physical ring row
      ``(ring_start[b] + ring_len[b]) % R``.  ``state[s]`` is not written.
    * flush: the records and then the current token are folded sequentially into ``state[s]``
      from the raw inputs, in the conventional packed-decode kernel's fp32 op order, and
      ``state[s]`` is written once (a 16-bit state is rounded once); ``out[b]`` is read from the
      folded state.  No record is written.

    Split precision (optional ``read_state``): non-flush rows read ``S0`` from the read copy
    ``read_state[s]`` (the checkpoint is not read); flush rows fold into ``state[s]`` exactly as
    without a copy, then refresh ``read_state[s]`` (and ``read_scale[s]``) from the checkpoint as
    stored (``replayssm_kernels.mamba2_decode.read_copy``, rows = V, scaled over K).

    Stochastic rounding (optional ``sr_seed``, fp16 ``state`` only): flush rows store the folded
    fp32 state with unbiased stochastic rounding instead of round to nearest, bits keyed by
    ``(sr_seed[0], sr_layer, s)`` and the element's index in ``[HV, V, K]``
    (``replayssm_kernels.stochastic_round``); the fold and the outputs are unchanged, and a read
    copy is refreshed from the value as stored.  Without ``sr_seed`` the SR code is compiled out.

    Value head ``hv`` uses key head ``hv // (HV // Hk)``.

    Parameters
    ----------
    state : torch.Tensor
        ``[slots, HV, V, K]`` checkpoint, fp32 / fp16 / bf16, any strides (e.g. one layer's view
        of SGLang's ``temporal`` pool).  Updated in place on flush rows only.
    ring_u : torch.Tensor
        ``[slots, HV, R, V]`` corrected updates u, ``v.dtype`` or fp32.  Updated in place.
    ring_k : torch.Tensor
        ``[slots, Hk, R, K]`` raw (pre-norm) keys, ``k.dtype``.  Updated in place.
    ring_v : torch.Tensor
        ``[slots, HV, R, V]`` raw values, ``v.dtype``.  Updated in place.
    ring_g : torch.Tensor
        ``[slots, HV, R]`` fp32 log-gates g = −exp(A_log)·softplus(a + dt_bias).  Updated in place.
    ring_beta : torch.Tensor
        ``[slots, HV, R]`` fp32 β = sigmoid(b) rounded to ``b.dtype`` (as the conventional kernel
        uses it).  Updated in place.
    q, k : torch.Tensor
        ``[batch, Hk, K]`` post-conv query / key, any strides (views into SGLang's ``mixed_qkv``).
    v : torch.Tensor
        ``[batch, HV, V]`` post-conv value, any strides.
    a, b : torch.Tensor
        ``[batch, HV]`` gate inputs, any strides.
    A_log, dt_bias : torch.Tensor
        ``[HV]``, contiguous.
    out : torch.Tensor
        ``[batch, HV, V]`` output, any strides; written for non-padding rows only.
    slot_idx : torch.Tensor
        ``[batch]`` int32 / int64 state slot per row, ``-1`` for padding.
    ring_start, ring_len : torch.Tensor
        ``[batch]`` int32 / int64 cursor snapshot of each row.
    flush : torch.Tensor
        ``[batch]`` bool, rows that fold this step.
    scale : float
        Query scale (``K ** -0.5`` in the models).
    use_qk_l2norm : bool
        Normalise q and k in-kernel (division form), as SGLang's decode does (``True``).
    read_state : torch.Tensor, optional
        ``[slots, HV, V, K]`` read copy, bf16 / fp16 / fp8 e4m3 (not ``state``'s dtype), any
        strides.  Read by non-flush rows; rewritten in place on flush rows.
    read_scale : torch.Tensor, optional
        ``[slots, HV, V]`` fp32 per-row scales, with (and only with) an fp8 copy; rewritten in
        place on flush rows.
    sr_seed : torch.Tensor, optional
        ``[1]`` int64 counter on ``state``'s device: stochastic rounding of the fp16 checkpoint on
        flush rows.  Read on the device (no host sync); the caller advances it between steps.
        Not written.
    sr_layer : int
        Stream id mixed into the bits (the layer index), ``[0, 2^31)``; a runtime argument.

    Raises
    ------
    ValueError
        On any shape, dtype or device mismatch (the message names expected and actual);
        ``sr_seed`` with a non-fp16 ``state``.
    """
    validate_gdn_decode(
        state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, out,
        slot_idx, ring_start, ring_len, flush, scale,
    )  # fmt: skip
    validate_read_copy(state, read_state, read_scale)
    validate_stochastic_rounding(state, sr_seed, sr_layer)
    gdn_replay_decode_fwd(
        state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, out,
        slot_idx, ring_start, ring_len, flush, scale=scale, use_qk_l2norm=use_qk_l2norm,
        read_state=read_state, read_scale=read_scale, sr_seed=sr_seed, sr_layer=sr_layer,
    )  # fmt: skip
