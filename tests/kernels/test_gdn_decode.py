"""Gated DeltaNet ReplaySSM decode: kernel and reference vs the float64 conventional recurrence.

On CPU the Triton kernel runs under the interpreter (small shapes; see conftest.py); the same
tests run at the Qwen3.5-4B shape on a GPU under the ``gpu`` marker.

Every step of a simulation drives a pool of slots through ``decode_cursor_step`` (random forced
flushes, shuffled rows, padding rows), calls the op with NaN-poisoned outputs and NaN-poisoned
rings, and checks:

* outputs against the float64 conventional recurrence of each request (``‖out−ref‖/‖ref‖``);
* after a flush, the checkpoint against the float64 state (a 16-bit checkpoint is compared with the
  float64 state rounded at the same flush points: rounded once per flush, by design);
* non-flush rows leave the checkpoint bit-identical; slots not in the batch (and slot 0, the null
  slot) are bit-identical in the checkpoint and in every ring tensor; padding rows leave their
  output row untouched (still NaN); every other output element is written.

Bitwise: the fp32 checkpoint and the flush outputs against SGLang's packed decode run token by token
(on the CPU with the interpreter's ``tl.sum`` in the GPU's row-sum order, conftest.py), and the
compiled fold's reductions, FMAs and registers (sm_90a, offline).

Measured bounds are printed (``pytest -s``) and recorded in kernels/README.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch

from replayssm_kernels.conventional.gdn import gdn_conventional_f64
from replayssm_kernels.cursors import decode_cursor_step
from replayssm_kernels.gdn_decode import gdn_replay_decode, gdn_replay_decode_ref
from replayssm_kernels.row_order import flush_first_order

HAS_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")

pytestmark = [
    pytest.mark.usefixtures("interpreter_bf16_rtne"),
    # The interpreter converts 0-d loop bounds with int(array): numpy's deprecation, not ours.
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
]

OPS = {"kernel": gdn_replay_decode, "ref": gdn_replay_decode_ref}

_INT_OF = {4: torch.int32, 2: torch.int16, 1: torch.int8, 8: torch.int64}


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor, msg: str = "") -> None:
    """Bitwise equality (distinguishes -0.0 from +0.0 and compares NaN payloads)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype.is_floating_point:
        it = _INT_OF[got.element_size()]
        got, want = got.view(it), want.view(it)
    n_diff = int((got != want).sum())
    assert n_diff == 0, f"{msg}: {n_diff} elements differ bitwise"


@dataclasses.dataclass(frozen=True)
class Case:
    HV: int
    Hk: int
    K: int
    V: int
    L: int
    R: int
    state_dtype: torch.dtype = torch.float32
    act_dtype: torch.dtype = torch.bfloat16
    u_dtype: torch.dtype | None = None  # None: activation dtype
    requests: int = 3  # live requests (slots 1..requests; slot 0 is the null slot)
    spare_slots: int = 2  # allocated, never used: must stay bit-identical
    pad_rows: int = 1
    noncontig: bool = False
    idx64: bool = False  # int64 slot_idx (int32 otherwise)
    steps: int | None = None  # default: 3 full ring cycles + 2
    force_p: float = 0.15
    tol_out: float = 1e-2
    tol_state: float = 1e-5

    @property
    def id(self) -> str:
        sd = str(self.state_dtype).split(".")[-1]
        ad = str(self.act_dtype).split(".")[-1]
        nc = "-nc" if self.noncontig else ""
        return f"HV{self.HV}-Hk{self.Hk}-K{self.K}-V{self.V}-L{self.L}-R{self.R}-{sd}-{ad}{nc}"


