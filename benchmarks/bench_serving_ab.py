"""Serving A/B on one GPU: stock SGLang (``--ssm-backend default``) vs ReplaySSM (``--ssm-backend replay``).

One command, bounded in time end to end (``--time-budget``):

1. generates a shape-faithful model with random weights (``tests/models/make_model.py`` presets;
   drawn on the GPU in a child process, written as bf16 safetensors shards under ``--model-dir``,
   default ``/tmp/replayssm_bench_models/<name>``, reused if already complete);
2. starts both servers **at the same time** on two ports of 127.0.0.1 on the same GPU, identical
   flags except ``--ssm-backend`` (and ``--replayssm-window``), so SGLang's cold start (Triton /
   FlashInfer compiles, CUDA-graph capture) is paid once in wall time, and waits for both
   ``/health_generate``;
3. a greedy probe (temperature 0, ``input_ids`` prompts, > 3 ring cycles of decode) on both servers:
   token matches and the largest logprob difference, reported, not asserted;
4. a short warm-up at the largest concurrency on both servers (prefill shapes, big decode batches);
   with ``generated-shared-prefix`` also one radix-cache hit per server (``_warmup_prefix_hit``);
5. ``python -m sglang.bench_serving --backend sglang --dataset-name <--dataset>`` against each
   server in turn, for every ``--concurrency``, the two servers back to back (order alternating);
   a concurrency given more than once (``64,64,64``) runs again, and the table adds each run's
   ratios and their median (run-to-run spread; targets judged on the medians);
6. writes ``results.md`` (the table), ``results.json`` (everything), ``bench_raw.jsonl`` (every
   bench_serving result line), ``bench_stdout.log``, ``server_stock.log``, ``server_replay.log``
   and ``gen.log`` under ``--out`` (7 files), and prints the table last.

Both servers are killed (process groups) in every case: normal end, error, timeout, SIGTERM.

Datasets (``--dataset``):

- ``random-ids`` (default): random token ids, ``--input-len`` / ``--output-len``, range ratio 1.0,
  radix cache off (``--disable-radix-cache``).  Table: output throughput, median TPOT, median ITL.
- ``generated-shared-prefix`` (gsp): bench_serving's shared-system-prompt dataset, radix cache **on**
  for both servers with SGLang's default mamba radix strategy (``extra_buffer`` on a GPU; nothing is
  forced).  Per concurrency ``--gsp-num-groups`` system prompts of ``--gsp-system-prompt-len`` tokens,
  ``--gsp-prompts-per-group`` questions of ``--gsp-question-len`` tokens each, ``--gsp-output-len``
  new tokens (bench_serving 0.5.17 flags ``--gsp-num-groups --gsp-prompts-per-group
  --gsp-system-prompt-len --gsp-question-len --gsp-output-len --gsp-range-ratio``; the request count
  is groups x prompts per group, ``--num-prompts`` does not apply).  Before each run the radix cache
  is flushed (``POST /flush_cache?timeout=60``, which waits for the server to be idle), so every run
  starts cold and runs at one concurrency do not feed the next; bench_serving then runs with
  ``--warmup-requests 0`` (its warm-up request would cache one group's prefix, and its own
  ``--flush-cache`` right after it is a single attempt that fails if the server has not yet retired
  that request) and ``--cache-report``.  Table: output throughput,
  mean/median TTFT, median TPOT and the cache hit rate, with the replay/stock ratios and the issue's
  targets (TTFT x <= 1.05, same hit rate: |replay - stock| <= 1 point).

  **Cache hit rate**, two ways, both recorded.  (a) The table's: bench_serving's ``--cache-report``
  sums the ``cached_tokens`` that the server returns in each request's ``meta_info`` (SGLang's
  ``Req.cached_tokens``, counted once per request, chunked-prefill continuations excluded) over the
  prompt tokens of the completed requests: ``cache_report.cache_hit_rate_pct`` of the result line.
  (b) A cross-check from the server's own log: SGLang prints ``Prefill batch, #new-seq: ..,
  #new-token: N, #cached-token: C, ..`` per prefill batch; over the part of ``server_<v>.log``
  written during the run, after the flush's ``Cache flushed successfully!``, hit rate = sum C / sum
  (N + C) (``server_log_cache`` per run in ``results.json``; it counts a chunked prefill's earlier
  chunks as cached, so it reads higher when prompts are chunked).  Not used: ``/metrics``'s
  ``sglang:cache_hit_rate`` needs ``--enable-metrics`` and is a gauge of the last prefill batch
  only; ``/server_info`` carries no hit rate in 0.5.17.
  bench_serving caches the generated gsp prompts under ``~/.cache/sglang/benchmark`` keyed by the
  lengths and the tokenizer *class* only (every preset has the same class), so its ``HOME`` is a
  folder of this run (``PYTHONUSERBASE`` kept, for ``--user`` installs): both servers get the same
  prompts, never another model's.

Memory: SGLang 0.5.17 takes ``--mem-fraction-static`` of the memory that is free when each server
starts, and the two start together, so the fraction does not split the GPU between them.  Instead
every pool is sized explicitly (``--max-running-requests`` = ``--cuda-graph-max-bs-decode`` = the largest
concurrency, ``--max-total-tokens`` for that many requests; random-ids: radix cache off so each
request holds exactly one mamba slot; gsp: ``--max-mamba-cache-size`` = 5 slots per running request,
the 3 + 2 that SGLang 0.5.17 budgets under ``extra_buffer`` with the overlap scheduler, plus 2 per
group for the cached prefixes) and the fraction only has to leave room for them whichever server
allocates first; 0.70 does (see ``benchmarks/README.md``).  The 5 slots per request make gsp's mamba
pool 5x random-ids' at one concurrency: c=64 is ~29 GB of fp32 state per Nano-4B server, c=256
would not fit two servers, hence gsp's default concurrencies 1, 16, 64.

``--device cpu`` is a smoke mode for machines without a GPU: the tiny Nemotron-H, SGLang's CPU
flags (``tests/e2e/server.py``, which use the ``no_buffer`` strategy), small lengths.  It exercises
the whole orchestration; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import dataclasses
import datetime as _dt
import json
import os
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT / "tests" / "e2e", ROOT / "tests" / "models"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import server as srv  # noqa: E402  (tests/e2e/server.py: launch / stop / free_port)

__all__ = [
    "FAMILY_MODELS",
    "VARIANTS",
    "parse_args",
    "server_base_flags",
    "variant_args",
    "bench_cmd",
    "read_bench_jsonl",
    "parse_prefill_log",
    "hit_rate_pct",
    "compare_greedy",
    "build_table",
    "main",
]

#: default preset per family (``tests/models/<name>/config.json``)
FAMILY_MODELS = {"mamba2": "nemotron_h_nano4b", "gdn": "qwen3_next_4b"}
#: the tiny presets of the CPU smoke mode
CPU_FAMILY_MODELS = {"mamba2": "nemotron_h_tiny", "gdn": "qwen3_next_tiny"}
#: order matters: "stock" is the baseline of every ratio
VARIANTS = ("stock", "replay")
#: issue 4's targets on the shape-faithful Mamba-2 model (replay/stock output throughput, random-ids)
TARGETS = {"mamba2": {256: 1.30, 1: 0.98}}
DATASETS = ("random-ids", "generated-shared-prefix")
#: the generated-shared-prefix issue's targets (every GPU run): replay/stock TTFT (mean and median) at
#: most this, and the replay hit rate within this many percentage points of stock's
GSP_TTFT_X_MAX = 1.05
GSP_HIT_DIFF_PP_MAX = 1.0
#: mamba slots per running request that SGLang 0.5.17 budgets with the radix cache on: 3, plus 2
#: for the extra_buffer ping-pong under the overlap scheduler (kv_cache_configurator.py)
MAMBA_SLOTS_PER_REQ_RADIX = 5
FLUSH_LOG_MARK = "Cache flushed successfully!"
REPLAY_LOG_MARK = "ReplaySSM rings are allocated"
SHARD_BYTES = 2 << 30
TEARDOWN_RESERVE_S = 25.0


# ----------------------------------------------------------------------------- arguments


def _int_list(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from e
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {text!r}")
    return vals


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_serving_ab",
        description="bench_serving A/B on one GPU: stock SGLang vs --ssm-backend replay, two servers at once.",
    )
    p.add_argument("--family", choices=("mamba2", "gdn"), default="mamba2",
                   help="mamba2: Nemotron-3-Nano-4B-like; gdn: Qwen3.5-4B-like (default model per family)")
    p.add_argument("--model", default=None,
                   help="preset of tests/models/make_model.py (default: nemotron_h_nano4b / qwen3_next_4b; "
                        "qwen3_5_4b is the dense Qwen3.5 variant; tiny presets in --device cpu)")
    p.add_argument("--model-dir", default=None,
                   help="where the model is written (default /tmp/replayssm_bench_models/<model>); reused if complete")
    p.add_argument("--dataset", choices=DATASETS, default="random-ids",
                   help="bench_serving dataset; generated-shared-prefix keeps the radix cache on (see the docstring)")
    p.add_argument("--concurrency", type=_int_list, default=None,
                   help="comma list (default 1,64,256; generated-shared-prefix: 1,16,64; cpu: 1,4)")
    p.add_argument("--num-prompts", type=_int_list, default=None,
                   help="random-ids: comma list, one per concurrency (default: 8 at c=1, else 2*c)")
    p.add_argument("--input-len", type=int, default=None,
                   help="random-ids input length and the probe's longest prompt (default 512; cpu: 64)")
    p.add_argument("--output-len", type=int, default=None, help="random-ids output length (default 256; cpu: 32)")
    g = p.add_argument_group("generated-shared-prefix (bench_serving's --gsp-* flags)")
    g.add_argument("--gsp-num-groups", type=_int_list, default=None,
                   help="system-prompt groups: comma list, one per concurrency, or one value for all "
                        "(default: ceil(4 c / prompts per group), i.e. about 4 c requests)")
    g.add_argument("--gsp-prompts-per-group", type=int, default=None, help="questions per group (default 16; cpu: 4)")
    g.add_argument("--gsp-system-prompt-len", type=int, default=None,
                   help="shared system prompt tokens (default 2048; cpu: 64)")
    g.add_argument("--gsp-question-len", type=int, default=None, help="question tokens (default 128; cpu: 16)")
    g.add_argument("--gsp-output-len", type=int, default=None, help="new tokens per request (default 256; cpu: 16)")
    p.add_argument("--window", type=int, default=16, help="--replayssm-window of the replay server")
    p.add_argument("--out", default="bench_serving_out", help="output folder (created)")
    p.add_argument("--commit", default=None, help="recorded in the outputs (default: git rev-parse --short HEAD)")
    p.add_argument("--time-budget", type=float, default=500.0,
                   help="seconds for the whole command; later steps are skipped when it runs out")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: orchestration smoke test")
    p.add_argument("--mem-fraction-static", type=float, default=0.70,
                   help="both servers; 0.5.17 takes it of the memory free at each start (see README)")
    p.add_argument("--max-running-requests", type=int, default=None, help="default: the largest concurrency")
    p.add_argument("--cuda-graph-max-bs", type=int, default=None, help="default: the largest concurrency")
    p.add_argument("--max-total-tokens", type=int, default=None,
                   help="KV tokens per server (default: max running requests x (input + output + 64) + 8192; "
                        "gsp: plus groups x (system + question), input = system + question, output = gsp output)")
    p.add_argument("--max-mamba-cache-size", type=int, default=None,
                   help="mamba slots per server (default: not passed for random-ids; gsp on cuda: "
                        f"{MAMBA_SLOTS_PER_REQ_RADIX} x max running requests + 2 x the most groups)")
    p.add_argument("--keep-radix-cache", action="store_true",
                   help="do not pass --disable-radix-cache (then each request may hold several mamba slots)")
    p.add_argument("--conv-dtype", default=None,
                   help="SGLANG_MAMBA_CONV_DTYPE for both servers (default: bfloat16 on cuda, SGLang's default)")
    p.add_argument("--server-args", default="", help="extra flags for both servers (one shell-quoted string)")
    p.add_argument("--replay-args", default="",
                   help="extra flags for the replay server only, e.g. '--replayssm-read-dtype bf16'")
    p.add_argument("--probe-requests", type=int, default=8, help="greedy-probe requests (0: no probe)")
    p.add_argument("--probe-new-tokens", type=int, default=64, help="tokens decoded per probe request")
    p.add_argument("--no-warmup", action="store_true", help="skip the warm-up at the largest concurrency")
    p.add_argument("--order", choices=("alternate", "stock-first"), default="alternate",
                   help="which server runs first at each concurrency")
    p.add_argument("--seed", type=int, default=1, help="bench_serving --seed (same prompts for both servers)")
    args = p.parse_args(argv)

    cpu = args.device == "cpu"
    gsp = args.dataset == "generated-shared-prefix"
    if args.model is None:
        args.model = (CPU_FAMILY_MODELS if cpu else FAMILY_MODELS)[args.family]
    if args.concurrency is None:
        args.concurrency = [1, 4] if cpu else ([1, 16, 64] if gsp else [1, 64, 256])
    if args.input_len is None:
        args.input_len = 64 if cpu else 512
    if args.output_len is None:
        args.output_len = 32 if cpu else 256
    gsp_defaults = {"gsp_prompts_per_group": (4, 16), "gsp_system_prompt_len": (64, 2048),
                    "gsp_question_len": (16, 128), "gsp_output_len": (16, 256)}
    for name, (on_cpu, on_gpu) in gsp_defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, on_cpu if cpu else on_gpu)
        elif getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: expected an integer >= 1, got {getattr(args, name)}")
    if gsp:
        if args.num_prompts is not None:
            p.error("--num-prompts: not used by generated-shared-prefix (requests = groups x prompts per group); "
                    "use --gsp-num-groups / --gsp-prompts-per-group")
        ppg = args.gsp_prompts_per_group
        if args.gsp_num_groups is None:
            args.gsp_num_groups = [-(-4 * c // ppg) for c in args.concurrency]
        elif len(args.gsp_num_groups) == 1:
            args.gsp_num_groups = args.gsp_num_groups * len(args.concurrency)
        if len(args.gsp_num_groups) != len(args.concurrency):
            p.error(f"--gsp-num-groups: expected 1 or {len(args.concurrency)} values (one per concurrency), "
                    f"got {len(args.gsp_num_groups)}")
        args.num_prompts = [n * ppg for n in args.gsp_num_groups]
    else:
        if args.gsp_num_groups is not None:
            p.error("--gsp-num-groups: only with --dataset generated-shared-prefix")
        if args.num_prompts is None:
            args.num_prompts = [8 if c == 1 else 2 * c for c in args.concurrency]
    if len(args.num_prompts) != len(args.concurrency):
        p.error(f"--num-prompts: expected {len(args.concurrency)} values (one per concurrency), "
                f"got {len(args.num_prompts)}")
    if args.window < 1:
        p.error(f"--window: expected an integer >= 1, got {args.window}")
    if args.time_budget <= 0:
        p.error(f"--time-budget: expected seconds > 0, got {args.time_budget}")
    maxc = max(args.concurrency)
    if args.max_running_requests is None:
        args.max_running_requests = maxc
    if args.cuda_graph_max_bs is None:
        args.cuda_graph_max_bs = maxc
    if args.max_total_tokens is None:
        if gsp:
            prompt = args.gsp_system_prompt_len + args.gsp_question_len
            args.max_total_tokens = (args.max_running_requests * (prompt + args.gsp_output_len + 64)
                                     + max(args.gsp_num_groups) * prompt + 8192)
        else:
            args.max_total_tokens = args.max_running_requests * (args.input_len + args.output_len + 64) + 8192
    if args.max_mamba_cache_size is None and gsp and not cpu:
        args.max_mamba_cache_size = (MAMBA_SLOTS_PER_REQ_RADIX * args.max_running_requests
                                     + 2 * max(args.gsp_num_groups))
    if args.conv_dtype is None and not cpu:
        args.conv_dtype = "bfloat16"
    if args.model_dir is None:
        args.model_dir = f"/tmp/replayssm_bench_models/{args.model}"
    if args.commit is None:
        args.commit = _git_commit()
    return args


def _git_commit() -> str:
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                           timeout=10)
        return r.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# ----------------------------------------------------------------------------- commands


def server_base_flags(args: argparse.Namespace) -> list[str]:
    """Flags shared by both servers (everything but the ``--ssm-backend`` choice).

    generated-shared-prefix keeps the radix cache on and passes no ``--mamba-radix-cache-strategy``
    (SGLang picks ``extra_buffer`` on a GPU; the CPU flags carry ``no_buffer``, the only one a CPU runs).
    """
    if args.device == "cpu":
        flags = list(srv.CPU_FLAGS)
    else:
        flags = [
            "--dtype", "bfloat16",
            # The device payload strips sgl_kernel's FA3 library; FlashInfer serves both servers.
            "--attention-backend", "flashinfer",
            "--load-format", "safetensors",
            "--mem-fraction-static", str(args.mem_fraction_static),
            "--max-running-requests", str(args.max_running_requests),
            "--cuda-graph-max-bs-decode", str(args.cuda_graph_max_bs),
            "--max-total-tokens", str(args.max_total_tokens),
        ]
        if args.max_mamba_cache_size is not None:
            flags += ["--max-mamba-cache-size", str(args.max_mamba_cache_size)]
        if not args.keep_radix_cache and args.dataset == "random-ids":
            flags.append("--disable-radix-cache")
    flags += ["--random-seed", "0", "--log-level", "info"]
    return flags + shlex.split(args.server_args)


def variant_args(variant: str, window: int, device: str = "cuda", replay_args: str = "") -> list[str]:
    """``--ssm-backend`` flags of one server.  On a CPU, SGLang's own Mamba-2 path does not run, so the
    smoke mode's "stock" server is ReplaySSM at window 1 (every step flushes: the conventional update).
    ``replay_args`` (shell-quoted) are appended to the replay server's flags only."""
    if variant == "stock":
        if device == "cpu":
            return ["--ssm-backend", "replay", "--replayssm-window", "1"]
        return ["--ssm-backend", "default"]
    if variant == "replay":
        return ["--ssm-backend", "replay", "--replayssm-window", str(window), *shlex.split(replay_args)]
    raise ValueError(f"variant: expected one of {VARIANTS}, got {variant!r}")


