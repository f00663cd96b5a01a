"""Mamba-2 ReplaySSM decode: kernel and reference vs the float64 conventional recurrence.

On CPU the Triton kernel runs under the interpreter (conftest sets ``TRITON_INTERPRET=1``) on small
shapes; the ``gpu``-marked tests rerun the same drivers at Nemotron-3-Nano-4B's shape on the H200.

Every cycle test drives the cursors with ``decode_cursor_step`` over at least three full ring
cycles with randomly forced flushes, on layer views of ``[layers, slots, ...]`` pools, with padding
rows and a per-step row permutation, and checks after every call:

- outputs NaN-poisoned before the call are fully written (padding rows stay NaN: untouched);
- outputs and flushed checkpoints against the float64 sequential recurrence (relative L2 error,
  printed as ``[mamba2] ...`` lines; run pytest with ``-s`` to see them);
- every byte of the pools outside the rows the protocol allows to change is bit-identical (other
  layers, untouched slots, checkpoints of non-flush rows, ring rows other than the appended one);
- appended records equal the inputs exactly (x, B) and Δ to float64 within fp32 rounding.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import pytest
import torch

from replayssm_kernels import (
    decode_cursor_step,
    mamba2_conventional_f64,
    mamba2_replay_decode,
    mamba2_replay_decode_ref,
)

# Under the interpreter, round fp32 -> bf16 to nearest even as the GPU does (the interpreter
# itself truncates); the fixture lives in conftest.py and does nothing on the GPU.
pytestmark = pytest.mark.usefixtures("interpreter_bf16_rtne")

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"
IMPLS = {"kernel": mamba2_replay_decode, "ref": mamba2_replay_decode_ref}


@dataclasses.dataclass(frozen=True)
class Shape:
    H: int
    G: int
    P: int
    N: int

    def __str__(self) -> str:
        return f"H{self.H}-G{self.G}-P{self.P}-N{self.N}"


CPU_SHAPE_A = Shape(H=6, G=2, P=20, N=16)  # P=20: one full 16-row tile + a masked tile
CPU_SHAPE_B = Shape(H=6, G=3, P=24, N=16)
CPU_SHAPE_C = Shape(H=6, G=3, P=12, N=16)  # one masked tile: the long (L=16) runs stay cheap
CPU_SHAPE_D = Shape(H=3, G=1, P=20, N=16)
NANO_4B = Shape(H=96, G=8, P=80, N=128)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-300))


# --------------------------------------------------------------------------------------------
# Problem set-up
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Params:
    A: torch.Tensor  # [H] fp32, -exp(A_log)
    dt_bias: torch.Tensor  # [H] fp32
    D: torch.Tensor  # [H] fp32


def make_params(shape: Shape, gen: torch.Generator, device: str) -> Params:
    H = shape.H
    # Mamba-2 init: A_log ~ log U[1, 16]; dt_bias = softplus^-1(U[1e-3, 1e-1]).
    A = -torch.empty(H).uniform_(1.0, 16.0, generator=gen)
    dt0 = torch.exp(torch.empty(H).uniform_(math.log(1e-3), math.log(1e-1), generator=gen))
    dt_bias = dt0 + torch.log(-torch.expm1(-dt0))
    # Head 0 straddles softplus' threshold (dt + dt_bias around 20) with a slow decay.
    dt_bias[0] = 20.0
    A[0] = -0.05
    D = torch.randn(H, generator=gen)
    return Params(A.to(device), dt_bias.to(device), D.to(device))


@dataclasses.dataclass
class Pool:
    """Layer ``layer`` of ``[layers, slots, ...]`` pools, optionally with strided layouts."""

    state: torch.Tensor
    ring_x: torch.Tensor
    ring_dt: torch.Tensor
    ring_B: torch.Tensor
    full: tuple[torch.Tensor, ...]  # the whole allocations (for bitwise untouched checks)


def make_pool(
    shape: Shape, slots: int, R: int, state_dtype: torch.dtype, act_dtype: torch.dtype,
    layout: str, gen: torch.Generator, device: str, layers: int = 2, layer: int = 1,
) -> Pool:
    H, G, P, N = shape.H, shape.G, shape.P, shape.N
    if layout == "layer":  # a plain layer slice of a contiguous pool
        st = torch.randn(layers, slots, H, P, N, generator=gen) * 0.5
        state = st[layer]
    elif layout == "permuted":  # state stored [.., N, P]: stride 1 on P, not on N
        st = torch.randn(layers, slots, H, N, P, generator=gen) * 0.5
        state = st[layer].transpose(-1, -2)
    elif layout == "padded":  # padded rows and columns: no dim is dense
        st = torch.randn(layers, slots + 1, H, P + 3, N + 5, generator=gen) * 0.5
        state = st[layer, 1:, :, 1 : P + 1, :N]
    else:
        raise AssertionError(layout)
    st = st.to(device=device, dtype=state_dtype)
    state = _same_view(st, state)
    # Rings start NaN: a read of a row that was never written poisons the outputs.
    nan = float("nan")
    rx = torch.full((layers, slots, H, R, P), nan, dtype=act_dtype, device=device)
    rdt = torch.full((layers, slots, H, R), nan, dtype=torch.float32, device=device)
    rB = torch.full((layers, slots, G, R, N), nan, dtype=act_dtype, device=device)
    if layout == "padded":
        rx_full = torch.full((layers, slots, H, R + 2, P + 4), nan, dtype=act_dtype, device=device)
        ring_x = rx_full[layer, :, :, 1 : R + 1, 2 : P + 2]
        return Pool(state, ring_x, rdt[layer], rB[layer], (st, rx_full, rdt, rB))
    return Pool(state, rx[layer], rdt[layer], rB[layer], (st, rx, rdt, rB))


def _same_view(full: torch.Tensor, view_cpu: torch.Tensor) -> torch.Tensor:
    """Rebuild on ``full`` (moved/cast) the view that ``view_cpu`` is of its CPU fp32 base."""
    return torch.as_strided(full, view_cpu.shape, view_cpu.stride(), view_cpu.storage_offset())


@dataclasses.dataclass
class Step:
    x: torch.Tensor
    dt: torch.Tensor  # [batch, H] raw
    B: torch.Tensor
    C: torch.Tensor
    z: torch.Tensor | None


def make_step(shape: Shape, batch: int, act_dtype, gen, device, with_z: bool) -> Step:
    H, G, P, N = shape.H, shape.G, shape.P, shape.N
    x = torch.randn(batch, H, P, generator=gen)
    dt = torch.randn(batch, H, generator=gen) * 0.7
    dt[:, 0] += torch.randn(batch, generator=gen)  # head 0: dt + dt_bias on both sides of 20
    B = torch.randn(batch, G, N, generator=gen) / math.sqrt(N)
    C = torch.randn(batch, G, N, generator=gen)
    z = torch.randn(batch, H, P, generator=gen) if with_z else None
    # The mixer's layout: x, B and C are column slices of one conv output row per token, dt a
    # slice of the in_proj row, so none of them is contiguous over the batch.
    hp, gn = H * P, G * N
    xBC = torch.cat([x.reshape(batch, hp), B.reshape(batch, gn), C.reshape(batch, gn)], dim=1)
    xBC = xBC.to(device=device, dtype=act_dtype)
    proj = torch.cat([torch.zeros(batch, 3), dt], dim=1).to(device=device, dtype=act_dtype)
    return Step(
        xBC[:, :hp].view(batch, H, P),
        proj[:, 3:],
        xBC[:, hp : hp + gn].view(batch, G, N),
        xBC[:, hp + gn :].view(batch, G, N),
        None if z is None else z.to(device=device, dtype=act_dtype),
    )


@dataclasses.dataclass(frozen=True)
class Variant:
    """How the caller passes the tied parameters (both forms must work)."""

    broadcast: bool  # mixer form: dt [b,H,P], A [H,P,N], D/dt_bias [H,P], all stride 0
    with_z: bool


def call_args(shape: Shape, prm: Params, st: Step, variant: Variant):
    H, P, N = shape.H, shape.P, shape.N
    if variant.broadcast:
        dt = st.dt[:, :, None].expand(-1, -1, P)
        A = prm.A[:, None, None].expand(-1, P, N)
        D = prm.D[:, None].expand(-1, P)
        dt_bias = prm.dt_bias[:, None].expand(-1, P)
    else:
        dt, A, D, dt_bias = st.dt, prm.A, prm.D, prm.dt_bias
    return dt, A, D, dt_bias


# --------------------------------------------------------------------------------------------
# The cycle driver
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Report:
    out_rel: float
    state_rel: float
    flush_rows: int
    nonflush_rows: int
    steps: int


def run_cycles(
    impl: str, shape: Shape, L: int, state_dtype: torch.dtype, act_dtype: torch.dtype, *,
    layout: str = "layer", variant: Variant = Variant(True, False), active: int = 3,
    pads: int = 1, cycles: int = 3, force_p: float = 0.15, seed: int = 0, device: str = DEVICE,
    sglang_check: bool = False,
) -> Report:
    gen = torch.Generator().manual_seed(seed)
    fn = IMPLS[impl]
    H, G, P, N = shape.H, shape.G, shape.P, shape.N
    R = L + 2  # R > L: the flush start wraps at varying offsets
    slots = active + 3  # slot 0 (null) and two never-scheduled slots stay untouched
    prm = make_params(shape, gen, device)
    pool = make_pool(shape, slots, R, state_dtype, act_dtype, layout, gen, device)
    cursors = torch.zeros(slots, 2, dtype=torch.int32, device=device)
    active_slots = torch.randperm(slots - 1, generator=gen)[:active] + 1
    shadow = {int(s): pool.state[int(s)].double().clone() for s in active_slots}
    sg_state = pool.state.clone().contiguous() if sglang_check else None

    outs, refs, st_got, st_ref = [], [], [], []
    n_flush = n_nonflush = 0
    steps = cycles * L + 4
    batch = active + pads
    for _ in range(steps):
        rows = torch.cat([active_slots, torch.full((pads,), -1, dtype=torch.int64)])
        rows = rows[torch.randperm(batch, generator=gen)]
        slot_idx = rows.to(device=device, dtype=torch.int32)
        force = (torch.rand(batch, generator=gen) < force_p).to(device)
        rs = torch.empty(batch, dtype=torch.int32, device=device)
        rl = torch.empty_like(rs)
        fl = torch.empty(batch, dtype=torch.bool, device=device)
        decode_cursor_step(cursors, slot_idx, force, L, R, rs, rl, fl)
        st = make_step(shape, batch, act_dtype, gen, device, variant.with_z)
        dt, A, D, dt_bias = call_args(shape, prm, st, variant)
        out = torch.full((batch, H, P), float("nan"), dtype=act_dtype, device=device)
        before = tuple(t.clone() for t in pool.full)
        state_before = pool.state.clone()

        fn(pool.state, pool.ring_x, pool.ring_dt, pool.ring_B, st.x, dt, A, st.B, st.C, out,
           slot_idx, rs, rl, fl, D=D, z=st.z, dt_bias=dt_bias, dt_softplus=True)

        if sg_state is not None:
            sg_out = torch.empty_like(out)
            sglang_ssu(sg_state, st.x, st.dt[:, :, None].expand(-1, -1, P),
                       prm.A[:, None, None].expand(-1, P, N), st.B, st.C,
                       D=prm.D[:, None].expand(-1, P), z=st.z,
                       dt_bias=prm.dt_bias[:, None].expand(-1, P), dt_softplus=True,
                       state_batch_indices=slot_idx, out=sg_out)

        # Expected pools: `before` with only the protocol-allowed regions replaced.
        exp_full = [t.clone() for t in before]
        exp_view = dataclasses.replace(
            pool, **{k: _rebase(getattr(pool, k), exp_full[i])
                     for i, k in enumerate(("state", "ring_x", "ring_dt", "ring_B"))})
        rows_cpu = slot_idx.cpu().tolist()
        for b, s in enumerate(rows_cpu):
            if s < 0:
                assert torch.isnan(out[b]).all(), f"padding row {b}: out written"
                continue
            assert not torch.isnan(out[b]).any(), f"row {b}: out not fully written"
            x64 = st.x[b : b + 1]
            o64, s64 = mamba2_conventional_f64(
                shadow[s], x64, st.dt[b : b + 1], prm.A, st.B[b : b + 1], st.C[b : b + 1],
                D=prm.D, z=None if st.z is None else st.z[b : b + 1], dt_bias=prm.dt_bias,
                dt_softplus=True,
            )
            shadow[s] = s64[...]
            outs.append(out[b].double().cpu())
            refs.append(o64[0].cpu())
            if bool(fl[b]):
                n_flush += 1
                exp_view.state[s] = pool.state[s]
                st_got.append(pool.state[s].double().cpu())
                st_ref.append(s64.cpu())
                if sg_state is not None:
                    assert _bits_equal(pool.state[s], sg_state[s]), (
                        f"slot {s}: fp32 checkpoint differs from selective_state_update "
                        f"(max |diff| {(pool.state[s] - sg_state[s]).abs().max().item():.3e})"
                    )
            else:
                n_nonflush += 1
                assert _bits_equal(pool.state[s], state_before[s]), "non-flush row wrote state"
                r = (int(rs[b]) + int(rl[b])) % R
                assert torch.equal(pool.ring_x[s, :, r], st.x[b]), "ring_x record != x"
                assert torch.equal(pool.ring_B[s, :, r], st.B[b]), "ring_B record != B"
                d64 = st.dt[b].double() + prm.dt_bias.double()
                d64 = torch.where(d64 <= 20, torch.log1p(torch.exp(d64.clamp(max=20))), d64)
                # fp32 log(exp(u) + 1) cancels for small Δ: an absolute error of ~ulp(1).
                torch.testing.assert_close(pool.ring_dt[s, :, r].double(), d64, rtol=2e-6,
                                           atol=3e-7)
                exp_view.ring_x[s, :, r] = pool.ring_x[s, :, r]
                exp_view.ring_dt[s, :, r] = pool.ring_dt[s, :, r]
                exp_view.ring_B[s, :, r] = pool.ring_B[s, :, r]
        for name, got, want in zip(("state", "ring_x", "ring_dt", "ring_B"), pool.full, exp_full):
            assert _bits_equal(got, want), f"{name} pool: bytes outside the allowed rows changed"

    out_rel = _rel(torch.stack(outs), torch.stack(refs))
    state_rel = _rel(torch.stack(st_got), torch.stack(st_ref)) if st_got else 0.0
    rep = Report(out_rel, state_rel, n_flush, n_nonflush, steps)
    print(
        f"\n[mamba2] {impl} {shape} L={L} state={str(state_dtype)[6:]} act={str(act_dtype)[6:]} "
        f"layout={layout}: |out-f64|/|f64| = {out_rel:.2e}, |S-f64|/|f64| = {state_rel:.2e} "
        f"({n_flush} flush / {n_nonflush} non-flush rows, {steps} steps)"
    )
    return rep


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN payloads included), i.e. ``atol = rtol = 0`` and NaN == NaN."""
    as_int = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.view(as_int), b.view(as_int))