class Sim:
    """A pool of slots driven through decode steps, with a float64 shadow of every request."""

    def __init__(self, case: Case, seed: int, device: torch.device = DEVICE):
        self.c = c = case
        self.dev = device
        self.g = torch.Generator().manual_seed(seed)
        self.slots = 1 + c.requests + c.spare_slots
        act, u_dt = c.act_dtype, c.u_dtype or c.act_dtype

        def pool(shape, dtype, fill=None):
            # Non-contiguous: a layer view of a [slots, 2 layers, ...] allocation; the other layer
            # must stay untouched.
            full = (shape[0], 2, *shape[1:]) if c.noncontig else shape
            t = torch.full(full, math.nan if fill is None else fill, dtype=dtype)
            t = t.to(device)
            return t[:, 1] if c.noncontig else t

        self.state = pool((self.slots, c.HV, c.V, c.K), c.state_dtype)
        init = 0.5 * torch.randn(self.slots, c.HV, c.V, c.K, generator=self.g)
        self.state.copy_(init.to(c.state_dtype))
        # Rings start NaN-poisoned: reading a row outside [0, len) poisons the result.
        self.ring_u = pool((self.slots, c.HV, c.R, c.V), u_dt)
        self.ring_k = pool((self.slots, c.Hk, c.R, c.K), act)
        self.ring_v = pool((self.slots, c.HV, c.R, c.V), act)
        self.ring_g = pool((self.slots, c.HV, c.R), torch.float32)
        self.ring_beta = pool((self.slots, c.HV, c.R), torch.float32)
        self.cursors = torch.zeros(self.slots, 2, dtype=torch.int32, device=device)
        self.A_log = torch.log(0.5 + 3.5 * torch.rand(c.HV, generator=self.g)).to(device)
        self.dt_bias = (torch.randn(c.HV, generator=self.g) - 1.5).to(device)
        self.scale = c.K**-0.5
        # float64 shadow per request (slot r+1), on the test's device (the float64 recurrence at
        # the Qwen3.5-4B shape is far too slow on a host CPU for the gpu cases)
        self.shadow = [self.state[1 + r].to(torch.float64) for r in range(c.requests)]
        self.max_out_err = 0.0
        self.max_state_err = 0.0
        self.flushes = [0] * c.requests

    def tensors(self):
        return [self.state, self.ring_u, self.ring_k, self.ring_v, self.ring_g, self.ring_beta]

    def full_tensors(self):
        return [t._base if t._base is not None else t for t in self.tensors()]

    def make_inputs(self):
        """One step: shuffled live rows plus padding rows; q/k/v and a/b are strided views."""
        c, g = self.c, self.g
        reqs = torch.randperm(c.requests, generator=g).tolist()
        rows = [1 + r for r in reqs] + [-1] * c.pad_rows
        perm = torch.randperm(len(rows), generator=g).tolist()
        rows = [rows[i] for i in perm]
        B = len(rows)
        D = 2 * c.Hk * c.K + c.HV * c.V
        mixed = torch.randn(B, D, generator=self.g).to(c.act_dtype).to(self.dev)
        q = mixed[:, : c.Hk * c.K].view(B, c.Hk, c.K)
        k = mixed[:, c.Hk * c.K : 2 * c.Hk * c.K].view(B, c.Hk, c.K)
        v = mixed[:, 2 * c.Hk * c.K :].view(B, c.HV, c.V)
        ab = torch.randn(B, 2 * c.HV, generator=self.g).to(c.act_dtype).to(self.dev)
        a, b = ab[:, : c.HV], ab[:, c.HV :]
        force = (torch.rand(B, generator=g) < c.force_p).to(self.dev)
        idx_dtype = torch.int64 if c.idx64 else torch.int32
        slot_idx = torch.tensor(rows, dtype=idx_dtype, device=self.dev)
        return dict(mixed=mixed, q=q, k=k, v=v, a=a, b=b, force=force, slot_idx=slot_idx)

    def step(self, fn, inp):
        c = self.c
        B = inp["slot_idx"].shape[0]
        start = torch.empty(B, dtype=torch.int32, device=self.dev)
        length = torch.empty(B, dtype=torch.int32, device=self.dev)
        flush = torch.empty(B, dtype=torch.bool, device=self.dev)
        decode_cursor_step(
            self.cursors, inp["slot_idx"], inp["force"], c.L, c.R, start, length, flush
        )
        out = torch.full((B, c.HV, c.V), math.nan, dtype=c.act_dtype, device=self.dev)
        before = [t.clone() for t in self.full_tensors()]
        fn(
            *self.tensors(), inp["q"], inp["k"], inp["v"], inp["a"], inp["b"], self.A_log,
            self.dt_bias, out, inp["slot_idx"], start, length, flush, scale=self.scale,
        )  # fmt: skip
        self.check(inp, out, flush, before)
        return out, flush

    def check(self, inp, out, flush, before):
        c = self.c
        rows = inp["slot_idx"].tolist()
        flush = flush.tolist()
        touched = {s for s in rows if s >= 0}
        # Untouched slots (null slot 0, spare slots) bit-identical everywhere, including the other
        # layer of a non-contiguous allocation.
        for new, old in zip(self.full_tensors(), before):
            for s in range(self.slots):
                if s not in touched:
                    assert_bits_equal(new[s], old[s], f"untouched slot {s}")
            if c.noncontig:
                assert_bits_equal(new[:, 0], old[:, 0], "other layer of the allocation")
        st_new, st_old = self.full_tensors()[0], before[0]
        if c.noncontig:
            st_new, st_old = st_new[:, 1], st_old[:, 1]
        num = den = 0.0
        for i, s in enumerate(rows):
            if s < 0:
                assert torch.isnan(out[i]).all(), "padding row output must stay untouched"
                continue
            assert not torch.isnan(out[i]).any(), f"row {i}: output not fully written"
            r = s - 1
            y64, S64 = gdn_conventional_f64(
                self.shadow[r], inp["q"][i : i + 1], inp["k"][i : i + 1], inp["v"][i : i + 1],
                inp["a"][i : i + 1], inp["b"][i : i + 1], self.A_log, self.dt_bias,
                scale=self.scale,
            )  # fmt: skip
            self.shadow[r] = S64
            diff = out[i].double() - y64[0]
            num += float((diff * diff).sum())
            den += float((y64[0] * y64[0]).sum())
            if flush[i]:
                self.flushes[r] += 1
                if c.state_dtype != torch.float32:
                    # The checkpoint is rounded once per flush, by design: compare like with like.
                    self.shadow[r] = S64.to(c.state_dtype).to(torch.float64)
                got = st_new[s].double()
                err = float((got - self.shadow[r]).norm() / self.shadow[r].norm())
                self.max_state_err = max(self.max_state_err, err)
                assert err < c.tol_state, f"slot {s}: checkpoint rel err {err:.3e}"
            else:
                assert_bits_equal(st_new[s], st_old[s], f"non-flush row wrote slot {s}")
        if den > 0:
            err = math.sqrt(num / den)
            self.max_out_err = max(self.max_out_err, err)
            assert err < c.tol_out, f"output rel err {err:.3e}"

    def run(self, fn):
        steps = self.c.steps or 3 * self.c.L + 2
        for _ in range(steps):
            self.step(fn, self.make_inputs())
        assert min(self.flushes) >= 1
        return self


# ---------------------------------------------------------------------------------------------
# Cases.  CPU (interpreter) cases are small; the gpu cases use the Qwen3.5-4B head shape.

BF16, FP32 = torch.bfloat16, torch.float32
CPU_CASES = [
    Case(HV=4, Hk=2, K=32, V=32, L=1, R=1, steps=6),
    Case(HV=6, Hk=3, K=80, V=40, L=4, R=6, state_dtype=BF16, tol_state=2e-3, idx64=True),
    Case(HV=4, Hk=2, K=32, V=16, L=16, R=16, noncontig=True, u_dtype=FP32),
    Case(
        HV=2, Hk=1, K=16, V=16, L=16, R=16, act_dtype=FP32, requests=2, pad_rows=1,
        tol_out=1e-5, tol_state=1e-5,
    ),  # fmt: skip
]
REF_CASES = CPU_CASES + [
    Case(HV=6, Hk=3, K=80, V=48, L=16, R=20, state_dtype=torch.float16, tol_state=2e-3),
    Case(HV=4, Hk=4, K=16, V=16, L=4, R=4, act_dtype=FP32, u_dtype=FP32, tol_out=1e-5),
]
GPU_CASES = [
    Case(HV=32, Hk=16, K=128, V=128, L=L, R=L, requests=24, pad_rows=3, noncontig=nc)
    for L, nc in ((1, False), (4, True), (16, False))
] + [
    Case(HV=32, Hk=16, K=128, V=128, L=16, R=16, requests=8, state_dtype=BF16, tol_state=2e-3),
    Case(HV=6, Hk=3, K=80, V=48, L=16, R=20, act_dtype=FP32, tol_out=1e-5),
]


@pytest.mark.parametrize("case", REF_CASES, ids=lambda c: c.id)
def test_reference_vs_f64(case):
    sim = Sim(case, seed=1, device=torch.device("cpu")).run(gdn_replay_decode_ref)
    print(f"\n[ref {case.id}] out {sim.max_out_err:.2e} state {sim.max_state_err:.2e}")


