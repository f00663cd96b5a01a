"""The timed verify probe of ``--replayssm-verify auto`` (``verify_probe``) and its wiring in ``spec_plan``.

On CPU the probe runs on a real ``ReplayMambaPool`` (SGLang's speculative buffers moved to the CPU) with
an injected timer: our side through the kernels' torch references (so the probe's arguments meet the
real signatures), SGLang's kernels as recording fakes.  Checked: the cycle of ring fills matches the byte
model, per-layer units scale by the layers and the commits count once, the pool is left as allocated,
interpolation and extrapolation between measured buckets, the SGLang scatter limit, the CUDA-event timer
(fake events), which settings get a probe, and the logged byte-model fallback of a failing probe.  The
``gpu`` test runs the real probe on small shapes.
"""

from __future__ import annotations

import dataclasses

import logging
import math
from types import SimpleNamespace

import pytest
import torch

import replayssm_kernels as rk
from sglang_replayssm import heuristic as h
from sglang_replayssm import spec_plan, verify_probe
from sglang_replayssm.byte_model import verify_cycle
from sglang_replayssm.sizing import verify_flush_limit
from sglang_replayssm.verify_probe import ProbeKernels, ProbeParts, VerifyProbe, anchor_buckets
from tests.integration.test_spec_verify import _cpu_spec_pool

GPU = h.DeviceProfile(name="cuda:Synthetic", kind="cuda", peak_bytes_per_s=4.0e12, launch_s=5e-6,
                      peak_source="synthetic")
WINDOW, T = 8, 2  # the late rule: cycle of 5 steps, len 2, 4, 6, 8 (non-flush), 10 (flush)
UNIT_S = {"replay verify": 3e-6, "replay commit": 50e-6, "snapshot verify": 7e-6, "snapshot commit": 900e-6}


class _Timer:
    """Runs every call once (so the kernels see the probe's arguments) and returns a set time per unit,
    or ``per_bs(unit, bs)`` with ``bs`` the batch the last kernel call saw."""

    def __init__(self, seen: list[int], per_bs=None) -> None:
        self.seen, self.per_bs, self.units = seen, per_bs, []

    def __call__(self, unit: str, calls) -> float:
        for call in calls:
            call()
        self.units.append((unit, len(calls)))
        return UNIT_S[unit] if self.per_bs is None else self.per_bs(unit, self.seen[-1])


def _recording_kernels(family: str, seen: list[int], log: list) -> ProbeKernels:
    """Our kernels' references (recording the batch), SGLang's kernels as recording fakes."""
    ours = rk.mamba2_replay_verify_ref if family == "mamba2" else rk.gdn_replay_verify_ref

    def replay_verify(*args, **kwargs):
        seen.append(args[-4].shape[0])  # slot_idx, 4th from the end in both families
        log.append(("replay_verify", args, kwargs))
        return ours(*args, **kwargs)

    return ProbeKernels(
        replay_verify=replay_verify, cursor_step=rk.verify_cursor_step, commit=rk.verify_commit_ref,
        snapshot_verify=lambda *a, **k: log.append(("snapshot_verify", a, k)),
        snapshot_commit=lambda *a, **k: log.append(("snapshot_commit", a, k)),
    )


