"""Decode-kernel benchmark: our ReplaySSM kernels against SGLang 0.5.17's kernels, in one process.

Run from the repository root (see benchmarks/README.md)::

    python -m benchmarks.bench_decode --family all --batch 1,8,32,64,128,256,512 \\
        --window 16 --state-dtype fp32 --refcheck --out OUT_DIR

What it does, in order:

1. measures the device copy bandwidth (one large device-to-device copy, bytes read + written);
2. per family, allocates ONE layer's pool with ``--slots`` slots (default ``2 × max batch``), maps
   the rows of every batch to a random subset of slots (scattered, as in serving), fills every
   tensor with random non-zero data (rings too: realistic records, random ring starts so that
   rings wrap);
3. ``--refcheck``: one decode step of our kernel against our torch reference at the real shapes
   (rows in every phase, a forced flush, a padding row); a kernel that fails is not timed;
4. times each kernel with CUDA events around a CUDA-graph replay of one launch, cold L2 (a read
   of a buffer of 4 × L2 between repetitions), median of ``--repeats`` per phase and pass. Our
   kernel and SGLang's built-in ReplaySSM kernel are timed at every phase ``w = 0 .. L-1``
   (``ring_len = w`` for all rows, flush only at ``w = L-1``) and reported as the mean over the
   cycle; one mixed batch (rows spread over the phases) is timed too;
5. prints a table (median us, bytes moved by the byte model, TB/s, share of copy bandwidth,
   speed-up against SGLang) and writes ``results.json``, ``results.md`` and ``decode_bench.png``
   under ``--out``.

Cold L2: the Mamba-2 pool alone is far beyond L2 (50 MB) at batch >= 16, but at batch 1-8 a
kernel timed repeatedly on the same slots would find them in L2; in serving, dozens of other
layers run between two visits of one layer's slots, so every visit is cold. Flushing L2 between
repetitions is the one method that is right at every batch; reading (not writing) the flush
buffer leaves no dirty lines whose write-back would be billed to the timed kernel
(``--l2-flush write`` does what ``triton.testing.do_bench`` does).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks import bytes_model as bm
from benchmarks import bytes_read_copy as brc
from benchmarks.shapes import (
    DTYPE_BYTES,
    GDN_SHAPES,
    MAMBA2_SHAPES,
    GDNShape,
    Mamba2Shape,
)

DEFAULT_BATCHES = (1, 8, 32, 64, 128, 256, 512)

# Kernel keys: (family, key) -> table label. Peers are SGLang 0.5.17's decode kernels.
LABELS = {
    "ours": "replayssm (ours)",
    "ssu": "sglang selective_state_update",
    "packed": "sglang packed decode",
    "builtin": "sglang built-in replayssm",
}
#: the conventional SGLang kernel each family's speed-ups are measured against
BASELINE = {"mamba2": "ssu", "gdn": "packed"}

#: refcheck tolerances, ‖kernel − reference‖ / ‖reference‖ per tensor kind. They gate against a
#: broken kernel (wrong rows, records or decays give errors of order 1), not against rounding: the
#: kernels' own tests check precision against float64. On CPU the Triton interpreter truncates
#: fp32 -> bf16 casts (round-to-nearest-even on the GPU), so bf16-rounded values (GDN's beta, u)
#: differ by an ulp there, which moves an fp32 GDN state by ~5e-3.
REFCHECK_TOL = {
    "cuda": {"out": 2e-2, "state": 2e-3, "state16": 1e-2, "ring": 1e-2},
    "cpu": {"out": 3e-2, "state": 2e-2, "state16": 3e-2, "ring": 2e-2},
}
#: --read-dtype: the refreshed copy's gate is the state's plus one ulp of the copy at 1.0 (kernel
#: and reference each round their own, close, checkpoint; fp8 e4m3 has 3 mantissa bits)
READ_COPY_ULP = {"bf16": 2.0**-7, "fp16": 2.0**-10, "fp8": 2.0**-3}

# Synthetic efficiencies for --dry-run (share of copy bandwidth). Only for exercising the CLI.
_DRY_EFF = {"ours": 0.85, "ssu": 0.70, "packed": 0.93, "builtin": 0.77}
_DRY_COPY_BW = 4.25e12


# ==================================================================================================
# Arguments
# ==================================================================================================


def _int_list(text: str) -> list[int]:
    try:
        vals = [int(t) for t in text.split(",") if t.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from e
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_decode",
        description="Time ReplaySSM decode kernels against SGLang 0.5.17's kernels (cold L2).",
    )
    p.add_argument("--family", choices=("mamba2", "gdn", "all"), default="all")
    p.add_argument("--batch", type=_int_list, default=list(DEFAULT_BATCHES),
                   help="comma-separated batch sizes (default 1,8,32,64,128,256,512)")
    p.add_argument("--window", type=int, default=16, help="ring window L (default 16)")
    p.add_argument("--ring-size", type=int, default=None,
                   help="physical ring rows R >= L of our kernels (default L)")
    p.add_argument("--state-dtype", choices=tuple(DTYPE_BYTES), default="fp32")
    p.add_argument("--act-dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--read-dtype", choices=("same", *brc.READ_COPY_BYTES), default="same",
                   help="split precision (both families): our kernel's non-flush rows read a read "
                        "copy of this dtype (fp8: e4m3 + per-row scales) beside the --state-dtype "
                        "checkpoint; SGLang's peers have no copy (default same: no copy)")
    p.add_argument("--gdn-u-dtype", choices=("act", "fp32"), default="fp32",
                   help="dtype of our GDN ring_u (fp32 by default, as the server allocates it)")
    p.add_argument("--mamba2-shape", choices=tuple(MAMBA2_SHAPES), default=None,
                   help="default nano-4b on cuda, mamba2-tiny on cpu")
    p.add_argument("--gdn-shape", choices=tuple(GDN_SHAPES), default=None,
                   help="default qwen3.5-4b on cuda, gdn-tiny on cpu")
    p.add_argument("--slots", type=int, default=None,
                   help="pool slots per family (default max(2 × max batch, 64)); slot 0 unused")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="default cuda when available; cpu runs the Triton interpreter "
                        "(or --impl ref) at tiny shapes: a smoke test, not a measurement")
    p.add_argument("--impl", choices=("kernel", "ref"), default="kernel",
                   help="what to run as 'ours': the Triton kernels or the torch references")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed repetitions per phase and pass (default 100 on cuda, 2 on cpu)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed repetitions before each series (default 10 on cuda, 1 on cpu)")
    p.add_argument("--passes", type=int, default=2,
                   help="time everything this many times, interleaved; the spread between passes "
                        "is reported (default 2)")
    p.add_argument("--l2-flush", choices=("read", "write", "none"), default="read",
                   help="between repetitions, read (default) or write a buffer of 4 × L2, or nothing")
    p.add_argument("--no-graph", action="store_true",
                   help="launch eagerly instead of replaying a captured CUDA graph")
    p.add_argument("--refcheck", action="store_true",
                   help="check our kernels against our torch references before timing")
    p.add_argument("--skip-peers", action="store_true", help="time our kernels only")
    p.add_argument("--row-order", choices=ROW_ORDERS, default="serving",
                   help="our GDN kernel's launch order: flush-first (row_order from "
                        "replayssm_kernels.row_order.flush_first_order, built before the timed "
                        "launches, as a forward does once for all layers), batch (none), or "
                        "serving (default: flush-first from the serving backend's "
                        "FLUSH_FIRST_MIN_BATCH rows, else batch)")
    p.add_argument("--dry-run", action="store_true",
                   help="no device work: synthetic timings from the byte model, to exercise the "
                        "table / JSON / plot writing")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--commit", default=None, help="commit id recorded in the outputs "
                   "(default: git rev-parse HEAD, when available)")
    p.add_argument("--gdn-decode-launch", default=None, metavar="KEY=INT,...",
                   help="override the GDN decode launch's tile (keywords of "
                        "gdn_replay_decode_fwd: block_v, fold_rows, nonflush_rows, tiles; powers "
                        "of two), e.g. block_v=16,fold_rows=8 or tiles=2, for a launch sweep; "
                        "default: the kernel's")
    p.add_argument("--kernels-module", default="replayssm_kernels",
                   help=argparse.SUPPRESS)  # tests: a module with the same API
    p.add_argument("--out", type=Path, required=True, help="output folder (created)")
    return p


@dataclass
class Config:
    families: list[str]
    batches: list[int]
    L: int
    R: int
    state_dtype: str
    act_dtype: str
    gdn_u_dtype: str
    mamba2_shape: Mamba2Shape
    gdn_shape: GDNShape
    slots: int
    device: str
    impl: str
    repeats: int
    warmup: int
    passes: int
    l2_flush: str
    graph: bool
    refcheck: bool
    skip_peers: bool
    dry_run: bool
    seed: int
    commit: str
    kernels_module: str
    out: Path
    argv: list[str] = field(default_factory=list)
    read_dtype: str = "same"
    gdn_decode_launch: dict[str, int] = field(default_factory=dict)
    row_order: str = "serving"

    def flush_first(self, batch: int) -> bool:
        """Whether our GDN launch at ``batch`` rows runs the rows flush rows first."""
        if self.row_order == "serving":
            from replayssm_kernels.gdn_decode.kernel import FLUSH_FIRST_MIN_BATCH

            return batch >= FLUSH_FIRST_MIN_BATCH
        return self.row_order == "flush-first"


#: ``--row-order`` values.
ROW_ORDERS = ("serving", "flush-first", "batch")

#: ``gdn_replay_decode_fwd``'s keywords that ``--gdn-decode-launch`` may set.
GDN_DECODE_LAUNCH_FIELDS = ("block_v", "fold_rows", "nonflush_rows", "tiles")


def int_fields(text: str, fields: Sequence[str], flag: str,
               parser: argparse.ArgumentParser) -> dict[str, int]:
    """``FIELD=INT,...`` of a launch-override flag; unknown fields or non-integers end the parse
    with the fields that exist."""
    out: dict[str, int] = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        if name not in fields or not value.lstrip("-").isdigit():
            parser.error(f"{flag}: expected FIELD=INT with FIELD in {list(fields)}, got {item!r}")
        out[name] = int(value)
    return out


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001 (no torch at all: only --dry-run can work)
        return False


def _git_commit() -> str:
    try:
        here = Path(__file__).resolve().parent.parent
        r = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                           text=True, timeout=10, check=False)
        if r.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain",
                                    "--untracked-files=no"], capture_output=True, text=True,
                                   timeout=10, check=False).stdout.strip()
            return r.stdout.strip() + ("-dirty" if dirty else "")
    except Exception:  # noqa: BLE001 (no git on the device machine: record "unknown")
        pass
    return "unknown"


def parse_args(argv: Sequence[str] | None = None) -> Config:
    parser = build_parser()
    a = parser.parse_args(argv)
    # a dry run does no device work: it models the real (cuda) shapes unless told otherwise
    device = a.device or ("cuda" if (a.dry_run or _has_cuda()) else "cpu")
    if device == "cuda" and not a.dry_run and not _has_cuda():
        parser.error("--device cuda: no CUDA device visible (use --device cpu or --dry-run)")
    cpu = device == "cpu"
    if a.window < 1:
        parser.error(f"--window: expected >= 1, got {a.window}")
    R = a.window if a.ring_size is None else a.ring_size
    if R < a.window:
        parser.error(f"--ring-size: expected >= window ({a.window}), got {R}")
    max_b = max(a.batch)
    slots = a.slots if a.slots is not None else max(2 * max_b, 8 if cpu else 64)
    if slots < max_b + 1:
        parser.error(f"--slots: expected >= max batch + 1 = {max_b + 1} (slot 0 is the null "
                     f"slot), got {slots}")
    for name in ("repeats", "warmup", "passes"):
        v = getattr(a, name)
        if v is not None and v < (0 if name == "warmup" else 1):
            parser.error(f"--{name}: got {v}")
    if a.read_dtype == a.state_dtype:
        parser.error(f"--read-dtype {a.read_dtype}: the read copy must differ from --state-dtype "
                     f"{a.state_dtype} (pass --read-dtype same to read the checkpoint)")
    gdn_launch = int_fields(a.gdn_decode_launch, GDN_DECODE_LAUNCH_FIELDS, "--gdn-decode-launch",
                            parser) if a.gdn_decode_launch else {}
    if gdn_launch:
        if cpu and not a.dry_run:  # as main(): the kernels are defined at this import
            os.environ.setdefault("TRITON_INTERPRET", "1")
        from replayssm_kernels.gdn_decode.kernel import launch_tile

        try:
            launch_tile(128, **gdn_launch)
        except ValueError as e:
            parser.error(f"--gdn-decode-launch: {e}")
    return Config(
        read_dtype=a.read_dtype,
        gdn_decode_launch=gdn_launch,
        families=["mamba2", "gdn"] if a.family == "all" else [a.family],
        batches=list(a.batch),
        L=a.window,
        R=R,
        state_dtype=a.state_dtype,
        act_dtype=a.act_dtype,
        gdn_u_dtype=a.gdn_u_dtype,
        mamba2_shape=MAMBA2_SHAPES[a.mamba2_shape or ("mamba2-tiny" if cpu else "nano-4b")],
        gdn_shape=GDN_SHAPES[a.gdn_shape or ("gdn-tiny" if cpu else "qwen3.5-4b")],
        slots=slots,
        device=device,
        impl=a.impl,
        repeats=a.repeats if a.repeats is not None else (2 if cpu else 100),
        warmup=a.warmup if a.warmup is not None else (1 if cpu else 10),
        passes=a.passes,
        l2_flush=a.l2_flush,
        graph=(not a.no_graph) and not cpu,
        refcheck=a.refcheck,
        skip_peers=a.skip_peers,
        row_order=a.row_order,
        dry_run=a.dry_run,
        seed=a.seed,
        commit=a.commit or _git_commit(),
        kernels_module=a.kernels_module,
        out=a.out,
        argv=list(sys.argv[1:] if argv is None else argv),
    )


# ==================================================================================================
# Byte models per kernel
# ==================================================================================================


def byte_models(cfg: Config, family: str) -> dict[str, bm.KernelBytes]:
    """Byte model of every kernel timed for ``family`` (keys as in ``LABELS``)."""
    s_b, a_b = DTYPE_BYTES[cfg.state_dtype], DTYPE_BYTES[cfg.act_dtype]
    if family == "mamba2":
        sh = cfg.mamba2_shape
        ours = (bm.mamba2_replay_bytes(sh, cfg.L, s_b, a_b) if cfg.read_dtype == "same" else
                brc.mamba2_read_copy_bytes(sh, cfg.L, cfg.read_dtype, s_b, a_b))
        return {
            "ours": ours,
            "ssu": bm.selective_state_update_bytes(sh, s_b, a_b),
        }
    sh = cfg.gdn_shape
    u_b = 4 if cfg.gdn_u_dtype == "fp32" else a_b
    ours = (bm.gdn_replay_bytes(sh, cfg.L, s_b, a_b, u_bytes=u_b) if cfg.read_dtype == "same" else
            brc.gdn_read_copy_bytes(sh, cfg.L, cfg.read_dtype, s_b, a_b, u_bytes=u_b))
    return {
        # SGLang's peers have no read copy: their models are the same with --read-dtype
        "ours": ours,
        "packed": bm.gdn_packed_decode_bytes(sh, s_b, a_b),
        # SGLang's pool allocates the decode ring (d, k) in the SSM dtype
        "builtin": bm.gdn_builtin_replay_bytes(sh, cfg.L, s_b, a_b, ring_bytes=s_b),
    }


# ==================================================================================================
# Timing
# ==================================================================================================


class Timer:
    """Times one launch per repetition: CUDA events around it, L2 flushed before it.

    On CPU (smoke runs) it uses ``time.perf_counter`` and flushes nothing.
    """

    def __init__(self, cfg: Config):
        import torch

        self.torch = torch
        self.cuda = cfg.device == "cuda"
        self.mode = cfg.l2_flush if self.cuda else "none"
        self.l2_bytes = 0
        self.buf = None
        if self.cuda:
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)
            if self.mode != "none":
                n = max(4 * self.l2_bytes, 256 * 2**20)
                self.buf = torch.zeros(n // 4, dtype=torch.float32, device="cuda")

    @property
    def flush_bytes(self) -> int:
        return 0 if self.buf is None else self.buf.numel() * 4

    def flush(self) -> None:
        if self.buf is None:
            return
        if self.mode == "read":
            # a reduction reads every line; the one-element result is the only write
            self.torch.sum(self.buf)
        else:
            self.buf.zero_()

    def measure(self, run: Callable[[], None], reps: int, warmup: int) -> list[float]:
        """``reps`` timings of ``run()`` in microseconds (after ``warmup`` untimed runs)."""
        torch = self.torch
        if not self.cuda:
            for _ in range(warmup):
                run()
            out = []
            for _ in range(reps):
                t0 = time.perf_counter()
                run()
                out.append((time.perf_counter() - t0) * 1e6)
            return out
        for _ in range(warmup):
            self.flush()
            run()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        # Keep the host ahead of the device so that no launch latency lands between the events.
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(200_000)
        for i in range(reps):
            self.flush()
            starts[i].record()
            run()
            ends[i].record()
        ends[-1].synchronize()
        return [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]


def measure_copy_bandwidth(cfg: Config) -> dict:
    """Device-to-device copy bandwidth: bytes read + written over the median copy time."""
    import torch

    if cfg.device != "cuda":
        return {"bytes_per_s": float("nan"), "note": "cpu: not measured"}
    free, _ = torch.cuda.mem_get_info()
    nbytes = int(min(2 * 2**30, free // 8))
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    src.random_(0, 255)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e-3)
    med = statistics.median(times)
    del src, dst
    torch.cuda.empty_cache()
    return {
        "bytes_per_s": 2 * nbytes / med,
        "copy_bytes": nbytes,
        "median_s": med,
        "min_s": min(times),
        "note": "torch copy_ of a uint8 buffer, bytes read + written, median of 20",
    }


def capture_graph(fn: Callable[[], None]):
    """Capture one launch of ``fn`` into a CUDA graph (after a side-stream warm-up)."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g


