"""Byte models of our decode and verify kernels with a split-precision read copy (both families).

Split precision (``--replayssm-read-dtype``, kernels/README.md "Split precision"): beside each
checkpoint the pool holds a narrower **read copy** (bf16, fp16, or fp8 e4m3 with one fp32 scale per
state row). Beside ``decode.mamba2_replay_bytes`` / ``decode.gdn_replay_bytes`` and
``verify.*_replay_verify_bytes`` (no copy): non-flush rows read the copy (``S_r`` bytes) instead of
the checkpoint; flush rows read and write the checkpoint as before and also write the refreshed copy;
where a second launch reads a flush row's folded state (the GDN verify's window launch,
``flush_state_reads = 2``) it reads the copy. Records and I/O are unchanged. Pool memory per slot and
layer grows by ``S_r``.

``S_r`` is the copy's values plus, for fp8, one fp32 scale per row of the last (state) dim:

- Mamba-2 ``[H, P, N]``: ``H·P·N·c_b`` (+ ``4·H·P``);
- GDN ``[HV, V, K]``: ``HV·V·K·c_b`` (+ ``4·HV·V``: rows = V, scaled over K).

Decode cycle mean over the L phases: ``S_r + 2S/L + ring + I``, math.md §9's "S_lo + σ + 2·S_hi/L +
ring + I" with the ring and I of the no-copy models (GDN: +v, β over math.md's ring, as without a
copy).

A copy refreshed outside the kernels (``ReplayMambaPool.refresh_read``: after prefill, copy-on-write,
radix materialisation and SGLang's snapshot-path commit; one fused launch on CUDA) reads the checkpoint
and writes the copy: ``read_copy_refresh_bytes``.

Moved here from ``benchmarks/bytes_read_copy.py`` (audited; it re-exports these, numbers unchanged) so
that the serving plug-in's verify heuristic counts the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_replayssm.byte_model.decode import gdn_replay_bytes, mamba2_replay_bytes
from sglang_replayssm.byte_model.sizes import GDNDims, Mamba2Dims
from sglang_replayssm.byte_model.steps import KernelBytes, StepBytes, VerifyBytes

__all__ = [
    "READ_COPY_BYTES",
    "READ_COPY_SCALE_BYTES",
    "ReadCopyKernelBytes",
    "ReadCopyVerifyBytes",
    "gdn_read_copy_bytes",
    "mamba2_read_copy_bytes",
    "read_copy_bytes",
    "read_copy_refresh_bytes",
    "read_copy_size",
    "verify_read_copy_bytes",
]

#: bytes per element of each ``--read-dtype`` copy
READ_COPY_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1}
#: bytes per state row of each copy's scales (fp8: one fp32 scale per row; none otherwise)
READ_COPY_SCALE_BYTES = {"bf16": 0, "fp16": 0, "fp8": 4}


def read_copy_size(shape: Mamba2Dims | GDNDims, read_bytes: int, scale_bytes: int = 0) -> int:
    """``S_r``: bytes of one slot's read copy in one layer, from element sizes.

    Parameters
    ----------
    shape : Mamba2Dims or GDNDims
        The layer (a ``GDNDims`` is a GDN layer; anything else is read as Mamba-2).
    read_bytes : int
        Bytes per element of the copy (2 for bf16 / fp16, 1 for fp8).
    scale_bytes : int
        Bytes of the scale of one state row (last dim: Mamba-2 ``N``, GDN ``K``); 4 for fp8, else 0.
    """
    if isinstance(shape, GDNDims):
        rows, n = shape.HV * shape.V, shape.K
    else:
        rows, n = shape.H * shape.P, shape.N
    return rows * n * read_bytes + rows * scale_bytes


def read_copy_bytes(shape: Mamba2Dims | GDNDims, read_dtype: str) -> int:
    """Bytes of one slot's read copy in one layer (fp8: values plus fp32 per-row scales)."""
    return read_copy_size(shape, READ_COPY_BYTES[read_dtype], READ_COPY_SCALE_BYTES[read_dtype])


def read_copy_refresh_bytes(S: int, S_read: int) -> StepBytes:
    """A refresh of one slot's copy in one layer outside the decode kernels
    (``ReplayMambaPool.refresh_read``): the checkpoint read (``S``), the copy and its scales written
    (``S_read``).

    On CUDA this is also what moves: the pool calls the fused kernel
    ``replayssm_kernels.read_copy_refresh.refresh_read_copy``, which reads each touched checkpoint row
    once and writes the copy (and the fp8 scale) once; padding entries move nothing. (The unfused
    torch path it replaced, a gather, ``quantize_rows`` and a scatter, moved about ``3S + 3S_read``
    for a 16-bit copy and about ``8S`` for fp8 through its temporaries; a CPU pool still runs that
    path, ``refresh_read_copy_ref``.)
    """
    return StepBytes(S, S_read, 0, 0, 0)


