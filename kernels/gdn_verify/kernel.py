"""Gated DeltaNet ReplaySSM speculative verify: one Triton launch for a mixed flush/non-flush batch.

Layers (fla style): ``gdn_replay_verify_recurrent_fwd_kernel`` and, with a split-precision read
copy, ``gdn_replay_verify_recurrent_read_fwd_kernel`` (Triton jit; both inline one program,
``_gdn_verify_program``, so the launch without a copy compiles as before),
``gdn_replay_verify_recurrent_fwd`` (launcher, no checks), ``gdn_replay_verify`` (validated public
function).

Each row verifies a linear chain of ``T`` tokens (the last accepted token plus ``T - 1`` drafts) on
the ring protocol of ``gdn_decode`` (same ring tensors, same cursors; ``../README.md``). The window
runs as T sequential delta-rule steps on a ``[BV, K]`` register tile, as SGLang's snapshot kernel
does, without its per-draft state stores (H200, T = 4, batch 256, Qwen3.5-4B: 626.7 us against
SGLang's snapshot verify at 704.9 us; ``../README.md``).

Launch layout: grid ``(cdiv(V, BV), HV, batch)``, one warp per program, ``BV = 32`` (the tile and
warp count of ``gdn_replay_decode`` and SGLang's packed decode). A program owns one ``[BV, K]``
tile of one value head's checkpoint, loaded once:

* flush row: the exact fold of the committed records ``[0, len)`` from the raw inputs
  (``fold_records``, the decode kernel's fold), stored once (an fp16 tile with ``SR``:
  stochastically rounded, ``stochastic_round.py``); the window runs from the stored tile.
  With a read copy the stored tile also rewrites the copy (``store_read_tile``).
* non-flush row: the committed history is applied to the tile in registers from the stored
  corrected updates, oldest first: ``S ← e^{g_j} S + u_j k̂_jᵀ`` (no reduction per record; u_j is
  the value the recurrence added at that step). The checkpoint is not written. With a read copy
  the tile starts from the copy (dequantised) and the checkpoint is not read.
* window, both kinds: for each token ``s`` the conventional packed-decode step, in its op order:
  ``S ← e^{g_s} S``, ``u_s = β_s (v_s − S k̂_s)``, ``S ← S + u_s k̂_sᵀ``, ``y_s = S q̃_s``. No state
  leaves registers.

The records ``(u_s, raw k_s, raw v_s, g_s, β_s)`` of all T tokens are written at logical rows
``len .. len + T − 1`` (physical ``(start + len + s) % R``), accepted or not; the commit advances
the cursors by the accepted count and later steps overwrite the rest. g and β use the decode
kernel's expressions, β rounded to ``b.dtype`` (see the README: the fold is the decode path's, so
the ring's β is the packed-decode β). Not autotuned (writes the checkpoint). No host sync;
CUDA-graph safe.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_kernels.gdn_decode._fold import fold_records, replay_updates
from replayssm_kernels.gdn_decode._validate import validate_gdn_verify
from replayssm_kernels.mamba2_decode.read_copy import store_read_tile, validate_read_copy
from replayssm_kernels.stochastic_round import (
    sr_key,
    sr_round_fp16,
    validate_stochastic_rounding,
)

__all__ = [
    "gdn_replay_verify",
    "gdn_replay_verify_recurrent_fwd",
    "gdn_replay_verify_recurrent_fwd_kernel",
    "gdn_replay_verify_recurrent_read_fwd_kernel",
]


@triton.jit
def _gdn_verify_program(
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
    BK: tl.constexpr, BV: tl.constexpr, SOFTPLUS_THRESHOLD: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr, HAS_READ: tl.constexpr, READ_FP8: tl.constexpr,
    SR: tl.constexpr,
):  # fmt: skip
    """One program of the verify launch (kernels below); ``HAS_READ``: split precision, non-flush
    rows start the history replay from the read copy (``read_ptr``, fp8: times ``read_scale_ptr``'s
    per-row scale) and flush rows refresh it from the checkpoint as stored.  ``SR``: flush rows
    store the fp16 checkpoint with stochastic rounding (``sr_seed`` counter, ``sr_layer``
    stream)."""
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
    p_o = o + i_n * stride_o_b + i_hv * stride_o_h + o_v * stride_o_v
    p_rk = ring_k + i_s * stride_rk_n + i_h * stride_rk_h
    p_rv = ring_v + i_s * stride_rv_n + i_hv * stride_rv_h
    p_ru = ring_u + i_s * stride_u_n + i_hv * stride_u_h
    p_rg = ring_g + i_s * stride_g_n + i_hv * stride_g_h
    p_rb = ring_beta + i_s * stride_beta_n + i_hv * stride_beta_h

    if HAS_READ:
        # Copy accesses are declared contiguous only in runs of the checkpoint's 16-byte vector
        # (4 fp32), so Triton gives the copy's loads and stores the checkpoint tile's layout
        # ([1, 4] x [1, 32] per warp for fp32) instead of a wider one of its own (bf16: [1, 8] x
        # [2, 16]), which would spread to the fold and change its reduction trees: the fold must
        # compile as without a copy (test_fold_codegen_matches_decode).
        o_kr = tl.max_contiguous(o_k, 128 // state.dtype.element_ty.primitive_bitwidth)
    else:
        b_h = tl.load(p_s, mask=mask_h, other=0).to(tl.float32)
    if is_flush:
        if HAS_READ:
            b_h = tl.load(p_s, mask=mask_h, other=0).to(tl.float32)
        b_h = fold_records(
            b_h, p_rk, p_rv, p_rg, p_rb, r_start, r_len, R, o_k, o_v, mask_k, mask_v,
            stride_rk_r, stride_rk_k, stride_rv_r, stride_rv_v, stride_g_r, stride_beta_r,
            USE_QK_L2NORM,
        )
        if SR:
            b_h = sr_round_fp16(b_h, sr_key(sr_seed, sr_layer, i_s),
                                (i_hv * V + o_v[:, None]) * K + o_k[None, :])
        else:
            b_h = b_h.to(state.dtype.element_ty)
        tl.store(p_s, b_h, mask=mask_h)
        if HAS_READ:
            # Refresh the copy from the checkpoint as stored (masked lanes of b_h are zeros).
            p_rs_head = read_scale_ptr
            if READ_FP8:
                p_rs_head = read_scale_ptr + i_s * stride_rs_n + i_hv * stride_rs_h
            store_read_tile(
                b_h, read_ptr + i_s * stride_rd_n + i_hv * stride_rd_h, p_rs_head, o_v, o_kr,
                mask_v, mask_k, stride_rd_v, stride_rd_k, stride_rs_v, READ_FP8,
            )
        # The window runs from the stored (possibly 16-bit) checkpoint: what later steps read.
        b_h = b_h.to(tl.float32)
    else:
        if HAS_READ:
            # Split precision: S0 is the read copy; the checkpoint is not read.  The fp8 scale is
            # a power of two, so q·scale is exact (dequantize_rows' values).
            b_h = tl.load(read_ptr + i_s * stride_rd_n + i_hv * stride_rd_h
                          + o_v[:, None] * stride_rd_v + o_kr[None, :] * stride_rd_k,
                          mask=mask_h, other=0.0).to(tl.float32)
            if READ_FP8:
                b_rs = tl.load(read_scale_ptr + i_s * stride_rs_n + i_hv * stride_rs_h
                               + o_v * stride_rs_v, mask=mask_v, other=0.0)
                b_h = b_h * b_rs[:, None]
        b_h = replay_updates(
            b_h, p_rk, p_ru, p_rg, r_start, r_len, R, o_k, o_v, mask_k, mask_v,
            stride_rk_r, stride_rk_k, stride_u_r, stride_u_v, stride_g_r, USE_QK_L2NORM,
        )

    for s in tl.static_range(T):
        # Gates: the decode kernel's expressions, so the ring's g and β carry the bits a later
        # fold replays.
        x_g = tl.load(p_a + s * stride_a_t).to(tl.float32) + dt_bias_val
        softplus_x = tl.where(x_g <= SOFTPLUS_THRESHOLD, tl.log(1.0 + tl.exp(x_g)), x_g)
        g_val = -tl.exp(A_log_val) * softplus_x
        b_in = tl.load(p_b + s * stride_b_t)
        beta_val = tl.sigmoid(b_in.to(tl.float32)).to(b.dtype.element_ty).to(tl.float32)
        b_q = tl.load(p_q + s * stride_q_t, mask=mask_k, other=0).to(tl.float32)
        b_k_raw = tl.load(p_k + s * stride_k_t, mask=mask_k, other=0)
        b_v_raw = tl.load(p_v + s * stride_v_t, mask=mask_v, other=0)
        b_k = b_k_raw.to(tl.float32)
        b_v = b_v_raw.to(tl.float32)
        if USE_QK_L2NORM:
            b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
            b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
        b_q = b_q * scale
        b_h *= tl.exp(g_val)
        b_v -= tl.sum(b_h * b_k[None, :], 1)
        b_v *= beta_val
        b_h += b_v[:, None] * b_k[None, :]
        b_o = tl.sum(b_h * b_q[None, :], 1)
        tl.store(p_o + s * stride_o_t, b_o.to(o.dtype.element_ty), mask=mask_v)
        # The window record at logical row len + s.
        w_row = (r_start + r_len + s) % R
        tl.store(p_ru + w_row * stride_u_r + o_v * stride_u_v, b_v.to(ring_u.dtype.element_ty),
                 mask=mask_v)
        tl.store(p_rv + w_row * stride_rv_r + o_v * stride_rv_v,
                 b_v_raw.to(ring_v.dtype.element_ty), mask=mask_v)
        if i_v == 0:
            tl.store(p_rg + w_row * stride_g_r, g_val)
            tl.store(p_rb + w_row * stride_beta_r, beta_val)
            if i_hv % (HV // H) == 0:
                tl.store(p_rk + w_row * stride_rk_r + o_k * stride_rk_k,
                         b_k_raw.to(ring_k.dtype.element_ty), mask=mask_k)


@triton.jit(do_not_specialize=["sr_layer"])
def gdn_replay_verify_recurrent_fwd_kernel(
    state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, o,
    slot_idx, ring_start, ring_len, flush, scale, sr_seed,
    R, sr_layer,
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
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, SOFTPLUS_THRESHOLD: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr, SR: tl.constexpr = False,
):  # fmt: skip
    """The verify launch without a read copy (see the module docstring)."""
    _gdn_verify_program(
        state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, o,
        slot_idx, ring_start, ring_len, flush, scale, None, None, sr_seed, R, sr_layer,
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
        0, 0, 0, 0, 0, 0, 0,
        H, HV, K, V, T, BK, BV, SOFTPLUS_THRESHOLD, USE_QK_L2NORM, False, False, SR,
    )  # fmt: skip


@triton.jit(do_not_specialize=["sr_layer"])
def gdn_replay_verify_recurrent_read_fwd_kernel(
    state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, o,
    slot_idx, ring_start, ring_len, flush, scale, read_ptr, read_scale_ptr, sr_seed,
    R, sr_layer,
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
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, T: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, SOFTPLUS_THRESHOLD: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr, READ_FP8: tl.constexpr, SR: tl.constexpr = False,
):  # fmt: skip
    """The verify launch with a split-precision read copy (``read_ptr``, fp8 scales
    ``read_scale_ptr``)."""
    _gdn_verify_program(
        state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, o,
        slot_idx, ring_start, ring_len, flush, scale, read_ptr, read_scale_ptr, sr_seed, R,
        sr_layer,
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
        H, HV, K, V, T, BK, BV, SOFTPLUS_THRESHOLD, USE_QK_L2NORM, True, READ_FP8, SR,
    )  # fmt: skip


def gdn_replay_verify_recurrent_fwd(
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
    num_warps: int = 1,
    read_state: torch.Tensor | None = None,
    read_scale: torch.Tensor | None = None,
    sr_seed: torch.Tensor | None = None,
    sr_layer: int = 0,
) -> None:
    """Launch the kernel without checks (caller: ``gdn_replay_verify``).

    ``block_v=32, num_warps=1`` is the tile and warp count of ``gdn_replay_decode``'s fold and of
    SGLang's packed decode; the bitwise checkpoint claim is made for this configuration only.

    ``read_state`` (and ``read_scale`` for fp8): split precision, launched as
    ``gdn_replay_verify_recurrent_read_fwd_kernel`` (same program, read-copy code compiled in);
    without it the launch is ``gdn_replay_verify_recurrent_fwd_kernel``, compiled as before.
    ``sr_seed`` (fp16 ``state``): stochastic rounding of the flush store (``SR`` compiled in).
    """
    batch, T, Hk, K = q.shape
    HV, V = state.shape[1], state.shape[2]
    R = ring_k.shape[2]
    if batch == 0:
        return
    BK = triton.next_power_of_2(K)
    BV = min(triton.next_power_of_2(V), block_v)
    grid = (triton.cdiv(V, BV), HV, batch)
    kernel = gdn_replay_verify_recurrent_fwd_kernel
    read_args: tuple = ()
    read_strides: tuple = ()
    meta = dict(H=Hk, HV=HV, K=K, V=V, T=T, BK=BK, BV=BV, SOFTPLUS_THRESHOLD=20.0,
                USE_QK_L2NORM=use_qk_l2norm, SR=sr_seed is not None, num_warps=num_warps,
                num_stages=1)  # fmt: skip
    if read_state is not None:
        kernel = gdn_replay_verify_recurrent_read_fwd_kernel
        read_args = (read_state, read_scale)
        read_strides = (*read_state.stride(),
                        *(read_scale.stride() if read_scale is not None else (0, 0, 0)))
        meta["READ_FP8"] = read_scale is not None
    kernel[grid](
        state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, out,
        slot_idx, ring_start, ring_len, flush, float(scale), *read_args, sr_seed, R, sr_layer,
        *state.stride(), *ring_u.stride(), *ring_k.stride(), *ring_v.stride(),
        *ring_g.stride(), *ring_beta.stride(), *q.stride(), *k.stride(), *v.stride(),
        *a.stride(), *b.stride(), *out.stride(), *read_strides, **meta,
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
    read_state: torch.Tensor | None = None,
    read_scale: torch.Tensor | None = None,
    sr_seed: torch.Tensor | None = None,
    sr_layer: int = 0,
) -> None:
    """Verify ``T`` tokens per row (linear draft chain) on the Gated DeltaNet ReplaySSM ring.

    Per row ``b`` with slot ``s = slot_idx[b]`` (``-1``: padding, touches nothing, ``out[b]``
    untouched) and cursor snapshot ``(ring_start[b], ring_len[b], flush[b])``:

    * non-flush: ``out[b, t]`` for every window token from the checkpoint ``state[s]``, the
      committed records ``[0, ring_len[b])`` and the window, in registers (the history's stored
      updates, then the window's delta-rule steps).
      ``state[s]`` is not written.
    * flush: the committed records ``[0, ring_len[b])`` are folded sequentially into ``state[s]``
      from the raw inputs in the conventional packed-decode op order (``gdn_replay_decode``'s fold)
      and ``state[s]`` is written once; the window then runs from the folded checkpoint.

    Both write the T window records ``(u, raw k, raw v, g, β)`` at physical ring rows
    ``(ring_start[b] + ring_len[b] + t) % R``, ``t < T``, accepted or not (the commit keeps the
    accepted ones).  The caller guarantees ``ring_len[b] + T <= R`` (not checked: on device).
    β is ``sigmoid(b)`` rounded to ``b.dtype``, as ``gdn_replay_decode`` and SGLang's packed decode
    use it, so a later fold of these records reproduces that kernel's checkpoint.

    Split precision (optional ``read_state``, as ``gdn_replay_decode``): non-flush rows start from
    the read copy ``read_state[s]`` (fp8: times ``read_scale[s]``) instead of the checkpoint, which
    they do not read; the history replay and the window run from those values.  Flush rows fold
    into ``state[s]`` exactly as without a copy (same bits), store it, refresh ``read_state[s]``
    (and ``read_scale[s]``) from the checkpoint as stored
    (``replayssm_kernels.mamba2_decode.read_copy``, rows = V, scaled over K), and run the window
    from the stored checkpoint.

    Stochastic rounding (optional ``sr_seed``, fp16 ``state`` only, as ``gdn_replay_decode``):
    flush rows store the folded state with unbiased stochastic rounding (bits keyed by
    ``(sr_seed[0], sr_layer, s)`` and the element's index in ``[HV, V, K]``); the window then runs
    from that stored value, as it runs from a rounded-to-nearest one without ``sr_seed``.

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
    read_state : torch.Tensor, optional
        ``[slots, HV, V, K]`` read copy, bf16 / fp16 / fp8 e4m3 (not ``state``'s dtype), any
        strides.  Read by non-flush rows; rewritten in place on flush rows.
    read_scale : torch.Tensor, optional
        ``[slots, HV, V]`` fp32 per-row scales, with (and only with) an fp8 copy, any strides;
        rewritten in place on flush rows.
    sr_seed : torch.Tensor, optional
        ``[1]`` int64 counter on ``state``'s device: stochastic rounding of the fp16 checkpoint on
        flush rows.  Read on the device (no host sync); the caller advances it between steps.
        Not written.
    sr_layer : int
        Stream id mixed into the bits (the layer index), ``[0, 2^31)``; a runtime argument.

    Raises
    ------
    ValueError
        On any shape, dtype or device mismatch, or a bad read copy (the message names expected
        and actual); ``sr_seed`` with a non-fp16 ``state``.
    """
    validate_gdn_verify(
        state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, out,
        slot_idx, ring_start, ring_len, flush, scale,
    )  # fmt: skip
    validate_read_copy(state, read_state, read_scale)
    validate_stochastic_rounding(state, sr_seed, sr_layer)
    gdn_replay_verify_recurrent_fwd(
        state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, out,
        slot_idx, ring_start, ring_len, flush, scale=scale, use_qk_l2norm=use_qk_l2norm,
        read_state=read_state, read_scale=read_scale, sr_seed=sr_seed, sr_layer=sr_layer,
    )  # fmt: skip
