"""``ReplayMambaPool``'s speculative state against SGLang 0.5.17's own ``MambaPool`` construction.

With ``--replayssm-verify replay`` (linear drafts) the pool builds SGLang's ``MambaPool`` without
speculation and adds SGLang's speculative state itself (``_install_speculative_state``), so SGLang's
per-draft SSM buffer ``intermediate_ssm`` (``T`` full states per row) is never allocated, not even for
a moment at start-up.  Checked here:

- the CUDA path, on the meta device (no GPU on CI): the meta device takes the pool's non-CPU branch,
  the one a CUDA pool takes, with SGLang's module flags ``_is_cpu`` / ``_is_npu`` False as on a GPU
  server.  Every tensor created while the pool is built is recorded (a ``TorchDispatchMode``: factory
  calls, views and copies alike) and none has ``intermediate_ssm``'s shape or size; the speculative
  attributes SGLang's verify and commit read (``mamba_cache`` a ``SpeculativeState``, its
  ``intermediate_conv_window`` views with their strides over ``_intermediate_conv_window_phys``,
  ``conv_window_axis``) equal those of SGLang's own pool, whose ``device="cuda"`` allocations are sent
  to the meta device for the comparison only (the replay pool's are not redirected: a ``"cuda"`` one
  would fail here), and ``mem_usage`` is SGLang's less ``intermediate_ssm``;
- ``auto`` keeps SGLang's construction (its ``intermediate_ssm`` is there, and was recorded);
- a CPU pool takes SGLang's CPU layout (dense conv windows), with ``intermediate_ssm`` only when the
  snapshot verify may read it;
- on a GPU (``gpu``): the peak of the bytes requested from the CUDA allocator while a replay-only pool
  is built is what the pool holds afterwards, exactly its ``mem_usage``, far below SGLang's pool with
  ``intermediate_ssm``, and the layout equals SGLang's real CUDA pool.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from sglang_replayssm.pool import ReplayMambaPool, ReplayPoolSpec

GIB = 1 << 30
LAYERS = [0, 2, 4]
SIZE = 6


def _params(family: str, *, large: bool = False):
    """Mamba-2 / GDN cache params as SGLang builds them (bf16 conv, fp32 state); ``large``: a state big
    enough that the allocator's rounding is negligible beside ``intermediate_ssm`` (GPU test)."""
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape

    if family == "mamba2":  # H, P, N, G
        h, p, n, g = (32, 64, 128, 2) if large else (8, 16, 16, 2)
        shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=h * p, n_groups=g, num_heads=h,
                                        head_dim=p, state_size=n, conv_kernel=4)
    else:  # GDN: HV, V, Hk, K
        hv, v, hk, k = (32, 64, 16, 128) if large else (4, 8, 2, 8)
        shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=hv * v, n_groups=hk, num_heads=hv,
                                        head_dim=v, state_size=k, conv_kernel=4)
    dtype = Mamba2StateDType(conv=torch.bfloat16, temporal=torch.float32)
    return Mamba2CacheParams(shape=shape, layers=LAYERS, dtype=dtype)


def _kwargs(family: str, device: str, T: int, *, large: bool = False, size: int = SIZE) -> dict:
    return dict(size=size, spec_state_size=size, cache_params=_params(family, large=large), mamba_layer_ids=LAYERS,
                device=device, speculative_num_draft_tokens=T, speculative_eagle_topk=1)


def _replay_pool(family: str, verify: str, monkeypatch, **kw) -> ReplayMambaPool:
    monkeypatch.setenv("SGLANG_REPLAYSSM_CONFIG", json.dumps({"backend": "replay", "verify": verify}))
    return ReplayMambaPool(replay=ReplayPoolSpec(family=family, window=8, act_dtype=torch.bfloat16), **kw)


def _ssm_shape(kw: dict) -> tuple[int, ...]:
    """``intermediate_ssm``'s shape in SGLang 0.5.17: ``[layers, spec_state_size + 1, T, *temporal]``."""
    return (len(kw["mamba_layer_ids"]), kw["spec_state_size"] + 1, kw["speculative_num_draft_tokens"],
            *kw["cache_params"].shape.temporal)


