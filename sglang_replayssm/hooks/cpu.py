"""Hooks that let Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5) run on ``--device cpu`` with ReplaySSM.

SGLang 0.5.17 treats a CPU as "cpu" only with its CPU build of ``sgl_kernel`` (``SGLANG_USE_CPU_ENGINE``,
not on PyPI); with the ordinary CUDA build of torch on a machine without a GPU, four SGLang code
paths of Qwen3-Next and four of Qwen3.5 (the RoPE shared) outside the GDN backend are Triton-only or
import vLLM (``../shared/design/cpu-serving.md``).
Each hook is ``when="replay"`` and transparent unless the server runs on a CPU (RoPE: the server's
device; the others: the tensors' device, where the stock Triton kernel could not run anyway), so
``--ssm-backend default`` and GPU servers are unchanged.  The backend side (conv, gating, delta rule)
needs no hook: ``gdn.ReplayGDNAttnBackend`` runs ``cpu.gdn`` for CPU tensors.

``rotary_embedding.base.RotaryEmbedding.__init__`` (AROUND)
    Why: with ``is_cpu()`` false and no CUDA, ``__init__`` imports ``vllm._custom_ops.rotary_embedding``
    as a fallback kernel (``ModuleNotFoundError: vllm``).  Gated-attention layers of every GDN hybrid
    build a RoPE.
    How: when the server device is ``cpu``, the module flag ``base._is_cpu`` reads true for the
    duration of the original ``__init__`` (restored after), so no fallback kernel is chosen; the
    forward is then ``forward_native`` (``MultiPlatformOp``'s choice without CUDA).
    Removal: when SGLang treats ``--device cpu`` as CPU without ``sgl_kernel``'s CPU build.

``triton_gdn_fused_proj.fused_qkvzba_split_reshape_cat`` (AROUND)
    Why: ``Qwen3GatedDeltaNet.forward`` calls this Triton kernel whenever ``HV/Hk`` is 1, 2 or 4.
    How: CPU tensors go to ``cpu.gdn.qkvzba_split_interleaved`` (same outputs); others to the kernel.
    Removal: as above.

``fla.fused_norm_gate.rms_norm_gated`` (AROUND)
    Why: ``FusedRMSNormGated.forward`` (the GDN output norm) calls this Triton function.
    How: CPU tensors without residual go to ``cpu.gdn.rms_norm_gated``; others to the original.
    Removal: as above.

``elementwise.elementwise.fused_gate_sigmoid_mul_add`` (AROUND)
    Why: ``Qwen2MoeSparseMoeBlock.forward`` (Qwen3-Next's MoE MLP) adds the gated shared expert with
    this Triton kernel.
    How: CPU tensors go to ``cpu.gdn.gate_sigmoid_mul_add`` (same in-place update); others to the kernel.
    Removal: as above.

``triton_gdn_fused_proj.fused_qkvzba_split_reshape_cat_contiguous`` (AROUND)
    Why: ``Qwen3_5GatedDeltaNet.forward`` calls this Triton kernel whenever ``HV/Hk`` is 1, 2 or 4.
    How: CPU tensors go to ``cpu.gdn.qkvzba_split_contiguous`` (same outputs); others to the kernel.
    Removal: as above.

``fla.layernorm_gated.rms_norm_gated`` (AROUND)
    Why: Qwen3.5's GDN output norm (``layernorm_gated.RMSNorm``) reaches this Triton function, which
    also asks CUDA for the SM count.
    How: CPU tensors in the mode the layer uses (RMS norm before the gate, one group) go to
    ``cpu.gdn.rms_norm_gated``; another mode on CPU raises ``NotImplementedError``; others to the original.
    Removal: as above.

``elementwise.elementwise.fused_sigmoid_mul`` (AROUND)
    Why: Qwen3.5's gated attention multiplies its output by ``sigmoid(gate)`` with this Triton kernel.
    How: CPU tensors go to ``cpu.gdn.sigmoid_mul`` (same result, in place when asked); others to the kernel.
    Removal: as above.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from sglang_replayssm.hooks import HookSpec

__all__ = [
    "HOOKS",
    "around_gate_sigmoid_mul_add",
    "around_layernorm_gated",
    "around_qkvzba_split",
    "around_qkvzba_split_contiguous",
    "around_rms_norm_gated",
    "around_rope_init",
    "around_sigmoid_mul",
]

logger = logging.getLogger(__name__)

ROPE_INIT = "sglang.srt.layers.rotary_embedding.base.RotaryEmbedding.__init__"
QKVZBA_SPLIT = "sglang.kernels.ops.attention.triton_gdn_fused_proj.fused_qkvzba_split_reshape_cat"
RMS_NORM_GATED = "sglang.kernels.ops.attention.fla.fused_norm_gate.rms_norm_gated"
GATE_SIGMOID_MUL_ADD = "sglang.kernels.ops.elementwise.elementwise.fused_gate_sigmoid_mul_add"
QKVZBA_SPLIT_CONTIGUOUS = (
    "sglang.kernels.ops.attention.triton_gdn_fused_proj.fused_qkvzba_split_reshape_cat_contiguous"
)
LAYERNORM_GATED = "sglang.kernels.ops.attention.fla.layernorm_gated.rms_norm_gated"
SIGMOID_MUL = "sglang.kernels.ops.elementwise.elementwise.fused_sigmoid_mul"


def _server_on_cpu() -> bool:
    try:
        from sglang.srt.server_args import get_global_server_args

        return getattr(get_global_server_args(), "device", None) == "cpu"
    except Exception:  # no server context (e.g. a bare module import): not a CPU server
        return False


def around_rope_init(original: Callable[..., Any], self, *args: Any, **kwargs: Any) -> None:
    """AROUND ``RotaryEmbedding.__init__``: on a CPU server, build it as SGLang's CPU platform would."""
    if not _server_on_cpu():
        return original(self, *args, **kwargs)
    import sglang.srt.layers.rotary_embedding.base as base

    previous = base._is_cpu
    base._is_cpu = True
    try:
        return original(self, *args, **kwargs)
    finally:
        base._is_cpu = previous