@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: c.id)
def test_kernel_vs_f64_and_ref(case):
    """Kernel vs float64, and kernel vs reference on the same inputs in lockstep."""
    sim = Sim(case, seed=2)
    ref = Sim(case, seed=2)
    steps = case.steps or 3 * case.L + 2
    worst = 0.0
    for _ in range(steps):
        inp = sim.make_inputs()
        ref.make_inputs()  # keep the generators in step
        out_k, _ = sim.step(gdn_replay_decode, inp)
        out_r, _ = ref.step(gdn_replay_decode_ref, inp)
        live = inp["slot_idx"] >= 0
        d = (out_k[live].double() - out_r[live].double()).norm() / out_r[live].double().norm()
        worst = max(worst, float(d))
        for tk, tr in zip(sim.tensors()[1:], ref.tensors()[1:]):
            torch.testing.assert_close(tk, tr, equal_nan=True, atol=1e-2, rtol=1e-2)
        # fp32 state: reduction order only; a 16-bit state may flip a rounding (one ulp).
        tol = 1e-4 if case.state_dtype == FP32 else 1e-2
        torch.testing.assert_close(sim.state, ref.state, atol=tol, rtol=tol)
    assert worst < case.tol_out
    print(
        f"\n[kernel {case.id}] out vs f64 {sim.max_out_err:.2e}, state vs f64 "
        f"{sim.max_state_err:.2e}, out vs ref {worst:.2e}"
    )


def test_kernel_multi_chunk_records():
    """Non-flush rows with more records than one chunk (R = 36, chunks of 16: up to 3)."""
    case = Case(HV=2, Hk=1, K=16, V=16, L=36, R=36, act_dtype=FP32, requests=2, force_p=0.02,
                steps=40, tol_out=1e-5)  # fmt: skip
    sim = Sim(case, seed=6).run(gdn_replay_decode)
    print(f"\n[kernel 3 chunks {case.id}] out {sim.max_out_err:.2e} state {sim.max_state_err:.2e}")


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.id)
def test_kernel_vs_f64_gpu(case):
    sim = Sim(case, seed=3).run(gdn_replay_decode)
    print(f"\n[gpu {case.id}] out {sim.max_out_err:.2e} state {sim.max_state_err:.2e}")


# ---------------------------------------------------------------------------------------------
# Bitwise: the fp32 checkpoint equals SGLang's packed decode run token by token.


