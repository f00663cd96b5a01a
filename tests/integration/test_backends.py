"""Backend wiring on CPU, without a server: the SSU routing hook and the GDN decode path.

The real CUDA kernels are exercised on the H200 (see the report / benchmarks); here the plain-torch
references with the same signatures stand in, which checks that the backends pass the right tensors
(shapes, strides, head split, output layout) and drive the cursors once per forward.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sglang_replayssm import mamba2
from sglang_replayssm.metadata import build_eager


def test_ssu_hook_is_transparent_without_a_layer_context():
    seen = {}

    def original(*args, **kwargs):
        seen["args"], seen["kwargs"] = args, kwargs
        return "stock"

    assert mamba2._ACTIVE is None
    assert mamba2.replay_selective_state_update(original, 1, 2, x=3) == "stock"
    assert seen == {"args": (1, 2), "kwargs": {"x": 3}}


def test_ssu_hook_maps_the_mixer_call_onto_the_ring_decode():
    b, H, P, N, G = 2, 4, 3, 5, 2
    t = lambda *s: torch.randn(*s)  # noqa: E731
    state, x, B, C, out = t(6, H, P, N), t(b, H, P), t(b, G, N), t(b, G, N), torch.empty(b, H, P)
    dt = t(b, H)[:, :, None].expand(-1, -1, P)
    A = t(H)[:, None, None].expand(-1, P, N)
    D = t(H)[:, None].expand(-1, P)
    dt_bias = t(H)[:, None].expand(-1, P)
    slots = torch.tensor([1, 4], dtype=torch.int32)
    cursors = torch.zeros(6, 2, dtype=torch.int32)
    step = build_eager(cursors=cursors, slot_idx=slots, num_prefills=0, num_decodes=b, track_mask=None,
                       window=4, rows=4)
    rings = {"x": t(6, H, 4, P), "dt": t(6, H, 4), "B": t(6, G, 4, N)}
    calls = []

    def decode(*args, **kwargs):
        calls.append((args, kwargs))

    ctx = mamba2._LayerContext(rings=rings, step=step, decode=decode)
    mamba2._ACTIVE = ctx
    try:
        # exactly the call MambaMixer2.forward makes for its decode rows
        r = mamba2.replay_selective_state_update(
            lambda *a, **k: pytest.fail("stock SSU called inside a ReplaySSM layer"),
            state, x, dt, A, B, C, D, z=None, dt_bias=dt_bias, dt_softplus=True,
            state_batch_indices=slots, out=out,
        )
    finally:
        mamba2._ACTIVE = None
    assert r is out and ctx.calls == 1
    (args, kwargs), = calls
    expected = (state, rings["x"], rings["dt"], rings["B"], x, dt, A, B, C, out, slots, step.ring_start,
                step.ring_len, step.flush)
    assert len(args) == len(expected) and all(a is e for a, e in zip(args, expected))
    assert kwargs["D"] is D and kwargs["dt_bias"] is dt_bias and kwargs["z"] is None and kwargs["dt_softplus"]


def test_ssu_hook_refuses_a_verify_call_in_a_decode_context_and_vice_versa():
    from sglang_replayssm.spec import VerifyStep

    z = torch.zeros(1, dtype=torch.int32)
    for step, kwargs in ((SimpleNamespace(slot_idx=z), {"disable_state_update": True}),
                         (VerifyStep(slot_idx=z, ring_start=z, ring_len=z, flush=z.bool(), num_tokens=2), {})):
        mamba2._ACTIVE = mamba2._LayerContext(rings={}, step=step, decode=None)
        try:
            with pytest.raises(RuntimeError, match="inside a"):
                mamba2.replay_selective_state_update(lambda *a, **k: pytest.fail("stock SSU called"), **kwargs)
        finally:
            mamba2._ACTIVE = None


def _gdn_backend(window: int):
    """A ReplayGDNAttnBackend without SGLang's constructor (it needs a model runner), on CPU."""
    import replayssm_kernels

    from sglang_replayssm import gdn
    from sglang_replayssm.pool import ReplayMambaPool, ReplayPoolSpec
    from tests.integration.test_pool import SIZE, _params

    # CPU tensors: forward_decode runs the plug-in's torch path (cpu.gdn: conv update + ring decode).
    pool = ReplayMambaPool(
        replay=ReplayPoolSpec(family="gdn", window=window, act_dtype=torch.float32),
        size=SIZE, spec_state_size=SIZE, cache_params=_params("gdn"), mamba_layer_ids=[0, 2, 4], device="cpu",
    )
    be = gdn.ReplayGDNAttnBackend.__new__(gdn.ReplayGDNAttnBackend)
    be.pool, be.window, be.rows = pool, window, pool.ring_spec.rows
    be._decode = replayssm_kernels.gdn_replay_decode_ref
    be._graph_bs = None
    be.req_to_token_pool = SimpleNamespace(
        mamba_map={0: 0, 2: 1, 4: 2},
        mamba2_layer_cache=lambda layer_id: pool.mamba2_layer_cache({0: 0, 2: 1, 4: 2}[layer_id]),
    )
    be._track_mamba_state_decode = lambda *a, **k: None
    return be, pool


