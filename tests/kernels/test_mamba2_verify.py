"""Mamba-2 ReplaySSM verify (+ commit): kernel and reference vs the float64 conventional recurrence.

On CPU the Triton kernels run under the interpreter at small shapes; ``gpu``-marked tests rerun the
same driver at Nemotron-3-Nano-4B's shape on the H200.

The driver runs many steps on layer views of ``[layers, slots, ...]`` pools with padding rows and a
per-step row permutation. Each step is either a verify of ``T`` tokens (``verify_cursor_step`` →
``mamba2_replay_verify[_ref]`` → random accepted counts ``a`` (all-reject ``a = 1``, partial,
all-accept ``a = T``) → ``verify_commit[_ref]``) or a plain decode step (``decode_cursor_step`` →
``mamba2_replay_decode[_ref]``) on the same rings, with random forced flushes. A float64 shadow
state per slot only ever sees the accepted tokens. After every step, every ring row outside a live
slot's committed range ``[0, len)`` (rejected drafts, folded records) is overwritten with NaN, so
a read of one would poison an output or a checkpoint. After every call:

- outputs (NaN-poisoned before) are fully written; padding rows stay NaN;
- every window output ``out[b, t]`` equals the float64 recurrence from the shadow over window
  tokens ``0..t`` (relative L2, printed as ``[mamba2-verify]`` lines with ``pytest -s``); so the
  outputs of accepted tokens are right, and rejected drafts of earlier steps had no effect;
- flushed checkpoints match the shadow (float64) and, for fp32 state, are **bit-identical** to
  SGLang's ``selective_state_update`` run token by token over the accepted tokens only;
- every pool byte outside the allowed rows (flush rows' checkpoints, the ``T`` window rows) is
  bit-identical; appended records equal the inputs exactly (x, B) and Δ to f64 within fp32.

With a split-precision read copy (``read_dtype``: bf16 / fp16 / fp8 e4m3 beside the fp32 or 16-bit
checkpoint, refreshed for every slot before the first step) decode and verify both get it; after
every flush (decode or verify) the copy, and the fp8 scales, are bit-identical to
``quantize_rows`` of the checkpoint as stored, and no other byte of the copy's allocations moves.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re

import numpy as np
import pytest
import torch
from test_mamba2_decode import (  # same pools, parameters and helpers as the decode tests
    Shape,
    _bits_equal,
    _rebase,
    _rel,
    make_params,
    make_pool,
    sglang_ssu,
)

from test_split_precision_mamba2 import F8, _bad_read_cases, make_read_copy

from replayssm_kernels import (
    decode_cursor_step,
    mamba2_conventional_f64,
    mamba2_replay_decode,
    mamba2_replay_decode_ref,
    mamba2_replay_verify,
    mamba2_replay_verify_ref,
    min_ring_size,
    verify_commit,
    verify_commit_ref,
    verify_cursor_step,
)
from replayssm_kernels.mamba2_decode.read_copy import dequantize_rows, quantize_rows

pytestmark = pytest.mark.usefixtures("interpreter_bf16_rtne")

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"


def mamba2_replay_verify_dot(*args, **kw) -> None:
    """``mamba2_replay_verify`` with the tensor-core implementation (``kernel.py``) forced, as
    ``bench_verify --mamba2-verify-impl dot`` forces it: ``launch_config`` returns the ``dot``
    configuration for the duration of the call."""
    import replayssm_kernels.mamba2_verify.kernel as k

    orig = k.launch_config
    k.launch_config = functools.partial(orig, impl="dot")
    try:
        mamba2_replay_verify(*args, **kw)
    finally:
        k.launch_config = orig


# "kernel": the default (FMA, fma.py) implementation; "dot": the tensor-core kernel of the same
# contract.
VERIFY = {"kernel": mamba2_replay_verify, "dot": mamba2_replay_verify_dot,
          "ref": mamba2_replay_verify_ref}
DECODE = {"kernel": mamba2_replay_decode, "dot": mamba2_replay_decode,
          "ref": mamba2_replay_decode_ref}
COMMIT = {"kernel": verify_commit, "dot": verify_commit, "ref": verify_commit_ref}

SHAPE_A = Shape(H=6, G=3, P=20, N=16)  # P=20: a full 16-row tile + a masked tile
SHAPE_B = Shape(H=3, G=1, P=12, N=16)  # H=3, P=12: non-powers of two, one masked tile
SHAPE_C = Shape(H=5, G=5, P=24, N=8)
NANO_4B = Shape(H=96, G=8, P=80, N=128)

OUT_TOL = {torch.bfloat16: 3e-3, torch.float32: 2e-5}
STATE_TOL = {torch.float32: 2e-5, torch.bfloat16: 5e-3}
# Outputs with a read copy, vs float64, by (copy, activation) dtype: one rounding of S0 (bf16
# 2^-9, fp16 2^-12, e4m3 2^-4 relative per element, at most) on the S0·Q term, plus the bf16
# output store (~1.5e-3) with bf16 activations.
READ_OUT_TOL = {(torch.bfloat16, torch.bfloat16): 3e-3, (torch.float16, torch.bfloat16): 3e-3,
                (F8, torch.bfloat16): 2e-2, (torch.bfloat16, torch.float32): 2e-3,
                (torch.float16, torch.float32): 3e-4, (F8, torch.float32): 2e-2}
SHAPE_RC = Shape(H=2, G=1, P=20, N=48)  # two P-tiles and two N-chunks (BLOCK_K 32), last masked


@dataclasses.dataclass
class Tokens:
    x: torch.Tensor  # [batch, T, H, P]
    dt: torch.Tensor  # [batch, T, H] raw
    B: torch.Tensor  # [batch, T, G, N]
    C: torch.Tensor
    z: torch.Tensor | None


def make_tokens(shape: Shape, batch: int, T: int, act_dtype, gen, device, with_z) -> Tokens:
    """T tokens per row in the mixer's layout: x, B, C column slices of one conv row per token."""
    H, G, P, N = shape.H, shape.G, shape.P, shape.N
    x = torch.randn(batch, T, H, P, generator=gen)
    dt = torch.randn(batch, T, H, generator=gen) * 0.7
    dt[:, :, 0] += torch.randn(batch, T, generator=gen)  # head 0 straddles softplus' threshold
    B = torch.randn(batch, T, G, N, generator=gen) / math.sqrt(N)
    C = torch.randn(batch, T, G, N, generator=gen)
    z = torch.randn(batch, T, H, P, generator=gen) if with_z else None
    hp, gn = H * P, G * N
    xBC = torch.cat([x.reshape(batch, T, hp), B.reshape(batch, T, gn), C.reshape(batch, T, gn)],
                    dim=2).to(device=device, dtype=act_dtype)
    proj = torch.cat([torch.zeros(batch, T, 3), dt], dim=2).to(device=device, dtype=act_dtype)
    return Tokens(
        xBC[..., :hp].view(batch, T, H, P), proj[..., 3:],
        xBC[..., hp: hp + gn].view(batch, T, G, N), xBC[..., hp + gn:].view(batch, T, G, N),
        None if z is None else z.to(device=device, dtype=act_dtype),
    )


