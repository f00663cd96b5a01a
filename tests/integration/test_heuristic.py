"""The verify-path heuristic (``sglang_replayssm.heuristic``) with synthetic timings: the rule, the
fallbacks (latency-bound snapshot, replay not faster, no CUDA, failing or unusable probe), the
override, tree drafts, one log line per bucket, and the decision cache."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest
import torch

from sglang_replayssm import heuristic as h
from sglang_replayssm.byte_model import GDNDims, Mamba2Dims
from sglang_replayssm.errors import ReplaySSMStartupError
from sglang_replayssm.sizing import ring_spec, verify_flush_limit

# A Mamba-2 layer of realistic size (H=64, P=64, N=128, G=8), 21 layers, L=16.
SHAPE = h.verify_shape(
    family="mamba2", temporal_shape=(64, 64, 128), conv_dim=64 * 64 + 2 * 8 * 128, num_k_heads=1,
    num_layers=21, window=16, state_dtype=torch.float32, act_dtype=torch.bfloat16,
)
PEAK = 4.0e12
GPU = h.DeviceProfile(name="cuda:Synthetic", kind="cuda", peak_bytes_per_s=PEAK, launch_s=5e-6,
                      peak_source="synthetic")
T = 4


def _bytes(bs: int) -> tuple[float, float]:
    scale = bs * SHAPE.num_layers
    return h.snapshot_path_bytes(SHAPE, T) * scale, h.replay_verify_bytes(SHAPE, T) * scale


def _timing(bs: int, snap_util: float, speedup: float) -> h.Timing:
    """Times for which the snapshot path reaches ``snap_util`` of peak and replay is ``speedup`` x faster."""
    b_snap, _ = _bytes(bs)
    t_snap = b_snap / (snap_util * PEAK)
    return h.Timing(snapshot_s=t_snap, replay_s=t_snap / speedup)


def _real_shape(family: str) -> h.VerifyShape:
    """One layer of Nemotron-3-Nano-4B (Mamba-2) or Qwen3.5-4B (GDN), L = 16, fp32 state, bf16."""
    if family == "mamba2":
        kw = dict(temporal_shape=(96, 80, 128), conv_dim=96 * 80 + 2 * 8 * 128, num_k_heads=1)
    else:
        kw = dict(temporal_shape=(32, 128, 128), conv_dim=0, num_k_heads=16)
    return h.verify_shape(family=family, num_layers=1, window=16, state_dtype=torch.float32,
                          act_dtype=torch.bfloat16, **kw)


def test_byte_model_is_the_kernels_model_mamba2() -> None:
    """``sglang_replayssm.byte_model`` at Nano-4B: math.md's S, r, I; the replay verify reads the
    ``h`` committed records (x, dt, B: the whole record), writes ``T`` and ``S`` on the flush step."""
    shape = _real_shape("mamba2")
    S, r, I = 3_932_160, 17_792, 35_008  # noqa: E741 (math.md's symbols)
    # math.md §11: SGLang snapshot spec (3+T)S + T·I
    assert h.snapshot_verify_bytes(shape, 4) == 27_665_152
    # the plug-in's snapshot path adds the materialise call: S read, its one-token record written, I
    assert h.snapshot_path_bytes(shape, 4) == 27_665_152 + S + r + I
    # the late rule (flush when len + T > max(L, T) + T = 20), a = T = 4, L = 16: lens 4, 8, 12, 16,
    # then 20 flushing (F = 5, mean history a·(F+1)/2 = 12)
    assert h.replay_verify_bytes(shape, 4) == S + S / 5 + 12 * r + 4 * r + 4 * I == 5_143_296
    # a = 3: lens 3, 6, ..., 15, then 18 flushing (F = 6, mean history 10.5)
    assert h.replay_verify_bytes(shape, 4, 3) == pytest.approx(S + S / 6 + 10.5 * r + 4 * r + 4 * I)
    # the default a = T is the upper bound over a
    assert all(h.replay_verify_bytes(shape, 4) >= h.replay_verify_bytes(shape, 4, a) for a in (1, 2, 3, 4))
    # T > L (L = 2): limit max(L, T) + T = 8, lens 4, then 8 flushing (F = 2, mean history 6)
    short = dataclasses.replace(shape, window=2)
    assert h.replay_verify_bytes(short, 4) == S + S / 2 + 6 * r + 4 * r + 4 * I
    with pytest.raises(ValueError, match="expected 1 <= a <= T = 4, got a = 5"):
        h.replay_verify_bytes(shape, 4, 5)


def test_byte_model_is_the_kernels_model_gdn() -> None:
    """At Qwen3.5-4B with the server's fp32 ``u``: non-flush rows read (u, k, g) per record, the flush
    row (k, v, g, beta) and ``S`` twice (fold launch, window launch); every row writes ``T`` full
    records, the record ``sizing.ring_spec`` allocates."""
    shape = _real_shape("gdn")
    assert (shape.dims, shape.state_bytes, shape.act_bytes, shape.u_bytes) == (
        GDNDims(HV=32, Hk=16, K=128, V=128), 4, 2, 4)
    spec = ring_spec(family="gdn", temporal_shape=(32, 128, 128), conv_dim=0, num_k_heads=16, num_layers=1,
                     window=16, act_dtype=torch.bfloat16)
    record = 32 * 128 * (4 + 2) + 16 * 128 * 2 + 32 * 4 * 2  # u fp32, v, k bf16, g, beta fp32
    assert shape.replay(4).ring_write == spec.bytes_per_slot_layer // spec.rows == record == 28_928
    S, I = 32 * 128 * 128 * 4, 24_704  # noqa: E741
    read_nf, read_fl = 32 * 128 * 4 + 16 * 128 * 2 + 32 * 4, 16 * 128 * 2 + 32 * 128 * 2 + 32 * 8
    assert (read_nf, read_fl) == (20_608, 12_544)
    assert h.snapshot_verify_bytes(shape, 4) == 7 * S + 4 * I == 14_778_880  # math.md §11
    assert h.snapshot_path_bytes(shape, 4) == 14_778_880 + S + record + I
    # the late rule (flush when len + T > R = 20): lens 4, 8, 12, 16 (non-flush), 20 (flush: S read
    # twice, written once)
    want = (4 * S + 3 * S + (4 + 8 + 12 + 16) * read_nf + 20 * read_fl) / 5 + 4 * record + 4 * I
    assert h.replay_verify_bytes(shape, 4) == pytest.approx(want) == 3_365_580.8


def test_shape_checks_its_family_and_keys_its_dims() -> None:
    with pytest.raises(ValueError, match="dims: expected Mamba2Dims for family 'mamba2', got GDNDims"):
        h.VerifyShape(family="mamba2", dims=GDNDims(HV=2, Hk=1, K=4, V=4), state_bytes=4, act_bytes=2,
                      num_layers=1, window=4)
    with pytest.raises(ValueError, match="u_bytes"):
        h.VerifyShape(family="gdn", dims=GDNDims(HV=2, Hk=1, K=4, V=4), state_bytes=4, act_bytes=2,
                      num_layers=1, window=4)
    assert _real_shape("gdn").key() == "gdn:HV32.Hk16.K128.V128:s4:a2:u4:layers1:L16"
    assert SHAPE.key() == "mamba2:H64.P64.N128.G8:s4:a2:layers21:L16"
    with pytest.raises(ValueError, match="read_scale_bytes: expected >= 0, and 0 without a read copy"):
        dataclasses.replace(SHAPE, read_scale_bytes=4)
    with pytest.raises(ValueError, match="read_bytes: expected the read copy's element size >= 1 or None, got 0"):
        dataclasses.replace(SHAPE, read_bytes=0)


#: the copy's element size and per-row scale bytes (fp8: e4m3 and one fp32 scale per state row)
READ_COPY = {"bf16": (2, 0), "fp8": (1, 4)}
#: replay bytes per layer and request, T = 4, L = 16, a = T, fp32 state, bf16 activations (GDN: u fp32):
#: 3,534,080 (Qwen3.5-4B) and 5,304,320 (Nano-4B) without a copy
REPLAY_WITH_COPY = {("gdn", "bf16"): 2_526_720, ("gdn", "fp8"): 1_917_235.2,
                    ("mamba2", "bf16"): 3_963_648, ("mamba2", "fp8"): 3_011_328}


@pytest.mark.parametrize("rd", sorted(READ_COPY))
@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_byte_model_counts_the_read_copy_as_the_audited_model(family: str, rd: str) -> None:
    """With a read copy (``S_r``) the replay bytes are the audited read-copy model's
    (``benchmarks/bytes_read_copy.py``), below the no-copy bytes; the snapshot path's materialise call
    reads the copy and the commit's refresh reads ``S`` and writes ``S_r``; SGLang's verify and commit
    are unchanged."""
    from benchmarks import bytes_model as bm
    from benchmarks.bytes_read_copy import read_copy_bytes, verify_read_copy_bytes
    from benchmarks.shapes import NANO_4B, QWEN35_4B
    from sglang_replayssm.byte_model import verify_cycle

    plain = _real_shape(family)
    read_bytes, scale_bytes = READ_COPY[rd]
    shape = dataclasses.replace(plain, read_bytes=read_bytes, read_scale_bytes=scale_bytes)
    preset = NANO_4B if family == "mamba2" else QWEN35_4B
    S, S_r = plain.replay(4).S, read_copy_bytes(preset, rd)
    assert shape.read_copy_bytes == S_r and plain.read_copy_bytes == 0
    audited = verify_read_copy_bytes(
        bm.mamba2_replay_verify_bytes(preset, 4, 4, 2) if family == "mamba2"
        else bm.gdn_replay_verify_bytes(preset, 4, 4, 2, 4), S_r, rd)
    for a in (1, 2, 3, 4):
        cycle = verify_cycle(verify_flush_limit(16, 4), 4, a)  # the late rule: len + T > 20
        assert h.replay_verify_bytes(shape, 4, a) == audited.cycle_mean(cycle)
        assert h.replay_verify_bytes(shape, 4, a) < h.replay_verify_bytes(plain, 4, a)
    # by hand at a = T = 4 (the late rule: lens 4 .. 16, then 20 flushing): the F - 1 = 4 non-flush
    # steps read S_r instead of S; the flush step reads S (GDN: and S_r, its window launch) and
    # writes S + S_r
    flush_reads, F = (2 if family == "gdn" else 1), 5
    want = (h.replay_verify_bytes(plain, 4) - ((F - 1) * S + flush_reads * S + S) / F
            + ((F - 1) * S_r + S + (flush_reads - 1) * S_r + S + S_r) / F)
    assert h.replay_verify_bytes(shape, 4) == pytest.approx(want) == REPLAY_WITH_COPY[family, rd]
    # snapshot path: SGLang's part reads the checkpoint; our materialise call (an empty ring: a
    # non-flush row) reads S_r instead of S; the commit is followed by the copy's refresh, S + S_r
    assert h.snapshot_verify_bytes(shape, 4) == h.snapshot_verify_bytes(plain, 4)
    assert h.snapshot_path_bytes(shape, 4) == h.snapshot_path_bytes(plain, 4) - S + S_r + S + S_r


@pytest.mark.parametrize("rd", sorted(READ_COPY))
@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_a_read_copy_only_moves_byte_model_decisions_towards_replay(family: str, rd: str) -> None:
    """Fewer replay bytes and more snapshot-path bytes: a bucket that the byte model sends to replay
    without a copy goes to replay with one (and the copy turns none to snapshot)."""
    plain = dataclasses.replace(_real_shape(family), num_layers=24)
    read_bytes, scale_bytes = READ_COPY[rd]
    shape = dataclasses.replace(plain, read_bytes=read_bytes, read_scale_bytes=scale_bytes,
                                variant=f"read-{rd}")
    for bs in (1, 2, 4, 8, 16, 64, 256):
        without, with_copy = h.decide(bs, 4, plain, GPU), h.decide(bs, 4, shape, GPU)
        assert with_copy.replay_bytes < without.replay_bytes and with_copy.snapshot_bytes > without.snapshot_bytes
        if without.path == "replay":
            assert with_copy.path == "replay"
    assert h.decide(256, 4, shape, GPU).path == "replay"


@pytest.mark.parametrize(("read_dtype", "read_bytes", "scale_bytes"),
                         [(torch.bfloat16, 2, 0), (torch.float16, 2, 0), (torch.float8_e4m3fn, 1, 4)])
@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_pool_verify_shape_reads_the_pools_read_copy(family: str, read_dtype: torch.dtype, read_bytes: int,
                                                     scale_bytes: int) -> None:
    """``spec_plan.pool_verify_shape`` takes the copy's element and scale sizes from the pool's own
    ``read_state`` / ``read_scale``: its ``S_r`` over the layers is what the pool allocates per slot."""
    from sglang_replayssm.pool import read_copy_bytes_per_slot
    from sglang_replayssm.spec_plan import pool_verify_shape
    from tests.integration.test_read_copy_pool import _pool

    pool = _pool(read_dtype, family)
    shape = pool_verify_shape(pool)
    assert (shape.read_bytes, shape.read_scale_bytes) == (read_bytes, scale_bytes)
    names = (f"state-{str(pool.mamba_cache.temporal.dtype).removeprefix('torch.')}+"
             f"act-{str(pool.replay.act_dtype).removeprefix('torch.')}")
    assert shape.variant == f"{names}+read-{str(read_dtype).removeprefix('torch.')}"
    temporal = pool.mamba_cache.temporal
    assert shape.num_layers * shape.read_copy_bytes == read_copy_bytes_per_slot(
        tuple(temporal.shape[2:]), shape.num_layers, read_dtype)
    plain = pool_verify_shape(_pool(None, family))
    assert (plain.read_bytes, plain.read_scale_bytes, plain.variant) == (None, 0, names)
    assert dataclasses.replace(shape, read_bytes=None, read_scale_bytes=0, variant=names) == plain


@pytest.mark.parametrize(
    ("snap_util", "speedup", "path", "reason"),
    [
        (0.9, 3.0, "replay", "snapshot path bandwidth-bound (util 0.90 >= 0.5) and replay 3.00x faster"),
        (0.5, 1.05, "replay", "bandwidth-bound (util 0.50 >= 0.5) and replay 1.05x faster"),
        (0.3, 3.0, "snapshot", "snapshot path not bandwidth-bound (util 0.30 < 0.5)"),  # fallback
        (0.9, 1.02, "snapshot", "replay not faster enough (1.02x < 1.05x)"),  # fallback
        (0.9, 0.7, "snapshot", "replay not faster enough (0.70x < 1.05x)"),  # replay slower
    ],
)
def test_rule_on_measured_timings(snap_util: float, speedup: float, path: str, reason: str) -> None:
    d = h.decide(64, T, SHAPE, GPU, timing=_timing(64, snap_util, speedup))
    assert (d.path, d.source) == (path, "measured")
    assert reason in d.reason
    assert d.snapshot_util == pytest.approx(snap_util)
    b_snap, b_replay = _bytes(64)
    assert (d.snapshot_bytes, d.replay_bytes) == (b_snap, b_replay)
    assert d.replay_util == pytest.approx(b_replay / d.replay_s / PEAK)


@pytest.mark.parametrize("mode", ["replay", "snapshot"])
def test_override_wins_over_the_timings(mode: str) -> None:
    # replay would be chosen in auto (and snapshot in the second case): the override decides either way
    for timing in (_timing(64, 0.9, 3.0), _timing(64, 0.1, 0.5)):
        d = h.decide(64, T, SHAPE, GPU, mode=mode, timing=timing)
        assert (d.path, d.source, d.reason) == (mode, "override", f"override --replayssm-verify {mode}")
        assert d.times == "measured" and "source=override, times: measured;" in d.log_line()
    # without timings (what spec_plan gives an override: no probe) the log says the times are estimates
    d = h.decide(64, T, SHAPE, GPU, mode=mode)
    assert d.times == "byte-model" and "source=override, times: byte-model;" in d.log_line()
    assert "times:" not in h.decide(64, T, SHAPE, GPU, mode="auto").log_line()  # source says it already


def test_tree_drafts_go_to_snapshot_and_replay_override_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    probed = []
    with caplog.at_level(logging.INFO, logger="sglang_replayssm.heuristic"):
        out = h.decide_buckets([1, 64], T, SHAPE, GPU, topk=4,
                               probe=lambda bs, t: probed.append(bs) or _timing(bs, 0.9, 3.0))
    assert {d.path for d in out.values()} == {"snapshot"} and {d.source for d in out.values()} == {"tree"}
    assert probed == []  # no probe for tree drafts
    assert "tree drafts (--speculative-eagle-topk 4 > 1)" in caplog.records[0].getMessage()
    assert h.decide(64, T, SHAPE, GPU, mode="snapshot", topk=4).path == "snapshot"
    with pytest.raises(ReplaySSMStartupError, match="--replayssm-verify replay cannot serve tree drafts"):
        h.decide_buckets([1], T, SHAPE, GPU, mode="replay", topk=2)
    with pytest.raises(ReplaySSMStartupError, match="expected one of auto, replay, snapshot, got 'fast'"):
        h.check_verify_mode("fast", 1)


def test_one_log_line_per_bucket_with_the_numbers(caplog: pytest.LogCaptureFixture) -> None:
    utils = {1: 0.2, 8: 0.6, 64: 0.9, 256: 0.95}
    with caplog.at_level(logging.INFO, logger="sglang_replayssm.heuristic"):
        out = h.decide_buckets([256, 1, 64, 8, 64], T, SHAPE, GPU,
                               probe=lambda bs, t: _timing(bs, utils[bs], 2.0))
    assert [out[bs].path for bs in (1, 8, 64, 256)] == ["snapshot", "replay", "replay", "replay"]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4
    assert [line.split(":")[0] for line in lines] == [f"ReplaySSM verify bs={bs} T=4" for bs in (1, 8, 64, 256)]
    first = lines[0]
    for part in ("snapshot (snapshot path not bandwidth-bound (util 0.20 < 0.5)", "source=measured",
                 " MB ", " us util 0.20", "replay "):
        assert part in first


def test_cpu_decides_from_the_byte_model_alone(caplog: pytest.LogCaptureFixture) -> None:
    cpu = h.cpu_device_profile()

    def probe(bs: int, t: int) -> h.Timing:
        raise AssertionError("the timed probe must not run on CPU")

    with caplog.at_level(logging.INFO, logger="sglang_replayssm.heuristic"):
        out = h.decide_buckets([1, 4], T, SHAPE, cpu, probe=probe)
    for d in out.values():
        assert d.source == "byte-model (no CUDA: byte model only)"
        b_snap, b_replay = d.snapshot_bytes, d.replay_bytes
        fixed = SHAPE.num_layers * cpu.launch_s
        assert d.snapshot_s == pytest.approx(fixed + b_snap / cpu.peak_bytes_per_s)
        assert d.replay_s == pytest.approx(fixed + b_replay / cpu.peak_bytes_per_s)
    assert all("source=byte-model (no CUDA: byte model only)" in r.getMessage() for r in caplog.records)
    # a tiny model is launch-bound even by the byte model: snapshot
    tiny = h.VerifyShape(family="mamba2", dims=Mamba2Dims(H=2, P=16, N=32, G=1), state_bytes=4, act_bytes=2,
                         num_layers=2, window=16)
    assert h.decide(1, T, tiny, cpu).path == "snapshot"


def test_failing_or_unusable_probe_falls_back_to_the_byte_model(tmp_path) -> None:
    cache = h.DecisionCache(tmp_path / "c.json", versions="v")

    def broken(bs: int, t: int) -> h.Timing:
        if bs == 1:
            raise RuntimeError("out of memory")
        return h.Timing(snapshot_s=float("nan"), replay_s=1e-3)

    out = h.decide_buckets([1, 64], T, SHAPE, GPU, probe=broken, cache=cache)
    assert out[1].source == "byte-model (probe failed: RuntimeError: out of memory)"
    assert out[64].source == "byte-model (unusable probe times nan/0.001)"
    # byte-model path gives the same as decide() without timing
    assert out[64].path == h.decide(64, T, SHAPE, GPU).path
    assert not (tmp_path / "c.json").exists()  # nothing measured, nothing cached on CUDA


def test_decisions_are_cached_per_device_shape_and_version(tmp_path) -> None:
    path = tmp_path / "sub" / "verify.json"
    calls = []

    def probe(bs: int, t: int) -> h.Timing:
        calls.append(bs)
        return _timing(bs, 0.9, 2.0)

    first = h.decide_buckets([8, 64], T, SHAPE, GPU, probe=probe, cache=h.DecisionCache(path, versions="v1"))
    assert calls == [8, 64]
    assert len(json.loads(path.read_text())) == 2
    again = h.decide_buckets([8, 64], T, SHAPE, GPU, probe=probe, cache=h.DecisionCache(path, versions="v1"))
    assert calls == [8, 64]  # no probe: cached
    assert {bs: d.path for bs, d in again.items()} == {bs: d.path for bs, d in first.items()}
    assert again[8].source == "cached measured"
    # another version, device, shape or T probes again
    h.decide_buckets([8], T, SHAPE, GPU, probe=probe, cache=h.DecisionCache(path, versions="v2"))
    other_gpu = h.DeviceProfile(name="cuda:Other", kind="cuda", peak_bytes_per_s=PEAK, launch_s=5e-6,
                                peak_source="synthetic")
    h.decide_buckets([8], T, SHAPE, other_gpu, probe=probe, cache=h.DecisionCache(path, versions="v1"))
    other_shape = h.VerifyShape(**{**SHAPE.__dict__, "window": 8})
    h.decide_buckets([8], T, other_shape, GPU, probe=probe, cache=h.DecisionCache(path, versions="v1"))
    h.decide_buckets([8], 3, SHAPE, GPU, probe=probe, cache=h.DecisionCache(path, versions="v1"))
    assert calls == [8, 64, 8, 8, 8, 8]
    assert len(json.loads(path.read_text())) == 6
    # overrides never read or write the cache
    out = h.decide_buckets([8], T, SHAPE, GPU, mode="snapshot", probe=probe, cache=h.DecisionCache(path, "v1"))
    assert out[8].source == "override" and calls == [8, 64, 8, 8, 8, 8]
    # a corrupt file is an empty cache, rewritten
    path.write_text("{not json")
    h.decide_buckets([8], T, SHAPE, GPU, probe=probe, cache=h.DecisionCache(path, versions="v1"))
    assert calls[-1] == 8 and len(json.loads(path.read_text())) == 1


def test_an_unwritable_cache_is_logged_and_the_decisions_stand(tmp_path, caplog) -> None:
    (tmp_path / "file").write_text("")
    cache = h.DecisionCache(tmp_path / "file" / "verify.json", versions="v")  # parent is a file
    with caplog.at_level(logging.WARNING, logger="sglang_replayssm.heuristic"):
        out = h.decide_buckets([8], T, SHAPE, GPU, probe=lambda bs, t: _timing(bs, 0.9, 2.0), cache=cache)
    assert out[8].source == "measured"
    assert any("decisions not cached" in r.getMessage() for r in caplog.records)


def test_extrapolated_times_are_not_cached(tmp_path) -> None:
    """Times scaled past the pool's capacity depend on that pool, which the key does not name."""
    path = tmp_path / "verify.json"
    probe = lambda bs, t: dataclasses.replace(_timing(bs, 0.9, 2.0), how="extrapolated in proportion")  # noqa: E731
    out = h.decide_buckets([8], T, SHAPE, GPU, probe=probe, cache=h.DecisionCache(path, versions="v"))
    assert out[8].source.startswith("measured (extrapolated") and not path.exists()


