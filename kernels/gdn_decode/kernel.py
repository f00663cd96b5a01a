"""Gated DeltaNet ReplaySSM decode: one Triton launch for a mixed flush / non-flush batch.

Layers (fla style): ``gdn_replay_decode_fwd_kernel`` (Triton jit), ``gdn_replay_decode_fwd``
(launcher, no checks), ``gdn_replay_decode`` (validated public function).

Launch layout: grid ``(cdiv(cdiv(V, BV), TILES), HV, batch)`` with ``BV = 32``, one warp per program; a
program owns one ``[BV, K]`` tile of one value head's checkpoint, so the checkpoint is read exactly
once per row and head and the flush writes it exactly once.  From batch 64 a program owns two (from
256 four) of the head's tiles, one after another (``TILES_BY_BATCH``; the per-key-head work once
per program).  Per row the program branches on
``flush[b]`` (``_tree.py``; every row sum laid out rows-on-lanes):

* flush: the exact fold, ``_tree.flush_tree`` (16 rows on lanes).  Records ``[0, len)`` and then
  the current token are replayed into the checkpoint tile from the raw inputs (pre-norm k, raw v,
  g, β) with the expressions of SGLang's ``fused_recurrent_gated_delta_rule_packed_decode_kernel``
  and its reduction tree written out (per lane a 4-column chain, then xor 16 .. 1), so every fp32
  operation is that kernel's; the tile is stored once (a 16-bit state is rounded once per flush:
  to nearest, or for an fp16 state with ``SR`` stochastically, ``stochastic_round.py``).
* non-flush: the inner-product form (math.md §4), ``_tree.nonflush_rows`` (4 rows on lanes).
  ``S_w`` is never built: one pass over the checkpoint tile gives ``S0·k̂_c`` and ``S0·q̃_c``; the
  records add ``Σ_j ω_j (k̂_j·k̂_c) u_j`` and ``Σ_j ω_j (k̂_j·q̃_c) u_j``, where
  ``ω_j = exp(Σ_{i>j} g_i)``.  That costs ``O(R·(K + BV))`` per program instead of the
  ``O(R·BV·K)`` of rebuilding ``S_w`` in registers (SGLang's built-in ReplaySSM kernel), and it is
  plain fp32 (no TF32 / bf16 dot).  The current record ``(u_c, raw k_c, raw v_c, g_c, β_c)`` is
  appended at physical row ``(start + len) % R``; the checkpoint is not written.

Measured on the H200 at commit 42bdf52 against the launch variants it replaced
(``benchmarks/notes/gdn_decode.md``, "Result").  Not autotuned: the kernel writes the checkpoint
in place.  No host sync; CUDA-graph safe (all per-row decisions are read on the device).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_kernels._checks import check_launch_device, launch_device
from replayssm_kernels.gdn_decode._tree import flush_tree, nonflush_rows
from replayssm_kernels.gdn_decode._validate import validate_gdn_decode
from replayssm_kernels.mamba2_decode.read_copy import validate_read_copy
from replayssm_kernels.row_order import validate_row_order
from replayssm_kernels.stochastic_round import validate_stochastic_rounding

__all__ = [
    "gdn_replay_decode",
    "gdn_replay_decode_fwd",
    "gdn_replay_decode_fwd_kernel",
    "BLOCK_V",
    "FOLD_ROWS",
    "NONFLUSH_ROWS",
    "BLOCK_R",
    "TILES_BY_BATCH",
    "FLUSH_FIRST_MIN_BATCH",
    "program_tiles",
    "launch_tile",
]

# The launch configuration (measured, benchmarks/notes/gdn_decode.md). The tile (value rows per
# program, rows on lanes of each path) does not change a flush row's bits (the reduction tree is
# written out; GPU-tested at four other tiles); gdn_replay_decode_fwd's keywords override it for a
# sweep. Smaller tiles were slower on the H200 from batch 64 up (twenty-second session).
BLOCK_V = 32  # value rows per program, one warp: SGLang's packed-decode tile
FOLD_ROWS = 16  # flush rows: rows on lanes of the tree-form fold
NONFLUSH_ROWS = 4  # non-flush rows: rows on lanes of the inner-product sums
BLOCK_R = 16  # non-flush rows: records per chunk (R <= 16: one chunk)
# (from batch size, value tiles per program), largest first: a program over several of a head's
# tiles does the per-key-head work once; smaller batches keep one tile (SMs would idle).
TILES_BY_BATCH = ((256, 4), (64, 2))
# Callers launch the rows flush rows first (``row_order``, ``flush_first_order``) from this batch
# size: a mixed batch's flush programs (tiles folded in turn) then start in the first wave.
FLUSH_FIRST_MIN_BATCH = 64


def program_tiles(batch: int) -> int:
    """Value tiles per program of the default launch for ``batch`` rows (``TILES_BY_BATCH``)."""
    return next((t for b, t in TILES_BY_BATCH if batch >= b), 1)


def launch_tile(V: int, block_v: int | None = None, fold_rows: int | None = None,
                nonflush_rows: int | None = None,
                tiles: int | None = None) -> tuple[int, int, int, int]:
    """The decode launch's tile for ``V`` value rows.

    Parameters
    ----------
    V : int
        Value rows per head.
    block_v, fold_rows, nonflush_rows : int, optional
        Value rows per tile and rows on lanes of the flush / non-flush paths, powers of two
        (``None``: the module's ``BLOCK_V`` / ``FOLD_ROWS`` / ``NONFLUSH_ROWS``, read at call
        time).
    tiles : int, optional
        Value tiles per program, a power of two (``None``: one).

    Returns
    -------
    tuple of int
        ``(BV, RL_FOLD, RL_OUT, TILES)``: ``BV = min(next_pow2(V), block_v)``, each
        rows-on-lanes count at most ``BV``, ``TILES`` at most ``next_pow2(cdiv(V, BV))``.

    Raises
    ------
    ValueError
        A given value that is not a power of two, or given rows on lanes above ``block_v``.
    """
    given = {"block_v": block_v, "fold_rows": fold_rows, "nonflush_rows": nonflush_rows,
             "tiles": tiles}
    for name, val in given.items():
        if val is not None and (val < 1 or val & (val - 1)):
            raise ValueError(f"{name}: expected a power of two, got {val}")
    block_v = BLOCK_V if block_v is None else block_v
    for name in ("fold_rows", "nonflush_rows"):
        if given[name] is not None and given[name] > block_v:
            raise ValueError(f"{name}: expected at most block_v = {block_v}, got {given[name]}")
    bv = min(triton.next_power_of_2(V), block_v)
    fold = FOLD_ROWS if fold_rows is None else fold_rows
    out = NONFLUSH_ROWS if nonflush_rows is None else nonflush_rows
    n_tiles = min(1 if tiles is None else tiles, triton.next_power_of_2(triton.cdiv(V, bv)))
    return bv, min(fold, bv), min(out, bv), n_tiles


@triton.jit(do_not_specialize=["sr_layer"])
def gdn_replay_decode_fwd_kernel(
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
    row_order,
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
    ONE_CHUNK: tl.constexpr,
    RL_FOLD: tl.constexpr,
    RL_OUT: tl.constexpr,
    TILES: tl.constexpr,
    SOFTPLUS_THRESHOLD: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    HAS_READ: tl.constexpr,
    READ_FP8: tl.constexpr,
    SR: tl.constexpr,
    HAS_ORDER: tl.constexpr,
):
    """One program of the decode launch (module docstring).  ``HAS_READ``: split precision,
    non-flush rows read ``S0`` from the read copy (``read_ptr``, fp8: times ``read_scale_ptr``'s
    per-row scale) and flush rows refresh it after storing the checkpoint (``None`` pointers and
    zero strides without a copy).  ``SR``: flush rows store the fp16 checkpoint with stochastic
    rounding (``sr_seed`` counter, ``sr_layer`` stream).  ``RL_FOLD`` / ``RL_OUT``: rows on lanes
    of the flush / non-flush rows (``_tree.py``); ``TILES``: value tiles of the program (group
    ``i_g`` of the head's tiles), one after another.  ``HAS_ORDER``: the program's row is
    ``row_order[z]`` (``row_order.py``: flush rows first), else ``z``."""
    i_g, i_hv, i_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if HAS_ORDER:
        i_n = tl.load(row_order + i_n)
    i_h = i_hv // (HV // H)

    # Every per-row scalar is requested at once (one memory round trip); padding rows read their
    # own (unused) cursor and gate entries, which exist since they are batch-shaped.
    i_s = tl.load(slot_idx + i_n).to(tl.int64)
    r_start = tl.load(ring_start + i_n).to(tl.int32)
    r_len = tl.load(ring_len + i_n).to(tl.int32)
    is_flush = tl.load(flush + i_n).to(tl.int32) != 0
    a_val = tl.load(a + i_n * stride_a_b + i_hv * stride_a_h).to(tl.float32)
    b_val = tl.load(b + i_n * stride_b_b + i_hv * stride_b_h).to(tl.float32)
    A_log_val = tl.load(A_log + i_hv).to(tl.float32)
    dt_bias_val = tl.load(dt_bias + i_hv).to(tl.float32)

    # Padding row: touches nothing, not even its output row.
    if i_s < 0:
        return

    # Gates of the current token: the conventional kernel's expressions, so g and β (stored in
    # the ring and replayed by a later flush) carry the bits that kernel would have used.
    x = a_val + dt_bias_val
    softplus_x = tl.where(x <= SOFTPLUS_THRESHOLD, tl.log(1.0 + tl.exp(x)), x)
    g_val = -tl.exp(A_log_val) * softplus_x
    beta_val = tl.sigmoid(b_val).to(b.dtype.element_ty).to(tl.float32)

    p_s_head = state + i_s * stride_s_n + i_hv * stride_s_h
    p_q = q + i_n * stride_q_b + i_h * stride_q_h
    p_k = k + i_n * stride_k_b + i_h * stride_k_h
    p_v = v + i_n * stride_v_b + i_hv * stride_v_h
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

    if is_flush:
        for i_t in range(TILES):
            flush_tree(
                state, p_s_head, p_rk, p_rv, p_rg, p_rb, p_q, p_k, p_v, p_o, p_rd, p_rs, sr_seed,
                sr_layer, i_s, i_hv, i_g * TILES + i_t, r_start, r_len, R, g_val, beta_val,
                scale, stride_s_v, stride_s_k, stride_rk_r, stride_rk_k, stride_rv_r,
                stride_rv_v, stride_g_r, stride_beta_r, stride_q_k, stride_k_k, stride_v_v,
                stride_o_v, stride_rd_v, stride_rd_k, stride_rs_v,
                K, V, BK, BV, RL_FOLD, USE_QK_L2NORM, HAS_READ, READ_FP8, SR, o.dtype.element_ty,
            )  # fmt: skip
    else:
        nonflush_rows(
            p_s_head, p_ru, p_rk, p_rv, p_rg, p_rb, p_q, p_k, p_v, p_o, p_rd, p_rs,
            i_hv, i_g, r_start, r_len, R, g_val, beta_val, scale,
            stride_s_v, stride_s_k, stride_u_r, stride_u_v, stride_rk_r, stride_rk_k,
            stride_rv_r, stride_rv_v, stride_g_r, stride_beta_r, stride_q_k, stride_k_k,
            stride_v_v, stride_o_v, stride_rd_v, stride_rd_k, stride_rs_v,
            H, HV, K, V, BK, BV, BR, RL_OUT, TILES, ONE_CHUNK, USE_QK_L2NORM, HAS_READ, READ_FP8,
            o.dtype.element_ty, ring_u.dtype.element_ty, ring_k.dtype.element_ty,
            ring_v.dtype.element_ty,
        )  # fmt: skip


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
    read_state: torch.Tensor | None = None,
    read_scale: torch.Tensor | None = None,
    sr_seed: torch.Tensor | None = None,
    sr_layer: int = 0,
    block_v: int | None = None,
    fold_rows: int | None = None,
    nonflush_rows: int | None = None,
    tiles: int | None = None,
    row_order: torch.Tensor | None = None,
) -> None:
    """Launch the kernel without checks (callers: the validated wrapper, benchmarks).

    One launch, grid ``(cdiv(cdiv(V, BV), TILES), HV, batch)``, one warp per program,
    ``K <= 128``.
    ``read_state`` (and ``read_scale`` for fp8): split precision (``HAS_READ`` compiled in).
    ``sr_seed`` (fp16 ``state``): stochastic rounding of the flush store (``SR`` compiled in).
    ``block_v`` / ``fold_rows`` / ``nonflush_rows`` / ``tiles``: the tile and the tiles per
    program (``launch_tile``; ``None``: the module's constants, ``tiles`` by the batch size,
    ``program_tiles``), for a launch sweep; flush rows give the same bits at any tile (compiled:
    at K = 128, ``_tree.py``), non-flush outputs may differ in the last bits (their sums' order
    follows the tile; compiled, also between ``tiles`` values: FMA contraction).  ``row_order``:
    program ``z`` of the grid's batch dimension runs row ``row_order[z]`` (``HAS_ORDER`` compiled
    in).

    Raises
    ------
    ValueError
        A tile value that is not a power of two or exceeds ``block_v`` (``launch_tile``).
    """
    batch, Hk, K = q.shape
    HV, V = state.shape[1], state.shape[2]
    R = ring_k.shape[2]
    if batch == 0:
        return
    if tiles is None:
        tiles = program_tiles(batch)
    BK = max(triton.next_power_of_2(K), 4)  # whole 4-column chunks (``_tree._cols``)
    BV, RL_FOLD, RL_OUT, TILES_ = launch_tile(V, block_v, fold_rows, nonflush_rows, tiles)
    BR = min(triton.next_power_of_2(R), BLOCK_R)
    has_read = read_state is not None
    read_strides = (*read_state.stride(), *(read_scale.stride() if read_scale is not None
                                            else (0, 0, 0))) if has_read else (0,) * 7
    grid = (triton.cdiv(triton.cdiv(V, BV), TILES_), HV, batch)
    gdn_replay_decode_fwd_kernel[grid](
        state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, out,
        slot_idx, ring_start, ring_len, flush, float(scale), read_state, read_scale, sr_seed,
        row_order, R,
        sr_layer, *state.stride(), *ring_u.stride(), *ring_k.stride(), *ring_v.stride(),
        *ring_g.stride(), *ring_beta.stride(), *q.stride(), *k.stride(), *v.stride(),
        *a.stride(), *b.stride(), *out.stride(), *read_strides,
        H=Hk, HV=HV, K=K, V=V, BK=BK, BV=BV, BR=BR, ONE_CHUNK=R <= BR,
        RL_FOLD=RL_FOLD, RL_OUT=RL_OUT, TILES=TILES_, SOFTPLUS_THRESHOLD=20.0,
        USE_QK_L2NORM=use_qk_l2norm,
        HAS_READ=has_read, READ_FP8=read_scale is not None, SR=sr_seed is not None,
        HAS_ORDER=row_order is not None, num_warps=1, num_stages=1,
    )  # fmt: skip


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
    row_order: torch.Tensor | None = None,
    batch_invariant: bool = False,
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
      from the raw inputs, in the conventional packed-decode kernel's fp32 op order (its
      reduction trees included: an fp32 ``state[s]`` and ``out[b]`` equal SGLang's packed decode
      run token by token, bit for bit), and ``state[s]`` is written once (a 16-bit state is
      rounded once); ``out[b]`` is read from the folded state.  No record is written.

    Split precision (optional ``read_state``): non-flush rows read ``S0`` from the read copy
    ``read_state[s]`` (the checkpoint is not read); flush rows fold into ``state[s]`` exactly as
    without a copy (from the checkpoint, never the copy: same bits), then refresh ``read_state[s]`` (and ``read_scale[s]``) from the checkpoint as
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
        ``[slots, HV, V, K]`` checkpoint, fp32 / fp16 / bf16, ``K <= 128``, any strides (e.g. one
        layer's view of SGLang's ``temporal`` pool).  Updated in place on flush rows only.
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
    row_order : torch.Tensor, optional
        ``[batch]`` int32 permutation of the rows: the launch runs the rows in this order
        (``replayssm_kernels.row_order.flush_first_order``: flush rows first, so their long
        programs start in the first wave).  Changes no result.  Its contents are not checked.
    batch_invariant : bool
        Pin the launch to the configuration of no particular batch size: one value tile per
        program at every batch (``tiles = 1``; by default ``program_tiles``: 2 from batch 64, 4
        from 256, whose compiled non-flush sums round differently, kernels/README.md, "Batch
        invariance"). A row's outputs, records and checkpoint then come from the same compiled
        kernel and the same programs whatever else is in the batch (SGLang's
        ``--enable-deterministic-inference``). ``row_order`` stays allowed (it only maps
        programs to rows).

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
    if row_order is not None:
        validate_row_order(row_order, slot_idx.shape[0], slot_idx.device, unit_stride=True)
    check_launch_device("state", state)
    with launch_device(state):
        gdn_replay_decode_fwd(
            state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, out,
            slot_idx, ring_start, ring_len, flush, scale=scale, use_qk_l2norm=use_qk_l2norm,
            read_state=read_state, read_scale=read_scale, sr_seed=sr_seed, sr_layer=sr_layer,
            row_order=row_order, tiles=1 if batch_invariant else None,
        )  # fmt: skip
