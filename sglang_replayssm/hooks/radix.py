"""Hook that keeps radix-tree mamba slots complete (invariant T of ``sglang_replayssm.radix``).

``MambaComponent.prepare_for_caching_req`` (AROUND)
    Why: SGLang's radix cache inserts a mamba slot's ``temporal`` as the state of the key it caches.
    With ReplaySSM that checkpoint lags the live state by the slot's ``len`` ring records.  SGLang
    0.5.17 caps the key by ``replayssm_write_pos`` for finished requests under ``no_buffer`` only;
    the chunked-prefill insert (``copy_from`` of the live slot) and ``extra_buffer``'s ping-pong
    donation (whose slot keeps its previous owner's cursor, SGLang PR #37837) are not covered.
    How: unfinished ``no_buffer``: after the original (whose ``copy_from`` carries the ring into the
    donated slot), ``radix.seal_donated_slot`` caps the returned key length by the donated slot's
    ``len`` and empties its ring.  Finished ``no_buffer``: the original caps; the cut is counted
    (``radix.DonationStats``) and the cursor pair zeroed.  ``extra_buffer``: the donated track
    slot's cursor is zeroed (its checkpoint was copied from a row that force-flushed that step).
    SGLang's int8 checkpoint pool (values that are not slots of our pool) is refused.
    Removal: when SGLang's mamba component asks the pool to seal a slot it donates.
"""

from __future__ import annotations

from sglang_replayssm.hooks import HookSpec

__all__ = ["HOOKS", "around_prepare_for_caching_req"]

TARGET = (
    "sglang.srt.mem_cache.unified_cache.components.mamba_component.MambaComponent.prepare_for_caching_req"
)


def around_prepare_for_caching_req(original, self, req, insert_params, token_ids_len, is_finished):
    from sglang_replayssm.pool import ReplayMambaPool
    from sglang_replayssm.radix import DonationStats, reset_tree_slots, seal_donated_slot

    pool = self.cache.req_to_token_pool.mamba_pool
    if not isinstance(pool, ReplayMambaPool):
        return original(self, req, insert_params, token_ids_len, is_finished)
    if self.int8_ckpt_pool is not None:
        raise RuntimeError(
            "ReplaySSM (--ssm-backend replay) does not support SGLang's int8 mamba checkpoint pool in the "
            "radix cache; disable it or run with --ssm-backend default"
        )
    extra_buffer = self.cache.enable_mamba_extra_buffer
    pending = 0
    if is_finished and not extra_buffer and req.mamba_pool_idx is not None:
        pending = int(pool.cursors[int(req.mamba_pool_idx), 1])  # SGLang's original reads it too
    cache_len = original(self, req, insert_params, token_ids_len, is_finished)
    value = insert_params.mamba_value
    if value is None:
        return cache_len
    if extra_buffer or is_finished:
        # extra_buffer: a stale cursor; finished no_buffer: the original capped the key by `pending`
        # and zeroed `len`.  Either way the tree slot's cursor pair becomes (0, 0).
        reset_tree_slots(pool.cursors, value)
        DonationStats.donated += 1
        DonationStats.cut_tokens += pending
    elif cache_len is not None:
        cache_len = seal_donated_slot(pool.cursors, value, cache_len)
    return cache_len


HOOKS: list[HookSpec] = [
    HookSpec(target=TARGET, hook=around_prepare_for_caching_req, hook_type="around"),
]
