"""Byte model: bytes each decode kernel moves through device memory, per layer, per request, per step.

Two levels:

1. The closed forms of ``../shared/design/math.md`` §11 (``baseline_ar``, ``replay_ar``, the spec
   schemes). With math.md's ring bytes ``r`` they reproduce its worked numbers exactly.
2. Per-phase models of the kernels the benchmark times (``KernelBytes``): OUR kernels with the
   record layouts of ``kernels/README.md`` (which fields each phase reads and writes), and SGLang's
   peers as math.md models them.

Phase ``w`` = ``ring_len`` at the step (records already in the ring). A ring of window ``L`` cycles
through ``w = 0 .. L-1``; the step at ``w = L-1`` (or a forced one) flushes.

What is counted (unique bytes, each read or written once):

- state: ``S`` read every step; ``S`` written on flush steps only (the baselines write it every step);
- ring: the committed records that the phase reads, and the record a non-flush step appends;
- I/O: this step's activations in and the output out (math.md's ``I``).

What is left out (all < 0.01% at the real shapes, and identical across schemes where they apply):

- per-layer parameters (``A``, ``D``, ``dt_bias``, ``A_log``): a few hundred bytes per layer, shared
  by the whole batch;
- per-row slot indices and cursors (``slot_idx``, ``ring_start``, ``ring_len``, ``flush``: 13 B/row);
- the conv window (math.md §10: the same in every scheme);
- re-reads that hit L2 (B shared by the H/G heads of a group, q/k shared by HV/Hk value heads,
  SGLang's built-in kernel reading its S0 tile twice on a flush): counted once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from benchmarks.shapes import GDNShape, Mamba2Shape

__all__ = [
    "Sizes",
    "mamba2_sizes",
    "gdn_sizes",
    "baseline_ar",
    "replay_ar",
    "snapshot_spec_vllm",
    "snapshot_spec_sglang",
    "replay_spec",
    "optimal_window",
    "StepBytes",
    "KernelBytes",
    "mamba2_replay_bytes",
    "selective_state_update_bytes",
    "gdn_replay_bytes",
    "gdn_packed_decode_bytes",
    "gdn_builtin_replay_bytes",
    "floor_us",
]


# --------------------------------------------------------------------------------------------------
# math.md §11 closed forms
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """math.md §11 symbols for one layer: state ``S``, ring bytes per token ``r``, step I/O ``I``."""

    S: int
    r: int
    I: int  # noqa: E741 (math.md's symbol)


def mamba2_sizes(shape: Mamba2Shape, state_bytes: int = 4, act_bytes: int = 2) -> Sizes:
    """math.md's Mamba-2 sizes; ``r = H·P·a_b + 4H + G·N·a_b`` is also our record (kernels/README.md)."""
    H, P, N, G = shape.H, shape.P, shape.N, shape.G
    return Sizes(
        S=H * P * N * state_bytes,
        r=H * P * act_bytes + 4 * H + G * N * act_bytes,
        I=2 * H * P * act_bytes + H * act_bytes + 2 * G * N * act_bytes,
    )


def gdn_sizes(shape: GDNShape, state_bytes: int = 4, act_bytes: int = 2) -> Sizes:
    """math.md's GDN sizes; ``r = HV·V·a_b + Hk·K·a_b + 4HV`` (u, k, g: what a non-flush step reads)."""
    HV, Hk, K, V = shape.HV, shape.Hk, shape.K, shape.V
    return Sizes(
        S=HV * V * K * state_bytes,
        r=HV * V * act_bytes + Hk * K * act_bytes + 4 * HV,
        I=(2 * Hk * K + 2 * HV * V) * act_bytes + 2 * HV * act_bytes,
    )


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
    """ReplaySSM spec: ``S + S/F + (h̄+T)r + T·r + T·I``, ``F = (B_h-T)/a + 1``, ``h̄ = (B_h-T)/2``."""
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
# Per-phase models of the timed kernels
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepBytes:
    """Bytes one request moves in one layer at one step, by where they go."""

    state_read: int
    state_write: int
    ring_read: int
    ring_write: int
    io: int

    @property
    def total(self) -> int:
        return self.state_read + self.state_write + self.ring_read + self.ring_write + self.io


