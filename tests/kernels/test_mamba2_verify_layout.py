"""Mamba-2 verify, FMA implementation: the launch options ``n_chunks`` and ``kq_dot``.

``kernel.fma_layout`` / ``fma.py``: with ``n_chunks = NC > 1`` the checkpoint tile is held as
``[CQ, BLOCK_P, NC, VEC]`` so each thread keeps ``NC`` column chunks of its rows; a sum over N is
mostly in-thread, and the records' term joins each token's sum before the lanes are crossed.
``kq_dot = 1`` (with ``n_chunks > 1``) computes ``KᵀQ`` with ``tl.dot``. Launch options (the
default stays ``n_chunks = 1``, ``kq_dot = 0``), selected here the way
``bench_verify --mamba2-verify-launch n_chunks=4,kq_dot=1`` selects them: the field overrides
applied to ``launch_config``'s result for the duration of a call.

What is checked (CPU: Triton interpreter; ``gpu``: the same drivers at Nano-4B on the H200):

- the full driver of ``test_mamba2_verify.run_spec`` with the option forced (outputs vs the
  float64 recurrence, printed as ``[mamba2-verify] nc4 ...`` lines with ``pytest -s``;
  NaN-poisoned outputs fully written and padding rows left NaN; flushed checkpoints bit-identical
  to SGLang's ``selective_state_update`` over the accepted tokens; appended records exact; every
  pool byte outside the allowed rows, untouched slots included, bit-identical);
- the option in lockstep with the default launch on identical pools and inputs
  (``split_lockstep``): checkpoints (fp16 with stochastic rounding too), rings, read copies, fp8
  scales and cursors bitwise after every step, outputs within ``LAYOUT_OUT_TOL``;
- ``ValueError`` for an ``n_chunks`` that is not a power of two in ``[1, BLOCK_N]``, a
  ``kq_dot`` other than 0 / 1 or 1 with ``n_chunks = 1``, and either option with
  ``impl="dot"``;
- offline sm_90a codegen (no GPU): the fold sites still compile to SGLang's update and the
  cross-lane reductions (``shfl.sync``) and barriers drop.
"""

from __future__ import annotations

import functools

import pytest
import torch
import test_mamba2_verify as tmv
from test_mamba2_decode import Shape
from test_mamba2_verify import (  # noqa: F401  (force_p_split: a fixture, used by name)
    NANO_4B,
    OUT_TOL,
    _check,
    force_p_split,
    mamba2_replay_verify,
    run_spec,
    split_lockstep,
)
from test_split_precision_mamba2 import F8

pytestmark = pytest.mark.usefixtures("interpreter_bf16_rtne")

DEVICE = tmv.DEVICE


def _forced_launch(**fields):
    """``mamba2_replay_verify`` with ``fields`` of the launch configuration overridden for the
    call (``bench_verify --mamba2-verify-launch``'s mechanism)."""
    import replayssm_kernels.mamba2_verify.kernel as k

    def run(*args, **kw) -> None:
        orig = k.launch_config
        k.launch_config = lambda *a, **kk: orig(*a, **kk)._replace(**fields)
        try:
            mamba2_replay_verify(*args, **kw)
        finally:
            k.launch_config = orig

    return run


#: The launches under test, by driver key: the N-chunked tile at 2, 4 and 8 chunks, with
#: ``KᵀQ`` on tensor cores (``kq``), and 4 chunks with 16-row tiles at every T (the default
#: launch takes 8-row tiles for T = 8).
LAUNCHES = {"nc2": dict(n_chunks=2), "nc4": dict(n_chunks=4), "nc8": dict(n_chunks=8),
            "nc2kq": dict(n_chunks=2, kq_dot=1), "nc4kq": dict(n_chunks=4, kq_dot=1),
            "nc8kq": dict(n_chunks=8, kq_dot=1),
            "nc4kqbp16": dict(n_chunks=4, kq_dot=1, block_p=16)}
for _name, _fields in LAUNCHES.items():  # the drivers look implementations up by key
    tmv.VERIFY[_name] = _forced_launch(**_fields)
    tmv.DECODE[_name] = tmv.DECODE["kernel"]
    tmv.COMMIT[_name] = tmv.COMMIT["kernel"]