def _delta64(dt_row: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    d = dt_row.double() + dt_bias.double()
    return torch.where(d <= 20, torch.log1p(torch.exp(d.clamp(max=20))), d)


def _poison_dead_rows(pool, cursors: torch.Tensor, slots: list[int], R: int) -> None:
    """NaN into every ring row outside each live slot's committed range ``[0, len)``: rejected
    drafts and records already folded. A later read of one poisons an output or a checkpoint."""
    cur = cursors.cpu().tolist()
    for s in slots:
        start, n = cur[s]
        dead = [(start + r) % R for r in range(n, R)]
        if dead:
            idx = torch.tensor(dead, device=cursors.device)
            for t in (pool.ring_x, pool.ring_dt, pool.ring_B):
                t[s].index_fill_(1, idx, float("nan"))


@dataclasses.dataclass
class Report:
    out_rel: float
    state_rel: float
    verify_flush: int
    verify_nonflush: int
    decode_rows: int
    a_kinds: set
    max_flush_len: int = 0  # the longest history a verify flush row folded


def run_spec(
    impl: str, shape: Shape, T: int, L: int, state_dtype, act_dtype, *, steps: int = 24,
    active: int = 3, pads: int = 1, decode_p: float = 0.2, force_p: float = 0.1, seed: int = 0,
    broadcast: bool = True, with_z: bool = False, sglang_check: bool = False,
    commit_impl: str | None = None, ring_extra: int = 1, device: str = DEVICE,
    read_dtype: torch.dtype | None = None, read_layout: str = "layer", late: bool = False,
) -> Report:
    """``late``: ``verify_cursor_step``'s late rule (flush when ``len + T > max(L, T) + T``) on a
    ring ``T`` rows longer, so a flush row's window never meets its history."""
    gen = torch.Generator().manual_seed(seed)
    H, G, P, N = shape.H, shape.G, shape.P, shape.N
    R = min_ring_size(L, T) + (T if late else 0) + ring_extra
    slots = active + 3  # slot 0 (null) and two never-scheduled slots stay untouched
    prm = make_params(shape, gen, device)
    pool = make_pool(shape, slots, R, state_dtype, act_dtype, "layer", gen, device)
    rc = None if read_dtype is None else make_read_copy(pool.state, read_dtype, read_layout)
    rkw = {} if rc is None else dict(read_state=rc.read, read_scale=rc.scale)
    full = pool.full + (() if rc is None else rc.full)
    views = (pool.state, pool.ring_x, pool.ring_dt, pool.ring_B) + (
        () if rc is None else (rc.read, rc.scale))
    names = ("state", "ring_x", "ring_dt", "ring_B", "read", "scale")
    cursors = torch.zeros(slots, 2, dtype=torch.int32, device=device)
    act = (torch.randperm(slots - 1, generator=gen)[:active] + 1).tolist()
    shadow = {s: pool.state[s].double().clone() for s in act}
    sg_state = pool.state.clone().contiguous() if sglang_check else None
    commit = COMMIT[commit_impl or impl]
    if broadcast:
        A = prm.A[:, None, None].expand(-1, P, N)
        D = prm.D[:, None].expand(-1, P)
        dt_bias = prm.dt_bias[:, None].expand(-1, P)
    else:
        A, D, dt_bias = prm.A, prm.D, prm.dt_bias
    batch = active + pads
    outs, refs, st_got, st_ref = [], [], [], []
    rep = Report(0.0, 0.0, 0, 0, 0, set())

    def sg_advance(tok: Tokens, rows_cpu, counts):
        """SGLang's selective_state_update, token by token, over each row's first counts[b]."""
        for t in range(max(counts)):
            idx = torch.tensor([s if s >= 0 and counts[b] > t else -1
                                for b, s in enumerate(rows_cpu)], dtype=torch.int32,
                               device=device)
            sglang_ssu(sg_state, tok.x[:, t], tok.dt[:, t, :, None].expand(-1, -1, P),
                   prm.A[:, None, None].expand(-1, P, N), tok.B[:, t], tok.C[:, t],
                   D=prm.D[:, None].expand(-1, P), z=None if tok.z is None else tok.z[:, t],
                   dt_bias=prm.dt_bias[:, None].expand(-1, P), dt_softplus=True,
                   state_batch_indices=idx, out=torch.empty_like(tok.x[:, t]))

    for _ in range(steps):
        rows = torch.tensor(act + [-1] * pads)[torch.randperm(batch, generator=gen)]
        rows_cpu = rows.tolist()
        slot_idx = rows.to(device=device, dtype=torch.int32)
        force = (torch.rand(batch, generator=gen) < force_p).to(device)
        rs = torch.empty(batch, dtype=torch.int32, device=device)
        rl = torch.empty_like(rs)
        fl = torch.empty(batch, dtype=torch.bool, device=device)
        is_decode = torch.rand(1, generator=gen).item() < decode_p
        Tt = 1 if is_decode else T
        tok = make_tokens(shape, batch, Tt, act_dtype, gen, device, with_z)
        dt_arg = tok.dt[..., None].expand(*tok.dt.shape, P) if broadcast else tok.dt
        out = torch.full((batch, Tt, H, P), float("nan"), dtype=act_dtype, device=device)
        before = tuple(t.clone() for t in full)
        state_before = pool.state.clone()
        if is_decode:
            decode_cursor_step(cursors, slot_idx, force, L, R, rs, rl, fl)
            DECODE[impl](pool.state, pool.ring_x, pool.ring_dt, pool.ring_B, tok.x[:, 0],
                         dt_arg[:, 0], A, tok.B[:, 0], tok.C[:, 0], out[:, 0], slot_idx, rs, rl,
                         fl, D=D, z=None if tok.z is None else tok.z[:, 0], dt_bias=dt_bias,
                         dt_softplus=True, **rkw)
            acc = [1] * batch
        else:
            verify_cursor_step(cursors, slot_idx, force, L, R, T, rs, rl, fl, late_flush=late)
            VERIFY[impl](pool.state, pool.ring_x, pool.ring_dt, pool.ring_B, tok.x, dt_arg, A,
                         tok.B, tok.C, out, slot_idx, rs, rl, fl, D=D, z=tok.z, dt_bias=dt_bias,
                         dt_softplus=True, **rkw)
            a = torch.randint(1, T + 1, (batch,), generator=gen)
            u = torch.rand(batch, generator=gen)
            a[u < 0.3] = 1  # all-reject
            a[u > 0.7] = T  # all-accept
            acc = a.tolist()
        # Flushed checkpoints: decode folds history + token; verify folds the history only.
        if sg_state is not None and not is_decode:
            for b, s in enumerate(rows_cpu):
                if s >= 0 and bool(fl[b]):
                    assert _bits_equal(pool.state[s], sg_state[s]), (
                        f"slot {s}: verify-flush checkpoint != selective_state_update "
                        f"(max |diff| {(pool.state[s] - sg_state[s]).abs().max().item():.3e})")
        if sg_state is not None:
            sg_advance(tok, rows_cpu, [acc[b] if s >= 0 else 0 for b, s in enumerate(rows_cpu)])
        if sg_state is not None and is_decode:
            for b, s in enumerate(rows_cpu):
                if s >= 0 and bool(fl[b]):
                    assert _bits_equal(pool.state[s], sg_state[s]), f"slot {s}: decode flush"

        exp_full = [t.clone() for t in before]
        exp = {k: _rebase(v, exp_full[i]) for i, (k, v) in enumerate(zip(names, views))
               if v is not None}
        for b, s in enumerate(rows_cpu):
            if s < 0:
                assert torch.isnan(out[b]).all(), f"padding row {b}: out written"
                continue
            assert not torch.isnan(out[b]).any(), f"row {b}: out not fully written"
            o64, _ = mamba2_conventional_f64(
                shadow[s], tok.x[b], tok.dt[b], prm.A, tok.B[b], tok.C[b], D=prm.D,
                z=None if tok.z is None else tok.z[b], dt_bias=prm.dt_bias, dt_softplus=True)
            outs.append(out[b].double().cpu())
            refs.append(o64.cpu())
            n = acc[b]
            _, s_acc = mamba2_conventional_f64(
                shadow[s], tok.x[b, :n], tok.dt[b, :n], prm.A, tok.B[b, :n], tok.C[b, :n],
                dt_bias=prm.dt_bias, dt_softplus=True)
            if bool(fl[b]):
                folded = s_acc if is_decode else shadow[s]
                st_got.append(pool.state[s].double().cpu())
                st_ref.append(folded.cpu())
                exp["state"][s] = pool.state[s]
                if rc is not None:  # the refreshed copy: round(checkpoint as stored), bitwise
                    q, scale = quantize_rows(pool.state[s], read_dtype)
                    assert _bits_equal(rc.read[s], q), f"slot {s}: read copy != round(checkpoint)"
                    exp["read"][s] = rc.read[s]
                    if scale is not None:
                        assert _bits_equal(rc.scale[s], scale), f"slot {s}: fp8 scales differ"
                        exp["scale"][s] = rc.scale[s]
            else:
                assert _bits_equal(pool.state[s], state_before[s]), "non-flush row wrote state"
            shadow[s] = s_acc
            if is_decode:
                rep.decode_rows += 1
                if bool(fl[b]):
                    continue  # a decode flush appends nothing
            else:
                rep.verify_flush += bool(fl[b])
                if bool(fl[b]):
                    rep.max_flush_len = max(rep.max_flush_len, int(rl[b]))
                rep.verify_nonflush += not bool(fl[b])
                rep.a_kinds.add("reject" if n == 1 else "accept" if n == T else "partial")
            for t in range(Tt):
                r = (int(rs[b]) + int(rl[b]) + t) % R
                assert torch.equal(pool.ring_x[s, :, r], tok.x[b, t]), "ring_x record != x"
                assert torch.equal(pool.ring_B[s, :, r], tok.B[b, t]), "ring_B record != B"
                torch.testing.assert_close(pool.ring_dt[s, :, r].double(),
                                           _delta64(tok.dt[b, t], prm.dt_bias), rtol=2e-6,
                                           atol=3e-7)
                for k in names[1:4]:
                    exp[k][s, :, r] = getattr(pool, k)[s, :, r]
        for name, got, want in zip(names, full, exp_full):
            assert _bits_equal(got, want), f"{name} pool: bytes outside the allowed rows changed"
        if not is_decode:
            commit(cursors, slot_idx, rs, rl, fl, torch.tensor(acc, device=device), window=L,
                   ring_size=R, num_tokens=T)
        _poison_dead_rows(pool, cursors, act, R)

    rep.out_rel = _rel(torch.cat([o.flatten() for o in outs]),
                       torch.cat([r.flatten() for r in refs]))
    rep.state_rel = _rel(torch.stack(st_got), torch.stack(st_ref)) if st_got else 0.0
    read = "" if read_dtype is None else f" read={str(read_dtype)[6:]}/{read_layout}"
    print(f"\n[mamba2-verify] {impl} {shape} T={T} L={L} R={R} state={str(state_dtype)[6:]} "
          f"act={str(act_dtype)[6:]}{read}: |out-f64|/|f64| = {rep.out_rel:.2e}, "
          f"|S-f64|/|f64| = {rep.state_rel:.2e} ({rep.verify_flush} flush / "
          f"{rep.verify_nonflush} non-flush verify rows, {rep.decode_rows} decode rows, "
          f"a: {sorted(rep.a_kinds)})")
    return rep


def _check(rep: Report, state_dtype, act_dtype, T: int, read_dtype=None) -> None:
    assert rep.verify_flush > 0 and rep.verify_nonflush > 0 and rep.decode_rows > 0, rep
    tol = OUT_TOL[act_dtype] if read_dtype is None else READ_OUT_TOL[read_dtype, act_dtype]
    assert rep.out_rel < tol, rep
    assert rep.state_rel < STATE_TOL[state_dtype], rep
    if T > 1:
        assert {"reject", "accept"} <= rep.a_kinds, rep
    if T > 2:
        assert "partial" in rep.a_kinds, rep


# --------------------------------------------------------------------------------------------
# CPU tests
# --------------------------------------------------------------------------------------------


# The tensor-core implementation ("dot", not the default) at the ends of the T range only: it is
# pinned to the FMA kernel bitwise (checkpoints, rings, copies) by test_fma_bitwise_vs_dot, and the
# H200 runs it at T = 2, 4, 8 on the Nano-4B shape (test_gpu_nano4b_dot_*).
SPEC_CASES = [(T, impl) for T in (1, 2, 4, 8) for impl in ("kernel", "dot", "ref")
              if impl != "dot" or T in (2, 8)]


@pytest.mark.parametrize("T,impl", [(T, i) for T in (2, 4) for i in ("kernel", "ref")])
def test_spec_steps_late_rule_vs_f64(impl, T):
    """The late flush rule on a ring of ``max(L, T) + 2T`` rows: histories up to ``max(L, T)``,
    flush rows folding more than ``L`` records (asserted), the window beside the history; flushed
    checkpoints bit-identical to SGLang's selective_state_update over the accepted tokens."""
    L = {2: 6, 4: 8}[T]
    rep = run_spec(impl, SHAPE_B, T, L, torch.float32, torch.bfloat16, seed=10 + T, steps=24,
                   sglang_check=(impl != "ref"), late=True, ring_extra=0, decode_p=0.1)
    _check(rep, torch.float32, torch.bfloat16, T)
    assert rep.max_flush_len > L, rep  # past the early rule's longest flush history (L)


@pytest.mark.parametrize("T,impl", SPEC_CASES, ids=[f"T{t}-{i}" for t, i in SPEC_CASES])
def test_spec_steps_vs_f64(impl, T):
    """fp32 checkpoint, bf16 activations; the kernels' flushed checkpoints bit-identical to
    SGLang's selective_state_update over the accepted tokens."""
    L = {1: 4, 2: 6, 4: 8, 8: 12}[T]
    shape = SHAPE_A if T <= 2 else SHAPE_B
    rep = run_spec(impl, shape, T, L, torch.float32, torch.bfloat16, seed=T, steps=20,
                   with_z=(T == 2), sglang_check=(impl != "ref"))
    _check(rep, torch.float32, torch.bfloat16, T)


@pytest.mark.parametrize("impl", ["kernel", "dot", "ref"])
def test_spec_bf16_state_headform(impl):
    rep = run_spec(impl, SHAPE_C, 4, 6, torch.bfloat16, torch.bfloat16, seed=11, steps=20,
                   broadcast=False, with_z=True, pads=2)
    _check(rep, torch.bfloat16, torch.bfloat16, 4)


@pytest.mark.parametrize("impl", ["kernel", "dot", "ref"])
def test_spec_fp32_activations(impl):
    rep = run_spec(impl, SHAPE_B, 4, 8, torch.float32, torch.float32, seed=5, steps=20,
                   force_p=0.2)
    _check(rep, torch.float32, torch.float32, 4)


@pytest.fixture
def dot_precisions(monkeypatch):
    """Count the interpreter's ``tl.dot`` calls by ``input_precision`` name."""
    from triton.runtime import interpreter

    orig = interpreter.InterpreterBuilder.create_dot
    seen: dict[str, int] = {}

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        seen[input_precision.name] = seen.get(input_precision.name, 0) + 1
        return orig(self, a, b, d, input_precision, max_num_imprecise_acc)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)
    return seen


@pytest.mark.skipif(HAS_CUDA, reason="inspects the interpreter's tl.dot calls")
@pytest.mark.parametrize("act_dtype,expected", [(torch.bfloat16, {"TF32"}),
                                                (torch.float32, {"TF32x3"})])