def bench_cmd(args: argparse.Namespace, model_dir: str | Path, port: int, concurrency: int, num_prompts: int,
              output_file: str | Path, tag: str, num_groups: int | None = None) -> list[str]:
    """``sglang.bench_serving`` command line for one run (flag names of SGLang 0.5.17).

    generated-shared-prefix needs ``num_groups`` (this concurrency's); its request count is
    ``num_groups x --gsp-prompts-per-group`` whatever ``--num-prompts`` says (passed equal to it).
    """
    if args.dataset == "generated-shared-prefix":
        if num_groups is None:
            raise ValueError("bench_cmd: generated-shared-prefix needs num_groups")
        data = [
            "--dataset-name", "generated-shared-prefix",
            "--gsp-num-groups", str(num_groups),
            "--gsp-prompts-per-group", str(args.gsp_prompts_per_group),
            "--gsp-system-prompt-len", str(args.gsp_system_prompt_len),
            "--gsp-question-len", str(args.gsp_question_len),
            "--gsp-output-len", str(args.gsp_output_len),
            "--gsp-range-ratio", "1.0",
            # the per-request cached_tokens summed into result["cache_report"]
            "--cache-report",
        ]
        warmup = "0"  # main() flushes the radix cache before the run; a warm-up would refill it
    else:
        data = [
            "--dataset-name", "random-ids",
            "--random-input-len", str(args.input_len),
            "--random-output-len", str(args.output_len),
            "--random-range-ratio", "1.0",
        ]
        warmup = "1"
    return [
        sys.executable, "-m", "sglang.bench_serving",
        "--backend", "sglang",
        "--host", "127.0.0.1", "--port", str(port),
        "--model", str(model_dir), "--tokenizer", str(model_dir),
        *data,
        "--num-prompts", str(num_prompts),
        "--max-concurrency", str(concurrency),
        "--seed", str(args.seed),
        "--warmup-requests", warmup,
        "--disable-tqdm",
        "--output-file", str(output_file),
        "--tag", tag,
    ]


