"""Where the c = 1 cached-prefix TTFT goes, stock vs replay: /metrics split, per-request TTFTs, one profiled request.

Items 2 and 3 of ``benchmarks/notes/radix_ttft.md`` (issue 7) in one bounded command (``--time-budget``), for
the stock server (``--ssm-backend default``) and the replay server (``--ssm-backend replay``), each measured in
turn (``--order``):

1. generates the shape-faithful model (``bench_serving_ab``'s generator, reused if complete);
2. starts the servers with ``bench_serving_ab``'s flags for the generated-shared-prefix A/B plus
   ``--enable-metrics``; the pool flags default to the measured run's (``4aeec14``: 64 running requests,
   graphs to bs 64, 202,752 tokens, 352 mamba slots).  ``--launch together`` (default) starts both at
   once, as the measured A/B did (one cold start in wall time); ``--launch sequential`` starts, measures
   and stops one server, then the other (the second start is warm in the Triton / FlashInfer caches);
3. per server, in ``--order``:

   a. a short warm-up (``--warmup-requests`` random prompts of system + question length, then one
      radix-cache hit: ``bench_serving_ab._warmup_prefix_hit``), then ``POST /flush_cache``;
   b. ``GET /metrics`` (the histograms of ``METRIC_SERIES``), bench_serving generated-shared-prefix at
      concurrency 1 (1 group of ``--gsp-prompts-per-group`` prompts, ``--warmup-requests 0``,
      ``--cache-report``, ``--output-details``: per-request TTFTs and cached tokens), ``GET /metrics``
      again; the deltas split the server's mean TTFT into stages (``request_process``,
      ``prefill_forward``, queue time);
   c. ``--extra-requests`` cached-prefix ``/generate`` requests without the profiler (client TTFT of a
      streamed request: the group's system prompt, cached by the run, then a fresh question of the
      run's question length), then ``POST /start_profile`` (CPU + GPU activities, ``--profile-steps``
      forward steps, no stacks, no shapes) around one more such request; the trace is read back and
      summarised (``summarize_trace``): the scheduler's receipt of the request, the prefill's
      ``run_batch`` and forward (``step[EXTEND ...]``) host spans, the GPU span of the forward's kernels,
      host syncs and the longest host gaps between launches in the forward, the first decode step's
      graph launch and its GPU start, the end of ``process_batch_result`` (the first token handed to the
      detokenizer), and the forward's kernels by GPU time;

4. writes under ``--out``: ``results.md`` (the tables: bench, server-side split, per-request TTFTs, profile
   timeline, prefill kernels by GPU time in both servers), ``results.json`` (everything),
   ``trace_<variant>.json.gz`` (the trace cut to the profiled request's window, if under
   ``--max-trace-mb``), ``server_<variant>.log`` and ``bench_stdout.log`` (bench_serving's output and the
   generator's log): at most 7 files.

The servers are killed (process groups) in every case.  The bench_serving prompts are the ones of the
measured run (same seed and lengths; bench_serving keeps them in a pickle under its ``HOME``, which this
command points at a folder of its own, so both servers get the same prompts, in the same order).

``--device cpu`` is an orchestration smoke test (tiny Nemotron-H, SGLang's CPU flags, "stock" is replay
at window 1 as in ``bench_serving_ab``, CPU activity only); its numbers mean nothing.

Device command (one call of its own, ~7-9 min): ``benchmarks/notes/radix_ttft.md``, items 2 and 3.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gzip
import json
import os
import pickle
import random
import re
import shlex
import signal
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

from benchmarks import bench_serving_ab as ab

srv = ab.srv

__all__ = [
    "METRIC_SERIES",
    "parse_args",
    "server_flags",
    "parse_metrics",
    "metrics_split",
    "request_ttfts",
    "compare_ttfts",
    "system_prompt_of",
    "summarize_trace",
    "trim_trace",
    "build_report",
    "main",
]

#: the histograms read from /metrics before and after the run (``_sum`` / ``_count`` of each, per ``stage``)
METRIC_SERIES = (
    "sglang:time_to_first_token_seconds",
    "sglang:per_stage_req_latency_seconds",
    "sglang:queue_time_seconds",
    "sglang:e2e_request_latency_seconds",
)
#: the pool flags of the measured shared-prefix run (``4aeec14``, RESULTS.md "Shared-prefix A/B, Mamba-2")
MEASURED_POOL = {"max_running_requests": 64, "cuda_graph_max_bs": 64, "max_total_tokens": 202752,
                 "max_mamba_cache_size": 352}
PROFILED_LOG_MARK = "Profiling done"
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
TEARDOWN_RESERVE_S = 25.0
#: seconds one server's measurement needs at least (warm-up, bench_serving, the profiled request)
MEASURE_MIN_S = 45.0
NAME_CHARS = 140


# ----------------------------------------------------------------------------- arguments


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, argparse.Namespace]:
    """This command's arguments and the ``bench_serving_ab`` namespace they map to (flags, bench command)."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.ttft_probe",
        description="c=1 cached-prefix TTFT, stock vs replay: /metrics split, per-request TTFTs, one profile.",
    )
    p.add_argument("--family", choices=("mamba2", "gdn"), default="mamba2")
    p.add_argument("--model", default=None, help="preset of tests/models/make_model.py (default: bench_serving_ab's)")
    p.add_argument("--model-dir", default=None, help="default /tmp/replayssm_bench_models/<model>; reused if complete")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: orchestration smoke test")
    p.add_argument("--order", choices=("stock-first", "replay-first"), default="stock-first",
                   help="which server is measured first")
    p.add_argument("--launch", choices=("together", "sequential"), default="together",
                   help="together: both servers start at once (as the measured A/B); sequential: one at a time")
    p.add_argument("--time-budget", type=float, default=560.0,
                   help="seconds for the whole command; later steps are skipped when it runs out")
    p.add_argument("--out", default="ttft_probe_out", help="output folder (created)")
    p.add_argument("--commit", default=None, help="recorded in the outputs (default: git rev-parse --short HEAD)")
    p.add_argument("--window", type=int, default=16, help="--replayssm-window of the replay server")
    p.add_argument("--replay-args", default="", help="extra flags for the replay server only")
    p.add_argument("--server-args", default="", help="extra flags for both servers")
    p.add_argument("--mem-fraction-static", type=float, default=0.70)
    p.add_argument("--max-running-requests", type=int, default=MEASURED_POOL["max_running_requests"])
    p.add_argument("--cuda-graph-max-bs", type=int, default=MEASURED_POOL["cuda_graph_max_bs"])
    p.add_argument("--max-total-tokens", type=int, default=MEASURED_POOL["max_total_tokens"])
    p.add_argument("--max-mamba-cache-size", type=int, default=MEASURED_POOL["max_mamba_cache_size"])
    p.add_argument("--gsp-prompts-per-group", type=int, default=None, help="requests of the run (default 16; cpu 4)")
    p.add_argument("--gsp-system-prompt-len", type=int, default=None, help="default 2048; cpu 64")
    p.add_argument("--gsp-question-len", type=int, default=None, help="default 128; cpu 16")
    p.add_argument("--gsp-output-len", type=int, default=None, help="default 256; cpu 16")
    p.add_argument("--seed", type=int, default=1, help="bench_serving --seed (the measured run's: 1)")
    p.add_argument("--warmup-requests", type=int, default=2,
                   help="random prompts of system + question length before the flush (0: none)")
    p.add_argument("--extra-requests", type=int, default=3,
                   help="cached-prefix /generate requests without the profiler, before the profiled one")
    p.add_argument("--profile-steps", type=int, default=4, help="forward steps the profiler records")
    p.add_argument("--profile-new-tokens", type=int, default=8, help="max_new_tokens of the profiled request")
    p.add_argument("--no-profile", action="store_true", help="skip item 3 (the profiled request)")
    p.add_argument("--max-trace-mb", type=float, default=6.0,
                   help="keep trace_<variant>.json.gz (the request's window) only if at most this size")
    args = p.parse_args(argv)
    for name in ("window", "profile_steps", "profile_new_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: expected an integer >= 1, got {getattr(args, name)}")
    for name in ("warmup_requests", "extra_requests"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')}: expected an integer >= 0, got {getattr(args, name)}")
    if args.time_budget <= 0:
        p.error(f"--time-budget: expected seconds > 0, got {args.time_budget}")

    ab_argv = ["--family", args.family, "--dataset", "generated-shared-prefix", "--concurrency", "1",
               "--gsp-num-groups", "1", "--window", str(args.window), "--time-budget", str(args.time_budget),
               "--device", args.device, "--mem-fraction-static", str(args.mem_fraction_static),
               "--seed", str(args.seed), "--out", args.out, "--server-args", args.server_args,
               "--replay-args", args.replay_args]
    for name in ("model", "model_dir", "commit", "gsp_prompts_per_group", "gsp_system_prompt_len",
                 "gsp_question_len", "gsp_output_len"):
        if getattr(args, name) is not None:
            ab_argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if args.device == "cuda":  # the CPU flags carry their own pool sizes
        for name in MEASURED_POOL:
            ab_argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    ab_args = ab.parse_args(ab_argv)
    for name in ("model", "model_dir", "commit", "gsp_prompts_per_group", "gsp_system_prompt_len",
                 "gsp_question_len", "gsp_output_len"):
        setattr(args, name, getattr(ab_args, name))
    return args, ab_args


def server_flags(ab_args: argparse.Namespace) -> list[str]:
    """Both servers' flags: ``bench_serving_ab``'s for the gsp A/B, plus ``--enable-metrics``."""
    return [*ab.server_base_flags(ab_args), "--enable-metrics"]


def variant_order(order: str) -> list[str]:
    return list(ab.VARIANTS) if order == "stock-first" else list(reversed(ab.VARIANTS))


# ----------------------------------------------------------------------------- /metrics


_SAMPLE_RX = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL_RX = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str, series: Sequence[str] = METRIC_SERIES) -> dict[str, float]:
    """The ``_sum`` and ``_count`` samples of the histograms ``series`` in a Prometheus text exposition.

    Keys: ``<name>_sum`` / ``<name>_count``, with ``{stage="..."}`` when the sample has a ``stage`` label;
    every other label (``model_name``, ranks, ...) is dropped and samples that differ only there are
    added up.  Comment lines and other series are ignored.
    """
    out: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RX.match(line.strip())
        if not m:
            continue
        name = m.group("name")
        base, _, kind = name.rpartition("_")
        if kind not in ("sum", "count") or base not in series:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        labels = dict(_LABEL_RX.findall(m.group("labels") or ""))
        key = name + (f'{{stage="{labels["stage"]}"}}' if "stage" in labels else "")
        out[key] += value
    return dict(out)


