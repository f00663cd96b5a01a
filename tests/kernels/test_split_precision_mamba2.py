"""Split precision, Mamba-2 decode: fp32/16-bit recurrence checkpoint + low-precision read copy.

Driver as ``test_mamba2_decode.run_cycles`` (same pools, parameters, cursor protocol: >= 3 ring
cycles, random forced flushes, padding rows, row permutation, NaN rings and NaN-poisoned outputs),
plus a read copy (bf16 / fp16 / fp8 e4m3 with per-row scales) on a layer view of a
``[layers, slots, H, P, N]`` allocation, refreshed from the checkpoint for every slot before the
first step (what the integration does after prefill). After every call:

- outputs fully written (padding rows untouched) and vs the float64 recurrence (relative L2);
- flush rows: checkpoint vs float64, and the refreshed copy (and scales) bit-identical to
  ``quantize_rows`` of the checkpoint as stored (kernel and torch round alike);
- every byte of the checkpoint, ring, copy and scale allocations outside the rows the protocol
  lets change is bit-identical (other layers, untouched slots, non-flush rows' checkpoint and copy).

Under the interpreter fp32 -> bf16 / fp16 / fp8 casts round to nearest even as on the GPU
(conftest shims). Run with ``-s`` to see the ``[split-mamba2]`` error lines.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_mamba2_decode import (
    DEVICE,
    IMPLS,
    NANO_4B,
    Shape,
    Variant,
    _bits_equal,
    _rebase,
    _rel,
    call_args,
    make_params,
    make_pool,
    make_step,
)

from replayssm_kernels import decode_cursor_step, mamba2_conventional_f64
from replayssm_kernels.mamba2_decode.read_copy import quantize_rows
from replayssm_kernels.read_copy_refresh import refresh_read_copy_ref

pytestmark = pytest.mark.usefixtures("interpreter_fp16_fp8_rtne")

F8 = torch.float8_e4m3fn
SHAPE_P80 = Shape(H=2, G=1, P=80, N=16)  # head dim 80 (five 16-row tiles)
SHAPE_SMALL = Shape(H=4, G=2, P=12, N=16)

# Output error vs float64 (relative L2). bf16 outputs: the bf16 store (~1.5e-3) plus the copy's
# rounding of S0 (bf16 2^-9, fp16 2^-12, e4m3 2^-4 relative per element).
OUT_TOL = {torch.bfloat16: 3e-3, torch.float16: 3e-3, F8: 2e-2}
STATE_TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 5e-3}


@dataclasses.dataclass
class ReadCopy:
    read: torch.Tensor  # layer view [slots, H, P, N]
    scale: torch.Tensor | None  # layer view [slots, H, P]
    full: tuple[torch.Tensor, ...]


def make_read_copy(state: torch.Tensor, dtype: torch.dtype, layout: str, layers: int = 2,
                   layer: int = 1) -> ReadCopy:
    slots, H, P, N = state.shape
    nan = float("nan")
    if layout == "permuted":  # stored [.., N, P]
        full = torch.full((layers, slots, H, N, P), nan, device=state.device).to(dtype)
        read = full[layer].transpose(-1, -2)
    else:
        full = torch.full((layers, slots, H, P, N), nan, device=state.device).to(dtype)
        read = full[layer]
    scale_full = scale = None
    if dtype == F8:
        scale_full = torch.full((layers, slots, H, P + 3), nan, device=state.device)
        scale = scale_full[layer, :, :, 1 : P + 1]
    idx = torch.arange(slots, device=state.device)
    refresh_read_copy_ref(state, read, scale, idx)
    return ReadCopy(read, scale, (full,) if scale_full is None else (full, scale_full))


@dataclasses.dataclass
class SplitReport:
    out_rel: float
    state_rel: float
    flush_rows: int
    nonflush_rows: int


def run_split_cycles(
    impl: str, shape: Shape, L: int, read_dtype: torch.dtype, *,
    state_dtype: torch.dtype = torch.float32, act_dtype: torch.dtype = torch.bfloat16,
    layout: str = "layer", variant: Variant = Variant(True, False), active: int = 3,
    pads: int = 1, cycles: int = 3, force_p: float = 0.15, seed: int = 0, device: str = DEVICE,
) -> SplitReport:
    gen = torch.Generator().manual_seed(seed)
    fn = IMPLS[impl]
    H, P = shape.H, shape.P
    R = L + 2
    slots = active + 3
    prm = make_params(shape, gen, device)
    pool = make_pool(shape, slots, R, state_dtype, act_dtype, layout, gen, device)
    rc = make_read_copy(pool.state, read_dtype, layout)
    cursors = torch.zeros(slots, 2, dtype=torch.int32, device=device)
    active_slots = torch.randperm(slots - 1, generator=gen)[:active] + 1
    shadow = {int(s): pool.state[int(s)].double().clone() for s in active_slots}
    full = pool.full + rc.full
    names = ("state", "ring_x", "ring_dt", "ring_B", "read", "scale")

    outs, refs, st_got, st_ref = [], [], [], []
    n_flush = n_nonflush = 0
    batch = active + pads
    for _ in range(cycles * L + 4):
        rows = torch.cat([active_slots, torch.full((pads,), -1, dtype=torch.int64)])
        slot_idx = rows[torch.randperm(batch, generator=gen)].to(device=device, dtype=torch.int32)
        force = (torch.rand(batch, generator=gen) < force_p).to(device)
        rs = torch.empty(batch, dtype=torch.int32, device=device)
        rl = torch.empty_like(rs)
        fl = torch.empty(batch, dtype=torch.bool, device=device)
        decode_cursor_step(cursors, slot_idx, force, L, R, rs, rl, fl)
        st = make_step(shape, batch, act_dtype, gen, device, variant.with_z)
        dt, A, D, dt_bias = call_args(shape, prm, st, variant)
        out = torch.full((batch, H, P), float("nan"), dtype=act_dtype, device=device)
        before = tuple(t.clone() for t in full)

        fn(pool.state, pool.ring_x, pool.ring_dt, pool.ring_B, st.x, dt, A, st.B, st.C, out,
           slot_idx, rs, rl, fl, D=D, z=st.z, dt_bias=dt_bias, dt_softplus=True,
           read_state=rc.read, read_scale=rc.scale)

        exp_full = [t.clone() for t in before]
        views = (pool.state, pool.ring_x, pool.ring_dt, pool.ring_B, rc.read, rc.scale)
        exp = {n: _rebase(v, exp_full[i]) for i, (n, v) in enumerate(zip(names, views))
               if v is not None}
        for b, s in enumerate(slot_idx.cpu().tolist()):
            if s < 0:
                assert torch.isnan(out[b]).all(), f"padding row {b}: out written"
                continue
            assert not torch.isnan(out[b]).any(), f"row {b}: out not fully written"
            o64, s64 = mamba2_conventional_f64(
                shadow[s], st.x[b : b + 1], st.dt[b : b + 1], prm.A, st.B[b : b + 1],
                st.C[b : b + 1], D=prm.D, z=None if st.z is None else st.z[b : b + 1],
                dt_bias=prm.dt_bias, dt_softplus=True,
            )
            shadow[s] = s64
            outs.append(out[b].double().cpu())
            refs.append(o64[0].cpu())
            if bool(fl[b]):
                n_flush += 1
                st_got.append(pool.state[s].double().cpu())
                st_ref.append(s64.cpu())
                q, scale = quantize_rows(pool.state[s], read_dtype)
                assert _bits_equal(rc.read[s], q), f"slot {s}: read copy != round(checkpoint)"
                if scale is not None:
                    assert _bits_equal(rc.scale[s], scale), f"slot {s}: fp8 scales differ"
                    exp["scale"][s] = rc.scale[s]
                exp["state"][s] = pool.state[s]
                exp["read"][s] = rc.read[s]
            else:
                n_nonflush += 1
                r = (int(rs[b]) + int(rl[b])) % R
                for n in ("ring_x", "ring_dt", "ring_B"):
                    exp[n][s, :, r] = getattr(pool, n)[s, :, r]
        for n, got, want in zip(names, full, exp_full):
            assert _bits_equal(got, want), f"{n} allocation: bytes outside the allowed rows changed"

    rep = SplitReport(_rel(torch.stack(outs), torch.stack(refs)),
                      _rel(torch.stack(st_got), torch.stack(st_ref)) if st_got else 0.0,
                      n_flush, n_nonflush)
    print(f"\n[split-mamba2] {impl} {shape} L={L} read={str(read_dtype)[6:]} "
          f"state={str(state_dtype)[6:]} act={str(act_dtype)[6:]} layout={layout}: "
          f"|out-f64|/|f64| = {rep.out_rel:.2e}, |S-f64|/|f64| = {rep.state_rel:.2e} "
          f"({n_flush} flush / {n_nonflush} non-flush rows)")
    return rep


def _check(rep: SplitReport, read_dtype, state_dtype=torch.float32, L: int = 4) -> None:
    assert rep.flush_rows > 0
    if L > 1:
        assert rep.nonflush_rows > 0
    assert rep.out_rel < OUT_TOL[read_dtype], rep
    assert rep.state_rel < STATE_TOL[state_dtype], rep


READS = [torch.bfloat16, torch.float16, F8]
READ_IDS = ["bf16", "fp16", "fp8"]


@pytest.mark.parametrize("read_dtype", READS, ids=READ_IDS)
@pytest.mark.parametrize("L", [1, 4, 16], ids=lambda L: f"L{L}")
def test_ref_cycles(read_dtype, L):
    rep = run_split_cycles("ref", SHAPE_P80, L, read_dtype, seed=10 + L,
                           variant=Variant(True, L == 4))
    _check(rep, read_dtype, L=L)


@pytest.mark.parametrize(
    "L,read_dtype",
    [(1, torch.bfloat16), (4, torch.bfloat16), (16, torch.bfloat16), (4, torch.float16),
     (4, F8), (16, F8)],
    ids=["L1-bf16", "L4-bf16", "L16-bf16", "L4-fp16", "L4-fp8", "L16-fp8"],
)
def test_kernel_cycles(L, read_dtype):
    shape = SHAPE_P80 if L < 16 else SHAPE_SMALL
    rep = run_split_cycles("kernel", shape, L, read_dtype, seed=20 + L, active=2,
                           variant=Variant(True, L == 4))
    _check(rep, read_dtype, L=L)


@pytest.mark.parametrize("impl", ["kernel", "ref"])
@pytest.mark.parametrize(
    "state_dtype,read_dtype,layout",
    [(torch.float16, torch.bfloat16, "permuted"), (torch.bfloat16, F8, "padded"),
     (torch.float32, F8, "permuted")],
    ids=["S-fp16-read-bf16-permuted", "S-bf16-read-fp8-padded", "S-fp32-read-fp8-permuted"],
)
def test_16bit_checkpoints_and_strided_copies(impl, state_dtype, read_dtype, layout):
    rep = run_split_cycles(impl, SHAPE_SMALL, 4, read_dtype, state_dtype=state_dtype,
                           layout=layout, variant=Variant(False, True), active=2, pads=2, seed=5)
    _check(rep, read_dtype, state_dtype)


@pytest.mark.parametrize("impl", ["kernel", "ref"])
@pytest.mark.parametrize("read_dtype", [torch.bfloat16, F8], ids=["bf16", "fp8"])
def test_fp32_activations(impl, read_dtype):
    """fp32 activations and outputs: the output error is the copy's rounding alone."""
    rep = run_split_cycles(impl, SHAPE_SMALL, 6, read_dtype, act_dtype=torch.float32, seed=3,
                           active=2)
    _check(rep, read_dtype)


