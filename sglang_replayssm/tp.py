"""Tensor parallelism: which SSM heads and groups each rank holds, and the layouts ReplaySSM refuses.

How SGLang 0.5.17 shards the SSM state (attention-TP size ``tp``: ``--tp-size``, or
``tp_size / dp_size`` with ``--enable-dp-attention``; ``configs/mamba_utils.py``,
``layers/attention/mamba/mamba.py``, ``models/qwen3_next.py``):

- Mamba-2 (``H`` heads, ``G`` groups): rank ``r`` holds heads ``[r*H/tp, (r+1)*H/tp)``.  With
  ``G % tp == 0`` it holds groups ``[r*G/tp, (r+1)*G/tp)``; with ``G == 1`` every rank holds a copy
  of the one group (``extra_groups_for_head_shards``, ``mamba_v2_sharded_weight_loader`` with
  ``duplicate_groups``).  Any other ``G`` is refused by ``MambaMixer2`` (an ``assert``).
- Gated DeltaNet (``HV`` value heads, ``Hk`` key heads): rank ``r`` holds value heads
  ``[r*HV/tp, ...)`` and key heads ``[r*Hk/tp, ...)``; ``Mamba2StateShape.num_k_heads_per_tp`` is
  ``Hk/tp`` (a ceiling division when ``Hk % tp != 0``, which the model does not support on GPU).

Either way a rank's local head ``i`` reads its local group ``i // (heads_per_rank //
groups_per_rank)``, the rule the kernels use (``h // (H // G)``, ``hv // (HV // Hk)``), so the rings
of a rank are the rings of a smaller model: ``x``/``dt`` (``u``/``v``/``g``/``beta``) for its
heads, ``B`` (``k``) for its groups.  No ring record crosses ranks and no communication is added.
Every rank has the same ring bytes per slot (SGLang's per-rank shape does not depend on the rank),
so the memory-budget hook (``hooks/pool.py``) solves the same slot count on every rank from SGLang's
rank-min free memory (``get_available_gpu_memory(distributed=True)``); without replication the
ring's share of a slot is the TP-1 share.

Cursors are per slot, not per head, and every rank holds a full copy.  They stay identical on all
ranks without communication because everything the cursor step reads is the same on every rank:
the slot indices, row counts, extend prefix lengths and track masks come from the ``ForwardBatch``
each rank's own ``Scheduler`` builds from the same broadcast requests with the same deterministic
decisions, and the window and ring rows are startup constants.  Speculative commits advance by the
accepted length, which follows from the sampled token ids; SGLang itself relies on those being
identical on every TP rank (``Sampler``, ``SYNC_TOKEN_IDS_ACROSS_TP``), since ranks that disagreed
would already desynchronise SGLang's own scheduler.  No cursor step reads SSM data.

The one start-up exchange: with speculative decoding each rank's backend plans its verify paths
from a probe of its own GPU, then every rank takes rank 0's plan (``spec_plan.agree_across_ranks``,
one ``broadcast_object`` on SGLang's TP group), so all ranks verify a bucket on the same path.
"""

from __future__ import annotations

import dataclasses

from sglang_replayssm.sizing import FAMILIES

