"""Plain-torch reference of ``refresh_read_copy``: same signature, same in-place semantics.

``quantize_rows`` (``mamba2_decode/read_copy.py``) of the gathered checkpoint rows, scattered into
the copy: the unfused path ``ReplayMambaPool.refresh_read`` used before the kernel, except that
padding (``slots < 0``) is dropped instead of being clamped to the null slot 0. Dropping it is a
boolean mask, a data-dependent shape: on a CUDA tensor it syncs with the host. It is the CPU
serving path (and the tests' oracle), never the GPU one.
"""

from __future__ import annotations

import torch

from replayssm_kernels.mamba2_decode.read_copy import quantize_rows
from replayssm_kernels.read_copy_refresh._validate import validate_refresh

__all__ = ["refresh_read_copy_ref"]


def refresh_read_copy_ref(
    state: torch.Tensor,
    read_state: torch.Tensor,
    read_scale: torch.Tensor | None,
    slots: torch.Tensor,
    *,
    layer_idx: int | None = None,
) -> None:
    """Reference of ``replayssm_kernels.refresh_read_copy`` (see its docstring; same contract,
    same bits). Syncs on a CUDA ``slots`` (the padding mask)."""
    validate_refresh(state, read_state, read_scale, slots, layer_idx)
    idx = slots[slots >= 0].to(torch.int64)
    if idx.numel() == 0:
        return
    if state.dim() == 4:  # one layer's [slots, A, B, n]
        state, read_state, layer_idx = state[None], read_state[None], 0
        read_scale = None if read_scale is None else read_scale[None]
    if layer_idx is None:
        q, scale = quantize_rows(state[:, idx], read_state.dtype)
        read_state[:, idx] = q
        if scale is not None:
            read_scale[:, idx] = scale
    else:
        q, scale = quantize_rows(state[layer_idx, idx], read_state.dtype)
        read_state[layer_idx, idx] = q
        if scale is not None:
            read_scale[layer_idx, idx] = scale
