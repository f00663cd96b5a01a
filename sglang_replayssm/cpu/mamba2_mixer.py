"""A pure-torch ``MambaMixer2.forward`` for CPU tensors (``--device cpu``), ring decode included.

SGLang 0.5.17 cannot run a Mamba-2 layer on a CPU: ``MambaMixer2.forward`` reaches
``causal_conv1d_fn_triton``, which ``mamba.py`` imports for CUDA/NPU/XPU only (``NameError``), then the
Triton SSD and ``selective_state_update``.  Only ``ReplayMamba2AttnBackend.forward`` calls this
module, and only for CPU tensors, so ``--ssm-backend default`` leaves SGLang unchanged (and still
unable to run Mamba-2 on a CPU).

The math is the mixer's (``../shared/design/cpu-serving.md``): in_proj, split
``[gate | xBC | dt]``, depthwise causal conv over ``[previous K-1 | x]`` with the conv state
``[slots, conv_dim, K-1]`` (window on the last axis), bias + SiLU, the SSM, ``norm(y, gate)``,
out_proj.  Extend rows run the fp32 recurrence token by token (conventional order
``S = S*exp(A*dt) + (B*dt) x``) from the slot's checkpoint when the row has a cached prefix, and
write the final state; decode rows run the ring kernel reference on the forward's ``ReplayStep``.
Token order and slots follow ``Mamba2Metadata`` exactly: extend rows first, then decode rows.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from sglang_replayssm.metadata import ReplayStep
from sglang_replayssm.spec import VerifyStep

__all__ = ["conv_verify_windows", "mamba2_mixer_forward_cpu"]


def _softplus(u: torch.Tensor) -> torch.Tensor:
    # The conventional kernels' softplus: log(1 + e^u) for u <= 20, else u.
    return torch.where(u <= 20.0, torch.log(torch.exp(u) + 1), u)


def _conv_extend(
    x: torch.Tensor, prev: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv of one sequence. x [T, C], prev [C, K-1] or None; returns (y [T, C], new state)."""
    c, km1 = weight.shape[0], weight.shape[1] - 1
    xt = x.t().to(weight.dtype)  # [C, T]
    if prev is None:
        prev = torch.zeros(c, km1, dtype=weight.dtype, device=x.device)
    xpad = torch.cat([prev.to(weight.dtype), xt], dim=1)  # [C, K-1+T]
    y = F.conv1d(xpad[None], weight[:, None, :], bias, groups=c)[0]  # [C, T]
    return y.t(), xpad[:, -km1:] if km1 > 0 else xpad[:, :0]


def conv_verify_windows(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    windows: torch.Tensor,
) -> torch.Tensor:
    """Causal conv of ``T`` verify tokens per request, as SGLang's verify conv does it.

    ``x [batch, T, C]``; ``conv_state [slots, C, K-1]`` is read, not written (the commit rolls it
    forward to the last accepted token); ``windows [batch, T, C, K-1]`` (SGLang's per-layer
    ``intermediate_conv_window``, any strides) receives the conv window after each token.  Returns
    the conv output (before the activation) ``[batch, T, C]``.  Padding rows (slot ``-1``) read the
    null slot and their windows are written too (never read).  Each token is the decode step's
    reduction (``(window * weight).sum(-1)``), so a verified token equals its decoded self.
    """
    k = weight.shape[1]
    safe = slots.long().clamp(min=0)
    xpad = torch.cat([conv_state[safe], x.to(conv_state.dtype).transpose(1, 2)], dim=2)  # [b, C, K-1+T]
    win = xpad.unfold(2, k, 1)  # [b, C, T, K]
    y = (win * weight[None, :, None, :].to(win.dtype)).sum(-1)
    if bias is not None:
        y = y + bias[None, :, None].to(y.dtype)
    windows.copy_(xpad.unfold(2, k - 1, 1)[:, :, 1:].permute(0, 2, 1, 3).to(windows.dtype))
    return y.transpose(1, 2)


