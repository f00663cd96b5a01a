"""Fused refresh of the split-precision read copy from the checkpoint (one Triton launch).

``ReplayMambaPool.refresh_read`` rewrites the read copy of some slots after their checkpoints were
written outside the decode kernels (extend forwards, per layer; the snapshot-path verify commit;
copy-on-write; reload; radix materialisation). Unfused, ``quantize_rows(temporal[:, idx])`` plus a
scatter moved the checkpoint rows through a gathered fp32 temporary and (fp8) an ``|x|``, a row max
and a scaled temporary: about ``3S + 3S_r`` bytes per slot and layer for a bf16 copy of an fp32
checkpoint, about ``8S`` for fp8. This kernel reads each touched row of the checkpoint once and writes
the copy (and the fp8 scale) once: ``S + S_r``.

One program per (slot entry, block of ``BLOCK_R`` state rows, layer): it loads a
``[BLOCK_R, BLOCK_N]`` tile (whole rows: ``BLOCK_N = next_pow2(n)``, so the fp8 row max needs no
second pass), rounds it with ``quantize_rows``' rule (fp8: ``fp8_row_scale``, the function the
decode kernels' flush rows use) and stores it. A padding entry (``slots[i] < 0``) exits before any
load or store. Rows are addressed through both row dims' strides (``[A, B]``: Mamba-2 ``[H, P]``,
GDN ``[HV, V]``), so views of any strides work, including one layer of the pool or a strided slot
dim; no copy is made. Not autotuned (it writes pool state); no host sync; CUDA-graph safe.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_kernels._checks import check_launch_device, launch_device
from replayssm_kernels.mamba2_decode.read_copy import fp8_row_scale
from replayssm_kernels.read_copy_refresh._validate import validate_refresh

__all__ = ["refresh_read_copy", "refresh_read_copy_fwd"]

#: Elements per program tile (rows x padded columns); a 16 KB fp32 tile at 4 warps.
_TILE = 4096


@triton.jit
def _refresh_read_copy_kernel(
    # Pointers
    state_ptr, read_ptr, scale_ptr, slots_ptr,
    # Dimensions
    B, N, rows,
    # Strides
    stride_s_l, stride_s_s, stride_s_a, stride_s_b, stride_s_n,
    stride_r_l, stride_r_s, stride_r_a, stride_r_b, stride_r_n,
    stride_c_l, stride_c_s, stride_c_a, stride_c_b,
    stride_slot,
    # Meta-parameters
    READ_FP8: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):
    i_k, i_r, i_l = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    slot = tl.load(slots_ptr + i_k * stride_slot).to(tl.int64)
    if slot < 0:  # padding: touches nothing
        return
    o_r = i_r * BLOCK_R + tl.arange(0, BLOCK_R)
    o_n = tl.arange(0, BLOCK_N)
    m_r = o_r < rows
    m_n = o_n < N
    m = m_r[:, None] & m_n[None, :]
    # int64 offsets: a permuted pool may put the slot dim inside a row dim (offsets past 2^31).
    o_a, o_b, o_c = (o_r // B).to(tl.int64), (o_r % B).to(tl.int64), o_n.to(tl.int64)
    p_s = (state_ptr + i_l * stride_s_l + slot * stride_s_s + (o_a * stride_s_a + o_b * stride_s_b)[:, None]
           + o_c[None, :] * stride_s_n)
    # Masked entries load as zeros: they never raise the fp8 row max.
    b_v = tl.load(p_s, mask=m, other=0.0).to(tl.float32)
    if READ_FP8:
        scale, inv = fp8_row_scale(tl.max(tl.abs(b_v), axis=1))
        p_c = scale_ptr + i_l * stride_c_l + slot * stride_c_s + o_a * stride_c_a + o_b * stride_c_b
        tl.store(p_c, scale, mask=m_r)
        b_v = b_v * inv[:, None]
    p_r = (read_ptr + i_l * stride_r_l + slot * stride_r_s + (o_a * stride_r_a + o_b * stride_r_b)[:, None]
           + o_c[None, :] * stride_r_n)
    tl.store(p_r, b_v.to(p_r.dtype.element_ty), mask=m)


def refresh_read_copy_fwd(
    state: torch.Tensor,
    read_state: torch.Tensor,
    read_scale: torch.Tensor | None,
    slots: torch.Tensor,
    *,
    layer_idx: int | None = None,
) -> None:
    """Launch on validated arguments (no checks, no device context; see ``refresh_read_copy``).
    Launches on the current CUDA device."""
    k = slots.shape[0]
    if k == 0:
        return
    if state.dim() == 4:  # one layer's [slots, A, B, n]: a one-long layer axis (views, no copy)
        state, read_state = state[None], read_state[None]
        read_scale = None if read_scale is None else read_scale[None]
    if layer_idx is not None:  # one layer: a view of it, stride 0 for the one-long layer grid axis
        state, read_state = state[layer_idx : layer_idx + 1], read_state[layer_idx : layer_idx + 1]
        read_scale = None if read_scale is None else read_scale[layer_idx : layer_idx + 1]
    layers, _, A, B, N = state.shape
    rows = A * B
    if rows == 0 or N == 0 or layers == 0:
        return
    block_n = triton.next_power_of_2(N)
    block_r = min(triton.next_power_of_2(rows), max(1, _TILE // block_n))
    fp8 = read_scale is not None
    sc = read_scale if fp8 else read_state  # unused pointer without scales
    sc_strides = read_scale.stride() if fp8 else (0, 0, 0, 0)
    _refresh_read_copy_kernel[(k, triton.cdiv(rows, block_r), layers)](
        state, read_state, sc, slots,
        B, N, rows,
        *state.stride(), *read_state.stride(), *sc_strides, slots.stride(0),
        READ_FP8=fp8, BLOCK_R=block_r, BLOCK_N=block_n, num_warps=4,
    )  # fmt: skip


def refresh_read_copy(
    state: torch.Tensor,
    read_state: torch.Tensor,
    read_scale: torch.Tensor | None,
    slots: torch.Tensor,
    *,
    layer_idx: int | None = None,
) -> None:
    """Rewrite the read copy (and fp8 scales) of ``slots`` from their checkpoints, in one launch.

    For every entry ``s = slots[i] >= 0`` and every layer ``l`` (all layers, or ``layer_idx``):
    ``read_state[l, s], read_scale[l, s] = quantize_rows(state[l, s], read_state.dtype)``, bit for
    bit (one round-to-nearest-even per element; fp8 with the power-of-two row scale
    ``2^(E-7)``, ``2^E <= max|row| < 2^(E+1)``, floor ``2^-126``, so zero rows give zeros with a
    finite scale). Entries ``< 0`` are padding and write nothing at all (the unfused pool code
    clamped them to the null slot 0 and rewrote its copy; this one does not). Duplicate entries
    write the same values twice. Every other slot and layer is left bit-identical. Bit identity
    is for finite checkpoints (a NaN / inf row's scale and values are not specified).

    ``refresh_read_copy`` is one Triton launch (CUDA tensors, or any under ``TRITON_INTERPRET=1``),
    no host sync, no copy of any argument: CUDA-graph safe. ``refresh_read_copy_ref`` is the
    plain-torch reference with the same signature and effects (it syncs on a CUDA ``slots``).

    Parameters
    ----------
    state : torch.Tensor
        ``[layers, slots, A, B, n]`` checkpoint, fp32 / bf16 / fp16, any strides (e.g. the pool's
        ``temporal``: Mamba-2 ``[H, P, N]``, GDN ``[HV, V, K]`` per slot), or one layer's
        ``[slots, A, B, n]`` (e.g. ``temporal[l]``, the decode kernels' per-layer view; then
        ``read_state`` / ``read_scale`` are per layer too). Read only.
    read_state : torch.Tensor
        ``state``'s shape, bf16 / fp16 / fp8 e4m3 and not ``state``'s dtype, any strides. Rows of
        ``slots`` (in the refreshed layers) are **updated in place**.
    read_scale : torch.Tensor or None
        ``state.shape[:-1]`` (``[layers, slots, A, B]``) fp32 for an fp8 copy, any strides,
        **updated in place** with the row scales; None for a 16-bit copy.
    slots : torch.Tensor
        ``[k]`` int32 / int64 slot indices, any stride; ``-1`` (any negative) is padding.
    layer_idx : int or None
        Refresh only this layer of a 5-D ``state`` (``0 <= layer_idx < layers``; keyword only);
        None: every layer.

    Raises
    ------
    ValueError
        ``state`` not 5-D or 4-D fp32 / bf16 / fp16; ``read_state`` missing, of another shape, not a
        read-copy dtype or of ``state``'s own dtype; an fp8 copy without its ``[layers, slots, A,
        B]`` fp32 ``read_scale``, or a scale with a 16-bit copy; a stride-0 copy or scale; ``slots``
        not a 1-D int32 / int64 tensor; tensors on different devices, or not on CUDA without the
        interpreter; ``layer_idx`` out of range, or given with a 4-D ``state``.
    """
    validate_refresh(state, read_state, read_scale, slots, layer_idx)
    check_launch_device("state", state)
    with launch_device(state):
        refresh_read_copy_fwd(state, read_state, read_scale, slots, layer_idx=layer_idx)