@pytest.mark.parametrize("impl", ["kernel", "ref"])
def test_nonflush_rows_never_read_the_checkpoint(impl):
    """With NaN in every checkpoint, non-flush rows still give finite outputs equal to the same
    step computed from a checkpoint that holds the copy's values (so they read the copy only)."""
    shape, L, R, batch = SHAPE_SMALL, 4, 6, 3
    gen = torch.Generator().manual_seed(11)
    prm = make_params(shape, gen, DEVICE)
    pool = make_pool(shape, batch + 1, R, torch.float32, torch.float32, "layer", gen, DEVICE)
    rc = make_read_copy(pool.state, F8, "layer")
    # Two committed records per row (ring rows 0, 1), then one non-flush step.
    pool.ring_x[:, :, :2] = torch.randn(batch + 1, shape.H, 2, shape.P, generator=gen)
    pool.ring_dt[:, :, :2] = torch.rand(batch + 1, shape.H, 2, generator=gen) * 0.1
    pool.ring_B[:, :, :2] = torch.randn(batch + 1, shape.G, 2, shape.N, generator=gen)
    st = make_step(shape, batch, torch.float32, gen, DEVICE, False)
    idx = torch.arange(1, batch + 1, dtype=torch.int32)
    rs, rl = torch.zeros(batch, dtype=torch.int32), torch.full((batch,), 2, dtype=torch.int32)
    fl = torch.zeros(batch, dtype=torch.bool)
    rings = [t.clone() for t in (pool.ring_x, pool.ring_dt, pool.ring_B)]
    want = torch.empty(batch, shape.H, shape.P)
    deq = rc.read.float() * rc.scale[..., None]
    IMPLS["ref"](deq, *rings, st.x, st.dt, prm.A, st.B, st.C, want, idx, rs, rl, fl, D=prm.D,
                 dt_bias=prm.dt_bias, dt_softplus=True)
    pool.state.fill_(float("nan"))
    out = torch.full_like(want, float("nan"))
    IMPLS[impl](pool.state, pool.ring_x, pool.ring_dt, pool.ring_B, st.x, st.dt, prm.A, st.B,
                st.C, out, idx, rs, rl, fl, D=prm.D, dt_bias=prm.dt_bias, dt_softplus=True,
                read_state=rc.read, read_scale=rc.scale)
    assert torch.isfinite(out).all()
    assert _rel(out, want) < 1e-6, _rel(out, want)