def _rebase(view: torch.Tensor, other_full: torch.Tensor) -> torch.Tensor:
    """The same view as ``view`` (of its pool allocation), taken of ``other_full``."""
    return torch.as_strided(other_full, view.shape, view.stride(), view.storage_offset())


def sglang_ssu(*args, **kwargs):
    """SGLang 0.5.17's ``selective_state_update`` (Triton), runnable under the CPU interpreter."""
    if not hasattr(torch.cpu, "device"):  # it enters torch.get_device_module(dev).device(idx)
        torch.cpu.device = lambda idx=None: contextlib.nullcontext()
    from sglang.kernels.ops.mamba.triton_ops.mamba_ssm import selective_state_update

    return selective_state_update(*args, **kwargs)


# Output tolerances (relative L2 vs float64): bf16 outputs are bound by the bf16 store
# (2^-9 relative per element); fp32 outputs by fp32 arithmetic.
OUT_TOL = {torch.bfloat16: 3e-3, torch.float32: 2e-5}
STATE_TOL = {torch.float32: 2e-5, torch.bfloat16: 5e-3}


def _check(rep: Report, state_dtype, act_dtype, impl: str = "ref") -> None:
    assert rep.flush_rows > 0
    assert rep.out_rel < OUT_TOL[act_dtype], rep
    assert rep.state_rel < STATE_TOL[state_dtype], rep


