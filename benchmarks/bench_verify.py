"""Speculative-verify benchmark: our ReplaySSM verify kernels against SGLang 0.5.17's (one process).

Run from the repository root (see benchmarks/README.md)::

    python -m benchmarks.bench_verify --family all --T 2,4,8 --batch 1,8,32,64,128,256,512 \\
        --window 16 --refcheck --time-budget 200 --out OUT_DIR

Per family, draft length ``T`` and batch it times, cold L2, CUDA-graph replay, CUDA events,
medians (``bench_decode``'s ``Timer``): our verify kernel at every step of the steady verify cycle
for the accepted count ``a`` (``--accepted``; history ``a, 2a, ...``, the last step flushing) and
one mixed launch; SGLang's snapshot verify and (Mamba-2) its commit scatter; (GDN) SGLang's
built-in circular-ring verify at the same steps and its fold-every-commit step; and one
conventional decode step of the family, so that every row also says how many decode steps its
verify costs. Outputs: a table (stdout and ``results.md``), ``results.json``, ``verify_bench.png``.
See ``verify_cases.py`` for exactly how each kernel is called.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks import bench_decode as bd
from benchmarks import bytes_model as bm
from benchmarks import bytes_read_copy as brc
from benchmarks.shapes import DTYPE_BYTES, GDN_SHAPES, MAMBA2_SHAPES, GDNShape, Mamba2Shape
from benchmarks.verify_cases import GDNVerify, Mamba2Verify, VCase

LABELS = {
    "ours": "replayssm verify (ours)",
    "snapshot": "sglang snapshot verify",
    "commit": "sglang snapshot commit (scatter)",
    "builtin": "sglang built-in spec verify",
    "fold": "sglang built-in fold step",
    "decode": "sglang decode step (T=1)",
}
ORDER = {k: i for i, k in enumerate(LABELS)}

#: refcheck gates (relative error vs our torch reference): catch a broken kernel, not rounding.
REFCHECK_TOL = {"cuda": {"out": 2e-2, "state": 2e-3, "state16": 1e-2, "ring": 1e-2},
                "cpu": {"out": 3e-2, "state": 2e-2, "state16": 3e-2, "ring": 2e-2}}


# ==================================================================================================
# Arguments
# ==================================================================================================


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_verify",
        description="Time ReplaySSM verify kernels against SGLang 0.5.17's (cold L2).")
    p.add_argument("--family", choices=("mamba2", "gdn", "all"), default="all")
    p.add_argument("--T", type=bd._int_list, default=[2, 4, 8],
                   help="draft lengths: tokens verified per row (default 2,4,8)")
    p.add_argument("--batch", type=bd._int_list, default=list(bd.DEFAULT_BATCHES))
    p.add_argument("--window", type=int, default=16, help="ring window L (default 16)")
    p.add_argument("--accepted", type=bd._int_list, default=None,
                   help="accepted count a per T (incl. the bonus token), one per --T "
                        "(default ceil(T/2))")
    p.add_argument("--state-dtype", choices=tuple(DTYPE_BYTES), default="fp32")
    p.add_argument("--act-dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--gdn-u-dtype", choices=("act", "fp32"), default="fp32")
    p.add_argument("--read-dtype", choices=("same", *brc.READ_COPY_BYTES), default="same",
                   help="split precision (both families): our verify reads a copy of the "
                        "checkpoint in this dtype (Mamba-2: non-flush rows; GDN: every row's "
                        "window), flush rows refresh it (default same: no copy); SGLang's "
                        "kernels read the checkpoint")
    p.add_argument("--mamba2-shape", choices=tuple(MAMBA2_SHAPES), default=None)
    p.add_argument("--gdn-shape", choices=tuple(GDN_SHAPES), default=None)
    p.add_argument("--slots", type=int, default=None,
                   help="pool slots per family (default max(2 × max batch, 64)); slot 0 unused")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None)
    p.add_argument("--impl", choices=("kernel", "ref"), default="kernel")
    p.add_argument("--repeats", type=int, default=None, help="default 100 on cuda, 2 on cpu")
    p.add_argument("--warmup", type=int, default=None, help="default 10 on cuda, 1 on cpu")
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--l2-flush", choices=("read", "write", "none"), default="read")
    p.add_argument("--no-graph", action="store_true")
    p.add_argument("--refcheck", action="store_true",
                   help="check our kernels against our torch references (and compare with "
                        "SGLang's snapshot verify) before timing")
    p.add_argument("--skip-peers", action="store_true", help="time our kernels only")
    p.add_argument("--time-budget", type=float, default=None,
                   help="seconds: no new (family, T, batch) point starts after this; the points "
                        "left are listed as skipped")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mamba2-verify-p-split", type=int, default=None,
                   help="force the Mamba-2 verify kernel's P-split (1: the unsplit launch, for "
                        "an A/B against the default small-batch rule; default: the rule)")
    p.add_argument("--mamba2-verify-impl", choices=("dot", "fma"), default="fma",
                   help="Mamba-2 verify implementation: fma (fp32 FMA reductions, "
                        "kernels/mamba2_verify/fma.py, the default) or dot (tensor cores), for "
                        "an A/B")
    p.add_argument("--mamba2-verify-launch", default=None, metavar="FIELD=INT,...",
                   help="override fields of the Mamba-2 verify launch configuration (LaunchConfig "
                        "of kernels/mamba2_verify/kernel.py, e.g. num_warps=4,maxnreg=128; "
                        "maxnreg=0: no cap), for a launch sweep; default: launch_config's")
    p.add_argument("--gdn-verify-launch", default=None, metavar="KEY=INT,...",
                   help="override the GDN verify launches (keywords of "
                        "gdn_replay_verify_fwd: the window's block_v, block_k, num_warps, "
                        "num_stages, maxnreg; the fold's tree-form tile fold_block_v, fold_rows and "
                        "its tiles per program fold_tiles (a program grid) or its "
                        "work-list programs fold_programs; "
                        "e.g. block_v=64,num_stages=3 or fold_block_v=16,fold_rows=8), for a "
                        "launch sweep; default: the kernel's")
    p.add_argument("--flush-rule", choices=("late", "early"), default="late",
                   help="the verify cycle's flush rule: late (default; the rule the server runs, "
                        "verify_cursor_step(late_flush=True): a row flushes when len + T > R0 = "
                        "max(L, T) + T, so histories reach R0 - T and a flush folds up to R0 "
                        "records; GDN on its R0-row ring, the window wrapping over the folded "
                        "history, Mamba-2 on a ring T rows longer) or early (len + T > L, on "
                        "R0-row rings: the rule of the tables before the thirty-seventh session)")
    p.add_argument("--commit", default=None)
    p.add_argument("--out", type=Path, required=True)
    return p


@dataclass
class Config:
    families: list[str]
    Ts: list[int]
    accepted: dict[int, int]
    batches: list[int]
    L: int
    R: int  # ring rows the timed pools hold: the largest ring_rows(max T, family)
    builtin_ring: int
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
    time_budget: float | None
    seed: int
    commit: str
    out: Path
    mamba2_verify_p_split: int | None = None
    mamba2_verify_impl: str = "fma"
    mamba2_verify_launch: dict[str, int | None] = field(default_factory=dict)
    gdn_verify_launch: dict[str, int] = field(default_factory=dict)
    read_dtype: str = "same"
    late_flush: bool = True
    dry_run: bool = False  # bench_decode.environment() reads it
    argv: list[str] = field(default_factory=list)

    def ring_rows(self, T: int, family: str) -> int:
        """Ring rows a server with ``T`` speculative tokens allocates for ``family``
        (``ring_rows``): each T is timed on the first ``ring_rows(T, family)`` rows of the pools,
        so a short window is not timed with a longer window's history block."""
        return ring_rows(self.L, T, family, self.late_flush)

    def flush_limit(self, T: int) -> int:
        """A row flushes when ``len + T`` passes this: ``L`` (the early rule), or
        ``max(L, T) + T`` with ``--flush-rule late`` (``verify_cursor_step(late_flush=True)``)."""
        from replayssm_kernels import flush_limit

        return flush_limit(self.L, T, self.late_flush)