# ==================================================================================================
# Kernel cases
# ==================================================================================================


@dataclass
class Case:
    """One kernel at one batch size, ready to launch on static tensors."""

    family: str
    key: str
    fn: Callable[[], None]
    out: object  # torch.Tensor written by every launch
    set_phase: Callable[[int], None] | None = None  # phased kernels: all rows at ring_len w
    set_mixed: Callable[[], None] | None = None  # phased kernels: rows spread over phases
    mixed_phases: list[int] | None = None
    note: str = ""

    @property
    def phased(self) -> bool:
        return self.set_phase is not None


def _tdtype(name: str):
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[name]


class _Rand:
    """Random non-zero data on one device from one seeded generator."""

    def __init__(self, device: str, seed: int):
        import torch

        self.torch = torch
        self.device = device
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(seed)

    def normal(self, shape, dtype, scale: float = 1.0, offset: float = 0.0):
        t = self.torch.randn(*shape, generator=self.gen, device=self.device, dtype=dtype)
        if scale != 1.0:
            t.mul_(scale)
        if offset != 0.0:
            t.add_(offset)
        return t

    def uniform(self, shape, dtype, lo: float, hi: float):
        t = self.torch.rand(*shape, generator=self.gen, device=self.device, dtype=dtype)
        return t.mul_(hi - lo).add_(lo)

    def ints(self, shape, hi: int, dtype):
        return self.torch.randint(0, hi, tuple(shape), generator=self.gen, device=self.device,
                                  dtype=dtype)

    def perm(self, n: int):
        return self.torch.randperm(n, generator=self.gen, device=self.device)


def _softplus(u):
    import torch

    return torch.where(u <= 20.0, torch.log1p(torch.exp(torch.clamp(u, max=20.0))), u)


def _row_slots(rng: _Rand, slots: int, batch: int):
    """A random, scattered choice of ``batch`` distinct slots in ``1 .. slots-1`` (int32)."""
    import torch

    return (rng.perm(slots - 1)[:batch] + 1).to(torch.int32)


class _Cursors:
    """Static per-row cursor tensors of our kernels (and write_pos of SGLang's built-in)."""

    def __init__(self, rng: _Rand, batch: int, L: int, R: int, flush_first: bool = False):
        import torch

        self.L, self.flush_first = L, flush_first
        dev = rng.device
        self.ring_start = rng.ints((batch,), R, torch.int32)  # rings wrap, as in serving
        self.ring_len = torch.zeros(batch, dtype=torch.int32, device=dev)
        self.flush = torch.zeros(batch, dtype=torch.bool, device=dev)
        self.write_pos = torch.zeros(batch, dtype=torch.int32, device=dev)  # SGLang built-in
        self.row_order = torch.arange(batch, dtype=torch.int32, device=dev)  # flush-first order
        order = rng.perm(batch).tolist()
        self.mixed = [order[i] % L for i in range(batch)]
        self._mixed_t = torch.tensor(self.mixed, dtype=torch.int32, device=dev)

    def set_phase(self, w: int) -> None:
        self.ring_len.fill_(w)
        self.write_pos.fill_(w)
        self.flush.fill_(w == self.L - 1)
        self._order()

    def set_mixed(self) -> None:
        self.ring_len.copy_(self._mixed_t)
        self.write_pos.copy_(self._mixed_t)
        self.flush.copy_(self._mixed_t == self.L - 1)
        self._order()

    def _order(self) -> None:
        if self.flush_first:
            from replayssm_kernels.row_order import flush_first_order

            flush_first_order(self.flush, self.row_order)


