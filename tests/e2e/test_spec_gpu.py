"""End to end on a CUDA GPU (run by the lead on the H200): speculative decoding with ``--ssm-backend replay``.

Algorithm: STANDALONE with the tiny Llama (``tests/models/llama_tiny``, same 512-token vocabulary, dummy
weights, attention heads of 64 for FlashInfer) as the draft model, ``--speculative-eagle-topk 1``
(linear chains), 3 steps / 4 draft tokens; it needs no MTP head in the target
(``benchmarks/notes/spec_algorithms.md``).  The random draft gives near-zero acceptance; the accept
lengths the server reports are printed.  Target: the tiny Nemotron-H (Mamba-2)
and the tiny Qwen3-Next (GDN) in bf16 with FlashInfer attention (as ``test_serve_gpu.py``).

Servers, all started at once: replay + spec (``--replayssm-verify replay``, CUDA graphs on: TARGET_VERIFY
graphs of every bucket), replay + spec eager, replay + spec ``auto`` (every bucket of the tiny models goes
to the snapshot fallback), replay without spec, stock + spec, and the replay verify and ``auto`` with a
bf16 read copy under ``SGLANG_REPLAYSSM_CHECK_READ_COPY=1`` (the copy equals ``quantize_rows`` of its
checkpoint before every forward, else the server stops: asserted through its log; their tokens are
printed only, ``test_read_copy_gpu.py`` says why).
Checked one request at a time (concurrent runs are printed only): replay + spec with graphs gives
the same tokens as without graphs; ``auto`` (snapshot fallback) gives exactly stock + spec's tokens;
replay + spec parts from stock + spec only late, if at all (bf16: the verify kernels sum in another
order than SGLang's); spec vs no spec is printed only (stock + spec parts from no spec early too);
requests run long enough for > 3 ring cycles at L = 16.  Radix tracking is off (``no_buffer``): the
replay verify refuses ``extra_buffer``.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import sys
from pathlib import Path

import pytest
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

import make_model  # noqa: E402
import server as srv  # noqa: E402

from sglang_replayssm.read_copy_check import ENV_VAR as CHECK_ENV  # noqa: E402

MODEL_DIR = Path(make_model.__file__).resolve().parent
pytestmark = [pytest.mark.gpu, pytest.mark.e2e]

# Pools sized explicitly; the fraction is the margin of SGLang's pre-load check (test_serve_gpu.py).
GPU_FLAGS = ("--dtype", "bfloat16", "--max-mamba-cache-size", "64", "--max-total-tokens", "32768",
             "--mem-fraction-static", "0.25", "--cuda-graph-max-bs", "8", "--attention-backend", "flashinfer",
             "--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule")
MODELS = ("nemotron_h_tiny", "qwen3_next_tiny", "qwen3_5_tiny")
CONFIG_OVERRIDES = {"nemotron_h_tiny": {"head_dim": 64}}
ENV = {"SGLANG_MAMBA_CONV_DTYPE": "bfloat16"}
MAX_NEW = 64  # > 3 ring cycles at L = 16 even at full acceptance
PROMPT_LENS = (5, 37, 130, 16)
MIN_COMMON = 8


def _spec(draft: Path) -> list[str]:
    # make_model writes no weights for the tiny Llama: random (dummy) draft weights, near-zero acceptance
    return ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", str(draft),
            "--speculative-draft-load-format", "dummy", "--speculative-num-steps", "3",
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def _runs(draft: Path) -> dict[str, list[str]]:
    replay = ["--ssm-backend", "replay", "--replayssm-window", "16", "--replayssm-verify", "replay"]
    return {
        "replay_spec": replay + _spec(draft),
        "replay_spec_eager": replay + _spec(draft) + ["--disable-cuda-graph"],
        "replay_nospec": replay,
        # auto without a probe: the byte model finds the tiny models launch-bound, so every bucket takes
        # SGLang's snapshot verify behind the ring (the snapshot fallback: fold, stock verify, stock commit)
        "replay_spec_auto": ["--ssm-backend", "replay", "--replayssm-window", "16"] + _spec(draft),
        "stock_spec": ["--ssm-backend", "default"] + _spec(draft),
        # split precision under speculation, with the in-server copy check (read_copy_check): the replay
        # verify (its flush rows refresh the copy) and the snapshot fallback (the commit refreshes it)
        "replay_spec_copy": replay + _spec(draft) + ["--replayssm-read-dtype", "bf16"],
        "replay_spec_auto_copy": ["--ssm-backend", "replay", "--replayssm-window", "16", "--replayssm-read-dtype",
                                  "bf16"] + _spec(draft),
    }


def _generate(url: str, ids: list[int], n: int):
    r = requests.post(f"{url}/generate", json={
        "input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True},
    }, timeout=600)
    r.raise_for_status()
    out = r.json()
    return out["output_ids"], out["meta_info"].get("spec_accept_length")


def _workload(url: str, concurrent: bool):
    prompts = [[(7 * i + 3 * j) % 500 + 4 for j in range(n)] for i, n in enumerate(PROMPT_LENS)]
    with cf.ThreadPoolExecutor(len(prompts) if concurrent else 1) as ex:
        return list(ex.map(lambda p: _generate(url, p, MAX_NEW), prompts))


@pytest.fixture(scope="module", params=MODELS)
def results(request, tmp_path_factory):
    """One model's servers, started at once (``-k <model>`` runs one model: 5 servers)."""
    name = request.param
    root = tmp_path_factory.mktemp("spec_gpu")
    # FlashInfer has no head_dim 16 kernels (the tiny Llama's 64 / 4): heads of 64, as for the targets.
    draft_config = json.loads((MODEL_DIR / "llama_tiny" / "config.json").read_text()) | {"head_dim": 64}
    draft = make_model.materialize("llama_tiny", root / "models" / "llama_tiny", config=draft_config)
    procs = {}
    with contextlib.ExitStack() as stack:
        config = json.loads((MODEL_DIR / name / "config.json").read_text())
        config.update(CONFIG_OVERRIDES.get(name, {}))
        model = make_model.materialize(name, root / "models" / name, config=config)
        for run, args in _runs(draft).items():
            port, log = srv.free_port(), root / f"{name}-{run}.log"
            env = ENV | ({CHECK_ENV: "1"} if run.endswith("_copy") else {})
            proc = srv.launch(model, args, log, port=port, base_flags=GPU_FLAGS, env=env)
            stack.callback(srv.stop, proc)
            procs[name, run] = (proc, port, log)
        for proc, port, log in procs.values():
            srv.wait_ready(proc, port, log, timeout=400)
        # one request at a time (no batch-composition noise), then all at once
        out = {}
        with cf.ThreadPoolExecutor(len(procs)) as ex:
            for mode in ("seq", "conc"):
                futures = {(*key, mode): ex.submit(_workload, f"http://127.0.0.1:{port}", mode == "conc")
                           for key, (_, port, _) in procs.items()}
                out.update({key: f.result() for key, f in futures.items()})
    logs = {key: log.read_text() for key, (_, _, log) in procs.items()}
    return name, out, logs


