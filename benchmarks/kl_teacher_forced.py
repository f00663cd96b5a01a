"""Teacher-forced per-token KL of each SSM-state configuration against the fp32 conventional path.

Issue 8's check: on the shape-faithful model, the next-token distribution of ReplaySSM with an fp32
checkpoint, with a bf16 read copy, and of a shared bf16 state, each against SGLang's conventional
update with an fp32 SSM state, over 4,096 decode tokens of one sequence.

    python -m benchmarks.kl_teacher_forced --family mamba2 --tokens 4096 --out kl_out

How (all configurations see the same token sequence, so the KL is per position, not per sample):

1. the model is materialised (``tests/models/make_model.py``; on a GPU the preset drawn on the GPU
   and written as bf16 shards, as ``benchmarks/bench_serving_ab.py`` does), reused from ``--model-dir``;
2. one ``sglang.launch_server`` per configuration starts, all at once (one cold start in wall time),
   identical flags but the SSM-state ones, plus ``--enable-custom-logit-processor`` and
   ``--disable-overlap-schedule``;
3. the reference gets one greedy request (``--prompt-len`` random ids, ``max_new_tokens = --tokens``,
   ``ignore_eos``) carrying ``benchmarks/_kl_processor.TeacherForcedKL``: per step it stores the fp32
   logits row (what SGLang's sampler sees) in a file-backed ``[tokens, vocab]`` array and forces its
   own argmax;
4. then every other configuration gets the same request at once (batch 1 each): its processor
   computes ``KL(ref || run)`` per step against the reference's row (both ``log_softmax`` in float64:
   no rounding floor under the estimate) and forces the reference's token.  Each returned
   ``output_ids`` must equal the forced tokens and every step must have been seen exactly once (that
   is what proves the step index right);
5. ``--out`` gets ``results.json`` (everything, per-token KL included), ``results.md`` (the table),
   ``kl_vs_token.png`` (running mean of the KL per configuration, if matplotlib imports) and one
   ``server_<config>.log`` per configuration; the table is printed last.

Configurations (``--configs``; the reference always runs):

- ``reference``: ``--ssm-backend default --mamba-ssm-dtype float32``: SGLang's conventional update,
  fp32 SSM state;
- ``replay_fp32``: ``--ssm-backend replay --mamba-ssm-dtype float32``: ReplaySSM, fp32 checkpoint;
- ``replay_bf16_read``: the same plus ``--replayssm-read-dtype bf16``: fp32 checkpoint + bf16 read copy;
- ``stock_bf16_state``: ``--ssm-backend default --mamba-ssm-dtype bfloat16``: conventional update,
  one shared bf16 state;
- ``replay_bf16_state``: ``--ssm-backend replay --mamba-ssm-dtype bfloat16``: ReplaySSM with a bf16
  checkpoint.

Replay configurations add ``--replayssm-window --window`` (default 16).  On ``--device cpu`` SGLang's
own Mamba-2 and GDN paths do not run (``../shared/design/cpu-serving.md``), so there "stock" means
ReplaySSM at window 1 (every step a flush: the conventional update order) with the same state dtype;
``results.json`` and the table say so.

Memory on a GPU: SGLang 0.5.17 budgets each pool as the free memory at its profiling time minus
``pre_model_load_memory x (1 - --mem-fraction-static)`` (``KVCacheConfigurator._profile_available_bytes``),
where ``pre_model_load_memory`` is the free memory when that server started.  All servers start at
once, so each sees nearly the whole GPU there: a *small* fraction would leave no budget once the other
servers' weights are resident ("Loaded weights leave no GPU memory for the KV cache").  Instead every
pool is capped explicitly (``--max-running-requests 2``, ``--max-total-tokens`` = prompt + tokens +
8192, ``--max-mamba-cache-size 8``, radix cache off) and the fraction (default 0.85) only has to
leave that small budget positive: five ~8 GB servers should use about 60-75 GB of the H200
(estimated, not yet measured).

The processor's per-step cost is one device-to-host copy of the fp32 logits row and, on the host, an
argmax and (compared runs) two float64 ``log_softmax`` and the KL over the vocabulary: a few ms at
vocab 131072, in each server's own scheduler process.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import datetime as _dt
import json
import math
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT / "tests" / "e2e", ROOT / "tests" / "models"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import server as srv  # noqa: E402  (tests/e2e/server.py: launch / wait_ready / stop / free_port)

from benchmarks import _kl_processor as klp  # noqa: E402
from benchmarks import bench_serving_ab as ab  # noqa: E402  (model generation, GPU name, commit)

__all__ = [
    "CONFIGS",
    "DEFAULT_CONFIGS",
    "REFERENCE",
    "ConfigSpec",
    "build_table",
    "config_args",
    "kl_stats",
    "main",
    "parse_args",
    "prompt_ids",
    "server_base_flags",
]

REFERENCE = "reference"


@dataclass(frozen=True)
class ConfigSpec:
    """One server configuration: which SSM path and which state dtypes.

    Attributes
    ----------
    backend : str
        ``"default"`` (SGLang's conventional update) or ``"replay"``.
    ssm_dtype : str
        ``--mamba-ssm-dtype``: ``"float32"`` or ``"bfloat16"``.
    read_dtype : str or None
        ``--replayssm-read-dtype`` (replay only), None for no copy.
    what : str
        One line for the table.
    """

    backend: str
    ssm_dtype: str
    read_dtype: str | None
    what: str


CONFIGS: dict[str, ConfigSpec] = {
    REFERENCE: ConfigSpec("default", "float32", None, "conventional update, fp32 SSM state (the reference)"),
    "replay_fp32": ConfigSpec("replay", "float32", None, "ReplaySSM, fp32 checkpoint, no read copy"),
    "replay_bf16_read": ConfigSpec("replay", "float32", "bf16", "ReplaySSM, fp32 checkpoint + bf16 read copy"),
    "stock_bf16_state": ConfigSpec("default", "bfloat16", None, "conventional update, shared bf16 SSM state"),
    "replay_bf16_state": ConfigSpec("replay", "bfloat16", None, "ReplaySSM with a bf16 checkpoint, no copy"),
}
DEFAULT_CONFIGS = ("replay_fp32", "replay_bf16_read", "stock_bf16_state", "replay_bf16_state")
FAMILY_MODELS = {"mamba2": "nemotron_h_nano4b", "gdn": "qwen3_5_4b"}
CPU_FAMILY_MODELS = {"mamba2": "nemotron_h_tiny", "gdn": "qwen3_next_tiny"}
REPLAY_LOG_MARK = ab.REPLAY_LOG_MARK
TEARDOWN_RESERVE_S = 25.0
MAX_PROMPT_LEN = 2048  # one prefill chunk at SGLang's defaults: a chunked prompt would sample twice at step 0


# ----------------------------------------------------------------------------- arguments


def _config_list(text: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    others = [n for n in CONFIGS if n != REFERENCE]
    bad = [n for n in names if n not in others]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {others}, got {text!r}")
    return list(dict.fromkeys(names))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and validate the command line (bad input exits with a message naming the flag).

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments without the program name (default: ``sys.argv[1:]``).

    Returns
    -------
    argparse.Namespace
        With defaults resolved: ``model``, ``model_dir``, ``commit``, ``max_total_tokens``,
        ``conv_dtype``, ``configs``.
    """
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.kl_teacher_forced",
        description="Teacher-forced per-token KL of SSM-state configurations vs the fp32 conventional path.",
    )
    p.add_argument("--family", choices=("mamba2", "gdn"), default="mamba2",
                   help="mamba2: Nemotron-3-Nano-4B-like (nemotron_h_nano4b); gdn: Qwen3.5-4B-like (qwen3_5_4b); "
                        "--device cpu: the tiny preset of the family")
    p.add_argument("--model", default=None, help="preset of tests/models/make_model.py (default: per family)")
    p.add_argument("--model-dir", default=None,
                   help="where the model is written (default /tmp/replayssm_bench_models/<model>); reused if complete")
    p.add_argument("--tokens", type=int, default=4096, help="teacher-forced decode steps (default 4096)")
    p.add_argument("--prompt-len", type=int, default=64, help="random prompt ids before the first step (default 64)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt ids")
    p.add_argument("--configs", type=_config_list, default=list(DEFAULT_CONFIGS),
                   help=f"compared configurations, comma list (default {','.join(DEFAULT_CONFIGS)})")
    p.add_argument("--window", type=int, default=16, help="--replayssm-window of the replay configurations")
    p.add_argument("--segment", type=int, default=512, help="length of the first/last segment means (default 512)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: tiny model, SGLang's CPU flags, stock = replay at window 1")
    p.add_argument("--out", default="kl_teacher_forced_out", help="output folder (created)")
    p.add_argument("--work-dir", default=None,
                   help="folder of the per-step files (the reference's is tokens x vocab x 4 bytes: 2 GiB at "
                        "4096 x 131072); default: a temporary folder, removed at the end")
    p.add_argument("--commit", default=None, help="recorded in the outputs (default: git rev-parse --short HEAD)")
    p.add_argument("--time-budget", type=float, default=530.0,
                   help="seconds for the whole command; what is left undone when it runs out is reported")
    p.add_argument("--mem-fraction-static", type=float, default=0.85,
                   help="cuda: every server's (see the module docstring: it is not a share of the GPU)")
    p.add_argument("--max-total-tokens", type=int, default=None,
                   help="cuda: KV tokens per server (default prompt + tokens + 8192)")
    p.add_argument("--max-mamba-cache-size", type=int, default=8, help="cuda: mamba slots per server (default 8)")
    p.add_argument("--conv-dtype", default=None, choices=("float32", "bfloat16", "float16"),
                   help="SGLANG_MAMBA_CONV_DTYPE of every server (default: bfloat16 on cuda, SGLang's default; "
                        "float32 on cpu)")
    p.add_argument("--server-args", default="", help="extra flags for every server (one shell-quoted string)")
    p.add_argument("--server-timeout", type=float, default=None,
                   help="seconds to wait for the servers (default: what the budget leaves)")
    args = p.parse_args(argv)

    cpu = args.device == "cpu"
    if args.tokens < 1:
        p.error(f"--tokens: expected an integer >= 1, got {args.tokens}")
    if not 1 <= args.prompt_len <= MAX_PROMPT_LEN:
        p.error(f"--prompt-len: expected 1..{MAX_PROMPT_LEN} (one prefill chunk), got {args.prompt_len}")
    if args.window < 1:
        p.error(f"--window: expected an integer >= 1, got {args.window}")
    if args.segment < 1:
        p.error(f"--segment: expected an integer >= 1, got {args.segment}")
    if args.time_budget <= 0:
        p.error(f"--time-budget: expected seconds > 0, got {args.time_budget}")
    if not 0.0 < args.mem_fraction_static < 1.0:
        p.error(f"--mem-fraction-static: expected a fraction in (0, 1), got {args.mem_fraction_static}")
    if args.max_mamba_cache_size < 2:
        p.error(f"--max-mamba-cache-size: expected >= 2 (max running requests), got {args.max_mamba_cache_size}")
    if args.model is None:
        args.model = (CPU_FAMILY_MODELS if cpu else FAMILY_MODELS)[args.family]
    cfg_path = ROOT / "tests" / "models" / args.model / "config.json"
    if not cfg_path.exists():
        p.error(f"--model: no preset {args.model!r} (expected a folder of tests/models with a config.json)")
    context = int(json.loads(cfg_path.read_text()).get("max_position_embeddings") or 0)
    # SGLang 0.5.17 silently caps max_new_tokens at context_len - 2 - prompt (Scheduler, max_req_len)
    if context and args.prompt_len + args.tokens + 2 > context:
        p.error(f"--prompt-len + --tokens = {args.prompt_len + args.tokens} does not fit {args.model}'s context "
                f"length {context} (SGLang needs prompt + tokens + 2 <= context)")
    need = args.prompt_len + args.tokens + 8192
    if args.max_total_tokens is None:
        args.max_total_tokens = need
    elif args.max_total_tokens < args.prompt_len + args.tokens + 1:
        p.error(f"--max-total-tokens: expected >= prompt + tokens + 1 = {args.prompt_len + args.tokens + 1}, "
                f"got {args.max_total_tokens}")
    if args.conv_dtype is None:
        args.conv_dtype = "float32" if cpu else "bfloat16"
    if args.model_dir is None:
        args.model_dir = f"/tmp/replayssm_bench_models/{args.model}"
    if args.commit is None:
        args.commit = ab._git_commit()
    return args


