"""Where a serving step's GPU time goes: SGLang's torch profiler over a few steady forwards, summarised.

``bench_spec_serving --profile-steps N`` asks each spec server, ``--profile-delay`` seconds into its
run, to profile its next ``N`` forwards (SGLang's ``/start_profile`` with ``num_steps``: the server
stops by itself and writes ``<profile_id>-TP-0.trace.json.gz`` into ``output_dir``).  This module
starts that, waits for the trace, and reduces it to GPU time per kernel class and per kernel: what
a step spends in the SSM verify (ours or SGLang's snapshot path), GEMMs, attention, norms, sampling,
copies, and how long the GPU sat idle between kernels (host gaps).  CUDA-graph replays are traced
kernel by kernel (CUPTI), so graphed steps are covered.

Not a timing of record: the profiler adds overhead around launches (the idle share is an upper
bound), and ``N`` forwards of a running benchmark mix decode / verify steps with the admissions'
prefills, and the trace's ``cudaGraphLaunch`` count is graph replays, not forwards (a speculative
step may replay more than one graph).  It answers "which share", not "how fast".
"""

from __future__ import annotations

import gzip
import json
import re
import time
from pathlib import Path
from typing import Iterable

import requests

#: Kernel classes, first match wins (``re.search`` on the kernel name, case-insensitive).  Our kernels
#: first: their names hold words that later classes also match.
CLASSES: tuple[tuple[str, str], ...] = (
    ("ssm replay (ours)", r"gdn_verify|gdn_replay|mamba2_replay|mamba2_verify|replayssm|_verify_commit|"
                          r"cursor_step"),
    ("ssm conv1d", r"conv1d"),
    ("ssm sglang", r"gated_delta|delta_rule|selective_state|selective_scan|ssd_|chunk_scan|chunk_state|"
                   r"state_passing|mamba|_fwd_kernel_o|solve_tril|l2norm|gdn"),
    ("attention", r"batchprefill|batchdecode|prefillwith|decodewith|mergestates|merge_state|fmha|flash_fwd|"
                  r"flash::|attention|paged"),
    ("gemm", r"gemm|nvjet|xmma|cutlass|cublas|sm90_|matmul|_mm_|splitk|gemv"),
    ("moe", r"moe|expert|topk_softmax|align_block"),
    ("norm", r"norm"),
    ("activation / gate", r"silu|gelu|act_and_mul|sigmoid|swiglu|gate"),
    ("sampling / logits", r"softmax|argmax|sampl|top_k|topk|top_p|verify_tree|greedy|logit|penalt"),
    ("memcpy / memset", r"^memcpy|^memset|^Memcpy|^Memset"),
    ("copy / elementwise", r"elementwise|copy|index|scatter|gather|cat_|catarray|fill|reduce|arange|where|"
                           r"embedding|rotary|rope"),
)
_COMPILED = tuple((name, re.compile(pat, re.IGNORECASE)) for name, pat in CLASSES)
OTHER = "other"
#: Trace event categories that are GPU work.
GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})


def classify(name: str) -> str:
    """The class (``CLASSES``) of a kernel name; ``"other"`` if none matches."""
    for cls, pat in _COMPILED:
        if pat.search(name):
            return cls
    return OTHER


def short_name(name: str, width: int = 60) -> str:
    """A kernel name without template / argument lists, cut to ``width`` characters."""
    out, depth = [], 0
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    s = "".join(out).strip() or name
    s = s.removeprefix("void ")
    return s if len(s) <= width else s[: width - 1] + "…"


def start_profile(url: str, output_dir: str | Path, profile_id: str, num_steps: int,
                  timeout: float = 30.0) -> None:
    """Ask a running SGLang server to profile its next ``num_steps`` forwards (GPU and CPU activities).

    Raises
    ------
    RuntimeError
        The server refused (HTTP status not 200).
    """
    r = requests.post(f"{url}/start_profile", json={
        "output_dir": str(output_dir), "num_steps": int(num_steps), "activities": ["CPU", "GPU"],
        "profile_id": profile_id,
    }, timeout=timeout)
    if r.status_code != 200:
        raise RuntimeError(f"/start_profile answered {r.status_code}: {r.text[:200]}")


def stop_profile(url: str, timeout: float = 60.0) -> None:
    """Ask the server to stop profiling now (SGLang's ``/stop_profile``; it writes what it has)."""
    requests.post(f"{url}/stop_profile", timeout=timeout)


def trace_path(output_dir: str | Path, profile_id: str) -> Path:
    """Where SGLang 0.5.17 writes rank 0's trace for ``profile_id`` (one GPU, no DP / PP / EP)."""
    return Path(output_dir) / f"{profile_id}-TP-0.trace.json.gz"


