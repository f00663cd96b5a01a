"""Hooks that route hybrid-SSM decode through the ReplaySSM backends.

``hybrid_linear_attn_backend.Mamba2AttnBackend`` (class REPLACE)
    Why: the cursor snapshot / advance must run once per forward, in the metadata build, eager and
    under CUDA graphs; NemotronH / Falcon-H1 / Granite assert ``isinstance(..., Mamba2AttnBackend)``.
    How: ``mamba2.ReplayMamba2AttnBackend`` subclasses it; ``attn_backend_wrapper`` imports the name
    inside the function, so the replacement is what it builds.
    Removal: when SGLang has a backend registry for linear-attention layers.

``mamba.mamba.selective_state_update`` (AROUND)
    Why: it is ``MambaMixer2.forward``'s only decode SSU call site; hooking it keeps the mixer stock.
    How: transparent (calls the original) unless a ReplaySSM layer context is active, in which case
    it runs ``mamba2_replay_decode`` on the same tensors.  Propagation also rebinds the name in
    ``ssu_dispatch`` and ``triton_ops``; the hook is transparent there too.
    Removal: with a kernel-dispatch extension point for the Mamba-2 SSU.

``linear.gdn_backend.GDNAttnBackend`` (class REPLACE)
    Why / How: as for Mamba-2, with ``gdn.ReplayGDNAttnBackend``, whose ``forward_decode`` runs
    ``gdn_replay_decode``.

``model_config.ModelConfig.from_server_args`` (AFTER)
    Why: a model family ReplaySSM does not support would otherwise start stock silently (no pool or
    backend hook fires for it).
    How: refuses to start (``ReplaySSMStartupError``) unless the target model is a supported Mamba-2
    or GDN hybrid; draft models are not checked.  Runs during ``ServerArgs`` resolution, in the
    launching process, before anything is loaded.
    Removal: never (it is the plug-in's own validation), unless SGLang grows a capability query.
"""

from __future__ import annotations

from sglang_replayssm.errors import ReplaySSMStartupError
from sglang_replayssm.gdn import ReplayGDNAttnBackend
from sglang_replayssm.hooks import HookSpec
from sglang_replayssm.hooks.pool import replay_family
from sglang_replayssm.mamba2 import ReplayMamba2AttnBackend, replay_selective_state_update

__all__ = ["HOOKS", "check_model_family"]


def check_model_family(result, *args, **kwargs):
    """AFTER ``ModelConfig.from_server_args``: refuse unsupported model families."""
    is_draft = kwargs.get("is_draft_model", args[3] if len(args) > 3 else False)
    if is_draft:
        return result
    try:
        replay_family(result)
    except ValueError as exc:
        raise ReplaySSMStartupError(str(exc)) from None
    return result


HOOKS: list[HookSpec] = [
    HookSpec(
        target="sglang.srt.layers.attention.hybrid_linear_attn_backend.Mamba2AttnBackend",
        hook=ReplayMamba2AttnBackend,
        hook_type="replace",
    ),
    HookSpec(
        target="sglang.srt.layers.attention.linear.gdn_backend.GDNAttnBackend",
        hook=ReplayGDNAttnBackend,
        hook_type="replace",
    ),
    HookSpec(
        target="sglang.srt.layers.attention.mamba.mamba.selective_state_update",
        hook=replay_selective_state_update,
        hook_type="around",
    ),
    HookSpec(
        target="sglang.srt.configs.model_config.ModelConfig.from_server_args",
        hook=check_model_family,
        hook_type="after",
    ),
]