# --------------------------------------------------------------------------------------------
# CPU tests (interpreter + reference), small shapes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["kernel", "ref"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["S-fp32", "S-bf16"])
@pytest.mark.parametrize("L", [1, 4, 16], ids=lambda L: f"L{L}")
def test_cycles_vs_f64(impl, state_dtype, L):
    """Three ring cycles with forced flushes vs float64. For the kernel with an fp32 state this
    also checks, after every flush, that the checkpoint is bit-identical to SGLang's
    ``selective_state_update`` run step by step on the same inputs (CPU: both interpreted)."""
    sglang_check = impl == "kernel" and state_dtype == torch.float32
    shape = CPU_SHAPE_C if L == 16 else CPU_SHAPE_A
    rep = run_cycles(impl, shape, L, state_dtype, torch.bfloat16, seed=L, active=2,
                     variant=Variant(True, L == 4), sglang_check=sglang_check)
    _check(rep, state_dtype, torch.bfloat16, impl)
    if L > 1:
        assert rep.nonflush_rows > 0


@pytest.mark.parametrize("impl", ["kernel", "ref"])
@pytest.mark.parametrize(
    "layout,variant",
    [("permuted", Variant(False, True)), ("padded", Variant(True, True))],
    ids=["permuted-headform-z", "padded-broadcast-z"],
)
def test_strided_pools_and_gate(impl, layout, variant):
    rep = run_cycles(impl, CPU_SHAPE_B, 4, torch.float32, torch.bfloat16, layout=layout,
                     variant=variant, active=2, pads=2, seed=7)
    _check(rep, torch.float32, torch.bfloat16, impl)


@pytest.mark.parametrize("impl", ["kernel", "ref"])
def test_fp32_activations_accuracy(impl):
    """fp32 activations and outputs: the inner-product route is within fp32 rounding of f64."""
    rep = run_cycles(impl, CPU_SHAPE_C, 8, torch.float32, torch.float32, seed=3, active=2)
    _check(rep, torch.float32, torch.float32, impl)


def test_kernel_small_tiles_several_chunks(monkeypatch):
    """BLOCK_P = 8 (P = 20: three tiles, the last masked), BLOCK_L = 8 and FOLD_UNROLL = 3 (an
    8-row ring: full chunks of three records and a remainder): tile masks and the fold's
    remainder loop, still bit-identical to SGLang."""
    import replayssm_kernels.mamba2_decode.kernel as k

    monkeypatch.setattr(k, "launch_config",
                        lambda P, N, R: k.LaunchConfig(block_p=8, block_l=8, fold_unroll=3,
                                                       num_warps=2, l2_ahead=0))
    rep = run_cycles("kernel", CPU_SHAPE_D, 6, torch.float32, torch.bfloat16, seed=5, active=2,
                     cycles=3, force_p=0.05, sglang_check=True)
    _check(rep, torch.float32, torch.bfloat16, "kernel")


# --------------------------------------------------------------------------------------------
# P-split: several programs share one (row, head) (small batches on the GPU; forced here)
# --------------------------------------------------------------------------------------------


