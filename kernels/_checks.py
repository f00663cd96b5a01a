"""Input validation shared by every public kernel wrapper.

Each check raises ``ValueError`` naming the argument, what was expected and what was given.
No check copies or converts: a wrong layout is refused, never fixed silently.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

__all__ = [
    "check_tensor",
    "check_same_device",
    "check_index",
    "check_launch_device",
    "interpreting",
    "FLOAT_DTYPES",
    "STATE_DTYPES",
]

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
STATE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_tensor(
    name: str,
    t: torch.Tensor,
    shape: Sequence[int | None],
    dtypes: Sequence[torch.dtype],
    *,
    last_contiguous: bool = False,
) -> None:
    """Check rank, sizes (``None`` = any) and dtype of ``t``.

    Parameters
    ----------
    name : str
        Argument name used in the message.
    t : torch.Tensor
        The tensor to check.
    shape : sequence of int or None
        Expected sizes; ``None`` accepts any size in that position.
    dtypes : sequence of torch.dtype
        Accepted dtypes.
    last_contiguous : bool
        Require ``t.stride(-1) == 1`` (kernels that load rows with vector loads).
    """
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    want = tuple("*" if s is None else s for s in shape)
    if t.dim() != len(shape) or any(s is not None and s != a for s, a in zip(shape, t.shape)):
        raise ValueError(f"{name}: expected shape {want}, got {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name}: expected dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    if last_contiguous and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name}: expected stride 1 on the last dim, got strides {t.stride()}")


def check_same_device(**tensors: torch.Tensor | None) -> None:
    """Check that every given (non-None) tensor is on one device."""
    devs = {k: v.device for k, v in tensors.items() if v is not None}
    if len(set(devs.values())) > 1:
        raise ValueError(f"expected all tensors on one device, got {devs}")


def check_index(name: str, t: torch.Tensor, batch: int) -> None:
    """Check a per-row int index/cursor vector of length ``batch``."""
    check_tensor(name, t, (batch,), (torch.int32, torch.int64))


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET`` set, not 0)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_launch_device(name: str, t: torch.Tensor) -> None:
    """Refuse a tensor a Triton kernel cannot run on: not CUDA, and no interpreter."""
    if t.device.type != "cuda" and not interpreting():
        raise ValueError(
            f"{name}: expected a CUDA tensor (or TRITON_INTERPRET=1 on CPU), got device {t.device}"
        )
