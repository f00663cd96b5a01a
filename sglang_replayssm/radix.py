"""Radix-cache prefix sharing with ReplaySSM rings: what a slot must hold when the tree takes it.

A live slot's logical state is its checkpoint ``S0`` plus the ``len`` committed records of its ring
(``kernels/README.md``).  SGLang's radix cache (``UnifiedRadixCache`` + ``MambaComponent``, 0.5.17)
only knows ``temporal`` (``S0``) and ``conv``, so the plug-in keeps two invariants:

**T (tree).** Every slot held by the radix tree has an empty ring (``len == 0``), so its checkpoint is
the complete state for the key length the tree gives it.  Established at donation by
``seal_donated_slot`` (hooked into ``MambaComponent.prepare_for_caching_req``,
``hooks/radix.py``):

- finished request, ``no_buffer``: SGLang itself caps the key by ``replayssm_write_pos`` (our
  ``len``) and zeroes it; the live slot becomes the node.  The cut (``len`` tokens, at most
  ``L - 1``) is counted here, not silent;
- unfinished request (chunked-prefill insert), ``no_buffer``: SGLang copies the live slot into a new
  one (``copy_from``, which carries the ring: see below); the key is capped by the copied ``len``
  and the copy's ring emptied.  After an extend the live ring is empty, so nothing is cut then;
- ``extra_buffer``: the donated ping-pong track slot's checkpoint was copied from a row that
  force-flushed in that step (``metadata.py``), so it is complete; its cursor, left over from the
  slot's previous owner (SGLang's ping-pong allocation does not reset it), is zeroed.

**F (fork).** ``ReplayMambaPool.copy_from`` copies the ring rows and the cursors with the
checkpoint: the destination is the same logical state as the source, whatever the source's ``len``.
A copy-on-write from a tree node (``len == 0`` by T) therefore starts with an empty ring.

Together with SGLang's allocation reset, T and F give **E (extend)**: a slot entering an extend
forward (prefill, chunked prefill, radix-hit suffix) has an empty ring, which SGLang's extend
kernels need (they read ``temporal`` alone as the initial state).  ``check_extend_rows`` checks E
on the device.

Not built: materialising the pending ring tail (folding it into ``S0``) at donation instead of
cutting it from the key; that needs each layer's parameters (Mamba-2's ``A``) at the pool.
"""

from __future__ import annotations

import logging

import torch

__all__ = ["seal_donated_slot", "reset_tree_slots", "check_extend_rows", "DonationStats"]

logger = logging.getLogger(__name__)


class DonationStats:
    """Per-process counters of donations (read by tests and logged at debug level).

    Attributes
    ----------
    donated : int
        Slots sealed for the tree.
    cut_tokens : int
        Key tokens cut because their records were still in the ring.
    """

    donated: int = 0
    cut_tokens: int = 0

    @classmethod
    def reset(cls) -> None:
        cls.donated = 0
        cls.cut_tokens = 0


def seal_donated_slot(cursors: torch.Tensor, slot: int | torch.Tensor, cache_len: int) -> int:
    """Make ``slot``'s checkpoint the complete state of its key; return the key length it holds.

    Parameters
    ----------
    cursors : torch.Tensor
        The pool's ``[slots, 2]`` int32 cursors (modified in place: ``slot``'s row is zeroed).
    slot : int or torch.Tensor
        The slot the tree takes (a 0-d or 1-element tensor, as SGLang passes it, or an int >= 1).
    cache_len : int
        The key length SGLang means to insert.

    Returns
    -------
    int
        ``cache_len - len``: the checkpoint is the state after that many tokens (host sync: reads
        ``len``).

    Raises
    ------
    ValueError
        On a slot outside ``[1, slots)`` or a ``len`` larger than ``cache_len``.
    """
    s = int(slot.reshape(-1)[0]) if isinstance(slot, torch.Tensor) else int(slot)
    if not 1 <= s < cursors.shape[0]:
        raise ValueError(f"seal_donated_slot: slot expected in [1, {cursors.shape[0]}), got {s}")
    n = int(cursors[s, 1])
    if n > cache_len:
        raise ValueError(
            f"seal_donated_slot: slot {s} has {n} ring records but the key claims only {cache_len} tokens"
        )
    cursors[s] = 0
    DonationStats.donated += 1
    if n:
        DonationStats.cut_tokens += n
        logger.debug("ReplaySSM radix: slot %d donated with %d ring records: key %d -> %d tokens",
                     s, n, cache_len, cache_len - n)
    return cache_len - n


def reset_tree_slots(cursors: torch.Tensor, slots: torch.Tensor) -> None:
    """Zero the cursors of slots whose checkpoint is complete by construction (no host sync).

    Parameters
    ----------
    cursors : torch.Tensor
        ``[slots, 2]`` int32 (in place).
    slots : torch.Tensor
        Slot indices (any shape, integer); each must be in ``[1, slots)``.
    """
    idx = slots.reshape(-1).to(device=cursors.device, dtype=torch.long)
    cursors.index_fill_(0, idx, 0)


def check_extend_rows(cursors: torch.Tensor, extend_slots: torch.Tensor) -> None:
    """Invariant E: every slot an extend forward writes has an empty ring (device-side assert).

    Parameters
    ----------
    cursors : torch.Tensor
        ``[slots, 2]`` int32 cursors, before the extend rows are reset.
    extend_slots : torch.Tensor
        The extend rows' slots; ``-1`` (padding) reads the null slot 0, whose ``len`` is 0.

    Raises
    ------
    RuntimeError
        On a CPU tensor at once; on a GPU the assert fires asynchronously (no host sync).
    """
    if extend_slots.numel() == 0:
        return
    idx = extend_slots.to(device=cursors.device, dtype=torch.long).clamp(min=0)
    torch._assert_async(
        (cursors[idx, 1] == 0).all(),
        "ReplaySSM: a slot entered an extend forward with records in its ring (radix invariant E)",
    )
