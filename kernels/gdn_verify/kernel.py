"""Gated DeltaNet ReplaySSM speculative verify: two Triton launches for a mixed flush/non-flush batch.

Layers (fla style): ``fold.py`` (launch 1, ``gdn_verify_fold_kernel`` /
``gdn_verify_fold_read_kernel``: the flush rows' exact fold and store), ``window.py`` (launch 2,
``gdn_verify_window_kernel``: every row's window outputs and records by matrix products, no state
formed), ``gdn_replay_verify_fwd`` (both launches, no checks), ``gdn_replay_verify`` (validated
public function).

Each row verifies a linear chain of ``T`` tokens (the last accepted token plus ``T - 1`` drafts) on
the ring protocol of ``gdn_decode`` (same ring tensors, same cursors; ``../README.md``). A flush row
folds its committed records into the checkpoint (launch 1, the packed decode's op order, so the
checkpoint is the conventional kernel's) and its window then runs from the stored checkpoint (or
its refreshed read copy) with an empty history; a non-flush row's window runs from the checkpoint
(or its read copy) plus the committed records' stored corrected updates. Both write the ``T``
window records at logical rows ``len .. len + T − 1``; the commit advances the cursors by the
accepted count and later steps overwrite the rest. Not autotuned (writes the checkpoint). No host
sync; CUDA-graph safe (two launches on the caller's stream).
"""

from __future__ import annotations

import torch
import triton

from replayssm_kernels._checks import check_launch_device, interpreting, launch_device
from replayssm_kernels.gdn_decode._validate import MAX_K_DECODE, validate_gdn_verify
from replayssm_kernels.gdn_decode.kernel import BLOCK_V, FOLD_ROWS, launch_tile
from replayssm_kernels.gdn_verify.fold import gdn_verify_fold_kernel, gdn_verify_fold_read_kernel
from replayssm_kernels.gdn_verify.window import gdn_verify_window_kernel
from replayssm_kernels.mamba2_decode.kernel import _sm_count as cuda_sm_count
from replayssm_kernels.mamba2_decode.read_copy import validate_read_copy
from replayssm_kernels.stochastic_round import validate_stochastic_rounding

__all__ = ["gdn_replay_verify", "gdn_replay_verify_fwd"]

#: Window launch, from an H200 sweep at T = 4, batch 256 (``benchmarks/RESULTS.md``, fourteenth
#: session): value rows per program, key columns per chunk, warps, software-pipelining stages.
#: Register-bound occupancy decides it: two warps and a whole value head per program were fastest.
WINDOW_BLOCK_V = 128
WINDOW_BLOCK_K = 32
WINDOW_WARPS = 2
WINDOW_STAGES = 3
#: Batches of at most ``SMALL_BATCH`` rows launch half a value head per program (``SMALL_BLOCK_V``):
#: twice the programs where the default grid leaves most SMs idle (H200, sixteenth session, T = 4:
#: batch 1 16.1 vs 22.3 us, batch 4 18.5 vs 23.4; batch 16 keeps the default, 34.5 vs 43.1).
SMALL_BATCH = 4
SMALL_BLOCK_V = 64
#: Fold launch as a program grid above ``FOLD_WORK_LIST_MAX_BATCH`` rows (``fold_tiles`` given:
#: that many tiles per program): one program per (row, value head), folding the head's value
#: tiles in turn, once the grid has at least this many (row, head) programs, else one program per
#: tile (H200, eighteenth session, T = 4: batch 256 322.9 vs 335.9 us, batch 1 19.4 vs 15.4 us with
#: a program per head; ``benchmarks/RESULTS.md``). Above the work list's batch every HV >= 1 gives
#: a program per head; the rule is kept for a smaller ``FOLD_WORK_LIST_MAX_BATCH`` (tests).
FOLD_HEAD_GRID = 1024
#: Fold launch as a work list (``fold.py``, the default): ``FOLD_PROGRAMS_PER_SM`` one-warp programs
#: per SM (offline sm_90a at the Qwen3.5-4B head with placeholder strides: 255 registers, no spills,
#: up to ``BLOCK_B`` 1024 and with a read copy; the program grid 254: 8 fit) over the flush rows'
#: items, when the batch has at most ``FOLD_WORK_LIST_MAX_BATCH`` rows (the program ranks the flush
#: flags in registers, ``BLOCK_B / 32`` per lane); a (row, head) item when there are at least
#: ``FOLD_HEAD_ITEMS`` of them per program, else a one-tile item. H100, twenty-seventh session,
#: T = 4, rows spread over the cycle: batch 64 / 256 / 512 108.8 / 350.2 / 671.4 us vs the program
#: grid's 134.4 / 369.0 / 695.2; 4 / 16 programs per SM and 2 items per program were slower or the
#: same (``benchmarks/notes/verify.md``).
FOLD_PROGRAMS_PER_SM = 8
FOLD_WORK_LIST_MAX_BATCH = 1024
FOLD_HEAD_ITEMS = 4
#: Fold launch, tree form (``K <= 128``): value rows per program tile and rows on lanes (``RL``).
#: The bits do not depend on them (the reduction tree is written out, ``_tree.py``; GPU-tested at
#: four other tiles); registers do: offline sm_90a at the Qwen3.5-4B head ``32 / 16`` compiles to
#: 240 per thread (8 one-warp programs per SM), ``16 / 8`` to 167 (12), ``8 / 8`` to 128 (16), for
#: 21% / 50% more instructions per state row. H200 (twenty-second session, ``benchmarks/RESULTS.md``):
#: every smaller tile is slower from batch 64 up (T = 4, batch 256 flush step 744 vs 841-977 us),
#: so ``32 / 16`` stays.
FOLD_BLOCK_V = BLOCK_V
FOLD_TREE_ROWS = FOLD_ROWS


