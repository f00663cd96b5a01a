"""Test-only SGLang plug-in: ``--speculative-algorithm REPLAYSSM_ORACLE``, drafts with chosen acceptance.

Loaded only by the servers of ``tests/e2e/test_spec_cpu.py`` (this folder on ``PYTHONPATH``, whose
``replayssm_spec_oracle-0.0.0.dist-info`` declares the entry point, and ``replayssm_spec_oracle`` in
``SGLANG_PLUGINS``).  It registers a speculative algorithm (``SpeculativeAlgorithm.register``) whose
drafter proposes, for a request whose prompt is in the oracle file, the next ``T-1`` tokens of a
reference run of that prompt (the same server without speculation), each replaced by a wrong token
with the prompt's chosen probability (``perturbed``; a fixed function of the seed and the token's
index).  Acceptance is therefore known in advance: ``expected_verify_steps`` is the number of
verify steps a correct server takes, rate 0 gives full acceptance, rate 1 none.

The worker is SGLang's ``NGRAMWorker`` flow for a linear chain (``speculative/ngram_worker.py``, which
cannot be imported here: it imports ``sgl_kernel`` at module level) with the corpus lookup replaced
by the oracle: TARGET_VERIFY forward of ``[last token, T-1 drafts]``, ``eagle_sample``, the mamba
commit, the accepted tokens' KV move.  The algorithm declares itself draft-model-free like NGRAM
(``is_ngram``), so SGLang's scheduler takes its NGRAM branches (no draft KV pool, drafts carried in
``batch.spec_info``).

Oracle file (path in ``REPLAYSSM_SPEC_ORACLE``; it may appear after the server starts, and is read
again whenever a request's prompt is not in it):
``{"entries": [{"prompt": [ids], "reference": [ids], "rate": float, "seed": int}, ...]}``.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import torch

__all__ = ["ALGORITHM", "ENV", "expected_verify_steps", "perturbed", "register"]

ALGORITHM = "REPLAYSSM_ORACLE"
ENV = "REPLAYSSM_SPEC_ORACLE"


def perturbed(reference: list[int], index: int, rate: float, seed: int, vocab: int) -> int:
    """The draft for output position ``index``: ``reference[index]``, or a wrong token with probability
    ``rate`` (decided by ``seed`` and ``index`` alone).  Past the reference: token 0."""
    if index >= len(reference):
        return 0
    token = reference[index]
    return (token + 1) % vocab if random.Random(f"{seed}:{index}").random() < rate else token


def expected_verify_steps(reference: list[int], rate: float, seed: int, vocab: int, num_draft_tokens: int,
                          max_new_tokens: int) -> int:
    """Verify steps a correct server takes for ``max_new_tokens`` (the first token comes from prefill).

    Each step accepts the drafts up to the first wrong one plus the target's own next token.
    """
    steps, produced = 0, 1
    while produced < max_new_tokens:
        accepted = 1
        while accepted < num_draft_tokens and produced + accepted - 1 < len(reference):
            index = produced + accepted - 1
            if perturbed(reference, index, rate, seed, vocab) != reference[index]:
                break
            accepted += 1
        produced += accepted
        steps += 1
    return steps


class _Oracle:
    """Prompt → (reference output, wrong rate, seed), from the oracle file (re-read on a prompt it lacks)."""

    def __init__(self, path: Path, vocab: int):
        self.path = path
        self.vocab = vocab
        self.entries: dict[tuple[int, ...], tuple[list[int], float, int]] = {}

    def _entry(self, prompt: tuple[int, ...]) -> tuple[list[int], float, int]:
        if prompt not in self.entries and self.path.exists():
            self.entries = {tuple(e["prompt"]): (e["reference"], e["rate"], e["seed"])
                            for e in json.loads(self.path.read_text())["entries"]}
        return self.entries.get(prompt, ([], 0.0, 0))

    def drafts(self, prompt: list[int], num_output: int, count: int) -> list[int]:
        """``count`` drafts after ``num_output`` output tokens (token 0 for prompts not in the file)."""
        reference, rate, seed = self._entry(tuple(prompt))
        return [perturbed(reference, num_output + i, rate, seed, self.vocab) for i in range(count)]


def _worker_class():
    from sglang.srt.managers.scheduler import GenerationBatchResult
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
    from sglang.srt.speculative.eagle_utils import eagle_sample
    from sglang.srt.speculative import spec_utils
    from sglang.srt.speculative.ngram_info import NgramVerifyInput

    class OracleWorker(BaseSpecWorker):
        """NGRAM's linear-chain verify flow with oracle drafts (see the module docstring)."""

        def __init__(self, server_args, gpu_id, ps, nccl_port, target_worker):
            super().__init__()
            self._target_worker = target_worker
            self.model_runner = target_worker.model_runner
            self.draft_token_num: int = server_args.speculative_num_draft_tokens
            self.device = server_args.device
            self._oracle = _Oracle(Path(os.environ[ENV]), self.model_runner.model_config.vocab_size)

        @property
        def draft_worker(self):
            return None

        def alloc_memory_pool(self, **kwargs):
            self.req_to_token_pool, self.token_to_kv_pool_allocator = self._target_worker.get_memory_pool()

        def _chain(self, batch) -> NgramVerifyInput:
            """The verify input of ``[last token, T-1 oracle drafts]`` per request (a linear chain)."""
            bs, t = len(batch.reqs), self.draft_token_num
            tokens = [
                [req.output_ids[-1], *self._oracle.drafts(list(req.origin_input_ids), len(req.output_ids), t - 1)]
                for req in batch.reqs
            ]
            steps = torch.arange(t, device=self.device)
            nodes = torch.arange(bs * t, device=self.device).view(bs, t)
            next_token = torch.where(steps + 1 < t, steps + 1, -1).expand(bs, t).contiguous()
            return NgramVerifyInput(
                draft_token=torch.tensor(tokens, dtype=torch.int64, device=self.device).flatten(),
                custom_mask=torch.ones(t, t, dtype=torch.bool, device=self.device).tril().repeat(bs, 1).flatten(),
                positions=(batch.seq_lens.to(torch.int64)[:, None] + steps).flatten(),
                retrieve_index=nodes,
                retrieve_next_token=next_token,
                retrieve_next_sibling=torch.full((bs, t), -1, dtype=torch.int64, device=self.device),
                draft_token_num=t,
            )

        def _verify(self, batch):
            if batch.return_logprob:
                raise NotImplementedError(f"{ALGORITHM}: return_logprob is not supported")
            t = self.draft_token_num
            verify_input = self._chain(batch)
            batch.forward_mode = ForwardMode.TARGET_VERIFY
            batch.input_ids = verify_input.draft_token
            req_to_token = batch.req_to_token_pool.req_to_token
            batch.out_cache_loc = req_to_token[batch.req_pool_indices[:, None], verify_input.positions.view(-1, t)]
            batch.out_cache_loc = batch.out_cache_loc.flatten().to(torch.int64)
            spec_utils.prepare_mamba_track_for_verify(batch)
            batch.spec_info = verify_input
            result = self.target_worker.forward_batch_generation(batch, is_verify=True)
            predict, accept_lens, accept_index = eagle_sample(verify_input, batch, result.logits_output)
            new_seq_lens = batch.seq_lens + accept_lens
            spec_utils.commit_mamba_states_after_verify(self.target_worker, batch, accept_lens, accept_index, t)
            accept_tokens = predict[accept_index].flatten()
            spec_utils.move_accept_tokens_to_target_kvcache(
                batch, accept_index, accept_lens - 1, self.token_to_kv_pool_allocator
            )
            batch.forward_mode = ForwardMode.DECODE
            return result, accept_tokens, accept_lens, new_seq_lens

        def _extend(self, batch):
            result = self.target_worker.forward_batch_generation(batch)
            bs = len(batch.reqs)
            accept_tokens = torch.zeros(bs, self.draft_token_num, dtype=torch.int32, device=self.device)
            accept_tokens[:, 0] = result.next_token_ids
            accept_lens = torch.ones(bs, dtype=torch.int32, device=self.device)
            return result, result.next_token_ids, accept_tokens.flatten(), accept_lens, batch.seq_lens.clone()

        def forward_batch_generation(self, batch, on_publish=None) -> GenerationBatchResult:
            if batch.forward_mode.is_decode():
                result, accept_tokens, accept_lens, new_seq_lens = self._verify(batch)
                next_token_ids = accept_tokens
            else:
                result, next_token_ids, accept_tokens, accept_lens, new_seq_lens = self._extend(batch)
            if on_publish is not None:
                on_publish(new_seq_lens)
            return GenerationBatchResult(
                logits_output=result.logits_output,
                next_token_ids=next_token_ids,
                can_run_cuda_graph=result.can_run_cuda_graph,
                accept_lens=accept_lens,
                new_seq_lens=new_seq_lens,
                next_draft_input=NgramVerifyInput(
                    draft_token_num=self.draft_token_num, new_seq_lens=new_seq_lens, accept_tokens=accept_tokens,
                    accept_lens=accept_lens,
                ),
                speculative_num_draft_tokens=self.draft_token_num,
            )

    return OracleWorker


