"""Argument validation shared by ``mamba2_replay_verify`` and ``mamba2_replay_verify_ref``.

The per-token tensors carry a window dim ``T`` (dim 1); everything else is checked by the decode
validator on the ``t = 0`` slices, so decode and verify refuse the same layouts with the same
messages.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replayssm_kernels._checks import check_tensor
from replayssm_kernels.mamba2_decode._validate import Mamba2DecodeDims, validate_mamba2_decode

__all__ = ["Mamba2VerifyDims", "validate_mamba2_verify"]


@dataclass(frozen=True)
class Mamba2VerifyDims:
    dims: Mamba2DecodeDims  # sizes and per-head strides, as for decode
    T: int
    stride_dt_T: int


def validate_mamba2_verify(
    state, ring_x, ring_dt, ring_B, x, dt, A, B, C, out, slot_idx, ring_start, ring_len, flush,
    D, z, dt_bias,
) -> Mamba2VerifyDims:
    """Check every argument of a Mamba-2 ReplaySSM verify call; return its sizes.

    Raises
    ------
    ValueError
        On any shape, dtype, stride or device mismatch, naming expected and actual.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError(f"x: expected shape (batch, T, H, P), got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    batch, T = x.shape[0], x.shape[1]
    if T < 1:
        raise ValueError(f"x: expected T >= 1 window tokens, got shape {tuple(x.shape)}")
    for name, t, rank in (("dt", dt, None), ("B", B, 4), ("C", C, 4), ("out", out, 4),
                          ("z", z, 4)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.dim() < 3 or (rank and t.dim() != rank):
            want = "(batch, T, H) or (batch, T, H, P)" if name == "dt" else "(batch, T, ...)"
            raise ValueError(f"{name}: expected shape {want}, got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else t}")
        if tuple(t.shape[:2]) != (batch, T):
            raise ValueError(f"{name}: expected leading dims (batch, T) = ({batch}, {T}), got "
                             f"{tuple(t.shape)}")
    R = ring_x.shape[2] if isinstance(ring_x, torch.Tensor) and ring_x.dim() == 4 else None
    if R is not None and R < T:
        raise ValueError(f"ring_x: expected at least T = {T} ring rows, got {R}")
    dims = validate_mamba2_decode(
        state, ring_x, ring_dt, ring_B, x[:, 0], dt[:, 0], A, B[:, 0], C[:, 0], out[:, 0],
        slot_idx, ring_start, ring_len, flush, D, None if z is None else z[:, 0], dt_bias,
    )
    check_tensor("x", x, (dims.batch, T, dims.H, dims.P), (x.dtype,))
    return Mamba2VerifyDims(dims=dims, T=T, stride_dt_T=dt.stride(1))
