"""Gated DeltaNet ReplaySSM speculative verify: kernel and reference vs the float64 recurrence.

On CPU the Triton kernels run under the interpreter (small shapes; see conftest.py); the ``gpu``
cases use the Qwen3.5-4B head shape.

A simulation drives a pool of slots through the shared cursor protocol of ``kernels/commit``
(``verify_cursor_step`` → ``gdn_replay_verify`` → ``verify_commit`` with random accepted counts:
all-reject ``a = 1``, partial, all-accept ``a = T``), with plain decode steps
(``decode_cursor_step`` → ``gdn_replay_decode``) and forced flushes mixed in.  Every step runs with
NaN-poisoned outputs, and after every commit the ring rows outside each live slot's committed
range ``[0, len)`` (the rejected drafts among them) are overwritten with NaN, so a read of a
rejected or stale record would poison an output or the checkpoint.  Checks per step:

* outputs of every window token against the float64 conventional recurrence run from the
  request's committed (accepted-only) state over the window (``‖out−ref‖/‖ref‖``); the float64
  state then advances by the accepted tokens only;
* after every flush (verify or decode) the checkpoint against that float64 state (a 16-bit
  checkpoint against the float64 state rounded at the same flush points), and, for an fp32
  checkpoint and the Triton kernels, **bitwise** against ``gdn_replay_decode``'s exact fold run on
  the same accepted tokens one at a time (window ``L = 1``: the conventional packed-decode update;
  on the CPU with the interpreter's ``tl.sum`` in the GPU's row-sum order, conftest.py);
* non-flush rows leave the checkpoint bit-identical; slots not in the batch (and the null slot 0)
  are bit-identical in the checkpoint and every ring tensor; padding rows leave their output rows
  untouched (still NaN); every other output element is written.

Measured bounds are printed (``pytest -s``) and recorded in kernels/README.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch

from replayssm_kernels.commit import min_ring_size, verify_commit, verify_cursor_step
from replayssm_kernels.conventional.gdn import gdn_conventional_f64
from replayssm_kernels.cursors import decode_cursor_step
from replayssm_kernels.gdn_decode import gdn_replay_decode, gdn_replay_decode_ref
from replayssm_kernels.gdn_decode._validate import MAX_K_DECODE
from replayssm_kernels.gdn_verify import gdn_replay_verify, gdn_replay_verify_ref
from replayssm_kernels.gdn_verify import kernel as gdn_verify_kernel
from replayssm_kernels.mamba2_decode.read_copy import (
    dequantize_rows,
    quantize_rows,
)
from replayssm_kernels.read_copy_refresh import refresh_read_copy_ref

HAS_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")

pytestmark = [
    # GPU row-sum order for the interpreter's tl.sum (conftest): the verify kernel's fold (SGLang's
    # tile) and the decode kernel's tree-form fold then agree bit for bit, as on the GPU.
    pytest.mark.usefixtures("interpreter_bf16_rtne", "interpreter_gpu_sum_order"),
    # The interpreter converts 0-d loop bounds with int(array): numpy's deprecation, not ours.
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
]

OPS = {
    "kernel": (gdn_replay_verify, gdn_replay_decode),
    "ref": (gdn_replay_verify_ref, gdn_replay_decode_ref),
}

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
    T: int
    R: int | None = None  # default: min_ring_size(L, T)
    state_dtype: torch.dtype = torch.float32
    act_dtype: torch.dtype = torch.bfloat16
    u_dtype: torch.dtype | None = None  # None: activation dtype
    requests: int = 3  # live requests (slots 1..requests; slot 0 is the null slot)
    spare_slots: int = 1  # allocated, never used: must stay bit-identical
    pad_rows: int = 1
    noncontig: bool = False
    idx64: bool = False
    steps: int = 14
    decode_p: float = 0.25  # probability that a step is a plain decode step
    force_p: float = 0.1
    tol_out: float = 1e-2
    tol_state: float = 1e-5
    late: bool = False  # verify_cursor_step(late_flush=True): flush when len + T > max(L, T) + T (= R: the default ring)

    @property
    def ring(self) -> int:
        return self.R if self.R is not None else min_ring_size(self.L, self.T)

    @property
    def id(self) -> str:
        sd = str(self.state_dtype).split(".")[-1]
        ad = str(self.act_dtype).split(".")[-1]
        nc = "-nc" if self.noncontig else ""
        return (
            f"T{self.T}-HV{self.HV}-Hk{self.Hk}-K{self.K}-V{self.V}-L{self.L}-R{self.ring}-"
            f"{sd}-{ad}{nc}{'-late' if self.late else ''}"
        )


class Sim:
    """A pool of slots driven through verify / decode steps, with float64 and fold shadows."""

    def __init__(self, case: Case, seed: int, ops: str, device: torch.device = DEVICE):
        self.c = c = case
        self.dev = device
        self.verify_fn, self.decode_fn = OPS[ops]
        # (the decode kernel, the fold shadow, takes K <= 128)
        self.bitwise = (ops.startswith("kernel") and c.state_dtype == torch.float32
                        and c.K <= MAX_K_DECODE)
        self.g = torch.Generator().manual_seed(seed)
        self.slots = 1 + c.requests + c.spare_slots
        self.R = R = c.ring
        act, u_dt = c.act_dtype, c.u_dtype or c.act_dtype

        def pool(shape, dtype):
            # Non-contiguous: a layer view of a [slots, 2 layers, ...] allocation; the other layer
            # must stay untouched.
            full = (shape[0], 2, *shape[1:]) if c.noncontig else shape
            t = torch.full(full, math.nan, dtype=dtype, device=device)
            return t[:, 1] if c.noncontig else t

        self.state = pool((self.slots, c.HV, c.V, c.K), c.state_dtype)
        init = 0.5 * torch.randn(self.slots, c.HV, c.V, c.K, generator=self.g)
        self.state.copy_(init.to(c.state_dtype))
        # Rings start NaN-poisoned: reading a row outside [0, len) poisons the result.
        self.ring_u = pool((self.slots, c.HV, R, c.V), u_dt)
        self.ring_k = pool((self.slots, c.Hk, R, c.K), act)
        self.ring_v = pool((self.slots, c.HV, R, c.V), act)
        self.ring_g = pool((self.slots, c.HV, R), torch.float32)
        self.ring_beta = pool((self.slots, c.HV, R), torch.float32)
        self.cursors = torch.zeros(self.slots, 2, dtype=torch.int32, device=device)
        self.A_log = torch.log(0.5 + 3.5 * torch.rand(c.HV, generator=self.g)).to(device)
        self.dt_bias = (torch.randn(c.HV, generator=self.g) - 1.5).to(device)
        self.scale = c.K**-0.5
        # float64 shadow per request (slot r+1): the state after its accepted tokens
        # (on the test's device: the float64 recurrence at the Qwen3.5-4B shape is far too slow on
        # a host CPU for the gpu cases)
        self.shadow = [self.state[1 + r].to(torch.float64) for r in range(c.requests)]
        # Fold shadow (fp32 kernel runs): an L = 1 decode pool fed the accepted tokens one by one
        # (every step flushes: the conventional packed-decode update); fed lazily at checks.
        if self.bitwise:
            n = 1 + c.requests
            self.f_state = self.state[:n].clone()
            self.f_ring = [
                torch.zeros(n, c.HV, 1, c.V, dtype=u_dt, device=device),
                torch.zeros(n, c.Hk, 1, c.K, dtype=act, device=device),
                torch.zeros(n, c.HV, 1, c.V, dtype=act, device=device),
                torch.zeros(n, c.HV, 1, device=device),
                torch.zeros(n, c.HV, 1, device=device),
            ]
            self.pending: list[list[tuple]] = [[] for _ in range(c.requests)]
            self.bitwise_checks = 0
        self.max_out_err = 0.0
        self.max_state_err = 0.0
        self.flushes = [0] * c.requests
        self.verify_steps = self.decode_steps = 0
        self.accepted_seen: set[str] = set()
        self.max_flush_len = 0  # longest history a verify flush folded

    def tensors(self):
        return [self.state, self.ring_u, self.ring_k, self.ring_v, self.ring_g, self.ring_beta]

    def full_tensors(self):
        return [t._base if t._base is not None else t for t in self.tensors()]

    # -- inputs ------------------------------------------------------------------------------

    def make_inputs(self, T: int):
        """One step: shuffled live rows plus padding rows; q/k/v and a/b are strided views of one
        ``[B, T, ...]`` mixer-like allocation (``T = 0``: a decode step, ``[B, ...]`` inputs)."""
        c, g = self.c, self.g
        reqs = torch.randperm(c.requests, generator=g).tolist()
        rows = [1 + r for r in reqs] + [-1] * c.pad_rows
        perm = torch.randperm(len(rows), generator=g).tolist()
        rows = [rows[i] for i in perm]
        B = len(rows)
        tt = max(T, 1)
        D = 2 * c.Hk * c.K + c.HV * c.V
        mixed = torch.randn(B, tt, D, generator=g).to(c.act_dtype).to(self.dev)
        q = mixed[..., : c.Hk * c.K].unflatten(-1, (c.Hk, c.K))
        k = mixed[..., c.Hk * c.K : 2 * c.Hk * c.K].unflatten(-1, (c.Hk, c.K))
        v = mixed[..., 2 * c.Hk * c.K :].unflatten(-1, (c.HV, c.V))
        ab = torch.randn(B, tt, 2 * c.HV, generator=g).to(c.act_dtype).to(self.dev)
        a, b = ab[..., : c.HV], ab[..., c.HV :]
        if T == 0:
            q, k, v, a, b = (x[:, 0] for x in (q, k, v, a, b))
        force = (torch.rand(B, generator=g) < c.force_p).to(self.dev)
        # Accepted counts (bonus included): all-reject, all-accept or partial, a third each.
        u = torch.rand(B, generator=g)
        acc = torch.randint(1, tt + 1, (B,), generator=g)
        acc = torch.where(u < 1 / 3, torch.ones_like(acc), acc)
        acc = torch.where(u > 2 / 3, torch.full_like(acc, tt), acc)
        idx_dtype = torch.int64 if c.idx64 else torch.int32
        slot_idx = torch.tensor(rows, dtype=idx_dtype, device=self.dev)
        return dict(q=q, k=k, v=v, a=a, b=b, force=force, slot_idx=slot_idx,
                    accepted=acc.to(self.dev), T=T)  # fmt: skip

    # -- steps -------------------------------------------------------------------------------

    def step(self, inp):
        c = self.c
        B = inp["slot_idx"].shape[0]
        T = inp["T"]
        start = torch.empty(B, dtype=torch.int32, device=self.dev)
        length = torch.empty(B, dtype=torch.int32, device=self.dev)
        flush = torch.empty(B, dtype=torch.bool, device=self.dev)
        if T == 0:
            self.decode_steps += 1
            decode_cursor_step(
                self.cursors, inp["slot_idx"], inp["force"], c.L, self.R, start, length, flush
            )
            out = torch.full((B, c.HV, c.V), math.nan, dtype=c.act_dtype, device=self.dev)
            fn = self.decode_fn
        else:
            self.verify_steps += 1
            verify_cursor_step(
                self.cursors, inp["slot_idx"], inp["force"], c.L, self.R, T, start, length, flush,
                late_flush=c.late,
            )
            if bool(flush.any()):
                self.max_flush_len = max(self.max_flush_len, int(length[flush].max()))
            out = torch.full((B, T, c.HV, c.V), math.nan, dtype=c.act_dtype, device=self.dev)
            fn = self.verify_fn
        before = [t.clone() for t in self.full_tensors()]
        fn(
            *self.tensors(), inp["q"], inp["k"], inp["v"], inp["a"], inp["b"], self.A_log,
            self.dt_bias, out, inp["slot_idx"], start, length, flush, scale=self.scale,
        )  # fmt: skip
        if T > 0:
            verify_commit(
                self.cursors, inp["slot_idx"], start, length, flush, inp["accepted"],
                window=c.L, ring_size=self.R, num_tokens=T, late_flush=c.late,
            )  # fmt: skip
        self.check(inp, out, flush, before)
        self.poison_uncommitted()
        return out, flush

    def poison_uncommitted(self):
        """NaN into every ring row outside a live slot's committed range [0, len)."""
        cur = self.cursors.cpu().tolist()
        for s in range(1, 1 + self.c.requests):
            start, n = cur[s]
            dead = [(start + r) % self.R for r in range(n, self.R)]
            if not dead:
                continue
            idx = torch.tensor(dead, device=self.dev)
            for t in self.tensors()[1:]:
                t[s].index_fill_(1, idx, math.nan)

    def _token(self, inp, i, t):
        """Token t of row i as ``[1, ...]`` tensors (copies, on the test's device)."""
        sel = (lambda x: x[i : i + 1]) if inp["T"] == 0 else (lambda x: x[i, t : t + 1])
        return tuple(sel(inp[n]).clone() for n in ("q", "k", "v", "a", "b"))

    def _f64(self, r, toks):
        cat = [torch.cat([tk[j] for tk in toks]) for j in range(5)]
        return gdn_conventional_f64(
            self.shadow[r], *cat, self.A_log, self.dt_bias, scale=self.scale
        )

    def check(self, inp, out, flush, before):
        c = self.c
        T = inp["T"]
        rows = inp["slot_idx"].tolist()
        flush = flush.tolist()
        acc = inp["accepted"].tolist()
        touched = {s for s in rows if s >= 0}
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
            n_tok = max(T, 1)
            toks = [self._token(inp, i, t) for t in range(n_tok)]
            n_acc = acc[i] if T > 0 else 1
            if T > 0:
                self.accepted_seen.add("reject" if n_acc == 1 else "all" if n_acc == T else "part")
            # Outputs of every window token: from the committed state over the drafts.
            y64, _ = self._f64(r, toks)
            got = out[i] if T > 0 else out[i : i + 1]
            diff = got.double() - y64
            num += float((diff * diff).sum())
            den += float((y64 * y64).sum())
            # Checkpoint after a flush: a verify flush folds the committed history only (the
            # shadow before this step); a decode flush also folds its token.
            if flush[i]:
                self.flushes[r] += 1
                if T == 0:
                    _, self.shadow[r] = self._f64(r, toks)
                if c.state_dtype != torch.float32:
                    self.shadow[r] = self.shadow[r].to(c.state_dtype).to(torch.float64)
                got_s = st_new[s].double()
                err = float((got_s - self.shadow[r]).norm() / self.shadow[r].norm())
                self.max_state_err = max(self.max_state_err, err)
                assert err < c.tol_state, f"slot {s}: checkpoint rel err {err:.3e}"
                if self.bitwise:
                    if T == 0:
                        self.pending[r].append(toks[0])
                    self.fold_shadow_to_pending(r)
                    assert_bits_equal(st_new[s], self.f_state[s], f"checkpoint of slot {s}")
                    self.bitwise_checks += 1
                    if T > 0:
                        self.pending[r].extend(toks[:n_acc])
            else:
                assert_bits_equal(st_new[s], st_old[s], f"non-flush row wrote slot {s}")
                if self.bitwise:
                    self.pending[r].extend(toks[:n_acc])
            # The float64 state advances by the accepted tokens only.
            if T > 0 or not flush[i]:
                _, self.shadow[r] = self._f64(r, toks[:n_acc])
        if den > 0:
            err = math.sqrt(num / den)
            self.max_out_err = max(self.max_out_err, err)
            assert err < c.tol_out, f"output rel err {err:.3e}"

    def fold_shadow_to_pending(self, r):
        """Feed request r's pending accepted tokens through gdn_replay_decode at L = 1."""
        c = self.c
        n = 1 + c.requests
        z = torch.zeros(1, dtype=torch.int32, device=self.dev)
        for tok in self.pending[r]:
            q, k, v, a, b = (x.to(self.dev) for x in tok)
            out = torch.empty(1, c.HV, c.V, dtype=c.act_dtype, device=self.dev)
            gdn_replay_decode(
                self.f_state, *self.f_ring, q, k, v, a, b, self.A_log, self.dt_bias, out,
                torch.tensor([r + 1], dtype=torch.int32, device=self.dev), z, z,
                torch.ones(1, dtype=torch.bool, device=self.dev), scale=self.scale,
            )  # fmt: skip
        assert self.f_state.shape[0] == n
        self.pending[r] = []

    def run(self):
        c = self.c
        for _ in range(c.steps):
            is_decode = float(torch.rand(1, generator=self.g)) < c.decode_p
            self.step(self.make_inputs(0 if is_decode else c.T))
        assert min(self.flushes) >= 1, self.flushes
        return self


