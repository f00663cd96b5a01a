"""Stochastic rounding of an fp16 recurrence checkpoint at the flush (opt-in, both families).

A 16-bit checkpoint is rounded once per flush; round to nearest (the default) is biased for a
value that sits between two fp16 neighbours for many flushes, stochastic rounding (SR) is not:
``v`` becomes the upper neighbour with probability ``(|v| - lo) / ulp`` and the lower one
otherwise, so ``E[round(v)] = v``. SGLang 0.5.17's ``--enable-mamba-cache-stochastic-rounding``
does this for the Mamba-2 ``selective_state_update`` store with the ``cvt.rs.f16x2.f32``
instruction (SM100 only) and Philox bits; here it is plain integer / fp32 arithmetic, so it runs
on every GPU and in the interpreter, and the random bits come from a counter-based hash that the
torch functions below reproduce bit for bit (kernels/README.md, "Stochastic rounding").

**Bits.** Per stored element, 32 bits ``fmix32(key ^ idx·M_IDX)`` (murmur3's finaliser) where
``idx`` is the element's index in the slot's logical C-order ``[H, P, N]`` (Mamba-2) or
``[HV, V, K]`` (GDN) state, whatever the pool's strides, and ``key`` hashes ``(seed, layer,
slot)``: ``seed`` is a device int64 counter that the caller advances once per forward (no host
sync, CUDA-graph safe), ``layer`` a per-layer stream id. A slot flushes at most once per forward
and layer, so no two stores share a key.

**Rounding** (``round_fp16_sr``; all steps exact in fp32): ``ulp = 2^(max(E, -14) - 10)`` for
``2^E <= |v| < 2^(E+1)`` (fp16's spacing, subnormals included), ``x = |v| / ulp``,
``n = floor(x)``, ``u = (bits >> 8)·2^-24``; the result is ``(n + [u < x - n])·ulp`` with ``v``'s
sign, exactly an fp16 value (or ``2^16``, which the cast sends to ``inf``, as it would any value
past fp16's range). ``P(up) = x - n`` exactly when ``x - n`` is a multiple of ``2^-24`` (every
``|v| >= 2^-49``). NaN stays NaN, ``±inf`` stays ``±inf``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_kernels._checks import check_same_device, check_tensor

__all__ = [
    "SR_STATE_DTYPE",
    "validate_stochastic_rounding",
    "sr_key",
    "sr_round_fp16",
    "sr_key_ref",
    "sr_bits_ref",
    "round_fp16_sr_ref",
    "round_slot_sr_ref",
]

#: The only checkpoint dtype stochastic rounding stores (as SGLang's flag requires).
SR_STATE_DTYPE = torch.float16

_MASK = 0xFFFFFFFF
_GOLD = 0x9E3779B9  # seed word
_M_LAYER = 0x85EBCA77
_M_SLOT = 0xC2B2AE3D
_M_IDX = 0x27D4EB2F
_F1 = 0x85EBCA6B  # fmix32 multipliers
_F2 = 0xC2B2AE35
_U24 = 5.9604644775390625e-08  # 2^-24


# ------------------------------------------------------------------------------------ Triton


@triton.jit
def _fmix32(h):
    # murmur3's finaliser on uint32 (wrapping multiplies, logical shifts).
    h ^= h >> 16
    h *= 0x85EBCA6B
    h ^= h >> 13
    h *= 0xC2B2AE35
    h ^= h >> 16
    return h


@triton.jit
def sr_key(sr_seed_ptr, sr_layer, slot):
    """uint32 key of one (seed, layer, slot) store: ``sr_seed_ptr`` points at the int64 counter,
    ``slot`` is the row's (int64) slot index. Same value as ``sr_key_ref``."""
    seed = tl.load(sr_seed_ptr)
    k = _fmix32(seed.to(tl.uint32) ^ 0x9E3779B9)
    k = _fmix32(k ^ (seed >> 32).to(tl.uint32))
    k = _fmix32(k ^ (tl.cast(sr_layer, tl.uint32) * 0x85EBCA77))
    k = _fmix32(k ^ (slot.to(tl.uint32) * 0xC2B2AE3D))
    return k


