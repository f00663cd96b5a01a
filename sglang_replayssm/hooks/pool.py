"""Hooks that install the ReplaySSM mamba pool and charge its bytes to SGLang's memory budget.

``KVCacheConfigurator._build_hybrid_req_pool`` (AROUND)
    Why: ``HybridReqToTokenPool.mamba_pool_cls`` is a class attribute, which ``HookRegistry``'s
    propagation does not reach, and the pool needs the model family and activation dtype, which
    SGLang does not pass to it.
    How: for the duration of the original call, ``HybridReqToTokenPool.mamba_pool_cls`` is a factory
    building ``ReplayMambaPool`` with this configurator's family, window and dtype; afterwards the
    attribute is restored (EAGLE draft pools built later by ``clone_with_new_mamba`` stay stock) and
    the built pool is checked to be a ``ReplayMambaPool``, so a pool class that bypasses
    ``mamba_pool_cls`` (unified memory) fails closed.  Unsupported families are refused here with a
    clear message, and so are radix features that bypass the pool (``radix.startup_refusals``:
    HiCache, the int8 mamba checkpoint pool).  Mamba-2 pools get each layer's ``A`` (``fold_A``) for
    radix materialisation.
    Removal: when SGLang lets a plug-in choose the mamba pool class per server.

``KVCacheConfigurator._handle_max_mamba_cache`` (AROUND)
    Why: the rings (and a split-precision read copy) are not part of ``mamba_cache_per_req``, so
    without this ``--mem-fraction-static`` would be exceeded by ``(K+1) * ring_bytes_per_slot``.
    How: the original solves ``K`` slots; if ``K`` was derived from the memory budget we republish
    ``K' = floor((K+1) * per_req / (per_req + ring)) - 1`` (same bytes), otherwise (explicit
    ``--max-mamba-cache-size`` / ``--max-running-requests``) we keep ``K``; either way the returned
    remaining memory is reduced by the ring bytes of ``K'+1`` slots.  With speculative decoding and
    ``--replayssm-verify replay`` on linear chains (nothing reads SGLang's per-draft SSM snapshots),
    the original solves as without speculation, so the ``intermediate_ssm`` reserve (``T`` states
    per running request) is not taken out of the budget; ``ReplayMambaPool`` never allocates that
    buffer (it builds ``MambaPool`` without speculation and adds the rest of SGLang's speculative state).
    Removal: SGLang 0.5.23 has ``extra_mamba_cache_bytes_per_req``.
"""

from __future__ import annotations

import contextlib
import functools
import logging

from sglang_replayssm.config import ReplaySSMConfig
from sglang_replayssm.hooks import HookSpec
from sglang_replayssm.sizing import ring_spec

__all__ = ["HOOKS", "replay_family", "around_build_hybrid_req_pool", "around_handle_max_mamba_cache"]

logger = logging.getLogger(__name__)

_CONFIGURATOR = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator"
SUPPORTED = (
    "Mamba-2 hybrids (NemotronH, NemotronH_Nano_VL_V2, FalconH1, GraniteMoeHybrid) and Gated DeltaNet "
    "hybrids (Qwen3Next, Qwen3.5 / Qwen3.5-MoE)"
)


def replay_family(model_config) -> str:
    """``"mamba2"`` or ``"gdn"`` for a model ReplaySSM supports; raise ``ValueError`` otherwise."""
    from sglang.srt.configs.hybrid_arch import hybrid_gdn_config, mamba2_config

    hf = model_config.hf_config
    arch = (getattr(hf, "architectures", None) or [type(hf).__name__])[0]
    if hybrid_gdn_config(model_config) is not None:
        name = type(model_config.hf_config.get_text_config()).__name__
        if name in ("Qwen3NextConfig", "Qwen3_5Config", "Qwen3_5MoeConfig", "Qwen3_5TextConfig",
                    "Qwen3_5MoeTextConfig"):
            return "gdn"
    elif mamba2_config(model_config) is not None:
        name = type(hf).__name__
        if name in ("NemotronHConfig", "NemotronHPuzzleConfig", "NemotronH_Nano_VL_V2_Config",
                    "FalconH1Config", "GraniteMoeHybridConfig"):
            return "mamba2"
    raise ValueError(
        f"--ssm-backend replay supports {SUPPORTED}; model architecture {arch} is not one of them. "
        "Run it with --ssm-backend default."
    )


def _spec_for(configurator):
    from sglang.srt.runtime_context import get_parallel

    from sglang_replayssm import tp
    from sglang_replayssm.pool import ReplayPoolSpec

    cfg = ReplaySSMConfig.from_env()
    family = replay_family(configurator.model_config)
    layout = tp.model_layout(family, configurator.mambaish_config, get_parallel().attn_tp_size)
    return ReplayPoolSpec(family=family, window=cfg.window, act_dtype=configurator.model_config.dtype,
                          layout=layout, read_dtype=cfg.read_torch_dtype(),
                          stochastic_rounding=configurator.server_args.enable_mamba_cache_stochastic_rounding)


