"""A deliberately broken stand-in for ``replayssm_kernels`` (``--kernels-module`` in the CLI tests).

``mamba2_replay_decode`` is the torch reference plus a wrong output, so ``--refcheck`` must refuse
to time it. No GDN kernel: the CLI must report it unavailable and time the rest.
"""

from replayssm_kernels.mamba2_decode import mamba2_replay_decode_ref


def mamba2_replay_decode(state, ring_x, ring_dt, ring_B, x, dt, A, B, C, out, slot_idx, *args,
                         **kwargs):
    mamba2_replay_decode_ref(state, ring_x, ring_dt, ring_B, x, dt, A, B, C, out, slot_idx, *args,
                             **kwargs)
    live = slot_idx >= 0
    out[live] = out[live] + 1.0