# ----------------------------------------------------------------------------- results


def read_bench_jsonl(path: str | Path) -> dict | None:
    """The last result line of a bench_serving ``--output-file`` (it appends one JSON object per run)."""
    path = Path(path)
    if not path.exists():
        return None
    last = None
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            last = json.loads(line)
        except json.JSONDecodeError:
            continue
    return last


_PREFILL_RX = re.compile(r"Prefill batch.*?#new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+)")


def parse_prefill_log(text: str, burst_tokens: int = 0) -> dict:
    """Prefix-cache hit rate from SGLang's per-batch log lines (0.5.17 ``report_prefill_stats``).

    ``text``: the part of a server log written during one bench_serving run and the flush before it.
    Only the lines after the last ``Cache flushed successfully!`` count; each ``Prefill batch,
    #new-seq: S, #new-token: N, #cached-token: C, ...`` adds S, N, C.  Returns ``{"prefill_batches",
    "new_seqs", "new_tokens", "cached_tokens", "hit_rate_pct", "after_flush", "burst_batches",
    "burst_cached_tokens", "burst_new_tokens", "after_burst_hit_rate_pct"}``; ``hit_rate_pct`` =
    100 C / (N + C), None without prefill lines.  The
    opening burst is the batches up to the one whose prompt tokens (N + C, summed) reach
    ``burst_tokens`` (concurrency x prompt length: the requests that arrive at once, before any
    prefix of the run is cached; by tokens because a chunked request counts in ``#new-seq`` again
    in each batch of its chunks); ``burst_cached_tokens`` / ``burst_new_tokens`` are their C / N (0
    batches with 0), ``after_burst_hit_rate_pct`` the hit rate of the batches after it (None without
    any): the reuse once the run's prefixes could be cached, without the burst's arrival timing.
    """
    flushed = text.rfind(FLUSH_LOG_MARK)
    if flushed >= 0:
        text = text[flushed + len(FLUSH_LOG_MARK):]
    batches = seqs = new = cached = 0
    burst_batches = burst_cached = burst_new = 0
    for m in _PREFILL_RX.finditer(text):
        if new + cached < burst_tokens:
            burst_batches += 1
            burst_new += int(m.group(2))
            burst_cached += int(m.group(3))
        batches += 1
        seqs += int(m.group(1))
        new += int(m.group(2))
        cached += int(m.group(3))
    total = new + cached
    after = total - burst_new - burst_cached
    return {"prefill_batches": batches, "new_seqs": seqs, "new_tokens": new, "cached_tokens": cached,
            "hit_rate_pct": round(100.0 * cached / total, 2) if total else None, "after_flush": flushed >= 0,
            "burst_batches": burst_batches, "burst_cached_tokens": burst_cached, "burst_new_tokens": burst_new,
            "after_burst_hit_rate_pct": round(100.0 * (cached - burst_cached) / after, 2) if after else None}


def hit_rate_pct(result: dict | None) -> float | None:
    """A run's prefix-cache hit rate in percent: bench_serving's ``cache_report.cache_hit_rate_pct``
    (server-reported ``cached_tokens`` per request over prompt tokens); None if the run has none."""
    report = (result or {}).get("cache_report") or {}
    return report.get("cache_hit_rate_pct")


