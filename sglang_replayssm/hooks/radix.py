"""Hook that keeps radix-tree mamba slots complete (invariant T of ``sglang_replayssm.radix``).

``MambaComponent.prepare_for_caching_req`` (AROUND)
    Why: SGLang's radix cache inserts a mamba slot's ``temporal`` as the state of the key it caches.
    With ReplaySSM that checkpoint lags the live state by the slot's ``len`` ring records, while the
    conv state does not.  SGLang 0.5.17's own answer for its built-in ring, a cap of the key by
    ``replayssm_write_pos`` for finished requests under ``no_buffer``, would make checkpoint and key
    agree but leave the conv state at the full length (our pool does not expose that name, so the cap
    never runs: ``pool.py``); the chunked-prefill insert (``copy_from`` of the live slot) and
    ``extra_buffer``'s ping-pong donation (whose slot keeps its previous owner's cursor, SGLang PR
    #37837) are not covered at all.
    How: ``no_buffer``: before the original, the live slot is materialised
    (its ring folded into its checkpoint, as a flush would: ``radix_materialise.fold_slot`` for a
    finished request, no host sync; ``materialise_slot`` for an unfinished one, whose ring is empty
    after its extend: one host read, no launch),
    so the slot (finished) or its copy (unfinished) holds the state of the full key, consistent with
    the conv state.  ``extra_buffer``: the
    donated track slot was copied from a row that force-flushed that step.  Either way the tree
    slot's cursor pair is zeroed afterwards (``radix.reset_tree_slots``).  SGLang's int8 checkpoint
    pool (values that are not slots of our pool) is refused.
    Removal: when SGLang's mamba component asks the pool to materialise a slot it donates.
"""

from __future__ import annotations

from sglang_replayssm.hooks import HookSpec

__all__ = ["HOOKS", "around_prepare_for_caching_req"]

TARGET = (
    "sglang.srt.mem_cache.unified_cache.components.mamba_component.MambaComponent.prepare_for_caching_req"
)


def around_prepare_for_caching_req(original, self, req, insert_params, token_ids_len, is_finished):
    from sglang_replayssm.pool import ReplayMambaPool
    from sglang_replayssm.radix import DonationStats, reset_tree_slots
    from sglang_replayssm.radix_materialise import fold_slot, materialise_slot

    pool = self.cache.req_to_token_pool.mamba_pool
    if not isinstance(pool, ReplayMambaPool):
        return original(self, req, insert_params, token_ids_len, is_finished)
    if self.int8_ckpt_pool is not None:
        raise RuntimeError(
            "ReplaySSM (--ssm-backend replay) does not support SGLang's int8 mamba checkpoint pool in the "
            "radix cache; disable it or run with --ssm-backend default"
        )
    if not self.cache.enable_mamba_extra_buffer and req.mamba_pool_idx is not None:
        if not is_finished:
            # SGLang inserts an unfinished request right after its extend forward (overlap is off
            # under no_buffer), whose ring is then empty: one host read and no launch, rather than
            # fold_slot's per-layer launches.
            DonationStats.materialised_tokens += materialise_slot(pool, req.mamba_pool_idx)
        else:
            if DonationStats.count_tokens:  # tests only: a host read of the cursor
                DonationStats.materialised_tokens += int(pool.cursors[req.mamba_pool_idx.reshape(-1)[0], 1])
            fold_slot(pool, req.mamba_pool_idx)  # a finished request's ring holds records: no host read
    cache_len = original(self, req, insert_params, token_ids_len, is_finished)
    if insert_params.mamba_value is not None:
        reset_tree_slots(pool.cursors, insert_params.mamba_value)
        DonationStats.donated += 1
    return cache_len


HOOKS: list[HookSpec] = [
    HookSpec(target=TARGET, hook=around_prepare_for_caching_req, hook_type="around",
             callers=("sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.cache_finished_req",
                      "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache.cache_unfinished_req")),
]
