"""Plain-torch reference of ``mamba2_replay_verify``: same signature, same in-place semantics.

A readable per-row loop (it syncs on the row metadata; never use it on a hot path). All math is
fp32: the exact fold ``S = S·exp(A·Δ) + (B·Δ)·x`` per committed record on flush rows (the
conventional kernel's op order), and the chunkwise output form of math.md §5.1 (per head
``O = S0·Q·Dg + V(W ⊙ KᵀQ) + D x``) for the window. With a read copy, non-flush rows take ``S0``
from the dequantised copy and flush rows refresh it from the checkpoint as stored.
"""

from __future__ import annotations

import torch

from replayssm_kernels.mamba2_decode.read_copy import (
    dequantize_rows,
    quantize_rows,
    validate_read_copy,
)
from replayssm_kernels.mamba2_verify._validate import validate_mamba2_verify
from replayssm_kernels.stochastic_round import round_slot_sr_ref, validate_stochastic_rounding

__all__ = ["mamba2_replay_verify_ref"]


def _softplus_f32(u: torch.Tensor) -> torch.Tensor:
    return torch.where(u <= 20.0, torch.log(torch.exp(u) + 1), u)


def mamba2_replay_verify_ref(
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
    """Reference of ``replayssm_kernels.mamba2_replay_verify`` (see its docstring).

    ``batch_invariant`` is accepted for the kernel's signature and has no effect: the reference has no
    launch configuration (it is not claimed batch invariant: torch's batched ops may round by batch).

    Raises
    ------
    ValueError
        On a wrong shape, dtype, stride (untied A / dt / dt_bias) or device, or a bad read copy;
        ``sr_seed`` with a non-fp16 ``state``.
    """
    vd = validate_mamba2_verify(
        state, ring_x, ring_dt, ring_B, x, dt, A, B, C, out, slot_idx, ring_start, ring_len,
        flush, D, z, dt_bias,
    )
    validate_read_copy(state, read_state, read_scale)
    validate_stochastic_rounding(state, sr_seed, sr_layer)
    seed = None if sr_seed is None else int(sr_seed[0])
    dims, T = vd.dims, vd.T
    H, P, R = dims.H, dims.P, dims.R
    hpg = H // dims.G
    f32 = torch.float32
    A_h = (A if A.dim() == 1 else A[:, 0, 0]).to(f32)  # [H]
    dt_h = dt if dt.dim() == 3 else dt[..., 0]  # [batch, T, H]
    bias_h = None
    if dt_bias is not None:
        bias_h = (dt_bias if dt_bias.dim() == 1 else dt_bias[:, 0]).to(f32)
    D_hp = None
    if D is not None:
        D_hp = (D[:, None].expand(H, P) if D.dim() == 1 else D).to(f32)

    for b in range(dims.batch):
        s = int(slot_idx[b])
        if s < 0:
            continue
        start, length, fl = int(ring_start[b]), int(ring_len[b]), bool(flush[b])

        xw = x[b].to(f32)  # [T, H, P]
        dw = dt_h[b].to(f32)  # [T, H]
        if bias_h is not None:
            dw = dw + bias_h
        if dt_softplus:
            dw = _softplus_f32(dw)
        Bw = B[b].to(f32).repeat_interleave(hpg, dim=1)  # [T, H, N]
        Cw = C[b].to(f32).repeat_interleave(hpg, dim=1)
        if fl or read_state is None:
            S = state[s].to(f32)  # [H, P, N]
        else:  # split precision: non-flush rows read the copy, never the checkpoint
            S = dequantize_rows(read_state[s], None if read_scale is None else read_scale[s])

        def record(j: int):
            r = (start + j) % R
            return (ring_x[s, :, r, :].to(f32), ring_dt[s, :, r],
                    ring_B[s, :, r, :].to(f32).repeat_interleave(hpg, dim=0))

        if fl:
            # Exact fold of the committed history only; the window stays in the ring.
            for j in range(length):
                xj, dtj, Bj = record(j)
                dA = torch.exp(A_h * dtj)
                dB = Bj * dtj[:, None]
                S = S * dA[:, None, None] + dB[:, None, :] * xj[:, :, None]
            if seed is None:
                state[s] = S.to(state.dtype)
            else:  # stochastic rounding of the fp16 checkpoint (outputs use the fp32 fold)
                state[s] = round_slot_sr_ref(S, seed, sr_layer, s)
            if read_state is not None:  # refresh the copy from the checkpoint as stored
                q, scale = quantize_rows(state[s], read_state.dtype)
                read_state[s] = q
                if scale is not None:
                    read_scale[s] = scale
            hist = 0
        else:
            hist = length

        cw = torch.cumsum(dw, dim=0)  # [T, H] inclusive window prefix
        # History newest first: sh_j = Δ-sum of the newer history records (exclusive).
        recs = [record(j) for j in reversed(range(hist))]
        if recs:
            xh = torch.stack([r[0] for r in recs])  # [h, H, P]
            dh = torch.stack([r[1] for r in recs])  # [h, H]
            Bh = torch.stack([r[2] for r in recs])  # [h, H, N]
            sh = torch.cumsum(dh, dim=0) - dh
            hsum = dh.sum(0)
        else:
            xh = S.new_zeros(0, H, P)
            dh = sh = S.new_zeros(0, H)
            Bh = S.new_zeros(0, H, Cw.shape[-1])
            hsum = S.new_zeros(H)
        # S0·Q Dg: decay of the checkpoint to window token s.
        sc = torch.einsum("hpn,thn->thp", S, Cw)  # [T, H, P]
        abar = torch.exp(A_h * (hsum + cw))  # [T, H]
        y = abar[:, :, None] * sc
        # V (W ⊙ KᵀQ), history part: W[j, s] = Δ_j exp(A (sh_j + cw_s)).
        kq_h = torch.einsum("jhn,shn->jsh", Bh, Cw)  # [h, T, H]
        w_h = dh[:, None, :] * torch.exp(A_h * (sh[:, None, :] + cw[None, :, :]))
        y = y + torch.einsum("jsh,jhp->shp", w_h * kq_h, xh)
        # Window part: W[t, s] = Δ_t exp(A (cw_s − cw_t)) for t <= s.
        kq_w = torch.einsum("thn,shn->tsh", Bw, Cw)  # [T, T, H]
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool, device=S.device)).T  # [t, s]: t <= s
        w_w = dw[:, None, :] * torch.exp(A_h * (cw[None, :, :] - cw[:, None, :]))
        w_w = torch.where(causal[:, :, None], w_w * kq_w, S.new_zeros(()))
        y = y + torch.einsum("tsh,thp->shp", w_w, xw)
        if D_hp is not None:
            y = y + xw * D_hp
        if z is not None:
            zb = z[b].to(f32)
            y = y * (zb * torch.sigmoid(zb))
        out[b] = y.to(out.dtype)

        # Append the window at physical rows (start + length + t) % R (flush rows too).
        for t in range(T):
            r = (start + length + t) % R
            ring_x[s, :, r, :] = x[b, t]
            ring_dt[s, :, r] = dw[t]
            ring_B[s, :, r, :] = B[b, t]