def test_product_precision_follows_the_activation_dtype(dot_precisions, act_dtype, expected):
    """16-bit activations: plain tf32 products only (the fp32 operand is split by hand, see
    launch_config); fp32 activations: tf32x3 on every product. Outputs within the tolerance."""
    shape = Shape(H=2, G=1, P=16, N=128)
    rep = run_spec("dot", shape, 8, 12, torch.float32, act_dtype, seed=8, steps=12, active=2,
                   sglang_check=True)
    assert set(dot_precisions) == expected, dot_precisions
    _check(rep, torch.float32, act_dtype, 8)


def _round_tf32(a: np.ndarray) -> np.ndarray:
    """fp32 -> tf32 (10 mantissa bits), round to nearest even, as the tensor cores' operands."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    bias = ((bits >> 13) & 1) + np.uint32(0xFFF)
    return ((bits + bias) & np.uint32(0xFFFFE000)).view(np.float32)


@pytest.mark.skipif(HAS_CUDA, reason="emulates tensor-core operand rounding in the interpreter")
def test_split_products_keep_fp32_accuracy_under_tf32_rounding(monkeypatch):
    """With every tf32 operand rounded as the tensor cores round it, the bf16-activation launch
    (fp32 checkpoint, fp32 outputs) stays within 1e-6 of the same launch with exact products;
    without the split (``_tf32_split`` returning ``(a, 0)``: plain tf32 on the fp32 operands) the
    same emulation is far off, so the check can fail."""
    import replayssm_kernels.mamba2_verify.kernel as k
    from triton.runtime import interpreter

    shape, T, L = Shape(H=2, G=1, P=16, N=128), 4, 8
    R = min_ring_size(L, T)
    orig_dot = interpreter.InterpreterBuilder.create_dot

    def tf32_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        assert input_precision.name == "TF32", input_precision.name
        a2 = interpreter.TensorHandle(_round_tf32(a.data), a.dtype.scalar)
        b2 = interpreter.TensorHandle(_round_tf32(b.data), b.dtype.scalar)
        return orig_dot(self, a2, b2, d, input_precision, max_num_imprecise_acc)

    def launch(emulate: bool, split: bool) -> torch.Tensor:
        gen = torch.Generator().manual_seed(4)
        prm = make_params(shape, gen, DEVICE)
        pool = make_pool(shape, 5, R, torch.float32, torch.bfloat16, "layer",
                         torch.Generator().manual_seed(9), DEVICE)
        pool.full[0].normal_(generator=torch.Generator().manual_seed(5))  # a busy checkpoint
        pool.full[1].normal_(generator=torch.Generator().manual_seed(1))
        pool.full[2].uniform_(0.01, 0.5, generator=torch.Generator().manual_seed(2))
        pool.full[3].normal_(generator=torch.Generator().manual_seed(3))
        tok = make_tokens(shape, 3, T, torch.bfloat16, gen, DEVICE, True)
        out = torch.full((3, T, shape.H, shape.P), float("nan"), device=DEVICE)
        with monkeypatch.context() as m:
            if emulate:
                m.setattr(interpreter.InterpreterBuilder, "create_dot", tf32_dot)
            if not split:
                m.setattr(k, "_tf32_split", lambda a: (a, a * 0.0))
            mamba2_replay_verify_dot(
                pool.state, pool.ring_x, pool.ring_dt, pool.ring_B, tok.x, tok.dt, prm.A, tok.B,
                tok.C, out, torch.tensor([3, 1, 4], dtype=torch.int32),
                torch.tensor([5, 9, 2], dtype=torch.int32),
                torch.tensor([2, 6, 0], dtype=torch.int32),
                torch.tensor([False, False, False]), D=prm.D, z=None, dt_bias=prm.dt_bias,
                dt_softplus=True)
        return out

    exact = launch(False, True)
    split = _rel(launch(True, True), exact)
    plain = _rel(launch(True, False), exact)
    print(f"\n[mamba2-verify] emulated tf32 products vs exact: split {split:.2e}, plain {plain:.2e}")
    assert split < 1e-6, split
    assert plain > 30 * max(split, 1e-8), (split, plain)


@pytest.mark.parametrize("impl", ["kernel", "dot"])
def test_kernel_vs_reference_outputs(impl):
    """Kernel and reference on identical inputs and pools (fp32): outputs within fp32 rounding,
    records exact; checkpoints and Δ within an ulp or so (torch's exp/log vs the interpreter's
    numpy; the kernel's fold is checked bitwise against SGLang's kernel elsewhere)."""
    shape, T, L = SHAPE_A, 4, 6
    gen = torch.Generator().manual_seed(3)
    R = min_ring_size(L, T)
    prm = make_params(shape, gen, DEVICE)
    pools = [make_pool(shape, 5, R, torch.float32, torch.float32, "layer",
                       torch.Generator().manual_seed(9), DEVICE) for _ in range(2)]
    for p in pools:  # fill the rings with committed history
        p.full[1].normal_(generator=torch.Generator().manual_seed(1))
        p.full[2].uniform_(0.01, 0.5, generator=torch.Generator().manual_seed(2))
        p.full[3].normal_(generator=torch.Generator().manual_seed(3))
    tok = make_tokens(shape, 4, T, torch.float32, gen, DEVICE, True)
    slot_idx = torch.tensor([3, -1, 1, 4], dtype=torch.int32, device=DEVICE)
    rs = torch.tensor([5, 0, 9, 2], dtype=torch.int32, device=DEVICE)
    rl = torch.tensor([2, 0, 6, 0], dtype=torch.int32, device=DEVICE)
    fl = torch.tensor([False, False, True, True], device=DEVICE)
    outs = []
    for which, p in zip((impl, "ref"), pools):
        out = torch.full((4, T, shape.H, shape.P), float("nan"), device=DEVICE)
        VERIFY[which](p.state, p.ring_x, p.ring_dt, p.ring_B, tok.x, tok.dt, prm.A, tok.B, tok.C,
                     out, slot_idx, rs, rl, fl, D=prm.D, z=tok.z, dt_bias=prm.dt_bias,
                     dt_softplus=True)
        outs.append(out)
    live = slot_idx.cpu() >= 0
    rel = _rel(outs[0][live], outs[1][live])
    print(f"\n[mamba2-verify] {impl} vs ref (fp32): {rel:.2e}")
    assert rel < 1e-6
    assert torch.isnan(outs[0][1]).all() and torch.isnan(outs[1][1]).all()
    for name, a, b in zip(("state", "ring_x", "ring_dt", "ring_B"), pools[0].full, pools[1].full):
        if name in ("state", "ring_dt"):  # exp/log: numpy (interpreter) vs torch, an ulp apart
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, equal_nan=True)
        else:
            assert _bits_equal(a, b), name


@pytest.mark.parametrize("impl", ["dot", "fma"])
def test_kernel_small_fold_unroll(monkeypatch, impl):
    """FOLD_UNROLL = 3 and BLOCK_P = 16 at P = 40 (three tiles, the last half masked): fold chunk
    remainders and tile masks, still bit-identical to SGLang (both implementations)."""
    import replayssm_kernels.mamba2_verify.kernel as k

    orig = k.mamba2_replay_verify_fwd
    monkeypatch.setattr(k, "mamba2_replay_verify_fwd",
                        lambda *a, **kw: orig(*a, **kw, block_p=16, fold_unroll=3, impl=impl))
    rep = run_spec("kernel", Shape(H=2, G=1, P=40, N=16), 2, 7, torch.float32, torch.bfloat16,
                   seed=21, steps=16, active=2, sglang_check=True)
    _check(rep, torch.float32, torch.bfloat16, 2)


def test_empty_batch_is_a_no_op():
    shape = SHAPE_A
    gen = torch.Generator().manual_seed(0)
    pool = make_pool(shape, 3, 8, torch.float32, torch.bfloat16, "layer", gen, DEVICE)
    before = [t.clone() for t in pool.full]
    prm = make_params(shape, gen, DEVICE)
    tok = make_tokens(shape, 0, 4, torch.bfloat16, gen, DEVICE, False)
    e = torch.empty(0, dtype=torch.int32, device=DEVICE)
    out = torch.empty(0, 4, shape.H, shape.P, dtype=torch.bfloat16, device=DEVICE)
    mamba2_replay_verify(pool.state, pool.ring_x, pool.ring_dt, pool.ring_B, tok.x, tok.dt, prm.A,
                         tok.B, tok.C, out, e, e, e, e.bool(), dt_bias=prm.dt_bias,
                         dt_softplus=True)
    assert all(_bits_equal(a, b) for a, b in zip(before, pool.full))


# --------------------------------------------------------------------------------------------
# Against SGLang's snapshot verify (selective_state_update with intermediate_states_buffer)
# --------------------------------------------------------------------------------------------


def snapshot_compare(shape: Shape, T: int, L: int, act_dtype, *, batch: int, seed: int,
                     device: str = DEVICE, impl: str = "kernel") -> dict:
    """One verify step of ours against SGLang 0.5.17's snapshot verify on the same request states.

    Rows get random committed histories (``len`` in ``[0, max(L, T)]``, random ring starts, records
    in the ring) and flush iff ``len + T > L`` or forced. SGLang's side: the history replayed token
    by token into a copy of the checkpoint by ``selective_state_update`` (processed Δ as ``dt``,
    no softplus, a zero ``dt_bias``: the same update as the fold), then one verify call exactly as
    ``MambaMixer2.forward`` makes it (``disable_state_update=True``, ``intermediate_states_buffer``
    ``[batch, T, H, P, N]``, ``cache_steps=T``, ``intermediate_state_indices=arange``). Returns the
    relative output difference and checks: flush rows' checkpoints bit-identical to SGLang's state
    after the history (fp32), every other checkpoint untouched, SGLang's verify left its state
    alone, the padding row's output untouched.
    """
    gen = torch.Generator().manual_seed(seed)
    H, G, P, N = shape.H, shape.G, shape.P, shape.N
    R = min_ring_size(L, T)
    slots = batch + 2
    prm = make_params(shape, gen, device)
    pool = make_pool(shape, slots, R, torch.float32, act_dtype, "layer", gen, device)
    live = (torch.randperm(slots - 1, generator=gen)[:batch] + 1).tolist()
    hmax = max(L, T)
    h = torch.randint(0, hmax + 1, (batch,), generator=gen)
    h[0], h[-1] = 0, hmax  # an empty ring and a full one
    forced = torch.rand(batch, generator=gen) < 0.2
    forced[0] = False  # row 0 (empty ring) flushes only if it must
    flush = (h + T > L) | forced
    start = torch.randint(0, R, (batch,), generator=gen)
    hx = torch.randn(batch, hmax, H, P, generator=gen).to(device=device, dtype=act_dtype)
    hB = (torch.randn(batch, hmax, G, N, generator=gen) / math.sqrt(N)).to(device=device,
                                                                            dtype=act_dtype)
    hdt = _delta64(torch.randn(batch, hmax, H, generator=gen) * 0.7,
                   prm.dt_bias.cpu()).float().to(device)
    for b, s in enumerate(live):
        for j in range(int(h[b])):
            r = (int(start[b]) + j) % R
            pool.ring_x[s, :, r] = hx[b, j]
            pool.ring_dt[s, :, r] = hdt[b, j]
            pool.ring_B[s, :, r] = hB[b, j]
    sg_state = pool.state.clone().contiguous()
    A_d = prm.A[:, None, None].expand(-1, P, N)
    zero_bias = torch.zeros(H, device=device)[:, None].expand(-1, P)
    for j in range(hmax):  # SGLang's state after each row's history
        idx = torch.tensor([s if int(h[b]) > j else -1 for b, s in enumerate(live)],
                           dtype=torch.int32, device=device)
        sglang_ssu(sg_state, hx[:, j], hdt[:, j, :, None].expand(-1, -1, P), A_d, hB[:, j],
                   hB[:, j], D=zero_bias, z=None, dt_bias=zero_bias, dt_softplus=False,
                   state_batch_indices=idx, out=torch.empty_like(hx[:, j]))
    hist_state = sg_state.clone()

    tok = make_tokens(shape, batch + 1, T, act_dtype, gen, device, False)  # last row: padding
    rows = live + [-1]
    slot_idx = torch.tensor(rows, dtype=torch.int32, device=device)
    pad = lambda t, v: torch.cat([t, torch.tensor([v])]).to(device)  # noqa: E731
    rs, rl = pad(start, 0).int(), pad(h, 0).int()
    fl = pad(flush, False).bool()
    out = torch.full((batch + 1, T, H, P), float("nan"), dtype=act_dtype, device=device)
    state_before = pool.state.clone()
    VERIFY[impl](pool.state, pool.ring_x, pool.ring_dt, pool.ring_B, tok.x,
                 tok.dt[..., None].expand(-1, -1, -1, P), A_d, tok.B, tok.C, out, slot_idx, rs,
                 rl, fl, D=prm.D[:, None].expand(-1, P), z=None,
                 dt_bias=prm.dt_bias[:, None].expand(-1, P), dt_softplus=True)
    # SGLang's snapshot verify, as MambaMixer2.forward calls it in TARGET_VERIFY
    out_sg = torch.full((batch, T, H, P), float("nan"), dtype=act_dtype, device=device)
    buf = torch.zeros(batch, T, H, P, N, dtype=torch.float32, device=device)
    sglang_ssu(sg_state, tok.x[:batch], tok.dt[:batch, ..., None].expand(-1, -1, -1, P), A_d,
               tok.B[:batch], tok.C[:batch], prm.D[:, None].expand(-1, P), z=None,
               dt_bias=prm.dt_bias[:, None].expand(-1, P), dt_softplus=True,
               state_batch_indices=slot_idx[:batch], out=out_sg, disable_state_update=True,
               intermediate_states_buffer=buf, cache_steps=T,
               intermediate_state_indices=torch.arange(batch, dtype=torch.int32, device=device))
    assert _bits_equal(sg_state, hist_state), "SGLang's verify wrote its state"
    assert torch.isnan(out[batch]).all(), "padding row written"
    assert not torch.isnan(out[:batch]).any() and not torch.isnan(out_sg).any()
    for b, s in enumerate(live):
        if bool(flush[b]):
            assert _bits_equal(pool.state[s], hist_state[s]), f"row {b}: folded checkpoint"
        else:
            assert _bits_equal(pool.state[s], state_before[s]), f"row {b}: state written"
    others = [s for s in range(slots) if s not in live]
    assert _bits_equal(pool.state[others], state_before[others]), "untouched slots written"
    # The last intermediate state is the state after the whole window: check the buffer is real.
    assert torch.isfinite(buf).all()
    res = {"out_rel": _rel(out[:batch], out_sg), "flush_rows": int(flush.sum()),
           "nonflush_rows": int((~flush).sum())}
    print(f"\n[mamba2-verify vs sglang snapshot] {impl} {shape} T={T} L={L} "
          f"act={str(act_dtype)[6:]}: "
          f"|out-sglang|/|sglang| = {res['out_rel']:.2e} ({res['flush_rows']} flush / "
          f"{res['nonflush_rows']} non-flush rows)")
    return res


SNAPSHOT_TOL = {torch.bfloat16: 6e-3, torch.float32: 2e-5}  # two independent bf16 stores


@pytest.mark.parametrize("impl", ["kernel", "dot"])
@pytest.mark.parametrize("T,act", [(2, torch.bfloat16), (4, torch.float32)], ids=["T2", "T4-fp32"])
def test_outputs_vs_sglang_snapshot_verify(T, act, impl):
    res = snapshot_compare(SHAPE_A, T, 6, act, batch=4, seed=40 + T, impl=impl)
    assert res["flush_rows"] > 0 and res["nonflush_rows"] > 0
    assert res["out_rel"] < SNAPSHOT_TOL[act], res


# --------------------------------------------------------------------------------------------
# Split precision: a read copy beside the checkpoint (non-flush rows read it, flush rows refresh it)
# --------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("interpreter_fp16_fp8_rtne")
@pytest.mark.parametrize(
    "impl,T,read_dtype,state_dtype,act_dtype,layout",
    [("kernel", 2, torch.bfloat16, torch.float32, torch.bfloat16, "layer"),
     ("kernel", 4, torch.float16, torch.float32, torch.float32, "permuted"),
     ("kernel", 4, F8, torch.float32, torch.bfloat16, "layer"),
     ("kernel", 2, F8, torch.bfloat16, torch.float32, "permuted"),
     ("dot", 2, torch.bfloat16, torch.float32, torch.bfloat16, "layer"),
     ("dot", 4, F8, torch.float32, torch.bfloat16, "layer"),
     ("dot", 2, F8, torch.bfloat16, torch.float32, "permuted"),
     ("ref", 4, torch.bfloat16, torch.float32, torch.bfloat16, "layer"),
     ("ref", 2, F8, torch.bfloat16, torch.float32, "permuted")],
    ids=["kernel-T2-bf16", "kernel-T4-fp16-act32-permuted", "kernel-T4-fp8",
         "kernel-T2-fp8-S-bf16-act32-permuted", "dot-T2-bf16", "dot-T4-fp8",
         "dot-T2-fp8-S-bf16-act32-permuted", "ref-T4-bf16", "ref-T2-fp8-S-bf16-act32"],
)
def test_spec_read_copy_vs_f64(impl, T, read_dtype, state_dtype, act_dtype, layout):
    """Verify and decode steps with a read copy, random accepted counts and forced flushes:
    outputs vs float64 within one rounding of S0; after every flush the copy (and fp8 scales)
    bitwise ``quantize_rows`` of the stored checkpoint; no other byte of the copy moves."""
    rep = run_spec(impl, SHAPE_RC, T, 2 * T + 2, state_dtype, act_dtype, seed=60 + T, steps=14,
                   active=2, with_z=(T == 2), read_dtype=read_dtype, read_layout=layout)
    _check(rep, state_dtype, act_dtype, T, read_dtype)


def _fill_rings(pool, seed: int) -> None:
    """Committed-looking history in every ring row (x, B normal; Δ in [0.01, 0.5])."""
    for i, t in enumerate(pool.full[1:], start=1):
        g = torch.Generator().manual_seed(seed + i)
        v = torch.rand(t.shape, generator=g) * 0.49 + 0.01 if i == 2 else torch.randn(
            t.shape, generator=g)
        t.copy_(v)


def _one_verify(impl: str, read_dtype, *, shape: Shape = SHAPE_RC, T: int = 4, L: int = 6,
                state_dtype=torch.float32, act_dtype=torch.float32, out_dtype=None,
                flush: bool = True, state: str = "keep", pass_copy: bool = True, seed: int = 3,
                device: str = DEVICE):
    """One verify launch on a pool with history: rows ``[3, -1, 1, 4, 2]`` are non-flush (len 2),
    padding, flush (len 6; non-flush if ``flush`` is false), flush (len 0; idem), non-flush
    (len 5). ``read_dtype``: a read copy (permuted strides, fp8 scales inside a padded
    allocation) refreshed from the checkpoint, passed iff ``pass_copy``. ``state``: ``"nan"``
    NaN-fills the checkpoint after the refresh, ``"copy"`` sets it to the copy's values.
    ``out_dtype`` defaults to ``act_dtype``. Returns ``(pool, copy, out, flush)``."""
    gen = torch.Generator().manual_seed(seed)
    R = min_ring_size(L, T)
    prm = make_params(shape, gen, device)
    pool = make_pool(shape, 6, R, state_dtype, act_dtype, "layer", gen, device)
    _fill_rings(pool, seed)
    rc = None if read_dtype is None else make_read_copy(pool.state, read_dtype, "permuted")
    if state == "nan":
        pool.state.fill_(float("nan"))
    elif state == "copy":
        pool.state.copy_(dequantize_rows(rc.read, rc.scale))
    rkw = dict(read_state=rc.read, read_scale=rc.scale) if rc is not None and pass_copy else {}
    tok = make_tokens(shape, 5, T, act_dtype, gen, device, True)
    slot_idx = torch.tensor([3, -1, 1, 4, 2], dtype=torch.int32, device=device)
    rs = torch.tensor([5, 0, 9, 2, 7], dtype=torch.int32, device=device)
    rl = torch.tensor([2, 0, 6, 0, 5], dtype=torch.int32, device=device)
    fl = torch.tensor([False, False, flush, flush, False], device=device)
    out = torch.full((5, T, shape.H, shape.P), float("nan"), dtype=out_dtype or act_dtype,
                     device=device)
    VERIFY[impl](pool.state, pool.ring_x, pool.ring_dt, pool.ring_B, tok.x, tok.dt, prm.A, tok.B,
                 tok.C, out, slot_idx, rs, rl, fl, D=prm.D, z=tok.z, dt_bias=prm.dt_bias,
                 dt_softplus=True, **rkw)
    return pool, rc, out, fl


def _assert_copy_is_rounded_checkpoint(pool, rc) -> None:
    """Every slot's copy (and fp8 scales) is bitwise ``quantize_rows`` of its checkpoint: flush
    rows refreshed it, every other slot kept the initial refresh."""
    q, scale = quantize_rows(pool.state, rc.read.dtype)
    assert _bits_equal(rc.read, q), "read copy != round(checkpoint as stored)"
    if scale is not None:
        assert _bits_equal(rc.scale, scale), "fp8 scales != quantize_rows' scales"


def _assert_kernel_matches_reference(read_dtype, impl: str = "kernel", **kw) -> float:
    """Kernel and reference on identical inputs with a read copy (fp32 activations): outputs
    within fp32 rounding, records bitwise, checkpoints and Δ within an ulp (exp / log of the
    interpreter's numpy or the GPU vs torch), copies rounded from their own checkpoints and
    within one copy ulp (relative) of each other, plus the checkpoints' own 1e-6 absolute
    tolerance: two checkpoint values of ~1e-6 that differ within it may round to copies more
    than one relative ulp apart (2 of 5.9M elements on the H200, 0.82% at ~1.8e-6). Returns the
    relative output difference."""
    (kp, krc, kout, _), (rp, rrc, rout, _) = (_one_verify(i, read_dtype, **kw)
                                              for i in (impl, "ref"))
    assert torch.isnan(kout[1]).all() and torch.isnan(rout[1]).all(), "padding row written"
    live = torch.tensor([True, False, True, True, True], device=kout.device)
    assert not torch.isnan(kout[live]).any(), "kernel: outputs not fully written"
    rel = _rel(kout[live], rout[live])
    for name, a, b in zip(("state", "ring_x", "ring_dt", "ring_B"), kp.full, rp.full):
        if name in ("state", "ring_dt"):  # atol: an ulp or two of the O(1) checkpoint values
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, equal_nan=True)
        else:
            assert _bits_equal(a, b), name
    for p, rc in ((kp, krc), (rp, rrc)):
        _assert_copy_is_rounded_checkpoint(p, rc)
    ulp = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, F8: 2.0**-3}[read_dtype]
    torch.testing.assert_close(dequantize_rows(krc.read, krc.scale),
                               dequantize_rows(rrc.read, rrc.scale), rtol=ulp, atol=1e-6)
    return rel


@pytest.mark.usefixtures("interpreter_fp16_fp8_rtne")
@pytest.mark.parametrize("impl", ["kernel", "dot"])
@pytest.mark.parametrize("read_dtype", [torch.bfloat16, F8], ids=["bf16", "fp8"])
def test_read_copy_kernel_vs_reference(read_dtype, impl):
    rel = _assert_kernel_matches_reference(read_dtype, impl)
    print(f"\n[mamba2-verify] {impl} vs ref, read copy {str(read_dtype)[6:]} (fp32): {rel:.2e}")
    assert rel < 1e-6, rel


def _assert_flush_rows_match_no_copy(read_dtype, impl: str = "kernel", **kw) -> float:
    """The kernel with and without a read copy on identical inputs: checkpoints (the whole
    allocation), rings and the flush rows' outputs bitwise equal; the copy refreshed. Returns the
    non-flush rows' relative output difference (the copy's rounding of S0)."""
    (cp, crc, cout, fl), (np_, _, nout, _) = (
        _one_verify(impl, read_dtype, pass_copy=pc, **kw) for pc in (True, False))
    for name, a, b in zip(("state", "ring_x", "ring_dt", "ring_B"), cp.full, np_.full):
        assert _bits_equal(a, b), f"{name}: differs from the launch without a copy"
    assert _bits_equal(cout[fl], nout[fl]), "flush rows' outputs differ from the no-copy launch"
    _assert_copy_is_rounded_checkpoint(cp, crc)
    nonflush = ~fl & torch.tensor([True, False, True, True, True], device=fl.device)
    return _rel(cout[nonflush], nout[nonflush])


@pytest.mark.usefixtures("interpreter_fp16_fp8_rtne")
@pytest.mark.parametrize("read_dtype,state_dtype", [(torch.bfloat16, torch.float32),
                                                    (F8, torch.float32),
                                                    (torch.float16, torch.bfloat16)],
                         ids=["bf16-S32", "fp8-S32", "fp16-S-bf16"])
@pytest.mark.parametrize("impl", ["kernel", "dot"])
def test_read_copy_flush_rows_bit_identical_to_no_copy(read_dtype, state_dtype, impl):
    rel = _assert_flush_rows_match_no_copy(read_dtype, impl, state_dtype=state_dtype)
    print(f"\n[mamba2-verify] {impl}: read copy {str(read_dtype)[6:]} vs none, state "
          f"{str(state_dtype)[6:]}: non-flush outputs {rel:.2e}")
    assert rel < READ_OUT_TOL[read_dtype, torch.float32], rel
    # An fp16 copy of a bf16 checkpoint holds the same values: the FMA kernel's ("kernel", the
    # default) products are then the same fp32 operations (0); the tensor-core kernel ("dot")
    # takes another product split.
    exact = impl == "kernel" and (read_dtype, state_dtype) == (torch.float16, torch.bfloat16)
    assert (rel == 0) if exact else (rel > 0), rel


@pytest.mark.usefixtures("interpreter_fp16_fp8_rtne")
@pytest.mark.parametrize("impl", ["kernel", "dot", "ref"])
def test_read_copy_nonflush_rows_never_read_the_checkpoint(impl):
    """With NaN in every checkpoint, non-flush rows still give finite outputs, equal to the same
    launch without a copy from a checkpoint holding the copy's values (fp8: scaled)."""
    _, _, out, _ = _one_verify(impl, F8, flush=False, state="nan")
    _, _, want, _ = _one_verify("ref", F8, flush=False, state="copy", pass_copy=False)
    live = torch.tensor([True, False, True, True, True])
    assert torch.isfinite(out[live]).all()
    assert torch.isnan(out[1]).all()
    assert _rel(out[live], want[live]) < 1e-6, _rel(out[live], want[live])


