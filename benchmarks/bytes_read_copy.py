"""Byte model of ``mamba2_replay_decode`` with a split-precision read copy.

Beside ``bytes_model.mamba2_replay_bytes`` (no copy): non-flush rows read the read copy (``S_r``
bytes: ``H·P·N·c_b``, plus ``4·H·P`` fp32 scales for fp8) instead of the checkpoint; flush rows
read and write the checkpoint as before and also write the refreshed copy. Records and I/O are
unchanged. Pool memory per slot and layer grows by ``S_r``.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks import bytes_model as bm
from benchmarks.shapes import Mamba2Shape

__all__ = ["READ_COPY_BYTES", "ReadCopyKernelBytes", "read_copy_bytes", "mamba2_read_copy_bytes"]

#: bytes per element of each ``--read-dtype`` copy
READ_COPY_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1}


def read_copy_bytes(shape: Mamba2Shape, read_dtype: str) -> int:
    """Bytes of one slot's read copy in one layer (fp8: values plus fp32 per-row scales)."""
    H, P, N = shape.H, shape.P, shape.N
    scales = 4 * H * P if read_dtype == "fp8" else 0
    return H * P * N * READ_COPY_BYTES[read_dtype] + scales


@dataclass(frozen=True)
class ReadCopyKernelBytes(bm.KernelBytes):
    """``KernelBytes`` whose non-flush phases read ``S_read`` bytes of state (the copy) and whose
    flush phase writes ``S + S_read`` (checkpoint, then the refreshed copy)."""

    S_read: int = 0

    def phase(self, w: int, flush: bool | None = None) -> bm.StepBytes:
        base = super().phase(w, flush)
        if base.state_write:  # flush
            return bm.StepBytes(base.state_read, base.state_write + self.S_read, base.ring_read,
                                base.ring_write, base.io)
        return bm.StepBytes(self.S_read, 0, base.ring_read, base.ring_write, base.io)


def mamba2_read_copy_bytes(
    shape: Mamba2Shape, L: int, read_dtype: str, state_bytes: int = 4, act_bytes: int = 2
) -> ReadCopyKernelBytes:
    """Per-phase bytes of ``mamba2_replay_decode`` with a ``read_dtype`` copy (see module doc)."""
    base = bm.mamba2_replay_bytes(shape, L, state_bytes, act_bytes)
    return ReadCopyKernelBytes(
        f"replayssm mamba2 (read copy {read_dtype})", base.L, base.S, base.I,
        ring_read_nonflush=base.ring_read_nonflush, ring_read_flush=base.ring_read_flush,
        ring_write=base.ring_write, note=base.note + f"; non-flush reads a {read_dtype} copy",
        S_read=read_copy_bytes(shape, read_dtype),
    )