# ----------------------------------------------------------------------------- commands


def server_base_flags(args: argparse.Namespace) -> list[str]:
    """Flags shared by every server (everything but the SSM-state ones).

    cuda: ``bench_serving_ab``'s (bf16 model, FlashInfer attention, safetensors, radix cache off)
    with small explicit pools; cpu: ``tests/e2e/server.py``'s ``CPU_FLAGS``.  Both add
    ``--enable-custom-logit-processor`` and ``--disable-overlap-schedule`` (the processor's step
    index is ``len(req.output_ids)``, exact only when each step's result is processed before the
    next step is sampled).
    """
    if args.device == "cpu":
        flags = list(srv.CPU_FLAGS)
    else:
        flags = [
            "--dtype", "bfloat16",
            # The device payload strips sgl_kernel's FA3 library; FlashInfer serves every server.
            "--attention-backend", "flashinfer",
            "--load-format", "safetensors",
            "--mem-fraction-static", str(args.mem_fraction_static),
            "--max-running-requests", "2",
            "--cuda-graph-max-bs-decode", "2",
            "--max-total-tokens", str(args.max_total_tokens),
            "--max-mamba-cache-size", str(args.max_mamba_cache_size),
            "--disable-radix-cache",
        ]
    if "--disable-overlap-schedule" not in flags:
        flags.append("--disable-overlap-schedule")
    flags += ["--enable-custom-logit-processor", "--random-seed", "0", "--log-level", "info"]
    return flags + shlex.split(args.server_args)