# Outputs of two launches on identical inputs, each within OUT_TOL of float64 (bf16: two
# independent output roundings; fp32: summation order only).
LAYOUT_OUT_TOL = {torch.bfloat16: 2 * OUT_TOL[torch.bfloat16], torch.float32: 1e-5}
#: P = 80: five 16-row tiles (ten 8-row tiles); N = 48: BLOCK_N 64 with a masked chunk, so
#: ``n_chunks`` 2 / 4 / 8 give CQ = 8 / 4 / 2 lanes and, with the ring sizes below, record chunks
#: narrower and wider than ``BLOCK_J`` (the ``BLOCK_J`` round-up).
SHAPE_L = Shape(H=2, G=1, P=80, N=48)


# --------------------------------------------------------------------------------------------
# CPU tests
# --------------------------------------------------------------------------------------------


# (launch, T) pairs of the full driver (P = 80 makes these the slow tests: 0.5-5 min each under
# the interpreter): both options at every T, the other chunk counts once each.
SPEC_CASES = [("nc4kq", 1), ("nc4kq", 2), ("nc4kq", 4), ("nc4kq", 8), ("nc4", 2), ("nc4", 4),
              ("nc2kq", 4), ("nc8", 4)]


@pytest.mark.parametrize("name,T", SPEC_CASES, ids=[f"{n}-T{t}" for n, t in SPEC_CASES])
def test_layout_spec_steps_vs_f64(name, T):
    """The full verify / decode / commit driver with the option forced (P = 80): outputs vs
    float64, flushed checkpoints bit-identical to SGLang, untouched bytes and padding rows."""
    L = {1: 4, 2: 6, 4: 8, 8: 12}[T]
    rep = run_spec(name, SHAPE_L, T, L, torch.float32, torch.bfloat16, seed=100 + T, steps=8,
                   active=2, with_z=(T == 2), sglang_check=True)
    _check(rep, torch.float32, torch.bfloat16, T)


@pytest.mark.parametrize("name", ["nc4", "nc4kq"])
def test_layout_spec_fp32_activations(name):
    """fp32 activations (``kq``: ``tl.dot`` with ``input_precision="ieee"``), forced flushes."""
    rep = run_spec(name, Shape(H=3, G=1, P=12, N=16), 4, 8, torch.float32, torch.float32,
                   seed=5, steps=12, force_p=0.2)
    _check(rep, torch.float32, torch.float32, 4)


def test_layout_spec_bf16_state_headform():
    """A bf16 checkpoint, per-head (non-broadcast) A / D / dt_bias, z, two padding rows, N = 8
    (4 chunks of 2 columns: ``VEC = 2``, one lane over N)."""
    rep = run_spec("nc4kq", Shape(H=5, G=5, P=24, N=8), 4, 6, torch.bfloat16, torch.bfloat16,
                   seed=11, steps=12, broadcast=False, with_z=True, pads=2)
    _check(rep, torch.bfloat16, torch.bfloat16, 4)


@pytest.mark.usefixtures("interpreter_fp16_fp8_rtne")
@pytest.mark.parametrize("read_dtype", [torch.bfloat16, F8], ids=["bf16", "fp8"])
def test_layout_spec_read_copy_vs_f64(read_dtype):
    """The read-copy driver: non-flush rows read the copy, the copy (and fp8 scales) after every
    flush bitwise round(checkpoint as stored)."""
    rep = run_spec("nc4kq", SHAPE_L, 4, 8, torch.float32, torch.bfloat16, seed=31, steps=8,
                   active=2, sglang_check=True, read_dtype=read_dtype)
    _check(rep, torch.float32, torch.bfloat16, 4, read_dtype)


# (launch, T) pairs in lockstep with the default launch.
LOCKSTEP_CASES = [("nc4kq", 1), ("nc4kq", 2), ("nc4kq", 4), ("nc4kq", 8), ("nc4", 1),
                  ("nc4", 8), ("nc2", 4), ("nc8kq", 8), ("nc4kqbp16", 8)]