@pytest.mark.skipif(HAS_CUDA, reason="counts and rounds the interpreter's tl.dot operands")
def test_read_copy_products_are_single_tf32(monkeypatch):
    """Non-flush rows with a bf16 copy and bf16 activations: one tf32 product per N-chunk for
    S0·Q instead of the split's two (both operands exact in tf32), and with every tf32 operand
    rounded as the tensor cores round it the (fp32) outputs stay within 1e-6 of exact products."""
    from triton.runtime import interpreter

    orig_dot = interpreter.InterpreterBuilder.create_dot
    calls = []

    def counting_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        calls.append(input_precision.name)
        return orig_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    def tf32_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        a2 = interpreter.TensorHandle(_round_tf32(a.data), a.dtype.scalar)
        b2 = interpreter.TensorHandle(_round_tf32(b.data), b.dtype.scalar)
        return orig_dot(self, a2, b2, d, input_precision, max_num_imprecise_acc)

    counts, outs = {}, {}
    for copy, dot in ((False, counting_dot), (True, counting_dot), (True, tf32_dot)):
        calls.clear()
        with monkeypatch.context() as m:
            m.setattr(interpreter.InterpreterBuilder, "create_dot", dot)
            _, _, out, _ = _one_verify("dot", torch.bfloat16 if copy else None,
                                       act_dtype=torch.bfloat16, out_dtype=torch.float32,
                                       flush=False)
        if dot is counting_dot:
            assert set(calls) == {"TF32"}, calls
            counts[copy] = len(calls)
        outs[copy, dot is tf32_dot] = out
    rows, n_pt, n_nk = 4, 2, 2  # live rows; SHAPE_RC: 2 P-tiles, 2 N-chunks
    assert counts[False] - counts[True] == rows * SHAPE_RC.H * n_pt * n_nk, counts
    live = torch.tensor([True, False, True, True, True])
    err = _rel(outs[True, True][live], outs[True, False][live])
    print(f"\n[mamba2-verify] read copy, emulated tf32 operands vs exact: {err:.2e}")
    assert err < 1e-6, err


