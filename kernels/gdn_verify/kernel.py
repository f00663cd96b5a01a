"""Gated DeltaNet ReplaySSM speculative verify: one Triton launch for a mixed flush/non-flush batch.

Layers (fla style): ``gdn_replay_verify_fwd_kernel`` and, with a split-precision read
copy, ``gdn_replay_verify_read_fwd_kernel`` (Triton jit; both inline one program,
``_gdn_verify_program``, so the launch without a copy compiles as before),
``gdn_replay_verify_fwd`` (launcher, no checks), ``gdn_replay_verify`` (validated public
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

from replayssm_kernels.gdn_decode._tree import _col8, _r8, fold_tree_records, store_tile
from replayssm_kernels.gdn_decode._validate import validate_gdn_verify
from replayssm_kernels.gdn_decode.kernel import BLOCK_R, BLOCK_V, FOLD_ROWS, NONFLUSH_ROWS
from replayssm_kernels.gdn_verify._window import verify_window
from replayssm_kernels.mamba2_decode.read_copy import validate_read_copy
from replayssm_kernels.stochastic_round import validate_stochastic_rounding

__all__ = [
    "gdn_replay_verify",
    "gdn_replay_verify_fwd",
    "gdn_replay_verify_fwd_kernel",
    "gdn_replay_verify_read_fwd_kernel",
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
    TW: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BR: tl.constexpr,
    RL_FOLD: tl.constexpr, RL_OUT: tl.constexpr, SOFTPLUS_THRESHOLD: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr, HAS_READ: tl.constexpr, READ_FP8: tl.constexpr,
    SR: tl.constexpr,
):  # fmt: skip
    """One program of the verify launch (kernels below); ``HAS_READ``: split precision, non-flush
    rows start from the read copy (``read_ptr``, fp8: times ``read_scale_ptr``'s per-row scale)
    and flush rows refresh it from the checkpoint as stored.  ``SR``: flush rows store the fp16
    checkpoint with stochastic rounding (``sr_seed`` counter, ``sr_layer`` stream)."""
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

    p_s_head = state + i_s * stride_s_n + i_hv * stride_s_h
    p_q = q + i_n * stride_q_b + i_h * stride_q_h
    p_k = k + i_n * stride_k_b + i_h * stride_k_h
    p_v = v + i_n * stride_v_b + i_hv * stride_v_h
    p_a = a + i_n * stride_a_b + i_hv * stride_a_h
    p_b = b + i_n * stride_b_b + i_hv * stride_b_h
    p_o = o + i_n * stride_o_b + i_hv * stride_o_h
    p_rk = ring_k + i_s * stride_rk_n + i_h * stride_rk_h
    p_rv = ring_v + i_s * stride_rv_n + i_hv * stride_rv_h
    p_ru = ring_u + i_s * stride_u_n + i_hv * stride_u_h
    p_rg = ring_g + i_s * stride_g_n + i_hv * stride_g_h
    p_rb = ring_beta + i_s * stride_beta_n + i_hv * stride_beta_h
    p_rd = read_ptr
    p_rs = read_scale_ptr
    if HAS_READ:
        p_rd = read_ptr + i_s * stride_rd_n + i_hv * stride_rd_h
        if READ_FP8:
            p_rs = read_scale_ptr + i_s * stride_rs_n + i_hv * stride_rs_h
    col8 = _col8(BK)
    o_k = tl.arange(0, BK)
    mask_k = o_k < K

    hist_len = r_len
    if is_flush:
        # The exact fold of the committed records (decode's tree form, RL_FOLD rows on lanes),
        # stored once; the window then runs from the checkpoint as stored, with no history.
        RH_F: tl.constexpr = BV // RL_FOLD
        row2_f = (i_v * BV + tl.arange(0, RH_F)[None, :] * RL_FOLD
                  + tl.arange(0, RL_FOLD)[:, None])  # fmt: skip
        row8_f = _r8(row2_f)
        mask_hf = (row8_f < V) & (col8 < K)
        p_sf = p_s_head + row8_f * stride_s_v + col8 * stride_s_k
        b_hf = tl.load(p_sf, mask=mask_hf, other=0).to(tl.float32)
        b_hf = fold_tree_records(
            b_hf, p_rk, p_rv, p_rg, p_rb, r_start, r_len, R, row2_f, row2_f < V, o_k, mask_k,
            stride_rk_r, stride_rk_k, stride_rv_r, stride_rv_v, stride_g_r, stride_beta_r,
            BK, USE_QK_L2NORM,
        )  # fmt: skip
        store_tile(
            b_hf, state, p_sf, p_rd, p_rs, sr_seed, sr_layer, i_s, i_hv, row2_f, row8_f, col8,
            mask_hf, row2_f < V, stride_rd_v, stride_rd_k, stride_rs_v, K, V, HAS_READ, READ_FP8,
            SR,
        )  # fmt: skip
        # The window reads the stored tile back in its own layout (other lanes own other rows).
        tl.debug_barrier()
        hist_len = 0

    # The window's tile, RL_OUT rows on lanes (a lane's rows contiguous): the checkpoint (as just
    # stored, after a flush), or with a copy on non-flush rows the copy (the checkpoint is then
    # not read); the committed history on top of it.
    RH_O: tl.constexpr = BV // RL_OUT
    row2 = i_v * BV + tl.arange(0, RL_OUT)[:, None] * RH_O + tl.arange(0, RH_O)[None, :]
    row8 = _r8(row2)
    mask_h = (row8 < V) & (col8 < K)
    if HAS_READ and not is_flush:
        b_h0 = tl.load(p_rd + row8 * stride_rd_v + col8 * stride_rd_k, mask=mask_h,
                       other=0.0).to(tl.float32)
        if READ_FP8:
            # power-of-two scales: the products are exact (dequantize_rows' values)
            b_h0 = b_h0 * _r8(tl.load(p_rs + row2 * stride_rs_v, mask=row2 < V, other=0.0))
    else:
        b_h0 = tl.load(p_s_head + row8 * stride_s_v + col8 * stride_s_k, mask=mask_h,
                       other=0).to(tl.float32)
    verify_window(
        b_h0, row2, p_ru, p_rk, p_rv, p_rg, p_rb, p_q, p_k, p_v, p_a, p_b,
        p_o, i_hv, i_v, r_start, hist_len, r_len, R, A_log_val, dt_bias_val, scale,
        stride_u_r, stride_u_v, stride_rk_r, stride_rk_k, stride_rv_r, stride_rv_v,
        stride_g_r, stride_beta_r, stride_q_t, stride_q_k, stride_k_t, stride_k_k,
        stride_v_t, stride_v_v, stride_a_t, stride_b_t, stride_o_t, stride_o_v,
        H, HV, K, V, T, TW, BK, BR, RL_OUT, SOFTPLUS_THRESHOLD, USE_QK_L2NORM,
    )  # fmt: skip


@triton.jit(do_not_specialize=["sr_layer"])
def gdn_replay_verify_fwd_kernel(
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
    TW: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BR: tl.constexpr,
    RL_FOLD: tl.constexpr, RL_OUT: tl.constexpr, SOFTPLUS_THRESHOLD: tl.constexpr,
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
        H, HV, K, V, T, TW, BK, BV, BR, RL_FOLD, RL_OUT, SOFTPLUS_THRESHOLD, USE_QK_L2NORM,
        False, False, SR,
    )  # fmt: skip


@triton.jit(do_not_specialize=["sr_layer"])
def gdn_replay_verify_read_fwd_kernel(
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
    TW: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BR: tl.constexpr,
    RL_FOLD: tl.constexpr, RL_OUT: tl.constexpr, SOFTPLUS_THRESHOLD: tl.constexpr,
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
        H, HV, K, V, T, TW, BK, BV, BR, RL_FOLD, RL_OUT, SOFTPLUS_THRESHOLD, USE_QK_L2NORM,
        True, READ_FP8, SR,
    )  # fmt: skip


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
    read_state: torch.Tensor | None = None,
    read_scale: torch.Tensor | None = None,
    sr_seed: torch.Tensor | None = None,
    sr_layer: int = 0,
) -> None:
    """Launch the kernel without checks (caller: ``gdn_replay_verify``).

    ``gdn_replay_decode``'s launch configuration (``BLOCK_V`` rows, one warp, ``FOLD_ROWS`` /
    ``NONFLUSH_ROWS`` rows on lanes, ``BLOCK_R`` records per chunk): the flush rows' fold is that
    kernel's, bit for bit, in that configuration only.

    ``read_state`` (and ``read_scale`` for fp8): split precision, launched as
    ``gdn_replay_verify_read_fwd_kernel`` (same program, read-copy code compiled in);
    without it the launch is ``gdn_replay_verify_fwd_kernel``, compiled as before.
    ``sr_seed`` (fp16 ``state``): stochastic rounding of the flush store (``SR`` compiled in).
    """
    batch, T, Hk, K = q.shape
    HV, V = state.shape[1], state.shape[2]
    R = ring_k.shape[2]
    if batch == 0:
        return
    BK = max(triton.next_power_of_2(K), 4)  # whole 4-column chunks (``_tree._cols``)
    BV = min(triton.next_power_of_2(V), BLOCK_V)
    grid = (triton.cdiv(V, BV), HV, batch)
    kernel = gdn_replay_verify_fwd_kernel
    read_args: tuple = ()
    read_strides: tuple = ()
    meta = dict(H=Hk, HV=HV, K=K, V=V, T=T, TW=max(triton.next_power_of_2(T), 2), BK=BK, BV=BV,
                BR=min(triton.next_power_of_2(R), BLOCK_R), RL_FOLD=min(FOLD_ROWS, BV),
                RL_OUT=min(NONFLUSH_ROWS, BV), SOFTPLUS_THRESHOLD=20.0,
                USE_QK_L2NORM=use_qk_l2norm, SR=sr_seed is not None, num_warps=1,
                num_stages=1)  # fmt: skip
    if read_state is not None:
        kernel = gdn_replay_verify_read_fwd_kernel
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
    gdn_replay_verify_fwd(
        state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, out,
        slot_idx, ring_start, ring_len, flush, scale=scale, use_qk_l2norm=use_qk_l2norm,
        read_state=read_state, read_scale=read_scale, sr_seed=sr_seed, sr_layer=sr_layer,
    )  # fmt: skip