def around_build_hybrid_req_pool(original, self, *args, **kwargs):
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

    from sglang_replayssm.pool import ReplayMambaPool

    from sglang_replayssm.radix import startup_refusals

    spec = _spec_for(self)
    problems = startup_refusals(self.server_args)
    if problems:
        raise RuntimeError("ReplaySSM: " + "; ".join(problems))
    previous = HybridReqToTokenPool.__dict__.get("mamba_pool_cls")
    HybridReqToTokenPool.mamba_pool_cls = functools.partial(ReplayMambaPool, replay=spec)
    try:
        pool = original(self, *args, **kwargs)
    finally:
        HybridReqToTokenPool.mamba_pool_cls = previous
    mamba_pool = getattr(pool, "mamba_pool", None)
    if not isinstance(mamba_pool, ReplayMambaPool):
        raise RuntimeError(
            f"ReplaySSM: {type(pool).__name__} built a {type(mamba_pool).__name__}, not a ReplayMambaPool "
            "(unified memory and other custom hybrid pools are not supported with --ssm-backend replay)"
        )
    if spec.family == "mamba2":
        from sglang_replayssm.radix_materialise import mamba2_layer_A

        # Materialising a slot for the radix tree folds its Mamba-2 records with each layer's A.
        mamba_pool.fold_A = mamba2_layer_A(self.model, mamba_pool.mamba_cache.temporal.shape[0])
    return pool


def ring_bytes_per_slot(configurator) -> int:
    """Ring + cursor (+ read copy) bytes of one mamba slot on this rank (what ``ReplayMambaPool`` allocates)."""
    from sglang_replayssm.pool import read_copy_bytes_per_slot

    spec = _spec_for(configurator)
    params = configurator.mambaish_config.mamba2_cache_params
    layers = [
        i for i in params.layers
        if configurator.layer_info.start_layer <= i < configurator.layer_info.end_layer
    ]
    # As the pool: speculative rings hold R = max(L, T) + T rows (T = SGLang's draft-token maximum),
    # sized from this rank's shard of heads and groups.
    return ring_spec(
        family=spec.family,
        temporal_shape=tuple(params.shape.temporal),
        conv_dim=params.shape.conv[0][0],
        num_k_heads=params.shape.num_k_heads_per_tp,
        num_layers=len(layers),
        window=spec.window,
        act_dtype=spec.act_dtype,
        spec_tokens=int(configurator.server_args.max_speculative_num_draft_tokens or 0),
        layout=spec.layout,
    ).bytes_per_slot + read_copy_bytes_per_slot(tuple(params.shape.temporal), len(layers), spec.read_dtype)


@contextlib.contextmanager
def _solved_without_draft_states(configurator):
    """Let SGLang's solve see no speculative algorithm, so it reserves no per-draft SSM snapshots.

    ``_handle_max_mamba_cache`` reads ``spec_algorithm`` only to reserve ``intermediate_ssm``
    (``(reqs + 1) * T * mamba_cache_per_req``); the configurator's attribute is restored afterwards.
    """
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    saved = configurator.spec_algorithm
    configurator.spec_algorithm = SpeculativeAlgorithm.NONE
    try:
        yield
    finally:
        configurator.spec_algorithm = saved


def around_handle_max_mamba_cache(original, self, total_rest_memory):
    from sglang.srt.runtime_context import get_context, get_memory, get_schedule

    explicit = get_schedule().max_mamba_cache_size is not None or (
        get_memory().disable_radix_cache and get_schedule().max_running_requests is not None
    )
    no_draft_states = not self.spec_algorithm.is_none() and not ReplaySSMConfig.from_env().needs_draft_states(
        self.server_args.speculative_eagle_topk
    )
    with _solved_without_draft_states(self) if no_draft_states else contextlib.nullcontext():
        rest = original(self, total_rest_memory)
    if no_draft_states:
        logger.info(
            "ReplaySSM memory: --replayssm-verify replay with linear drafts keeps no per-draft SSM states; "
            "SGLang's intermediate_ssm reserve (T=%d snapshots per running request) goes to mamba slots and KV",
            self.server_args.speculative_num_draft_tokens,
        )
    k = get_schedule().max_mamba_cache_size
    ring = ring_bytes_per_slot(self)
    per_req = self.mambaish_config.mamba2_cache_params.mamba_cache_per_req
    gib = float(1 << 30)
    if explicit:
        k_new = k
    else:
        # Same bytes as the original solve: (K+1) * per_req == (K'+1) * (per_req + ring).
        k_new = (k + 1) * per_req // (per_req + ring) - 1
        if k_new <= 0:
            raise RuntimeError(
                f"ReplaySSM: not enough memory for the rings: {k} mamba slots of {per_req} B shrink to "
                f"{k_new} with {ring} B of ring per slot; lower --replayssm-window or raise "
                "--mem-fraction-static"
            )
        get_context().override("replayssm.ring_budget", max_mamba_cache_size=k_new)
        rest += (k + 1) * per_req / gib - (k_new + 1) * per_req / gib
    rest -= (k_new + 1) * ring / gib
    logger.info(
        "ReplaySSM memory: %d B of ring (+ read copy) per mamba slot (state %d B per slot); "
        "max_mamba_cache_size %d -> %d "
        "(%s); rings charged %.3f GB",
        ring, per_req, k, k_new, "explicit size kept" if explicit else "budget re-solved",
        (k_new + 1) * ring / gib,
    )
    return rest


HOOKS: list[HookSpec] = [
    HookSpec(
        target=f"{_CONFIGURATOR}._build_hybrid_req_pool",
        hook=around_build_hybrid_req_pool,
        hook_type="around",
    ),
    HookSpec(
        target=f"{_CONFIGURATOR}._handle_max_mamba_cache",
        hook=around_handle_max_mamba_cache,
        hook_type="around",
    ),
]