def metrics_split(before: dict[str, float], after: dict[str, float]) -> dict[str, dict]:
    """Per histogram (and stage): observations, seconds and mean ms between two ``parse_metrics`` reads.

    Returns ``{"<name>" or "<name>{stage=...}": {"count", "sum_s", "mean_ms"}}`` for every series with a
    ``_count`` in ``after``; ``mean_ms`` is None without new observations.
    """
    split: dict[str, dict] = {}
    for key, count in after.items():
        name, brace, labels = key.partition("{")
        if not name.endswith("_count"):
            continue
        base = name[: -len("_count")]
        sum_key = base + "_sum" + brace + labels
        dc = count - before.get(key, 0.0)
        ds = after.get(sum_key, 0.0) - before.get(sum_key, 0.0)
        split[base + brace + labels] = {"count": dc, "sum_s": ds,
                                        "mean_ms": 1e3 * ds / dc if dc > 0 else None}
    return dict(sorted(split.items()))


# ----------------------------------------------------------------------------- per-request TTFTs


def request_ttfts(result: dict | None) -> list[dict]:
    """Per request of a bench_serving ``--output-details`` result, in the order sent: TTFT ms, cached and
    prompt tokens (``cached_tokens`` needs ``--cache-report``), error."""
    if not result or "ttfts" not in result:
        return []
    n = len(result["ttfts"])
    cached = result.get("cached_tokens") or [None] * n
    lens = result.get("input_lens") or [None] * n
    errors = result.get("errors") or [""] * n
    return [{"i": i, "ttft_ms": 1e3 * t if t else None, "cached_tokens": c, "prompt_tokens": n_in,
             "error": e or None}
            for i, (t, c, n_in, e) in enumerate(zip(result["ttfts"], cached, lens, errors))]


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def compare_ttfts(stock: list[dict], replay: list[dict]) -> dict:
    """Request by request (same prompts, same order): replay - stock TTFT, and its spread over the hits.

    A constant shift shows as a small spread of the hit differences around their median; a few slow
    requests as a median near 0 and a large maximum.  ``hits``: requests with cached tokens on both.
    """
    rows = []
    for s, r in zip(stock, replay):
        d = None if s["ttft_ms"] is None or r["ttft_ms"] is None else r["ttft_ms"] - s["ttft_ms"]
        hit = bool(s.get("cached_tokens")) and bool(r.get("cached_tokens"))
        rows.append({"i": s["i"], "stock_ms": s["ttft_ms"], "replay_ms": r["ttft_ms"], "diff_ms": d, "hit": hit,
                     "cached": (s.get("cached_tokens"), r.get("cached_tokens"))})
    hits = [x["diff_ms"] for x in rows if x["hit"] and x["diff_ms"] is not None]
    misses = [x["diff_ms"] for x in rows if not x["hit"] and x["diff_ms"] is not None]
    summary = {"hits": len(hits), "misses": len(misses)}
    if hits:
        q = sorted(hits)
        summary.update(hit_diff_median_ms=statistics.median(q), hit_diff_min_ms=q[0], hit_diff_max_ms=q[-1],
                       hit_diff_mean_ms=statistics.fmean(q), hit_diffs_positive=sum(d > 0 for d in q),
                       hit_stock_median_ms=_median([x["stock_ms"] for x in rows if x["hit"]]),
                       hit_replay_median_ms=_median([x["replay_ms"] for x in rows if x["hit"]]))
    if misses:
        summary["miss_diffs_ms"] = misses
    return {"per_request": rows, "summary": summary}