@pytest.mark.usefixtures("interpreter_fp16_fp8_rtne")
@pytest.mark.parametrize("impl", ["kernel", "dot"])
@pytest.mark.parametrize("read_dtype", [F8, torch.bfloat16], ids=["fp8", "bf16"])
def test_read_copy_refresh_extremes(read_dtype, impl):
    """Flush rows whose checkpoint rows are zero, tiny (1e-30), huge (1e30), or whose max lies in
    the second (masked) N-chunk only: the copy and fp8 scales bit-identical to ``quantize_rows``
    of the stored checkpoint (A = 0 and x = 0 keep the checkpoint's values through the fold)."""
    shape, T = SHAPE_RC, 2
    gen = torch.Generator().manual_seed(9)
    slots, R = 3, 4
    state = torch.randn(slots, shape.H, shape.P, shape.N, generator=gen)
    state[1, 0, :4] = 0.0
    state[1, 0, 4:8] *= 1e-30
    state[1, 1, :4] *= 1e30
    state[1, 1, 4:8, :32] = 0.0  # the row max in the last, half-masked chunk (columns 32..47)
    state[1, 1, 8:12, 40] = 1e20
    state[2, 0, 17:, :32] *= 1e-30
    state = state.to(DEVICE)
    rc = make_read_copy(state, read_dtype, "permuted")
    rc.read.fill_(float("nan"))
    ring_x = torch.zeros(slots, shape.H, R, shape.P, dtype=torch.bfloat16, device=DEVICE)
    ring_dt = torch.full((slots, shape.H, R), 0.1, device=DEVICE)
    ring_B = torch.randn(slots, shape.G, R, shape.N, generator=gen).to(DEVICE, torch.bfloat16)
    batch = 2
    x = torch.zeros(batch, T, shape.H, shape.P, dtype=torch.bfloat16, device=DEVICE)
    B = torch.randn(batch, T, shape.G, shape.N, generator=gen).to(DEVICE, torch.bfloat16)
    C = torch.randn(batch, T, shape.G, shape.N, generator=gen).to(DEVICE, torch.bfloat16)
    dt = torch.full((batch, T, shape.H), 0.1, device=DEVICE)
    out = torch.empty(batch, T, shape.H, shape.P, device=DEVICE)
    idx = torch.tensor([1, 2], dtype=torch.int32, device=DEVICE)
    rs = torch.tensor([3, 0], dtype=torch.int32, device=DEVICE)
    rl = torch.tensor([2, 1], dtype=torch.int32, device=DEVICE)
    before = state.clone()
    VERIFY[impl](state, ring_x, ring_dt, ring_B, x, dt, torch.zeros(shape.H, device=DEVICE), B,
                 C, out, idx, rs, rl, torch.ones(batch, dtype=torch.bool, device=DEVICE),
                 read_state=rc.read, read_scale=rc.scale)
    assert torch.equal(state, before)  # values kept
    q, scale = quantize_rows(state[1:], read_dtype)
    assert _bits_equal(rc.read[1:], q)
    if scale is not None:
        assert _bits_equal(rc.scale[1:], scale)
        assert (scale[0, 0, :4] == 2.0**-126).all()  # zero rows: the floor scale, zeros stored


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _valid_args(T: int = 4, batch: int = 2, R: int = 8):
    shape = SHAPE_A
    gen = torch.Generator().manual_seed(1)
    pool = make_pool(shape, 4, R, torch.float32, torch.bfloat16, "layer", gen, DEVICE)
    prm = make_params(shape, gen, DEVICE)
    tok = make_tokens(shape, batch, T, torch.bfloat16, gen, DEVICE, True)
    zeros = torch.zeros(batch, dtype=torch.int32, device=DEVICE)
    args = dict(
        state=pool.state, ring_x=pool.ring_x, ring_dt=pool.ring_dt, ring_B=pool.ring_B, x=tok.x,
        dt=tok.dt, A=prm.A, B=tok.B, C=tok.C,
        out=torch.empty(batch, T, shape.H, shape.P, dtype=torch.bfloat16, device=DEVICE),
        slot_idx=torch.arange(1, batch + 1, dtype=torch.int32, device=DEVICE), ring_start=zeros,
        ring_len=zeros.clone(), flush=torch.zeros(batch, dtype=torch.bool, device=DEVICE),
    )
    return args, dict(D=prm.D, z=tok.z, dt_bias=prm.dt_bias, dt_softplus=True)


def _bad_cases():
    H, P, N = SHAPE_A.H, SHAPE_A.P, SHAPE_A.N
    return {
        "x-3d": ("x", lambda a: a["x"][:, 0], "x"),
        "x-T0": ("x", lambda a: a["x"][:, :0], "x"),
        "x-wrong-P": ("x", lambda a: a["x"][..., :-1], "x"),
        "dt-T-mismatch": ("dt", lambda a: a["dt"][:, :2], "dt"),
        "dt-untied": ("dt", lambda a: torch.zeros(2, 4, H, P, dtype=torch.bfloat16), "untied"),
        "B-3d": ("B", lambda a: a["B"][:, 0], "B"),
        "C-T-mismatch": ("C", lambda a: a["C"][:, :3], "C"),
        "out-T-mismatch": ("out", lambda a: a["out"][:, :3], "out"),
        "ring-too-short": ("ring_x", lambda a: a["ring_x"][:, :, :3], "ring_x"),
        "ring_x-dtype": ("ring_x", lambda a: a["ring_x"].float(), "ring_x"),
        "ring_B-R-mismatch": ("ring_B", lambda a: a["ring_B"][:, :, :-1], "ring_B"),
        "A-untied": ("A", lambda a: torch.zeros(H, P, N), "untied"),
        "state-int": ("state", lambda a: a["state"].to(torch.int32), "state"),
        "flush-int": ("flush", lambda a: a["flush"].int(), "flush"),
        "slot_idx-float": ("slot_idx", lambda a: a["slot_idx"].float(), "slot_idx"),
        "device-mix": ("C", lambda a: a["C"].to("meta"), "device"),
        "slot_idx-strided": ("slot_idx", lambda a: a["slot_idx"].repeat_interleave(2)[::2], "stride 1"),
        "ring_start-strided": ("ring_start", lambda a: a["ring_start"].repeat_interleave(2)[::2], "stride 1"),
        "flush-strided": ("flush", lambda a: a["flush"].repeat_interleave(2)[::2], "stride 1"),
        "out-overlapping": ("out", lambda a: a["out"][:1].expand_as(a["out"]), "stride-0"),
    }


