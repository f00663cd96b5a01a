"""Serving plumbing of ``--enable-mamba-cache-stochastic-rounding`` with ``--ssm-backend replay`` (CPU).

The pool owns one device counter (``sr_seed``), advanced once per forward by both backends'
metadata builds (eager, and inside a captured CUDA graph for decode and verify) and by radix
materialisation; the layers pass it with their pool layer index to the kernels. Checked here on CPU
with the plain-torch references standing in for the kernels (same signatures): the pool fields and
their refusals, the per-forward advance, the GDN decode path end to end at backend level (every
flushed checkpoint is ``round_slot_sr_ref`` of the fp32 fold with that forward's counter and the
layer's pool index), the Mamba-2 layer's kernel keywords, radix materialisation, and the pool hook's flag (the startup checks:
``test_backends.py``).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from replayssm_kernels.stochastic_round import round_slot_sr_ref
from sglang_replayssm.metadata import GraphBuffers, GraphMetadataMixin
from sglang_replayssm.pool import ReplayMambaPool, ReplayPoolSpec
from tests.integration.test_pool import SIZE


def _params(family: str, temporal: torch.dtype):
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType

    from tests.integration.test_pool import _params as fp32_params

    p = fp32_params(family)
    return Mamba2CacheParams(shape=p.shape, layers=p.layers,
                             dtype=Mamba2StateDType(conv=torch.float32, temporal=temporal))


def _pool(family: str, *, sr: bool, temporal: torch.dtype = torch.float16, window: int = 4,
          read_dtype: torch.dtype | None = None) -> ReplayMambaPool:
    return ReplayMambaPool(
        replay=ReplayPoolSpec(family=family, window=window, act_dtype=torch.float32, read_dtype=read_dtype,
                              stochastic_rounding=sr),
        size=SIZE, spec_state_size=SIZE, cache_params=_params(family, temporal), mamba_layer_ids=[0, 2, 4],
        device="cpu",
    )


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_pool_counter_and_kernel_keywords(family):
    pool = _pool(family, sr=True)
    assert pool.sr_seed.dtype == torch.int64 and pool.sr_seed.tolist() == [0]
    kw = pool.layer_rounding(2)
    assert kw["sr_seed"] is pool.sr_seed and kw["sr_layer"] == 2
    pool.advance_rounding()
    pool.advance_rounding()
    assert pool.sr_seed.tolist() == [2]
    off = _pool(family, sr=False)
    assert off.sr_seed is None and off.layer_rounding(2) == {}
    off.advance_rounding()  # a no-op


def test_pool_refuses_sr_without_an_fp16_checkpoint():
    for dtype in (torch.float32, torch.bfloat16):
        with pytest.raises(ValueError, match="stochastic rounding stores an fp16 checkpoint"):
            _pool("gdn", sr=True, temporal=dtype)


# ------------------------------------------------------------------------------------ metadata


class _SGLangBase:
    """Stands in for SGLang's backend under the mixins (their ``super()`` calls land here)."""

    def init_forward_metadata_in_graph(self, forward_batch):
        pass

    def init_cuda_graph_state(self, max_bs, max_num_tokens):
        pass


def test_graph_metadata_advances_the_counter_once_per_replay():
    """``init_forward_metadata_in_graph`` (recorded in the captured graph) advances the counter
    once per decode forward and once per verify forward, beside the cursor step."""
    from sglang_replayssm.spec import VerifyGraphBuffers, VerifyMetadataMixin

    class Backend(VerifyMetadataMixin, GraphMetadataMixin, _SGLangBase):
        pass

    pool = _pool("gdn", sr=True)
    be = Backend()
    be.pool, be.window, be.rows, be.num_tokens = pool, 4, pool.ring_spec.rows, 0
    slots = torch.tensor([3, -1], dtype=torch.int32)
    be._graph = GraphBuffers(2, "cpu")
    be.state_indices_list = [slots[:1], slots]
    be._graph_bs, be._graph_verify_bs = 2, None
    fb = SimpleNamespace(mamba_track_mask=None)
    be.init_forward_metadata_in_graph(fb)
    assert pool.sr_seed.tolist() == [1] and pool.cursors[3].tolist() == [0, 1]
    # a verify forward (T = 2) in a graph: the verify snapshot and one advance
    be.num_tokens, be.rows = 2, 6  # the cursor snapshot only: R >= L + T
    be._verify_graph = VerifyGraphBuffers(2, 2, "cpu")
    be._graph_verify_bs = 2
    be.forward_metadata = SimpleNamespace(mamba_cache_indices=slots)
    be.verify_plan = None
    be.init_forward_metadata_in_graph(fb)
    assert pool.sr_seed.tolist() == [2]