def _bitwise_vs_sglang(case: Case, steps: int, seed: int, op=gdn_replay_decode) -> int:
    from sglang.kernels.ops.attention.fla.fused_recurrent import (
        fused_recurrent_gated_delta_rule_packed_decode,
    )

    sim = Sim(case, seed=seed)
    sg_state = sim.state.clone()  # SGLang's pool: the conventional kernel every step
    checked = 0
    for _ in range(steps):
        inp = sim.make_inputs()
        B = inp["slot_idx"].shape[0]
        sg_out = torch.empty(B, 1, case.HV, case.V, dtype=case.act_dtype, device=DEVICE)
        fused_recurrent_gated_delta_rule_packed_decode(
            inp["mixed"], inp["a"], inp["b"], sim.A_log, sim.dt_bias, sim.scale, sg_state,
            sg_out, inp["slot_idx"], use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        out, flush = sim.step(op, inp)
        for i, s in enumerate(inp["slot_idx"].tolist()):
            if s >= 0 and flush[i]:
                assert_bits_equal(sim.state[s], sg_state[s], f"checkpoint of slot {s}")
                assert_bits_equal(out[i], sg_out[i, 0], f"flush output of row {i}")
                checked += 1
    assert checked >= 3
    return checked


BITWISE_CPU_CASES = [
    Case(HV=4, Hk=2, K=32, V=32, L=1, R=1, requests=2, force_p=0.1, steps=6),
    Case(HV=4, Hk=2, K=32, V=32, L=16, R=16, requests=2, force_p=0.1, steps=34),
    # masked K and V tiles (K 80 -> 128 columns, V 48 -> two tiles), non-contiguous pool, fp32 u
    Case(HV=2, Hk=1, K=80, V=48, L=16, R=16, noncontig=True, u_dtype=FP32, force_p=0.2,
         steps=20),
    # fp32 activations, int64 slot_idx, two padding rows, R > L
    Case(HV=2, Hk=1, K=16, V=16, L=4, R=6, act_dtype=FP32, idx64=True, pad_rows=2, tol_out=1e-5,
         steps=12),
]  # fmt: skip


@pytest.mark.usefixtures("sglang_fla_interpret", "interpreter_gpu_sum_order")
@pytest.mark.parametrize("case", BITWISE_CPU_CASES, ids=lambda c: c.id)
def test_bitwise_vs_sglang_packed_decode_cpu(case):
    """Under the interpreter (numpy fp32, no FMA), with ``tl.sum`` in the GPU's row-sum order
    (conftest: per lane 4 columns in order, then the butterfly), SGLang's packed decode computes
    the reduction tree its tile has on the GPU; the tree-form fold spells that tree out, so the
    checkpoint and the flush outputs must be the same bits (random forced and full-ring flushes).
    """
    if HAS_CUDA:
        pytest.skip("CPU interpreter case; test_bitwise_vs_sglang_packed_decode_gpu covers the GPU")
    checked = _bitwise_vs_sglang(case, steps=case.steps, seed=4)
    print(f"\n[bitwise {case.id}] {checked} flushed rows == SGLang's packed decode")


@pytest.mark.gpu
@pytest.mark.parametrize("L,nc", [(1, False), (16, False), (16, True)],
                         ids=["L1", "L16", "L16-noncontig"])
def test_bitwise_vs_sglang_packed_decode_gpu(L, nc):
    """On the GPU: compiled code with FMA contraction and the compiler's reduction trees."""
    case = Case(HV=32, Hk=16, K=128, V=128, L=L, R=L, requests=16, pad_rows=2, force_p=0.1,
                noncontig=nc)  # fmt: skip
    _bitwise_vs_sglang(case, steps=3 * L + 2, seed=5)


#: Launch tiles other than the default (``BLOCK_V``, ``FOLD_ROWS``, ``NONFLUSH_ROWS``): fewer
#: value rows per program or rows on lanes, for fewer registers (offline sm_90a at the Qwen3.5-4B
#: shape: 255 at the default, 174 at 16 / 8 / 4, 168 at 8 / 8 / 4; timed slower on the H200,
#: ``benchmarks/RESULTS.md``, twenty-second session).  All four on the GPU; two on the CPU.
DECODE_TILES = [(16, 8, 4), (8, 8, 4), (16, 16, 2), (8, 4, 8)]
_TILE_IDS = [f"bv{b}-fold{f}-out{o}" for b, f, o in DECODE_TILES]
#: Value tiles per program (one program over several of a head's tiles, the non-flush rows'
#: per-key-head work once), at the default tile (the default launch from batch 64,
#: ``TILES_BY_BATCH``; this test's batch of 18 would get one).
PROGRAM_TILES = [(32, 16, 4, 2), (32, 16, 4, 4)]
_PROGRAM_TILE_IDS = [f"tiles{t[3]}" for t in PROGRAM_TILES]


def _set_tile(monkeypatch, launch_spy, tile):
    """Make ``tile`` (``BLOCK_V``, ``FOLD_ROWS``, ``NONFLUSH_ROWS`` and optionally the value tiles
    per program, ``program_tiles``' answer at every batch) the decode launch's default; returns
    the launches' ``(BV, RL_FOLD, RL_OUT[, TILES])`` as a spy records them."""
    from replayssm_kernels.gdn_decode import kernel as K_

    for name, val in zip(("BLOCK_V", "FOLD_ROWS", "NONFLUSH_ROWS"), tile):
        monkeypatch.setattr(K_, name, val)
    if len(tile) == 4:
        monkeypatch.setattr(K_, "program_tiles", lambda batch: tile[3])
    spy = launch_spy(K_, "gdn_replay_decode_fwd_kernel")
    keys = ("BV", "RL_FOLD", "RL_OUT", "TILES")[: len(tile)]
    return lambda: [tuple(m[k] for k in keys) for _, m in spy.launches]


@pytest.mark.usefixtures("sglang_fla_interpret", "interpreter_gpu_sum_order")
@pytest.mark.parametrize("tile", [DECODE_TILES[0], DECODE_TILES[2]], ids=[_TILE_IDS[0], _TILE_IDS[2]])
def test_tiles_bitwise_vs_sglang_cpu(monkeypatch, launch_spy, tile):
    """Other launch tiles (masked K and V: K 80, V 48 in tiles of 16 or 8 rows): flushed
    checkpoints and flush outputs bit for bit SGLang's packed decode, non-flush outputs and every
    checkpoint vs float64, untouched slots and padding rows (``Sim``)."""
    if HAS_CUDA:
        pytest.skip("CPU interpreter case; test_tiles_bitwise_vs_sglang_gpu covers the GPU")
    seen = _set_tile(monkeypatch, launch_spy, tile)
    case = Case(HV=2, Hk=1, K=80, V=48, L=16, R=16, u_dtype=FP32, pad_rows=1, force_p=0.2,
                steps=20)  # fmt: skip
    checked = _bitwise_vs_sglang(case, steps=case.steps, seed=8)
    assert seen() and set(seen()) == {tile}
    print(f"\n[bitwise tile {tile}] {checked} flushed rows == SGLang's packed decode")


@pytest.mark.gpu
@pytest.mark.parametrize("tile", DECODE_TILES + PROGRAM_TILES, ids=_TILE_IDS + _PROGRAM_TILE_IDS)
def test_tiles_bitwise_vs_sglang_gpu(monkeypatch, launch_spy, tile):
    """Other launch tiles in compiled code at the Qwen3.5-4B shape (L = 16): flush rows SGLang's
    bits, everything else vs float64."""
    seen = _set_tile(monkeypatch, launch_spy, tile)
    case = Case(HV=32, Hk=16, K=128, V=128, L=16, R=16, requests=16, pad_rows=2, force_p=0.1)
    _bitwise_vs_sglang(case, steps=3 * 16 + 2, seed=9)
    assert seen() and set(seen()) == {tile}


def _lockstep_tiles(case: Case, seed: int, base: dict, launch: dict,
                    flush_first: bool = False, nonflush_rtol: float | None = None) -> int:
    """Two pools from the same seed driven step by step through ``gdn_replay_decode_fwd``, one
    with the keywords ``base``, one with ``launch`` (and, with ``flush_first``, the rows launched
    in ``flush_first_order``): every output and pool element bit for bit after every step, or
    with ``nonflush_rtol`` as ``lockstep`` says (each pool also checked by ``Sim``).  Returns the
    flushed rows seen."""
    from replayssm_kernels.gdn_decode.kernel import gdn_replay_decode_fwd

    def ordered(*args, **kw):
        flush = args[17]
        order = torch.full(flush.shape, -1, dtype=torch.int32, device=flush.device)
        flush_first_order(flush, order)
        gdn_replay_decode_fwd(*args, **kw, **launch, row_order=order)

    sims = Sim(case, seed=seed), Sim(case, seed=seed)
    ops = [functools.partial(gdn_replay_decode_fwd, **base),
           ordered if flush_first else functools.partial(gdn_replay_decode_fwd, **launch)]
    return lockstep(sims, ops, case.steps, nonflush_rtol)


def lockstep(sims, ops, steps: int, nonflush_rtol: float | None = None) -> int:
    """Drive twin pools (``Sim``s from one seed) through ``steps`` steps, ``ops[i]`` on
    ``sims[i]``: every output and pool element bit for bit after every step.  Returns the flushed
    rows seen.

    ``nonflush_rtol`` (compiled launches whose non-flush sums may contract differently): the
    non-flush rows' outputs and the ring ``u`` (which only they write) within that relative
    difference in norm (``assert_close_rel``), and NaN exactly where the other has NaN (the never-written
    ring rows); the checkpoint, the other rings, the flush rows' and the padding rows' outputs
    stay bitwise.
    """
    flushed = 0
    for step in range(steps):
        inps = [s.make_inputs() for s in sims]
        (out0, flush), (out1, _) = [s.step(op, inp) for s, op, inp in zip(sims, ops, inps)]
        for i, (t0, t1) in enumerate(zip(sims[0].full_tensors(), sims[1].full_tensors())):
            if nonflush_rtol is not None and i == 1:
                assert_close_rel(t1, t0, nonflush_rtol, f"step {step}: ring u")
            else:
                assert_bits_equal(t1, t0, f"step {step}: pool tensor {i}")
        real = inps[0]["slot_idx"] >= 0
        for kind, rows in (("flush", flush), ("non-flush", ~flush & real), ("padding", ~real)):
            msg = f"step {step}: {kind} rows' outputs ({ulp_spread(out1[rows], out0[rows])})"
            if kind == "non-flush" and nonflush_rtol is not None:
                assert_close_rel(out1[rows], out0[rows], nonflush_rtol, msg)
            else:
                assert_bits_equal(out1[rows], out0[rows], msg)
        flushed += int(flush.sum())
    return flushed


def assert_close_rel(got: torch.Tensor, want: torch.Tensor, rtol: float, msg: str) -> None:
    """Each vector along the last dim: ``‖got − want‖ / ‖want‖ <= rtol`` in float64 over the
    elements that are not NaN, with NaN in ``got`` exactly where ``want`` has NaN.  ``rtol`` is
    raised to the stored dtype's ``eps``: in bf16 a rounding flip is up to ``2**-7`` of a value,
    and a flipped ``u`` record feeds every later non-flush output of its row (seen on the H100:
    2 bf16 ulp on one output element of a step), so an element-wise bound would test the
    rounding, not the launch; per vector, so one wrong row is not diluted by a large pool."""
    rtol = max(rtol, torch.finfo(want.dtype).eps)
    g, w = got.double(), want.double()
    nan = torch.isnan(w)
    assert torch.equal(torch.isnan(g), nan), f"{msg}: NaN at other elements"
    g, w = g.masked_fill(nan, 0.0), w.masked_fill(nan, 0.0)
    if w.numel() == 0:
        return
    dnorm = torch.linalg.vector_norm(g - w, dim=-1)
    rel = dnorm / torch.linalg.vector_norm(w, dim=-1).clamp_min(1e-30)
    worst = float(rel.max())
    assert worst <= rtol, f"{msg}: largest ‖Δ‖ / ‖want‖ of a vector = {worst:.2e} > {rtol:.1e}"


def ulp_spread(got: torch.Tensor, want: torch.Tensor) -> str:
    """Where two same-sign float tensors differ: how many elements, the largest distance in units
    in the last place and the largest relative difference."""
    if got.numel() == 0:
        return "no elements"
    it = _INT_OF[got.element_size()]
    ulps = (got.view(it).long() - want.view(it).long()).abs()
    rel = ((got.double() - want.double()).abs() / want.double().abs().clamp_min(1e-30)).max()
    return f"{int((ulps > 0).sum())} differ, max {int(ulps.max())} ulp, rel {rel:.2e}"


#: (case, keywords) of programs over several value tiles, CPU.
_TILES_CPU = [
    # V 48 in tiles of 16: programs over tiles (0, 1) and (2, a masked 3); one record chunk
    (Case(HV=2, Hk=1, K=80, V=48, L=16, R=16, u_dtype=FP32, pad_rows=1, force_p=0.2, steps=12),
     dict(block_v=16, tiles=2)),
    # every tile of a head in one program; R > 16 (records in chunks: coefficients per tile);
    # non-contiguous pool, bf16 u
    (Case(HV=2, Hk=1, K=16, V=64, L=16, R=20, noncontig=True, requests=2, steps=22),
     dict(block_v=16, tiles=4)),
]  # fmt: skip


@pytest.mark.parametrize("case,launch", _TILES_CPU, ids=["bv16-tiles2", "bv16-tiles4-chunks"])
def test_program_tiles_bitwise_vs_one_tile(case, launch):
    """A program over several of a head's value tiles gives the one-tile launch's bits
    everywhere (outputs of both row kinds, checkpoints, every ring tensor): each tile runs the
    same expressions; only the per-key-head part is done once per program."""
    base = dict(block_v=launch["block_v"])
    assert _lockstep_tiles(case, 12, base, launch) >= 3


def test_lockstep_tolerance_path_cpu():
    """The GPU tiles test's tolerance path on equal runs: never-written ring rows (NaN in both)
    and padding rows pass; a NaN moved or a 1% change fails."""
    case, launch = _TILES_CPU[0]
    assert _lockstep_tiles(case, 12, dict(block_v=16), launch, nonflush_rtol=1e-3) >= 3
    want = torch.tensor([1.0, -2.0, math.nan, 1e-6])
    assert_close_rel(want.clone(), want, 1e-3, "equal")
    assert_close_rel(want + torch.tensor([1e-4, 0.0, 0.0, 1e-6]), want, 1e-3, "small change")
    for got, match in ((torch.tensor([1.0, -2.0, 0.0, 1e-6]), "NaN at other"),
                       (torch.tensor([1.01, -2.0, math.nan, 1e-6]), "‖Δ‖")):
        with pytest.raises(AssertionError, match=match):
            assert_close_rel(got, want, 1e-3, "changed")
    # One bf16 vector 5% off in 64: within eps over the whole tensor (0.6%), not per vector.
    base = torch.randn(64, 16, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    bad = base.clone()
    bad[5] = (bad[5].float() * 1.05).to(torch.bfloat16)
    with pytest.raises(AssertionError, match="‖Δ‖"):
        assert_close_rel(bad, base, 1e-3, "one vector")


@pytest.mark.parametrize("tiles", [1, 2])
def test_flush_first_order_bitwise(tiles):
    """Rows launched flush rows first (``row_order``, with one and two tiles per program): every
    written bit equal to the launch in batch order, padding rows still untouched."""
    case = Case(HV=2, Hk=1, K=32, V=32, L=4, R=4, requests=5, pad_rows=2, force_p=0.2, steps=8)
    assert _lockstep_tiles(case, 14, dict(block_v=16), dict(block_v=16, tiles=tiles),
                           flush_first=True) >= 3


@pytest.mark.gpu
@pytest.mark.parametrize("tiles,flush_first", [(2, False), (4, False), (1, True), (4, True)],
                         ids=["tiles2", "tiles4", "flush-first", "tiles4-flush-first"])
def test_program_tiles_bitwise_vs_one_tile_gpu(tiles, flush_first):
    """Compiled, at the Qwen3.5-4B shape (4 tiles of 32 rows per head): a launch over several
    tiles per program gives the one-tile launch's checkpoint, k / v / g / β records and flush
    outputs bit for bit; its non-flush outputs and ``u`` records may round differently (the
    H200 showed 3–5 output elements of a step differing while the flush rows kept SGLang's bits,
    ``test_tiles_bitwise_vs_sglang_gpu``: read as the unrolled tiles' sums contracted
    differently; on the H100 a flipped bf16 ``u`` record moved a later output by 2 ulp), so
    they are held to their dtype's eps in norm (``assert_close_rel``). A one-tile launch in flush-first
    row order must give every bit."""
    case = Case(HV=32, Hk=16, K=128, V=128, L=16, R=16, requests=16, pad_rows=2, force_p=0.1,
                steps=34)  # fmt: skip
    rtol = None if tiles == 1 else 1e-3
    assert _lockstep_tiles(case, 13, dict(tiles=1), dict(tiles=tiles), flush_first, rtol) >= 3


def test_program_tiles_by_batch():
    """The default launch's tiles per program follow ``TILES_BY_BATCH`` (one below its smallest
    batch), and the serving backend orders rows from the batch where programs start to hold
    several tiles (a flush program folds its tiles in turn: it must start early)."""
    from replayssm_kernels.gdn_decode.kernel import (
        FLUSH_FIRST_MIN_BATCH,
        TILES_BY_BATCH,
        program_tiles,
    )

    assert [program_tiles(b) for b in (1, 63, 64, 255, 256, 512)] == [1, 1, 2, 2, 4, 4]
    assert list(TILES_BY_BATCH) == sorted(TILES_BY_BATCH, reverse=True)
    assert FLUSH_FIRST_MIN_BATCH == min(b for b, _ in TILES_BY_BATCH)


def test_launch_tile_value_errors():
    """Bad tiles name the keyword, what it expects and what it got."""
    from replayssm_kernels.gdn_decode.kernel import launch_tile

    assert launch_tile(48, 16, 8, 4) == (16, 8, 4, 1)
    assert launch_tile(8, None, None, None) == (8, 8, 4, 1)
    assert launch_tile(48, 16, 8, 4, 4) == (16, 8, 4, 4)  # 3 tiles: at most 4 per program
    assert launch_tile(128, None, None, None, 8) == (32, 16, 4, 4)
    for args, msg in (((128, 24, 8, 4), "block_v: expected a power of two, got 24"),
                      ((128, 16, 32, 4), "fold_rows: expected at most block_v = 16, got 32"),
                      ((128, 16, 8, 0), "nonflush_rows: expected a power of two, got 0"),
                      ((128, 16, 8, 4, 3), "tiles: expected a power of two, got 3")):
        with pytest.raises(ValueError, match=msg):
            launch_tile(*args)


# ---------------------------------------------------------------------------------------------
# Validation


def _args(HV=4, Hk=2, K=16, V=16, R=4, B=3, slots=4):
    f32, bf = torch.float32, torch.bfloat16
    with torch.device(DEVICE):
        return _args_here(HV, Hk, K, V, R, B, slots, f32, bf)


def _args_here(HV, Hk, K, V, R, B, slots, f32, bf):
    return dict(
        state=torch.zeros(slots, HV, V, K),
        ring_u=torch.zeros(slots, HV, R, V, dtype=bf),
        ring_k=torch.zeros(slots, Hk, R, K, dtype=bf),
        ring_v=torch.zeros(slots, HV, R, V, dtype=bf),
        ring_g=torch.zeros(slots, HV, R, dtype=f32),
        ring_beta=torch.zeros(slots, HV, R, dtype=f32),
        q=torch.zeros(B, Hk, K, dtype=bf),
        k=torch.zeros(B, Hk, K, dtype=bf),
        v=torch.zeros(B, HV, V, dtype=bf),
        a=torch.zeros(B, HV, dtype=bf),
        b=torch.zeros(B, HV, dtype=bf),
        A_log=torch.zeros(HV),
        dt_bias=torch.zeros(HV),
        out=torch.zeros(B, HV, V, dtype=bf),
        slot_idx=torch.zeros(B, dtype=torch.int32),
        ring_start=torch.zeros(B, dtype=torch.int32),
        ring_len=torch.zeros(B, dtype=torch.int32),
        flush=torch.zeros(B, dtype=torch.bool),
    )


BAD = {
    "state-rank": ("state", lambda a: a["state"][0], "state"),
    "state-dtype": ("state", lambda a: a["state"].double(), "state"),
    "K-too-large": ("state", None, "state"),
    "heads-not-divisible": ("q", lambda a: a["q"].new_zeros(3, 3, 16), "q"),
    "k-shape": ("k", lambda a: a["k"][:, :1], "k"),
    "v-shape": ("v", lambda a: a["v"][:, :, :8], "v"),
    "ring_k-dtype": ("ring_k", lambda a: a["ring_k"].float(), "ring_k"),
    "ring_u-dtype": ("ring_u", lambda a: a["ring_u"].half(), "ring_u"),
    "ring_v-R": ("ring_v", lambda a: a["ring_v"][:, :, :2], "ring_v"),
    "ring_g-dtype": ("ring_g", lambda a: a["ring_g"].bfloat16(), "ring_g"),
    "ring_beta-shape": ("ring_beta", lambda a: a["ring_beta"][:2], "ring_beta"),
    "a-shape": ("a", lambda a: a["a"][:2], "a"),
    "A_log-strided": ("A_log", lambda a: a["A_log"].new_zeros(8)[::2], "A_log"),
    "out-shape": ("out", lambda a: a["out"][:, :2], "out"),
    "slot_idx-float": ("slot_idx", lambda a: a["slot_idx"].float(), "slot_idx"),
    "ring_len-batch": ("ring_len", lambda a: a["ring_len"][:2], "ring_len"),
    "flush-int": ("flush", lambda a: a["flush"].int(), "flush"),
    "slot_idx-strided": ("slot_idx", lambda a: a["slot_idx"].repeat_interleave(2)[::2], "stride 1"),
    "ring_len-strided": ("ring_len", lambda a: a["ring_len"].repeat_interleave(2)[::2], "stride 1"),
    "flush-strided": ("flush", lambda a: a["flush"].repeat_interleave(2)[::2], "stride 1"),
    "out-overlapping": ("out", lambda a: a["out"][:1].expand_as(a["out"]), "stride-0"),
    "ring_g-overlapping": ("ring_g", lambda a: a["ring_g"][:1].expand_as(a["ring_g"]), "stride-0"),
}


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("bad", list(BAD))
def test_value_errors(op, bad):
    args = _args()
    if bad == "K-too-large":
        args = _args(K=512)
    else:
        name, make, _ = BAD[bad]
        args[name] = make(args)
    with pytest.raises(ValueError, match=BAD[bad][2]):
        OPS[op](**args, scale=0.25)


@pytest.mark.parametrize("op", list(OPS))
def test_value_error_scale(op):
    with pytest.raises(ValueError, match="scale"):
        OPS[op](**_args(), scale=float("nan"))


def test_all_padding_touches_nothing():
    args = _args()
    args["slot_idx"].fill_(-1)
    args["out"].fill_(math.nan)
    before = {k: v.clone() for k, v in args.items()}
    gdn_replay_decode(**args, scale=0.25)
    for k, v in args.items():
        assert_bits_equal(v, before[k], k)


# ---------------------------------------------------------------------------------------------
# Codegen (compiled for sm_90a on any machine, no GPU): what the tree-form fold's bits rest on.

_CODEGEN_SCRIPT = r'''
import inspect, json, os, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sglang.kernels.ops.attention.fla.fused_recurrent import (
    fused_recurrent_gated_delta_rule_packed_decode_kernel as sg_kernel,
)
from replayssm_kernels.gdn_decode import kernel as K_
from replayssm_kernels.gdn_decode.kernel import gdn_replay_decode_fwd_kernel as our_kernel

H, HV, K, V, R = 16, 32, 128, 128, 16
TARGET = GPUTarget("cuda", 90, 32)
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")

def build(kern, ptrs, ints, const, num_stages):
    names = list(inspect.signature(kern.fn).parameters)
    sig, cx, attrs = {}, {}, {}
    for i, n in enumerate(names):
        if n in ptrs:
            sig[n] = ptrs[n]
            if ptrs[n].startswith("*"):
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif n in const:
            sig[n], cx[n] = "constexpr", const[n]
        elif ints[n] == 1:  # Triton specialises int arguments equal to 1
            sig[n], cx[n] = "constexpr", 1
        else:
            sig[n] = "i32"
            if ints[n] % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=kern, signature=sig, constexprs=cx, attrs=attrs)
    opts = dict(num_warps=1, num_stages=num_stages)
    return triton.compile(src, target=TARGET, options=opts)

D = 2 * H * K + HV * V
sg_c = build(
    sg_kernel,
    dict(mixed_qkv="*bf16", a="*bf16", b="*bf16", A_log="*fp32", dt_bias="*fp32", o="*bf16",
         h0="*fp32", ht="*fp32", ssm_state_indices="*i32", scale="fp32"),
    {},
    dict(stride_mixed_qkv_tok=D, stride_a_tok=HV, stride_b_tok=HV,
         stride_init_state_token=HV * V * K, stride_final_state_token=HV * V * K,
         stride_indices_seq=1, H=H, HV=HV, K=K, V=V, BK=128, BV=32, SOFTPLUS_THRESHOLD=20.0,
         USE_QK_L2NORM_IN_KERNEL=True),
    3,  # as SGLang's launcher
)
sg = sg_c.asm["ttgir"]
VARIANT = sys.argv[1]  # "none", "bf16" / "fp8" (read copy), "sr" (fp16 checkpoint + SR)
# the launch tile (block_v, fold_rows, nonflush_rows[, tiles]): the launcher's defaults unless given
TILE = [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else K_.launch_tile(V)
TILE = [*TILE, 1] if len(TILE) == 3 else TILE
strides = dict(
    R=R, sr_layer=0, stride_s_n=HV * V * K, stride_s_h=V * K, stride_s_v=K, stride_s_k=1,
    stride_u_n=HV * R * V, stride_u_h=R * V, stride_u_r=V, stride_u_v=1,
    stride_rk_n=H * R * K, stride_rk_h=R * K, stride_rk_r=K, stride_rk_k=1,
    stride_rv_n=HV * R * V, stride_rv_h=R * V, stride_rv_r=V, stride_rv_v=1,
    stride_g_n=HV * R, stride_g_h=R, stride_g_r=1, stride_beta_n=HV * R, stride_beta_h=R,
    stride_beta_r=1, stride_q_b=D, stride_q_h=K, stride_q_k=1, stride_k_b=D, stride_k_h=K,
    stride_k_k=1, stride_v_b=D, stride_v_h=V, stride_v_v=1, stride_a_b=2 * HV, stride_a_h=1,
    stride_b_b=2 * HV, stride_b_h=1, stride_o_b=HV * V, stride_o_h=V, stride_o_v=1,
    stride_rd_n=0, stride_rd_h=0, stride_rd_v=0, stride_rd_k=0, stride_rs_n=0, stride_rs_h=0,
    stride_rs_v=0,
)
ptrs = dict(state="*fp32", ring_u="*fp32", ring_k="*bf16", ring_v="*bf16", ring_g="*fp32",
            ring_beta="*fp32", q="*bf16", k="*bf16", v="*bf16", a="*bf16", b="*bf16",
            A_log="*fp32", dt_bias="*fp32", o="*bf16", slot_idx="*i32", ring_start="*i32",
            ring_len="*i32", flush="*i1", scale="fp32")
# the launcher's configuration (gdn_replay_decode_fwd)
const = dict(H=H, HV=HV, K=K, V=V, BK=128, BV=TILE[0], BR=K_.BLOCK_R,
             ONE_CHUNK=R <= K_.BLOCK_R, RL_FOLD=TILE[1],
             RL_OUT=TILE[2], TILES=TILE[3], SOFTPLUS_THRESHOLD=20.0, USE_QK_L2NORM=True,
             HAS_READ=False, READ_FP8=False, SR=False, HAS_ORDER=False, read_ptr=None,
             read_scale_ptr=None, sr_seed=None, row_order=None)
if VARIANT in ("bf16", "fp8"):
    del const["read_ptr"], const["read_scale_ptr"]
    ptrs.update(read_ptr={"bf16": "*bf16", "fp8": "*fp8e4nv"}[VARIANT], read_scale_ptr="*fp32")
    strides.update(stride_rd_n=HV * V * K, stride_rd_h=V * K, stride_rd_v=K, stride_rd_k=1,
                   stride_rs_n=HV * V, stride_rs_h=V, stride_rs_v=1)
    const.update(HAS_READ=True, READ_FP8=VARIANT == "fp8")
    if VARIANT == "bf16":
        const["read_scale_ptr"] = None
        del ptrs["read_scale_ptr"]
elif VARIANT == "sr":
    del const["sr_seed"]
    ptrs.update(state="*fp16", sr_seed="*i64")
    const.update(SR=True)
ours_c = build(our_kernel, ptrs, strides, const, 1)  # num_stages as gdn_replay_decode_fwd
ours = ours_c.asm["ttgir"]

KEEP = re.compile(r"^(arith\.(mulf|addf|subf|divf|extf|truncf)|math\.\w+|\"tt\.reduce\"|"
                  r"tt\.reshape|ttg\.convert_layout|tt\.expand_dims|tt\.broadcast|tt\.splat|"
                  r"\}\) : \(tensor)")

def seq(txt):
    # Float tensor ops with their layouts spelled out and SSA names erased.
    defs = dict(re.findall(r"^(#\w+) = (#ttg\.\w+<\{.*?\}>)", txt, re.M))
    out = []
    for line in txt.splitlines():
        line = re.sub(r"\s*loc\(.*$", "", line.strip())
        body = line.split(" = ", 1)[1] if line.startswith("%") and " = " in line else line
        if not KEEP.match(body) or "tensor<" not in body:
            continue
        if "ptr" in body or "xi32" in body or "xi1" in body:
            continue
        body = re.sub(r"#\w+", lambda m: defs.get(m.group(0), m.group(0)), body)
        out.append(re.sub(r"%[\w#]+(:\d+)?", "%", body))
    return out

defs = dict(re.findall(r"^(#\w+) = (#ttg\.\w+<\{.*?\}>)", ours, re.M))
reds, cur = [], None
for line in ours.splitlines():
    if '"tt.reduce"' in line:
        cur = dict(axis=int(re.search(r"axis = (\d+)", line).group(1)), body=[])
    elif cur is not None and line.strip().startswith("})"):
        m = re.search(r"\(tensor<([\dx]+)x\w+, (#[\w.]+)", line)
        shape = [int(d) for d in m.group(1).split("x")]
        cur.update(shape=shape, layout=defs.get(m.group(2), m.group(2)),
                   add=any("arith.addf" in b for b in cur["body"]))
        reds.append(cur)
        cur = None
    elif cur is not None:
        cur["body"].append(line)
norm = [l for l in seq(ours) if "allow_reorder" in l]
sg_norm = [l for l in seq(sg) if "allow_reorder" in l]
with tempfile.TemporaryDirectory() as d:
    open(os.path.join(d, "k.cubin"), "wb").write(ours_c.asm["cubin"])
    sass = subprocess.run([os.path.join(BIN, "nvdisasm"), "-c", os.path.join(d, "k.cubin")],
                          capture_output=True, text=True, check=True).stdout
    open(os.path.join(d, "k.ptx"), "w").write(ours_c.asm["ptx"])
    px = subprocess.run([os.path.join(BIN, "ptxas"), "-v", "--gpu-name=sm_90a",
                         os.path.join(d, "k.ptx"), "-o", os.path.join(d, "k2.cubin")],
                        capture_output=True, text=True, check=True)
log = px.stdout + px.stderr
spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
ptxas = dict(regs=int(re.search(r"Used (\d+) registers", log).group(1)),
             spill_st=int(spill.group(1)), spill_ld=int(spill.group(2)))
# SASS loops (label .. backward branch) and their instruction counts
ins, lab = [], {}
for l in sass.splitlines():
    m = re.match(r"^(\.L_x_\d+):", l)
    if m:
        lab[m.group(1)] = len(ins)
    m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", l)
    if m:
        ins.append(m.group(1))
loops = []
for i, t in enumerate(ins):
    m = re.search(r"BRA `?\(?(\.L_x_\d+)", t)
    if m and lab.get(m.group(1), len(ins)) <= i:
        ops = [x.split()[1] if x.split()[0].startswith("@") else x.split()[0]
               for x in ins[lab[m.group(1)]:i + 1]]
        loops.append({o: sum(1 for x in ops if x.split(".")[0] == o)
                      for o in ("FFMA", "FMUL", "FADD", "SHFL", "LDS", "BAR")})
json.dump(dict(reds=[{k: r[k] for k in ("axis", "shape", "layout", "add")} for r in reds],
               norm=norm, sg_norm=sg_norm, loops=loops, ptxas=ptxas), sys.stdout)
'''


def _codegen(variant: str, tile: tuple[int, int, int] | None = None) -> dict:
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    argv = [variant] + ([",".join(map(str, tile))] if tile else [])
    proc = subprocess.run([sys.executable, "-c", _CODEGEN_SCRIPT, *argv], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    err = proc.stderr.lower()
    if proc.returncode != 0 and "nvidia" in err and "backend" in err:
        pytest.skip(f"no NVIDIA Triton backend: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("variant,tile",
                         [("none", None), ("bf16", None), ("fp8", None), ("sr", None),
                          ("none", (16, 8, 4)), ("none", (8, 8, 4))],
                         ids=["no-copy", "bf16-copy", "fp8-copy", "fp16-sr", "tile16-8-4",
                              "tile8-8-4"])
def test_fold_codegen(variant, tile):
    '''Compile the decode launch for sm_90a (no GPU needed) and check what the fold's bits rest on.

    * each k / q norm reduces on SGLang's layout (the same ``tt.reshape allow_reorder`` line as
      SGLang's kernel: 4 registers per lane, then the 32 lanes), so k̂ and q̃ are SGLang's;
    * every row sum of the 8-D view (``_tree._rows``) starts with the 4-column chain in one
      thread's registers (the reduced dim of size 4 has ``sizePerThread = 4`` on one lane, so it is
      summed in order as on SGLang's tile), then five adds over dims of size 2 (xor 16, 8, 4, 2, 1:
      axes 6, 5, 4, 2, 1 of the shrinking tile); also with a read copy, whose loads and stores
      could otherwise move the tile to another layout;
    * the fold loop fuses as many products into FMAs as SGLang's step on its tile (per 32 rows:
      32 chains x 3, 128 update FMAs, 3 for the norm; ptxas adds none of its own) and needs few
      shuffles (SGLang's layout: 165 per record and 32 rows);
    * ptxas: no spill without SR (registers and spills recorded in kernels/README.md).
    The same for other launch tiles (``tile``: block_v, fold_rows, nonflush_rows), whose fold
    loop has ``7 · block_v + 3`` FFMA.  The order of the levels is checked on the CPU
    (``test_bitwise_vs_sglang_packed_decode_cpu``, ``test_tiles_bitwise_vs_sglang_cpu``).
    '''
    import re

    got = _codegen(variant, tile)
    assert len(got["sg_norm"]) == 2 and got["sg_norm"][0] == got["sg_norm"][1]
    # flush: prologue record, loop record, current q and k; non-flush: current q and k, k̂·q̃
    assert len(got["norm"]) == 7, got["norm"]
    assert all(n == got["sg_norm"][0] for n in got["norm"])
    reds = got["reds"]
    chains = [i for i, r in enumerate(reds) if len(r["shape"]) == 8 and r["add"]]
    # flush: record, current token, output; non-flush: S0·k̂, S0·q̃, k_j·k̂, k_j·q̃, |k_j|²
    assert len(chains) == 8, [reds[i]["shape"] for i in chains]
    for i in chains:
        chain, levels = reds[i], reds[i + 1 : i + 6]
        assert chain["axis"] == 7 and chain["shape"][7] == 4 and chain["add"]
        lay = chain["layout"]
        for key, want in (("sizePerThread", 4), ("threadsPerWarp", 1), ("warpsPerCTA", 1)):
            vals = re.search(key + r" = \[([\d, ]+)\]", lay).group(1).split(",")
            assert int(vals[7]) == want, f"{key} of the 4-column dim: {lay}"
        assert [r["axis"] for r in levels] == [6, 5, 4, 2, 1], [r["axis"] for r in levels]
        assert all(r["add"] and r["shape"][r["axis"]] == 2 for r in levels)
    bv = tile[0] if tile else 32
    fold = [c for c in got["loops"] if c["FFMA"] == 7 * bv + 3 and c["SHFL"] < 20]
    assert fold, f"no fold loop with {7 * bv + 3} FFMA and < 20 SHFL: {got['loops']}"
    px = got["ptxas"]
    # SR's hash and rounding at the store spill (as they did in the previous default: 376-388 B)
    assert (px["spill_st"] == 0 and px["spill_ld"] == 0) or variant == "sr", px
    print(f"\n[codegen {variant} {tile}] ptxas {px}; loops {got['loops']}")
