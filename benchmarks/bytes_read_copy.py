"""Byte models of our decode and verify kernels with a split-precision read copy (both families).

They live in ``sglang_replayssm.byte_model.read_copy`` (one model, shared with the serving plug-in's
verify heuristic; its docstring says what is counted) and are re-exported here, numbers unchanged.

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

from sglang_replayssm.byte_model.read_copy import (
    READ_COPY_BYTES,
    ReadCopyKernelBytes,
    ReadCopyVerifyBytes,
    gdn_read_copy_bytes,
    mamba2_read_copy_bytes,
    read_copy_bytes,
    verify_read_copy_bytes,
)

__all__ = [
    "READ_COPY_BYTES",
    "ReadCopyKernelBytes",
    "ReadCopyVerifyBytes",
    "read_copy_bytes",
    "mamba2_read_copy_bytes",
    "gdn_read_copy_bytes",
    "verify_read_copy_bytes",
]
