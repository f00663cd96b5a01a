"""Byte model of the benchmarks: math.md §11's closed forms, and the per-kernel models they report.

Two levels:

1. The closed forms of ``../shared/design/math.md`` §11 (``baseline_ar``, ``replay_ar``, the spec
   schemes). With math.md's ring bytes ``r`` they reproduce its worked numbers exactly.
2. Per-phase models of the kernels the benchmark times: OUR kernels with the record layouts of
   ``kernels/README.md`` (which fields each phase reads and writes), and SGLang's peers. They live in
   ``sglang_replayssm.byte_model`` (one model, shared with the serving plug-in's verify heuristic;
   its docstring says what is counted and what is left out) and are re-exported here, beside the
   reporting helpers (``mixed_phases``, ``summarize``, ``floor_us``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sglang_replayssm.byte_model import (
    KernelBytes,
    Sizes,
    StepBytes,
    VerifyBytes,
    gdn_builtin_fold_step_bytes,
    gdn_builtin_replay_bytes,
    gdn_builtin_spec_verify_bytes,
    gdn_packed_decode_bytes,
    gdn_record_fields,
    gdn_replay_bytes,
    gdn_replay_verify_bytes,
    gdn_sizes,
    gdn_snapshot_verify_bytes,
    mamba2_replay_bytes,
    mamba2_replay_verify_bytes,
    mamba2_sizes,
    mamba2_snapshot_commit_bytes,
    mamba2_snapshot_verify_bytes,
    selective_state_update_bytes,
    verify_cycle,
)

__all__ = [
    # math.md §11 closed forms
    "baseline_ar",
    "replay_ar",
    "snapshot_spec_vllm",
    "snapshot_spec_sglang",
    "replay_spec",
    "optimal_window",
    "floor_us",
    # reporting
    "mixed_phases",
    "summarize",
    # re-exported from sglang_replayssm.byte_model
    "Sizes",
    "mamba2_sizes",
    "gdn_sizes",
    "gdn_record_fields",
    "StepBytes",
    "KernelBytes",
    "mamba2_replay_bytes",
    "selective_state_update_bytes",
    "gdn_replay_bytes",
    "gdn_packed_decode_bytes",
    "gdn_builtin_replay_bytes",
    "VerifyBytes",
    "verify_cycle",
    "mamba2_replay_verify_bytes",
    "mamba2_snapshot_verify_bytes",
    "mamba2_snapshot_commit_bytes",
    "gdn_replay_verify_bytes",
    "gdn_snapshot_verify_bytes",
    "gdn_builtin_spec_verify_bytes",
    "gdn_builtin_fold_step_bytes",
]


# --------------------------------------------------------------------------------------------------
# math.md §11 closed forms
# --------------------------------------------------------------------------------------------------


def baseline_ar(S: float, I: float) -> float:  # noqa: E741
    """Conventional decode step: read and write the state, plus I/O."""
    return 2 * S + I


def replay_ar(S: float, r: float, I: float, L: int) -> float:  # noqa: E741
    """ReplaySSM decode, mean over the L-phase cycle: ``S + S/L + r(L-1)/2 + r(L-1)/L + I``."""
    return S + S / L + r * (L - 1) / 2 + r * (L - 1) / L + I


def snapshot_spec_vllm(S: float, I: float, T: int) -> float:  # noqa: E741
    """Snapshot spec, vLLM style (read 1 state, write T): ``(1+T)S + T·I``."""
    return (1 + T) * S + T * I


def snapshot_spec_sglang(S: float, I: float, T: int) -> float:  # noqa: E741
    """Snapshot spec, SGLang 0.5.17 (plus the commit copy): ``(3+T)S + T·I``."""
    return (3 + T) * S + T * I


def replay_spec(S: float, r: float, I: float, T: int, B_h: int, a: float) -> float:  # noqa: E741
    """ReplaySSM spec: ``S + S/F + (h̄+T)r + T·r + T·I``, ``F = (B_h-T)/a + 1``, ``h̄ = (B_h-T)/2``.

    math.md's closed form, kept for its worked numbers. The kernels' own model (``verify_cycle`` over
    ``mamba2_replay_verify_bytes`` / ``gdn_replay_verify_bytes``) reads ``h`` history records, not
    ``h̄ + T``, over a cycle whose mean history is ``a·(F+1)/2``, and counts the fields each phase
    reads and GDN's second ``S`` read on flush rows.
    """
    F = (B_h - T) / a + 1
    h = (B_h - T) / 2
    return S + S / F + (h + T) * r + T * r + T * I


def optimal_window(S: float, r: float) -> float:
    """Pure-bandwidth optimum ``L* ≈ sqrt(2S/r)``."""
    return math.sqrt(2 * S / r)


def floor_us(bytes_moved: float, bandwidth_bytes_per_s: float) -> float:
    """Time to move ``bytes_moved`` at ``bandwidth_bytes_per_s``, in microseconds."""
    return bytes_moved / bandwidth_bytes_per_s * 1e6


# --------------------------------------------------------------------------------------------------
# Reporting over the per-kernel models
# --------------------------------------------------------------------------------------------------


def mixed_phases(batch: int, L: int, offset: int = 0) -> list[int]:
    """Rows spread over the phases as in serving: row ``i`` at ``w = (i + offset) % L``."""
    return [(i + offset) % L for i in range(batch)]


def summarize(models: Sequence[KernelBytes]) -> list[dict]:
    """Per-model cycle-mean bytes and the per-phase totals, for JSON output."""
    return [
        {
            "kernel": m.name,
            "L": m.L,
            "cycle_mean_bytes": m.cycle_mean(),
            "phase_bytes": [p.total for p in m.phases()],
            "note": m.note,
        }
        for m in models
    ]
