"""Byte models of the speculative verify kernels (``T`` tokens per request): ours and SGLang
0.5.17's peers, per step.

Each function returns a ``VerifyBytes`` for one layer and request; ``state_bytes`` / ``act_bytes``
are element sizes (bytes) of the checkpoint and the activations. Our kernels' steps depend on the
committed history ``h`` and the flush flag (``VerifyBytes.step``; a steady cycle of them:
``verify_cycle``); SGLang's snapshot verify and commit do not.
"""

from __future__ import annotations

from sglang_replayssm.byte_model.sizes import GDNDims, Mamba2Dims, gdn_record_fields, gdn_sizes, mamba2_sizes
from sglang_replayssm.byte_model.steps import VerifyBytes

__all__ = [
    "gdn_builtin_fold_step_bytes",
    "gdn_builtin_spec_verify_bytes",
    "gdn_replay_verify_bytes",
    "gdn_snapshot_commit_bytes",
    "gdn_snapshot_verify_bytes",
    "mamba2_replay_verify_bytes",
    "mamba2_snapshot_commit_bytes",
    "mamba2_snapshot_verify_bytes",
]


def mamba2_replay_verify_bytes(
    shape: Mamba2Dims, T: int, state_bytes: int = 4, act_bytes: int = 2
) -> VerifyBytes:
    """Our ``mamba2_replay_verify``: reads ``S`` and the history records (x, Δ, B), appends the
    ``T`` window records, writes ``S`` on flush rows (the fold reads the same record fields; one
    launch, so a flush row's folded state stays in registers: ``S`` read once)."""
    z = mamba2_sizes(shape, state_bytes, act_bytes)
    return VerifyBytes("replayssm mamba2 verify", T, z.S, z.I, ring_read_nonflush=z.r,
                       ring_read_flush=z.r, ring_write=z.r, note="record x,dt,B")


def mamba2_snapshot_verify_bytes(
    shape: Mamba2Dims, T: int, state_bytes: int = 4, act_bytes: int = 2
) -> VerifyBytes:
    """SGLang's snapshot verify (``selective_state_update``, ``disable_state_update``,
    ``intermediate_states_buffer``): reads ``S``, writes ``T`` states to the buffer:
    ``(1+T)S + T·I``."""
    z = mamba2_sizes(shape, state_bytes, act_bytes)
    return VerifyBytes("sglang snapshot verify", T, z.S, z.I, phased=False, state_writes=T,
                       note="(1+T)S + T·I")


def mamba2_snapshot_commit_bytes(
    shape: Mamba2Dims, T: int, state_bytes: int = 4, act_bytes: int = 2
) -> VerifyBytes:
    """SGLang's commit after a snapshot verify (``fused_mamba_state_scatter_with_mask``): reads
    the accepted intermediate state, writes ``S``: ``2S`` (no activations)."""
    z = mamba2_sizes(shape, state_bytes, act_bytes)
    return VerifyBytes("sglang snapshot commit", T, z.S, z.I, phased=False, state_writes=1,
                       io_tokens=0, note="2S")


def gdn_replay_verify_bytes(
    shape: GDNDims, T: int, state_bytes: int = 4, act_bytes: int = 2, u_bytes: int | None = None
) -> VerifyBytes:
    """Our ``gdn_replay_verify``: non-flush rows read (u, k, g) of each history record, flush rows
    replay raw (k, v, g, β); every row appends ``T`` full records (u, k, v, g, β).  A flush row's
    ``S`` is read twice: by the fold launch (which writes it) and again by the window launch.
    ``u_bytes``: ring_u's element size (activation dtype by default; the server stores fp32)."""
    f = gdn_record_fields(shape, act_bytes, u_bytes)
    z = gdn_sizes(shape, state_bytes, act_bytes)
    return VerifyBytes(
        "replayssm gdn verify", T, z.S, z.I,
        ring_read_nonflush=f["u"] + f["k"] + f["g"],
        ring_read_flush=f["k"] + f["v"] + f["g"] + f["beta"],
        ring_write=sum(f.values()), flush_state_reads=2,
        note="non-flush reads u,k,g; flush reads k,v,g,beta and S twice (fold, window); appends u,k,v,g,beta",
    )