# ---------------------------------------------------------------------------------------------
# Cases.  CPU (interpreter) cases are small; the gpu cases use the Qwen3.5-4B head shape.

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
CPU_CASES = [
    Case(HV=4, Hk=2, K=32, V=32, L=3, T=1),
    Case(HV=2, Hk=1, K=16, V=16, L=6, T=2, act_dtype=FP32, u_dtype=FP32, tol_out=1e-5),
    # non-power-of-two K and V (masked lanes), fp32 u, non-contiguous pool, int64 slot_idx
    Case(HV=4, Hk=2, K=24, V=20, L=8, T=4, u_dtype=FP32, noncontig=True, idx64=True),
    Case(HV=2, Hk=1, K=16, V=16, L=12, T=8, act_dtype=FP32, tol_out=1e-5, requests=2, steps=12),
    Case(HV=2, Hk=1, K=16, V=16, L=6, T=4, state_dtype=BF16, tol_state=2e-3, steps=12),
    # the late flush rule: histories up to R - T, a flush row's window wrapping over its history
    Case(HV=4, Hk=2, K=24, V=20, L=8, T=4, u_dtype=FP32, steps=16, decode_p=0.15, late=True),
]
REF_CASES = CPU_CASES + [
    Case(HV=6, Hk=3, K=40, V=24, L=8, T=4, state_dtype=BF16, tol_state=2e-3, steps=20),
    Case(HV=4, Hk=4, K=16, V=16, L=4, T=8, act_dtype=FP32, tol_out=1e-5, steps=20),
    Case(HV=2, Hk=1, K=16, V=16, L=6, T=2, act_dtype=FP32, tol_out=1e-5, steps=24, late=True),
]
GPU_CASES = [
    Case(HV=32, Hk=16, K=128, V=128, L=16, T=T, requests=24, pad_rows=3, noncontig=nc, steps=40)
    for T, nc in ((2, False), (4, True), (8, False))
] + [
    Case(HV=32, Hk=16, K=128, V=128, L=16, T=4, requests=8, state_dtype=BF16, tol_state=2e-3),
    Case(HV=6, Hk=3, K=80, V=48, L=16, T=8, act_dtype=FP32, tol_out=1e-5, steps=30),
    Case(HV=32, Hk=16, K=128, V=128, L=16, T=4, requests=24, pad_rows=3, steps=40, decode_p=0.1,
         late=True),
]


@pytest.mark.parametrize("case", REF_CASES, ids=lambda c: c.id)
def test_reference_vs_f64(case):
    sim = Sim(case, seed=1, ops="ref", device=torch.device("cpu")).run()
    assert sim.verify_steps >= 3 and sim.accepted_seen == {"reject", "all", "part"} or case.T <= 2
    assert not case.late or sim.max_flush_len > sim.R - case.T, (sim.max_flush_len, sim.R)
    print(
        f"\n[ref {case.id}] out {sim.max_out_err:.2e} state {sim.max_state_err:.2e} "
        f"(verify {sim.verify_steps}, decode {sim.decode_steps}, flushes {sim.flushes})"
    )


@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: c.id)
def test_kernel_vs_f64_and_fold(case):
    """Kernel vs float64 (outputs, checkpoints) and the fp32 checkpoint bitwise vs the fold."""
    sim = Sim(case, seed=2, ops="kernel").run()
    assert sim.verify_steps >= 3 and sim.decode_steps >= 1
    assert not case.late or sim.max_flush_len > sim.R - case.T, (sim.max_flush_len, sim.R)
    if sim.bitwise:
        assert sim.bitwise_checks >= 3
    print(
        f"\n[kernel {case.id}] out {sim.max_out_err:.2e} state {sim.max_state_err:.2e} "
        f"(verify {sim.verify_steps}, decode {sim.decode_steps}, flushes {sim.flushes}, "
        f"bitwise {getattr(sim, 'bitwise_checks', 0)}, a {sorted(sim.accepted_seen)})"
    )


def test_kernel_long_history():
    """Non-flush rows that replay long committed histories (L = 10: up to 10 stored updates)."""
    case = Case(HV=2, Hk=1, K=16, V=16, L=10, T=2, act_dtype=FP32, tol_out=1e-5, requests=2,
                decode_p=0.3, force_p=0.05, steps=14)  # fmt: skip
    sim = Sim(case, seed=6, ops="kernel").run()
    print(f"\n[kernel history {case.id}] out {sim.max_out_err:.2e} state {sim.max_state_err:.2e}")


def test_kernel_wide_keys():
    """K > 128: the fold launch takes SGLang's tile (the tree form covers K <= 128); verify steps
    only (the decode kernel takes K <= 128), outputs and flushed checkpoints vs float64."""
    case = Case(HV=2, Hk=1, K=160, V=16, L=6, T=2, act_dtype=FP32, tol_out=1e-5, requests=2,
                decode_p=0.0, force_p=0.2, steps=10)  # fmt: skip
    sim = Sim(case, seed=9, ops="kernel").run()
    assert sim.verify_steps == case.steps and sum(sim.flushes) >= 3
    print(f"\n[kernel wide keys {case.id}] out {sim.max_out_err:.2e} "
          f"state {sim.max_state_err:.2e} (flushes {sim.flushes})")


def program_grid(monkeypatch, head: bool) -> None:
    """Make the fold launch a program per (row, value head) (``head``) or per (row, head, tile)
    at any batch, instead of the work list (``kernel.FOLD_WORK_LIST_MAX_BATCH``)."""
    monkeypatch.setattr(gdn_verify_kernel, "FOLD_WORK_LIST_MAX_BATCH", 0)
    monkeypatch.setattr(gdn_verify_kernel, "FOLD_HEAD_GRID", 1 if head else 1 << 30)


@pytest.mark.parametrize("K,V", [(24, 72), (160, 40)], ids=["tree", "sglang-tile"])
def test_kernel_fold_head_grid(monkeypatch, K, V):
    """The fold launch with a program per (row, value head) (``kernel.FOLD_HEAD_GRID``, taken
    above the work list's batch) folding several value tiles in turn, the last one partial:
    outputs and checkpoints vs float64, the fp32 checkpoint bitwise vs the fold (tree form, and
    SGLang's tile for K > 128)."""
    program_grid(monkeypatch, head=True)
    case = Case(HV=2, Hk=1, K=K, V=V, L=4, T=2, act_dtype=FP32, tol_out=1e-5, requests=2,
                decode_p=0.0, force_p=0.3, steps=8)  # fmt: skip
    sim = Sim(case, seed=21, ops="kernel").run()
    assert sum(sim.flushes) >= 3 and (not sim.bitwise or sim.bitwise_checks >= 3)
    print(f"\n[kernel head-grid fold {case.id}] out {sim.max_out_err:.2e} "
          f"state {sim.max_state_err:.2e} (flushes {sim.flushes})")


