"""Pure-torch Gated DeltaNet pieces for CPU tensors (``--device cpu``, Qwen3-Next and Qwen3.5).

Without the CPU build of ``sgl_kernel`` (not on PyPI), SGLang 0.5.17 runs Triton for the Qwen3-Next
layer's q/k/v/z/b/a split (``fused_qkvzba_split_reshape_cat``), its gated RMSNorm
(``rms_norm_gated``), its MoE shared-expert gate (``fused_gate_sigmoid_mul_add``), the dense Qwen3.5
layer's split (``fused_qkvzba_split_reshape_cat_contiguous``), gated RMSNorm (``layernorm_gated``'s
``rms_norm_gated``) and attention output gate (``fused_sigmoid_mul``), and the whole
``GDNAttnBackend`` (``causal_conv1d_fn`` / ``causal_conv1d_update``, ``fused_gdn_gating``,
``chunk_gated_delta_rule``).  This module holds torch replacements: ``hooks/cpu.py`` routes the
model-layer ones here for CPU tensors only, and ``gdn.ReplayGDNAttnBackend`` calls
``gdn_extend_cpu`` / ``gdn_decode_cpu`` for CPU tensors, so ``--ssm-backend default`` never reaches
this code.

The math (``../shared/design/cpu-serving.md``, ``kernels/README.md``):

- conv: depthwise causal conv over ``[previous K-1 | x]`` with the conv state ``[slots, conv_dim,
  K-1]`` (window on the last axis), bias, SiLU; extend writes the last K-1 inputs back, decode rolls
  by one (``cpu.mamba2_mixer`` does the same for Mamba-2);
- gating: ``g = -exp(A_log) * softplus(a + dt_bias)``, ``beta = sigmoid(b)``;
- delta rule per token, fp32, state ``S [HV, V, K]`` (SGLang's ``temporal`` layout):
  ``S *= exp(g)``, ``u = beta * (v - S k)``, ``S += u k^T``, ``o = S q`` with ``k``, ``q``
  l2-normalised (``x / sqrt(sum x^2 + 1e-6)``) and ``q`` scaled by ``K^-1/2``;
- extend rows start from the slot's checkpoint when the row has a cached prefix (else zeros) and
  write the final state as the new checkpoint; decode rows run ``gdn_replay_decode_ref`` on the
  forward's ``ReplayStep`` (the ring protocol).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from sglang_replayssm.cpu.mamba2_mixer import _conv_extend, conv_verify_windows
from sglang_replayssm.metadata import ReplayStep

__all__ = [
    "gate_sigmoid_mul_add",
    "gdn_decode_cpu",
    "gdn_extend_cpu",
    "gdn_verify_conv_cpu",
    "qkvzba_split_contiguous",
    "qkvzba_split_interleaved",
    "rms_norm_gated",
    "sigmoid_mul",
]

_F32 = torch.float32


# ----------------------------------------------------------------------------- model-layer pieces


def qkvzba_split_interleaved(
    mixed_qkvz: torch.Tensor, mixed_ba: torch.Tensor, num_heads_qk: int, num_heads_v: int, head_qk: int, head_v: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Torch ``fused_qkvzba_split_reshape_cat`` (Qwen3-Next's per-k-head interleaved projection).

    ``mixed_qkvz [T, Hk*(2*Dk + 2*r*Dv)]`` grouped per key head as ``[q | k | v (r heads) | z (r heads)]``,
    ``mixed_ba [T, Hk*2r]`` as ``[b (r) | a (r)]`` with ``r = HV / Hk``.  Returns ``mixed_qkv [T, all q |
    all k | all v]``, ``z [T, HV, Dv]``, ``b [T, HV]``, ``a [T, HV]``, as the Triton kernel writes them.
    """
    t = mixed_qkvz.shape[0]
    r = num_heads_v // num_heads_qk
    qkvz = mixed_qkvz.view(t, num_heads_qk, 2 * head_qk + 2 * r * head_v)
    q, k, v, z = torch.split(qkvz, [head_qk, head_qk, r * head_v, r * head_v], dim=-1)
    ba = mixed_ba.view(t, num_heads_qk, 2 * r)
    b, a = torch.split(ba, [r, r], dim=-1)
    mixed_qkv = torch.cat([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], dim=-1)
    return (
        mixed_qkv,
        z.reshape(t, num_heads_v, head_v).contiguous(),
        b.reshape(t, num_heads_v).contiguous(),
        a.reshape(t, num_heads_v).contiguous(),
    )