@pytest.mark.parametrize("impl", ["kernel", "dot", "ref"])
@pytest.mark.parametrize("case", list(_bad_cases()))
def test_value_errors(impl, case):
    args, kw = _valid_args()
    name, mutate, match = _bad_cases()[case]
    args[name] = mutate(args)
    with pytest.raises(ValueError, match=match):
        VERIFY[impl](*args.values(), **kw)


@pytest.mark.parametrize("impl", ["kernel", "dot", "ref"])
def test_value_error_z_window(impl):
    args, kw = _valid_args()
    kw["z"] = kw["z"][:, :2]
    with pytest.raises(ValueError, match="z"):
        VERIFY[impl](*args.values(), **kw)


@pytest.mark.parametrize("impl", ["kernel", "dot", "ref"])
@pytest.mark.parametrize("case", list(_bad_read_cases()))
def test_value_errors_read_copy(impl, case):
    """The decode kernel's read-copy cases (shape, dtype, the checkpoint's own dtype, fp8 without
    or with bad scales, scales without fp8, device) on verify's arguments."""
    read_dtype, mutate, match = _bad_read_cases()[case]
    args, kw = _valid_args()
    st = args["state"]
    kw["read_state"] = torch.zeros(st.shape, dtype=read_dtype, device=st.device)
    kw["read_scale"] = torch.ones(st.shape[:-1], device=st.device) if read_dtype == F8 else None
    mutate(args, kw)
    with pytest.raises(ValueError, match=match):
        VERIFY[impl](*args.values(), **kw)


# --------------------------------------------------------------------------------------------
# Small-batch P-split: the split launch is bit-identical to the unsplit one
# --------------------------------------------------------------------------------------------

SHAPE_SPLIT = Shape(H=4, G=2, P=80, N=16)  # P=80: five 16-row tiles (splits 1, 2, 3, 5)


@pytest.fixture
def force_p_split(monkeypatch):
    """``set(s)`` makes every following verify launch split each head over ``s`` programs
    (``None``: the fixed rule, which is ``1`` off CUDA)."""
    import replayssm_kernels.mamba2_verify.kernel as k

    rule = k.p_split_rule
    forced: list[int | None] = [None]
    monkeypatch.setattr(k, "p_split_rule",
                        lambda *a: rule(*a) if forced[0] is None else forced[0])
    return lambda s: forced.__setitem__(0, s)


def split_lockstep(set_split, splits, *, shape: Shape = SHAPE_SPLIT, T: int = 4, L: int = 6,
                   state_dtype=torch.float32, act_dtype=torch.bfloat16, read_dtype=None,
                   sr: bool = False, active: int = 3, pads: int = 1, steps: int = 6,
                   seed: int = 0, device: str = DEVICE, impls: list[str] | None = None,
                   out_rtol: float = 0.0) -> dict:
    """The verify driver once per entry of ``splits`` (``None``: the fixed rule) on identical
    pools, cursors and inputs, in lockstep: random rows (padding ``-1`` included), forced
    flushes, random accepted counts (commit kernel). After every step the outputs (NaN-poisoned
    before; padding rows must stay NaN), every byte of the pools (checkpoint, rings, read copy
    and scales) and the cursors must be bitwise equal to the first entry's. ``impls`` gives each
    run's implementation (``VERIFY`` key; default ``"kernel"`` for all); ``out_rtol > 0`` checks
    the outputs to that relative L2 difference instead of bitwise (two implementations). Returns
    counts of the rows seen and the largest relative output difference (``out_rel``)."""
    gen = torch.Generator().manual_seed(seed)
    R = min_ring_size(L, T) + 1
    slots = active + 3  # slot 0 and two never-scheduled slots: untouched (checked bitwise)
    prm = make_params(shape, gen, device)
    runs = []
    impls = impls or ["kernel"] * len(splits)
    for _ in splits:
        pool = make_pool(shape, slots, R, state_dtype, act_dtype, "layer",
                         torch.Generator().manual_seed(seed + 1), device)
        _fill_rings(pool, seed)
        rc = None if read_dtype is None else make_read_copy(pool.state, read_dtype, "permuted")
        full = pool.full + (() if rc is None else rc.full)
        rkw = {} if rc is None else dict(read_state=rc.read, read_scale=rc.scale)
        if sr:
            rkw["sr_seed"] = torch.tensor([1234], dtype=torch.int64, device=device)
            rkw["sr_layer"] = 3
        cursors = torch.zeros(slots, 2, dtype=torch.int32, device=device)
        runs.append((pool, full, rkw, cursors))
    act = (torch.randperm(slots - 1, generator=gen)[:active] + 1).tolist()
    for s in act:  # committed history already in the ring at random cursors
        for _, _, _, cursors in runs:
            cursors[s, 0] = (7 * s) % R
            cursors[s, 1] = (3 * s) % (L + 1)
    batch = active + pads
    seen = {"flush": 0, "nonflush": 0, "pad": 0, "out_rel": 0.0}
    for _ in range(steps):
        rows = torch.tensor(act + [-1] * pads)[torch.randperm(batch, generator=gen)]
        slot_idx = rows.to(device=device, dtype=torch.int32)
        force = (torch.rand(batch, generator=gen) < 0.2).to(device)
        tok = make_tokens(shape, batch, T, act_dtype, gen, device, True)
        acc = torch.randint(1, T + 1, (batch,), generator=gen).to(device)
        got = []
        for split, impl, (pool, full, rkw, cursors) in zip(splits, impls, runs):
            rs = torch.empty(batch, dtype=torch.int32, device=device)
            rl = torch.empty_like(rs)
            fl = torch.empty(batch, dtype=torch.bool, device=device)
            verify_cursor_step(cursors, slot_idx, force, L, R, T, rs, rl, fl)
            out = torch.full((batch, T, shape.H, shape.P), float("nan"), dtype=act_dtype,
                             device=device)
            set_split(split)
            VERIFY[impl](pool.state, pool.ring_x, pool.ring_dt, pool.ring_B, tok.x, tok.dt,
                         prm.A, tok.B, tok.C, out, slot_idx, rs, rl, fl, D=prm.D, z=tok.z,
                         dt_bias=prm.dt_bias, dt_softplus=True, **rkw)
            set_split(None)
            verify_commit(cursors, slot_idx, rs, rl, fl, acc, window=L, ring_size=R,
                          num_tokens=T)
            got.append((out, full, cursors, fl))
        out0, full0, cur0, fl0 = got[0]
        live = slot_idx >= 0
        assert torch.isnan(out0[~live]).all(), "padding row written"
        assert not torch.isnan(out0[live]).any(), "outputs not fully written"
        for split, (out, full, cur, fl) in zip(splits[1:], got[1:]):
            if out_rtol:
                assert torch.isnan(out[~live]).all(), f"p_split={split}: padding row written"
                rel = _rel(out[live], out0[live])
                seen["out_rel"] = max(seen["out_rel"], rel)
                assert rel < out_rtol, f"p_split={split}: outputs {rel:.2e} from the first run"
            else:
                assert _bits_equal(out, out0), f"p_split={split}: outputs differ from unsplit"
            assert torch.equal(fl, fl0) and torch.equal(cur, cur0), f"p_split={split}: cursors"
            for i, (a, b) in enumerate(zip(full, full0)):
                assert _bits_equal(a, b), f"p_split={split}: pool tensor {i} differs"
        seen["flush"] += int((fl0 & live).sum())
        seen["nonflush"] += int((~fl0 & live).sum())
        seen["pad"] += int((~live).sum())
    assert seen["flush"] and seen["nonflush"] and (seen["pad"] or not pads), seen
    return seen


