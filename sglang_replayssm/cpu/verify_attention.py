"""TARGET_VERIFY attention for SGLang's ``torch_native`` backend (the attention backend on ``--device cpu``).

``TorchNativeAttnBackend.forward_extend`` reads ``extend_prefix_lens`` / ``extend_seq_lens``, which a
TARGET_VERIFY forward does not set (it has no speculative path).  For a linear draft chain the
verify forward *is* an extend: each request's ``T`` window tokens (last verified token + ``T-1``
drafts, KV written at ``out_cache_loc``, which ``req_to_token`` maps at positions ``seq_len ..
seq_len+T-1``) attend causally to its ``seq_len`` cached tokens and to the window tokens before
them.  ``verify_as_extend`` runs the backend's own extend on a shallow copy of the batch that says
so.  Tree drafts (a custom mask) are not covered; ``spec_plan.startup_refusals`` refuses them on CPU.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["verify_as_extend"]


def verify_as_extend(forward_extend: Callable[..., torch.Tensor], backend: Any, q: torch.Tensor, k: torch.Tensor,
                     v: torch.Tensor, layer: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    """Run ``forward_extend`` for a linear-chain TARGET_VERIFY batch as the extend it is.

    Parameters
    ----------
    forward_extend : callable
        ``TorchNativeAttnBackend.forward_extend`` (unbound).
    backend : TorchNativeAttnBackend
    q, k, v : torch.Tensor
        ``[bs * T, ...]`` projections of the verify window tokens.
    layer : RadixAttention
    forward_batch : ForwardBatch
        A TARGET_VERIFY batch: ``seq_lens`` (cached tokens per request, window excluded) and
        ``spec_info.draft_token_num`` (``T``).  Not modified.
    *args, **kwargs
        Passed on (``save_kv_cache``).

    Returns
    -------
    torch.Tensor
        The attention output, ``[bs * T, heads * head_dim]``.

    Raises
    ------
    ValueError
        When ``q`` does not hold ``bs * T`` tokens.
    """
    seq_lens = forward_batch.seq_lens
    window = int(forward_batch.spec_info.draft_token_num)
    if q.shape[0] != seq_lens.shape[0] * window:
        raise ValueError(
            f"ReplaySSM CPU verify attention: expected bs*T = {seq_lens.shape[0]}*{window} query tokens, "
            f"got {q.shape[0]}"
        )
    as_extend = copy.copy(forward_batch)
    as_extend.extend_prefix_lens = seq_lens
    as_extend.extend_seq_lens = torch.full_like(seq_lens, window)
    as_extend.seq_lens = seq_lens + window
    return forward_extend(backend, q, k, v, layer, as_extend, *args, **kwargs)
