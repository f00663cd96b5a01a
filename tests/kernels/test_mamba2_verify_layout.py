"""Mamba-2 verify, FMA: the N-chunked tile (``n_chunks``, ``kq_dot``) of the default launch.

``kernel.fma_layout`` / ``fma.py``: with ``n_chunks = NC > 1`` the checkpoint tile is held as
``[CQ, BLOCK_P, NC, VEC]`` so each thread keeps ``NC`` column chunks of its rows; a sum over N is
mostly in-thread, and the records' term joins each token's sum before the lanes are crossed.
``kq_dot = 1`` (with ``n_chunks > 1``) computes ``KᵀQ`` with ``tl.dot``. The default launch
(``fma_launch_config``, since the twelfth session's H200 sweep) takes ``n_chunks = 4`` for windows of
up to 4 tokens and ``n_chunks = 4, kq_dot = 1`` with 16-row tiles at 8 tokens (16-bit activations);
longer windows keep the whole-N tile (``n_chunks = 1``, here ``base4`` / ``base8``). Other launches
are selected the way ``bench_verify --mamba2-verify-launch n_chunks=8`` selects them: the field
overrides applied to ``launch_config``'s result for the duration of a call. The default launch
itself is checked against float64 and SGLang by ``test_mamba2_verify.py``.

What is checked (CPU: Triton interpreter; ``gpu``: the same driver at Nano-4B on the H200):

- the default launch in lockstep with the whole-N tile and with the other chunk counts on
  identical pools and inputs (``split_lockstep``): checkpoints (fp16 with stochastic rounding
  too), rings, read copies, fp8 scales and cursors bitwise after every step, outputs within
  ``LAYOUT_OUT_TOL``;
- the launch rule;
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
from test_mamba2_verify import NANO_4B, OUT_TOL, mamba2_replay_verify, split_lockstep
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


#: The launches under test, by driver key: the whole-N tile as the default launch had it before
#: (16-row tiles up to T = 4, ``base4``; 8-row tiles at T = 8, ``base8``; FMA outputs with a read
#: copy too, ``read_mma=0``), the N-chunked tile at 2, 4 and 8 chunks, with ``KᵀQ`` on tensor cores
#: (``kq``), 4 chunks with 16-row tiles, and that launch with the copy's outputs in FMAs
#: (``fm4``): the partner of a default that takes ``read_mma`` (every bf16 / fp8 copy at 4 and 8
#: tokens); ``one4``: ``read_mma`` in one launch, the partner of a default that splits the flush
#: rows off (``flush_split``: an fp8 copy at 4 tokens, every copy at 8).
_ONE = dict(flush_split=0, flush_kq_dot=0)  # one launch (without read_mma there is no split)
LAUNCHES = {"base4": dict(n_chunks=1, kq_dot=0, read_mma=0, **_ONE),
            "base8": dict(n_chunks=1, kq_dot=0, block_p=8, read_mma=0, **_ONE),
            "nc2": dict(n_chunks=2), "nc4": dict(n_chunks=4), "nc8": dict(n_chunks=8),
            "nc2kq": dict(n_chunks=2, kq_dot=1), "nc4kq": dict(n_chunks=4, kq_dot=1),
            "nc8kq": dict(n_chunks=8, kq_dot=1),
            "nc4kqbp16": dict(n_chunks=4, kq_dot=1, block_p=16),
            "fm4": dict(n_chunks=4, kq_dot=1, block_p=16, read_mma=0, **_ONE),
            "one4": dict(n_chunks=4, kq_dot=1, block_p=16, read_mma=1, **_ONE)}
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


# (partner launch, T) pairs in lockstep with the default launch: the whole-N tile at every
# window form of the rule, the other chunk counts once each (P = 80: 0.5-2 min each under the
# interpreter).
LOCKSTEP_CASES = [("base4", 1), ("base4", 4), ("base8", 8), ("nc2", 4), ("nc8kq", 8)]


@pytest.mark.parametrize("name,T", LOCKSTEP_CASES, ids=[f"{n}-T{t}" for n, t in LOCKSTEP_CASES])
def test_layout_bitwise_vs_default(name, T):
    """Default launch and ``name`` in lockstep (flush, non-flush and padding rows, random
    accepted counts): checkpoints, rings and cursors bitwise after every step, outputs within
    ``LAYOUT_OUT_TOL`` of the default's."""
    seen = split_lockstep(lambda s: None, [None, None], shape=SHAPE_L, T=T, L=max(6, T + 4),
                          seed=200 + T, steps=4, impls=["kernel", name],
                          out_rtol=LAYOUT_OUT_TOL[torch.bfloat16])
    print(f"\n[mamba2-verify] {name} vs default T={T}: outputs {seen['out_rel']:.2e}, "
          f"checkpoints / rings / cursors bitwise ({seen['flush']} flush, {seen['nonflush']} "
          f"non-flush, {seen['pad']} padding rows)")


