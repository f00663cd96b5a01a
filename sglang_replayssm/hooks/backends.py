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
    drafts; ``--replayssm-verify replay`` with tree drafts; NGRAM at ``--speculative-ngram-max-bfs-breadth
    1``, whose tree drafts SGLang would verify as chains; DSPARK's compact ragged verify; FROZEN_KV_MTP;
    ``--speculative-adaptive``;
    ``--enable-deterministic-inference`` with ``--replayssm-verify auto`` on linear drafts, whose verify
    path depends on the batch bucket; ``spec_plan.draft_length_refusal``: for GDN, more draft tokens than
    its replay verify kernel takes with ``--replayssm-verify replay`` or on ``--device cpu``;
    ``spec_plan.target_refusal``: DFLASH / DSPARK on a Mamba-2 target),
    tensor-parallel layouts that cannot shard the SSM heads and groups (``tp.startup_refusal``), a read
    copy (``--replayssm-read-dtype``) not narrower than the SSM checkpoint's dtype, a Philox round count
    for stochastic rounding (``--mamba-cache-philox-rounds``: our flush hashes its bits), stochastic rounding
    with ``--enable-deterministic-inference`` (its bits follow a per-forward counter and the slot, which depend
    on the other requests; without it the backends pin their launches, ``batch_invariant``), streaming sessions (a
    session keeps a finished turn's slot without folding its ring), two-batch overlap (the micro-batches'
    child attention backends build forward metadata again, so the ring cursors would advance twice per
    forward), PD multiplexing (``--enable-pdmux``: layer-split prefills, which no supported model
    implements, on a second stream beside decode forwards on other backend copies), ``--enable-torch-compile``
    (not validated: the SSM layers' kernels and wrappers run inside the compiled model forward),
    pipeline parallelism, unified memory, PD disaggregation, and for GDN ``--enable-mixed-chunk``; draft
    model configs are not checked.  Runs during ``ServerArgs`` resolution, in the launching process,
    before anything is loaded (and again in each scheduler, where SGLang's speculative defaults are
    resolved).
    Removal: never (it is the plug-in's own validation), unless SGLang grows a capability query.
"""

from __future__ import annotations

import dataclasses

import torch

from sglang_replayssm import tp
from sglang_replayssm.config import ReplaySSMConfig
from sglang_replayssm.errors import ReplaySSMStartupError
from sglang_replayssm.gdn import ReplayGDNAttnBackend
from sglang_replayssm.hooks import HookSpec
from sglang_replayssm.hooks.pool import replay_family
from sglang_replayssm.mamba2 import ReplayMamba2AttnBackend, replay_selective_state_update
from sglang_replayssm.spec_plan import draft_length_refusal, startup_refusals, target_refusal

__all__ = ["HOOKS", "validate_startup"]


def _state_dtype(model_config, server_args) -> torch.dtype:
    """The dtype SGLang allocates the SSM checkpoint in: ``--mamba-ssm-dtype`` where given, else the
    model config's ``mamba2_cache_params`` (``SGLANG_MAMBA_SSM_DTYPE``, the config's ``mamba_ssm_dtype``,
    float32).  The flag comes first because ``ServerArgs`` exports it to that variable only after its
    first ``ModelConfig.from_server_args``, which this check follows."""
    from sglang.srt.configs.hybrid_arch import mambaish_config
    from sglang.srt.runtime_context import get_parallel

    flag = getattr(server_args, "mamba_ssm_dtype", None)
    if flag is not None:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[flag]
    with get_parallel().override(attn_tp_size=1):
        return mambaish_config(model_config).mamba2_cache_params.dtype.temporal


def _read_copy_refusal(config: ReplaySSMConfig, state_dtype: torch.dtype) -> str | None:
    """A read copy must be strictly narrower than the checkpoint: it exists to move fewer bytes, and a
    copy as wide in another format can overflow (fp16 holds less range than a bf16 checkpoint)."""
    read = config.read_torch_dtype()
    if read is None or read.itemsize < state_dtype.itemsize:
        return None
    narrower = [name for name in ("bf16", "fp16", "fp8")
                if dataclasses.replace(config, read_dtype=name).read_torch_dtype().itemsize < state_dtype.itemsize]
    state = str(state_dtype).removeprefix("torch.")
    return (
        f"--replayssm-read-dtype {config.read_dtype}: expected a read copy narrower than the SSM checkpoint, got "
        f"{read.itemsize} bytes per value for a {state} checkpoint ({state_dtype.itemsize} bytes; from "
        "--mamba-ssm-dtype, else SGLANG_MAMBA_SSM_DTYPE or the model config's mamba_ssm_dtype): such a copy moves "
        "no fewer bytes" + (f", and an {config.read_dtype} copy of a {state} checkpoint can overflow"
                            if (read, state_dtype) == (torch.float16, torch.bfloat16) else "")
        + "; use --replayssm-read-dtype "
        + " or ".join([*narrower, "same"]) + ", or a wider --mamba-ssm-dtype"
    )


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
    problems += [p for p in (draft_length_refusal(family, server_args, config.verify),
                             target_refusal(family, server_args)) if p]
    tp_problem = tp.startup_refusal(family, model_config, server_args)
    if tp_problem:
        problems.append(tp_problem)
    if config.read_dtype != "same":
        read_problem = _read_copy_refusal(config, _state_dtype(model_config, server_args))
        if read_problem:
            problems.append(read_problem)
    if getattr(server_args, "enable_mamba_cache_stochastic_rounding", False) and getattr(
        server_args, "mamba_cache_philox_rounds", 0
    ):
        problems.append(
            "--mamba-cache-philox-rounds: the ReplaySSM flush draws its stochastic-rounding bits from a counter hash "
            "(replayssm_kernels/stochastic_round.py), not from Philox; leave it at 0 (the hash has no rounds to set)"
        )
    if getattr(server_args, "enable_deterministic_inference", False) and getattr(
        server_args, "enable_mamba_cache_stochastic_rounding", False
    ):
        problems.append(
            "--enable-deterministic-inference with --enable-mamba-cache-stochastic-rounding is not supported with "
            "--ssm-backend replay: the flush draws its rounding bits from a counter advanced once per forward and "
            "from the request's SSM slot (replayssm_kernels/stochastic_round.py), and both depend on the other "
            "requests the server has run, so a request's checkpoint bits would depend on its batch; run without "
            "one of the two flags"
        )
    if getattr(server_args, "enable_streaming_session", False):
        problems.append(
            "--enable-streaming-session is not supported with --ssm-backend replay: a streaming session keeps a "
            "finished turn's SSM slot for the next turn without folding its ring into the checkpoint; run without "
            "--enable-streaming-session, or with --ssm-backend default"
        )
    if getattr(server_args, "enable_two_batch_overlap", False):
        problems.append(
            "--enable-two-batch-overlap is not supported with --ssm-backend replay: two-batch overlap builds the "
            "forward metadata on the main attention backend and again on each micro-batch's child backend "
            "(SGLang's TboAttnBackend), so every request's ring cursors would advance twice per forward; run "
            "without --enable-two-batch-overlap, or with --ssm-backend default"
        )
    if getattr(server_args, "enable_pdmux", False):
        problems.append(
            "--enable-pdmux is not supported with --ssm-backend replay: PD multiplexing runs every prefill as a "
            "layer-split prefill (model.forward_split_prefill, which none of SGLang 0.5.17's Mamba-2 or Gated "
            "DeltaNet hybrids implements, so stock SGLang fails at the first prefill too) on a second stream, "
            "concurrently with decode forwards on other copies of the attention backend, a schedule the rings and "
            "cursors were never run under; run without --enable-pdmux"
        )
    if getattr(server_args, "enable_torch_compile", False):
        problems.append(
            "--enable-torch-compile is not supported with --ssm-backend replay (not validated): SGLang compiles the "
            "whole model forward with torch.compile for the graph-captured batch sizes up to "
            "--torch-compile-max-bs, and the SSM layers' ReplaySSM kernels and their Python wrappers run inside "
            "that compiled region; run without --enable-torch-compile, or with --ssm-backend default"
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
    flags, speculative setups that cannot run or would not be deterministic
    (``spec_plan.startup_refusals``, ``spec_plan.draft_length_refusal``, ``spec_plan.target_refusal``),
    TP layouts that cannot
    shard the SSM heads and groups (``tp.startup_refusal``), a read copy not narrower than the SSM
    checkpoint, a Philox round count for the SSM cache's stochastic rounding, streaming sessions,
    two-batch overlap, PD multiplexing (``--enable-pdmux``), ``--enable-torch-compile``, pipeline
    parallelism, unified memory, PD disaggregation, and (GDN) ``--enable-mixed-chunk``.  Draft model
    configs are not checked.
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