def compare_greedy(stock: list[dict], replay: list[dict]) -> dict:
    """Compare greedy outputs request by request.

    Each item: ``{"tokens": [...], "logprobs": [...]}`` or ``{"error": "..."}``.  Returns the number of
    token-identical requests, each request's first differing position, and the largest logprob
    difference over the common prefix (positions before the first difference).
    """
    per = []
    max_diff = 0.0
    matches = 0
    for i, (a, b) in enumerate(zip(stock, replay)):
        if "error" in a or "error" in b:
            per.append({"request": i, "error": a.get("error") or b.get("error")})
            continue
        ta, tb = a["tokens"], b["tokens"]
        first = next((j for j, (x, y) in enumerate(zip(ta, tb)) if x != y), None)
        if first is None and len(ta) != len(tb):
            first = min(len(ta), len(tb))
        upto = first if first is not None else len(ta)
        diffs = [abs(x - y) for x, y in zip(a["logprobs"][:upto], b["logprobs"][:upto])
                 if x is not None and y is not None]
        d = max(diffs, default=0.0)
        max_diff = max(max_diff, d)
        matches += first is None
        per.append({"request": i, "tokens": len(ta), "first_diff": first, "max_logprob_diff": d})
    return {"requests": len(per), "token_identical": matches, "max_logprob_diff_common_prefix": max_diff,
            "per_request": per}


def _fmt(v, spec: str = ".1f") -> str:
    return "—" if v is None else format(v, spec)


def _ratio(a, b):
    return None if a is None or b is None or not b else a / b


def _done(x: dict) -> str:
    if "skipped" in x:
        return "skipped"
    if "error" in x:
        return "failed"
    return str(x.get("completed", "—"))


def _diff(a, b):
    return None if a is None or b is None else a - b


def build_table(runs: dict, meta: dict, repeats: dict | None = None) -> str:
    """Markdown: one row per concurrency, stock vs replay and replay/stock ratios.

    ``runs``: ``{concurrency: {"stock": result-or-None, "replay": ...}}`` where a result is a
    bench_serving JSON line (``output_throughput``, ``median_tpot_ms``, ``median_itl_ms``,
    ``completed``; generated-shared-prefix adds ``mean_ttft_ms``, ``median_ttft_ms``,
    ``cache_report`` and our ``server_log_cache``) or ``{"skipped": reason}`` / ``{"error": ...}``.
    ``meta["dataset"]`` picks the table (default random-ids). ``repeats``: ``{concurrency: [run, ...]}``
    with a run ``{"order": [...], "stock": result, "replay": result}`` for every run of that concurrency
    in order; where a concurrency ran more than once (``--concurrency 64,64,64``) ``runs`` holds its last
    run and a section lists each run's ratios and their median (``_repeat_rows``).
    """
    dataset = meta.get("dataset", "random-ids")
    if dataset == "generated-shared-prefix":
        data = (f"bench_serving generated-shared-prefix, system prompt {meta.get('gsp_system_prompt_len')}, "
                f"question {meta.get('gsp_question_len')}, output {meta.get('gsp_output_len')}, "
                f"{meta.get('gsp_prompts_per_group')} prompts per group, range ratio 1.0, radix cache on, "
                "flushed before each run")
    else:
        data = (f"bench_serving random-ids, input {meta.get('input_len')}, output {meta.get('output_len')}, "
                "range ratio 1.0")
    lines = [
        f"### Serving A/B ({dataset}): {meta.get('model')} ({meta.get('family')}), stock vs replay "
        f"L={meta.get('window')}",
        "",
        f"commit `{meta.get('commit')}`, {meta.get('date')}, {meta.get('gpu') or meta.get('device')}; "
        f"{data}; server flags: `{meta.get('server_flags')}`"
        + (f"; replay server also `{meta['replay_args']}`" if meta.get("replay_args") else ""),
        "",
    ]
    if dataset == "generated-shared-prefix":
        lines += _gsp_rows(runs)
    else:
        lines += _random_ids_rows(runs)
    probe = meta.get("probe")
    if probe:
        firsts = [q["first_diff"] for q in probe["per_request"] if q.get("first_diff") is not None]
        lines.append(
            f"Greedy probe ({probe['requests']} requests x {meta.get('probe_new_tokens')} tokens, temperature 0): "
            f"{probe['token_identical']}/{probe['requests']} token-identical; max |logprob diff| on the common "
            f"prefix {probe['max_logprob_diff_common_prefix']:.4g}"
            + (f"; earliest divergence at token {min(firsts)}" if firsts else "") + "."
        )
    gsp = dataset == "generated-shared-prefix"
    lines += _repeat_rows(repeats or {}, gsp, meta.get("device") != "cpu")
    if gsp:
        if meta.get("device") != "cpu":
            lines += _gsp_targets(runs, {c for c, r in (repeats or {}).items() if len(r) > 1})
    else:
        for c, goal in sorted(TARGETS.get(meta.get("family"), {}).items(), reverse=True):
            if meta.get("model") != FAMILY_MODELS.get(meta.get("family")) or c not in runs:
                continue
            x = _ratio((runs[c].get("replay") or {}).get("output_throughput"),
                       (runs[c].get("stock") or {}).get("output_throughput"))
            verdict = "not measured" if x is None else ("met" if x >= goal else "MISSED")
            lines.append(f"target c={c}: output throughput x >= {goal:.2f}: {_fmt(x, '.3f')} {verdict}")
    for w in meta.get("warnings", []):
        lines.append(f"WARNING: {w}")
    return "\n".join(lines) + "\n"


def _repeat_rows(repeats: dict, gsp: bool, targets: bool) -> list[str]:
    """Concurrencies run more than once: each run's replay / stock ratios (which server ran first), then
    their median and range; for generated-shared-prefix also the TTFT and hit-rate targets on the medians."""
    many = {c: reps for c, reps in sorted(repeats.items()) if len(reps) > 1}
    if not many:
        return []
    cols = ([("x throughput", "output_throughput"), ("x mean TTFT", "mean_ttft_ms"),
             ("x median TTFT", "median_ttft_ms"), ("hit diff pp", None)] if gsp else
            [("x throughput", "output_throughput"), ("x TPOT", "median_tpot_ms"), ("x ITL", "median_itl_ms")])
    lines = ["", "Repeated concurrencies: each run's replay / stock (the table above shows the last run), then the "
             "median of the runs with a value (min-max, how many).", "",
             "| concurrency | run | first | " + " | ".join(name for name, _ in cols) + " |",
             "|---:|---:|---|" + "---:|" * len(cols)]
    meds: dict[int, list] = {}
    for c, reps in many.items():
        vals: list[list[float]] = [[] for _ in cols]
        for k, run in enumerate(reps, 1):
            s, p = run.get("stock") or {}, run.get("replay") or {}
            cells = []
            for j, (_, field) in enumerate(cols):
                v = _ratio(p.get(field), s.get(field)) if field else _diff(hit_rate_pct(p), hit_rate_pct(s))
                if v is not None:
                    vals[j].append(v)
                cells.append(_fmt(v, ".3f" if field else "+.1f"))
            lines.append(f"| {c} | {k} | {(run.get('order') or ['—'])[0]} | " + " | ".join(cells) + " |")
        meds[c] = [(statistics.median(v), len(v)) if v else (None, 0) for v in vals]
        lines.append(f"| {c} | median | | " + " | ".join(
            "—" if m is None else f"{_fmt(m, '.3f' if f else '+.1f')} ({_fmt(min(v), '.3f' if f else '+.1f')}-"
            f"{_fmt(max(v), '.3f' if f else '+.1f')}, {n})" for (m, n), v, (_, f) in zip(meds[c], vals, cols)) + " |")
    if gsp and targets:
        lines.append("")
        for c, (_, (mean_x, n_mean), (median_x, n_median), (hit, n_hit)) in meds.items():
            ttft = "not measured" if None in (mean_x, median_x) else (
                "met" if max(mean_x, median_x) <= GSP_TTFT_X_MAX else "MISSED")
            same = "not measured" if hit is None else ("met" if abs(hit) <= GSP_HIT_DIFF_PP_MAX else "MISSED")
            lines.append(f"target c={c} over {min(n_mean, n_median)} runs (medians): TTFT x <= {GSP_TTFT_X_MAX:.2f}: mean "
                         f"{_fmt(mean_x, '.3f')}, median {_fmt(median_x, '.3f')} {ttft}; same hit rate (<= "
                         f"{GSP_HIT_DIFF_PP_MAX:.1f} pp): {_fmt(hit, '+.1f')} pp over {n_hit} runs {same}")
    return lines


