"""``ReplayMambaPool`` on CPU: ring shapes and bytes, slot 0, cursor resets and the copy (fork) rule."""

from __future__ import annotations

import functools

import pytest
import torch

from sglang_replayssm.pool import ReplayMambaPool, ReplayPoolSpec
from sglang_replayssm.sizing import ring_rows, ring_spec, verify_flush_limit

SIZE = 6


def _params(family: str):
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape

    if family == "mamba2":  # H=8, P=16, N=16, G=2
        shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=128, n_groups=2, num_heads=8,
                                        head_dim=16, state_size=16, conv_kernel=4)
    else:  # GDN: HV=4, V=8, Hk=2, K=8
        shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=32, n_groups=2, num_heads=4,
                                        head_dim=8, state_size=8, conv_kernel=4)
    dtype = Mamba2StateDType(conv=torch.float32, temporal=torch.float32)
    return Mamba2CacheParams(shape=shape, layers=[0, 2, 4], dtype=dtype)


def _pool(family: str = "mamba2", window: int = 4, **extra) -> ReplayMambaPool:
    return ReplayMambaPool(
        replay=ReplayPoolSpec(family=family, window=window, act_dtype=torch.bfloat16),
        size=SIZE, spec_state_size=SIZE, cache_params=_params(family), mamba_layer_ids=[0, 2, 4],
        device="cpu", **extra,
    )


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_ring_shapes_and_bytes(family: str, caplog: pytest.LogCaptureFixture):
    caplog.set_level("INFO")
    pool = _pool(family)
    expected = {"mamba2": {"x": (3, 7, 8, 4, 16), "dt": (3, 7, 8, 4), "B": (3, 7, 2, 4, 16)},
                "gdn": {"u": (3, 7, 4, 4, 8), "k": (3, 7, 2, 4, 8), "v": (3, 7, 4, 4, 8), "g": (3, 7, 4, 4),
                        "beta": (3, 7, 4, 4)}}[family]
    assert {n: tuple(t.shape) for n, t in pool.rings.items()} == expected
    spec = ring_spec(family=family, temporal_shape=tuple(_params(family).shape.temporal),
                     conv_dim=_params(family).shape.conv[0][0], num_k_heads=2, num_layers=3, window=4,
                     act_dtype=torch.bfloat16)
    assert pool.replay_ring_bytes == spec.bytes_total(SIZE + 1)
    assert "ReplaySSM rings are allocated" in caplog.text
    assert pool.cursors.shape == (SIZE + 1, 2) and pool.cursors.dtype == torch.int32
    # SGLang's built-in cursor name stays unset: its gated resets / reads (host syncs) never run on our pool
    assert pool.replayssm_write_pos is None


def test_verify_flush_rule_and_ring_rows():
    """The served late rule flushes a verify row when ``len + T > max(L, T) + T``; GDN's ring holds
    ``max(L, T) + T`` rows (its window may wrap over the folded history), Mamba-2's ``T`` more (its
    one-launch verify keeps the window beside the history); decode-only rings hold ``L``."""
    assert verify_flush_limit(16, 4) == 20 and verify_flush_limit(2, 4) == 8
    assert ring_rows("gdn", 16, 4) == 20 and ring_rows("mamba2", 16, 4) == 24
    assert ring_rows("gdn", 2, 4) == 8 and ring_rows("mamba2", 2, 4) == 12
    assert ring_rows("gdn", 16) == ring_rows("mamba2", 16) == 16
    with pytest.raises(ValueError, match="family: expected one of"):
        ring_rows("rwkv", 16, 4)


def test_clear_resets_and_copy_forks_cursors_and_rings():
    pool = _pool()
    g = torch.Generator().manual_seed(1)
    for t in pool.rings.values():
        t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
    pool.cursors[1:] = torch.tensor([2, 3], dtype=torch.int32)
    pool.mamba_cache.temporal[:, 2] = 7.0
    pool.clear_slots(torch.tensor([1]))
    assert pool.cursors[1].tolist() == [0, 0] and pool.cursors[2].tolist() == [2, 3]
    pool.cursors[2] = torch.tensor([1, 2], dtype=torch.int32)
    before = {n: t.clone() for n, t in pool.rings.items()}
    # SGLang's call (no keyword) copies empty rings only: a source with records is refused, not dropped
    with pytest.raises(RuntimeError, match="copy_from of a slot with ring records"):
        pool.copy_from(torch.tensor([2]), torch.tensor([4]))
    pool.copy_from(torch.tensor([2]), torch.tensor([4]), carry_ring=True)
    # the destination is the source's logical state: checkpoint, ring rows and cursors
    assert pool.cursors[4].tolist() == [1, 2]
    assert pool.cursors[2].tolist() == [1, 2]  # the source keeps its ring
    assert torch.equal(pool.mamba_cache.temporal[:, 4], pool.mamba_cache.temporal[:, 2])
    for n, t in pool.rings.items():
        assert torch.equal(t[:, 4], before[n][:, 2]), n
        keep = [s for s in range(SIZE + 1) if s != 4]
        assert torch.equal(t[:, keep], before[n][:, keep]), n  # only the destination is written
    with pytest.raises(ValueError, match="as many destination as source"):
        pool.copy_from(torch.tensor([2, 3]), torch.tensor([4]))