# ------------------------------------------------------------------------------------- GDN path


def _gdn_layer(HV=4, V=8, Hk=2, K=8, layer_id=2):
    conv_weights = 0.5 * torch.randn(2 * Hk * K + HV * V, 4, generator=torch.Generator().manual_seed(2))
    return SimpleNamespace(layer_id=layer_id, conv_weights=conv_weights, bias=None, activation="silu",
                           q_dim=Hk * K, k_dim=Hk * K, v_dim=HV * V, num_q_heads=Hk, head_q_dim=K,
                           num_k_heads=Hk, head_k_dim=K, num_v_heads=HV, head_v_dim=V,
                           A_log=torch.log(torch.linspace(0.5, 2.0, HV)), dt_bias=torch.full((HV,), -2.0))


def _gdn_backend(monkeypatch, pool: ReplayMambaPool):
    """A ReplayGDNAttnBackend without SGLang's constructor, whose SGLang-side metadata is a stub."""
    import replayssm_kernels
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend

    from sglang_replayssm import gdn

    def stock_metadata(self, forward_batch):
        self.forward_metadata = SimpleNamespace(mamba_cache_indices=forward_batch.slots)

    monkeypatch.setattr(GDNAttnBackend, "init_forward_metadata", stock_metadata)
    be = gdn.ReplayGDNAttnBackend.__new__(gdn.ReplayGDNAttnBackend)
    be.pool, be.window, be.rows = pool, pool.replay.window, pool.ring_spec.rows
    be._decode = replayssm_kernels.gdn_replay_decode_ref
    be._graph_bs = None
    lmap = {0: 0, 2: 1, 4: 2}
    be.req_to_token_pool = SimpleNamespace(mamba_map=lmap,
                                           mamba2_layer_cache=lambda lid: pool.mamba2_layer_cache(lmap[lid]))
    be._track_mamba_state_decode = lambda *a, **k: None
    return be


def _decode_batch(slots: torch.Tensor) -> SimpleNamespace:
    mode = SimpleNamespace(is_target_verify=lambda: False, is_decode_or_idle=lambda: True,
                           is_mixed=lambda: False)
    return SimpleNamespace(forward_mode=mode, mamba_track_mask=None, slots=slots)


def test_gdn_decode_stores_each_flush_with_that_forwards_bits(monkeypatch):
    """Ten decode forwards of two requests through ``init_forward_metadata`` + ``forward_decode`` (CPU
    path) on an fp16 pool with SR, beside the same backend on an fp32 twin synced to the fp16
    values before every forward: after each forward every flushed checkpoint (both layers) is
    ``round_slot_sr_ref`` of the twin's fp32 fold, keyed by that forward's counter and the layer's
    pool index; non-flushed checkpoints are unchanged."""
    pool16 = _pool("gdn", sr=True)
    pool32 = _pool("gdn", sr=False, temporal=torch.float32)
    be16, be32 = _gdn_backend(monkeypatch, pool16), _gdn_backend(monkeypatch, pool32)
    g = torch.Generator().manual_seed(0)
    pool16.mamba_cache.temporal.copy_(0.3 * torch.randn(pool16.mamba_cache.temporal.shape, generator=g))
    layers = [_gdn_layer(layer_id=2), _gdn_layer(layer_id=4)]
    HV, Hk, K, V = 4, 2, 8, 8
    slots = torch.tensor([3, 5], dtype=torch.int32)
    flushes = 0
    for step in range(10):
        # the twin starts the forward from the fp16 pool's exact values
        pool32.mamba_cache.temporal.copy_(pool16.mamba_cache.temporal.float())
        for c16, c32 in zip(pool16.mamba_cache.conv, pool32.mamba_cache.conv):
            c32.copy_(c16)
        for name, t in pool16.rings.items():
            pool32.rings[name].copy_(t)
        pool32.cursors.copy_(pool16.cursors)
        before = pool16.mamba_cache.temporal.clone()
        for be in (be16, be32):
            be.init_forward_metadata(_decode_batch(slots))
        assert pool16.sr_seed.tolist() == [step + 1]
        flush = be16._step.flush.tolist()
        for layer in layers:
            qkv = torch.randn(2, 2 * Hk * K + HV * V, generator=g)
            a, b = torch.randn(2, HV, generator=g), torch.randn(2, HV, generator=g)
            o16 = be16.forward_decode(layer, SimpleNamespace(mamba_track_mask=None), qkv, a, b)
            o32 = be32.forward_decode(layer, SimpleNamespace(mamba_track_mask=None), qkv, a, b)
            torch.testing.assert_close(o16, o32, rtol=0, atol=0)  # SR changes the stored state only
        expected = before.clone()
        for row, s in enumerate(slots.tolist()):
            if not flush[row]:
                continue
            flushes += 1
            for pl in (1, 2):
                expected[pl, s] = round_slot_sr_ref(pool32.mamba_cache.temporal[pl, s], step + 1, pl, s)
        assert torch.equal(pool16.mamba_cache.temporal.view(torch.int16), expected.view(torch.int16))
    assert flushes >= 4


