"""One shape and bytes calculator for the ReplaySSM rings (pool, memory budget, benchmarks).

The rings follow ``kernels/README.md`` (the binding protocol).  Per layer and slot:

Mamba-2 (``family="mamba2"``), temporal state ``(H, P, N)``, ``G`` groups:

==========  ==============  ==========
tensor      shape           dtype
==========  ==============  ==========
``x``       ``[H, R, P]``   activation
``dt``      ``[H, R]``      fp32
``B``       ``[G, R, N]``   activation
==========  ==============  ==========

Gated DeltaNet (``family="gdn"``), temporal state ``(HV, V, K)``, ``Hk`` key heads:

==========  ===============  ==========
tensor      shape            dtype
==========  ===============  ==========
``u``       ``[HV, R, V]``   activation
``k``       ``[Hk, R, K]``   activation
``v``       ``[HV, R, V]``   activation
``g``       ``[HV, R]``      fp32
``beta``    ``[HV, R]``      fp32
==========  ===============  ==========

plus one int32 cursor pair ``(start, len)`` per slot, shared by all layers.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
from replayssm_kernels import flush_limit, min_ring_size

if TYPE_CHECKING:
    from sglang_replayssm.tp import TPLayout

__all__ = ["FAMILIES", "RingSpec", "ring_spec", "ring_rows", "verify_flush_limit"]

FAMILIES = ("mamba2", "gdn")
CURSOR_BYTES_PER_SLOT = 2 * 4


def ring_rows(family: str, window: int, spec_tokens: int = 0) -> int:
    """Physical ring rows ``R``: ``L`` for decode; with spec verify of ``T`` tokens
    ``R0 = max(L, T) + T`` (``replayssm_kernels.commit.min_ring_size``), Mamba-2 ``R0 + T``: under
    the late flush rule a flush row holds up to ``R0`` records, and Mamba-2's one-launch verify
    needs its window beside them (kernels/README.md, "Late rule")."""
    if window < 1:
        raise ValueError(f"window: expected >= 1, got {window}")
    if spec_tokens < 0:
        raise ValueError(f"spec_tokens: expected >= 0, got {spec_tokens}")
    if family not in FAMILIES:
        raise ValueError(f"family: expected one of {FAMILIES}, got {family!r}")
    rows = min_ring_size(window, spec_tokens)
    return rows + spec_tokens if family == "mamba2" else rows


def verify_flush_limit(window: int, spec_tokens: int) -> int:
    """The ``limit`` of the served verify flush rule "a row flushes when ``len + T > limit``": the
    late rule's ``max(L, T) + T`` for both families (``verify_cursor_step(late_flush=True)``; what
    ``byte_model.verify_cycle`` takes as its first argument)."""
    return flush_limit(window, spec_tokens, late_flush=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RingSpec:
    """Ring tensor shapes of one layer and slot, and the bytes they cost.

    Attributes
    ----------
    family : str
        ``"mamba2"`` or ``"gdn"``.
    window, rows : int
        Decode window ``L`` and physical rows ``R``.
    tensors : dict[str, tuple[tuple[int, ...], torch.dtype]]
        Per-slot, per-layer shape (without the leading ``[layers, slots]``) and dtype of each ring.
    num_layers : int
        Linear-attention layers held by this rank.
    """

    family: str
    window: int
    rows: int
    tensors: dict[str, tuple[tuple[int, ...], torch.dtype]]
    num_layers: int

    @property
    def bytes_per_slot_layer(self) -> int:
        total = 0
        for shape, dtype in self.tensors.values():
            n = 1
            for s in shape:
                n *= s
            total += n * dtype.itemsize
        return total

    @property
    def bytes_per_slot(self) -> int:
        """Ring bytes of one slot over all layers, plus its cursor pair."""
        return self.bytes_per_slot_layer * self.num_layers + CURSOR_BYTES_PER_SLOT

    def bytes_total(self, num_slots: int) -> int:
        return self.bytes_per_slot * num_slots


def ring_spec(
    *,
    family: str,
    temporal_shape: tuple[int, int, int],
    conv_dim: int,
    num_k_heads: int,
    num_layers: int,
    window: int,
    act_dtype: torch.dtype,
    spec_tokens: int = 0,
    layout: TPLayout | None = None,
) -> RingSpec:
    """Ring shapes for one rank.

    Under tensor parallelism every rank sizes its rings from its own shard of heads and groups
    (``sglang_replayssm.tp``): the arguments are SGLang's per-rank shapes, which ``layout`` (when
    given) must match.

    Parameters
    ----------
    family : str
        ``"mamba2"`` or ``"gdn"``.
    temporal_shape : tuple of int
        SGLang's per-slot temporal state shape after TP sharding: ``(H, P, N)`` for Mamba-2,
        ``(HV, V, K)`` for GDN (``Mamba2StateShape.temporal``).
    conv_dim : int
        Per-rank conv channels (``Mamba2StateShape.conv[0][0]``); Mamba-2 derives its group count
        from it: ``G = (conv_dim - H*P) / (2N)`` (this includes SGLang's extra groups for head
        shards).
    num_k_heads : int
        GDN key heads per rank (``Mamba2StateShape.num_k_heads_per_tp``); ignored for Mamba-2.
    num_layers : int
        Linear-attention layers on this rank.
    window : int
        Decode window ``L >= 1``.
    act_dtype : torch.dtype
        Activation dtype (model dtype): x / B / k / v records are stored in it; GDN's u is fp32.
    spec_tokens : int
        Extra rows for speculative verify (0 for plain decode).
    layout : TPLayout or None
        The model's attention-TP layout (``tp.model_layout``); the per-rank heads and groups above
        are checked against it.

    Raises
    ------
    ValueError
        On an unknown family, a ``conv_dim`` that is not ``H*P + 2*G*N``, a group count that does
        not divide the heads, or per-rank shapes that differ from ``layout``.
    """
    rows = ring_rows(family, window, spec_tokens)
    fp32 = torch.float32
    if family == "mamba2":
        h, p, n = temporal_shape
        rest = conv_dim - h * p
        if rest <= 0 or rest % (2 * n) != 0:
            raise ValueError(
                f"conv_dim: expected H*P + 2*G*N with H={h}, P={p}, N={n}, got {conv_dim}"
            )
        g = rest // (2 * n)
        if h % g != 0:
            raise ValueError(f"conv_dim: expected G dividing H={h}, got G={g} from conv_dim={conv_dim}")
        heads, groups = h, g
        tensors = {
            "x": ((h, rows, p), act_dtype),
            "dt": ((h, rows), fp32),
            "B": ((g, rows, n), act_dtype),
        }
    elif family == "gdn":
        hv, v, k = temporal_shape
        if num_k_heads < 1 or hv % num_k_heads != 0:
            raise ValueError(
                f"num_k_heads: expected a divisor of HV={hv}, got {num_k_heads}"
            )
        heads, groups = hv, num_k_heads
        tensors = {
            "u": ((hv, rows, v), fp32),  # fp32: the conventional update never rounds u
            "k": ((num_k_heads, rows, k), act_dtype),
            "v": ((hv, rows, v), act_dtype),
            "g": ((hv, rows), fp32),
            "beta": ((hv, rows), fp32),
        }
    else:
        raise ValueError(f"family: expected one of {FAMILIES}, got {family!r}")
    if layout is not None:
        if layout.family != family:
            raise ValueError(f"layout: expected family {family!r}, got {layout.family!r}")
        layout.check_rank_shape(heads, groups)
    return RingSpec(family=family, window=window, rows=rows, tensors=tensors, num_layers=num_layers)
