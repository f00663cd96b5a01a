"""Float64 sequential Mamba-2 recurrence: the yardstick every Mamba-2 kernel is checked against.

This is the conventional decode recurrence of ``selective_state_update`` (math.md §1), one token
after the other, for one request, entirely in float64: the raw dt, dt_bias and A are converted to
float64 before Δ = softplus(dt + dt_bias) is formed, so the result is the exact-arithmetic answer
up to float64 rounding, not a replica of any fp32 op order.
"""

from __future__ import annotations

import torch

__all__ = ["mamba2_conventional_f64"]


def _softplus_f64(u: torch.Tensor) -> torch.Tensor:
    # Same threshold as the conventional kernel: softplus(u) = u above 20.
    return torch.where(u <= 20.0, torch.log1p(torch.exp(torch.clamp(u, max=20.0))), u)


def _per_head_dim(name: str, t: torch.Tensor, H: int, P: int) -> torch.Tensor:
    """Return a float64 ``[H, P]`` view of a ``[H]`` or ``[H, P]`` per-head parameter."""
    if t.dim() == 1 and t.shape[0] == H:
        return t.to(torch.float64)[:, None].expand(H, P)
    if t.dim() == 2 and tuple(t.shape) == (H, P):
        return t.to(torch.float64)
    raise ValueError(f"{name}: expected shape ({H},) or ({H}, {P}), got {tuple(t.shape)}")


def mamba2_conventional_f64(
    state0: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the conventional Mamba-2 decode recurrence over ``T`` tokens of one request in float64.

    Per token and head ``h`` (group ``g = h // (H // G)``)::

        Δ = softplus(dt + dt_bias)           (if dt_softplus; threshold 20)
        S = S * exp(A * Δ) + Δ * x ⊗ B_g
        y = S · C_g + D * x ;  y *= silu(z)  (if z is given)

    Parameters
    ----------
    state0 : torch.Tensor
        ``[H, P, N]`` initial state (any float dtype; read only).
    x : torch.Tensor
        ``[T, H, P]`` post-conv activations.
    dt : torch.Tensor
        ``[T, H]`` or ``[T, H, P]`` raw dt (before dt_bias and softplus); untied ``[T, H, P]`` is
        allowed here (this reference is general).
    A : torch.Tensor
        ``[H]`` or ``[H, P, N]`` (already ``-exp(A_log)``).
    B, C : torch.Tensor
        ``[T, G, N]``.
    D : torch.Tensor, optional
        ``[H]`` or ``[H, P]`` skip coefficient.
    z : torch.Tensor, optional
        ``[T, H, P]`` gate; the output is multiplied by ``silu(z)``.
    dt_bias : torch.Tensor, optional
        ``[H]`` or ``[H, P]``.
    dt_softplus : bool
        Apply softplus to ``dt + dt_bias``.

    Returns
    -------
    out_seq : torch.Tensor
        ``[T, H, P]`` float64 outputs.
    final_state : torch.Tensor
        ``[H, P, N]`` float64 state after the last token.
    """
    if state0.dim() != 3:
        raise ValueError(f"state0: expected shape (H, P, N), got {tuple(state0.shape)}")
    H, P, N = state0.shape
    if x.dim() != 3 or tuple(x.shape[1:]) != (H, P):
        raise ValueError(f"x: expected shape (T, {H}, {P}), got {tuple(x.shape)}")
    T = x.shape[0]
    if B.dim() != 3 or B.shape[0] != T or B.shape[2] != N:
        raise ValueError(f"B: expected shape ({T}, G, {N}), got {tuple(B.shape)}")
    G = B.shape[1]
    if G < 1 or H % G != 0:
        raise ValueError(f"B: expected a group count dividing H={H}, got G={G}")
    if tuple(C.shape) != tuple(B.shape):
        raise ValueError(f"C: expected shape {tuple(B.shape)}, got {tuple(C.shape)}")

    f64 = torch.float64
    if dt.dim() == 2 and tuple(dt.shape) == (T, H):
        dt64 = dt.to(f64)[:, :, None].expand(T, H, P)
    elif dt.dim() == 3 and tuple(dt.shape) == (T, H, P):
        dt64 = dt.to(f64)
    else:
        raise ValueError(f"dt: expected shape ({T}, {H}) or ({T}, {H}, {P}), got {tuple(dt.shape)}")
    if A.dim() == 1 and A.shape[0] == H:
        A64 = A.to(f64)[:, None, None].expand(H, P, N)
    elif A.dim() == 3 and tuple(A.shape) == (H, P, N):
        A64 = A.to(f64)
    else:
        raise ValueError(f"A: expected shape ({H},) or ({H}, {P}, {N}), got {tuple(A.shape)}")
    D64 = _per_head_dim("D", D, H, P) if D is not None else None
    bias64 = _per_head_dim("dt_bias", dt_bias, H, P) if dt_bias is not None else None
    if z is not None and tuple(z.shape) != (T, H, P):
        raise ValueError(f"z: expected shape ({T}, {H}, {P}), got {tuple(z.shape)}")

    heads_per_group = H // G
    S = state0.to(f64).clone()
    out = torch.empty((T, H, P), dtype=f64, device=state0.device)
    for t in range(T):
        delta = dt64[t]
        if bias64 is not None:
            delta = delta + bias64
        if dt_softplus:
            delta = _softplus_f64(delta)
        Bh = B[t].to(f64).repeat_interleave(heads_per_group, dim=0)  # [H, N]
        Ch = C[t].to(f64).repeat_interleave(heads_per_group, dim=0)
        xt = x[t].to(f64)  # [H, P]
        S = S * torch.exp(A64 * delta[:, :, None]) + (delta * xt)[:, :, None] * Bh[:, None, :]
        y = torch.einsum("hpn,hn->hp", S, Ch)
        if D64 is not None:
            y = y + D64 * xt
        if z is not None:
            zt = z[t].to(f64)
            y = y * (zt * torch.sigmoid(zt))
        out[t] = y
    return out, S