@pytest.mark.usefixtures("interpreter_fp16_fp8_rtne")
@pytest.mark.parametrize("T,read_dtype,state_dtype,act_dtype,sr,base", [
    (4, torch.bfloat16, torch.float32, torch.bfloat16, False, "base4"),
    (2, None, torch.float16, torch.float32, True, "base4"),
    (8, F8, torch.float16, torch.bfloat16, True, "base8"),
    (4, torch.bfloat16, torch.float32, torch.bfloat16, False, "fm4"),
    (4, F8, torch.float16, torch.bfloat16, True, "fm4"),
    (4, F8, torch.float32, torch.bfloat16, False, "one4")],
    ids=["T4-bf16-copy", "T2-fp16-SR-act32", "T8-fp8-copy-fp16-SR", "T4-bf16-copy-fma-outputs",
         "T4-fp8-copy-fp16-SR-fma-outputs", "T4-fp8-copy-one-launch"])
def test_layout_bitwise_vs_default_read_copy_and_sr(T, read_dtype, state_dtype, act_dtype, sr,
                                                    base):
    """Read copies (the fp8 row max is over all of N in either layout), their scales and SR
    checkpoints bitwise the whole-N tile's."""
    seen = split_lockstep(lambda s: None, [None, None], shape=SHAPE_L, T=T, L=T + 4,
                          state_dtype=state_dtype, act_dtype=act_dtype, read_dtype=read_dtype,
                          sr=sr, seed=240 + T, steps=4, impls=["kernel", base],
                          out_rtol=LAYOUT_OUT_TOL[act_dtype])
    print(f"\n[mamba2-verify] default vs {base} T={T} copy={str(read_dtype)[6:]} "
          f"state={str(state_dtype)[6:]} act={str(act_dtype)[6:]} SR={sr}: outputs "
          f"{seen['out_rel']:.2e}, checkpoints / rings / copies bitwise")


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


def _one_row_step():
    """A one-row, T = 4 verify step's pool, parameters, tokens, output and ``i = [0]`` (slot
    ``i + 1``, empty ring) at a tiny shape: the arguments of the launch-option refusals."""
    gen = torch.Generator().manual_seed(0)
    shape = Shape(H=2, G=1, P=16, N=16)
    pool = tmv.make_pool(shape, 3, 12, torch.float32, torch.bfloat16, "layer", gen, DEVICE)
    prm = tmv.make_params(shape, gen, DEVICE)
    tok = tmv.make_tokens(shape, 1, 4, torch.bfloat16, gen, DEVICE, False)
    i = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    out = torch.empty(1, 4, shape.H, shape.P, dtype=torch.bfloat16, device=DEVICE)
    return pool, prm, tok, out, i


@pytest.mark.parametrize("fields,read", [
    (dict(read_mma=1, kq_dot=0), torch.bfloat16),
    (dict(n_chunks=4, kq_dot=1, read_mma=1), None),
    (dict(n_chunks=4, kq_dot=1, read_mma=1), torch.float16),
    (dict(n_chunks=4, kq_dot=1, read_mma=2), torch.bfloat16)],
    ids=["without-kq_dot", "without-copy", "fp16-copy", "value-2"])