def _random_ids_rows(runs: dict) -> list[str]:
    lines = [
        "| concurrency | prompts | stock out tok/s | replay out tok/s | x throughput | stock TPOT ms "
        "| replay TPOT ms | x TPOT | stock ITL ms | replay ITL ms | x ITL | completed (stock/replay) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for c in sorted(runs):
        r = runs[c]
        s, p = r.get("stock") or {}, r.get("replay") or {}
        st, rt = s.get("output_throughput"), p.get("output_throughput")
        sp, rp = s.get("median_tpot_ms"), p.get("median_tpot_ms")
        si, ri = s.get("median_itl_ms"), p.get("median_itl_ms")
        lines.append(
            f"| {c} | {r.get('num_prompts', '—')} | {_fmt(st)} | {_fmt(rt)} | {_fmt(_ratio(rt, st), '.3f')} "
            f"| {_fmt(sp, '.2f')} | {_fmt(rp, '.2f')} | {_fmt(_ratio(rp, sp), '.3f')} "
            f"| {_fmt(si, '.2f')} | {_fmt(ri, '.2f')} | {_fmt(_ratio(ri, si), '.3f')} "
            f"| {_done(s)}/{_done(p)} |"
        )
    return lines + ["", "x = replay / stock (throughput: higher is better; TPOT, ITL: lower is better)."]


def _gsp_rows(runs: dict) -> list[str]:
    lines = [
        "| concurrency | prompts (groups) | stock out tok/s | replay out tok/s | x throughput "
        "| stock mean TTFT ms | replay mean TTFT ms | x mean TTFT | stock median TTFT ms | replay median TTFT ms "
        "| x median TTFT | stock TPOT ms | replay TPOT ms | x TPOT | stock hit % | replay hit % | hit diff pp "
        "| completed (stock/replay) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    log_rates, burst = [], []
    for c in sorted(runs):
        r = runs[c]
        s, p = r.get("stock") or {}, r.get("replay") or {}
        st, rt = s.get("output_throughput"), p.get("output_throughput")
        sm, rm = s.get("mean_ttft_ms"), p.get("mean_ttft_ms")
        sd, rd = s.get("median_ttft_ms"), p.get("median_ttft_ms")
        sp, rp = s.get("median_tpot_ms"), p.get("median_tpot_ms")
        sh, rh = hit_rate_pct(s), hit_rate_pct(p)
        lines.append(
            f"| {c} | {r.get('num_prompts', '—')} ({r.get('gsp_num_groups', '—')}) | {_fmt(st)} | {_fmt(rt)} "
            f"| {_fmt(_ratio(rt, st), '.3f')} "
            f"| {_fmt(sm, '.1f')} | {_fmt(rm, '.1f')} | {_fmt(_ratio(rm, sm), '.3f')} "
            f"| {_fmt(sd, '.1f')} | {_fmt(rd, '.1f')} | {_fmt(_ratio(rd, sd), '.3f')} "
            f"| {_fmt(sp, '.2f')} | {_fmt(rp, '.2f')} | {_fmt(_ratio(rp, sp), '.3f')} "
            f"| {_fmt(sh, '.1f')} | {_fmt(rh, '.1f')} | {_fmt(_diff(rh, sh), '+.1f')} "
            f"| {_done(s)}/{_done(p)} |"
        )
        sc, rc = s.get("server_log_cache") or {}, p.get("server_log_cache") or {}
        log_rates.append(f"c={c} {_fmt(sc.get('hit_rate_pct'), '.1f')}/{_fmt(rc.get('hit_rate_pct'), '.1f')}")
        burst.append(
            f"c={c} {_fmt(sc.get('burst_cached_tokens'), 'd')}/{_fmt(rc.get('burst_cached_tokens'), 'd')} in the first "
            f"{_fmt(sc.get('burst_batches'), 'd')}/{_fmt(rc.get('burst_batches'), 'd')} batches, "
            f"{_fmt(_minus(sc.get('cached_tokens'), sc.get('burst_cached_tokens')), 'd')}/"
            f"{_fmt(_minus(rc.get('cached_tokens'), rc.get('burst_cached_tokens')), 'd')} after (hit "
            f"{_fmt(sc.get('after_burst_hit_rate_pct'), '.1f')}/{_fmt(rc.get('after_burst_hit_rate_pct'), '.1f')}%, "
            f"diff {_fmt(_diff(rc.get('after_burst_hit_rate_pct'), sc.get('after_burst_hit_rate_pct')), '+.1f')} pp)")
    return lines + [
        "",
        "x = replay / stock (throughput: higher is better; TTFT, TPOT: lower is better); TPOT is the median; "
        "hit % = server-reported cached prompt tokens / prompt tokens (bench_serving --cache-report); "
        "hit diff = replay - stock, percentage points.",
        "Server-log hit % (sum #cached-token / (#new-token + #cached-token) over the run's prefill batches, "
        "stock/replay): " + ", ".join(log_rates) + ".",
        "Server-log cached tokens in the opening burst (the prefill batches holding the first c x prompt "
        "length prompt tokens: the c requests that arrive at once, with no prefix of the run cached) and "
        "after it, stock/replay: "
        + "; ".join(burst) + ".",
    ]


def _minus(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a - b


def _gsp_targets(runs: dict, repeated: set | frozenset = frozenset()) -> list[str]:
    lines = []
    for c in sorted(runs):
        s, p = runs[c].get("stock") or {}, runs[c].get("replay") or {}
        last = " (last run)" if c in repeated else ""
        xs = [_ratio(p.get(k), s.get(k)) for k in ("mean_ttft_ms", "median_ttft_ms")]
        if None in xs:
            verdict = "not measured"
        else:
            verdict = "met" if max(xs) <= GSP_TTFT_X_MAX else "MISSED"
        lines.append(f"target c={c}{last}: TTFT x <= {GSP_TTFT_X_MAX:.2f}: mean {_fmt(xs[0], '.3f')}, "
                     f"median {_fmt(xs[1], '.3f')} {verdict}")
        d = _diff(hit_rate_pct(p), hit_rate_pct(s))
        verdict = "not measured" if d is None else ("met" if abs(d) <= GSP_HIT_DIFF_PP_MAX else "MISSED")
        lines.append(f"target c={c}{last}: same hit rate (|replay - stock| <= {GSP_HIT_DIFF_PP_MAX:.1f} pp): "
                     f"{_fmt(hit_rate_pct(s), '.1f')}% vs {_fmt(hit_rate_pct(p), '.1f')}% "
                     f"({_fmt(d, '+.1f')} pp) {verdict}")
    return lines


# ----------------------------------------------------------------------------- running


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.t0 = time.monotonic()
        self.end = self.t0 + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0


class _Terminated(BaseException):
    pass


def _on_signal(signum, frame):  # noqa: ARG001
    raise _Terminated(f"signal {signum}")


def _log(msg: str) -> None:
    print(f"[bench_serving_ab {time.strftime('%H:%M:%S')}] {msg}", flush=True)


#: seconds bench_serving gets to exit once its result is out (the output file's line or its printed result
#: block); then it is killed and the result taken, with a warning
BENCH_EXIT_GRACE_S = 20.0

#: bench_serving 0.5.17's printed result block (``benchmark``): header, ``{label:<40} {value}`` lines, a
#: closing line of 50 ``=``; the labels this harness reads, by result key (as its ``--output-file`` line)
_RESULT_HEADER = "{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")
_RESULT_LABELS = {
    "Max request concurrency:": "max_concurrency", "Successful requests:": "completed",
    "Benchmark duration (s):": "duration", "Total input tokens:": "total_input_tokens",
    "Total generated tokens:": "total_output_tokens", "Request throughput (req/s):": "request_throughput",
    "Input token throughput (tok/s):": "input_throughput", "Output token throughput (tok/s):": "output_throughput",
    "Peak output token throughput (tok/s):": "max_output_tokens_per_s",
    "Peak concurrent requests:": "max_concurrent_requests", "Total token throughput (tok/s):": "total_throughput",
    "Concurrency:": "concurrency", "Accept length:": "accept_length",
    **{f"{stat} {name} ({unit}):": f"{stat.lower()}_{key}_ms"
       for name, key, unit in (("E2E Latency", "e2e_latency", "ms"), ("TTFT", "ttft", "ms"),
                               ("TPOT", "tpot", "ms"), ("ITL", "itl", "ms"))
       for stat in ("Mean", "Median", "P90", "P95", "P99")},
}


def parse_bench_stdout(text: str) -> dict | None:
    """bench_serving's printed result block (the last complete one) as its output-file keys, or None.

    A block is complete once its closing line of 50 ``=`` is out.  Values that are not numbers (``Max
    request concurrency: not set``) are kept as text; ``accept_length`` is None when not printed (as
    bench_serving writes it without speculation).  None without a complete block or without
    ``Successful requests``.
    """
    lines = text.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.strip() == _RESULT_HEADER]
    for start in reversed(starts):
        end = next((j for j in range(start + 1, len(lines)) if lines[j].strip() == "=" * 50), None)
        if end is None:
            continue
        out: dict = {"accept_length": None}
        for ln in lines[start + 1:end]:
            for label, key in _RESULT_LABELS.items():
                if ln.startswith(label):
                    value = ln[len(label):].strip()
                    try:
                        out[key] = int(value) if re.fullmatch(r"-?\d+", value) else float(value)
                    except ValueError:
                        out[key] = value
                    break
        if "completed" in out:
            return out
    return None


@dataclasses.dataclass
class BenchRun:
    """One bench_serving process: how it ended, what it printed, its result and where it came from.

    ``rc``: the exit status, ``"timeout"`` (killed at the limit) or ``"killed after its result"`` (its
    result was out, then it did not exit within ``BENCH_EXIT_GRACE_S``); ``source``: ``"output file"``,
    ``"stdout"`` (only the printed block) or None (no result).
    """

    rc: int | str
    text: str
    result: dict | None
    source: str | None


def run_bench_serving(cmd: Sequence[str], ofile: Path, *, env: dict, cwd: Path, timeout: float,
                      exit_grace: float = BENCH_EXIT_GRACE_S, poll: float = 0.5) -> BenchRun:
    """Run bench_serving until it exits, or until ``exit_grace`` s after its result is out, or ``timeout``.

    Its result is out once ``ofile`` has a result line (bench_serving appends it last) or its stdout a
    complete result block (``parse_bench_stdout``: printed before the output file, and before one more
    ``/server_info`` request without a timeout).  A process still alive then is killed; the result is
    taken from the output file, else from the printed block.  Stdout goes to ``<ofile>.stdout``.
    ``ofile`` is deleted first: bench_serving appends to it, and an earlier run's line (the same tag
    run twice) would otherwise read as this run's result from the first poll on.
    """
    Path(ofile).unlink(missing_ok=True)
    out_path = Path(f"{ofile}.stdout")
    end = time.monotonic() + max(timeout, 1.0)
    out_since = None
    with open(out_path, "w") as fh:
        proc = subprocess.Popen(list(cmd), stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        try:
            while True:
                rc = proc.poll()
                if rc is not None:
                    break
                now = time.monotonic()
                if out_since is None and (read_bench_jsonl(ofile) is not None
                                          or parse_bench_stdout(out_path.read_text(errors="replace")) is not None):
                    out_since = now
                if out_since is not None and now - out_since >= exit_grace:
                    rc = "killed after its result"
                    break
                if now >= end:
                    rc = "timeout"
                    break
                time.sleep(poll)
        finally:
            if proc.poll() is None:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
    text = out_path.read_text(errors="replace")
    res, source = read_bench_jsonl(ofile), "output file"
    if res is None:
        res, source = parse_bench_stdout(text), "stdout"
    return BenchRun(rc=rc, text=text, result=res, source=source if res is not None else None)


def _generate_model(args: argparse.Namespace, out: Path, timeout: float) -> float:
    """Materialize the preset in a child process (its GPU memory is released before the servers start)."""
    t = time.monotonic()
    code = (
        "import sys, time, torch; sys.path.insert(0, sys.argv[1]); import make_model; t = time.time(); "
        "make_model.materialize(sys.argv[2], sys.argv[3], dtype=getattr(torch, sys.argv[4]), device=sys.argv[5], "
        "shard_bytes=int(sys.argv[6])); print(f'generated {sys.argv[2]} in {time.time() - t:.1f}s', flush=True)"
    )
    dtype = "float32" if args.device == "cpu" else "bfloat16"
    cmd = [sys.executable, "-c", code, str(ROOT / "tests" / "models"), args.model, args.model_dir, dtype,
           args.device, str(SHARD_BYTES)]
    with open(out / "gen.log", "a") as fh:
        r = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=max(timeout, 1.0), cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"model generation failed (exit {r.returncode}):\n{(out / 'gen.log').read_text()[-3000:]}")
    return time.monotonic() - t


def _wait_ready(procs: dict, ports: dict, logs: dict, deadline: float) -> dict:
    """Poll ``/health_generate`` of every server until all answer 200; return seconds to ready per server."""
    import requests

    t0 = time.monotonic()
    ready: dict[str, float] = {}
    while len(ready) < len(procs):
        for name, proc in procs.items():
            if name in ready:
                continue
            if proc.poll() is not None:
                raise RuntimeError(f"{name} server exited with {proc.returncode}:\n{logs[name].read_text()[-4000:]}")
            try:
                r = requests.get(f"http://127.0.0.1:{ports[name]}/health_generate", timeout=10)
                if r.status_code == 200:
                    ready[name] = time.monotonic() - t0
                    _log(f"{name} server ready after {ready[name]:.0f}s")
            except requests.RequestException:
                pass
        if len(ready) < len(procs):
            if time.monotonic() > deadline:
                missing = [n for n in procs if n not in ready]
                tails = "\n".join(f"--- {n}:\n{logs[n].read_text()[-3000:]}" for n in missing)
                raise TimeoutError(f"servers not ready in time: {missing}\n{tails}")
            time.sleep(2.0)
    return ready


def _generate(url: str, ids: list[int], n: int, timeout: float) -> dict:
    import requests

    try:
        r = requests.post(f"{url}/generate", json={
            "input_ids": ids,
            "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True},
            "return_logprob": True,
        }, timeout=timeout)
        r.raise_for_status()
        meta = r.json()["meta_info"]
        lp = meta["output_token_logprobs"]
        return {"tokens": [t[1] for t in lp], "logprobs": [t[0] for t in lp]}
    except Exception as e:  # reported, never fatal
        return {"error": f"{type(e).__name__}: {e}"[:500]}


def _probe_prompts(n: int, vocab: int, max_len: int, seed: int = 7) -> list[list[int]]:
    rng = random.Random(seed)
    lens = [7, 33, 128, 300, 512, 64, 200, 16, 96, 450]
    out = []
    for i in range(n):
        length = max(1, min(lens[i % len(lens)], max_len))
        out.append([rng.randrange(4, vocab) for _ in range(length)])
    return out


def _run_probe(urls: dict, prompts: list[list[int]], new_tokens: int, timeout: float) -> dict:
    """The same greedy requests to both servers at once (each server gets them concurrently)."""
    with cf.ThreadPoolExecutor(2 * len(prompts)) as ex:
        futs = {name: [ex.submit(_generate, url, p, new_tokens, timeout) for p in prompts]
                for name, url in urls.items()}
        outs = {name: [f.result() for f in fs] for name, fs in futs.items()}
    return compare_greedy(outs["stock"], outs["replay"])


def _warmup(urls: dict, n: int, input_len: int, vocab: int, timeout: float) -> None:
    """``n`` concurrent requests (``input_len`` tokens, 8 new) per server, both servers at once."""
    prompts = _probe_prompts(n, vocab, input_len, seed=11)
    prompts = [(p * (input_len // len(p) + 1))[:input_len] for p in prompts]
    with cf.ThreadPoolExecutor(min(2 * n, 512)) as ex:
        futs = [ex.submit(_generate, url, p, 8, timeout) for url in urls.values() for p in prompts]
        errors = [r["error"] for r in (f.result() for f in futs) if "error" in r]
    if errors:
        _log(f"warm-up: {len(errors)} request(s) failed, e.g. {errors[0]}")


def _warmup_prefix_hit(urls: dict, prefix_len: int, question_len: int, vocab: int, timeout: float) -> None:
    """Per server (both at once): two requests one after the other that share a ``prefix_len``-token
    prefix, so the second can hit the radix cache (8 new tokens each).

    The first prefill that continued a cached prefix cost one server ~10.7 s on the H200 and the other,
    run after it, 107 ms (``benchmarks/notes/radix_ttft.md``): read as a one-off Triton compile into the
    disk cache both servers share (which kernel was not isolated), and it decided earlier c = 1 mean
    TTFTs by the run order. This moves it before the measured runs (not yet run on a GPU). Flush the
    cache after it."""
    rng = random.Random(13)
    prefix = [rng.randrange(4, vocab) for _ in range(prefix_len)]
    questions = [[rng.randrange(4, vocab) for _ in range(question_len)] for _ in range(2)]

    def pair(url: str) -> list[dict]:
        return [_generate(url, prefix + q, 8, timeout) for q in questions]

    with cf.ThreadPoolExecutor(len(urls)) as ex:
        errors = [r["error"] for f in [ex.submit(pair, u) for u in urls.values()] for r in f.result() if "error" in r]
    if errors:
        _log(f"prefix-hit warm-up: {len(errors)} request(s) failed, e.g. {errors[0]}")


def _read_from(path: Path, offset: int) -> str:
    """The text appended to ``path`` since byte ``offset``."""
    if not path.exists():
        return ""
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read().decode(errors="replace")


def _flush_cache(url: str, timeout: float) -> str | None:
    """Flush a server's radix cache once it is idle (0.5.17 ``/flush_cache?timeout=``); None if done,
    else why not."""
    import requests

    try:
        r = requests.post(f"{url}/flush_cache", params={"timeout": timeout}, timeout=timeout + 15)
        return None if r.status_code == 200 else f"HTTP {r.status_code}: {r.text.strip()[:200]}"
    except requests.RequestException as e:
        return f"{type(e).__name__}: {e}"[:300]


def _grep_log(path: Path, patterns: Sequence[str], limit: int = 12) -> list[str]:
    if not path.exists():
        return []
    rx = re.compile("|".join(patterns))
    hits = [ln.strip()[:400] for ln in path.read_text(errors="replace").splitlines()
            if rx.search(ln) and "server_args=" not in ln]
    return hits[:limit]


def _max_running_from_log(path: Path) -> int | None:
    """``max_running_requests`` as the scheduler finally set it (its start-up summary line)."""
    found = None
    if path.exists():
        text = path.read_text(errors="replace")
        for m in re.finditer(r"max_total_num_tokens=\d+.*?max_running_requests=(\d+)", text):
            found = int(m.group(1))
    return found


def _strategy_from_log(path: Path) -> str | None:
    """The last ``mamba_radix_cache_strategy='...'`` of the server log's ``server_args`` dump."""
    found = None
    if path.exists():
        for m in re.finditer(r"mamba_radix_cache_strategy='(\w+)'", path.read_text(errors="replace")):
            found = m.group(1)
    return found


def _gpu_name() -> str | None:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def _stop_all(procs: dict) -> None:
    threads = [threading.Thread(target=srv.stop, args=(p,), daemon=True) for p in procs.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=70)


def ignore_term_signals(sigs=(signal.SIGTERM, signal.SIGINT, signal.SIGHUP)) -> None:
    """Ignore ``sigs`` from here on, so that a teardown already under way finishes (servers stopped)."""
    for sig in sigs:
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, signal.SIG_IGN)


def teardown(procs: dict, log=None) -> None:
    """Stop every server in ``procs`` (a ``finally`` block's teardown): signals ignored, errors swallowed."""
    ignore_term_signals()
    with contextlib.suppress(BaseException):
        (log or _log)("stopping servers")
        _stop_all(procs)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    dl = _Deadline(args.time_budget)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"replayssm_bench_{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    for name in ("bench_raw.jsonl", "bench_stdout.log", "gen.log"):
        (out / name).write_text("")

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, _on_signal)

    model_cfg = json.loads((ROOT / "tests" / "models" / args.model / "config.json").read_text())
    flags = server_base_flags(args)
    meta: dict = {
        "model": args.model, "family": args.family, "window": args.window, "commit": args.commit,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": args.device, "gpu": _gpu_name() if args.device == "cuda" else None,
        "dataset": args.dataset, "input_len": args.input_len, "output_len": args.output_len,
        "server_flags": " ".join(flags), "replay_args": args.replay_args,
        "conv_dtype": args.conv_dtype, "probe_new_tokens": args.probe_new_tokens, "warnings": [],
        "command": " ".join(shlex.quote(a) for a in [sys.executable, "-m", "benchmarks.bench_serving_ab",
                                                       *(sys.argv[1:] if argv is None else argv)]),
    }
    if args.device == "cpu":
        meta["warnings"].append("cpu smoke: 'stock' is --ssm-backend replay --replayssm-window 1 (SGLang's own "
                                "Mamba-2 path does not run on a CPU); the numbers mean nothing")
    gsp = args.dataset == "generated-shared-prefix"
    if gsp:
        meta.update({k: getattr(args, k) for k in ("gsp_prompts_per_group", "gsp_system_prompt_len",
                                                   "gsp_question_len", "gsp_output_len", "max_mamba_cache_size")})
    runs: dict[int, dict] = {c: {"num_prompts": n} for c, n in zip(args.concurrency, args.num_prompts)}
    repeats: dict[int, list[dict]] = {}
    if gsp:
        for c, g in zip(args.concurrency, args.gsp_num_groups):
            runs[c]["gsp_num_groups"] = g
    timings: dict[str, float] = {}
    procs: dict[str, subprocess.Popen] = {}
    ports: dict[str, int] = {}
    logs = {v: out / f"server_{v}.log" for v in VARIANTS}
    status = 0

    def write_results() -> str:
        table = build_table(runs, meta, repeats)
        (out / "results.md").write_text(table)
        (out / "results.json").write_text(json.dumps(
            {"meta": meta, "timings_s": timings, "runs": {str(c): r for c, r in runs.items()},
             "repeats": {str(c): r for c, r in repeats.items()},
             "model_config": model_cfg, "args": {k: v for k, v in vars(args).items()}},
            indent=1, default=str))
        return table

    try:
        # 1. model
        _log(f"generating {args.model} into {args.model_dir} on {args.device}")
        timings["generate"] = _generate_model(args, out, min(240.0, dl.left() - TEARDOWN_RESERVE_S))
        _log(f"model ready in {timings['generate']:.0f}s")

        # 2. both servers at once
        env = {"SGLANG_MAMBA_CONV_DTYPE": args.conv_dtype} if args.conv_dtype else {}
        env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        for v in VARIANTS:
            ports[v] = srv.free_port()
        t = time.monotonic()
        for v in VARIANTS:
            vargs = variant_args(v, args.window, args.device, args.replay_args)
            procs[v] = srv.launch(Path(args.model_dir), vargs, logs[v], port=ports[v], env=env, base_flags=flags)
            _log(f"started {v} server (pid {procs[v].pid}, port {ports[v]}): {' '.join(vargs)}")
        # keep at least ~60 s for the benchmark itself
        ready = _wait_ready(procs, ports, logs, deadline=time.monotonic() + max(dl.left() - 60.0, 1.0))
        timings["servers_ready"] = time.monotonic() - t
        timings.update({f"ready_{k}": s for k, s in ready.items()})
        meta["replay_active"] = REPLAY_LOG_MARK in logs["replay"].read_text(errors="replace")
        meta["stock_has_replay_mark"] = REPLAY_LOG_MARK in logs["stock"].read_text(errors="replace")
        if not meta["replay_active"]:
            meta["warnings"].append(f"replay server log lacks {REPLAY_LOG_MARK!r}: ReplaySSM may not be active")
        if meta["stock_has_replay_mark"] and args.device != "cpu":
            meta["warnings"].append("stock server log shows ReplaySSM rings: the A/B is not stock vs replay")
        meta["server_log_lines"] = {v: _grep_log(logs[v], (r"max_running_requests", r"max_total_num_tokens",
                                                            r"Mamba Cache", r"KV Cache is allocated",
                                                            r"ReplaySSM", r"capped", r"Capture cuda graph end"))
                                    for v in VARIANTS}
        meta["max_running_requests"] = {v: _max_running_from_log(logs[v]) for v in VARIANTS}
        meta["mamba_radix_cache_strategy"] = {v: _strategy_from_log(logs[v]) for v in VARIANTS}
        if len(set(meta["mamba_radix_cache_strategy"].values())) > 1:
            meta["warnings"].append(f"the servers' mamba radix strategies differ: {meta['mamba_radix_cache_strategy']}")
        for v, n in meta["max_running_requests"].items():
            if n is not None and n < max(args.concurrency):
                meta["warnings"].append(f"{v} server: max_running_requests={n} < concurrency {max(args.concurrency)}: "
                                        "the top concurrency is capped by the server")
        urls = {v: f"http://127.0.0.1:{ports[v]}" for v in VARIANTS}
        vocab = int(model_cfg["vocab_size"])

        # 3. greedy probe
        if args.probe_requests > 0 and dl.left() > 60:
            t = time.monotonic()
            meta["probe"] = _run_probe(urls, _probe_prompts(args.probe_requests, vocab, args.input_len),
                                       args.probe_new_tokens, timeout=min(120.0, dl.left() - 40))
            timings["probe"] = time.monotonic() - t
            _log(f"greedy probe: {meta['probe']['token_identical']}/{meta['probe']['requests']} token-identical, "
                 f"max logprob diff {meta['probe']['max_logprob_diff_common_prefix']:.4g}")
        write_results()

        # 4. warm-up at the largest concurrency
        if not args.no_warmup and dl.left() > 90:
            t = time.monotonic()
            warm_len = args.gsp_system_prompt_len + args.gsp_question_len if gsp else args.input_len
            _warmup(urls, max(args.concurrency), warm_len, vocab, timeout=min(120.0, dl.left() - 60))
            if gsp:
                _warmup_prefix_hit(urls, args.gsp_system_prompt_len, args.gsp_question_len, vocab,
                                   timeout=min(120.0, max(dl.left() - 60, 5.0)))
            timings["warmup"] = time.monotonic() - t
            _log(f"warm-up done in {timings['warmup']:.0f}s")

        # 5. bench_serving, both servers back to back per concurrency
        benv = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
        benv["SGLANG_PLUGINS"] = "replayssm"
        if gsp:  # bench_serving's gsp prompt cache (~/.cache/sglang/benchmark) is keyed by tokenizer class only
            import site

            # packages installed with --user stay importable under the new HOME
            benv.setdefault("PYTHONUSERBASE", site.getuserbase())
            benv["HOME"] = str(work / "home")
            (work / "home").mkdir(exist_ok=True)
        groups = args.gsp_num_groups if gsp else [None] * len(args.concurrency)
        for i, (c, n, ng) in enumerate(zip(args.concurrency, args.num_prompts, groups)):
            order = list(VARIANTS) if (args.order == "stock-first" or i % 2 == 0) else list(reversed(VARIANTS))
            this = {"order": order, "num_prompts": n, "gsp_num_groups": ng}
            repeats.setdefault(c, []).append(this)
            for v in order:
                left = dl.left() - TEARDOWN_RESERVE_S
                if left < 20:
                    runs[c][v] = this[v] = {"skipped": "time budget"}
                    meta["warnings"].append(f"c={c} {v}: skipped (time budget)")
                    continue
                tag = f"{v}-c{c}"
                ofile = work / f"{tag}.jsonl"
                cmd = bench_cmd(args, args.model_dir, ports[v], c, n, ofile, tag, num_groups=ng)
                log_from = logs[v].stat().st_size if logs[v].exists() else 0
                flush_error = _flush_cache(urls[v], timeout=min(60.0, max(left - 20, 1.0))) if gsp else None
                if flush_error:
                    meta["warnings"].append(f"c={c} {v}: radix cache not flushed before the run ({flush_error}): "
                                            "its hit rate may include earlier runs' prefixes")
                t = time.monotonic()
                run = run_bench_serving(cmd, ofile, env=benv, cwd=work, timeout=min(left, 300.0))
                with open(out / "bench_stdout.log", "a") as fh:
                    fh.write(f"\n===== {tag}: {' '.join(cmd)}\n{run.text}")
                timings[f"bench_{tag}"] = time.monotonic() - t
                res = run.result
                if res is None:
                    runs[c][v] = this[v] = {"error": f"bench_serving exit {run.rc}"}
                    meta["warnings"].append(f"c={c} {v}: bench_serving exit {run.rc} (see bench_stdout.log)")
                    status = 1
                else:
                    if run.rc != 0:
                        meta["warnings"].append(f"c={c} {v}: bench_serving exit {run.rc}, but its result was "
                                                f"out: taken from its {run.source} (see bench_stdout.log)")
                    res = {k: val for k, val in res.items() if k != "server_info"}
                    if run.rc != 0:
                        res["bench_exit"] = {"rc": run.rc, "result_from": run.source}
                    res["server_log_cache"] = parse_prefill_log(
                        _read_from(logs[v], log_from),
                        burst_tokens=c * (args.gsp_system_prompt_len + args.gsp_question_len) if gsp else 0)
                    if gsp:
                        res["flushed_before"] = flush_error is None
                    runs[c][v] = this[v] = res
                    with open(out / "bench_raw.jsonl", "a") as fh:
                        fh.write(json.dumps({**res, "ab_variant": v, "ab_max_concurrency": c}) + "\n")
                    extra = ""
                    if gsp:
                        extra = (f", mean TTFT {res.get('mean_ttft_ms') or 0:.1f} ms, hit rate "
                                 f"{_fmt(hit_rate_pct(res))}% (server log "
                                 f"{_fmt(res['server_log_cache']['hit_rate_pct'])}%)")
                    _log(f"{tag}: {res.get('output_throughput', 0):.1f} out tok/s, median TPOT "
                         f"{res.get('median_tpot_ms', 0):.2f} ms{extra}, {res.get('completed')}/{n} completed, "
                         f"{timings[f'bench_{tag}']:.0f}s")
                write_results()
    except _Terminated as e:
        meta["warnings"].append(f"terminated by {e}")
        status = 2
    except Exception as e:  # keep whatever was measured; the table still comes out
        meta["warnings"].append(f"aborted: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
        _log(f"aborted: {type(e).__name__}: {e}")
        status = 1
    finally:
        teardown(procs)
    timings["total"] = dl.elapsed()
    table = write_results()
    print("\n" + table, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
