"""Split precision in ``ReplayMambaPool`` (CPU): the read copy's allocation, bytes, and its refresh on
every checkpoint write outside the decode kernels (clear, copy-on-write, reload, extend refresh,
radix materialisation).  Invariant checked throughout: every slot's copy (and fp8 scales) is
bit-identical to ``quantize_rows`` of its checkpoint; slots not written stay bit-identical."""

from __future__ import annotations

import pytest
import torch
from replayssm_kernels.mamba2_decode.read_copy import quantize_rows

from sglang_replayssm.pool import ReplayMambaPool, ReplayPoolSpec, read_copy_bytes_per_slot

SIZE = 6
LAYERS = [0, 2, 4]
READ = [torch.bfloat16, torch.float16, torch.float8_e4m3fn]


def _params(family: str, ssm_dtype: torch.dtype = torch.float32):
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape

    if family == "mamba2":  # H=8, P=16, N=16, G=2
        shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=128, n_groups=2, num_heads=8,
                                        head_dim=16, state_size=16, conv_kernel=4)
    else:  # GDN: HV=4, V=8, Hk=2, K=8
        shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=32, n_groups=2, num_heads=4,
                                        head_dim=8, state_size=8, conv_kernel=4)
    return Mamba2CacheParams(shape=shape, layers=LAYERS,
                             dtype=Mamba2StateDType(conv=torch.float32, temporal=ssm_dtype))


def _pool(read_dtype, family: str = "mamba2", ssm_dtype: torch.dtype = torch.float32) -> ReplayMambaPool:
    return ReplayMambaPool(
        replay=ReplayPoolSpec(family=family, window=4, act_dtype=torch.bfloat16, read_dtype=read_dtype),
        size=SIZE, spec_state_size=SIZE, cache_params=_params(family, ssm_dtype), mamba_layer_ids=LAYERS,
        device="cpu",
    )


def _fill(pool: ReplayMambaPool, seed: int) -> None:
    """Random checkpoints (rows of very different magnitudes) with a consistent copy."""
    g = torch.Generator().manual_seed(seed)
    t = pool.mamba_cache.temporal
    mag = torch.exp2(torch.randint(-20, 20, t.shape[:-1], generator=g).float())[..., None]
    t.copy_((torch.randn(t.shape, generator=g) * mag).to(t.dtype))
    pool.refresh_read(torch.arange(SIZE + 1))


def _assert_copy_follows(pool: ReplayMambaPool, slots) -> None:
    q, scale = quantize_rows(pool.mamba_cache.temporal[:, slots], pool.read_state.dtype)
    assert torch.equal(pool.read_state[:, slots].view(torch.uint8), q.view(torch.uint8))
    if scale is None:
        assert pool.read_scale is None
    else:
        assert torch.equal(pool.read_scale[:, slots], scale)


def _snapshot(pool: ReplayMambaPool):
    return pool.read_state.clone(), None if pool.read_scale is None else pool.read_scale.clone()


def _assert_untouched(pool: ReplayMambaPool, before, written: list[int]) -> None:
    keep = [s for s in range(SIZE + 1) if s not in written]
    assert torch.equal(pool.read_state[:, keep].view(torch.uint8), before[0][:, keep].view(torch.uint8))
    if before[1] is not None:
        assert torch.equal(pool.read_scale[:, keep], before[1][:, keep])


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
@pytest.mark.parametrize("read_dtype", READ)
def test_allocation_shapes_bytes_and_log(family: str, read_dtype: torch.dtype, caplog: pytest.LogCaptureFixture):
    caplog.set_level("INFO")
    pool = _pool(read_dtype, family)
    temporal = pool.mamba_cache.temporal
    assert pool.read_state.shape == temporal.shape and pool.read_state.dtype == read_dtype
    if read_dtype == torch.float8_e4m3fn:
        assert pool.read_scale.shape == temporal.shape[:-1] and pool.read_scale.dtype == torch.float32
    else:
        assert pool.read_scale is None
    per_slot = read_copy_bytes_per_slot(tuple(_params(family).shape.temporal), len(LAYERS), read_dtype)
    elems = temporal[0, 0].numel()
    expect = len(LAYERS) * (elems * read_dtype.itemsize + (4 * elems // temporal.shape[-1]
                                                           if read_dtype == torch.float8_e4m3fn else 0))
    assert per_slot == expect
    assert pool.replay_read_bytes == per_slot * (SIZE + 1)
    assert "ReplaySSM read copy is allocated" in caplog.text and f"({per_slot} B per slot)" in caplog.text
    _assert_copy_follows(pool, list(range(SIZE + 1)))  # allocated from the (zero) checkpoint


def test_no_copy_by_default():
    pool = _pool(None)
    assert pool.read_state is None and pool.read_scale is None and pool.replay_read_bytes == 0
    assert pool.layer_read_copy(0) == {}
    assert read_copy_bytes_per_slot((8, 16, 16), 3, None) == 0
    pool.refresh_read(torch.tensor([1]))  # no-op


def test_copy_of_the_checkpoint_dtype_is_refused():
    with pytest.raises(ValueError, match="checkpoint's own dtype torch.bfloat16.*--replayssm-read-dtype same"):
        _pool(torch.bfloat16, ssm_dtype=torch.bfloat16)


