"""Mamba-2 ReplaySSM decode.

Triton kernel in ``kernel.py``, plain-torch reference in ``reference.py``.
"""

from replayssm_kernels.mamba2_decode.kernel import mamba2_replay_decode
from replayssm_kernels.mamba2_decode.reference import mamba2_replay_decode_ref

__all__ = ["mamba2_replay_decode", "mamba2_replay_decode_ref"]
