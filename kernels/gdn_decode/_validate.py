"""Argument validation of the GDN ReplaySSM calls: ``gdn_replay_decode`` / ``gdn_replay_decode_ref``
(one token per row) and ``gdn_replay_verify`` / ``gdn_replay_verify_ref`` (a window of ``T``
tokens per row, on dim 1 of every per-token tensor).

A kernel and its reference take the same arguments and must refuse the same inputs, and decode and
verify share every check but the window dim, so the checks live here once.  Every check raises
``ValueError`` naming the argument, what was expected and what was given; nothing is copied or
converted.  For verify, the per-row cursor invariant ``ring_len[b] + T <= R`` lives on the device
and is not checked here (no host sync); the reference checks it, the kernel relies on the cursor
protocol.
"""

from __future__ import annotations

import math
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

__all__ = [
    "GDNDims",
    "validate_gdn_decode",
    "validate_gdn_verify",
    "MAX_K",
    "MAX_K_DECODE",
    "MAX_T",
]

# A program holds a whole key row (``BK = next_pow2(K)``), like SGLang's packed decode.
MAX_K = 256
# Decode: the fold's row sums are written out as SGLang's tree for at most one 4-column chunk per
# lane of its [1,4]x[1,32] layout (``gdn_decode/_tree.py``); every GDN model served has K = 128.
MAX_K_DECODE = 128
# Verify: the forward substitution and the per-token loops are unrolled over T.
MAX_T = 16


@dataclass(frozen=True)
class GDNDims:
    """Sizes of one decode (``T = 1``) or verify call."""

    batch: int
    T: int
    slots: int
    HV: int
    Hk: int
    K: int
    V: int
    R: int


def _validate_gdn(
    state: torch.Tensor,
    ring_u: torch.Tensor,
    ring_k: torch.Tensor,
    ring_v: torch.Tensor,
    ring_g: torch.Tensor,
    ring_beta: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    out: torch.Tensor,
    slot_idx: torch.Tensor,
    ring_start: torch.Tensor,
    ring_len: torch.Tensor,
    flush: torch.Tensor,
    scale: float,
    *,
    windowed: bool,
    max_k: int = MAX_K,
) -> GDNDims:
    """Check every argument of a GDN ReplaySSM call; return the sizes.

    ``windowed``: the per-token tensors (q, k, v, a, b, out) have a window dim ``T`` after the
    batch dim (verify); otherwise they have none and ``T = 1`` (decode).
    """
    check_tensor("state", state, (None, None, None, None), STATE_DTYPES)
    slots, HV, V, K = state.shape
    if K < 1 or K > max_k:
        raise ValueError(f"state: expected head dim K in [1, {max_k}], got K={K}")
    check_tensor("q", q, (None, None, None, K) if windowed else (None, None, K), FLOAT_DTYPES)
    batch, T, Hk = (q.shape[0], q.shape[1], q.shape[2]) if windowed else (q.shape[0], 1, q.shape[1])
    if windowed and (T < 1 or T > MAX_T):
        raise ValueError(f"q: expected T (q.shape[1]) in [1, {MAX_T}], got T={T}")
    if Hk < 1 or HV % Hk != 0:
        raise ValueError(
            f"q: expected Hk key heads dividing HV={HV} (state.shape[1]), got Hk={Hk}"
        )
    tok = (batch, T) if windowed else (batch,)  # leading dims of the per-token tensors
    check_tensor("k", k, (*tok, Hk, K), FLOAT_DTYPES)
    check_tensor("v", v, (*tok, HV, V), FLOAT_DTYPES)
    check_tensor("ring_k", ring_k, (slots, Hk, None, K), (k.dtype,))
    R = ring_k.shape[2]
    if windowed and R < T:
        raise ValueError(
            f"ring_k: expected R >= T={T} ring rows (the integration allocates R >= L + T), "
            f"got shape {tuple(ring_k.shape)}"
        )
    if R < 1:
        raise ValueError(f"ring_k: expected R >= 1 ring rows, got shape {tuple(ring_k.shape)}")
    u_dtypes = (v.dtype,) if v.dtype == torch.float32 else (v.dtype, torch.float32)
    check_tensor("ring_u", ring_u, (slots, HV, R, V), u_dtypes)
    check_tensor("ring_v", ring_v, (slots, HV, R, V), (v.dtype,))
    check_tensor("ring_g", ring_g, (slots, HV, R), (torch.float32,))
    check_tensor("ring_beta", ring_beta, (slots, HV, R), (torch.float32,))
    check_tensor("a", a, (*tok, HV), FLOAT_DTYPES)
    check_tensor("b", b, (*tok, HV), FLOAT_DTYPES)
    check_tensor("A_log", A_log, (HV,), FLOAT_DTYPES, last_contiguous=True)
    check_tensor("dt_bias", dt_bias, (HV,), FLOAT_DTYPES, last_contiguous=True)
    check_tensor("out", out, (*tok, HV, V), FLOAT_DTYPES)
    check_index("slot_idx", slot_idx, batch, unit_stride=True)
    check_index("ring_start", ring_start, batch, unit_stride=True)
    check_index("ring_len", ring_len, batch, unit_stride=True)
    check_tensor("flush", flush, (batch,), (torch.bool,), last_contiguous=True)
    check_no_overlap(state=state, ring_u=ring_u, ring_k=ring_k, ring_v=ring_v, ring_g=ring_g, ring_beta=ring_beta,
                     out=out)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale: expected a finite float, got {scale!r}")
    check_same_device(
        state=state,
        ring_u=ring_u,
        ring_k=ring_k,
        ring_v=ring_v,
        ring_g=ring_g,
        ring_beta=ring_beta,
        q=q,
        k=k,
        v=v,
        a=a,
        b=b,
        A_log=A_log,
        dt_bias=dt_bias,
        out=out,
        slot_idx=slot_idx,
        ring_start=ring_start,
        ring_len=ring_len,
        flush=flush,
    )
    return GDNDims(batch=batch, T=T, slots=slots, HV=HV, Hk=Hk, K=K, V=V, R=R)


def validate_gdn_decode(*args) -> GDNDims:
    """Check every argument of a GDN ReplaySSM decode call (``gdn_replay_decode``'s positional
    order); return the sizes (``T = 1``).  ``K <= MAX_K_DECODE``."""
    return _validate_gdn(*args, windowed=False, max_k=MAX_K_DECODE)


def validate_gdn_verify(*args) -> GDNDims:
    """Check every argument of a GDN ReplaySSM verify call (``gdn_replay_verify``'s positional
    order); return the sizes."""
    return _validate_gdn(*args, windowed=True)
