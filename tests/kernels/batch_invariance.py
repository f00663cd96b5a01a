"""Batch-invariance driver: one request's row run at two batch sizes, every bit compared.

A *target* request (its own input stream, its own slot: slot 1, initial checkpoint from a fixed
seed) is stepped through decode or verify steps beside ``batch - 1`` other requests (random inputs,
random forced flushes, random accepted counts) at ``pos`` in the batch; ``run_world`` returns, after
every step, the target row's outputs and its slot's checkpoint and ring rows.  Two runs at different
batch sizes are compared bit for bit by ``compare_worlds``: a launch whose configuration depends on
the batch size (``replayssm_kernels``' P-split, value tiles per program, window tile, row order) is
batch invariant exactly when nothing differs.

Used by ``test_batch_invariance.py`` (CPU, interpreter; ``gpu``-marked at the real shapes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BF16 = torch.bfloat16
FP32 = torch.float32
TARGET_SLOT = 1


@dataclass(frozen=True)
class Shape:
    family: str  # "mamba2" or "gdn"
    heads: int  # H (Mamba-2) or HV (GDN)
    groups: int  # G (Mamba-2) or Hk (GDN)
    rows: int  # P (Mamba-2) or V (GDN): the state's row dimension
    cols: int  # N (Mamba-2) or K (GDN)


def _randn(shape, gen, dtype=FP32, scale=1.0):
    return (torch.randn(shape, generator=gen) * scale).to(dtype)


def _params(shape: Shape, device) -> dict:
    """Per-layer parameters, the same in every world."""
    g = torch.Generator().manual_seed(7)
    H = shape.heads
    if shape.family == "mamba2":
        return dict(A=(-torch.exp(_randn(H, g) * 0.5)).to(device), D=_randn(H, g).to(device),
                    dt_bias=_randn(H, g, scale=0.5).to(device))
    return dict(A_log=_randn(H, g, scale=0.5).to(device), dt_bias=_randn(H, g, scale=0.5).to(device))


def _state(shape: Shape, n: int, gen) -> torch.Tensor:
    scale = 0.1 if shape.family == "gdn" else 0.5
    return _randn((n, shape.heads, shape.rows, shape.cols), gen, scale=scale)


def _pool(shape: Shape, slots: int, R: int, gen, device) -> dict[str, torch.Tensor]:
    """Checkpoint (random, slot 1 overwritten by the target's) and NaN rings."""
    H, G, P, N = shape.heads, shape.groups, shape.rows, shape.cols
    nan = float("nan")
    pool = {"state": _state(shape, slots, gen)}
    if shape.family == "mamba2":
        pool.update(ring_x=torch.full((slots, H, R, P), nan, dtype=BF16),
                    ring_dt=torch.full((slots, H, R), nan), ring_B=torch.full((slots, G, R, N), nan, dtype=BF16))
    else:
        pool.update(ring_u=torch.full((slots, H, R, P), nan), ring_k=torch.full((slots, G, R, N), nan, dtype=BF16),
                    ring_v=torch.full((slots, H, R, P), nan, dtype=BF16), ring_g=torch.full((slots, H, R), nan),
                    ring_beta=torch.full((slots, H, R), nan))
    pool["state"][TARGET_SLOT] = _state(shape, 1, torch.Generator().manual_seed(11))[0]
    return {k: v.to(device) for k, v in pool.items()}


def _inputs(shape: Shape, rows: int, T: int | None, gen) -> dict[str, torch.Tensor]:
    """``rows`` rows of one step's inputs (``[rows, T, ...]`` for verify, ``[rows, ...]`` for decode)."""
    H, G, P, N = shape.heads, shape.groups, shape.rows, shape.cols
    lead = (rows,) if T is None else (rows, T)
    if shape.family == "mamba2":
        return dict(x=_randn((*lead, H, P), gen, BF16), dt=_randn((*lead, H), gen, BF16, 0.5),
                    B=_randn((*lead, G, N), gen, BF16), C=_randn((*lead, G, N), gen, BF16),
                    z=_randn((*lead, H, P), gen, BF16))
    return dict(q=_randn((*lead, G, N), gen, BF16), k=_randn((*lead, G, N), gen, BF16),
                v=_randn((*lead, H, P), gen, BF16), a=_randn((*lead, H), gen, BF16),
                b=_randn((*lead, H), gen, BF16))


def _call(op, shape: Shape, pool, params, inp, out, slot_idx, start, length, flush, kw) -> None:
    if shape.family == "mamba2":
        op(pool["state"], pool["ring_x"], pool["ring_dt"], pool["ring_B"], inp["x"], inp["dt"], params["A"],
           inp["B"], inp["C"], out, slot_idx, start, length, flush, D=params["D"], z=inp["z"],
           dt_bias=params["dt_bias"], dt_softplus=True, **kw)
    else:
        op(pool["state"], pool["ring_u"], pool["ring_k"], pool["ring_v"], pool["ring_g"], pool["ring_beta"],
           inp["q"], inp["k"], inp["v"], inp["a"], inp["b"], params["A_log"], params["dt_bias"], out, slot_idx,
           start, length, flush, scale=shape.cols ** -0.5, **kw)


@dataclass
class World:
    outputs: list  # the target row's output per step
    slot: list  # the target slot's pool tensors per step (dict name -> tensor)
    flushes: int  # steps in which the target row flushed
    other_flushes: int  # flush rows of the other requests, all steps
    mixed: int  # steps whose batch held flush and non-flush rows


def run_world(op, shape: Shape, batch: int, *, pos: int = 0, steps: int = 12, L: int = 4, T: int | None = None,
              device="cpu", other_seed: int = 3, row_order_from: int | None = None, **kw) -> World:
    """Run the target request at ``pos`` of a ``batch``-row launch for ``steps`` steps.

    ``op``: a decode (``T is None``) or verify (``T`` window tokens) wrapper with the kernels'
    signature; ``kw`` go to every call. ``row_order_from`` (GDN decode): from that batch size pass
    ``row_order = flush_first_order(flush)``, as the serving backend does."""
    from replayssm_kernels import decode_cursor_step_ref, flush_first_order_ref, min_ring_size, verify_commit_ref
    from replayssm_kernels.commit.reference import verify_cursor_step_ref

    if not 0 <= pos < batch:
        raise ValueError(f"pos: expected in [0, {batch}), got {pos}")
    R = L if T is None else min_ring_size(L, T)
    go = torch.Generator().manual_seed(other_seed)
    gt = torch.Generator().manual_seed(101)  # the target's stream: the same in every world
    pool = _pool(shape, batch + 1, R, go, device)
    params = _params(shape, device)
    cursors = torch.zeros(batch + 1, 2, dtype=torch.int32, device=device)
    others = [s for s in range(batch + 1) if s not in (0, TARGET_SLOT)]
    slots = others[:pos] + [TARGET_SLOT] + others[pos:]
    slot_idx = torch.tensor(slots, dtype=torch.int32, device=device)
    world = World([], [], 0, 0, 0)
    for _ in range(steps):
        tin, oin = _inputs(shape, 1, T, gt), _inputs(shape, batch - 1, T, go)
        inp = {k: torch.cat([oin[k][:pos], tin[k], oin[k][pos:]]).to(device) for k in tin}
        t_force = torch.rand(1, generator=gt) < 0.1
        force = torch.rand(batch - 1, generator=go) < 0.2
        force = torch.cat([force[:pos], t_force, force[pos:]]).to(device)
        start = torch.empty(batch, dtype=torch.int32, device=device)
        length, flush = torch.empty_like(start), torch.empty(batch, dtype=torch.bool, device=device)
        if T is None:
            decode_cursor_step_ref(cursors, slot_idx, force, L, R, start, length, flush)
        else:
            verify_cursor_step_ref(cursors, slot_idx, force, L, R, T, start, length, flush)
        out_shape = inp["x"].shape if shape.family == "mamba2" else inp["v"].shape
        out = torch.full(out_shape, float("nan"), dtype=BF16, device=device)
        call_kw = dict(kw)
        if shape.family == "gdn" and T is None and row_order_from is not None and batch >= row_order_from:
            order = torch.empty(batch, dtype=torch.int32, device=device)
            flush_first_order_ref(flush, order)
            call_kw["row_order"] = order
        _call(op, shape, pool, params, inp, out, slot_idx, start, length, flush, call_kw)
        if T is not None:
            t_acc = torch.randint(1, T + 1, (1,), generator=gt)
            acc = torch.randint(1, T + 1, (batch - 1,), generator=go)
            acc = torch.cat([acc[:pos], t_acc, acc[pos:]]).to(device=device, dtype=torch.int32)
            verify_commit_ref(cursors, slot_idx, start, length, flush, acc, window=L, ring_size=R, num_tokens=T)
        f = flush.cpu()
        world.flushes += int(f[pos])
        world.other_flushes += int(f.sum()) - int(f[pos])
        world.mixed += int(bool(f.any()) and not bool(f.all()))
        world.outputs.append(out[pos].cpu().clone())
        world.slot.append({k: v[TARGET_SLOT].cpu().clone() for k, v in pool.items()})
    return world


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def compare_worlds(a: World, b: World) -> list[str]:
    """Every difference between two runs of the target request, bit for bit (NaN bits included):
    one line per step and tensor that differs (empty: batch invariant)."""
    diffs = []
    for step, (oa, ob) in enumerate(zip(a.outputs, b.outputs)):
        n = int((_bits(oa) != _bits(ob)).sum())
        if n:
            diffs.append(f"step {step}: output, {n} of {oa.numel()} elements differ")
        for name in a.slot[step]:
            ta, tb = a.slot[step][name], b.slot[step][name]
            n = int((_bits(ta) != _bits(tb)).sum())
            if n:
                diffs.append(f"step {step}: {name}, {n} of {ta.numel()} elements differ")
    return diffs
