"""Byte models of the decode kernels (``T = 1``): ours and SGLang 0.5.17's peers, per phase.

Each function returns a ``KernelBytes`` for one layer and request; ``state_bytes`` / ``act_bytes``
are element sizes (bytes) of the checkpoint and the activations.
"""

from __future__ import annotations

from sglang_replayssm.byte_model.sizes import GDNDims, Mamba2Dims, gdn_record_fields, gdn_sizes, mamba2_sizes
from sglang_replayssm.byte_model.steps import KernelBytes

__all__ = [
    "gdn_builtin_replay_bytes",
    "gdn_packed_decode_bytes",
    "gdn_replay_bytes",
    "mamba2_replay_bytes",
    "selective_state_update_bytes",
]


def mamba2_replay_bytes(shape: Mamba2Dims, L: int, state_bytes: int = 4, act_bytes: int = 2) -> KernelBytes:
    """Our ``mamba2_replay_decode``: records (x act, processed dt fp32, B act per group).

    Non-flush reads the w committed records and appends one; the flush folds the w records and the
    current token sequentially (reads the same three fields) and writes ``S`` once. Identical to
    math.md's model, so its cycle mean equals math.md's ``replay_ar``.
    """
    z = mamba2_sizes(shape, state_bytes, act_bytes)
    return KernelBytes(
        "replayssm mamba2", L, z.S, z.I,
        ring_read_nonflush=z.r, ring_read_flush=z.r, ring_write=z.r,
        note="record x,dt,B = H·P·a_b + 4H + G·N·a_b",
    )


def selective_state_update_bytes(shape: Mamba2Dims, state_bytes: int = 4, act_bytes: int = 2) -> KernelBytes:
    """SGLang's ``selective_state_update`` (decode): ``2S + I`` (math.md's baseline AR)."""
    z = mamba2_sizes(shape, state_bytes, act_bytes)
    return KernelBytes("sglang selective_state_update", 0, z.S, z.I, note="2S + I")


def gdn_replay_bytes(
    shape: GDNDims, L: int, state_bytes: int = 4, act_bytes: int = 2, u_bytes: int | None = None
) -> KernelBytes:
    """Our ``gdn_replay_decode``: a non-flush step reads (u, k, g) of w records and appends a full
    record (u, k, v, g, beta); the flush replays raw (k, v, g, beta) of w records and writes ``S``.

    ``u_bytes`` is the ring_u element size (activation dtype by default; the server stores fp32).
    Differs from math.md's GDN model (which reads and writes (u, k, g) only) by the v/beta fields:
    +0.34% of the cycle mean at Qwen3.5-4B, L=16.
    """
    f = gdn_record_fields(shape, act_bytes, u_bytes)
    z = gdn_sizes(shape, state_bytes, act_bytes)
    return KernelBytes(
        "replayssm gdn", L, z.S, z.I,
        ring_read_nonflush=f["u"] + f["k"] + f["g"],
        ring_read_flush=f["k"] + f["v"] + f["g"] + f["beta"],
        ring_write=sum(f.values()),
        note="non-flush reads u,k,g; appends u,k,v,g,beta; flush reads k,v,g,beta",
    )


def gdn_packed_decode_bytes(shape: GDNDims, state_bytes: int = 4, act_bytes: int = 2) -> KernelBytes:
    """SGLang's ``fused_recurrent_gated_delta_rule_packed_decode``: ``2S + I``."""
    z = gdn_sizes(shape, state_bytes, act_bytes)
    return KernelBytes("sglang packed decode", 0, z.S, z.I, note="2S + I")


def gdn_builtin_replay_bytes(
    shape: GDNDims, L: int, state_bytes: int = 4, act_bytes: int = 2, ring_bytes: int | None = None
) -> KernelBytes:
    """SGLang 0.5.17's built-in ``fused_recurrent_linear_replayssm_decode`` (decode ring).

    Records (d: HV·V, k: Hk·K) in the pool's SSM dtype (``ring_bytes``, fp32 by default as the
    pool allocates them) and g (fp32): ``r = (HV·V + Hk·K)·ring_b + 4HV`` (24,704 B at
    Qwen3.5-4B). Every phase reads the w records; non-flush appends one; flush writes ``S``.
    """
    rb = state_bytes if ring_bytes is None else ring_bytes
    r = (shape.HV * shape.V + shape.Hk * shape.K) * rb + 4 * shape.HV
    z = gdn_sizes(shape, state_bytes, act_bytes)
    return KernelBytes(
        "sglang built-in replayssm", L, z.S, z.I,
        ring_read_nonflush=r, ring_read_flush=r, ring_write=r,
        note="record d,k in ring dtype, g fp32",
    )