def test_read_mma_value_error(fields, read):
    """``read_mma`` other than 0 / 1, or 1 without ``kq_dot``, without a read copy or with a
    copy whose values are not exact bf16 operands, raises before any launch."""
    pool, prm, tok, out, i = _one_row_step()
    kw = {}
    if read is not None:
        kw["read_state"] = pool.state.to(read)
    with pytest.raises(ValueError, match=r"read_mma"):
        _forced_launch(**fields)(
            pool.state, pool.ring_x, pool.ring_dt, pool.ring_B, tok.x, tok.dt, prm.A, tok.B, tok.C,
            out, i + 1, i, i, i.bool(), dt_bias=prm.dt_bias, dt_softplus=True, **kw)


def test_flush_split_without_read_mma_value_error():
    """``flush_split`` splits the flush rows off a ``read_mma`` launch: without ``read_mma`` it
    raises before any launch."""
    pool, prm, tok, out, i = _one_row_step()
    with pytest.raises(ValueError, match=r"flush_split=1: expected read_mma=1 .*set flush_split=0,"
                                         r"flush_kq_dot=0"):
        _forced_launch(n_chunks=4, kq_dot=1, read_mma=0, flush_split=1)(
            pool.state, pool.ring_x, pool.ring_dt, pool.ring_B, tok.x, tok.dt, prm.A, tok.B, tok.C,
            out, i + 1, i, i, i.bool(), dt_bias=prm.dt_bias, dt_softplus=True,
            read_state=pool.state.to(torch.bfloat16))


@pytest.mark.parametrize("fields,match", [
    (dict(flush_kq_dot=2), r"flush_split / flush_kq_dot: expected 0 or 1"),
    (dict(flush_split=-1), r"flush_split / flush_kq_dot: expected 0 or 1"),
    (dict(flush_kq_dot=1), r"flush_kq_dot=1: expected flush_split=1")],
    ids=["flush_kq_dot-2", "flush_split-minus-1", "flush_kq_dot-without-flush_split"])
def test_flush_split_fields_value_error(fields, match):
    """``flush_split`` / ``flush_kq_dot`` other than 0 / 1, or ``flush_kq_dot`` without
    ``flush_split``, raise before any launch."""
    pool, prm, tok, out, i = _one_row_step()
    with pytest.raises(ValueError, match=match):
        _forced_launch(**fields)(
            pool.state, pool.ring_x, pool.ring_dt, pool.ring_B, tok.x, tok.dt, prm.A, tok.B, tok.C,
            out, i + 1, i, i, i.bool(), dt_bias=prm.dt_bias, dt_softplus=True)


def test_options_refused_by_the_tensor_core_kernel():
    """``impl="dot"`` with an FMA layout option raises instead of ignoring it."""
    import replayssm_kernels.mamba2_verify.kernel as k

    pool, prm, tok, out, i = _one_row_step()
    orig = k.launch_config
    k.launch_config = lambda *a, **kk: orig(*a, **kk)._replace(n_chunks=4)
    try:
        with pytest.raises(ValueError, match=r"n_chunks / kq_dot / read_mma: FMA launch options"):
            k.mamba2_replay_verify_fwd(
                pool.state, pool.ring_x, pool.ring_dt, pool.ring_B, tok.x, tok.dt, prm.A, tok.B,
                tok.C, out, i + 1, i, i, i.bool(), D=None, z=None, dt_bias=prm.dt_bias,
                dt_softplus=True, stride_dt=tuple(tok.dt.stride()), stride_A_head=1,
                stride_D=(0, 0), stride_dt_bias_head=1, impl="dot")
    finally:
        k.launch_config = orig