# ----------------------------------------------------------------------------- the profiled request


def system_prompt_of(prompts: Sequence[str]) -> str | None:
    """The shared system prompt of one gsp group: the prompts' common prefix up to its last ``"\\n\\n"``
    (bench_serving 0.5.17 builds each prompt as ``f"{system_prompt}\\n\\n{question}"``)."""
    if len(prompts) < 2:
        return None
    common = os.path.commonprefix(list(prompts))
    cut = common.rfind("\n\n")
    return common[:cut] if cut > 0 else None


def _load_bench_prompts(home: Path, args: argparse.Namespace) -> list[str] | None:
    """The prompts bench_serving generated for this run (its pickle under ``home``), or None."""
    folder = home / ".cache" / "sglang" / "benchmark"
    name = (f"gen_shared_prefix_{args.seed}_1_{args.gsp_prompts_per_group}_{args.gsp_system_prompt_len}_"
            f"{args.gsp_question_len}_{args.gsp_output_len}_*.pkl")
    for path in sorted(folder.glob(name)):
        try:
            with open(path, "rb") as fh:
                rows = pickle.load(fh)
            return [r.prompt for r in rows if isinstance(r.prompt, str)]
        except Exception:  # noqa: BLE001 (an unreadable pickle: fall back to a fresh prefix)
            continue
    return None


def _fresh_text(tokenizer, n: int, rng: random.Random) -> str:
    """``n`` random tokens as text, as bench_serving's ``gen_prompt`` makes them (its own RNG here)."""
    from sglang.benchmark.datasets.common import get_available_tokens

    return tokenizer.decode(rng.choices(get_available_tokens(tokenizer), k=n))


def _stream_generate(url: str, text: str, new_tokens: int, timeout: float) -> dict:
    """One streamed greedy ``/generate``: client TTFT and end-to-end seconds, server meta (cached tokens)."""
    import requests

    body = {"text": text, "stream": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}}
    t0 = time.perf_counter()
    first = None
    meta: dict = {}
    try:
        with requests.post(f"{url}/generate", json=body, stream=True, timeout=timeout) as r:
            r.raise_for_status()
            for raw in r.iter_lines():
                if not raw or not raw.startswith(b"data:"):
                    continue
                payload = raw[5:].strip()
                if payload == b"[DONE]":
                    break
                if first is None:
                    first = time.perf_counter() - t0
                with contextlib.suppress(ValueError):
                    meta = json.loads(payload).get("meta_info", meta)
    except Exception as e:  # noqa: BLE001 (reported, never fatal)
        return {"error": f"{type(e).__name__}: {e}"[:400]}
    return {"ttft_ms": None if first is None else 1e3 * first, "e2e_ms": 1e3 * (time.perf_counter() - t0),
            "cached_tokens": meta.get("cached_tokens"), "prompt_tokens": meta.get("prompt_tokens"),
            "completion_tokens": meta.get("completion_tokens")}


def _post(url: str, path: str, body: dict | None, timeout: float) -> str | None:
    """POST; None if 200, else why not."""
    import requests

    try:
        r = requests.post(f"{url}{path}", json=body, timeout=timeout)
        return None if r.status_code == 200 else f"HTTP {r.status_code}: {r.text.strip()[:300]}"
    except requests.RequestException as e:
        return f"{type(e).__name__}: {e}"[:300]


def _scrape(url: str) -> str:
    import requests

    r = requests.get(f"{url}/metrics", timeout=20)
    r.raise_for_status()
    return r.text