#: K of the CPU-designed fold-tile tests below: 24 in the interpreter, 128 on a GPU. In compiled
#: code a tile's bits equal the default tile's only when every lane holds whole 4-column chunks of
#: a row (K = 128 on one warp, the real shapes). At K = 24 Triton spreads a chunk's columns over
#: lanes; LLVM then fuses a lane's own product into the first cross-lane add (``fma(s, k,
#: shfl(p))``), the lanes' sums differ in the last bit, and the tile decides which lane's sum a
#: row uses (sm_90a PTX; ``test_split_fold_tile`` failed so on an H100 at K = 24).
K_TILE = 128 if DEVICE.type == "cuda" else 24

#: Tree-form fold tiles other than the default (``FOLD_BLOCK_V``, ``FOLD_TREE_ROWS``): fewer rows
#: per program or on lanes, for fewer registers (``kernel.FOLD_BLOCK_V``'s comment; timed slower).
#: All four on the GPU; two on the CPU.
FOLD_TILES = [(16, 16), (16, 8), (8, 8), (8, 4)]


def spy_fold_launches(monkeypatch, launch_spy, bv: int, rl: int, head_grid: bool) -> list:
    """Set the fold tile (``FOLD_BLOCK_V`` / ``FOLD_TREE_ROWS``) and a program grid
    (``program_grid``), and spy on both fold kernels (without and with a read copy)."""
    monkeypatch.setattr(gdn_verify_kernel, "FOLD_BLOCK_V", bv)
    monkeypatch.setattr(gdn_verify_kernel, "FOLD_TREE_ROWS", rl)
    program_grid(monkeypatch, head_grid)
    return [launch_spy(gdn_verify_kernel, name)
            for name in ("gdn_verify_fold_kernel", "gdn_verify_fold_read_kernel")]


