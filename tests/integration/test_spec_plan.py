"""The verify plan at startup (``spec_plan``): per-bucket decisions logged, override, tree drafts, and
the refusal of everything that would need SGLang's snapshot verify (not built behind a ReplaySSM pool)."""

from __future__ import annotations

import dataclasses
import logging
from types import SimpleNamespace

import pytest
import torch

from sglang_replayssm import heuristic as h
from sglang_replayssm import spec_plan
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


def test_auto_sends_launch_bound_buckets_to_snapshot_and_logs_why(caplog):
    caplog.set_level(logging.INFO)
    # no probe: byte model; batch 1 is launch-bound -> snapshot; a large bucket is bandwidth-bound -> replay
    plan = plan_verify(buckets=[1, 4096], num_tokens=4, topk=1, mode="auto", shape=SHAPE, profile=GPU)
    assert plan[1].path == "snapshot" and "not bandwidth-bound" in plan[1].reason
    assert plan[4096].path == "replay" and plan[4096].source.startswith("byte-model")
    assert len(_lines(caplog)) == 2
    forced = plan_verify(buckets=[4096], num_tokens=4, topk=1, mode="snapshot", shape=SHAPE, profile=GPU)
    assert forced[4096].path == "snapshot" and forced[4096].source == "override"


def test_tree_drafts_go_to_snapshot(caplog):
    caplog.set_level(logging.INFO)
    plan = plan_verify(buckets=[8, 4096], num_tokens=4, topk=2, mode="auto", shape=SHAPE, profile=GPU)
    assert {d.path for d in plan.values()} == {"snapshot"} and {d.source for d in plan.values()} == {"tree"}
    assert any("tree drafts (--speculative-eagle-topk 2 > 1)" in r.getMessage() for r in caplog.records)
    with pytest.raises(ReplaySSMStartupError, match="tree drafts"):  # forcing replay on a tree
        plan_verify(buckets=[8], num_tokens=4, topk=2, mode="replay", shape=SHAPE, profile=GPU)


def test_snapshot_path_routing_by_batch_size():
    from sglang_replayssm.spec import VerifyMetadataMixin

    plan = plan_verify(buckets=[1, 8, 4096], num_tokens=4, topk=1, mode="auto", shape=SHAPE, profile=GPU)
    host = SimpleNamespace(verify_plan=plan)
    route = {bs: VerifyMetadataMixin._snapshot_path(host, bs) for bs in (1, 2, 8, 9, 4096, 5000)}
    # the smallest bucket >= bs decides (bs 1 -> bucket 1: snapshot; 2..8 -> 8; 9.. -> 4096; beyond -> 4096)
    assert route == {1: True, 2: plan[8].path == "snapshot", 8: plan[8].path == "snapshot", 9: False,
                     4096: False, 5000: False}
    assert VerifyMetadataMixin._snapshot_path(SimpleNamespace(verify_plan=None), 3) is False


def test_eager_batches_past_the_buckets_keep_off_an_overflowing_snapshot_commit(caplog):
    """An eager verify larger than every CUDA-graph bucket inherits the largest bucket's decision,
    except a heuristic snapshot decision above ``snapshot_batch_limit`` (logged once); an override
    keeps the snapshot path (stock SGLang's behaviour)."""
    from sglang_replayssm.spec import VerifyMetadataMixin

    caplog.set_level(logging.INFO)
    slow = h.DeviceProfile(name="cuda:slow", kind="cuda", peak_bytes_per_s=1e20, launch_s=1.0,
                           peak_source="synthetic")  # launch-bound everywhere: auto picks snapshot
    auto = plan_verify(buckets=[1, 8], num_tokens=4, topk=1, mode="auto", shape=SHAPE, profile=slow)
    assert {d.path for d in auto.values()} == {"snapshot"}
    host = SimpleNamespace(verify_plan=auto, _snapshot_limit=100)
    route = {bs: VerifyMetadataMixin._snapshot_path(host, bs) for bs in (8, 9, 100, 101, 500)}
    assert route == {8: True, 9: True, 100: True, 101: False, 500: False}
    assert sum("overflows int32" in r.getMessage() for r in caplog.records) == 1
    forced = plan_verify(buckets=[1, 8], num_tokens=4, topk=1, mode="snapshot", shape=SHAPE, profile=GPU)
    host = SimpleNamespace(verify_plan=forced, _snapshot_limit=100)
    assert VerifyMetadataMixin._snapshot_path(host, 500) is True