def _first_diff(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def test_replay_spec_matches_no_spec_and_stock_spec(results):
    model_name, out, logs = results
    assert "ReplaySSM verify bs=" in logs[model_name, "replay_spec"]  # the per-bucket plan was logged
    assert ": snapshot (" in logs[model_name, "replay_spec_auto"]
    for run in ("replay_spec_copy", "replay_spec_auto_copy"):
        # the copy equalled quantize_rows of its checkpoint before every forward, verify graphs included
        assert "ReplaySSM read copy is allocated" in logs[model_name, run], f"{model_name} {run}"
        assert "(verify graph)" in logs[model_name, run], f"{model_name} {run}: no check before a verify graph"
    for mode in ("seq", "conc"):
        toks = {run: [t for t, _ in out[model_name, run, mode]] for run in _runs(Path("d"))}
        for run in toks:
            accepts = [a for _, a in out[model_name, run, mode]]
            firsts = [_first_diff(x, y) for x, y in zip(toks[run], toks["replay_nospec"])]
            print(f"TABLE {model_name} {mode} {run}: accept lengths {accepts}; first divergence vs replay_nospec "
                  f"{firsts}")
    # Checked one request at a time: concurrent batches differ between runs (bf16 batch-composition
    # noise, as in test_serve_gpu.py), so only the sequential pass is compared.
    toks = {run: [t for t, _ in out[model_name, run, "seq"]] for run in _runs(Path("d"))}
    assert toks["replay_spec"] == toks["replay_spec_eager"]
    # auto sends every bucket of the tiny models to SGLang's snapshot verify behind an exact fold:
    # the same kernels and states as stock + spec.
    assert toks["replay_spec_auto"] == toks["stock_spec"]
    # Replay verify vs stock's snapshot verify: the same forward shapes, only the SSM verify differs.
    # (Spec vs no spec is printed, not asserted: a verify forward runs other attention and GEMM
    # shapes than decode, and stock + spec itself parted from no spec at tokens 4-5 on the random
    # tiny Nemotron-H in bf16, benchmarks/RESULTS.md.)
    for x, y in zip(toks["replay_spec"], toks["stock_spec"]):
        first = _first_diff(x, y)
        assert first is None or first >= MIN_COMMON, f"{model_name}: replay_spec parts from stock_spec at {first}"