class _ReadCopy:
    """Split precision (``--read-dtype``), shared by both families: the read copy beside the
    checkpoint ``[slots, ..., n]`` (same shape; fp8: fp32 scales ``[slots, ...]`` per row, over the
    last dim) and the keywords that hand it to our kernel and reference. Semantics in
    ``replayssm_kernels.mamba2_decode.read_copy`` (kernels/README.md, "Split precision")."""

    cfg: Config
    read = read_scale = None

    def _read_copy(self, state):
        """A read copy of ``state`` (all slots refreshed) in ``--read-dtype``, or (None, None)."""
        if self.cfg.read_dtype == "same":
            return None, None
        import torch

        from replayssm_kernels.read_copy_refresh import refresh_read_copy_ref

        rdt = {"bf16": torch.bfloat16, "fp16": torch.float16,
               "fp8": torch.float8_e4m3fn}[self.cfg.read_dtype]
        S = state.shape[0]
        read = torch.empty(state.shape, dtype=rdt, device=state.device)
        scale = None
        if rdt == torch.float8_e4m3fn:
            scale = torch.empty(state.shape[:-1], dtype=torch.float32, device=state.device)
        refresh_read_copy_ref(state, read, scale, torch.arange(S, device=state.device))
        return read, scale

    def _read_kwargs(self, read=None, scale=None) -> dict:
        """``read_state`` / ``read_scale`` keywords for our kernel (none without --read-dtype)."""
        if self.cfg.read_dtype == "same":
            return {}
        if read is None:
            read, scale = self.read, self.read_scale
        return {"read_state": read, "read_scale": scale}


class Mamba2Family(_ReadCopy):
    """One Nemotron-H Mamba-2 layer: the pool (state + our rings) and per-batch inputs.

    Inputs are laid out as ``MambaMixer2`` hands them over in decode: x, B, C are views of the
    conv output ``[batch, H·P + 2·G·N]``, dt a strided view of the projection, A / dt_bias / D
    per-head parameters (A fp32, D / dt_bias in the activation dtype).
    """

    name = "mamba2"

    def __init__(self, cfg: Config, kernels, peers: dict):
        import torch

        self.cfg, self.kernels, self.peers = cfg, kernels, peers
        sh = cfg.mamba2_shape
        self.sh = sh
        dev, adt, sdt = cfg.device, _tdtype(cfg.act_dtype), _tdtype(cfg.state_dtype)
        self.adt, self.sdt = adt, sdt
        rng = self.rng = _Rand(dev, cfg.seed + 1)
        H, P, N, G, R, S = sh.H, sh.P, sh.N, sh.G, cfg.R, cfg.slots
        # per-head parameters, Mamba-2 initialisation ranges
        self.A = -rng.uniform((H,), torch.float32, 1.0, 16.0)
        dt_init = rng.uniform((H,), torch.float32, math.log(1e-3), math.log(1e-1)).exp()
        self.dt_bias = (dt_init + torch.log(-torch.expm1(-dt_init))).to(adt)  # softplus⁻¹
        self.D = rng.normal((H,), torch.float32, 0.1, 1.0).to(adt)
        # pool of one layer: [layers=1, slots, ...] allocations, viewed at layer 0
        self.state = rng.normal((1, S, H, P, N), sdt, 0.1)[0]
        self.ring_x = rng.normal((1, S, H, R, P), adt)[0]
        self.ring_dt = _softplus(rng.normal((1, S, H, R), torch.float32, 0.5)
                                 + self.dt_bias.float()[None, None, :, None])[0]
        self.ring_B = rng.normal((1, S, G, R, N), adt)[0]
        # split precision (--read-dtype): the read copy, refreshed from the checkpoint
        self.read, self.read_scale = self._read_copy(self.state)

    def bytes_per_slot(self) -> int:
        tensors = (self.state, self.ring_x, self.ring_dt, self.ring_B, self.read, self.read_scale)
        return sum(t[0].numel() * t.element_size() for t in tensors if t is not None)

    def inputs(self, batch: int, contiguous: bool = False) -> dict:
        import torch

        sh, adt, rng = self.sh, self.adt, self.rng
        H, P, N, G = sh.H, sh.P, sh.N, sh.G
        xbc = rng.normal((batch, H * P + 2 * G * N), adt)
        x = xbc[:, : H * P].unflatten(1, (H, P))
        B = xbc[:, H * P: H * P + G * N].unflatten(1, (G, N))
        C = xbc[:, H * P + G * N:].unflatten(1, (G, N))
        dt = rng.normal((batch, 2 * H), adt, 0.5)[:, H:]  # a strided slice of the projection
        if contiguous:
            x, B, C, dt = x.contiguous(), B.contiguous(), C.contiguous(), dt.contiguous()
        return {
            "x": x, "B": B, "C": C, "dt": dt,
            "out": torch.empty(batch, H, P, dtype=adt, device=self.cfg.device),
            "slot_idx": _row_slots(rng, self.cfg.slots, batch),
        }

    def cases(self, batch: int) -> list[Case]:
        cfg = self.cfg
        inp = self.inputs(batch, contiguous=getattr(self, "_contiguous", False))
        cur = _Cursors(self.rng, batch, cfg.L, cfg.R)
        out: list[Case] = []
        if self.kernels.get("mamba2") is not None:
            fn_ours = self.kernels["mamba2"]
            A, D, dt_bias = self.A, self.D, self.dt_bias
            if getattr(self, "_fp32_params", False):
                D, dt_bias = D.float(), dt_bias.float()

            def ours(fn=fn_ours, i=inp, c=cur, A=A, D=D, dt_bias=dt_bias):
                fn(self.state, self.ring_x, self.ring_dt, self.ring_B, i["x"], i["dt"], A,
                   i["B"], i["C"], i["out"], i["slot_idx"], c.ring_start, c.ring_len, c.flush,
                   D=D, z=None, dt_bias=dt_bias, dt_softplus=True, **self._read_kwargs())

            out.append(Case("mamba2", "ours", ours, inp["out"], cur.set_phase, cur.set_mixed,
                            cur.mixed, note=getattr(self, "_note", "")))
        ssu = self.peers.get("ssu")
        if ssu is not None:
            sh = self.sh
            out_ssu = inp["out"].clone()
            # exactly MambaMixer2.forward's decode call (mamba.py, non-verify branch)
            A_d = self.A[:, None, None].expand(-1, sh.P, sh.N).to(dtype=self.A.dtype)
            dt_d = inp["dt"][:, :, None].expand(-1, -1, sh.P)
            dt_bias_d = self.dt_bias[:, None].expand(-1, sh.P)
            D_d = self.D[:, None].expand(-1, sh.P)

            def peer(fn=ssu, i=inp, o=out_ssu):
                fn(self.state, i["x"], dt_d, A_d, i["B"], i["C"], D_d, z=None,
                   dt_bias=dt_bias_d, dt_softplus=True, state_batch_indices=i["slot_idx"],
                   out=o)

            out.append(Case("mamba2", "ssu", peer, out_ssu))
        return out

    # ---------------------------------------------------------------------------------- refcheck

    def refcheck_args(self, rows: int = 8, slots: int = 16) -> tuple[dict, list[int], list[int]]:
        """Fresh small pool + inputs at the real head shapes; rows in several phases."""
        import torch

        cfg, sh, rng = self.cfg, self.sh, self.rng
        H, P, N, G, R, L = sh.H, sh.P, sh.N, sh.G, cfg.R, cfg.L
        dev = cfg.device
        slot_idx, ring_len, flush = _refcheck_rows(rows, slots, L, rng)
        args = {
            "state": rng.normal((slots, H, P, N), self.sdt, 0.1),
            "ring_x": rng.normal((slots, H, R, P), self.adt),
            "ring_dt": _softplus(rng.normal((slots, H, R), torch.float32, 0.5)
                                 + self.dt_bias.float()[None, :, None]),
            "ring_B": rng.normal((slots, G, R, N), self.adt),
        }
        inp = self.inputs(rows, contiguous=getattr(self, "_contiguous", False))
        args.update(x=inp["x"], dt=inp["dt"], B=inp["B"], C=inp["C"])
        args["out"] = torch.full((rows, H, P), float("nan"), dtype=self.adt, device=dev)
        args["slot_idx"] = torch.tensor(slot_idx, dtype=torch.int32, device=dev)
        args["ring_start"] = rng.ints((rows,), R, torch.int32)
        args["ring_len"] = torch.tensor(ring_len, dtype=torch.int32, device=dev)
        args["flush"] = torch.tensor(flush, dtype=torch.bool, device=dev)
        read, scale = self._read_copy(args["state"])
        if read is not None:
            args["read_state"] = read
        if scale is not None:
            args["read_scale"] = scale
        return args, slot_idx, ring_len

    def refcheck_call(self, fn, a: dict) -> None:
        D, dt_bias = self.D, self.dt_bias
        if getattr(self, "_fp32_params", False):
            D, dt_bias = D.float(), dt_bias.float()
        fn(a["state"], a["ring_x"], a["ring_dt"], a["ring_B"], a["x"], a["dt"], self.A, a["B"],
           a["C"], a["out"], a["slot_idx"], a["ring_start"], a["ring_len"], a["flush"],
           D=D, z=None, dt_bias=dt_bias, dt_softplus=True,
           **self._read_kwargs(a.get("read_state"), a.get("read_scale")))

    ring_names = ("ring_x", "ring_dt", "ring_B")

    def peer_conventional(self, a: dict):
        """SGLang's conventional step on refcheck args (as MambaMixer2 calls it); returns out."""
        ssu = self.peers.get("ssu")
        if ssu is None:
            return None
        P, N = self.sh.P, self.sh.N
        ssu(a["state"], a["x"], a["dt"][:, :, None].expand(-1, -1, P),
            self.A[:, None, None].expand(-1, P, N), a["B"], a["C"],
            self.D[:, None].expand(-1, P), z=None, dt_bias=self.dt_bias[:, None].expand(-1, P),
            dt_softplus=True, state_batch_indices=a["slot_idx"], out=a["out"])
        return a["out"]


