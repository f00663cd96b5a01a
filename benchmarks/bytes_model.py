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
  SGLang's built-in decode kernel reading its S0 tile twice on a flush, in one program): counted
  once.  A re-read by a later launch (the GDN verifies' flush rows: the fold launch writes ``S``,
  the next launch reads it again, after the whole batch's stores) is counted.
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


# --------------------------------------------------------------------------------------------------
# Speculative verify (T tokens per row): per-step models of the timed verify kernels
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifyBytes:
    """Per-step byte model of one verify kernel (or step) of ``T`` tokens.

    Phased kernels (ring-based: ours, SGLang's built-in circular ring) at history length ``h``
    (committed records in the ring): ``S`` read, ``S`` written on flush steps, ``h`` history
    records read (``ring_read_nonflush`` or ``ring_read_flush`` bytes each), ``T`` window records
    written (``ring_write`` each), ``T·I`` activations in and outputs out. Unphased kernels
    (``phased=False``, SGLang's snapshot verify and commit) move ``state_reads·S +
    state_writes·S + T·I + extra`` whatever the history.
    """

    name: str
    T: int
    S: int
    I: int  # noqa: E741 (per token, math.md's symbol)
    phased: bool = True
    ring_read_nonflush: int = 0
    ring_read_flush: int = 0
    ring_write: int = 0
    state_reads: int = 1
    state_writes: int = 0
    flush_state_reads: int = 1  # S reads of a flush row: 2 where a second launch reads the folded S
    io_tokens: int | None = None  # tokens of activations moved (default T)
    extra: int = 0
    note: str = ""

    def step(self, h: int = 0, flush: bool = False) -> StepBytes:
        """Bytes of one request at history length ``h`` (ignored when unphased)."""
        io = (self.T if self.io_tokens is None else self.io_tokens) * self.I
        if not self.phased:
            return StepBytes(self.state_reads * self.S, self.state_writes * self.S, 0, self.extra,
                             io)
        if h < 0:
            raise ValueError(f"{self.name}: expected h >= 0, got {h}")
        per = self.ring_read_flush if flush else self.ring_read_nonflush
        reads = self.flush_state_reads if flush else 1
        return StepBytes(reads * self.S, self.S if flush else 0, h * per, self.T * self.ring_write, io)

    def batch_bytes(self, rows: Iterable[tuple[int, bool]]) -> int:
        """Bytes of one launch whose rows are at ``(h, flush)``."""
        return sum(self.step(h, f).total for h, f in rows)


def verify_cycle(L: int, T: int, a: int) -> list[tuple[int, bool]]:
    """Steady-state verify cycle with a constant accepted count ``a`` (kernels/README.md's rule).

    After a flush step the history is ``a``; each non-flush step adds ``a``; a step flushes when
    ``len + T > L``. Returns the ``(len, flush)`` of each step of one cycle, the flush step last
    (e.g. ``L=16, T=4, a=2``: lens 2, 4, ..., 12, then 14 flushing). ``len <= max(L, T)`` always.
    """
    if not 1 <= a <= T:
        raise ValueError(f"expected 1 <= a <= T = {T}, got a = {a}")
    out, h = [], a
    while h + T <= L:
        out.append((h, False))
        h += a
    out.append((h, True))
    return out


def mamba2_replay_verify_bytes(
    shape: Mamba2Shape, T: int, state_bytes: int = 4, act_bytes: int = 2
) -> VerifyBytes:
    """Our ``mamba2_replay_verify``: reads ``S`` and the history records (x, Δ, B), appends the
    ``T`` window records, writes ``S`` on flush rows (the fold reads the same record fields)."""
    z = mamba2_sizes(shape, state_bytes, act_bytes)
    return VerifyBytes("replayssm mamba2 verify", T, z.S, z.I, ring_read_nonflush=z.r,
                       ring_read_flush=z.r, ring_write=z.r, note="record x,dt,B")


def mamba2_snapshot_verify_bytes(
    shape: Mamba2Shape, T: int, state_bytes: int = 4, act_bytes: int = 2
) -> VerifyBytes:
    """SGLang's snapshot verify (``selective_state_update``, ``disable_state_update``,
    ``intermediate_states_buffer``): reads ``S``, writes ``T`` states to the buffer:
    ``(1+T)S + T·I``."""
    z = mamba2_sizes(shape, state_bytes, act_bytes)
    return VerifyBytes("sglang snapshot verify", T, z.S, z.I, phased=False, state_writes=T,
                       note="(1+T)S + T·I")


def mamba2_snapshot_commit_bytes(
    shape: Mamba2Shape, T: int, state_bytes: int = 4, act_bytes: int = 2
) -> VerifyBytes:
    """SGLang's commit after a snapshot verify (``fused_mamba_state_scatter_with_mask``): reads
    the accepted intermediate state, writes ``S``: ``2S`` (no activations)."""
    z = mamba2_sizes(shape, state_bytes, act_bytes)
    return VerifyBytes("sglang snapshot commit", T, z.S, z.I, phased=False, state_writes=1,
                       io_tokens=0, note="2S")


def gdn_replay_verify_bytes(
    shape: GDNShape, T: int, state_bytes: int = 4, act_bytes: int = 2, u_bytes: int | None = None
) -> VerifyBytes:
    """Our ``gdn_replay_verify``: non-flush rows read (u, k, g) of each history record, flush rows
    replay raw (k, v, g, β); every row appends ``T`` full records (u, k, v, g, β).  A flush row's
    ``S`` is read twice: by the fold launch (which writes it) and again by the window launch."""
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
    shape: GDNShape, T: int, state_bytes: int = 4, act_bytes: int = 2
) -> VerifyBytes:
    """SGLang's snapshot verify (``fused_sigmoid_gating_delta_rule_update`` with intermediate
    states): ``(1+T)S + T·I``."""
    z = gdn_sizes(shape, state_bytes, act_bytes)
    return VerifyBytes("sglang snapshot verify", T, z.S, z.I, phased=False, state_writes=T,
                       note="(1+T)S + T·I")


def _gdn_raw_record(shape: GDNShape, act_bytes: int) -> int:
    """Raw record of SGLang's built-in rings: v, pre-norm k (activation dtype), g, β (fp32)."""
    return (shape.HV * shape.V + shape.Hk * shape.K) * act_bytes + 8 * shape.HV


def gdn_builtin_spec_verify_bytes(
    shape: GDNShape, T: int, state_bytes: int = 4, act_bytes: int = 2,
    ring_bytes: int | None = None,
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
    shape: GDNShape, T: int, a: int, state_bytes: int = 4, act_bytes: int = 2
) -> VerifyBytes:
    """SGLang 0.5.17's active built-in path, fold-every-commit: the verify kernel reads ``S`` and
    writes the raw window (``T`` records), the commit folds the ``a`` accepted records into ``S``
    (reads and writes it): ``3S + (T + a)·r_raw + T·I`` (math.md §11)."""
    raw = _gdn_raw_record(shape, act_bytes)
    z = gdn_sizes(shape, state_bytes, act_bytes)
    return VerifyBytes("sglang built-in fold step", T, z.S, z.I, phased=False, state_reads=2,
                       state_writes=1, extra=(T + a) * raw, note="3S + (T+a)·r_raw + T·I")