def test_default_versions_name_sglang_the_kernels_and_the_rule(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    import replayssm_kernels

    cache = h.DecisionCache(tmp_path / "c.json")
    assert cache.versions.startswith("sglang0.5.17:replayssm") and cache.versions.endswith(":rule1")
    digest = h.source_digest(Path(replayssm_kernels.__file__).parent)
    assert f":kernels{digest}:" in cache.versions and len(digest) == 12
    plugin = h.source_digest(Path(h.__file__).parent)  # the probe and the paths it times
    assert f":plugin{plugin}:" in cache.versions
    monkeypatch.setenv(h.CACHE_ENV_VAR, str(tmp_path / "x.json"))
    assert h.default_cache_path() == tmp_path / "x.json"


def test_source_digest_follows_the_code(tmp_path) -> None:
    """A cached decision must not outlive the kernel code it was measured with: the digest changes
    with any source file's bytes or name, and ignores everything but ``*.py``."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    d0 = h.source_digest(tmp_path)
    (tmp_path / "sub" / "cache.pyc").write_bytes(b"junk")
    assert h.source_digest(tmp_path) == d0
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")
    d1 = h.source_digest(tmp_path)
    assert d1 != d0
    (tmp_path / "sub" / "b.py").rename(tmp_path / "sub" / "c.py")
    assert h.source_digest(tmp_path) not in (d0, d1)
