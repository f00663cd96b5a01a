"""End to end on CPU: split precision (``--replayssm-read-dtype``) in a real server.

Two ``sglang.launch_server --device cpu --ssm-backend replay`` servers on the tiny Nemotron-H (fp32
model, fp32 checkpoint), started side by side: ``--replayssm-read-dtype bf16`` and ``same``.  A few
short greedy requests, each decoding more than two ring cycles at ``L = 16`` (so decode reads the
copy after prefill refreshes and after kernel flushes):

- the first ``FIRST`` greedy tokens equal, and the per-token logprob differences small (the copy is
  one bf16 rounding of the fp32 checkpoint; it does not accumulate, since the recurrence never reads
  it); the quoted numbers are printed (``-s``);
- the bf16 server logs the copy's allocation and bytes; the ``same`` server allocates none.

``test_read_copy_with_speculative_decoding_refused``: refused at startup with what to change.
Servers listen on 127.0.0.1 only and are killed (process group) at the end.
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

pytestmark = pytest.mark.e2e

MAX_NEW = 40  # > 2 ring cycles at L = 16
FIRST = 12  # greedy tokens that must agree (later ones may diverge after a near-tie)
LOGPROB_TOL = 5e-2  # on the tokens where both servers agree
PROMPT_LENS = (5, 23, 61)


def _generate(url: str, ids: list[int]) -> tuple[list[int], list[float]]:
    r = requests.post(
        f"{url}/generate",
        json={
            "input_ids": ids,
            "sampling_params": {"temperature": 0, "max_new_tokens": MAX_NEW, "ignore_eos": True},
            "return_logprob": True,
        },
        timeout=300,
    )
    r.raise_for_status()
    meta = r.json()["meta_info"]["output_token_logprobs"]
    return [t[1] for t in meta], [t[0] for t in meta]


def _workload(url: str) -> dict[int, tuple[list[int], list[float]]]:
    prompts = {n: [(11 * j + 5 * n) % 500 + 4 for j in range(n)] for n in PROMPT_LENS}
    with cf.ThreadPoolExecutor(len(prompts)) as ex:
        futs = {n: ex.submit(_generate, url, p) for n, p in prompts.items()}
        return {n: f.result() for n, f in futs.items()}


def test_bf16_read_copy_serves_the_same_greedy_tokens(tmp_path: Path, tmp_path_factory):
    model = make_model.materialize("nemotron_h_tiny", tmp_path_factory.mktemp("models") / "nemotron_h_tiny")
    logs = {name: tmp_path / f"server_{name}.log" for name in ("same", "bf16")}
    base = ["--ssm-backend", "replay", "--replayssm-window", "16"]
    with contextlib.ExitStack() as stack:
        ports = {name: srv.free_port() for name in logs}
        procs = {name: srv.launch(model, [*base, "--replayssm-read-dtype", name], logs[name], port=ports[name])
                 for name in logs}
        for proc in procs.values():
            stack.callback(srv.stop, proc)
        for name, proc in procs.items():
            srv.wait_ready(proc, ports[name], logs[name], 240.0)
        results = {name: _workload(f"http://127.0.0.1:{ports[name]}") for name in logs}
    bf16_log = logs["bf16"].read_text()
    assert "ReplaySSM read copy is allocated" in bf16_log and "torch.bfloat16" in bf16_log, bf16_log[-3000:]
    assert "B per slot) beside the torch.float32 checkpoint" in bf16_log
    assert "ReplaySSM read copy is allocated" not in logs["same"].read_text()
    for n in PROMPT_LENS:
        toks_c, lps_c = results["bf16"][n]
        toks_s, lps_s = results["same"][n]
        assert len(toks_c) == len(toks_s) == MAX_NEW
        agree = next((i for i, (a, b) in enumerate(zip(toks_c, toks_s)) if a != b), MAX_NEW)
        diff = max(abs(a - b) for a, b in zip(lps_c[:agree], lps_s[:agree]))
        print(f"prompt {n}: {agree}/{MAX_NEW} greedy tokens equal, max |logprob diff| {diff:.3e} on those")
        assert agree >= FIRST, f"prompt {n}: greedy tokens differ at step {agree}: {toks_c} vs {toks_s}"
        assert diff < LOGPROB_TOL, f"prompt {n}: logprobs differ by {diff}"


def test_read_copy_with_speculative_decoding_refused(tmp_path: Path, tmp_path_factory):
    model = make_model.materialize("nemotron_h_tiny", tmp_path_factory.mktemp("models") / "nemotron_h_tiny")
    log = tmp_path / "refused.log"
    proc = srv.launch(model, ["--ssm-backend", "replay", "--replayssm-read-dtype", "fp8", "--speculative-algorithm",
                              "NGRAM", "--speculative-num-draft-tokens", "4"], log, port=srv.free_port())
    try:
        rc = proc.wait(timeout=180)
    finally:
        srv.stop(proc)
    text = log.read_text()
    assert rc != 0, text[-3000:]
    assert "--replayssm-read-dtype fp8 with speculative decoding" in text, text[-3000:]
    assert "use --replayssm-read-dtype same" in text
