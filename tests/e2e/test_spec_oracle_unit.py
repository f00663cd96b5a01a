"""Unit tests of the test-only drafter ``spec_oracle/replayssm_spec_oracle.py`` (no server).

- ``full_chain_mask`` is NGRAM's ``USE_FULL_MASK`` layout for linear chains (FlashInfer's verify mask on
  CUDA), built here by NGRAM's own per-request loop (``ngram_worker._prepare_for_speculative_decoding``);
- the precomputed ``draft_sequence`` gives ``perturbed``'s drafts, and ``expected_verify_steps`` the
  counts of the per-token walk it replaced; ``expected_accept_length`` approaches
  ``(1 - (1 - r)^T) / r`` on long references;
- the oracle file is read once per change, a request's sequence is found once per request id, and a
  verify step's host cost at batch 512 stays under a millisecond or so.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "spec_oracle"))

import replayssm_spec_oracle as oracle  # noqa: E402


def _ngram_full_mask(seq_lens: list[int], t: int) -> torch.Tensor:
    """NGRAM's loop (``USE_FULL_MASK and not _is_cpu``) on a linear chain's ``T x T`` tree mask."""
    chain = torch.ones(t, t, dtype=torch.bool).tril()
    rows = [torch.cat([torch.ones(t, n, dtype=torch.bool), chain], dim=1).flatten() for n in seq_lens]
    return torch.cat(rows)


@pytest.mark.parametrize("t", [2, 4, 5])
def test_full_chain_mask_is_ngrams_layout(t: int):
    lens = [1, 7, 130, 3, 512]
    got = oracle.full_chain_mask(torch.tensor(lens, dtype=torch.int32), sum(lens), t)
    assert torch.equal(got, _ngram_full_mask(lens, t))
    assert oracle.full_chain_mask(torch.tensor([], dtype=torch.int64), 0, t).numel() == 0


def _old_expected_verify_steps(reference, rate, seed, vocab, t, max_new):
    steps, produced = 0, 1
    while produced < max_new:
        accepted = 1
        while accepted < t and produced + accepted - 1 < len(reference):
            index = produced + accepted - 1
            if oracle.perturbed(reference, index, rate, seed, vocab) != reference[index]:
                break
            accepted += 1
        produced += accepted
        steps += 1
    return steps


@pytest.mark.parametrize("rate", [0.0, 0.25, 0.35, 1.0])
def test_draft_sequence_and_expected_counts(rate: float):
    ref = [(5 * i + 11) % 500 + 4 for i in range(131)]
    seq = oracle.draft_sequence(ref, rate, 3, 512)
    assert seq == [oracle.perturbed(ref, i, rate, 3, 512) for i in range(len(ref))]
    for t in (2, 4):
        for n in (64, 131):
            assert oracle.expected_verify_steps(ref, rate, 3, 512, t, n) == _old_expected_verify_steps(
                ref, rate, 3, 512, t, n)


@pytest.mark.parametrize("rate", [0.0, 0.25, 0.5, 1.0])
def test_expected_accept_length_near_geometric(rate: float):
    t = 4
    entries = [{"prompt": [i], "reference": [(i + j) % 1000 + 4 for j in range(128)], "rate": rate, "seed": i}
               for i in range(256)]
    got = oracle.expected_accept_length(entries, 1004, t, 128)
    analytic = float(t) if rate == 0 else (1 - (1 - rate) ** t) / rate
    # the last steps of a request are cut by max_new_tokens, so slightly below the geometric mean
    assert analytic - 0.12 <= got <= analytic + 0.03, (got, analytic)


def _req(rid: str, prompt: list[int], n_out: int):
    return type("Req", (), {"rid": rid, "origin_input_ids": prompt, "output_ids": [1] * n_out})()


def test_oracle_reads_once_and_caches_per_request(tmp_path: Path, monkeypatch):
    path = tmp_path / "oracle.json"
    o = oracle._Oracle(path, 512)
    assert o.drafts("a", [1, 2, 3], 0, 3) == [0, 0, 0]  # no file yet: token 0
    ref = list(range(10, 30))
    path.write_text(json.dumps({"entries": [{"prompt": [1, 2, 3], "reference": ref, "rate": 0.0, "seed": 0}]}))
    assert o.drafts("a", [1, 2, 3], 0, 3) == [0, 0, 0]  # request "a" keeps what it found on its first step
    assert o.drafts("b", [1, 2, 3], 0, 3) == ref[:3] and o.drafts("b", [1, 2, 3], 18, 3) == [ref[18], ref[19], 0]
    reads = []
    real = oracle.draft_sequence
    monkeypatch.setattr(oracle, "draft_sequence", lambda *a: reads.append(1) or real(*a))
    for i in range(50):  # unknown prompts (warm-up requests): the unchanged file is not read again
        assert o.drafts(f"w{i}", [9, 9], 0, 2) == [0, 0]
    assert reads == []
    path.write_text(json.dumps({"entries": [{"prompt": [9, 9], "reference": ref, "rate": 1.0, "seed": 0}]}))
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert o.drafts("c", [9, 9], 0, 2) == [ref[0] + 1, ref[1] + 1] and len(reads) == 1
    o.forget_except({"c"})
    assert set(o.by_rid) == {"c"}


def test_host_cost_at_batch_512(tmp_path: Path):
    path = tmp_path / "oracle.json"
    prompts = [[(i + j) % 131068 + 4 for j in range(512)] for i in range(512)]
    entries = [{"prompt": p, "reference": [(p[-1] + k) % 131068 + 4 for k in range(1, 129)], "rate": 0.25,
                "seed": i} for i, p in enumerate(prompts)]
    path.write_text(json.dumps({"entries": entries}))
    o = oracle._Oracle(path, 131072)
    reqs = [_req(f"r{i}", p, 1) for i, p in enumerate(prompts)]
    t0 = time.perf_counter()
    for r in reqs:  # first step: one file read, one lookup per request
        o.drafts(r.rid, r.origin_input_ids, 1, 3)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for step in range(20):
        [[r.output_ids[-1], *o.drafts(r.rid, r.origin_input_ids, 1 + 3 * step, 3)] for r in reqs]
    per_step = (time.perf_counter() - t0) / 20
    print(f"oracle host cost at batch 512: first step {first * 1e3:.0f} ms (file read), then {per_step * 1e3:.2f} ms")
    assert per_step < 5e-3  # about 0.3 ms here; the old per-token random.Random cost ~15 ms