def config_args(name: str, window: int, device: str = "cuda") -> list[str]:
    """The SSM-state flags of configuration ``name`` (``CONFIGS``).

    On ``device == "cpu"`` a ``default`` backend becomes ReplaySSM at window 1 (SGLang's own SSM
    paths do not run on a CPU; window 1 flushes every step, the conventional update).

    Raises
    ------
    ValueError
        On an unknown configuration.
    """
    if name not in CONFIGS:
        raise ValueError(f"config: expected one of {tuple(CONFIGS)}, got {name!r}")
    spec = CONFIGS[name]
    if spec.backend == "default" and device != "cpu":
        flags = ["--ssm-backend", "default"]
    else:
        w = 1 if spec.backend == "default" else window
        flags = ["--ssm-backend", "replay", "--replayssm-window", str(w)]
    flags += ["--mamba-ssm-dtype", spec.ssm_dtype]
    if spec.read_dtype is not None:
        flags += ["--replayssm-read-dtype", spec.read_dtype]
    return flags


def prompt_ids(n: int, vocab: int, seed: int) -> list[int]:
    """``n`` prompt token ids in ``[4, vocab)`` (above the presets' 4 special tokens), fixed by ``seed``."""
    rng = np.random.default_rng(seed)
    return [int(v) for v in rng.integers(4, vocab, size=n)]


