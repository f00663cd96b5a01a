"""Split precision: the low-precision read copy kept beside the recurrence checkpoint.

The recurrence checkpoint (``state``, fp32 or 16-bit) is the only tensor the fold reads and
writes. The read copy (``read_state``, same shape, bf16 / fp16 / fp8 e4m3) is what non-flush decode
rows read for ``S0·C`` (Mamba-2) or ``S0·k̂``, ``S0·q̃`` (GDN). It is refreshed from the checkpoint
*as stored* at every flush and never feeds the recurrence, so its rounding error is one rounding of
the current checkpoint and does not accumulate with length.

fp8 copies carry one fp32 scale per row of the last (state) dim: ``read_scale[s, h, p]`` for
``state[s, h, p, :]``. The scale is a power of two, ``2^(E-7)`` with ``2^E <= max|row| < 2^(E+1)``,
so the scaled row lies in ``[-256, 256)`` (inside e4m3's ±448, no saturation) and the scaling is
exact: quantising is one round-to-nearest-even per element, the same bits in torch, in the Triton
kernels on the GPU and under the interpreter (with conftest's rounding shim). Dequantised value:
``q · scale``.

The kernels write the copy themselves on flush rows with ``store_read_tile`` (Triton, below,
inlined by the Mamba-2 and GDN decode kernels); ``quantize_rows`` is the same rounding in torch
(references, tests). The refresh for checkpoints written outside the ring protocol (allocation,
prefill, copy-on-write, ...) is ``replayssm_kernels.read_copy_refresh``: ``refresh_read_copy`` (one
fused Triton launch, ``fp8_row_scale`` below) and ``refresh_read_copy_ref`` (``quantize_rows`` of a
gather, then a scatter); both give the kernels' bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_kernels._checks import check_no_overlap, check_same_device, check_tensor

__all__ = [
    "READ_DTYPES",
    "FP8_MAX_SCALED",
    "quantize_rows",
    "fp8_row_scale",
    "store_read_tile",
    "dequantize_rows",
    "validate_read_copy",
]

READ_DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn)
FP8_MAX_SCALED = 256.0  # |q| < 256 after scaling (e4m3 max finite is 448)

# Biased fp32 exponent floor for the scale: max|row| below 2^-119 is treated as 2^-119 (scale
# 2^-126, the smallest normal), so an all-zero row quantises to zeros with a finite scale.
_MIN_BIASED_EXP = 8


def quantize_rows(
    S: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Round ``S`` to a read-copy dtype (fp8: with per-row power-of-two scales).

    Parameters
    ----------
    S : torch.Tensor
        ``[..., n]`` checkpoint values as stored (any float dtype; read only).
    dtype : torch.dtype
        One of ``READ_DTYPES``.

    Returns
    -------
    q : torch.Tensor
        ``[..., n]`` in ``dtype`` (round to nearest even).
    scale : torch.Tensor or None
        ``[...]`` fp32 per-row scales for fp8, ``None`` otherwise. ``S ≈ q · scale[..., None]``.

    Raises
    ------
    ValueError
        ``dtype`` not one of ``READ_DTYPES``.
    """
    if dtype not in READ_DTYPES:
        raise ValueError(f"dtype: expected one of {[str(d) for d in READ_DTYPES]}, got {dtype}")
    S = S.to(torch.float32)
    if dtype != torch.float8_e4m3fn:
        return S.to(dtype), None
    amax = S.abs().amax(dim=-1)
    e = ((amax.view(torch.int32) >> 23) & 0xFF).clamp_min(_MIN_BIASED_EXP)
    scale = ((e - 7) << 23).view(torch.float32)
    inv = ((261 - e) << 23).view(torch.float32)  # exactly 1 / scale
    return (S * inv[..., None]).to(torch.float8_e4m3fn), scale