@dataclass(frozen=True)
class ReadCopyKernelBytes(KernelBytes):
    """``KernelBytes`` whose non-flush phases read ``S_read`` bytes of state (the copy) and whose
    flush phase writes ``S + S_read`` (checkpoint, then the refreshed copy)."""

    S_read: int = 0

    def phase(self, w: int, flush: bool | None = None) -> StepBytes:
        base = super().phase(w, flush)
        if base.state_write:  # flush
            return StepBytes(base.state_read, base.state_write + self.S_read, base.ring_read,
                             base.ring_write, base.io)
        return StepBytes(self.S_read, 0, base.ring_read, base.ring_write, base.io)


def _with_copy(base: KernelBytes, S_read: int, read_dtype: str) -> ReadCopyKernelBytes:
    return ReadCopyKernelBytes(
        f"{base.name} (read copy {read_dtype})", base.L, base.S, base.I,
        ring_read_nonflush=base.ring_read_nonflush, ring_read_flush=base.ring_read_flush,
        ring_write=base.ring_write, note=base.note + f"; non-flush reads a {read_dtype} copy",
        S_read=S_read,
    )


def mamba2_read_copy_bytes(
    shape: Mamba2Dims, L: int, read_dtype: str, state_bytes: int = 4, act_bytes: int = 2
) -> ReadCopyKernelBytes:
    """Per-phase bytes of ``mamba2_replay_decode`` with a ``read_dtype`` copy (see module doc)."""
    base = mamba2_replay_bytes(shape, L, state_bytes, act_bytes)
    return _with_copy(base, read_copy_bytes(shape, read_dtype), read_dtype)


def gdn_read_copy_bytes(
    shape: GDNDims,
    L: int,
    read_dtype: str,
    state_bytes: int = 4,
    act_bytes: int = 2,
    u_bytes: int | None = None,
) -> ReadCopyKernelBytes:
    """Per-phase bytes of ``gdn_replay_decode`` with a ``read_dtype`` copy (see module doc).

    Records as ``decode.gdn_replay_bytes`` (``u_bytes``: ring_u element size): a non-flush step
    reads the copy and (u, k, g) of w records and appends (u, k, v, g, β); the flush reads the
    checkpoint and (k, v, g, β) of w records, writes the checkpoint and the refreshed copy.
    """
    base = gdn_replay_bytes(shape, L, state_bytes, act_bytes, u_bytes=u_bytes)
    return _with_copy(base, read_copy_bytes(shape, read_dtype), read_dtype)


@dataclass(frozen=True)
class ReadCopyVerifyBytes(VerifyBytes):
    """``VerifyBytes`` of our verify with a read copy: non-flush rows read ``S_read`` bytes of
    state (the copy); flush rows read the checkpoint, write it and the refreshed copy, and where a
    second launch reads the folded state (GDN, ``flush_state_reads = 2``) it reads the copy."""

    S_read: int = 0

    def step(self, h: int = 0, flush: bool = False) -> StepBytes:
        base = super().step(h, flush)
        if flush:
            reads = self.S + (self.flush_state_reads - 1) * self.S_read
            return StepBytes(reads, base.state_write + self.S_read, base.ring_read,
                             base.ring_write, base.io)
        return StepBytes(self.S_read, 0, base.ring_read, base.ring_write, base.io)


def verify_read_copy_bytes(base: VerifyBytes, S_read: int, read_dtype: str) -> ReadCopyVerifyBytes:
    """``base`` (``verify.mamba2_replay_verify_bytes`` / ``gdn_replay_verify_bytes``) with a
    ``read_dtype`` copy (a label: it only names the model) of ``S_read`` bytes per slot
    (``read_copy_bytes`` / ``read_copy_size``).

    Raises
    ------
    ValueError
        ``base`` unphased (SGLang's snapshot verify and commit read the checkpoint, not a copy).
    """
    if not base.phased:
        raise ValueError(f"{base.name}: expected a phased (ring) verify model, got an unphased one")
    return ReadCopyVerifyBytes(
        f"{base.name} (read copy {read_dtype})", base.T, base.S, base.I,
        ring_read_nonflush=base.ring_read_nonflush, ring_read_flush=base.ring_read_flush,
        ring_write=base.ring_write, flush_state_reads=base.flush_state_reads,
        note=base.note + f"; non-flush reads a {read_dtype} copy", S_read=S_read,
    )
