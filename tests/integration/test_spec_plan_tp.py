"""Tensor-parallel ranks take rank 0's verify plan (``spec_plan.agree_across_ranks``): with a fake group
coordinator, and through SGLang's own ``GroupCoordinator`` on two CPU processes (gloo)."""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle

import pytest
import torch
import torch.multiprocessing as mp

from sglang_replayssm import heuristic as h
from sglang_replayssm.errors import ReplaySSMStartupError
from sglang_replayssm.spec_plan import agree_across_ranks, plan_verify, tp_group

SHAPE = h.verify_shape(
    family="gdn", temporal_shape=(4, 32, 32), conv_dim=4 * 32 * 3, num_k_heads=2,
    num_layers=3, window=16, state_dtype=torch.float32, act_dtype=torch.bfloat16,
)
FAST = h.DeviceProfile(name="cuda:fast", kind="cuda", peak_bytes_per_s=4.0e12, launch_s=5e-6, peak_source="synthetic")
SLOW = h.DeviceProfile(name="cuda:slow", kind="cuda", peak_bytes_per_s=1e20, launch_s=1.0, peak_source="synthetic")
BUCKETS = [1, 64, 256]


def _plans() -> tuple[dict, dict]:
    """Two plans over the same buckets whose paths differ in at least one bucket."""
    ours = plan_verify(buckets=BUCKETS, num_tokens=4, topk=1, mode="auto", shape=SHAPE, profile=FAST)
    theirs = plan_verify(buckets=BUCKETS, num_tokens=4, topk=1, mode="auto", shape=SHAPE, profile=SLOW)
    assert {d.path for d in theirs.values()} == {"snapshot"}
    assert any(d.path == "replay" for d in ours.values())
    return ours, theirs


class _FakeGroup:
    def __init__(self, rank: int, rank0_plan: dict):
        self.rank_in_group, self.world_size, self._rank0, self.calls = rank, 2, rank0_plan, []

    def broadcast_object(self, obj=None, src=0):
        self.calls.append((obj, src))
        return obj if self.rank_in_group == 0 else self._rank0


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "takes rank 0's" in r.getMessage()]


def test_one_rank_or_no_group_keeps_its_plan():
    ours, _ = _plans()
    assert agree_across_ranks(ours, None) is ours
    # no distributed state here (unit test): no group
    assert tp_group() is None


def test_rank0_sends_its_plan_and_another_rank_takes_it(caplog):
    caplog.set_level(logging.INFO)
    ours, theirs = _plans()
    g0 = _FakeGroup(0, theirs)
    assert agree_across_ranks(theirs, g0) is theirs and g0.calls == [(theirs, 0)] and _lines(caplog) == []
    g1 = _FakeGroup(1, theirs)
    assert agree_across_ranks(ours, g1) == theirs and g1.calls == [(None, 0)]
    differ = [bs for bs in BUCKETS if ours[bs].path != theirs[bs].path]
    assert [int(line.split()[2].split("=")[1].rstrip(":")) for line in _lines(caplog)] == differ
    assert all("rank 1 takes rank 0's snapshot path (its own decision: replay" in line for line in _lines(caplog))


def test_plans_over_different_buckets_are_refused():
    ours, _ = _plans()
    other = plan_verify(buckets=[1, 64], num_tokens=4, topk=1, mode="auto", shape=SHAPE, profile=SLOW)
    with pytest.raises(ReplaySSMStartupError, match=r"rank 1 planned verify buckets \[1, 64, 256\], rank 0 \[1, 64\]"):
        agree_across_ranks(ours, _FakeGroup(1, other))


def test_plan_for_server_takes_rank0s_plan(monkeypatch, tmp_path):
    from sglang_replayssm import spec_plan
    from tests.integration.test_pool import _pool
    from tests.integration.test_spec_plan import _args

    monkeypatch.setenv("SGLANG_REPLAYSSM_CONFIG", '{"backend": "replay", "verify": "replay"}')
    monkeypatch.setenv(h.CACHE_ENV_VAR, str(tmp_path / "cache.json"))
    pool = _pool("gdn")
    pool.spec_tokens = 3
    own = spec_plan.plan_for_server(pool, _args(), torch.device("cpu"))
    rank0 = {bs: dataclasses.replace(d, reason="rank 0") for bs, d in own.items()}
    group = _FakeGroup(1, rank0)
    monkeypatch.setattr(spec_plan, "tp_group", lambda: group)
    assert spec_plan.plan_for_server(pool, _args(), torch.device("cpu")) == rank0 and len(group.calls) == 1


def _rank(rank: int, init_file: str, out_dir: str, mq: bool) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    from sglang.srt.distributed.parallel_state import GroupCoordinator

    group = GroupCoordinator(
        group_ranks=[[0, 1]], local_rank=rank, torch_distributed_backend="gloo", use_pynccl=False,
        use_pymscclpp=False, use_custom_allreduce=False, use_torch_symm_mem_all_reduce=False,
        use_hpu_communicator=False, use_xpu_communicator=False, use_npu_communicator=False,
        use_message_queue_broadcaster=mq, group_name="tp",
    )
    ours, theirs = _plans()
    records: list[str] = []
    log = logging.getLogger(f"replayssm-tp-test-{rank}")
    log.setLevel(logging.INFO)
    log.addHandler(type("H", (logging.Handler,), {"emit": lambda self, r: records.append(r.getMessage())})())
    got = agree_across_ranks(theirs if rank == 0 else ours, group, log=log)
    with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as fh:
        pickle.dump((got, records), fh)
    dist.destroy_process_group()


@pytest.mark.parametrize("mq", [False, True], ids=["gloo", "message-queue"])
def test_two_cpu_ranks_through_sglangs_group_coordinator(tmp_path, mq):
    """SGLang's ``GroupCoordinator.broadcast_object`` over gloo (and its shared-memory message queue,
    which SGLang's TP group uses on one host): rank 1 ends with rank 0's plan and logs each bucket
    whose path it changed."""
    mp.spawn(_rank, args=(str(tmp_path / "init"), str(tmp_path), mq), nprocs=2, join=True)
    ours, theirs = _plans()
    got0, log0 = pickle.loads((tmp_path / "rank0.pkl").read_bytes())
    got1, log1 = pickle.loads((tmp_path / "rank1.pkl").read_bytes())
    assert got0 == theirs and got1 == theirs and log0 == []
    assert len(log1) == sum(ours[bs].path != theirs[bs].path for bs in BUCKETS) > 0