def test_gdn_decode_window4_matches_window1():
    """Seven decode steps of two requests through forward_decode (CPU path): L=4 (two ring cycles) == L=1."""
    HV, V, Hk, K = 4, 8, 2, 8
    conv_weights = 0.5 * torch.randn(2 * Hk * K + HV * V, 4, generator=torch.Generator().manual_seed(2))
    layer = SimpleNamespace(layer_id=2, conv_weights=conv_weights, bias=None, activation="silu", q_dim=Hk * K,
                            k_dim=Hk * K, v_dim=HV * V, num_q_heads=Hk, head_q_dim=K, num_k_heads=Hk,
                            head_k_dim=K, num_v_heads=HV, head_v_dim=V,
                            A_log=torch.log(torch.linspace(0.5, 2.0, HV)), dt_bias=torch.full((HV,), -2.0))
    g = torch.Generator().manual_seed(0)
    steps = [(torch.randn(2, 2 * Hk * K + HV * V, generator=g), torch.randn(2, HV, generator=g),
              torch.randn(2, HV, generator=g)) for _ in range(7)]
    outs = {}
    for window in (4, 1):
        be, pool = _gdn_backend(window)
        pool.mamba_cache.temporal.copy_(0.1 * torch.randn(pool.mamba_cache.temporal.shape, generator=g.manual_seed(1)))
        slots = torch.tensor([3, 5], dtype=torch.int32)
        res = []
        for qkv, a, b in steps:
            be.forward_metadata = SimpleNamespace(mamba_cache_indices=slots)
            be._step = build_eager(cursors=pool.cursors, slot_idx=slots, num_prefills=0, num_decodes=2,
                                   track_mask=None, window=window, rows=be.rows)
            o = be.forward_decode(layer, SimpleNamespace(mamba_track_mask=None), qkv, a, b)
            assert o.shape == (1, 2, HV, V)
            res.append(o)
        outs[window] = (torch.stack(res), pool.mamba_cache.temporal[1, 3].clone(), pool.cursors.clone())
    o4, s4, c4 = outs[4]
    o1, s1, c1 = outs[1]
    torch.testing.assert_close(o4, o1, rtol=1e-5, atol=1e-5)
    # L=4: one flush at the 4th step (3 records + the token), then 3 records pending
    assert c4[3].tolist() == [3, 3] and c1[3].tolist() == [0, 0]
    # so the L=4 checkpoint lags the L=1 one by those 3 tokens
    assert not torch.equal(s4, s1)


