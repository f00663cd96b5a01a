"""The CPU GDN path (``sglang_replayssm/cpu/gdn.py``, ``hooks/cpu.py``) without a server.

- The torch replacements equal SGLang's Triton kernels (run by the Triton interpreter on CPU, see
  ``tests/conftest.py``): Qwen3-Next's q/k/v/z/b/a split, gated RMSNorm and MoE shared-expert gate;
  Qwen3.5's contiguous split, ``layernorm_gated`` RMSNorm and attention output gate.
- The hooks are transparent for non-CPU calls and route CPU tensors to torch.
- ``gdn_extend_cpu`` over T tokens equals T one-token decode steps at L = 1 (same outputs, same final
  checkpoint and conv state), also split into two extends with a cached prefix.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_replayssm.cpu import gdn as cpu_gdn
from sglang_replayssm.hooks import cpu as cpu_hooks

HV, V, HK, K, KC = 4, 16, 2, 16, 4


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_qkvzba_split_equals_the_triton_kernel():
    from sglang.kernels.ops.attention.triton_gdn_fused_proj import fused_qkvzba_split_reshape_cat

    g = _gen()
    t = 5
    qkvz = torch.randn(t, HK * (2 * K + 2 * (HV // HK) * V), generator=g)
    ba = torch.randn(t, 2 * HV, generator=g)
    ours = cpu_gdn.qkvzba_split_interleaved(qkvz, ba, HK, HV, K, V)
    theirs = fused_qkvzba_split_reshape_cat(qkvz, ba, HK, HV, K, V)
    for x, y in zip(ours, theirs, strict=True):
        assert x.shape == y.shape
        assert torch.equal(x, y)


@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
def test_rms_norm_gated_equals_the_triton_kernel(activation: str):
    from sglang.kernels.ops.attention.fla.fused_norm_gate import rms_norm_gated

    g = _gen(1)
    x, z = torch.randn(12, V, generator=g), torch.randn(12, V, generator=g)
    w = 1 + 0.1 * torch.randn(V, generator=g)
    ours = cpu_gdn.rms_norm_gated(x, z, w, None, activation, 1e-6)
    theirs = rms_norm_gated(x, z, w, None, activation, eps=1e-6)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_gate_sigmoid_mul_add_equals_the_triton_kernel():
    from sglang.kernels.ops.elementwise.elementwise import fused_gate_sigmoid_mul_add

    g = _gen(2)
    h, w, s = torch.randn(6, 32, generator=g), torch.randn(32, generator=g), torch.randn(6, 32, generator=g)
    f0 = torch.randn(6, 32, generator=g)
    ours, theirs = f0.clone(), f0.clone()
    cpu_gdn.gate_sigmoid_mul_add(h, w, s, ours)
    fused_gate_sigmoid_mul_add(h, w, s, theirs)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_qkvzba_split_contiguous_equals_the_triton_kernel():
    from sglang.kernels.ops.attention.triton_gdn_fused_proj import fused_qkvzba_split_reshape_cat_contiguous

    g = _gen(6)
    t = 5
    qkvz = torch.randn(t, 2 * HK * K + 2 * HV * V, generator=g)
    ba = torch.randn(t, 2 * HV, generator=g)
    ours = cpu_gdn.qkvzba_split_contiguous(qkvz, ba, HK, HV, K, V)
    theirs = fused_qkvzba_split_reshape_cat_contiguous(qkvz, ba, HK, HV, K, V)
    for x, y in zip(ours, theirs, strict=True):
        assert x.shape == y.shape and x.is_contiguous()
        assert torch.equal(x, y)


@pytest.mark.parametrize("activation", ["silu", "sigmoid"])
def test_layernorm_gated_equals_the_triton_kernel(activation: str, monkeypatch: pytest.MonkeyPatch):
    import sglang.kernels.ops.attention.fla.layernorm_gated as lg

    # Under the interpreter the kernel still asks CUDA for the SM count and enters a device context.
    monkeypatch.setattr(lg, "_get_sm_count", lambda device: 1)
    monkeypatch.setattr(torch.cpu, "device", lambda index=None: __import__("contextlib").nullcontext(),
                        raising=False)
    g = _gen(7)
    x, z = torch.randn(12, V, generator=g), torch.randn(12, V, generator=g)
    w = 1 + 0.1 * torch.randn(V, generator=g)
    ours = cpu_hooks.around_layernorm_gated(None, x=x, weight=w, bias=None, z=z, eps=1e-6, group_size=None,
                                            norm_before_gate=True, is_rms_norm=True, activation=activation)
    theirs = lg.rms_norm_gated(x=x, weight=w, bias=None, z=z, eps=1e-6, group_size=None, norm_before_gate=True,
                               is_rms_norm=True, activation=activation)
    assert ours.abs().max() > 0.1
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strided", [True, False])
def test_sigmoid_mul_equals_the_triton_kernel(strided: bool):
    from sglang.kernels.ops.elementwise.elementwise import fused_sigmoid_mul

    g = _gen(8)
    t, h, d = 5, 4, 16
    out0 = torch.randn(t, h * d, generator=g)
    if strided:  # the gate as Qwen3.5 passes it: a [T, H, D] view of a wider projection
        gate = torch.randn(t, h, 2 * d, generator=g)[:, :, d:]
    else:
        gate = torch.randn(t, h * d, generator=g)
    ours, theirs = out0.clone(), out0.clone()
    ret = cpu_gdn.sigmoid_mul(ours, gate, inplace=True)
    fused_sigmoid_mul(theirs, gate, inplace=True)
    assert ret.data_ptr() == ours.data_ptr()
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    fresh = cpu_gdn.sigmoid_mul(out0, gate)
    assert not torch.equal(fresh, out0)
    torch.testing.assert_close(fresh, theirs, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="expected gate of shape"):
        cpu_gdn.sigmoid_mul(out0, gate[:, :2])


def test_hooks_route_cpu_tensors_to_torch_and_others_to_the_original():
    calls = []

    def original(*args, **kwargs):
        calls.append(args)
        return "original"

    meta = torch.empty(2, HK * (2 * K + 2 * (HV // HK) * V), device="meta")
    assert cpu_hooks.around_qkvzba_split(original, meta, torch.empty(2, 2 * HV, device="meta"), HK, HV, K, V) == "original"
    qkvz = torch.randn(2, HK * (2 * K + 2 * (HV // HK) * V), generator=_gen(3))
    out = cpu_hooks.around_qkvzba_split(original, qkvz, torch.randn(2, 2 * HV), HK, HV, K, V)
    assert isinstance(out, tuple) and len(out) == 4 and len(calls) == 1
    xm = torch.empty(3, V, device="meta")
    assert cpu_hooks.around_rms_norm_gated(original, xm, xm, None, None, "silu") == "original"
    with pytest.raises(NotImplementedError):
        cpu_hooks.around_rms_norm_gated(original, torch.ones(3, V), torch.ones(3, V), None, None, "silu",
                                        residual=torch.ones(3, V))
    # Qwen3.5's three: meta tensors go to the original, CPU tensors to torch, other norm modes refused.
    assert cpu_hooks.around_qkvzba_split_contiguous(
        original, torch.empty(2, 2 * HK * K + 2 * HV * V, device="meta"), torch.empty(2, 2 * HV, device="meta"),
        HK, HV, K, V) == "original"
    out = cpu_hooks.around_qkvzba_split_contiguous(
        original, torch.randn(2, 2 * HK * K + 2 * HV * V), torch.randn(2, 2 * HV), HK, HV, K, V)
    assert isinstance(out, tuple) and len(out) == 4
    assert cpu_hooks.around_sigmoid_mul(original, xm, xm, True) == "original"
    assert cpu_hooks.around_sigmoid_mul(original, torch.ones(3, V), torch.zeros(3, V)).eq(0.5).all()
    kw = dict(weight=torch.ones(V), bias=None, eps=1e-6, group_size=None, norm_before_gate=True,
              is_rms_norm=True, activation="silu")
    assert cpu_hooks.around_layernorm_gated(original, x=xm, z=xm, **kw) == "original"
    assert cpu_hooks.around_layernorm_gated(original, x=torch.ones(3, V), z=torch.ones(3, V), **kw).shape == (3, V)
    for bad in ({"is_rms_norm": False}, {"norm_before_gate": False}, {"group_size": V // 2}):
        with pytest.raises(NotImplementedError, match="only the RMS norm before a gate"):
            cpu_hooks.around_layernorm_gated(original, x=torch.ones(3, V), z=torch.ones(3, V), **{**kw, **bad})
    with pytest.raises(NotImplementedError):
        cpu_hooks.around_layernorm_gated(original, x=torch.ones(3, V), **kw)
    assert len(calls) == 5  # the five calls with meta tensors, Qwen3-Next's two and Qwen3.5's three
    # No server context: RoPE construction is the original's.
    assert not cpu_hooks._server_on_cpu()


def _layer() -> SimpleNamespace:
    g = _gen(4)
    conv_dim = 2 * HK * K + HV * V
    return SimpleNamespace(
        conv_weights=0.5 * torch.randn(conv_dim, KC, generator=g), bias=0.1 * torch.randn(conv_dim, generator=g),
        activation="silu", q_dim=HK * K, k_dim=HK * K, v_dim=HV * V, num_q_heads=HK, head_q_dim=K,
        num_k_heads=HK, head_k_dim=K, num_v_heads=HV, head_v_dim=V,
        A_log=torch.log(torch.linspace(0.5, 2.0, HV)), dt_bias=torch.full((HV,), -2.0),
    )


def test_extend_equals_decode_steps_at_window_one():
    """Rows: slot 1 prefills 9 tokens in one extend; slot 2 prefills 4, then extends 5 more from its
    checkpoint; slot 3 prefills 1 token, then decodes 8 (L = 1: every step flushes)."""
    import replayssm_kernels

    from sglang_replayssm.metadata import ReplayStep

    layer = _layer()
    g = _gen(5)
    T = 9
    x = torch.randn(T, 2 * HK * K + HV * V, generator=g)
    a, b = torch.randn(T, HV, generator=g), torch.randn(T, HV, generator=g)
    slots_n = 4
    conv = torch.zeros(slots_n, x.shape[1], KC - 1)
    ssm = torch.zeros(slots_n, HV, V, K)
    rings = {
        "u": torch.zeros(slots_n, HV, 1, V), "k": torch.zeros(slots_n, HK, 1, K), "v": torch.zeros(slots_n, HV, 1, V),
        "g": torch.zeros(slots_n, HV, 1), "beta": torch.zeros(slots_n, HV, 1),
    }

    def extend(rows, spans, init):
        qsl = [0]
        for lo, hi in spans:
            qsl.append(qsl[-1] + hi - lo)
        idx = torch.cat([torch.arange(lo, hi) for lo, hi in spans])
        return cpu_gdn.gdn_extend_cpu(
            layer, mixed_qkv=x[idx], a=a[idx], b=b[idx], conv_state=conv, ssm_state=ssm,
            slots=torch.tensor(rows), query_start_loc=torch.tensor(qsl), has_initial_state=torch.tensor(init),
        )[0]

    one = extend([1], [(0, T)], [False])
    two = torch.cat([extend([2], [(0, 4)], [False]), extend([2], [(4, T)], [True])])
    steps = [extend([3], [(0, 1)], [False])]
    for t in range(1, T):
        step = ReplayStep(slot_idx=torch.tensor([3]), ring_start=torch.tensor([0]), ring_len=torch.tensor([0]),
                          flush=torch.tensor([True]))
        steps.append(cpu_gdn.gdn_decode_cpu(
            layer, mixed_qkv=x[t:t + 1], a=a[t:t + 1], b=b[t:t + 1], conv_state=conv, ssm_state=ssm, rings=rings,
            step=step, decode_fn=replayssm_kernels.gdn_replay_decode_ref,
        )[0])
    three = torch.cat(steps)
    assert one.abs().max() > 1e-2
    torch.testing.assert_close(two, one, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(three, one, rtol=1e-5, atol=1e-5)
    for s in (2, 3):
        torch.testing.assert_close(ssm[s], ssm[1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(conv[s], conv[1], rtol=0, atol=0)
