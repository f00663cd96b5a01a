"""Split precision, Gated DeltaNet decode: checkpoint + low-precision read copy.

The simulation of ``test_gdn_decode.py`` (random forced flushes, shuffled and padding rows,
NaN-poisoned rings and outputs, float64 shadow per request, untouched slots and the other layer of
a non-contiguous allocation bit-identical) with a read copy ``[slots, HV, V, K]`` (bf16 / fp16 /
fp8 e4m3 with per-(head, row) scales) beside the checkpoint. The copy and scales are part of the
untouched-bytes checks; in addition, after every step: flush rows' copy is bit-identical to
``quantize_rows`` of the stored checkpoint, non-flush rows' copy is unchanged. In lockstep with
the launch without a copy, checkpoints, raw records and flush outputs are bit-identical. Run with
``-s`` for the ``[split-gdn]`` error lines.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch
from test_gdn_decode import DEVICE, Case, Sim, assert_bits_equal, lockstep

from replayssm_kernels.gdn_decode import gdn_replay_decode, gdn_replay_decode_ref
from replayssm_kernels.mamba2_decode.read_copy import quantize_rows
from replayssm_kernels.read_copy_refresh import refresh_read_copy_ref

pytestmark = [
    pytest.mark.usefixtures("interpreter_fp16_fp8_rtne"),
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
]

F8, BF16, FP16, FP32 = torch.float8_e4m3fn, torch.bfloat16, torch.float16, torch.float32
OPS = {"kernel": gdn_replay_decode, "ref": gdn_replay_decode_ref}


class SplitSim(Sim):
    """``Sim`` with a read copy passed to every call and checked after it."""

    def __init__(self, case: Case, read_dtype: torch.dtype, seed: int, device=DEVICE):
        super().__init__(case, seed, device)
        c = case
        self.read_dtype = read_dtype

        def alloc(shape, dtype):
            full = (shape[0], 2, *shape[1:]) if c.noncontig else shape
            t = torch.full(full, math.nan, device=device).to(dtype)
            return t, (t[:, 1] if c.noncontig else t)

        self.read_full, self.read = alloc((self.slots, c.HV, c.V, c.K), read_dtype)
        self.scale_full = self.read_scale = None
        if read_dtype == F8:
            self.scale_full, self.read_scale = alloc((self.slots, c.HV, c.V), FP32)
        refresh_read_copy_ref(self.state, self.read, self.read_scale,
                              torch.arange(self.slots, device=device))

    def full_tensors(self):
        extra = [self.read_full] + ([self.scale_full] if self.scale_full is not None else [])
        return super().full_tensors() + extra

    def step(self, fn, inp):
        read0 = self.read.clone()
        fn = functools.partial(fn, read_state=self.read, read_scale=self.read_scale)
        out, flush = super().step(fn, inp)
        for i, s in enumerate(inp["slot_idx"].tolist()):
            if s < 0:
                continue
            if bool(flush[i]):
                q, sc = quantize_rows(self.state[s], self.read_dtype)
                assert_bits_equal(self.read[s], q, f"slot {s}: read copy != round(checkpoint)")
                if sc is not None:
                    assert_bits_equal(self.read_scale[s], sc, f"slot {s}: fp8 scales")
            else:
                assert_bits_equal(self.read[s], read0[s], f"non-flush row wrote copy {s}")
        return out, flush


def _run(op: str, case: Case, read_dtype: torch.dtype, seed: int) -> SplitSim:
    dev = DEVICE if op == "kernel" else torch.device("cpu")
    sim = SplitSim(case, read_dtype, seed, dev).run(OPS[op])
    print(f"\n[split-gdn] {op} {case.id} read={str(read_dtype)[6:]}: out vs f64 "
          f"{sim.max_out_err:.2e}, state vs f64 {sim.max_state_err:.2e}")
    return sim


# Output tolerance vs float64 (relative L2 per step, worst step): bf16 outputs are ~2e-3; the copy
# adds its rounding of S0 (bf16 2^-9, e4m3 2^-4 relative per element).
TOL_OUT = {BF16: 1e-2, FP16: 1e-2, F8: 6e-2}

CPU_CASES = [
    (Case(HV=4, Hk=2, K=32, V=32, L=1, R=1, steps=6), BF16),
    (Case(HV=4, Hk=2, K=32, V=32, L=4, R=6), BF16),
    (Case(HV=4, Hk=2, K=32, V=32, L=4, R=6, idx64=True), F8),
    (Case(HV=2, Hk=1, K=32, V=16, L=16, R=16, noncontig=True, u_dtype=FP32, requests=2), F8),
    (Case(HV=2, Hk=1, K=16, V=16, L=6, R=8, state_dtype=BF16, tol_state=2e-3), FP16),
]
REF_ONLY = [
    (Case(HV=4, Hk=2, K=32, V=16, L=16, R=16), BF16),
    (Case(HV=4, Hk=2, K=32, V=16, L=16, R=16, state_dtype=FP16, tol_state=2e-3), F8),
    (Case(HV=2, Hk=2, K=16, V=16, L=4, R=4, act_dtype=FP32, u_dtype=FP32), F8),
]


def _with_tol(case: Case, read_dtype) -> Case:
    return dataclasses.replace(case, tol_out=TOL_OUT[read_dtype])


def _id(cr) -> str:
    case, rd = cr
    return f"{case.id}-read-{str(rd)[6:]}"


@pytest.mark.parametrize("cr", CPU_CASES, ids=[_id(c) for c in CPU_CASES])
def test_kernel_split(cr):
    case, rd = cr
    _run("kernel", _with_tol(case, rd), rd, seed=2)


@pytest.mark.parametrize("cr", CPU_CASES + REF_ONLY, ids=[_id(c) for c in CPU_CASES + REF_ONLY])
def test_reference_split(cr):
    case, rd = cr
    _run("ref", _with_tol(case, rd), rd, seed=1)


def _lockstep_vs_no_copy(case: Case, read_dtype: torch.dtype, seed: int) -> int:
    """The launch with a read copy and the launch without one on twin pools: after every step the
    checkpoints, the raw records (k, v, g, β) and the flush rows' outputs are bit-identical (the
    fold reads the checkpoint, never the copy); returns the number of flushed rows."""
    case = _with_tol(case, read_dtype)
    with_copy, plain = SplitSim(case, read_dtype, seed), Sim(case, seed)
    flushed = 0
    for step in range(case.steps or 3 * case.L + 2):
        inp = with_copy.make_inputs()
        plain.make_inputs()  # keep the generators in step
        out_c, flush = with_copy.step(gdn_replay_decode, inp)
        out_p, _ = plain.step(gdn_replay_decode, inp)
        rows = [i for i, s in enumerate(inp["slot_idx"].tolist()) if s >= 0 and bool(flush[i])]
        flushed += len(rows)
        for i in rows:
            assert_bits_equal(out_c[i], out_p[i], f"step {step}: flush output of row {i}")
        names = ("state", "u", "k", "v", "g", "beta")
        for name, tc, tp in zip(names, with_copy.tensors(), plain.tensors()):
            if name != "u":  # u of non-flush rows is computed against the copy
                assert_bits_equal(tc, tp, f"step {step}: {name}")
    return flushed


@pytest.mark.parametrize("rd", [BF16, F8], ids=["bf16", "fp8"])
def test_flush_rows_equal_the_launch_without_copy(rd):
    case = Case(HV=2, Hk=1, K=32, V=48, L=4, R=6, force_p=0.25, steps=12)
    assert _lockstep_vs_no_copy(case, rd, seed=5) >= 3


@pytest.mark.gpu
@pytest.mark.parametrize("rd", [BF16, F8], ids=["bf16", "fp8"])
def test_gpu_qwen35_flush_rows_equal_the_launch_without_copy(rd):
    """Compiled: the copy's loads and stores must not change the fold's reduction trees."""
    case = Case(HV=32, Hk=16, K=128, V=128, L=16, R=16, requests=16, pad_rows=2, force_p=0.1,
                steps=34)  # fmt: skip
    assert _lockstep_vs_no_copy(case, rd, seed=6) >= 3


@pytest.mark.parametrize("rd", [BF16, F8], ids=["bf16", "fp8"])
def test_program_tiles_with_copy_bitwise_vs_one_tile(rd):
    """A program over two value tiles (V 48 in tiles of 16: a masked fourth tile) with a read
    copy: outputs, checkpoints, rings, the copy and its fp8 scales bit for bit the one-tile
    launch's after every step."""
    from replayssm_kernels.gdn_decode.kernel import gdn_replay_decode_fwd

    case = _with_tol(Case(HV=2, Hk=1, K=32, V=48, L=4, R=6, force_p=0.25, steps=10), rd)
    sims = SplitSim(case, rd, seed=7), SplitSim(case, rd, seed=7)
    ops = [functools.partial(gdn_replay_decode_fwd, block_v=16, **kw) for kw in ({}, {"tiles": 2})]
    assert lockstep(sims, ops, case.steps) >= 3