def test_anchor_buckets() -> None:
    sglang_buckets = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256]
    assert anchor_buckets(sglang_buckets, cap=1000) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert anchor_buckets([3, 12, 24, 48, 160], cap=1000) == [3, 160]
    assert anchor_buckets(sglang_buckets, cap=100) == [1, 2, 4, 8, 16, 32, 64, 100]
    assert anchor_buckets([2**i for i in range(12)], cap=10**6, max_anchors=4) == [1, 16, 128, 2048]
    with pytest.raises(ValueError, match="expected buckets >= 1"):
        anchor_buckets([], cap=4)


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_probe_scales_by_layers_and_counts_the_commits_once(family: str, monkeypatch) -> None:
    pool = _cpu_spec_pool(family, WINDOW, T, monkeypatch, verify="auto")
    layers = pool.ring_spec.num_layers
    assert layers == 3 and pool.mamba_cache.intermediate_ssm is not None
    cursors, temporal = pool.cursors.clone(), pool.mamba_cache.temporal
    temporal[:, 0] = 5.0  # the null slot: never touched
    seen, log = [], []
    timer = _Timer(seen)
    probe = VerifyProbe(pool, [1, 2, 4], kernels=lambda: _recording_kernels(family, seen, log), timer=timer)
    timing = probe(4, T)

    assert timing.replay_s == pytest.approx(layers * UNIT_S["replay verify"] + UNIT_S["replay commit"])
    assert timing.snapshot_s == pytest.approx(layers * UNIT_S["snapshot verify"] + UNIT_S["snapshot commit"])
    # the replay verify is timed over the phases of the served (late) rule's cycle (flush when
    # len + T > max(L, T) + T = 10: 5 phases), each unit once
    cycle = verify_cycle(verify_flush_limit(WINDOW, T), T, T)
    assert len(cycle) == 5
    assert timer.units == [("replay verify", len(cycle)), ("replay commit", 1), ("snapshot verify", 1),
                           ("snapshot commit", 1)]
    replays = [(a, k) for name, a, k in log if name == "replay_verify"]
    ring_len, flush = replays[0][0][-2], replays[0][0][-1]
    # the byte model's steady cycle at a = T (heuristic.replay_verify_bytes)
    lens = [n for n, _ in cycle]
    assert lens == [2, 4, 6, 8, 10]
    assert sorted(ring_len.tolist()) == lens[:4]  # 4 rows: the first variant's phases
    assert flush.tolist() == [n == lens[-1] for n in ring_len.tolist()]
    # the materialise call of the snapshot path: empty rings (steady state) do not flush, one-token window
    mat_len, mat_flush = replays[-1][0][-2], replays[-1][0][-1]
    assert mat_len.tolist() == [0] * 4 and not mat_flush.any()
    # successive per-layer calls walk the layers (state views of layers 0, 1, 2, 0)
    states = [a[0] for a, _ in replays[:4]]
    assert [s.data_ptr() for s in states] == [temporal[i % 3].data_ptr() for i in range(4)]
    ((_, sv_args, sv_kw),) = [e for e in log if e[0] == "snapshot_verify"]
    assert sv_kw["disable_state_update"] is True and sv_kw["cache_steps"] == T
    interm = pool.mamba_cache.intermediate_ssm
    assert sv_kw["intermediate_states_buffer"].data_ptr() in {interm[i].data_ptr() for i in range(layers)}
    ((_, sc_args, _),) = [e for e in log if e[0] == "snapshot_commit"]
    assert sc_args[0] is temporal and sc_args[1] is pool.mamba_cache.intermediate_ssm  # all layers, once
    assert sc_args[3].tolist() == [T - 1] * 4  # the last draft: all accepted
    assert sorted(sc_args[2].tolist()) == [1, 2, 3, 4]  # free slots only, never the null slot
    # the pool is left as allocated: cursors never written, touched slots zeroed, null slot untouched
    assert torch.equal(pool.cursors, cursors)
    assert temporal[:, 1:].abs().sum() == 0 and (temporal[:, 0] == 5.0).all()
    assert all(ring[:, 1:].abs().sum() == 0 for ring in pool.rings.values())
    # a measured bucket is not measured again
    probe(4, T)
    assert len(timer.units) == 4
    with pytest.raises(ValueError, match="num_tokens: expected the pool's T=2, got 3"):
        probe(4, 3)


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_probe_passes_the_read_copy_and_rounding_and_refreshes_the_copy(family: str, monkeypatch) -> None:
    """Split precision / stochastic rounding change both paths' cost: the probe's verify gets the
    keywords the server's does, its snapshot commit refreshes the copy as the server's does, and the
    probed slots' copies are zeroed afterwards like their checkpoints."""
    pool = _cpu_spec_pool(family, WINDOW, T, monkeypatch, verify="auto", read="bf16")
    assert pool.read_state is not None
    pool.sr_seed = torch.zeros(1, dtype=torch.int64)  # stochastic rounding's counter (on the pool)
    pool.read_state[:, 0] = 3.0  # the null slot's copy: never touched
    refreshed = []
    refresh = pool.refresh_read
    monkeypatch.setattr(pool, "refresh_read", lambda idx, layer_idx=None: (refreshed.append(idx.tolist()),
                                                                           refresh(idx, layer_idx)))
    seen, log = [], []
    kernels = _recording_kernels(family, seen, log)
    kernels = dataclasses.replace(kernels, replay_verify=lambda *a, **k: (seen.append(a[-4].shape[0]),
                                                                          log.append(("replay_verify", a, k))))
    VerifyProbe(pool, [1, 2, 4], kernels=lambda: kernels, timer=_Timer(seen))(4, T)
    calls = [(a, k) for name, a, k in log if name == "replay_verify"]
    for args, kw in calls:
        layer = next(i for i in range(pool.ring_spec.num_layers) if args[0].data_ptr()
                     == pool.mamba_cache.temporal[i].data_ptr())
        assert kw["read_state"].data_ptr() == pool.read_state[layer].data_ptr()
        assert kw["sr_seed"] is pool.sr_seed and kw["sr_layer"] == layer
    assert [sorted(i) for i in refreshed] == [[1, 2, 3, 4]]
    assert pool.read_state[:, 1:].float().abs().sum() == 0 and (pool.read_state[:, 0] == 3.0).all()