def test_init_spec_passes_the_runners_maximum_of_running_requests(monkeypatch):
    from sglang_replayssm.spec import VerifyMetadataMixin

    seen = {}
    monkeypatch.setattr(spec_plan, "plan_for_server", lambda pool, args, device, max_batch, capture_bs:
                        seen.update(mb=max_batch, capture=capture_bs))
    monkeypatch.setattr(spec_plan, "pool_snapshot_batch_limit", lambda pool: 7)
    host = SimpleNamespace(num_tokens=4, is_draft_worker=False, pool=None, device="cpu")
    VerifyMetadataMixin._init_spec(host, SimpleNamespace(server_args=_args(), max_running_requests=640))
    assert seen == {"mb": 640, "capture": None} and host._snapshot_limit == 7  # no CUDA graphs on a CPU


def test_capture_buckets_are_sglangs(monkeypatch):
    """On CUDA the plan decides the batch sizes SGLang captures (its own function: the configured list
    clamped to the request pool, the pool's size added), at the verify's tokens per request."""
    from sglang.srt.model_executor.runner import base_cuda_graph_runner as bcg

    from sglang_replayssm.spec import _capture_buckets

    seen = []

    def fake(model_runner, width):
        seen.append(width)
        return [1, 2, 4, 48], []

    monkeypatch.setattr(bcg, "get_batch_sizes_to_capture", fake)
    runner = SimpleNamespace(server_args=_args(), decode_num_tokens_per_req=lambda: 4)
    assert _capture_buckets(runner, torch.device("cuda")) == [1, 2, 4, 48] and seen == [4]
    assert _capture_buckets(runner, torch.device("cpu")) is None
    runner.server_args.disable_cuda_graph = True
    assert _capture_buckets(runner, torch.device("cuda")) is None and seen == [4]


def test_verify_buckets_add_the_largest_eager_batch():
    graphs = _args(cuda_graph_config=SimpleNamespace(decode=SimpleNamespace(bs=[1, 2, 4, 256])))
    # SGLang's capture list replaces the configured one (buckets past the request pool are not captured)
    assert spec_plan.verify_buckets(graphs, 48, capture_bs=[1, 2, 4, 48]) == [1, 2, 4, 48]
    assert spec_plan.verify_buckets(graphs, 48) == [1, 2, 4, 256]  # no capture list: as configured
    # eager batches past the largest graph (--cuda-graph-max-bs 4, 256 running) get their own decision
    assert spec_plan.verify_buckets(graphs, 512, capture_bs=[1, 2, 4]) == [1, 2, 4, 512]
    # without graphs: the runner's maximum, else the flag's, else 1
    eager = _args(disable_cuda_graph=True, max_running_requests=None)
    assert spec_plan.verify_buckets(eager, 640) == [640] and spec_plan.verify_buckets(eager) == [1]
    assert spec_plan.verify_buckets(_args(disable_cuda_graph=True)) == [8]


def _args(**kw) -> SimpleNamespace:
    base = dict(speculative_algorithm="EAGLE", speculative_eagle_topk=1, device="cuda", disable_cuda_graph=False,
                cuda_graph_config=SimpleNamespace(decode=SimpleNamespace(bs=[1, 2, 4])), max_running_requests=8,
                enable_mamba_extra_buffer=lambda: False)
    base.update(kw)
    return SimpleNamespace(**base)


