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
again when a new request's prompt is not in it and the file changed since it was last read):
``{"entries": [{"prompt": [ids], "reference": [ids], "rate": float, "seed": int}, ...]}``.

Host cost per verify step (the benchmark runs batches of 256-512): each entry's whole draft sequence
(``draft_sequence``) is computed once, when the file is read; a request's sequence is looked up by
prompt once, on its first verify step, and kept by request id; a step then costs one list slice per
request: 0.4 ms per step at batch 512 on this CPU, where drawing ``random.Random`` per draft token and
hashing the prompt per step cost 12 ms; the file read (0.5 s for 512 prompts x 128 tokens) happens
at the first request it lacks, so write it before the warm-up.

On CUDA the verify attention (FlashInfer, as NGRAM's ``USE_FULL_MASK``) takes the full mask: per
request ``T`` rows of ``seq_len + T`` entries (the prefix, then the chain's causal ``T x T``),
built on the device with no per-request loop (``full_chain_mask``); on a CPU the ``T x T`` mask per
request, as SGLang's torch_native verify reads it.  Everything else is NGRAM's flow; CUDA-graph
capture and replay of TARGET_VERIFY take NGRAM's branch (``is_ngram``: ``NgramVerifyInput`` with the
graph's mask buffer, ``bs x T`` input ids).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import torch

__all__ = ["ALGORITHM", "ENV", "draft_sequence", "expected_accept_length", "expected_verify_steps", "full_chain_mask",
           "perturbed", "register"]

ALGORITHM = "REPLAYSSM_ORACLE"
ENV = "REPLAYSSM_SPEC_ORACLE"


def perturbed(reference: list[int], index: int, rate: float, seed: int, vocab: int) -> int:
    """The draft for output position ``index``: ``reference[index]``, or a wrong token with probability
    ``rate`` (decided by ``seed`` and ``index`` alone).  Past the reference: token 0."""
    if index >= len(reference):
        return 0
    token = reference[index]
    return (token + 1) % vocab if random.Random(f"{seed}:{index}").random() < rate else token


def draft_sequence(reference: list[int], rate: float, seed: int, vocab: int) -> list[int]:
    """``perturbed`` for every output position of ``reference`` (what the drafter proposes there)."""
    return [perturbed(reference, i, rate, seed, vocab) for i in range(len(reference))]


def _verify_walk(reference: list[int], drafts: list[int], num_draft_tokens: int, max_new_tokens: int) -> int:
    steps, produced = 0, 1
    while produced < max_new_tokens:
        accepted = 1
        while accepted < num_draft_tokens and produced + accepted - 1 < len(reference):
            index = produced + accepted - 1
            if drafts[index] != reference[index]:
                break
            accepted += 1
        produced += accepted
        steps += 1
    return steps


def expected_verify_steps(reference: list[int], rate: float, seed: int, vocab: int, num_draft_tokens: int,
                          max_new_tokens: int) -> int:
    """Verify steps a correct server takes for ``max_new_tokens`` (the first token comes from prefill).

    Each step accepts the drafts up to the first wrong one plus the target's own next token.
    """
    return _verify_walk(reference, draft_sequence(reference, rate, seed, vocab), num_draft_tokens, max_new_tokens)


def expected_accept_length(entries: list[dict], vocab: int, num_draft_tokens: int, max_new_tokens: int) -> float:
    """Accepted tokens per verify step (bonus included) over all ``entries`` (oracle-file entries):
    total verify-produced tokens / total verify steps, as a server's ``accept len`` averages them."""
    steps = tokens = 0
    for e in entries:
        n = min(max_new_tokens, len(e["reference"]))
        steps += expected_verify_steps(e["reference"], e["rate"], e["seed"], vocab, num_draft_tokens, n)
        tokens += n - 1
    return tokens / steps if steps else float("nan")


def full_chain_mask(seq_lens: torch.Tensor, seq_lens_sum: int, num_draft_tokens: int) -> torch.Tensor:
    """The flat bool verify mask of linear chains in NGRAM's ``USE_FULL_MASK`` layout (FlashInfer).

    Per request ``i``, ``T`` rows of ``seq_lens[i] + T`` entries: the prefix all True, then row ``k``
    True up to the chain's ``k``-th token.  Built where ``seq_lens`` lives (no host loop, no sync:
    ``seq_lens_sum`` is the host's sum).
    """
    t = num_draft_tokens
    lens = seq_lens.to(torch.int64)
    bs = lens.numel()
    mask = torch.ones(seq_lens_sum * t + t * t * bs, dtype=torch.bool, device=lens.device)
    pairs = [(k, q) for k in range(t - 1) for q in range(t - 1 - k)]
    if not pairs or bs == 0:
        return mask
    k = torch.tensor([kq[0] for kq in pairs], dtype=torch.int64, device=lens.device)
    q = torch.tensor([kq[1] for kq in pairs], dtype=torch.int64, device=lens.device)
    row = lens + t
    base = torch.cumsum(t * row, 0) - t * row
    idx = base[:, None] + k * row[:, None] + lens[:, None] + k + 1 + q
    mask[idx.flatten()] = False
    return mask


class _Oracle:
    """Prompt → its draft sequence (``draft_sequence``), from the oracle file; per request id, the
    sequence found on the request's first step (module docstring: host cost)."""

    def __init__(self, path: Path, vocab: int):
        self.path = path
        self.vocab = vocab
        self.sequences: dict[tuple[int, ...], list[int]] = {}
        self.by_rid: dict[str, list[int]] = {}
        self._stamp: tuple[int, int] | None = None

    def _reload(self) -> None:
        """Read the file again if it changed (mtime, size) since the last read."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return
        if (st.st_mtime_ns, st.st_size) == self._stamp:
            return
        entries = json.loads(self.path.read_text())["entries"]
        self.sequences = {tuple(e["prompt"]): draft_sequence(e["reference"], e["rate"], e["seed"], self.vocab)
                          for e in entries}
        self._stamp = (st.st_mtime_ns, st.st_size)

    def sequence(self, rid: str, prompt) -> list[int]:
        """The request's draft sequence (empty for a prompt not in the file: every draft is token 0)."""
        seq = self.by_rid.get(rid)
        if seq is None:
            key = tuple(prompt)
            if key not in self.sequences:
                self._reload()
            seq = self.by_rid[rid] = self.sequences.get(key, [])
        return seq

    def drafts(self, rid: str, prompt, num_output: int, count: int) -> list[int]:
        """``count`` drafts after ``num_output`` output tokens (token 0 past the sequence)."""
        d = self.sequence(rid, prompt)[num_output:num_output + count]
        return d + [0] * (count - len(d)) if len(d) < count else d

    def forget_except(self, rids: set[str]) -> None:
        """Drop the sequences of requests that left the batch (called when the table outgrows it)."""
        self.by_rid = {r: s for r, s in self.by_rid.items() if r in rids}


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
            oracle = self._oracle
            tokens = [
                [req.output_ids[-1], *oracle.drafts(req.rid, req.origin_input_ids, len(req.output_ids), t - 1)]
                for req in batch.reqs
            ]
            if len(oracle.by_rid) > 2 * bs + 1024:
                oracle.forget_except({req.rid for req in batch.reqs})
            steps = torch.arange(t, device=self.device)
            nodes = torch.arange(bs * t, device=self.device).view(bs, t)
            next_token = torch.where(steps + 1 < t, steps + 1, -1).expand(bs, t).contiguous()
            if str(self.device) == "cpu":  # torch_native verify: T x T per request
                mask = torch.ones(t, t, dtype=torch.bool, device=self.device).tril().repeat(bs, 1).flatten()
            else:  # FlashInfer: NGRAM's full mask
                lens_cpu = batch.seq_lens_cpu if batch.seq_lens_cpu is not None else batch.seq_lens.cpu()
                mask = full_chain_mask(batch.seq_lens, int(lens_cpu.sum()), t)
            return NgramVerifyInput(
                draft_token=torch.tensor(tokens, dtype=torch.int64, device=self.device).flatten(),
                custom_mask=mask,
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
