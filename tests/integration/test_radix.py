"""Radix-cache invariants with ReplaySSM rings (``sglang_replayssm/radix.py``), on CPU.

T: a slot the tree takes has an empty ring (its records are materialised first), and the key it
claims is the length its checkpoint is complete for; F: ``copy_from`` forks the ring with the
checkpoint; E: extend rows have empty rings.
The donation tests run SGLang's own ``MambaComponent.prepare_for_caching_req`` under our hook, on a
real ``HybridReqToTokenPool`` with a ``ReplayMambaPool`` inside (the component itself is a stand-in
carrying the attributes the method reads).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch

from sglang_replayssm.hooks.radix import around_prepare_for_caching_req
from sglang_replayssm.pool import ReplayMambaPool, ReplayPoolSpec
from sglang_replayssm.radix import DonationStats, check_extend_rows, reset_tree_slots
from sglang_replayssm.radix_materialise import materialise_slot


def _hybrid_pool(extra_buffer: bool = False, slots: int = 8):
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

    shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=8, n_groups=1, num_heads=2,
                                    head_dim=4, state_size=4, conv_kernel=4)
    params = Mamba2CacheParams(shape=shape, layers=[0, 1],
                               dtype=Mamba2StateDType(conv=torch.float32, temporal=torch.float32))
    previous = HybridReqToTokenPool.__dict__["mamba_pool_cls"]
    HybridReqToTokenPool.mamba_pool_cls = functools.partial(
        ReplayMambaPool, replay=ReplayPoolSpec(family="mamba2", window=4, act_dtype=torch.float32))
    try:
        hp = HybridReqToTokenPool(size=4, mamba_size=slots, mamba_spec_state_size=4, max_context_len=8,
                                  device="cpu", enable_memory_saver=False, cache_params=params,
                                  mamba_layer_ids=[0, 1], enable_mamba_extra_buffer=extra_buffer)
    finally:
        HybridReqToTokenPool.mamba_pool_cls = previous
    pool = hp.mamba_pool
    g = torch.Generator().manual_seed(0)
    pool.mamba_cache.temporal.copy_(torch.randn(pool.mamba_cache.temporal.shape, generator=g))
    for t in pool.rings.values():
        t.copy_(torch.randn(t.shape, generator=g))
    return hp


def _req(hp):
    req = SimpleNamespace(mamba_pool_idx=None, req_pool_idx=None, mamba_needs_clear=False,
                          mamba_ping_pong_track_buffer=None, mamba_next_track_idx=None,
                          mamba_last_track_seqlen=None, inflight_middle_chunks=0, kv_committed_len=0)
    assert hp.alloc([req]) is not None
    return req


def _component(hp):
    """What ``MambaComponent.prepare_for_caching_req`` reads from ``self``."""
    cache = SimpleNamespace(req_to_token_pool=hp, enable_mamba_extra_buffer=hp.enable_mamba_extra_buffer)
    return SimpleNamespace(cache=cache, int8_ckpt_pool=None,
                           _alloc_mamba_slot=lambda: hp.mamba_allocator.alloc(1))


def _donate(hp, req, token_ids_len, finished):
    from sglang.srt.mem_cache.unified_cache.components.mamba_component import MambaComponent

    params = SimpleNamespace(mamba_value=None)
    cl = around_prepare_for_caching_req(MambaComponent.prepare_for_caching_req, _component(hp), req, params,
                                        token_ids_len, finished)
    return cl, params.mamba_value


@pytest.fixture(autouse=True)
def _stats():
    DonationStats.reset()
    DonationStats.count_tokens = True
    yield
    DonationStats.reset()


def test_reset_tree_slots_only_touches_the_given_slots():
    cursors = torch.tensor([[0, 0], [1, 2], [3, 1], [2, 2]], dtype=torch.int32)
    reset_tree_slots(cursors, torch.tensor([[2]]))
    assert cursors.tolist() == [[0, 0], [1, 2], [0, 0], [2, 2]]


def test_check_extend_rows_refuses_a_pending_ring():
    cursors = torch.zeros(5, 2, dtype=torch.int32)
    cursors[4] = torch.tensor([1, 0])  # start alone does not matter
    check_extend_rows(cursors, torch.tensor([1, -1, 4], dtype=torch.int32))
    check_extend_rows(cursors, torch.tensor([], dtype=torch.int32))
    cursors[2, 1] = 1
    with pytest.raises(RuntimeError, match="radix invariant E"):
        check_extend_rows(cursors, torch.tensor([1, 2]))


def _fold_f64(pool, slot: int) -> torch.Tensor:
    """float64 fold of ``slot``'s ring records onto its checkpoint, every layer (Mamba-2)."""
    start, length = pool.cursors[slot].tolist()
    R = pool.ring_spec.rows
    out = []
    for layer in range(pool.mamba_cache.temporal.shape[0]):
        S = pool.mamba_cache.temporal[layer, slot].double()
        A = pool.fold_A[layer].double()
        for j in range(length):
            r = (start + j) % R
            x = pool.rings["x"][layer, slot, :, r].double()
            d = pool.rings["dt"][layer, slot, :, r].double()
            B = pool.rings["B"][layer, slot, :, r].double().repeat_interleave(2, 0)
            S = S * torch.exp(A * d)[:, None, None] + (d[:, None] * x)[:, :, None] * B[:, None, :]
        out.append(S)
    return torch.stack(out)