def test_startup_refusals():
    assert startup_refusals(_args(speculative_algorithm=None, device="cpu"), "snapshot") == []
    for mode in ("auto", "replay", "snapshot"):
        assert startup_refusals(_args(), mode) == []
    assert startup_refusals(_args(speculative_eagle_topk=4), "auto") == []  # tree -> snapshot path
    (tree,) = startup_refusals(_args(speculative_eagle_topk=4), "replay")
    assert "--speculative-eagle-topk 4" in tree
    (cpu,) = startup_refusals(_args(device="cpu", speculative_algorithm="NGRAM", speculative_ngram_max_bfs_breadth=1),
                              "replay")
    assert "--device cpu with NGRAM" in cpu and "sgl_kernel" in cpu and "plug-in-registered" in cpu
    assert startup_refusals(_args(speculative_adaptive=False), "auto") == []
    (adaptive,) = startup_refusals(_args(speculative_adaptive=True), "auto")
    assert "--speculative-adaptive" in adaptive and "--speculative-num-draft-tokens" in adaptive


def test_ngram_at_breadth_one_is_refused_its_drafts_are_trees():
    """NGRAM's drafts are trees at any breadth, but at ``--speculative-ngram-max-bfs-breadth 1`` SGLang sets
    ``speculative_eagle_topk`` 1 and both verify paths would run them as chains: refused in every mode.
    Breadth 2 or more is a tree draft (SGLang's snapshot verify): ``auto`` / ``snapshot`` start, ``replay``
    is refused, also before SGLang has copied the breadth into ``speculative_eagle_topk``."""
    ngram = dict(speculative_algorithm="NGRAM")
    for mode in ("auto", "replay", "snapshot"):
        problems = startup_refusals(_args(**ngram, speculative_ngram_max_bfs_breadth=1), mode)
        (chain,) = [p for p in problems if "NGRAM" in p]
        assert "--speculative-ngram-max-bfs-breadth 1" in chain and "trees" in chain
        assert "use --speculative-ngram-max-bfs-breadth 2 or more" in chain
    assert startup_refusals(_args(**ngram, speculative_ngram_max_bfs_breadth=1), "snapshot") == [chain]
    for mode in ("auto", "snapshot"):  # SGLang's default breadth 10, before and after its resolution
        assert startup_refusals(_args(**ngram, speculative_ngram_max_bfs_breadth=10, speculative_eagle_topk=None),
                                mode) == []
        assert startup_refusals(_args(**ngram, speculative_ngram_max_bfs_breadth=10, speculative_eagle_topk=10),
                                mode) == []
    (tree,) = startup_refusals(_args(**ngram, speculative_ngram_max_bfs_breadth=2, speculative_eagle_topk=None),
                               "replay")
    assert "cannot serve tree drafts (--speculative-eagle-topk 2 > 1)" in tree
    # other algorithms keep --speculative-eagle-topk: linear EAGLE chains start
    assert startup_refusals(_args(speculative_ngram_max_bfs_breadth=1), "replay") == []


def test_deterministic_inference_refuses_the_per_bucket_verify_choice():
    """``auto`` picks the verify path per batch bucket, so outputs could depend on the batch size:
    refused under ``--enable-deterministic-inference`` (linear drafts), naming the two fixed paths."""
    deterministic = dict(enable_deterministic_inference=True)
    (problem,) = startup_refusals(_args(**deterministic), "auto")
    assert "--enable-deterministic-inference with --replayssm-verify auto" in problem
    assert "pass --replayssm-verify replay or --replayssm-verify snapshot" in problem
    assert "for Gated DeltaNet past 16 draft tokens only snapshot" in problem  # replay is refused there
    for mode in ("replay", "snapshot"):
        assert startup_refusals(_args(**deterministic), mode) == []
    assert startup_refusals(_args(enable_deterministic_inference=False), "auto") == []
    assert startup_refusals(_args(speculative_eagle_topk=4, **deterministic), "auto") == []  # always snapshot
    assert startup_refusals(_args(speculative_algorithm=None, **deterministic), "auto") == []