def test_p_split_rule_at_nano4b_verify():
    """The decode kernel's rule, shared: 96 heads x 5 tiles of 16 rows on 132 SMs."""
    from replayssm_kernels.mamba2_decode.kernel import p_split_rule

    import replayssm_kernels.mamba2_verify.kernel as k

    assert k.p_split_rule is p_split_rule  # imported, not copied
    n_tiles = -(-NANO_4B.P // k.launch_config(80, 128, 20, 4, torch.bfloat16).block_p)
    assert n_tiles == 5
    assert [p_split_rule(n_tiles, 96, b, 132) for b in (1, 2, 4, 5, 6, 8, 64)] == [
        5, 3, 2, 2, 1, 1, 1]
    assert p_split_rule(n_tiles, 96, 1, None) == 1  # off CUDA: unsplit


SPLIT_T_CASES = [(T, impl) for T in (1, 2, 4, 8) for impl in ("kernel", "dot")
                 if impl == "kernel" or T in (1, 8)]  # "dot": see SPEC_CASES


@pytest.mark.parametrize("T,impl", SPLIT_T_CASES, ids=[f"T{t}-{i}" for t, i in SPLIT_T_CASES])
def test_split_launch_bitwise_vs_unsplit(force_p_split, T, impl):
    """Splits 2, 3 and 5 of five P-tiles (the last split with one tile per program, the middle
    one with a short last program): outputs, checkpoints, rings and cursors bitwise equal to
    the unsplit launch over several steps with flush, non-flush and padding rows."""
    split_lockstep(force_p_split, [1, 2, 3, 5], T=T, L=max(6, T + 4), seed=40 + T,
                   steps=3, impls=[impl] * 4)


@pytest.mark.usefixtures("interpreter_fp16_fp8_rtne")
@pytest.mark.parametrize("read_dtype,state_dtype,sr", [
    (F8, torch.float32, False), (torch.bfloat16, torch.float32, False),
    (None, torch.float16, True), (F8, torch.float16, True)],
    ids=["fp8-copy", "bf16-copy", "fp16-SR", "fp8-copy-fp16-SR"])
@pytest.mark.parametrize("impl", ["kernel", "dot"])
def test_split_launch_bitwise_vs_unsplit_read_copy_and_sr(force_p_split, read_dtype,
                                                          state_dtype, sr, impl):
    """The fp8 copy's row max stays inside one program (a program owns whole P rows, all N
    columns), so the split keeps the copy, its scales and the SR checkpoint bitwise too."""
    split_lockstep(force_p_split, [1, 5, 2], shape=Shape(H=2, G=1, P=80, N=48),
                   state_dtype=state_dtype, act_dtype=torch.float32, read_dtype=read_dtype,
                   sr=sr, seed=60, steps=4, impls=[impl] * 3)


def test_split_launch_vs_f64_and_sglang(force_p_split):
    """The full driver (float64 shadow, SGLang's fold bitwise, NaN-poisoned dead ring rows and
    outputs, untouched slots and bytes, padding rows) with every verify launch split 3 ways."""
    force_p_split(3)
    rep = run_spec("kernel", Shape(H=2, G=1, P=80, N=16), 4, 6, torch.float32, torch.bfloat16,
                   seed=33, steps=12, active=2, pads=1, sglang_check=True, with_z=True)
    _check(rep, torch.float32, torch.bfloat16, 4)


def test_p_split_value_error():
    import replayssm_kernels.mamba2_verify.kernel as k

    gen = torch.Generator().manual_seed(0)
    pool = make_pool(SHAPE_SPLIT, 3, 12, torch.float32, torch.bfloat16, "layer", gen, DEVICE)
    prm = make_params(SHAPE_SPLIT, gen, DEVICE)
    tok = make_tokens(SHAPE_SPLIT, 1, 4, torch.bfloat16, gen, DEVICE, False)
    i = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    out = torch.empty(1, 4, SHAPE_SPLIT.H, SHAPE_SPLIT.P, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match=r"p_split: expected one of \[1, 2, 3, 5\].*got 4"):
        k.mamba2_replay_verify_fwd(
            pool.state, pool.ring_x, pool.ring_dt, pool.ring_B, tok.x, tok.dt, prm.A, tok.B,
            tok.C, out, i + 1, i, i, i.bool(), D=None, z=None, dt_bias=prm.dt_bias,
            dt_softplus=True, stride_dt=tuple(tok.dt.stride()), stride_A_head=1,
            stride_D=(0, 0), stride_dt_bias_head=1, p_split=4)


# --------------------------------------------------------------------------------------------
# The FMA implementation (fma.py) in lockstep with the tensor-core kernel
# --------------------------------------------------------------------------------------------

# Outputs of the two implementations on identical inputs: each within OUT_TOL of float64, so
# apart by at most about twice that (bf16: independent output roundings).
FMA_VS_DOT_TOL = {torch.bfloat16: 2 * OUT_TOL[torch.bfloat16], torch.float32: 1e-5}
SHAPE_FMA = Shape(H=4, G=2, P=20, N=48)  # two P-tiles (last masked), N masked in its tile


@pytest.mark.usefixtures("interpreter_fp16_fp8_rtne")
@pytest.mark.parametrize("T,read_dtype,state_dtype,act_dtype,sr", [
    (2, None, torch.float32, torch.bfloat16, False),
    (8, None, torch.float32, torch.float32, False),
    (4, torch.bfloat16, torch.float32, torch.bfloat16, False),
    (4, F8, torch.float32, torch.float32, False),
    (2, None, torch.float16, torch.float32, True),
    (4, F8, torch.float16, torch.bfloat16, True)],
    ids=["T2", "T8-act32", "T4-bf16-copy", "T4-fp8-copy-act32", "T2-fp16-SR",
         "T4-fp8-copy-fp16-SR"])
def test_fma_bitwise_vs_dot(T, read_dtype, state_dtype, act_dtype, sr):
    """Both implementations on identical pools and inputs over several verify steps (flush,
    non-flush and padding rows, random accepted counts): flushed checkpoints (SR ones too), ring
    records, read copies and fp8 scales bit-identical after every step, every other byte
    untouched alike; outputs within ``FMA_VS_DOT_TOL``."""
    seen = split_lockstep(lambda s: None, [None, None], shape=SHAPE_FMA, T=T, L=T + 4,
                          state_dtype=state_dtype, act_dtype=act_dtype, read_dtype=read_dtype,
                          sr=sr, seed=70 + T, steps=5, impls=["dot", "kernel"],
                          out_rtol=FMA_VS_DOT_TOL[act_dtype])
    print(f"\n[mamba2-verify] fma vs dot T={T} copy={str(read_dtype)[6:]} "
          f"state={str(state_dtype)[6:]} act={str(act_dtype)[6:]} SR={sr}: outputs "
          f"{seen['out_rel']:.2e}, checkpoints / rings / copies bitwise ({seen['flush']} flush, "
          f"{seen['nonflush']} non-flush rows)")


def test_fma_impl_selection():
    """``launch_config`` picks the FMA implementation unless asked; unknown names raise."""
    import replayssm_kernels.mamba2_verify.kernel as k

    assert k.launch_config(80, 128, 24, 4, torch.bfloat16).impl == "fma"
    cfg = k.launch_config(80, 128, 24, 4, torch.bfloat16, impl="fma")
    assert cfg == k.fma_launch_config(80, 128, 24, 4, torch.bfloat16)
    assert (cfg.impl, cfg.block_p, cfg.block_j, cfg.block_t, cfg.num_warps) == (
        "fma", 16, 32, 4, 2)
    assert (cfg.maxnreg, cfg.n_chunks, cfg.kq_dot) == (128, 4, 0)
    cfg8 = k.launch_config(80, 128, 24, 8, torch.bfloat16)
    assert (cfg8.block_p, cfg8.block_t, cfg8.maxnreg, cfg8.n_chunks, cfg8.kq_dot) == (16, 8, None, 4, 1)
    with pytest.raises(ValueError, match=r"impl: expected one of \('dot', 'fma'\), got 'mma'"):
        k.launch_config(80, 128, 24, 4, torch.bfloat16, impl="mma")


def offline_rows(expr: str):
    """``expr`` evaluated (JSON-able) in a fresh process without the Triton interpreter, with
    ``bench_verify.offline_sm90a`` in scope (offline sm_90a builds, no GPU), or why not (a string)
    when this Triton has no NVIDIA backend."""
    import json
    import os
    import subprocess
    import sys
    import tempfile

    script = ("import json, sys; sys.path.insert(0, sys.argv[1]); "
              "from benchmarks.bench_verify import offline_sm90a; "
              f"rows = {expr}; json.dump(rows, open(sys.argv[2], 'w'))")
    root = str(__import__("pathlib").Path(__file__).resolve().parents[2])
    env = {key: v for key, v in os.environ.items() if key != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory() as d:
        dst = os.path.join(d, "rows.json")
        proc = subprocess.run([sys.executable, "-c", script, root, dst], env=env,
                              capture_output=True, text=True, timeout=900)
        err = proc.stderr.lower()
        if proc.returncode != 0 and "nvidia" in err and "backend" in err:
            return f"no NVIDIA Triton backend: {proc.stderr[-300:]}"
        assert proc.returncode == 0, proc.stderr[-3000:]
        with open(dst) as f:
            return json.load(f)


@functools.lru_cache(maxsize=None)
def _fma_codegen() -> list[dict] | str:
    """Offline sm_90a builds of the FMA kernel at Nano-4B, T = 4 (no copy, bf16, fp8 copy):
    ``bench_verify.offline_sm90a`` rows with their PTX, or why not."""
    return offline_rows("offline_sm90a(4, (1,), impl='fma', keep_ptx=True)")


def test_fma_codegen_fold_and_registers():
    """sm_90a, Nano-4B, T = 4 (no copy, bf16, fp8 copy: ``flush_split``'s two builds): every
    fold site of ``fma.py`` compiles to SGLang's update (``fma(state, ex2(·), (Δ·B)·x)``, as the
    decode test pins it), and the fp8 copy's non-flush build has none; an ``mma`` instruction
    only where the build takes ``read_mma`` (the copies' non-flush outputs), at most 16 B of
    spill stores at the chosen launch (``fma_launch_config``: 128 registers, 8 CTAs per SM)."""
    import inspect

    from test_mamba2_decode import _update_signatures

    import replayssm_kernels.mamba2_verify.fma as f

    rows = _fma_codegen()
    if isinstance(rows, str):
        pytest.skip(rows)
    with open(inspect.getsourcefile(f)) as fh:
        src = fh.read().splitlines()
    # The default launch's fold at T = 4 (_fold_tile4, the N-chunked tile; the whole-N tile's
    # _fold_tile, for longer windows, is held bitwise to it by test_mamba2_verify_layout.py).
    start = src.index(next(line for line in src if line.startswith("def _fold_tile4(")))
    end = next(i for i in range(start + 1, len(src)) if src[i].startswith("def "))
    lines = {i + 1 for i in range(start, end) if "tl.fma(b_s, dA, dB" in src[i]}
    assert len(lines) == 2
    expected = {("fma.rn.f32", "a=state", ("ex2.approx.f32",), (("mul.f32",),),
                 (("mul.f32", ("cvt.f32.bf16", "mul.f32")),))}
    assert [(row["read"], row["rows"]) for row in rows] == [(None, 0), ("bf16", 0), ("fp8", 2),
                                                             ("fp8", 1)]
    for row in rows:
        sig = _update_signatures(row["ptx"], "mamba2_verify/fma.py", lines)
        if row["rows"] == 2:  # flush_split's non-flush build: no fold code at all
            assert sig == set(), f"{row['read']} non-flush build: fold sites {sig}"
        else:
            assert sig == expected, f"{row['read']}: fold compiles to {sig}, SGLang's to {expected}"
        assert ("mma.sync" in row["ptx"]) == bool(row["read_mma"]), row["read"]
        # The chosen 128-register cap (the H200 sweep's fastest) spills a few bytes (ptxas).
        assert row["regs"] <= 128 and row["spill_st"] <= 16 and row["ctas"] >= 8, {
            k: v for k, v in row.items() if k != "ptx"}


# --------------------------------------------------------------------------------------------
# GPU (H200): the same driver at the real shape
# --------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("T", [2, 4, 8], ids=lambda t: f"T{t}")
def test_gpu_nano4b_spec_bitwise_vs_sglang(T):
    rep = run_spec("kernel", NANO_4B, T, 16, torch.float32, torch.bfloat16, active=24, pads=8,
                   steps=48, seed=500 + T, sglang_check=True)
    _check(rep, torch.float32, torch.bfloat16, T)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [4, 8], ids=lambda t: f"T{t}")
def test_gpu_nano4b_spec_late_rule_bitwise_vs_sglang(T):
    """The late flush rule at Nano-4B on the ring a server allocates for it (``max(L, T) + 2T``)."""
    rep = run_spec("kernel", NANO_4B, T, 16, torch.float32, torch.bfloat16, active=24, pads=8,
                   steps=48, seed=520 + T, sglang_check=True, late=True, ring_extra=0, decode_p=0.1)
    _check(rep, torch.float32, torch.bfloat16, T)
    assert rep.max_flush_len > 16, rep


@pytest.mark.gpu
@pytest.mark.parametrize("T", [2, 4, 8], ids=lambda t: f"T{t}")
def test_gpu_nano4b_vs_sglang_snapshot_verify(T):
    res = snapshot_compare(NANO_4B, T, 16, torch.bfloat16, batch=24, seed=700 + T, device="cuda")
    assert res["flush_rows"] > 0 and res["nonflush_rows"] > 0
    assert res["out_rel"] < SNAPSHOT_TOL[torch.bfloat16], res


@pytest.mark.gpu
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["S-fp32", "S-bf16"])
def test_gpu_nano4b_spec_cycles(state_dtype):
    rep = run_spec("kernel", NANO_4B, 4, 16, state_dtype, torch.bfloat16, active=32, pads=8,
                   steps=48, seed=600, with_z=True)
    _check(rep, state_dtype, torch.bfloat16, 4)


