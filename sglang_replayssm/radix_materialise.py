"""Materialise a slot: fold its pending ring records into its checkpoint, exactly as a flush would.

A slot's logical state is ``S0`` + ``len`` ring records, but its conv state is always the live one
(after all ``ntok`` tokens).  Before the radix tree takes a slot (or a copy of it) the records are
folded into ``S0`` so that checkpoint, conv state and key length all describe the same ``ntok``
tokens (``radix.py``, invariant T).

The fold is the family's own decode step (Triton kernel on CUDA, torch reference on CPU) on one
flush row whose current token is neutral: it folds records ``[0, len)`` in the flush's operation
order and then multiplies the state by ``exp(0) = 1`` and adds ``0`` (Mamba-2: ``x = 0``, ``Δ = 0``;
GDN: ``A_log = -inf`` so ``g = 0``, ``b = -inf`` so ``β = 0``, ``k = 0``), which leaves every element
bit for bit.  The stored checkpoint is therefore what the next flush would have stored before its
own token (with stochastic rounding: one such rounding, with bits of their own).  Mamba-2 needs
each layer's ``A`` (``MambaMixer2.A``, ``-exp(A_log)``), registered on the
pool by ``hooks/pool.py`` (``ReplayMambaPool.fold_A``); GDN records carry their gates.
"""

from __future__ import annotations

import torch

__all__ = ["materialise_slot", "mamba2_layer_A"]


def mamba2_layer_A(model: torch.nn.Module, num_layers: int) -> list[torch.Tensor]:
    """The ``A`` parameter (``[H]``, ``-exp(A_log)``) of each Mamba-2 mixer of ``model``, pool layer order.

    Raises
    ------
    ValueError
        When ``model`` does not have exactly ``num_layers`` ``MambaMixer2`` modules.
    """
    from sglang.srt.layers.attention.mamba.mamba import MambaMixer2

    found = [m.A for m in model.modules() if isinstance(m, MambaMixer2)]
    if len(found) != num_layers:
        raise ValueError(
            f"ReplaySSM: expected {num_layers} MambaMixer2 layers (one per mamba pool layer), "
            f"found {len(found)} in {type(model).__name__}"
        )
    return found


def _neutral_mamba2(pool, layer: int, slot: torch.Tensor, start: torch.Tensor, length: torch.Tensor):
    import replayssm_kernels as rk

    A = pool.fold_A[layer]
    rings = pool.layer_rings(layer)
    state = pool.mamba_cache.temporal[layer]
    H, P = rings["x"].shape[1], rings["x"].shape[3]
    G, N = rings["B"].shape[1], rings["B"].shape[3]
    dev = state.device
    x = torch.zeros(1, H, P, dtype=rings["x"].dtype, device=dev)
    dt = torch.zeros(1, H, dtype=torch.float32, device=dev)
    B = torch.zeros(1, G, N, dtype=rings["B"].dtype, device=dev)
    out = torch.empty(1, H, P, dtype=torch.float32, device=dev)
    fn = rk.mamba2_replay_decode if dev.type == "cuda" else rk.mamba2_replay_decode_ref
    fn(state, rings["x"], rings["dt"], rings["B"], x, dt, A.to(device=dev, dtype=torch.float32), B,
       B.clone(), out, slot, start, length, torch.ones(1, dtype=torch.bool, device=dev),
       **pool.layer_rounding(layer))


def _neutral_gdn(pool, layer: int, slot: torch.Tensor, start: torch.Tensor, length: torch.Tensor):
    import replayssm_kernels as rk

    rings = pool.layer_rings(layer)
    state = pool.mamba_cache.temporal[layer]
    HV, V = rings["v"].shape[1], rings["v"].shape[3]
    Hk, K = rings["k"].shape[1], rings["k"].shape[3]
    dev = state.device
    k = torch.zeros(1, Hk, K, dtype=rings["k"].dtype, device=dev)
    v = torch.zeros(1, HV, V, dtype=rings["v"].dtype, device=dev)
    a = torch.zeros(1, HV, dtype=torch.float32, device=dev)
    b = torch.full((1, HV), float("-inf"), dtype=torch.float32, device=dev)
    A_log = torch.full((HV,), float("-inf"), dtype=torch.float32, device=dev)
    dt_bias = torch.zeros(HV, dtype=torch.float32, device=dev)
    out = torch.empty(1, HV, V, dtype=torch.float32, device=dev)
    fn = rk.gdn_replay_decode if dev.type == "cuda" else rk.gdn_replay_decode_ref
    fn(state, rings["u"], rings["k"], rings["v"], rings["g"], rings["beta"], k.clone(), k, v, a, b,
       A_log, dt_bias, out, slot, start, length, torch.ones(1, dtype=torch.bool, device=dev), scale=1.0,
       **pool.layer_rounding(layer))


def materialise_slot(pool, slot: int | torch.Tensor) -> int:
    """Fold ``slot``'s ring into its checkpoint in every layer and empty the ring.

    Parameters
    ----------
    pool : ReplayMambaPool
        The pool (``temporal``, rings and a read copy written in place for ``slot`` only; cursors
        reset).
    slot : int or torch.Tensor
        One slot in ``[1, slots)`` (a 0-d or 1-element tensor, as SGLang passes it).

    Returns
    -------
    int
        The number of records folded (0: nothing was launched).  Reads the cursors (host sync).

    Raises
    ------
    ValueError
        On a slot out of range, or a Mamba-2 pool without ``fold_A``.
    """
    s = int(slot.reshape(-1)[0]) if isinstance(slot, torch.Tensor) else int(slot)
    cursors = pool.cursors
    if not 1 <= s < cursors.shape[0]:
        raise ValueError(f"materialise_slot: slot expected in [1, {cursors.shape[0]}), got {s}")
    start, length = (int(v) for v in cursors[s].tolist())
    if length == 0:
        return 0
    family = pool.replay.family
    if family == "mamba2" and getattr(pool, "fold_A", None) is None:
        raise ValueError("materialise_slot: a Mamba-2 pool needs fold_A (each layer's A) to fold its ring")
    dev = cursors.device
    idx = torch.tensor([s], dtype=torch.int32, device=dev)
    st = torch.tensor([start], dtype=torch.int32, device=dev)
    ln = torch.tensor([length], dtype=torch.int32, device=dev)
    fold = _neutral_mamba2 if family == "mamba2" else _neutral_gdn
    pool.advance_rounding()  # stochastic rounding: bits no flush of this slot has used
    for layer in range(pool.mamba_cache.temporal.shape[0]):
        fold(pool, layer, idx, st, ln)
    cursors[s] = torch.tensor([(start + length) % pool.ring_spec.rows, 0], dtype=cursors.dtype, device=dev)
    pool.refresh_read(idx)  # split precision: the copy follows the folded checkpoint
    return length