def gdn_snapshot_verify_bytes(
    shape: GDNDims, T: int, state_bytes: int = 4, act_bytes: int = 2
) -> VerifyBytes:
    """SGLang's snapshot verify (``fused_sigmoid_gating_delta_rule_update`` with intermediate
    states): ``(1+T)S + T·I``."""
    z = gdn_sizes(shape, state_bytes, act_bytes)
    return VerifyBytes("sglang snapshot verify", T, z.S, z.I, phased=False, state_writes=T,
                       note="(1+T)S + T·I")


def gdn_snapshot_commit_bytes(
    shape: GDNDims, T: int, state_bytes: int = 4, act_bytes: int = 2
) -> VerifyBytes:
    """SGLang's commit after a GDN snapshot verify (the same ``fused_mamba_state_scatter_with_mask``
    as Mamba-2's): reads the accepted intermediate state, writes ``S``: ``2S`` (no activations)."""
    z = gdn_sizes(shape, state_bytes, act_bytes)
    return VerifyBytes("sglang snapshot commit", T, z.S, z.I, phased=False, state_writes=1,
                       io_tokens=0, note="2S")


def _gdn_raw_record(shape: GDNDims, act_bytes: int) -> int:
    """Raw record of SGLang's built-in rings: v, pre-norm k (activation dtype), g, β (fp32)."""
    return (shape.HV * shape.V + shape.Hk * shape.K) * act_bytes + 8 * shape.HV


def gdn_builtin_spec_verify_bytes(
    shape: GDNDims, T: int, state_bytes: int = 4, act_bytes: int = 2, ring_bytes: int | None = None
) -> VerifyBytes:
    """SGLang 0.5.17's built-in circular-ring verify (``gdn_replayssm_spec_decode``).

    Non-flush rows read (d, k, g) of each history record (d, k in the pool's ring dtype,
    ``ring_bytes``, the SSM dtype by default); flush rows replay raw (v, k, g, β); every row writes
    ``T`` records of both kinds (d, k, g and v, k, β).  A flush row's ``S`` is read twice (the
    fold launch, then the flush-output launch).
    """
    rb = state_bytes if ring_bytes is None else ring_bytes
    dkg = (shape.HV * shape.V + shape.Hk * shape.K) * rb + 4 * shape.HV
    raw = _gdn_raw_record(shape, act_bytes)
    z = gdn_sizes(shape, state_bytes, act_bytes)
    return VerifyBytes("sglang built-in spec verify", T, z.S, z.I, ring_read_nonflush=dkg,
                       ring_read_flush=raw, ring_write=dkg + raw - 4 * shape.HV, flush_state_reads=2,
                       note="non-flush reads d,k,g; flush reads raw v,k,g,beta and S twice; appends both")


def gdn_builtin_fold_step_bytes(
    shape: GDNDims, T: int, a: int, state_bytes: int = 4, act_bytes: int = 2
) -> VerifyBytes:
    """SGLang 0.5.17's active built-in path, fold-every-commit: the verify kernel reads ``S`` and
    writes the raw window (``T`` records), the commit folds the ``a`` accepted records into ``S``
    (reads and writes it): ``3S + (T + a)·r_raw + T·I`` (math.md §11)."""
    raw = _gdn_raw_record(shape, act_bytes)
    z = gdn_sizes(shape, state_bytes, act_bytes)
    return VerifyBytes("sglang built-in fold step", T, z.S, z.I, phased=False, state_reads=2,
                       state_writes=1, extra=(T + a) * raw, note="3S + (T+a)·r_raw + T·I")
