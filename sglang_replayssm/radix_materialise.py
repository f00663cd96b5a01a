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

``fold_slot`` (the server's path, ``hooks/radix.py``) reads nothing on the host: the cursor pair is
gathered on the device, and a slot whose ring is empty goes to the kernels as a padding row
(``-1``), which every layer's launch skips before touching memory; its cursor pair and a read copy
are rewritten with the values they already hold, and the stochastic-rounding counter advances by
``len > 0``, so the results are those of ``materialise_slot``'s host-side early return.  The neutral
token's inputs are allocated once per pool (``ReplayMambaPool.fold_inputs``).
``materialise_slot`` reads the slot's ``len`` first (one host sync) and launches nothing for an empty
ring: the cheaper choice where the ring is expected to be empty.
"""

from __future__ import annotations

import torch

__all__ = ["materialise_slot", "fold_slot", "mamba2_layer_A"]


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


def _neutral_inputs(pool) -> dict[str, torch.Tensor]:
    """The neutral token's per-row inputs (one row), built on first use and kept on the pool.

    The kernels read them and never write them (flush rows append no record); ``out`` is scratch.
    """
    if pool.fold_inputs is not None:
        return pool.fold_inputs
    rings = pool.layer_rings(0)
    dev = pool.cursors.device
    f32 = torch.float32
    if pool.replay.family == "mamba2":
        H, P = rings["x"].shape[1], rings["x"].shape[3]
        G, N = rings["B"].shape[1], rings["B"].shape[3]
        inputs = {
            "x": torch.zeros(1, H, P, dtype=rings["x"].dtype, device=dev),
            "dt": torch.zeros(1, H, dtype=f32, device=dev),
            "B": torch.zeros(1, G, N, dtype=rings["B"].dtype, device=dev),
            "C": torch.zeros(1, G, N, dtype=rings["B"].dtype, device=dev),
            "out": torch.empty(1, H, P, dtype=f32, device=dev),
        }
    else:
        HV, V = rings["v"].shape[1], rings["v"].shape[3]
        Hk, K = rings["k"].shape[1], rings["k"].shape[3]
        inputs = {
            "q": torch.zeros(1, Hk, K, dtype=rings["k"].dtype, device=dev),
            "k": torch.zeros(1, Hk, K, dtype=rings["k"].dtype, device=dev),
            "v": torch.zeros(1, HV, V, dtype=rings["v"].dtype, device=dev),
            "a": torch.zeros(1, HV, dtype=f32, device=dev),
            "b": torch.full((1, HV), float("-inf"), dtype=f32, device=dev),
            "A_log": torch.full((HV,), float("-inf"), dtype=f32, device=dev),
            "dt_bias": torch.zeros(HV, dtype=f32, device=dev),
            "out": torch.empty(1, HV, V, dtype=f32, device=dev),
        }
    inputs["flush"] = torch.ones(1, dtype=torch.bool, device=dev)
    pool.fold_inputs = inputs
    return inputs


def _neutral_mamba2(pool, layer: int, slot: torch.Tensor, start: torch.Tensor, length: torch.Tensor):
    import replayssm_kernels as rk

    n = _neutral_inputs(pool)
    rings = pool.layer_rings(layer)
    state = pool.mamba_cache.temporal[layer]
    dev = state.device
    A = pool.fold_A[layer].to(device=dev, dtype=torch.float32)  # no copy when already fp32 there
    fn = rk.mamba2_replay_decode if dev.type == "cuda" else rk.mamba2_replay_decode_ref
    fn(state, rings["x"], rings["dt"], rings["B"], n["x"], n["dt"], A, n["B"], n["C"], n["out"], slot, start,
       length, n["flush"], **pool.layer_rounding(layer))


def _neutral_gdn(pool, layer: int, slot: torch.Tensor, start: torch.Tensor, length: torch.Tensor):
    import replayssm_kernels as rk

    n = _neutral_inputs(pool)
    rings = pool.layer_rings(layer)
    state = pool.mamba_cache.temporal[layer]
    fn = rk.gdn_replay_decode if state.device.type == "cuda" else rk.gdn_replay_decode_ref
    fn(state, rings["u"], rings["k"], rings["v"], rings["g"], rings["beta"], n["q"], n["k"], n["v"], n["a"],
       n["b"], n["A_log"], n["dt_bias"], n["out"], slot, start, length, n["flush"], scale=1.0,
       **pool.layer_rounding(layer))


def _host_slot(pool, slot: int) -> int:
    s = int(slot)
    if not 1 <= s < pool.cursors.shape[0]:
        raise ValueError(f"materialise_slot: slot expected in [1, {pool.cursors.shape[0]}), got {s}")
    return s


def _check_fold_A(pool) -> None:
    if pool.replay.family == "mamba2" and pool.fold_A is None:
        raise ValueError("materialise_slot: a Mamba-2 pool needs fold_A (each layer's A) to fold its ring")


def fold_slot(pool, slot: int | torch.Tensor) -> None:
    """Fold ``slot``'s ring into its checkpoint in every layer and empty the ring; no host sync.

    The same result as ``materialise_slot``: an empty ring leaves checkpoint, read copy and
    stochastic-rounding counter as they are (every layer's launch skips the slot on the device).

    Parameters
    ----------
    pool : ReplayMambaPool
        The pool (``temporal``, a read copy and the cursors written in place for ``slot`` only).
    slot : int or torch.Tensor
        One slot in ``[1, slots)``: a host int (checked), or a 0-d / 1-element integer tensor on any
        device, as SGLang passes ``req.mamba_pool_idx`` (not checked: that would read it).

    Raises
    ------
    ValueError
        On a host slot out of range, or a Mamba-2 pool without ``fold_A``.
    """
    cursors = pool.cursors
    dev = cursors.device
    _check_fold_A(pool)
    if isinstance(slot, torch.Tensor):
        if slot.numel() != 1:
            raise ValueError(f"fold_slot: expected one slot, got a tensor of shape {tuple(slot.shape)}")
        idx = slot.reshape(1).to(device=dev, dtype=torch.int32)
    else:
        idx = torch.full((1,), _host_slot(pool, slot), dtype=torch.int32, device=dev)
    idx_l = idx.long()
    cur = cursors.index_select(0, idx_l).t().contiguous()  # [2, 1]: start, len
    start, length = cur[0], cur[1]
    pending = length > 0
    row = torch.where(pending, idx, -1)  # empty ring: a padding row, skipped by every launch
    if pool.sr_seed is not None:  # stochastic rounding: bits no flush of this slot has used
        pool.sr_seed.add_(pending.to(torch.int64))
    fold = _neutral_mamba2 if pool.replay.family == "mamba2" else _neutral_gdn
    for layer in range(pool.mamba_cache.temporal.shape[0]):
        fold(pool, layer, row, start, length)
    new = torch.stack([(start + length) % pool.ring_spec.rows, torch.zeros_like(length)], dim=1)
    cursors.index_copy_(0, idx_l, new.to(cursors.dtype))
    pool.refresh_read(idx)  # split precision: the copy follows the (possibly unchanged) checkpoint


def materialise_slot(pool, slot: int | torch.Tensor) -> int:
    """Fold ``slot``'s ring into its checkpoint in every layer and empty the ring; returns the count.

    Reads the slot and its ``len`` on the host in one transfer (one sync on a GPU) and launches
    nothing for an empty ring; otherwise ``fold_slot``.  Cheaper than ``fold_slot``'s per-layer
    launches where the ring is expected to be empty (the ``no_buffer`` insert after a prefill).

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
        The number of records folded (0: nothing was launched).

    Raises
    ------
    ValueError
        On a slot out of range, or a Mamba-2 pool without ``fold_A``.
    """
    cursors = pool.cursors
    if isinstance(slot, torch.Tensor):
        if slot.numel() != 1:
            raise ValueError(f"materialise_slot: expected one slot, got a tensor of shape {tuple(slot.shape)}")
        idx = slot.reshape(1).to(device=cursors.device, dtype=torch.long)
        safe = idx.clamp(0, cursors.shape[0] - 1)  # validated on the host below, after the one read
        s, length = torch.cat([idx.to(cursors.dtype), cursors.index_select(0, safe)[:, 1]]).tolist()
        _host_slot(pool, s)
    else:
        s = _host_slot(pool, slot)
        length = int(cursors[s, 1])
    if length == 0:
        return 0
    fold_slot(pool, s)
    return length