def _shadow_split(monkeypatch, p_split: int, block_p: int | None = None) -> list[int]:
    """Route every launch of the public wrapper through ``p_split`` programs per (row, head),
    after running the unsplit launch (``p_split = 1``, same ``block_p``) on clones of every
    in-place argument; assert both leave the same bits (pools, read copy, outputs: NaN
    payloads of untouched rows included). Returns a list that grows by one per launch."""
    import replayssm_kernels.mamba2_decode.kernel as k

    orig = k.mamba2_replay_decode_fwd
    calls: list[int] = []

    def fwd(*args, **kw):
        kw.pop("p_split", None)  # the wrapper's choice (None: the rule; 1: batch_invariant), replaced here
        inplace = (0, 1, 2, 3, 9)  # state, ring_x, ring_dt, ring_B, out
        twin = [a.clone() if i in inplace else a for i, a in enumerate(args)]
        twin_kw = {n: (v.clone() if n in ("read_state", "read_scale") and v is not None else v)
                   for n, v in kw.items()}
        orig(*twin, **twin_kw, block_p=block_p, p_split=1)
        orig(*args, **kw, block_p=block_p, p_split=p_split)
        for i in inplace:
            assert _bits_equal(args[i], twin[i]), f"arg {i}: split launch != unsplit launch"
        for n in ("read_state", "read_scale"):
            if kw.get(n) is not None:
                assert _bits_equal(kw[n], twin_kw[n]), f"{n}: split launch != unsplit launch"
        calls.append(p_split)

    monkeypatch.setattr(k, "mamba2_replay_decode_fwd", fwd)
    return calls


# (shape, block_p, p_split, L): P = 20 / 12 / 24 are no multiple of the split's rows per
# program, so the last program of each head holds a partial tile (D-bp8-s2: 2 + 1 tiles).
SPLIT_CASES = {
    "A-bp16-s2-L4": (CPU_SHAPE_A, 16, 2, 4),  # rows 0-15 | 16-19
    "D-bp8-s3-L1": (CPU_SHAPE_D, 8, 3, 1),  # rows 0-7 | 8-15 | 16-19
    "D-bp8-s2-L4": (CPU_SHAPE_D, 8, 2, 4),  # rows 0-15 | 16-19
    "C-bp8-s2-L8": (CPU_SHAPE_C, 8, 2, 8),  # rows 0-7 | 8-11
    # head dim 80, N = 32, BLOCK_L = 8: the fused record term with four columns per record
    "P80N32-bp16-s3-L4": (Shape(H=2, G=1, P=80, N=32), 16, 3, 4),  # rows 0-31 | 32-63 | 64-79
}


@pytest.mark.parametrize("case", list(SPLIT_CASES))
def test_kernel_forced_split_cycles(monkeypatch, case):
    """Forced P-split: >= 3 ring cycles (flush and non-flush rows mixed in every launch, padding
    rows) vs float64, fp32 checkpoint bit-identical to SGLang after every flush, untouched bytes
    bit-identical, and every launch bit-identical to the unsplit launch."""
    shape, block_p, p_split, L = SPLIT_CASES[case]
    calls = _shadow_split(monkeypatch, p_split, block_p)
    rep = run_cycles("kernel", shape, L, torch.float32, torch.bfloat16, seed=40 + L, active=3,
                     pads=2, variant=Variant(True, L == 4), force_p=0.2, sglang_check=True)
    _check(rep, torch.float32, torch.bfloat16, "kernel")
    assert len(calls) == rep.steps
    if L > 1:
        assert rep.nonflush_rows > 0


@pytest.mark.parametrize(
    "layout,variant,state_dtype",
    [("permuted", Variant(False, True), torch.float32),
     ("padded", Variant(True, True), torch.bfloat16)],
    ids=["permuted-headform-z-S-fp32", "padded-broadcast-z-S-bf16"],
)
def test_kernel_forced_split_strided(monkeypatch, layout, variant, state_dtype):
    """Forced P-split (P = 24 in three 8-row programs) on strided pools, with the gate, and a
    16-bit checkpoint (rounded once per flush, per program's tile)."""
    _shadow_split(monkeypatch, 3, 8)
    rep = run_cycles("kernel", CPU_SHAPE_B, 4, state_dtype, torch.bfloat16, layout=layout,
                     variant=variant, active=2, pads=2, seed=8)
    _check(rep, state_dtype, torch.bfloat16, "kernel")


@pytest.mark.usefixtures("interpreter_fp16_fp8_rtne")
@pytest.mark.parametrize("read", ["bf16", "fp8"])
def test_kernel_forced_split_read_copy(monkeypatch, read):
    """Forced P-split with the split-precision read copy (test_split_precision_mamba2's driver):
    non-flush rows read the copy, flush rows refresh it tile by tile (fp8: per-row scales), bit
    for bit as the unsplit launch."""
    from test_split_precision_mamba2 import F8, SHAPE_P80, run_split_cycles
    from test_split_precision_mamba2 import _check as check_split

    read_dtype = {"bf16": torch.bfloat16, "fp8": F8}[read]
    _shadow_split(monkeypatch, 3, 16)  # P = 80: tiles 0-1 | 2-3 | 4
    rep = run_split_cycles("kernel", SHAPE_P80, 4, read_dtype, seed=31, active=2)
    check_split(rep, read_dtype, L=4)