def test_layout_rule():
    """The default launch by window (``fma_launch_config``): 4 N-chunks at up to 4 tokens (128-
    register cap), 4 N-chunks with ``KᵀQ`` on tensor cores and 16-row tiles at 8 tokens with 16-bit
    activations, the whole-N tile otherwise; BLOCK_J is rounded up to one chunk, and to 16 with
    kq_dot."""
    import replayssm_kernels.mamba2_verify.kernel as k

    def form(T, act=torch.bfloat16, P=80, N=128):
        c = k.launch_config(P, N, 16 + T, T, act)
        return c.block_p, c.n_chunks, c.kq_dot, c.maxnreg, c.num_warps

    for T in (1, 2, 3, 4):
        assert form(T) == form(T, torch.float32) == (16, 4, 0, 128, 2)
    assert form(8) == form(5, torch.float16) == (16, 4, 1, None, 2)
    assert form(8, torch.float32) == form(16) == (8, 1, 0, None, 2)
    assert form(4, N=2)[:3] == (16, 2, 0) and form(8, N=2)[:3] == (16, 2, 1)  # n_chunks <= BLOCK_N
    cfg = k.launch_config(80, 128, 24, 8, torch.bfloat16)
    assert k.fma_layout(cfg, 128) == dict(BLOCK_J=32, BLOCK_K=32, N_CHUNKS=4, KQ_DOT=1)
    cfg = k.launch_config(80, 128, 20, 4, torch.bfloat16)  # BLOCK_J 32, BLOCK_K 32
    assert [k.fma_layout(cfg._replace(n_chunks=c), 128)["BLOCK_J"] for c in (1, 2, 4, 8, 16)] == [
        32, 64, 32, 32, 32]
    small = k.launch_config(12, 8, 6, 1, torch.bfloat16)  # BLOCK_J 8, BLOCK_K 8
    assert k.fma_layout(small._replace(n_chunks=2, kq_dot=1), 8) == dict(
        BLOCK_J=16, BLOCK_K=16, N_CHUNKS=2, KQ_DOT=1)


def test_read_mma_rule():
    """``read_mma`` (with ``kq_dot``) by default where it was timed faster: bf16 activations and a
    bf16 or fp8 copy at 4 (3) and 8 tokens; not below 4 tokens, without a copy, with an fp16 copy
    or fp16 activations; the rest of the launch as without a copy."""
    import replayssm_kernels.mamba2_verify.kernel as k

    bf, f8, f16 = torch.bfloat16, torch.float8_e4m3fn, torch.float16

    def mma(T, read, act=bf):
        c = k.launch_config(80, 128, 16 + T, T, act, read_dtype=read)
        plain = k.launch_config(80, 128, 16 + T, T, act)
        assert c._replace(read_mma=0, kq_dot=0, flush_split=0, flush_kq_dot=0) == \
            plain._replace(kq_dot=0)
        assert c.kq_dot >= c.read_mma
        return c.read_mma

    assert mma(8, bf) == mma(8, f8) == mma(4, bf) == mma(4, f8) == mma(3, bf) == 1
    assert mma(2, bf) == mma(1, f8) == mma(4, None) == mma(8, None) == mma(8, f16) == 0
    assert mma(8, bf, f16) == mma(4, bf, torch.float32) == mma(16, bf) == 0
    assert k.launch_config(80, 128, 20, 4, bf, read_dtype=bf).kq_dot == 1
    assert k.launch_config(80, 128, 20, 4, bf, read_dtype=f8).kq_dot == 1
    # tl.dot's 16-row / 16-column minimum: not below 16 checkpoint rows or 16 columns of N
    assert k.launch_config(8, 128, 24, 8, bf, read_dtype=bf).read_mma == 0
    assert k.launch_config(80, 8, 24, 8, bf, read_dtype=bf).read_mma == 0


def test_flush_split_rule():
    """``flush_split`` by default where it was timed faster: with ``read_mma`` at 8 tokens (either
    copy) and with an fp8 copy at 4 (3); the flush launch's ``kq_dot`` (``flush_kq_dot``) as
    without a copy (1 at 8 tokens, 0 at 4)."""
    import replayssm_kernels.mamba2_verify.kernel as k

    bf, f8 = torch.bfloat16, torch.float8_e4m3fn

    def split(T, read):
        c = k.launch_config(80, 128, 16 + T, T, bf, read_dtype=read)
        assert c.flush_kq_dot == (k.launch_config(80, 128, 16 + T, T, bf).kq_dot
                                  if c.flush_split else 0)
        return c.flush_split, c.flush_kq_dot

    assert split(8, bf) == split(8, f8) == (1, 1)
    assert split(4, f8) == split(3, f8) == (1, 0)
    assert split(4, bf) == split(3, bf) == split(2, f8) == split(4, None) == split(8, None) == (
        0, 0)


def test_bench_verify_selects_the_option():
    """``--mamba2-verify-launch n_chunks=4,kq_dot=1,block_p=16`` parses to the launch fields."""
    from benchmarks.bench_verify import parse_args

    cfg = parse_args(["--device", "cpu", "--out", "/tmp/unused",
                      "--mamba2-verify-launch", "n_chunks=4,kq_dot=1,block_p=16"])
    assert cfg.mamba2_verify_launch == {"n_chunks": 4, "kq_dot": 1, "block_p": 16}


