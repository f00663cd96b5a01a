"""``refresh_read_copy`` (fused Triton refresh of the split-precision read copy) against its torch
reference ``refresh_read_copy_ref`` and the unfused pool path it replaced (``quantize_rows`` of a
gather, then a scatter), bitwise.

Cases: bf16 / fp16 / fp8 copies of fp32, bf16 and fp16 checkpoints (the copy strictly narrower
than the checkpoint, as the serving plug-in requires), Mamba-2 (head dim ``P = 80``, not a power of
two; ``N = 24``, a masked column block) and GDN ``[HV, V, K]`` shapes, contiguous pools and
non-contiguous views (strided slot and layer dims, permuted row dims, a strided last dim), every
layer, one layer by ``layer_idx``, one layer's 4-D view. Every call: the copy and scales of every
touched (layer, slot) equal ``quantize_rows`` of its checkpoint bit for bit; everything else (the
copy's NaN poison included, so untouched slots, padding and the null slot 0) is bit-identical to
before; touched slots were NaN-poisoned, so each of their bytes was written.

On CPU the kernel runs under the Triton interpreter (``interpreter_fp16_fp8_rtne``: fp32 -> fp16 /
fp8 rounding as on the GPU); the GPU tests (``@pytest.mark.gpu``) run the real shapes and a
CUDA-graph capture.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import pytest
import torch

from replayssm_kernels.mamba2_decode.read_copy import quantize_rows
from replayssm_kernels.read_copy_refresh import refresh_read_copy, refresh_read_copy_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32, BF16, F16, F8 = torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn

pytestmark = [
    pytest.mark.usefixtures("interpreter_fp16_fp8_rtne"),
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),
    # the interpreter's fp32 -> fp16 cast of values past 65504 (inf, as on the GPU and in torch)
    pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning"),
]

#: (checkpoint dtype, copy dtype): the copy strictly narrower than the checkpoint
PAIRS = [(F32, BF16), (F32, F16), (F32, F8), (BF16, F8), (F16, F8)]
OPS = {"kernel": refresh_read_copy, "ref": refresh_read_copy_ref}


@dataclass(frozen=True)
class Shape:
    name: str
    A: int  # Mamba-2 H, GDN HV
    B: int  # Mamba-2 P, GDN V
    n: int  # Mamba-2 N, GDN K (the scaled dim)


SHAPES = [Shape("mamba2-P80", 2, 80, 24), Shape("gdn", 3, 16, 32)]


def _pid(p):
    return f"{str(p[0])[6:]}-{str(p[1])[6:]}"


def _checkpoint(full_shape, dtype, gen) -> torch.Tensor:
    """Finite rows of very different magnitudes (2^-30 .. 2^20, 2^9 for an fp16 checkpoint; fp16
    copies overflowing to inf and subnormals included),
    a few all-zero rows, rows whose max is an exact power of two, and fp32 values halfway between
    two bf16 values (ties to even)."""
    t = torch.randn(full_shape, generator=gen)
    hi = 10 if dtype == torch.float16 else 21  # finite checkpoints (an fp16 one stays below 65504)
    mag = torch.exp2(torch.randint(-30, hi, full_shape[:-1], generator=gen).float())[..., None]
    t = t * mag
    rows = t.view(-1, full_shape[-1])
    r = rows.shape[0]
    rows[torch.randperm(r, generator=gen)[: max(1, r // 16)]] = 0.0
    pw = torch.randperm(r, generator=gen)[: max(1, r // 16)]
    rows[pw] = rows[pw].clamp(-0.5, 0.5)
    rows[pw, 0] = torch.exp2(torch.randint(-20, 10, (pw.numel(),), generator=gen).float())
    ties = torch.randperm(r, generator=gen)[: max(1, r // 16)]
    tie_shape = (ties.numel(), full_shape[-1])
    e = torch.randint(110, 140, tie_shape, generator=gen, dtype=torch.int32)  # biased exponents
    m = torch.randint(0, 1 << 7, tie_shape, generator=gen, dtype=torch.int32)
    sign = torch.randint(0, 2, tie_shape, generator=gen, dtype=torch.int32) << 31
    rows[ties] = (sign | (e << 23) | (m << 16) | 0x8000).view(torch.float32)  # exactly half a bf16 ulp
    return t.to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8) if t.element_size() == 1 else t.contiguous().view(
        {2: torch.int16, 4: torch.int32}[t.element_size()])


def _assert_bits(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape, what
    diff = (_bits(a) != _bits(b))
    assert not diff.any(), f"{what}: {int(diff.sum())} elements differ"


@dataclass
class Pool:
    state: torch.Tensor  # [layers, slots, A, B, n] view
    read: torch.Tensor
    scale: torch.Tensor | None


def _alloc(layers, slots, shape: Shape, pair, layout: str, gen) -> Pool:
    """Pool tensors in a layout: ``contig``, or ``strided`` (each tensor a view into a larger
    allocation: slots interleaved with a second pool, row dims permuted in memory, the checkpoint's
    last dim strided)."""
    sd, rd = pair
    A, B, n = shape.A, shape.B, shape.n
    if layout == "contig":
        state = _checkpoint((layers, slots, A, B, n), sd, gen).to(DEVICE)
        read = torch.full((layers, slots, A, B, n), math.nan).to(rd).to(DEVICE)
        scale = torch.full((layers, slots, A, B), math.nan, device=DEVICE) if rd == F8 else None
        return Pool(state, read, scale)
    # [slots, 2, layers, B, A, 2n] -> [:, 1, :, :, :, ::2] permuted to [layers, slots, A, B, n]
    full = _checkpoint((slots, 2, layers, B, A, 2 * n), sd, gen).to(DEVICE)
    state = full[:, 1, :, :, :, ::2].permute(1, 0, 3, 2, 4)
    rfull = torch.full((layers, slots, 2, B, A, n), math.nan).to(rd).to(DEVICE)
    read = rfull[:, :, 0].permute(0, 1, 3, 2, 4)
    scale = None
    if rd == F8:
        sfull = torch.full((slots, layers, A, 3, B), math.nan, device=DEVICE)
        scale = sfull[:, :, :, 2].transpose(0, 1)
    assert not state.is_contiguous() and not read.is_contiguous()
    return Pool(state, read, scale)


def _unfused(pool: Pool, idx: torch.Tensor, layer_idx: int | None):
    """The pool's previous code (``quantize_rows(temporal[:, idx])`` + scatter) on the valid
    entries, on copies: the expected copy and scales."""
    read, scale = pool.read.clone(), None if pool.scale is None else pool.scale.clone()
    ok = idx[idx >= 0].long()
    if ok.numel():
        if layer_idx is None:
            q, sc = quantize_rows(pool.state[:, ok], read.dtype)
            read[:, ok] = q
            if sc is not None:
                scale[:, ok] = sc
        else:
            q, sc = quantize_rows(pool.state[layer_idx, ok], read.dtype)
            read[layer_idx, ok] = q
            if sc is not None:
                scale[layer_idx, ok] = sc
    return read, scale


def _check_call(op, pool: Pool, idx: torch.Tensor, layer_idx: int | None, mode: str) -> None:
    """Run ``op`` (``mode``: all layers, ``layer_idx``, or the 4-D view of one layer) and check it
    against the unfused path, per (layer, slot)."""
    want_read, want_scale = _unfused(pool, idx, layer_idx)
    before_read = pool.read.clone()
    state_before = pool.state.clone()
    if mode == "view4d":
        op(pool.state[layer_idx], pool.read[layer_idx],
           None if pool.scale is None else pool.scale[layer_idx], idx)
    else:
        op(pool.state, pool.read, pool.scale, idx, layer_idx=layer_idx)
    _assert_bits(pool.state, state_before, "checkpoint (read only)")
    _assert_bits(pool.read, want_read, "copy")
    if pool.scale is not None:
        _assert_bits(pool.scale, want_scale, "scales")
    # Touched rows were NaN before: every element written (and no NaN from a finite checkpoint).
    touched = sorted({int(s) for s in idx.tolist() if s >= 0})
    layers = range(pool.state.shape[0]) if layer_idx is None else [layer_idx]
    for lyr in layers:
        for s in range(pool.state.shape[1]):
            if s in touched:
                assert not torch.isnan(pool.read[lyr, s].float()).any()
                q, sc = quantize_rows(pool.state[lyr, s], pool.read.dtype)
                _assert_bits(pool.read[lyr, s], q, f"copy of layer {lyr} slot {s}")
                if sc is not None:
                    _assert_bits(pool.scale[lyr, s], sc, f"scales of layer {lyr} slot {s}")
            else:
                _assert_bits(pool.read[lyr, s], before_read[lyr, s], f"untouched layer {lyr} slot {s}")


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("layout", ["contig", "strided"])
@pytest.mark.parametrize("pair", PAIRS, ids=_pid)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_refresh_bitwise(shape, pair, layout, op):
    gen = torch.Generator().manual_seed(zlib.crc32(f"{shape.name}-{_pid(pair)}-{layout}".encode()))
    layers, slots = 3, 7
    pool = _alloc(layers, slots, shape, pair, layout, gen)
    fn = OPS[op]
    # All layers, int64 slots with padding (slot 0 never named: the padding must not reach it), a
    # duplicate entry.
    _check_call(fn, pool, torch.tensor([3, -1, 5, 3, -1], device=DEVICE), None, "all")
    # One layer, int32 slots (a strided view of a longer index buffer), slot 0 named explicitly.
    buf = torch.tensor([1, 99, -1, 99, 0, 99, 6, 99], dtype=torch.int32, device=DEVICE)
    _check_call(fn, pool, buf[::2], 1, "layer_idx")
    # One layer's 4-D view (the decode kernels' per-layer tensors).
    _check_call(fn, pool, torch.tensor([2, 4], device=DEVICE), 2, "view4d")
    # Only padding, and no entries at all: nothing written.
    _check_call(fn, pool, torch.tensor([-1, -1], device=DEVICE), None, "all")
    _check_call(fn, pool, torch.zeros(0, dtype=torch.int64, device=DEVICE), 0, "layer_idx")


@pytest.mark.parametrize("pair", PAIRS, ids=_pid)
def test_kernel_equals_reference_and_unfused_on_the_whole_pool(pair):
    """Every slot of every layer from a NaN-poisoned copy: kernel == reference == ``quantize_rows``
    of the whole checkpoint (what the pool's allocation used to do)."""
    gen = torch.Generator().manual_seed(7)
    shape = SHAPES[0]
    k = _alloc(2, 5, shape, pair, "strided", gen)
    r = Pool(k.state, k.read.clone(), None if k.scale is None else k.scale.clone())
    idx = torch.arange(5, device=DEVICE)
    refresh_read_copy(k.state, k.read, k.scale, idx)
    refresh_read_copy_ref(r.state, r.read, r.scale, idx)
    q, sc = quantize_rows(k.state, pair[1])
    _assert_bits(k.read, q, "kernel copy")
    _assert_bits(r.read, q, "reference copy")
    if sc is not None:
        _assert_bits(k.scale, sc, "kernel scales")
        _assert_bits(r.scale, sc, "reference scales")


def test_fp8_scale_rule_edges():
    """fp8 rows at the scale rule's edges: zero rows (floor scale ``2^-126``, zero values), a row max
    exactly ``2^E`` and just below ``2^(E+1)`` (scaled ``[-256, 256)``), tiny rows near the floor,
    and a row with a single non-zero element."""
    n = 24
    vals = torch.zeros(8, n)
    vals[1, 3] = 2.0 ** 5
    vals[2, :] = torch.linspace(-1, 1, n) * (2.0 ** 6 - 2.0 ** -17)
    vals[3, :] = torch.linspace(-1, 1, n) * 2.0 ** -118
    vals[4, :] = torch.linspace(-1, 1, n) * 2.0 ** -125
    vals[5, 7] = -(2.0 ** 100)
    vals[6, :] = torch.arange(n) * 0.37 - 4.0
    vals[7, :] = 255.9 * torch.sign(torch.randn(n, generator=torch.Generator().manual_seed(0)))
    state = vals.view(1, 1, 2, 4, n).expand(1, 2, 2, 4, n).contiguous().to(DEVICE)
    for op in OPS.values():
        read = torch.full(state.shape, math.nan).to(F8).to(DEVICE)
        scale = torch.full(state.shape[:-1], math.nan, device=DEVICE)
        op(state, read, scale, torch.tensor([1], device=DEVICE))
        q, sc = quantize_rows(state[:, 1], F8)
        _assert_bits(read[:, 1], q, "copy")
        _assert_bits(scale[:, 1], sc, "scales")
        assert torch.all(scale[0, 1, 0, 0] == 2.0 ** -126) and torch.all(read[0, 1, 0, 0].float() == 0)
        assert torch.isnan(scale[:, 0]).all()  # slot 0 untouched


def test_kernel_launch_grid(launch_spy):
    """One launch per call; padding programs exit (grid over every entry, the kernel skips them);
    no launch for an empty index."""
    from replayssm_kernels.read_copy_refresh import kernel as mod

    spy = launch_spy(mod, "_refresh_read_copy_kernel")
    gen = torch.Generator().manual_seed(3)
    pool = _alloc(3, 4, SHAPES[0], (F32, F8), "contig", gen)
    refresh_read_copy(pool.state, pool.read, pool.scale, torch.tensor([1, -1, 2], device=DEVICE))
    refresh_read_copy(pool.state, pool.read, pool.scale, torch.tensor([1], device=DEVICE), layer_idx=2)
    refresh_read_copy(pool.state, pool.read, pool.scale, torch.zeros(0, dtype=torch.int32, device=DEVICE))
    assert len(spy.launches) == 2
    (g0, kw0), (g1, _) = spy.launches
    assert g0[0] == 3 and g0[2] == 3 and g1[0] == 1 and g1[2] == 1
    assert kw0["READ_FP8"] is True and kw0["BLOCK_N"] == 32


# ------------------------------------------------------------------ validation


def _valid():
    state = torch.zeros(2, 3, 2, 4, 8, device=DEVICE)
    return dict(state=state, read_state=torch.zeros(state.shape, dtype=F8, device=DEVICE),
                read_scale=torch.zeros(state.shape[:-1], device=DEVICE),
                slots=torch.tensor([1, -1], device=DEVICE))


def _bad_cases():
    v = _valid()
    st, rs, sc, sl = v["state"], v["read_state"], v["read_scale"], v["slots"]
    return [
        ("rank", dict(state=st[0, 0]), {}, r"state: expected shape \(layers, slots, A, B, n\).*got \(2, 4, 8\)"),
        ("state dtype", dict(state=st.double(), read_state=rs), {}, r"state: expected dtype in .*got torch.float64"),
        ("no copy", dict(read_state=None, read_scale=None), {}, r"read_state: expected a tensor of shape .*got None"),
        ("copy shape", dict(read_state=rs[:, :2], read_scale=sc[:, :2]), {},
         r"read_state: expected shape \(2, 3, 2, 4, 8\), got \(2, 2, 2, 4, 8\)"),
        ("copy dtype", dict(read_state=rs.float()), {}, r"read_state: expected dtype in .*got torch.float32"),
        ("same dtype", dict(state=st.bfloat16(), read_state=rs.bfloat16(), read_scale=None), {},
         r"read_state: expected a dtype other than the checkpoint's \(torch.bfloat16\)"),
        ("fp8 no scale", dict(read_scale=None), {}, r"read_scale: expected a fp32 tensor of shape \(2, 3, 2, 4\).*got None"),
        ("scale shape", dict(read_scale=sc[..., :3]), {}, r"read_scale: expected shape \(2, 3, 2, 4\), got \(2, 3, 2, 3\)"),
        ("scale dtype", dict(read_scale=sc.half()), {}, r"read_scale: expected dtype in .*got torch.float16"),
        ("scale with bf16", dict(read_state=rs.bfloat16()), {}, r"read_scale: expected None for a torch.bfloat16 read copy"),
        ("stride-0 copy", dict(read_state=rs[:, :1].expand(2, 3, 2, 4, 8)), {},
         r"read_state: written in place, expected no stride-0 dimension.*got shape"),
        ("slots rank", dict(slots=sl[None]), {}, r"slots: expected shape \('\*',\), got \(1, 2\)"),
        ("slots dtype", dict(slots=sl.float()), {}, r"slots: expected dtype in \['torch.int32', 'torch.int64'\], got torch.float32"),
        ("layer range", {}, dict(layer_idx=2), r"layer_idx: expected None or an int in \[0, 2\), got 2"),
        ("layer negative", {}, dict(layer_idx=-1), r"layer_idx: expected None or an int in \[0, 2\), got -1"),
        ("layer bool", {}, dict(layer_idx=True), r"layer_idx: expected None or an int in \[0, 2\), got True \(bool\)"),
        ("layer type", {}, dict(layer_idx=1.0), r"layer_idx: expected None or an int in \[0, 2\), got 1.0 \(float\)"),
        ("layer with 4-D", dict(state=st[0], read_state=rs[0], read_scale=sc[0]), dict(layer_idx=0),
         r"layer_idx: expected None for a one-layer state \(3, 2, 4, 8\).*got 0"),
    ]


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_value_errors(op, case):
    _, override, kw, msg = case
    args = {**_valid(), **override}
    before = args["read_state"].clone() if isinstance(args["read_state"], torch.Tensor) else None
    with pytest.raises(ValueError, match=msg):
        OPS[op](args["state"], args["read_state"], args["read_scale"], args["slots"], **kw)
    if before is not None and before.shape == args["read_state"].shape:
        _assert_bits(args["read_state"], before, "nothing written on a refused call")


def test_value_error_devices():
    v = _valid()
    if DEVICE == "cpu" and not torch.cuda.is_available():
        # Mixed devices cannot be built without a GPU; the message is check_same_device's.
        with pytest.raises(ValueError, match=r"expected all tensors on one device, got"):
            refresh_read_copy(v["state"], v["read_state"], v["read_scale"], v["slots"].to("meta"))
    else:
        with pytest.raises(ValueError, match=r"expected all tensors on one device, got"):
            refresh_read_copy(v["state"], v["read_state"], v["read_scale"], v["slots"].cpu())


def test_kernel_refuses_cpu_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    v = {k: t.cpu() for k, t in _valid().items()}
    with pytest.raises(ValueError, match=r"state: expected a CUDA tensor \(or TRITON_INTERPRET=1 on CPU\), got device cpu"):
        refresh_read_copy(v["state"], v["read_state"], v["read_scale"], v["slots"])


# ------------------------------------------------------------------ GPU: real shapes, CUDA graphs


GPU_SHAPES = [Shape("nano4b-mamba2", 16, 80, 128), Shape("qwen35-gdn", 8, 128, 128)]


@pytest.mark.gpu
@pytest.mark.parametrize("pair", PAIRS, ids=_pid)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: s.name)
def test_gpu_real_shapes(shape, pair):
    gen = torch.Generator().manual_seed(11)
    for layout in ("contig", "strided"):
        pool = _alloc(4, 33, shape, pair, layout, gen)
        idx = torch.tensor([5, -1, 17, 32, 1, -1], device=DEVICE)
        _check_call(refresh_read_copy, pool, idx, None, "all")
        _check_call(refresh_read_copy, pool, idx.int(), 3, "layer_idx")


@pytest.mark.gpu
def test_gpu_cuda_graph_capture():
    """The refresh captures into a CUDA graph (no host sync) and replays with new indices."""
    gen = torch.Generator().manual_seed(12)
    pool = _alloc(3, 9, GPU_SHAPES[0], (F32, F8), "contig", gen)
    idx = torch.tensor([2, -1, 4], device=DEVICE)
    refresh_read_copy(pool.state, pool.read, pool.scale, idx)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        refresh_read_copy(pool.state, pool.read, pool.scale, idx, layer_idx=1)
    idx.copy_(torch.tensor([7, 8, -1], device=DEVICE))
    pool.state.mul_(-3.0)
    want_read, want_scale = _unfused(pool, idx, 1)
    graph.replay()
    torch.cuda.synchronize()
    _assert_bits(pool.read, want_read, "copy after replay")
    _assert_bits(pool.scale, want_scale, "scales after replay")
