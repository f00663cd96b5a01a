"""Plain-torch reference of ``gdn_replay_verify``: same signature, same in-place semantics.

fp32 arithmetic, one row at a time, all value heads at once.  Flush rows run the sequential fold in
the conventional kernel's expression order (torch's reductions: close to the kernel, not bitwise);
the window uses the chunkwise closed form (inner-product history term, forward substitution), not
the kernel's recurrent form, so the two are independent derivations of the same outputs.  With a
split-precision read copy, every row's window takes ``S0`` from the dequantised copy, which flush
rows first refresh with ``quantize_rows`` (``mamba2_decode/read_copy.py``), the kernel's bits.
"""

from __future__ import annotations

import torch

from replayssm_kernels.gdn_decode._validate import validate_gdn_verify
from replayssm_kernels.mamba2_decode.read_copy import (
    dequantize_rows,
    quantize_rows,
    validate_read_copy,
)
from replayssm_kernels.stochastic_round import round_slot_sr_ref, validate_stochastic_rounding

__all__ = ["gdn_replay_verify_ref"]

_F32 = torch.float32


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    # Division form over the last dim, as the conventional kernel: x / sqrt(Σx² + 1e-6).
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def gdn_replay_verify_ref(
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
    """Reference of ``replayssm_kernels.gdn_verify.gdn_replay_verify`` (see its docstring).

    ``batch_invariant`` is accepted for the kernel's signature and has no effect: the reference has no
    launch configuration (it is not claimed batch invariant: torch's batched ops may round by batch).

    Same arguments, same in-place updates of ``state`` (flush rows), the ring tensors (window rows
    of every live row), ``out`` (non-padding rows) and, with a split-precision copy,
    ``read_state`` / ``read_scale`` (flush rows: ``quantize_rows`` of the stored checkpoint).
    With ``sr_seed`` (fp16 ``state``) flush rows store ``round_slot_sr_ref`` of the folded state.
    Reads the per-row cursors (and ``sr_seed``) on the host and raises ``ValueError`` if a row
    breaks ``ring_len + T <= R``.
    """
    dims = validate_gdn_verify(
        state, ring_u, ring_k, ring_v, ring_g, ring_beta, q, k, v, a, b, A_log, dt_bias, out,
        slot_idx, ring_start, ring_len, flush, scale,
    )  # fmt: skip
    validate_read_copy(state, read_state, read_scale)
    validate_stochastic_rounding(state, sr_seed, sr_layer)
    seed = None if sr_seed is None else int(sr_seed[0])
    group = dims.HV // dims.Hk
    R, T = dims.R, dims.T
    A = -torch.exp(A_log.to(_F32))
    dtb = dt_bias.to(_F32)
    slots_h = slot_idx.tolist()
    starts = ring_start.tolist()
    lens = ring_len.tolist()
    flushes = flush.tolist()
    causal = torch.ones(T, T, dtype=torch.bool, device=state.device).tril()  # [s, s'] s' <= s

    def norm(x: torch.Tensor) -> torch.Tensor:
        return _l2norm(x) if use_qk_l2norm else x

    for i_n in range(dims.batch):
        s = int(slots_h[i_n])
        if s < 0:
            continue
        start, n = int(starts[i_n]), int(lens[i_n])
        # A flush row folds its history before its window is written, so the window may wrap
        # over it (``verify_cursor_step``'s late rule): len <= R; other rows need len + T <= R.
        top = R if flushes[i_n] else R - T
        if n < 0 or n > top:
            kind = "flush row: len <= R" if flushes[i_n] else "len <= R - T"
            raise ValueError(f"ring_len[{i_n}]: expected 0 <= len, {kind} = {top}, got {n}")
        rows = [(start + r) % R for r in range(n)]

        x = a[i_n].to(_F32) + dtb  # [T, HV]
        softplus_x = torch.where(x <= 20.0, torch.log(1.0 + torch.exp(x)), x)
        g = A * softplus_x  # [T, HV]
        beta = torch.sigmoid(b[i_n].to(_F32)).to(b.dtype).to(_F32)  # packed-decode β
        kh = norm(k[i_n].to(_F32)).repeat_interleave(group, 1)  # [T, HV, K]
        qh = (norm(q[i_n].to(_F32)) * scale).repeat_interleave(group, 1)
        vw = v[i_n].to(_F32)  # [T, HV, V]

        if flushes[i_n]:
            S = state[s].to(_F32).clone()  # [HV, V, K]
            for r in rows:
                kj = norm(ring_k[s, :, r].to(_F32)).repeat_interleave(group, 0)
                vj = ring_v[s, :, r].to(_F32)
                S = S * torch.exp(ring_g[s, :, r])[:, None, None]
                vj = vj - (S * kj[:, None, :]).sum(-1)
                vj = vj * ring_beta[s, :, r][:, None]
                S = S + vj[:, :, None] * kj[:, None, :]
            if seed is None:
                state[s] = S.to(state.dtype)
            else:  # stochastic rounding of the fp16 checkpoint
                state[s] = round_slot_sr_ref(S, seed, sr_layer, s)
            if read_state is not None:  # refresh the copy from the checkpoint as stored
                qc, sc = quantize_rows(state[s], read_state.dtype)
                read_state[s] = qc
                if sc is not None:
                    read_scale[s] = sc
            if read_state is None:
                S0 = state[s].to(_F32)  # the window runs from the stored checkpoint
            else:  # ... or from its refreshed copy
                S0 = dequantize_rows(read_state[s], None if read_scale is None else read_scale[s])
            n_hist = 0
        elif read_state is None:
            S0 = state[s].to(_F32)
            n_hist = n
        else:  # split precision: non-flush rows read the copy, never the checkpoint
            S0 = dequantize_rows(read_state[s], None if read_scale is None else read_scale[s])
            n_hist = n
        hk = torch.einsum("hvk,thk->thv", S0, kh)  # [T, HV, V]
        hq = torch.einsum("hvk,thk->thv", S0, qh)
        if n_hist > 0:
            kr = ring_k[s][:, rows].to(_F32)  # [Hk, n, K] raw
            if use_qk_l2norm:
                kr = _l2norm(kr)
            kr = kr.repeat_interleave(group, 0)  # [HV, n, K]
            kk = torch.einsum("hnk,thk->thn", kr, kh)
            kq = torch.einsum("hnk,thk->thn", kr, qh)
            gr = ring_g[s][:, rows]  # [HV, n]
            w = torch.exp(gr.flip(-1).cumsum(-1).flip(-1) - gr)  # ω_j = exp(Σ_{i>j} g_i)
            ur = ring_u[s][:, rows].to(_F32)  # [HV, n, V]
            decay = torch.exp(gr.sum(-1))[None, :, None]
            hk = decay * hk + torch.einsum("thn,hnv->thv", kk * w, ur)
            hq = decay * hq + torch.einsum("thn,hnv->thv", kq * w, ur)

        G = g.cumsum(0)  # [T, HV] local cumulative gates
        eG = torch.exp(G)
        dG = torch.exp(G[:, None, :] - G[None, :, :])  # [s, s', HV] = e^{G_s - G_s'}
        KK = torch.einsum("shk,phk->sph", kh, kh)  # [s, s', HV]
        KQ = torch.einsum("phk,shk->sph", kh, qh)  # [s, s', HV] = k̂_s'·q̃_s
        Am = torch.where(causal[:, :, None] & ~torch.eye(T, dtype=torch.bool, device=causal.device)[:, :, None],
                         beta[:, None, :] * dG * KK, 0.0)  # fmt: skip
        F = torch.where(causal[:, :, None], dG * KQ, 0.0)  # [s, s', HV]
        Rm = beta[:, :, None] * (vw - eG[:, :, None] * hk)  # [T, HV, V]
        U = torch.zeros_like(Rm)
        for t in range(T):  # forward substitution: (I + A) U = R
            U[t] = Rm[t] - torch.einsum("ph,phv->hv", Am[t, :t], U[:t])
        y = eG[:, :, None] * hq + torch.einsum("sph,phv->shv", F, U)
        out[i_n] = y.to(out.dtype)

        wr = [(start + n + t) % R for t in range(T)]
        ring_u[s][:, wr] = U.transpose(0, 1).to(ring_u.dtype)
        ring_k[s][:, wr] = k[i_n].transpose(0, 1)
        ring_v[s][:, wr] = v[i_n].transpose(0, 1)
        ring_g[s][:, wr] = g.transpose(0, 1)
        ring_beta[s][:, wr] = beta.transpose(0, 1)