def mamba2_mixer_forward_cpu(
    mixer,
    *,
    hidden_states: torch.Tensor,
    output: torch.Tensor | None,
    layer_cache,
    metadata,
    rings: dict[str, torch.Tensor],
    step: ReplayStep | None,
    decode_fn: Callable[..., None],
    mup_vector: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run ``mixer`` (a ``MambaMixer2``) on CPU tensors; returns the projected output.

    Parameters
    ----------
    mixer : MambaMixer2
        The layer (weights, sizes, norm, projections).
    hidden_states : torch.Tensor
        ``[tokens, hidden]``.
    output : torch.Tensor or None
        Written with the result when given (as the stock mixer does).
    layer_cache : MambaPool.State
        This layer's ``conv[0]`` ``[slots, conv_dim, K-1]`` and ``temporal`` ``[slots, H, P, N]``.
    metadata : Mamba2Metadata
        Row counts, ``query_start_loc``, ``mamba_cache_indices``, ``mixed_metadata``.
    rings : dict
        This layer's ring views (``x``, ``dt``, ``B``).
    step : ReplayStep or VerifyStep or None
        The forward's cursor snapshot for the decode rows (None without decode rows); a
        ``VerifyStep`` for a TARGET_VERIFY forward (``metadata.is_target_verify``).
    decode_fn : callable
        ``mamba2_replay_decode`` with the binding signature (the plain-torch reference on CPU), or
        ``mamba2_replay_verify_ref`` for a verify forward.
    """
    if metadata.is_target_verify and not isinstance(step, VerifyStep):
        raise RuntimeError("ReplaySSM CPU mixer: a TARGET_VERIFY forward needs a VerifyStep")
    conv_state = layer_cache.conv[0]
    ssm_state = layer_cache.temporal
    tp = mixer.tp_size
    H = mixer.num_heads // tp
    P = mixer.head_dim
    N = mixer.ssm_state_size
    G = mixer.n_groups // tp
    inner = mixer.intermediate_size // tp
    gss = mixer.groups_ssm_state_size // tp
    hpg = H // G

    projected, _ = mixer.in_proj(hidden_states)
    if mup_vector is not None:
        projected = projected * mup_vector
    gate, xbc, dt = torch.split(projected, [inner, mixer.conv_dim // tp, H], dim=-1)
    weight = mixer.conv1d.weight.view(mixer.conv1d.weight.size(0), mixer.conv1d.weight.size(2))
    bias = mixer.conv1d.bias

    num_prefills = metadata.num_prefills
    num_decodes = metadata.num_decodes
    num_prefill_tokens = metadata.num_prefill_tokens
    slots = metadata.mamba_cache_indices
    y_all = torch.zeros(projected.shape[0], H * P, dtype=hidden_states.dtype, device=hidden_states.device)

    A = mixer.A.float()  # already -exp(A_log)
    Dp = mixer.D.float()
    dt_bias = mixer.dt_bias.float()

    if num_prefills:
        qsl = metadata.query_start_loc[: num_prefills + 1].tolist()
        mm = metadata.mixed_metadata
        has_init = mm.has_initial_states[:num_prefills].tolist() if mm is not None else [False] * num_prefills
        for r in range(num_prefills):
            s = int(slots[r])
            lo, hi = qsl[r], qsl[r + 1]
            if s < 0 or hi <= lo:
                continue
            prev = conv_state[s] if has_init[r] else None
            xc, new_conv = _conv_extend(xbc[lo:hi], prev, weight, bias)
            conv_state[s] = new_conv.to(conv_state.dtype)
            xc = F.silu(xc).to(hidden_states.dtype)
            xs, Bs, Cs = torch.split(xc, [inner, gss, gss], dim=-1)
            xs = xs.float().view(-1, H, P)
            Bs = Bs.float().view(-1, G, N).repeat_interleave(hpg, dim=1)  # [T, H, N]
            Cs = Cs.float().view(-1, G, N).repeat_interleave(hpg, dim=1)
            delta = _softplus(dt[lo:hi].float() + dt_bias)  # [T, H]
            S = ssm_state[s].float() if has_init[r] else torch.zeros(H, P, N)
            ys = torch.empty(hi - lo, H, P)
            for t in range(hi - lo):
                dA = torch.exp(A * delta[t])
                dB = Bs[t] * delta[t][:, None]
                S = S * dA[:, None, None] + dB[:, None, :] * xs[t][:, :, None]
                ys[t] = (S * Cs[t][:, None, :]).sum(-1) + Dp[:, None] * xs[t]
            ssm_state[s] = S.to(ssm_state.dtype)
            y_all[lo:hi] = ys.reshape(hi - lo, H * P).to(y_all.dtype)

    if num_decodes and isinstance(step, VerifyStep):
        T = step.num_tokens
        xin = xbc[num_prefill_tokens:].view(num_decodes, T, -1)
        xc = conv_verify_windows(xin, conv_state, step.slot_idx, weight, bias,
                                 layer_cache.intermediate_conv_window[0][:num_decodes])
        xc = F.silu(xc).to(hidden_states.dtype)
        xs, Bd, Cd = torch.split(xc, [inner, gss, gss], dim=-1)
        out_v = torch.empty(num_decodes, T, H, P, dtype=hidden_states.dtype)
        decode_fn(
            ssm_state,
            rings["x"],
            rings["dt"],
            rings["B"],
            xs.reshape(num_decodes, T, H, P),
            dt[num_prefill_tokens:].view(num_decodes, T, H)[..., None].expand(-1, -1, -1, P),
            A[:, None, None].expand(-1, P, N),
            Bd.reshape(num_decodes, T, G, N),
            Cd.reshape(num_decodes, T, G, N),
            out_v,
            step.slot_idx,
            step.ring_start,
            step.ring_len,
            step.flush,
            D=mixer.D[:, None].expand(-1, P),
            z=None,
            dt_bias=mixer.dt_bias[:, None].expand(-1, P),
            dt_softplus=True,
        )
        y_all[num_prefill_tokens:] = out_v.reshape(num_decodes * T, H * P)
    elif num_decodes:
        if step is None:
            raise RuntimeError("ReplaySSM CPU mixer: decode rows without a cursor snapshot")
        d0, d1 = num_prefill_tokens, num_prefill_tokens + num_decodes
        sl = step.slot_idx
        safe = sl.long().clamp(min=0)
        xin = xbc[d0:d1].to(conv_state.dtype)  # [nd, C]
        window = torch.cat([conv_state[safe], xin[:, :, None]], dim=2)  # [nd, C, K]
        xc = (window * weight[None].to(window.dtype)).sum(-1)
        if bias is not None:
            xc = xc + bias.to(xc.dtype)
        valid = sl >= 0
        new_conv = window[:, :, 1:]
        if bool(valid.all()):
            conv_state[safe] = new_conv
        else:
            conv_state[safe[valid]] = new_conv[valid]
        xc = F.silu(xc).to(hidden_states.dtype)
        xs, Bd, Cd = torch.split(xc, [inner, gss, gss], dim=-1)
        out_d = torch.empty(num_decodes, H, P, dtype=hidden_states.dtype)
        decode_fn(
            ssm_state,
            rings["x"],
            rings["dt"],
            rings["B"],
            xs.reshape(num_decodes, H, P),
            dt[d0:d1][:, :, None].expand(-1, -1, P),
            A[:, None, None].expand(-1, P, N),
            Bd.reshape(num_decodes, G, N),
            Cd.reshape(num_decodes, G, N),
            out_d,
            sl,
            step.ring_start,
            step.ring_len,
            step.flush,
            D=mixer.D[:, None].expand(-1, P),
            z=None,
            dt_bias=mixer.dt_bias[:, None].expand(-1, P),
            dt_softplus=True,
        )
        y_all[d0:d1] = out_d.reshape(num_decodes, H * P)

    normed = mixer.norm.forward_native(y_all, gate)
    mixer_out, _ = mixer.out_proj(normed)
    if output is not None:
        output[: hidden_states.shape[0]].copy_(mixer_out)
    return mixer_out