def _request(prompt: list[int], n: int, mode: str, run_dir: Path, ref_dir: Path | None, vocab: int) -> dict:
    params = {"kl_mode": mode, "kl_dir": str(run_dir), "kl_tokens": n, "kl_vocab": vocab}
    if ref_dir is not None:
        params["kl_ref_dir"] = str(ref_dir)
    return {
        "input_ids": prompt,
        "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True, "custom_params": params},
        "custom_logit_processor": klp.TeacherForcedKL.to_str(),
    }


# ----------------------------------------------------------------------------- statistics and table


def kl_stats(kl: np.ndarray, segment: int = 512) -> dict:
    """Summary of a per-token KL array (nats).

    Parameters
    ----------
    kl : np.ndarray
        ``[n]`` float; NaN marks steps never written.
    segment : int
        Length of the first/last-segment means (clipped to ``n``).

    Returns
    -------
    dict
        ``tokens``, ``written`` (non-NaN count), ``nonfinite`` (NaN or inf count), ``mean``,
        ``median``, ``p99``, ``max``, ``first_mean``, ``last_mean``, ``segment``, ``negative``
        (steps below 0: float rounding of a near-zero KL).  Statistics are over the finite
        values, None if there are none.
    """
    kl = np.asarray(kl, dtype=np.float64)
    finite = kl[np.isfinite(kl)]
    seg = min(segment, kl.size)
    out = {"tokens": int(kl.size), "written": int(np.count_nonzero(~np.isnan(kl))),
           "nonfinite": int(np.count_nonzero(~np.isfinite(kl))), "segment": seg,
           "negative": int(np.count_nonzero(finite < 0))}
    if finite.size == 0:
        return out | dict.fromkeys(("mean", "median", "p99", "max", "first_mean", "last_mean"))

    def _mean(x: np.ndarray) -> float | None:
        x = x[np.isfinite(x)]
        return float(x.mean()) if x.size else None

    return out | {
        "mean": float(finite.mean()), "median": float(np.median(finite)),
        "p99": float(np.percentile(finite, 99)), "max": float(finite.max()),
        "first_mean": _mean(kl[:seg]), "last_mean": _mean(kl[-seg:]),
    }


