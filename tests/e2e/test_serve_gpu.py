"""End to end on a CUDA GPU (run by the lead on the H200): replay vs stock, CUDA graphs on.

For each tiny model (Nemotron-H: Mamba-2; Qwen3-Next: GDN), the same concurrent greedy workload runs
against

- stock SGLang (``--ssm-backend default``, CUDA graphs on),
- ``--ssm-backend replay --replayssm-window 16`` with CUDA graphs on,
- the same with CUDA graphs off (eager),
- ``--ssm-backend replay --replayssm-window 1`` (every step a flush: the conventional update through
  our kernels, pool and metadata) with CUDA graphs on,

and the greedy tokens must be equal (logprobs close).  Prompts of 230+ tokens decode across the
default radix track interval (256) under the ``extra_buffer`` strategy SGLang picks on a GPU, so the
force-flush of tracked rows is exercised, and the repeated-prefix request reads a tracked state.

All eight servers start at once (one cold compile in wall time; the device is lent by the minute) on
127.0.0.1, each with explicitly sized pools so that they fit side by side.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import sys
from pathlib import Path

import pytest
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

import make_model  # noqa: E402
import server as srv  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.e2e]

# Eight servers share the GPU: 0.08 of the free memory each covers the explicitly sized pools.
GPU_FLAGS = ("--max-mamba-cache-size", "128", "--max-total-tokens", "65536", "--mem-fraction-static", "0.08",
             "--cuda-graph-max-bs", "16")
MAX_NEW = 64
PROMPT_LENS = (5, 37, 130, 16, 230, 260, 7, 99)
# model -> (logprob tolerance, attention backend).  The device payload strips sgl_kernel's FA3 library
# (SGLang's default on H200); FlashInfer has no head_dim 32 kernels (tiny Nemotron-H), Triton has.
MODELS = {"nemotron_h_tiny": (2e-3, "triton"), "qwen3_next_tiny": (5e-2, "flashinfer")}
RUNS = {
    "stock": ["--ssm-backend", "default"],
    "replay_graph": ["--ssm-backend", "replay", "--replayssm-window", "16"],
    "replay_eager": ["--ssm-backend", "replay", "--replayssm-window", "16", "--disable-cuda-graph"],
    "replay_window1": ["--ssm-backend", "replay", "--replayssm-window", "1"],
}


def _generate(url: str, ids: list[int], n: int):
    r = requests.post(f"{url}/generate", json={
        "input_ids": ids,
        "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True},
        "return_logprob": True,
    }, timeout=600)
    r.raise_for_status()
    meta = r.json()["meta_info"]
    return [t[1] for t in meta["output_token_logprobs"]], [t[0] for t in meta["output_token_logprobs"]]


def _workload(url: str):
    prompts = [[(7 * i + 3 * j) % 500 + 4 for j in range(n)] for i, n in enumerate(PROMPT_LENS)]
    with cf.ThreadPoolExecutor(len(prompts)) as ex:
        outs = list(ex.map(lambda ip: _generate(url, ip[1], MAX_NEW + 5 * ip[0]), enumerate(prompts)))
    # a second round reuses cached prefixes (radix hits, copy-on-write into fresh slots)
    outs.append(_generate(url, prompts[4] + outs[4][0][:40], MAX_NEW))
    return outs


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Start every (model, run) server at once, run the workload on each, stop them all."""
    root = tmp_path_factory.mktemp("serve_gpu")
    procs = {}
    with contextlib.ExitStack() as stack:
        for model_name in MODELS:
            model = make_model.materialize(model_name, root / "models" / model_name)
            for run, args in RUNS.items():
                port = srv.free_port()
                log = root / f"{model_name}-{run}.log"
                flags = (*GPU_FLAGS, "--attention-backend", MODELS[model_name][1])
                proc = srv.launch(model, args, log, port=port, base_flags=flags)
                stack.callback(srv.stop, proc)
                procs[model_name, run] = (proc, port, log)
        for proc, port, log in procs.values():
            srv.wait_ready(proc, port, log, timeout=900)
        with cf.ThreadPoolExecutor(len(procs)) as ex:
            futures = {key: ex.submit(_workload, f"http://127.0.0.1:{port}") for key, (_, port, _) in procs.items()}
            out = {key: f.result() for key, f in futures.items()}
    logs = {key: log.read_text() for key, (_, _, log) in procs.items()}
    return out, logs


@pytest.mark.parametrize("model_name", list(MODELS))
def test_replay_equals_stock_with_cuda_graphs(model_name: str, results):
    out, logs = results
    tol = MODELS[model_name][0]
    for run in RUNS:
        if run != "stock":
            assert "ReplaySSM rings are allocated" in logs[model_name, run], f"{model_name} {run}: no rings"
    stock = out[model_name, "stock"]
    for run in ("replay_graph", "replay_eager", "replay_window1"):
        for i, ((toks, lps), (toks0, lps0)) in enumerate(zip(out[model_name, run], stock)):
            assert toks == toks0, f"{model_name} {run} request {i}: greedy tokens differ from stock"
            diff = max(abs(a - b) for a, b in zip(lps, lps0))
            print(f"{model_name} {run} request {i}: max |logprob diff| vs stock {diff:.3g}")
            assert diff < tol, f"{model_name} {run} request {i}: logprobs differ from stock by {diff}"
    graph, eager = out[model_name, "replay_graph"], out[model_name, "replay_eager"]
    assert [t for t, _ in graph] == [t for t, _ in eager]
