"""Launch-config sweep of the GDN ReplaySSM verify kernel on one GPU (one process).

Run from the repository root (see benchmarks/README.md)::

    python -m benchmarks.sweep_gdn_verify --out OUT_DIR [--T 4] [--batch 64,256] \\
        [--configs 32x16x1,64x8x4] [--time-budget 420]

It launches ``replayssm_kernels.gdn_verify.kernel.gdn_replay_verify_fwd`` (the chunkwise form's
launcher) directly. A config ``BVxBRxW`` is its ``block_v`` x ``block_r`` x ``num_warps``. The
grid is ``{32, 64, 128} x {4, 8, 16} x {1, 2, 4, 8}`` minus invalid combos (``validate_config``),
the default ``32x16x1`` first and always run, then more warps before fewer (one warp per tile is
the suspected latency limit), so that a ``--time-budget`` cut drops the least likely configs. The
set-up is ``bench_verify``'s (``verify_cases.GDNVerify``): Qwen3.5-4B shape, fp32 state, bf16
activations, fp32 ring u, L = 16 (on CPU the tiny shape). Per config:

1. **Correctness first** (``bench_verify.refcheck``, on identical inputs for every config): one
   verify step on a fresh 16-slot pool (empty, middle and longest histories, the cycle's flush,
   forced flushes, a padding row) against ``gdn_replay_verify_ref``: out, flushed checkpoints and
   the T window records of every ring by relative error, every other byte untouched. Then whether
   the flushed checkpoints are **bit-identical to the default config's**. Only the default
   (``block_v=32, num_warps=1``, the tile and warp count of SGLang's packed decode) carries the
   claim that a flush folds to the packed decode's bits; another config may reduce in another
   order and lose that claim, which the ``fold bitwise vs default`` column shows. A config that
   fails the check is not timed.
2. **Timing** (CUDA only): one mixed launch per batch, rows spread over the steady verify cycle of
   ``a = ceil(T/2)`` accepted tokens as in ``bench_verify`` (at T = 4, L = 16: 1 row in 7
   flushes), identical inputs, slots and cursors for every config; ``bench_decode``'s timer: CUDA
   graph replay, cold L2 (read flush), CUDA events, median of ``--repeats`` x ``--passes``.

Outputs (written after every config, so a killed run keeps what it measured): ``results.json``
and ``results.md`` under ``--out``; the table is printed last. ``x vs default`` = the default's
median / this config's (> 1: faster). With ``--device cpu`` only the correctness part runs, under
the Triton interpreter, for ``CPU_CONFIGS``.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks import bench_decode as bd
from benchmarks import bench_verify as bv
from benchmarks import bytes_model as bm
from benchmarks.shapes import GDN_SHAPES
from benchmarks.verify_cases import GDNVerify, VCase

BLOCK_V = (32, 64, 128)
BLOCK_R = (4, 8, 16)
NUM_WARPS = (1, 2, 4, 8)
MAX_WARPS = 32  # 1024 threads per CUDA block
#: the launcher's defaults: the config whose flush fold is the packed decode's, bit for bit
DEFAULT = "32x16x1"
#: the CPU run: the default, a V split into two tiles (tiny V = 32), more warps and smaller chunks
CPU_CONFIGS = ("32x16x1", "16x4x2", "32x8x4")
CHECK_SEED = 1234  # every config's correctness check draws the same inputs from this seed


@dataclass(frozen=True)
class LaunchConfig:
    """One launch configuration of ``gdn_replay_verify_fwd``."""

    block_v: int
    block_r: int
    num_warps: int

    @property
    def name(self) -> str:
        return f"{self.block_v}x{self.block_r}x{self.num_warps}"

    @classmethod
    def parse(cls, text: str) -> LaunchConfig:
        """``"BVxBRxW"`` (e.g. ``"64x8x4"``) to a config; ``ValueError`` if malformed."""
        parts = text.strip().lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise ValueError(f"launch config: expected BVxBRxW (e.g. 64x8x4), got {text!r}")
        return cls(*(int(p) for p in parts))


def _pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def validate_config(c: LaunchConfig, V: int, R: int) -> None:
    """Raise ``ValueError`` unless ``c`` is a distinct, launchable config at value dim ``V`` and
    ring rows ``R``.

    Triton block sizes and warp counts are powers of two, at most 32 warps (1024 threads). The
    launcher clamps ``block_v`` to ``next_pow2(V)`` and ``block_r`` to ``next_pow2(R)``, so a
    larger value is the same launch as the clamped one: rejected as a duplicate.
    """
    for name, val in (("block_v", c.block_v), ("block_r", c.block_r),
                      ("num_warps", c.num_warps)):
        if not _pow2(val):
            raise ValueError(f"{c.name}: {name} must be a power of two, got {val}")
    if c.num_warps > MAX_WARPS:
        raise ValueError(f"{c.name}: num_warps must be <= {MAX_WARPS}, got {c.num_warps}")
    if c.block_v > _next_pow2(V):
        raise ValueError(f"{c.name}: block_v {c.block_v} > next_pow2(V) = {_next_pow2(V)} "
                         "(the launcher clamps it: a duplicate launch)")
    if c.block_r > _next_pow2(R):
        raise ValueError(f"{c.name}: block_r {c.block_r} > next_pow2(R) = {_next_pow2(R)} "
                         "(the launcher clamps it: a duplicate launch)")


def grid(V: int, R: int) -> tuple[list[LaunchConfig], dict[str, str]]:
    """The sweep grid at ``V``, ``R``: (valid configs, default first; invalid name -> reason)."""
    order = sorted(((bv_, br, w) for bv_ in BLOCK_V for br in BLOCK_R for w in NUM_WARPS),
                   key=lambda t: (-t[2], t[0], -t[1]))
    return select([LaunchConfig(*t) for t in order], V, R)


def select(configs: Sequence[LaunchConfig], V: int,
           R: int) -> tuple[list[LaunchConfig], dict[str, str]]:
    """The default first, then ``configs`` (duplicates dropped); invalid ones set aside."""
    valid, invalid, seen = [], {}, set()
    for c in [LaunchConfig.parse(DEFAULT), *configs]:
        if c in seen:
            continue
        seen.add(c)
        try:
            validate_config(c, V, R)
            valid.append(c)
        except ValueError as e:
            invalid[c.name] = str(e)
    return valid, invalid


# ==================================================================================================
# Arguments
# ==================================================================================================


def _config_list(text: str) -> list[LaunchConfig]:
    try:
        return [LaunchConfig.parse(t) for t in text.split(",") if t.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.sweep_gdn_verify",
        description="Sweep launch configs of the GDN ReplaySSM verify kernel (check, then time).")
    p.add_argument("--T", type=int, default=4, help="tokens verified per row (default 4)")
    p.add_argument("--batch", type=bd._int_list, default=[64, 256],
                   help="batches timed (default 64,256; ignored on cpu)")
    p.add_argument("--configs", type=_config_list, default=None,
                   help="BVxBRxW list, e.g. 32x16x1,64x8x4 (default: the grid on cuda, "
                        f"{','.join(CPU_CONFIGS)} on cpu); the default {DEFAULT} is always run")
    p.add_argument("--window", type=int, default=16, help="ring window L (default 16)")
    p.add_argument("--gdn-shape", choices=tuple(GDN_SHAPES), default=None,
                   help="default qwen3.5-4b (cpu: gdn-tiny)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None)
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--l2-flush", choices=("read", "write", "none"), default="read")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds: no config or batch starts after this; the rest are listed as "
                        "skipped")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--commit", default=None)
    p.add_argument("--out", type=Path, required=True)
    return p


@dataclass
class Sweep:
    cfg: bv.Config  # bench_verify's config: shapes, dtypes, L, R, slots, timer settings
    T: int
    configs: list[LaunchConfig]
    invalid: dict[str, str]
    time_budget: float | None


def parse_args(argv: Sequence[str] | None = None) -> Sweep:
    parser = build_parser()
    a = parser.parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    cpu = (a.device or ("cuda" if bd._has_cuda() else "cpu")) == "cpu"
    inner = ["--family", "gdn", "--T", str(a.T), "--window", str(a.window),
             "--batch", "1" if cpu else ",".join(map(str, a.batch)),
             "--repeats", str(a.repeats), "--warmup", str(a.warmup), "--passes", str(a.passes),
             "--l2-flush", a.l2_flush, "--seed", str(a.seed), "--out", str(a.out)]
    for flag, val in (("--device", a.device), ("--gdn-shape", a.gdn_shape),
                      ("--commit", a.commit)):
        if val is not None:
            inner += [flag, val]
    cfg = bv.parse_args(inner)  # its checks (T <= 16, window >= 1, ...) exit with its message
    cfg.argv = argv
    asked = a.configs if a.configs is not None else (
        [LaunchConfig.parse(t) for t in CPU_CONFIGS] if cpu else None)
    V = cfg.gdn_shape.V
    configs, invalid = grid(V, cfg.R) if asked is None else select(asked, V, cfg.R)
    if a.configs is not None and invalid:
        parser.error("--configs: " + "; ".join(invalid.values()))
    return Sweep(cfg, a.T, configs, invalid, a.time_budget)


# ==================================================================================================
# Correctness and timing of one config
# ==================================================================================================


def launcher(c: LaunchConfig) -> Callable[..., None]:
    """``gdn_replay_verify_fwd`` at config ``c`` (imported here: after ``TRITON_INTERPRET``)."""
    from replayssm_kernels.gdn_verify.kernel import gdn_replay_verify_fwd

    return functools.partial(gdn_replay_verify_fwd, block_v=c.block_v, block_r=c.block_r,
                             num_warps=c.num_warps)


def check(fam: GDNVerify, fn: Callable[..., None], T: int, default: dict | None) -> dict:
    """``bench_verify.refcheck`` of ``fn`` on the inputs of ``CHECK_SEED``, plus bitwise equality
    with ``default`` (the default config's ``"tensors"``; None: not compared). The tensors this
    launch wrote are returned under ``"tensors"``."""
    from replayssm_kernels.gdn_verify.kernel import gdn_replay_verify_fwd
    from replayssm_kernels.gdn_verify.reference import gdn_replay_verify_ref

    sig = inspect.signature(gdn_replay_verify_fwd)
    kept: dict = {}

    def keeping(*args, **kw):
        fn(*args, **kw)
        kept.update(sig.bind(*args, **kw).arguments)

    fam.rng = bd._Rand(fam.cfg.device, CHECK_SEED)  # refcheck draws its pool from fam.rng
    res = bv.refcheck(fam, keeping, gdn_replay_verify_ref, T)
    res["tensors"] = {k: kept[k] for k in ("out", "state") + fam.ring_names}
    if default is not None:
        flushed = sorted({s for s, _, f in res["plan"] if s >= 0 and f})
        mine = res["tensors"]
        res["fold_bitwise_vs_default"] = _same_bits(mine["state"][flushed],
                                                    default["state"][flushed])
        res["bitwise_vs_default"] = {k: _same_bits(mine[k], default[k]) for k in mine}
    return res


def _same_bits(x, y) -> bool:
    """Bitwise equality (NaN padding rows included, which ``torch.equal`` calls unequal)."""
    import torch

    return x.shape == y.shape and torch.equal(x.contiguous().view(torch.uint8),
                                              y.contiguous().view(torch.uint8))


def time_mixed(case: VCase, sw: Sweep, timer: bd.Timer) -> dict:
    """Median of the mixed launch (CUDA graph, cold L2) after one synchronised eager launch whose
    NaN-poisoned output must come back finite."""
    import torch

    case.set_mixed()
    case.out().fill_(float("nan"))
    case.fn()
    torch.cuda.synchronize()
    if not torch.isfinite(case.out().float()).all():
        raise RuntimeError("non-finite output on the mixed launch")
    graph = bd.capture_graph(case.fn)
    passes = [timer.measure(graph.replay, sw.cfg.repeats, sw.cfg.warmup)
              for _ in range(sw.cfg.passes)]
    del graph
    meds = [bd._median(p) for p in passes]
    med = bd._median([v for p in passes for v in p])
    spread = (max(meds) - min(meds)) / med * 100 if len(meds) > 1 else math.nan
    return {"median_us": med, "spread_pct": spread}


# ==================================================================================================
# Results
# ==================================================================================================


COLS = ("config", "batch", "median us", "x vs default", "% copy BW", "± %", "out rel err",
        "fold bitwise vs default", "check")


def table_lines(results: list[dict], batches: list[int]) -> list[list[str]]:
    """One line per (batch, config), fastest first within a batch; configs without timings
    (cpu, not timed, skipped) once at the end."""
    f = bd._fmt
    lines = []

    def line(r: dict, batch: str, t: dict) -> list[str]:
        c = r.get("check", {})
        ok = "PASS" if c.get("ok") else ("FAIL" if c else "—")
        fold = {True: "yes", False: "no"}.get(c.get("fold_bitwise_vs_default"), "—")
        return [r["name"], batch, f(t.get("median_us", math.nan), ".1f"),
                f(t.get("x_vs_default", math.nan), ".2f"), f(t.get("pct_copy", math.nan), ".1f"),
                f(t.get("spread_pct", math.nan), ".1f"),
                f(c.get("errors", {}).get("out", math.nan), ".2e"), fold, ok]

    for b in batches:
        timed = [r for r in results if "median_us" in r["timing"].get(str(b), {})]
        timed.sort(key=lambda r: r["timing"][str(b)]["median_us"])
        lines += [line(r, str(b), r["timing"][str(b)]) for r in timed]
    lines += [line(r, "—", {}) for r in results
              if not any("median_us" in t for t in r["timing"].values())]
    return lines


def format_text(lines: list[list[str]]) -> str:
    rows = [list(COLS)] + lines
    w = [max(len(x[i]) for x in rows) for i in range(len(COLS))]
    fmt = "  ".join(f"{{:<{n}}}" if i == 0 else f"{{:>{n}}}" for i, n in enumerate(w))
    return "\n".join([fmt.format(*rows[0]), fmt.format(*["-" * n for n in w])]
                     + [fmt.format(*x) for x in rows[1:]])


def format_markdown(lines: list[list[str]], meta: dict) -> str:
    md = [f"# GDN verify launch-config sweep ({meta.get('device_name', '?')})", "",
          f"- commit `{meta.get('commit')}`, {meta.get('date')}",
          f"- command: `python -m benchmarks.sweep_gdn_verify {' '.join(meta.get('argv', []))}`",
          f"- shape {meta['shape']}, T = {meta['T']}, L = {meta['L']}, ring rows R = {meta['R']}, "
          f"state {meta['state_dtype']}, activations {meta['act_dtype']}, ring u "
          f"{meta['gdn_u_dtype']}; config = block_v x block_r x num_warps",
          f"- timing: one mixed launch (rows over the verify cycle of a = {meta['a']}, flush "
          f"share {meta['flush_share']}), CUDA-graph replay, L2 flush {meta['l2_flush']}, median "
          f"of {meta['repeats']} x {meta['passes']}; `x vs default` = {DEFAULT} / this (> 1: "
          "faster); `% copy BW` = byte model / median vs the measured copy bandwidth",
          "- check: `bench_verify.refcheck` vs `gdn_replay_verify_ref` (out, flushed state, "
          f"window records by relative error; other bytes untouched); `fold bitwise vs default`: "
          f"flushed checkpoints bit-identical to {DEFAULT}'s, the only config claimed "
          "bit-identical to SGLang's packed decode",
          "", "| " + " | ".join(COLS) + " |",
          "|" + "|".join("---" if i == 0 else "---:" for i in range(len(COLS))) + "|"]
    md += ["| " + " | ".join(x) + " |" for x in lines]
    return "\n".join(md) + "\n"


def write_outputs(sw: Sweep, meta: dict, results: list[dict], skipped: list[str], t0: float,
                  final: bool) -> str:
    """Write results.json and results.md; returns the text table."""
    meta.update(complete=final, wall_s=time.perf_counter() - t0, skipped=skipped)
    lines = table_lines(results, [] if sw.cfg.device == "cpu" else sw.cfg.batches)
    clean = [{k: v for k, v in r.items() if k != "check"}
             | {"check": {k: v for k, v in r.get("check", {}).items() if k != "tensors"}}
             for r in results]
    out = sw.cfg.out
    (out / "results.json").write_text(json.dumps(
        bd._json_safe({"meta": meta, "invalid": sw.invalid, "configs": clean}), indent=1,
        default=str, allow_nan=False))
    md = format_markdown(lines, meta)
    notes = [f"- {r['name']}: {r['status']}" for r in results if r.get("status")]
    notes += [f"- {n}: invalid ({why})" for n, why in sw.invalid.items()]
    if skipped:
        notes.append(f"- time budget: skipped {', '.join(skipped)}")
    if notes:
        md += "\nStatus:\n\n" + "\n".join(notes) + "\n"
    (out / "results.md").write_text(md)
    return format_text(lines)


# ==================================================================================================
# Driver
# ==================================================================================================


def main(argv: Sequence[str] | None = None) -> int:
    sw = parse_args(argv)
    cfg = sw.cfg
    cfg.out.mkdir(parents=True, exist_ok=True)
    cpu = cfg.device == "cpu"
    if cpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported
    import torch

    t0 = time.perf_counter()
    T, a = sw.T, cfg.accepted[sw.T]
    cycle = bm.verify_cycle(cfg.L, T, a)
    meta = bd.environment(cfg)
    meta.update(shape=cfg.gdn_shape.name, T=T, a=a, L=cfg.L, R=cfg.R, state_dtype=cfg.state_dtype,
                act_dtype=cfg.act_dtype, gdn_u_dtype=cfg.gdn_u_dtype, slots=cfg.slots,
                batches=[] if cpu else cfg.batches, repeats=cfg.repeats, warmup=cfg.warmup,
                passes=cfg.passes, time_budget=sw.time_budget, cycle=cycle,
                flush_share=f"1/{len(cycle)}", configs=[c.name for c in sw.configs])
    if cpu and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        from benchmarks import _cpu_shims

        meta["cpu_shims"] = _cpu_shims.apply(sglang=False)
    bd._log(f"sweep_gdn_verify: {meta.get('device_name')} | {cfg.gdn_shape.name} T{T} a{a} "
            f"L{cfg.L} R{cfg.R} | {len(sw.configs)} configs | batches {meta['batches']}")
    torch.manual_seed(cfg.seed)
    copy = bd.measure_copy_bandwidth(cfg)
    meta["copy_bw"] = copy["bytes_per_s"]
    timer = None if cpu else bd.Timer(cfg)
    if timer is not None:
        meta["l2_flush"], meta["l2_flush_bytes"] = timer.mode, timer.flush_bytes
    else:
        meta["l2_flush"] = "none (cpu: not timed)"
    model = bv.byte_models(cfg, "gdn", T)["ours"]
    current: dict = {}  # the config the timed cases launch (read when a graph is captured)
    fam = GDNVerify(cfg, {"gdn": lambda *x, **kw: current["fn"](*x, **kw)}, {})
    cases = {} if cpu else {b: fam.cases(b, T, cycle, a)[0] for b in cfg.batches}
    results: list[dict] = []
    skipped: list[str] = []
    default_check = None
    default_us: dict[int, float] = {}
    for c in sw.configs:
        if sw.time_budget is not None and time.perf_counter() - t0 > sw.time_budget:
            skipped.append(c.name)
            continue
        r = {"name": c.name, "block_v": c.block_v, "block_r": c.block_r,
             "num_warps": c.num_warps, "timing": {}}
        results.append(r)
        fn = current["fn"] = launcher(c)
        t1 = time.perf_counter()
        try:
            r["check"] = check(fam, fn, T, default_check)
        except Exception as e:  # noqa: BLE001 (a crash is a failed check; the sweep goes on)
            traceback.print_exc()
            r["check"] = {"ok": False, "problems": [f"{type(e).__name__}: {e}"]}
        rc = r["check"]
        if c.name == DEFAULT:  # the first config run: the others are compared with it
            default_check = rc.get("tensors")
            rc["fold_bitwise_vs_default"] = True if default_check is not None else None
        bd._log(f"[check] {c.name}: {'PASS' if rc['ok'] else 'FAIL'} out rel "
                f"{bd._fmt(rc.get('errors', {}).get('out', math.nan), '.2e')}, fold bitwise vs "
                f"default: {rc.get('fold_bitwise_vs_default', '—')}"
                + ("" if rc["ok"] else f" {rc['problems']}")
                + f" ({time.perf_counter() - t1:.1f} s)")
        if not rc["ok"]:
            r["status"] = "not timed: check failed"
        for batch, case in cases.items():
            if not rc["ok"]:
                break
            if sw.time_budget is not None and time.perf_counter() - t0 > sw.time_budget:
                skipped.append(f"{c.name} b{batch}")
                continue
            try:
                t = r["timing"][str(batch)] = time_mixed(case, sw, timer)
            except Exception as e:  # noqa: BLE001 (report it; the next config may still run)
                traceback.print_exc()
                r["status"] = f"b{batch} aborted: {type(e).__name__}: {e}"
                torch.cuda.synchronize()  # a device fault raises again: the run ends, earlier
                continue  # configs' results are on disk already
            if c.name == DEFAULT:
                default_us[batch] = t["median_us"]
            nbytes = model.batch_bytes(case.mixed_rows)
            t["bytes"] = nbytes
            t["pct_copy"] = 100 * nbytes / (t["median_us"] * 1e-6) / copy["bytes_per_s"]
            t["x_vs_default"] = default_us.get(batch, math.nan) / t["median_us"]
            bd._log(f"[time] {c.name} b{batch}: {t['median_us']:.1f} us, x "
                    f"{bd._fmt(t['x_vs_default'], '.2f')} vs default")
        write_outputs(sw, meta, results, skipped, t0, final=False)
    table = write_outputs(sw, meta, results, skipped, t0, final=True)
    bd._log("")
    for n, why in sw.invalid.items():
        bd._log(f"invalid {n}: {why}")
    if skipped:
        bd._log(f"time budget: skipped {', '.join(skipped)}")
    bd._log(f"wrote {cfg.out}/results.json, results.md; {meta['wall_s']:.0f} s")
    bd._log(table)
    return 0 if all(r["check"]["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