@pytest.mark.parametrize("op", ["kernel", "ref"])
def test_nonflush_rows_never_read_the_checkpoint(op):
    """NaN in every checkpoint: non-flush rows still give finite outputs equal to the same step
    run on a checkpoint that holds the copy's (dequantised) values."""
    case = Case(HV=2, Hk=1, K=16, V=16, L=4, R=4, act_dtype=FP32, u_dtype=FP32, pad_rows=0)
    sim = SplitSim(case, F8, seed=4)
    inp = sim.make_inputs()
    B = inp["slot_idx"].shape[0]
    zeros = torch.zeros(B, dtype=torch.int32, device=DEVICE)
    no = torch.zeros(B, dtype=torch.bool, device=DEVICE)
    rings = [t.clone() for t in sim.tensors()[1:]]
    want = torch.empty(B, case.HV, case.V, device=DEVICE)
    deq = sim.read.float() * sim.read_scale[..., None]
    args = (inp["q"], inp["k"], inp["v"], inp["a"], inp["b"], sim.A_log, sim.dt_bias)
    gdn_replay_decode_ref(deq, *rings, *args, want, inp["slot_idx"], zeros, zeros, no,
                          scale=sim.scale)
    sim.state.fill_(math.nan)
    out = torch.full_like(want, math.nan)
    OPS[op](*sim.tensors(), *args, out, inp["slot_idx"], zeros, zeros, no, scale=sim.scale,
            read_state=sim.read, read_scale=sim.read_scale)
    assert torch.isfinite(out).all()
    rel = float((out - want).norm() / want.norm())
    assert rel < 1e-6, rel