@triton.jit
def fp8_row_scale(amax):
    """The fp8 scale rule in kernel form: ``(scale, 1 / scale)`` for rows of max |value| ``amax``
    (fp32), ``scale = 2^(E-7)`` with ``2^E <= amax < 2^(E+1)``, floor ``2^-126``; both exact."""
    e = tl.maximum((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF, 8)  # _MIN_BIASED_EXP
    scale = ((e - 7) << 23).to(tl.float32, bitcast=True)
    inv = ((261 - e) << 23).to(tl.float32, bitcast=True)  # exactly 1 / scale
    return scale, inv


@triton.jit
def store_read_tile(b_s, p_r_head, p_rs_head, o_p, o_n, m_p, m_n, stride_read_p, stride_read_n,
                    stride_rs_p, READ_FP8: tl.constexpr):
    """Kernel form of ``quantize_rows``: write one ``[rows, cols]`` tile of the read copy from the
    checkpoint tile as stored (``b_s``, state dtype); rows ``o_p`` (mask ``m_p``), columns ``o_n``
    (mask ``m_n``). Masked entries must hold zeros (they then do not enter the fp8 row max)."""
    b_v = b_s.to(tl.float32)
    p_r = p_r_head + o_p[:, None] * stride_read_p + o_n[None, :] * stride_read_n
    if READ_FP8:
        scale, inv = fp8_row_scale(tl.max(tl.abs(b_v), axis=1))
        tl.store(p_rs_head + o_p * stride_rs_p, scale, mask=m_p)
        b_v = b_v * inv[:, None]
    tl.store(p_r, b_v.to(p_r.dtype.element_ty), mask=m_p[:, None] & m_n[None, :])


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """fp32 values of a read copy: ``q`` (times ``scale[..., None]`` for fp8).

    Raises
    ------
    ValueError
        ``q`` not of a ``READ_DTYPES`` dtype; for fp8 a ``scale`` other than ``[*q.shape[:-1]]``
        fp32, for a 16-bit copy a scale at all.
    """
    check_tensor("q", q, (None,) * q.dim(), READ_DTYPES)
    if q.dtype == torch.float8_e4m3fn:
        if scale is None:
            raise ValueError(f"scale: expected a fp32 tensor of shape {tuple(q.shape[:-1])} for fp8, got None")
        check_tensor("scale", scale, tuple(q.shape[:-1]), (torch.float32,))
    elif scale is not None:
        raise ValueError(f"scale: expected None for a {q.dtype} copy, got shape {tuple(scale.shape)}")
    S = q.to(torch.float32)
    return S if scale is None else S * scale[..., None]


def validate_read_copy(
    state: torch.Tensor, read_state: torch.Tensor | None, read_scale: torch.Tensor | None
) -> None:
    """Check a read copy against its checkpoint (``read_state is None``: no copy, no scale).

    Raises
    ------
    ValueError
        ``read_state`` not of ``state``'s shape or not bf16 / fp16 / fp8 e4m3, of ``state``'s own
        dtype (pass ``read_state=None`` to read the checkpoint), an fp8 copy without its
        ``read_scale`` ``[*state.shape[:-1]]`` fp32, a scale given for a 16-bit copy, or another
        device.
    """
    if read_state is None:
        if read_scale is not None:
            raise ValueError("read_scale: expected None without a read_state, got a tensor")
        return
    check_tensor("read_state", read_state, tuple(state.shape), READ_DTYPES)
    if read_state.dtype == state.dtype:
        raise ValueError(
            f"read_state: expected a dtype other than the checkpoint's ({state.dtype}); pass "
            "read_state=None to read the checkpoint itself"
        )
    if read_state.dtype == torch.float8_e4m3fn:
        if read_scale is None:
            raise ValueError(
                f"read_scale: expected a fp32 tensor of shape {tuple(state.shape[:-1])} for the "
                "fp8 read copy, got None"
            )
        check_tensor("read_scale", read_scale, tuple(state.shape[:-1]), (torch.float32,))
    elif read_scale is not None:
        raise ValueError(
            f"read_scale: expected None for a {read_state.dtype} read copy (scales are fp8 only), "
            f"got shape {tuple(read_scale.shape)}"
        )
    check_same_device(state=state, read_state=read_state, read_scale=read_scale)
    check_no_overlap(read_state=read_state, read_scale=read_scale)

