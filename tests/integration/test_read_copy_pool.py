"""Split precision in ``ReplayMambaPool`` (CPU): the read copy's allocation, bytes, and its refresh on
every checkpoint write outside the decode kernels (clear, copy-on-write, reload, extend refresh,
radix materialisation).  Invariant checked throughout: every slot's copy (and fp8 scales) is
bit-identical to ``quantize_rows`` of its checkpoint; slots not written stay bit-identical."""

from __future__ import annotations

from types import SimpleNamespace

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


def _pool(read_dtype, family: str = "mamba2", ssm_dtype: torch.dtype = torch.float32,
          device: str = "cpu") -> ReplayMambaPool:
    return ReplayMambaPool(
        replay=ReplayPoolSpec(family=family, window=4, act_dtype=torch.bfloat16, read_dtype=read_dtype),
        size=SIZE, spec_state_size=SIZE, cache_params=_params(family, ssm_dtype), mamba_layer_ids=LAYERS,
        device=device,
    )


def _fill(pool: ReplayMambaPool, seed: int) -> None:
    """Random checkpoints (rows of very different magnitudes) with a consistent copy."""
    g = torch.Generator().manual_seed(seed)
    t = pool.mamba_cache.temporal
    mag = torch.exp2(torch.randint(-20, 20, t.shape[:-1], generator=g).float())[..., None]
    t.copy_((torch.randn(t.shape, generator=g) * mag).to(t.dtype))
    pool.refresh_read(torch.arange(SIZE + 1, device=t.device))


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
    if before[1] is not None:  # bitwise: NaN-poisoned scales compare equal
        assert torch.equal(pool.read_scale[:, keep].view(torch.int32), before[1][:, keep].view(torch.int32))


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
    pool.refresh_read(torch.tensor([3, -1]), layer_idx=1)  # -1: padding, writes nothing
    _assert_copy_follows(pool, list(range(SIZE + 1)))
    changed = [(layer, s) for layer in range(3) for s in range(SIZE + 1)
               if not torch.equal(pool.read_state[layer, s].view(torch.uint8), before[0][layer, s].view(torch.uint8))]
    assert changed == [(1, 3)]


def _poison(pool: ReplayMambaPool, slots) -> None:
    """NaN into the copy (and scales) of ``slots``: a later refresh must write every byte, or none."""
    pool.read_state[:, slots] = torch.tensor(float("nan")).to(pool.read_state.dtype)
    if pool.read_scale is not None:
        pool.read_scale[:, slots] = float("nan")


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
@pytest.mark.parametrize("read_dtype", READ)
def test_refresh_padding_writes_nothing(family: str, read_dtype: torch.dtype):
    """``-1`` entries touch nothing, the null slot 0's copy included (the unfused code clamped them to
    slot 0 and rewrote it); named slots are written whole (NaN-poisoned before), in every layer or one."""
    pool = _pool(read_dtype, family)
    _fill(pool, 5)
    _poison(pool, [0, 2, 5])
    before = _snapshot(pool)
    pool.refresh_read(torch.tensor([-1, 2, -1], dtype=torch.int32))
    _assert_copy_follows(pool, [2])
    _assert_untouched(pool, before, [2])  # slot 0 (and 5) still NaN
    pool.mamba_cache.temporal[2, 5] += 1.0
    pool.refresh_read(torch.tensor([[5], [-1]]), layer_idx=2)  # any shape, flattened
    q, scale = quantize_rows(pool.mamba_cache.temporal[2, 5], read_dtype)
    assert torch.equal(pool.read_state[2, 5].view(torch.uint8), q.view(torch.uint8))
    assert torch.isnan(pool.read_state[:2, 5].float()).all() and torch.isnan(pool.read_state[:, 0].float()).all()
    if scale is not None:
        assert torch.equal(pool.read_scale[2, 5], scale) and torch.isnan(pool.read_scale[:, 0]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["mamba2", "gdn"])
@pytest.mark.parametrize("ssm_dtype,read_dtype", [(torch.float32, torch.bfloat16), (torch.float32, torch.float16),
                                                   (torch.float32, torch.float8_e4m3fn),
                                                   (torch.bfloat16, torch.float8_e4m3fn)])
def test_gpu_refresh_takes_the_kernel(family: str, ssm_dtype: torch.dtype, read_dtype: torch.dtype,
                                      launch_spy_module):
    """A CUDA pool refreshes through the fused kernel (one launch per call, allocation included),
    bit-identical to ``quantize_rows``; padding writes nothing."""
    spy = launch_spy_module
    pool = _pool(read_dtype, family, ssm_dtype, device="cuda")
    assert len(spy.launches) == 1  # the allocation's fill
    _assert_copy_follows(pool, list(range(SIZE + 1)))
    _fill(pool, 6)
    _poison(pool, [0, 3, 4])
    before = _snapshot(pool)
    pool.refresh_read(torch.tensor([3, -1, 4], device="cuda"))
    pool.refresh_read(torch.tensor([-1], device="cuda"), layer_idx=1)
    assert len(spy.launches) == 4
    _assert_copy_follows(pool, [3, 4])
    _assert_untouched(pool, before, [3, 4])


@pytest.fixture
def launch_spy_module(monkeypatch: pytest.MonkeyPatch):
    """Count launches of the refresh kernel (the pool's CUDA path)."""
    from replayssm_kernels.read_copy_refresh import kernel as mod

    launches = []
    kern = mod._refresh_read_copy_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                launches.append(tuple(grid))
                return kern[grid](*args, **kw)
            return launch

    monkeypatch.setattr(mod, "_refresh_read_copy_kernel", Spy())
    return SimpleNamespace(launches=launches)


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
