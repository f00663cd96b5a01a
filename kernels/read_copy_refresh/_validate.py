"""Argument validation shared by ``refresh_read_copy`` and ``refresh_read_copy_ref``. Every check
raises ``ValueError`` naming expected and actual; metadata only (no device sync)."""

from __future__ import annotations

import torch

from replayssm_kernels._checks import STATE_DTYPES, check_same_device, check_tensor
from replayssm_kernels.mamba2_decode.read_copy import validate_read_copy

__all__ = ["validate_refresh"]


def validate_refresh(
    state: torch.Tensor,
    read_state: torch.Tensor,
    read_scale: torch.Tensor | None,
    slots: torch.Tensor,
    layer_idx: int | None,
) -> None:
    """Check a refresh call: ``state [layers, slots, A, B, n]`` (or one layer's ``[slots, A, B, n]``)
    fp32/bf16/fp16, its copy (as ``validate_read_copy``, a copy is required), ``slots [k]``
    int32/int64 on the same device, ``layer_idx`` None or (5-D only) an int in ``[0, layers)``."""
    if not isinstance(state, torch.Tensor):
        raise ValueError(f"state: expected a torch.Tensor, got {type(state).__name__}")
    if state.dim() not in (4, 5):
        raise ValueError(
            "state: expected shape (layers, slots, A, B, n) or one layer's (slots, A, B, n), "
            f"got {tuple(state.shape)}"
        )
    check_tensor("state", state, (None,) * state.dim(), STATE_DTYPES)
    if read_state is None:
        raise ValueError(
            f"read_state: expected a tensor of shape {tuple(state.shape)} (bf16 / fp16 / fp8 e4m3), got None"
        )
    validate_read_copy(state, read_state, read_scale)
    check_tensor("slots", slots, (None,), (torch.int32, torch.int64))
    check_same_device(state=state, read_state=read_state, read_scale=read_scale, slots=slots)
    if layer_idx is not None:
        if state.dim() == 4:
            raise ValueError(
                f"layer_idx: expected None for a one-layer state {tuple(state.shape)} (slots, A, B, n), "
                f"got {layer_idx!r}"
            )
        layers = state.shape[0]
        if isinstance(layer_idx, bool) or not isinstance(layer_idx, int):
            raise ValueError(
                f"layer_idx: expected None or an int in [0, {layers}), got {layer_idx!r} "
                f"({type(layer_idx).__name__})"
            )
        if not 0 <= layer_idx < layers:
            raise ValueError(f"layer_idx: expected None or an int in [0, {layers}), got {layer_idx}")
