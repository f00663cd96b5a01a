"""Mamba-2 ReplaySSM decode: one Triton launch for a mixed batch of flush and non-flush rows.

Layers (fla style): ``_mamba2_replay_decode_fwd_kernel`` (jit) → ``mamba2_replay_decode_fwd``
(launcher, no checks) → ``mamba2_replay_decode`` (public, validated).

Launch layout: grid ``(cdiv(P, BLOCK_P), H, batch)``; one program owns a ``[BLOCK_P, N]`` tile of
one head's checkpoint for one row and reads it exactly once. P-blocks and heads of one row are
adjacent in launch order, so a slot's checkpoint ``[H, P, N]`` streams contiguously and the
group's B records, read by ``H/G`` heads, hit L2.

- Padding row (``slot < 0``): the program returns before touching memory.
- Non-flush row: ``y = ā·(S0·C) + Σ_j λ_j Δ_j (B_j·C) x_j + D x`` (math.md §2), the current token
  being the last term; then the record ``(x, Δ, B)`` is appended at logical row ``ring_len``
  (``x`` by every P-block, ``Δ`` by P-block 0, ``B`` by P-block 0 of the group's first head).
  The checkpoint is not written.
- Flush row: the records ``[0, ring_len)`` and the current token are folded into the tile in
  ``selective_state_update``'s own fp32 expressions (``dA = exp(A·Δ)``, ``dB = B·Δ``,
  ``S = S·dA + dB·x``), the tile is stored once (a 16-bit state is rounded once, here), and
  ``y = S·C + D x``.

No autotune (the kernel writes the pool), no host sync, no data-dependent allocation: the launch is
CUDA-graph safe.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_kernels.mamba2_decode._validate import validate_mamba2_decode

__all__ = ["mamba2_replay_decode", "mamba2_replay_decode_fwd", "launch_config"]


@triton.jit
def _softplus(dt):
    # Verbatim the conventional kernel's softplus (Triton >= 3 branch), so Δ is bit-identical.
    dt = tl.where(dt <= 20.0, tl.math.log(tl.math.exp(dt) + 1), dt)
    return dt


@triton.jit
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
    # Dimensions
    P,
    N,
    R,
    heads_per_group,
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
    # Meta-parameters
    DT_SOFTPLUS: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr,
    HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_L: tl.constexpr,
    FOLD_UNROLL: tl.constexpr,
):
    i_p = tl.program_id(0)
    i_h = tl.program_id(1)
    i_b = tl.program_id(2)

    slot = tl.load(slot_idx_ptr + i_b).to(tl.int64)
    if slot < 0:
        return  # padding row: touches nothing, not even its output row
    start = tl.load(ring_start_ptr + i_b).to(tl.int32)
    length = tl.load(ring_len_ptr + i_b).to(tl.int32)
    do_flush = tl.load(flush_ptr + i_b)
    i_g = i_h // heads_per_group

    o_p = i_p * BLOCK_P + tl.arange(0, BLOCK_P)
    o_n = tl.arange(0, BLOCK_N)
    m_p = o_p < P
    m_n = o_n < N
    m_pn = m_p[:, None] & m_n[None, :]

    # Current token, loaded and processed exactly as selective_state_update's TIE_HDIM path.
    p_x = x_ptr + i_b * stride_x_batch + i_h * stride_x_head + o_p * stride_x_p
    b_x_raw = tl.load(p_x, mask=m_p, other=0.0)
    b_x = b_x_raw.to(tl.float32)
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

    # The checkpoint tile: read once, on every path.
    p_s = (
        state_ptr
        + slot * stride_state_slot
        + i_h * stride_state_head
        + o_p[:, None] * stride_state_p
        + o_n[None, :] * stride_state_n
    )
    b_s = tl.load(p_s, mask=m_pn, other=0.0).to(tl.float32)

    p_rx = ring_x_ptr + slot * stride_rx_slot + i_h * stride_rx_head + o_p * stride_rx_p
    p_rdt = ring_dt_ptr + slot * stride_rdt_slot + i_h * stride_rdt_head
    p_rB = ring_B_ptr + slot * stride_rB_slot + i_g * stride_rB_group + o_n * stride_rB_n

    if do_flush:
        # Exact fold: replay the committed raw records, then the current token, in the
        # conventional kernel's op order; the state stays fp32 in registers across tokens.
        # `S = S·dA + dB·x` is written as fma(S, dA, dB·x) because that is what
        # selective_state_update's `state * dA + dB * x[:, None]` compiles to (sm_90, Triton 3.6;
        # tests/kernels/test_mamba2_decode.py checks both kernels' PTX). Left to LLVM, the same
        # expression here was contracted the other way, fma(dB, x, S·dA), on one of the two
        # sites. The interpreter evaluates tl.fma unfused, as it evaluates SGLang's kernel.
        # The inner loop is unrolled with masked loads that do not depend on the state, so
        # FOLD_UNROLL record loads are in flight together instead of one latency per record.
        for c in range(0, length, FOLD_UNROLL):
            for jj in tl.static_range(FOLD_UNROLL):
                ok = c + jj < length
                row = (start + c + jj) % R
                b_xj = tl.load(p_rx + row * stride_rx_row, mask=m_p & ok, other=0.0)
                dtj = tl.load(p_rdt + row * stride_rdt_row, mask=ok, other=0.0)
                b_Bj = tl.load(p_rB + row * stride_rB_row, mask=m_n & ok, other=0.0)
                dA = tl.exp(A * dtj)
                dB = b_Bj.to(tl.float32) * dtj
                b_s = tl.where(ok, tl.fma(b_s, dA, dB * b_xj.to(tl.float32)[:, None]), b_s)
        dA = tl.exp(A * dt)
        dB = b_B * dt
        b_s = tl.fma(b_s, dA, dB * b_x[:, None])
        tl.store(p_s, b_s.to(p_s.dtype.element_ty), mask=m_pn)
        b_y = tl.sum(b_s * b_C[None, :], axis=1)
    else:
        # Inner-product route (math.md §2), a chunk of BLOCK_L records at a time, newest first:
        # λ_j = exp(A·s_j) with s_j the Δ-sum of every newer token (the current one included),
        # carried across chunks in `s_newer`; ā = exp(A·(all Δ)).
        b_acc = (dt * tl.sum(b_B * b_C)) * b_x
        s_newer = dt
        o_l = tl.arange(0, BLOCK_L)
        for c in range(0, length, BLOCK_L):
            j = length - 1 - c - o_l  # logical rows, newest first
            m_l = j >= 0
            row = (start + j) % R
            b_d = tl.load(p_rdt + row * stride_rdt_row, mask=m_l, other=0.0)
            p_Bj = p_rB + row[:, None] * stride_rB_row
            b_Bj = tl.load(p_Bj, mask=m_l[:, None] & m_n[None, :], other=0.0).to(tl.float32)
            p_xj = ring_x_ptr + slot * stride_rx_slot + i_h * stride_rx_head
            p_xj += row[:, None] * stride_rx_row + o_p[None, :] * stride_rx_p
            b_xj = tl.load(p_xj, mask=m_l[:, None] & m_p[None, :], other=0.0).to(tl.float32)
            b_beta = tl.sum(b_Bj * b_C[None, :], axis=1)  # B_j·C, [BLOCK_L]
            b_lam = tl.exp(A * (s_newer + (tl.cumsum(b_d, axis=0) - b_d)))
            b_acc += tl.sum((b_lam * b_d * b_beta)[:, None] * b_xj, axis=0)
            s_newer += tl.sum(b_d, axis=0)
        b_y = tl.exp(A * s_newer) * tl.sum(b_s * b_C[None, :], axis=1) + b_acc
        # Append the current record at logical row `length`.
        row = (start + length) % R
        tl.store(p_rx + row * stride_rx_row, b_x_raw, mask=m_p)
        tl.store(p_rdt + row * stride_rdt_row, dt, mask=i_p == 0)
        first = (i_p == 0) & (i_h % heads_per_group == 0)
        tl.store(p_rB + row * stride_rB_row, b_B_raw, mask=m_n & first)

    if HAS_D:
        b_D = tl.load(D_ptr + i_h * stride_D_head + o_p * stride_D_p, mask=m_p, other=0.0)
        b_y += b_x * b_D.to(tl.float32)
    if HAS_Z:
        p_z = z_ptr + i_b * stride_z_batch + i_h * stride_z_head + o_p * stride_z_p
        b_z = tl.load(p_z, mask=m_p, other=0.0).to(tl.float32)
        b_y *= b_z * tl.sigmoid(b_z)
    p_o = out_ptr + i_b * stride_out_batch + i_h * stride_out_head + o_p * stride_out_p
    tl.store(p_o, b_y.to(p_o.dtype.element_ty), mask=m_p)


def launch_config(P: int, N: int, R: int) -> tuple[int, int, int, int]:
    """Fixed launch parameters ``(BLOCK_P, BLOCK_L, FOLD_UNROLL, num_warps)``; no autotune (the
    kernel writes the pool).

    - ``BLOCK_P = 16`` divides Nano-4B's P = 80: 5 tiles of ``16 × 128``, 8 KiB of fp32 state per
      program, 16 elements per thread at 4 warps. Other P are masked; small P use one tile.
    - ``BLOCK_L = 16`` records per non-flush chunk: a whole L = 16 window in one chunk.
    - ``FOLD_UNROLL = 4``: four record loads in flight per fold step. At the Nano-4B shape (fp32
      state, bf16 activations, sm_90a, contiguous pool) ptxas reports 96 registers and no spills
      (5 CTAs per SM); 8 gives 128 registers with a spill, 16 gives 153.
    """
    block_p = min(16, triton.next_power_of_2(P))
    block_l = min(16, triton.next_power_of_2(R))
    num_warps = 4 if triton.next_power_of_2(N) * block_p >= 1024 else 2
    return block_p, block_l, 4, num_warps


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
    block_p: int | None = None,
    block_l: int | None = None,
    fold_unroll: int | None = None,
    num_warps: int | None = None,
) -> None:
    """Launch the kernel on validated arguments (no checks; see ``mamba2_replay_decode``).

    ``block_p`` / ``block_l`` / ``fold_unroll`` / ``num_warps`` override ``launch_config`` (tests,
    benchmarks and tuning only).
    """
    batch, H, P = x.shape
    N = state.shape[3]
    G = B.shape[1]
    R = ring_x.shape[2]
    if batch == 0:
        return
    bp, bl, fu, nw = launch_config(P, N, R)
    block_p = bp if block_p is None else block_p
    block_l = bl if block_l is None else block_l
    fold_unroll = fu if fold_unroll is None else fold_unroll
    num_warps = nw if num_warps is None else num_warps
    z_strides = (z.stride(0), z.stride(1), z.stride(2)) if z is not None else (0, 0, 0)
    grid = (triton.cdiv(P, block_p), H, batch)
    _mamba2_replay_decode_fwd_kernel[grid](
        state, ring_x, ring_dt, ring_B, x, dt, A, B, C, D, z, dt_bias, out,
        slot_idx, ring_start, ring_len, flush,
        P, N, R, H // G,
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
        DT_SOFTPLUS=dt_softplus,
        HAS_DT_BIAS=dt_bias is not None,
        HAS_D=D is not None,
        HAS_Z=z is not None,
        BLOCK_P=block_p,
        BLOCK_N=triton.next_power_of_2(N),
        BLOCK_L=block_l,
        FOLD_UNROLL=fold_unroll,
        num_warps=num_warps,
    )


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


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

    Raises
    ------
    ValueError
        On a wrong shape, dtype, stride (untied A / dt / dt_bias) or device, naming expected and
        actual.
    """
    dims = validate_mamba2_decode(
        state, ring_x, ring_dt, ring_B, x, dt, A, B, C, out, slot_idx, ring_start, ring_len,
        flush, D, z, dt_bias,
    )
    if state.device.type != "cuda" and not _interpreting():
        raise ValueError(
            "state: expected a CUDA tensor (or TRITON_INTERPRET=1 on CPU), "
            f"got device {state.device}"
        )
    launch = lambda: mamba2_replay_decode_fwd(  # noqa: E731
        state, ring_x, ring_dt, ring_B, x, dt, A, B, C, out, slot_idx, ring_start, ring_len,
        flush, D=D, z=z, dt_bias=dt_bias, dt_softplus=bool(dt_softplus),
        stride_dt=(dims.stride_dt_batch, dims.stride_dt_head),
        stride_A_head=dims.stride_A_head,
        stride_D=(dims.stride_D_head, dims.stride_D_p),
        stride_dt_bias_head=dims.stride_dt_bias_head,
    )
    if state.device.type == "cuda":
        with torch.cuda.device(state.device):
            launch()
    else:
        launch()