def assert_fold_tile(spies: list, bv: int, rl: int, V: int, head_grid: bool) -> None:
    """Every fold launch ran ``bv``-row tiles with ``rl`` rows on lanes, over ``cdiv(V, bv)``
    tiles per head (all in one program with the head grid)."""
    launches = [lc for sp in spies for lc in sp.launches]
    assert launches, "no fold launch"
    tiles = -(-V // bv)
    for grid, meta in launches:
        assert (meta["BV"], meta["RL"]) == (bv, rl), meta
        assert (grid[0], meta["TILES"]) == ((1, tiles) if head_grid else (tiles, 1)), (grid, meta)


@pytest.mark.parametrize("head_grid", [True, False], ids=["head", "tile"])
@pytest.mark.parametrize("bv,rl", [(16, 8), (8, 4)], ids=["bv16-rl8", "bv8-rl4"])
def test_kernel_fold_tiles(monkeypatch, launch_spy, bv, rl, head_grid):
    """The fold launch with other tree-form tiles (``FOLD_BLOCK_V`` / ``FOLD_TREE_ROWS``), a
    program per value head or per tile, V = 72 (a partial last tile): outputs and checkpoints vs
    float64, the fp32 checkpoint bitwise vs the decode kernel's fold."""
    spies = spy_fold_launches(monkeypatch, launch_spy, bv, rl, head_grid)
    case = Case(HV=2, Hk=1, K=K_TILE, V=72, L=4, T=2, act_dtype=FP32, tol_out=1e-5, requests=2,
                decode_p=0.0, force_p=0.3, steps=8)  # fmt: skip
    sim = Sim(case, seed=22, ops="kernel").run()
    assert sum(sim.flushes) >= 3 and sim.bitwise and sim.bitwise_checks >= 3
    assert_fold_tile(spies, bv, rl, case.V, head_grid)
    print(f"\n[kernel fold tile bv{bv} rl{rl} {case.id}] out {sim.max_out_err:.2e} "
          f"state {sim.max_state_err:.2e} (flushes {sim.flushes})")


def test_kernel_fold_tiles_per_program(monkeypatch, launch_spy):
    """``fold_tiles`` between 1 and all: 8-row tiles, three per program over V = 72 (nine tiles per
    head, the last partial), bitwise vs the decode fold; a count that does not divide the head's
    tiles is refused."""
    import functools

    spies = spy_fold_launches(monkeypatch, launch_spy, 8, 8, head_grid=False)
    monkeypatch.setattr(gdn_verify_kernel, "gdn_replay_verify_fwd", functools.partial(
        gdn_verify_kernel.gdn_replay_verify_fwd, fold_tiles=3))
    case = Case(HV=2, Hk=1, K=K_TILE, V=72, L=4, T=2, act_dtype=FP32, tol_out=1e-5, requests=2,
                decode_p=0.0, force_p=0.3, steps=8)  # fmt: skip
    sim = Sim(case, seed=23, ops="kernel").run()
    assert sum(sim.flushes) >= 3 and sim.bitwise and sim.bitwise_checks >= 3
    launches = [lc for sp in spies for lc in sp.launches]
    assert launches and all(g[0] == 3 and m["TILES"] == 3 and m["BV"] == 8 for g, m in launches)
    monkeypatch.setattr(gdn_verify_kernel, "gdn_replay_verify_fwd", functools.partial(
        gdn_verify_kernel.gdn_replay_verify_fwd.func, fold_tiles=2))
    with pytest.raises(ValueError, match="fold_tiles: expected a divisor of the 9 value tiles"):
        Sim(case, seed=23, ops="kernel").run()


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """``‖got − want‖ / ‖want‖`` in float64."""
    return float((got.double() - want.double()).norm() / want.double().norm())


#: Pool tensors of ``_work_list_args``: each a view past a guard slot 0 that nothing may touch (a
#: row with slot -1 that wrongly folded would write there).
POOL_NAMES = ("state", "ring_u", "ring_k", "ring_v", "ring_g", "ring_beta", "read_state",
              "read_scale")


def _work_list_args(device, seed: int, B: int = 9, slots: int = 12, HV: int = 2, Hk: int = 1,
                    K: int = 16, V: int = 20, T: int = 2, R: int = 8, p_flush: float = 0.5,
                    state_dtype: torch.dtype = FP32, read: torch.dtype | None = None,
                    ) -> tuple[dict, dict]:
    """One verify step's arguments with a fresh random pool and inputs, and the pool tensors'
    guarded allocations (``POOL_NAMES``). Up to nine rows: flush rows (one with an empty ring),
    non-flush rows and padding rows (one of them flagged flush) interleaved; above, a random such
    pattern. ``read``: a read copy of that dtype (fp8: with scales); fp16 ``state_dtype``: a
    stochastic-rounding seed."""
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rnd(*shape, dtype=torch.float32, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

    bf, i32 = torch.bfloat16, torch.int32
    if B <= 9:
        slot = [3, -1, 0, 7, 5, -1, 11, 2, 9][:B]
        flush = [True, True, False, True, False, False, True, True, False][:B]
        rlen = [5, 3, 4, 6, 2, 0, 0, 3, 6][:B]
    else:  # distinct random slots, every 7th row padding, flush rows with probability p_flush
        slot = torch.randperm(slots, generator=g)[:B].tolist()
        slot = [-1 if i % 7 == 3 else x for i, x in enumerate(slot)]
        flush = (torch.rand(B, generator=g) < p_flush).tolist()
        rlen = torch.randint(0, R - T + 1, (B,), generator=g).tolist()
    tens = lambda x, dt: torch.tensor(x, dtype=dt, device=device)  # noqa: E731
    pool = dict(
        state=rnd(slots + 1, HV, V, K, dtype=state_dtype, scale=0.1),
        ring_u=rnd(slots + 1, HV, R, V, scale=0.1), ring_k=rnd(slots + 1, Hk, R, K, dtype=bf),
        ring_v=rnd(slots + 1, HV, R, V, dtype=bf), ring_g=-rnd(slots + 1, HV, R).abs() * 0.2,
        ring_beta=torch.sigmoid(rnd(slots + 1, HV, R)),
    )
    if read is not None:
        pool["read_state"] = rnd(slots + 1, HV, V, K, scale=0.1).to(read)
        if read == torch.float8_e4m3fn:
            pool["read_scale"] = rnd(slots + 1, HV, V).abs() + 0.5
    args = {name: t[1:] for name, t in pool.items()}
    args.update(
        q=rnd(B, T, Hk, K, dtype=bf), k=rnd(B, T, Hk, K, dtype=bf), v=rnd(B, T, HV, V, dtype=bf),
        a=rnd(B, T, HV, dtype=bf), b=rnd(B, T, HV, dtype=bf), A_log=rnd(HV, scale=0.5),
        dt_bias=rnd(HV, scale=0.5),
        out=torch.full((B, T, HV, V), math.nan, dtype=bf, device=device),
        slot_idx=tens(slot, i32), ring_start=(torch.arange(B, dtype=i32, device=device) * 3) % R,
        ring_len=tens(rlen, i32), flush=tens(flush, torch.bool),
    )
    if state_dtype == FP16:
        args["sr_seed"] = torch.tensor([1234], dtype=torch.int64, device=device)
    return args, pool


def _head_items(args: dict, programs: int, head_items: int) -> bool:
    """Whether the work list takes (row, head) items for ``args`` on ``programs`` programs (the
    kernel's rule, from the live flush rows)."""
    live = int((args["flush"] & (args["slot_idx"] >= 0)).sum())
    return live * args["state"].shape[1] >= head_items * programs


def _clone(args: dict, pool: dict) -> tuple[dict, dict]:
    """A deep copy of ``_work_list_args``' result, the pool views into the copied allocations."""
    pool2 = {k: t.clone() for k, t in pool.items()}
    args2 = {k: (pool2[k][1:] if k in pool2 else t.clone()) for k, t in args.items()}
    return args2, pool2


#: Work-list variants: (case id, ``_work_list_args`` keywords).
WORK_VARIANTS = [
    ("plain", {}),
    ("bf16-copy", dict(read=BF16)),
    ("fp8-copy", dict(read=torch.float8_e4m3fn)),
    ("fp16-sr", dict(state_dtype=FP16)),
    ("sglang-tile-K160", dict(K=160, V=72)),
]
#: (programs, ``FOLD_HEAD_ITEMS``, (row, head) items expected) with the nine-row pattern (four live
#: flush rows, HV = 2: eight (row, head) items).
WORK_GRIDS = [(1, 1, True), (3, 1 << 20, False), (5, 1, True), (1000, 1, False)]


@pytest.mark.usefixtures("interpreter_fp16_fp8_rtne")
@pytest.mark.parametrize(
    "variant,programs,head_items,heads",
    [("plain", *g) for g in WORK_GRIDS]
    + [(v, *g) for v, _ in WORK_VARIANTS[1:] for g in WORK_GRIDS[:2]],
    ids=[f"plain-P{g[0]}" for g in WORK_GRIDS]
    + [f"{v}-P{g[0]}" for v, _ in WORK_VARIANTS[1:] for g in WORK_GRIDS[:2]],
)
def test_fold_work_list_bitwise_vs_program_grid(monkeypatch, launch_spy, variant, programs,
                                                head_items, heads):
    """The work-list fold (``fold.py``) against a program per (row, head, tile) on the same step:
    every tensor bit-identical (pool, untouched slots, the guard slot a row with slot -1 would hit,
    NaN-poisoned outputs of padding rows), at one program taking every item, a few programs
    striding over (row, head) items or over one-tile items (8-row tiles, three per head, the last
    partial) and a grid capped at the item count; with a bf16 / fp8 read copy, an fp16 checkpoint
    with stochastic rounding and on SGLang's tile (K = 160); then (plain) outputs and checkpoints
    against the torch reference."""
    kw = dict(scale=0.25, fold_block_v=8, fold_rows=4)
    args, pool = _work_list_args(DEVICE, seed=31, **dict(WORK_VARIANTS)[variant])
    want, pool_want = _clone(args, pool)
    guards = {k: t[0].clone() for k, t in pool.items()}
    monkeypatch.setattr(gdn_verify_kernel, "FOLD_HEAD_ITEMS", head_items)
    spies = [launch_spy(gdn_verify_kernel, n)
             for n in ("gdn_verify_fold_kernel", "gdn_verify_fold_read_kernel")]
    gdn_verify_kernel.gdn_replay_verify_fwd(**args, **kw, fold_programs=programs)
    gdn_verify_kernel.gdn_replay_verify_fwd(**want, **kw, fold_tiles=1)
    (grid_w, meta_w), (grid_p, meta_p) = [lc for sp in spies for lc in sp.launches]
    n_tiles = grid_p[0]
    assert meta_w["WORK_LIST"] and grid_w == (min(programs, 9 * 2 * n_tiles), 1, 1), grid_w
    assert not meta_p["WORK_LIST"] and grid_p == (n_tiles, 2, 9) and n_tiles == 3, grid_p
    assert _head_items(args, grid_w[0], head_items) == heads
    for name, t in args.items():
        assert_bits_equal(t, want[name], name)
    for name, t in pool.items():
        assert_bits_equal(t[0], guards[name], f"guard slot of {name}")
    assert args["out"][args["slot_idx"] < 0].isnan().all()
    if variant != "plain":
        return
    ref, _ = _clone(*_work_list_args(DEVICE, seed=31))
    gdn_replay_verify_ref(**ref, scale=0.25)
    live = args["slot_idx"] >= 0
    d_out = rel_err(args["out"][live], ref["out"][live])
    d_state = rel_err(args["state"], ref["state"])
    assert d_out < 2e-2 and d_state < 1e-5, (d_out, d_state)
    print(f"\n[fold work list P{programs}] out {d_out:.2e} state {d_state:.2e} vs reference")


@pytest.mark.gpu
@pytest.mark.parametrize("B,p_flush,heads", [(64, 0.125, False), (256, 0.125, False),
                                             (300, 0.9, True)],
                         ids=["b64-mixed", "b256-mixed", "b300-head-items"])
def test_fold_work_list_bitwise_vs_program_grid_gpu(launch_spy, B, p_flush, heads):
    """The default work-list fold at the Qwen3.5-4B head shape (one-tile items for an eighth of
    the rows flushing, (row, head) items for 90%) bit for bit against a program per (row, head)
    on the same step: every tensor, untouched slots, the guard slot and padding outputs included."""
    args, pool = _work_list_args(DEVICE, seed=B, B=B, slots=B + 16, HV=32, Hk=16, K=128, V=128,
                                 T=4, R=19, p_flush=p_flush)
    want, _ = _clone(args, pool)
    guards = {k: t[0].clone() for k, t in pool.items()}
    spy = launch_spy(gdn_verify_kernel, "gdn_verify_fold_kernel")
    gdn_verify_kernel.gdn_replay_verify_fwd(**args, scale=128 ** -0.5)
    gdn_verify_kernel.gdn_replay_verify_fwd(**want, scale=128 ** -0.5, fold_tiles=4)
    (grid_w, meta_w), (_, meta_p) = spy.launches
    assert meta_w["WORK_LIST"] and not meta_p["WORK_LIST"]
    assert _head_items(args, grid_w[0], gdn_verify_kernel.FOLD_HEAD_ITEMS) == heads
    for name, t in args.items():
        assert_bits_equal(t, want[name], name)
    for name, t in pool.items():
        assert_bits_equal(t[0], guards[name], f"guard slot of {name}")


def test_fold_grid_choice():
    """``_fold_grid``: the work list up to ``FOLD_WORK_LIST_MAX_BATCH`` rows (its grid capped at
    the item count), a program per (row, head) above; ``fold_tiles`` a program grid at any batch."""
    cpu = torch.device("cpu")
    cap = gdn_verify_kernel.FOLD_PROGRAMS_PER_SM * 4  # the interpreter's 4 SMs
    top = gdn_verify_kernel.FOLD_WORK_LIST_MAX_BATCH

    def grid(batch, tiles=None, programs=None):
        meta = {}
        g = gdn_verify_kernel._fold_grid(cpu, batch, 32, 4, tiles, programs, meta)
        return g, meta["WORK_LIST"], meta["TILES"], meta["BLOCK_B"]

    assert grid(1) == ((min(cap, 128), 1, 1), True, 1, 32)
    assert grid(top) == ((cap, 1, 1), True, 1, top)
    assert grid(top + 1) == ((1, 32, top + 1), False, 4, 1)
    assert grid(8, tiles=1) == ((4, 32, 8), False, 1, 1)
    assert grid(8, programs=7) == ((7, 1, 1), True, 1, 32)


@pytest.mark.parametrize("kw,msg", [
    (dict(fold_programs=0), "fold_programs: expected >= 1, got 0"),
    (dict(fold_programs=4, fold_tiles=1), "fold_programs: sets the work list's grid"),
])
def test_fold_programs_value_error(kw, msg):
    """``fold_programs`` below 1, or beside ``fold_tiles``, names the keyword."""
    args, _ = _work_list_args(DEVICE, seed=1)
    with pytest.raises(ValueError, match=msg):
        gdn_verify_kernel.gdn_replay_verify_fwd(**args, scale=0.25, **kw)


@pytest.mark.parametrize("bv,rl,msg", [(12, 4, "fold_block_v: expected a power of two, got 12"),
                                       (16, 3, "fold_rows: expected a power of two, got 3"),
                                       (8, 16, "fold_rows: expected at most fold_block_v = 8")])
def test_fold_tile_value_errors(bv, rl, msg):
    """Bad fold tiles name the keyword, what it expects and what it got."""
    with pytest.raises(ValueError, match=msg):
        gdn_verify_kernel._fold_tile(128, bv, rl)


@pytest.mark.parametrize("T", [1, 4, 16])
def test_kernel_vs_ref_lockstep(T):
    """Kernel and reference on the same inputs step by step: outputs and ring records (T = 16:
    the longest window, four factors of the window kernel's triangular inverse)."""
    case = Case(HV=2, Hk=1, K=24, V=20, L=6, T=T, act_dtype=FP32, u_dtype=FP32, steps=8)
    sim = Sim(case, seed=3, ops="kernel")
    ref = Sim(case, seed=3, ops="ref")
    worst = 0.0
    for _ in range(case.steps):
        is_decode = float(torch.rand(1, generator=sim.g)) < case.decode_p
        float(torch.rand(1, generator=ref.g))
        inp = sim.make_inputs(0 if is_decode else T)
        ref.make_inputs(0 if is_decode else T)
        out_k, _ = sim.step(inp)
        out_r, _ = ref.step(inp)
        live = inp["slot_idx"] >= 0
        d = (out_k[live].double() - out_r[live].double()).norm() / out_r[live].double().norm()
        worst = max(worst, float(d))
        for tk, tr in zip(sim.tensors(), ref.tensors()):
            torch.testing.assert_close(tk, tr, equal_nan=True, atol=1e-5, rtol=1e-5)
        assert torch.equal(sim.cursors, ref.cursors)
    assert worst < 1e-5
    print(f"\n[kernel vs ref T{T}] out {worst:.2e}")


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.id)
def test_kernel_vs_f64_gpu(case):
    """At the Qwen3.5-4B shape on the GPU; the fp32 checkpoint bitwise vs gdn_replay_decode's
    fold (compiled code: FMA contraction and the compiler's reduction trees)."""
    sim = Sim(case, seed=4, ops="kernel").run()
    assert not case.late or sim.max_flush_len > sim.R - case.T, (sim.max_flush_len, sim.R)
    print(f"\n[gpu {case.id}] out {sim.max_out_err:.2e} state {sim.max_state_err:.2e}")


@pytest.mark.gpu
def test_kernel_fold_head_grid_gpu(monkeypatch):
    """The Qwen3.5-4B shape with a program per (row, value head) in the fold launch at any batch
    (``program_grid``; batches above the work list's take it)."""
    program_grid(monkeypatch, head=True)
    case = GPU_CASES[1]
    sim = Sim(case, seed=5, ops="kernel").run()
    assert sum(sim.flushes) >= 3 and (not sim.bitwise or sim.bitwise_checks >= 3)
    print(f"\n[gpu head-grid fold {case.id}] out {sim.max_out_err:.2e} "
          f"state {sim.max_state_err:.2e}")


@pytest.mark.gpu
@pytest.mark.parametrize("bv,rl", FOLD_TILES, ids=[f"bv{b}-rl{r}" for b, r in FOLD_TILES])
def test_kernel_fold_tiles_gpu(monkeypatch, launch_spy, bv, rl):
    """The Qwen3.5-4B shape with other tree-form fold tiles, a program per value head: the fp32
    checkpoint bitwise vs the decode kernel's fold in compiled code (the layouts differ, the
    written-out reduction tree must not)."""
    spies = spy_fold_launches(monkeypatch, launch_spy, bv, rl, head_grid=True)
    case = GPU_CASES[1]
    sim = Sim(case, seed=7, ops="kernel").run()
    assert sum(sim.flushes) >= 3 and sim.bitwise and sim.bitwise_checks >= 3
    assert_fold_tile(spies, bv, rl, case.V, head_grid=True)
    print(f"\n[gpu fold tile bv{bv} rl{rl} {case.id}] out {sim.max_out_err:.2e} "
          f"state {sim.max_state_err:.2e}")


# ---------------------------------------------------------------------------------------------
# Against SGLang's snapshot verify (fused_sigmoid_gating_delta_rule_update with intermediate states)


def snapshot_compare(HV, Hk, K, V, L, T, *, batch, seed, device=DEVICE) -> dict:
    """One verify step of ours against SGLang 0.5.17's snapshot verify on the same requests.

    Each live row gets a committed history of ``len`` tokens in ``[0, max(L, T)]`` (random ring
    start), appended by our decode kernel as non-flush steps; SGLang's side advances a copy of the
    checkpoint over the same tokens with ``fused_sigmoid_gating_delta_rule_update`` (its decode
    mode, one token per call). Then both verify ``T`` tokens: ours with rows flushing iff
    ``len + T > L`` or forced, SGLang's exactly as ``TritonGDNKernel.target_verify`` calls it
    (``disable_state_update=True``, ``intermediate_states_buffer [batch, T, HV, V, K]``,
    ``cache_steps=T``, varlen ``cu_seqlens``). Convention difference: SGLang keeps β in fp32, ours
    rounds it to ``b.dtype`` as the packed decode does (kernels/README.md), so with bf16 ``b`` the
    two differ by that rounding, not by bitwise noise. Checks: padding row untouched, non-flush
    rows and other slots' checkpoints bit-identical, SGLang's verify leaves its state alone.
    """
    from sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent import (
        fused_sigmoid_gating_delta_rule_update as sg_verify,
    )

    g = torch.Generator().manual_seed(seed)
    bf = torch.bfloat16
    R = min_ring_size(L, T)
    slots = batch + 2
    hmax = max(L, T)
    state = (0.5 * torch.randn(slots, HV, V, K, generator=g)).to(device)
    rings = [torch.full(sh, math.nan, dtype=dt, device=device) for sh, dt in (
        ((slots, HV, R, V), bf), ((slots, Hk, R, K), bf), ((slots, HV, R, V), bf),
        ((slots, HV, R), torch.float32), ((slots, HV, R), torch.float32))]
    A_log = torch.log(0.5 + 3.5 * torch.rand(HV, generator=g)).to(device)
    dt_bias = (torch.randn(HV, generator=g) - 1.5).to(device)
    scale = K**-0.5
    live = (torch.randperm(slots - 1, generator=g)[:batch] + 1).tolist()
    h = torch.randint(0, hmax + 1, (batch,), generator=g)
    h[0], h[-1] = 0, hmax
    flush = (h + T > L) | (torch.rand(batch, generator=g) < 0.2)
    flush[0] = T > L  # row 0 (empty ring) flushes only if it must
    start = torch.randint(0, R, (batch,), generator=g)
    i32 = dict(dtype=torch.int32, device=device)

    def tokens(n):
        D = 2 * Hk * K + HV * V
        mixed = torch.randn(batch + 1, n, D, generator=g).to(device=device, dtype=bf)
        q = mixed[..., : Hk * K].unflatten(-1, (Hk, K))
        k = mixed[..., Hk * K : 2 * Hk * K].unflatten(-1, (Hk, K))
        v = mixed[..., 2 * Hk * K :].unflatten(-1, (HV, V))
        ab = torch.randn(batch + 1, n, 2 * HV, generator=g).to(device=device, dtype=bf)
        return q, k, v, ab[..., :HV], ab[..., HV:]

    sg_state = state.clone()
    hist = tokens(hmax)
    for j in range(hmax):  # history: our non-flush decode appends; SGLang's decode update
        rows = [s if int(h[b]) > j else -1 for b, s in enumerate(live)]
        idx = torch.tensor(rows + [-1], **i32)
        q, k, v, a, b = (x[:, j] for x in hist)
        gdn_replay_decode(
            state, *rings, q, k, v, a, b, A_log, dt_bias,
            torch.empty(batch + 1, HV, V, dtype=bf, device=device), idx,
            torch.cat([start, torch.zeros(1, dtype=torch.long)]).to(**i32),
            torch.full((batch + 1,), j, **i32),
            torch.zeros(batch + 1, dtype=torch.bool, device=device), scale=scale,
        )  # fmt: skip
        # SGLang's kernel takes the batch stride as T x the token stride: packed tokens
        q, k, v, a, b = (x[:, None].contiguous() for x in (q, k, v, a, b))
        sg_verify(A_log=A_log, a=a, dt_bias=dt_bias, softplus_beta=1.0, softplus_threshold=20.0,
                  q=q, k=k, v=v, b=b, initial_state_source=sg_state, initial_state_indices=idx,
                  scale=scale, use_qk_l2norm_in_kernel=True)  # fmt: skip
    hist_state = sg_state.clone()
    state_before = state.clone()

    q, k, v, a, b = tokens(T)  # last row: padding
    rows = live + [-1]
    out = torch.full((batch + 1, T, HV, V), math.nan, dtype=bf, device=device)
    gdn_replay_verify(
        state, *rings, q, k, v, a, b, A_log, dt_bias, out, torch.tensor(rows, **i32),
        torch.cat([start, torch.zeros(1, dtype=torch.long)]).to(**i32),
        torch.cat([h, torch.zeros(1, dtype=torch.long)]).to(**i32),
        torch.cat([flush, torch.zeros(1, dtype=torch.bool)]).to(device), scale=scale,
    )  # fmt: skip
    # SGLang's snapshot verify, as TritonGDNKernel.target_verify calls it (varlen, packed tokens)
    n = batch * T
    buf = torch.zeros(batch, T, HV, V, K, device=device)
    o_sg = sg_verify(
        A_log=A_log, a=a[:batch].reshape(n, HV), dt_bias=dt_bias, softplus_beta=1.0,
        softplus_threshold=20.0, q=q[:batch].reshape(1, n, Hk, K),
        k=k[:batch].reshape(1, n, Hk, K), v=v[:batch].reshape(1, n, HV, V),
        b=b[:batch].reshape(n, HV), initial_state_source=sg_state,
        initial_state_indices=torch.tensor(live, **i32), scale=scale,
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=torch.arange(0, n + 1, T, **i32), disable_state_update=True,
        intermediate_states_buffer=buf, intermediate_state_indices=torch.arange(batch, **i32),
        cache_steps=T,
    ).reshape(batch, T, HV, V)  # fmt: skip
    assert_bits_equal(sg_state, hist_state, "SGLang's verify wrote its state")
    assert torch.isnan(out[batch]).all(), "padding row written"
    assert not torch.isnan(out[:batch]).any()
    assert torch.isfinite(o_sg.float()).all() and torch.isfinite(buf).all()
    st_num = st_den = 0.0
    for i, s in enumerate(live):
        if bool(flush[i]):
            d = state[s].double() - hist_state[s].double()
            st_num += float((d * d).sum())
            st_den += float((hist_state[s].double() ** 2).sum())
        else:
            assert_bits_equal(state[s], state_before[s], f"row {i}: non-flush row wrote state")
    others = [s for s in range(slots) if s not in live]
    assert_bits_equal(state[others], state_before[others], "untouched slots")
    d = out[:batch].double() - o_sg.double()
    res = {
        "out_rel": float(d.norm() / o_sg.double().norm()),
        "state_rel": math.sqrt(st_num / st_den) if st_den else 0.0,
        "flush_rows": int(flush.sum()),
        "nonflush_rows": int((~flush).sum()),
    }
    print(f"\n[gdn-verify vs sglang snapshot] HV{HV} Hk{Hk} K{K} V{V} T={T} L={L}: "
          f"|out-sglang|/|sglang| = {res['out_rel']:.2e}, flushed checkpoint vs SGLang's state "
          f"{res['state_rel']:.2e} ({res['flush_rows']} flush / {res['nonflush_rows']} non-flush)")
    return res


@pytest.mark.usefixtures("sglang_fla_interpret")
def test_outputs_vs_sglang_snapshot_verify():
    res = snapshot_compare(4, 2, 32, 32, 6, 4, batch=4, seed=30)
    assert res["flush_rows"] > 0 and res["nonflush_rows"] > 0
    assert res["out_rel"] < 1e-2 and res["state_rel"] < 5e-3, res


@pytest.mark.gpu
@pytest.mark.parametrize("T", [2, 4, 8], ids=lambda t: f"T{t}")
def test_gpu_qwen35_vs_sglang_snapshot_verify(T):
    res = snapshot_compare(32, 16, 128, 128, 16, T, batch=24, seed=800 + T)
    assert res["flush_rows"] > 0 and res["nonflush_rows"] > 0
    assert res["out_rel"] < 1e-2 and res["state_rel"] < 5e-3, res


# ---------------------------------------------------------------------------------------------
# Validation


def _args(HV=4, Hk=2, K=16, V=16, R=6, T=2, B=3, slots=4):
    f32, bf = torch.float32, torch.bfloat16
    with torch.device(DEVICE):
        return dict(
            state=torch.zeros(slots, HV, V, K),
            ring_u=torch.zeros(slots, HV, R, V, dtype=bf),
            ring_k=torch.zeros(slots, Hk, R, K, dtype=bf),
            ring_v=torch.zeros(slots, HV, R, V, dtype=bf),
            ring_g=torch.zeros(slots, HV, R, dtype=f32),
            ring_beta=torch.zeros(slots, HV, R, dtype=f32),
            q=torch.zeros(B, T, Hk, K, dtype=bf),
            k=torch.zeros(B, T, Hk, K, dtype=bf),
            v=torch.zeros(B, T, HV, V, dtype=bf),
            a=torch.zeros(B, T, HV, dtype=bf),
            b=torch.zeros(B, T, HV, dtype=bf),
            A_log=torch.zeros(HV),
            dt_bias=torch.zeros(HV),
            out=torch.zeros(B, T, HV, V, dtype=bf),
            slot_idx=torch.zeros(B, dtype=torch.int32),
            ring_start=torch.zeros(B, dtype=torch.int32),
            ring_len=torch.zeros(B, dtype=torch.int32),
            flush=torch.zeros(B, dtype=torch.bool),
        )


BAD = {
    "state-rank": ("state", lambda a: a["state"][0], "state"),
    "state-dtype": ("state", lambda a: a["state"].double(), "state"),
    "q-rank": ("q", lambda a: a["q"][:, 0], "q"),
    "heads-not-divisible": ("q", lambda a: a["q"].new_zeros(3, 2, 3, 16), "q"),
    "T-too-large": ("q", lambda a: a["q"].new_zeros(3, 17, 2, 16), "q"),
    "k-T": ("k", lambda a: a["k"][:, :1], "k"),
    "v-shape": ("v", lambda a: a["v"][..., :8], "v"),
    "ring_k-dtype": ("ring_k", lambda a: a["ring_k"].float(), "ring_k"),
    "ring-smaller-than-T": ("ring_k", lambda a: a["ring_k"][:, :, :1], "ring_k"),
    "ring_u-dtype": ("ring_u", lambda a: a["ring_u"].half(), "ring_u"),
    "ring_v-R": ("ring_v", lambda a: a["ring_v"][:, :, :2], "ring_v"),
    "ring_g-dtype": ("ring_g", lambda a: a["ring_g"].bfloat16(), "ring_g"),
    "ring_beta-shape": ("ring_beta", lambda a: a["ring_beta"][:2], "ring_beta"),
    "a-T": ("a", lambda a: a["a"][:, :1], "a"),
    "b-shape": ("b", lambda a: a["b"][:2], "b"),
    "A_log-strided": ("A_log", lambda a: a["A_log"].new_zeros(8)[::2], "A_log"),
    "out-shape": ("out", lambda a: a["out"][:, :, :2], "out"),
    "out-decode-shape": ("out", lambda a: a["out"][:, 0], "out"),
    "slot_idx-float": ("slot_idx", lambda a: a["slot_idx"].float(), "slot_idx"),
    "ring_start-batch": ("ring_start", lambda a: a["ring_start"][:2], "ring_start"),
    "flush-int": ("flush", lambda a: a["flush"].int(), "flush"),
    "slot_idx-strided": ("slot_idx", lambda a: a["slot_idx"].repeat_interleave(2)[::2], "stride 1"),
    "ring_len-strided": ("ring_len", lambda a: a["ring_len"].repeat_interleave(2)[::2], "stride 1"),
    "flush-strided": ("flush", lambda a: a["flush"].repeat_interleave(2)[::2], "stride 1"),
    "out-overlapping": ("out", lambda a: a["out"][:1].expand_as(a["out"]), "stride-0"),
    "ring_u-overlapping": ("ring_u", lambda a: a["ring_u"][:1].expand_as(a["ring_u"]), "stride-0"),
}


@pytest.mark.parametrize("op", ["kernel", "ref"])
@pytest.mark.parametrize("bad", list(BAD))
def test_value_errors(op, bad):
    args = _args()
    name, make, match = BAD[bad]
    args[name] = make(args)
    with pytest.raises(ValueError, match=match):
        OPS[op][0](**args, scale=0.25)


@pytest.mark.parametrize("op", ["kernel", "ref"])
def test_value_error_scale_and_K(op):
    with pytest.raises(ValueError, match="scale"):
        OPS[op][0](**_args(), scale=float("nan"))
    with pytest.raises(ValueError, match="state"):
        OPS[op][0](**_args(K=512), scale=0.25)


def test_reference_rejects_ring_overflow():
    """The reference checks the cursor invariant on the host (the kernel cannot): len + T <= R
    on non-flush rows, len <= R on flush rows (their window may wrap over the folded history)."""
    args = _args(R=6, T=2)
    args["ring_len"].fill_(5)
    with pytest.raises(ValueError, match=r"ring_len\[0\]: expected 0 <= len, len <= R - T = 4"):
        gdn_replay_verify_ref(**args, scale=0.25)
    args = _args(R=6, T=2)
    args["flush"].fill_(True)
    args["ring_len"].fill_(7)
    with pytest.raises(ValueError, match=r"ring_len\[0\]: expected 0 <= len, flush row: len <= R"):
        gdn_replay_verify_ref(**args, scale=0.25)


def test_all_padding_touches_nothing():
    args = _args()
    args["slot_idx"].fill_(-1)
    args["out"].fill_(math.nan)
    before = {k: v.clone() for k, v in args.items()}
    gdn_replay_verify(**args, scale=0.25)
    for k, v in args.items():
        assert_bits_equal(v, before[k], k)


# ---------------------------------------------------------------------------------------------
# Split precision: a low-precision read copy beside the checkpoint (kernels/README.md, "Split
# precision").  Non-flush rows start from the copy (the checkpoint is not read); flush rows fold
# the checkpoint exactly as without a copy and refresh the copy from it as stored.

F8 = torch.float8_e4m3fn
# Output tolerance vs float64 (relative L2 per step, worst step), test_split_precision_gdn.py's:
# the copy adds one rounding of S0 (bf16 2^-9, fp16 2^-11, e4m3 2^-4 relative per element) to the
# ~2e-3 of bf16 outputs.
TOL_OUT_COPY = {BF16: 1e-2, FP16: 1e-2, F8: 6e-2}


class SplitSim(Sim):
    """``Sim`` with a read copy passed to every verify and decode call and checked after it: flush
    rows' copy (and fp8 scales) bit-identical to ``quantize_rows`` of the stored checkpoint,
    non-flush rows' copy unchanged; untouched slots and padding rows leave the copy alone (the copy
    is part of ``full_tensors``, so ``Sim.check`` covers it)."""

    def __init__(self, case: Case, read_dtype: torch.dtype, seed: int, ops: str,
                 device: torch.device = DEVICE):  # fmt: skip
        super().__init__(case, seed, ops, device)
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
                              torch.arange(self.slots, device=device))  # fmt: skip
        kw = dict(read_state=self.read, read_scale=self.read_scale)
        self.verify_fn = functools.partial(self.verify_fn, **kw)
        self.decode_fn = functools.partial(self.decode_fn, **kw)
        self.copy_checks = 0
        self.after: list[torch.Tensor] = []

    def copy_tensors(self) -> list[torch.Tensor]:
        return [self.read] + ([self.read_scale] if self.read_scale is not None else [])

    def full_tensors(self):
        extra = [self.read_full] + ([self.scale_full] if self.scale_full is not None else [])
        return super().full_tensors() + extra

    def poison_uncommitted(self):
        # The pool as the step left it (before the rejected rows are poisoned), for lockstep checks.
        self.after = [t.clone() for t in self.tensors() + self.copy_tensors()]
        super().poison_uncommitted()

    def step(self, inp):
        copy0 = [t.clone() for t in self.copy_tensors()]
        out, flush = super().step(inp)
        for i, s in enumerate(inp["slot_idx"].tolist()):
            if s < 0:
                continue
            if bool(flush[i]):
                q, sc = quantize_rows(self.state[s], self.read_dtype)
                assert_bits_equal(self.read[s], q, f"slot {s}: read copy != round(checkpoint)")
                if sc is not None:
                    assert_bits_equal(self.read_scale[s], sc, f"slot {s}: fp8 scales")
                self.copy_checks += 1
            else:
                for t, t0 in zip(self.copy_tensors(), copy0):
                    assert_bits_equal(t[s], t0[s], f"non-flush row wrote the copy of slot {s}")
        return out, flush