class GDNFamily(_ReadCopy):
    """One Qwen3.5 Gated DeltaNet layer: the pool (state + our rings + SGLang's built-in rings).

    Inputs as ``GDNAttnBackend.forward_decode`` has them: the packed conv output
    ``mixed_qkv [batch, 2·Hk·K + HV·V]`` (our kernel gets q / k / v as views of it), contiguous
    a, b ``[batch, HV]``, A_log fp32, dt_bias in the activation dtype.
    """

    name = "gdn"

    def __init__(self, cfg: Config, kernels, peers: dict):
        import torch

        self.cfg, self.kernels, self.peers = cfg, kernels, peers
        sh = self.sh = cfg.gdn_shape
        dev, adt, sdt = cfg.device, _tdtype(cfg.act_dtype), _tdtype(cfg.state_dtype)
        self.adt, self.sdt = adt, sdt
        self.udt = torch.float32 if cfg.gdn_u_dtype == "fp32" else adt
        rng = self.rng = _Rand(dev, cfg.seed + 2)
        HV, Hk, K, V, R, L, S = sh.HV, sh.Hk, sh.K, sh.V, cfg.R, cfg.L, cfg.slots
        self.A_log = rng.uniform((HV,), torch.float32, 0.0, math.log(16.0))
        self.dt_bias = rng.normal((HV,), torch.float32, 0.5).to(adt)
        self.scale = K ** -0.5
        self.state = rng.normal((1, S, HV, V, K), sdt, 0.1)[0]
        # our rings
        self.ring_u = rng.normal((1, S, HV, R, V), self.udt, 0.1)[0]
        self.ring_k = rng.normal((1, S, Hk, R, K), adt)[0]
        self.ring_v = rng.normal((1, S, HV, R, V), adt)[0]
        self.ring_g = self._log_gate(rng.normal((1, S, HV, R), torch.float32))[0]
        self.ring_beta = torch.sigmoid(rng.normal((1, S, HV, R), torch.float32))[0]
        # SGLang's built-in decode ring (memory_pool.py: d, k in the SSM dtype, g fp32, L rows)
        self.bi_d = self.bi_k = self.bi_g = None
        if peers.get("builtin") is not None:
            self.bi_d = rng.normal((1, S, HV, L, V), sdt, 0.1)[0]
            k = rng.normal((1, S, Hk, L, K), torch.float32)
            self.bi_k = (k / k.norm(dim=-1, keepdim=True)).to(sdt)[0]
            self.bi_g = self._log_gate(rng.normal((1, S, HV, L), torch.float32))[0]
        # split precision (--read-dtype): our kernel's read copy, refreshed from the checkpoint
        self.read, self.read_scale = self._read_copy(self.state)

    def _log_gate(self, a):
        # shape [..., HV, R]: g = -exp(A_log) * softplus(a + dt_bias)
        A = self.A_log.exp()[:, None]
        return -A * _softplus(a + self.dt_bias.float()[:, None])

    def bytes_per_slot(self) -> int:
        ts = [self.state, self.ring_u, self.ring_k, self.ring_v, self.ring_g, self.ring_beta,
              self.read, self.read_scale]
        return sum(t[0].numel() * t.element_size() for t in ts if t is not None)

    def inputs(self, batch: int, contiguous: bool = False) -> dict:
        import torch

        sh, adt, rng = self.sh, self.adt, self.rng
        HV, Hk, K, V = sh.HV, sh.Hk, sh.K, sh.V
        mixed = rng.normal((batch, sh.qkv_dim), adt)
        q = mixed[:, : Hk * K].unflatten(1, (Hk, K))
        k = mixed[:, Hk * K: 2 * Hk * K].unflatten(1, (Hk, K))
        v = mixed[:, 2 * Hk * K:].unflatten(1, (HV, V))
        if contiguous:
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        return {
            "mixed_qkv": mixed, "q": q, "k": k, "v": v,
            "a": rng.normal((batch, HV), adt), "b": rng.normal((batch, HV), adt),
            "out": torch.empty(batch, HV, V, dtype=adt, device=self.cfg.device),
            "slot_idx": _row_slots(rng, self.cfg.slots, batch),
        }

    def cases(self, batch: int) -> list[Case]:
        cfg = self.cfg
        inp = self.inputs(batch, contiguous=getattr(self, "_contiguous", False))
        flush_first = cfg.flush_first(batch)
        cur = _Cursors(self.rng, batch, cfg.L, cfg.R, flush_first)
        out: list[Case] = []
        if self.kernels.get("gdn") is not None:
            fn_ours = self.kernels["gdn"]
            A_log, dt_bias = self.A_log, self.dt_bias
            if getattr(self, "_fp32_params", False):
                dt_bias = dt_bias.float()

            def ours(fn=fn_ours, i=inp, c=cur, A_log=A_log, dt_bias=dt_bias):
                fn(self.state, self.ring_u, self.ring_k, self.ring_v, self.ring_g, self.ring_beta,
                   i["q"], i["k"], i["v"], i["a"], i["b"], A_log, dt_bias, i["out"],
                   i["slot_idx"], c.ring_start, c.ring_len, c.flush,
                   scale=self.scale, use_qk_l2norm=True, **self._read_kwargs(),
                   **({"row_order": c.row_order} if flush_first else {}))

            out.append(Case("gdn", "ours", ours, inp["out"], cur.set_phase, cur.set_mixed,
                            cur.mixed, note=getattr(self, "_note", "")))
        packed = self.peers.get("packed")
        if packed is not None:
            out_p = torch_empty_like4(inp["out"])

            def peer_packed(fn=packed, i=inp, o=out_p):
                # exactly TritonGDNKernel.packed_decode (gdn_triton.py), replayssm off
                fn(mixed_qkv=i["mixed_qkv"], a=i["a"], b=i["b"], A_log=self.A_log,
                   dt_bias=self.dt_bias, scale=self.scale, initial_state=self.state, out=o,
                   ssm_state_indices=i["slot_idx"], use_qk_l2norm_in_kernel=True)

            out.append(Case("gdn", "packed", peer_packed, out_p))
        builtin = self.peers.get("builtin")
        if builtin is not None:
            out_b = torch_empty_like4(inp["out"])
            # SGLang's built-in ring has exactly L rows and its own cursor (write_pos); the
            # rows' ring_start does not apply (its ring never wraps: it restarts at 0).

            def peer_builtin(fn=builtin, i=inp, o=out_b, c=cur):
                # as TritonGDNKernel.packed_decode calls it with --enable-linear-replayssm
                fn(mixed_qkv=i["mixed_qkv"], a=i["a"], b=i["b"], A_log=self.A_log,
                   dt_bias=self.dt_bias, scale=self.scale, initial_state=self.state,
                   d_cache=self.bi_d, k_cache=self.bi_k, g_cache=self.bi_g, out=o,
                   ssm_state_indices=i["slot_idx"], write_pos=c.write_pos, force_flush=None,
                   use_qk_l2norm_in_kernel=True)

            out.append(Case("gdn", "builtin", peer_builtin, out_b, cur.set_phase, cur.set_mixed,
                            cur.mixed))
        return out

    def refcheck_args(self, rows: int = 8, slots: int = 16) -> tuple[dict, list[int], list[int]]:
        import torch

        cfg, sh, rng = self.cfg, self.sh, self.rng
        HV, Hk, K, V, R, L = sh.HV, sh.Hk, sh.K, sh.V, cfg.R, cfg.L
        dev = cfg.device
        slot_idx, ring_len, flush = _refcheck_rows(rows, slots, L, rng)
        args = {
            "state": rng.normal((slots, HV, V, K), self.sdt, 0.1),
            "ring_u": rng.normal((slots, HV, R, V), self.udt, 0.1),
            "ring_k": rng.normal((slots, Hk, R, K), self.adt),
            "ring_v": rng.normal((slots, HV, R, V), self.adt),
            "ring_g": self._log_gate(rng.normal((slots, HV, R), torch.float32)),
            "ring_beta": torch.sigmoid(rng.normal((slots, HV, R), torch.float32)),
        }
        inp = self.inputs(rows, contiguous=getattr(self, "_contiguous", False))
        args.update(q=inp["q"], k=inp["k"], v=inp["v"], a=inp["a"], b=inp["b"],
                    mixed_qkv=inp["mixed_qkv"])
        args["out"] = torch.full((rows, HV, V), float("nan"), dtype=self.adt, device=dev)
        args["slot_idx"] = torch.tensor(slot_idx, dtype=torch.int32, device=dev)
        args["ring_start"] = rng.ints((rows,), R, torch.int32)
        args["ring_len"] = torch.tensor(ring_len, dtype=torch.int32, device=dev)
        args["flush"] = torch.tensor(flush, dtype=torch.bool, device=dev)
        read, scale = self._read_copy(args["state"])
        if read is not None:
            args["read_state"] = read
        if scale is not None:
            args["read_scale"] = scale
        return args, slot_idx, ring_len

    def refcheck_call(self, fn, a: dict) -> None:
        dt_bias = self.dt_bias.float() if getattr(self, "_fp32_params", False) else self.dt_bias
        order = {}
        if self.cfg.flush_first(a["slot_idx"].shape[0]):  # the launch that is timed
            import torch

            from replayssm_kernels.row_order import flush_first_order_ref

            order["row_order"] = torch.empty_like(a["slot_idx"], dtype=torch.int32)
            flush_first_order_ref(a["flush"], order["row_order"])
        fn(a["state"], a["ring_u"], a["ring_k"], a["ring_v"], a["ring_g"], a["ring_beta"],
           a["q"], a["k"], a["v"], a["a"], a["b"], self.A_log, dt_bias, a["out"],
           a["slot_idx"], a["ring_start"], a["ring_len"], a["flush"],
           scale=self.scale, use_qk_l2norm=True,
           **self._read_kwargs(a.get("read_state"), a.get("read_scale")), **order)

    ring_names = ("ring_u", "ring_k", "ring_v", "ring_g", "ring_beta")

    def peer_conventional(self, a: dict):
        """SGLang's packed decode on refcheck args (as GDNAttnBackend calls it); returns out."""
        packed = self.peers.get("packed")
        if packed is None:
            return None
        o = torch_empty_like4(a["out"])
        o.fill_(float("nan"))
        packed(mixed_qkv=a["mixed_qkv"], a=a["a"], b=a["b"], A_log=self.A_log,
               dt_bias=self.dt_bias, scale=self.scale, initial_state=a["state"], out=o,
               ssm_state_indices=a["slot_idx"], use_qk_l2norm_in_kernel=True)
        return o[:, 0]


def torch_empty_like4(out3):
    """SGLang's GDN kernels write ``out`` as ``[batch, 1, HV, V]``."""
    import torch

    b, hv, v = out3.shape
    return torch.empty(b, 1, hv, v, dtype=out3.dtype, device=out3.device)


