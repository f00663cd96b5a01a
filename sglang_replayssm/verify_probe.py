"""The timed startup probe of ``--replayssm-verify auto``: both verify paths, on this GPU, this model's shapes.

``heuristic.decide_buckets`` asks ``probe(bs, T) -> heuristic.Timing`` for every CUDA-graph bucket it
has no cached decision for.  ``VerifyProbe`` answers with the seconds of one whole verify step (all SSM
layers) of each path, built from four timed units that run exactly what the server runs:

==========================  ========================================================================
unit                        what is timed (``spec.py``, ``mamba2.py``, ``gdn.py``)
==========================  ========================================================================
replay, per layer           our verify kernel (``mamba2_replay_verify`` / ``gdn_replay_verify``)
replay, per forward         ``verify_cursor_step`` + ``verify_commit`` (once, not per layer)
snapshot, per layer         the materialise call (our verify kernel, one-token window; rows with an
                            empty ring do not flush) + SGLang's verify writing ``T`` per-draft states
                            (``selective_state_update`` / ``fused_sigmoid_gating_delta_rule_update``,
                            ``disable_state_update=True``, ``intermediate_states_buffer``,
                            ``cache_steps=T``)
snapshot, per forward       the materialise cursor snapshot + SGLang's commit
                            (``fused_mamba_state_scatter_with_mask`` over all layers: one launch, as
                            ``scatter_mamba_states_after_mtp_verify`` runs it) + the ring reset
                            + the read copy's refresh (split precision: ``pool.refresh_read``)
==========================  ========================================================================

``Timing = layers · per-layer + per-forward`` for each path.  The conv rollback is left out: both paths
run the same one.  The snapshot side includes our materialise call because the server runs it on
every snapshot-path forward (in steady state the ring is empty then, ``len = 0``: no row flushes, but
the kernel still reads the checkpoint, or a split-precision read copy, for its discarded outputs),
and with a copy the commit's refresh of it; it is the cost of *our* snapshot fallback, not of stock
SGLang.

**Ring fill (the byte model's assumptions).**  ``heuristic.replay_verify_bytes`` assumes every draft
accepted (``a = T``): a flush leaves ``len = a``, the history grows by ``a`` while ``len + T <= limit``
(the server's late rule: ``limit = max(L, T) + T``, ``sizing.verify_flush_limit``) and the next step
flushes, so one flush every ``F`` steps (``sglang_replayssm.byte_model.verify_cycle``).
The probe puts the batch's rows on that same cycle: row ``i`` is at phase ``(i + j) mod F`` in variant
``j``; every variant is timed and the per-variant medians are averaged, so even ``bs < F`` sees the
flush share ``1/F``.  Ring starts are random (rings wrap).  The snapshot commit scatters draft
``T - 1`` (all accepted).

**Memory: the server pool's own tensors, no new state.**  Batch × ``T`` full states are what SGLang's
``intermediate_ssm`` already holds (and ``auto`` keeps it), so the probe reuses the pool: ``temporal``,
``intermediate_ssm`` and the rings of every layer, for slots ``1..bs``.  The probe runs while the
backend is built, before the scheduler admits any request, so every slot but the null slot 0 is free;
SGLang clears (or copy-on-writes) a slot's state whenever it hands it out, and our cursors keep its
ring empty.  Still, the probe leaves the pool as allocated: it advances a private copy of the cursors
(the pool's are never written) and zeroes the checkpoint and ring rows of the slots it touched
afterwards (their value at allocation); ``intermediate_ssm`` is scratch that SGLang writes before
every read.  New allocations are the per-bucket inputs only (``bs · T`` tokens of activations).
Successive calls of a per-layer unit cycle through the layers, so a call finds its layer's state cold in
L2, as in a forward.

**Which buckets are measured.**  ``anchor_buckets``: the powers of two among the buckets plus the
smallest and largest (at most ``max_anchors``, 10); the others are interpolated linearly in ``bs``
between the neighbouring measured anchors, each unit separately, and logged as such.  Buckets above what
the pool can hold (free slots, ``intermediate_ssm`` rows) are extrapolated proportionally from the
largest feasible batch.  A bucket where SGLang's commit scatter cannot run (its ``pid_req ·
src_req_stride`` is formed in int32: ``(bs - 1) · T · state_elems > 2^31 - 1`` faults) raises, so that
bucket falls back to the byte model, logged (``heuristic.decide_buckets``).

**Timing** (``cuda_median_timer``).  CUDA events around each call, 3 warm-up rounds (they also compile
the kernels), ~15 timed calls per unit, medians; one event sync per unit, no other host sync.  The
server replays verify steps as CUDA graphs, so host launch overhead must not count: a GPU sleep queued
ahead of the timed calls lets the host enqueue them all first, and the events see GPU work only (eager
launches, not graph replay: the gaps between kernels remain).  Each anchor's wall time is logged.
Estimate (not yet measured): at the H200's bandwidth the timed work of all anchors stays around a
second for buckets up to 512 (the all-layer commit scatter dominates), plus up to 0.1 s of lead per
unit and anchor, plus Triton compilation on a cold cache (which the CUDA-graph capture would pay
anyway for the same kernels).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence

import torch

from sglang_replayssm import heuristic
from sglang_replayssm.byte_model import verify_cycle
from sglang_replayssm.sizing import verify_flush_limit

__all__ = [
    "ProbeKernels",
    "ProbeParts",
    "Timer",
    "VerifyProbe",
    "anchor_buckets",
    "cuda_kernels",
    "cuda_median_timer",
    "make_probe",
]

logger = logging.getLogger(__name__)

MAX_ANCHORS = 10
SLEEP_CYCLES_PER_S = 2.0e9
"""GPU clock cycles per second assumed for ``torch.cuda._sleep`` (H200: 1.98 GHz; a slower clock only
shortens the lead the host gets)."""

Timer = Callable[[str, Sequence[Callable[[], object]]], float]
"""``timer(unit, calls) -> seconds per call``: the mean over ``calls`` of each call's median time."""