def test_quantize_rows_fp8_scales():
    """Power-of-two scales with max|row|/scale in [128, 256); zero rows stay zero."""
    S = torch.randn(5, 7, 16) * torch.logspace(-30, 30, 7)[None, :, None]
    S[0, 0] = 0.0
    q, scale = quantize_rows(S, F8)
    ratio = S.abs().amax(-1) / scale
    live = S.abs().amax(-1) > 0
    assert ((ratio[live] >= 128) & (ratio[live] < 256)).all()
    assert (q[0, 0].float() == 0).all() and scale[0, 0] > 0
    m, e = torch.frexp(scale)
    assert (m == 0.5).all()  # powers of two
    back = q.float() * scale[..., None]
    # Round to nearest: half an e4m3 ulp (2^-4 relative) for normals, half the subnormal
    # spacing (2^-9 · scale) below 2^-6 · scale.
    bound = torch.maximum(S.abs() * 2.0**-4, scale[..., None] * 2.0**-10)
    assert ((back - S).abs() <= bound).all()


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _valid(read_dtype=torch.bfloat16):
    from test_mamba2_decode import _valid_args

    args, kw = _valid_args()
    st = args["state"]
    kw["read_state"] = torch.zeros(st.shape, dtype=read_dtype, device=st.device)
    kw["read_scale"] = (torch.ones(st.shape[:-1], device=st.device) if read_dtype == F8
                        else None)
    return args, kw