def test_stochastic_rounding_is_accepted_and_a_philox_round_count_refused():
    """SGLang's fp16 stochastic rounding of the SSM cache runs in the ReplaySSM flush (bits from a counter
    hash, ``replayssm_kernels/stochastic_round.py``): accepted at startup; a Philox round count, which the
    hash has no use for, is refused with what to change."""
    from sglang.srt.configs.model_config import ModelConfig

    from sglang_replayssm.hooks.backends import _refusals

    base = dict(tp_size=1, dp_size=1, enable_dp_attention=False, attn_cp_size=1, device="cuda",
                speculative_algorithm=None)
    model = ModelConfig(model_path=str(Path(__file__).resolve().parents[1] / "models" / "nemotron_h_tiny"))
    assert _refusals(model, SimpleNamespace(**base)) == []
    sr = dict(base, enable_mamba_cache_stochastic_rounding=True)
    assert _refusals(model, SimpleNamespace(**sr, mamba_cache_philox_rounds=0)) == []
    problems = _refusals(model, SimpleNamespace(**sr, mamba_cache_philox_rounds=7))
    assert len(problems) == 1 and "--mamba-cache-philox-rounds" in problems[0]
    assert "leave it at 0" in problems[0]


def test_deterministic_inference_pins_the_kernels_and_refuses_stochastic_rounding():
    """``--enable-deterministic-inference``: the backends call their kernels with ``batch_invariant=True``
    (one launch configuration at every batch size, ``spec.pin_batch_invariant``), and without the flag
    the kernels unchanged; with stochastic rounding, whose bits follow a per-forward counter and the slot,
    it is refused at startup (deterministic mode alone, decode or speculative with a fixed verify path, is
    accepted)."""
    from sglang.srt.configs.model_config import ModelConfig

    from sglang_replayssm.hooks.backends import _refusals
    from sglang_replayssm.spec import pin_batch_invariant

    calls = []

    def kernel(*args, **kw):
        calls.append(kw)

    assert pin_batch_invariant(SimpleNamespace(enable_deterministic_inference=False), kernel, kernel) == (
        kernel, kernel)
    decode, verify = pin_batch_invariant(SimpleNamespace(enable_deterministic_inference=True), kernel, kernel)
    decode(1, sr_layer=3)
    verify(2)
    assert calls == [{"batch_invariant": True, "sr_layer": 3}, {"batch_invariant": True}]

    base = dict(tp_size=1, dp_size=1, enable_dp_attention=False, attn_cp_size=1, device="cuda",
                speculative_algorithm=None, enable_deterministic_inference=True)
    model = ModelConfig(model_path=str(Path(__file__).resolve().parents[1] / "models" / "nemotron_h_tiny"))
    assert _refusals(model, SimpleNamespace(**base)) == []
    (problem,) = _refusals(model, SimpleNamespace(**base, enable_mamba_cache_stochastic_rounding=True))
    assert "--enable-deterministic-inference with --enable-mamba-cache-stochastic-rounding" in problem
    assert "run without one of the two flags" in problem


def test_streaming_sessions_refused():
    """A streaming session hands a finished turn's SSM slot to the next turn without the radix
    cache's donate path, so its ring would never be folded: refused at startup, with what to change."""
    from sglang.srt.configs.model_config import ModelConfig

    from sglang_replayssm.hooks.backends import _refusals

    base = dict(tp_size=1, dp_size=1, enable_dp_attention=False, attn_cp_size=1, device="cuda",
                speculative_algorithm=None)
    model = ModelConfig(model_path=str(Path(__file__).resolve().parents[1] / "models" / "nemotron_h_tiny"))
    assert _refusals(model, SimpleNamespace(**base, enable_streaming_session=False)) == []
    (problem,) = _refusals(model, SimpleNamespace(**base, enable_streaming_session=True))
    assert "--enable-streaming-session" in problem and "--ssm-backend default" in problem