def _refcheck_rows(rows: int, slots: int, L: int, rng: _Rand):
    """Rows covering phase 0, a middle phase, the last non-flush phase, the ring-full flush, a
    forced flush of a short ring, a forced flush of an empty ring, and (last) a padding row."""
    import torch

    perm = (torch.randperm(slots - 1, generator=torch.Generator().manual_seed(rows)) + 1).tolist()
    plan = [(0, False), ((L - 1) // 2, False), (max(L - 2, 0), False), (L - 1, True),
            (min(2, L - 1), True), (0, True)]
    slot_idx, ring_len, flush = [], [], []
    for i in range(rows):
        if i == rows - 1:
            slot_idx.append(-1)  # padding row
            ring_len.append(0)
            flush.append(False)
            continue
        w, f = plan[i % len(plan)]
        slot_idx.append(perm[i])
        ring_len.append(w)
        flush.append(bool(f or w == L - 1))
    return slot_idx, ring_len, flush


# ==================================================================================================
# Imports of the kernels (ours and SGLang's)
# ==================================================================================================


def _resolve(mod, names: Sequence[str]):
    """First attribute found among dotted ``names`` under module ``mod`` (None if none)."""
    import importlib

    for n in names:
        sub, _, attr = n.rpartition(".")
        try:
            m = importlib.import_module(f"{mod}.{sub}") if sub else importlib.import_module(mod)
        except ImportError:
            continue
        f = getattr(m, attr, None)
        if f is not None:
            return f
    return None


def load_ours(cfg: Config) -> tuple[dict, dict, dict]:
    """(kernels, references, errors) for each family: our kernels (or refs with --impl ref)."""
    mod = cfg.kernels_module
    cands = {
        "mamba2": ("mamba2_replay_decode", "mamba2_decode.mamba2_replay_decode",
                   "mamba2_decode.kernel.mamba2_replay_decode"),
        "gdn": ("gdn_replay_decode", "gdn_decode.gdn_replay_decode",
                "gdn_decode.kernel.gdn_replay_decode"),
    }
    kernels, refs, errors = {}, {}, {}
    for fam, names in cands.items():
        ref_names = [n + "_ref" for n in names] + [
            f"{fam}_decode.reference.{names[0]}_ref", f"{fam}_decode.reference.{names[0]}"]
        try:
            k = _resolve(mod, names)
            r = _resolve(mod, ref_names)
        except Exception as e:  # noqa: BLE001 (a broken module: report, time the rest)
            k = r = None
            errors[fam] = f"import failed: {type(e).__name__}: {e}"
        if cfg.impl == "ref":
            k = r
        kernels[fam], refs[fam] = k, r
        if k is None and fam not in errors:
            errors[fam] = f"{mod}: none of {', '.join(names)} importable"
    return kernels, refs, errors


def load_peers(cfg: Config) -> tuple[dict, dict]:
    """SGLang 0.5.17's kernels: (functions, errors)."""
    peers, errors = {}, {}
    if cfg.skip_peers:
        return peers, {k: "--skip-peers" for k in ("ssu", "packed", "builtin")}
    spec = {
        "ssu": ("sglang.kernels.ops.mamba.triton_ops.mamba_ssm", "selective_state_update"),
        "packed": ("sglang.kernels.ops.attention.fla.fused_recurrent",
                   "fused_recurrent_gated_delta_rule_packed_decode"),
        "builtin": ("sglang.kernels.ops.attention.fla.fused_recurrent_linear_replayssm",
                    "fused_recurrent_linear_replayssm_decode"),
    }
    import importlib

    for key, (mod, name) in spec.items():
        try:
            peers[key] = getattr(importlib.import_module(mod), name)
        except Exception as e:  # noqa: BLE001 (no SGLang here: time ours only, say why)
            peers[key] = None
            errors[key] = f"{type(e).__name__}: {e}"
    return peers, errors


# ==================================================================================================
# Refcheck
# ==================================================================================================


def _rel_err(a, b) -> float:
    a64, b64 = a.double(), b.double()
    den = b64.norm().item()
    num = (a64 - b64).norm().item()
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def refcheck_family(fam, kernel, ref) -> dict:
    """One decode step of ``kernel`` against ``ref`` on identical copies; a dict of findings.

    Compares: ``out`` of live rows; ``state`` of flushed slots; the appended record of every
    non-flush row (all ring fields); with ``--read-dtype``, the refreshed read copy of flushed slots
    (dequantised). Everything else must be bitwise unchanged: padding rows' out (NaN-poisoned), the
    state, read copy and fp8 scales of non-flushed and untouched slots, every other ring row.
    """
    import torch

    args, slot_idx, ring_len = fam.refcheck_args()
    a_k = {k: v.clone() for k, v in args.items()}
    a_r = {k: v.clone() for k, v in args.items()}
    fam.refcheck_call(kernel, a_k)
    fam.refcheck_call(ref, a_r)
    if fam.cfg.device == "cuda":
        torch.cuda.synchronize()
    flush = args["flush"].tolist()
    start = args["ring_start"].tolist()
    R = args[fam.ring_names[0]].shape[2]
    res: dict = {"rows": len(slot_idx), "ring_len": ring_len, "flush": flush, "errors": {},
                 "problems": []}
    live = [i for i, s in enumerate(slot_idx) if s >= 0]
    pad = [i for i, s in enumerate(slot_idx) if s < 0]
    out_k, out_r = a_k["out"], a_r["out"]
    if not torch.isfinite(out_k[live].float()).all():
        res["problems"].append("out: non-finite (unwritten or NaN) values in live rows")
    if pad and not torch.isnan(out_k[pad].float()).all():
        res["problems"].append("out: padding row was written")
    res["errors"]["out"] = _rel_err(out_k[live], out_r[live])

    flushed = [slot_idx[i] for i in live if flush[i]]
    kept = [s for s in range(args["state"].shape[0]) if s not in set(flushed)]
    if flushed:
        res["errors"]["state"] = _rel_err(a_k["state"][flushed], a_r["state"][flushed])
    if not torch.equal(a_k["state"][kept], args["state"][kept]):
        res["problems"].append("state: a slot that did not flush was written")
    appended = [(slot_idx[i], (start[i] + ring_len[i]) % R) for i in live if not flush[i]]
    for name in fam.ring_names:
        k_t, r_t, o_t = a_k[name], a_r[name], args[name]
        if appended:
            ks = torch.stack([k_t[s, :, r] for s, r in appended])
            rs = torch.stack([r_t[s, :, r] for s, r in appended])
            res["errors"][name] = _rel_err(ks, rs)
        same = k_t.clone()
        for s, r in appended:
            same[s, :, r] = o_t[s, :, r]
        if not torch.equal(same, o_t):
            res["problems"].append(f"{name}: a ring row other than the appended ones changed")
    st16 = args["state"].dtype != torch.float32
    tols = REFCHECK_TOL["cuda" if fam.cfg.device == "cuda" else "cpu"]
    tol = {"out": tols["out"], "state": tols["state16" if st16 else "state"]}
    if "read_state" in args:
        _check_read_copy(args, a_k, a_r, flushed, kept, res)
        # the copies of kernel and reference round their (close) checkpoints: one copy ulp apart
        tol["read_state"] = tol["state"] + READ_COPY_ULP[fam.cfg.read_dtype]
    res["tolerances"] = {**tol, "ring": tols["ring"]}
    for name, err in res["errors"].items():
        lim = tol.get(name, tols["ring"])
        if not err <= lim:  # NaN fails too
            res["problems"].append(f"{name}: rel err {err:.3e} > {lim:.0e}")
    res["ok"] = not res["problems"]
    return res


def _bits_equal(a, b) -> bool:
    """Bitwise equality (NaN payloads included) of two tensors of one dtype and shape."""
    import torch

    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _check_read_copy(args: dict, a_k: dict, a_r: dict, flushed: list[int], kept: list[int],
                     res: dict) -> None:
    """Split precision part of ``refcheck_family``: the copy and fp8 scales of every slot that did
    not flush bitwise unchanged (a problem otherwise); flushed slots' copies, dequantised, against
    the reference's (``res["errors"]["read_state"]``); and, informational, whether the kernel's
    refreshed copy is exactly ``quantize_rows`` of its own stored checkpoint, as
    kernels/README.md promises (``res["read_copy_bits"]``)."""
    from replayssm_kernels.mamba2_decode.read_copy import dequantize_rows, quantize_rows

    for name in ("read_state", "read_scale"):
        if name in args and not _bits_equal(a_k[name][kept], args[name][kept]):
            res["problems"].append(f"{name}: the copy of a slot that did not flush was written")
    if not flushed:
        return

    def deq(a):
        scale = a["read_scale"][flushed] if "read_scale" in a else None
        return dequantize_rows(a["read_state"][flushed], scale)

    res["errors"]["read_state"] = _rel_err(deq(a_k), deq(a_r))
    q, scale = quantize_rows(a_k["state"][flushed], a_k["read_state"].dtype)
    res["read_copy_bits"] = _bits_equal(q, a_k["read_state"][flushed]) and (
        scale is None or _bits_equal(scale, a_k["read_scale"][flushed]))


def crosscheck_conventional(fam, kernel) -> dict | None:
    """Our kernel with an empty ring and every row flushing IS the conventional step: compare it
    with SGLang's conventional kernel (selective_state_update / packed decode) on identical
    copies. Checks the peers' invocation as much as ours. Informational (not a gate): the claim
    is bitwise for an fp32 state, and the report says whether it holds."""
    import torch

    args, slot_idx, _ = fam.refcheck_args()
    args["ring_len"].zero_()
    args["flush"].fill_(True)
    args["flush"][[i for i, s in enumerate(slot_idx) if s < 0]] = False
    a_o = {k: v.clone() for k, v in args.items()}
    a_p = {k: v.clone() for k, v in args.items()}
    fam.refcheck_call(kernel, a_o)
    out_p = fam.peer_conventional(a_p)
    if out_p is None:
        return None
    if fam.cfg.device == "cuda":
        torch.cuda.synchronize()
    live = [i for i, s in enumerate(slot_idx) if s >= 0]
    slots = sorted({s for s in slot_idx if s >= 0})
    res = {
        "out": _rel_err(a_o["out"][live], out_p[live]),
        "state": _rel_err(a_o["state"][slots], a_p["state"][slots]),
        "out_bitwise": bool(torch.equal(a_o["out"][live], out_p[live])),
        "state_bitwise": bool(torch.equal(a_o["state"][slots], a_p["state"][slots])),
    }
    res["ok"] = res["out"] <= 2e-2 and res["state"] <= 1e-2
    return res


def probe_layout(fam, kernel) -> str | None:
    """Call our kernel once in the serving layout (strided views of the packed activations,
    per-head parameters in the model's dtypes). If its wrapper refuses that layout, switch the
    family to contiguous inputs and fp32 parameters, say so, and probe again. Returns None when a
    layout works, else the error."""
    for attempt in range(2):
        args, _, _ = fam.refcheck_args()
        try:
            fam.refcheck_call(kernel, args)
            return None
        except ValueError as e:
            if attempt == 1:
                return f"ValueError: {e}"
            _log(f"  [{fam.name}] ours refused the serving layout ({e}); using contiguous "
                 "inputs and fp32 per-head parameters")
            fam._contiguous = fam._fp32_params = True
            fam._note = f"contiguous inputs, fp32 params (refused serving layout: {e})"
        except Exception as e:  # noqa: BLE001 (a crash: report it, time the rest)
            traceback.print_exc()
            return f"{type(e).__name__}: {e}"
    return None


# ==================================================================================================
# Results
# ==================================================================================================


@dataclass
class Row:
    """One line of the results table."""

    family: str
    kernel: str  # key in LABELS
    label: str
    batch: int
    mode: str  # "cycle" (mean over the L phases), "mixed" (one mixed batch) or "step"
    median_us: float
    bytes: float  # bytes moved per launch (byte model), whole batch, one layer
    tbps: float = float("nan")
    pct_copy: float = float("nan")
    speedup_vs_base: float = float("nan")  # vs SGLang's conventional kernel of the family
    speedup_vs_builtin: float = float("nan")  # GDN: vs SGLang's built-in ReplaySSM
    nonflush_us: float = float("nan")
    flush_us: float = float("nan")
    spread_pct: float = float("nan")  # max spread between the passes' medians
    floor_us: float = float("nan")  # bytes / copy bandwidth
    phase_us: list[float] = field(default_factory=list)
    phase_bytes: list[float] = field(default_factory=list)
    note: str = ""


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def summarize_case(case_key: str, family: str, batch: int, model: bm.KernelBytes, L: int,
                   samples: dict, mixed_phases: list[int] | None, note: str) -> list[Row]:
    """Rows for one kernel at one batch from its timing samples.

    ``samples`` maps a series id (``("phase", w)``, ``("mixed",)`` or ``("step",)``) to a list of
    per-pass sample lists (microseconds).
    """
    rows: list[Row] = []

    def med_and_spread(series) -> tuple[float, float]:
        passes = samples.get(series, [])
        allv = [v for p in passes for v in p]
        meds = [_median(p) for p in passes if p]
        spread = (max(meds) - min(meds)) / _median(allv) * 100 if len(meds) > 1 else float("nan")
        return _median(allv), spread

    if model.phased:
        phase_us, spreads = [], []
        for w in range(L):
            m, s = med_and_spread(("phase", w))
            phase_us.append(m)
            spreads.append(s)
        cyc = sum(phase_us) / L
        pb = [p.total for p in model.phases()]
        nonflush = sum(phase_us[:-1]) / (L - 1) if L > 1 else float("nan")
        sp = max(spreads) if spreads and not all(math.isnan(x) for x in spreads) else float("nan")
        rows.append(Row(family, case_key, f"{LABELS[case_key]} L{L}", batch, "cycle", cyc,
                        batch * model.cycle_mean(), nonflush_us=nonflush, flush_us=phase_us[-1],
                        spread_pct=sp, phase_us=phase_us, phase_bytes=[batch * b for b in pb],
                        note=note))
        if ("mixed",) in samples and mixed_phases is not None:
            m, s = med_and_spread(("mixed",))
            rows.append(Row(family, case_key, f"{LABELS[case_key]} L{L} mixed", batch, "mixed", m,
                            model.batch_bytes(mixed_phases), spread_pct=s, note=note))
    else:
        m, s = med_and_spread(("step",))
        rows.append(Row(family, case_key, LABELS[case_key], batch, "step", m,
                        model.batch_bytes(batch=batch), spread_pct=s, note=note))
    return rows


def finish_rows(rows: list[Row], copy_bw: float) -> None:
    """Fill TB/s, share of copy bandwidth, floors and speed-ups (same family, batch and mode)."""
    for r in rows:
        if r.median_us > 0 and not math.isnan(r.median_us):
            r.tbps = r.bytes / (r.median_us * 1e-6) / 1e12
            if copy_bw and not math.isnan(copy_bw):
                r.pct_copy = 100 * r.tbps * 1e12 / copy_bw
        if copy_bw and not math.isnan(copy_bw):
            r.floor_us = r.bytes / copy_bw * 1e6
    by = {(r.family, r.batch, r.kernel, r.mode): r for r in rows}
    for r in rows:
        base = by.get((r.family, r.batch, BASELINE[r.family], "step"))
        if base is not None and r.kernel != BASELINE[r.family]:
            r.speedup_vs_base = base.median_us / r.median_us
        if r.family == "gdn" and r.kernel == "ours":
            bi = by.get((r.family, r.batch, "builtin", r.mode))
            if bi is not None:
                r.speedup_vs_builtin = bi.median_us / r.median_us


#: Issue 3's targets at batch 256, fp32 state, L = 16: (family, kernel, what, threshold)
TARGETS = (
    ("mamba2", "ours", "speedup_vs_base", 2.2),
    ("gdn", "ours", "speedup_vs_base", 1.65),
    ("gdn", "ours", "speedup_vs_builtin", 1.15),
    ("mamba2", "ours", "pct_copy", 85.0),
    ("gdn", "ours", "pct_copy", 85.0),
)


def check_targets(rows: list[Row], batch: int = 256) -> list[dict]:
    """Issue 3's targets, evaluated on the cycle rows at ``batch`` (empty if not timed)."""
    out = []
    for fam, key, what, lim in TARGETS:
        r = next((r for r in rows if (r.family, r.kernel, r.batch, r.mode)
                  == (fam, key, batch, "cycle")), None)
        if r is None:
            continue
        v = getattr(r, what)
        out.append({"family": fam, "kernel": key, "batch": batch, "metric": what, "target": lim,
                    "value": v, "met": (not math.isnan(v)) and v >= lim})
    return out


def _json_safe(x):
    """NaN / inf -> None, recursively, so that results.json is strict JSON."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def _read_note(read_dtype: str) -> str:
    """``", read copy bf16 (ours)"`` with --read-dtype, else nothing."""
    return "" if read_dtype == "same" else f", read copy {read_dtype} (ours)"


def _fmt(v: float, spec: str) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


TABLE_COLS = ("family", "kernel", "batch", "median us", "MB moved", "TB/s", "% copy BW",
              "non-flush us", "flush us", "x vs SGLang", "x vs built-in", "± %")


def table_lines(rows: list[Row]) -> list[list[str]]:
    out = []
    for r in rows:
        out.append([
            r.family, r.label, str(r.batch), _fmt(r.median_us, ".1f"), _fmt(r.bytes / 1e6, ".2f"),
            _fmt(r.tbps, ".2f"), _fmt(r.pct_copy, ".0f"), _fmt(r.nonflush_us, ".1f"),
            _fmt(r.flush_us, ".1f"), _fmt(r.speedup_vs_base, ".2f"),
            _fmt(r.speedup_vs_builtin, ".2f"), _fmt(r.spread_pct, ".1f"),
        ])
    return out


def format_text_table(rows: list[Row]) -> str:
    lines = [list(TABLE_COLS)] + table_lines(rows)
    widths = [max(len(line[i]) for line in lines) for i in range(len(TABLE_COLS))]
    fmt = "  ".join(f"{{:<{w}}}" if i < 2 else f"{{:>{w}}}" for i, w in enumerate(widths))
    text = [fmt.format(*lines[0]), fmt.format(*["-" * w for w in widths])]
    text += [fmt.format(*line) for line in lines[1:]]
    return "\n".join(text)


#: Metadata keys of launch overrides (``--*-launch``), named in results.md when present.
LAUNCH_META_KEYS = ("gdn_decode_launch", "mamba2_verify_launch", "gdn_verify_launch")


def launch_override_lines(meta: dict) -> list[str]:
    """Markdown bullet lines naming the launch overrides a run used (none: no line)."""
    lines = [f"- **launch override** `{k}`: " + ", ".join(f"{f}={v}" for f, v in meta[k].items())
             for k in LAUNCH_META_KEYS if meta.get(k)]
    if meta.get("row_order", "serving") != "serving":
        lines.append(f"- **launch override** `--row-order {meta['row_order']}`: our GDN kernel's "
                     "rows in that order at every batch (default: flush rows first from the "
                     "serving backend's FLUSH_FIRST_MIN_BATCH)")
    return lines


def format_markdown(rows: list[Row], meta: dict) -> str:
    cols = TABLE_COLS
    md = [f"# Decode kernel benchmark ({meta.get('device_name', '?')})", ""]
    if meta.get("dry_run"):
        md += ["**DRY RUN: synthetic timings from the byte model, not measurements.**", ""]
    md += [
        f"- commit `{meta.get('commit')}`, {meta.get('date')}",
        f"- command: `python -m benchmarks.bench_decode {' '.join(meta.get('argv', []))}`",
        f"- shapes: {meta.get('shapes')}; window L = {meta.get('L')}, ring rows R = "
        f"{meta.get('R')}; state {meta.get('state_dtype')}"
        f"{_read_note(meta.get('read_dtype', 'same'))}, activations {meta.get('act_dtype')}; "
        f"{meta.get('slots')} pool slots per family (one layer), rows on random slots",
        f"- copy bandwidth {_fmt(meta.get('copy_bw', float('nan')) / 1e12, '.2f')} TB/s "
        f"(read + write); L2 flush: {meta.get('l2_flush')} of "
        f"{meta.get('l2_flush_bytes', 0) / 2**20:.0f} MiB between repetitions; "
        f"{'CUDA-graph replay' if meta.get('graph') else 'eager launches'}; median of "
        f"{meta.get('repeats')} × {meta.get('passes')} passes per phase",
        f"- `median us`: phased kernels (`L{meta.get('L')}`): mean over the L phases of each phase's median "
        "(flush step included); `mixed`: one launch with rows spread over the phases; "
        "`MB moved`: byte model (benchmarks/bytes_model.py) for the whole batch; "
        "`± %`: spread between passes",
        *launch_override_lines(meta),
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "|".join("---" if i < 2 else "---:" for i in range(len(cols))) + "|",
    ]
    for line in table_lines(rows):
        md.append("| " + " | ".join(line) + " |")
    md.append("")
    return "\n".join(md)


# ----------------------------------------------------------------------------------------- plot


_COLORS = {"ours": (214, 39, 40), "ssu": (31, 119, 180), "packed": (31, 119, 180),
           "builtin": (44, 160, 44)}


def _plot_series(rows: list[Row], family: str) -> dict[str, list[tuple[int, float, float]]]:
    series: dict[str, list[tuple[int, float, float]]] = {}
    for r in rows:
        if r.family != family or math.isnan(r.median_us):
            continue
        series.setdefault(r.label, []).append((r.batch, r.median_us, r.pct_copy))
    for v in series.values():
        v.sort()
    return series


def write_plot(rows: list[Row], path: Path, title: str) -> str:
    """Write the PNG: per family, median us and share of copy bandwidth against batch.

    Uses matplotlib when importable, else Pillow; returns which one (or why none).
    """
    families = [f for f in ("mamba2", "gdn") if any(r.family == f for r in rows)]
    if not families:
        return "no rows"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001 (no matplotlib in this venv: fall back to Pillow)
        plt = None
    mpl_error = ""
    if plt is not None:
        try:
            _write_plot_mpl(rows, families, path, title, plt, matplotlib)
            return "matplotlib"
        except Exception as e:  # noqa: BLE001 (an odd matplotlib: fall back to Pillow, say so)
            mpl_error = f"; matplotlib failed: {type(e).__name__}: {e}"
    try:
        _write_plot_pil(rows, families, path, title)
        return "pillow" + (mpl_error or " (matplotlib not importable)")
    except Exception as e:  # noqa: BLE001 (no plotting library at all: say so, keep the rest)
        return f"no plot: {type(e).__name__}: {e}{mpl_error}"


def _write_plot_mpl(rows: list[Row], families: list[str], path: Path, title: str, plt,
                    matplotlib) -> None:
    import matplotlib.ticker  # noqa: F401 (NullLocator below)

    fig, axes = plt.subplots(2, len(families), figsize=(6.5 * len(families), 8.5),
                             squeeze=False)
    for j, fam in enumerate(families):
        ser = _plot_series(rows, fam)
        for label, pts in ser.items():
            key = next(r.kernel for r in rows if r.label == label)
            color = tuple(c / 255 for c in _COLORS.get(key, (100, 100, 100)))
            ls = "--" if "mixed" in label else "-"
            xs = [p[0] for p in pts]
            axes[0][j].plot(xs, [p[1] for p in pts], ls, marker="o", color=color,
                            label=label, ms=4)
            axes[1][j].plot(xs, [p[2] for p in pts], ls, marker="o", color=color,
                            label=label, ms=4)
        batches = sorted({p[0] for pts in ser.values() for p in pts})
        for i in range(2):
            axes[i][j].set_xscale("log", base=2)
            axes[i][j].set_xticks(batches)
            axes[i][j].set_xticklabels([str(b) for b in batches])
            axes[i][j].xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        axes[0][j].set_yscale("log")
        axes[0][j].set_title(f"{fam}: median us per layer step")
        axes[1][j].set_title(f"{fam}: % of measured copy bandwidth")
        axes[1][j].set_xlabel("batch")
        axes[1][j].set_ylim(bottom=0)
        for i in range(2):
            axes[i][j].grid(True, which="both", alpha=0.3)
            axes[i][j].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _write_plot_pil(rows: list[Row], families: list[str], path: Path, title: str) -> None:
    from PIL import Image, ImageDraw

    pw, ph, m = 520, 330, 60
    img = Image.new("RGB", (pw * len(families), ph * 2 + 30), "white")
    d = ImageDraw.Draw(img)
    d.text((10, 8), title[:150], fill="black")
    for j, fam in enumerate(families):
        ser = _plot_series(rows, fam)
        for i, (idx, name, logy) in enumerate(((1, "median us (log)", True),
                                               (2, "% of copy BW", False))):
            x0, y0 = j * pw + m, 30 + i * ph + 20
            x1, y1 = (j + 1) * pw - 20, 30 + (i + 1) * ph - 40
            d.rectangle([x0, y0, x1, y1], outline="black")
            d.text((x0, y0 - 14), f"{fam}: {name} vs batch", fill="black")
            pts_all = [p for v in ser.values() for p in v if not math.isnan(p[idx])]
            if not pts_all:
                continue
            bx = sorted({p[0] for p in pts_all})
            lx = [math.log2(b) for b in bx]
            xmin, xmax = min(lx), max(lx) if max(lx) > min(lx) else min(lx) + 1
            ys = [p[idx] for p in pts_all]
            if logy:
                ys = [math.log10(max(y, 1e-3)) for y in ys]
            ymin, ymax = (min(ys), max(ys)) if not logy else (math.floor(min(ys)),
                                                               math.ceil(max(ys)))
            if not logy:
                ymin = 0.0
            if ymax <= ymin:
                ymax = ymin + 1

            def px(b, y, xmin=xmin, xmax=xmax, ymin=ymin, ymax=ymax, x0=x0, x1=x1, y0=y0,
                   y1=y1, logy=logy):
                yy = math.log10(max(y, 1e-3)) if logy else y
                return (x0 + (math.log2(b) - xmin) / (xmax - xmin) * (x1 - x0),
                        y1 - (yy - ymin) / (ymax - ymin) * (y1 - y0))

            for b in bx:
                xx = px(b, 10 ** ymin if logy else ymin)[0]
                d.text((xx - 6, y1 + 4), str(b), fill="black")
            for k in range(5):
                yv = ymin + (ymax - ymin) * k / 4
                yy = y1 - (y1 - y0) * k / 4
                d.text((x0 - 50, yy - 6), f"{10 ** yv:.3g}" if logy else f"{yv:.0f}",
                       fill="black")
            for n, (label, pts) in enumerate(ser.items()):
                key = next(r.kernel for r in rows if r.label == label)
                col = _COLORS.get(key, (100, 100, 100))
                xy = [px(p[0], p[idx]) for p in pts if not math.isnan(p[idx])]
                if len(xy) > 1:
                    d.line(xy, fill=col, width=1 if "mixed" in label else 2)
                for x, y in xy:
                    d.ellipse([x - 2, y - 2, x + 2, y + 2], fill=col)
                d.text((x0 + 6, y0 + 4 + 12 * n), label, fill=col)
    img.save(path, format="PNG")


# ==================================================================================================
# Driver
# ==================================================================================================


def environment(cfg: Config) -> dict:
    meta: dict = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": cfg.commit,
        "argv": cfg.argv,
        "python": platform.python_version(),
        "host": platform.node(),
        "device": cfg.device,
        "dry_run": cfg.dry_run,
    }
    try:
        import torch

        meta["torch"] = torch.__version__
        if cfg.device == "cuda" and torch.cuda.is_available():
            p = torch.cuda.get_device_properties(torch.cuda.current_device())
            meta["device_name"] = p.name
            meta["sm_count"] = p.multi_processor_count
            meta["l2_bytes"] = int(getattr(p, "L2_cache_size", 0))
            meta["gpu_mem_bytes"] = int(p.total_memory)
            meta["cuda"] = torch.version.cuda
    except Exception:  # noqa: BLE001 (dry runs may have no torch)
        pass
    for mod in ("triton", "sglang"):
        try:
            import importlib.metadata as md

            meta[mod] = md.version(mod)
        except Exception:  # noqa: BLE001 (not installed: leave it out)
            pass
    meta.setdefault("device_name", "cpu" if cfg.device == "cpu" else "?")
    if cfg.dry_run:
        meta["device_name"] = "dry run"
    return meta


def _log(msg: str) -> None:
    print(msg, flush=True)


def _dry_rows(cfg: Config) -> list[Row]:
    rows: list[Row] = []
    for fam in cfg.families:
        models = byte_models(cfg, fam)
        for b in cfg.batches:
            for key, model in models.items():
                if cfg.skip_peers and key != "ours":
                    continue
                eff = _DRY_EFF[key]

                def t(nbytes, eff=eff):
                    return nbytes / (eff * _DRY_COPY_BW) * 1e6 + 2.0

                samples: dict = {}
                mixed = None
                if model.phased:
                    for w in range(cfg.L):
                        samples[("phase", w)] = [[t(b * model.phase(w).total)]] * cfg.passes
                    mixed = bm.mixed_phases(b, cfg.L)
                    samples[("mixed",)] = [[t(model.batch_bytes(mixed))]] * cfg.passes
                else:
                    samples[("step",)] = [[t(b * model.phase(0).total)]] * cfg.passes
                rows += summarize_case(key, fam, b, model, cfg.L, samples, mixed, "dry run")
    return rows


def _try_first_call(fam, case: Case, cfg: Config) -> str | None:
    """Run ``case`` once per phase (compiles it) with a NaN-poisoned output; None if all is well."""
    import torch

    phases = list(range(cfg.L)) if case.phased else [None]
    for w in phases:
        if w is not None:
            case.set_phase(w)
        case.out.fill_(float("nan"))
        case.fn()
        if cfg.device == "cuda":
            torch.cuda.synchronize()
        if not torch.isfinite(case.out.float()).all():
            return f"non-finite output at phase {w}"
    if case.phased:
        case.set_mixed()
        case.fn()
    return None


def run_family(cfg: Config, fam, timer: Timer, models: dict, skip_ours: str | None,
               status: dict) -> list[Row]:
    import torch

    rows: list[Row] = []
    dead: dict[str, str] = {}
    for batch in cfg.batches:
        t0 = time.perf_counter()
        cases = fam.cases(batch)
        ready: list[tuple[Case, Callable[[], None]]] = []
        for case in cases:
            if (case.key == "ours" and skip_ours) or case.key in dead:
                continue
            err = None
            try:
                err = _try_first_call(fam, case, cfg)
            except Exception as e:  # noqa: BLE001 (one broken kernel must not stop the others)
                err = f"{type(e).__name__}: {e}"
                if cfg.device == "cuda":
                    traceback.print_exc()
            if err is not None:
                # not retried at the later (larger) batches
                dead[case.key] = err
                status.setdefault(f"{fam.name}/{case.key}", f"not timed: {err}")
                _log(f"  [{fam.name}] {LABELS[case.key]} batch {batch}: NOT TIMED ({err})")
                continue
            run = case.fn
            if cfg.graph:
                try:
                    g = capture_graph(case.fn)
                    run = g.replay
                    case._graph = g  # keep it alive
                except Exception as e:  # noqa: BLE001 (uncapturable: time eagerly, say so)
                    _log(f"  [{fam.name}] {LABELS[case.key]}: graph capture failed ({e}); "
                         "timing eager launches")
                    case.note = (case.note + "; " if case.note else "") + "eager (no graph)"
                    torch.cuda.synchronize()
            ready.append((case, run))
        # interleave: every pass times every series once
        series = []
        for case, run in ready:
            if case.phased:
                series += [(case, run, ("phase", w)) for w in range(cfg.L)]
                series.append((case, run, ("mixed",)))
            else:
                series.append((case, run, ("step",)))
        samples: dict = {id(c): {} for c, _ in ready}
        for _ in range(cfg.passes):
            for case, run, sid in series:
                if sid[0] == "phase":
                    case.set_phase(sid[1])
                elif sid[0] == "mixed":
                    case.set_mixed()
                ts = timer.measure(run, cfg.repeats, cfg.warmup)
                samples[id(case)].setdefault(sid, []).append(ts)
        for case, _ in ready:
            rows += summarize_case(case.key, fam.name, batch, models[case.key], cfg.L,
                                   samples[id(case)], case.mixed_phases, case.note)
        for case, _ in ready:
            case._graph = None
        del cases, ready, series
        if cfg.device == "cuda":
            torch.cuda.synchronize()
        _log(f"  [{fam.name}] batch {batch}: {time.perf_counter() - t0:.1f} s")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    cfg.out.mkdir(parents=True, exist_ok=True)
    if cfg.device == "cpu" and not cfg.dry_run:
        # Triton reads this when a kernel is defined: set it before any kernel is imported (ours
        # and SGLang's both run under the interpreter on CPU).
        os.environ.setdefault("TRITON_INTERPRET", "1")
    meta = environment(cfg)
    meta.update(
        L=cfg.L, R=cfg.R, state_dtype=cfg.state_dtype, act_dtype=cfg.act_dtype,
        read_dtype=cfg.read_dtype, gdn_u_dtype=cfg.gdn_u_dtype, slots=cfg.slots,
        batches=cfg.batches, families=cfg.families, impl=cfg.impl, repeats=cfg.repeats,
        warmup=cfg.warmup, passes=cfg.passes, l2_flush=cfg.l2_flush, graph=cfg.graph, seed=cfg.seed,
        shape_dims={"mamba2": asdict(cfg.mamba2_shape), "gdn": asdict(cfg.gdn_shape)},
    )
    status: dict[str, str] = {}
    refchecks: dict[str, dict] = {}
    t_start = time.perf_counter()
    _log(f"bench_decode: {meta.get('device_name')} | families {cfg.families} | batches "
         f"{cfg.batches} | L={cfg.L} R={cfg.R} | state "
         f"{cfg.state_dtype}{_read_note(cfg.read_dtype)} | slots {cfg.slots}")

    if cfg.dry_run:
        copy = {"bytes_per_s": _DRY_COPY_BW, "note": "dry run: assumed"}
        rows = _dry_rows(cfg)
    else:
        import torch

        torch.manual_seed(cfg.seed)
        copy = measure_copy_bandwidth(cfg)
        if cfg.device == "cuda":
            _log(f"copy bandwidth: {copy['bytes_per_s'] / 1e12:.3f} TB/s (read + write)")
        if cfg.device == "cpu" and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            from benchmarks import _cpu_shims

            # GPU row-sum order: our GDN fold vs SGLang's packed decode (crosscheck) bit for bit
            meta["cpu_shims"] = _cpu_shims.apply(sglang=not cfg.skip_peers, gpu_sum_order=True)
        if cfg.gdn_decode_launch:  # launch sweep: keywords of gdn_replay_decode_fwd, looked up per call
            import functools

            import replayssm_kernels.gdn_decode.kernel as gdk

            gdk.gdn_replay_decode_fwd = functools.partial(gdk.gdn_replay_decode_fwd,
                                                          **cfg.gdn_decode_launch)
            meta["gdn_decode_launch"] = dict(cfg.gdn_decode_launch)
            _log(f"GDN decode: launch tile overridden: {cfg.gdn_decode_launch}")
        meta["row_order"] = cfg.row_order
        kernels, refs, kerr = load_ours(cfg)
        peers, perr = load_peers(cfg)
        for k, e in {**{f"ours/{k}": v for k, v in kerr.items()},
                     **{f"peer/{k}": v for k, v in perr.items()}}.items():
            status[k] = f"unavailable: {e}"
            _log(f"  {k}: unavailable ({e})")
        timer = Timer(cfg)
        meta["l2_flush_bytes"] = timer.flush_bytes
        meta["l2_flush"] = timer.mode
        rows = []
        for fam_name in cfg.families:
            try:
                rows += _run_one_family(cfg, fam_name, kernels, refs, peers, timer, meta,
                                        refchecks, status)
            except Exception as e:  # noqa: BLE001 (e.g. a device fault: keep what was measured)
                traceback.print_exc()
                status[f"{fam_name}/all"] = f"aborted: {type(e).__name__}: {e}"
                _log(f"[{fam_name}] ABORTED: {type(e).__name__}: {e}")
            # written after every family, so a later crash keeps the finished ones
            write_outputs(cfg, meta, copy, refchecks, status, rows, t_start, final=False)
            if cfg.device == "cuda":
                torch.cuda.empty_cache()
        if kernels.get("mamba2") is not None or kernels.get("gdn") is not None:
            meta["cursor_step_us"] = time_cursor_step(cfg, timer)

    rows = write_outputs(cfg, meta, copy, refchecks, status, rows, t_start, final=True)
    failed = any(not rc.get("ok", False) for rc in refchecks.values())
    return 1 if failed else 0


def time_cursor_step(cfg: Config, timer: Timer) -> dict:
    """``decode_cursor_step`` (once per forward, shared by all layers), median us per batch."""
    import importlib

    import torch

    try:
        step = importlib.import_module(cfg.kernels_module).decode_cursor_step
    except Exception as e:  # noqa: BLE001 (informational only)
        return {"error": f"{type(e).__name__}: {e}"}
    rng = _Rand(cfg.device, cfg.seed + 3)
    res: dict = {}
    for batch in cfg.batches:
        cursors = torch.stack([rng.ints((cfg.slots,), cfg.R, torch.int32),
                               rng.ints((cfg.slots,), cfg.L, torch.int32)], dim=1).contiguous()
        slot_idx = _row_slots(rng, cfg.slots, batch)
        outs = (torch.empty(batch, dtype=torch.int32, device=cfg.device),
                torch.empty(batch, dtype=torch.int32, device=cfg.device),
                torch.empty(batch, dtype=torch.bool, device=cfg.device))

        def fn(c=cursors, s=slot_idx, o=outs):
            # the cursors wander over the run; only the time matters here
            step(c, s, None, cfg.L, cfg.R, *o)

        try:
            fn()
            run = capture_graph(fn).replay if cfg.graph else fn
            ts = timer.measure(run, max(cfg.repeats // 2, 1), cfg.warmup)
            res[str(batch)] = _median(ts)
        except Exception as e:  # noqa: BLE001 (informational only)
            res[str(batch)] = f"{type(e).__name__}: {e}"
    return res


def _run_one_family(cfg: Config, fam_name: str, kernels: dict, refs: dict, peers: dict,
                    timer: Timer, meta: dict, refchecks: dict, status: dict) -> list[Row]:
    """Layout probe, refcheck / crosscheck, then timing of one family."""
    fam = (Mamba2Family if fam_name == "mamba2" else GDNFamily)(cfg, kernels, peers)
    models = byte_models(cfg, fam_name)
    meta[f"{fam_name}_pool_bytes_per_slot"] = fam.bytes_per_slot()
    skip_ours = None
    if kernels.get(fam_name) is not None:
        err = probe_layout(fam, kernels[fam_name])
        if err is not None:
            skip_ours = f"refused every input layout: {err}"
    if cfg.refcheck and kernels.get(fam_name) is not None and not skip_ours:
        if refs.get(fam_name) is None:
            skip_ours = "no torch reference found for --refcheck"
        else:
            try:
                rc = refcheck_family(fam, kernels[fam_name], refs[fam_name])
            except Exception as e:  # noqa: BLE001 (a crash is a failed check)
                traceback.print_exc()
                rc = {"ok": False, "problems": [f"{type(e).__name__}: {e}"]}
            refchecks[fam_name] = rc
            errs = ", ".join(f"{k} {v:.2e}" for k, v in rc.get("errors", {}).items())
            bits = rc.get("read_copy_bits")
            _log(f"refcheck {fam_name}: {'PASS' if rc['ok'] else 'FAIL'} ({errs})"
                 + ("" if bits is None else f"; refreshed copy == quantize_rows(checkpoint): "
                    f"{'bitwise' if bits else 'NOT bitwise (informational)'}")
                 + ("" if rc["ok"] else f" problems: {rc['problems']}"))
            if not rc["ok"]:
                skip_ours = "refcheck failed: " + "; ".join(rc["problems"])
            try:
                xc = crosscheck_conventional(fam, kernels[fam_name])
            except Exception as e:  # noqa: BLE001 (informational only)
                xc = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            if xc is not None:
                rc["vs_sglang_conventional"] = xc
                _log(f"crosscheck {fam_name} (empty ring, all rows flush) vs SGLang "
                     f"conventional: " + ", ".join(f"{k} {v}" for k, v in xc.items()))
    if skip_ours:
        status[f"{fam_name}/ours"] = f"not timed: {skip_ours}"
    return run_family(cfg, fam, timer, models, skip_ours, status)


def write_outputs(cfg: Config, meta: dict, copy: dict, refchecks: dict, status: dict,
                  rows: list[Row], t_start: float, final: bool) -> list[Row]:
    """Write results.json, results.md and the PNG; on the final call also print the summary."""
    rows = [dataclasses.replace(r) for r in rows]  # finish_rows fills fields: work on copies
    copy_bw = copy["bytes_per_s"]
    meta["copy_bw"] = copy_bw
    meta["shapes"] = ", ".join(
        f"{f} {cfg.mamba2_shape.name if f == 'mamba2' else cfg.gdn_shape.name}"
        for f in cfg.families)
    meta["complete"] = final
    finish_rows(rows, copy_bw)
    order = {"ours": 0, "builtin": 1, "ssu": 2, "packed": 2}
    rows.sort(key=lambda r: (cfg.families.index(r.family), r.batch, order[r.kernel],
                             r.mode == "mixed"))
    meta["wall_s"] = time.perf_counter() - t_start

    title = (f"ReplaySSM decode, {meta.get('device_name')}, L={cfg.L}, state {cfg.state_dtype}"
             f"{_read_note(cfg.read_dtype)}, "
             f"commit {str(cfg.commit)[:12]}" + (" [DRY RUN]" if cfg.dry_run else ""))
    plot = write_plot(rows, cfg.out / "decode_bench.png", title)
    meta["plot"] = plot
    targets = check_targets(rows)
    result = {
        "meta": meta,
        "targets_batch256": targets,
        "copy_bandwidth": copy,
        "refcheck": refchecks,
        "status": status,
        "byte_models": {f: bm.summarize(list(byte_models(cfg, f).values()))
                        for f in cfg.families},
        "rows": [asdict(r) for r in rows],
    }
    (cfg.out / "results.json").write_text(
        json.dumps(_json_safe(result), indent=1, default=str, allow_nan=False))
    md = format_markdown(rows, meta)
    if targets:
        md += "\nIssue 3 targets at batch 256:\n\n" + "\n".join(
            f"- {t['family']} {t['metric']}: {_fmt(t['value'], '.2f')} (target >= {t['target']})"
            f" {'met' if t['met'] else 'MISSED'}" for t in targets) + "\n"
    if status:
        md += "\nStatus:\n\n" + "\n".join(f"- {k}: {v}" for k, v in status.items()) + "\n"
    (cfg.out / "results.md").write_text(md)
    if not final:
        return rows

    _log("")
    for k, v in status.items():
        _log(f"status {k}: {v}")
    _log(f"plot: {plot}; wrote {cfg.out}/results.json, results.md, decode_bench.png; "
         f"{meta['wall_s']:.0f} s")
    _log(f"copy bandwidth {_fmt(copy_bw / 1e12, '.3f')} TB/s"
         + (" (DRY RUN: synthetic timings)" if cfg.dry_run else ""))
    _log(format_text_table(rows))
    cs = meta.get("cursor_step_us")
    if isinstance(cs, dict):
        _log("decode_cursor_step (once per forward, all layers), median us: " + ", ".join(
            f"b{k} {_fmt(v, '.1f') if isinstance(v, float) else v}" for k, v in cs.items()))
    for t in targets:
        _log(f"target {t['family']} {t['metric']} @256: {_fmt(t['value'], '.2f')} "
             f"(>= {t['target']}) {'met' if t['met'] else 'MISSED'}")
    return rows


if __name__ == "__main__":
    sys.exit(main())