def _split_id(cr) -> str:
    case, rd = cr
    return f"{case.id}-read-{str(rd)[6:]}"


def _run_split(op: str, case: Case, read_dtype: torch.dtype, seed: int) -> SplitSim:
    case = dataclasses.replace(case, tol_out=TOL_OUT_COPY[read_dtype])
    dev = DEVICE  # the reference too: its cursors are Triton kernels (CUDA or the interpreter)
    sim = SplitSim(case, read_dtype, seed, op, dev).run()
    assert sim.verify_steps >= 3 and sim.copy_checks >= 3
    print(f"\n[split-gdn-verify] {op} {_split_id((case, read_dtype))}: out vs f64 "
          f"{sim.max_out_err:.2e}, state vs f64 {sim.max_state_err:.2e} (verify "
          f"{sim.verify_steps}, decode {sim.decode_steps}, flushes {sim.flushes}, copy checks "
          f"{sim.copy_checks}, bitwise {getattr(sim, 'bitwise_checks', 0)}, "
          f"a {sorted(sim.accepted_seen)})")  # fmt: skip
    return sim


SPLIT_CPU_CASES = [
    # 16-bit checkpoint: the copy is refreshed from the checkpoint as stored (rounded)
    (Case(HV=2, Hk=1, K=16, V=16, L=6, T=2, state_dtype=FP16, tol_state=2e-3, steps=12), BF16),
    # masked K and V lanes, fp32 u, non-contiguous pool and copy, int64 slot_idx
    (Case(HV=2, Hk=1, K=24, V=20, L=8, T=4, u_dtype=FP32, noncontig=True, idx64=True,
          requests=2, steps=12), F8),  # fmt: skip
    # fp32 activations: the copy's rounding alone
    (Case(HV=2, Hk=1, K=16, V=16, L=6, T=4, act_dtype=FP32, u_dtype=FP32, requests=2,
          steps=12), FP16),  # fmt: skip
]
SPLIT_REF_ONLY = [
    (Case(HV=2, Hk=1, K=16, V=16, L=6, T=4, act_dtype=FP32, u_dtype=FP32, steps=12), F8),
    (Case(HV=4, Hk=2, K=16, V=16, L=6, T=2, state_dtype=BF16, tol_state=2e-3, steps=12), FP16),
]


