"""End to end on a CUDA GPU (run by the lead on the H200): replay vs stock, CUDA graphs on.

For each tiny model (Nemotron-H: Mamba-2; Qwen3-Next: GDN), in bf16, the same concurrent greedy
workload runs against stock SGLang (``--ssm-backend default``) with and without CUDA graphs, and
``--ssm-backend replay`` at L=16 with and without CUDA graphs and at L=1 (every step a flush: the
conventional update through our kernels, pool and metadata).  Replay with CUDA graphs must give the
same tokens as replay without; against stock, greedy paths may part only late and logprobs on the
common prefix stay close (the table of divergences is printed, stock graph vs stock eager as the
noise floor of bf16 serving).  Prompts of 230+ tokens decode across the default radix track interval
(256) under the ``extra_buffer`` strategy SGLang picks on a GPU, so the force-flush of tracked rows
is exercised, and the repeated-prefix request reads a tracked state.

All eleven servers (ten, plus SGLang's built-in GDN ReplaySSM as a noise floor) start at once (one
cold compile in wall time; the device is lent by the minute) on 127.0.0.1, each with explicitly sized
pools so that they fit side by side.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import os
import sys
from pathlib import Path

import pytest
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

import make_model  # noqa: E402
MODEL_DIR = Path(make_model.__file__).resolve().parent
import server as srv  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.e2e]

# Eleven servers share the GPU; their pools are sized explicitly (SGLang 0.5.17 takes the smaller of
# --max-total-tokens and the profiled capacity), so --mem-fraction-static is only the margin of SGLang's
# pre-load check (rest = available - (1 - fraction) * free before the weights must be > 0), which the
# other servers' allocations during a server's start eat into: 0.08 failed on an 80 GiB H100 (the
# thirty-second session: 9% of the free memory went to the others in the window).
GPU_FLAGS = ("--dtype", "bfloat16", "--max-mamba-cache-size", "128", "--max-total-tokens", "65536", "--mem-fraction-static", "0.25",
             "--cuda-graph-max-bs", "16", "--attention-backend", "flashinfer")
MAX_NEW = 64
PROMPT_LENS = (5, 37, 130, 16, 230, 260, 7, 99)
# The radix-hit request: prompt RADIX_SOURCE's prompt and its first RADIX_CARRY output tokens.
RADIX_SOURCE, RADIX_CARRY = 4, 40
# FlashInfer attention: the device payload strips sgl_kernel's FA3 library (SGLang's default on H200).
# FlashInfer has no fp32 or head_dim 32 kernels and SGLang refuses Triton attention for NemotronH, so the
# models run in bf16 (conv state bf16, SGLang's GPU default) and the tiny Nemotron-H gets attention heads
# of 64 here (its SSM layers are unchanged).
MODELS = ("nemotron_h_tiny", "qwen3_next_tiny", "qwen3_5_tiny")
# A time-limited device call may run a subset: comma lists of MODELS / run names ("stock" and the
# replay_graph / replay_eager pair are always kept; the assertions skip the runs left out).
SUBSET_MODELS = os.environ.get("REPLAYSSM_E2E_MODELS")
SUBSET_RUNS = os.environ.get("REPLAYSSM_E2E_RUNS")
ENV = {"SGLANG_MAMBA_CONV_DTYPE": "bfloat16"}
MIN_COMMON = 8
LOGPROB_TOL = 0.1
CONFIG_OVERRIDES = {"nemotron_h_tiny": {"head_dim": 64}}
RUNS = {
    "stock": ["--ssm-backend", "default"],
    "stock_eager": ["--ssm-backend", "default", "--disable-cuda-graph"],
    "replay_graph": ["--ssm-backend", "replay", "--replayssm-window", "16"],
    "replay_eager": ["--ssm-backend", "replay", "--replayssm-window", "16", "--disable-cuda-graph"],
    "replay_window1": ["--ssm-backend", "replay", "--replayssm-window", "1"],
}
# SGLang's own GDN ReplaySSM decode (L = 16, fp32 ring; it needs the no_buffer strategy): its distance
# from stock is the noise floor of reordering GDN's fp32 sums on this model.  At commit 5ff4ed4 our
# L = 16 parted from stock only late (tokens 48-69) but with logprob diffs up to 0.198 on the common
# prefix at batch 1 (benchmarks/RESULTS.md), above LOGPROB_TOL; the built-in run tells whether that
# is this model's sensitivity or ours.
EXTRA_RUNS = {
    "qwen3_next_tiny": {
        "builtin_replay": ["--ssm-backend", "default", "--enable-linear-replayssm", "--linear-replayssm-cache-len",
                           "16", "--mamba-radix-cache-strategy", "no_buffer",
                           "--disable-overlap-schedule"],  # SGLang refuses no_buffer with the overlap scheduler
    },
}
#: Our replay may be this many times further from stock than the built-in ReplaySSM (when run) or stock
#: eager is from stock with CUDA graphs.
FLOOR_FACTOR = 2.0


def _models() -> tuple[str, ...]:
    return tuple(SUBSET_MODELS.split(",")) if SUBSET_MODELS else MODELS


def _runs(model_name: str) -> dict[str, list[str]]:
    runs = RUNS | EXTRA_RUNS.get(model_name, {})
    if SUBSET_RUNS:
        keep = set(SUBSET_RUNS.split(",")) | {"stock", "replay_graph", "replay_eager"}
        runs = {k: v for k, v in runs.items() if k in keep}
    return runs


def _generate(url: str, ids: list[int], n: int):
    r = requests.post(f"{url}/generate", json={
        "input_ids": ids,
        "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True},
        "return_logprob": True,
    }, timeout=600)
    r.raise_for_status()
    meta = r.json()["meta_info"]
    return [t[1] for t in meta["output_token_logprobs"]], [t[0] for t in meta["output_token_logprobs"]]


def _workload(url: str, concurrent: bool = True):
    prompts = [[(7 * i + 3 * j) % 500 + 4 for j in range(n)] for i, n in enumerate(PROMPT_LENS)]
    with cf.ThreadPoolExecutor(len(prompts) if concurrent else 1) as ex:
        outs = list(ex.map(lambda ip: _generate(url, ip[1], MAX_NEW + 5 * ip[0]), enumerate(prompts)))
    # a second round reuses cached prefixes (radix hits, copy-on-write into fresh slots)
    outs.append(_generate(url, prompts[RADIX_SOURCE] + outs[RADIX_SOURCE][0][:RADIX_CARRY], MAX_NEW))
    return outs


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Start every (model, run) server at once, run the workload on each, stop them all."""
    root = tmp_path_factory.mktemp("serve_gpu")
    procs = {}
    with contextlib.ExitStack() as stack:
        for model_name in _models():
            config = json.loads((MODEL_DIR / model_name / "config.json").read_text())
            config.update(CONFIG_OVERRIDES.get(model_name, {}))
            model = make_model.materialize(model_name, root / "models" / model_name, config=config)
            for run, args in _runs(model_name).items():
                port = srv.free_port()
                log = root / f"{model_name}-{run}.log"
                proc = srv.launch(model, args, log, port=port, base_flags=GPU_FLAGS, env=ENV)
                stack.callback(srv.stop, proc)
                procs[model_name, run] = (proc, port, log)
        for proc, port, log in procs.values():
            srv.wait_ready(proc, port, log, timeout=900)
        # one request at a time first (batch 1: no batch-composition noise), then all at once
        with cf.ThreadPoolExecutor(len(procs)) as ex:
            futures = {(*key, "seq"): ex.submit(_workload, f"http://127.0.0.1:{port}", False)
                       for key, (_, port, _) in procs.items()}
            out = {key: f.result() for key, f in futures.items()}
            futures = {(*key, "conc"): ex.submit(_workload, f"http://127.0.0.1:{port}")
                       for key, (_, port, _) in procs.items()}
            out.update({key: f.result() for key, f in futures.items()})
    logs = {key: log.read_text() for key, (_, _, log) in procs.items()}
    return out, logs


