"""What the replay server adds to a cached-prefix prefill at concurrency 1 (radix cache, ``extra_buffer``), on CPU.

Companion of ``benchmarks/notes/radix_ttft.md`` (issue 7: shared-prefix TTFT at c = 1).  Drives, one
event at a time, the plug-in code that runs between a request's arrival and its first streamed token
when it hits a cached prefix, on a **Nano-4B-shaped** pool (21 Mamba-2 layers, 96 heads x 80 x 128
fp32 state, bf16 conv state, window 16), next to what stock SGLang 0.5.17 runs for the same event:

- ``cow``: the copy-on-write fork of the matched tree slot into the request's slot
  (``model_runner._maybe_execute_deferred_mamba_cow_and_clear`` -> ``copy_from``), stock
  ``MambaPool`` vs ``ReplayMambaPool``;
- ``extend_metadata``: ``metadata.build_eager`` for a one-row extend with a prefix (replay only;
  stock's ``Mamba2AttnBackend.init_forward_metadata`` runs in both servers);
- ``layer_python``: ``ReplayMamba2AttnBackend.forward`` around SGLang's ``Mamba2AttnBackend.forward``
  (stubbed) for an extend-only forward on a non-CPU device, per layer and for the 21 layers;
- ``insert_hook``: the AROUND hook on ``MambaComponent.prepare_for_caching_req`` for the unfinished
  insert that SGLang runs after the prefill and *before* it streams the first token (``extra_buffer``;
  SGLang's own method stubbed); the finished request's donation is measured too, though it runs
  before the previous request's last token is streamed (outside the next request's TTFT);
- ``decode_metadata``: ``GraphMetadataMixin.init_forward_metadata_out_graph`` for the first decode
  step (launched before the prefill's result is processed by the overlap scheduler).

Counts per event (``benchmarks.host_overhead.OpCount``): aten ops, would-be CUDA launches
(``kern``), would-be host syncs (``sync``), and ``MB``: bytes the event writes (index_put_ /
index_copy_ values, index_fill_ rows, outputs of gathers), which a copy reads as well.  ``us``:
median host time on this CPU (a proxy only; the copies move real memory here).

Run: ``.venv/bin/python -m benchmarks.radix_ttft`` (``--json PATH`` keeps the rows).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from benchmarks.host_overhead import mamba2_cache_params, measure, run

# Nano-4B (tests/models/nemotron_h_nano4b): 21 Mamba-2 layers, mamba_num_heads 96, head_dim 80,
# ssm_state_size 128, n_groups 8, conv kernel 4; fp32 temporal, bf16 conv (SGLang's defaults).
H, P, N, G, K, LAYERS, WINDOW = 96, 80, 128, 8, 4, 21, 16
SLOTS = 6  # 82.6 MB of temporal per slot


def _params():
    return mamba2_cache_params(heads=H, head_dim=P, state=N, groups=G, layers=LAYERS, conv_kernel=K,
                               conv_dtype=torch.bfloat16)


def make_pool(replay: bool):
    """SGLang's ``MambaPool`` or our ``ReplayMambaPool`` with the Nano-4B shapes, on CPU."""
    from sglang.srt.mem_cache.memory_pool import MambaPool

    from sglang_replayssm.pool import ReplayMambaPool, ReplayPoolSpec

    kw = dict(size=SLOTS, spec_state_size=SLOTS, cache_params=_params(), mamba_layer_ids=list(range(LAYERS)),
              device="cpu")
    if replay:
        return ReplayMambaPool(replay=ReplayPoolSpec(family="mamba2", window=WINDOW, act_dtype=torch.bfloat16),
                               **kw)
    return MambaPool(**kw)


# ----------------------------------------------------------------------------------------------------
# events
# ----------------------------------------------------------------------------------------------------


def rows_cow() -> list[dict]:
    """The COW fork of one tree slot into the request's slot, as SGLang passes the indices (int64)."""
    out = []
    src = torch.tensor([2], dtype=torch.int64)  # torch.cat of tree values
    dst = torch.tensor([5], dtype=torch.int64)  # torch.cat of req.mamba_pool_idx.unsqueeze(0)
    for replay in (False, True):
        pool = make_pool(replay)
        out.append(measure(f"cow copy_from, 1 slot ({'replay' if replay else 'stock'})",
                           lambda pool=pool: pool.copy_from(src, dst), reps=20,
                           note="in the prefill forward, before the first layer"))
    return out


def rows_extend_metadata() -> list[dict]:
    import inspect

    from sglang_replayssm.metadata import build_eager

    pool = make_pool(True)
    slots = torch.tensor([5], dtype=torch.int32)  # Mamba2Metadata.mamba_cache_indices (int32)
    host = "extend_prefix_lens_cpu" in inspect.signature(build_eager).parameters
    rows = []
    for label, lens in (("a radix hit (prefix 2048)", [2048]), ("no prefix (radix off / miss)", [0])):
        prefix = torch.tensor(lens, dtype=torch.int32)  # forward_batch.extend_prefix_lens (int32)
        kw = {"extend_prefix_lens_cpu": lens} if host else {}  # forward_batch.extend_prefix_lens_cpu
        rows.append(measure(
            f"build_eager, extend of 1 row, {label} (replay only)",
            lambda prefix=prefix, kw=kw: build_eager(cursors=pool.cursors, slot_idx=slots, num_prefills=1,
                                                     num_decodes=0, track_mask=None, window=WINDOW,
                                                     rows=pool.ring_spec.rows, extend_prefix_lens=prefix, **kw),
            reps=500, note="ReplayMamba2AttnBackend.init_forward_metadata, once per extend forward"))
    return rows