@pytest.mark.gpu
@pytest.mark.parametrize("read_dtype", [torch.bfloat16, F8], ids=["bf16", "fp8"])
@pytest.mark.parametrize("T", [2, 4], ids=lambda t: f"T{t}")
def test_gpu_nano4b_spec_read_copy(T, read_dtype):
    """The read-copy driver at Nano-4B: outputs vs float64, the copy bitwise round(checkpoint)
    after every flush, and the fp32 checkpoint bit-identical to SGLang's selective_state_update
    over the accepted tokens (the copy does not touch the fold)."""
    rep = run_spec("kernel", NANO_4B, T, 16, torch.float32, torch.bfloat16, active=24, pads=8,
                   steps=48, seed=800 + T, sglang_check=True, read_dtype=read_dtype,
                   read_layout="permuted" if T == 4 else "layer")
    _check(rep, torch.float32, torch.bfloat16, T, read_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("read_dtype", [torch.bfloat16, F8], ids=["bf16", "fp8"])
def test_gpu_nano4b_read_copy_vs_reference_and_no_copy(read_dtype):
    kw = dict(shape=NANO_4B, T=4, L=16, device="cuda")
    rel = _assert_kernel_matches_reference(read_dtype, **kw)
    assert rel < 1e-5, rel  # tensor-core products vs torch's fp32 GEMMs, other summation orders
    rel = _assert_flush_rows_match_no_copy(read_dtype, **kw)
    assert 0 < rel < READ_OUT_TOL[read_dtype, torch.float32], rel


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 4], ids=lambda b: f"bs{b}")
def test_gpu_nano4b_split_bitwise_vs_unsplit(force_p_split, batch):
    """Nano-4B at batch 1 and 4 (the rule splits 5 and 2 ways on the H200's 132 SMs; asserted):
    the rule's launch vs the forced unsplit one, bitwise (outputs, checkpoints, rings, cursors),
    with and without an fp8 read copy; then the float64 / SGLang driver at that batch."""
    import replayssm_kernels.mamba2_verify.kernel as k

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert k.p_split_rule(5, 96, batch, sms) > 1, "no split at this batch on this GPU"
    split_lockstep(force_p_split, [1, None], shape=NANO_4B, L=16, active=batch, pads=0,
                   steps=12, seed=900 + batch, device="cuda")
    split_lockstep(force_p_split, [1, None], shape=NANO_4B, L=16, active=batch, pads=1,
                   steps=8, seed=910 + batch, device="cuda", read_dtype=F8,
                   act_dtype=torch.bfloat16)
    rep = run_spec("kernel", NANO_4B, 4, 16, torch.float32, torch.bfloat16, active=batch,
                   pads=0, steps=32, seed=920 + batch, sglang_check=True)
    _check(rep, torch.float32, torch.bfloat16, 4)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [2, 4, 8], ids=lambda t: f"T{t}")
def test_gpu_nano4b_dot_spec_bitwise_vs_sglang(T):
    """The tensor-core implementation through the float64 / SGLang driver at Nano-4B (as
    ``test_gpu_nano4b_spec_bitwise_vs_sglang``)."""
    rep = run_spec("dot", NANO_4B, T, 16, torch.float32, torch.bfloat16, active=24, pads=8,
                   steps=48, seed=500 + T, sglang_check=True)
    _check(rep, torch.float32, torch.bfloat16, T)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [2, 4, 8], ids=lambda t: f"T{t}")
def test_gpu_nano4b_dot_vs_sglang_snapshot_verify(T):
    res = snapshot_compare(NANO_4B, T, 16, torch.bfloat16, batch=24, seed=700 + T, device="cuda",
                           impl="dot")
    assert res["flush_rows"] > 0 and res["nonflush_rows"] > 0
    assert res["out_rel"] < SNAPSHOT_TOL[torch.bfloat16], res


@pytest.mark.gpu
@pytest.mark.parametrize("read_dtype", [torch.bfloat16, F8], ids=["bf16", "fp8"])
@pytest.mark.parametrize("T", [2, 4], ids=lambda t: f"T{t}")
def test_gpu_nano4b_dot_spec_read_copy(T, read_dtype):
    rep = run_spec("dot", NANO_4B, T, 16, torch.float32, torch.bfloat16, active=24, pads=8,
                   steps=48, seed=800 + T, sglang_check=True, read_dtype=read_dtype,
                   read_layout="permuted" if T == 4 else "layer")
    _check(rep, torch.float32, torch.bfloat16, T, read_dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("read_dtype,sr", [(None, False), (F8, False), (None, True)],
                         ids=["no-copy", "fp8-copy", "fp16-SR"])
@pytest.mark.parametrize("T", [4, 8], ids=lambda t: f"T{t}")
def test_gpu_nano4b_fma_bitwise_vs_dot(T, read_dtype, sr):
    """Nano-4B, both implementations in lockstep: checkpoints, rings, copies bitwise; outputs
    within ``FMA_VS_DOT_TOL``."""
    seen = split_lockstep(lambda s: None, [None, None], shape=NANO_4B, T=T, L=16,
                          state_dtype=torch.float16 if sr else torch.float32,
                          act_dtype=torch.bfloat16, read_dtype=read_dtype, sr=sr, active=24,
                          pads=8, steps=12, seed=960 + T, device="cuda",
                          impls=["dot", "kernel"], out_rtol=FMA_VS_DOT_TOL[torch.bfloat16])
    print(f"\n[mamba2-verify] GPU fma vs dot T={T}: outputs {seen['out_rel']:.2e}")


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 4], ids=lambda b: f"bs{b}")
def test_gpu_nano4b_dot_split_bitwise_vs_unsplit(force_p_split, batch):
    split_lockstep(force_p_split, [1, None], shape=NANO_4B, L=16, active=batch, pads=1,
                   steps=8, seed=930 + batch, device="cuda", read_dtype=F8,
                   act_dtype=torch.bfloat16, impls=["dot", "dot"])


# --------------------------------------------------------------------------------------------
# Codegen: the verify fold compiles (sm_90a, no GPU needed) like selective_state_update's update
# --------------------------------------------------------------------------------------------

_CODEGEN_SCRIPT = r"""
import json, sys
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from replayssm_kernels.mamba2_verify import kernel as mk

H, P, N, G, T = 96, 80, 128, 8, 4  # Nemotron-3-Nano-4B, L = 16, R = 20
R = 16 + T
cfg = mk.launch_config(P, N, R, T, torch.bfloat16, impl="dot")  # the tensor-core kernel
K = mk._mamba2_replay_verify_fwd_kernel
ptrs = dict(state_ptr="*fp32", ring_x_ptr="*bf16", ring_dt_ptr="*fp32", ring_B_ptr="*bf16",
            x_ptr="*bf16", dt_ptr="*bf16", A_ptr="*fp32", B_ptr="*bf16", C_ptr="*bf16",
            D_ptr="*fp32", z_ptr="*bf16", dt_bias_ptr="*fp32", out_ptr="*bf16",
            slot_idx_ptr="*i32", ring_start_ptr="*i32", ring_len_ptr="*i32", flush_ptr="*i1",
            read_scale_ptr="*fp32")
const = dict(DT_SOFTPLUS=True, HAS_DT_BIAS=True, HAS_D=True, HAS_Z=False, BLOCK_P=cfg.block_p,
             BLOCK_K=cfg.block_k, NUM_NK=-(-N // cfg.block_k), BLOCK_J=cfg.block_j,
             BLOCK_T=cfg.block_t,
             NUM_PT=-(-P // cfg.block_p), FOLD_UNROLL=cfg.fold_unroll,
             ACT_TF32_EXACT=cfg.act_tf32_exact, sr_seed_ptr=None, SR=False, P_SPLIT=1)
# Unit strides of contiguous pools become constexpr 1, as the JIT specialises them.
ones = {"stride_state_n", "stride_rx_p", "stride_rdt_row", "stride_rB_n", "stride_x_p",
        "stride_B_n", "stride_C_n", "stride_out_p", "stride_dt_head", "stride_A_head",
        "stride_D_head", "stride_dt_bias_head"}
def ptx(read=None, **over):
    # read: None (no copy; the read pointers are None, as the JIT passes them), "bf16" or "fp8"
    cx = dict(const, HAS_READ=read is not None, READ_FP8=read == "fp8") | over
    unit = ones | ({"stride_read_n", "stride_rs_p"} if read else set())
    sig = {}
    for n in K.arg_names:
        if n in cx:
            sig[n] = "constexpr"
        elif n in unit:
            sig[n], cx[n] = "constexpr", 1
        elif (n == "read_ptr" and read is None) or (n == "read_scale_ptr" and read != "fp8"):
            sig[n], cx[n] = "constexpr", None
        elif n == "read_ptr":
            sig[n] = {"bf16": "*bf16", "fp8": "*fp8e4nv"}[read]
        else:
            sig[n] = ptrs.get(n, "i32")
    k = triton.compile(ASTSource(fn=K, signature=sig, constexprs=cx),
                       target=GPUTarget("cuda", 90, 32), options=dict(num_warps=cfg.num_warps))
    return k.asm["ptx"]
# ours: the bf16 launch (split fp32 operands); x3: the same kernel with tf32x3 on every product;
# bf16copy / fp8copy: ours with a split-precision read copy
json.dump(dict(ours=ptx(), x3=ptx(ACT_TF32_EXACT=False), bf16copy=ptx("bf16"),
               fp8copy=ptx("fp8")), sys.stdout)
"""


@functools.lru_cache(maxsize=None)
def _codegen() -> dict[str, str] | str:
    """PTX of the bf16 launch (``ours``), of the tf32x3 build (``x3``) and of the read-copy
    builds (``bf16copy``, ``fp8copy``), or why not."""
    import json
    import os
    import subprocess
    import sys

    env = {key: v for key, v in os.environ.items() if key != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _CODEGEN_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=600)
    err = proc.stderr.lower()
    if proc.returncode != 0 and "nvidia" in err and "backend" in err:
        return f"no NVIDIA Triton backend: {proc.stderr[-300:]}"
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.xdist_group("mamba2-verify-codegen")  # one offline build (lru_cache) for both
def test_split_products_use_fewer_tensor_core_ops():
    """With bf16 activations the fp32 operand alone is split: per KᵀQ chunk one tf32 product
    instead of three, per S·Q chunk and per record product two instead of three (static PTX
    counts of ``mma.sync``, sm_90a); the tf32x3 build of the same kernel is the yardstick."""
    got = _codegen()
    if isinstance(got, str):
        pytest.skip(got)
    n_ours, n_x3 = (len(re.findall(r"\bmma\.sync\.", got[k])) for k in ("ours", "x3"))
    assert n_x3 > 0 and n_ours > 0
    assert n_ours < 0.75 * n_x3, (n_ours, n_x3)


@pytest.mark.xdist_group("mamba2-verify-codegen")  # one offline build (lru_cache) for both
def test_fold_codegen_matches_sglang():
    """Compile the verify kernel for sm_90a (no GPU) at the Nano-4B shape and check that its fold
    site is built exactly like SGLang 0.5.17's ``state = state * dA + dB * x[:, None]``:
    fma(state, ex2.approx(·), mul(cvt(x), mul(Δ, B))) — the signature the decode test pins — in
    the no-copy build and in both read-copy builds (bf16, fp8)."""
    import inspect

    from test_mamba2_decode import _update_signatures

    import replayssm_kernels.mamba2_verify.kernel as k

    got = _codegen()
    if isinstance(got, str):
        pytest.skip(got)
    with open(inspect.getsourcefile(k)) as f:
        lines = {i + 1 for i, line in enumerate(f) if "tl.fma(b_s, dA, dB" in line}
    assert len(lines) == 1
    expected = {("fma.rn.f32", "a=state", ("ex2.approx.f32",), (("mul.f32",),),
                 (("mul.f32", ("cvt.f32.bf16", "mul.f32")),))}
    for build in ("ours", "bf16copy", "fp8copy"):  # the read-copy builds fold the same way
        sig = _update_signatures(got[build], "mamba2_verify/kernel.py", lines)
        assert sig == expected, f"{build}: verify fold compiles to {sig}, SGLang's to {expected}"
