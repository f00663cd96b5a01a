"""Radix-cache prefix sharing with ReplaySSM rings: what a slot must hold when the tree takes it.

A live slot's logical state is its checkpoint ``S0`` plus the ``len`` committed records of its ring
(``kernels/README.md``).  SGLang's radix cache (``UnifiedRadixCache`` + ``MambaComponent``, 0.5.17)
only knows ``temporal`` (``S0``) and ``conv``, so the plug-in keeps these invariants:

**T (tree).** Every slot held by the radix tree has an empty ring (cursor pair ``(0, 0)``), so its
checkpoint, like its conv state, is the complete state for the key length the tree gives it.
Established at donation (hooked into ``MambaComponent.prepare_for_caching_req``,
``hooks/radix.py``):

- ``no_buffer`` (finished request: the live slot becomes the node; unfinished, i.e. a
  chunked-prefill insert: SGLang copies the live slot): the live slot is materialised first
  (``radix_materialise.materialise_slot``: its ring folded into its checkpoint, exactly as a flush
  would), so the key keeps its full length.  (SGLang's own cap by ``replayssm_write_pos`` never
  runs: the pool leaves that name unset, ``pool.py``.)  Cutting the key instead would be wrong: the
  conv state is always the live one;
- ``extra_buffer``: the donated ping-pong track slot's checkpoint was copied from a row that
  force-flushed in that step (``metadata.py``), so it is complete; its cursor, left over from the
  slot's previous owner (SGLang's ping-pong allocation does not reset it), is zeroed.

**F (fork).** ``ReplayMambaPool.copy_from`` copies the cursors with the checkpoint: the
destination is the same logical state as the source.  SGLang's sources have empty rings (a
copy-on-write reads a tree node, ``len == 0`` by T; the ``no_buffer`` insert copies the live slot
after the hook folded it), so the ring rows are not copied and a source with records fails a
device-side assert; ``copy_from(..., carry_ring=True)`` forks a source with records whole (tests).

Together with the reset of every freshly allocated slot (``ReplayMambaPool.clear_slots``, which
SGLang's deferred clear runs before the slot's first forward), T and F give **E (extend)**: a slot entering an extend
forward (prefill, chunked prefill, radix-hit suffix) has an empty ring, which SGLang's extend
kernels need (they read ``temporal`` alone as the initial state).  ``check_extend_rows`` checks E
on the device.
"""

from __future__ import annotations

import torch

__all__ = [
    "reset_tree_slots", "extend_index", "assert_all", "check_extend_index", "check_extend_rows",
    "startup_refusals", "DonationStats",
]


class DonationStats:
    """Per-process counters of donations (read by tests).

    Attributes
    ----------
    donated : int
        Slots (or copies) the tree took.
    count_tokens : bool
        Also count ``materialised_tokens``: reads the donor's cursor on the host before the fold (a
        host sync per donation on a GPU), so off by default; tests turn it on.
    materialised_tokens : int
        Ring records folded into checkpoints before a donation (only while ``count_tokens``).
    """

    donated: int = 0
    count_tokens: bool = False
    materialised_tokens: int = 0

    @classmethod
    def reset(cls) -> None:
        cls.donated = 0
        cls.count_tokens = False
        cls.materialised_tokens = 0


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


def extend_index(cursors: torch.Tensor, extend_slots: torch.Tensor) -> torch.Tensor:
    """The extend rows' slots as an int64 index into ``cursors``; ``-1`` (padding) becomes the null slot 0.

    Built once per extend forward and shared by the invariant check and the reset (``metadata.py``):
    a dtype conversion and a clamp (two launches for SGLang's int32 slots).
    """
    return extend_slots.to(device=cursors.device, dtype=torch.long).reshape(-1).clamp(min=0)


def assert_all(cond: torch.Tensor, msg: str) -> None:
    """Device-side assert that every element of the bool tensor ``cond`` holds (no host sync).

    A one-element ``cond`` (a batch of one) goes to the assert as it is, without the ``all`` reduction.
    """
    torch._assert_async(cond if cond.numel() == 1 else cond.all(), msg)


_E_MESSAGE = "ReplaySSM: a slot resumed an extend forward with records in its ring (radix invariant E)"


def check_extend_index(cursors: torch.Tensor, index: torch.Tensor, prefix: torch.Tensor | None = None) -> None:
    """Invariant E on a prepared index (``extend_index``): device-side assert, no host sync.

    Parameters
    ----------
    cursors : torch.Tensor
        ``[slots, 2]`` int32 cursors, before the extend rows are reset.
    index : torch.Tensor
        ``[n]`` int64 slots of the rows to check (``extend_index``).
    prefix : torch.Tensor or None
        ``[n]`` the rows' prefix lengths (integer) or a bool "has a prefix" mask: rows where it is
        ``<= 0`` / False are not checked.  None checks every row (the caller knows they all resume).
    """
    if index.numel() == 0:
        return
    ok = cursors[index, 1] == 0
    if prefix is not None:
        prefix = prefix.to(device=cursors.device)
        ok = ok | (~prefix if prefix.dtype == torch.bool else prefix <= 0)
    assert_all(ok, _E_MESSAGE)


def check_extend_rows(
    cursors: torch.Tensor, extend_slots: torch.Tensor, has_prefix: torch.Tensor | None = None
) -> None:
    """Invariant E: a slot an extend forward resumes from its checkpoint has an empty ring.

    Device-side assert, no host sync.  Rows without a prefix start from a zero state, so their
    cursors are not checked (the extend resets them).

    Parameters
    ----------
    cursors : torch.Tensor
        ``[slots, 2]`` int32 cursors, before the extend rows are reset.
    extend_slots : torch.Tensor
        ``[n]`` the extend rows' slots; ``-1`` (padding) reads the null slot 0, whose ``len`` is 0.
    has_prefix : torch.Tensor or None
        ``[n]`` bool, rows that resume from a cached or earlier-chunk state (``extend_prefix_lens >
        0``); None checks every row.

    Raises
    ------
    RuntimeError
        On a CPU tensor at once; on a GPU the assert fires asynchronously.
    ValueError
        When ``has_prefix`` is not ``[n]``.
    """
    n = extend_slots.numel()
    if n == 0:
        return
    if has_prefix is not None and tuple(has_prefix.shape) != (n,):
        raise ValueError(f"has_prefix: expected shape ({n},), got {tuple(has_prefix.shape)}")
    check_extend_index(cursors, extend_index(cursors, extend_slots), has_prefix)


def startup_refusals(server_args) -> list[str]:
    """Radix-cache features whose slot traffic bypasses the pool's ``copy_from`` / the donation hook.

    HiCache loads evicted mamba states back into freshly allocated slots without resetting their
    cursors, and the int8 checkpoint pool stores tree states outside our pool; both would hand a
    stale or incomplete ring to the next copy-on-write.

    Returns
    -------
    list[str]
        One message per refused flag (empty: nothing refused).
    """
    problems = []
    if getattr(server_args, "disable_radix_cache", False):
        return problems
    if getattr(server_args, "enable_hierarchical_cache", False):
        problems.append("--enable-hierarchical-cache (HiCache) is not supported with --ssm-backend replay; "
                        "drop it, or run with --ssm-backend default")
    if getattr(server_args, "enable_int8_mamba_checkpoint", False):
        problems.append("--enable-int8-mamba-checkpoint is not supported with --ssm-backend replay; drop it, "
                        "or run with --ssm-backend default")
    return problems