@pytest.mark.usefixtures("interpreter_fp16_fp8_rtne")
@pytest.mark.parametrize("cr", SPLIT_CPU_CASES, ids=[_split_id(c) for c in SPLIT_CPU_CASES])
def test_kernel_split_vs_f64(cr):
    """Kernel with a read copy over many steps (random accepted counts, decode steps, forced
    flushes): outputs vs float64, the copy after every flush, and the fp32 checkpoint bitwise vs
    ``gdn_replay_decode``'s fold without a copy."""
    sim = _run_split("kernel", *cr, seed=12)
    if sim.bitwise:
        assert sim.bitwise_checks >= 3


@pytest.mark.usefixtures("interpreter_fp16_fp8_rtne")
@pytest.mark.parametrize("cr", SPLIT_CPU_CASES + SPLIT_REF_ONLY,
                         ids=[_split_id(c) for c in SPLIT_CPU_CASES + SPLIT_REF_ONLY])  # fmt: skip
def test_reference_split_vs_f64(cr):
    _run_split("ref", *cr, seed=11)


def split_lockstep(case: Case, read_dtype: torch.dtype, seed: int) -> dict:
    """Verify steps of the kernel with a copy (``SplitSim``: its own checks) and, on clones of the
    same pool with the same cursor snapshot, the reference with the copy and the kernel without
    it.  Checks: kernel vs reference (outputs, checkpoint, rings; the reference's copy is
    ``quantize_rows`` of its checkpoint; flush rows' outputs and ``u`` within the copy's
    tolerance, as each side's window reads its own refreshed copy, whose rounding the folds' ~1e-7
    difference can flip); flush rows of the launch without a copy: checkpoint
    bit-identical, outputs within the copy's rounding (the window of a launch with a copy reads
    the refreshed copy; reported); non-flush rows: checkpoint untouched in all three."""
    case = dataclasses.replace(case, tol_out=TOL_OUT_COPY[read_dtype])
    sim = SplitSim(case, read_dtype, seed, "kernel")
    T, dev = case.T, sim.dev
    res = {"out_vs_ref": 0.0, "flush_out_vs_ref": 0.0, "flush_out_vs_nocopy": 0.0, "flush_rows": 0,
           "nonflush_rows": 0}
    for _ in range(case.steps):
        inp = sim.make_inputs(T)
        pool = [t.clone() for t in sim.tensors()]
        copy = [t.clone() for t in sim.copy_tensors()]
        cursors = sim.cursors.clone()
        out_k, flush = sim.step(inp)
        B = inp["slot_idx"].shape[0]
        start = torch.empty(B, dtype=torch.int32, device=dev)
        length = torch.empty(B, dtype=torch.int32, device=dev)
        flush2 = torch.empty(B, dtype=torch.bool, device=dev)
        verify_cursor_step(cursors, inp["slot_idx"], inp["force"], case.L, sim.R, T, start,
                           length, flush2)  # fmt: skip
        assert torch.equal(flush2, flush)
        args = (inp["q"], inp["k"], inp["v"], inp["a"], inp["b"], sim.A_log, sim.dt_bias)
        snap = (inp["slot_idx"], start, length, flush)

        def launch(fn, pool_c, **kw):
            out = torch.full_like(out_k, math.nan)
            fn(*pool_c, *args, out, *snap, scale=sim.scale, **kw)
            return out

        ref_pool = [t.clone() for t in pool]
        ref_copy = [t.clone() for t in copy]
        out_r = launch(gdn_replay_verify_ref, ref_pool, read_state=ref_copy[0],
                       read_scale=ref_copy[1] if len(ref_copy) > 1 else None)  # fmt: skip
        nc_pool = [t.clone() for t in pool]
        out_n = launch(gdn_replay_verify, nc_pool)

        live = inp["slot_idx"] >= 0
        # non-flush rows read the same copy on both sides; flush rows each side's own refreshed
        # copy (below, with the records)
        for rows, key in ((live & ~flush, "out_vs_ref"), (live & flush, "flush_out_vs_ref")):
            if bool(rows.any()):
                res[key] = max(res[key], rel_err(out_k[rows], out_r[rows]))
        # Flush rows' u records come from each side's own refreshed copy, and the two folds'
        # ~1e-7 difference can flip a copy rounding (an fp8 ulp is 6%): those rows within the
        # copy's tolerance, everything else as close as without a copy.
        flushed = torch.zeros(sim.slots, dtype=torch.bool, device=dev)
        flushed[inp["slot_idx"][(inp["slot_idx"] >= 0) & flush].long()] = True
        for n, (tk, tr) in enumerate(zip(sim.after, ref_pool)):
            rows = ~flushed if n == 1 else slice(None)  # n == 1: ring_u
            torch.testing.assert_close(tk[rows], tr[rows], equal_nan=True, atol=1e-5, rtol=1e-5)
        if bool(flushed.any()):
            uk, ur = sim.after[1][flushed], ref_pool[1][flushed]
            assert torch.equal(uk.isnan(), ur.isnan())  # unwritten ring rows hold NaN
            assert rel_err(uk[~uk.isnan()], ur[~ur.isnan()]) < TOL_OUT_COPY[read_dtype]
        for i, s in enumerate(inp["slot_idx"].tolist()):
            if s < 0:
                for o in (out_r, out_n):
                    assert torch.isnan(o[i]).all(), "padding row written"
                continue
            if not bool(flush[i]):
                res["nonflush_rows"] += 1
                for p in (sim.after, ref_pool, nc_pool):
                    assert_bits_equal(p[0][s], pool[0][s], f"non-flush row {i} wrote the state")
                continue
            res["flush_rows"] += 1
            q, sc = quantize_rows(ref_pool[0][s], read_dtype)
            assert_bits_equal(ref_copy[0][s], q, f"reference copy of slot {s}")
            if sc is not None:
                assert_bits_equal(ref_copy[1][s], sc, f"reference fp8 scales of slot {s}")
            assert_bits_equal(sim.after[0][s], nc_pool[0][s], f"flushed checkpoint of slot {s}")
            dn = (out_k[i].double() - out_n[i].double()).norm() / out_n[i].double().norm()
            res["flush_out_vs_nocopy"] = max(res["flush_out_vs_nocopy"], float(dn))
        tol = TOL_OUT_COPY[read_dtype]
        assert res["out_vs_ref"] < 1e-5, res
        assert res["flush_out_vs_ref"] < tol and res["flush_out_vs_nocopy"] < tol, res
    assert res["flush_rows"] >= 2 and res["nonflush_rows"] >= 2, res
    assert res["flush_out_vs_nocopy"] > 0, res  # flush rows' windows read the copy
    print(f"\n[split-gdn-verify lockstep] {_split_id((case, read_dtype))}: out kernel vs ref "
          f"{res['out_vs_ref']:.2e}, flush rows vs no copy {res['flush_out_vs_nocopy']:.2e} "
          f"({res['flush_rows']} flush / {res['nonflush_rows']} non-flush rows)")
    return res


