"""Gated DeltaNet ReplaySSM decode: checkpoint + corrected-update ring (see ../README.md)."""

from replayssm_kernels.gdn_decode.kernel import gdn_replay_decode
from replayssm_kernels.gdn_decode.reference import gdn_replay_decode_ref

__all__ = ["gdn_replay_decode", "gdn_replay_decode_ref"]