def test_gdn_draft_length_refusal():
    """Linear GDN drafts past ``GDN_VERIFY_MAX_T`` (the replay verify kernel's own limit): refused with
    ``--replayssm-verify replay`` and on a CPU (no snapshot verify there); ``auto`` / ``snapshot`` on
    CUDA, tree drafts, Mamba-2, a draft length not yet resolved and no speculation pass."""
    from replayssm_kernels.gdn_decode._validate import MAX_T

    from sglang_replayssm.spec_plan import GDN_VERIFY_MAX_T, draft_length_refusal

    assert GDN_VERIFY_MAX_T == MAX_T == 16
    long = dict(speculative_num_draft_tokens=17)
    replay = draft_length_refusal("gdn", _args(**long), "replay")
    assert "--speculative-num-draft-tokens 17: 17 draft tokens" in replay and "takes at most 16 (" in replay
    assert "use --speculative-num-draft-tokens 16 or fewer, or --replayssm-verify auto or snapshot" in replay
    cpu = draft_length_refusal("gdn", _args(device="cpu", **long), "auto")
    assert "--device cpu" in cpu and "use --speculative-num-draft-tokens 16 or fewer" in cpu
    for mode in ("auto", "snapshot"):
        assert draft_length_refusal("gdn", _args(**long), mode) is None
    assert draft_length_refusal("gdn", _args(speculative_num_draft_tokens=16), "replay") is None
    assert draft_length_refusal("gdn", _args(speculative_num_draft_tokens=None), "replay") is None
    assert draft_length_refusal("gdn", _args(speculative_eagle_topk=4, **long), "snapshot") is None
    assert draft_length_refusal("mamba2", _args(**long), "replay") is None
    assert draft_length_refusal("gdn", _args(speculative_algorithm=None, **long), "replay") is None
    # before SGLang resolves its settings: an EAGLE-family chain is num_steps + 1 tokens whatever the
    # draft-token flag says, and NGRAM's topk is its breadth
    steps = draft_length_refusal("gdn", _args(speculative_num_steps=16, speculative_num_draft_tokens=4), "replay")
    assert steps.startswith("--speculative-num-steps 16: 17 draft tokens")
    for algorithm in ("EAGLE", "STANDALONE", "NEXTN"):
        assert draft_length_refusal("gdn", _args(speculative_algorithm=algorithm, speculative_num_steps=3,
                                                 **long), "replay") is None
    assert draft_length_refusal("gdn", _args(speculative_algorithm="NGRAM", speculative_ngram_max_bfs_breadth=4,
                                             speculative_num_steps=None, **long), "replay") is None


GDN_SHAPE = h.verify_shape(
    family="gdn", temporal_shape=(32, 128, 128), conv_dim=2 * 16 * 128 + 32 * 128, num_k_heads=16,
    num_layers=24, window=16, state_dtype=torch.float32, act_dtype=torch.bfloat16,
)