@pytest.mark.parametrize("name,T", LOCKSTEP_CASES, ids=[f"{n}-T{t}" for n, t in LOCKSTEP_CASES])
def test_layout_bitwise_vs_default(name, T):
    """Default launch and the option in lockstep (flush, non-flush and padding rows, random
    accepted counts): checkpoints, rings and cursors bitwise after every step, outputs within
    ``LAYOUT_OUT_TOL`` of the default's."""
    seen = split_lockstep(lambda s: None, [None, None], shape=SHAPE_L, T=T, L=max(6, T + 4),
                          seed=200 + T, steps=4, impls=["kernel", name],
                          out_rtol=LAYOUT_OUT_TOL[torch.bfloat16])
    print(f"\n[mamba2-verify] {name} vs default T={T}: outputs {seen['out_rel']:.2e}, "
          f"checkpoints / rings / cursors bitwise ({seen['flush']} flush, {seen['nonflush']} "
          f"non-flush, {seen['pad']} padding rows)")


@pytest.mark.usefixtures("interpreter_fp16_fp8_rtne")
@pytest.mark.parametrize("T,read_dtype,state_dtype,act_dtype,sr", [
    (4, torch.bfloat16, torch.float32, torch.bfloat16, False),
    (4, F8, torch.float32, torch.float32, False),
    (2, None, torch.float16, torch.float32, True),
    (8, F8, torch.float16, torch.bfloat16, True)],
    ids=["T4-bf16-copy", "T4-fp8-copy-act32", "T2-fp16-SR", "T8-fp8-copy-fp16-SR"])
def test_layout_bitwise_vs_default_read_copy_and_sr(T, read_dtype, state_dtype, act_dtype, sr):
    """Read copies (the fp8 row max is over all of N in either layout), their scales and SR
    checkpoints bitwise the default launch's."""
    seen = split_lockstep(lambda s: None, [None, None], shape=SHAPE_L, T=T, L=T + 4,
                          state_dtype=state_dtype, act_dtype=act_dtype, read_dtype=read_dtype,
                          sr=sr, seed=240 + T, steps=4, impls=["kernel", "nc4kq"],
                          out_rtol=LAYOUT_OUT_TOL[act_dtype])
    print(f"\n[mamba2-verify] nc4kq vs default T={T} copy={str(read_dtype)[6:]} "
          f"state={str(state_dtype)[6:]} act={str(act_dtype)[6:]} SR={sr}: outputs "
          f"{seen['out_rel']:.2e}, checkpoints / rings / copies bitwise")


def test_layout_split_bitwise_vs_unsplit(force_p_split):
    """The option under the small-batch P-split (2, 3 and 5 programs per head): bitwise the
    unsplit launch of the same option, outputs included."""
    split_lockstep(force_p_split, [1, 2, 3, 5], shape=SHAPE_L, T=4, L=8, seed=260, steps=3,
                   impls=["nc4kq"] * 4)


@pytest.mark.parametrize("n_chunks,N", [(3, 128), (0, 128), (-2, 128), (32, 16), (256, 128)])
def test_n_chunks_value_error(n_chunks, N):
    import replayssm_kernels.mamba2_verify.kernel as k

    cfg = k.launch_config(80, N, 20, 4, torch.bfloat16)._replace(n_chunks=n_chunks)
    bn = 1 << (N - 1).bit_length()
    with pytest.raises(ValueError, match=rf"n_chunks: expected a power of two in \[1, {bn}\]"):
        k.fma_layout(cfg, N)


@pytest.mark.parametrize("n_chunks,kq_dot", [(1, 1), (4, 2), (4, -1)])
def test_kq_dot_value_error(n_chunks, kq_dot):
    import replayssm_kernels.mamba2_verify.kernel as k

    cfg = k.launch_config(80, 128, 20, 4, torch.bfloat16)._replace(n_chunks=n_chunks,
                                                                    kq_dot=kq_dot)
    with pytest.raises(ValueError, match=r"kq_dot: expected 0, or 1 with n_chunks > 1"):
        k.fma_layout(cfg, 128)


def test_options_refused_by_the_tensor_core_kernel():
    """``impl="dot"`` with an FMA layout option raises instead of ignoring it."""
    import replayssm_kernels.mamba2_verify.kernel as k

    gen = torch.Generator().manual_seed(0)
    shape = Shape(H=2, G=1, P=16, N=16)
    pool = tmv.make_pool(shape, 3, 12, torch.float32, torch.bfloat16, "layer", gen, DEVICE)
    prm = tmv.make_params(shape, gen, DEVICE)
    tok = tmv.make_tokens(shape, 1, 4, torch.bfloat16, gen, DEVICE, False)
    i = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    out = torch.empty(1, 4, shape.H, shape.P, dtype=torch.bfloat16, device=DEVICE)
    orig = k.launch_config
    k.launch_config = lambda *a, **kk: orig(*a, **kk)._replace(n_chunks=4)
    try:
        with pytest.raises(ValueError, match=r"n_chunks / kq_dot: FMA launch options"):
            k.mamba2_replay_verify_fwd(
                pool.state, pool.ring_x, pool.ring_dt, pool.ring_B, tok.x, tok.dt, prm.A, tok.B,
                tok.C, out, i + 1, i, i, i.bool(), D=None, z=None, dt_bias=prm.dt_bias,
                dt_softplus=True, stride_dt=tuple(tok.dt.stride()), stride_A_head=1,
                stride_D=(0, 0), stride_dt_bias_head=1, impl="dot")
    finally:
        k.launch_config = orig