def _with_records(hp, slot: int, start: int, length: int) -> None:
    pool = hp.mamba_pool
    pool.fold_A = [-torch.rand(2, generator=torch.Generator().manual_seed(i)) - 0.1 for i in range(2)]
    pool.rings["dt"].abs_()  # Δ >= 0, as softplus gives
    pool.cursors[slot] = torch.tensor([start, length])


def test_materialise_folds_the_ring_and_touches_nothing_else():
    hp = _hybrid_pool()
    pool = hp.mamba_pool
    _with_records(hp, 3, 2, 3)
    want = _fold_f64(pool, 3)
    before = {n: t.clone() for n, t in pool.rings.items()} | {"temporal": pool.mamba_cache.temporal.clone()}
    assert materialise_slot(pool, torch.tensor(3)) == 3
    got = pool.mamba_cache.temporal[:, 3].double()
    err = ((got - want).norm() / want.norm()).item()
    assert err < 1e-6, err  # fp32 fold vs float64: measured ~5e-8
    assert pool.cursors[3].tolist() == [(2 + 3) % pool.ring_spec.rows, 0]
    keep = [s for s in range(pool.cursors.shape[0]) if s != 3]
    assert torch.equal(pool.mamba_cache.temporal[:, keep], before["temporal"][:, keep])
    for n, t in pool.rings.items():
        assert torch.equal(t, before[n]), n  # records are read, never written
    assert materialise_slot(pool, 3) == 0  # empty ring: nothing launched
    pool.fold_A = None
    pool.cursors[4, 1] = 1
    with pytest.raises(ValueError, match="needs fold_A"):
        materialise_slot(pool, 4)
    with pytest.raises(ValueError, match=r"slot expected in \[1, "):
        materialise_slot(pool, 0)


def test_finished_no_buffer_donation_is_materialised():
    hp = _hybrid_pool()
    pool = hp.mamba_pool
    req = _req(hp)
    s = int(req.mamba_pool_idx)
    _with_records(hp, s, 1, 3)
    want = _fold_f64(pool, s)
    cl, value = _donate(hp, req, 50, finished=True)
    assert cl == 50 and int(value) == s  # full key: the live slot itself enters the tree
    assert pool.cursors[s].tolist() == [0, 0]  # the tree slot's cursor pair is zeroed
    got = pool.mamba_cache.temporal[:, s].double()
    assert ((got - want).norm() / want.norm()).item() < 1e-6
    assert (DonationStats.donated, DonationStats.materialised_tokens) == (1, 3)


