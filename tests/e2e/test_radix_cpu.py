"""End to end on CPU: the radix cache with ReplaySSM rings serves the same greedy outputs as no cache.

Two ``sglang.launch_server --device cpu --ssm-backend replay`` servers on the tiny Nemotron-H
(Mamba-2) and the tiny Qwen3-Next (GDN): one with SGLang's radix cache (``no_buffer``, the strategy
SGLang 0.5.17 resolves on a CPU, see ``sglang_replayssm/radix.py``), one with
``--disable-radix-cache``.  Both run ``--chunked-prefill-size 43`` (chunked-prefill inserts).  On each:

- ``python -m sglang.bench_serving --dataset-name generated-shared-prefix`` (2 system prompts x 4
  questions, greedy): generated texts must be identical between the two servers, and the radix
  server's cache hit rate (``--cache-report``) non-zero;
- parallel sampling, ``n = 3`` greedy: every sample's tokens identical to the other server's;
- a follow-up request that extends a finished request's prompt and output: its hit must reach past
  the prompt (a finished-request donation, ring materialised), tokens identical;
- sequential shared-prefix requests (two system prompts, three questions each, and the first
  question extended by its own output; one at a time, so the tree's contents do not depend on
  timing) on the radix server and on a third one with ``--replayssm-window 1`` (every step
  flushes, nothing is left in a ring to materialise): each request's cached-token count and greedy
  tokens identical, logprobs within ``LOGPROB_TOL``, i.e. what the rings donate holds the state of
  the lengths the conventional update's donations claim (issue 7's "same cache hit rate", at c = 1;
  a donation that skips the ring's fold keeps the counts and fails the logprobs).

Greedy tokens must be identical; logprobs differ by fp32 rounding only (a hit resumes from a cached
checkpoint instead of recomputing the prefix): measured max 3.7e-6 on Nemotron-H.

Servers listen on 127.0.0.1 only and are killed (process group) at the end.  About 3-4 minutes per
model on 2 cores.  ``test_default_strategy_on_cpu_is_refused_at_startup``: the default strategy
(``extra_buffer``) is refused on a CPU by SGLang itself, before any model code runs.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
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

LOGPROB_TOL = 1e-3  # radix hits resume from a cached checkpoint: fp32 rounding differs, tokens must not


def _generate(url: str, ids: list[int], max_new: int, n: int = 1) -> list[dict]:
    r = requests.post(
        f"{url}/generate",
        json={
            "input_ids": ids,
            "sampling_params": {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True, "n": n},
            "return_logprob": True,
        },
        timeout=300,
    )
    r.raise_for_status()
    out = r.json()
    return out if isinstance(out, list) else [out]


def _summary(o: dict) -> tuple[list[int], list[float], int]:
    meta = o["meta_info"]
    lp = meta["output_token_logprobs"]
    return [t[1] for t in lp], [t[0] for t in lp], int(meta.get("cached_tokens") or 0)


def _bench_gsp(url: str, tokenizer: Path, workdir: Path) -> dict:
    host, port = url.removeprefix("http://").split(":")
    out = workdir / "gsp.jsonl"
    out.unlink(missing_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HOME=str(workdir))  # the dataset cache goes under HOME
    proc = subprocess.run(
        [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--host", host, "--port", port,
         "--dataset-name", "generated-shared-prefix", "--tokenizer", str(tokenizer), "--model", str(tokenizer),
         "--gsp-num-groups", "2", "--gsp-prompts-per-group", "4", "--gsp-system-prompt-len", "100",
         "--gsp-question-len", "20", "--gsp-output-len", "24", "--num-prompts", "8", "--max-concurrency", "4",
         "--seed", "1", "--output-details", "--cache-report", "--output-file", str(out)],
        capture_output=True, text=True, timeout=300, env=env, cwd=workdir,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Successful requests:                     8" in proc.stdout, proc.stdout[-3000:]
    return json.loads(out.read_text().strip().splitlines()[-1])


def _sequential_prefix(url: str) -> list[tuple[list[int], list[float], int]]:
    """Two 60-token system prompts, three questions each, then the first question extended by its
    own output (a finished request's donation), sent one at a time (greedy, 20 tokens each)."""
    out = []
    for g in range(2):
        system = [(13 * j + 7 * g) % 350 + 5 for j in range(60)]
        for i in range(3):
            question = [(17 * i + 5 * j + g) % 280 + 9 for j in range(8 + 3 * i)]
            out += [_summary(o) for o in _generate(url, system + question, 20)]
        first = system + [(5 * j + g) % 280 + 9 for j in range(8)]  # question 0
        first_out = out[-3][0]  # question 0's generated tokens
        out += [_summary(o) for o in _generate(url, first + first_out + [11, 12], 20)]
    return out


def _workload(url: str, model: Path, workdir: Path) -> dict:
    res: dict = {"gsp": _bench_gsp(url, model, workdir)}
    shared = [(11 * j) % 400 + 4 for j in range(90)]
    prompts = {f"q{i}": shared + [(5 * i + 3 * j) % 300 + 7 for j in range(6 + 3 * i)] for i in range(3)}
    with cf.ThreadPoolExecutor(4) as ex:
        futs = {k: ex.submit(_generate, url, p, 40) for k, p in prompts.items()}
        futs["n3"] = ex.submit(_generate, url, shared[:70], 30, 3)
        res.update({k: [_summary(o) for o in f.result()] for k, f in futs.items()})
    # Extend a finished request by its whole output: under the radix cache the hit comes from that
    # request's finished donation (prompt + 39 decoded tokens; the 7 ring records the slot still
    # held at L = 16 are materialised first), so it lies past the prompt.
    follow = prompts["q1"] + res["q1"][0][0]
    res["follow"] = [_summary(o) for o in _generate(url, follow, 24)]
    res["follow_prompt_len"] = len(prompts["q1"])
    return res


@pytest.mark.parametrize(
    "model_name,family", [("nemotron_h_tiny", "mamba2"), ("qwen3_next_tiny", "gdn"), ("qwen3_5_tiny", "gdn")]
)
def test_radix_cache_equals_no_cache(model_name: str, family: str, tmp_path: Path, tmp_path_factory):
    model = make_model.materialize(model_name, tmp_path_factory.mktemp("models") / model_name)
    results = {}
    for tag, extra in (("radix", []), ("plain", ["--disable-radix-cache"]),
                       ("radix_l1", ["--replayssm-window", "1"])):
        args = ["--ssm-backend", "replay", "--chunked-prefill-size", "43", *extra]
        work = tmp_path / tag
        work.mkdir()
        log = work / "server.log"
        with srv.server(model, args, log) as url:
            # first, on the fresh tree: the timing-independent sequence the window must not change
            results[tag] = {"seq": _sequential_prefix(url)}
            if tag != "radix_l1":
                results[tag].update(_workload(url, model, work))
        assert f"ReplaySSM rings are allocated. family={family}" in log.read_text()
    radix, plain = results["radix"], results["plain"]

    # sequential shared prefixes: the same hits (and tokens) at L = 16 as at L = 1
    seq16, seq1 = radix["seq"], results["radix_l1"]["seq"]
    hits16, hits1 = [c for _, _, c in seq16], [c for _, _, c in seq1]
    print(f"\n{model_name}: sequential shared-prefix hits L=16 {hits16}, L=1 {hits1}")
    assert hits16 == hits1, f"cached tokens differ: L=16 {hits16}, L=1 {hits1}"
    assert all(h > 0 for k, h in enumerate(hits16) if k % 4), f"a repeated system prompt missed: {hits16}"
    assert all(hits16[k] > 68 for k in (3, 7)), f"an extension did not reach past its prompt: {hits16}"
    assert [t for t, _, _ in seq16] == [t for t, _, _ in seq1], "greedy tokens differ between L = 16 and 1"
    seq_lp = max(abs(a - b) for (_, l16, _), (_, l1, _) in zip(seq16, seq1) for a, b in zip(l16, l1))
    assert seq_lp < LOGPROB_TOL, f"sequential requests: max |logprob(L=16) - logprob(L=1)| = {seq_lp:.3g}"

    hit = radix["gsp"]["cache_report"]["cache_hit_rate_pct"]
    print(f"\n{model_name}: generated-shared-prefix cache hit rate {hit}% (no-cache server: "
          f"{plain['gsp']['cache_report']['cache_hit_rate_pct']}%)")
    assert hit > 0, radix["gsp"]["cache_report"]
    assert radix["gsp"]["generated_texts"] == plain["gsp"]["generated_texts"]
    assert all(radix["gsp"]["generated_texts"]), "empty generations"

    worst = 0.0
    for key in ("q0", "q1", "q2", "n3", "follow"):
        assert len(radix[key]) == len(plain[key]) == (3 if key == "n3" else 1)
        for (t_r, lp_r, _), (t_p, lp_p, _) in zip(radix[key], plain[key]):
            assert t_r == t_p, f"{key}: greedy tokens differ between the radix and the no-cache server"
            worst = max(worst, max(abs(a - b) for a, b in zip(lp_r, lp_p)))
    print(f"{model_name}: max |logprob(radix) - logprob(no cache)| = {worst:.3g}")
    assert worst < LOGPROB_TOL
    assert all(s[0] == radix["n3"][0][0] for s in radix["n3"]), "n=3 greedy samples differ"
    assert max(c for _, _, c in radix["n3"]) > 0, "parallel sampling did not hit the prefix cache"
    assert radix["follow"][0][2] > radix["follow_prompt_len"], (
        f"follow-up hit {radix['follow'][0][2]} tokens, not past the {radix['follow_prompt_len']}-token prompt")


def test_default_strategy_on_cpu_is_refused_at_startup(tmp_path: Path, tmp_path_factory):
    """On a CPU, SGLang 0.5.17 resolves the default radix strategy (``auto``, overlap scheduling on)
    to ``extra_buffer`` and refuses it while resolving the server arguments (FLA kernels): the
    plug-in's CPU paths never see ``extra_buffer`` tracking; ``no_buffer`` (with
    ``--disable-overlap-schedule``) is the CPU strategy."""
    model = make_model.materialize("nemotron_h_tiny", tmp_path_factory.mktemp("models") / "nemotron_h_tiny")
    flags = [f for f in srv.CPU_FLAGS if f not in ("--mamba-radix-cache-strategy", "no_buffer",
                                                    "--disable-overlap-schedule")]
    log = tmp_path / "refused.log"
    proc = srv.launch(model, ["--ssm-backend", "replay"], log, port=srv.free_port(), base_flags=flags)
    try:
        rc = proc.wait(timeout=180)
    finally:
        srv.stop(proc)
    text = log.read_text()
    assert rc != 0, text[-3000:]
    assert "extra_buffer needs CUDA" in text, text[-3000:]
