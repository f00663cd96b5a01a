"""Mamba-2 ReplaySSM speculative verify (linear draft chains).

Triton kernel in ``kernel.py``, plain-torch reference in ``reference.py``.
"""

from replayssm_kernels.mamba2_verify.kernel import mamba2_replay_verify
from replayssm_kernels.mamba2_verify.reference import mamba2_replay_verify_ref

__all__ = ["mamba2_replay_verify", "mamba2_replay_verify_ref"]