def test_gdn_draft_length_past_the_replay_kernel_sends_every_bucket_to_snapshot(caplog):
    """``auto`` with more GDN draft tokens than the replay verify takes: every bucket goes to SGLang's
    snapshot verify, logged, as binding as an override: the overflow guard then refuses a bucket
    past its limit (naming why it is on snapshot), and eager batches past the buckets stay there."""
    from sglang_replayssm.spec import VerifyMetadataMixin
    from sglang_replayssm.spec_plan import _guard_draft_length, _guard_snapshot_overflow

    caplog.set_level(logging.INFO)
    launch_bound = h.DeviceProfile(name="cuda:Synthetic", kind="cuda", peak_bytes_per_s=4.0e12, launch_s=1e-4,
                                   peak_source="synthetic")
    auto = plan_verify(buckets=[1, 4096], num_tokens=17, topk=1, mode="auto", shape=GDN_SHAPE,
                       profile=launch_bound)
    assert auto[1].path == "snapshot" and auto[4096].path == "replay"  # the byte model alone
    caplog.clear()
    guarded = _guard_draft_length(auto, "gdn", 17)
    assert all(d.path == "snapshot" and d.source == "draft-length" and "at most 16 draft tokens" in d.reason
               for d in guarded.values())
    assert _lines(caplog) == [guarded[1].log_line(), guarded[4096].log_line()]
    assert guarded[4096].times == auto[4096].times  # the numbers behind the moved decision are kept
    # within the kernel's limit, or Mamba-2: untouched
    short = plan_verify(buckets=[1, 4096], num_tokens=16, topk=1, mode="auto", shape=GDN_SHAPE, profile=GPU)
    assert _guard_draft_length(short, "gdn", 16) is short and _guard_draft_length(auto, "mamba2", 17) is auto
    # tree drafts and a forced snapshot are on snapshot already; a forced replay is refused
    for mode, topk in (("auto", 2), ("snapshot", 1)):
        plan = plan_verify(buckets=[8], num_tokens=17, topk=topk, mode=mode, shape=GDN_SHAPE, profile=GPU)
        assert _guard_draft_length(plan, "gdn", 17) == plan
    forced = plan_verify(buckets=[8], num_tokens=17, topk=1, mode="replay", shape=GDN_SHAPE, profile=GPU)
    with pytest.raises(ReplaySSMStartupError, match=r"\[8\] are forced to the replay verify.*at most 16"):
        _guard_draft_length(forced, "gdn", 17)
    # past the snapshot commit's int32 limit such a bucket cannot be moved back to replay: refused
    with pytest.raises(ReplaySSMStartupError, match=r"\[4096\].*\(the Gated DeltaNet replay verify takes at most "
                       r"16.*above batch 100.*--max-running-requests at 100, or use --speculative-num-draft-tokens 16 "
                       r"or fewer \(the replay verify then runs\)$"):
        _guard_snapshot_overflow(guarded, 17, 100)
    host = SimpleNamespace(verify_plan=guarded, _snapshot_limit=100)
    assert VerifyMetadataMixin._snapshot_path(host, 5000) is True


def test_probe_is_skipped_where_the_replay_verify_cannot_run():
    """A GDN draft length past the replay kernel's: no timed probe (its replay half would fail)."""
    from tests.integration.test_pool import _pool

    pool = _pool("gdn")
    pool.spec_tokens = 17
    assert spec_plan._probe(pool, [1, 8], "auto", 1, torch.device("cuda")) is None
    pool.spec_tokens = 16
    assert spec_plan._probe(pool, [1, 8], "auto", 1, torch.device("cuda")) is not None


def test_cpu_runs_plugin_algorithms_with_linear_drafts_only(monkeypatch):
    from sglang.srt.speculative import spec_registry

    algo = spec_registry.CustomSpecAlgo("TEST_CHAIN", lambda server_args: None)
    monkeypatch.setitem(spec_registry._REGISTRY, "TEST_CHAIN", algo)
    assert startup_refusals(_args(device="cpu", speculative_algorithm="test_chain"), "replay") == []
    assert startup_refusals(_args(device="cpu", speculative_algorithm="TEST_CHAIN"), "auto") == []
    (tree,) = startup_refusals(_args(device="cpu", speculative_algorithm="TEST_CHAIN", speculative_eagle_topk=2),
                               "auto")
    assert "tree drafts (--speculative-eagle-topk 2 > 1)" in tree and "--device cpu" in tree
    (standalone,) = startup_refusals(_args(device="cpu", speculative_algorithm="STANDALONE"), "replay")
    assert "STANDALONE" in standalone and "torch_native draft attention backend" in standalone