def _backend(pool):
    """A ReplayMamba2AttnBackend without SGLang's constructor (it needs a model runner)."""
    from sglang_replayssm import mamba2

    be = mamba2.ReplayMamba2AttnBackend.__new__(mamba2.ReplayMamba2AttnBackend)
    be.pool, be.window, be.rows = pool, WINDOW, pool.ring_spec.rows
    be._decode = be._verify = lambda *a, **k: None
    be._step = None
    be.req_to_token_pool = SimpleNamespace(mamba_map={i: i for i in range(LAYERS)})
    be.forward_metadata = SimpleNamespace(num_decodes=0, num_prefills=1,
                                          mamba_cache_indices=torch.tensor([5], dtype=torch.int32))
    return be


def rows_layer_python() -> list[dict]:
    """``ReplayMamba2AttnBackend.forward`` of an extend-only forward minus SGLang's forward (stubbed)."""
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import Mamba2AttnBackend

    from sglang_replayssm import mamba2

    pool = make_pool(True)
    be = _backend(pool)
    hidden = torch.empty(128, 8, device="meta")  # device type "meta": the backend's non-CPU branch
    fb = SimpleNamespace(mamba_track_mask=None)
    stock = Mamba2AttnBackend.forward
    parent = mamba2.ReplayMamba2AttnBackend.__mro__[1:]
    owner = next(c for c in parent if "forward" in vars(c) and c.__module__.startswith("sglang."))
    saved = vars(owner)["forward"]

    def stub(self, mixer, hidden_states, output, layer_id, forward_batch, *a, **k):
        return hidden_states

    setattr(owner, "forward", stub)
    try:
        rows = [
            measure("forward: SGLang's (stub) called directly, 21 layers",
                    lambda: [stub(be, None, hidden, None, i, fb) for i in range(LAYERS)], reps=500, per=LAYERS,
                    note="the stock server's cost of the same call sites (baseline)"),
            measure("forward: ReplayMamba2AttnBackend.forward, extend only, 21 layers",
                    lambda: [be.forward(None, hidden, None, i, fb) for i in range(LAYERS)], reps=500, per=LAYERS,
                    note="per Mamba-2 layer of an eager extend forward"),
        ]
    finally:
        setattr(owner, "forward", saved)
    assert Mamba2AttnBackend.forward is stock
    return rows


def rows_insert_hook() -> list[dict]:
    """The radix hook around SGLang's ``prepare_for_caching_req`` under ``extra_buffer`` (original stubbed)."""
    from sglang_replayssm.hooks.radix import around_prepare_for_caching_req

    pool = make_pool(True)
    comp = SimpleNamespace(
        cache=SimpleNamespace(req_to_token_pool=SimpleNamespace(mamba_pool=pool), enable_mamba_extra_buffer=True),
        int8_ckpt_pool=None,
    )
    req = SimpleNamespace(mamba_pool_idx=torch.tensor(5))

    def original(self, req, insert_params, token_ids_len, is_finished):
        insert_params.mamba_value = torch.tensor([4])  # donate_mamba_ping_pong_slot's [1] int64 slot
        return 2176

    rows = []
    for finished in (False, True):
        tag = "finished (previous request)" if finished else "unfinished insert after the prefill"
        rows.append(measure(f"prepare_for_caching_req, SGLang's (stub), {tag}",
                            lambda f=finished: original(comp, req, SimpleNamespace(mamba_value=None), 2176, f),
                            reps=500, note="baseline"))
        rows.append(measure(f"prepare_for_caching_req + replay hook, {tag}",
                            lambda f=finished: around_prepare_for_caching_req(
                                original, comp, req, SimpleNamespace(mamba_value=None), 2176, f),
                            reps=500, note="extra_buffer"))
    return rows


def rows_decode_metadata() -> list[dict]:
    """Out-of-graph metadata of the first decode step (CUDA graph bs = 1), replay's part only."""
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import Mamba2AttnBackend

    from sglang_replayssm.metadata import GraphBuffers

    pool = make_pool(True)
    be = _backend(pool)
    be._graph = GraphBuffers(4, "cpu")
    be.state_indices_list = [torch.tensor([5] + [-1] * i, dtype=torch.int32) for i in range(4)]
    fb = SimpleNamespace(forward_mode=SimpleNamespace(is_target_verify=lambda: False, is_decode_or_idle=lambda: True),
                         batch_size=1)
    saved = vars(Mamba2AttnBackend)["init_forward_metadata_out_graph"]
    Mamba2AttnBackend.init_forward_metadata_out_graph = lambda self, fb, in_capture=False: None
    try:
        return [measure("init_forward_metadata_out_graph, decode bs 1, replay's part",
                        lambda: be.init_forward_metadata_out_graph(fb), reps=2000,
                        note="first decode step, launched before the prefill's result is processed")]
    finally:
        Mamba2AttnBackend.init_forward_metadata_out_graph = saved


def main(argv: list[str] | None = None) -> list[dict]:
    return run((rows_cow, rows_extend_metadata, rows_layer_python, rows_insert_hook, rows_decode_metadata),
               ("ops", "kernels", "syncs", "mb", "cpu_us"), __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