def _precision(q: torch.Tensor, k: torch.Tensor) -> str:
    """``"split"`` when tf32 holds the raw q / k exactly (16-bit), else fp32 FMA (``"ieee"``)."""
    exact = (torch.bfloat16, torch.float16)
    return "split" if q.dtype in exact and k.dtype in exact else "ieee"


def _fold_tile(V: int, block_v: int | None, rows: int | None) -> tuple[int, int]:
    """``(BV, RL)`` of the tree-form fold launch for ``V`` value rows (``None``: the module's
    ``FOLD_BLOCK_V`` / ``FOLD_TREE_ROWS``; given values checked as the decode kernel's
    ``launch_tile`` checks them)."""
    try:
        bv, rl, _, _ = launch_tile(V, FOLD_BLOCK_V if block_v is None else block_v, rows, 1)
    except ValueError as e:  # name the keywords of this function
        raise ValueError(str(e).replace("block_v", "fold_block_v")) from None
    return bv, (min(FOLD_TREE_ROWS, bv) if rows is None else rl)


def _sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (the interpreter: 4)."""
    if interpreting() or device.type != "cuda":
        return 4
    return cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


def _fold_grid(device: torch.device, batch: int, HV: int, n_tiles: int, tiles: int | None,
               programs: int | None, meta: dict) -> tuple[int, int, int]:
    """The fold launch's grid; sets ``meta``'s ``TILES`` / ``WORK_LIST`` / ``BLOCK_B`` /
    ``HEAD_ITEMS``.  ``tiles`` given: a program per (row, head, ``tiles`` tiles); else a work
    list of ``programs`` (default ``FOLD_PROGRAMS_PER_SM`` per SM) up to
    ``FOLD_WORK_LIST_MAX_BATCH`` rows, a program per (row, head) or per tile above."""
    if tiles is not None and (tiles < 1 or n_tiles % tiles):
        raise ValueError(f"fold_tiles: expected a divisor of the {n_tiles} value tiles per head, "
                         f"got {tiles}")
    if programs is not None and programs < 1:
        raise ValueError(f"fold_programs: expected >= 1, got {programs}")
    if programs is not None and (tiles is not None or batch > FOLD_WORK_LIST_MAX_BATCH):
        raise ValueError(f"fold_programs: sets the work list's grid, which runs without fold_tiles "
                         f"and up to {FOLD_WORK_LIST_MAX_BATCH} rows; got fold_tiles={tiles}, "
                         f"batch {batch}")
    meta.update(WORK_LIST=False, BLOCK_B=1, HEAD_ITEMS=FOLD_HEAD_ITEMS)
    if tiles is None and batch <= FOLD_WORK_LIST_MAX_BATCH:
        if programs is None:
            programs = FOLD_PROGRAMS_PER_SM * _sm_count(device)
        meta.update(TILES=1, WORK_LIST=True, BLOCK_B=max(triton.next_power_of_2(batch), 32))
        return (min(programs, batch * HV * n_tiles), 1, 1)
    if tiles is None:
        tiles = n_tiles if batch * HV >= FOLD_HEAD_GRID else 1
    meta["TILES"] = tiles
    return (n_tiles // tiles, HV, batch)


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
    block_v: int | None = None,
    block_k: int = WINDOW_BLOCK_K,
    num_warps: int = WINDOW_WARPS,
    num_stages: int = WINDOW_STAGES,
    precision: str | None = None,
    maxnreg: int | None = None,
    fold_block_v: int | None = None,
    fold_rows: int | None = None,
    fold_tiles: int | None = None,
    fold_programs: int | None = None,
) -> None:
    """Both launches without checks (caller: ``gdn_replay_verify``).

    The fold launch is fixed (the decode kernel's tree form for ``K <= 128``, SGLang's packed-decode
    tile above; both give SGLang's bits, the bitwise checkpoint claim). ``block_v`` / ``block_k`` /
    ``num_warps`` / ``num_stages`` shape the window launch (outputs only; any value is exact in the
    same sense; ``block_v`` defaults to ``SMALL_BLOCK_V`` for at most ``SMALL_BATCH`` rows, else
    ``WINDOW_BLOCK_V``); ``precision`` overrides its product precision (``"split"``, ``"ieee"``,
    ``"tf32x3"``; default by q / k dtype); ``maxnreg`` caps the window launch's registers per
    thread (ptxas; ``None``: the compiler's choice; ignored by the interpreter). ``fold_block_v``
    / ``fold_rows`` shape the fold launch's tree form (value rows per tile, rows on lanes; powers
    of two; ``None``: ``FOLD_BLOCK_V`` / ``FOLD_TREE_ROWS``), the same bits at any value at K = 128
    (compiled; smaller K: ``gdn_decode/_tree.py``); SGLang's tile (``K > 128``) ignores them.
    ``fold_tiles``: a program per (row, head, ``fold_tiles`` value tiles folded one after
    another; a divisor of the head's tile count); ``None``: the work list
    (``fold.py``) of ``fold_programs`` programs (``None``: ``FOLD_PROGRAMS_PER_SM`` per SM) up to
    ``FOLD_WORK_LIST_MAX_BATCH`` rows, above a program per (row, head) from ``FOLD_HEAD_GRID``
    pairs on, else per tile.  Every choice folds the same tiles in the same op order (same bits).

    Raises
    ------
    ValueError
        ``fold_block_v`` or ``fold_rows`` not a power of two, ``fold_rows > fold_block_v``, or
        ``fold_tiles`` not a divisor of the head's tile count, ``fold_programs < 1``, or
        ``fold_programs`` with ``fold_tiles`` or above ``FOLD_WORK_LIST_MAX_BATCH`` rows.
    """
    batch, T, Hk, K = q.shape
    HV, V = state.shape[1], state.shape[2]
    R = ring_k.shape[2]
    if batch == 0:
        return
    BK = triton.next_power_of_2(K)
    ring_strides = (*state.stride(), *ring_k.stride(), *ring_v.stride(), *ring_g.stride(),
                    *ring_beta.stride())  # fmt: skip
    cursors = (slot_idx, ring_start, ring_len, flush)
    # The fold: the decode kernel's tree form for K <= 128 (RL rows on lanes), SGLang's tile
    # (RL = 0) above.
    tree = K <= MAX_K_DECODE
    if tree:
        fold_bv, fold_rl = _fold_tile(V, fold_block_v, fold_rows)
    else:
        fold_bv, fold_rl = min(triton.next_power_of_2(V), BLOCK_V), 0
    fold_meta = dict(H=Hk, HV=HV, K=K, V=V, BK=max(BK, 4) if tree else BK, BV=fold_bv,
                     RL=fold_rl, USE_QK_L2NORM=use_qk_l2norm, SR=sr_seed is not None,
                     num_warps=1, num_stages=1)  # fmt: skip
    n_tiles = triton.cdiv(V, fold_bv)
    grid = _fold_grid(state.device, batch, HV, n_tiles, fold_tiles, fold_programs, fold_meta)
    if read_state is None:
        gdn_verify_fold_kernel[grid](
            state, ring_k, ring_v, ring_g, ring_beta, *cursors, sr_seed, R, sr_layer, batch,
            *ring_strides, **fold_meta,
        )  # fmt: skip
        read_strides = (0,) * 7
    else:
        read_strides = (*read_state.stride(),
                        *(read_scale.stride() if read_scale is not None else (0, 0, 0)))
        gdn_verify_fold_read_kernel[grid](
            state, ring_k, ring_v, ring_g, ring_beta, *cursors, read_state, read_scale, sr_seed,
            R, sr_layer, batch, *ring_strides, *read_strides, READ_FP8=read_scale is not None,
            **fold_meta,
        )  # fmt: skip

    if block_v is None:
        block_v = SMALL_BLOCK_V if batch <= SMALL_BATCH else WINDOW_BLOCK_V
    BV = max(16, min(triton.next_power_of_2(V), block_v))
    BKC = max(16, min(BK, block_k))
    grid = (triton.cdiv(V, BV), HV, batch)
    gdn_verify_window_kernel[grid](
        state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, out,
        *cursors, float(scale), read_state, read_scale, R,
        *state.stride(), *ring_u.stride(), *ring_k.stride(), *ring_v.stride(),
        *ring_g.stride(), *ring_beta.stride(), *q.stride(), *k.stride(), *v.stride(),
        *a.stride(), *b.stride(), *out.stride(), *read_strides,
        H=Hk, HV=HV, K=K, V=V, T=T, BK=max(BK, BKC), BKC=BKC, BV=BV,
        NX=max(16, triton.next_power_of_2(2 * T)),
        NH=max(16, triton.next_power_of_2(max(R - T, 1))), LOG2T=(T - 1).bit_length(),
        SOFTPLUS_THRESHOLD=20.0, USE_QK_L2NORM=use_qk_l2norm, HAS_READ=read_state is not None,
        READ_FP8=read_scale is not None, PRECISION=precision or _precision(q, k),
        num_warps=num_warps, num_stages=num_stages,
        **({} if maxnreg is None or interpreting() else {"maxnreg": maxnreg}),
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
    batch_invariant: bool = False,
) -> None:
    """Verify ``T`` tokens per row (linear draft chain) on the Gated DeltaNet ReplaySSM ring.

    Per row ``b`` with slot ``s = slot_idx[b]`` (``-1``: padding, touches nothing, ``out[b]``
    untouched) and cursor snapshot ``(ring_start[b], ring_len[b], flush[b])``:

    * non-flush: ``out[b, t]`` for every window token from the checkpoint ``state[s]``, the
      committed records ``[0, ring_len[b])`` and the window, without forming a state (one pass
      over ``state[s]`` as ``S0·X``, the history's stored updates, the window's triangular
      system; ``window.py``).  ``state[s]`` is not written.
    * flush: the committed records ``[0, ring_len[b])`` are folded sequentially into ``state[s]``
      from the raw inputs in the conventional packed-decode op order (``gdn_replay_decode``'s fold)
      and ``state[s]`` is written once (``fold.py``); the window then runs from the stored
      checkpoint with an empty history.

    Both write the T window records ``(u, raw k, raw v, g, β)`` at physical ring rows
    ``(ring_start[b] + ring_len[b] + t) % R``, ``t < T``, accepted or not (the commit keeps the
    accepted ones).  The caller guarantees ``ring_len[b] + T <= R`` on non-flush rows and
    ``ring_len[b] <= R`` on flush rows (not checked: on device): a flush row's window may wrap
    over its own history, which the fold launch has folded before the window launch runs
    (``verify_cursor_step(late_flush=True)``).
    β is ``sigmoid(b)`` rounded to ``b.dtype``, as ``gdn_replay_decode`` and SGLang's packed decode
    use it, so a later fold of these records reproduces that kernel's checkpoint.

    Split precision (optional ``read_state``, as ``gdn_replay_decode``): non-flush rows start from
    the read copy ``read_state[s]`` (fp8: times ``read_scale[s]``) instead of the checkpoint, which
    they do not read; the history and the window run from those values.  Flush rows fold
    into ``state[s]`` exactly as without a copy (same bits), store it, refresh ``read_state[s]``
    (and ``read_scale[s]``) from the checkpoint as stored
    (``replayssm_kernels.mamba2_decode.read_copy``, rows = V, scaled over K), and run the window
    from the refreshed copy, so every output and ``u`` of a launch with a copy comes from the copy
    (the window reads one tensor, in one tf32 product).  The checkpoint never depends on the copy.

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
    batch_invariant : bool
        Pin the window launch to one value tile at every batch (``WINDOW_BLOCK_V``; by default
        ``SMALL_BLOCK_V`` for at most ``SMALL_BATCH`` rows), so a row's outputs and records come
        from the same compiled kernel and the same programs whatever else is in the batch
        (SGLang's ``--enable-deterministic-inference``; kernels/README.md, "Batch invariance").
        The fold launch keeps its work list: every grid of it gives the per-row grid's bits.

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
    check_launch_device("state", state)
    with launch_device(state):
        gdn_replay_verify_fwd(
            state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, out,
            slot_idx, ring_start, ring_len, flush, scale=scale, use_qk_l2norm=use_qk_l2norm,
            read_state=read_state, read_scale=read_scale, sr_seed=sr_seed, sr_layer=sr_layer,
            block_v=WINDOW_BLOCK_V if batch_invariant else None,
        )  # fmt: skip