def ring_rows(L: int, T: int, family: str, late_flush: bool) -> int:
    """Ring rows for verify windows of ``T`` tokens: under the late rule the served sizes
    (``sglang_replayssm.sizing.ring_rows``: ``min_ring_size(L, T)``, Mamba-2 ``T`` more); under
    the early rule ``min_ring_size(L, T)`` for both families."""
    from replayssm_kernels import min_ring_size
    from sglang_replayssm.sizing import ring_rows as served_rows

    return served_rows(family, L, T) if late_flush else min_ring_size(L, T)


def parse_launch_overrides(text: str | None,
                           parser: argparse.ArgumentParser) -> dict[str, int | None]:
    """``--mamba2-verify-launch`` as ``{field: value}`` (``maxnreg=0`` → ``None``, no cap); unknown
    fields or non-integer values end the parse with the fields that exist."""
    if not text:
        return {}
    from replayssm_kernels.mamba2_verify.kernel import LaunchConfig

    fields = [f for f in LaunchConfig._fields if f not in ("impl", "act_tf32_exact")]
    out = bd.int_fields(text, fields, "--mamba2-verify-launch", parser)
    return {k: None if k == "maxnreg" and v == 0 else v for k, v in out.items()}


#: ``gdn_replay_verify_fwd``'s launch keywords that ``--gdn-verify-launch`` may set (window launch,
#: then the fold launch's tree-form tile, its tiles per program (a program grid) and its work-list
#: programs).
GDN_LAUNCH_FIELDS = ("block_v", "block_k", "num_warps", "num_stages", "maxnreg", "fold_block_v",
                     "fold_rows", "fold_tiles", "fold_programs")


def parse_gdn_launch(text: str | None, parser: argparse.ArgumentParser) -> dict[str, int]:
    """``--gdn-verify-launch`` as ``{keyword: value}`` for ``gdn_replay_verify_fwd``; unknown
    keywords or non-positive / non-integer values end the parse with the keywords that exist."""
    out = bd.int_fields(text, GDN_LAUNCH_FIELDS, "--gdn-verify-launch", parser) if text else {}
    if any(v < 1 for v in out.values()):
        parser.error(f"--gdn-verify-launch: expected positive values, got {text!r}")
    return out


