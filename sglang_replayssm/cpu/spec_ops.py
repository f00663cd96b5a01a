"""Pure-torch speculative-decoding bookkeeping ops for CPU tensors (``--device cpu``).

SGLang 0.5.17 runs these as Triton kernels (or as ops of ``sgl_kernel``'s CPU build, which is not on
PyPI) and, with the ordinary CUDA build of torch on a machine without a GPU, has no CPU path for
them: ``is_cpu()`` is false, so ``verify_tree_greedy_func`` silently returns its inputs unchanged and
the others launch Triton on CPU tensors.  ``hooks/cpu_spec.py`` routes CPU calls here; each function
has the signature and the in-place semantics of the SGLang function it replaces.

- ``assign_req_to_token_pool_func`` (``mem_cache/allocation.py``): the decode-step slot allocation of
  speculative decoding writes each row's new KV slots into ``req_to_token``;
- ``verify_tree_greedy_func`` (``speculative/eagle_utils.py``): greedy acceptance of a draft tree
  (a linear chain is the tree whose nodes each have one child);
- ``move_accept_tokens_to_target_kvcache`` (``speculative/spec_utils.py``): moves the accepted
  tokens' KV rows from their draft slots to the request's next positions.
"""

from __future__ import annotations

import torch

__all__ = ["assign_req_to_token_pool_func", "move_accept_tokens_to_target_kvcache", "verify_tree_greedy_func"]


def _row_ranges(start_offset: torch.Tensor, end_offset: torch.Tensor) -> list[tuple[int, int]]:
    return list(zip(start_offset.tolist(), end_offset.tolist(), strict=True))


def assign_req_to_token_pool_func(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    batch_size: int,
) -> None:
    """Write ``out_cache_loc`` into ``req_to_token`` row by row (Triton ``assign_req_to_token_pool``).

    For row ``b``: ``req_to_token[req_pool_indices[b], start_offset[b]:end_offset[b]]`` takes the next
    ``end_offset[b] - start_offset[b]`` entries of ``out_cache_loc`` (rows packed in order).

    Parameters
    ----------
    req_pool_indices : torch.Tensor
        ``[bs]`` request-pool rows.
    req_to_token : torch.Tensor
        ``[rows, max_context]`` slot table.  Updated in-place.
    start_offset, end_offset : torch.Tensor
        ``[bs]`` each: the positions written per row, ``[start, end)``.
    out_cache_loc : torch.Tensor
        ``[sum(end - start)]`` KV slots, packed row after row.
    batch_size : int
        ``bs`` (the Triton launch grid; rows past it are not written).
    """
    offset = 0
    rows = req_pool_indices[:batch_size].tolist()
    for row, (start, end) in zip(rows, _row_ranges(start_offset[:batch_size], end_offset[:batch_size]), strict=True):
        req_to_token[row, start:end] = out_cache_loc[offset : offset + end - start].to(req_to_token.dtype)
        offset += end - start