def _bad_read_cases():
    return {
        "read-shape": (torch.bfloat16, lambda a, k: k.update(read_state=k["read_state"][:, :1]),
                       "read_state"),
        "read-fp32": (torch.bfloat16, lambda a, k: k.update(read_state=k["read_state"].float()),
                      "read_state"),
        "read-same-as-state": (torch.bfloat16, lambda a, k: (
            a.update(state=a["state"].bfloat16())), "read_state"),
        "fp8-no-scale": (F8, lambda a, k: k.update(read_scale=None), "read_scale"),
        "fp8-scale-shape": (F8, lambda a, k: k.update(read_scale=k["read_scale"][..., :-1]),
                            "read_scale"),
        "fp8-scale-bf16": (F8, lambda a, k: k.update(read_scale=k["read_scale"].bfloat16()),
                           "read_scale"),
        "bf16-with-scale": (torch.bfloat16, lambda a, k: k.update(
            read_scale=torch.ones(a["state"].shape[:-1])), "read_scale"),
        "scale-without-copy": (torch.bfloat16, lambda a, k: k.update(
            read_state=None, read_scale=torch.ones(a["state"].shape[:-1])), "read_scale"),
        "copy-device": (torch.bfloat16, lambda a, k: k.update(
            read_state=k["read_state"].to("meta")), "device"),
    }