@pytest.mark.usefixtures("interpreter_fp16_fp8_rtne")
@pytest.mark.parametrize("T,rd", [(2, BF16), (4, F8)], ids=["T2-bf16", "T4-fp8"])
def test_split_kernel_vs_ref_and_no_copy(T, rd):
    case = Case(HV=2, Hk=1, K=24, V=20, L=6, T=T, act_dtype=FP32, u_dtype=FP32, requests=3,
                steps=6, decode_p=0.0, force_p=0.25)  # fmt: skip
    split_lockstep(case, rd, seed=13)


@pytest.mark.usefixtures("interpreter_fp16_fp8_rtne")
def test_split_fold_head_grid(monkeypatch):
    """The read-copy fold launch with a program per (row, value head), three value tiles each."""
    program_grid(monkeypatch, head=True)
    case = Case(HV=2, Hk=1, K=24, V=72, L=6, T=2, act_dtype=FP32, u_dtype=FP32, requests=3,
                steps=6, decode_p=0.0, force_p=0.25)  # fmt: skip
    split_lockstep(case, F8, seed=14)


@pytest.mark.usefixtures("interpreter_fp16_fp8_rtne")
def test_split_fold_tile(monkeypatch, launch_spy):
    """The read-copy fold launch with an 8-row tree-form tile (4 rows on lanes), a program per
    value head, nine value tiles each: the fp8 copy's per-row scales over partial tiles."""
    spies = spy_fold_launches(monkeypatch, launch_spy, 8, 4, head_grid=True)
    case = Case(HV=2, Hk=1, K=K_TILE, V=72, L=6, T=2, act_dtype=FP32, u_dtype=FP32, requests=3,
                steps=6, decode_p=0.0, force_p=0.25)  # fmt: skip
    split_lockstep(case, F8, seed=15)
    assert spies[0].launches and spies[1].launches  # the no-copy run and the copy's
    assert_fold_tile(spies, 8, 4, case.V, head_grid=True)


def _split_after_history(op: str, rd: torch.dtype, seed: int):
    """A ``SplitSim`` (``op``'s verify, copy ``rd``) after two steps of committed history (len 2..4
    per slot, one padding row), the next step's inputs, its cursor snapshot ``(start, len,
    flush)`` and the launch's positional inputs."""
    case = Case(HV=2, Hk=1, K=16, V=16, L=6, T=2, act_dtype=FP32, u_dtype=FP32, pad_rows=1,
                force_p=0.0, decode_p=0.0, tol_out=TOL_OUT_COPY[rd])  # fmt: skip
    sim = SplitSim(case, rd, seed=seed, ops=op, device=DEVICE)
    for _ in range(2):
        sim.step(sim.make_inputs(case.T))
    inp = sim.make_inputs(case.T)
    B = inp["slot_idx"].shape[0]
    start = torch.empty(B, dtype=torch.int32, device=sim.dev)
    length = torch.empty(B, dtype=torch.int32, device=sim.dev)
    flush = torch.empty(B, dtype=torch.bool, device=sim.dev)
    verify_cursor_step(sim.cursors, inp["slot_idx"], inp["force"], case.L, sim.R, case.T,
                       start, length, flush)  # fmt: skip
    assert int(length.max()) > 0
    args = (inp["q"], inp["k"], inp["v"], inp["a"], inp["b"], sim.A_log, sim.dt_bias)
    return sim, case, inp, (start, length, flush), args


@pytest.mark.usefixtures("interpreter_fp16_fp8_rtne")
@pytest.mark.parametrize("rd", [BF16, F8], ids=["bf16", "fp8"])
@pytest.mark.parametrize("op", ["kernel", "ref"])
def test_split_nonflush_rows_never_read_the_checkpoint(op, rd):
    """NaN in every checkpoint: non-flush rows (with committed histories) give the outputs and
    records of the same launch without a copy on a checkpoint holding the copy's dequantised
    values, bit for bit."""
    sim, case, inp, (start, length, flush), args = _split_after_history(op, rd, 14)
    flush.zero_()
    B = inp["slot_idx"].shape[0]
    snap = (inp["slot_idx"], start, length, flush)
    fn = OPS[op][0]
    deq = dequantize_rows(sim.read, sim.read_scale)
    rings_want = [t.clone() for t in sim.tensors()[1:]]
    want = torch.full((B, case.T, case.HV, case.V), math.nan, device=sim.dev)
    fn(deq, *rings_want, *args, want, *snap, scale=sim.scale)
    sim.state.fill_(math.nan)
    out = torch.full_like(want, math.nan)
    fn(*sim.tensors(), *args, out, *snap, scale=sim.scale, read_state=sim.read,
       read_scale=sim.read_scale)  # fmt: skip
    live = inp["slot_idx"] >= 0
    assert torch.isfinite(out[live]).all()
    assert_bits_equal(out, want, "outputs")
    for got, exp in zip(sim.tensors()[1:], rings_want):
        assert_bits_equal(got, exp, "ring records")


@pytest.mark.usefixtures("interpreter_fp16_fp8_rtne")
@pytest.mark.parametrize("rd", [BF16, F8], ids=["bf16", "fp8"])
@pytest.mark.parametrize("op", ["kernel", "ref"])
def test_split_flush_rows_window_reads_the_copy(op, rd):
    """Every live row flushes (committed histories folded): the checkpoint is as without a copy
    and the copy is refreshed from it; the outputs are those of a second launch, on the refreshed
    copy with every checkpoint NaN, where the same rows do not flush and have no history, bit for
    bit (the window's code for a flush row and for an empty history is the same)."""
    sim, case, inp, (start, length, flush), args = _split_after_history(op, rd, 16)
    flush.fill_(True)
    B = inp["slot_idx"].shape[0]
    fn = OPS[op][0]
    nocopy = [t.clone() for t in sim.tensors()]
    fn(*nocopy, *args, torch.empty(B, case.T, case.HV, case.V, device=sim.dev),
       inp["slot_idx"], start, length, flush, scale=sim.scale)  # fmt: skip
    out = torch.full((B, case.T, case.HV, case.V), math.nan, device=sim.dev)
    fn(*sim.tensors(), *args, out, inp["slot_idx"], start, length, flush, scale=sim.scale,
       read_state=sim.read, read_scale=sim.read_scale)  # fmt: skip
    live = inp["slot_idx"] >= 0
    slots = inp["slot_idx"][live].long()
    assert_bits_equal(sim.state[slots], nocopy[0][slots], "checkpoint")
    q, sc = quantize_rows(sim.state[slots], rd)
    assert_bits_equal(sim.read[slots], q, "refreshed copy")
    rings = [t.clone() for t in sim.tensors()[1:]]
    want = torch.full_like(out, math.nan)
    fn(torch.full_like(sim.state, math.nan), *rings, *args, want, inp["slot_idx"], start,
       torch.zeros_like(length), torch.zeros_like(flush), scale=sim.scale, read_state=sim.read,
       read_scale=sim.read_scale)  # fmt: skip
    assert torch.isfinite(out[live]).all() and out[~live].isnan().all()
    assert_bits_equal(out, want, "outputs")

def _copy_args(read_dtype=BF16, with_scale=False, **kw):
    args = _args(**kw)
    st = args["state"]
    args["read_state"] = torch.zeros(st.shape, device=DEVICE).to(read_dtype)
    args["read_scale"] = (torch.ones(st.shape[:-1], device=DEVICE) if with_scale else None)
    return args


BAD_COPY = {
    "copy-shape": (lambda: {**_copy_args(), "read_state": _copy_args()["read_state"][:, :1]},
                   "read_state"),
    "copy-dtype-fp32": (lambda: _copy_args(FP32), "read_state"),
    "copy-is-checkpoint-dtype": (lambda: {**_copy_args(), "state": _args()["state"].to(BF16)},
                                 "read_state"),
    "fp8-without-scale": (lambda: _copy_args(F8), "read_scale"),
    "scale-with-bf16": (lambda: _copy_args(BF16, with_scale=True), "read_scale"),
    "scale-shape": (lambda: {**_copy_args(F8, with_scale=True),
                             "read_scale": torch.ones(4, 4, 15, device=DEVICE)}, "read_scale"),
    "scale-dtype": (lambda: {**_copy_args(F8, with_scale=True),
                             "read_scale": torch.ones(4, 4, 16, device=DEVICE).double()},
                    "read_scale"),
    "scale-without-copy": (lambda: {**_args(), "read_scale": torch.ones(4, 4, 16, device=DEVICE)},
                           "read_scale"),
}  # fmt: skip


@pytest.mark.parametrize("op", ["kernel", "ref"])
@pytest.mark.parametrize("bad", list(BAD_COPY))
def test_split_value_errors(op, bad):
    make, match = BAD_COPY[bad]
    with pytest.raises(ValueError, match=match):
        OPS[op][0](**make(), scale=0.25)


SPLIT_GPU_CASES = [
    (Case(HV=32, Hk=16, K=128, V=128, L=16, T=2, requests=24, pad_rows=3, steps=30), BF16),
    (Case(HV=32, Hk=16, K=128, V=128, L=16, T=4, requests=24, pad_rows=3, noncontig=True,
          steps=30), F8),  # fmt: skip
    (Case(HV=32, Hk=16, K=128, V=128, L=16, T=4, requests=8, state_dtype=BF16,
          tol_state=2e-3), FP16),  # fmt: skip
]


@pytest.mark.gpu
@pytest.mark.parametrize("cr", SPLIT_GPU_CASES, ids=[_split_id(c) for c in SPLIT_GPU_CASES])
def test_gpu_qwen35_split_vs_f64(cr):
    """(1) at the Qwen3.5-4B shape: outputs vs float64, the copy after every flush, the fp32
    checkpoint bitwise vs ``gdn_replay_decode``'s fold (compiled code)."""
    _run_split("kernel", *cr, seed=15)


@pytest.mark.gpu
@pytest.mark.parametrize("T,rd", [(2, BF16), (4, F8)], ids=["T2-bf16", "T4-fp8"])
def test_gpu_qwen35_split_vs_ref_and_no_copy(T, rd):
    """(2) and (3) at the Qwen3.5-4B shape: kernel vs reference with the copy, and the flushed
    checkpoint bit-identical to the launch without a copy (compiled: two different kernels)."""
    case = Case(HV=32, Hk=16, K=128, V=128, L=16, T=T, act_dtype=FP32, u_dtype=FP32,
                requests=12, pad_rows=2, steps=10, decode_p=0.0, force_p=0.25)  # fmt: skip
    split_lockstep(case, rd, seed=16)


# ---------------------------------------------------------------------------------------------
# Codegen: the verify kernel's fold compiles (for sm_90, no GPU needed) to SGLang's update.