def test_plan_for_server_uses_the_graph_buckets_and_refuses_radix_tracking(monkeypatch, tmp_path):
    from tests.integration.test_pool import _pool

    monkeypatch.setenv("SGLANG_REPLAYSSM_CONFIG", '{"backend": "replay", "verify": "replay"}')
    monkeypatch.setenv(h.CACHE_ENV_VAR, str(tmp_path / "cache.json"))
    pool = _pool("gdn")
    pool.spec_tokens = 3
    shape = pool_verify_shape(pool)
    assert shape.family == "gdn" and shape.num_layers == 3 and shape.window == 4
    import dataclasses

    # the dtypes, a read copy or stochastic rounding change the kernels' cost: a cached decision must not
    # carry over
    names = f"state-{str(pool.mamba_cache.temporal.dtype).removeprefix('torch.')}+act-bfloat16"
    assert shape.variant == names and shape.key().endswith(f":L4:{names}")
    pool.read_state, pool.sr_seed = torch.zeros(1, dtype=torch.bfloat16), torch.zeros(1, dtype=torch.int64)
    split = pool_verify_shape(pool)
    assert split.variant == f"{names}+read-bfloat16+sr"
    assert split.key() == shape.key().replace(":layers", ":r2s0:layers") + "+read-bfloat16+sr"
    # a hand-built shape with a copy but no variant is keyed apart from the shape without one
    bare = dataclasses.replace(shape, read_bytes=1, read_scale_bytes=4)
    assert bare.key() != shape.key() and ":r1s4:" in bare.key()
    pool.read_state, pool.sr_seed = None, None
    # fp16 and bf16 activations have one size and other kernels: keyed apart
    replay = pool.replay
    pool.replay = dataclasses.replace(replay, act_dtype=torch.float16)
    assert pool_verify_shape(pool).key() == shape.key().replace("act-bfloat16", "act-float16")
    pool.replay = replay
    from sglang_replayssm.spec_plan import pool_snapshot_batch_limit, snapshot_batch_limit

    assert pool_snapshot_batch_limit(pool) == snapshot_batch_limit(3, pool.mamba_cache.temporal[0, 0].numel())
    plan = plan_for_server(pool, _args(), CPU)  # max_running_requests 8 passes the buckets: decided too
    assert sorted(plan) == [1, 2, 4, 8] and all(d.num_tokens == 3 for d in plan.values())
    assert sorted(plan_for_server(pool, _args(disable_cuda_graph=True), CPU)) == [8]
    with pytest.raises(ReplaySSMStartupError, match="extra_buffer"):
        plan_for_server(pool, _args(enable_mamba_extra_buffer=lambda: True), CPU)
    # snapshot buckets need CUDA (SGLang's verify): forced, refused; auto's choices move to replay, logged
    monkeypatch.setenv("SGLANG_REPLAYSSM_CONFIG", '{"backend": "replay", "verify": "snapshot"}')
    with pytest.raises(ReplaySSMStartupError, match=r"buckets \[1, 2, 4, 8\].*needs CUDA.*--replayssm-verify replay"):
        plan_for_server(pool, _args(), CPU)
    # the model runner's maximum of running requests reaches the overflow guard
    with pytest.raises(ReplaySSMStartupError, match=r"above batch \d+.*--max-running-requests"):
        plan_for_server(pool, _args(), CPU, max_batch=pool_snapshot_batch_limit(pool) + 1)


def test_plan_for_server_logs_one_line_per_bucket_past_the_gdn_draft_length(monkeypatch, tmp_path, caplog):
    """``auto`` with GDN drafts past the replay kernel: the byte model's decisions are replaced before
    they are final, so only ``_guard_draft_length``'s snapshot lines are logged, and nothing is cached."""
    from tests.integration.test_pool import _pool

    monkeypatch.setenv("SGLANG_REPLAYSSM_CONFIG", '{"backend": "replay", "verify": "auto"}')
    monkeypatch.setenv(h.CACHE_ENV_VAR, str(tmp_path / "cache.json"))
    monkeypatch.setattr(spec_plan, "_profile", lambda device: GPU)  # CUDA's: the snapshot verify may serve
    pool = _pool("gdn")
    pool.spec_tokens = 17
    cache = pool.mamba_cache  # with the snapshot verify's per-draft buffer (auto keeps it)
    pool.mamba_cache = SimpleNamespace(**{f.name: getattr(cache, f.name) for f in dataclasses.fields(cache)},
                                       intermediate_ssm=torch.zeros(1))
    caplog.set_level(logging.INFO)
    plan = plan_for_server(pool, _args(), torch.device("cuda"))
    assert sorted(plan) == [1, 2, 4, 8] and {(d.path, d.source) for d in plan.values()} == {("snapshot", "draft-length")}
    assert _lines(caplog) == [plan[bs].log_line() for bs in sorted(plan)]
    assert not (tmp_path / "cache.json").exists()


