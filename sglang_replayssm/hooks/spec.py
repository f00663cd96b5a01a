"""The post-verify commit hook for speculative decoding with ``--ssm-backend replay``.

``hybrid_linear_attn_backend.HybridLinearAttnBackend.update_mamba_state_after_mtp_verify`` (AROUND)
    Why: after sampling, SGLang commits a verify step by copying the per-draft state of each
    request's last accepted token from ``intermediate_ssm`` into ``temporal`` and its conv window
    into the conv state (``scatter_mamba_states_after_mtp_verify``).  The replay verify keeps no
    per-draft state: the accepted tokens are ring records already, so the commit is a cursor move.
    It is the one call every speculative algorithm's commit reaches (``spec_utils.
    commit_mamba_states_after_verify`` for EAGLE / STANDALONE / NGRAM, and dspark / dflash directly).
    How: when the linear backend is a ReplaySSM backend and the verify forward took the replay path,
    advance the cursors of the verify rows by the accepted counts (``last_correct_step_indices + 1``,
    a linear chain) with ``replayssm_kernels.verify_commit`` (one launch, no host sync) and roll the
    conv state back to the last accepted token from ``intermediate_conv_window`` (SGLang's own conv
    rollback kernel on CUDA); ``temporal`` is not touched.  A forward that took SGLang's snapshot
    verify (``spec.py``, "Snapshot fallback") is committed by the original, then the rows' rings
    are emptied.  Radix tracking during spec (``mamba_track_indices``) is
    refused at startup; a call that carries it raises.  Any other backend: the original.
    Removal: when SGLang lets a linear backend own its post-verify commit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sglang_replayssm.hooks import HookSpec

__all__ = ["HOOKS", "COMMIT_TARGET", "around_update_after_verify"]

COMMIT_TARGET = (
    "sglang.srt.layers.attention.hybrid_linear_attn_backend.HybridLinearAttnBackend."
    "update_mamba_state_after_mtp_verify"
)


def around_update_after_verify(
    original: Callable[..., Any],
    self,
    last_correct_step_indices,
    mamba_track_indices=None,
    mamba_steps_to_track=None,
    model=None,
    req_pool_indices=None,
) -> None:
    """AROUND ``update_mamba_state_after_mtp_verify``: the ReplaySSM commit (see the module docstring)."""
    from sglang_replayssm.spec import VerifyMetadataMixin

    linear = getattr(self, "linear_attn_backend", None)
    if not isinstance(linear, VerifyMetadataMixin):
        return original(self, last_correct_step_indices, mamba_track_indices, mamba_steps_to_track, model,
                        req_pool_indices)
    if mamba_track_indices is not None:
        raise RuntimeError(
            "ReplaySSM: mamba radix tracking during speculative decoding is not supported (refused at startup; "
            "use --mamba-radix-cache-strategy no_buffer or --disable-radix-cache)"
        )
    linear.commit_after_verify(
        last_correct_step_indices,
        lambda: original(self, last_correct_step_indices, mamba_track_indices, mamba_steps_to_track, model,
                         req_pool_indices),
    )


HOOKS: list[HookSpec] = [
    HookSpec(target=COMMIT_TARGET, hook=around_update_after_verify, hook_type="around",
             callers=("sglang.srt.speculative.spec_utils.commit_mamba_states_after_verify",
                      "sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2._update_target_mamba_state_after_verify",
                      "sglang.srt.speculative.dspark_components.dspark_worker_v2.DSparkWorkerV2."
                      "_commit_target_mamba_states_after_verify")),
]