def test_layout_rule():
    """The default launch keeps n_chunks = 1 and kq_dot = 0 at every T (its constexprs are
    launch_config's blocks); BLOCK_J is rounded up to one chunk, and to 16 with kq_dot."""
    import replayssm_kernels.mamba2_verify.kernel as k

    for T in (1, 2, 4, 8):
        cfg = k.launch_config(80, 128, 16 + T, T, torch.bfloat16)
        assert (cfg.n_chunks, cfg.kq_dot) == (1, 0)
        assert k.fma_layout(cfg, 128) == dict(BLOCK_J=cfg.block_j, BLOCK_K=cfg.block_k,
                                              N_CHUNKS=1, KQ_DOT=0)
    cfg = k.launch_config(80, 128, 20, 4, torch.bfloat16)  # BLOCK_J 32, BLOCK_K 32
    assert [k.fma_layout(cfg._replace(n_chunks=c), 128)["BLOCK_J"] for c in (2, 4, 8, 16)] == [
        64, 32, 32, 32]
    small = k.launch_config(12, 8, 6, 1, torch.bfloat16)  # BLOCK_J 8, BLOCK_K 8
    assert k.fma_layout(small._replace(n_chunks=2, kq_dot=1), 8) == dict(
        BLOCK_J=16, BLOCK_K=16, N_CHUNKS=2, KQ_DOT=1)


def test_bench_verify_selects_the_option():
    """``--mamba2-verify-launch n_chunks=4,kq_dot=1,block_p=16`` parses to the launch fields."""
    from benchmarks.bench_verify import parse_args

    cfg = parse_args(["--device", "cpu", "--out", "/tmp/unused",
                      "--mamba2-verify-launch", "n_chunks=4,kq_dot=1,block_p=16"])
    assert cfg.mamba2_verify_launch == {"n_chunks": 4, "kq_dot": 1, "block_p": 16}


#: Offline builds of the codegen test: the default launch and the two options, by key.
CODEGEN_LAUNCHES = {"default": {}, "nc4": dict(n_chunks=4), "nc4kq": dict(n_chunks=4, kq_dot=1)}