def test_interpolation_and_extrapolation_between_measured_buckets(monkeypatch, caplog) -> None:
    caplog.set_level(logging.INFO, logger="sglang_replayssm.verify_probe")
    pool = _cpu_spec_pool("mamba2", WINDOW, T, monkeypatch, verify="auto")  # 6 free slots
    seen, log = [], []
    timer = _Timer(seen, per_bs=lambda unit, bs: UNIT_S[unit] * bs**2)
    probe = VerifyProbe(pool, [1, 3, 4, 8], kernels=lambda: _recording_kernels("mamba2", seen, log), timer=timer)
    assert probe.cap() == 6 and probe.anchors() == [1, 4, 6]

    def parts(bs: float) -> ProbeParts:
        return ProbeParts(*(UNIT_S[u] * bs**2 for u in UNIT_S))

    between = probe(3, T)
    assert between == dataclasses.replace(parts(1).lerp(parts(4), 2 / 3).timing(3),
                                          how="interpolated between measured bs=1 and bs=4")
    assert sorted(set(seen)) == [1, 4]  # bs 3 itself is not run
    beyond = probe(8, T)  # beyond the pool: in proportion
    assert (beyond.snapshot_s, beyond.replay_s) == pytest.approx(
        dataclasses.astuple(parts(6).scaled(8 / 6).timing(3))[:2])
    assert beyond.how.startswith("extrapolated in proportion from bs=6")
    assert sorted(set(seen)) == [1, 4, 6]
    assert probe(4, T) == parts(4).timing(3)  # measured here: no note
    # the decision line names how the times were obtained
    d = h.decide(3, T, h.verify_shape(family="mamba2", temporal_shape=(8, 16, 16), conv_dim=8 * 16 + 2 * 2 * 16,
                                      num_k_heads=1, num_layers=3, window=WINDOW, state_dtype=torch.float32,
                                      act_dtype=torch.float32),
                 h.DeviceProfile(name="cuda:x", kind="cuda", peak_bytes_per_s=4e12, launch_s=5e-6,
                                 peak_source="synthetic"), timing=between)
    assert d.source == "measured (interpolated between measured bs=1 and bs=4)"
    messages = [r.getMessage() for r in caplog.records]
    assert "ReplaySSM verify probe bs=3 T=2: interpolated between measured bs=1 and bs=4" in messages
    assert any(m.startswith("ReplaySSM verify probe bs=8 T=2: extrapolated in proportion from bs=6") for m in messages)
    assert sum("measured replay" in m for m in messages) == 3  # one line per measured anchor
    assert ProbeParts(1, 2, 3, 4).timing(10) == h.Timing(snapshot_s=34, replay_s=12)


def test_a_failed_anchor_is_not_run_again(monkeypatch) -> None:
    pool = _cpu_spec_pool("gdn", WINDOW, T, monkeypatch, verify="auto")
    runs = []

    def timer(unit, calls):
        runs.append(unit)
        raise RuntimeError("CUDA out of memory")

    probe = VerifyProbe(pool, [1, 4], kernels=lambda: _recording_kernels("gdn", [], []), timer=timer)
    for bs in (4, 4, 3):  # 3 interpolates from 1 and 4: the remembered failure of 4 raises again
        with pytest.raises(RuntimeError, match="CUDA out of memory"):
            probe(bs, T)
    assert runs == ["replay verify", "replay verify"]  # bs 4 once, bs 1 once


