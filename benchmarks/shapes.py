"""Model shape presets shared by the benchmarks, the byte model and the tests.

Head counts are per tensor-parallel rank (TP = 1 here). Sources: ``../shared/design/math.md`` §0.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_replayssm.byte_model import GDNDims, Mamba2Dims

__all__ = [
    "Mamba2Shape",
    "GDNShape",
    "NANO_4B",
    "QWEN35_4B",
    "MAMBA2_TINY",
    "GDN_TINY",
    "MAMBA2_SHAPES",
    "GDN_SHAPES",
    "DTYPE_BYTES",
]

#: bytes per element of the dtype names the CLI accepts
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class Mamba2Shape(Mamba2Dims):
    """One Mamba-2 mixer layer (``MambaMixer2``): H heads of dim P, state dim N, G groups (keywords,
    ``Mamba2Dims``), named, with its layer count."""

    name: str
    layers: int

    def __post_init__(self) -> None:
        if self.H % self.G != 0:
            raise ValueError(f"{self.name}: expected H % G == 0, got H={self.H}, G={self.G}")


@dataclass(frozen=True)
class GDNShape(GDNDims):
    """One Gated DeltaNet layer: HV value heads of dim V, Hk key heads of dim K (keywords,
    ``GDNDims``), named, with its layer count."""

    name: str
    layers: int

    def __post_init__(self) -> None:
        if self.HV % self.Hk != 0:
            raise ValueError(f"{self.name}: expected HV % Hk == 0, got HV={self.HV}, Hk={self.Hk}")

    @property
    def qkv_dim(self) -> int:
        """Width of SGLang's packed ``mixed_qkv`` row: ``q | k | v``."""
        return 2 * self.Hk * self.K + self.HV * self.V


#: NVIDIA Nemotron-3-Nano-4B (Mamba-2 layers)
NANO_4B = Mamba2Shape("nano-4b", H=96, P=80, N=128, G=8, layers=21)
#: Qwen3.5-4B (Gated DeltaNet layers)
QWEN35_4B = GDNShape("qwen3.5-4b", HV=32, Hk=16, K=128, V=128, layers=24)
#: CPU smoke shapes: non-power-of-two head dim and head count, grouped B/C, HV > Hk.
MAMBA2_TINY = Mamba2Shape("mamba2-tiny", H=6, P=20, N=16, G=2, layers=1)
#: K = 32 so that SGLang's built-in ReplaySSM kernel (K split in 2 tiles of >= 16) accepts it.
GDN_TINY = GDNShape("gdn-tiny", HV=4, Hk=2, K=32, V=32, layers=1)

MAMBA2_SHAPES = {s.name: s for s in (NANO_4B, MAMBA2_TINY)}
GDN_SHAPES = {s.name: s for s in (QWEN35_4B, GDN_TINY)}