def _g(v: float | None) -> str:
    return "—" if v is None else f"{v:.3g}"


def build_table(results: dict, meta: dict) -> str:
    """Markdown: one row per compared configuration, then the flags and notes.

    ``results``: ``{config: {"stats": kl_stats(...), "top1_agree": float, "forced_ok": bool,
    "flags": [...]} | {"error": str, "flags": [...]}}``.
    """
    lines = [
        f"### Teacher-forced KL vs the fp32 conventional path: {meta.get('model')} ({meta.get('family')}), "
        f"{meta.get('tokens')} tokens",
        "",
        f"commit `{meta.get('commit')}`, {meta.get('date')}, {meta.get('gpu') or meta.get('device')}; prompt "
        f"{meta.get('prompt_len')} random ids (seed {meta.get('seed')}), greedy tokens of the reference forced on "
        f"every configuration; replay window {meta.get('window')}; SGLANG_MAMBA_CONV_DTYPE={meta.get('conv_dtype')}; "
        f"common server flags: `{meta.get('server_flags')}`",
        "",
        "KL(ref || run) per token in nats; first/last = mean over the first/last "
        f"{meta.get('segment')} tokens; top-1 = the run's own argmax equals the reference's token.",
        "",
        "| configuration | what | tokens | mean | median | p99 | max | first mean | last mean | top-1 | forced ok |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, r in results.items():
        what = CONFIGS[name].what if name in CONFIGS else ""
        if "error" in r:
            lines.append(f"| {name} | {what} | — | — | — | — | — | — | — | — | {r['error'][:160]} |")
            continue
        s = r["stats"]
        lines.append(
            f"| {name} | {what} | {s['tokens']} | {_g(s['mean'])} | {_g(s['median'])} | {_g(s['p99'])} "
            f"| {_g(s['max'])} | {_g(s['first_mean'])} | {_g(s['last_mean'])} | {r['top1_agree']:.4f} "
            f"| {'yes' if r['forced_ok'] else 'NO'} |"
        )
    lines += ["", "Flags per configuration:", ""]
    for name, flags in meta.get("config_flags", {}).items():
        lines.append(f"- {name}: `{' '.join(flags)}`")
    for w in meta.get("warnings", []):
        lines.append(f"\nWARNING: {w}")
    return "\n".join(lines) + "\n"


def plot(results: dict, meta: dict, path: Path) -> bool:
    """Running mean of the per-token KL per configuration (log y); False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, r in results.items():
        if "kl" not in r:
            continue
        kl = np.array([np.nan if v is None else v for v in r["kl"]], dtype=np.float64)
        kl = np.where(np.isfinite(kl), kl, 0.0)
        run = np.cumsum(kl) / np.arange(1, kl.size + 1)
        run = np.where(run > 0, run, np.nan)  # log axis: an all-zero curve is not drawn
        label = name + (" (KL 0 throughout)" if np.all(np.isnan(run)) else "")
        ax.plot(np.arange(1, kl.size + 1), run, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("token index")
    ax.set_ylabel("running mean of KL(ref || run), nats")
    ax.set_title(f"Teacher-forced KL vs fp32 conventional: {meta.get('model')}, commit {meta.get('commit')}",
                 fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ----------------------------------------------------------------------------- running


class _Terminated(BaseException):
    pass


def _on_signal(signum, frame):  # noqa: ARG001
    raise _Terminated(f"signal {signum}")


def _log(msg: str) -> None:
    print(f"[kl_teacher_forced {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _post(url: str, payload: dict, timeout: float) -> list[int]:
    import requests

    r = requests.post(f"{url}/generate", json=payload, timeout=max(timeout, 1.0))
    if r.status_code != 200:
        raise RuntimeError(f"HTTP {r.status_code}: {r.text.strip()[:500]}")
    return [int(t) for t in r.json()["output_ids"]]


def _check_run(mode: str, run_dir: Path, ref_dir: Path | None, out_ids: list[int], n: int, vocab: int) -> dict:
    """Read one finished run's files; return its record (``error`` set if anything is off)."""
    files = klp.open_run_files(mode, run_dir, n, vocab, ref_dir, writable=False)
    forced = [int(v) for v in files.tokens]
    hits = np.asarray(files.hits)
    rec: dict = {"forced_ok": out_ids == forced, "steps_seen_once": bool(np.all(hits == 1)),
                 "output_tokens": len(out_ids)}
    problems = []
    err = klp.read_error(run_dir)
    if err:
        problems.append(f"processor error: {err.strip().splitlines()[-1][:300]}")
        rec["processor_error"] = err[-4000:]
    if not rec["forced_ok"]:
        first = next((i for i, (a, b) in enumerate(zip(out_ids, forced)) if a != b), min(len(out_ids), n))
        problems.append(f"returned tokens differ from the forced ones at step {first} "
                        f"({len(out_ids)} returned, {n} forced)")
    if not rec["steps_seen_once"]:
        bad = np.flatnonzero(hits != 1)
        problems.append(f"{bad.size} steps not seen exactly once "
                        f"(first: step {int(bad[0])}, {int(hits[bad[0]])} times)")
    if mode == "compare":
        kl = np.array(files.kl, dtype=np.float64)
        argmax = np.array(files.argmax)
        rec["stats"] = None
        rec["kl"] = [None if not math.isfinite(v) else float(v) for v in kl]
        rec["top1_agree"] = float(np.mean(argmax == np.asarray(files.tokens)))
        rec["top1_mismatch_steps"] = [int(i) for i in np.flatnonzero(argmax != np.asarray(files.tokens))][:200]
    else:
        rec["tokens"] = forced
    if problems:
        rec["error"] = "; ".join(problems)
    return rec


def _run_one(name: str, url: str, prompt: list[int], args: argparse.Namespace, work: Path, vocab: int,
             timeout: float) -> dict:
    mode = "reference" if name == REFERENCE else "compare"
    run_dir = work / name
    ref_dir = None if name == REFERENCE else work / REFERENCE
    klp.create_run_files(mode, run_dir, args.tokens, vocab)
    t = time.monotonic()
    try:
        out_ids = _post(url, _request(prompt, args.tokens, mode, run_dir, ref_dir, vocab), timeout)
    except Exception as e:  # reported per configuration
        return {"error": f"request failed: {type(e).__name__}: {str(e)[:400]}",
                "processor_error": klp.read_error(run_dir)}
    rec = _check_run(mode, run_dir, ref_dir, out_ids, args.tokens, vocab)
    rec["request_s"] = time.monotonic() - t
    if "kl" in rec:
        kl = np.array([np.nan if v is None else v for v in rec["kl"]])
        rec["stats"] = kl_stats(kl, args.segment)
    return rec


def _start_servers(args: argparse.Namespace, names: list[str], out: Path, flags: list[str]) -> tuple[dict, dict]:
    env = {"SGLANG_MAMBA_CONV_DTYPE": args.conv_dtype, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1",
           # the servers unpickle benchmarks._kl_processor.TeacherForcedKL by reference
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    procs, ports = {}, {}
    for name in names:
        ports[name] = srv.free_port()
        cargs = config_args(name, args.window, args.device)
        procs[name] = srv.launch(Path(args.model_dir), cargs, out / f"server_{name}.log", port=ports[name],
                                 env=env, base_flags=flags)
        _log(f"started {name} (pid {procs[name].pid}, port {ports[name]}): {' '.join(cargs)}")
    return procs, ports


def _wait_servers(procs: dict, ports: dict, out: Path, deadline: float) -> dict[str, str]:
    """Wait for every server; return ``{name: why}`` for those that exited or did not come up."""
    failed: dict[str, str] = {}
    for name, proc in procs.items():
        log = out / f"server_{name}.log"
        try:
            srv.wait_ready(proc, ports[name], log, max(deadline - time.monotonic(), 1.0))
            _log(f"{name} ready")
        except (RuntimeError, TimeoutError) as e:
            lines = [ln for ln in str(e).splitlines() if ln.strip()]
            why = next((ln for ln in reversed(lines) if "Error" in ln or "error" in ln), lines[-1] if lines else "")
            failed[name] = f"server did not start: {lines[0][:120] if lines else ''} ... {why.strip()[:400]}"
            _log(f"{name} failed: {failed[name]}")
    return failed


def _install_signals() -> dict:
    old = {}
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):
            old[sig] = signal.signal(sig, _on_signal)
    return old


def _restore_signals(old: dict) -> None:
    for sig, handler in old.items():
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, handler)


