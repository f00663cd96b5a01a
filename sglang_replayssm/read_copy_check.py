"""Debug check of the split-precision invariant in a running server (opt-in, slow).

With ``SGLANG_REPLAYSSM_CHECK_READ_COPY=1`` in the server's environment, the backends compare, before
every forward (eager, and before each CUDA-graph replay: the check runs outside the graph), the read
copy of every slot of the batch with ``quantize_rows`` of its checkpoint as stored, bit for bit: the
pool's invariant (``pool.py``, "Split precision"), which every writer of a checkpoint keeps (flush rows
in the decode kernels, ``refresh_read`` elsewhere).  A mismatch raises ``RuntimeError`` naming the
layers and slots, which stops the server; a passing check logs the first check of each kind of
forward (``where``) and every ``LOG_EVERY``-th, with the counts so far.  Each check syncs with the
host and quantises the batch's checkpoints in all layers: for tests
(``tests/e2e/test_read_copy_gpu.py``), not for serving.

It is what an end-to-end test of the copy can assert on a GPU: a bf16-activation tiny random model
amplifies the copy's one rounding into early greedy divergences (measured on a CPU, where an fp32 model
keeps 40 of 40 tokens), so token agreement cannot tell a correct copy from a stale one there.
"""

from __future__ import annotations

import logging
import os

import torch
from replayssm_kernels.mamba2_decode.read_copy import quantize_rows

__all__ = ["ENV_VAR", "LOG_EVERY", "ReadCopyChecker", "check_forward", "enabled", "mismatched_rows"]

logger = logging.getLogger(__name__)

ENV_VAR = "SGLANG_REPLAYSSM_CHECK_READ_COPY"
LOG_EVERY = 200


def enabled() -> bool:
    """Whether ``$SGLANG_REPLAYSSM_CHECK_READ_COPY`` asks for the check (``1``)."""
    return os.environ.get(ENV_VAR, "") == "1"


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def mismatched_rows(temporal: torch.Tensor, read_state: torch.Tensor, read_scale: torch.Tensor | None,
                    slots: torch.Tensor) -> list[tuple[int, int]]:
    """``(layer, slot)`` pairs of ``slots`` whose copy differs from ``quantize_rows`` of the checkpoint.

    Parameters
    ----------
    temporal : torch.Tensor
        ``[layers, slots, ...]`` checkpoints (read only).
    read_state : torch.Tensor
        ``[layers, slots, ...]`` copy, ``temporal``'s shape (read only).
    read_scale : torch.Tensor or None
        ``[layers, slots, ...]`` fp8 row scales (``temporal``'s shape without the last dim), else None.
    slots : torch.Tensor
        ``[k]`` integer slots; negative entries (padding) and the null slot 0 are skipped.  Syncs with
        the host.
    """
    idx = torch.unique(slots.reshape(-1).to(device=temporal.device, dtype=torch.int64))
    idx = idx[idx > 0]  # padding, and the null slot 0 (graph warm-up and padding rows write its checkpoint)
    if idx.numel() == 0:
        return []
    q, scale = quantize_rows(temporal[:, idx], read_state.dtype)
    bad = (_bits(q) != _bits(read_state[:, idx])).flatten(2).any(-1)
    if scale is not None:
        bad |= (_bits(scale) != _bits(read_scale[:, idx])).flatten(2).any(-1)
    layers, cols = bad.nonzero(as_tuple=True)
    return list(zip(layers.tolist(), idx[cols].tolist()))


class ReadCopyChecker:
    """Per-backend counter and the check itself (``__call__``); a no-op for a pool without a copy."""

    def __init__(self) -> None:
        self.checks = 0
        self.rows = 0
        self.kinds: set[str] = set()

    def __call__(self, pool, slots: torch.Tensor, where: str) -> None:
        """Check ``slots`` of ``pool`` (a ``ReplayMambaPool``) before a forward (``where`` names it)."""
        if pool.read_state is None:
            return
        bad = mismatched_rows(pool.mamba_cache.temporal, pool.read_state, pool.read_scale, slots)
        if bad:
            raise RuntimeError(
                f"ReplaySSM read-copy check ({ENV_VAR}=1) before a {where} forward: the copy of "
                f"{len(bad)} (layer, slot) rows is not quantize_rows of its checkpoint, first {bad[:8]}"
            )
        self.checks += 1
        self.rows += int((slots > 0).sum())
        if where not in self.kinds or self.checks % LOG_EVERY == 0:
            self.kinds.add(where)
            logger.info("ReplaySSM read-copy check passed: %d forwards, %d rows (%s)", self.checks, self.rows,
                        where)


def check_forward(backend, slots: torch.Tensor, where: str) -> None:
    """The backends' call before a forward: checks ``slots`` of ``backend.pool`` when ``enabled()``
    (one ``ReadCopyChecker`` per backend, made on first use); nothing otherwise."""
    if not enabled():
        return
    checker = backend.__dict__.get("_read_copy_checker")
    if checker is None:
        checker = backend._read_copy_checker = ReadCopyChecker()
    checker(backend.pool, slots, where)