_CODEGEN_SCRIPT = r'''
import inspect, json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from replayssm_kernels.gdn_verify.fold import (
    gdn_verify_fold_kernel, gdn_verify_fold_read_kernel)
H, HV, K, V, R, T = 16, 32, 128, 128, 24, int(sys.argv[1])
TARGET = GPUTarget("cuda", 90, 32)
def build(kern, ptrs, ints, const, num_stages, nw=1):
    names = list(inspect.signature(kern.fn).parameters)
    sig, cx, attrs = {}, {}, {}
    for i, n in enumerate(names):
        if n in ptrs:
            sig[n] = ptrs[n]
            if ptrs[n].startswith("*"):
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif n in const:
            sig[n], cx[n] = "constexpr", const[n]
        elif ints[n] == 1:
            sig[n], cx[n] = "constexpr", 1
        else:
            sig[n] = "i32"
            if ints[n] % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=kern, signature=sig, constexprs=cx, attrs=attrs)
    return triton.compile(src, target=TARGET, options=dict(num_warps=nw, num_stages=num_stages))
D = 2 * H * K + HV * V
strides = dict(
    R=R, sr_layer=0, batch=255, stride_s_n=HV * V * K, stride_s_h=V * K, stride_s_v=K, stride_s_k=1,
    stride_u_n=HV * R * V, stride_u_h=R * V, stride_u_r=V, stride_u_v=1,
    stride_rk_n=H * R * K, stride_rk_h=R * K, stride_rk_r=K, stride_rk_k=1,
    stride_rv_n=HV * R * V, stride_rv_h=R * V, stride_rv_r=V, stride_rv_v=1,
    stride_g_n=HV * R, stride_g_h=R, stride_g_r=1, stride_beta_n=HV * R, stride_beta_h=R,
    stride_beta_r=1, stride_q_b=T * D, stride_q_t=D, stride_q_h=K, stride_q_k=1,
    stride_k_b=T * D, stride_k_t=D, stride_k_h=K, stride_k_k=1,
    stride_v_b=T * D, stride_v_t=D, stride_v_h=V, stride_v_v=1,
    stride_a_b=T * 2 * HV, stride_a_t=2 * HV, stride_a_h=1,
    stride_b_b=T * 2 * HV, stride_b_t=2 * HV, stride_b_h=1,
    stride_o_b=T * HV * V, stride_o_t=HV * V, stride_o_h=V, stride_o_v=1,
)
# RL = 0: the fold on SGLang's tile (the launch takes it for K > 128; K <= 128 folds in the decode
# kernel's tree form, whose codegen test_gdn_decode.py checks).
const = dict(H=H, HV=HV, K=K, V=V, T=T, BK=128, BV=32, RL=0, SOFTPLUS_THRESHOLD=20.0,
             USE_QK_L2NORM=True, sr_seed=None, SR=False, TILES=1, WORK_LIST=False, BLOCK_B=1,
             HEAD_ITEMS=4)
ptrs = dict(state="*fp32", ring_u="*fp32", ring_k="*bf16", ring_v="*bf16", ring_g="*fp32",
            ring_beta="*fp32", q="*bf16", k="*bf16", v="*bf16", a="*bf16", b="*bf16",
            A_log="*fp32", dt_bias="*fp32", o="*bf16", slot_idx="*i32", ring_start="*i32",
            ring_len="*i32", flush="*i1", scale="fp32")
k = build(gdn_verify_fold_kernel, ptrs, strides, const, 1)
# A program per value head (large batches): the head's V / BV tiles in turn.
k_head = build(gdn_verify_fold_kernel, ptrs, strides, dict(const, TILES=V // 32), 1)
# The work list (the default up to 1024 rows): two item loops, (row, head) and one-tile items.
k_work = build(gdn_verify_fold_kernel, ptrs, strides, dict(const, WORK_LIST=True, BLOCK_B=256), 1)
# With a split-precision read copy (bf16, fp8 + scales): the launch for read_state=...
rstr = dict(strides, stride_rd_n=HV * V * K, stride_rd_h=V * K, stride_rd_v=K, stride_rd_k=1,
            stride_rs_n=HV * V, stride_rs_h=V, stride_rs_v=1)
k_read = {rd: build(gdn_verify_fold_read_kernel,
                    dict(ptrs, read_ptr=f"*{rd}", read_scale_ptr="*fp32"), rstr,
                    dict(const, READ_FP8=rd == "fp8e4nv"), 1) for rd in ("bf16", "fp8e4nv")}

from sglang.kernels.ops.attention.fla.fused_recurrent import (
    fused_recurrent_gated_delta_rule_packed_decode_kernel as sg_kernel,
)
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
KEEP = re.compile(r"^(arith\.(mulf|addf|subf|divf|extf|truncf)|math\.\w+|\"tt\.reduce\"|"
                  r"tt\.reshape|ttg\.convert_layout|tt\.expand_dims|tt\.broadcast|tt\.splat|"
                  r"\}\) : \(tensor)")
def seq(txt, lo=0, hi=None):
    defs = dict(re.findall(r"^(#\w+) = (#ttg\.\w+<\{.*?\}>)", txt, re.M))
    out = []
    for line in txt.splitlines()[lo:hi]:
        line = re.sub(r"\s*loc\(.*$", "", line.strip())
        body = line.split(" = ", 1)[1] if line.startswith("%") and " = " in line else line
        if not KEEP.match(body) or "tensor<" not in body:
            continue
        if "ptr" in body or "xi32" in body or "xi1" in body:
            continue
        body = re.sub(r"#\w+", lambda m: defs.get(m.group(0), m.group(0)), body)
        out.append(re.sub(r"%[\w#]+(:\d+)?", "%", body))
    return out
def fold_bodies(txt):
    lines = txt.splitlines()
    out = []
    for i_for in (i for i, l in enumerate(lines) if "scf.for" in l and "iter_args(%b_h" in l):
        i_yield = next(i for i, l in enumerate(lines) if i > i_for and "scf.yield" in l)
        out.append(seq(txt, i_for, i_yield))
    return out
ours = fold_bodies(k.asm["ttgir"])[0]
read = {rd: fold_bodies(kr.asm["ttgir"])[0] for rd, kr in k_read.items()}
json.dump(dict(verify=ours, head=fold_bodies(k_head.asm["ttgir"])[0], sglang=seq(sg_c.asm["ttgir"]),
               read=read, work=fold_bodies(k_work.asm["ttgir"])), sys.stdout)
'''


def test_fold_codegen_matches_sglang():
    """Compile the verify's fold launch on SGLang's tile (``RL = 0``, taken for ``K > 128``) and
    SGLang's packed decode for sm_90a on any machine and compare the fold loop's TTGIR.

    The checkpoint is bitwise SGLang's only if every fp32 op of the fold compiles as in SGLang's
    kernel: the same ops in the same order on tensors of the same layouts (the layout fixes the
    reduction tree of every ``tl.sum``).  Each replayed record must be SGLang's step without the
    q / output ops; the same for the launch with a split-precision read copy (bf16, fp8), whose
    flush rows must fold as without it, for the launch with a program per value head
    (``TILES`` = V / BV) and for both item loops of the work-list launch (the default).  (The
    decode kernel folds in tree form, checked against SGLang's tree by ``test_gdn_decode.py``.)
    Qwen3.5-4B head shape, T = 2, bf16 activations, fp32 state.
    """
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", _CODEGEN_SCRIPT, "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    err = proc.stderr.lower()
    if proc.returncode != 0 and "nvidia" in err and "backend" in err:
        pytest.skip(f"no NVIDIA Triton backend: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    sg = got["sglang"]
    assert len(sg) == 39, "SGLang 0.5.17's packed decode step changed shape: re-derive the slices"
    # SGLang's step is: q, k loads [0:6), v load [6:8), q norm [8:13), k norm [13:18),
    # q * scale [18:20), the state update [20:33), the output [33:39).  A replayed record is the
    # same step without q and without the output.
    want = sg[3:8] + sg[13:18] + sg[20:33]
    assert got["verify"] == want, "verify fold loop differs from SGLang's packed-decode update"
    assert got["head"] == want, "fold loop with a program per value head differs"
    assert len(got["work"]) == 2, "the work list should compile two item loops"
    for body in got["work"]:
        assert body == want, "fold loop of the work-list launch differs"
    for rd, body in got["read"].items():
        assert body == want, f"verify fold loop with a {rd} read copy differs"


_WINDOW_CODEGEN_SCRIPT = r'''
import json, sys
import triton
sys.path.insert(0, sys.argv[3])  # the repository root (benchmarks/ is not an installed package)
from benchmarks.sweep_mamba2 import compile_sm90a, ptxas_stats
from replayssm_kernels.gdn_verify import kernel as gk
from replayssm_kernels.gdn_verify.window import gdn_verify_window_kernel
H, HV, K, V, T, read, BV = 16, 32, 128, 128, int(sys.argv[1]), sys.argv[2], int(sys.argv[4])
R, D = 16 + T, 2 * 16 * 128 + 32 * 128  # ring rows; the mixer's packed q / k / v row
ptrs = dict(state="*fp32", ring_u="*fp32", ring_k="*bf16", ring_v="*bf16", ring_g="*fp32",
            ring_beta="*fp32", q="*bf16", k="*bf16", v="*bf16", a="*bf16", b="*bf16",
            A_log="*fp32", dt_bias="*fp32", o="*bf16", slot_idx="*i32", ring_start="*i32",
            ring_len="*i32", flush="*i1", scale="fp32",
            read_ptr="constexpr" if read == "none" else f"*{read}",
            read_scale_ptr="*fp32" if read == "fp8e4nv" else "constexpr")
ints = dict(R=R, stride_s_n=HV * V * K, stride_s_h=V * K, stride_s_v=K, stride_s_k=1,
            stride_u_n=HV * R * V, stride_u_h=R * V, stride_u_r=V, stride_u_v=1,
            stride_rk_n=H * R * K, stride_rk_h=R * K, stride_rk_r=K, stride_rk_k=1,
            stride_rv_n=HV * R * V, stride_rv_h=R * V, stride_rv_r=V, stride_rv_v=1,
            stride_g_n=HV * R, stride_g_h=R, stride_g_r=1, stride_beta_n=HV * R,
            stride_beta_h=R, stride_beta_r=1, stride_q_b=T * D, stride_q_t=D, stride_q_h=K,
            stride_q_k=1, stride_k_b=T * D, stride_k_t=D, stride_k_h=K, stride_k_k=1,
            stride_v_b=T * D, stride_v_t=D, stride_v_h=V, stride_v_v=1,
            stride_a_b=T * HV, stride_a_t=HV, stride_a_h=1, stride_b_b=T * HV, stride_b_t=HV,
            stride_b_h=1, stride_o_b=T * HV * V, stride_o_t=HV * V, stride_o_h=V, stride_o_v=1,
            stride_rd_n=HV * V * K, stride_rd_h=V * K, stride_rd_v=K, stride_rd_k=1,
            stride_rs_n=HV * V, stride_rs_h=V, stride_rs_v=1)
const = dict(H=H, HV=HV, K=K, V=V, T=T, BK=K, BKC=gk.WINDOW_BLOCK_K, BV=BV,
             NX=max(16, triton.next_power_of_2(2 * T)), NH=16, LOG2T=(T - 1).bit_length(),
             SOFTPLUS_THRESHOLD=20.0, USE_QK_L2NORM=True, HAS_READ=read != "none",
             READ_FP8=read == "fp8e4nv", PRECISION="split")
c = compile_sm90a(gdn_verify_window_kernel, ptrs, ints, const,
                  dict(num_warps=gk.WINDOW_WARPS, num_stages=gk.WINDOW_STAGES))
json.dump(ptxas_stats(c.asm["ptx"]), sys.stdout)
'''


@pytest.mark.parametrize("T,read,bv", [(4, "none", 128), (8, "none", 128), (4, "bf16", 128),
                                       (4, "fp8e4nv", 128), (4, "none", 64), (8, "none", 64)])
def test_window_codegen_no_spills(T, read, bv):
    """The window launch at its default configurations (``kernel.WINDOW_*``; ``SMALL_BLOCK_V`` = 64
    for small batches) compiles for sm_90a
    without spills (offline ``ptxas -v``; Qwen3.5-4B head shape, bf16 activations, fp32 state,
    with and without a read copy).  The launch is register-bound (``benchmarks/RESULTS.md``,
    fourteenth session): a change that spills would undo its speed."""
    import json
    import os
    import pathlib
    import subprocess
    import sys

    root = str(pathlib.Path(__file__).resolve().parents[2])
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    args = [sys.executable, "-c", _WINDOW_CODEGEN_SCRIPT, str(T), read, root, str(bv)]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    err = proc.stderr.lower()
    if proc.returncode != 0 and "nvidia" in err and "backend" in err:
        pytest.skip(f"no NVIDIA Triton backend: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    px = json.loads(proc.stdout)
    print(f"[window codegen T{T} {read} BV{bv}] ptxas {px}")
    assert px["spill_st"] == 0 and px["spill_ld"] == 0, px