@pytest.mark.parametrize("pending", [0, 2])
def test_unfinished_no_buffer_donation_is_complete(pending: int):
    """Chunked-prefill insert: the live slot is materialised, then SGLang copies it; the copy holds
    the full key's state with an empty ring, the live request decodes on from the same state."""
    hp = _hybrid_pool()
    pool = hp.mamba_pool
    req = _req(hp)
    s = int(req.mamba_pool_idx)
    _with_records(hp, s, 2, pending)
    cl, value = _donate(hp, req, 30, finished=False)
    d = int(value.reshape(-1)[0])
    assert d != s and cl == 30
    assert pool.cursors[d].tolist() == [0, 0]
    assert torch.equal(pool.mamba_cache.temporal[:, d], pool.mamba_cache.temporal[:, s])
    assert pool.cursors[s].tolist() == [(2 + pending) % pool.ring_spec.rows if pending else 2, 0]
    assert (DonationStats.donated, DonationStats.materialised_tokens) == (1, pending)


def test_extra_buffer_donation_zeroes_the_stale_cursor_of_the_track_slot():
    hp = _hybrid_pool(extra_buffer=True)
    pool = hp.mamba_pool
    req = _req(hp)
    track = req.mamba_ping_pong_track_buffer
    keep = int(track[hp.get_mamba_ping_pong_keep_idx(req)])
    pool.cursors[keep] = torch.tensor([3, 2])  # left over from the slot's previous owner
    req.mamba_last_track_seqlen = 16
    cl, value = _donate(hp, req, 20, finished=False)
    assert int(value.reshape(-1)[0]) == keep and cl == 16
    assert pool.cursors[keep].tolist() == [0, 0]


def test_int8_checkpoint_pool_is_refused():
    hp = _hybrid_pool()
    comp = _component(hp)
    comp.int8_ckpt_pool = object()
    with pytest.raises(RuntimeError, match="int8 mamba checkpoint pool"):
        around_prepare_for_caching_req(lambda *a: None, comp, _req(hp), SimpleNamespace(mamba_value=None),
                                       10, True)


def test_startup_refuses_radix_features_that_bypass_the_pool():
    from sglang_replayssm.radix import startup_refusals

    ok = SimpleNamespace(disable_radix_cache=False, enable_hierarchical_cache=False,
                         enable_int8_mamba_checkpoint=False)
    assert startup_refusals(ok) == []
    bad = SimpleNamespace(disable_radix_cache=False, enable_hierarchical_cache=True,
                          enable_int8_mamba_checkpoint=True)
    msgs = startup_refusals(bad)
    assert len(msgs) == 2
    assert "--enable-hierarchical-cache" in msgs[0] and "--enable-int8-mamba-checkpoint" in msgs[1]
    assert startup_refusals(SimpleNamespace(**{**vars(bad), "disable_radix_cache": True})) == []


# ---------------------------------------------------------------------- fold_slot (the server's path)

SYNC_OPS = {"_local_scalar_dense", "item", "is_nonzero", "nonzero", "equal"}


