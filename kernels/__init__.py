"""ReplaySSM kernels: Triton kernels beside plain-torch references (never imports SGLang).

See README.md in this folder for the ring protocol, record layouts and bytes per record.
"""

from replayssm_kernels.commit import (
    flush_limit,
    min_ring_size,
    verify_commit,
    verify_commit_ref,
    verify_cursor_step,
)
from replayssm_kernels.conventional.gdn import gdn_conventional_f64
from replayssm_kernels.conventional.mamba2 import mamba2_conventional_f64
from replayssm_kernels.cursors import decode_cursor_step, decode_cursor_step_ref, reset_cursors
from replayssm_kernels.gdn_decode import gdn_replay_decode, gdn_replay_decode_ref
from replayssm_kernels.gdn_verify import gdn_replay_verify, gdn_replay_verify_ref
from replayssm_kernels.mamba2_decode import mamba2_replay_decode, mamba2_replay_decode_ref
from replayssm_kernels.mamba2_verify import mamba2_replay_verify, mamba2_replay_verify_ref
from replayssm_kernels.read_copy_refresh import refresh_read_copy, refresh_read_copy_ref
from replayssm_kernels.row_order import flush_first_order, flush_first_order_ref

__all__ = [
    "decode_cursor_step",
    "decode_cursor_step_ref",
    "reset_cursors",
    "verify_cursor_step",
    "verify_commit",
    "verify_commit_ref",
    "min_ring_size",
    "flush_limit",
    "flush_first_order",
    "flush_first_order_ref",
    "mamba2_replay_decode",
    "mamba2_replay_decode_ref",
    "mamba2_replay_verify",
    "mamba2_replay_verify_ref",
    "mamba2_conventional_f64",
    "gdn_replay_decode",
    "gdn_replay_decode_ref",
    "gdn_conventional_f64",
    "gdn_replay_verify",
    "gdn_replay_verify_ref",
    "refresh_read_copy",
    "refresh_read_copy_ref",
]