def test_auto_on_a_cpu_moves_snapshot_choices_to_replay_and_logs_them(caplog):
    from sglang_replayssm.spec_plan import _guard_device

    caplog.set_level(logging.INFO)
    auto = plan_verify(buckets=[1, 64], num_tokens=4, topk=1, mode="auto", shape=SHAPE,
                       profile=h.DeviceProfile(name="cuda:slow", kind="cuda", peak_bytes_per_s=1e20,
                                               launch_s=1.0, peak_source="synthetic"))
    assert {d.path for d in auto.values()} == {"snapshot"}  # launch-bound everywhere
    caplog.clear()
    guarded = _guard_device(auto, CPU)
    assert all(d.path == "replay" and "needs CUDA (device cpu)" in d.reason for d in guarded.values())
    assert _lines(caplog) == [guarded[1].log_line(), guarded[64].log_line()]
    assert _guard_device(auto, torch.device("cuda", 0)) == auto


def test_cuda_profile_is_asked_for_by_device_index(monkeypatch):
    from sglang_replayssm import spec_plan

    calls = []
    monkeypatch.setattr(h, "cuda_device_profile", lambda index, **kw: calls.append((index, kw)) or GPU)
    assert spec_plan._profile(torch.device("cuda", 1)) is GPU and spec_plan._profile(torch.device("cuda")) is GPU
    assert calls == [(1, {"probe_bytes": 256 << 20}), (None, {"probe_bytes": 256 << 20})]
    assert spec_plan._profile(CPU).kind == "cpu"


def test_snapshot_batch_limit_matches_the_int32_wrap():
    from sglang_replayssm.spec_plan import snapshot_batch_limit

    nano = 96 * 80 * 128
    assert snapshot_batch_limit(8, nano) == 274 and snapshot_batch_limit(4, nano) == 547
    for T in (2, 4, 8):
        n = snapshot_batch_limit(T, nano)
        assert (n - 1) * T * nano <= 2**31 - 1 < n * T * nano


def test_snapshot_buckets_past_the_scatter_limit_go_to_replay_or_are_refused(caplog):
    from sglang_replayssm.spec_plan import _guard_snapshot_overflow, snapshot_batch_limit

    caplog.set_level(logging.INFO)
    elems = 64 * 64 * 128  # SHAPE's state: limit at T = 4 is 1024
    limit4, limit2 = snapshot_batch_limit(4, elems), snapshot_batch_limit(2, elems)
    assert (limit4, limit2) == (1024, 2048)
    auto = plan_verify(buckets=[1, 1024, 1025], num_tokens=4, topk=1, mode="auto", shape=SHAPE,
                       profile=h.DeviceProfile(name="cuda:slow", kind="cuda", peak_bytes_per_s=1e20,
                                               launch_s=1.0, peak_source="synthetic"))
    assert {d.path for d in auto.values()} == {"snapshot"}  # launch-bound everywhere: all snapshot
    caplog.clear()
    guarded = _guard_snapshot_overflow(auto, 4, limit4)
    assert guarded[1].path == "snapshot" and guarded[1024].path == "snapshot"
    assert guarded[1025].path == "replay" and "int32" in guarded[1025].reason
    assert _lines(caplog) == [guarded[1025].log_line()]
    forced = plan_verify(buckets=[8, 1025], num_tokens=4, topk=1, mode="snapshot", shape=SHAPE, profile=GPU)
    with pytest.raises(ReplaySSMStartupError, match=r"\[1025\].*above batch 1024.*--cuda-graph-max-bs"):
        _guard_snapshot_overflow(forced, 4, limit4)
    tree = plan_verify(buckets=[2048], num_tokens=4, topk=2, mode="auto", shape=SHAPE, profile=GPU)
    with pytest.raises(ReplaySSMStartupError, match=r"tree"):
        _guard_snapshot_overflow(tree, 4, limit4)
    assert _guard_snapshot_overflow(forced, 2, limit2) == forced
    # the server's maximum of running requests is a bucket of its own (verify_buckets), so a forced
    # snapshot past the limit is refused by the same rule
    args = _args(cuda_graph_config=SimpleNamespace(decode=SimpleNamespace(bs=[8, 512])))
    small = plan_verify(buckets=spec_plan.verify_buckets(args, 1025), num_tokens=4, topk=1, mode="snapshot",
                        shape=SHAPE, profile=GPU)
    with pytest.raises(ReplaySSMStartupError, match=r"\[1025\].*above batch 1024.*--max-running-requests at 1024"):
        _guard_snapshot_overflow(small, 4, limit4)

