"""``bench_spec_serving --gpus G`` (one index): all servers on one GPU, each budgeted by arithmetic.

SGLang 0.5.17 budgets a server from the memory free when it profiles: ``rest = free after its weights -
(1 - --mem-fraction-static) x free before them`` (``KVCacheConfigurator._profile_available_bytes``), i.e.
``f x free - weights``.  With the radix cache off the mamba pool comes from ``--max-running-requests``
(the equal-memory plan), and the KV pool is the rest, capped by ``--max-total-tokens``.  So on one GPU
each server is started only after the previous one sized its pools, with ``--max-total-tokens`` for the
requests it can hold and the fraction that makes ``rest`` cover its mamba rows and that KV
(``server_budgets``), read against ``nvidia-smi``'s free memory just before its launch; the CUDA-graph,
activation and context memory of every server comes out of the part none of them budgets
(``PER_SERVER_RESERVE_GIB`` each, checked before anything starts: ``one_gpu_fit``).  Equal memory is
still the mamba rows' (the plan's); the KV pools differ and are each large enough for the server's own
requests, so KV never limits a run.  The runs then take the GPU one server at a time.
"""
from __future__ import annotations

import argparse
import math

GIB = 1 << 30
#: added to the fraction's need: SGLang's own small allocations inside ``rest``, and its pre-load check
#: (the CUDA context and load-time buffers come out of ``f x free`` too): 1.5 failed stock without spec
#: on an H100 (the thirty-third session: qwen3_5_4b, 0.281 given, 0.2995 needed, ~0.7 GiB short)
FRACTION_SLACK_GIB = 3.0
#: per server, outside every fraction: CUDA context, CUDA graphs, activations, cuBLAS / FlashInfer workspaces
PER_SERVER_RESERVE_GIB = 5.0
#: the largest fraction given to a server (SGLang's activations need the rest of what it saw free)
MAX_FRACTION = 0.95


def kv_tokens(running: int, args: argparse.Namespace) -> int:
    """``--max-total-tokens`` for a server holding ``running`` requests: each request's input, output,
    draft tokens and 64 more, plus 8192 (every server of ``bench_spec_serving`` sizes its KV by it)."""
    return running * (args.input_len + args.output_len + args.draft_tokens + 64) + 8192


def server_budgets(args: argparse.Namespace, plan: dict, kv_per_token: int, weights_bytes: int,
                   variants) -> dict:
    """Per variant: running requests, mamba bytes, KV tokens and bytes, and ``need`` (weights + both pools).

    Spec servers hold ``min(M, max concurrency)`` requests (``M`` from ``plan``); stock without spec
    the largest concurrency, one mamba row each (``plan["row_bytes"]["state_conv"]``) plus the padding row.
    """
    top = max(args.concurrency)
    out = {}
    for v in variants:
        if v == "stock_nospec":
            running, mamba = top, (top + 1) * plan["row_bytes"]["state_conv"]
        else:
            running, mamba = min(plan[v]["max_running"], top), plan[v]["bytes"]
        tokens = kv_tokens(running, args)
        kv = tokens * kv_per_token
        out[v] = {"running": running, "mamba_bytes": mamba, "kv_tokens": tokens, "kv_bytes": kv,
                  "need_bytes": weights_bytes + mamba + kv}
    return out


def one_gpu_fit(budgets: dict, free_bytes: int | None) -> dict:
    """Whether every server fits one GPU: the sum of ``need + FRACTION_SLACK_GIB + PER_SERVER_RESERVE_GIB``."""
    need = sum(b["need_bytes"] for b in budgets.values()) + len(budgets) * (FRACTION_SLACK_GIB +
                                                                            PER_SERVER_RESERVE_GIB) * GIB
    return {"need_gib": round(need / GIB, 3), "free_gib": None if free_bytes is None else round(free_bytes / GIB, 3),
            "fits": None if free_bytes is None else need <= free_bytes,
            "per_server_gib": {v: round(b["need_bytes"] / GIB, 3) for v, b in budgets.items()}}


def server_flags(budget: dict, free_bytes: int) -> list[str]:
    """``--mem-fraction-static`` and ``--max-total-tokens`` of one server launched when ``free_bytes`` are free.

    Raises
    ------
    ValueError
        When the fraction would exceed ``MAX_FRACTION`` (what is free cannot hold this server).
    """
    f = (budget["need_bytes"] + FRACTION_SLACK_GIB * GIB) / free_bytes
    if f > MAX_FRACTION:
        raise ValueError(f"one GPU: expected {budget['need_bytes'] / GIB + FRACTION_SLACK_GIB:.1f} GiB to be at most "
                         f"{MAX_FRACTION} of the {free_bytes / GIB:.1f} GiB free, got fraction {f:.3f}")
    return ["--mem-fraction-static", f"{math.ceil(f * 1000) / 1000:.3f}", "--max-total-tokens",
            str(budget["kv_tokens"])]
