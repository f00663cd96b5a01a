"""End to end on CPU: split precision (``--replayssm-read-dtype``) in a real server.

Two ``sglang.launch_server --device cpu --ssm-backend replay`` servers (fp32 model, fp32 checkpoint),
started side by side: ``--replayssm-read-dtype same`` and a copy, on the tiny Nemotron-H (Mamba-2,
bf16 copy) and the tiny Qwen3-Next (GDN, fp8 copy).  A few short greedy requests, each decoding more
than two ring cycles at ``L = 16`` (so decode reads the copy after prefill refreshes and after kernel
flushes):

- the first ``FIRST`` greedy tokens equal, and the per-token logprob differences (on the tokens both
  agree on) below ``tol``: the copy is one rounding of the fp32 checkpoint and does not accumulate,
  since the recurrence never reads it.  Measured (``-s``): Nemotron-H bf16 2.0e-4 / 7.5e-4 / 3.3e-4
  (40/40 tokens equal); Qwen3-Next bf16 2.8e-3 / 2.6e-3 / 4.7e-3 (40/40); Qwen3-Next fp8 4.7e-2
  (40/40) and 2.6e-1 (23/40 equal) on the random tiny model, hence its loose ``tol``.  A stale copy
  diverges at once: with the refresh after prefill disabled, Nemotron-H bf16 differed at token 1.
- the copy's server logs its allocation and bytes, and checks the copy against its checkpoint before
  every forward (``SGLANG_REPLAYSSM_CHECK_READ_COPY=1``, ``sglang_replayssm.read_copy_check``); the
  ``same`` server allocates none.

A copy with speculative decoding is served on the GPU only (no SGLang speculative algorithm runs on a
CPU); the verify kernels' copy is tested in tests/kernels and tests/integration/test_spec_verify.py.
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

from sglang_replayssm.read_copy_check import ENV_VAR as CHECK_ENV  # noqa: E402

pytestmark = pytest.mark.e2e

MAX_NEW = 40  # > 2 ring cycles at L = 16
FIRST = 12  # greedy tokens that must agree (later ones may diverge after a near-tie)
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


@pytest.mark.parametrize(
    ("model_name", "read", "torch_name", "tol"),
    [("nemotron_h_tiny", "bf16", "torch.bfloat16", 5e-3), ("qwen3_next_tiny", "fp8", "torch.float8_e4m3fn", 0.5)],
)
def test_read_copy_serves_the_same_greedy_tokens(model_name: str, read: str, torch_name: str, tol: float,
                                                 tmp_path: Path, tmp_path_factory):
    model = make_model.materialize(model_name, tmp_path_factory.mktemp("models") / model_name)
    logs = {name: tmp_path / f"server_{name}.log" for name in ("same", read)}
    base = ["--ssm-backend", "replay", "--replayssm-window", "16"]
    with contextlib.ExitStack() as stack:
        # the copy's server checks the copy against its checkpoint before every forward (read_copy_check)
        specs = {name: dict(model=model, args=[*base, "--replayssm-read-dtype", name], log=logs[name],
                            env={CHECK_ENV: "1"} if name == read else None)
                 for name in logs}
        ports = srv.start(specs, 240.0, stack)
        results = {name: _workload(f"http://127.0.0.1:{ports[name]}") for name in logs}
    copy_log = logs[read].read_text()
    assert "ReplaySSM read copy is allocated" in copy_log and torch_name in copy_log, copy_log[-3000:]
    assert "B per slot) beside the torch.float32 checkpoint" in copy_log
    assert "ReplaySSM read-copy check passed" in copy_log, copy_log[-3000:]
    assert "ReplaySSM read copy is allocated" not in logs["same"].read_text()
    for n in PROMPT_LENS:
        toks_c, lps_c = results[read][n]
        toks_s, lps_s = results["same"][n]
        assert len(toks_c) == len(toks_s) == MAX_NEW
        agree = next((i for i, (a, b) in enumerate(zip(toks_c, toks_s)) if a != b), MAX_NEW)
        diff = max(abs(a - b) for a, b in zip(lps_c[:agree], lps_s[:agree]))
        print(f"{model_name} {read} prompt {n}: {agree}/{MAX_NEW} greedy tokens equal, "
              f"max |logprob diff| {diff:.3e} on those")
        assert agree >= FIRST, f"prompt {n}: greedy tokens differ at step {agree}: {toks_c} vs {toks_s}"
        assert diff < tol, f"prompt {n}: logprobs differ by {diff}"