def parse_args(argv: Sequence[str] | None = None) -> Config:
    parser = build_parser()
    a = parser.parse_args(argv)
    device = a.device or ("cuda" if bd._has_cuda() else "cpu")
    if device == "cuda" and not bd._has_cuda():
        parser.error("--device cuda: no CUDA device visible (use --device cpu)")
    cpu = device == "cpu"
    if cpu:  # before this parse's first import of a kernel module (the kernels are defined at it)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if a.window < 1:
        parser.error(f"--window: expected >= 1, got {a.window}")
    if any(t > 16 for t in a.T):
        parser.error(f"--T: our verify kernels take T <= 16, got {a.T}")
    acc = a.accepted or [(t + 1) // 2 for t in a.T]
    if len(acc) != len(a.T) or any(not 1 <= x <= t for x, t in zip(acc, a.T)):
        parser.error(f"--accepted: expected one value 1 <= a <= T per --T {a.T}, got {acc}")
    tmax = max(a.T)
    max_b = max(a.batch)
    slots = a.slots if a.slots is not None else max(2 * max_b, 8 if cpu else 64)
    if slots < max_b + 1:
        parser.error(f"--slots: expected >= max batch + 1 = {max_b + 1}, got {slots}")
    if a.read_dtype == a.state_dtype:
        parser.error(f"--read-dtype {a.read_dtype}: the read copy must differ from --state-dtype "
                     f"{a.state_dtype} (pass --read-dtype same to read the checkpoint)")
    if a.passes < 1 or (a.repeats is not None and a.repeats < 1):
        parser.error("--passes and --repeats must be >= 1")
    late = a.flush_rule == "late"
    launch = parse_launch_overrides(a.mamba2_verify_launch, parser)
    gdn_launch = parse_gdn_launch(a.gdn_verify_launch, parser)
    families = ["mamba2", "gdn"] if a.family == "all" else [a.family]
    return Config(
        families=families,
        Ts=list(a.T), accepted=dict(zip(a.T, acc)), batches=list(a.batch), L=a.window,
        R=max(ring_rows(a.window, tmax, f, late) for f in families),  # every T's ring fits
        # the built-in's ring holds the longest history plus a window: L + T, or L + 2T under
        # the late rule (a flush row's history reaches R = L + T)
        builtin_ring=1 << (a.window + (2 if late else 1) * tmax - 1).bit_length(),
        state_dtype=a.state_dtype, act_dtype=a.act_dtype, gdn_u_dtype=a.gdn_u_dtype,
        mamba2_shape=MAMBA2_SHAPES[a.mamba2_shape or ("mamba2-tiny" if cpu else "nano-4b")],
        gdn_shape=GDN_SHAPES[a.gdn_shape or ("gdn-tiny" if cpu else "qwen3.5-4b")],
        slots=slots, device=device, impl=a.impl,
        repeats=a.repeats if a.repeats is not None else (2 if cpu else 100),
        warmup=a.warmup if a.warmup is not None else (1 if cpu else 10),
        passes=a.passes, l2_flush=a.l2_flush, graph=(not a.no_graph) and not cpu,
        refcheck=a.refcheck, skip_peers=a.skip_peers, time_budget=a.time_budget, seed=a.seed,
        commit=a.commit or bd._git_commit(), out=a.out,
        mamba2_verify_p_split=a.mamba2_verify_p_split,
        mamba2_verify_impl=a.mamba2_verify_impl,
        mamba2_verify_launch=launch,
        gdn_verify_launch=gdn_launch,
        read_dtype=a.read_dtype,
        late_flush=late,
        argv=list(sys.argv[1:] if argv is None else argv),
    )


# ==================================================================================================
# Kernels (ours and SGLang's) and byte models
# ==================================================================================================


def load_ours(cfg: Config) -> tuple[dict, dict, dict]:
    """(kernels, references, errors) per family."""
    kernels, refs, errors = {}, {}, {}
    try:
        m = importlib.import_module("replayssm_kernels")
    except Exception as e:  # noqa: BLE001 (report; peers still run)
        return {}, {}, {f: f"import failed: {type(e).__name__}: {e}" for f in ("mamba2", "gdn")}
    for fam in ("mamba2", "gdn"):
        k = getattr(m, f"{fam}_replay_verify", None)
        r = getattr(m, f"{fam}_replay_verify_ref", None)
        kernels[fam], refs[fam] = (r if cfg.impl == "ref" else k), r
        if kernels[fam] is None:
            errors[fam] = f"replayssm_kernels has no {fam}_replay_verify"
    return kernels, refs, errors


PEERS = {
    "ssu": ("sglang.kernels.ops.mamba.triton_ops.mamba_ssm", "selective_state_update"),
    "scatter": ("sglang.kernels.ops.mamba.mamba_state_scatter_triton",
                "fused_mamba_state_scatter_with_mask"),
    "sigmoid": ("sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent",
                "fused_sigmoid_gating_delta_rule_update"),
    "builtin": ("sglang.kernels.ops.attention.fla.gdn_replayssm_spec_decode",
                "gdn_replayssm_spec_decode"),
    "fold": ("sglang.kernels.ops.attention.fla.gdn_replayssm_spec_fold",
             "commit_gdn_replayssm_fold_all_layers"),
    "packed": ("sglang.kernels.ops.attention.fla.fused_recurrent",
               "fused_recurrent_gated_delta_rule_packed_decode"),
}


def load_peers(cfg: Config) -> tuple[dict, dict]:
    if cfg.skip_peers:
        return {}, {k: "--skip-peers" for k in PEERS}
    peers, errors = {}, {}
    for key, (mod, name) in PEERS.items():
        try:
            peers[key] = getattr(importlib.import_module(mod), name)
        except Exception as e:  # noqa: BLE001 (no SGLang here: time ours only, say why)
            peers[key], errors[key] = None, f"{type(e).__name__}: {e}"
    return peers, errors


def byte_models(cfg: Config, family: str, T: int) -> dict[str, bm.VerifyBytes]:
    s_b, a_b = DTYPE_BYTES[cfg.state_dtype], DTYPE_BYTES[cfg.act_dtype]
    if family == "mamba2":
        sh = cfg.mamba2_shape
        return {
            "ours": _with_read_copy(cfg, sh, bm.mamba2_replay_verify_bytes(sh, T, s_b, a_b)),
            "snapshot": bm.mamba2_snapshot_verify_bytes(sh, T, s_b, a_b),
            "commit": bm.mamba2_snapshot_commit_bytes(sh, T, s_b, a_b),
            "decode": bm.mamba2_snapshot_verify_bytes(sh, 1, s_b, a_b),  # 2S + I
        }
    sh = cfg.gdn_shape
    u_b = 4 if cfg.gdn_u_dtype == "fp32" else a_b
    return {
        "ours": _with_read_copy(cfg, sh, bm.gdn_replay_verify_bytes(sh, T, s_b, a_b, u_b)),
        "snapshot": bm.gdn_snapshot_verify_bytes(sh, T, s_b, a_b),
        "builtin": bm.gdn_builtin_spec_verify_bytes(sh, T, s_b, a_b),
        "fold": bm.gdn_builtin_fold_step_bytes(sh, T, cfg.accepted[T], s_b, a_b),
        "decode": bm.gdn_snapshot_verify_bytes(sh, 1, s_b, a_b),  # 2S + I
    }


def _with_read_copy(cfg: Config, shape: Mamba2Shape | GDNShape,
                    model: bm.VerifyBytes) -> bm.VerifyBytes:
    """Our verify's byte model, with ``--read-dtype``'s copy (``bytes_read_copy``) if any."""
    if cfg.read_dtype == "same":
        return model
    return brc.verify_read_copy_bytes(model, brc.read_copy_bytes(shape, cfg.read_dtype),
                                      cfg.read_dtype)


# ==================================================================================================
# Refcheck (ours vs our reference) and the comparison with SGLang's snapshot verify
# ==================================================================================================


def refcheck(fam, kernel, ref, T: int) -> dict:
    """One verify step of ``kernel`` against ``ref`` on identical copies of a fresh pool.

    Compares outputs of live rows, flushed checkpoints and the ``T`` window records of every live
    row (all ring fields); with ``--read-dtype``, flushed slots' refreshed copies (dequantised);
    every other byte must be unchanged (padding rows' NaN outputs, other checkpoints and copies,
    other ring rows).
    """
    import torch

    args, plan = fam.refcheck_args(T)
    # inputs are read-only: shared, views kept
    written = ("state", "out", "read_state", "read_scale") + fam.ring_names
    a_k = {k: v.clone() if k in written else v for k, v in args.items()}
    a_r = {k: v.clone() if k in written else v for k, v in args.items()}
    fam.call_ours(kernel, a_k, fam.pool_of(a_k))
    fam.call_ours(ref, a_r, fam.pool_of(a_r))
    if fam.cfg.device == "cuda":
        torch.cuda.synchronize()
    R = args[fam.ring_names[0]].shape[2]
    start = args["ring_start"].tolist()
    live = [i for i, (s, _, _) in enumerate(plan) if s >= 0]
    pad = [i for i, (s, _, _) in enumerate(plan) if s < 0]
    res: dict = {"T": T, "plan": plan, "errors": {}, "problems": []}
    if not torch.isfinite(a_k["out"][live].float()).all():
        res["problems"].append("out: non-finite values in live rows")
    if pad and not torch.isnan(a_k["out"][pad].float()).all():
        res["problems"].append("out: padding row written")
    res["errors"]["out"] = bd._rel_err(a_k["out"][live], a_r["out"][live])
    flushed = [plan[i][0] for i in live if plan[i][2]]
    kept = [s for s in range(args["state"].shape[0]) if s not in set(flushed)]
    if flushed:
        res["errors"]["state"] = bd._rel_err(a_k["state"][flushed], a_r["state"][flushed])
    if not torch.equal(a_k["state"][kept], args["state"][kept]):
        res["problems"].append("state: a slot that did not flush was written")
    window = [(plan[i][0], (start[i] + plan[i][1] + t) % R) for i in live for t in range(T)]
    for name in fam.ring_names:
        k_t, r_t, o_t = a_k[name], a_r[name], args[name]
        ks = torch.stack([k_t[s, :, r] for s, r in window])
        rs = torch.stack([r_t[s, :, r] for s, r in window])
        res["errors"][name] = bd._rel_err(ks, rs)
        same = k_t.clone()
        for s, r in window:
            same[s, :, r] = o_t[s, :, r]
        if not torch.equal(same, o_t):
            res["problems"].append(f"{name}: a ring row outside the window changed")
    tols = REFCHECK_TOL["cuda" if fam.cfg.device == "cuda" else "cpu"]
    st16 = args["state"].dtype != torch.float32
    lims = {"out": tols["out"], "state": tols["state16" if st16 else "state"]}
    if "read_state" in args:
        bd._check_read_copy(args, a_k, a_r, flushed, kept, res)
        lims["read_state"] = lims["state"] + bd.READ_COPY_ULP[fam.cfg.read_dtype]
    for name, err in res["errors"].items():
        lim = lims.get(name, tols["ring"])
        if not err <= lim:  # NaN fails too
            res["problems"].append(f"{name}: rel err {err:.3e} > {lim:.0e}")
    res["ok"] = not res["problems"]
    return res


def compare_snapshot(fam, kernel, T: int) -> dict | None:
    """Ours with empty rings and no flush against SGLang's snapshot verify from the same
    checkpoints: the window outputs of both (informational; not bitwise: ours is the closed form,
    and GDN rounds β as the packed decode does, SGLang's verify keeps it fp32)."""
    import torch

    key = "ssu" if fam.name == "mamba2" else "sigmoid"
    if fam.peers.get(key) is None:
        return None
    args, plan = fam.refcheck_args(T)
    args["ring_len"].zero_()
    args["flush"].zero_()
    live = [i for i, (s, _, _) in enumerate(plan) if s >= 0]
    idx = torch.tensor(live, device=args["slot_idx"].device)
    sh = fam.sh
    state_sg = args["state"].clone()
    if fam.name == "mamba2":
        sub = {k: args[k][idx] for k in ("x", "dt_full", "B", "C", "slot_idx")}
        sub["interm_idx"] = args["interm_idx"][: len(live)]
        out_sg = torch.full_like(args["out"][idx], float("nan"))
        buf = torch.empty(len(live), T, sh.H, sh.P, sh.N, dtype=fam.sdt, device=idx.device)
        fam.call_snapshot(state_sg, sub, out_sg, buf)
    else:
        # the padding row is last: the live rows' tokens are the first len(live)·T of the packed
        n = len(live) * T
        sub = {k: args[k][:n] for k in ("q_tok", "k_tok", "v_tok", "a_tok", "b_tok")}
        sub.update(q=args["q"][: len(live)], slot_idx=args["slot_idx"][: len(live)],
                   cu_seqlens=args["cu_seqlens"][: len(live) + 1],
                   interm_idx=args["interm_idx"][: len(live)])
        buf = torch.empty(len(live), T, sh.HV, sh.V, sh.K, dtype=fam.sdt, device=idx.device)
        out_sg = fam.call_snapshot(state_sg, sub, buf)
    fam.call_ours(kernel, args, fam.pool_of(args))
    if fam.cfg.device == "cuda":
        torch.cuda.synchronize()
    ours = args["out"][idx]
    return {"T": T, "out_rel": bd._rel_err(ours, out_sg),
            "out_bitwise": bool(torch.equal(ours, out_sg)),
            "sglang_state_untouched": bool(torch.equal(state_sg, args["state"]))}


# ==================================================================================================
# Timing and results
# ==================================================================================================


@dataclass
class Row:
    family: str
    kernel: str
    label: str
    T: int
    a: int
    batch: int
    mode: str  # "cycle" (mean over the verify cycle), "mixed" or "step"
    median_us: float
    bytes: float
    tbps: float = float("nan")
    pct_copy: float = float("nan")
    nonflush_us: float = float("nan")
    flush_us: float = float("nan")
    x_snapshot: float = float("nan")  # snapshot verify / this
    x_snapshot_step: float = float("nan")  # (snapshot verify + its commit) / this
    x_builtin: float = float("nan")  # built-in spec verify (same mode) / this
    x_fold: float = float("nan")  # built-in fold step / this
    per_decode: float = float("nan")  # this / one conventional decode step
    spread_pct: float = float("nan")
    phase_us: list[float] = field(default_factory=list)
    phases: list = field(default_factory=list)
    note: str = ""


def summarize(case: VCase, T: int, a: int, batch: int, model: bm.VerifyBytes,
              samples: dict) -> list[Row]:
    def med(series):
        passes = samples.get(series, [])
        allv = [v for p in passes for v in p]
        meds = [bd._median(p) for p in passes if p]
        spread = (max(meds) - min(meds)) / bd._median(allv) * 100 if len(meds) > 1 else math.nan
        return bd._median(allv), spread

    label = f"{LABELS[case.key]} T{T}"
    if not case.phased:
        m, s = med(("step",))
        return [Row(case.family, case.key, label, T, a, batch, "step", m,
                    batch * model.step().total, spread_pct=s, note=case.note)]
    ph, sp = zip(*(med(("phase", i)) for i in range(len(case.phases))))
    nonflush = [t for t, (_, f) in zip(ph, case.phases) if not f]
    flush = [t for t, (_, f) in zip(ph, case.phases) if f]
    cyc_bytes = model.cycle_mean(case.phases)
    spread = max((x for x in sp if not math.isnan(x)), default=math.nan)
    rows = [Row(case.family, case.key, f"{label} a{a}", T, a, batch, "cycle", sum(ph) / len(ph),
                batch * cyc_bytes, nonflush_us=bd._median(nonflush) if nonflush else math.nan,
                flush_us=bd._median(flush) if flush else math.nan, spread_pct=spread,
                phase_us=list(ph), phases=list(case.phases), note=case.note)]
    if ("mixed",) in samples:
        m, s = med(("mixed",))
        rows.append(Row(case.family, case.key, f"{label} a{a} mixed", T, a, batch, "mixed", m,
                        model.batch_bytes(case.mixed_rows), spread_pct=s, note=case.note))
    return rows


def finish_rows(rows: list[Row], copy_bw: float) -> None:
    for r in rows:
        if r.median_us > 0 and not math.isnan(r.median_us):
            r.tbps = r.bytes / (r.median_us * 1e-6) / 1e12
            if copy_bw and not math.isnan(copy_bw):
                r.pct_copy = 100 * r.tbps * 1e12 / copy_bw
    by = {(r.family, r.T, r.batch, r.kernel, r.mode): r for r in rows}
    for r in rows:
        k = (r.family, r.T, r.batch)
        snap, com = by.get((*k, "snapshot", "step")), by.get((*k, "commit", "step"))
        dec = by.get((*k, "decode", "step"))
        if r.kernel in ("ours", "builtin", "fold") and snap is not None:
            r.x_snapshot = snap.median_us / r.median_us
            if com is not None:
                r.x_snapshot_step = (snap.median_us + com.median_us) / r.median_us
        if r.kernel == "ours":
            bi = by.get((*k, "builtin", r.mode))
            if bi is not None:
                r.x_builtin = bi.median_us / r.median_us
            fold = by.get((*k, "fold", "step"))
            if fold is not None:
                r.x_fold = fold.median_us / r.median_us
        if dec is not None and r.kernel != "decode":
            r.per_decode = r.median_us / dec.median_us


COLS = ("family", "kernel", "batch", "median us", "MB moved", "TB/s", "% copy BW", "non-flush us",
        "flush us", "x vs snapshot", "x vs snapshot+commit", "x vs built-in", "x vs fold step",
        "/ decode step", "± %")


def table_lines(rows: list[Row]) -> list[list[str]]:
    f = bd._fmt
    return [[r.family, r.label, str(r.batch), f(r.median_us, ".1f"), f(r.bytes / 1e6, ".2f"),
             f(r.tbps, ".2f"), f(r.pct_copy, ".0f"), f(r.nonflush_us, ".1f"), f(r.flush_us, ".1f"),
             f(r.x_snapshot, ".2f"), f(r.x_snapshot_step, ".2f"), f(r.x_builtin, ".2f"),
             f(r.x_fold, ".2f"), f(r.per_decode, ".2f"), f(r.spread_pct, ".1f")] for r in rows]


def format_text(rows: list[Row]) -> str:
    lines = [list(COLS)] + table_lines(rows)
    w = [max(len(x[i]) for x in lines) for i in range(len(COLS))]
    fmt = "  ".join(f"{{:<{n}}}" if i < 2 else f"{{:>{n}}}" for i, n in enumerate(w))
    return "\n".join([fmt.format(*lines[0]), fmt.format(*["-" * n for n in w])]
                     + [fmt.format(*x) for x in lines[1:]])


def format_markdown(rows: list[Row], meta: dict) -> str:
    f = bd._fmt
    md = [f"# Verify kernel benchmark ({meta.get('device_name', '?')})", "",
          f"- commit `{meta.get('commit')}`, {meta.get('date')}",
          f"- command: `python -m benchmarks.bench_verify {' '.join(meta.get('argv', []))}`",
          f"- shapes: {meta.get('shapes')}; window L = {meta.get('L')}, our ring rows R per T "
          f"{meta.get('R')} (min_ring_size(L, T); Mamba-2's T more under the late rule), "
          f"built-in ring rows {meta.get('builtin_ring')}; state "
          f"{meta.get('state_dtype')}{bd._read_note(meta.get('read_dtype', 'same'))}, "
          f"activations {meta.get('act_dtype')}; {meta.get('slots')} "
          "slots per family (one layer), rows on random slots",
          f"- copy bandwidth {f(meta.get('copy_bw', math.nan) / 1e12, '.2f')} TB/s; L2 flush "
          f"{meta.get('l2_flush')} of {meta.get('l2_flush_bytes', 0) / 2**20:.0f} MiB before every "
          f"repetition; {'CUDA-graph replay' if meta.get('graph') else 'eager launches'}; median "
          f"of {meta.get('repeats')} x {meta.get('passes')} passes per series",
          "- `aA`: steady verify cycle for A accepted tokens per step (history A, 2A, ..., the "
          "last step flushing), `median us` = mean of the cycle steps' medians; `mixed`: rows "
          "spread over the cycle in one launch; `x vs ...` = that SGLang kernel / this row; "
          "`/ decode step` = this row / one conventional decode step (T=1) at the same batch",
          *bd.launch_override_lines(meta),
          "", "| " + " | ".join(COLS) + " |",
          "|" + "|".join("---" if i < 2 else "---:" for i in range(len(COLS))) + "|"]
    md += ["| " + " | ".join(x) + " |" for x in table_lines(rows)]
    return "\n".join(md) + "\n"


# ==================================================================================================
# Driver
# ==================================================================================================


def _sync(cfg: Config) -> None:
    if cfg.device == "cuda":
        import torch

        torch.cuda.synchronize()


def _first_call(case: VCase, cfg: Config) -> str | None:
    """Run every phase and the mixed set once (compiles), each synchronised, with a NaN-poisoned
    output; None if all is well. A device fault raises here, naming this kernel and series."""
    import torch

    series = [("phase", i) for i in range(len(case.phases))] if case.phased else [("step",)]
    if case.set_mixed is not None:
        series.append(("mixed",))
    for sid in series:
        _set_series(case, sid)
        if case.out is not None:
            try:
                case.out().fill_(float("nan"))
            except KeyError:  # an output the first call allocates
                pass
        _launch_synced(case, case.fn, sid, cfg, "first call")
        if case.out is not None and not torch.isfinite(case.out().float()).all():
            return f"non-finite output at {'/'.join(map(str, sid))}"
    return None


def _launch_synced(case: VCase, run, sid: tuple, cfg: Config, what: str) -> None:
    """One launch, then a device sync; a fault is re-raised naming the kernel and series."""
    try:
        run()
        _sync(cfg)
    except Exception as e:
        raise RuntimeError(f"{LABELS[case.key]}, series {'/'.join(map(str, sid))} ({what}): "
                           f"{type(e).__name__}: {e}") from e


def run_point(cfg: Config, fam, timer: bd.Timer, T: int, batch: int, dead: dict,
              status: dict) -> list[Row]:
    import torch

    a = cfg.accepted[T]
    cycle = bm.verify_cycle(cfg.flush_limit(T), T, a)
    models = byte_models(cfg, fam.name, T)
    cases = fam.cases(batch, T, cycle, a)
    ready = []
    for case in cases:
        if (case.key, T) in dead:
            continue
        if case.skip is not None:
            status[f"{fam.name}/{case.key}/T{T}/b{batch}"] = case.skip
            bd._log(f"  [{fam.name}] {LABELS[case.key]} T{T} b{batch}: {case.skip}")
            continue
        try:
            err = _first_call(case, cfg)
        except Exception as e:  # noqa: BLE001 (one broken kernel must not stop the others)
            err = f"{type(e).__name__}: {e}"
            if cfg.device == "cuda":
                traceback.print_exc()
        if err is not None:
            dead[(case.key, T)] = err
            status.setdefault(f"{fam.name}/{case.key}/T{T}", f"not timed: {err}")
            bd._log(f"  [{fam.name}] {LABELS[case.key]} T{T} b{batch}: NOT TIMED ({err})")
            continue
        run = case.fn
        if cfg.graph:
            try:
                case._graph = bd.capture_graph(case.fn)
                run = case._graph.replay
            except Exception as e:  # noqa: BLE001 (uncapturable: time eagerly, say so)
                case.note = f"eager (graph capture failed: {e})"
                torch.cuda.synchronize()
        ready.append((case, run))
    series = []
    for case, run in ready:
        if case.phased:
            series += [(case, run, ("phase", i)) for i in range(len(case.phases))]
            if case.set_mixed is not None:
                series.append((case, run, ("mixed",)))
        else:
            series.append((case, run, ("step",)))
    samples: dict = {id(c): {} for c, _ in ready}
    for case, run, sid in series:  # each series' first replay synchronised: a fault names it
        _set_series(case, sid)
        _launch_synced(case, run, sid, cfg, "first replay")
    for _ in range(cfg.passes):
        for case, run, sid in series:
            _set_series(case, sid)
            samples[id(case)].setdefault(sid, []).append(
                timer.measure(run, cfg.repeats, cfg.warmup))
    rows = []
    for case, _ in ready:
        rows += summarize(case, T, a, batch, models[case.key], samples[id(case)])
        case._graph = None
    return rows


def _set_series(case: VCase, sid: tuple) -> None:
    if sid[0] == "phase":
        case.set_phase(sid[1])
    elif sid[0] == "mixed":
        case.set_mixed()


def time_cursors(cfg: Config, timer: bd.Timer) -> dict:
    """``verify_cursor_step`` + ``verify_commit`` (once per forward for all layers), median us."""
    import torch

    try:
        m = importlib.import_module("replayssm_kernels")
        step, commit = m.verify_cursor_step, m.verify_commit
    except Exception as e:  # noqa: BLE001 (informational only)
        return {"error": f"{type(e).__name__}: {e}"}
    rng = bd._Rand(cfg.device, cfg.seed + 13)
    T = max(cfg.Ts)
    res: dict = {}
    for batch in cfg.batches:
        cursors = torch.stack([rng.ints((cfg.slots,), cfg.R, torch.int32),
                               rng.ints((cfg.slots,), cfg.L, torch.int32)], 1).contiguous()
        slot_idx = bd._row_slots(rng, cfg.slots, batch)
        acc = torch.ones(batch, dtype=torch.int32, device=cfg.device)
        o = (torch.empty(batch, dtype=torch.int32, device=cfg.device),
             torch.empty(batch, dtype=torch.int32, device=cfg.device),
             torch.empty(batch, dtype=torch.bool, device=cfg.device))

        def fn(c=cursors, s=slot_idx, o=o, acc=acc):
            c[:, 1].clamp_(max=cfg.L)  # keep len within the protocol's bound across repeats
            step(c, s, None, cfg.L, cfg.R, T, *o)
            commit(c, s, *o, acc, window=cfg.L, ring_size=cfg.R, num_tokens=T)

        try:
            fn()
            run = bd.capture_graph(fn).replay if cfg.graph else fn
            res[str(batch)] = bd._median(timer.measure(run, max(cfg.repeats // 2, 1), cfg.warmup))
        except Exception as e:  # noqa: BLE001 (informational only)
            res[str(batch)] = f"{type(e).__name__}: {e}"
    return res


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    cfg.out.mkdir(parents=True, exist_ok=True)
    import torch

    t0 = time.perf_counter()
    meta = bd.environment(cfg)
    meta.update(L=cfg.L, R={f: {str(T): cfg.ring_rows(T, f) for T in cfg.Ts} for f in cfg.families},
                builtin_ring=cfg.builtin_ring, Ts=cfg.Ts,
                accepted=cfg.accepted, state_dtype=cfg.state_dtype, act_dtype=cfg.act_dtype,
                gdn_u_dtype=cfg.gdn_u_dtype, read_dtype=cfg.read_dtype, slots=cfg.slots,
                batches=cfg.batches,
                families=cfg.families, impl=cfg.impl, repeats=cfg.repeats, warmup=cfg.warmup,
                passes=cfg.passes, graph=cfg.graph, seed=cfg.seed, time_budget=cfg.time_budget,
                shapes=", ".join(
                    f"{f} {(cfg.mamba2_shape if f == 'mamba2' else cfg.gdn_shape).name}"
                    for f in cfg.families),
                cycles={str(T): bm.verify_cycle(cfg.flush_limit(T), T, cfg.accepted[T])
                        for T in cfg.Ts}, late_flush=cfg.late_flush)
    bd._log(f"bench_verify: {meta.get('device_name')} | {cfg.families} | T {cfg.Ts} (a "
            f"{cfg.accepted}) | batches {cfg.batches} | L={cfg.L} R per T "
            f"{ {f: [cfg.ring_rows(T, f) for T in cfg.Ts] for f in cfg.families} }"
            f"{' (late flush: len + T > max(L, T) + T)' if cfg.late_flush else ' (early flush: len + T > L)'}"
            f" | {cfg.state_dtype}"
            f"{bd._read_note(cfg.read_dtype)}")
    torch.manual_seed(cfg.seed)
    if cfg.mamba2_verify_p_split is not None:  # A/B of the small-batch split: force one value
        import replayssm_kernels.mamba2_verify.kernel as mvk

        forced = cfg.mamba2_verify_p_split
        mvk.p_split_rule = lambda *_: forced
        meta["mamba2_verify_p_split"] = forced
        bd._log(f"Mamba-2 verify: P-split forced to {forced} (default: the small-batch rule)")
    meta["mamba2_verify_impl"] = cfg.mamba2_verify_impl
    if cfg.mamba2_verify_impl != "fma":  # A/B of the implementations: force one
        import replayssm_kernels.mamba2_verify.kernel as mvk

        mvk.launch_config = functools.partial(mvk.launch_config, impl=cfg.mamba2_verify_impl)
        bd._log(f"Mamba-2 verify: implementation {cfg.mamba2_verify_impl} (default: fma)")
    if cfg.mamba2_verify_launch:  # launch sweep: override fields of the chosen configuration
        import replayssm_kernels.mamba2_verify.kernel as mvk

        chosen, over = mvk.launch_config, dict(cfg.mamba2_verify_launch)
        mvk.launch_config = lambda *a, **k: chosen(*a, **k)._replace(**over)
        meta["mamba2_verify_launch"] = over
        bd._log(f"Mamba-2 verify: launch fields overridden: {over}")
    if cfg.gdn_verify_launch:  # launch sweep: keywords of gdn_replay_verify_fwd
        import replayssm_kernels.gdn_verify.kernel as gvk

        gvk.gdn_replay_verify_fwd = functools.partial(gvk.gdn_replay_verify_fwd,
                                                      **cfg.gdn_verify_launch)
        meta["gdn_verify_launch"] = dict(cfg.gdn_verify_launch)
        bd._log(f"GDN verify: launch keywords overridden: {cfg.gdn_verify_launch}")
    copy = bd.measure_copy_bandwidth(cfg)
    if cfg.device == "cuda":
        bd._log(f"copy bandwidth: {copy['bytes_per_s'] / 1e12:.3f} TB/s (read + write)")
    status: dict[str, str] = {}
    kernels, refs, kerr = load_ours(cfg)
    peers, perr = load_peers(cfg)
    if cfg.device == "cpu" and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        from benchmarks import _cpu_shims

        meta["cpu_shims"] = _cpu_shims.apply(sglang=not cfg.skip_peers)
    for k, e in {**{f"ours/{k}": v for k, v in kerr.items()},
                 **{f"peer/{k}": v for k, v in perr.items()}}.items():
        status[k] = f"unavailable: {e}"
        bd._log(f"  {k}: unavailable ({e})")
    timer = bd.Timer(cfg)
    meta["l2_flush"], meta["l2_flush_bytes"] = timer.mode, timer.flush_bytes
    checks: dict = {}
    rows: list[Row] = []
    skipped: list[str] = []
    fams, dead = {}, {}
    for fam_name in cfg.families:
        fam = fams[fam_name] = (Mamba2Verify if fam_name == "mamba2" else GDNVerify)(
            cfg, kernels, peers)
        dead[fam_name] = {}
        if cfg.refcheck and kernels.get(fam_name) is not None:
            for T in cfg.Ts:
                try:
                    rc = refcheck(fam, kernels[fam_name], refs[fam_name], T)
                except Exception as e:  # noqa: BLE001 (a crash is a failed check)
                    traceback.print_exc()
                    rc = {"ok": False, "problems": [f"{type(e).__name__}: {e}"]}
                try:
                    rc["vs_sglang_snapshot"] = compare_snapshot(fam, kernels[fam_name], T)
                except Exception as e:  # noqa: BLE001 (informational only)
                    rc["vs_sglang_snapshot"] = {"error": f"{type(e).__name__}: {e}"}
                checks[f"{fam_name}/T{T}"] = rc
                errs = ", ".join(f"{k} {v:.2e}" for k, v in rc.get("errors", {}).items())
                bd._log(f"refcheck {fam_name} T{T}: {'PASS' if rc['ok'] else 'FAIL'} ({errs})"
                        + ("" if rc["ok"] else f" {rc['problems']}")
                        + f"; vs SGLang snapshot verify: {rc['vs_sglang_snapshot']}")
                if not rc["ok"]:
                    dead[fam_name][("ours", T)] = "refcheck failed"
                    status[f"{fam_name}/ours/T{T}"] = "not timed: refcheck failed"
    # T outermost, in the order given: with --time-budget the first T values are the ones kept
    for T in cfg.Ts:
        for fam_name, fam in fams.items():
            for batch in cfg.batches:
                if cfg.time_budget is not None and time.perf_counter() - t0 > cfg.time_budget:
                    skipped.append(f"{fam_name} T{T} b{batch}")
                    continue
                t1 = time.perf_counter()
                try:
                    rows += run_point(cfg, fam, timer, T, batch, dead[fam_name], status)
                except Exception as e:  # noqa: BLE001 (a device fault: keep what was measured)
                    traceback.print_exc()
                    status[f"{fam_name}/T{T}/b{batch}"] = f"aborted: {type(e).__name__}: {e}"
                if cfg.device == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
                bd._log(f"  [{fam_name}] T{T} batch {batch}: {time.perf_counter() - t1:.1f} s")
                # after every point (a killed run keeps what it measured); the PNG per family
                write_outputs(cfg, meta, copy, checks, status, rows, skipped, t0, final=False,
                              plot=batch == cfg.batches[-1])
    if kernels:
        meta["verify_cursor_step_and_commit_us"] = time_cursors(cfg, timer)
    write_outputs(cfg, meta, copy, checks, status, rows, skipped, t0, final=True)
    return 0 if all(rc.get("ok", False) for rc in checks.values()) else 1


def decode_ratio_lines(rows: list[Row]) -> list[str]:
    """Per family and T, over the batches: each step-kind row's time in decode steps."""
    out = []
    keys = sorted({(r.family, r.T) for r in rows}, key=lambda k: (k[0], -k[1]))
    for fam, T in keys:
        for kernel, mode in (("ours", "cycle"), ("ours", "mixed"), ("snapshot", "step"),
                             ("builtin", "cycle"), ("fold", "step")):
            pts = [f"b{r.batch} {r.per_decode:.2f}" for r in sorted(rows, key=lambda r: r.batch)
                   if (r.family, r.T, r.kernel, r.mode) == (fam, T, kernel, mode)
                   and not math.isnan(r.per_decode)]
            if pts:
                out.append(f"{fam} T={T} {LABELS[kernel]}{' mixed' if mode == 'mixed' else ''}: "
                           + ", ".join(pts))
    return out


def write_outputs(cfg: Config, meta: dict, copy: dict, checks: dict, status: dict,
                  rows: list[Row], skipped: list[str], t0: float, final: bool,
                  plot: bool = True) -> None:
    rows = [dataclasses.replace(r) for r in rows]
    copy_bw = copy["bytes_per_s"]
    meta["copy_bw"], meta["complete"] = copy_bw, final
    meta["wall_s"] = time.perf_counter() - t0
    finish_rows(rows, copy_bw)
    rows.sort(key=lambda r: (cfg.families.index(r.family), cfg.Ts.index(r.T), r.batch,
                             ORDER[r.kernel], r.mode == "mixed"))
    title = (f"ReplaySSM verify, {meta.get('device_name')}, L={cfg.L}, T={cfg.Ts}, state "
             f"{cfg.state_dtype}{bd._read_note(cfg.read_dtype)}, commit {str(cfg.commit)[:12]}")
    if plot:
        meta["plot"] = bd.write_plot(rows, cfg.out / "verify_bench.png", title)
    if skipped:
        status["time_budget"] = f"skipped {len(skipped)} points: {', '.join(skipped)}"
    result = {"meta": meta, "copy_bandwidth": copy, "refcheck": checks, "status": status,
              "rows": [asdict(r) for r in rows]}
    (cfg.out / "results.json").write_text(
        json.dumps(bd._json_safe(result), indent=1, default=str, allow_nan=False))
    md = format_markdown(rows, meta)
    ratios = decode_ratio_lines(rows)
    if ratios:
        md += "\nVerifying T tokens, in standard decode steps (same batch):\n\n"
        md += "\n".join(f"- {x}" for x in ratios) + "\n"
    if checks:
        md += "\nRefcheck (ours vs our torch reference; ours vs SGLang's snapshot verify):\n\n"
        md += "\n".join(f"- {k}: {'PASS' if v.get('ok') else 'FAIL'} "
                        f"{ {n: f'{e:.2e}' for n, e in v.get('errors', {}).items()} }; "
                        f"vs snapshot {v.get('vs_sglang_snapshot')}" for k, v in checks.items())
        md += "\n"
    if status:
        md += "\nStatus:\n\n" + "\n".join(f"- {k}: {v}" for k, v in status.items()) + "\n"
    (cfg.out / "results.md").write_text(md)
    if not final:
        return
    bd._log("")
    for k, v in status.items():
        bd._log(f"status {k}: {v}")
    bd._log(f"plot: {meta['plot']}; wrote {cfg.out}/results.json, results.md, verify_bench.png; "
            f"{meta['wall_s']:.0f} s; copy bandwidth {bd._fmt(copy_bw / 1e12, '.3f')} TB/s")
    bd._log(format_text(rows))
    for x in ratios:
        bd._log(f"verify vs decode step: {x}")
    cs = meta.get("verify_cursor_step_and_commit_us")
    if isinstance(cs, dict):
        bd._log("verify_cursor_step + verify_commit (once per forward, all layers), median us: "
                + ", ".join(f"b{k} {bd._fmt(v, '.1f') if isinstance(v, float) else v}"
                            for k, v in cs.items()))


# ==================================================================================================
# Offline (no GPU): sm_90a registers / spills of the Mamba-2 verify launch, split and unsplit
# ==================================================================================================


def offline_sm90a(T: int = 4, p_splits: Sequence[int] = (1, 2, 3, 5), impl: str = "dot",
                  reads: Sequence[str | None] = (None, "bf16", "fp8"),
                  num_warps: int | None = None, maxnreg: int | None = None,
                  keep_ptx: bool = False, launch: dict | None = None) -> list[dict]:
    """Compile the Mamba-2 verify kernel of ``impl`` (``"dot"``:
    ``_mamba2_replay_verify_fwd_kernel``, ``"fma"``: ``fma.py``'s) for sm_90a (no GPU) as the launcher would at the Nano-4B shape
    (L = 16, fp32 state, bf16 activations with the mixer's strides, no z), for each ``P_SPLIT``
    and read copy in ``reads`` (``None`` / ``"bf16"`` / ``"fp8"``; the launch as chosen for that
    copy; with ``flush_split`` its two builds, the non-flush rows' ``read_mma`` build first
    (``ROWS = 2``), then the flush rows' (``ROWS = 1``; a row's ``"rows"``, 0 without the split),
    and print ``ptxas -v``'s
    registers and spills (``sweep_mamba2.compile_sm90a`` / ``ptxas_stats``). ``num_warps`` /
    ``maxnreg`` (``0``: no cap) and ``launch`` (``{field: value}``, as ``--mamba2-verify-launch``;
    e.g. ``{"n_chunks": 4}``) override the launch configuration (offline sweeps); ``keep_ptx``
    adds each build's PTX to its row (``"ptx"``, codegen tests). Run without ``TRITON_INTERPRET``:
    ``python -c "from benchmarks.bench_verify import offline_sm90a; offline_sm90a(4)"``."""
    import torch

    import replayssm_kernels.mamba2_verify.kernel as k
    from benchmarks.sweep_mamba2 import compile_sm90a, ctas_per_sm, ptxas_stats

    H, P, N, G, L = 96, 80, 128, 8, 16
    R = max(L, T) + T
    read_dtypes = {None: None, "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
    if impl == "fma":
        from replayssm_kernels.mamba2_verify.fma import mamba2_replay_verify_fma_kernel as kern
    else:
        kern = k._mamba2_replay_verify_fwd_kernel
    xbc = H * P + 2 * G * N
    rows = []
    for read in reads:
        # as the launcher chooses it for this copy (read_mma), then the overrides
        cfg = k.launch_config(P, N, R, T, torch.bfloat16, impl=impl, read_dtype=read_dtypes[read])
        if num_warps is not None:
            cfg = cfg._replace(num_warps=num_warps)
        if maxnreg is not None:
            cfg = cfg._replace(maxnreg=maxnreg or None)
        if launch:
            cfg = cfg._replace(**launch)
        for ps in p_splits:
            tiles = -(-(-(-P // cfg.block_p)) // ps)
            rd, f8 = read is not None, read == "fp8"
            ptrs = dict(state_ptr="*fp32", ring_x_ptr="*bf16", ring_dt_ptr="*fp32",
                        ring_B_ptr="*bf16", x_ptr="*bf16", dt_ptr="*bf16", A_ptr="*fp32",
                        B_ptr="*bf16", C_ptr="*bf16", D_ptr="*fp32", z_ptr="constexpr",
                        dt_bias_ptr="*fp32", out_ptr="*bf16", slot_idx_ptr="*i32",
                        ring_start_ptr="*i32", ring_len_ptr="*i32", flush_ptr="*i1",
                        read_ptr={"bf16": "*bf16", "fp8": "*fp8e4nv", None: "constexpr"}[read],
                        read_scale_ptr="*fp32" if f8 else "constexpr", sr_seed_ptr="constexpr")
            ints = dict(
                T=T, P=P, N=N, R=R, heads_per_group=H // G, sr_layer=0,
                stride_state_slot=H * P * N, stride_state_head=P * N, stride_state_p=N,
                stride_state_n=1, stride_rx_slot=H * R * P, stride_rx_head=R * P,
                stride_rx_row=P, stride_rx_p=1, stride_rdt_slot=H * R, stride_rdt_head=R,
                stride_rdt_row=1, stride_rB_slot=G * R * N, stride_rB_group=R * N,
                stride_rB_row=N, stride_rB_n=1, stride_x_batch=T * xbc, stride_x_T=xbc,
                stride_x_head=P, stride_x_p=1, stride_dt_batch=T * (H + xbc),
                stride_dt_T=H + xbc, stride_dt_head=1, stride_A_head=1, stride_B_batch=T * xbc,
                stride_B_T=xbc, stride_B_group=N, stride_B_n=1, stride_C_batch=T * xbc,
                stride_C_T=xbc, stride_C_group=N, stride_C_n=1, stride_D_head=1, stride_D_p=0,
                stride_z_batch=0, stride_z_T=0, stride_z_head=0, stride_z_p=0,
                stride_dt_bias_head=1, stride_out_batch=T * H * P, stride_out_T=H * P,
                stride_out_head=P, stride_out_p=1, stride_read_slot=H * P * N if rd else 0,
                stride_read_head=P * N if rd else 0, stride_read_p=N if rd else 0,
                stride_read_n=1 if rd else 0, stride_rs_slot=H * P if f8 else 0,
                stride_rs_head=P if f8 else 0, stride_rs_p=1 if f8 else 0)
            # with flush_split, the launcher's two builds: non-flush rows (ROWS = 2), flush rows
            builds = [(cfg, 0)]
            if impl == "fma" and cfg.flush_split:
                builds = [(cfg, 2), (k.flush_launch_config(cfg), 1)]
            for b, part in builds:
                const = dict(DT_SOFTPLUS=True, HAS_DT_BIAS=True, HAS_D=True, HAS_Z=False,
                             BLOCK_P=b.block_p, BLOCK_K=b.block_k, BLOCK_J=b.block_j,
                             BLOCK_T=b.block_t, NUM_PT=tiles, FOLD_UNROLL=b.fold_unroll,
                             HAS_READ=rd, READ_FP8=f8, SR=False, P_SPLIT=ps)
                if impl == "fma":
                    const.update(BLOCK_N=1 << (N - 1).bit_length(), L2_AHEAD=b.l2_ahead,
                                 PTX=True, READ_MMA=b.read_mma, ROWS=part, **k.fma_layout(b, N))
                else:
                    const.update(NUM_NK=-(-N // b.block_k), ACT_TF32_EXACT=b.act_tf32_exact)
                opts = dict(num_warps=b.num_warps, num_stages=b.num_stages)
                if b.maxnreg:
                    opts["maxnreg"] = b.maxnreg
                ck = compile_sm90a(kern, ptrs, ints, const, opts)
                st = ptxas_stats(ck.asm["ptx"])
                row = dict(T=T, impl=impl, read=read, p_split=ps, num_warps=b.num_warps,
                           maxnreg=b.maxnreg, block_p=b.block_p, n_chunks=b.n_chunks,
                           kq_dot=b.kq_dot, read_mma=b.read_mma, rows=part,
                           shared=ck.metadata.shared,
                           ctas=ctas_per_sm(st["regs"], b.num_warps, ck.metadata.shared), **st)
                if keep_ptx:
                    row["ptx"] = ck.asm["ptx"]
                rows.append(row)
                print(f"{impl} T={T} read={str(read):4} P_SPLIT={ps} block_p {b.block_p} "
                      f"n_chunks {b.n_chunks} kq_dot {b.kq_dot} read_mma {b.read_mma} rows "
                      f"{part} warps {b.num_warps} cap {b.maxnreg}: regs {st['regs']} stack "
                      f"{st['stack']} spill st/ld {st['spill_st']}/{st['spill_ld']} shared "
                      f"{row['shared']} B, CTAs/SM {row['ctas']}", flush=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