@functools.lru_cache(maxsize=None)
def _layout_codegen() -> dict | str:
    """Offline sm_90a builds (``bench_verify.offline_sm90a``) of ``CODEGEN_LAUNCHES`` at
    Nano-4B, T = 4, no copy: rows with PTX by key, or why not."""
    import json
    import os
    import subprocess
    import sys
    import tempfile

    script = ("import json, sys; sys.path.insert(0, sys.argv[1]); "
              "from benchmarks.bench_verify import offline_sm90a; "
              "rows = {k: offline_sm90a(4, (1,), impl='fma', reads=(None,), keep_ptx=True, "
              "launch=v or None)[0] for k, v in json.loads(sys.argv[3]).items()}; "
              "json.dump(rows, open(sys.argv[2], 'w'))")
    root = str(__import__("pathlib").Path(__file__).resolve().parents[2])
    env = {key: v for key, v in os.environ.items() if key != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory() as d:
        dst = os.path.join(d, "rows.json")
        proc = subprocess.run([sys.executable, "-c", script, root, dst,
                               json.dumps(CODEGEN_LAUNCHES)], env=env, capture_output=True,
                              text=True, timeout=900)
        err = proc.stderr.lower()
        if proc.returncode != 0 and "nvidia" in err and "backend" in err:
            return f"no NVIDIA Triton backend: {proc.stderr[-300:]}"
        assert proc.returncode == 0, proc.stderr[-3000:]
        with open(dst) as f:
            return json.load(f)


def test_layout_codegen_fold_and_reductions():
    """sm_90a, Nano-4B, T = 4, no copy: every fold site of the N-chunked path (``_fold_tile4``)
    compiles to SGLang's update (``fma(state, ex2(·), (Δ·B)·x)``) in both options; ``mma`` only
    with ``kq_dot``; the static ``shfl.sync`` count is under half the default launch's and the
    barriers drop (printed; at this commit 501 / 145 / 117 shuffles, 43 / 19 / 27 barriers:
    ``kq_dot`` stages its operands through shared memory in the prologue)."""
    import inspect

    from test_mamba2_decode import _update_signatures

    import replayssm_kernels.mamba2_verify.fma as f

    rows = _layout_codegen()
    if isinstance(rows, str):
        pytest.skip(rows)
    with open(inspect.getsourcefile(f)) as fh:
        src = fh.read().splitlines()
    start = next(i for i, line in enumerate(src) if line.startswith("def _fold_tile4("))
    end = next(i for i in range(start + 1, len(src)) if src[i].startswith("def "))
    lines = {i + 1 for i in range(start, end)
             if "tl.fma(b_s, dA, dB * b_xj.to(tl.float32))" in src[i]}
    assert len(lines) == 2
    expected = {("fma.rn.f32", "a=state", ("ex2.approx.f32",), (("mul.f32",),),
                 (("mul.f32", ("cvt.f32.bf16", "mul.f32")),))}
    for key in ("nc4", "nc4kq"):
        ptx = rows[key]["ptx"]
        sig = _update_signatures(ptx, "mamba2_verify/fma.py", lines)
        assert sig == expected, f"{key}: fold compiles to {sig}, SGLang's to {expected}"
        assert ("mma.sync" in ptx) == (key == "nc4kq"), key
    shfl = {k: row["ptx"].count("shfl.sync") for k, row in rows.items()}
    bar = {k: row["ptx"].count("bar.sync") for k, row in rows.items()}
    print("\n[mamba2-verify] sm_90a T=4 " + ", ".join(
        f"{k}: shfl.sync {shfl[k]}, bar.sync {bar[k]}, registers {row['regs']}, spill stores "
        f"{row['spill_st']} B" for k, row in rows.items()))
    assert "mma.sync" not in rows["default"]["ptx"]
    for key in ("nc4", "nc4kq"):
        assert 2 * shfl[key] < shfl["default"], shfl
        assert bar[key] < bar["default"], bar


# --------------------------------------------------------------------------------------------
# GPU (H200): the same drivers at the real shape
# --------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["nc2", "nc4", "nc8", "nc4bp16"])
@pytest.mark.parametrize("T", [2, 4, 8], ids=lambda t: f"T{t}")
def test_gpu_nano4b_layout_bitwise_vs_default(name, T):
    seen = split_lockstep(lambda s: None, [None, None], shape=NANO_4B, T=T, L=16, active=24,
                          pads=8, steps=12, seed=1000 + T, device="cuda",
                          impls=["kernel", name], out_rtol=LAYOUT_OUT_TOL[torch.bfloat16])
    print(f"\n[mamba2-verify] GPU {name} vs default T={T}: outputs {seen['out_rel']:.2e}")


@pytest.mark.gpu
@pytest.mark.parametrize("read_dtype,sr", [(F8, False), (torch.bfloat16, False), (None, True)],
                         ids=["fp8-copy", "bf16-copy", "fp16-SR"])
def test_gpu_nano4b_layout_bitwise_vs_default_read_copy_and_sr(read_dtype, sr):
    split_lockstep(lambda s: None, [None, None], shape=NANO_4B, T=4, L=16,
                   state_dtype=torch.float16 if sr else torch.float32, act_dtype=torch.bfloat16,
                   read_dtype=read_dtype, sr=sr, active=24, pads=8, steps=12, seed=1020,
                   device="cuda", impls=["kernel", "nc4"],
                   out_rtol=LAYOUT_OUT_TOL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("T", [2, 4, 8], ids=lambda t: f"T{t}")
def test_gpu_nano4b_layout_spec_vs_f64_and_sglang(T):
    rep = run_spec("nc4", NANO_4B, T, 16, torch.float32, torch.bfloat16, active=24, pads=8,
                   steps=48, seed=1040 + T, sglang_check=True)
    _check(rep, torch.float32, torch.bfloat16, T)
