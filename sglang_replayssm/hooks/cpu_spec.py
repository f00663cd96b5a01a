"""Hooks that let speculative decoding (linear drafts) run on ``--device cpu`` with ReplaySSM.

SGLang 0.5.17's speculative bookkeeping outside the model runs Triton kernels or ops of
``sgl_kernel``'s CPU build (not on PyPI); with the ordinary CUDA build of torch and no GPU,
``is_cpu()`` is false and none of them has a CPU path (``benchmarks/notes/spec_algorithms.md``).
Each hook is ``when="replay"`` and routes CPU tensors only to a torch function with the same
signature and in-place semantics (``cpu/spec_ops.py``, ``cpu/verify_attention.py``); any other call
reaches the original, so GPU servers and ``--ssm-backend default`` are unchanged.

``mem_cache.allocation.assign_req_to_token_pool_func`` (AROUND)
    Why: every speculative decode step allocates its KV slots through it
    (``eagle_utils.eagle_prepare_for_decode`` → ``alloc_for_spec_decode``); Triton on CPU tensors.
    How: CPU tensors go to ``spec_ops.assign_req_to_token_pool_func``.
    Removal: when SGLang treats ``--device cpu`` as a CPU without ``sgl_kernel``'s CPU build.

``speculative.eagle_utils.verify_tree_greedy_func`` (AROUND)
    Why: ``eagle_sample`` (greedy verify of every algorithm) calls it; with neither CUDA nor the CPU
    engine it matches no branch and returns its inputs unchanged (every draft silently rejected,
    bonus token 0).
    How: CPU tensors go to ``spec_ops.verify_tree_greedy_func``.
    Removal: as above.

``speculative.spec_utils.move_accept_tokens_to_target_kvcache`` (AROUND)
    Why: every algorithm's post-verify KV move; its slot gathers are Triton kernels.
    How: CPU tensors go to ``spec_ops.move_accept_tokens_to_target_kvcache`` (the KV pool's own
    ``move_kv_cache`` still does the move).
    Removal: as above.

``mem_cache.memory_pool.MHATokenToKVPool._init_kv_copy_and_warmup`` (AROUND)
    Why: with speculative decoding the KV pool warms up SGLang's Triton KV copy kernel when it is
    built (``enable_kv_cache_copy``), and later moves KV rows with it.
    How: a pool on the CPU skips the warmup and takes SGLang's own torch move instead
    (``use_native_move_kv_cache``, the ``SGLANG_NATIVE_MOVE_KV_CACHE`` path: ``move_kv_cache_native``);
    any other pool unchanged.
    Removal: as above.

``layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend`` (AROUND)
    Why: ``torch_native`` (the attention backend SGLang picks on a CPU) has no TARGET_VERIFY path:
    its extend reads ``extend_prefix_lens`` / ``extend_seq_lens``, which a verify batch lacks.
    How: a TARGET_VERIFY call with CPU tensors runs as the extend of ``T`` tokens after the cached
    prefix (``verify_attention.verify_as_extend``; linear chains only); any other call unchanged.
    Removal: when ``torch_native`` serves TARGET_VERIFY.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from sglang_replayssm.cpu import spec_ops
from sglang_replayssm.cpu.verify_attention import verify_as_extend
from sglang_replayssm.hooks import HookSpec

__all__ = [
    "HOOKS",
    "around_assign_req_to_token_pool",
    "around_kv_copy_warmup",
    "around_move_accept_tokens",
    "around_torch_native_extend",
    "around_verify_tree_greedy",
]

ASSIGN_REQ_TO_TOKEN = "sglang.srt.mem_cache.allocation.assign_req_to_token_pool_func"
VERIFY_TREE_GREEDY = "sglang.srt.speculative.eagle_utils.verify_tree_greedy_func"
MOVE_ACCEPT_TOKENS = "sglang.srt.speculative.spec_utils.move_accept_tokens_to_target_kvcache"
KV_COPY_WARMUP = "sglang.srt.mem_cache.memory_pool.MHATokenToKVPool._init_kv_copy_and_warmup"
TORCH_NATIVE_EXTEND = "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend"


def around_assign_req_to_token_pool(original: Callable[..., Any], req_pool_indices: torch.Tensor,
                                    req_to_token: torch.Tensor, *args: Any) -> None:
    """AROUND ``assign_req_to_token_pool_func``: torch for CPU tensors."""
    fn = spec_ops.assign_req_to_token_pool_func if req_to_token.device.type == "cpu" else original
    return fn(req_pool_indices, req_to_token, *args)


def around_verify_tree_greedy(
    original: Callable[..., Any], predicts: torch.Tensor, accept_index: torch.Tensor, accept_token_num: torch.Tensor,
    candidates: torch.Tensor, retrieve_index: torch.Tensor, retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor, target_predict: torch.Tensor, topk: int = -1,
) -> Any:
    """AROUND ``verify_tree_greedy_func``: torch for CPU tensors."""
    fn = spec_ops.verify_tree_greedy_func if candidates.device.type == "cpu" else original
    return fn(predicts=predicts, accept_index=accept_index, accept_token_num=accept_token_num, candidates=candidates,
              retrieve_index=retrieve_index, retrieve_next_token=retrieve_next_token,
              retrieve_next_sibling=retrieve_next_sibling, target_predict=target_predict, topk=topk)


def around_move_accept_tokens(original: Callable[..., Any], batch: Any, *args: Any) -> None:
    """AROUND ``move_accept_tokens_to_target_kvcache``: torch for a batch on the CPU."""
    fn = spec_ops.move_accept_tokens_to_target_kvcache if batch.seq_lens.device.type == "cpu" else original
    return fn(batch, *args)


def around_kv_copy_warmup(original: Callable[..., Any], self: Any) -> None:
    """AROUND ``MHATokenToKVPool._init_kv_copy_and_warmup``: a CPU pool moves KV rows with torch."""
    if torch.device(self.device).type != "cpu":
        return original(self)
    self.use_native_move_kv_cache = True
    self._kv_copy_config = None


def around_torch_native_extend(original: Callable[..., Any], self: Any, q: torch.Tensor, k: torch.Tensor,
                               v: torch.Tensor, layer: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``TorchNativeAttnBackend.forward_extend``: a CPU TARGET_VERIFY runs as an extend."""
    if forward_batch.forward_mode.is_target_verify() and q.device.type == "cpu":
        return verify_as_extend(original, self, q, k, v, layer, forward_batch, *args, **kwargs)
    return original(self, q, k, v, layer, forward_batch, *args, **kwargs)


HOOKS: list[HookSpec] = [
    HookSpec(target=ASSIGN_REQ_TO_TOKEN, hook=around_assign_req_to_token_pool, hook_type="around"),
    HookSpec(target=VERIFY_TREE_GREEDY, hook=around_verify_tree_greedy, hook_type="around"),
    HookSpec(target=MOVE_ACCEPT_TOKENS, hook=around_move_accept_tokens, hook_type="around"),
    HookSpec(target=KV_COPY_WARMUP, hook=around_kv_copy_warmup, hook_type="around"),
    HookSpec(target=TORCH_NATIVE_EXTEND, hook=around_torch_native_extend, hook_type="around"),
]