#: Offline builds of the codegen test at T = 4: the whole-N tile, the default launch (4 chunks)
#: and 4 chunks with ``KᵀQ`` on tensor cores, by key.
CODEGEN_LAUNCHES = {"base": dict(n_chunks=1), "default": {}, "nc4kq": dict(n_chunks=4, kq_dot=1)}


@functools.lru_cache(maxsize=None)
def _layout_codegen() -> dict | str:
    """Offline sm_90a builds (``bench_verify.offline_sm90a``) of ``CODEGEN_LAUNCHES`` at
    Nano-4B, T = 4, no copy: rows with PTX by key, or why not."""
    return tmv.offline_rows(
        "{k: offline_sm90a(4, (1,), impl='fma', reads=(None,), keep_ptx=True, launch=v or None)[0] "
        f"for k, v in {CODEGEN_LAUNCHES!r}.items()}}")


def test_layout_codegen_fold_and_reductions():
    """sm_90a, Nano-4B, T = 4, no copy: every fold site of the N-chunked path (``_fold_tile4``)
    compiles to SGLang's update (``fma(state, ex2(·), (Δ·B)·x)``) in the default launch and with
    ``kq_dot``; ``mma`` only with ``kq_dot``; the static ``shfl.sync`` count is under half the
    whole-N tile's and the barriers drop (printed; at 2676cb4 501 / 145 / 117 shuffles, 43 / 19 /
    27 barriers: ``kq_dot`` stages its operands through shared memory in the prologue)."""
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
    for key in ("default", "nc4kq"):
        ptx = rows[key]["ptx"]
        sig = _update_signatures(ptx, "mamba2_verify/fma.py", lines)
        assert sig == expected, f"{key}: fold compiles to {sig}, SGLang's to {expected}"
        assert ("mma.sync" in ptx) == (key == "nc4kq"), key
    shfl = {k: row["ptx"].count("shfl.sync") for k, row in rows.items()}
    bar = {k: row["ptx"].count("bar.sync") for k, row in rows.items()}
    print("\n[mamba2-verify] sm_90a T=4 " + ", ".join(
        f"{k}: shfl.sync {shfl[k]}, bar.sync {bar[k]}, registers {row['regs']}, spill stores "
        f"{row['spill_st']} B" for k, row in rows.items()))
    assert "mma.sync" not in rows["base"]["ptx"]
    for key in ("default", "nc4kq"):
        assert 2 * shfl[key] < shfl["base"], shfl
        assert bar[key] < bar["base"], bar


def test_read_mma_codegen():
    """sm_90a, Nano-4B, fp8 copy: the default launches' non-flush builds at T = 8 and T = 4
    (``read_mma`` and ``flush_split`` by the rule) compile the copy's ``S·C`` to bf16 tensor-core
    products (``mma.sync`` with bf16 operands, the exact form the interpreter cannot run); the
    T = 4 one launch with ``read_mma`` and ``kq_dot`` off (FMA outputs) has no tensor-core
    product; the ``read_mma`` builds spill at most 8 B (the FMA-output T = 4 build: 12 B); at
    T = 8 the non-flush build takes fewer registers than ``read_mma`` in one launch (96 against
    239 at the commit that made the split a default: what made it faster)."""
    one = "'flush_split': 0, 'flush_kq_dot': 0"
    rows = tmv.offline_rows(
        "[offline_sm90a(8, (1,), impl='fma', reads=('fp8',), keep_ptx=True)[0], "
        "offline_sm90a(4, (1,), impl='fma', reads=('fp8',), keep_ptx=True)[0], "
        "offline_sm90a(4, (1,), impl='fma', reads=('fp8',), keep_ptx=True, "
        f"launch={{'kq_dot': 0, 'read_mma': 0, {one}}})[0], "
        f"offline_sm90a(8, (1,), impl='fma', reads=('fp8',), launch={{{one}}})[0]]")
    if isinstance(rows, str):
        pytest.skip(rows)
    bf16_mma = [row["ptx"].count("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32")
                for row in rows[:3]]
    print(f"\n[mamba2-verify] sm_90a fp8 copy, bf16 mma.sync (T8 default / T4 default / T4 "
          f"FMA outputs): {bf16_mma}; spill stores {[row['spill_st'] for row in rows]} B; "
          f"T8 registers non-flush build / one launch: {rows[0]['regs']} / {rows[3]['regs']}")
    assert [(row["read_mma"], row["rows"]) for row in rows] == [(1, 2), (1, 2), (0, 0), (1, 0)]
    assert bf16_mma[0] > 0 and bf16_mma[1] > 0 and "mma.sync" not in rows[2]["ptx"]
    assert rows[0]["spill_st"] <= 8 and rows[1]["spill_st"] <= 8
    assert rows[0]["regs"] < rows[3]["regs"]


