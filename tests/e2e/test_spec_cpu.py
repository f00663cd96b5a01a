"""End to end on CPU: speculative decoding with ``--ssm-backend replay`` gives the greedy tokens of the same
server without speculation, at full, partial and near-zero acceptance, over > 3 ring cycles (L = 16).

The speculative server runs ``--speculative-algorithm REPLAYSSM_ORACLE`` (``spec_oracle/``, a test-only
plug-in loaded through its own entry point): its drafts for each prompt are the reference server's
output, each token made wrong with the prompt's chosen rate (0: full acceptance, 0.35: partial,
1: none).  Acceptance is therefore known in advance: every request's number of verify steps must equal
``expected_verify_steps`` (the count a correct server takes) and its reported accept length must lie in
its level's range; tokens must equal the reference's.  Both servers (L = 16, T = 4) serve the six
requests (prompts of 5 and 130 tokens per level, 64 and 67 new tokens) concurrently; one verify forward
mixes all levels.  The CPU path is SGLang's own verify flow plus the shims of
``sglang_replayssm/hooks/cpu_spec.py``; the algorithm choice is argued in
``benchmarks/notes/spec_algorithms.md``.

Also: built-in algorithms on CPU and tree drafts with ``--replayssm-verify replay`` are refused at
startup with what to change.  About 50 s per model on 2 cores (two servers at once).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import sys
from pathlib import Path

import pytest
import requests

HERE = Path(__file__).resolve().parent
ORACLE_DIR = HERE / "spec_oracle"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "models"))
sys.path.insert(0, str(ORACLE_DIR))

import make_model  # noqa: E402
import replayssm_spec_oracle as oracle  # noqa: E402
import server as srv  # noqa: E402

pytestmark = pytest.mark.e2e

T = 4  # --speculative-num-draft-tokens
MAX_NEW = 64  # > 3 ring cycles at L = 16
PROMPT_LENS = (5, 130)
#: wrong-draft rate and the accepted-tokens-per-verify range (bonus included) each level must show
LEVELS: dict[str, tuple[float, tuple[float, float]]] = {
    "full": (0.0, (3.5, 4.0)),
    "partial": (0.35, (1.4, 3.2)),
    "near_zero": (1.0, (1.0, 1.05)),
}
#: SGLang caps running requests at mamba slots / 3 (radix cache): 32 slots let all six run together.
#: An idle SGLang scheduler busy-polls unless told to sleep; the two servers share 2 cores.
SERVER = ["--ssm-backend", "replay", "--max-mamba-cache-size", "32"]


def _prompts() -> dict[str, list[int]]:
    return {
        f"{level}-{n}": [(7 * i + 3 * j + 101 * k) % 500 + 4 for j in range(n)]
        for k, level in enumerate(LEVELS) for i, n in enumerate(PROMPT_LENS)
    }


def _rate(key: str) -> float:
    return LEVELS[key.split("-")[0]][0]


def _generate(url: str, ids: list[int], n: int) -> tuple[list[int], dict]:
    r = requests.post(
        f"{url}/generate",
        json={"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}},
        timeout=600,
    )
    r.raise_for_status()
    out = r.json()
    return out["output_ids"], out["meta_info"]


def _run_all(url: str, prompts: dict[str, list[int]]) -> dict[str, tuple[list[int], dict]]:
    with cf.ThreadPoolExecutor(len(prompts)) as ex:
        futs = {key: ex.submit(_generate, url, p, MAX_NEW + 3 * (i % len(PROMPT_LENS)))
                for i, (key, p) in enumerate(prompts.items())}
        return {key: f.result() for key, f in futs.items()}


def _oracle_env(path: Path) -> dict[str, str]:
    return {
        "SGLANG_PLUGINS": "replayssm,replayssm_spec_oracle",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ORACLE_DIR), os.environ.get("PYTHONPATH")])),
        oracle.ENV: str(path),
    }


@pytest.mark.parametrize("model_name", ["nemotron_h_tiny", "qwen3_next_tiny", "qwen3_5_tiny"])
def test_spec_tokens_equal_no_spec_at_controlled_acceptance(model_name: str, tmp_path: Path, tmp_path_factory):
    model = make_model.materialize(model_name, tmp_path_factory.mktemp("models") / model_name)
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    prompts = _prompts()
    oracle_file = tmp_path / "oracle.json"  # written once the reference has run
    spec = ["--speculative-algorithm", oracle.ALGORITHM, "--speculative-num-draft-tokens", str(T)]
    with srv.server(model, SERVER, tmp_path / "reference.log") as ref_url, \
            srv.server(model, [*SERVER, *spec], tmp_path / "spec.log", env=_oracle_env(oracle_file)) as spec_url:
        reference = _run_all(ref_url, prompts)
        entries = [{"prompt": prompts[key], "reference": reference[key][0], "rate": _rate(key), "seed": seed}
                   for seed, key in enumerate(prompts)]
        oracle_file.write_text(json.dumps({"entries": entries}))
        speculative = _run_all(spec_url, prompts)
    for entry, key in zip(entries, prompts, strict=True):
        ref_tokens = entry["reference"]
        tokens, meta = speculative[key]
        assert len(ref_tokens) >= MAX_NEW
        assert tokens == ref_tokens, f"{key}: speculative tokens differ from the no-spec server's"
        expected = oracle.expected_verify_steps(ref_tokens, entry["rate"], entry["seed"], vocab, T, len(ref_tokens))
        assert meta["spec_verify_ct"] == expected, f"{key}: {meta['spec_verify_ct']} verify steps, expected {expected}"
        low, high = LEVELS[key.split("-")[0]][1]
        assert low <= meta["spec_accept_length"] <= high, f"{key}: accept length {meta['spec_accept_length']}"


def _refused(model: Path, args: list[str], log: Path) -> str:
    proc = srv.launch(model, args, log, port=srv.free_port())
    try:
        rc = proc.wait(timeout=180)
    finally:
        srv.stop(proc)
    text = log.read_text()
    assert rc != 0, text[-3000:]
    return text


def test_builtin_algorithm_on_cpu_and_forced_replay_on_trees_refused(tmp_path: Path):
    root = tmp_path / "models"
    model = make_model.materialize("nemotron_h_tiny", root / "nemotron_h_tiny")
    draft = make_model.materialize("llama_tiny", root / "llama_tiny")
    standalone = ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", str(draft),
                  "--speculative-draft-load-format", "dummy", "--speculative-num-steps", "3",
                  "--speculative-num-draft-tokens", "4"]
    text = _refused(model, ["--ssm-backend", "replay", *standalone, "--speculative-eagle-topk", "1"],
                    tmp_path / "linear.log")
    assert "--ssm-backend replay refused: speculative decoding on --device cpu with STANDALONE" in text
    assert "plug-in-registered algorithm" in text
    text = _refused(model, ["--ssm-backend", "replay", "--replayssm-verify", "replay", *standalone,
                            "--speculative-eagle-topk", "2"], tmp_path / "tree.log")
    assert "--replayssm-verify replay cannot serve tree drafts (--speculative-eagle-topk 2 > 1)" in text