class _Created(TorchDispatchMode):
    """Records every tensor an op returns while active: ``(op, shape, dtype, bytes)``."""

    def __init__(self) -> None:
        super().__init__()
        self.tensors: list[tuple[str, tuple[int, ...], torch.dtype, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.tensors.append((str(func), tuple(t.shape), t.dtype, t.numel() * t.element_size()))
        return out


@pytest.fixture
def gpu_flags(monkeypatch):
    """SGLang's module flags as on a GPU server (``MambaPool.__init__`` and the replay pool read them)."""
    from sglang.srt.mem_cache import memory_pool as mp

    monkeypatch.setattr(mp, "_is_cpu", False)
    monkeypatch.setattr(mp, "_is_npu", False)
    return mp


def _sglang_pool(mp, monkeypatch, kw: dict):
    """SGLang's own ``MambaPool`` for ``kw``, its hard-coded ``device="cuda"`` allocations on the meta device."""
    zeros = torch.zeros
    with monkeypatch.context() as m:
        m.setattr(mp.torch, "zeros", lambda *a, device=None, **k: zeros(*a, device="meta" if device == "cuda"
                                                                         else device, **k))
        return mp.MambaPool(**kw)


def _assert_same_speculative_layout(ours, stock) -> None:
    """The speculative attributes SGLang reads, as SGLang's own pool has them (shape, strides, dtype, views)."""
    from sglang.srt.mem_cache.memory_pool import MambaPool

    a, b = ours.mamba_cache, stock.mamba_cache
    assert type(a) is MambaPool.SpeculativeState and type(b) is MambaPool.SpeculativeState
    assert a.temporal.shape == b.temporal.shape and [c.shape for c in a.conv] == [c.shape for c in b.conv]
    assert ours.conv_window_axis == stock.conv_window_axis
    assert len(a.intermediate_conv_window) == len(b.intermediate_conv_window) == len(a.conv)
    pairs = {"intermediate_conv_window": (a.intermediate_conv_window, b.intermediate_conv_window),
             "_intermediate_conv_window_phys": (ours._intermediate_conv_window_phys,
                                                stock._intermediate_conv_window_phys)}
    for name, (mine, theirs) in pairs.items():
        for x, y in zip(mine, theirs, strict=True):
            assert (x.shape, x.stride(), x.storage_offset(), x.dtype) == (y.shape, y.stride(), y.storage_offset(),
                                                                           y.dtype), name
    for view, phys in zip(a.intermediate_conv_window, ours._intermediate_conv_window_phys, strict=True):
        assert view is phys or view._base is phys  # dense: the buffer itself; deduplicated: a view of it
    for f in ("replayssm_d", "replayssm_k", "replayssm_g", "replayssm_rawv", "replayssm_rawk", "replayssm_beta"):
        assert getattr(a, f) is None
    # SGLang's readers: the per-layer view and the all-layers getter
    layer = ours.mamba2_layer_cache(1)
    assert layer.intermediate_conv_window[0].shape == b.intermediate_conv_window[0].shape[1:]
    assert ours.get_speculative_mamba2_params_all_layers() is a


def _requested(stat: str = "current") -> int:
    """Bytes the CUDA caching allocator was asked for (``torch.cuda.memory_stats``' ``requested_bytes``):
    ``memory_allocated`` counts whole blocks instead, e.g. the 1 MiB tail of a 99 MiB tensor's 2 MiB-rounded
    segment (measured on the H200: 1,048,824 B over the pool's own bytes for Mamba-2)."""
    return torch.cuda.memory_stats()[f"requested_bytes.all.{stat}"]


def _plugin_bytes(pool: ReplayMambaPool) -> int:
    return pool.replay_ring_bytes + pool.replay_read_bytes


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
@pytest.mark.parametrize("T", [2, 4])
def test_replay_only_cuda_path_never_allocates_the_per_draft_ssm_buffer(family: str, T: int, gpu_flags, monkeypatch,
                                                                        caplog):
    caplog.set_level("INFO")
    kw = _kwargs(family, "meta", T)
    ssm_shape = _ssm_shape(kw)
    ssm_bytes = math.prod(ssm_shape) * 4
    with _Created() as stock_seen:
        stock = _sglang_pool(gpu_flags, monkeypatch, kw)
    # the recorder does see SGLang's per-draft buffer when it is made
    assert stock.mamba_cache.intermediate_ssm.shape == ssm_shape
    assert any(shape == ssm_shape for _, shape, _, _ in stock_seen.tensors)
    with _Created() as seen:
        pool = _replay_pool(family, "replay", monkeypatch, **kw)
    assert pool.mamba_cache.intermediate_ssm is None
    assert not [t for t in seen.tensors if t[1] == ssm_shape or t[3] >= ssm_bytes], "per-draft SSM buffer allocated"
    assert all(t.device.type == "meta" for t in (*pool.mamba_cache.intermediate_conv_window,
                                                  *pool._intermediate_conv_window_phys))
    _assert_same_speculative_layout(pool, stock)
    # SGLang's accounting (windows at their physical size) less intermediate_ssm, plus the plug-in's own bytes
    assert round((pool.mem_usage * GIB)) - _plugin_bytes(pool) == round(stock.mem_usage * GIB) - ssm_bytes
    assert "conv windows deduplicated, intermediate_ssm not allocated" in caplog.text


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_auto_keeps_sglangs_construction(family: str, gpu_flags, monkeypatch):
    kw = _kwargs(family, "meta", 4)
    stock = _sglang_pool(gpu_flags, monkeypatch, kw)
    zeros = torch.zeros
    monkeypatch.setattr(gpu_flags.torch, "zeros", lambda *a, device=None, **k: zeros(
        *a, device="meta" if device == "cuda" else device, **k))
    with _Created() as seen:
        pool = _replay_pool(family, "auto", monkeypatch, **kw)
    assert pool.mamba_cache.intermediate_ssm.shape == _ssm_shape(kw)
    assert any(shape == _ssm_shape(kw) for _, shape, _, _ in seen.tensors)
    _assert_same_speculative_layout(pool, stock)
    assert round(pool.mem_usage * GIB) - _plugin_bytes(pool) == round(stock.mem_usage * GIB)


@pytest.mark.parametrize("verify", ["replay", "auto"])
def test_cpu_pool_takes_sglangs_cpu_layout(verify: str, gpu_flags, monkeypatch):
    """A CPU pool's layout differs from CUDA's: dense conv windows, as SGLang lays them out for a CPU."""
    kw = _kwargs("mamba2", "cpu", 4)
    monkeypatch.setattr(gpu_flags, "_is_cpu", True)
    stock = _sglang_pool(gpu_flags, monkeypatch, {**kw, "device": "meta"})  # SGLang's CPU rule, on meta
    monkeypatch.setattr(gpu_flags, "_is_cpu", False)  # the CPU device alone decides for the replay pool
    with _Created() as seen:
        pool = _replay_pool("mamba2", verify, monkeypatch, **kw)
    _assert_same_speculative_layout(pool, stock)
    assert all(v is p for v, p in zip(pool.mamba_cache.intermediate_conv_window, pool._intermediate_conv_window_phys,
                                       strict=True))
    assert all(t.device.type == "cpu" for t in pool.mamba_cache.intermediate_conv_window)
    ssm = pool.mamba_cache.intermediate_ssm
    ssm_shape = _ssm_shape(kw)
    if verify == "replay":
        assert ssm is None and not [t for t in seen.tensors if t[1] == ssm_shape]
    else:
        ref = stock.mamba_cache.intermediate_ssm
        assert (ssm.shape, ssm.stride(), ssm.dtype, ssm.device.type) == (ref.shape, ref.stride(), ref.dtype, "cpu")
    dropped = math.prod(ssm_shape) * 4 if ssm is None else 0
    assert round(pool.mem_usage * GIB) - _plugin_bytes(pool) == round(stock.mem_usage * GIB) - dropped


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_replay_only_pool_on_cuda_peaks_at_what_it_holds(family: str, monkeypatch):
    """On the GPU: building a replay-only pool never needs SGLang's per-draft buffer, not even for a moment."""
    from sglang.srt.mem_cache.memory_pool import MambaPool

    kw = _kwargs(family, "cuda", 4, large=True, size=32)
    ssm_bytes = math.prod(_ssm_shape(kw)) * 4
    torch.cuda.synchronize()
    base = _requested()
    torch.cuda.reset_peak_memory_stats()
    pool = _replay_pool(family, "replay", monkeypatch, **kw)
    torch.cuda.synchronize()
    peak, held = _requested("peak") - base, _requested() - base
    assert pool.mamba_cache.intermediate_ssm is None
    assert pool.mamba_cache.temporal.is_cuda and all(w.is_cuda for w in pool.mamba_cache.intermediate_conv_window)
    assert peak == held  # no transient: the peak is what the pool keeps
    assert held == round(pool.mem_usage * GIB)  # its accounting is exactly what it asked the allocator for

    torch.cuda.reset_peak_memory_stats()
    base = _requested()
    stock = MambaPool(**kw)  # SGLang's own, on the real GPU
    torch.cuda.synchronize()
    stock_peak = _requested("peak") - base
    print(f"{family}: replay-only pool peak {peak / 2**20:.1f} MiB, SGLang's pool {stock_peak / 2**20:.1f} MiB "
          f"(intermediate_ssm {ssm_bytes / 2**20:.1f} MiB)")
    assert stock_peak >= round(stock.mem_usage * GIB) and stock.mamba_cache.intermediate_ssm.nbytes == ssm_bytes
    assert peak < stock_peak - ssm_bytes + _plugin_bytes(pool) + (1 << 20)
    _assert_same_speculative_layout(pool, stock)