def test_pipeline_parallelism_refused():
    """Under ``--pp-size > 1`` SGLang sizes every stage's mamba pool from the largest stage's share of
    the layers, while the plug-in's budget solves the ring per stage: the stages' slot counts would
    differ (a review found 109 vs 110 slots on Nano-4B over two stages), so it is refused."""
    from sglang.srt.configs.model_config import ModelConfig

    from sglang_replayssm.hooks.backends import _refusals

    base = dict(tp_size=1, dp_size=1, enable_dp_attention=False, attn_cp_size=1, device="cuda",
                speculative_algorithm=None)
    model = ModelConfig(model_path=str(Path(__file__).resolve().parents[1] / "models" / "nemotron_h_tiny"))
    assert _refusals(model, SimpleNamespace(**base, pp_size=1)) == []
    (problem,) = _refusals(model, SimpleNamespace(**base, pp_size=2))
    assert "--pp-size 2" in problem and "--pp-size 1" in problem and "--ssm-backend default" in problem


def test_two_batch_overlap_refused():
    """Two-batch overlap builds the forward metadata on SGLang's main attention backend and again on
    each micro-batch's child backend (``TboAttnBackend``): every ring cursor would advance twice per
    forward, so it is refused at startup, with what to change."""
    from sglang.srt.configs.model_config import ModelConfig

    from sglang_replayssm.hooks.backends import _refusals

    base = dict(tp_size=1, dp_size=1, enable_dp_attention=False, attn_cp_size=1, device="cuda",
                speculative_algorithm=None)
    model = ModelConfig(model_path=str(Path(__file__).resolve().parents[1] / "models" / "nemotron_h_tiny"))
    assert _refusals(model, SimpleNamespace(**base, enable_two_batch_overlap=False)) == []
    (problem,) = _refusals(model, SimpleNamespace(**base, enable_two_batch_overlap=True))
    assert "--enable-two-batch-overlap" in problem and "twice per forward" in problem
    assert "--ssm-backend default" in problem
    # single-batch overlap only overlaps MoE communication within one batch: one metadata build, accepted
    assert _refusals(model, SimpleNamespace(**base, enable_single_batch_overlap=True)) == []


@pytest.mark.parametrize(("ssm_dtype", "read_dtype", "fixes"), [
    ("bfloat16", "fp16", "fp8 or same"),  # as wide, less range: overflows
    ("bfloat16", "bf16", "fp8 or same"),  # the checkpoint's own dtype: nothing saved
    ("float16", "bf16", "fp8 or same"),
    ("float32", "bf16", None), ("float32", "fp16", None), ("bfloat16", "fp8", None), ("float16", "fp8", None),
])
def test_read_copy_must_be_narrower_than_the_checkpoint(monkeypatch, ssm_dtype, read_dtype, fixes):
    """``--replayssm-read-dtype`` must be strictly narrower than the SSM checkpoint's dtype, read from
    ``--mamba-ssm-dtype`` or, without it, as SGLang resolves it (``SGLANG_MAMBA_SSM_DTYPE``, the model
    config, float32): refused at startup otherwise, naming the dtypes that would do."""
    from sglang.srt.configs.model_config import ModelConfig

    from sglang_replayssm.config import ENV_VAR
    from sglang_replayssm.hooks.backends import _refusals

    monkeypatch.setenv(ENV_VAR, f'{{"backend": "replay", "read_dtype": "{read_dtype}"}}')
    base = dict(tp_size=1, dp_size=1, enable_dp_attention=False, attn_cp_size=1, device="cuda",
                speculative_algorithm=None)
    model = ModelConfig(model_path=str(Path(__file__).resolve().parents[1] / "models" / "nemotron_h_tiny"))
    monkeypatch.setenv("SGLANG_MAMBA_SSM_DTYPE", "float32")  # the flag wins over the variable
    by_flag = _refusals(model, SimpleNamespace(**base, mamba_ssm_dtype=ssm_dtype))
    monkeypatch.setenv("SGLANG_MAMBA_SSM_DTYPE", ssm_dtype)
    by_env = _refusals(model, SimpleNamespace(**base, mamba_ssm_dtype=None))
    assert by_flag == by_env
    if fixes is None:
        assert by_flag == []
    else:
        (problem,) = by_flag
        assert f"--replayssm-read-dtype {read_dtype}: expected a read copy narrower" in problem
        assert f"{ssm_dtype} checkpoint" in problem and f"use --replayssm-read-dtype {fixes}," in problem
    monkeypatch.delenv("SGLANG_MAMBA_SSM_DTYPE")  # no flag, no variable: the model config's float32
    assert _refusals(model, SimpleNamespace(**base, mamba_ssm_dtype=None)) == []


