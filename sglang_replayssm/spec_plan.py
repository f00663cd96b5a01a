"""Which verify path each CUDA-graph batch bucket takes, decided once per server start.

``plan_verify`` runs ``heuristic.decide_buckets``: one log line per bucket with its numbers, tree
drafts (snapshot) and ``--replayssm-verify`` overrides included.  In ``auto`` mode on CUDA (linear
drafts) ``plan_for_server`` hands it the timed probe of ``verify_probe`` (both paths on the server's
own pool); a probe that fails falls back to the byte model for that bucket, logged.  The backends
then route each verify forward by its batch size (``spec.VerifyMetadataMixin._snapshot_path``):
replay verify, or SGLang's snapshot verify after folding the ring into the checkpoint (``spec.py``,
"Snapshot fallback"; CUDA only).

``startup_refusals`` and ``draft_length_refusal`` hold the speculative-decoding checks of
``hooks/backends.validate_startup`` (they need only ``ServerArgs``, the plug-in config and the model
family).

Gated DeltaNet with more draft tokens than its replay verify kernel takes (``GDN_VERIFY_MAX_T``):
every ``auto`` bucket goes to SGLang's snapshot verify (``_guard_draft_length``, logged; its source
``draft-length`` is as binding as an override, so the later guards refuse what cannot take the
snapshot path instead of moving it back to replay); ``--replayssm-verify replay`` and ``--device cpu``
are refused at start-up (``draft_length_refusal``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
from collections.abc import Iterable, Sequence

import torch
from replayssm_kernels.gdn_decode._validate import MAX_T as GDN_VERIFY_MAX_T

from sglang_replayssm import heuristic
from sglang_replayssm.errors import ReplaySSMStartupError

__all__ = [
    "FORCED_SOURCES", "GDN_VERIFY_MAX_T", "agree_across_ranks", "draft_length_refusal", "plan_for_server",
    "plan_verify", "pool_snapshot_batch_limit", "pool_verify_shape", "snapshot_batch_limit", "startup_refusals",
    "target_refusal", "tp_group",
]

logger = logging.getLogger(__name__)

#: Algorithms that draft one linear block per request (``speculative_hook._handle_dflash`` /
#: ``_handle_dspark``): the flag that sets the block and the verify length it gives.
_BLOCK_DRAFTS: dict[str, tuple[str, int]] = {
    "DFLASH": ("speculative_dflash_block_size", 0),  # T = block size
    "DSPARK": ("speculative_dspark_block_size", 1),  # T = gamma + 1
}

#: ``Decision.source`` values that bind a bucket to its path: an override, tree drafts, and
#: ``_guard_draft_length``'s snapshot; the guards refuse, rather than move, such a bucket.
FORCED_SOURCES: tuple[str, ...] = ("override", "tree", "draft-length")


def _draft_topk(server_args) -> int:
    """``--speculative-eagle-topk`` as SGLang resolves it: for NGRAM, ``--speculative-ngram-max-bfs-breadth``
    (SGLang 0.5.17's ``speculative_hook._handle_ngram`` copies it over the flag, and may not have run yet
    at the first check); DFLASH and DSPARK draft linear blocks (topk 1 whatever the flag says)."""
    algorithm = str(server_args.speculative_algorithm).upper()
    if algorithm == "NGRAM":
        return server_args.speculative_ngram_max_bfs_breadth
    if algorithm in _BLOCK_DRAFTS:  # SGLang overrides any topk to 1 for them (speculative_hook)
        return 1
    return getattr(server_args, "speculative_eagle_topk", None) or 1


def _ngram_chain_refusal(server_args) -> str | None:
    """NGRAM at breadth 1: SGLang treats its drafts as chains, but they are trees.

    SGLang 0.5.17 sets ``speculative_eagle_topk`` to ``--speculative-ngram-max-bfs-breadth``
    (``arg_groups/speculative_hook.py:699``), while NGRAM's drafts are trees at any breadth: the corpus
    match walks a chain from the root for every matched suffix length (``kernels/jit/csrc/ngram_corpus/
    trie.cpp:234-236``), and a short match is padded with children of the root (``result.cpp:32-35``);
    its verify input reports an irregular tree (``ngram_info.py:55-57``, ``tree_topk = -1``) and is
    accepted along tree paths (``eagle_utils.verify_tree_greedy_func``).  At topk 1 the replay verify runs
    the ``T`` tokens as one chain and commits ``last accepted index + 1`` tokens, and SGLang's snapshot
    verify does the same (``hybrid_linear_attn_backend.py:195`` builds the tree's parent indices only for
    topk > 1), so a token after a branch would be verified on the wrong state: refused (off CPU; there
    ``_cpu_refusals`` refuses NGRAM outright).  Breadth 2 or more reaches SGLang's tree verify.
    """
    if str(server_args.speculative_algorithm).upper() != "NGRAM" or _draft_topk(server_args) > 1:
        return None
    return (
        "--speculative-algorithm NGRAM with --speculative-ngram-max-bfs-breadth 1: NGRAM's drafts are trees at any "
        "breadth (a chain from the root per matched suffix length, short matches padded with children of the "
        "root), but at breadth 1 SGLang 0.5.17 sets --speculative-eagle-topk 1, and at topk 1 both the replay "
        "verify and SGLang's snapshot verify run the draft as one chain, so tokens after a branch would be "
        "verified on the wrong SSM state (stock SGLang shares the flaw); use --speculative-ngram-max-bfs-breadth "
        "2 or more (tree drafts: SGLang's snapshot verify, with --replayssm-verify auto or snapshot)"
    )


def startup_refusals(server_args, verify_mode: str) -> list[str]:
    """Speculative-decoding refusals for ``--ssm-backend replay`` (empty without speculation).

    ``--replayssm-verify replay`` with tree drafts, NGRAM at breadth 1 (``_ngram_chain_refusal``), DSPARK's
    compact ragged verify (``_ragged_verify_refusal``), FROZEN_KV_MTP (``_frozen_kv_refusal``),
    ``--speculative-adaptive``, ``--enable-deterministic-inference`` with ``auto`` on linear drafts, and
    on ``--device cpu`` what has no CPU path (``_cpu_refusals``).  The draft's ``topk`` is read as SGLang
    resolves it (``_draft_topk``).
    """
    if not getattr(server_args, "speculative_algorithm", None):
        return []
    problems = []
    topk = _draft_topk(server_args)
    try:
        heuristic.check_verify_mode(verify_mode, topk)
    except ReplaySSMStartupError as exc:
        problems.append(str(exc))
    if getattr(server_args, "speculative_adaptive", False):
        problems.append(
            "--speculative-adaptive: the replay verify path takes one draft length per server "
            "(--speculative-num-draft-tokens), while adaptive speculation captures a verify graph per "
            "draft length; run without --speculative-adaptive, or with --ssm-backend default"
        )
    if getattr(server_args, "enable_deterministic_inference", False) and verify_mode == "auto" and topk == 1:
        problems.append(
            "--enable-deterministic-inference with --replayssm-verify auto: auto sends each CUDA-graph batch "
            "bucket to the replay verify or to SGLang's snapshot verify (decided by a timed probe), and the two "
            "sum in different orders, so a request's tokens could depend on the size of the batch it was "
            "verified in; pass --replayssm-verify replay or --replayssm-verify snapshot (both fixed at every batch "
            "size: under this flag the replay kernels launch one configuration at every batch size; for Gated "
            "DeltaNet past 16 draft tokens only snapshot)"
        )
    if getattr(server_args, "device", None) == "cpu":
        problems += _cpu_refusals(server_args, topk)
    else:
        problems += [p for p in (_ngram_chain_refusal(server_args), _ragged_verify_refusal(server_args),
                                 _frozen_kv_refusal(server_args)) if p]
    return problems


def _ragged_verify_refusal(server_args) -> str | None:
    """DSPARK with ``SGLANG_RAGGED_VERIFY_MODE=compact``: each request verifies its own number of
    tokens (``dspark_verify.py``: ``ragged_verify_layout``) and the target's verify graphs are captured
    with rows of unequal length (``decode_cuda_graph_runner``), while the replay verify (like SGLang
    0.5.17's own Mamba-2 / GDN verify) runs exactly ``T`` tokens per row.  ``static`` (the default) and
    ``cap-accept`` keep the full window."""
    if str(server_args.speculative_algorithm).upper() != "DSPARK":
        return None
    from sglang.srt.speculative.ragged_verify import RaggedVerifyMode, read_ragged_verify_mode

    if read_ragged_verify_mode() is not RaggedVerifyMode.COMPACT:
        return None
    return (
        "SGLANG_RAGGED_VERIFY_MODE=compact with --speculative-algorithm DSPARK: compact ragged verify gives each "
        "request its own verify length, but the ReplaySSM verify (like SGLang 0.5.17's own Mamba-2 / Gated "
        "DeltaNet verify) runs the same number of draft tokens for every request; set SGLANG_RAGGED_VERIFY_MODE="
        "static (the default) or cap-accept"
    )


def _frozen_kv_refusal(server_args) -> str | None:
    """FROZEN_KV_MTP (SGLang promotes NEXTN / EAGLE with a Gemma 4 assistant draft to it): its draft
    maps onto a Gemma 4 target's attention layers (``gemma4_mtp.py``), which no Mamba-2 / Gated
    DeltaNet hybrid has; SGLang 0.5.17 fails building the draft worker, after the target's pools.
    Seen as such once SGLang resolved the algorithm (the scheduler's check)."""
    if str(server_args.speculative_algorithm).upper() != "FROZEN_KV_MTP":
        return None
    return (
        "--speculative-algorithm FROZEN_KV_MTP (SGLang selects it for a Gemma 4 assistant draft): its draft attends "
        "to a Gemma 4 target's attention layers and cannot serve a Mamba-2 / Gated DeltaNet hybrid target; use "
        "NEXTN / EAGLE with the model's MTP head, STANDALONE, NGRAM or (Gated DeltaNet targets) DFLASH / DSPARK"
    )


def target_refusal(family: str, server_args) -> str | None:
    """DFLASH / DSPARK on a Mamba-2 hybrid: they need the target to capture auxiliary hidden states
    (``set_dflash_layers_to_capture`` / ``set_dspark_layers_to_capture``), which SGLang 0.5.17's
    Mamba-2 hybrids lack (stock SGLang refuses them only after loading the weights); refused here
    before anything is loaded."""
    algorithm = str(getattr(server_args, "speculative_algorithm", None)).upper()
    if family != "mamba2" or algorithm not in _BLOCK_DRAFTS:
        return None
    return (
        f"--speculative-algorithm {algorithm} needs a target that captures auxiliary hidden states for its draft "
        "(set_dflash_layers_to_capture / set_dspark_layers_to_capture), which SGLang 0.5.17's Mamba-2 hybrids do "
        "not; use NEXTN / EAGLE with the model's MTP head, STANDALONE or NGRAM"
    )


#: Algorithms whose linear drafts SGLang 0.5.17 sizes as ``--speculative-num-steps + 1`` tokens
#: (``speculative_hook._handle_eagle_family``), whatever ``--speculative-num-draft-tokens`` says.
_STEPS_PLUS_ONE = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")


def _draft_tokens(server_args) -> tuple[int, str]:
    """Linear drafts' ``T`` as SGLang resolves it, and the flag that sets it (for messages).

    The first check runs before SGLang resolves its speculative settings
    (``_handle_model_specific_adjustments`` precedes ``handle_speculative_decoding``): there an
    EAGLE-family draft with ``--speculative-num-steps`` given has ``T = steps + 1``, DFLASH its block
    size and DSPARK its block size (gamma) + 1 where given; otherwise
    ``--speculative-num-draft-tokens`` (0 while unset: the scheduler's check sees the resolved value).
    """
    steps = getattr(server_args, "speculative_num_steps", None)
    algorithm = str(server_args.speculative_algorithm).upper()
    if algorithm in _STEPS_PLUS_ONE and steps is not None:
        return steps + 1, f"--speculative-num-steps {steps}"
    if algorithm in _BLOCK_DRAFTS:
        field, extra = _BLOCK_DRAFTS[algorithm]
        block = getattr(server_args, field, None)
        if block is not None:
            return int(block) + extra, f"--{field.replace('_', '-')} {block}"
    num_tokens = getattr(server_args, "speculative_num_draft_tokens", None) or 0
    return num_tokens, f"--speculative-num-draft-tokens {num_tokens}"


def draft_length_refusal(family: str, server_args, verify_mode: str) -> str | None:
    """The start-up refusal of a draft length the Gated DeltaNet replay verify cannot run, or None.

    ``gdn_replay_verify`` takes at most ``GDN_VERIFY_MAX_T`` tokens per row (its forward substitution
    and per-token loops are unrolled over ``T``).  Linear drafts with more (tree drafts take SGLang's
    snapshot verify anyway) are refused with ``--replayssm-verify replay`` and on ``--device cpu``,
    where SGLang's snapshot verify does not run; ``auto`` on CUDA is served by the snapshot verify
    (``_guard_draft_length``).

    Parameters
    ----------
    family : str
        ``"mamba2"`` or ``"gdn"`` (``hooks.pool.replay_family``).
    server_args : sglang.srt.server_args.ServerArgs
        Reads ``speculative_algorithm``, ``speculative_num_steps`` / ``speculative_num_draft_tokens``
        (``_draft_tokens``; unset until SGLang resolves its speculative defaults: checked again in each
        scheduler), the draft's topk (``_draft_topk``) and ``device``.
    verify_mode : str
        ``--replayssm-verify``.
    """
    if family != "gdn" or not getattr(server_args, "speculative_algorithm", None) or _draft_topk(server_args) > 1:
        return None
    num_tokens, given = _draft_tokens(server_args)
    if num_tokens <= GDN_VERIFY_MAX_T:
        return None
    limit = (f"{given}: {num_tokens} draft tokens, but the Gated DeltaNet replay verify kernel takes at most "
             f"{GDN_VERIFY_MAX_T} (its forward substitution is unrolled over them)")
    if getattr(server_args, "device", None) == "cpu":
        return (f"{limit}, and on --device cpu SGLang's snapshot verify does not run; use "
                f"--speculative-num-draft-tokens {GDN_VERIFY_MAX_T} or fewer")
    if verify_mode == "replay":
        return (f"{limit}; use --speculative-num-draft-tokens {GDN_VERIFY_MAX_T} or fewer, or --replayssm-verify "
                "auto or snapshot (SGLang's snapshot verify then serves every batch)")
    return None


#: Why each built-in algorithm cannot run on ``--device cpu`` (without ``sgl_kernel``'s CPU build).
_CPU_BLOCKERS: dict[str, str] = {
    "NGRAM": "ngram_worker imports sgl_kernel at module level and its corpus is a C++ JIT build",
    "EAGLE": "the draft worker has no torch_native draft attention backend",
    "EAGLE3": "the draft worker has no torch_native draft attention backend",
    "STANDALONE": "the draft worker has no torch_native draft attention backend",
}


def _cpu_refusals(server_args, topk: int) -> list[str]:
    """Speculative decoding on ``--device cpu``: what still cannot run, with what to change.

    Runs: a plug-in-registered algorithm (``SpeculativeAlgorithm.register``, a ``CustomSpecAlgo``)
    with linear drafts, through the CPU shims of ``hooks/cpu_spec.py``.  See
    ``benchmarks/notes/spec_algorithms.md``.
    """
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    name = str(server_args.speculative_algorithm).upper()
    if not isinstance(SpeculativeAlgorithm.from_string(name), CustomSpecAlgo):
        why = _CPU_BLOCKERS.get(name, "it has no CPU path in SGLang 0.5.17")
        return [
            f"speculative decoding on --device cpu with {name}: {why}; on a CPU only a plug-in-registered "
            "algorithm (SpeculativeAlgorithm.register) with linear drafts runs (see "
            "benchmarks/notes/spec_algorithms.md)"
        ]
    if topk > 1:
        return [
            f"speculative decoding on --device cpu: tree drafts (--speculative-eagle-topk {topk} > 1) have no CPU "
            "verify attention (torch_native serves linear chains only); use --speculative-eagle-topk 1"
        ]
    return []


def plan_verify(
    *,
    buckets: Iterable[int],
    num_tokens: int,
    topk: int,
    mode: str,
    shape: heuristic.VerifyShape,
    profile: heuristic.DeviceProfile,
    cache: heuristic.DecisionCache | None = None,
    probe: heuristic.Probe | None = None,
    log: logging.Logger | None = logger,
) -> dict[int, heuristic.Decision]:
    """Decide every bucket's verify path (one log line each); returns ``{bucket: Decision}``.

    Parameters
    ----------
    buckets : iterable of int
        CUDA-graph batch sizes (or ``[max_running_requests]`` without graphs).
    num_tokens : int
        ``T`` (``--speculative-num-draft-tokens``).
    topk : int
        ``--speculative-eagle-topk`` (``> 1``: tree drafts, snapshot path).
    mode : str
        ``--replayssm-verify``.
    shape : heuristic.VerifyShape
        The model's SSM layer shape (``heuristic.verify_shape``).
    profile : heuristic.DeviceProfile
        The device (``heuristic.cuda_device_profile``: measured copy bandwidth; or the CPU profile).
    cache : heuristic.DecisionCache, optional
        Re-used and filled in ``auto`` mode.
    probe : heuristic.Probe, optional
        Times both paths of a bucket (``auto`` on CUDA only; ``verify_probe.make_probe``).
    log : logging.Logger or None
        Where the lines go; None: not logged (decisions a guard replaces before they are final).

    Raises
    ------
    ReplaySSMStartupError
        ``--replayssm-verify replay`` with tree drafts, or an unknown mode.
    """
    return heuristic.decide_buckets(buckets, num_tokens, shape, profile, mode=mode, topk=topk, probe=probe,
                                    cache=cache, log=log)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def pool_verify_shape(pool) -> heuristic.VerifyShape:
    """``heuristic.VerifyShape`` of a ``ReplayMambaPool`` (its own state and ring shapes; a split-precision
    read copy's element size and, fp8, per-row scale size, from the pool's ``read_state`` / ``read_scale``;
    ``variant`` names the checkpoint's and activations' dtypes (fp16 and bf16 have one size but other
    kernels), the copy's dtype and stochastic rounding, which change the kernels' cost)."""
    temporal = pool.mamba_cache.temporal
    spec = pool.ring_spec
    num_k_heads = spec.tensors["k"][0][0] if spec.family == "gdn" else 1
    shape = heuristic.verify_shape(
        family=spec.family, temporal_shape=tuple(temporal.shape[2:]), conv_dim=pool.mamba_cache.conv[0].shape[2],
        num_k_heads=num_k_heads, num_layers=spec.num_layers, window=spec.window, state_dtype=temporal.dtype,
        act_dtype=pool.replay.act_dtype,
    )
    read, scale = pool.read_state, pool.read_scale
    variant = [f"state-{_dtype_name(temporal.dtype)}", f"act-{_dtype_name(pool.replay.act_dtype)}"] + (
        [f"read-{_dtype_name(read.dtype)}"] if read is not None else []) + (["sr"] if pool.sr_seed is not None else [])
    return dataclasses.replace(
        shape, variant="+".join(variant), read_bytes=None if read is None else read.element_size(),
        read_scale_bytes=0 if scale is None else scale.element_size(),
    )


def _profile(device: torch.device) -> heuristic.DeviceProfile:
    """CUDA: the measured copy bandwidth (256 MiB probe: the server's pools are allocated by now);
    any other device: the CPU profile (byte model only)."""
    if device.type != "cuda":
        return heuristic.cpu_device_profile()
    return heuristic.cuda_device_profile(device.index, probe_bytes=256 << 20)


def _probe(pool, buckets: list[int], mode: str, topk: int, device: torch.device) -> heuristic.Probe | None:
    """The timed probe where it is used: ``auto`` mode, linear drafts, CUDA, a draft length the replay
    verify runs; else None (overrides, tree drafts and ``_guard_draft_length``'s buckets need no timing,
    and a CPU decides from the byte model)."""
    if mode != "auto" or topk > 1 or device.type != "cuda" or _over_draft_length(pool.ring_spec.family,
                                                                                  pool.spec_tokens):
        return None
    from sglang_replayssm.verify_probe import make_probe

    return make_probe(pool, buckets, device)


#: SGLang 0.5.17's post-verify commit scatter (``fused_mamba_state_scatter_with_mask``) forms the source
#: offset ``pid_req * src_req_stride`` in int32; it wraps (illegal memory access) once
#: ``(batch - 1) * T * state_elems`` passes this.
INT32_MAX = 2**31 - 1


def snapshot_batch_limit(num_tokens: int, state_elems: int) -> int:
    """Largest batch whose snapshot commit offsets fit SGLang 0.5.17's int32 arithmetic.

    ``state_elems`` is one layer's per-request state (``H·P·N`` or ``HV·V·K``); the per-draft buffer's
    request stride is ``T·state_elems`` (Nano-4B shape: 274 at T = 8, 547 at T = 4). Read from
    SGLang's Triton source and its sm_90a PTX (``mul.lo.s32``); a batch of 512 at T = 8 faulted
    on the H200 at that commit (benchmarks/RESULTS.md, run of 7050b4b); the cause is read, not
    confirmed on the GPU.
    """
    stride = num_tokens * state_elems
    if stride > INT32_MAX:  # passed as i64 then: the product does not wrap
        return sys.maxsize
    return INT32_MAX // stride + 1


def pool_snapshot_batch_limit(pool) -> int:
    """``snapshot_batch_limit`` of a ``ReplayMambaPool``'s verify (its ``T`` and state size)."""
    return snapshot_batch_limit(pool.spec_tokens, math.prod(pool.mamba_cache.temporal.shape[2:]))


def _keep_off_snapshot(plan: dict[int, heuristic.Decision], bad: list[int], reason: str, refusal: str,
                       log: logging.Logger) -> dict[int, heuristic.Decision]:
    """Buckets ``bad`` must not take the snapshot verify: ``auto`` decisions there move to replay with
    ``reason`` (logged); forced ones (``FORCED_SOURCES``: an override, tree drafts, a GDN draft length
    past the replay kernel's) are refused with ``refusal`` (which must name what to change; the
    buckets and why they are on the snapshot path are prepended)."""
    forced = [bs for bs in bad if plan[bs].source in FORCED_SOURCES]
    if forced:
        raise ReplaySSMStartupError(
            f"--ssm-backend replay: batch buckets {forced} go to SGLang's snapshot verify ({plan[forced[0]].reason}), "
            + refusal
        )
    out = dict(plan)
    for bs in bad:
        out[bs] = dataclasses.replace(plan[bs], path="replay", reason=reason)
        log.info(out[bs].log_line())
    return out


def _over_draft_length(family: str, num_tokens: int) -> bool:
    """Whether the replay verify kernel cannot run ``num_tokens`` (Gated DeltaNet past ``GDN_VERIFY_MAX_T``)."""
    return family == "gdn" and num_tokens > GDN_VERIFY_MAX_T


def _guard_draft_length(plan: dict[int, heuristic.Decision], family: str, num_tokens: int,
                        log: logging.Logger = logger) -> dict[int, heuristic.Decision]:
    """Gated DeltaNet past ``GDN_VERIFY_MAX_T`` draft tokens: every ``auto`` bucket goes to SGLang's
    snapshot verify, source ``draft-length`` (logged; ``FORCED_SOURCES``, so the later guards refuse
    a bucket that cannot take the snapshot path rather than move it to replay); a forced replay is
    refused (``draft_length_refusal`` refuses it at start-up already).  Tree drafts and a forced
    snapshot are there already."""
    if not _over_draft_length(family, num_tokens):
        return plan
    forced = sorted(bs for bs, d in plan.items() if d.source in FORCED_SOURCES and d.path == "replay")
    if forced:
        raise ReplaySSMStartupError(
            f"--ssm-backend replay: batch buckets {forced} are forced to the replay verify, whose Gated DeltaNet "
            f"kernel takes at most {GDN_VERIFY_MAX_T} draft tokens (T={num_tokens}); use "
            f"--speculative-num-draft-tokens {GDN_VERIFY_MAX_T} or fewer, or --replayssm-verify auto or snapshot"
        )
    reason = (f"the Gated DeltaNet replay verify takes at most {GDN_VERIFY_MAX_T} draft tokens, T={num_tokens}; "
              f"--speculative-num-draft-tokens {GDN_VERIFY_MAX_T} or fewer would let it run")
    out = dict(plan)
    for bs in sorted(plan):
        if plan[bs].source not in FORCED_SOURCES:
            out[bs] = dataclasses.replace(plan[bs], path="snapshot", reason=reason, source="draft-length")
            log.info(out[bs].log_line())
    return out


def _guard_snapshot_overflow(plan: dict[int, heuristic.Decision], num_tokens: int, limit: int,
                             log: logging.Logger = logger) -> dict[int, heuristic.Decision]:
    """Buckets above ``limit`` (``snapshot_batch_limit``) must not take the snapshot verify: ``auto``
    decisions move to replay (logged); forced ones there are refused (what to change is named).  The
    largest eager batch is a bucket of the plan (``verify_buckets``), so the guard covers eager verify
    batches too."""
    bad = sorted(bs for bs, d in plan.items() if d.path == "snapshot" and bs > limit)
    # the replay verify is the way out, except where it cannot run the draft length
    way_out = ("--speculative-num-draft-tokens " + str(GDN_VERIFY_MAX_T) + " or fewer (the replay verify then runs)"
               if any(plan[bs].source == "draft-length" for bs in bad)
               else "--replayssm-verify replay with linear drafts")
    return _keep_off_snapshot(
        plan, bad, reason=f"snapshot commit would overflow SGLang 0.5.17's int32 offsets above batch {limit}",
        refusal=(f"whose commit scatter overflows int32 offsets above batch {limit} at T={num_tokens} (SGLang "
                 f"0.5.17); cap --cuda-graph-max-bs / --max-running-requests at {limit}, or use {way_out}"),
        log=log)


def _guard_device(plan: dict[int, heuristic.Decision], device: torch.device,
                  log: logging.Logger = logger) -> dict[int, heuristic.Decision]:
    """SGLang's snapshot verify is CUDA-only: on another device, ``auto`` decisions for it move to
    replay (logged; the byte model may favour it for small buckets); an override is refused."""
    if device.type == "cuda":
        return plan
    bad = sorted(bs for bs, d in plan.items() if d.path == "snapshot")
    return _keep_off_snapshot(
        plan, bad, reason=f"SGLang's snapshot verify needs CUDA (device {device})",
        refusal=f"which needs CUDA (device {device}); use --replayssm-verify replay", log=log)


def tp_group():
    """SGLang's tensor-parallel ``GroupCoordinator`` where it has more than one rank, else None (one
    rank, or no distributed state: unit tests)."""
    try:
        from sglang.srt.distributed import get_tp_group

        group = get_tp_group()
    except (ImportError, AssertionError):  # not initialised
        return None
    return group if group.world_size > 1 else None


def agree_across_ranks(plan: dict[int, heuristic.Decision], group,
                       log: logging.Logger = logger) -> dict[int, heuristic.Decision]:
    """Rank 0's verify plan on every rank of ``group`` (a ``GroupCoordinator``; None: ``plan``).

    Each tensor-parallel rank probes its own GPU, so near a tie two ranks could send a bucket down
    different paths: their SSM heads would then verify with different numerics and capture different
    graphs. Rank 0's plan is broadcast (``group.broadcast_object``: one collective per backend at
    start-up, reached in the same order on every rank, which builds the same backends from the same
    arguments); a rank whose own decision for a bucket differed logs it. Plans over different buckets
    are refused (the ranks' server arguments differ)."""
    if group is None:
        return plan
    ref = group.broadcast_object(plan if group.rank_in_group == 0 else None, src=0)
    if sorted(ref) != sorted(plan):
        raise ReplaySSMStartupError(
            f"--ssm-backend replay: tensor-parallel rank {group.rank_in_group} planned verify buckets {sorted(plan)}, "
            f"rank 0 {sorted(ref)}: the ranks' CUDA-graph settings differ"
        )
    for bs in sorted(plan):
        if ref[bs].path != plan[bs].path:
            log.info("ReplaySSM verify bs=%d: rank %d takes rank 0's %s path (its own decision: %s, %s)",
                     bs, group.rank_in_group, ref[bs].path, plan[bs].path, plan[bs].reason)
    return ref


def verify_buckets(server_args, max_batch: int = 0, capture_bs: Sequence[int] | None = None) -> list[int]:
    """The verify batch sizes to decide: the CUDA-graph buckets, plus the largest eager batch.

    ``capture_bs``: the buckets SGLang captures (``get_batch_sizes_to_capture``: the configured list
    clamped to the request pool, which adds the pool's size where the list passes it); ``None``: the
    configured list as given.  ``max_batch`` (the model runner's maximum of running requests; 0:
    ``server_args.max_running_requests``, else 1) is added where it passes every bucket, so eager
    verify batches above the largest graph get a decision (and a log line) of their own; without
    CUDA graphs it is the only bucket."""
    graph = None if server_args.disable_cuda_graph else getattr(server_args, "cuda_graph_config", None)
    buckets = []
    if graph is not None and graph.decode.bs:
        buckets = list(capture_bs) if capture_bs is not None else list(graph.decode.bs)
    top = max_batch or server_args.max_running_requests or 1
    if not buckets or top > max(buckets):
        buckets.append(top)
    return sorted(set(buckets))


def plan_for_server(pool, server_args, device: torch.device, max_batch: int = 0,
                    capture_bs: Sequence[int] | None = None) -> dict[int, heuristic.Decision]:
    """``plan_verify`` for a target backend: buckets (``verify_buckets``), ``T``, ``topk`` and mode from
    the server's settings.

    Also refuses mamba radix tracking (``extra_buffer``) with speculative decoding: its post-verify
    track copy reads per-draft states that the replay verify does not keep; sends every bucket to the
    snapshot verify where the Gated DeltaNet replay verify cannot run the draft length
    (``_guard_draft_length``); and keeps buckets (and,
    for a forced snapshot, eager batches up to ``max_batch``, the model runner's resolved maximum of
    running requests) above ``snapshot_batch_limit`` off the snapshot verify
    (``_guard_snapshot_overflow``).  On a non-CUDA device
    every bucket takes the replay path (SGLang's snapshot verify is CUDA-only): ``auto`` decisions move
    there, logged, and a forced snapshot is refused (``_guard_device``). With tensor parallelism every
    rank takes rank 0's plan (``agree_across_ranks``).
    """
    from sglang_replayssm.config import ReplaySSMConfig

    if server_args.enable_mamba_extra_buffer():
        raise ReplaySSMStartupError(
            "--ssm-backend replay with speculative decoding: mamba radix tracking (extra_buffer) is not supported; "
            "use --mamba-radix-cache-strategy no_buffer --disable-overlap-schedule, or --disable-radix-cache"
        )
    buckets = verify_buckets(server_args, max_batch, capture_bs)
    topk = server_args.speculative_eagle_topk or 1
    mode = ReplaySSMConfig.from_env().verify
    # every auto bucket goes to snapshot below (_guard_draft_length logs that): nothing logged or cached here
    over = mode == "auto" and topk <= 1 and _over_draft_length(pool.ring_spec.family, pool.spec_tokens)
    plan = plan_verify(
        buckets=buckets, num_tokens=pool.spec_tokens, topk=topk, mode=mode, shape=pool_verify_shape(pool),
        profile=_profile(device),
        cache=None if over else heuristic.DecisionCache(heuristic.default_cache_path()),
        probe=_probe(pool, buckets, mode, topk, device),
        log=None if over else logger,
    )
    plan = _guard_draft_length(plan, pool.ring_spec.family, pool.spec_tokens)
    plan = _guard_snapshot_overflow(plan, pool.spec_tokens, pool_snapshot_batch_limit(pool))
    plan = _guard_device(plan, device)
    plan = agree_across_ranks(plan, tp_group())
    snap = sorted(bs for bs, d in plan.items() if d.path == "snapshot")
    if snap and pool.mamba_cache.intermediate_ssm is None:
        raise ReplaySSMStartupError(
            f"--ssm-backend replay: batch buckets {snap} go to SGLang's snapshot verify, but the pool has no "
            "per-draft buffer (--replayssm-verify replay was set when it was built)"
        )
    return plan
