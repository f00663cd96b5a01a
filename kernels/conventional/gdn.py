"""Float64 sequential Gated DeltaNet recurrence: the yardstick every GDN kernel is checked against.

This is the conventional decode recurrence of SGLang's
``fused_recurrent_gated_delta_rule_packed_decode`` (math.md §3), one token after the other, for one
request, in float64.  It is the exact-arithmetic answer up to float64 rounding, not a replica of any
fp32 op order, with one deliberate exception: β.  The conventional packed-decode kernel rounds
β = sigmoid(b) to the activation dtype (``b.dtype``) before it uses it, which is part of what the
model computes (a bf16 β differs from the fp32 one by up to 2^-9 relative), so this reference does
the same: β = sigmoid(b) in fp32, rounded to ``b.dtype``, then widened to float64.
"""

from __future__ import annotations

import torch

__all__ = ["gdn_conventional_f64", "gdn_beta", "gdn_log_gate_f64"]


def gdn_beta(b: torch.Tensor) -> torch.Tensor:
    """β as the conventional packed-decode kernel uses it: fp32 sigmoid rounded to ``b.dtype``.

    Returned as float32 (the value the ring stores in ``ring_beta``).
    """
    return torch.sigmoid(b.to(torch.float32)).to(b.dtype).to(torch.float32)


def gdn_log_gate_f64(a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """g = −exp(A_log)·softplus(a + dt_bias) in float64 (softplus threshold 20, as the kernel)."""
    x = a.to(torch.float64) + dt_bias.to(torch.float64)
    sp = torch.where(x <= 20.0, torch.log1p(torch.exp(torch.clamp(x, max=20.0))), x)
    return -torch.exp(A_log.to(torch.float64)) * sp


def gdn_conventional_f64(
    state0: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    *,
    scale: float,
    use_qk_l2norm: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the conventional GDN decode recurrence over ``T`` tokens of one request in float64.

    Per token and value head ``hv`` (key head ``h = hv // (HV // Hk)``)::

        q̂ = q / sqrt(‖q‖² + 1e-6),  k̂ = k / sqrt(‖k‖² + 1e-6)    (if use_qk_l2norm)
        q̃ = q̂ · scale
        g = −exp(A_log)·softplus(a + dt_bias),  α = exp(g),  β = bf16-rounded sigmoid(b)
        S ← α S;  u = β (v − S k̂);  S ← S + u k̂ᵀ;  y = S q̃

    Parameters
    ----------
    state0 : torch.Tensor
        ``[HV, V, K]`` initial state (any float dtype; read only).
    q, k : torch.Tensor
        ``[T, Hk, K]`` post-conv query / key (raw, before the l2 norm).
    v : torch.Tensor
        ``[T, HV, V]`` post-conv value.
    a, b : torch.Tensor
        ``[T, HV]`` gate inputs (``b``'s dtype sets the rounding of β).
    A_log, dt_bias : torch.Tensor
        ``[HV]``.
    scale : float
        Query scale (usually ``K ** -0.5``).
    use_qk_l2norm : bool
        Normalise q and k as the kernel does (division form, eps 1e-6 under the root).

    Returns
    -------
    out_seq : torch.Tensor
        ``[T, HV, V]`` float64 outputs.
    final_state : torch.Tensor
        ``[HV, V, K]`` float64 state after the last token.
    """
    if state0.dim() != 3:
        raise ValueError(f"state0: expected [HV, V, K], got shape {tuple(state0.shape)}")
    HV, V, K = state0.shape
    if q.dim() != 3 or q.shape[-1] != K:
        raise ValueError(f"q: expected [T, Hk, {K}], got {tuple(q.shape)}")
    T, Hk, _ = q.shape
    if tuple(k.shape) != (T, Hk, K):
        raise ValueError(f"k: expected {(T, Hk, K)}, got {tuple(k.shape)}")
    if tuple(v.shape) != (T, HV, V):
        raise ValueError(f"v: expected {(T, HV, V)}, got {tuple(v.shape)}")
    for name, t in (("a", a), ("b", b)):
        if tuple(t.shape) != (T, HV):
            raise ValueError(f"{name}: expected {(T, HV)}, got {tuple(t.shape)}")
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        if tuple(t.shape) != (HV,):
            raise ValueError(f"{name}: expected ({HV},), got {tuple(t.shape)}")
    if Hk <= 0 or HV % Hk != 0:
        raise ValueError(f"HV ({HV}) must be a multiple of Hk ({Hk})")

    f64 = torch.float64
    group = HV // Hk
    S = state0.to(f64).clone()
    qq = q.to(f64)
    kk = k.to(f64)
    if use_qk_l2norm:
        qq = qq / torch.sqrt((qq * qq).sum(-1, keepdim=True) + 1e-6)
        kk = kk / torch.sqrt((kk * kk).sum(-1, keepdim=True) + 1e-6)
    qq = (qq * scale).repeat_interleave(group, dim=1)  # [T, HV, K]
    kk = kk.repeat_interleave(group, dim=1)
    alpha = torch.exp(gdn_log_gate_f64(a, A_log, dt_bias))  # [T, HV]
    beta = gdn_beta(b).to(f64)
    vv = v.to(f64)

    out = torch.empty(T, HV, V, dtype=f64, device=state0.device)
    for t in range(T):
        S = S * alpha[t, :, None, None]
        hk = torch.einsum("hvk,hk->hv", S, kk[t])
        u = beta[t, :, None] * (vv[t] - hk)
        S = S + u[:, :, None] * kk[t][:, None, :]
        out[t] = torch.einsum("hvk,hk->hv", S, qq[t])
    return out, S