def test_gdn_draft_length_past_the_verify_kernel_is_refused_where_snapshot_cannot_serve(monkeypatch):
    """Gated DeltaNet linear drafts longer than the replay verify kernel's ``T``: refused at startup
    with ``--replayssm-verify replay`` and on ``--device cpu``; ``auto`` on CUDA starts (the snapshot
    verify serves it, ``spec_plan._guard_draft_length``); Mamba-2 has no such limit."""
    from sglang.srt.configs.model_config import ModelConfig

    from sglang_replayssm.config import ENV_VAR
    from sglang_replayssm.hooks.backends import _refusals
    from sglang_replayssm.spec_plan import GDN_VERIFY_MAX_T

    models = Path(__file__).resolve().parents[1] / "models"
    gdn = ModelConfig(model_path=str(models / "qwen3_next_tiny"))
    mamba2 = ModelConfig(model_path=str(models / "nemotron_h_tiny"))
    args = dict(tp_size=1, dp_size=1, enable_dp_attention=False, attn_cp_size=1, device="cuda",
                speculative_algorithm="EAGLE", speculative_eagle_topk=1,
                speculative_num_draft_tokens=GDN_VERIFY_MAX_T + 1)
    monkeypatch.setenv(ENV_VAR, '{"backend": "replay", "verify": "replay"}')
    (problem,) = _refusals(gdn, SimpleNamespace(**args))
    assert f"--speculative-num-draft-tokens {GDN_VERIFY_MAX_T + 1}" in problem
    assert _refusals(mamba2, SimpleNamespace(**args)) == []
    assert _refusals(gdn, SimpleNamespace(**{**args, "speculative_num_draft_tokens": GDN_VERIFY_MAX_T})) == []
    monkeypatch.setenv(ENV_VAR, '{"backend": "replay", "verify": "auto"}')
    assert _refusals(gdn, SimpleNamespace(**args)) == []


def test_pd_multiplexing_and_torch_compile_refused():
    """``--enable-pdmux`` runs each prefill layer-split (``model.forward_split_prefill``, which no
    supported hybrid implements) on a second stream beside decode forwards on other backend copies;
    ``--enable-torch-compile`` compiles the model forward around the SSM layers' kernels and wrappers
    (never validated): both refused at startup, with what to change."""
    from sglang.srt.configs.model_config import ModelConfig

    from sglang_replayssm.hooks.backends import _refusals

    base = dict(tp_size=1, dp_size=1, enable_dp_attention=False, attn_cp_size=1, device="cuda",
                speculative_algorithm=None)
    models = Path(__file__).resolve().parents[1] / "models"
    for name in ("nemotron_h_tiny", "qwen3_next_tiny"):
        model = ModelConfig(model_path=str(models / name))
        assert _refusals(model, SimpleNamespace(**base, enable_pdmux=False, enable_torch_compile=False)) == []
        (pdmux,) = _refusals(model, SimpleNamespace(**base, enable_pdmux=True))
        assert "--enable-pdmux" in pdmux and "forward_split_prefill" in pdmux
        assert "run without --enable-pdmux" in pdmux
        (compiled,) = _refusals(model, SimpleNamespace(**base, enable_torch_compile=True))
        assert "--enable-torch-compile" in compiled and "not validated" in compiled
        assert "run without --enable-torch-compile, or with --ssm-backend default" in compiled
        assert len(_refusals(model, SimpleNamespace(**base, enable_pdmux=True, enable_torch_compile=True))) == 2