def verify_tree_greedy_func(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrieve_index: torch.Tensor,
    retrieve_next_token: torch.Tensor,
    retrieve_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
    topk: int = -1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy acceptance of a draft tree per request (``sgl_kernel.verify_tree_greedy``).

    Per request ``b``, starting at its root node 0: step to the first child
    (``retrieve_next_token``), then along the siblings (``retrieve_next_sibling``) until a node's
    token (``candidates[b, node]``) equals the target's greedy token at the last accepted node
    (``target_predict`` at flat index ``retrieve_index`` of that node); accept it and repeat, at
    most ``accept_index.shape[1] - 1`` times; stop when no child matches.

    Parameters
    ----------
    predicts : torch.Tensor
        ``[bs * T]`` int32.  Updated in-place: at every accepted node's flat index its target token
        (the next token after it), and at the last accepted node the bonus token.
    accept_index : torch.Tensor
        ``[bs, S]`` int32, pre-filled with ``-1``.  Updated in-place: flat indices of the root and
        the accepted nodes, in order.
    accept_token_num : torch.Tensor
        ``[bs]`` int32.  Updated in-place: accepted drafts per request (the root not counted).
    candidates : torch.Tensor
        ``[bs, T]`` draft tokens (node 0: the last verified token).
    retrieve_index, retrieve_next_token, retrieve_next_sibling : torch.Tensor
        ``[bs, T]`` each: a node's flat index, first child and next sibling (``-1``: none).
    target_predict : torch.Tensor
        ``[bs, T]`` the target's greedy token after each node.
    topk : int
        Unused (the Triton variant's layout hint); kept for the signature.

    Returns
    -------
    tuple of torch.Tensor
        ``(predicts, accept_index, accept_token_num)``, the updated inputs.
    """
    cand, index = candidates.tolist(), retrieve_index.tolist()
    first_child, sibling = retrieve_next_token.tolist(), retrieve_next_sibling.tolist()
    flat_target = target_predict.reshape(-1).tolist()
    for b in range(len(cand)):
        path = [index[b][0]]  # flat indices of the root and the accepted nodes
        node = 0
        while len(path) < accept_index.shape[1]:
            node = first_child[b][node]
            target = flat_target[path[-1]]
            while node != -1 and cand[b][node] != target:
                node = sibling[b][node]
            if node == -1:
                break
            predicts[path[-1]] = target
            path.append(index[b][node])
        accept_index[b, : len(path)] = torch.tensor(path, dtype=accept_index.dtype)
        accept_token_num[b] = len(path) - 1
        predicts[path[-1]] = flat_target[path[-1]]
    return predicts, accept_index, accept_token_num


def move_accept_tokens_to_target_kvcache(batch, accept_index: torch.Tensor, num_correct_drafts: torch.Tensor,
                                         token_to_kv_pool_allocator) -> None:
    """Move the accepted tokens' KV rows to the request's next positions (SGLang's function, in torch).

    Targets: per request ``b``, ``req_to_token[req_pool_indices[b], seq_lens[b] : seq_lens[b] +
    num_correct_drafts[b] + 1]`` (packed); sources: ``out_cache_loc`` at the non-``-1`` entries of
    ``accept_index`` (row-major, packed).  Both are zero-padded to ``bs * accept_index.shape[1]``
    entries, as SGLang passes them, and handed to the KV pool's ``move_kv_cache``.

    Parameters
    ----------
    batch : ScheduleBatch
        ``seq_lens``, ``req_pool_indices``, ``req_to_token_pool``, ``out_cache_loc`` of the verify.
    accept_index : torch.Tensor
        ``[bs, S]`` flat verify indices of the accepted tokens (incl. bonus), ``-1`` padded.
    num_correct_drafts : torch.Tensor
        ``[bs]`` accepted drafts per request (bonus excluded).
    token_to_kv_pool_allocator
        Its ``get_kvcache().move_kv_cache(tgt, src)`` does the move.
    """
    size = accept_index.numel()
    device = batch.seq_lens.device
    req_to_token = batch.req_to_token_pool.req_to_token
    ends = batch.seq_lens + num_correct_drafts + 1
    tgt = [req_to_token[row, start:end] for row, (start, end) in
           zip(batch.req_pool_indices.tolist(), _row_ranges(batch.seq_lens, ends), strict=True)]
    flat = accept_index.reshape(-1)
    src = batch.out_cache_loc[flat[flat != -1].long()]
    tgt_cache_loc = torch.zeros(size, dtype=torch.int64, device=device)
    accept_out_cache_loc = torch.zeros(size, dtype=torch.int64, device=device)
    packed = torch.cat(tgt) if tgt else tgt_cache_loc[:0]
    tgt_cache_loc[: packed.numel()] = packed
    accept_out_cache_loc[: src.numel()] = src
    token_to_kv_pool_allocator.get_kvcache().move_kv_cache(tgt_cache_loc, accept_out_cache_loc)