def test_copy_of_an_empty_ring_copies_cursors_and_checkpoint_only():
    """SGLang's copies (copy-on-write from a tree slot, the no_buffer insert after the fold): the
    source's ring is empty, so only checkpoint, conv state and cursors move; no ring row is written."""
    pool = _pool()
    g = torch.Generator().manual_seed(2)
    for t in pool.rings.values():
        t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
    pool.mamba_cache.temporal.copy_(torch.randn(pool.mamba_cache.temporal.shape, generator=g))
    pool.cursors[1:] = torch.tensor([2, 3], dtype=torch.int32)
    pool.cursors[2] = torch.tensor([3, 0], dtype=torch.int32)
    rings = {n: t.clone() for n, t in pool.rings.items()}
    pool.copy_from(torch.tensor([2]), torch.tensor([5]))
    assert pool.cursors[5].tolist() == [3, 0]
    assert torch.equal(pool.mamba_cache.temporal[:, 5], pool.mamba_cache.temporal[:, 2])
    for i, c in enumerate(pool.mamba_cache.conv):
        assert torch.equal(c[:, 5], c[:, 2]), i
    for n, t in pool.rings.items():
        assert torch.equal(t, rings[n]), n
    assert [pool.cursors[s].tolist() for s in (1, 3, 4, 6)] == [[2, 3]] * 4


def test_offload_reload_round_trips_rings_and_cursors():
    pool = _pool()
    g = torch.Generator().manual_seed(0)
    for t in pool.rings.values():
        t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
    pool.cursors[3] = torch.tensor([1, 2], dtype=torch.int32)
    saved = pool.get_cpu_copy(torch.tensor(3))
    want = {n: t[:, 3].clone() for n, t in pool.rings.items()}
    pool.load_cpu_copy(saved, torch.tensor(5))
    assert pool.cursors[5].tolist() == [1, 2]
    for n, t in pool.rings.items():
        assert torch.equal(t[:, 5], want[n])


def test_refuses_builtin_replayssm():
    # (speculative pools: R = max(L, T) + T, checked in test_spec_verify.py)
    with pytest.raises(ValueError, match="built-in"):
        _pool(enable_linear_replayssm=True)


def test_hybrid_pool_alloc_then_deferred_clear_resets_the_cursor_of_a_reused_slot():
    """SGLang's alloc leaves a reused slot's cursors alone (no host sync: the pool does not expose
    ``replayssm_write_pos``) and marks it ``mamba_needs_clear``; the deferred ``clear_slots`` that
    SGLang runs before the slot's first forward resets them."""
    from types import SimpleNamespace

    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

    previous = HybridReqToTokenPool.__dict__["mamba_pool_cls"]
    HybridReqToTokenPool.mamba_pool_cls = functools.partial(
        ReplayMambaPool, replay=ReplayPoolSpec(family="mamba2", window=4, act_dtype=torch.float32))
    try:
        pool = HybridReqToTokenPool(
            size=4, mamba_size=SIZE, mamba_spec_state_size=4, max_context_len=64, device="cpu",
            enable_memory_saver=False, cache_params=_params("mamba2"), mamba_layer_ids=[0, 2, 4],
            enable_mamba_extra_buffer=False,
        )
    finally:
        HybridReqToTokenPool.mamba_pool_cls = previous
    assert isinstance(pool.mamba_pool, ReplayMambaPool)
    mp = pool.mamba_pool
    mp.cursors[1:] = torch.tensor([3, 3], dtype=torch.int32)  # stale cursors everywhere
    req = SimpleNamespace(mamba_pool_idx=None, req_pool_idx=None, mamba_needs_clear=False,
                          mamba_ping_pong_track_buffer=None)
    pool.alloc([req])
    s = int(req.mamba_pool_idx)
    assert req.mamba_needs_clear
    assert mp.cursors[s].tolist() == [3, 3]  # untouched by SGLang's alloc
    # ModelRunner._maybe_execute_deferred_mamba_cow_and_clear -> ScheduleBatch's collected clear indices
    mp.clear_slots(req.mamba_pool_idx.unsqueeze(0))
    assert mp.cursors[s].tolist() == [0, 0]
    assert all(mp.cursors[o].tolist() == [3, 3] for o in range(1, SIZE + 1) if o != s)