def test_sglang_scatter_limit_refuses_the_bucket_and_falls_back(caplog) -> None:
    # Nano-4B shape, T = 8: (bs-1)·T·H·P·N passes 2^31-1 from bs 275 (meta tensors: no memory)
    state = (96, 80, 128)
    pool = SimpleNamespace(
        ring_spec=SimpleNamespace(family="mamba2", num_layers=21, rows=24), replay=SimpleNamespace(window=16),
        spec_tokens=8,
        mamba_cache=SimpleNamespace(temporal=torch.empty((21, 1025, *state), device="meta"),
                                    intermediate_ssm=torch.empty((21, 1025, 8, *state), device="meta")),
    )
    probe = VerifyProbe(pool, [256, 512], kernels=lambda: pytest.fail("no kernel may run"), timer=None)
    assert probe.cap() == 274
    shape = h.verify_shape(family="mamba2", temporal_shape=state, conv_dim=96 * 80 + 2 * 8 * 128, num_k_heads=1,
                           num_layers=21, window=16, state_dtype=torch.float32, act_dtype=torch.bfloat16)
    with caplog.at_level(logging.INFO, logger="sglang_replayssm.heuristic"):
        (d,) = h.decide_buckets([512], 8, shape, GPU, probe=probe).values()
    assert d.source.startswith("byte-model (probe failed: RuntimeError: SGLang's snapshot commit")
    assert "the snapshot path cannot run above bs=274" in caplog.text


def test_cuda_median_timer_takes_medians_with_one_sync_and_a_lead(monkeypatch) -> None:
    clock, syncs, sleeps = [0.0], [], []

    class Event:  # a fake CUDA event on a fake GPU clock (ms)
        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing

        def record(self) -> None:
            self.t = clock[0]

        def elapsed_time(self, end: Event) -> float:
            return end.t - self.t

        def synchronize(self) -> None:
            syncs.append(1)

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: sleeps.append(cycles))
    runs = {"a": 0, "b": 0}

    def call(name: str, ms: float, outlier_at: int | None = None):
        def run() -> None:
            runs[name] += 1
            clock[0] += 40.0 if runs[name] == outlier_at else ms

        return run

    seconds = verify_probe.cuda_median_timer("u", [call("a", 2.0), call("b", 4.0, outlier_at=5)])
    assert seconds == pytest.approx(3e-3)  # mean of the medians 2 ms and 4 ms; the outlier ignored
    assert runs == {"a": 3 + 8, "b": 3 + 8}  # 3 warm-up rounds, ceil(15 / 2) timed calls each
    assert len(syncs) == 1 and len(sleeps) == 1 and 0 < sleeps[0] <= verify_probe.SLEEP_CYCLES_PER_S * 0.1


# ----------------------------------------------------------------------------- wiring (spec_plan)


def _args(topk: int = 1) -> SimpleNamespace:
    return SimpleNamespace(speculative_algorithm="EAGLE", speculative_eagle_topk=topk, device="cuda",
                           disable_cuda_graph=False, max_running_requests=6,
                           cuda_graph_config=SimpleNamespace(decode=SimpleNamespace(bs=[1, 2, 4])),
                           enable_mamba_extra_buffer=lambda: False)


def _wire(monkeypatch, tmp_path, probe_fn) -> list:
    """Record the probe ``plan_for_server`` hands to the heuristic; fake the device profile and the
    probe factory (``probe_fn``)."""
    handed = []
    decide = h.decide_buckets

    def recording(*args, probe=None, **kwargs):
        handed.append(probe)
        return decide(*args, probe=probe, **kwargs)

    monkeypatch.setattr(h, "decide_buckets", recording)
    monkeypatch.setattr(spec_plan, "_profile", lambda device: GPU if device.type == "cuda" else h.cpu_device_profile())
    monkeypatch.setattr(verify_probe, "make_probe", lambda pool, buckets, device: probe_fn)
    monkeypatch.setenv(h.CACHE_ENV_VAR, str(tmp_path / "cache.json"))
    return handed