def test_snapshot_batch_limit_without_int32_strides():
    """A request stride past 2^31 is passed to SGLang's kernel as i64: no wrap, no limit."""
    import sys

    from sglang_replayssm.spec_plan import snapshot_batch_limit

    assert snapshot_batch_limit(8, 2**29) == sys.maxsize


def test_block_draft_algorithms_and_their_refusals(monkeypatch):
    """DFLASH / DSPARK draft linear blocks (topk 1 whatever the flag; T from the block size before SGLang
    resolves it); DSPARK's compact ragged verify, FROZEN_KV_MTP and (Mamba-2 targets) DFLASH / DSPARK are
    refused, each naming what to change; DSPARK's static and cap-accept modes pass."""
    from sglang_replayssm.spec_plan import draft_length_refusal, target_refusal

    for algorithm in ("DFLASH", "DSPARK"):
        assert startup_refusals(_args(speculative_algorithm=algorithm, speculative_eagle_topk=4), "replay") == []
    long = draft_length_refusal("gdn", _args(speculative_algorithm="DFLASH", speculative_dflash_block_size=17),
                                "replay")
    assert long.startswith("--speculative-dflash-block-size 17: 17 draft tokens")
    assert draft_length_refusal("gdn", _args(speculative_algorithm="DFLASH", speculative_dflash_block_size=16),
                                "replay") is None
    dspark = draft_length_refusal("gdn", _args(speculative_algorithm="DSPARK", speculative_dspark_block_size=16),
                                  "replay")
    assert dspark.startswith("--speculative-dspark-block-size 16: 17 draft tokens")
    for mode in ("static", "cap-accept"):
        monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", mode)
        assert startup_refusals(_args(speculative_algorithm="DSPARK"), "auto") == []
    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", "compact")
    (ragged,) = startup_refusals(_args(speculative_algorithm="DSPARK"), "auto")
    assert ragged.startswith("SGLANG_RAGGED_VERIFY_MODE=compact with --speculative-algorithm DSPARK")
    assert "set SGLANG_RAGGED_VERIFY_MODE=static" in ragged
    assert startup_refusals(_args(speculative_algorithm="DFLASH"), "auto") == []  # compact is DSPARK's only
    monkeypatch.delenv("SGLANG_RAGGED_VERIFY_MODE")
    (frozen,) = startup_refusals(_args(speculative_algorithm="FROZEN_KV_MTP"), "auto")
    assert "FROZEN_KV_MTP" in frozen and "Gemma 4" in frozen and "use NEXTN / EAGLE" in frozen
    for algorithm in ("DFLASH", "DSPARK"):
        assert algorithm in target_refusal("mamba2", _args(speculative_algorithm=algorithm))
        assert target_refusal("gdn", _args(speculative_algorithm=algorithm)) is None
    assert target_refusal("mamba2", _args()) is None
    assert target_refusal("mamba2", _args(speculative_algorithm=None)) is None
