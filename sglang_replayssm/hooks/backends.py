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
    backend hook fires for it), and some server options conflict with the rings.
    How: refuses to start (``ReplaySSMStartupError``) unless the target model is a supported Mamba-2
    or GDN hybrid, and refuses SGLang's built-in ReplaySSM flags, speculative setups that cannot
    run (``spec_plan.startup_refusals``: on ``--device cpu`` SGLang's built-in algorithms and tree
    drafts; ``--replayssm-verify replay`` with tree drafts; ``--speculative-adaptive``), tensor-parallel
    layouts that cannot shard the SSM heads and groups (``tp.startup_refusal``), a Philox round count
    for stochastic rounding (``--mamba-cache-philox-rounds``: our flush hashes its bits), streaming sessions (a
    session keeps a finished turn's slot without folding its ring), unified memory, PD
    disaggregation, and for GDN ``--enable-mixed-chunk``;
    draft model configs are not checked.  Runs during ``ServerArgs`` resolution, in the launching process,
    before anything is loaded (and again in each scheduler).
    Removal: never (it is the plug-in's own validation), unless SGLang grows a capability query.
"""

from __future__ import annotations

from sglang_replayssm import tp
from sglang_replayssm.config import ReplaySSMConfig
from sglang_replayssm.errors import ReplaySSMStartupError
from sglang_replayssm.gdn import ReplayGDNAttnBackend
from sglang_replayssm.hooks import HookSpec
from sglang_replayssm.hooks.pool import replay_family
from sglang_replayssm.mamba2 import ReplayMamba2AttnBackend, replay_selective_state_update
from sglang_replayssm.spec_plan import startup_refusals

__all__ = ["HOOKS", "validate_startup"]


def _refusals(model_config, server_args) -> list[str]:
    problems = []
    try:
        family = replay_family(model_config)
    except ValueError as exc:
        return [str(exc)]
    if getattr(server_args, "enable_linear_replayssm", False) or getattr(
        server_args, "enable_linear_replayssm_spec", False
    ):
        problems.append(
            "SGLang's built-in --enable-linear-replayssm / --enable-linear-replayssm-spec cannot be combined "
            "with --ssm-backend replay; use one of them"
        )
    config = ReplaySSMConfig.from_env()
    problems += startup_refusals(server_args, config.verify)
    tp_problem = tp.startup_refusal(family, model_config, server_args)
    if tp_problem:
        problems.append(tp_problem)
    if getattr(server_args, "enable_mamba_cache_stochastic_rounding", False) and getattr(
        server_args, "mamba_cache_philox_rounds", 0
    ):
        problems.append(
            "--mamba-cache-philox-rounds: the ReplaySSM flush draws its stochastic-rounding bits from a counter hash "
            "(replayssm_kernels/stochastic_round.py), not from Philox; leave it at 0 (the hash has no rounds to set)"
        )
    if getattr(server_args, "enable_streaming_session", False):
        problems.append(
            "--enable-streaming-session is not supported with --ssm-backend replay: a streaming session keeps a "
            "finished turn's SSM slot for the next turn without folding its ring into the checkpoint; run without "
            "--enable-streaming-session, or with --ssm-backend default"
        )
    if (getattr(server_args, "pp_size", 1) or 1) > 1:
        problems.append(
            f"--pp-size {server_args.pp_size}: pipeline parallelism is not supported with --ssm-backend replay (the "
            "ring's share of the mamba memory budget is solved per stage from that stage's layers, while SGLang "
            "sizes every stage alike from the largest stage, so the stages' slot counts would differ); use "
            "--pp-size 1, or --ssm-backend default"
        )
    if getattr(server_args, "enable_unified_memory", False):
        problems.append("--enable-unified-memory is not supported with --ssm-backend replay")
    if getattr(server_args, "disaggregation_mode", "null") not in (None, "null"):
        problems.append("prefill/decode disaggregation is not supported with --ssm-backend replay yet")
    if family == "gdn":
        if getattr(server_args, "enable_mixed_chunk", False):
            problems.append(
                "--enable-mixed-chunk is not supported for Gated DeltaNet models with --ssm-backend replay"
            )
    return problems


def validate_startup(result, *args, **kwargs):
    """AFTER ``ModelConfig.from_server_args(server_args, ..., is_draft_model=...)``: refuse bad setups.

    Refused with ``ReplaySSMStartupError``: an unsupported model family, SGLang's built-in ReplaySSM
    flags, speculative setups that cannot run (``spec_plan.startup_refusals``), a Philox round count
    for the SSM cache's stochastic rounding, TP layouts that cannot
    shard the SSM heads and groups (``tp.startup_refusal``), streaming sessions, pipeline parallelism,
    unified memory, PD disaggregation, and (GDN)
    ``--enable-mixed-chunk``.  Draft model configs are not checked.
    """
    if getattr(result, "is_draft_model", False):
        return result
    server_args = kwargs.get("server_args", args[0] if args else None)
    problems = _refusals(result, server_args)
    if problems:
        raise ReplaySSMStartupError("--ssm-backend replay refused: " + "; ".join(problems))
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
        hook=validate_startup,
        hook_type="after",
    ),
]