def _compare(run, base):
    """Per request: (first differing token index or None, max |logprob diff| on the common prefix).

    The radix-hit request (the last) is left out where the two servers gave it different prompts: its
    prompt carries request ``RADIX_SOURCE``'s first ``RADIX_CARRY`` output tokens of the same server."""
    if len(run) > len(PROMPT_LENS) and run[RADIX_SOURCE][0][:RADIX_CARRY] != base[RADIX_SOURCE][0][:RADIX_CARRY]:
        run, base = run[: len(PROMPT_LENS)], base[: len(PROMPT_LENS)]
    rows = []
    for (toks, lps), (toks0, lps0) in zip(run, base):
        first = next((i for i, (a, b) in enumerate(zip(toks, toks0)) if a != b), None)
        common = len(toks) if first is None else first
        rows.append((first, max((abs(a - b) for a, b in zip(lps[:common], lps0[:common])), default=0.0)))
    return rows


@pytest.mark.parametrize("model_name", list(MODELS))
def test_replay_matches_stock_with_cuda_graphs(model_name: str, results):
    if model_name not in _models():
        pytest.skip(f"{model_name} not in REPLAYSSM_E2E_MODELS={SUBSET_MODELS}")
    out, logs = results
    runs = _runs(model_name)
    for run in runs:
        if run.startswith("replay"):
            assert "ReplaySSM rings are allocated" in logs[model_name, run], f"{model_name} {run}: no rings"
    for mode in ("seq", "conc"):
        stock = out[model_name, "stock", mode]
        for run in runs:
            if run != "stock":
                rows = _compare(out[model_name, run, mode], stock)
                same = sum(first is None for first, _ in rows)
                firsts = [first for first, _ in rows if first is not None]
                print(f"TABLE {model_name} {mode} {run} vs stock: {same}/{len(rows)} token-identical, first "
                      f"divergences {firsts}, max |logprob diff| on common prefixes {max(d for _, d in rows):.3g}")
        rows = _compare(out[model_name, "replay_graph", mode], out[model_name, "replay_eager", mode])
        print(f"TABLE {model_name} {mode} replay_graph vs replay_eager: first divergences "
              f"{[f for f, _ in rows]}, max |logprob diff| {max(d for _, d in rows):.3g}")
    table = {run: _compare(out[model_name, run, "seq"], out[model_name, "stock", "seq"]) for run in runs}
    tol = LOGPROB_TOL
    # Noise floors: SGLang's built-in ReplaySSM (when run), and stock's own eager vs graph distance (the
    # thirty-fourth session, H100: qwen3_5_tiny stock_eager parted from stock by 0.101 on a common prefix).
    for floor in ("builtin_replay", "stock_eager"):
        floor_tol = FLOOR_FACTOR * max(d for _, d in table[floor]) if floor in table else 0.0
        if floor_tol > tol:
            tol = floor_tol
            print(f"TABLE {model_name} logprob tolerance {tol:.3g} ({floor} as the noise floor)")
    # One request at a time, CUDA graphs change nothing in our path.
    assert [t for t, _ in out[model_name, "replay_graph", "seq"]] == [t for t, _ in out[model_name, "replay_eager", "seq"]]
    # bf16 activations: replay computes outputs in another order than SGLang's kernel, so greedy
    # paths may part late (as stock graph vs stock eager may); a wrong ring or checkpoint parts early.
    # A request where stock eager already parts from stock graph at or before replay's divergence is a
    # near-tie that stock itself does not resolve one way (the thirty-third session, H100: qwen3_5_tiny
    # request 8 parted at token 5 in stock_eager, replay_graph and replay_eager alike); it is exempt
    # from MIN_COMMON, not from the logprob bound.
    stock_firsts = [first for first, _ in table.get("stock_eager", ())]
    for run in ("replay_graph", "replay_window1"):
        for i, (first, diff) in enumerate(table.get(run, ())):
            tie = i < len(stock_firsts) and stock_firsts[i] is not None and first is not None and stock_firsts[i] <= first
            assert first is None or first >= MIN_COMMON or tie, f"{model_name} {run} request {i}: diverged at token {first}"
            assert diff < tol, f"{model_name} {run} request {i}: logprob diff {diff} on the common prefix"