def around_qkvzba_split(
    original: Callable[..., Any], mixed_qkvz: torch.Tensor, mixed_ba: torch.Tensor, *args: Any, **kwargs: Any
) -> Any:
    """AROUND ``fused_qkvzba_split_reshape_cat``: the torch split for CPU tensors."""
    if mixed_qkvz.device.type != "cpu":
        return original(mixed_qkvz, mixed_ba, *args, **kwargs)
    from sglang_replayssm.cpu.gdn import qkvzba_split_interleaved

    return qkvzba_split_interleaved(mixed_qkvz, mixed_ba, *args, **kwargs)


def around_rms_norm_gated(
    original: Callable[..., Any],
    x: torch.Tensor,
    g: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    activation: str = "swish",
    residual: torch.Tensor | None = None,
    prenorm: bool = False,
    residual_in_fp32: bool = False,
    eps: float = 1e-6,
) -> Any:
    """AROUND ``rms_norm_gated``: the torch gated RMSNorm for CPU tensors (no residual / prenorm)."""
    if x.device.type != "cpu":
        return original(x, g, weight, bias, activation, residual, prenorm, residual_in_fp32, eps)
    if residual is not None or prenorm:
        raise NotImplementedError("ReplaySSM CPU rms_norm_gated: residual / prenorm are not supported")
    from sglang_replayssm.cpu.gdn import rms_norm_gated

    return rms_norm_gated(x, g, weight, bias, activation, eps)


def around_gate_sigmoid_mul_add(
    original: Callable[..., Any], hidden_states: torch.Tensor, gate_weight: torch.Tensor,
    shared_output: torch.Tensor, final_hidden_states: torch.Tensor,
) -> None:
    """AROUND ``fused_gate_sigmoid_mul_add``: the torch in-place update for CPU tensors."""
    if final_hidden_states.device.type != "cpu":
        return original(hidden_states, gate_weight, shared_output, final_hidden_states)
    from sglang_replayssm.cpu.gdn import gate_sigmoid_mul_add

    return gate_sigmoid_mul_add(hidden_states, gate_weight, shared_output, final_hidden_states)


def around_qkvzba_split_contiguous(
    original: Callable[..., Any], mixed_qkvz: torch.Tensor, mixed_ba: torch.Tensor, *args: Any, **kwargs: Any
) -> Any:
    """AROUND ``fused_qkvzba_split_reshape_cat_contiguous``: the torch split for CPU tensors."""
    if mixed_qkvz.device.type != "cpu":
        return original(mixed_qkvz, mixed_ba, *args, **kwargs)
    from sglang_replayssm.cpu.gdn import qkvzba_split_contiguous

    return qkvzba_split_contiguous(mixed_qkvz, mixed_ba, *args, **kwargs)


def around_layernorm_gated(
    original: Callable[..., Any],
    *,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    z: torch.Tensor | None = None,
    eps: float = 1e-6,
    group_size: int | None = None,
    norm_before_gate: bool = True,
    is_rms_norm: bool = False,
    activation: str = "swish",
) -> Any:
    """AROUND ``layernorm_gated.rms_norm_gated`` (keyword-only, as SGLang's): the torch gated RMSNorm
    for CPU tensors in Qwen3.5's mode (RMS norm before the gate, one group)."""
    if x.device.type != "cpu":
        return original(x=x, weight=weight, bias=bias, z=z, eps=eps, group_size=group_size,
                        norm_before_gate=norm_before_gate, is_rms_norm=is_rms_norm, activation=activation)
    if z is None or not is_rms_norm or not norm_before_gate or group_size not in (None, x.shape[-1]):
        raise NotImplementedError(
            "ReplaySSM CPU layernorm_gated.rms_norm_gated: only the RMS norm before a gate over the whole "
            f"last axis is supported (got z={'None' if z is None else 'given'}, is_rms_norm={is_rms_norm}, "
            f"norm_before_gate={norm_before_gate}, group_size={group_size})"
        )
    from sglang_replayssm.cpu.gdn import rms_norm_gated

    return rms_norm_gated(x, z, weight, bias, activation, eps)


def around_sigmoid_mul(
    original: Callable[..., Any], attn_output: torch.Tensor, gate: torch.Tensor, inplace: bool = False
) -> torch.Tensor:
    """AROUND ``fused_sigmoid_mul``: the torch gate for CPU tensors."""
    if attn_output.device.type != "cpu":
        return original(attn_output, gate, inplace)
    from sglang_replayssm.cpu.gdn import sigmoid_mul

    return sigmoid_mul(attn_output, gate, inplace)


HOOKS: list[HookSpec] = [
    HookSpec(target=ROPE_INIT, hook=around_rope_init, hook_type="around"),
    HookSpec(target=QKVZBA_SPLIT, hook=around_qkvzba_split, hook_type="around"),
    HookSpec(target=RMS_NORM_GATED, hook=around_rms_norm_gated, hook_type="around"),
    HookSpec(target=GATE_SIGMOID_MUL_ADD, hook=around_gate_sigmoid_mul_add, hook_type="around"),
    HookSpec(target=QKVZBA_SPLIT_CONTIGUOUS, hook=around_qkvzba_split_contiguous, hook_type="around"),
    HookSpec(target=LAYERNORM_GATED, hook=around_layernorm_gated, hook_type="around"),
    HookSpec(target=SIGMOID_MUL, hook=around_sigmoid_mul, hook_type="around"),
]