__all__ = ["TPLayout", "tp_layout", "model_layout", "startup_refusal"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class TPLayout:
    """The SSM head and group shard of every attention-TP rank (build it with ``tp_layout``).

    Attributes
    ----------
    family : str
        ``"mamba2"`` or ``"gdn"``.
    tp_size : int
        Attention-TP size.
    num_heads : int
        Whole-model heads: Mamba-2 ``H``, GDN value heads ``HV``.
    num_groups : int
        Whole-model groups: Mamba-2 ``G``, GDN key heads ``Hk``.
    """

    family: str
    tp_size: int
    num_heads: int
    num_groups: int

    @property
    def replicated(self) -> bool:
        """True when every rank holds a copy of the model's single group (Mamba-2, ``G == 1 < tp``)."""
        return self.num_groups % self.tp_size != 0

    @property
    def heads_per_rank(self) -> int:
        return self.num_heads // self.tp_size

    @property
    def groups_per_rank(self) -> int:
        return 1 if self.replicated else self.num_groups // self.tp_size

    def heads(self, rank: int) -> range:
        """Whole-model indices of the heads rank ``rank`` holds, in local order."""
        self._check_rank(rank)
        n = self.heads_per_rank
        return range(rank * n, (rank + 1) * n)

    def groups(self, rank: int) -> range:
        """Whole-model indices of the groups rank ``rank`` holds, in local order."""
        self._check_rank(rank)
        if self.replicated:
            return range(0, 1)
        n = self.groups_per_rank
        return range(rank * n, (rank + 1) * n)

    def group_of_head(self, head: int) -> int:
        """Whole-model group read by whole-model head ``head``."""
        return head // (self.num_heads // self.num_groups)

    def local_group_of_head(self, local_head: int) -> int:
        """Local group read by local head ``local_head`` on any rank (the kernels' rule)."""
        return local_head // (self.heads_per_rank // self.groups_per_rank)

    def check_rank_shape(self, heads: int, groups: int) -> None:
        """Raise ``ValueError`` unless SGLang's per-rank shape has this layout's heads and groups."""
        if (heads, groups) != (self.heads_per_rank, self.groups_per_rank):
            raise ValueError(
                f"per-rank SSM shape: expected {self.heads_per_rank} heads and {self.groups_per_rank} "
                f"groups on each of {self.tp_size} ranks ({self.num_heads} heads, {self.num_groups} "
                f"groups in the model), got {heads} heads and {groups} groups from SGLang's cache shape"
            )

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.tp_size:
            raise ValueError(f"rank: expected 0 <= rank < {self.tp_size}, got {rank}")


def _refusal(family: str, num_heads: int, num_groups: int, tp_size: int) -> str | None:
    if num_heads % tp_size != 0:
        what = "mamba heads" if family == "mamba2" else "linear value heads (linear_num_value_heads)"
        return f"{tp_size} does not divide the {num_heads} {what}"
    if family == "mamba2" and num_groups % tp_size != 0 and num_groups != 1:
        return (
            f"{tp_size} does not divide the {num_groups} Mamba-2 groups (n_groups), and SGLang "
            "replicates groups across ranks only for a model with one group"
        )
    if family == "gdn" and num_groups % tp_size != 0:
        return f"{tp_size} does not divide the {num_groups} linear key heads (linear_num_key_heads)"
    return None


def tp_layout(*, family: str, num_heads: int, num_groups: int, tp_size: int) -> TPLayout:
    """Validate and build the per-rank SSM layout of a model under attention-TP ``tp_size``.

    Parameters
    ----------
    family : str
        ``"mamba2"`` or ``"gdn"``.
    num_heads : int
        Whole-model heads: Mamba-2 ``H``, GDN value heads ``HV``.
    num_groups : int
        Whole-model groups: Mamba-2 ``G``, GDN key heads ``Hk``.  Must divide ``num_heads``.
    tp_size : int
        Attention-TP size (``--tp-size``, or ``tp_size / dp_size`` with DP attention).

    Returns
    -------
    TPLayout

    Raises
    ------
    ValueError
        On an unknown family, non-positive sizes, heads not a multiple of groups, or a layout
        SGLang cannot shard (see the module docstring); the message names the ``--tp-size`` values
        that work for this model.
    """
    if family not in FAMILIES:
        raise ValueError(f"family: expected one of {FAMILIES}, got {family!r}")
    for name, value in (("tp_size", tp_size), ("num_heads", num_heads), ("num_groups", num_groups)):
        if value < 1:
            raise ValueError(f"{name}: expected >= 1, got {value}")
    if num_heads % num_groups != 0:
        raise ValueError(
            f"num_groups: expected a divisor of num_heads={num_heads}, got {num_groups}"
        )
    reason = _refusal(family, num_heads, num_groups, tp_size)
    if reason is not None:
        valid = [t for t in range(1, num_heads + 1) if _refusal(family, num_heads, num_groups, t) is None]
        raise ValueError(
            f"attention-TP size {tp_size} cannot shard this model's SSM state for the ReplaySSM rings: "
            f"{reason}.  Use an attention-TP size (--tp-size, or --tp-size / --dp-size with "
            f"--enable-dp-attention) among {valid}"
        )
    return TPLayout(family=family, tp_size=tp_size, num_heads=num_heads, num_groups=num_groups)


def model_layout(family: str, mambaish_config, tp_size: int) -> TPLayout:
    """``tp_layout`` for a model config that has SGLang's ``mamba2_cache_params``.

    The whole-model heads and groups are read from SGLang's own cache shape at attention-TP 1:
    ``num_heads`` and ``G = (conv_dim - intermediate_size) / (2 * state_size)`` (for GDN,
    ``Hk``), so every supported config class is read the same way.

    Parameters
    ----------
    family : str
        ``"mamba2"`` or ``"gdn"`` (``hooks.pool.replay_family``).
    mambaish_config : transformers.PretrainedConfig
        The config with ``mamba2_cache_params`` (``KVCacheConfigurator.mambaish_config``).
    tp_size : int
        The server's attention-TP size (``get_parallel().attn_tp_size``).
    """
    from sglang.srt.runtime_context import get_parallel

    with get_parallel().override(attn_tp_size=1):
        shape = mambaish_config.mamba2_cache_params.shape
    groups, rest = divmod(shape.conv_dim - shape.intermediate_size, 2 * shape.state_size)
    if rest != 0 or groups < 1:
        raise ValueError(
            f"mamba2_cache_params: expected conv_dim = intermediate_size + 2*G*state_size at TP 1, got "
            f"conv_dim={shape.conv_dim}, intermediate_size={shape.intermediate_size}, "
            f"state_size={shape.state_size}"
        )
    return tp_layout(family=family, num_heads=shape.num_heads, num_groups=groups, tp_size=tp_size)


def startup_refusal(family: str, model_config, server_args) -> str | None:
    """The TP refusal for the startup validation (``hooks/backends.validate_startup``), or None.

    Runs before anything is loaded: the attention-TP size is SGLang's own
    ``compute_dp_attention_world_info`` of the server args, the model's heads and groups come from
    ``model_layout``.

    Parameters
    ----------
    family : str
        ``"mamba2"`` or ``"gdn"`` (``hooks.pool.replay_family``).
    model_config : sglang.srt.configs.model_config.ModelConfig
        The target model's config.
    server_args : sglang.srt.server_args.ServerArgs
        Reads ``tp_size``, ``dp_size``, ``enable_dp_attention`` and ``attn_cp_size``.

    Returns
    -------
    str or None
        What to change, when the layout cannot be sharded (``tp_layout``'s message).
    """
    from sglang.srt.configs.hybrid_arch import mambaish_config
    from sglang.srt.layers.dp_attention import compute_dp_attention_world_info

    _, attn_tp_size, _, _ = compute_dp_attention_world_info(
        server_args.enable_dp_attention, 0, server_args.tp_size, server_args.dp_size, server_args.attn_cp_size
    )
    try:
        model_layout(family, mambaish_config(model_config), attn_tp_size)
    except ValueError as exc:
        return str(exc)
    return None