def test_mamba2_layer_passes_counter_and_pool_layer_to_the_kernels(monkeypatch):
    """``ReplayMamba2AttnBackend.forward`` hands the decode / verify kernels the read copy and the
    rounding keywords of its pool layer (here through the CPU mixer path, stubbed)."""
    import sglang_replayssm.cpu.mamba2_mixer as cpu_mixer
    from sglang_replayssm import mamba2

    pool = _pool("mamba2", sr=True, read_dtype=torch.bfloat16)
    be = mamba2.ReplayMamba2AttnBackend.__new__(mamba2.ReplayMamba2AttnBackend)
    be.pool = pool
    be._decode, be._verify = (lambda *a, **k: None), (lambda *a, **k: None)
    be._step = None
    be.forward_metadata = SimpleNamespace(num_decodes=2, num_prefills=0, is_target_verify=False,
                                          mamba_cache_indices=torch.tensor([1, 2], dtype=torch.int32))
    be.req_to_token_pool = SimpleNamespace(mamba_map={0: 0, 2: 1, 4: 2}, mamba2_layer_cache=lambda lid: None)
    seen = {}
    monkeypatch.setattr(cpu_mixer, "mamba2_mixer_forward_cpu",
                        lambda mixer, **kw: seen.update(kw) or "out")
    r = be.forward(None, torch.zeros(2, 3), None, 4, SimpleNamespace(mamba_track_mask=None))
    assert r == "out"
    kw = seen["decode_fn"].keywords
    assert kw["sr_seed"] is pool.sr_seed and kw["sr_layer"] == 2
    assert kw["read_state"].data_ptr() == pool.read_state[2].data_ptr()


def test_radix_materialise_rounds_with_fresh_bits():
    """Materialising a slot folds its ring into the fp16 checkpoint with SR, after advancing the
    counter: each layer's stored checkpoint is ``round_slot_sr_ref`` of the fp32 fold (the same
    fold on an fp32 twin) keyed by the new counter and the pool layer."""
    from sglang_replayssm.radix_materialise import materialise_slot

    pool = _pool("gdn", sr=True)
    twin = _pool("gdn", sr=False, temporal=torch.float32)
    g = torch.Generator().manual_seed(4)
    pool.mamba_cache.temporal.copy_(0.3 * torch.randn(pool.mamba_cache.temporal.shape, generator=g))
    for name, t in pool.rings.items():
        v = torch.randn(t.shape, generator=g)
        t.copy_(-(v.abs() * 0.2) if name == "g" else (torch.sigmoid(v) if name == "beta" else v))
    pool.cursors[3] = torch.tensor([1, 3], dtype=torch.int32)
    twin.mamba_cache.temporal.copy_(pool.mamba_cache.temporal.float())
    for name, t in pool.rings.items():
        twin.rings[name].copy_(t)
    twin.cursors.copy_(pool.cursors)
    pool.sr_seed.fill_(41)
    assert materialise_slot(pool, 3) == 3 and materialise_slot(twin, 3) == 3
    assert pool.sr_seed.tolist() == [42]
    for pl in range(3):
        want = round_slot_sr_ref(twin.mamba_cache.temporal[pl, 3], 42, pl, 3)
        assert torch.equal(pool.mamba_cache.temporal[pl, 3].view(torch.int16), want.view(torch.int16))


# ------------------------------------------------------------------------------------ pool hook


def test_pool_hook_passes_the_flag(monkeypatch):
    """``hooks/pool.py`` builds the pool spec from SGLang's ``enable_mamba_cache_stochastic_rounding``."""
    import sglang.srt.runtime_context as runtime_context

    from sglang_replayssm import tp
    from sglang_replayssm.hooks import pool as pool_hook

    monkeypatch.setattr(pool_hook, "replay_family", lambda model_config: "gdn")
    monkeypatch.setattr(runtime_context, "get_parallel", lambda: SimpleNamespace(attn_tp_size=1))
    monkeypatch.setattr(tp, "model_layout", lambda family, config, size: None)
    for flag in (True, False):
        configurator = SimpleNamespace(
            server_args=SimpleNamespace(enable_mamba_cache_stochastic_rounding=flag),
            model_config=SimpleNamespace(dtype=torch.bfloat16), mambaish_config=None,
        )
        assert pool_hook._spec_for(configurator).stochastic_rounding is flag