def _wait_for_trace(folder: Path, log: Path, log_from: int, timeout: float) -> Path | None:
    """The trace file once the server logged ``Profiling done`` (written after the export), or None."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if PROFILED_LOG_MARK in ab._read_from(log, log_from):
            found = sorted(folder.glob("*.trace.json*"))
            if found:
                return found[-1]
        time.sleep(0.5)
    return None


# ----------------------------------------------------------------------------- the trace


def _end(e: dict) -> float:
    return e["ts"] + e.get("dur", 0.0)


def _union_us(spans: list[tuple[float, float]]) -> float:
    total, cur_a, cur_b = 0.0, None, None
    for a, b in sorted(spans):
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    return total + (cur_b - cur_a if cur_b is not None else 0.0)


def _short(name: str) -> str:
    return name if len(name) <= NAME_CHARS else name[: NAME_CHARS - 3] + "..."


def _is_sync(name: str) -> bool:
    return "Synchronize" in name or name in ("cudaMemcpy", "cuMemcpyDtoH_v2", "cuMemcpy")


def _is_launch(name: str) -> bool:
    return any(k in name for k in ("Launch", "Memcpy", "Memset"))


def summarize_trace(trace: dict, top: int = 25) -> dict:
    """The profiled cached-prefix request's timeline from a torch profiler chrome trace (SGLang 0.5.17).

    Spans used (``record_function`` names SGLang emits under a profiler): ``step[EXTEND bs=.. toks=..]``
    (``ModelRunner.forward`` of the prefill; the first one in the trace), the ``scheduler.run_batch`` that
    encloses it, the last ``scheduler.recv_requests`` before that (the iteration that received the request:
    ``t0``), the first ``step[DECODE ...]`` after it and the first ``scheduler.process_batch_result`` after
    it (the prefill's result: the first token goes to the detokenizer at its end).  GPU work is tied to
    its launch by the ``correlation`` of CUDA runtime / driver events.  Times are µs after ``t0``.
    A trace without GPU events (CPU) gives None for the GPU fields.
    """
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    ann = sorted((e for e in events if e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    extends = [e for e in ann if e["name"].startswith(("step[EXTEND", "step[MIXED"))]
    if not extends:
        names = Counter(e["name"] for e in ann)
        return {"error": "no step[EXTEND ...] span in the trace", "annotations": dict(names.most_common(12))}
    step = extends[0]

    def enclosing(name: str, e: dict) -> dict | None:
        cands = [a for a in ann if a["name"] == name and a["ts"] <= e["ts"] and _end(a) >= _end(e)]
        return min(cands, key=lambda a: a.get("dur", 0.0)) if cands else None

    def first_after(prefix: str, t: float) -> dict | None:
        return next((a for a in ann if a["name"].startswith(prefix) and a["ts"] >= t), None)

    rb = enclosing("scheduler.run_batch", step) or step
    recvs = [a for a in ann if a["name"] == "scheduler.recv_requests" and a["ts"] <= rb["ts"]]
    t0 = recvs[-1]["ts"] if recvs else rb["ts"]
    decode = first_after("step[DECODE", _end(step))
    decode_rb = enclosing("scheduler.run_batch", decode) if decode else None
    pbr = first_after("scheduler.process_batch_result", _end(step))

    pid = step.get("pid")
    rt = sorted((e for e in events if e.get("cat") in LAUNCH_CATS and e.get("pid") == pid), key=lambda e: e["ts"])
    by_corr: dict = defaultdict(list)
    for e in events:
        if e.get("cat") in GPU_CATS:
            by_corr[(e.get("args") or {}).get("correlation")].append(e)
    has_gpu = bool(by_corr)

    def rel(t: float | None) -> float | None:
        return None if t is None else t - t0

    def window(e: dict | None) -> tuple[list[dict], list[dict]]:
        if e is None:
            return [], []
        launches = [x for x in rt if e["ts"] <= x["ts"] <= _end(e)]
        gpu = [g for x in launches for g in by_corr.get((x.get("args") or {}).get("correlation"), [])]
        return launches, gpu

    def gpu_span(gpu: list[dict]) -> tuple[float | None, float | None, float | None]:
        if not gpu:
            return None, None, None
        return min(g["ts"] for g in gpu), max(_end(g) for g in gpu), _union_us([(g["ts"], _end(g)) for g in gpu])

    fwd_l, fwd_g = window(step)
    rb_l, rb_g = window(rb)
    dec_l, dec_g = window(decode_rb or decode)
    f0, f1, fbusy = gpu_span(fwd_g)
    r0, r1, rbusy = gpu_span(rb_g)
    d0, _, _ = gpu_span(dec_g)
    graph = next((x for x in dec_l if "GraphLaunch" in x["name"]), None)
    pbr_l, _ = window(pbr)
    has_rt = bool(rt)

    def syncs_of(launches: list[dict]) -> tuple[int | None, float | None, list[dict]]:
        found = [x for x in launches if _is_sync(x["name"])]
        if not has_rt:
            return None, None, found
        return len(found), sum(x.get("dur", 0.0) for x in found), found

    n_sync, sync_us, syncs = syncs_of(fwd_l)
    n_rb_sync, rb_sync_us, _ = syncs_of(rb_l)
    n_pbr_sync, pbr_sync_us, _ = syncs_of(pbr_l)
    launch_ev = [x for x in fwd_l if _is_launch(x["name"])]
    gaps = []
    if has_rt:  # host stalls: the longest stretches of the forward between two CUDA calls (end -> start)
        calls = [(step["ts"], step["ts"], "(forward start)"), *((x["ts"], _end(x), x["name"]) for x in fwd_l),
                 (_end(step), _end(step), "(forward end)")]
        gaps = sorted(((calls[i][0] - calls[i - 1][1], calls[i - 1][2], calls[i][2]) for i in range(1, len(calls))),
                      key=lambda g: -g[0])
    kern: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for g in fwd_g:
        k = kern[_short(g["name"])]
        k[0] += 1
        k[1] += g.get("dur", 0.0)
    kernels = sorted(({"name": n, "count": c, "us": us} for n, (c, us) in kern.items()), key=lambda k: -k["us"])

    return {
        "extend_step": step["name"],
        "extend_steps_in_trace": len(extends),
        "decode_steps_in_trace": sum(a["name"].startswith("step[DECODE") for a in ann),
        "t0": "scheduler.recv_requests" if recvs else "scheduler.run_batch (no recv_requests span)",
        "has_gpu_events": has_gpu,
        "run_batch_start_us": rel(rb["ts"]),
        "run_batch_host_us": rb.get("dur"),
        "forward_start_us": rel(step["ts"]),
        "forward_host_us": step.get("dur"),
        "forward_host_end_us": rel(_end(step)),
        "forward_launches": len(launch_ev) if has_rt else None,
        "forward_gpu_ops": len(fwd_g) if has_gpu else None,
        "forward_syncs": n_sync,
        "forward_sync_us": sync_us,
        "run_batch_syncs": n_rb_sync,
        "run_batch_sync_us": rb_sync_us,
        "forward_gpu_start_us": rel(f0),
        "forward_gpu_end_us": rel(f1),
        "forward_gpu_span_us": None if f0 is None else f1 - f0,
        "forward_gpu_busy_us": fbusy,
        "run_batch_gpu_end_us": rel(r1),
        "run_batch_gpu_busy_us": rbusy,
        "gpu_end_after_host_end_us": None if f1 is None else f1 - _end(step),
        "decode_step_start_us": rel(decode["ts"]) if decode else None,
        "decode_graph_launch_us": rel(graph["ts"]) if graph else None,
        "decode_gpu_start_us": rel(d0),
        "decode_launch_after_prefill_gpu_end_us": (graph["ts"] - r1) if graph and r1 is not None else None,
        "gpu_idle_before_decode_us": (d0 - r1) if d0 is not None and r1 is not None else None,
        "process_result_start_us": rel(pbr["ts"]) if pbr else None,
        "process_result_sync_us": pbr_sync_us,
        "first_token_out_us": rel(_end(pbr)) if pbr else None,
        "forward_host_gaps": [{"us": g[0], "after": _short(g[1]), "before": _short(g[2])} for g in gaps[:6]],
        "forward_syncs_list": [{"name": x["name"], "us": x.get("dur", 0.0), "at_us": rel(x["ts"])} for x in syncs],
        "forward_kernels": kernels[:top],
        "forward_kernel_names": len(kernels) if has_gpu else None,
        "window_us": [t0, max([_end(x) for x in (pbr, decode_rb, decode, rb) if x] + [r1 or t0])],
    }


def trim_trace(trace: dict, t_from: float, t_to: float) -> dict:
    """The trace with only the events that overlap ``[t_from, t_to]`` µs (and the metadata events)."""
    keep = [e for e in trace.get("traceEvents", [])
            if e.get("ph") == "M" or ("ts" in e and e["ts"] <= t_to and e["ts"] + e.get("dur", 0.0) >= t_from)]
    return {**{k: v for k, v in trace.items() if k != "traceEvents"}, "traceEvents": keep}


def _read_trace(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        return json.load(fh)


# ----------------------------------------------------------------------------- the report


def _f(v, spec: str = ".2f") -> str:
    return "—" if v is None else format(v, spec)


def _ms(v) -> str:
    return _f(None if v is None else v / 1e3, ".3f")


def _d(a, b, scale: float = 1.0, spec: str = "+.3f") -> str:
    return "—" if a is None or b is None else format((b - a) / scale, spec)


TIMELINE = (
    ("run_batch_start_us", "recv_requests -> run_batch start (scheduling, match_prefix, alloc)"),
    ("run_batch_host_us", "run_batch host span (prefill)"),
    ("forward_start_us", "forward (step[EXTEND]) host start"),
    ("forward_host_us", "forward host span"),
    ("forward_gpu_start_us", "forward GPU start"),
    ("forward_gpu_end_us", "forward GPU end"),
    ("forward_gpu_span_us", "forward GPU span"),
    ("forward_gpu_busy_us", "forward GPU busy (union of kernels)"),
    ("gpu_end_after_host_end_us", "forward GPU end - host end"),
    ("forward_sync_us", "host sync time inside the forward"),
    ("run_batch_sync_us", "host sync time inside run_batch"),
    ("run_batch_gpu_end_us", "run_batch GPU end (sampling included)"),
    ("decode_step_start_us", "first decode step host start"),
    ("decode_graph_launch_us", "first decode graph launch"),
    ("decode_launch_after_prefill_gpu_end_us", "decode graph launch - prefill GPU end"),
    ("decode_gpu_start_us", "first decode GPU start"),
    ("gpu_idle_before_decode_us", "GPU idle between prefill and decode"),
    ("process_result_start_us", "process_batch_result (prefill) start"),
    ("process_result_sync_us", "host sync time inside process_batch_result (waits for the prefill)"),
    ("first_token_out_us", "process_batch_result end (first token to the detokenizer)"),
)
COUNTS = (("forward_launches", "launches in the forward"), ("forward_gpu_ops", "GPU ops of the forward"),
          ("forward_syncs", "host syncs in the forward"), ("run_batch_syncs", "host syncs in run_batch"),
          ("forward_kernel_names", "distinct kernel names in the forward"))


def build_report(res: dict) -> str:
    """Markdown tables of one probe (``res``: the ``results.json`` object)."""
    meta, per = res["meta"], res["servers"]
    s, r = per.get("stock") or {}, per.get("replay") or {}
    lines = [
        f"### c = 1 cached-prefix TTFT probe: {meta.get('model')} ({meta.get('family')}), stock vs replay "
        f"L={meta.get('window')}",
        "",
        f"commit `{meta.get('commit')}`, {meta.get('date')}, {meta.get('gpu') or meta.get('device')}; servers "
        f"{meta.get('launch')}, measured {meta.get('order')}; bench_serving generated-shared-prefix, 1 group x "
        f"{meta.get('gsp_prompts_per_group')} prompts, system {meta.get('gsp_system_prompt_len')}, question "
        f"{meta.get('gsp_question_len')}, output {meta.get('gsp_output_len')}, c = 1, flushed before; server "
        f"flags: `{meta.get('server_flags')}`" + (f"; replay also `{meta['replay_args']}`" if meta.get("replay_args")
                                                  else ""),
        "",
        "| bench (c = 1) | stock | replay | x |",
        "|---|---:|---:|---:|",
    ]
    sb, rb = s.get("bench") or {}, r.get("bench") or {}
    for key, label in (("mean_ttft_ms", "mean TTFT ms"), ("median_ttft_ms", "median TTFT ms"),
                       ("median_tpot_ms", "median TPOT ms"), ("output_throughput", "out tok/s")):
        a, b = sb.get(key), rb.get(key)
        lines.append(f"| {label} | {_f(a)} | {_f(b)} | {_f(ab._ratio(b, a), '.3f')} |")
    lines.append(f"| hit % | {_f(ab.hit_rate_pct(sb), '.1f')} | {_f(ab.hit_rate_pct(rb), '.1f')} | |")
    lines.append(f"| completed | {sb.get('completed', '—')} | {rb.get('completed', '—')} | |")

    ms, mr = s.get("metrics_split") or {}, r.get("metrics_split") or {}
    if ms or mr:
        lines += ["", "Server-side split (/metrics deltas over the run; mean ms per observation):", "",
                  "| series | n stock | stock ms | n replay | replay ms | replay - stock ms |",
                  "|---|---:|---:|---:|---:|---:|"]
        for key in sorted(set(ms) | set(mr)):
            a, b = ms.get(key) or {}, mr.get(key) or {}
            if not a.get("count") and not b.get("count"):
                continue
            lines.append(f"| `{key.replace('sglang:', '')}` | {_f(a.get('count'), '.0f')} | "
                         f"{_f(a.get('mean_ms'), '.3f')} | {_f(b.get('count'), '.0f')} | {_f(b.get('mean_ms'), '.3f')}"
                         f" | {_d(a.get('mean_ms'), b.get('mean_ms'))} |")

    cmp_ = res.get("ttft_compare")
    if cmp_ and cmp_["per_request"]:
        sm = cmp_["summary"]
        lines += ["", "Per-request TTFT (bench_serving --output-details, same prompts in the same order):", "",
                  "| # | cached (stock/replay) | stock ms | replay ms | replay - stock ms |", "|---:|---|---:|---:|---:|"]
        for x in cmp_["per_request"]:
            c = "/".join("—" if v is None else str(v) for v in x["cached"])
            lines.append(f"| {x['i']} | {c} | {_f(x['stock_ms'])} | {_f(x['replay_ms'])} | {_f(x['diff_ms'], '+.2f')} |")
        if sm.get("hits"):
            lines.append("")
            lines.append(f"Hits ({sm['hits']}): replay - stock median {_f(sm['hit_diff_median_ms'], '+.2f')} ms, "
                         f"mean {_f(sm['hit_diff_mean_ms'], '+.2f')}, min {_f(sm['hit_diff_min_ms'], '+.2f')}, max "
                         f"{_f(sm['hit_diff_max_ms'], '+.2f')}, {sm['hit_diffs_positive']}/{sm['hits']} positive; "
                         f"median hit TTFT {_f(sm['hit_stock_median_ms'])} / {_f(sm['hit_replay_median_ms'])} ms.")

    es, er = s.get("extra_requests") or {}, r.get("extra_requests") or {}
    if es or er:
        lines += ["", f"Cached-prefix /generate without the profiler (client TTFT of a streamed request, "
                      f"median of {max(len(es.get('ttft_ms') or []), len(er.get('ttft_ms') or []))}): stock "
                      f"{_f(es.get('median_ttft_ms'))} ms, replay {_f(er.get('median_ttft_ms'))} ms; cached tokens "
                      f"{es.get('cached_tokens')} / {er.get('cached_tokens')}."]

    ps, pr = (s.get("profile") or {}), (r.get("profile") or {})
    ts_, tr_ = ps.get("summary") or {}, pr.get("summary") or {}
    if ts_ or tr_:
        lines += ["", "Profiled cached-prefix request (ms after the scheduler's `recv_requests` that received it; "
                      f"stock `{ts_.get('extend_step')}`, replay `{tr_.get('extend_step')}`; client TTFT under the "
                      f"profiler {_f((ps.get('request') or {}).get('ttft_ms'))} / "
                      f"{_f((pr.get('request') or {}).get('ttft_ms'))} ms, cached tokens "
                      f"{(ps.get('request') or {}).get('cached_tokens')} / {(pr.get('request') or {}).get('cached_tokens')}):",
                  "", "| event | stock ms | replay ms | replay - stock ms |", "|---|---:|---:|---:|"]
        for key, label in TIMELINE:
            a, b = ts_.get(key), tr_.get(key)
            lines.append(f"| {label} | {_ms(a)} | {_ms(b)} | {_d(a, b, 1e3)} |")
        for key, label in COUNTS:
            a, b = ts_.get(key), tr_.get(key)
            lines.append(f"| {label} (count) | {_f(a, '.0f')} | {_f(b, '.0f')} | {_d(a, b, 1.0, '+.0f')} |")
        for v, t in (("stock", ts_), ("replay", tr_)):
            gaps = t.get("forward_host_gaps") or []
            if gaps:
                lines.append("")
                lines.append(f"Longest host gaps between launches in the {v} forward: " + "; ".join(
                    f"{g['us']:.0f} us ({g['after']} -> {g['before']})" for g in gaps[:4]) + ".")
        ks = {k["name"]: k for k in ts_.get("forward_kernels") or []}
        kr = {k["name"]: k for k in tr_.get("forward_kernels") or []}
        if ks or kr:
            names = sorted(set(ks) | set(kr), key=lambda n: -max((ks.get(n) or {}).get("us", 0.0),
                                                               (kr.get(n) or {}).get("us", 0.0)))
            lines += ["", "Forward kernels by GPU time (each server's top 25; — = not in that server's top 25):", "",
                      "| kernel | n stock | stock us | n replay | replay us |", "|---|---:|---:|---:|---:|"]
            for n in names:
                a, b = ks.get(n) or {}, kr.get(n) or {}
                lines.append(f"| `{n}` | {_f(a.get('count'), '.0f')} | {_f(a.get('us'), '.1f')} | "
                             f"{_f(b.get('count'), '.0f')} | {_f(b.get('us'), '.1f')} |")
    for w in meta.get("warnings", []):
        lines.append(f"WARNING: {w}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- running


def _log(msg: str) -> None:
    print(f"[ttft_probe {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _slim_bench(res: dict) -> dict:
    """A bench_serving result without its bulky per-token lists (``itls``, ``generated_texts``)."""
    return {k: v for k, v in res.items() if k not in ("server_info", "itls", "generated_texts")}


def _profile_one(url: str, v: str, log: Path, args, tokenizer, system: str | None, work: Path, out: Path,
                 dl, warnings: list[str]) -> tuple[dict, dict]:
    """Item 3 for one server: unprofiled cached-prefix requests, then one under the profiler."""
    rng = random.Random(1000 + args.seed)
    extra: dict = {}
    prof: dict = {}
    if system is None:  # no bench prompts: a fresh prefix, cached by a first request
        system = _fresh_text(tokenizer, args.gsp_system_prompt_len, rng)
        seeded = _stream_generate(url, f"{system}\n\n{_fresh_text(tokenizer, args.gsp_question_len, rng)}", 8,
                                  timeout=60)
        prof["prompt"] = {"source": "fresh system prompt, cached by a first request", "seed_request": seeded}
    else:
        prof["prompt"] = {"source": "the run's system prompt (bench_serving's prompts)"}
    prof["prompt"]["system_chars"] = len(system)

    outs = [_stream_generate(url, f"{system}\n\n{_fresh_text(tokenizer, args.gsp_question_len, rng)}",
                             args.profile_new_tokens, timeout=60) for _ in range(args.extra_requests)]
    if outs:
        ttfts = [o.get("ttft_ms") for o in outs]
        extra = {"ttft_ms": ttfts, "median_ttft_ms": _median(ttfts),
                 "cached_tokens": [o.get("cached_tokens") for o in outs],
                 "errors": [o["error"] for o in outs if "error" in o]}
    if args.no_profile or dl.left() - TEARDOWN_RESERVE_S < 25:
        if not args.no_profile:
            warnings.append(f"{v}: profile skipped (time budget)")
        return extra, prof

    folder = work / f"prof_{v}"
    folder.mkdir(exist_ok=True)
    activities = ["CPU"] if args.device == "cpu" else ["CPU", "GPU"]
    log_from = log.stat().st_size if log.exists() else 0
    err = _post(url, "/start_profile", {"output_dir": str(folder), "num_steps": args.profile_steps,
                                        "activities": activities, "with_stack": False, "record_shapes": False},
                timeout=60)
    if err:
        warnings.append(f"{v}: /start_profile failed: {err}")
        prof["error"] = f"start_profile: {err}"
        return extra, prof
    text = f"{system}\n\n{_fresh_text(tokenizer, args.gsp_question_len, rng)}"
    prof["request"] = _stream_generate(url, text, args.profile_new_tokens, timeout=120)
    wait = max(min(90.0, dl.left() - TEARDOWN_RESERVE_S - 5), 5.0)
    path = _wait_for_trace(folder, log, log_from, timeout=min(wait, 30.0))
    if path is None:  # fewer forward steps than asked: stop it by hand
        prof["stopped_by_hand"] = True
        stop_err = _post(url, "/stop_profile", None, timeout=60)
        if stop_err:
            prof["stop_profile_error"] = stop_err
        path = _wait_for_trace(folder, log, log_from, timeout=max(wait - 30.0, 5.0))
    if path is None:
        warnings.append(f"{v}: no trace written in {folder}")
        prof["error"] = "no trace file"
        return extra, prof
    prof["raw_trace_bytes"] = path.stat().st_size
    trace = _read_trace(path)
    prof["summary"] = summ = summarize_trace(trace)
    cached = (prof["request"] or {}).get("cached_tokens")
    if cached is not None and cached < args.gsp_system_prompt_len // 2:
        warnings.append(f"{v}: the profiled request hit only {cached} cached tokens (system prompt "
                        f"{args.gsp_system_prompt_len}): not a cached-prefix prefill")
    if "window_us" in summ:
        a, b = summ["window_us"]
        cut = trim_trace(trace, a - 2000.0, b + 2000.0)
        dst = out / f"trace_{v}.json.gz"
        with gzip.open(dst, "wt") as fh:
            json.dump(cut, fh)
        prof["trace_bytes"] = dst.stat().st_size
        if prof["trace_bytes"] > args.max_trace_mb * 2**20:
            dst.unlink()
            prof["trace_dropped"] = f"{prof['trace_bytes']} bytes > --max-trace-mb {args.max_trace_mb}"
            warnings.append(f"{v}: trace window not kept ({prof['trace_dropped']})")
    return extra, prof


def _measure(v: str, url: str, log: Path, args, ab_args, benv: dict, work: Path, out: Path, vocab: int,
             tokenizer, dl, warnings: list[str]) -> dict:
    """Items 2 and 3 for one ready server."""
    res: dict = {}
    t = time.monotonic()
    if args.warmup_requests:
        ab._warmup({v: url}, args.warmup_requests, args.gsp_system_prompt_len + args.gsp_question_len, vocab,
                   timeout=min(120.0, max(dl.left() - 60, 5.0)))
        ab._warmup_prefix_hit({v: url}, args.gsp_system_prompt_len, args.gsp_question_len, vocab,
                              timeout=min(120.0, max(dl.left() - 60, 5.0)))
    res["warmup_s"] = time.monotonic() - t
    flush_error = ab._flush_cache(url, timeout=min(60.0, max(dl.left() - 40, 1.0)))
    if flush_error:
        warnings.append(f"{v}: radix cache not flushed before the run ({flush_error})")
    res["flushed_before"] = flush_error is None
    try:
        before = parse_metrics(_scrape(url))
    except Exception as e:  # noqa: BLE001
        before = None
        warnings.append(f"{v}: /metrics before the run: {type(e).__name__}: {e}"[:300])
    ofile = work / f"{v}-c1.jsonl"
    cmd = ab.bench_cmd(ab_args, ab_args.model_dir, int(url.rsplit(":", 1)[1]), 1, args.gsp_prompts_per_group, ofile,
                       f"{v}-c1", num_groups=1) + ["--output-details"]
    t = time.monotonic()
    run = ab.run_bench_serving(cmd, ofile, env=benv, cwd=work,
                               timeout=min(max(dl.left() - TEARDOWN_RESERVE_S - 20, 5.0), 240.0))
    res["bench_s"] = time.monotonic() - t
    with open(out / "bench_stdout.log", "a") as fh:
        fh.write(f"\n===== {v}: {' '.join(cmd)}\n{run.text}")
    if run.result is None:
        warnings.append(f"{v}: bench_serving exit {run.rc} (see bench_stdout.log)")
    else:
        if run.rc != 0:
            warnings.append(f"{v}: bench_serving exit {run.rc}, result taken from its {run.source}")
        res["bench"] = _slim_bench(run.result)
        res["ttfts"] = request_ttfts(run.result)
        _log(f"{v}: mean TTFT {run.result.get('mean_ttft_ms') or 0:.2f} ms, median "
             f"{run.result.get('median_ttft_ms') or 0:.2f} ms, hit rate {ab._fmt(ab.hit_rate_pct(run.result))}%")
    try:
        after = parse_metrics(_scrape(url))
        if before is not None:
            res["metrics_split"] = metrics_split(before, after)
        res["metrics_after"] = after
    except Exception as e:  # noqa: BLE001
        warnings.append(f"{v}: /metrics after the run: {type(e).__name__}: {e}"[:300])
    if dl.left() - TEARDOWN_RESERVE_S < 15:
        warnings.append(f"{v}: cached-prefix requests and profile skipped (time budget)")
        return res
    prompts = _load_bench_prompts(Path(benv["HOME"]), args)
    t = time.monotonic()
    res["extra_requests"], res["profile"] = _profile_one(
        url, v, log, args, tokenizer, system_prompt_of(prompts or []), work, out, dl, warnings)
    res["profile_s"] = time.monotonic() - t
    summ = res["profile"].get("summary") or {}
    if summ.get("first_token_out_us") is not None:
        _log(f"{v}: profiled request: forward host {(summ.get('forward_host_us') or 0) / 1e3:.2f} ms, GPU span "
             f"{_ms(summ.get('forward_gpu_span_us'))} ms, first token out at {summ['first_token_out_us'] / 1e3:.2f} ms")
    return res


def main(argv: Sequence[str] | None = None) -> int:
    args, ab_args = parse_args(argv)
    dl = ab._Deadline(args.time_budget)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"replayssm_ttft_probe_{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    (out / "bench_stdout.log").write_text("")
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, ab._on_signal)

    model_cfg = json.loads((ab.ROOT / "tests" / "models" / args.model / "config.json").read_text())
    flags = server_flags(ab_args)
    order = variant_order(args.order)
    meta: dict = {
        "model": args.model, "family": args.family, "window": args.window, "commit": args.commit,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "device": args.device,
        "gpu": ab._gpu_name() if args.device == "cuda" else None, "launch": args.launch, "order": args.order,
        "server_flags": " ".join(flags), "replay_args": args.replay_args, "conv_dtype": ab_args.conv_dtype,
        **{k: getattr(args, k) for k in ("gsp_prompts_per_group", "gsp_system_prompt_len", "gsp_question_len",
                                         "gsp_output_len", "seed", "profile_steps", "profile_new_tokens")},
        "warnings": [],
        "command": " ".join(shlex.quote(a) for a in [sys.executable, "-m", "benchmarks.ttft_probe",
                                                       *(sys.argv[1:] if argv is None else argv)]),
    }
    warnings = meta["warnings"]
    if args.device == "cpu":
        warnings.append("cpu smoke: 'stock' is --ssm-backend replay --replayssm-window 1; CPU activity only; "
                        "the numbers mean nothing")
    servers: dict[str, dict] = {v: {} for v in order}
    timings: dict[str, float] = {}
    procs: dict = {}
    ports: dict[str, int] = {}
    logs = {v: out / f"server_{v}.log" for v in ab.VARIANTS}
    status = 0
    res = {"meta": meta, "timings_s": timings, "servers": servers, "args": vars(args)}

    def write() -> str:
        if all(servers[v].get("ttfts") for v in ab.VARIANTS):
            res["ttft_compare"] = compare_ttfts(servers["stock"]["ttfts"], servers["replay"]["ttfts"])
        report = build_report(res)
        (out / "results.md").write_text(report)
        (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
        return report

    env = {"SGLANG_MAMBA_CONV_DTYPE": ab_args.conv_dtype} if ab_args.conv_dtype else {}
    env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    benv = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1",
                SGLANG_PLUGINS="replayssm")
    import site

    benv.setdefault("PYTHONUSERBASE", site.getuserbase())
    benv["HOME"] = str(work / "home")  # bench_serving's gsp prompt pickle: this run's, shared by both servers
    (work / "home").mkdir(exist_ok=True)

    def start(vs: list[str]) -> None:
        t = time.monotonic()
        for v in vs:
            ports[v] = srv.free_port()
            vargs = ab.variant_args(v, args.window, args.device, args.replay_args)
            procs[v] = srv.launch(Path(args.model_dir), vargs, logs[v], port=ports[v], env=env, base_flags=flags)
            _log(f"started {v} server (pid {procs[v].pid}, port {ports[v]}): {' '.join(vargs)}")
        need = MEASURE_MIN_S * len(vs) + TEARDOWN_RESERVE_S
        ready = ab._wait_ready({v: procs[v] for v in vs}, ports, logs,
                               deadline=time.monotonic() + max(dl.left() - need, 1.0))
        timings.update({f"ready_{v}": s for v, s in ready.items()})
        timings["start_" + "+".join(vs)] = time.monotonic() - t
        for v in vs:
            active = ab.REPLAY_LOG_MARK in logs[v].read_text(errors="replace")
            servers[v]["replay_log_mark"] = active
            if v == "replay" and not active:
                warnings.append(f"replay server log lacks {ab.REPLAY_LOG_MARK!r}: ReplaySSM may not be active")
            if v == "stock" and active and args.device != "cpu":
                warnings.append("stock server log shows ReplaySSM rings: not stock vs replay")
            servers[v]["mamba_radix_cache_strategy"] = ab._strategy_from_log(logs[v])

    try:
        _log(f"generating {args.model} into {args.model_dir} on {args.device}")
        timings["generate"] = ab._generate_model(ab_args, work, min(240.0, dl.left() - TEARDOWN_RESERVE_S))
        with contextlib.suppress(OSError), open(out / "bench_stdout.log", "a") as fh:
            fh.write("===== gen.log\n" + (work / "gen.log").read_text(errors="replace"))
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
        vocab = int(model_cfg["vocab_size"])
        if args.launch == "together":
            start(order)
        for i, v in enumerate(order):
            if args.launch == "sequential":
                if i > 0 and order[i - 1] in procs:
                    ab._stop_all({order[i - 1]: procs.pop(order[i - 1])})
                if dl.left() < MEASURE_MIN_S + TEARDOWN_RESERVE_S + 30:
                    warnings.append(f"{v}: not started (time budget)")
                    continue
                start([v])
            if dl.left() - TEARDOWN_RESERVE_S < MEASURE_MIN_S / 2:
                warnings.append(f"{v}: not measured (time budget)")
                continue
            t = time.monotonic()
            servers[v].update(_measure(v, f"http://127.0.0.1:{ports[v]}", logs[v], args, ab_args, benv, work, out,
                                       vocab, tokenizer, dl, warnings))
            timings[f"measure_{v}"] = time.monotonic() - t
            write()
    except ab._Terminated as e:
        warnings.append(f"terminated by {e}")
        status = 2
    except Exception as e:  # keep whatever was measured
        warnings.append(f"aborted: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
        _log(f"aborted: {type(e).__name__}: {e}")
        status = 1
    finally:
        ab.teardown(procs, _log)
    if any(not servers[v].get("bench") for v in ab.VARIANTS) and status == 0:
        status = 1
    timings["total"] = dl.elapsed()
    report = write()
    print("\n" + report, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