@pytest.mark.parametrize(
    ("mode", "topk", "device", "probed"),
    [("auto", 1, "cuda", True), ("auto", 1, "cpu", False), ("snapshot", 1, "cuda", False),
     ("replay", 1, "cuda", False), ("auto", 2, "cuda", False)],
)
def test_plan_for_server_passes_a_probe_only_for_cuda_auto_linear_drafts(mode, topk, device, probed, monkeypatch,
                                                                          tmp_path) -> None:
    pool = _cpu_spec_pool("mamba2", WINDOW, T, monkeypatch, verify=mode)
    calls = []

    def probe(bs: int, t: int) -> h.Timing:
        calls.append((bs, t))
        return h.Timing(snapshot_s=1.0, replay_s=0.5)

    handed = _wire(monkeypatch, tmp_path, probe)
    monkeypatch.setenv("SGLANG_REPLAYSSM_CONFIG", f'{{"backend": "replay", "verify": "{mode}"}}')
    plan = spec_plan.plan_for_server(pool, _args(topk), torch.device(device))
    assert sorted(plan) == [1, 2, 4, 6]  # the graphs' buckets and the largest eager batch
    if device == "cpu":  # the byte model sends these tiny buckets to the snapshot path: CUDA-only, so replay
        assert all(d.path == "replay" and "needs CUDA" in d.reason for d in plan.values())
    if probed:
        assert {d.source.split(" (")[0] for d in plan.values()} == {"measured"}
    assert handed == [probe if probed else None]
    assert calls == ([(1, T), (2, T), (4, T), (6, T)] if probed else [])


def test_a_failing_probe_falls_back_to_the_byte_model_logged(monkeypatch, tmp_path, caplog) -> None:
    pool = _cpu_spec_pool("gdn", WINDOW, T, monkeypatch, verify="auto")

    def broken(bs: int, t: int) -> h.Timing:
        raise RuntimeError("CUDA error: no kernel image")

    _wire(monkeypatch, tmp_path, broken)
    monkeypatch.setenv("SGLANG_REPLAYSSM_CONFIG", '{"backend": "replay", "verify": "auto"}')
    with caplog.at_level(logging.INFO, logger="sglang_replayssm.spec_plan"):
        plan = spec_plan.plan_for_server(pool, _args(), torch.device("cuda"))
    note = "byte-model (probe failed: RuntimeError: CUDA error: no kernel image)"
    assert {d.source for d in plan.values()} == {note}
    assert sum(f"source={note}" in r.getMessage() for r in caplog.records) == 4  # buckets 1, 2, 4 and 6
    assert not (tmp_path / "cache.json").exists()  # a failed probe is not cached: the next start probes again


def test_make_probe_builds_without_running_anything(monkeypatch) -> None:
    pool = _cpu_spec_pool("mamba2", WINDOW, T, monkeypatch, verify="auto")
    probe = verify_probe.make_probe(pool, [1, 2], torch.device("cuda"))
    assert isinstance(probe, VerifyProbe) and probe._kernels is None and probe.num_tokens == T


# ----------------------------------------------------------------------------- GPU


def _cuda_pool(family: str, monkeypatch):
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape

    from sglang_replayssm.pool import ReplayMambaPool, ReplayPoolSpec

    if family == "mamba2":  # H=8, P=64, N=128, G=2
        shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=512, n_groups=2, num_heads=8,
                                        head_dim=64, state_size=128, conv_kernel=4)
    else:  # GDN: HV=4, V=128, Hk=2, K=128
        shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=512, n_groups=2, num_heads=4,
                                        head_dim=128, state_size=128, conv_kernel=4)
    params = Mamba2CacheParams(shape=shape, layers=[0, 1, 2],
                               dtype=Mamba2StateDType(conv=torch.bfloat16, temporal=torch.float32))
    monkeypatch.setenv("SGLANG_REPLAYSSM_CONFIG", '{"backend": "replay", "verify": "auto"}')
    return ReplayMambaPool(
        replay=ReplayPoolSpec(family=family, window=16, act_dtype=torch.bfloat16), size=32, spec_state_size=32,
        cache_params=params, mamba_layer_ids=[0, 1, 2], device="cuda", speculative_num_draft_tokens=4,
        speculative_eagle_topk=1,
    )


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_real_probe_times_both_paths_on_cuda(family: str, monkeypatch, caplog) -> None:
    caplog.set_level(logging.INFO, logger="sglang_replayssm.verify_probe")
    pool = _cuda_pool(family, monkeypatch)
    cursors = pool.cursors.clone()
    probe = verify_probe.make_probe(pool, [1, 4, 8, 16], torch.device("cuda"))
    for bs in (1, 4, 8, 12, 16):
        t = probe(bs, 4)
        assert t.usable() and all(0 < s < 1 and math.isfinite(s) for s in (t.snapshot_s, t.replay_s)), (bs, t)
    torch.cuda.synchronize()
    assert torch.equal(pool.cursors, cursors)
    assert pool.mamba_cache.temporal[:, 1:17].abs().sum().item() == 0
    print("\n".join(r.getMessage() for r in caplog.records))
