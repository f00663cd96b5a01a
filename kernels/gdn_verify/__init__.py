"""Gated DeltaNet ReplaySSM speculative verify: T tokens per row on the decode ring."""

from replayssm_kernels.gdn_verify.kernel import gdn_replay_verify
from replayssm_kernels.gdn_verify.reference import gdn_replay_verify_ref

__all__ = ["gdn_replay_verify", "gdn_replay_verify_ref"]
