"""Plain-torch reference of ``gdn_replay_decode``: same signature, same in-place semantics.

fp32 arithmetic, one row at a time.  Non-flush rows use the same inner-product form as the kernel;
flush rows run the sequential fold in the conventional kernel's expression order (the reductions
are torch's, so the reference is close to the kernel, not bitwise equal to it).
"""

from __future__ import annotations

import torch

from replayssm_kernels.gdn_decode._validate import validate_gdn_decode
from replayssm_kernels.mamba2_decode.read_copy import (
    dequantize_rows,
    quantize_rows,
    validate_read_copy,
)
from replayssm_kernels.row_order import validate_row_order
from replayssm_kernels.stochastic_round import round_slot_sr_ref, validate_stochastic_rounding

__all__ = ["gdn_replay_decode_ref"]

_F32 = torch.float32


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    # Division form over the last dim, as the conventional kernel: x / sqrt(Σx² + 1e-6).
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def gdn_replay_decode_ref(
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
    """Reference of ``replayssm_kernels.gdn_decode.gdn_replay_decode`` (see its docstring).

    Same arguments, same in-place updates of ``state`` (flush rows), the ring tensors (non-flush
    rows) and ``out`` (non-padding rows).  Reads the per-row cursors (and ``sr_seed``) on the host.

    ``batch_invariant`` is accepted for the kernel's signature and has no effect: the reference has no
    launch configuration (it is not claimed batch invariant: torch's batched ops may round by batch).
    """
    dims = validate_gdn_decode(
        state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, out,
        slot_idx, ring_start, ring_len, flush, scale,
    )  # fmt: skip
    validate_read_copy(state, read_state, read_scale)
    validate_stochastic_rounding(state, sr_seed, sr_layer)
    if row_order is not None:  # a launch order: no effect on the results
        validate_row_order(row_order, slot_idx.shape[0], slot_idx.device, unit_stride=True)
    seed = None if sr_seed is None else int(sr_seed[0])
    group = dims.HV // dims.Hk
    R = dims.R
    A = -torch.exp(A_log.to(_F32))  # per head, as -tl.exp(A_log) in the kernel
    dtb = dt_bias.to(_F32)
    slots_h = slot_idx.tolist()
    starts = ring_start.tolist()
    lens = ring_len.tolist()
    flushes = flush.tolist()

    def norm(x: torch.Tensor) -> torch.Tensor:
        return _l2norm(x) if use_qk_l2norm else x

    for i_n in range(dims.batch):
        s = int(slots_h[i_n])
        if s < 0:
            continue
        start, n = int(starts[i_n]), int(lens[i_n])
        rows = [(start + r) % R for r in range(n)]

        x = a[i_n].to(_F32) + dtb
        softplus_x = torch.where(x <= 20.0, torch.log(1.0 + torch.exp(x)), x)
        g = A * softplus_x  # [HV]
        beta = torch.sigmoid(b[i_n].to(_F32)).to(b.dtype).to(_F32)
        kh = norm(k[i_n].to(_F32)).repeat_interleave(group, 0)  # [HV, K]
        qh = (norm(q[i_n].to(_F32)) * scale).repeat_interleave(group, 0)
        vc = v[i_n].to(_F32)  # [HV, V]

        if flushes[i_n]:
            S = state[s].to(_F32).clone()  # [HV, V, K]
            for r in rows:
                kj = norm(ring_k[s, :, r].to(_F32)).repeat_interleave(group, 0)
                vj = ring_v[s, :, r].to(_F32)
                S = S * torch.exp(ring_g[s, :, r])[:, None, None]
                vj = vj - (S * kj[:, None, :]).sum(-1)
                vj = vj * ring_beta[s, :, r][:, None]
                S = S + vj[:, :, None] * kj[:, None, :]
            S = S * torch.exp(g)[:, None, None]
            u = (vc - (S * kh[:, None, :]).sum(-1)) * beta[:, None]
            S = S + u[:, :, None] * kh[:, None, :]
            out[i_n] = (S * qh[:, None, :]).sum(-1).to(out.dtype)
            if seed is None:
                state[s] = S.to(state.dtype)
            else:  # stochastic rounding of the fp16 checkpoint
                state[s] = round_slot_sr_ref(S, seed, sr_layer, s)
            if read_state is not None:  # refresh the copy from the checkpoint as stored
                qc, sc = quantize_rows(state[s], read_state.dtype)
                read_state[s] = qc
                if sc is not None:
                    read_scale[s] = sc
            continue

        if read_state is None:
            S0 = state[s].to(_F32)
        else:  # split precision: non-flush rows read the copy, never the checkpoint
            S0 = dequantize_rows(read_state[s], None if read_scale is None else read_scale[s])
        hk = (S0 * kh[:, None, :]).sum(-1)  # [HV, V]
        hq = (S0 * qh[:, None, :]).sum(-1)
        if n > 0:
            kr = ring_k[s][:, rows].to(_F32)  # [Hk, n, K] raw
            kc = kh[::group]  # [Hk, K] normalised current key
            qc = qh[::group]
            kk = torch.einsum("hnk,hk->hn", kr, kc)
            kq = torch.einsum("hnk,hk->hn", kr, qc)
            if use_qk_l2norm:
                rn = 1.0 / torch.sqrt((kr * kr).sum(-1) + 1e-6)
                kk, kq = kk * rn, kq * rn
            kk = kk.repeat_interleave(group, 0)  # [HV, n]
            kq = kq.repeat_interleave(group, 0)
            gr = ring_g[s][:, rows]  # [HV, n]
            suffix = gr.flip(-1).cumsum(-1).flip(-1) - gr  # Σ_{i>j} g_i
            w = torch.exp(suffix)
            ur = ring_u[s][:, rows].to(_F32)  # [HV, n, V]
            decay = torch.exp(gr.sum(-1))[:, None]
            hk = decay * hk + torch.einsum("hn,hnv->hv", w * kk, ur)
            hq = decay * hq + torch.einsum("hn,hnv->hv", w * kq, ur)
        alpha = torch.exp(g)[:, None]
        u = beta[:, None] * (vc - alpha * hk)
        out[i_n] = (alpha * hq + (kh * qh).sum(-1)[:, None] * u).to(out.dtype)

        wr = (start + n) % R
        ring_u[s, :, wr] = u.to(ring_u.dtype)
        ring_k[s, :, wr] = k[i_n]
        ring_v[s, :, wr] = v[i_n]
        ring_g[s, :, wr] = g
        ring_beta[s, :, wr] = beta
