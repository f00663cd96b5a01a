"""Argument validation shared by ``mamba2_replay_decode`` and ``mamba2_replay_decode_ref``.

Both take the same arguments and must refuse the same inputs, so the checks live here once. Every
check raises ``ValueError`` naming the argument, what was expected and what was given; nothing is
copied or converted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replayssm_kernels._checks import (
    FLOAT_DTYPES,
    STATE_DTYPES,
    check_index,
    check_no_overlap,
    check_same_device,
    check_tensor,
)

__all__ = ["Mamba2DecodeDims", "validate_mamba2_decode"]


@dataclass(frozen=True)
class Mamba2DecodeDims:
    """Sizes of one decode call, plus the per-head strides of the tied (broadcast) parameters."""

    batch: int
    slots: int
    H: int
    P: int
    N: int
    G: int
    R: int
    stride_dt_batch: int
    stride_dt_head: int
    stride_A_head: int
    stride_D_head: int
    stride_D_p: int
    stride_dt_bias_head: int


def _tied(name: str, t: torch.Tensor, dims: tuple[int, ...], how: str) -> None:
    """Refuse a non-broadcast (untied) tensor: the given dims must have stride 0 (or size 1)."""
    for d in dims:
        if t.shape[d] > 1 and t.stride(d) != 0:
            raise ValueError(
                f"{name}: expected a per-head value broadcast with stride 0 on dim {d} "
                f"(pass {how}), got shape {tuple(t.shape)} strides {t.stride()}; "
                "untied per-channel values are not supported"
            )


def validate_mamba2_decode(
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
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
) -> Mamba2DecodeDims:
    """Check every argument of a Mamba-2 ReplaySSM decode call; return its sizes.

    Raises
    ------
    ValueError
        On any shape, dtype, stride or device mismatch, naming expected and actual.
    """
    check_tensor("state", state, (None, None, None, None), STATE_DTYPES)
    slots, H, P, N = state.shape
    check_tensor("x", x, (None, H, P), FLOAT_DTYPES)
    batch = x.shape[0]
    check_tensor("B", B, (batch, None, N), FLOAT_DTYPES)
    G = B.shape[1]
    if G < 1 or H % G != 0:
        raise ValueError(f"B: expected a group count G dividing H={H}, got G={G}")
    check_tensor("C", C, (batch, G, N), FLOAT_DTYPES)
    check_tensor("out", out, (batch, H, P), FLOAT_DTYPES)

    check_tensor("ring_x", ring_x, (slots, H, None, P), (x.dtype,))
    R = ring_x.shape[2]
    if R < 1:
        raise ValueError(f"ring_x: expected at least 1 ring row, got shape {tuple(ring_x.shape)}")
    check_tensor("ring_dt", ring_dt, (slots, H, R), (torch.float32,))
    check_tensor("ring_B", ring_B, (slots, G, R, N), (B.dtype,))

    # dt: raw dt per head, [batch, H] or the mixer's stride-0 broadcast [batch, H, P].
    if dt.dim() == 2:
        check_tensor("dt", dt, (batch, H), FLOAT_DTYPES)
    else:
        check_tensor("dt", dt, (batch, H, P), FLOAT_DTYPES)
        _tied("dt", dt, (2,), "dt[:, :, None].expand(-1, -1, P) or the [batch, H] tensor")
    # A: one value per head, [H] or the mixer's stride-0 broadcast [H, P, N].
    if A.dim() == 1:
        check_tensor("A", A, (H,), FLOAT_DTYPES)
    else:
        check_tensor("A", A, (H, P, N), FLOAT_DTYPES)
        _tied("A", A, (1, 2), "A[:, None, None].expand(-1, P, N) or the [H] tensor")
    stride_D = (0, 0)
    if D is not None:
        if D.dim() == 1:
            check_tensor("D", D, (H,), FLOAT_DTYPES)
            stride_D = (D.stride(0), 0)
        else:
            # [H, P] with any strides: D is read per channel, as the conventional kernel reads it.
            check_tensor("D", D, (H, P), FLOAT_DTYPES)
            stride_D = (D.stride(0), D.stride(1))
    stride_bias = 0
    if dt_bias is not None:
        if dt_bias.dim() == 1:
            check_tensor("dt_bias", dt_bias, (H,), FLOAT_DTYPES)
        else:
            check_tensor("dt_bias", dt_bias, (H, P), FLOAT_DTYPES)
            _tied("dt_bias", dt_bias, (1,), "dt_bias[:, None].expand(-1, P) or the [H] tensor")
        stride_bias = dt_bias.stride(0)
    if z is not None:
        check_tensor("z", z, (batch, H, P), FLOAT_DTYPES)

    check_index("slot_idx", slot_idx, batch, unit_stride=True)
    check_index("ring_start", ring_start, batch, unit_stride=True)
    check_index("ring_len", ring_len, batch, unit_stride=True)
    check_tensor("flush", flush, (batch,), (torch.bool,), last_contiguous=True)
    check_no_overlap(state=state, ring_x=ring_x, ring_dt=ring_dt, ring_B=ring_B, out=out)

    check_same_device(
        state=state, ring_x=ring_x, ring_dt=ring_dt, ring_B=ring_B, x=x, dt=dt, A=A, B=B, C=C,
        out=out, slot_idx=slot_idx, ring_start=ring_start, ring_len=ring_len, flush=flush,
        D=D, z=z, dt_bias=dt_bias,
    )
    return Mamba2DecodeDims(
        batch=batch, slots=slots, H=H, P=P, N=N, G=G, R=R,
        stride_dt_batch=dt.stride(0), stride_dt_head=dt.stride(1),
        stride_A_head=A.stride(0),
        stride_D_head=stride_D[0], stride_D_p=stride_D[1],
        stride_dt_bias_head=stride_bias,
    )