class _HostReads(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the ops that read a device value on the host (a sync on a GPU), by name."""

    def __init__(self):
        super().__init__()
        self.reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in SYNC_OPS:
            self.reads.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _sr_pool(family: str = "mamba2"):
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape

    shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=8, n_groups=1, num_heads=2,
                                    head_dim=4, state_size=4, conv_kernel=4)
    params = Mamba2CacheParams(shape=shape, layers=[0, 1],
                               dtype=Mamba2StateDType(conv=torch.float32, temporal=torch.float16))
    pool = ReplayMambaPool(replay=ReplayPoolSpec(family=family, window=4, act_dtype=torch.float32,
                                                 stochastic_rounding=True),
                           size=6, spec_state_size=6, cache_params=params, mamba_layer_ids=[0, 1], device="cpu")
    g = torch.Generator().manual_seed(3)
    pool.mamba_cache.temporal.copy_(0.3 * torch.randn(pool.mamba_cache.temporal.shape, generator=g))
    for name, t in pool.rings.items():
        v = torch.randn(t.shape, generator=g)
        t.copy_(-(v.abs() * 0.2) if name in ("g", "dt") else (torch.sigmoid(v) if name == "beta" else v))
    if family == "mamba2":
        pool.fold_A = [-torch.rand(2, generator=torch.Generator().manual_seed(i)) - 0.1 for i in range(2)]
        pool.rings["dt"].abs_()
    return pool


def _state(pool) -> dict[str, torch.Tensor]:
    out = {n: t.clone() for n, t in pool.rings.items()}
    out |= {"temporal": pool.mamba_cache.temporal.clone(), "cursors": pool.cursors.clone()}
    if pool.sr_seed is not None:
        out["sr_seed"] = pool.sr_seed.clone()
    return out


def _same(a: dict, b: dict) -> list[str]:
    return [n for n in a if not torch.equal(a[n].view(torch.uint8) if a[n].is_floating_point() else a[n],
                                            b[n].view(torch.uint8) if b[n].is_floating_point() else b[n])]


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
@pytest.mark.parametrize("length", [0, 3])
def test_fold_slot_is_materialise_slot_bitwise(family: str, length: int):
    """``fold_slot`` (no host read, an empty ring skipped on the device) leaves the pool bit for bit
    as ``materialise_slot`` (host read, early return) does, stochastic-rounding counter included."""
    from sglang_replayssm.radix_materialise import fold_slot

    a, b = _sr_pool(family), _sr_pool(family)
    for p in (a, b):
        p.cursors[3] = torch.tensor([2, length], dtype=torch.int32)
        p.sr_seed.fill_(7)
    before = _state(a)
    assert materialise_slot(a, 3) == length
    fold_slot(b, torch.tensor(3))  # SGLang's 0-d req.mamba_pool_idx
    assert _same(_state(a), _state(b)) == []
    assert b.sr_seed.tolist() == [7 + (length > 0)]
    changed = _same(before, _state(b))
    if length == 0:
        assert changed == []  # nothing at all: checkpoint, rings, cursors, counter
    else:
        assert sorted(changed) == ["cursors", "sr_seed", "temporal"]
        assert b.cursors[3].tolist() == [(2 + length) % b.ring_spec.rows, 0]


@pytest.mark.parametrize("length", [0, 2])
def test_fold_slot_reads_nothing_on_the_host(monkeypatch: pytest.MonkeyPatch, length: int):
    """No op of ``fold_slot`` reads a device value on the host (the CPU fold reference, which does,
    is replaced by a recorder); an empty ring reaches every layer's launch as a padding row."""
    import replayssm_kernels as rk

    from sglang_replayssm.radix_materialise import fold_slot

    pool = _sr_pool("mamba2")
    pool.cursors[3] = torch.tensor([1, length], dtype=torch.int32)
    rows = []
    monkeypatch.setattr(rk, "mamba2_replay_decode_ref", lambda *a, **k: rows.append(a[10].clone()))
    tolist = []
    real_tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: tolist.append(1) or real_tolist(t))
    slot = torch.tensor(3)
    with _HostReads() as m:
        fold_slot(pool, slot)
    assert m.reads == [] and tolist == []
    assert [r.tolist() for r in rows] == [[3 if length else -1]] * 2
    assert pool.cursors[3].tolist() == [(1 + length) % pool.ring_spec.rows, 0]
    with pytest.raises(ValueError, match="expected one slot"):
        fold_slot(pool, torch.tensor([3, 4]))
    with pytest.raises(ValueError, match=r"slot expected in \[1, "):
        fold_slot(pool, 0)


def test_materialise_slot_reads_the_host_once(monkeypatch: pytest.MonkeyPatch):
    """The unfinished-insert path: one transfer (``tolist``) of slot and ``len``, no launch for an
    empty ring; a tensor slot out of range is still a ``ValueError``."""
    import replayssm_kernels as rk

    pool = _sr_pool("mamba2")
    pool.cursors[3] = torch.tensor([1, 0], dtype=torch.int32)
    launches = []
    monkeypatch.setattr(rk, "mamba2_replay_decode_ref", lambda *a, **k: launches.append(1))
    tolist = []
    real_tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: tolist.append(1) or real_tolist(t))
    with _HostReads() as m:
        assert materialise_slot(pool, torch.tensor(3)) == 0
    assert m.reads == [] and tolist == [1] and launches == []
    pool.cursors[3, 1] = 2
    assert materialise_slot(pool, torch.tensor([3])) == 2 and launches == [1, 1]
    assert pool.cursors[3].tolist() == [3, 0]
    with pytest.raises(ValueError, match=r"slot expected in \[1, "):
        materialise_slot(pool, torch.tensor(pool.cursors.shape[0]))