@triton.jit
def sr_round_fp16(v, key, idx):
    """fp32 tile ``v`` to fp16 with stochastic rounding; ``idx`` (int32, ``v``'s shape) are the
    elements' logical indices in the slot's state, ``key`` from ``sr_key``."""
    bits = _fmix32(key ^ (idx.to(tl.uint32) * 0x27D4EB2F))
    v_bits = v.to(tl.int32, bitcast=True)
    a = (v_bits & 0x7FFFFFFF).to(tl.float32, bitcast=True)
    ue = tl.maximum(v_bits >> 23 & 0xFF, 113) - 10  # biased exponent of the fp16 ulp at |v|
    ulp = (ue << 23).to(tl.float32, bitcast=True)
    x = a * ((254 - ue) << 23).to(tl.float32, bitcast=True)  # |v| / ulp, exact
    n = tl.floor(x)
    u = (bits >> 8).to(tl.float32) * 5.9604644775390625e-08
    r = tl.where(u < x - n, n + 1.0, n) * ulp
    # v's sign by its bit (a negation would turn -0 into +0)
    r = (r.to(tl.int32, bitcast=True) | (v_bits & -2147483648)).to(tl.float32, bitcast=True)
    return r.to(tl.float16)


# ------------------------------------------------------------------------------------- torch


def _mul32(a: torch.Tensor | int, c: int) -> torch.Tensor | int:
    # (a * c) mod 2^32 for 0 <= a < 2^32, in int64 without overflow (16-bit halves of c).
    return (a * (c & 0xFFFF) + (((a * (c >> 16)) & 0xFFFF) << 16)) & _MASK


def _fmix32_ref(h: torch.Tensor | int) -> torch.Tensor | int:
    h = h ^ (h >> 16)
    h = _mul32(h, _F1)
    h = h ^ (h >> 13)
    h = _mul32(h, _F2)
    return h ^ (h >> 16)


def sr_key_ref(seed: int, layer: int, slot: int) -> int:
    """The kernels' ``sr_key`` on the host: uint32 key (as a Python int) of one store."""
    k = _fmix32_ref((seed & _MASK) ^ _GOLD)
    k = _fmix32_ref(k ^ ((seed >> 32) & _MASK))
    k = _fmix32_ref(k ^ _mul32(layer & _MASK, _M_LAYER))
    return _fmix32_ref(k ^ _mul32(slot & _MASK, _M_SLOT))


def sr_bits_ref(key: int, idx: torch.Tensor) -> torch.Tensor:
    """32 random bits per element (int64 tensor in ``[0, 2^32)``) for logical indices ``idx``."""
    return _fmix32_ref(key ^ _mul32(idx.to(torch.int64), _M_IDX))


def round_fp16_sr_ref(v: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """Stochastic rounding of ``v`` (read as fp32) to fp16 with the given bits (``sr_bits_ref``);
    the kernels' ``sr_round_fp16``, bit for bit. Returns a new fp16 tensor of ``v``'s shape."""
    v_bits = v.to(torch.float32).contiguous().view(torch.int32)
    a = (v_bits & 0x7FFFFFFF).view(torch.float32)
    ue = ((v_bits >> 23) & 0xFF).clamp_min(113) - 10
    ulp = (ue << 23).view(torch.float32)
    x = a * ((254 - ue) << 23).view(torch.float32)
    n = torch.floor(x)
    u = (bits >> 8).to(torch.float32) * _U24
    r = torch.where(u < x - n, n + 1.0, n) * ulp
    r = (r.view(torch.int32) | (v_bits & -(2**31))).view(torch.float32)
    return r.to(torch.float16)


def round_slot_sr_ref(S: torch.Tensor, seed: int, layer: int, slot: int) -> torch.Tensor:
    """One slot's folded state ``S`` (``[H, P, N]`` or ``[HV, V, K]``, fp32) as the kernels store it
    with stochastic rounding: fp16, bits keyed by ``(seed, layer, slot)`` and the logical index."""
    idx = torch.arange(S.numel(), dtype=torch.int64, device=S.device).view(S.shape)
    return round_fp16_sr_ref(S, sr_bits_ref(sr_key_ref(seed, layer, slot), idx))


def validate_stochastic_rounding(
    state: torch.Tensor, sr_seed: torch.Tensor | None, sr_layer: int
) -> None:
    """Check the stochastic-rounding arguments of a kernel that writes ``state``.

    Raises
    ------
    ValueError
        ``sr_seed`` given with a checkpoint that is not fp16, not an int64 ``[1]`` tensor on
        ``state``'s device, or ``sr_layer`` not an int in ``[0, 2^31)``.
    """
    if isinstance(sr_layer, bool) or not isinstance(sr_layer, int) or not 0 <= sr_layer < 2**31:
        raise ValueError(f"sr_layer: expected an int in [0, 2^31), got {sr_layer!r}")
    if sr_seed is None:
        return
    if state.dtype != SR_STATE_DTYPE:
        raise ValueError(
            f"state: expected {SR_STATE_DTYPE} with sr_seed (stochastic rounding stores an fp16 "
            f"checkpoint), got {state.dtype}; pass sr_seed=None to round to nearest"
        )
    check_tensor("sr_seed", sr_seed, (1,), (torch.int64,))
    check_same_device(state=state, sr_seed=sr_seed)
