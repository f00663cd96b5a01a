"""GDN verify, closed-form implementation (``gdn_replay_verify(..., impl="closed")``,
``kernels/gdn_verify/closed.py``): the drivers of ``test_gdn_verify.py`` with the new kernel.

* against the float64 conventional recurrence over full speculative cycles (``Sim``: NaN-poisoned
  outputs and uncommitted ring rows, touched slots vs reference, untouched slots and the other
  layer bit-identical, padding rows untouched, fp32 checkpoints bitwise vs ``gdn_replay_decode``'s
  fold), quoting ``‖out−ref‖/‖ref‖``;
* in lockstep with the recurrent kernel on the same inputs: after every step the checkpoint and
  the raw records (k, v, g, β) bit-identical (whole pools), the u records and outputs within a
  tolerance (closed form vs sequential: other summation order; u only feeds outputs);
* the same with a read copy (bf16, fp8) and with stochastic rounding of an fp16 checkpoint;
* the ValueError cases of the recurrent kernel, and an unknown ``impl``.

CPU: the Triton interpreter with small shapes (conftest.py); ``gpu``: the Qwen3.5-4B head shape.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch
from test_gdn_verify import (
    _CODEGEN_SCRIPT,
    BAD,
    BAD_COPY,
    BF16,
    CPU_CASES,
    DEVICE,
    F8,
    FP16,
    FP32,
    GPU_CASES,
    HAS_CUDA,
    SPLIT_GPU_CASES,
    TOL_OUT_COPY,
    Case,
    Sim,
    SplitSim,
    _args,
    _split_id,
    assert_bits_equal,
)

from replayssm_kernels.gdn_verify import gdn_replay_verify

pytestmark = [
    pytest.mark.usefixtures("interpreter_bf16_rtne", "interpreter_gpu_sum_order"),
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
]

GPU_REASON = "needs a CUDA GPU"


def closed(sim: Sim) -> Sim:
    """``sim`` with its verify calls routed to the closed-form implementation."""
    sim.verify_fn = functools.partial(sim.verify_fn, impl="closed")
    return sim


def with_sr(sim: Sim, seed: int) -> Sim:
    """``sim`` with stochastic rounding of the (fp16) checkpoint on verify flushes."""
    counter = torch.tensor([seed], dtype=torch.int64, device=sim.dev)
    sim.verify_fn = functools.partial(sim.verify_fn, sr_seed=counter, sr_layer=3)
    return sim


def run_closed_vs_f64(case: Case, seed: int, tag: str, device=DEVICE) -> Sim:
    sim = closed(Sim(case, seed=seed, ops="kernel", device=device)).run()
    assert sim.verify_steps >= 3
    if sim.bitwise:
        assert sim.bitwise_checks >= 3
    print(
        f"\n[closed {tag} {case.id}] out vs f64 {sim.max_out_err:.2e} state {sim.max_state_err:.2e}"
        f" (verify {sim.verify_steps}, decode {sim.decode_steps}, flushes {sim.flushes}, "
        f"bitwise {getattr(sim, 'bitwise_checks', 0)}, a {sorted(sim.accepted_seen)})"
    )
    return sim


# Small CPU cases of test_gdn_verify.py: T = 1, 2 (fp32), 4 (masked K/V, fp32 u, non-contiguous,
# int64 indices), 8 (fp32), and a bf16 checkpoint.
@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: c.id)
def test_closed_vs_f64_and_fold(case):
    run_closed_vs_f64(case, seed=2, tag="cpu")


def test_closed_long_history():
    """Non-flush rows with long committed histories (L = 10: up to 10 records before the window)."""
    case = Case(HV=2, Hk=1, K=16, V=16, L=10, T=2, act_dtype=FP32, tol_out=1e-5, requests=2,
                decode_p=0.3, force_p=0.05, steps=14)  # fmt: skip
    run_closed_vs_f64(case, seed=6, tag="history")


def lockstep(make, case: Case, seed: int, steps: int, tol_out: float) -> dict:
    """Recurrent and closed sims (``make(case, seed)``) on the same inputs, step by step: the whole
    checkpoint pool and the raw-record rings bit-identical after every step, u and outputs within
    ``tol_out`` (relative L2 over live rows)."""
    rec = make(case, seed)
    clo = closed(make(case, seed))
    res = {"out": 0.0, "u": 0.0, "flush_rows": 0, "nonflush_rows": 0}
    for _ in range(steps):
        inp = rec.make_inputs(case.T)
        clo.make_inputs(case.T)  # same generator draws
        out_r, flush = rec.step(inp)
        out_c, flush_c = clo.step(inp)
        assert torch.equal(flush, flush_c) and torch.equal(rec.cursors, clo.cursors)
        live = inp["slot_idx"] >= 0
        res["flush_rows"] += int((flush & live).sum())
        res["nonflush_rows"] += int((~flush & live).sum())
        d = (out_c[live].double() - out_r[live].double()).norm() / out_r[live].double().norm()
        res["out"] = max(res["out"], float(d))
        full_r, full_c = rec.full_tensors(), clo.full_tensors()
        assert_bits_equal(full_c[0], full_r[0], "checkpoint pool")
        for name, tc, tr in zip(("ring_k", "ring_v", "ring_g", "ring_beta"), full_c[2:6],
                                full_r[2:6]):  # fmt: skip
            assert_bits_equal(tc, tr, name)
        for tc, tr in zip(full_c[6:], full_r[6:]):  # read copy and fp8 scales
            assert_bits_equal(tc, tr, "read copy")
        u_c, u_r = clo.ring_u.double(), rec.ring_u.double()
        ok = ~torch.isnan(u_r)
        assert torch.equal(ok, ~torch.isnan(u_c)), "u records written in other rows"
        du = (u_c[ok] - u_r[ok]).norm() / u_r[ok].norm()
        res["u"] = max(res["u"], float(du))
    assert res["out"] < tol_out and res["u"] < tol_out, res
    assert res["flush_rows"] >= 2 and res["nonflush_rows"] >= 2, res
    print(f"\n[closed vs recurrent {case.id}] out {res['out']:.2e} u {res['u']:.2e} "
          f"({res['flush_rows']} flush / {res['nonflush_rows']} non-flush rows); out vs f64: "
          f"recurrent {rec.max_out_err:.2e}, closed {clo.max_out_err:.2e}")
    return res


def _sim(case, seed):
    return Sim(case, seed=seed, ops="kernel")


LOCKSTEP_CASES = [
    (Case(HV=2, Hk=1, K=24, V=20, L=6, T=4, act_dtype=FP32, u_dtype=FP32, steps=8), 1e-5),
    (Case(HV=4, Hk=2, K=16, V=16, L=8, T=3, noncontig=True, steps=8), 1e-2),
]


@pytest.mark.parametrize("case,tol", LOCKSTEP_CASES, ids=[c.id for c, _ in LOCKSTEP_CASES])
def test_closed_vs_recurrent_lockstep(case, tol):
    lockstep(_sim, case, seed=3, steps=case.steps, tol_out=tol)


@pytest.mark.usefixtures("interpreter_fp16_fp8_rtne")
def test_closed_vs_recurrent_lockstep_sr():
    """fp16 checkpoint, stochastic rounding on verify flushes: the same stored bits."""
    case = Case(HV=2, Hk=1, K=16, V=16, L=6, T=2, state_dtype=FP16, tol_state=2e-3, steps=8,
                force_p=0.25)  # fmt: skip
    lockstep(lambda c, s: with_sr(_sim(c, s), seed=77), case, seed=5, steps=8, tol_out=1e-2)


@pytest.mark.usefixtures("interpreter_fp16_fp8_rtne")
@pytest.mark.parametrize("rd", [BF16, F8], ids=["bf16", "fp8"])
def test_closed_split_lockstep(rd):
    """With a read copy: the closed kernel's own checks (``SplitSim``: copy after flushes, non-flush
    rows leave it alone, outputs vs float64) and lockstep with the recurrent kernel (checkpoint,
    copy and raw records bit-identical)."""
    case = Case(HV=2, Hk=1, K=24, V=20, L=6, T=4, act_dtype=FP32, u_dtype=FP32, requests=3,
                steps=6, force_p=0.25, tol_out=TOL_OUT_COPY[rd])  # fmt: skip
    lockstep(lambda c, s: SplitSim(c, rd, seed=s, ops="kernel"), case, seed=13, steps=6,
             tol_out=1e-5)  # fmt: skip


@pytest.mark.usefixtures("interpreter_fp16_fp8_rtne")
@pytest.mark.parametrize("rd", [BF16, F8], ids=["bf16", "fp8"])
def test_closed_split_nonflush_rows_never_read_the_checkpoint(rd):
    """NaN in every checkpoint, no flush: finite outputs (the copy is read, not the checkpoint)."""
    case = Case(HV=2, Hk=1, K=16, V=16, L=6, T=2, act_dtype=FP32, u_dtype=FP32, force_p=0.0,
                decode_p=0.0, tol_out=TOL_OUT_COPY[rd])  # fmt: skip
    sim = closed(SplitSim(case, rd, seed=14, ops="kernel"))
    for _ in range(2):  # committed histories
        sim.step(sim.make_inputs(case.T))
    inp = sim.make_inputs(case.T)
    B = inp["slot_idx"].shape[0]
    z = torch.zeros(B, dtype=torch.bool, device=sim.dev)
    start = sim.cursors[inp["slot_idx"].clamp(min=0).long(), 0].clone()
    length = sim.cursors[inp["slot_idx"].clamp(min=0).long(), 1].clone()
    assert int(length.max()) > 0
    sim.state.fill_(math.nan)
    out = torch.full((B, case.T, case.HV, case.V), math.nan, device=sim.dev)
    sim.verify_fn(*sim.tensors(), inp["q"], inp["k"], inp["v"], inp["a"], inp["b"], sim.A_log,
                  sim.dt_bias, out, inp["slot_idx"], start, length, z, scale=sim.scale)
    live = inp["slot_idx"] >= 0
    assert torch.isfinite(out[live]).all() and torch.isnan(out[~live]).all()


@pytest.mark.parametrize("bad", list(BAD))
def test_closed_value_errors(bad):
    args = _args()
    name, make, match = BAD[bad]
    args[name] = make(args)
    with pytest.raises(ValueError, match=match):
        gdn_replay_verify(**args, scale=0.25, impl="closed")


@pytest.mark.parametrize("bad", list(BAD_COPY))
def test_closed_split_value_errors(bad):
    make, match = BAD_COPY[bad]
    with pytest.raises(ValueError, match=match):
        gdn_replay_verify(**make(), scale=0.25, impl="closed")


def test_closed_value_error_scale_K_and_sr():
    with pytest.raises(ValueError, match="scale"):
        gdn_replay_verify(**_args(), scale=float("nan"), impl="closed")
    with pytest.raises(ValueError, match="state"):
        gdn_replay_verify(**_args(K=512), scale=0.25, impl="closed")
    with pytest.raises(ValueError, match="with sr_seed"):  # SR needs an fp16 checkpoint
        gdn_replay_verify(**_args(), scale=0.25, impl="closed",
                          sr_seed=torch.zeros(1, dtype=torch.int64, device=DEVICE))


def test_unknown_impl():
    with pytest.raises(ValueError, match="impl: expected one of"):
        gdn_replay_verify(**_args(), scale=0.25, impl="chunked")


def test_closed_all_padding_touches_nothing():
    args = _args()
    args["slot_idx"].fill_(-1)
    args["out"].fill_(math.nan)
    before = {k: v.clone() for k, v in args.items()}
    gdn_replay_verify(**args, scale=0.25, impl="closed")
    for k, v in args.items():
        assert_bits_equal(v, before[k], k)


# The recurrent kernel's codegen script (its builds ``k`` / ``k_read`` and helpers ``build``,
# ``seq``, ``fold_body``) without SGLang's kernel, plus the closed kernel's builds.
_CLOSED_CODEGEN_SCRIPT = (
    _CODEGEN_SCRIPT.split("from sglang")[0]
    + "KEEP" + _CODEGEN_SCRIPT.split("KEEP", 1)[1].split("ours, _ = fold_body")[0]
    + r'''
from replayssm_kernels.gdn_verify.closed import (
    CLOSED_BLOCK_V, CLOSED_NUM_WARPS, gdn_replay_verify_closed_fwd_kernel as ck)
cconst = dict(const, BV=CLOSED_BLOCK_V, TP=1 << (T - 1).bit_length())
closed = {}
for rd in (None, "bf16", "fp8e4nv"):
    f8 = rd == "fp8e4nv"
    p, c = dict(ptrs), dict(cconst, HAS_READ=rd is not None, READ_FP8=f8)
    if rd:
        p["read_ptr"] = f"*{rd}"
    else:
        c["read_ptr"] = None
    if f8:
        p["read_scale_ptr"] = "*fp32"
    else:
        c["read_scale_ptr"] = None
    zero = {n: 0 for n in rstr if n.startswith(("stride_rd", "stride_rs"))}
    s = dict(rstr) if f8 else dict(strides, **zero)
    if rd == "bf16":
        s.update({n: v for n, v in rstr.items() if n.startswith("stride_rd")})
    kc = build(ck, p, s, c, 1, CLOSED_NUM_WARPS)
    closed[str(rd)] = fold_body(kc.asm["ttgir"])[0]
rec = fold_body(k.asm["ttgir"])[0]
json.dump(dict(recurrent=rec, closed=closed), sys.stdout)
'''
)


def test_closed_fold_codegen_matches_recurrent():
    """Compile both kernels for sm_90a (no GPU needed) and compare the flush rows' fold loop
    (TTGIR, the fp32 ops and their layouts, which fix every reduction tree): the closed kernel's
    must be the recurrent kernel's (itself checked against SGLang's packed decode by
    ``test_fold_codegen_matches_sglang``), with and without a read copy, up to the tile's row
    count (BV = 16 against 32: the rows are split, each row's reduction over K is the same), and
    without the layout conversions (the v record is loaded straight into the tile's row layout
    here, converted after the load there: a copy)."""
    import json
    import os
    import re
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _CLOSED_CODEGEN_SCRIPT, "4"], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    err = proc.stderr.lower()
    if proc.returncode != 0 and "nvidia" in err and "backend" in err:
        pytest.skip(f"no NVIDIA Triton backend: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)

    def rows(body):
        # Layout conversions only move values (exact); every arithmetic op keeps its layouts.
        return [re.sub(r"tensor<(16|32)x", "tensor<BVx", line) for line in body
                if not line.startswith("ttg.convert_layout")]

    want = rows(got["recurrent"])
    assert len(want) > 15
    for rd, body in got["closed"].items():
        assert rows(body) == want, f"closed fold loop (read copy {rd}) differs from recurrent's"


# ---------------------------------------------------------------------------------------------
# GPU (Qwen3.5-4B head shape): compiled code, FMA contraction, the compiler's reduction trees.


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason=GPU_REASON)
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.id)
def test_closed_vs_f64_gpu(case):
    run_closed_vs_f64(case, seed=4, tag="gpu")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason=GPU_REASON)
@pytest.mark.parametrize("T", [2, 4, 8], ids=lambda t: f"T{t}")
def test_closed_vs_recurrent_lockstep_gpu(T):
    """The checkpoint and raw records bit-identical to the recurrent kernel's on the GPU too."""
    case = Case(HV=32, Hk=16, K=128, V=128, L=16, T=T, requests=24, pad_rows=3, steps=20)
    lockstep(_sim, case, seed=8, steps=case.steps, tol_out=1e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason=GPU_REASON)
@pytest.mark.parametrize("cr", SPLIT_GPU_CASES, ids=[_split_id(c) for c in SPLIT_GPU_CASES])
def test_closed_split_vs_f64_gpu(cr):
    case, rd = cr
    case = dataclasses.replace(case, tol_out=TOL_OUT_COPY[rd])
    sim = closed(SplitSim(case, rd, seed=12, ops="kernel")).run()
    assert sim.copy_checks >= 3
    print(f"\n[closed split gpu {_split_id(cr)}] out vs f64 {sim.max_out_err:.2e}")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason=GPU_REASON)
@pytest.mark.parametrize("rd", [BF16, F8], ids=["bf16", "fp8"])
def test_closed_split_lockstep_gpu(rd):
    case = Case(HV=32, Hk=16, K=128, V=128, L=16, T=4, requests=8, steps=10, force_p=0.25,
                tol_out=TOL_OUT_COPY[rd])  # fmt: skip
    lockstep(lambda c, s: SplitSim(c, rd, seed=s, ops="kernel"), case, seed=15, steps=10,
             tol_out=1e-2)  # fmt: skip