@pytest.mark.parametrize("op", ["kernel", "ref"])
def test_value_errors(op):
    case = Case(HV=2, Hk=1, K=16, V=16, L=4, R=4)
    sim = SplitSim(case, BF16, seed=0)
    inp = sim.make_inputs()
    B = inp["slot_idx"].shape[0]
    zeros = torch.zeros(B, dtype=torch.int32, device=DEVICE)
    no = torch.zeros(B, dtype=torch.bool, device=DEVICE)
    out = torch.empty(B, case.HV, case.V, dtype=BF16, device=DEVICE)
    call = functools.partial(
        OPS[op], *sim.tensors(), inp["q"], inp["k"], inp["v"], inp["a"], inp["b"], sim.A_log,
        sim.dt_bias, out, inp["slot_idx"], zeros, zeros, no, scale=sim.scale)
    with pytest.raises(ValueError, match="read_state"):
        call(read_state=sim.read[:, :1])
    with pytest.raises(ValueError, match="read_scale"):
        call(read_state=sim.read.to(F8))
    with pytest.raises(ValueError, match="read_scale"):
        call(read_state=sim.read, read_scale=torch.ones(sim.read.shape[:-1], device=DEVICE))


GPU_CASES = [
    (Case(HV=32, Hk=16, K=128, V=128, L=L, R=L, requests=24, pad_rows=3, noncontig=nc), rd)
    for L, nc, rd in ((1, False, BF16), (16, False, BF16), (16, True, F8), (4, False, FP16))
]


@pytest.mark.gpu
@pytest.mark.parametrize("cr", GPU_CASES, ids=[_id(c) for c in GPU_CASES])
def test_gpu_qwen35_split(cr):
    case, rd = cr
    _run("kernel", _with_tol(case, rd), rd, seed=3)