# --------------------------------------------------------------------------------------------
# GPU (H200): the same driver at the real shape
# --------------------------------------------------------------------------------------------

#: (partner launch, T) pairs in lockstep with the default launch on the H200.
GPU_LOCKSTEP_CASES = [("base4", 2), ("base4", 4), ("base8", 8), ("nc2", 4), ("nc8", 4),
                      ("nc4kq", 4)]


@pytest.mark.gpu
@pytest.mark.parametrize("name,T", GPU_LOCKSTEP_CASES,
                         ids=[f"{n}-T{t}" for n, t in GPU_LOCKSTEP_CASES])
def test_gpu_nano4b_layout_bitwise_vs_default(name, T):
    seen = split_lockstep(lambda s: None, [None, None], shape=NANO_4B, T=T, L=16, active=24,
                          pads=8, steps=12, seed=1000 + T, device="cuda",
                          impls=["kernel", name], out_rtol=LAYOUT_OUT_TOL[torch.bfloat16])
    print(f"\n[mamba2-verify] GPU {name} vs default T={T}: outputs {seen['out_rel']:.2e}")


@pytest.mark.gpu
@pytest.mark.parametrize("T,read_dtype,sr", [(4, F8, False), (4, torch.bfloat16, False),
                                             (4, None, True), (8, F8, False)],
                         ids=["T4-fp8-copy", "T4-bf16-copy", "T4-fp16-SR", "T8-fp8-copy"])
def test_gpu_nano4b_layout_bitwise_vs_default_read_copy_and_sr(T, read_dtype, sr):
    split_lockstep(lambda s: None, [None, None], shape=NANO_4B, T=T, L=16,
                   state_dtype=torch.float16 if sr else torch.float32, act_dtype=torch.bfloat16,
                   read_dtype=read_dtype, sr=sr, active=24, pads=8, steps=12, seed=1020,
                   device="cuda", impls=["kernel", "base4" if T <= 4 else "base8"],
                   out_rtol=LAYOUT_OUT_TOL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("T,read_dtype,partner", [(4, F8, "fm4"), (4, torch.bfloat16, "fm4"),
                                                  (8, F8, "fm4"), (8, torch.bfloat16, "fm4"),
                                                  (4, F8, "one4")],
                         ids=["T4-fp8-copy", "T4-bf16-copy", "T8-fp8-copy", "T8-bf16-copy",
                              "T4-fp8-copy-one-launch"])
def test_gpu_nano4b_read_mma_vs_default(T, read_dtype, partner):
    """The copy's non-flush outputs on tensor cores against the same launch's FMA outputs at
    Nano-4B, in lockstep with the default (``read_mma`` where the default takes it, so the partner
    is the other choice): checkpoints, copies, scales, rings and cursors bitwise, outputs within
    ``LAYOUT_OUT_TOL``."""
    seen = split_lockstep(lambda s: None, [None, None], shape=NANO_4B, T=T, L=16,
                          state_dtype=torch.float32, act_dtype=torch.bfloat16,
                          read_dtype=read_dtype, active=24, pads=8, steps=12, seed=1040 + T,
                          device="cuda", impls=["kernel", partner],
                          out_rtol=LAYOUT_OUT_TOL[torch.bfloat16])
    print(f"\n[mamba2-verify] GPU default vs {partner} T={T} copy={str(read_dtype)[6:]}: outputs "
          f"{seen['out_rel']:.2e}")
