"""Plain-torch reference of ``mamba2_replay_decode``: same signature, same in-place semantics.

A readable per-row loop (it syncs on the row metadata; never use it on a hot path). Everything is
fp32, in the kernel's expression order: the fold ``S = S·exp(A·Δ) + (B·Δ)·x`` per token, the
inner-product route for non-flush rows, newest record first.
"""

from __future__ import annotations

import torch

from replayssm_kernels.mamba2_decode._validate import validate_mamba2_decode
from replayssm_kernels.mamba2_decode.read_copy import (
    dequantize_rows,
    quantize_rows,
    validate_read_copy,
)
from replayssm_kernels.stochastic_round import round_slot_sr_ref, validate_stochastic_rounding

__all__ = ["mamba2_replay_decode_ref"]


def _softplus_f32(u: torch.Tensor) -> torch.Tensor:
    # The conventional kernel's softplus: log(exp(u) + 1) for u <= 20, else u.
    return torch.where(u <= 20.0, torch.log(torch.exp(u) + 1), u)


def mamba2_replay_decode_ref(
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
    """Reference of ``replayssm_kernels.mamba2_replay_decode`` (see its docstring; same contract).

    ``batch_invariant`` is accepted for the kernel's signature and has no effect: the reference has no
    launch configuration (it is not claimed batch invariant: torch's batched ops may round by batch).

    Raises
    ------
    ValueError
        On a wrong shape, dtype, stride (untied A / dt / dt_bias) or device; ``sr_seed`` with a
        non-fp16 ``state``.
    """
    dims = validate_mamba2_decode(
        state, ring_x, ring_dt, ring_B, x, dt, A, B, C, out, slot_idx, ring_start, ring_len,
        flush, D, z, dt_bias,
    )
    validate_read_copy(state, read_state, read_scale)
    validate_stochastic_rounding(state, sr_seed, sr_layer)
    seed = None if sr_seed is None else int(sr_seed[0])
    H, P, R = dims.H, dims.P, dims.R
    hpg = dims.H // dims.G
    f32 = torch.float32
    # Per-head scalars as [H] fp32 (the tied forms carry one value per head).
    A_h = (A if A.dim() == 1 else A[:, 0, 0]).to(f32)
    dt_h = dt if dt.dim() == 2 else dt[:, :, 0]
    bias_h = None
    if dt_bias is not None:
        bias_h = (dt_bias if dt_bias.dim() == 1 else dt_bias[:, 0]).to(f32)
    D_hp = None
    if D is not None:
        D_hp = (D[:, None].expand(H, P) if D.dim() == 1 else D).to(f32)

    for b in range(dims.batch):
        s = int(slot_idx[b])
        if s < 0:
            continue  # padding row: touches nothing
        start, length, fl = int(ring_start[b]), int(ring_len[b]), bool(flush[b])

        x_b = x[b].to(f32)  # [H, P]
        delta = dt_h[b].to(f32)  # [H]
        if bias_h is not None:
            delta = delta + bias_h
        if dt_softplus:
            delta = _softplus_f32(delta)
        B_b = B[b].to(f32).repeat_interleave(hpg, dim=0)  # [H, N]
        C_b = C[b].to(f32).repeat_interleave(hpg, dim=0)
        if fl or read_state is None:
            S = state[s].to(f32)  # [H, P, N], read once
        else:  # split precision: non-flush rows read the copy, never the checkpoint
            S = dequantize_rows(read_state[s], None if read_scale is None else read_scale[s])

        def record(j: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            r = (start + j) % R
            xj = ring_x[s, :, r, :].to(f32)
            dtj = ring_dt[s, :, r]
            Bj = ring_B[s, :, r, :].to(f32).repeat_interleave(hpg, dim=0)
            return xj, dtj, Bj

        if fl:
            for j in range(length):
                xj, dtj, Bj = record(j)
                dA = torch.exp(A_h * dtj)
                dB = Bj * dtj[:, None]
                S = S * dA[:, None, None] + dB[:, None, :] * xj[:, :, None]
            dA = torch.exp(A_h * delta)
            dB = B_b * delta[:, None]
            S = S * dA[:, None, None] + dB[:, None, :] * x_b[:, :, None]
            if seed is None:
                state[s] = S.to(state.dtype)
            else:  # stochastic rounding of the fp16 checkpoint
                state[s] = round_slot_sr_ref(S, seed, sr_layer, s)
            if read_state is not None:  # refresh the copy from the checkpoint as stored
                q, scale = quantize_rows(state[s], read_state.dtype)
                read_state[s] = q
                if scale is not None:
                    read_scale[s] = scale
            y = (S * C_b[:, None, :]).sum(-1)
        else:
            sc = (S * C_b[:, None, :]).sum(-1)  # [H, P]
            acc = (delta * (B_b * C_b).sum(-1))[:, None] * x_b
            lam = torch.exp(A_h * delta)
            for j in reversed(range(length)):
                xj, dtj, Bj = record(j)
                acc = acc + (lam * dtj * (Bj * C_b).sum(-1))[:, None] * xj
                lam = lam * torch.exp(A_h * dtj)
            y = lam[:, None] * sc + acc
            r = (start + length) % R
            ring_x[s, :, r, :] = x[b]
            ring_dt[s, :, r] = delta
            ring_B[s, :, r, :] = B[b]

        if D_hp is not None:
            y = y + x_b * D_hp
        if z is not None:
            z_b = z[b].to(f32)
            y = y * (z_b * torch.sigmoid(z_b))
        out[b] = y.to(out.dtype)
