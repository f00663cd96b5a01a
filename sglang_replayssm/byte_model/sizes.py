"""Layer dims and the per-token sizes built from them: math.md §11's ``S``, ``r``, ``I`` and the
GDN ring's fields.

Every size is in bytes, for one layer and one request on one tensor-parallel rank (head counts after
sharding). Element sizes are passed as ints: ``state_bytes`` (the checkpoint's dtype: 4 for fp32, 2
for fp16 / bf16), ``act_bytes`` (the activation dtype) and, for GDN, ``u_bytes`` (``ring_u``'s dtype:
fp32 in serving, the activation dtype by default here).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GDNDims", "Mamba2Dims", "Sizes", "gdn_record_fields", "gdn_sizes", "mamba2_sizes"]


@dataclass(frozen=True, kw_only=True)
class Mamba2Dims:
    """One Mamba-2 mixer layer (``MambaMixer2``) on one rank.

    Attributes
    ----------
    H : int
        Heads.
    P : int
        Head dim.
    N : int
        State dim.
    G : int
        Groups (``B`` and ``C`` are per group; head ``h`` uses group ``h·G/H``).
    """

    H: int
    P: int
    N: int
    G: int


@dataclass(frozen=True, kw_only=True)
class GDNDims:
    """One Gated DeltaNet layer on one rank.

    Attributes
    ----------
    HV : int
        Value heads.
    Hk : int
        Key heads (``q`` and ``k`` are per key head; value head ``hv`` uses key head ``hv·Hk/HV``).
    K : int
        Key dim (the state's last, contiguous dim).
    V : int
        Value dim.
    """

    HV: int
    Hk: int
    K: int
    V: int


@dataclass(frozen=True)
class Sizes:
    """math.md §11 symbols for one layer and request, in bytes.

    Attributes
    ----------
    S : int
        The recurrent state (checkpoint).
    r : int
        Ring bytes per token that a non-flush decode step reads (math.md's ``r``).
    I : int
        One token's kernel inputs and output.
    """

    S: int
    r: int
    I: int  # noqa: E741 (math.md's symbol)


def mamba2_sizes(shape: Mamba2Dims, state_bytes: int = 4, act_bytes: int = 2) -> Sizes:
    """math.md's Mamba-2 sizes.

    ``S = H·P·N·s_b``; ``r = H·P·a_b + 4H + G·N·a_b``, the record (x, fp32 dt, B; kernels/README.md),
    read whole by every phase; ``I = 2·H·P·a_b + H·a_b + 2·G·N·a_b`` (x and the output, dt, B and C).
    """
    H, P, N, G = shape.H, shape.P, shape.N, shape.G
    return Sizes(
        S=H * P * N * state_bytes,
        r=H * P * act_bytes + 4 * H + G * N * act_bytes,
        I=2 * H * P * act_bytes + H * act_bytes + 2 * G * N * act_bytes,
    )


def gdn_sizes(shape: GDNDims, state_bytes: int = 4, act_bytes: int = 2) -> Sizes:
    """math.md's GDN sizes.

    ``S = HV·V·K·s_b``; ``r = HV·V·a_b + Hk·K·a_b + 4HV`` (u, k, g in math.md's layout: what a
    non-flush step reads with u in the activation dtype; our full record is ``gdn_record_fields``);
    ``I = (2·Hk·K + 2·HV·V)·a_b + 2·HV·a_b`` (q, k, v and the output, a, b).
    """
    HV, Hk, K, V = shape.HV, shape.Hk, shape.K, shape.V
    return Sizes(
        S=HV * V * K * state_bytes,
        r=HV * V * act_bytes + Hk * K * act_bytes + 4 * HV,
        I=(2 * Hk * K + 2 * HV * V) * act_bytes + 2 * HV * act_bytes,
    )


def gdn_record_fields(shape: GDNDims, act_bytes: int = 2, u_bytes: int | None = None) -> dict[str, int]:
    """Bytes per record (one token) of each of our GDN ring fields (kernels/README.md).

    Returns ``{"u": HV·V·u_b, "k": Hk·K·a_b, "v": HV·V·a_b, "g": 4·HV, "beta": 4·HV}``; ``u_bytes``
    defaults to ``act_bytes``. Qwen3.5-4B: 20,736 B with bf16 u, 28,928 B with fp32 u.
    """
    u_b = act_bytes if u_bytes is None else u_bytes
    return {
        "u": shape.HV * shape.V * u_b,
        "k": shape.Hk * shape.K * act_bytes,
        "v": shape.HV * shape.V * act_bytes,
        "g": 4 * shape.HV,
        "beta": 4 * shape.HV,
    }