def _meta(args: argparse.Namespace, flags: list[str], names: list[str], argv: Sequence[str] | None) -> dict:
    meta = {
        "model": args.model, "family": args.family, "tokens": args.tokens, "prompt_len": args.prompt_len,
        "seed": args.seed, "window": args.window, "segment": min(args.segment, args.tokens),
        "commit": args.commit, "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": args.device, "gpu": ab._gpu_name() if args.device == "cuda" else None,
        "conv_dtype": args.conv_dtype, "server_flags": " ".join(flags),
        "config_flags": {n: config_args(n, args.window, args.device) for n in names},
        "command": " ".join(shlex.quote(a) for a in [sys.executable, "-m", "benchmarks.kl_teacher_forced",
                                                       *(sys.argv[1:] if argv is None else argv)]),
        "warnings": [],
    }
    if args.device == "cpu":
        meta["warnings"].append("cpu: 'reference' and 'stock_bf16_state' are ReplaySSM at window 1 (SGLang's own "
                                "SSM paths do not run on a CPU), fp32 resp. bf16 state")
    return meta


def _check_replay_marks(meta: dict, names: list[str], out: Path, device: str) -> None:
    """Warn where a server log's ReplaySSM mark disagrees with its configuration."""
    for name in names:
        log = out / f"server_{name}.log"
        if not log.exists():
            continue
        has = REPLAY_LOG_MARK in log.read_text(errors="replace")
        want = CONFIGS[name].backend == "replay" or device == "cpu"
        if has != want:
            meta["warnings"].append(f"{name}: server log {'shows' if has else 'lacks'} {REPLAY_LOG_MARK!r}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the measurement; return 0 if every configuration produced its KL, 1 if any failed, 2 if terminated."""
    args = parse_args(argv)
    t0 = time.monotonic()
    deadline = t0 + args.time_budget
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    own_work = args.work_dir is None
    work = Path(tempfile.mkdtemp(prefix="kl_tf_")) if own_work else Path(args.work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    names = [REFERENCE, *args.configs]
    flags = server_base_flags(args)
    model_cfg = json.loads((ROOT / "tests" / "models" / args.model / "config.json").read_text())
    vocab = int(model_cfg["vocab_size"])
    meta = _meta(args, flags, names, argv)
    results: dict[str, dict] = {}
    timings: dict[str, float] = {}
    procs: dict = {}
    status = 0
    old_signals = _install_signals()

    def write_results() -> str:
        table = build_table({n: results[n] for n in args.configs if n in results}, meta)
        (out / "results.md").write_text(table)
        (out / "results.json").write_text(json.dumps(
            {"meta": meta, "timings_s": timings, "results": results, "args": vars(args)}, indent=1, default=str))
        return table

    try:
        _log(f"materialising {args.model} into {args.model_dir} on {args.device}")
        timings["generate"] = ab._generate_model(args, work, min(300.0, deadline - time.monotonic() - 60))
        prompt = prompt_ids(args.prompt_len, vocab, args.seed)
        t = time.monotonic()
        procs, ports = _start_servers(args, names, out, flags)
        limit = deadline - TEARDOWN_RESERVE_S - 30.0
        if args.server_timeout is not None:
            limit = min(limit, time.monotonic() + args.server_timeout)
        failed = _wait_servers(procs, ports, out, limit)
        timings["servers_ready"] = time.monotonic() - t
        _check_replay_marks(meta, [n for n in names if n not in failed], out, args.device)
        for name, why in failed.items():
            results[name] = {"error": why}
            srv.stop(procs.pop(name))
        if REFERENCE in failed:
            raise RuntimeError(f"reference: {failed[REFERENCE]}")
        urls = {n: f"http://127.0.0.1:{ports[n]}" for n in procs}

        t = time.monotonic()
        left = deadline - time.monotonic() - TEARDOWN_RESERVE_S
        results[REFERENCE] = _run_one(REFERENCE, urls[REFERENCE], prompt, args, work, vocab, left)
        timings["reference"] = time.monotonic() - t
        if "error" in results[REFERENCE]:
            raise RuntimeError(f"reference run: {results[REFERENCE]['error']}")
        _log(f"reference: {args.tokens} tokens in {timings['reference']:.1f}s")
        write_results()

        compared = [n for n in args.configs if n in urls]
        t = time.monotonic()
        left = deadline - time.monotonic() - TEARDOWN_RESERVE_S
        with cf.ThreadPoolExecutor(max(len(compared), 1)) as ex:
            futs = {n: ex.submit(_run_one, n, urls[n], prompt, args, work, vocab, left) for n in compared}
            for n, f in futs.items():
                results[n] = f.result()
                s = results[n].get("stats") or {}
                _log(f"{n}: mean KL {_g(s.get('mean'))}, max {_g(s.get('max'))}"
                     + (f"; ERROR {results[n]['error']}" if "error" in results[n] else ""))
        timings["compared"] = time.monotonic() - t
        if any("error" in results.get(n, {"error": "missing"}) for n in args.configs):
            status = 1
    except _Terminated as e:
        meta["warnings"].append(f"terminated by {e}")
        status = 2
    except Exception as e:  # keep whatever was measured
        meta["warnings"].append(f"aborted: {type(e).__name__}: {str(e).splitlines()[0][:400] if str(e) else ''}")
        _log(f"aborted: {type(e).__name__}: {e}")
        status = 1
    finally:
        ab.teardown(procs, _log)
        _restore_signals(old_signals)
        if own_work:
            shutil.rmtree(work, ignore_errors=True)
    timings["total"] = time.monotonic() - t0
    for n in args.configs:
        results.setdefault(n, {"error": "not run (an earlier step failed)"})
    meta["plot"] = plot({n: results[n] for n in args.configs}, meta, out / "kl_vs_token.png")
    table = write_results()
    print("\n" + table, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