@dataclass(frozen=True)
class KernelBytes:
    """Per-phase byte model of one decode kernel.

    ``L == 0`` marks a kernel without phases (a conventional update): every step is the same.
    Non-flush phase ``w``: ``S`` + ``w·ring_read_nonflush`` + ``ring_write`` + ``I``.
    Flush phase ``w``: ``2S`` + ``w·ring_read_flush`` + ``I``.
    """

    name: str
    L: int
    S: int
    I: int  # noqa: E741
    ring_read_nonflush: int = 0
    ring_read_flush: int = 0
    ring_write: int = 0
    note: str = ""

    @property
    def phased(self) -> bool:
        return self.L > 0

    def phase(self, w: int, flush: bool | None = None) -> StepBytes:
        """Bytes at ring length ``w``; ``flush`` defaults to ``w == L-1`` (the ring is full)."""
        if not self.phased:
            return StepBytes(self.S, self.S, 0, 0, self.I)
        if not 0 <= w <= self.L - 1:
            raise ValueError(f"{self.name}: expected 0 <= w <= {self.L - 1}, got {w}")
        if flush is None:
            flush = w == self.L - 1
        if flush:
            return StepBytes(self.S, self.S, w * self.ring_read_flush, 0, self.I)
        return StepBytes(self.S, 0, w * self.ring_read_nonflush, self.ring_write, self.I)

    def phases(self) -> list[StepBytes]:
        """One entry per phase ``w = 0 .. L-1`` (a single entry for an unphased kernel)."""
        if not self.phased:
            return [self.phase(0)]
        return [self.phase(w) for w in range(self.L)]

    def cycle_mean(self) -> float:
        """Mean bytes per step over the L-phase cycle (flush step included)."""
        ph = self.phases()
        return sum(p.total for p in ph) / len(ph)

    def batch_bytes(self, phases: Iterable[int] | None = None, batch: int | None = None) -> int:
        """Bytes of one launch: ``phases`` lists each row's ``w`` (flush iff ``w == L-1``).

        For an unphased kernel give ``batch`` instead.
        """
        if not self.phased:
            if batch is None:
                if phases is None:
                    raise ValueError(f"{self.name}: expected phases or batch")
                batch = len(list(phases))
            return batch * self.phase(0).total
        if phases is None:
            raise ValueError(f"{self.name}: expected per-row phases")
        return sum(self.phase(int(w)).total for w in phases)


def mamba2_replay_bytes(
    shape: Mamba2Shape, L: int, state_bytes: int = 4, act_bytes: int = 2
) -> KernelBytes:
    """Our ``mamba2_replay_decode``: records (x act, processed dt fp32, B act per group).

    Non-flush reads the w committed records and appends one; the flush folds the w records and the
    current token sequentially (reads the same three fields) and writes ``S`` once. Identical to
    math.md's model, so its cycle mean equals ``replay_ar``.
    """
    z = mamba2_sizes(shape, state_bytes, act_bytes)
    return KernelBytes(
        "replayssm mamba2", L, z.S, z.I,
        ring_read_nonflush=z.r, ring_read_flush=z.r, ring_write=z.r,
        note="record x,dt,B = H·P·a_b + 4H + G·N·a_b",
    )


def selective_state_update_bytes(
    shape: Mamba2Shape, state_bytes: int = 4, act_bytes: int = 2
) -> KernelBytes:
    """SGLang's ``selective_state_update`` (decode): ``2S + I`` (math.md's baseline AR)."""
    z = mamba2_sizes(shape, state_bytes, act_bytes)
    return KernelBytes("sglang selective_state_update", 0, z.S, z.I, note="2S + I")


def gdn_record_fields(
    shape: GDNShape, act_bytes: int = 2, u_bytes: int | None = None
) -> dict[str, int]:
    """Bytes per record of each of our GDN ring fields (kernels/README.md)."""
    u_b = act_bytes if u_bytes is None else u_bytes
    return {
        "u": shape.HV * shape.V * u_b,
        "k": shape.Hk * shape.K * act_bytes,
        "v": shape.HV * shape.V * act_bytes,
        "g": 4 * shape.HV,
        "beta": 4 * shape.HV,
    }


def gdn_replay_bytes(
    shape: GDNShape,
    L: int,
    state_bytes: int = 4,
    act_bytes: int = 2,
    u_bytes: int | None = None,
) -> KernelBytes:
    """Our ``gdn_replay_decode``: a non-flush step reads (u, k, g) of w records and appends a full
    record (u, k, v, g, beta); the flush replays raw (k, v, g, beta) of w records and writes ``S``.

    ``u_bytes`` is the ring_u element size (activation dtype by default; the README allows fp32).
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


def gdn_packed_decode_bytes(
    shape: GDNShape, state_bytes: int = 4, act_bytes: int = 2
) -> KernelBytes:
    """SGLang's ``fused_recurrent_gated_delta_rule_packed_decode``: ``2S + I``."""
    z = gdn_sizes(shape, state_bytes, act_bytes)
    return KernelBytes("sglang packed decode", 0, z.S, z.I, note="2S + I")


def gdn_builtin_replay_bytes(
    shape: GDNShape,
    L: int,
    state_bytes: int = 4,
    act_bytes: int = 2,
    ring_bytes: int | None = None,
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
