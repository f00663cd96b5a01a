"""Byte models of our decode and verify kernels with a split-precision read copy (both families).

Beside ``bytes_model.mamba2_replay_bytes`` / ``bytes_model.gdn_replay_bytes`` (no copy): non-flush
rows read the read copy (``S_r`` bytes) instead of the checkpoint; flush rows read and write the
checkpoint as before and also write the refreshed copy. Records and I/O are unchanged. Pool memory
per slot and layer grows by ``S_r``.

``S_r`` is the copy's values plus, for fp8, one fp32 scale per row of the last (state) dim:

- Mamba-2 ``[H, P, N]``: ``H·P·N·c_b`` (+ ``4·H·P``);
- GDN ``[HV, V, K]``: ``HV·V·K·c_b`` (+ ``4·HV·V``: rows = V, scaled over K).

Cycle mean over the L phases: ``S_r + 2S/L + ring + I``, math.md §9's "S_lo + σ + 2·S_hi/L +
ring + I" with the ring and I of the no-copy models (GDN: +v, β over math.md's ring, as without a
copy).
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks import bytes_model as bm
from benchmarks.shapes import GDNShape, Mamba2Shape

__all__ = [
    "READ_COPY_BYTES",
    "ReadCopyKernelBytes",
    "ReadCopyVerifyBytes",
    "read_copy_bytes",
    "mamba2_read_copy_bytes",
    "gdn_read_copy_bytes",
    "verify_read_copy_bytes",
]

#: bytes per element of each ``--read-dtype`` copy
READ_COPY_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1}


def read_copy_bytes(shape: Mamba2Shape | GDNShape, read_dtype: str) -> int:
    """Bytes of one slot's read copy in one layer (fp8: values plus fp32 per-row scales)."""
    if isinstance(shape, GDNShape):
        rows, n = shape.HV * shape.V, shape.K
    else:
        rows, n = shape.H * shape.P, shape.N
    scales = 4 * rows if read_dtype == "fp8" else 0
    return rows * n * READ_COPY_BYTES[read_dtype] + scales


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


def _with_copy(base: bm.KernelBytes, S_read: int, read_dtype: str) -> ReadCopyKernelBytes:
    return ReadCopyKernelBytes(
        f"{base.name} (read copy {read_dtype})", base.L, base.S, base.I,
        ring_read_nonflush=base.ring_read_nonflush, ring_read_flush=base.ring_read_flush,
        ring_write=base.ring_write, note=base.note + f"; non-flush reads a {read_dtype} copy",
        S_read=S_read,
    )


def mamba2_read_copy_bytes(
    shape: Mamba2Shape, L: int, read_dtype: str, state_bytes: int = 4, act_bytes: int = 2
) -> ReadCopyKernelBytes:
    """Per-phase bytes of ``mamba2_replay_decode`` with a ``read_dtype`` copy (see module doc)."""
    base = bm.mamba2_replay_bytes(shape, L, state_bytes, act_bytes)
    return _with_copy(base, read_copy_bytes(shape, read_dtype), read_dtype)


def gdn_read_copy_bytes(
    shape: GDNShape,
    L: int,
    read_dtype: str,
    state_bytes: int = 4,
    act_bytes: int = 2,
    u_bytes: int | None = None,
) -> ReadCopyKernelBytes:
    """Per-phase bytes of ``gdn_replay_decode`` with a ``read_dtype`` copy (see module doc).

    Records as ``bytes_model.gdn_replay_bytes`` (``u_bytes``: ring_u element size): a non-flush
    step reads the copy and (u, k, g) of w records and appends (u, k, v, g, β); the flush reads the
    checkpoint and (k, v, g, β) of w records, writes the checkpoint and the refreshed copy.
    """
    base = bm.gdn_replay_bytes(shape, L, state_bytes, act_bytes, u_bytes=u_bytes)
    return _with_copy(base, read_copy_bytes(shape, read_dtype), read_dtype)


@dataclass(frozen=True)
class ReadCopyVerifyBytes(bm.VerifyBytes):
    """``VerifyBytes`` of our verify with a read copy: non-flush rows read ``S_read`` bytes of
    state (the copy); flush rows read the checkpoint, write it and the refreshed copy, and where a
    second launch reads the folded state (GDN, ``flush_state_reads = 2``) it reads the copy."""

    S_read: int = 0

    def step(self, h: int = 0, flush: bool = False) -> bm.StepBytes:
        base = super().step(h, flush)
        if flush:
            reads = self.S + (self.flush_state_reads - 1) * self.S_read
            return bm.StepBytes(reads, base.state_write + self.S_read, base.ring_read,
                                base.ring_write, base.io)
        return bm.StepBytes(self.S_read, 0, base.ring_read, base.ring_write, base.io)


def verify_read_copy_bytes(base: bm.VerifyBytes, S_read: int,
                           read_dtype: str) -> ReadCopyVerifyBytes:
    """``base`` (``bytes_model.mamba2_replay_verify_bytes`` / ``gdn_replay_verify_bytes``) with a
    ``read_dtype`` copy of ``S_read`` bytes per slot (``read_copy_bytes``)."""
    return ReadCopyVerifyBytes(
        f"{base.name} (read copy {read_dtype})", base.T, base.S, base.I,
        ring_read_nonflush=base.ring_read_nonflush, ring_read_flush=base.ring_read_flush,
        ring_write=base.ring_write, flush_state_reads=base.flush_state_reads,
        note=base.note + f"; non-flush reads a {read_dtype} copy", S_read=S_read,
    )