def qkvzba_split_contiguous(
    mixed_qkvz: torch.Tensor, mixed_ba: torch.Tensor, num_heads_qk: int, num_heads_v: int, head_qk: int, head_v: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Torch ``fused_qkvzba_split_reshape_cat_contiguous`` (Qwen3.5's projection).

    ``mixed_qkvz [T, 2*Hk*Dk + 2*HV*Dv]`` as ``[all q | all k | all v | all z]``, ``mixed_ba [T, 2*HV]``
    as ``[all b | all a]``.  Returns ``mixed_qkv [T, all q | all k | all v]``, ``z [T, HV, Dv]``,
    ``b [T, HV]``, ``a [T, HV]`` (new contiguous tensors, as the Triton kernel writes them).
    """
    t = mixed_qkvz.shape[0]
    kd, vd = num_heads_qk * head_qk, num_heads_v * head_v
    qkv, z = torch.split(mixed_qkvz, [2 * kd + vd, vd], dim=-1)
    b, a = torch.split(mixed_ba, [num_heads_v, num_heads_v], dim=-1)
    return qkv.contiguous(), z.reshape(t, num_heads_v, head_v).contiguous(), b.contiguous(), a.contiguous()


def sigmoid_mul(attn_output: torch.Tensor, gate: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """Torch ``fused_sigmoid_mul`` (Qwen3.5's gated-attention output): ``attn_output * sigmoid(gate)``,
    fp32 inside, in ``attn_output``'s dtype.  ``gate`` has ``attn_output``'s shape, or is ``[T, H, D]``
    (any strides) against ``attn_output [T, H*D]``; ``inplace`` writes into ``attn_output`` and returns it."""
    if gate.ndim == 3 and attn_output.ndim == 2:
        gate = gate.reshape(gate.shape[0], -1)
    if gate.shape != attn_output.shape:
        raise ValueError(
            f"sigmoid_mul: expected gate of shape {tuple(attn_output.shape)} (or [T, H, D] with H*D = "
            f"{attn_output.shape[-1]}), got {tuple(gate.shape)}"
        )
    res = (attn_output.to(_F32) * torch.sigmoid(gate.to(_F32))).to(attn_output.dtype)
    if inplace:
        return attn_output.copy_(res)
    return res


def rms_norm_gated(
    x: torch.Tensor, g: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
    activation: str, eps: float,
) -> torch.Tensor:
    """Torch ``fla.fused_norm_gate.rms_norm_gated`` without residual (Qwen3-Next), and
    ``fla.layernorm_gated.rms_norm_gated`` as an RMS norm before the gate over the whole last axis
    (Qwen3.5): ``rmsnorm(x) * w (+ b)``, then ``* g * sigmoid(g)`` (swish / silu) or ``* sigmoid(g)``
    (sigmoid); fp32 inside, output in x's dtype."""
    xf = x.to(_F32)
    y = xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(_F32)
    if bias is not None:
        y = y + bias.to(_F32)
    gf = g.to(_F32)
    if activation in ("swish", "silu"):
        y = y * gf * torch.sigmoid(gf)
    elif activation == "sigmoid":
        y = y * torch.sigmoid(gf)
    else:
        raise ValueError(f"ReplaySSM CPU rms_norm_gated: unsupported activation {activation!r}")
    return y.to(x.dtype)


def gate_sigmoid_mul_add(
    hidden_states: torch.Tensor, gate_weight: torch.Tensor, shared_output: torch.Tensor,
    final_hidden_states: torch.Tensor,
) -> None:
    """Torch ``fused_gate_sigmoid_mul_add`` (Qwen2-MoE / Qwen3-Next shared-expert gate), in place:
    ``final += sigmoid(hidden @ w)[:, None] * shared``, fp32 inside."""
    gate = hidden_states.to(_F32) @ gate_weight.to(_F32)
    upd = final_hidden_states.to(_F32) + torch.sigmoid(gate)[:, None] * shared_output.to(_F32)
    final_hidden_states.copy_(upd)


# ----------------------------------------------------------------------------- backend pieces


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def _softplus(u: torch.Tensor) -> torch.Tensor:
    return torch.where(u <= 20.0, torch.log(1.0 + torch.exp(u)), u)


def _split_heads(layer, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v = torch.split(x, [layer.q_dim, layer.k_dim, layer.v_dim], dim=-1)
    t = x.shape[0]
    return (
        q.reshape(t, layer.num_q_heads, layer.head_q_dim),
        k.reshape(t, layer.num_k_heads, layer.head_k_dim),
        v.reshape(t, layer.num_v_heads, layer.head_v_dim),
    )


def _activation(layer, x: torch.Tensor) -> torch.Tensor:
    if layer.activation not in ("silu", "swish"):
        raise NotImplementedError(f"ReplaySSM CPU GDN: conv activation {layer.activation!r}")
    return F.silu(x)


def gdn_extend_cpu(
    layer,
    *,
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    conv_state: torch.Tensor,
    ssm_state: torch.Tensor,
    slots: torch.Tensor,
    query_start_loc: torch.Tensor,
    has_initial_state: torch.Tensor,
) -> torch.Tensor:
    """Prefill / extend rows of one GDN layer on CPU tensors; returns ``[1, T, HV, V]``.

    Parameters
    ----------
    layer : RadixLinearAttention
        Sizes, ``conv_weights [conv_dim, K]``, ``bias``, ``activation``, ``A_log``, ``dt_bias``.
    mixed_qkv : torch.Tensor
        ``[T, conv_dim]`` packed q|k|v before the conv, rows concatenated in ``query_start_loc`` order.
    a, b : torch.Tensor
        ``[T, HV]`` gate inputs.
    conv_state, ssm_state : torch.Tensor
        The layer's pool tensors ``[slots, conv_dim, K-1]`` and ``[slots, HV, V, K]``, updated in place.
    slots : torch.Tensor
        ``[rows]`` slot per row (negative: padding, skipped).
    query_start_loc : torch.Tensor
        ``[rows+1]`` token offsets.
    has_initial_state : torch.Tensor
        ``[rows]`` bool: start from the slot's checkpoint and conv state (cached prefix) or from zeros.
    """
    weight = layer.conv_weights
    hv, dv, dk = layer.num_v_heads, layer.head_v_dim, layer.head_k_dim
    group = hv // layer.num_k_heads
    scale = dk**-0.5
    A = -torch.exp(layer.A_log.to(_F32))
    dtb = layer.dt_bias.to(_F32)
    out = torch.zeros(1, mixed_qkv.shape[0], hv, dv, dtype=mixed_qkv.dtype)
    qsl = query_start_loc.tolist()
    init = has_initial_state.tolist()
    for r, s in enumerate(slots.tolist()):
        lo, hi = int(qsl[r]), int(qsl[r + 1])
        if s < 0 or hi <= lo:
            continue
        prev = conv_state[s] if init[r] else None
        xc, new_conv = _conv_extend(mixed_qkv[lo:hi], prev, weight, layer.bias)
        conv_state[s] = new_conv.to(conv_state.dtype)
        xc = _activation(layer, xc).to(mixed_qkv.dtype)
        q, k, v = _split_heads(layer, xc)
        q = (_l2norm(q.to(_F32)) * scale).repeat_interleave(group, 1)  # [T, HV, K]
        k = _l2norm(k.to(_F32)).repeat_interleave(group, 1)
        v = v.to(_F32)
        g = A * _softplus(a[lo:hi].to(_F32) + dtb)  # [T, HV]
        beta = torch.sigmoid(b[lo:hi].to(_F32)).to(b.dtype).to(_F32)
        S = ssm_state[s].to(_F32).clone() if init[r] else torch.zeros(hv, dv, dk, dtype=_F32)
        for t in range(hi - lo):
            S = S * torch.exp(g[t])[:, None, None]
            u = (v[t] - (S * k[t][:, None, :]).sum(-1)) * beta[t][:, None]
            S = S + u[:, :, None] * k[t][:, None, :]
            out[0, lo + t] = (S * q[t][:, None, :]).sum(-1).to(out.dtype)
        ssm_state[s] = S.to(ssm_state.dtype)
    return out


def gdn_verify_conv_cpu(
    layer, x: torch.Tensor, conv_state: torch.Tensor, slots: torch.Tensor, windows: torch.Tensor
) -> torch.Tensor:
    """Verify conv of one GDN layer on CPU tensors: ``x [bs, T, conv_dim]`` -> activated ``[bs, T, conv_dim]``.

    ``conv_state`` is read only; ``windows [bs, T, conv_dim, K-1]`` (SGLang's
    ``intermediate_conv_window``) receives the window after each token for the commit's rollback.
    """
    xc = conv_verify_windows(x, conv_state, slots, layer.conv_weights, layer.bias, windows)
    return _activation(layer, xc).to(x.dtype)


def gdn_decode_cpu(
    layer,
    *,
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    conv_state: torch.Tensor,
    ssm_state: torch.Tensor,
    rings: dict[str, torch.Tensor],
    step: ReplayStep,
    decode_fn: Callable[..., None],
) -> torch.Tensor:
    """Decode rows (one token each) of one GDN layer on CPU tensors; returns ``[1, B, HV, V]``.

    The conv rolls the slot's conv state by one token; the delta rule runs ``decode_fn``
    (``gdn_replay_decode_ref``) with the layer's rings on the forward's cursor snapshot ``step``.
    """
    sl = step.slot_idx
    safe = sl.long().clamp(min=0)
    weight = layer.conv_weights
    window = torch.cat([conv_state[safe], mixed_qkv.to(conv_state.dtype)[:, :, None]], dim=2)  # [B, C, K]
    xc = (window * weight[None].to(window.dtype)).sum(-1)
    if layer.bias is not None:
        xc = xc + layer.bias.to(xc.dtype)
    valid = sl >= 0
    new_conv = window[:, :, 1:]
    if bool(valid.all()):
        conv_state[safe] = new_conv
    else:
        conv_state[safe[valid]] = new_conv[valid]
    xc = _activation(layer, xc).to(mixed_qkv.dtype)
    q, k, v = _split_heads(layer, xc)
    bs = xc.shape[0]
    out = xc.new_zeros(bs, layer.num_v_heads, layer.head_v_dim)
    decode_fn(
        ssm_state,
        rings["u"],
        rings["k"],
        rings["v"],
        rings["g"],
        rings["beta"],
        q,
        k,
        v,
        a,
        b,
        layer.A_log,
        layer.dt_bias,
        out,
        sl,
        step.ring_start,
        step.ring_len,
        step.flush,
        scale=layer.head_k_dim**-0.5,
        use_qk_l2norm=True,
        row_order=step.row_order,
    )
    return out.unsqueeze(0)
