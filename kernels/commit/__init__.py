"""Speculative-verify cursor snapshot and commit (shared by Mamba-2 and GDN verify).

Triton commit and cursor step in ``kernel.py``, plain-torch reference in ``reference.py``.
"""

from replayssm_kernels.commit._validate import min_ring_size
from replayssm_kernels.commit.kernel import verify_commit, verify_cursor_step
from replayssm_kernels.commit.reference import flush_limit, verify_commit_ref, verify_cursor_step_ref

__all__ = ["verify_commit", "verify_commit_ref", "verify_cursor_step", "verify_cursor_step_ref",
           "min_ring_size", "flush_limit"]
