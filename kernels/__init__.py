"""ReplaySSM kernels: Triton kernels beside plain-torch references (never imports SGLang).

See README.md in this folder for the ring protocol, record layouts and bytes per record.
"""

from replayssm_kernels.cursors import decode_cursor_step, reset_cursors

__all__ = ["decode_cursor_step", "reset_cursors"]
