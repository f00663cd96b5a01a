"""The verify plan at startup (``spec_plan``): per-bucket decisions logged, override, tree drafts, and
the refusal of everything that would need SGLang's snapshot verify (not built behind a ReplaySSM pool)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from sglang_replayssm import heuristic as h
from sglang_replayssm.errors import ReplaySSMStartupError
from sglang_replayssm.spec_plan import plan_for_server, plan_verify, pool_verify_shape, startup_refusals

SHAPE = h.verify_shape(
    family="mamba2", temporal_shape=(64, 64, 128), conv_dim=64 * 64 + 2 * 8 * 128, num_k_heads=1,
    num_layers=21, window=16, state_dtype=torch.float32, act_dtype=torch.bfloat16,
)
CPU = torch.device("cpu")
GPU = h.DeviceProfile(name="cuda:Synthetic", kind="cuda", peak_bytes_per_s=4.0e12, launch_s=5e-6,
                      peak_source="synthetic")


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("ReplaySSM verify bs=")]


def test_override_replay_serves_every_bucket_and_logs_one_line_each(caplog):
    caplog.set_level(logging.INFO)
    plan = plan_verify(buckets=[1, 8, 64, 8], num_tokens=4, topk=1, mode="replay", shape=SHAPE, profile=GPU)
    assert sorted(plan) == [1, 8, 64] and {d.path for d in plan.values()} == {"replay"}
    assert {d.source for d in plan.values()} == {"override"}
    lines = _lines(caplog)
    assert len(lines) == 3 and all("replay (override --replayssm-verify replay" in s for s in lines)
    assert all("snapshot" in s and "MB" in s and "util" in s for s in lines)  # the numbers behind it


def test_snapshot_buckets_are_refused_with_the_buckets_named(caplog, tmp_path):
    caplog.set_level(logging.INFO)
    # auto without a probe: byte model; batch 1 is launch-bound -> snapshot (not built) -> refused, bs named
    cache = h.DecisionCache(tmp_path / "d.json")
    with pytest.raises(ReplaySSMStartupError, match=r"buckets \[1\].*--replayssm-verify replay"):
        plan_verify(buckets=[1, 4096], num_tokens=4, topk=1, mode="auto", shape=SHAPE, profile=GPU, cache=cache)
    assert len(_lines(caplog)) == 2  # both decisions logged before the refusal
    # the large bucket alone goes to replay under auto (bandwidth-bound snapshot, replay faster)
    plan = plan_verify(buckets=[4096], num_tokens=4, topk=1, mode="auto", shape=SHAPE, profile=GPU, cache=cache)
    assert plan[4096].path == "replay" and plan[4096].source.startswith("byte-model")
    with pytest.raises(ReplaySSMStartupError, match="snapshot verify"):
        plan_verify(buckets=[4096], num_tokens=4, topk=1, mode="snapshot", shape=SHAPE, profile=GPU)


def test_tree_drafts_go_to_snapshot_and_are_refused(caplog):
    caplog.set_level(logging.INFO)
    with pytest.raises(ReplaySSMStartupError, match="tree drafts"):
        plan_verify(buckets=[4096], num_tokens=4, topk=2, mode="auto", shape=SHAPE, profile=GPU)
    assert any("tree drafts (--speculative-eagle-topk 2 > 1)" in r.getMessage() for r in caplog.records)
    with pytest.raises(ReplaySSMStartupError, match="tree drafts"):  # forcing replay on a tree
        plan_verify(buckets=[8], num_tokens=4, topk=2, mode="replay", shape=SHAPE, profile=GPU)


def _args(**kw) -> SimpleNamespace:
    base = dict(speculative_algorithm="NGRAM", speculative_eagle_topk=1, device="cuda", disable_cuda_graph=False,
                cuda_graph_config=SimpleNamespace(decode=SimpleNamespace(bs=[1, 2, 4])), max_running_requests=8,
                enable_mamba_extra_buffer=lambda: False)
    base.update(kw)
    return SimpleNamespace(**base)


def test_startup_refusals():
    assert startup_refusals(_args(speculative_algorithm=None, device="cpu"), "snapshot") == []
    assert startup_refusals(_args(), "auto") == [] and startup_refusals(_args(), "replay") == []
    (tree,) = startup_refusals(_args(speculative_eagle_topk=4), "auto")
    assert "--speculative-eagle-topk 4" in tree and "--replayssm-verify replay" in tree
    (snap,) = startup_refusals(_args(), "snapshot")
    assert snap.startswith("--replayssm-verify snapshot")
    (cpu,) = startup_refusals(_args(device="cpu"), "replay")
    assert "--device cpu" in cpu


def test_plan_for_server_uses_the_graph_buckets_and_refuses_radix_tracking(monkeypatch, tmp_path):
    from tests.integration.test_pool import _pool

    monkeypatch.setenv("SGLANG_REPLAYSSM_CONFIG", '{"backend": "replay", "verify": "replay"}')
    monkeypatch.setenv(h.CACHE_ENV_VAR, str(tmp_path / "cache.json"))
    pool = _pool("gdn")
    pool.spec_tokens = 3
    shape = pool_verify_shape(pool)
    assert shape.family == "gdn" and shape.num_layers == 3 and shape.window == 4
    plan = plan_for_server(pool, _args(), CPU)
    assert sorted(plan) == [1, 2, 4] and all(d.num_tokens == 3 for d in plan.values())
    assert sorted(plan_for_server(pool, _args(disable_cuda_graph=True), CPU)) == [8]
    with pytest.raises(ReplaySSMStartupError, match="extra_buffer"):
        plan_for_server(pool, _args(enable_mamba_extra_buffer=lambda: True), CPU)