@pytest.mark.parametrize("read_dtype", READ)
def test_layer_views_and_refresh_one_layer(read_dtype: torch.dtype):
    pool = _pool(read_dtype)
    _fill(pool, 0)
    view = pool.layer_read_copy(1)
    assert view["read_state"].data_ptr() == pool.read_state[1].data_ptr()
    assert (view["read_scale"] is None) == (read_dtype != torch.float8_e4m3fn)
    before = _snapshot(pool)
    pool.mamba_cache.temporal[1, 3] *= 3.0  # an extend wrote layer 1 of slot 3
    pool.refresh_read(torch.tensor([3, -1]), layer_idx=1)  # -1: padding, goes to the null slot
    _assert_copy_follows(pool, list(range(SIZE + 1)))
    changed = [(layer, s) for layer in range(3) for s in range(SIZE + 1)
               if not torch.equal(pool.read_state[layer, s].view(torch.uint8), before[0][layer, s].view(torch.uint8))]
    assert changed == [(1, 3)]


@pytest.mark.parametrize("read_dtype", READ)
def test_clear_and_copy_on_write_refresh_the_destination(read_dtype: torch.dtype):
    pool = _pool(read_dtype)
    _fill(pool, 1)
    before = _snapshot(pool)
    pool.clear_slots(torch.tensor([1]))
    assert torch.all(pool.mamba_cache.temporal[:, 1] == 0)
    _assert_copy_follows(pool, [1])
    _assert_untouched(pool, before, [1])
    # A source whose checkpoint was written behind the pool (SGLang's radix track-copy): its copy is
    # stale, and copy-on-write must not carry it.
    pool.mamba_cache.temporal[:, 2] = -pool.mamba_cache.temporal[:, 2] * 5.0
    before = _snapshot(pool)
    pool.copy_from(torch.tensor([2]), torch.tensor([4]))
    assert torch.equal(pool.mamba_cache.temporal[:, 4], pool.mamba_cache.temporal[:, 2])
    _assert_copy_follows(pool, [4])
    _assert_untouched(pool, before, [4])


@pytest.mark.parametrize("read_dtype", READ)
def test_offload_reload_restores_the_copy(read_dtype: torch.dtype):
    pool = _pool(read_dtype)
    _fill(pool, 2)
    saved = pool.get_cpu_copy(torch.tensor(3))
    want = _snapshot(pool)
    pool.mamba_cache.temporal[:, 3] = 0.0  # the slot is reused before the reload
    pool.refresh_read(torch.tensor([3]))
    before = _snapshot(pool)
    pool.load_cpu_copy(saved, torch.tensor(5))
    assert torch.equal(pool.read_state[:, 5].view(torch.uint8), want[0][:, 3].view(torch.uint8))
    if want[1] is not None:
        assert torch.equal(pool.read_scale[:, 5], want[1][:, 3])
    _assert_untouched(pool, before, [5])


def test_radix_materialise_refreshes_the_copy():
    from sglang_replayssm.radix_materialise import materialise_slot

    pool = _pool(torch.float8_e4m3fn, family="gdn")
    _fill(pool, 3)
    g = torch.Generator().manual_seed(4)
    for name, t in pool.rings.items():
        t.copy_((torch.rand(t.shape, generator=g) * (0.5 if name in ("g", "beta") else 1.0)
                 - (0.5 if name == "g" else 0.0)).to(t.dtype))
    pool.cursors[2] = torch.tensor([1, 3], dtype=torch.int32)
    before_state = pool.mamba_cache.temporal[:, 2].clone()
    before = _snapshot(pool)
    assert materialise_slot(pool, 2) == 3
    assert not torch.equal(pool.mamba_cache.temporal[:, 2], before_state)  # the fold wrote the checkpoint
    _assert_copy_follows(pool, [2])
    _assert_untouched(pool, before, [2])


@pytest.mark.parametrize("read_dtype", READ)
def test_memory_budget_charges_what_the_pool_allocates(read_dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch):
    """``hooks/pool.ring_bytes_per_slot`` (the per-slot bytes the budget hook charges) grows by exactly
    the copy's bytes per slot that the pool allocates."""
    from types import SimpleNamespace

    from sglang_replayssm.hooks import pool as pool_hooks

    params = _params("mamba2")
    configurator = SimpleNamespace(
        mambaish_config=SimpleNamespace(mamba2_cache_params=params),
        layer_info=SimpleNamespace(start_layer=0, end_layer=5),
        server_args=SimpleNamespace(max_speculative_num_draft_tokens=None),
    )
    charged = {}
    for dtype in (None, read_dtype):
        spec = ReplayPoolSpec(family="mamba2", window=4, act_dtype=torch.bfloat16, read_dtype=dtype)
        monkeypatch.setattr(pool_hooks, "_spec_for", lambda _c, spec=spec: spec)
        charged[dtype] = pool_hooks.ring_bytes_per_slot(configurator)
    pool = _pool(read_dtype)
    assert charged[read_dtype] - charged[None] == pool.replay_read_bytes // (SIZE + 1) > 0
    assert charged[None] == pool.ring_spec.bytes_per_slot