def wait_trace(path: Path, timeout: float, poll: float = 1.0) -> Path | None:
    """``path`` once it exists and its size has stopped changing, or ``None`` after ``timeout`` s."""
    end, last = time.monotonic() + timeout, -1
    while time.monotonic() < end:
        if path.exists():
            size = path.stat().st_size
            if size == last and size > 0:
                return path
            last = size
        time.sleep(poll)
    return None


def load_events(path: str | Path) -> list[dict]:
    """The ``traceEvents`` of a Chrome trace (``.json`` or ``.json.gz``)."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt") as fh:
        data = json.load(fh)
    return data["traceEvents"] if isinstance(data, dict) else data


def _union_us(intervals: Iterable[tuple[float, float]]) -> float:
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def summarize(events: list[dict]) -> dict:
    """GPU time of a trace by class and by kernel.

    Parameters
    ----------
    events : list of dict
        Chrome trace events (``load_events``); complete events (``"ph": "X"``) of the categories in
        ``GPU_CATEGORIES`` are GPU work, ``cudaGraphLaunch`` runtime calls count the graph replays.

    Returns
    -------
    dict
        ``span_us`` (first GPU event's start to the last one's end), ``busy_us`` (union of GPU
        events), ``idle_pct`` (``1 - busy / span``), ``kernel_us`` (sum of GPU event durations;
        above ``busy_us`` when streams overlap), ``graph_launches``, ``classes`` (``{class: us}``)
        and ``kernels`` (``[{"name", "class", "us", "count"}]``, largest first).
    """
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES and "dur" in e]
    graph_launches = sum(1 for e in events if e.get("ph") == "X" and e.get("name") == "cudaGraphLaunch")
    if not gpu:
        return {"span_us": 0.0, "busy_us": 0.0, "idle_pct": None, "kernel_us": 0.0,
                "graph_launches": graph_launches, "classes": {}, "kernels": []}
    spans = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in gpu]
    span = max(e for _, e in spans) - min(s for s, _ in spans)
    busy = _union_us(spans)
    per: dict[str, dict] = {}
    for e in gpu:
        name = e["name"] if e["cat"] == "kernel" else e["cat"].replace("gpu_", "")
        k = per.setdefault(name, {"name": name, "class": classify(name), "us": 0.0, "count": 0})
        k["us"] += float(e["dur"])
        k["count"] += 1
    kernels = sorted(per.values(), key=lambda k: -k["us"])
    classes: dict[str, float] = {}
    for k in kernels:
        classes[k["class"]] = classes.get(k["class"], 0.0) + k["us"]
    return {"span_us": span, "busy_us": busy, "idle_pct": 100.0 * (1.0 - busy / span) if span > 0 else None,
            "kernel_us": sum(k["us"] for k in kernels), "graph_launches": graph_launches,
            "classes": dict(sorted(classes.items(), key=lambda kv: -kv[1])), "kernels": kernels}


def report_lines(summaries: dict[str, dict], top: int = 12) -> list[str]:
    """Markdown: one column per profiled run (``{label: summarize(...)}``), GPU ms per class and its
    share of the GPU events' sum (kernels, copies and sets), then each run's largest kernels."""
    labels = [k for k, v in summaries.items() if v]
    if not labels:
        return []
    classes: list[str] = []
    for lb in labels:
        classes += [c for c in summaries[lb]["classes"] if c not in classes]

    def cell(lb: str, cls: str) -> str:
        s = summaries[lb]
        us = s["classes"].get(cls)
        return "—" if us is None else f"{us / 1e3:.1f} ({100 * us / s['kernel_us']:.0f}%)"

    lines = ["| GPU ms (share of GPU time) | " + " | ".join(labels) + " |",
             "|---|" + "---:|" * len(labels)]
    lines += [f"| {c} | " + " | ".join(cell(lb, c) for lb in labels) + " |" for c in classes]
    lines.append("| **GPU events, sum** | " + " | ".join(f"{summaries[lb]['kernel_us'] / 1e3:.1f}" for lb in labels) + " |")
    lines.append("| window span ms | " + " | ".join(f"{summaries[lb]['span_us'] / 1e3:.1f}" for lb in labels) + " |")
    lines.append("| GPU idle % of span | " + " | ".join(
        "—" if summaries[lb]["idle_pct"] is None else f"{summaries[lb]['idle_pct']:.1f}" for lb in labels) + " |")
    lines.append("| CUDA graph launches | " + " | ".join(str(summaries[lb]["graph_launches"]) for lb in labels) + " |")
    for lb in labels:
        s = summaries[lb]
        lines += ["", f"{lb}: largest kernels", "", "| kernel | class | ms | launches | share |", "|---|---|---:|---:|---:|"]
        lines += [f"| `{short_name(k['name'])}` | {k['class']} | {k['us'] / 1e3:.2f} | {k['count']} | "
                  f"{100 * k['us'] / s['kernel_us']:.1f}% |" for k in s["kernels"][:top]]
    return lines
