"""Input validation shared by every public kernel wrapper.

Each check raises ``ValueError`` naming the argument, what was expected and what was given.
No check copies or converts: a wrong layout is refused, never fixed silently.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

import torch

__all__ = [
    "check_tensor",
    "check_same_device",
    "check_index",
    "check_int",
    "check_no_overlap",
    "check_launch_device",
    "launch_device",
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


def check_index(name: str, t: torch.Tensor, batch: int, *, unit_stride: bool = False) -> None:
    """Check a per-row int index/cursor vector of length ``batch``; ``unit_stride``: also stride 1
    (kernels that load it as ``ptr + row``)."""
    check_tensor(name, t, (batch,), (torch.int32, torch.int64), last_contiguous=unit_stride)


def check_int(name: str, value: object, lo: int) -> None:
    """Check a plain Python int (not a bool, not a float) of at least ``lo``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: expected an int >= {lo}, got {value!r} ({type(value).__name__})")
    if value < lo:
        raise ValueError(f"{name}: expected >= {lo}, got {value}")


def check_no_overlap(**tensors: torch.Tensor | None) -> None:
    """Refuse a tensor written in place whose elements overlap: stride 0 on a dimension of size > 1
    (an ``expand``ed view), where rows would overwrite each other."""
    for name, t in tensors.items():
        if t is not None and any(n > 1 and st == 0 for n, st in zip(t.shape, t.stride())):
            raise ValueError(f"{name}: written in place, expected no stride-0 dimension of size > 1, got shape "
                             f"{tuple(t.shape)} strides {t.stride()}")


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET`` set, not 0)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_launch_device(name: str, t: torch.Tensor) -> None:
    """Refuse a tensor a Triton kernel cannot run on: not CUDA, and no interpreter."""
    if t.device.type != "cuda" and not interpreting():
        raise ValueError(
            f"{name}: expected a CUDA tensor (or TRITON_INTERPRET=1 on CPU), got device {t.device}"
        )


def launch_device(t: torch.Tensor):
    """Context for a Triton launch on ``t``'s device: ``torch.cuda.device`` when ``t`` is on a CUDA
    device other than the current one (Triton launches on the current device), else a null context."""
    if t.device.type == "cuda" and t.device.index is not None and t.device.index != torch.cuda.current_device():
        return torch.cuda.device(t.device)
    return contextlib.nullcontext()