@pytest.mark.parametrize("impl", ["kernel", "ref"])
@pytest.mark.parametrize("case", list(_bad_read_cases()))
def test_value_errors(impl, case):
    read_dtype, mutate, match = _bad_read_cases()[case]
    args, kw = _valid(read_dtype)
    mutate(args, kw)
    with pytest.raises(ValueError, match=match):
        IMPLS[impl](*args.values(), **kw)


# --------------------------------------------------------------------------------------------
# GPU (H200): the same driver at Nemotron-3-Nano-4B's shape
# --------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("read_dtype", READS, ids=READ_IDS)
@pytest.mark.parametrize("L", [1, 16], ids=lambda L: f"L{L}")
def test_gpu_nano4b_split(read_dtype, L):
    rep = run_split_cycles("kernel", NANO_4B, L, read_dtype, active=24, pads=8, seed=500 + L)
    _check(rep, read_dtype, L=L)


@pytest.mark.gpu
def test_gpu_nano4b_split_strided_gate_fp8():
    rep = run_split_cycles("kernel", NANO_4B, 16, F8, layout="padded",
                           variant=Variant(False, True), active=16, pads=4, seed=600)
    _check(rep, F8)


@pytest.mark.parametrize("read_dtype", [F8, torch.bfloat16], ids=["fp8", "bf16"])
def test_kernel_copy_refresh_extremes(read_dtype):
    """Flush rows whose checkpoint rows are zero, tiny (1e-30) and huge (1e30): the kernel's
    copy and fp8 scales are bit-identical to ``quantize_rows`` of the stored checkpoint (A = 0
    and x = 0 keep the state's values, so the refresh sees these rows)."""
    shape = Shape(H=2, G=1, P=20, N=16)
    gen = torch.Generator().manual_seed(9)
    slots, R = 3, 2
    state = torch.randn(slots, shape.H, shape.P, shape.N, generator=gen)
    state[1, 0, :4] = 0.0
    state[1, 0, 4:8] *= 1e-30
    state[1, 1, :4] *= 1e30
    state[2, 1, 3, :] = -0.0
    state = state.to(DEVICE)
    rc = make_read_copy(state, read_dtype, "layer")
    rc.read.fill_(float("nan"))
    ring_x = torch.zeros(slots, shape.H, R, shape.P, dtype=torch.bfloat16, device=DEVICE)
    ring_dt = torch.zeros(slots, shape.H, R, device=DEVICE)
    ring_B = torch.zeros(slots, shape.G, R, shape.N, dtype=torch.bfloat16, device=DEVICE)
    batch = 2
    x = torch.zeros(batch, shape.H, shape.P, dtype=torch.bfloat16, device=DEVICE)
    B = torch.randn(batch, shape.G, shape.N, generator=gen).to(DEVICE, torch.bfloat16)
    C = torch.randn(batch, shape.G, shape.N, generator=gen).to(DEVICE, torch.bfloat16)
    dt = torch.full((batch, shape.H), 0.1, device=DEVICE)
    A = torch.zeros(shape.H, device=DEVICE)
    out = torch.empty(batch, shape.H, shape.P, device=DEVICE)
    idx = torch.tensor([1, 2], dtype=torch.int32, device=DEVICE)
    zeros = torch.zeros(batch, dtype=torch.int32, device=DEVICE)
    before = state.clone()
    IMPLS["kernel"](state, ring_x, ring_dt, ring_B, x, dt, A, B, C, out, idx, zeros, zeros,
                    torch.ones(batch, dtype=torch.bool, device=DEVICE), read_state=rc.read,
                    read_scale=rc.scale)
    assert torch.equal(state, before)  # values kept (fma(-0, 1, +0) gives +0: not bitwise)
    q, scale = quantize_rows(state[1:], read_dtype)
    assert _bits_equal(rc.read[1:], q)
    if scale is not None:
        assert _bits_equal(rc.scale[1:], scale)
        assert (scale[0, 0, :4] == 2.0**-126).all()  # zero rows: the floor scale, zeros stored