def register() -> None:
    """SGLang plug-in entry point: register ``REPLAYSSM_ORACLE`` (idempotent)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo, get_spec

    if get_spec(ALGORITHM) is not None:
        return

    class OracleSpecAlgo(CustomSpecAlgo):
        """Draft-model-free, linear chains of ``--speculative-num-draft-tokens``, like NGRAM.

        Also gives three methods the scheduler calls on every algorithm that SGLang 0.5.17's
        ``CustomSpecAlgo`` lacks (its conformance check covers ``is_*`` / ``supports_*`` only).
        """

        def is_ngram(self) -> bool:
            return True

        def need_topk(self) -> bool:
            return False

        def carries_draft_hidden_states(self) -> bool:
            return False

        def create_future_map(self, device, req_to_token_pool, needs_cpu_seq_lens=True,
                              needs_confidence_relay=False):
            from sglang.srt.managers.overlap_utils import FutureMap

            return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)

        def has_draft_kv(self) -> bool:
            return False

        def handle_server_args(self, server_args) -> None:
            if server_args.max_running_requests is None:  # as NGRAM (spec pools are sized from it)
                server_args.max_running_requests = 48
            server_args.speculative_eagle_topk = 1
            server_args.speculative_num_steps = server_args.speculative_num_draft_tokens - 1
            server_args.enable_mixed_chunk = False

    SpeculativeAlgorithm.register(ALGORITHM, spec_class=OracleSpecAlgo)(lambda server_args: _worker_class())