def anchor_buckets(buckets: Iterable[int], cap: int, max_anchors: int = MAX_ANCHORS) -> list[int]:
    """The batch sizes the probe measures: powers of two among ``buckets``, the smallest and the
    largest, each capped at ``cap`` (the largest feasible batch), at most ``max_anchors`` of them
    (evenly spaced in that list when there are more).

    Raises
    ------
    ValueError
        No bucket, a bucket or ``cap`` below 1, or ``max_anchors < 2``.
    """
    bs = sorted(set(buckets))
    if not bs or bs[0] < 1 or cap < 1 or max_anchors < 2:
        raise ValueError(f"expected buckets >= 1, cap >= 1, max_anchors >= 2, got {bs}, {cap}, {max_anchors}")
    picked = {b for b in bs if b & (b - 1) == 0} | {bs[0], bs[-1]}
    points = sorted({min(b, cap) for b in picked})
    if len(points) > max_anchors:
        step = (len(points) - 1) / (max_anchors - 1)
        points = [points[round(i * step)] for i in range(max_anchors)]
    return points


@dataclasses.dataclass(frozen=True)
class ProbeParts:
    """Measured seconds of one bucket, per unit (see the module docstring)."""

    replay_layer_s: float
    replay_forward_s: float
    snapshot_layer_s: float
    snapshot_forward_s: float

    def timing(self, num_layers: int) -> heuristic.Timing:
        """One verify step of all ``num_layers`` SSM layers: per-layer units times the layers, plus the
        once-per-forward units once."""
        return heuristic.Timing(
            snapshot_s=num_layers * self.snapshot_layer_s + self.snapshot_forward_s,
            replay_s=num_layers * self.replay_layer_s + self.replay_forward_s,
        )

    def scaled(self, factor: float) -> ProbeParts:
        return ProbeParts(*(factor * v for v in dataclasses.astuple(self)))

    def lerp(self, other: ProbeParts, weight: float) -> ProbeParts:
        """``(1 - weight) · self + weight · other``, unit by unit."""
        return ProbeParts(*((1 - weight) * a + weight * b
                            for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProbeKernels:
    """The kernels the probe times, called with the server's signatures (tests inject fakes).

    Attributes
    ----------
    replay_verify
        ``replayssm_kernels.mamba2_replay_verify`` or ``gdn_replay_verify``.
    cursor_step, commit
        ``replayssm_kernels.verify_cursor_step`` and ``verify_commit``.
    snapshot_verify
        SGLang's ``selective_state_update`` (Mamba-2) or ``fused_sigmoid_gating_delta_rule_update`` (GDN).
    snapshot_commit
        SGLang's ``fused_mamba_state_scatter_with_mask``.
    """

    replay_verify: Callable[..., object]
    cursor_step: Callable[..., object]
    commit: Callable[..., object]
    snapshot_verify: Callable[..., object]
    snapshot_commit: Callable[..., object]


def cuda_kernels(family: str) -> ProbeKernels:
    """The real CUDA kernels of ``family`` (``"mamba2"`` / ``"gdn"``); imports SGLang's on call."""
    import replayssm_kernels as rk
    from sglang.kernels.ops.mamba.mamba_state_scatter_triton import fused_mamba_state_scatter_with_mask

    if family == "mamba2":
        from sglang.kernels.ops.mamba.triton_ops.mamba_ssm import selective_state_update as snapshot_verify

        replay_verify = rk.mamba2_replay_verify
    elif family == "gdn":
        from sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent import (
            fused_sigmoid_gating_delta_rule_update as snapshot_verify,
        )

        replay_verify = rk.gdn_replay_verify
    else:
        raise ValueError(f"family: expected mamba2 or gdn, got {family!r}")
    return ProbeKernels(replay_verify=replay_verify, cursor_step=rk.verify_cursor_step, commit=rk.verify_commit,
                        snapshot_verify=snapshot_verify, snapshot_commit=fused_mamba_state_scatter_with_mask)


def cuda_median_timer(unit: str, calls: Sequence[Callable[[], object]], *, warmup: int = 3,
                      iters: int = 15, max_lead_s: float = 0.1) -> float:
    """Seconds per call of GPU work on the current CUDA stream (CUDA events around every call).

    ``warmup`` untimed rounds (they compile the kernels), then about ``iters`` timed calls shared among
    ``calls`` (at least 3 each), one event sync at the end.  A GPU sleep is queued before the timed
    calls, long enough (twice the host's time to enqueue them, at most ``max_lead_s``) for the host to
    enqueue them all before the GPU runs any: the events then time the GPU work alone, not Python's
    launch overhead, which CUDA graphs remove in serving.

    Returns the mean over ``calls`` of each one's median.  ``unit`` names the measurement (unused here;
    part of the ``Timer`` signature).
    """
    del unit
    if warmup < 1:
        raise ValueError(f"warmup: expected >= 1, got {warmup}")
    for _ in range(warmup - 1):
        for call in calls:
            call()
    began = time.perf_counter()
    for call in calls:
        call()
    host_round_s = time.perf_counter() - began
    rounds = max(3, math.ceil(iters / len(calls)))
    torch.cuda._sleep(int(SLEEP_CYCLES_PER_S * min(max_lead_s, 2 * rounds * host_round_s)))
    events: list[list[tuple[torch.cuda.Event, torch.cuda.Event]]] = [[] for _ in calls]
    for _ in range(rounds):
        for i, call in enumerate(calls):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            events[i].append((start, end))
    events[-1][-1][1].synchronize()
    return statistics.fmean(statistics.median(s.elapsed_time(e) for s, e in ev) for ev in events) / 1e3


class VerifyProbe:
    """``probe(bs, T) -> heuristic.Timing`` on a ``ReplayMambaPool`` (see the module docstring).

    Nothing runs at construction; the first call builds the inputs and measures.  Measured anchors
    (and failures) are remembered, so interpolated buckets re-use them.

    Parameters
    ----------
    pool : ReplayMambaPool
        The server's pool, with speculative state (``intermediate_ssm`` kept: ``auto``).
    buckets : iterable of int
        The CUDA-graph batch buckets that will be asked for (chooses the anchors).
    kernels : callable
        Returns the ``ProbeKernels`` (``cuda_kernels(family)`` in the server); called at the first
        measurement, so that a failing import fails the probe (logged fallback), not the startup.
    timer : Timer
        ``cuda_median_timer`` in the server.
    seed : int
        Inputs, ring starts and slot order.
    log : logging.Logger
        One line per measured anchor and per interpolated bucket.
    """

    def __init__(self, pool, buckets: Iterable[int], *, kernels: Callable[[], ProbeKernels], timer: Timer,
                 seed: int = 0, log: logging.Logger = logger) -> None:
        self.pool = pool
        self.buckets = sorted(set(buckets))
        self._kernel_factory = kernels
        self._kernels: ProbeKernels | None = None
        self.timer = timer
        self.seed = seed
        self.log = log
        self.family = pool.ring_spec.family
        self.num_layers = pool.ring_spec.num_layers
        self.num_tokens = pool.spec_tokens
        self.window = pool.replay.window
        self.rows = pool.ring_spec.rows
        self._measured: dict[int, ProbeParts | Exception] = {}
        self._anchors: list[int] | None = None

    # ------------------------------------------------------------------ limits

    def _interm(self) -> torch.Tensor:
        buf = self.pool.mamba_cache.intermediate_ssm
        if buf is None:
            raise RuntimeError("ReplaySSM verify probe: the pool has no intermediate_ssm (SGLang's per-draft "
                               "states), so SGLang's snapshot verify cannot run")
        return buf

    def _scatter_limit(self) -> int:
        """Largest batch SGLang's commit scatter can serve (``spec_plan.snapshot_batch_limit``)."""
        from sglang_replayssm.spec_plan import snapshot_batch_limit

        return snapshot_batch_limit(self.num_tokens, self._interm().stride(1) // self.num_tokens)

    def cap(self) -> int:
        """Largest batch the probe measures: free slots (all but the null slot 0), ``intermediate_ssm``
        rows, and SGLang's commit scatter limit."""
        slots = self.pool.mamba_cache.temporal.shape[1] - 1
        return int(min(slots, self._interm().shape[1], self._scatter_limit()))

    def anchors(self) -> list[int]:
        if self._anchors is None:
            self._anchors = anchor_buckets(self.buckets, self.cap())
        return self._anchors

    # ------------------------------------------------------------------ the probe

    def __call__(self, batch_size: int, num_tokens: int) -> heuristic.Timing:
        if num_tokens != self.num_tokens:
            raise ValueError(f"num_tokens: expected the pool's T={self.num_tokens}, got {num_tokens}")
        if batch_size < 1:
            raise ValueError(f"batch_size: expected >= 1, got {batch_size}")
        limit = self._scatter_limit()
        if batch_size > limit:
            stride = self._interm().stride(1)
            raise RuntimeError(
                f"SGLang's snapshot commit (fused_mamba_state_scatter_with_mask) forms pid_req * src_req_stride "
                f"in int32: (bs-1)*T*state_elems = {(batch_size - 1) * stride:,} > 2^31-1 would fault; "
                f"the snapshot path cannot run above bs={limit}"
            )
        anchors = self.anchors()
        if batch_size in anchors or batch_size < anchors[0]:
            return self._measure(batch_size).timing(self.num_layers)
        if batch_size > anchors[-1]:
            top = anchors[-1]
            parts = self._measure(top).scaled(batch_size / top)
            how = f"extrapolated in proportion from bs={top} (the largest batch the pool can hold)"
        else:
            lo = max(a for a in anchors if a < batch_size)
            hi = min(a for a in anchors if a > batch_size)
            parts = self._measure(lo).lerp(self._measure(hi), (batch_size - lo) / (hi - lo))
            how = f"interpolated between measured bs={lo} and bs={hi}"
        self.log.info("ReplaySSM verify probe bs=%d T=%d: %s", batch_size, num_tokens, how)
        return dataclasses.replace(parts.timing(self.num_layers), how=how)

    def _measure(self, bs: int) -> ProbeParts:
        known = self._measured.get(bs)
        if isinstance(known, Exception):
            raise known
        if known is not None:
            return known
        began = time.perf_counter()
        try:
            parts = self._run(bs)
        except Exception as exc:
            self._measured[bs] = exc
            raise
        self._measured[bs] = parts
        self.log.info(
            "ReplaySSM verify probe bs=%d T=%d (%s, %d layers, L=%d): measured replay %.1f us/layer + %.1f us "
            "commit; snapshot %.1f us/layer (materialise + SGLang verify) + %.1f us commit (all layers); %.2f s",
            bs, self.num_tokens, self.family, self.num_layers, self.window, parts.replay_layer_s * 1e6,
            parts.replay_forward_s * 1e6, parts.snapshot_layer_s * 1e6, parts.snapshot_forward_s * 1e6,
            time.perf_counter() - began,
        )
        return parts

    @property
    def kernels(self) -> ProbeKernels:
        if self._kernels is None:
            self._kernels = self._kernel_factory()
        return self._kernels

    def _run(self, bs: int) -> ProbeParts:
        rows = _Rows(self.pool, bs, self.num_tokens, self.window, self.rows, self.seed)
        case = (_Mamba2 if self.family == "mamba2" else _GDN)(self.pool, rows, self.kernels)
        try:
            return ProbeParts(
                replay_layer_s=self.timer("replay verify", case.replay_calls()),
                replay_forward_s=self.timer("replay commit", [self._replay_commit(rows)]),
                snapshot_layer_s=self.timer("snapshot verify", [case.snapshot_call()]),
                snapshot_forward_s=self.timer("snapshot commit", [self._snapshot_commit(rows)]),
            )
        finally:
            rows.restore()

    def _replay_commit(self, r: _Rows) -> Callable[[], None]:
        k, T, L, R = self.kernels, self.num_tokens, self.window, self.rows

        def call() -> None:  # spec.build_verify_eager / VerifyGraphBuffers.fill, then spec.commit_verify
            k.cursor_step(r.cursors, r.slot_idx, None, L, R, T, r.out_start, r.out_len, r.out_flush,
                          late_flush=True)
            k.commit(r.cursors, r.slot_idx, r.out_start, r.out_len, r.out_flush, r.accepted, window=L, ring_size=R,
                     num_tokens=T)

        return call

    def _snapshot_commit(self, r: _Rows) -> Callable[[], None]:
        k, L, R = self.kernels, self.window, self.rows
        temporal, interm = self.pool.mamba_cache.temporal, self._interm()

        def call() -> None:  # spec._materialise_rows snapshot; SGLang's scatter (all layers); pool.reset_slots,
            # then pool.refresh_read (split precision: the copy follows the commit; no-op without one)
            k.cursor_step(r.cursors, r.slot_idx, None, L, R, 1, r.out_start, r.out_len, r.out_flush,
                          flush_nonempty=True)  # one launch, as spec.build_verify_eager / fill
            k.snapshot_commit(temporal, interm, r.slot_idx, r.last_step)
            r.cursors.index_fill_(0, r.slot_idx.long().clamp(min=0), 0)
            self.pool.refresh_read(r.slot_idx)

        return call


def make_probe(pool, buckets: Iterable[int], device: torch.device) -> VerifyProbe:
    """The server's probe: the real CUDA kernels and the CUDA-event timer on ``device``.  Nothing runs
    (or is imported) until the first call."""
    family = pool.ring_spec.family

    def timer(unit: str, calls: Sequence[Callable[[], object]]) -> float:
        with torch.cuda.device(device):
            return cuda_median_timer(unit, calls)

    return VerifyProbe(pool, buckets, kernels=lambda: cuda_kernels(family), timer=timer)


# --------------------------------------------------------------------------------------------------
# Inputs of one probed batch
# --------------------------------------------------------------------------------------------------


class _Rows:
    """Per-row state of one probed batch: slots ``1..bs`` (shuffled), random ring starts, the cycle
    variants of ``(len, flush)``, a private cursor copy and the commit's scratch."""

    def __init__(self, pool, bs: int, T: int, L: int, R: int, seed: int) -> None:
        self.pool = pool
        temporal = pool.mamba_cache.temporal
        dev = temporal.device
        self.device = dev
        self.gen = torch.Generator(device="cpu").manual_seed(seed + bs)
        self.device_gen = torch.Generator(device=dev).manual_seed(seed + bs)
        i32 = dict(dtype=torch.int32, device=dev)
        self.bs, self.T = bs, T
        self.slot_idx = (torch.randperm(bs, generator=self.gen) + 1).to(**i32)
        self.ring_start = torch.randint(0, R, (bs,), generator=self.gen).to(**i32)
        cycle = verify_cycle(verify_flush_limit(L, T), T, T)
        self.variants = []
        for j in range(len(cycle)):
            phase = [cycle[(i + j) % len(cycle)] for i in range(bs)]
            self.variants.append((torch.tensor([h for h, _ in phase], **i32),
                                  torch.tensor([f for _, f in phase], dtype=torch.bool, device=dev)))
        self.empty_len = torch.zeros(bs, **i32)  # snapshot path: rings emptied after every commit
        self.no_flush = torch.zeros(bs, dtype=torch.bool, device=dev)  # empty rings are not folded
        self.interm_idx = torch.arange(bs, **i32)
        self.accepted = torch.full((bs,), T, **i32)
        self.last_step = torch.full((bs,), T - 1, **i32)
        self.cursors = pool.cursors.clone()
        self.out_start = torch.empty(bs, **i32)
        self.out_len = torch.empty(bs, **i32)
        self.out_flush = torch.empty(bs, dtype=torch.bool, device=dev)

    def normal(self, shape: tuple[int, ...], dtype: torch.dtype, std: float = 1.0) -> torch.Tensor:
        return std * torch.randn(shape, generator=self.device_gen, device=self.device, dtype=dtype)

    def restore(self) -> None:
        """Zero the checkpoint, ring and read-copy rows of the probed slots (their value at allocation)."""
        idx = self.slot_idx.long()
        self.pool.mamba_cache.temporal[:, idx] = 0
        for ring in self.pool.rings.values():
            ring[:, idx] = 0
        for copy in (self.pool.read_state, self.pool.read_scale):
            if copy is not None:
                copy[:, idx] = 0


def _cycle_layers(n: int) -> Callable[[], int]:
    """Next layer index on each call (0, 1, ..., n-1, 0, ...): each call finds its layer cold in L2."""
    it = itertools.cycle(range(n))
    return lambda: next(it)


class _Mamba2:
    """One Mamba-2 verify step as ``MambaMixer2.forward`` (TARGET_VERIFY) hands it to the SSU."""

    def __init__(self, pool, r: _Rows, kernels: ProbeKernels) -> None:
        self.pool, self.r, self.kernels = pool, r, kernels
        h, p, n = pool.mamba_cache.temporal.shape[2:]
        g = pool.rings["B"].shape[2]
        adt = pool.replay.act_dtype
        bs, T = r.bs, r.T
        xbc = r.normal((bs, T, h * p + 2 * g * n), adt)
        self.x = xbc[..., : h * p].unflatten(-1, (h, p))
        self.B = xbc[..., h * p: h * p + g * n].unflatten(-1, (g, n))
        self.C = xbc[..., h * p + g * n:].unflatten(-1, (g, n))
        dt = r.normal((bs, T, 2 * h), adt, 0.5)[..., h:]
        self.dt = dt[..., None].expand(-1, -1, -1, p)
        dev = r.device
        self.A = (-1.0 - 15.0 * torch.rand(h, generator=r.gen)).to(dev)[:, None, None].expand(-1, p, n)
        self.dt_bias = r.normal((h,), adt, 0.5)[:, None].expand(-1, p)
        self.D = r.normal((h,), adt)[:, None].expand(-1, p)
        self.out = torch.empty(bs, T, h, p, dtype=adt, device=dev)
        self.out1 = torch.empty(bs, 1, h, p, dtype=adt, device=dev)
        self.layer = _cycle_layers(pool.ring_spec.num_layers)

    def _ours(self, l: int, window: slice, out, ring_len, flush) -> None:
        rings, r = self.pool.rings, self.r
        self.kernels.replay_verify(
            self.pool.mamba_cache.temporal[l], rings["x"][l], rings["dt"][l], rings["B"][l], self.x[:, window],
            self.dt[:, window], self.A, self.B[:, window], self.C[:, window], out, r.slot_idx, r.ring_start,
            ring_len, flush, D=self.D, z=None, dt_bias=self.dt_bias, dt_softplus=True,
            **self.pool.layer_read_copy(l), **self.pool.layer_rounding(l),  # as the server passes them
        )

    def replay_calls(self) -> list[Callable[[], None]]:
        full = slice(None)
        return [lambda v=v: self._ours(self.layer(), full, self.out, *v) for v in self.r.variants]

    def snapshot_call(self) -> Callable[[], None]:
        r = self.r

        def call() -> None:  # mamba2.replay_selective_state_update, snapshot-path branch
            l = self.layer()
            self._ours(l, slice(0, 1), self.out1, r.empty_len, r.no_flush)
            self.kernels.snapshot_verify(
                self.pool.mamba_cache.temporal[l], self.x, self.dt, self.A, self.B, self.C, self.D, z=None,
                dt_bias=self.dt_bias, dt_softplus=True, state_batch_indices=r.slot_idx, out=self.out,
                disable_state_update=True, intermediate_states_buffer=self.pool.mamba_cache.intermediate_ssm[l],
                cache_steps=r.T, intermediate_state_indices=r.interm_idx,
            )

        return call


class _GDN:
    """One Gated DeltaNet verify step as ``gdn.ReplayGDNAttnBackend._forward_verify`` runs it."""

    def __init__(self, pool, r: _Rows, kernels: ProbeKernels) -> None:
        self.pool, self.r, self.kernels = pool, r, kernels
        hv, v, kd = pool.mamba_cache.temporal.shape[2:]
        hk = pool.rings["k"].shape[2]
        adt = pool.replay.act_dtype
        bs, T = r.bs, r.T
        mixed = r.normal((bs * T, 2 * hk * kd + hv * v), adt)
        self.q_tok = mixed[:, : hk * kd].unflatten(1, (hk, kd))
        self.k_tok = mixed[:, hk * kd: 2 * hk * kd].unflatten(1, (hk, kd))
        self.v_tok = mixed[:, 2 * hk * kd:].unflatten(1, (hv, v))
        self.a_tok = r.normal((bs * T, hv), adt)
        self.b_tok = r.normal((bs * T, hv), adt)
        win = lambda t: t.unflatten(0, (bs, T))  # noqa: E731 -- [bs, T, ...] views
        self.q, self.k, self.v, self.a, self.b = (win(t) for t in (self.q_tok, self.k_tok, self.v_tok,
                                                                     self.a_tok, self.b_tok))
        dev = r.device
        self.A_log = (torch.rand(hv, generator=r.gen) * math.log(16.0)).to(dev)
        self.dt_bias = r.normal((hv,), adt, 0.5)
        self.scale = kd**-0.5
        self.cu_seqlens = torch.arange(0, bs * T + 1, T, dtype=torch.int32, device=dev)
        self.out = torch.empty(bs, T, hv, v, dtype=adt, device=dev)
        self.out1 = torch.empty(bs, 1, hv, v, dtype=adt, device=dev)
        self.layer = _cycle_layers(pool.ring_spec.num_layers)

    def _ours(self, l: int, window: slice, out, ring_len, flush) -> None:
        rings, r = self.pool.rings, self.r
        self.kernels.replay_verify(
            self.pool.mamba_cache.temporal[l], rings["u"][l], rings["k"][l], rings["v"][l], rings["g"][l],
            rings["beta"][l], self.q[:, window], self.k[:, window], self.v[:, window], self.a[:, window],
            self.b[:, window], self.A_log, self.dt_bias, out, r.slot_idx, r.ring_start, ring_len, flush,
            scale=self.scale, use_qk_l2norm=True,
            **self.pool.layer_read_copy(l), **self.pool.layer_rounding(l),  # as the server passes them
        )

    def replay_calls(self) -> list[Callable[[], None]]:
        full = slice(None)
        return [lambda v=v: self._ours(self.layer(), full, self.out, *v) for v in self.r.variants]

    def snapshot_call(self) -> Callable[[], None]:
        r = self.r

        def call() -> None:  # gdn._forward_verify, snapshot branch, then TritonGDNKernel.target_verify
            l = self.layer()
            self._ours(l, slice(0, 1), self.out1, r.empty_len, r.no_flush)
            self.kernels.snapshot_verify(
                A_log=self.A_log, dt_bias=self.dt_bias, q=self.q_tok[None], k=self.k_tok[None], v=self.v_tok[None],
                a=self.a_tok, b=self.b_tok, initial_state_source=self.pool.mamba_cache.temporal[l],
                initial_state_indices=r.slot_idx, cu_seqlens=self.cu_seqlens, use_qk_l2norm_in_kernel=True,
                softplus_beta=1.0, softplus_threshold=20.0, is_kda=False, disable_state_update=True,
                intermediate_states_buffer=self.pool.mamba_cache.intermediate_ssm[l],
                intermediate_state_indices=r.interm_idx, cache_steps=r.T, retrieve_parent_token=None,
            )

        return call
