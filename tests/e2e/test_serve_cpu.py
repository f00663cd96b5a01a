"""End to end on CPU: real ``sglang.launch_server --device cpu --ssm-backend replay`` on the tiny models.

The equality and bench_serving test runs on the tiny Nemotron-H (Mamba-2), the tiny Qwen3-Next (GDN,
MoE MLP) and the tiny dense Qwen3.5 (GDN, gated attention output); the refusal tests on the tiny Nemotron-H.

- Greedy outputs (tokens and logprobs) of concurrent requests of different lengths, each decoding
  more than 3 ring cycles at ``L = 16``, equal those of the same server at ``--replayssm-window 1``
  (every step flushes: the conventional update).  A radix-cache hit (copy-on-write of a donated
  slot) and a one-token final prefill chunk are part of the same run.
- ``python -m sglang.bench_serving --backend sglang --dataset-name random-ids`` completes against
  the ``L = 16`` server with the local tokenizer (no hub).
- Bad configurations are refused at startup with a clear message.

Servers listen on 127.0.0.1 only and are killed (process group) at the end of each test.  About
3-4 minutes per model on 2 cores (each server start is ~60 s of imports).
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

import make_model  # noqa: E402
import server as srv  # noqa: E402

pytestmark = pytest.mark.e2e

MAX_NEW = 56  # > 3 ring cycles (48 decode steps) at L = 16
PROMPT_LENS = (5, 37, 130, 16, 300)
RADIX_BASE = 41  # the radix request's cached prefix: the base request's prompt


@pytest.fixture(scope="module")
def nemotron(tmp_path_factory) -> Path:
    return make_model.materialize("nemotron_h_tiny", tmp_path_factory.mktemp("models") / "nemotron_h_tiny")


def _generate(url: str, ids: list[int], n: int) -> tuple[list[int], list[float], int]:
    r = requests.post(
        f"{url}/generate",
        json={
            "input_ids": ids,
            "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True},
            "return_logprob": True,
        },
        timeout=300,
    )
    r.raise_for_status()
    meta = r.json()["meta_info"]
    toks = [t[1] for t in meta["output_token_logprobs"]]
    lps = [t[0] for t in meta["output_token_logprobs"]]
    return toks, lps, int(meta.get("cached_tokens") or 0)


def _workload(url: str) -> dict[str, tuple[list[int], list[float], int]]:
    prompts = {
        f"p{n}": [(7 * i + 3 * j) % 500 + 4 for j in range(n)] for i, n in enumerate(PROMPT_LENS)
    }
    out: dict[str, tuple[list[int], list[float], int]] = {}
    with cf.ThreadPoolExecutor(len(prompts)) as ex:
        futs = {k: ex.submit(_generate, url, p, MAX_NEW + 3 * i) for i, (k, p) in enumerate(prompts.items())}
        out.update({k: f.result() for k, f in futs.items()})
    # Radix hit: a request extending a finished one (prompt + part of its output) copies the cached
    # checkpoint into a fresh slot (copy-on-write, cursors reset) and decodes on from it.  The base
    # request runs alone, after the concurrent ones: while five requests run, the 16-slot mamba pool
    # keeps one slot for the tree, so a prompt node cached then may be evicted before it is matched
    # (which one depends on the arrival order: a CI run once got no hit).
    prompt = [(11 * j) % 500 + 4 for j in range(RADIX_BASE)]
    out["base"] = _generate(url, prompt, MAX_NEW)
    out["radix"] = _generate(url, prompt + out["base"][0][:20], MAX_NEW)
    return out


def _bench_serving(url: str, tokenizer: Path, workdir: Path) -> subprocess.CompletedProcess:
    host, port = url.removeprefix("http://").split(":")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run(
        [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--host", host, "--port", port,
         "--dataset-name", "random-ids", "--tokenizer", str(tokenizer), "--model", str(tokenizer),
         "--num-prompts", "8", "--random-input-len", "64", "--random-output-len", "40",
         "--max-concurrency", "4", "--seed", "1"],
        capture_output=True, text=True, timeout=300, env=env, cwd=workdir,  # its result .jsonl lands there
    )


@pytest.mark.parametrize(
    "model_name,family", [("nemotron_h_tiny", "mamba2"), ("qwen3_next_tiny", "gdn"), ("qwen3_5_tiny", "gdn")]
)
def test_replay_window16_equals_window1_and_bench_serving(
    model_name: str, family: str, tmp_path: Path, tmp_path_factory
):
    model = make_model.materialize(model_name, tmp_path_factory.mktemp("models") / model_name)
    results = {}
    for window in (16, 1):
        # A small chunked-prefill size makes the 130- and 300-token prompts prefill in chunks, the
        # 130-token one ending with a one-token chunk (130 = 43 + 43 + 43 + 1).
        args = ["--ssm-backend", "replay", "--replayssm-window", str(window), "--chunked-prefill-size", "43"]
        log = tmp_path / f"server_L{window}.log"
        with srv.server(model, args, log) as url:
            results[window] = _workload(url)
            if window == 16:
                bench = _bench_serving(url, model, tmp_path)
                assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-3000:]
                assert "Successful requests:                     8" in bench.stdout, bench.stdout[-3000:]
        text = log.read_text()
        assert f"ReplaySSM rings are allocated. family={family}" in text and f"window L={window}" in text
    assert results[16]["radix"][2] == RADIX_BASE, f"expected a {RADIX_BASE}-token radix-cache hit"
    for key, (toks16, lps16, _) in results[16].items():
        toks1, lps1, _ = results[1][key]
        assert toks16 == toks1, f"{key}: greedy tokens differ between L=16 and L=1"
        assert len(toks16) >= MAX_NEW
        diff = max(abs(a - b) for a, b in zip(lps16, lps1))
        assert diff < 1e-4, f"{key}: logprobs differ by {diff}"


def _refused(model: Path, args: list[str], tmp_path: Path, timeout: float = 180) -> str:
    log = tmp_path / "refused.log"
    proc = srv.launch(model, args, log, port=srv.free_port())
    try:
        rc = proc.wait(timeout=timeout)
    finally:
        srv.stop(proc)
    assert rc != 0, log.read_text()[-3000:]
    return log.read_text()


def test_window_below_one_refused(nemotron: Path, tmp_path: Path):
    text = _refused(nemotron, ["--ssm-backend", "replay", "--replayssm-window", "0"], tmp_path)
    assert "expected an integer >= 1" in text


def test_unsupported_family_refused(tmp_path: Path, tmp_path_factory):
    llama = make_model.materialize("llama_tiny", tmp_path_factory.mktemp("models") / "llama_tiny")
    text = _refused(llama, ["--ssm-backend", "replay"], tmp_path)
    assert "--ssm-backend replay supports" in text and "LlamaForCausalLM" in text


def test_builtin_replayssm_flag_refused(nemotron: Path, tmp_path: Path):
    text = _refused(nemotron, ["--ssm-backend", "replay", "--enable-linear-replayssm"], tmp_path)
    assert "--enable-linear-replayssm" in text and "cannot be combined" in text


def test_tp_layout_that_cannot_shard_refused(nemotron: Path, tmp_path: Path):
    # The tiny Nemotron-H has 2 Mamba-2 groups: attention-TP 4 cannot shard them (tp.startup_refusal),
    # refused while the server arguments are resolved, before any process group is set up.
    text = _refused(nemotron, ["--ssm-backend", "replay", "--tp-size", "4"], tmp_path)
    assert "--ssm-backend replay refused" in text and "attention-TP size 4 cannot shard" in text