def test_p_split_rule():
    """The fixed rule: Nemotron-3-Nano-4B (96 heads, five 16-row tiles) on an H200 (132 SMs)
    splits at batch < 6 only; batch >= 6 (so every batch >= 64) is the unsplit launch; off CUDA
    (no SM count) it never splits. Every result is a split that leaves no program empty."""
    from replayssm_kernels.mamba2_decode.kernel import SPLIT_PROGRAMS_PER_SM, p_split_rule

    got = {b: p_split_rule(5, 96, b, 132) for b in (1, 2, 3, 4, 5, 6, 8, 64, 256, 512)}
    assert got == {1: 5, 2: 3, 3: 2, 4: 2, 5: 2, 6: 1, 8: 1, 64: 1, 256: 1, 512: 1}
    assert p_split_rule(5, 96, 1, None) == 1
    for n_tiles in (1, 2, 3, 5, 7):
        for heads in (1, 6, 96):
            for batch in (1, 2, 3, 16):
                s = p_split_rule(n_tiles, heads, batch, 132)
                tiles = -(-n_tiles // s)
                assert 1 <= s <= n_tiles and -(-n_tiles // tiles) == s
                # Short of the target only when already at one tile per program.
                assert heads * batch * s >= SPLIT_PROGRAMS_PER_SM * 132 or s == n_tiles
                if s > 1:  # the smallest such split
                    smaller = [-(-n_tiles // t) for t in range(1, n_tiles + 1)]
                    assert all(heads * batch * v < SPLIT_PROGRAMS_PER_SM * 132
                               for v in smaller if v < s)


@pytest.mark.parametrize("p_split", [0, 4, 6])
def test_p_split_override_refused(p_split):
    """An override that would leave a program without a tile (or none at all) is refused,
    naming the valid splits (P = 80, five 16-row tiles: 1, 2, 3, 5)."""
    import replayssm_kernels.mamba2_decode.kernel as k

    shape = Shape(H=2, G=1, P=80, N=16)
    args, kw = _valid_args(shape)
    dims = dict(stride_dt=(args["dt"].stride(0), args["dt"].stride(1)), stride_A_head=1,
                stride_D=(1, 0), stride_dt_bias_head=1)
    with pytest.raises(ValueError, match=r"p_split: expected one of \[1, 2, 3, 5\]"):
        k.mamba2_replay_decode_fwd(*args.values(), **kw, **dims, p_split=p_split)


def test_empty_batch_is_a_no_op():
    shape = CPU_SHAPE_A
    gen = torch.Generator().manual_seed(0)
    pool = make_pool(shape, 3, 4, torch.float32, torch.bfloat16, "layer", gen, DEVICE)
    before = [t.clone() for t in pool.full]
    prm = make_params(shape, gen, DEVICE)
    st = make_step(shape, 0, torch.bfloat16, gen, DEVICE, False)
    e = torch.empty(0, dtype=torch.int32, device=DEVICE)
    out = torch.empty(0, shape.H, shape.P, dtype=torch.bfloat16, device=DEVICE)
    mamba2_replay_decode(pool.state, pool.ring_x, pool.ring_dt, pool.ring_B, st.x, st.dt, prm.A,
                         st.B, st.C, out, e, e, e, e.bool(), dt_bias=prm.dt_bias, dt_softplus=True)
    assert all(_bits_equal(a, b) for a, b in zip(before, pool.full))


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _valid_args(shape: Shape = CPU_SHAPE_A, batch: int = 2, R: int = 4):
    gen = torch.Generator().manual_seed(1)
    pool = make_pool(shape, 4, R, torch.float32, torch.bfloat16, "layer", gen, DEVICE)
    prm = make_params(shape, gen, DEVICE)
    st = make_step(shape, batch, torch.bfloat16, gen, DEVICE, True)
    idx = torch.arange(1, batch + 1, dtype=torch.int32, device=DEVICE)
    zeros = torch.zeros(batch, dtype=torch.int32, device=DEVICE)
    args = dict(
        state=pool.state, ring_x=pool.ring_x, ring_dt=pool.ring_dt, ring_B=pool.ring_B, x=st.x,
        dt=st.dt, A=prm.A, B=st.B, C=st.C,
        out=torch.empty(batch, shape.H, shape.P, dtype=torch.bfloat16, device=DEVICE),
        slot_idx=idx, ring_start=zeros, ring_len=zeros.clone(),
        flush=torch.zeros(batch, dtype=torch.bool, device=DEVICE),
    )
    kw = dict(D=prm.D, z=st.z, dt_bias=prm.dt_bias, dt_softplus=True)
    return args, kw


def _bad_cases():
    H, P, N = CPU_SHAPE_A.H, CPU_SHAPE_A.P, CPU_SHAPE_A.N
    return {
        "state-3d": ("state", lambda a: a["state"][0], "state"),
        "state-int": ("state", lambda a: a["state"].to(torch.int32), "state"),
        "x-wrong-P": ("x", lambda a: a["x"][:, :, :-1], "x"),
        "ring_x-dtype": ("ring_x", lambda a: a["ring_x"].float(), "ring_x"),
        "ring_dt-bf16": ("ring_dt", lambda a: a["ring_dt"].bfloat16(), "ring_dt"),
        "ring_B-R-mismatch": ("ring_B", lambda a: a["ring_B"][:, :, :-1], "ring_B"),
        "B-groups-not-dividing": ("B", lambda a: torch.zeros(2, 4, N, dtype=torch.bfloat16), "B"),
        "C-shape": ("C", lambda a: a["C"][:1], "C"),
        "dt-untied": ("dt", lambda a: torch.zeros(2, H, P, dtype=torch.bfloat16), "untied"),
        "A-untied": ("A", lambda a: torch.zeros(H, P, N), "untied"),
        "A-shape": ("A", lambda a: torch.zeros(H + 1), "A"),
        "slot_idx-float": ("slot_idx", lambda a: a["slot_idx"].float(), "slot_idx"),
        "ring_len-batch": ("ring_len", lambda a: a["ring_len"][:1], "ring_len"),
        "flush-int": ("flush", lambda a: a["flush"].int(), "flush"),
        "out-shape": ("out", lambda a: a["out"][:, :1], "out"),
        "device-mix": ("x", lambda a: a["x"].to("meta"), "device"),
        "slot_idx-strided": ("slot_idx", lambda a: a["slot_idx"].repeat_interleave(2)[::2], "stride 1"),
        "ring_start-strided": ("ring_start", lambda a: a["ring_start"].repeat_interleave(2)[::2], "stride 1"),
        "flush-strided": ("flush", lambda a: a["flush"].repeat_interleave(2)[::2], "stride 1"),
        "out-overlapping": ("out", lambda a: a["out"][:1].expand_as(a["out"]), "stride-0"),
        "ring_dt-overlapping": ("ring_dt", lambda a: a["ring_dt"][:1].expand_as(a["ring_dt"]), "stride-0"),
    }


@pytest.mark.parametrize("impl", ["kernel", "ref"])
@pytest.mark.parametrize("case", list(_bad_cases()))
def test_value_errors(impl, case):
    args, kw = _valid_args()
    name, mutate, match = _bad_cases()[case]
    args[name] = mutate(args)
    with pytest.raises(ValueError, match=match):
        IMPLS[impl](*args.values(), **kw)


@pytest.mark.parametrize("impl", ["kernel", "ref"])
@pytest.mark.parametrize("which", ["D", "dt_bias", "z"])
def test_value_errors_optional(impl, which):
    args, kw = _valid_args()
    H, P = CPU_SHAPE_A.H, CPU_SHAPE_A.P
    bad = {
        "D": torch.zeros(H + 1),
        "dt_bias": torch.zeros(H, P),  # untied
        "z": torch.zeros(1, H, P, dtype=torch.bfloat16),
    }[which]
    kw[which] = bad
    with pytest.raises(ValueError, match=which):
        IMPLS[impl](*args.values(), **kw)


# --------------------------------------------------------------------------------------------
# Codegen: the fold compiles (sm_90a, no GPU needed) to selective_state_update's update
# --------------------------------------------------------------------------------------------

_CODEGEN_SCRIPT = r"""
import json, sys
import triton
from sglang.kernels.ops.mamba.triton_ops import mamba_ssm
from replayssm_kernels.mamba2_decode import kernel as ours

H, P, N, G, R = 96, 80, 128, 8, 16  # Nemotron-3-Nano-4B, L = 16
ROOT = sys.argv[1]  # the repository root (benchmarks/ is not an installed package)
XBC = H * P + 2 * G * N  # the mixer's conv row: x, B, C are column slices of it
DT = H + XBC  # dt is a slice of the in_proj row
sys.path.insert(0, ROOT)
from benchmarks.sweep_mamba2 import VARIANTS, compile_sm90a, offline_build, variant_config

def build(kern, ptrs, ints, const, num_warps):
    return compile_sm90a(kern, ptrs, ints, const, dict(num_warps=num_warps)).asm["ptx"]

sg_fn = mamba_ssm._selective_scan_update_kernel
while not isinstance(sg_fn, triton.runtime.JITFunction):  # unwrap @triton.heuristics
    sg_fn = sg_fn.fn
sg = build(
    sg_fn,
    dict(state_ptr="*fp32", x_ptr="*bf16", dt_ptr="*bf16", dt_bias_ptr="*fp32", A_ptr="*fp32",
         B_ptr="*bf16", C_ptr="*bf16", D_ptr="*fp32", z_ptr="constexpr", out_ptr="*bf16",
         state_batch_indices_ptr="*i32", intermediate_states_buffer="constexpr",
         retrieve_parent_token_ptr="constexpr", intermediate_state_indices_ptr="constexpr",
         rand_seed_ptr="constexpr"),
    dict(pad_slot_id=-1, cache_steps=0, batch=256, T=3, nheads=H, dim=P, dstate=N,
         nheads_ngroups_ratio=H // G, stride_state_batch=H * P * N, stride_state_head=P * N,
         stride_state_dim=N, stride_state_dstate=1, stride_x_batch=XBC, stride_x_T=XBC,
         stride_x_head=P, stride_x_dim=1, stride_dt_batch=DT, stride_dt_T=DT,
         stride_dt_head=1, stride_dt_dim=0, stride_dt_bias_head=1, stride_dt_bias_dim=0,
         stride_A_head=1, stride_A_dim=0, stride_A_dstate=0, stride_B_batch=XBC,
         stride_B_T=XBC, stride_B_group=N, stride_B_dstate=1, stride_C_batch=XBC,
         stride_C_T=XBC, stride_C_group=N, stride_C_dstate=1, stride_D_head=1, stride_D_dim=0,
         stride_z_batch=0, stride_z_T=0, stride_z_head=0, stride_z_dim=0,
         stride_out_batch=H * P, stride_out_T=H * P, stride_out_head=P, stride_out_dim=1,
         stride_retrieve_parent_token_batch=0, stride_retrieve_parent_token_T=0),
    dict(DT_SOFTPLUS=True, TIE_HDIM=True, BLOCK_SIZE_M=4, HAS_DT_BIAS=True, HAS_D=True,
         HAS_Z=False, HAS_STATE_BATCH_INDICES=True, DISABLE_STATE_UPDATE=False,
         CACHE_INTERMEDIATE_STATES=False, HAS_EAGLE_TREE_CUSTOM_ATTN_MASK=False,
         HAS_INTERMEDIATE_STATE_INDICES=False, BLOCK_SIZE_DSTATE=128, USE_RS_ROUNDING=False,
         PHILOX_ROUNDS=0, USE_GDC=False),
    4,  # as SGLang's launcher for dstate = 128
)
cfg = ours.launch_config(P, N, R)
n_tiles = -(-P // cfg.block_p)

# The default launch unsplit (batch >= 6 at this shape on an H200) and at the batch-1 split (one
# tile per program), both as ours.p_split_rule picks them on 132 SMs; then every other sweep
# variant (benchmarks/sweep_mamba2.py VARIANTS) at both.
builds = {}
for s in (ours.p_split_rule(n_tiles, H, 64, 132), ours.p_split_rule(n_tiles, H, 1, 132)):
    builds[f"ours_split{s}"] = offline_build(cfg, p_split=s)["ptx"]
    for name in VARIANTS:
        if name != "base":
            builds[f"var_{name}_split{s}"] = offline_build(variant_config(name, P, N, R),
                                                           p_split=s)["ptx"]
json.dump(dict(sglang=sg, **builds), sys.stdout)
"""


def _ptx_defs(ptx: str, file_suffix: str):
    """Instructions ``(source line, opcode, dst, srcs)`` of one source file, and reg -> defs."""
    import re

    fno = next(m.group(1) for m in re.finditer(r'\.file\s+(\d+)\s+"([^"]+)"', ptx)
               if m.group(2).endswith(file_suffix))
    cur, ins, defs = None, [], {}
    for raw in ptx.splitlines():
        line = raw.strip()
        m = re.match(r"\.loc\s+(\d+)\s+(\d+)\s+\d+", line)
        if m:
            cur = int(m.group(2)) if m.group(1) == fno else None
            continue
        m = re.match(r"(?:@!?%p\d+\s+)?([a-z][\w.]*)\s+(%\w+),\s*(.*);$", line)
        if m:
            op, dst, srcs = m.group(1), m.group(2), [s.strip() for s in m.group(3).split(",")]
            ins.append((cur, op, dst, srcs))
            defs.setdefault(dst, []).append((op, cur, srcs))
    return ins, defs


def _update_signatures(ptx: str, file_suffix: str, lines: set[int]) -> set[tuple]:
    """How each fp32 add/fma of the state-update source lines is built, registers erased.

    For ``fma(a, b, c)``: whether ``a`` is a product (e.g. ``dB`` of a contracted ``dB·x``) or the
    state itself, what defines ``b`` (and its input), and what defines ``c`` (and its inputs).
    SGLang's ``state * dA + dB * x`` gives fma(state, exp2(·), mul(cvt(x), mul(dt, B))).
    """
    ins, defs = _ptx_defs(ptx, file_suffix)

    def kinds(r: str) -> tuple[str, ...]:
        return tuple(sorted({d[0] for d in defs.get(r, [])}))

    sigs = set()
    for cur, op, _dst, srcs in ins:
        if cur not in lines or not op.startswith(("fma", "add.f32", "add.rn.f32")):
            continue
        if not op.startswith("fma"):
            sigs.add((op,))  # an unfused add: never what SGLang's kernel compiles to
            continue
        a, b, c = srcs
        a_is_product = any(d[0].startswith("mul") for d in defs.get(a, []))
        b_in = tuple(sorted({kinds(s) for d in defs.get(b, []) for s in d[2] if s.startswith("%")}))
        c_desc = tuple(sorted({(d[0], tuple(sorted(kinds(s)[0] if kinds(s) else "?" for s in d[2])))
                               for d in defs.get(c, [])}))
        sigs.add((op, "a=product" if a_is_product else "a=state", kinds(b), b_in, c_desc))
    return sigs


_REPO_ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


@__import__("functools").lru_cache(maxsize=1)
def _codegen_ptx() -> dict:
    """PTX (sm_90a, offline) of SGLang's kernel and of our launches (``_CODEGEN_SCRIPT``)."""
    import json
    import os
    import subprocess
    import sys

    env = {key: v for key, v in os.environ.items() if key != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _CODEGEN_SCRIPT, str(_REPO_ROOT)], env=env,
                          capture_output=True, text=True, timeout=900)
    err = proc.stderr.lower()
    if proc.returncode != 0 and "nvidia" in err and "backend" in err:
        pytest.skip(f"no NVIDIA Triton backend: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.xdist_group("mamba2-decode-codegen")  # one offline build (lru_cache) for both
def test_fold_codegen_matches_sglang():
    """Compile SGLang's selective_state_update kernel and ours for sm_90a (no GPU needed) at the
    Nano-4B shape and compare how every fp32 op of the state update is built.

    The checkpoint is bitwise equal on the GPU only if each fold step compiles exactly as SGLang's
    ``state = state * dA + dB * x[:, None]``: one fma(state, exp(A·Δ), (Δ·B)·x), with the same
    exp lowering. All our sites (replayed records in full chunks and in the remainder, records
    read by PTX loads; the current token) must match it, in the unsplit launch and in the batch-1
    P-split launch (five programs per (row, head)), for the default launch and every other
    sweep variant.
    """
    import inspect

    import replayssm_kernels.mamba2_decode.kernel as k
    from sglang.kernels.ops.mamba.triton_ops import mamba_ssm

    ptx = _codegen_ptx()

    def lines_with(module, pred) -> list[int]:
        with open(inspect.getsourcefile(module)) as f:
            return [i + 1 for i, line in enumerate(f) if pred(line.strip())]

    sg_lines = set(lines_with(mamba_ssm, lambda t: t == "state = state * dA + dB * x[:, None]"))
    our_lines = lines_with(k, lambda t: "tl.fma(b_s, dA, dB" in t)
    # full chunks, remainder, the current token
    assert len(sg_lines) == 1 and len(our_lines) == 3

    sg = _update_signatures(ptx["sglang"], "mamba_ssm.py", sg_lines)
    expected = {("fma.rn.f32", "a=state", ("ex2.approx.f32",), (("mul.f32",),),
                 (("mul.f32", ("cvt.f32.bf16", "mul.f32")),))}
    assert sg == expected, f"SGLang 0.5.17's update compiles differently now: {sg}"
    assert {"sglang", "ours_split1", "ours_split5"} <= set(ptx), list(ptx)
    from benchmarks.sweep_mamba2 import VARIANTS, variant_config

    for launch in sorted(set(ptx) - {"sglang"}):
        name = "base" if launch.startswith("ours_") else launch.split("_")[1]
        unroll = variant_config(name, 80, 128, 16).fold_unroll
        for line in our_lines:
            mine = _update_signatures(ptx[launch], "kernel.py", {line})
            if line == our_lines[1] and unroll == 1:
                continue  # the remainder loop is empty and compiled away at FOLD_UNROLL = 1
            assert mine == sg, f"{launch}: kernel.py:{line} compiles to {mine}, SGLang to {sg}"
    assert set(VARIANTS) - {"base"} == {launch.split("_")[1] for launch in ptx
                                        if launch.startswith("var_")}


@pytest.mark.xdist_group("mamba2-decode-codegen")  # one offline build (lru_cache) for both
def test_default_launch_ptx_features():
    """The default launch's compiled record loads (``ld_rec``, inline PTX), L1 prefetch hints
    and bulk L2 prefetches are in its PTX, unsplit and split (they are compiled code only: the
    interpreter tests never run them)."""
    ptx = _codegen_ptx()
    rec_ld = "@p ld.global.b16"  # ld_rec's predicated load (Triton's own loads use %p regs)
    for launch in ("ours_split1", "ours_split5"):
        assert rec_ld in ptx[launch]
        assert "prefetch.global.L1" in ptx[launch]
        assert "cp.async.bulk.prefetch.L2" in ptx[launch]


# Offline ptxas (this venv's, sm_90a) of every sweep variant at the Nano-4B shape, unsplit:
# (registers, spill-store bytes, CTAs per SM). Recorded; a change means the compiler or the
# kernel changed the register budget the launch was chosen with (benchmarks/notes/
# mamba2_decode.md, "Round 3 result").
VARIANT_PTXAS = {
    None: {
        "base": (96, 0, 10),  # 2 warps: CTAs of 64 threads
        "RF72": (72, 0, 7),  # 4 warps
        "RC112": (112, 0, 9),
        "RC128": (105, 0, 9),
        "RC4w80": (79, 0, 6),
        "RC4w96": (90, 0, 5),
    },
    # with a read copy beside the fp32 checkpoint (--read-dtype)
    "bf16": {"base": (96, 20, 10), "RF72": (72, 8, 7), "RC112": (112, 0, 9),
             "RC128": (121, 0, 8), "RC4w80": (80, 0, 6), "RC4w96": (91, 0, 5)},
    "fp8": {"base": (96, 92, 10), "RF72": (72, 80, 7), "RC112": (112, 28, 9),
            "RC128": (128, 0, 8), "RC4w80": (80, 40, 6), "RC4w96": (96, 0, 5)},
}


@pytest.mark.parametrize("read", [None, "bf16", "fp8"], ids=["no-copy", "bf16-copy", "fp8-copy"])
def test_variant_registers_offline(tmp_path, read):
    """``python -m benchmarks.sweep_mamba2 --offline [--read-dtype]``: every variant compiles for
    sm_90a and ptxas reports the registers / spills / CTAs per SM recorded in VARIANT_PTXAS."""
    import json
    import os
    import subprocess
    import sys

    out = tmp_path / "offline.json"
    env = {key: v for key, v in os.environ.items() if key != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.sweep_mamba2", "--offline",
                           "--out", str(out)] + (["--read-dtype", read] if read else []),
                          env=env, cwd=_REPO_ROOT, capture_output=True, text=True, timeout=900)
    err = proc.stderr.lower()
    if proc.returncode != 0 and "nvidia" in err and "backend" in err:
        pytest.skip(f"no NVIDIA Triton backend: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = {r["variant"]: (r["regs"], r["spill_st"], r["ctas"])
           for r in json.loads(out.read_text())}
    assert got == VARIANT_PTXAS[read]


# --------------------------------------------------------------------------------------------
# GPU (H200): the same drivers at the real shape
# --------------------------------------------------------------------------------------------


def _shadow_variant(monkeypatch, name: str, p_split: int | None = None) -> list:
    """Route every launch of the public wrapper through variant ``name``'s LaunchConfig
    (benchmarks/sweep_mamba2.py VARIANTS), after running the default configuration on clones of
    every in-place argument; assert both leave the same checkpoint and ring bits, the same
    untouched (NaN) output rows, and outputs equal up to rounding (another warp count sums the
    reductions in another order). Returns the launches' configs.
    """
    import replayssm_kernels.mamba2_decode.kernel as k
    from benchmarks.sweep_mamba2 import variant_config

    orig = k.mamba2_replay_decode_fwd
    calls: list = []

    def fwd(*args, **kw):
        kw.pop("p_split", None)  # the wrapper's choice (None: the rule; 1: batch_invariant), replaced here
        inplace = (0, 1, 2, 3, 9)  # state, ring_x, ring_dt, ring_B, out
        twin = [a.clone() if i in inplace else a for i, a in enumerate(args)]
        twin_kw = {n: (v.clone() if n in ("read_state", "read_scale") and v is not None else v)
                   for n, v in kw.items()}
        orig(*twin, **twin_kw, p_split=p_split)
        P, N, R = args[4].shape[2], args[0].shape[3], args[1].shape[2]
        cfg = variant_config(name, P, N, R)
        orig(*args, **kw, p_split=p_split, config=cfg)
        for i, what in zip((0, 1, 2, 3), ("state", "ring_x", "ring_dt", "ring_B")):
            assert _bits_equal(args[i], twin[i]), f"{name}: {what} differs from the default launch"
        for n in ("read_state", "read_scale"):
            if kw.get(n) is not None:
                assert _bits_equal(kw[n], twin_kw[n]), f"{name}: {n} differs from the default"
        out, ref = args[9], twin[9]
        assert torch.equal(torch.isnan(out), torch.isnan(ref)), f"{name}: rows written differ"
        live = ~torch.isnan(ref)
        o, r = out[live].double(), ref[live].double()
        # bf16 outputs: one rounding flip at most (2^-8 relative); fp32: fp32 rounding.
        ulp = 2.0**-7 if out.dtype == torch.bfloat16 else 2e-6
        bound = ulp * r.abs() + 1e-6 * r.abs().max()
        assert bool(((o - r).abs() <= bound).all()), (
            f"{name}: out differs from the default launch by up to "
            f"{float(((o - r).abs() / r.abs().clamp_min(1e-30)).max()):.2e} relative")
        calls.append(cfg)

    monkeypatch.setattr(k, "mamba2_replay_decode_fwd", fwd)
    return calls



@pytest.mark.gpu
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["S-fp32", "S-bf16"])
@pytest.mark.parametrize("L", [1, 4, 16], ids=lambda L: f"L{L}")
def test_gpu_nano4b_cycles(state_dtype, L):
    rep = run_cycles("kernel", NANO_4B, L, state_dtype, torch.bfloat16, active=24, pads=8,
                     seed=100 + L, variant=Variant(True, False))
    _check(rep, state_dtype, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("L", [1, 16], ids=lambda L: f"L{L}")
def test_gpu_nano4b_checkpoint_bitwise_vs_sglang(L):
    rep = run_cycles("kernel", NANO_4B, L, torch.float32, torch.bfloat16, active=24, pads=8,
                     seed=200 + L, sglang_check=True)
    _check(rep, torch.float32, torch.bfloat16)


@pytest.mark.gpu
def test_gpu_nano4b_strided_and_gate():
    rep = run_cycles("kernel", NANO_4B, 16, torch.float32, torch.bfloat16, layout="padded",
                     variant=Variant(False, True), active=16, pads=4, seed=300)
    _check(rep, torch.float32, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("active,pads", [(1, 0), (3, 1)], ids=["batch1", "batch4"])
def test_gpu_nano4b_small_batch_split(active, pads):
    """Batch 1 and 4 take the P-split by the default rule on this GPU (5 and 2 programs per
    (row, head) on 132 SMs): checkpoint bit-identical to ``selective_state_update`` after every
    flush, outputs and checkpoint vs float64, untouched bytes bit-identical."""
    from replayssm_kernels.mamba2_decode.kernel import _sm_count, p_split_rule

    sms = _sm_count(torch.cuda.current_device())
    assert p_split_rule(5, NANO_4B.H, active + pads, sms) > 1, f"no split on {sms} SMs"
    rep = run_cycles("kernel", NANO_4B, 16, torch.float32, torch.bfloat16, active=active,
                     pads=pads, seed=500 + active, sglang_check=True)
    _check(rep, torch.float32, torch.bfloat16)

@pytest.mark.gpu
def test_gpu_nano4b_fp32_activations():
    """fp32 activations at the real shape: kernel and reference within fp32 rounding of f64."""
    rep_k = run_cycles("kernel", NANO_4B, 16, torch.float32, torch.float32, active=8, pads=2,
                       seed=400, cycles=2)
    rep_r = run_cycles("ref", NANO_4B, 16, torch.float32, torch.float32, active=8, pads=2,
                       seed=400, cycles=2)
    _check(rep_k, torch.float32, torch.float32)
    _check(rep_r, torch.float32, torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("active,pads", [(24, 8), (1, 0)], ids=["batch32", "batch1"])
@pytest.mark.parametrize("variant", [n for n in __import__("benchmarks.sweep_mamba2",
                                                           fromlist=["VARIANTS"]).VARIANTS
                                     if n != "base"])
def test_gpu_nano4b_variants(monkeypatch, variant, active, pads):
    """Every other sweep variant (benchmarks/sweep_mamba2.py VARIANTS) at the real shape,
    compiled (warps, register caps): after every launch checkpoint and ring bits equal the
    default launch's,
    outputs within rounding of it; the fp32 checkpoint is bit-identical to
    ``selective_state_update`` after every flush. Batch 1 takes the P-split."""
    calls = _shadow_variant(monkeypatch, variant)
    rep = run_cycles("kernel", NANO_4B, 16, torch.float32, torch.bfloat16, active=active,
                     pads=pads, seed=800 + active, cycles=2, sglang_check=True)
    _check(rep, torch.float32, torch.bfloat16)
    assert len(calls) == rep.steps
