"""Host-side work of the ReplaySSM server paths that stock SGLang 0.5.17 does not do (CPU only).

Companion of ``benchmarks/notes/host_overhead.md``.  Runs on this CPU machine (no GPU): every path
is driven with CPU tensors and a ``TorchDispatchMode`` (``OpCount``) counts, per call,

- ``ops``: every aten op that reaches dispatch;
- ``kernels``: the ops that would be a CUDA kernel launch on a GPU (not views, not ``empty``, not
  ``lift_fresh``, not ``_local_scalar_dense``); Triton launches are counted separately by wrapping
  the launchers (``triton``), since they do not go through aten;
- ``syncs``: ops that block the host on a GPU (``_local_scalar_dense`` = ``.item()`` / ``int(t)`` /
  ``.tolist()`` per element / indexing with a 0-d integer tensor, ``nonzero``, ``is_nonzero``,
  ``equal``) when their operand lives on CUDA.  ``Tensor.tolist()`` does not reach dispatch on a
  CPU tensor; on CUDA it is one more sync (``materialise_slot`` has one: add 1 to its ``syncs``);
- ``mb``: megabytes the kernels write (``OpCount.bytes``);

and the host time on this CPU (median of repeated calls, ``us (CPU)``).  The CPU times are a proxy
only: a CUDA launch costs ~4-8 us of host time and a sync costs the whole queue ahead of it; the
op/launch/sync counts are what carries over to the GPU.

``OpCount``, ``measure``, ``mamba2_cache_params`` and ``run`` are shared with ``benchmarks/radix_ttft.py``
and the launch-budget tests (``tests/integration/test_radix_ttft.py``).

Run: ``.venv/bin/python -m benchmarks.host_overhead`` (add ``--json PATH`` to keep the numbers).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import time
from collections.abc import Callable, Sequence
from types import SimpleNamespace

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: ops that block the host when their operand lives on CUDA
SYNC_OPS = frozenset({"_local_scalar_dense", "nonzero", "is_nonzero", "equal", "item"})
#: ops that launch nothing on a GPU (allocations, wrapping), besides views
NO_KERNEL = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "lift_fresh", "lift_fresh_copy",
                       "detach"})


def _nbytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _bytes_written(name: str, args, out) -> int:
    """Bytes a kernel writes: index_put_ / index_copy_ values, index_fill_ rows, copy_'s source, an in-place
    op's self, else the outputs (a copy reads as many)."""
    if name in ("index_put_", "index_put"):
        return _nbytes(args[2])
    if name in ("index_copy_", "index_copy"):
        return _nbytes(args[3])
    if name in ("index_fill_", "index_fill"):
        t, dim, idx = args[0], args[1], args[2]
        return idx.numel() * (t.numel() // max(t.shape[dim], 1)) * t.element_size()
    if name == "copy_":
        return _nbytes(args[1])
    if name.endswith("_"):
        return _nbytes(args[0])
    return sum(_nbytes(o) for o in (out if isinstance(out, (tuple, list)) else (out,)))


class OpCount(TorchDispatchMode):
    """Counts the aten ops of a region (CPU tensors standing for CUDA ones), in dispatch order.

    - ``ops``: every op's name;
    - ``launches``: the ops that would reach the GPU: not a view, not in ``NO_KERNEL``, host syncs
      (``SYNC_OPS``) included, since on a GPU each is a copy to the host as well (the launch budgets
      of ``tests/integration/test_radix_ttft.py`` count these);
    - ``kernels``: the launches that are not host syncs; ``syncs``: the ops in ``SYNC_OPS``;
    - ``bytes``: what the kernels write (``_bytes_written``).

    An op is counted before it runs, so one that raises is counted too.
    """

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.launches: list[str] = []
        self.kernels = self.syncs = self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops.append(name)
        launch = not func.is_view and name not in NO_KERNEL
        if launch:
            self.launches.append(name)
        out = func(*args, **(kwargs or {}))
        if name in SYNC_OPS:
            self.syncs += 1
        elif launch:
            self.kernels += 1
            self.bytes += _bytes_written(name, args, out)
        return out


_TRITON_CALLS = [0]


@contextlib.contextmanager
def count_triton(module, *names: str):
    """Replace the named Triton launchers of ``module`` by a counter (CPU: they cannot run)."""
    saved = {n: getattr(module, n) for n in names}

    def fake(*a, **k):
        _TRITON_CALLS[0] += 1

    try:
        for n in names:
            setattr(module, n, fake)
        yield
    finally:
        for n, f in saved.items():
            setattr(module, n, f)


def measure(label: str, fn: Callable[[], object], *, per: int = 1, reps: int = 200, setup=None,
            note: str = "") -> dict:
    """One row: ops/kernels/syncs/Triton launches/MB written of one call (divided by ``per``) and CPU us.

    ``setup`` runs before the counted call and before each timed one; ``op_names``: the counted call's ops.
    """
    if setup:
        setup()
    _TRITON_CALLS[0] = 0
    with OpCount() as c:
        fn()
    triton_calls = _TRITON_CALLS[0]
    times = []
    for _ in range(reps):
        if setup:
            setup()
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    us = statistics.median(times) / 1e3
    return {"path": label, "ops": len(c.ops) / per, "kernels": c.kernels / per, "triton": triton_calls / per,
            "syncs": c.syncs / per, "mb": c.bytes / per / 1e6, "cpu_us": us / per, "note": note,
            "op_names": list(c.ops)}


#: the printed columns: row key -> (header, width, format)
COLUMNS = {"ops": ("ops", 6, ".1f"), "kernels": ("kern", 6, ".1f"), "triton": ("trit", 5, ".1f"),
           "syncs": ("sync", 5, ".1f"), "mb": ("MB", 8, ".3f"), "cpu_us": ("us(CPU)", 8, ".1f")}


def run(row_fns: Sequence[Callable[[], list[dict]]], columns: Sequence[str], description: str,
        argv: list[str] | None = None) -> list[dict]:
    """The command line of a counting benchmark: the rows of ``row_fns`` (one CPU thread), printed with
    ``columns`` (keys of ``COLUMNS``), and written to ``--json PATH`` if given."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = [r for fn in row_fns for r in fn()]
    width = max([len("path"), *(len(r["path"]) for r in rows)])
    cols = [(k, *COLUMNS[k]) for k in columns]
    print(f"{'path':{width}s} " + " ".join(f"{head:>{w}s}" for _, head, w, _ in cols))
    for r in rows:
        print(f"{r['path']:{width}s} " + " ".join(f"{r[k]:{w}{spec}}" for k, _, w, spec in cols))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


# ----------------------------------------------------------------------------------------------------
# Pools
# ----------------------------------------------------------------------------------------------------

H, P, N, G, LAYERS = 8, 16, 16, 2, 21  # small state, the Nano-4B layer count (op counts do not depend on sizes)
SLOTS = 64


def mamba2_cache_params(*, heads: int, head_dim: int, state: int, groups: int, layers: int, conv_kernel: int = 4,
                        conv_dtype: torch.dtype = torch.float32):
    """SGLang 0.5.17's ``Mamba2CacheParams`` of one TP rank: fp32 temporal state, ``conv_dtype`` conv state."""
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape

    shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=heads * head_dim, n_groups=groups,
                                    num_heads=heads, head_dim=head_dim, state_size=state, conv_kernel=conv_kernel)
    return Mamba2CacheParams(shape=shape, layers=list(range(layers)),
                             dtype=Mamba2StateDType(conv=conv_dtype, temporal=torch.float32))


def _params():
    return mamba2_cache_params(heads=H, head_dim=P, state=N, groups=G, layers=LAYERS)


def hybrid_pool(replay: bool, spec_tokens: int | None = None):
    """SGLang's ``HybridReqToTokenPool`` on CPU with the stock ``MambaPool`` or our ``ReplayMambaPool``."""
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

    from sglang_replayssm.pool import ReplayMambaPool, ReplayPoolSpec

    previous = HybridReqToTokenPool.__dict__["mamba_pool_cls"]
    if replay:
        HybridReqToTokenPool.mamba_pool_cls = functools.partial(
            ReplayMambaPool, replay=ReplayPoolSpec(family="mamba2", window=16, act_dtype=torch.bfloat16))
    try:
        return HybridReqToTokenPool(
            size=SLOTS, mamba_size=SLOTS, mamba_spec_state_size=SLOTS, max_context_len=8, device="cpu",
            enable_memory_saver=False, cache_params=_params(), mamba_layer_ids=list(range(LAYERS)),
            enable_mamba_extra_buffer=False, speculative_num_draft_tokens=spec_tokens,
            speculative_eagle_topk=1 if spec_tokens else None)
    finally:
        HybridReqToTokenPool.mamba_pool_cls = previous


def _req():
    return SimpleNamespace(req_pool_idx=None, mamba_pool_idx=None, mamba_needs_clear=False,
                           inflight_middle_chunks=0, kv_committed_len=0, mamba_ping_pong_track_buffer=None)


def rows_admission() -> list[dict]:
    """Per admitted request: ``HybridReqToTokenPool.alloc`` (SGLang's code, our pool attribute)."""
    out = []
    for replay in (False, True):
        hp = hybrid_pool(replay)
        reqs: list = []

        def setup(hp=hp):
            hp.clear()
            hp.mamba_allocator.clear()
            reqs[:] = [_req() for _ in range(16)]

        out.append(measure(f"alloc, 16 requests ({'replay' if replay else 'stock'})",
                           lambda hp=hp: hp.alloc(reqs), per=16, setup=setup,
                           note="per request (replay synced here through replayssm_write_pos until d15d498)"))
    return out


def rows_clear_and_copy() -> list[dict]:
    """Deferred clear of a prefill batch, and the no_buffer chunked/unfinished insert copy."""
    out = []
    idx = torch.arange(1, 17)
    src, dst = torch.tensor([1]), torch.tensor([40])
    for replay in (False, True):
        pool = hybrid_pool(replay).mamba_pool
        tag = "replay" if replay else "stock"
        out.append(measure(f"clear_slots, 16 slots ({tag})", lambda pool=pool: pool.clear_slots(idx),
                           note="once per extend forward with new requests (forward stream)"))
        out.append(measure(f"copy_from, 1 slot ({tag})", lambda pool=pool: pool.copy_from(src, dst),
                           note="radix no_buffer: per prefilled request (unfinished insert) and per COW"))
    return out


def rows_extend_metadata() -> list[dict]:
    """Our extra cursor work of one extend forward (``metadata.build_eager``), 16 rows."""
    from sglang_replayssm.metadata import build_eager

    pool = hybrid_pool(True).mamba_pool
    slots = torch.arange(1, 17, dtype=torch.int32)
    prefix0 = torch.zeros(16, dtype=torch.int64)
    prefix1 = torch.full((16,), 7, dtype=torch.int64)
    rows = []
    for label, pre in (("no prefix (radix off)", prefix0), ("radix hit", prefix1)):
        rows.append(measure(
            f"build_eager extend, 16 rows, {label}",
            lambda pre=pre: build_eager(cursors=pool.cursors, slot_idx=slots, num_prefills=16, num_decodes=0,
                                        track_mask=None, window=16, rows=16, extend_prefix_lens=pre),
            note="once per extend forward, eager, before the first layer"))
    return rows


def rows_layer_python() -> list[dict]:
    """Python of ``ReplayMamba2AttnBackend.forward`` before/after SGLang's (per layer)."""
    pool = hybrid_pool(True).mamba_pool
    mamba_map = {i: i for i in range(LAYERS)}

    def per_layer():
        pool_layer = mamba_map[5]
        rings = pool.layer_rings(pool_layer)
        extra = {**pool.layer_read_copy(pool_layer), **pool.layer_rounding(pool_layer)}
        return rings, extra

    return [measure("forward: ring views + kwargs, per layer", per_layer,
                    note="every SSM layer of an eager (extend) forward; graphs: capture only")]


def rows_finish_and_insert() -> list[dict]:
    """Radix donation paths under our hook (no_buffer): finished request and unfinished insert."""
    import replayssm_kernels as rk

    from sglang_replayssm import radix_materialise
    from sglang_replayssm.radix import reset_tree_slots

    pool = hybrid_pool(True).mamba_pool
    pool.fold_A = [-torch.rand(H) for _ in range(LAYERS)]
    slot = torch.tensor(3)  # SGLang's 0-d req.mamba_pool_idx
    out = []

    def empty_ring():
        pool.cursors[3] = torch.tensor([0, 0], dtype=torch.int32)

    def full_ring():
        pool.cursors[3] = torch.tensor([2, 9], dtype=torch.int32)

    out.append(measure("materialise_slot, empty ring (after prefill)",
                       lambda: radix_materialise.materialise_slot(pool, slot), setup=empty_ring,
                       note="hooks/radix.py:112, every no_buffer insert (prefill result, finish)"))
    with count_triton(rk, "mamba2_replay_decode_ref"):
        out.append(measure(f"materialise_slot, 9 records, {LAYERS} layers (finish)",
                           lambda: radix_materialise.materialise_slot(pool, slot), setup=full_ring, reps=50,
                           note="finish under no_buffer; the fold kernel counted as 'triton'"))
    out.append(measure("reset_tree_slots, 1 slot", lambda: reset_tree_slots(pool.cursors, torch.tensor([[7]])),
                       note="hooks/radix.py:115, every donation (both strategies)"))
    return out


def rows_spec_step() -> list[dict]:
    """One speculative step at bs=1: the in-graph snapshot and the out-of-graph commit."""
    import replayssm_kernels.commit.kernel as ck

    from sglang_replayssm.spec import VerifyGraphBuffers

    pool = hybrid_pool(True, spec_tokens=4).mamba_pool
    R = pool.ring_spec.rows
    vg = VerifyGraphBuffers(1, 4, "cpu")
    slots = torch.tensor([5], dtype=torch.int32)
    out = [measure("verify_cursor_step (inside the TARGET_VERIFY graph), bs=1",
                   lambda: vg.fill(1, cursors=pool.cursors, slots=slots, window=16, rows=R),
                   note="spec.py:163-168 -> commit/kernel.py:75-87; each kernel is a graph node on the GPU")]
    step = vg.view(1, slots)
    lcsi = torch.zeros(1, dtype=torch.int64)

    def replay_commit_host():  # spec.VerifyMetadataMixin.commit_after_verify up to the launches
        accepted = (lcsi + 1).to(torch.int32)
        m = accepted.shape[0]
        sl = step.slot_idx[:m]
        ck.validate_commit(pool.cursors, sl, step.ring_start[:m], step.ring_len[:m], step.flush[:m], accepted,
                           16, R, 4, None)
        ck.check_launch_device  # noqa: B018 (attribute lookup as in the wrapper)
        spec_state = pool.get_speculative_mamba2_params_all_layers()
        for conv, windows in zip(spec_state.conv, spec_state.intermediate_conv_window):
            if sl.shape != lcsi.shape:
                raise AssertionError

    out.append(measure("commit_after_verify host path, bs=1 (no launches)", replay_commit_host,
                       note="spec.py:314-318 + verify_commit's validation; + 2 Triton launches on the GPU "
                            "(verify_commit, conv rollback) vs stock's 2 (state scatter, conv scatter)"))
    return out


def rows_hook_wrapper() -> list[dict]:
    from sglang.srt.plugins.hook_registry import HookType, _wrap_fn

    def original(a, b):
        return a

    wrapped = _wrap_fn(original, lambda orig, *a, **k: orig(*a, **k), HookType.AROUND)
    t = torch.zeros(1)
    return [measure("direct call", lambda: original(t, t), reps=2000),
            measure("AROUND-wrapped call (HookRegistry)", lambda: wrapped(t, t), reps=2000,
                    note="cpu_spec hooks on assign_req_to_token_pool_func, verify_tree_greedy_func, "
                         "move_accept_tokens_to_target_kvcache + the commit hook: 4 per spec step")]


def rows_dispatch_demo() -> list[dict]:
    """Indexing with a 0-d integer tensor goes through .item() (what alloc and the finish cap do)."""
    w = torch.zeros(8, dtype=torch.int32)
    i0 = torch.tensor(3)
    i1 = torch.tensor([3])
    return [measure("w[0-d tensor] = 0", lambda: w.__setitem__(i0, 0), note="_local_scalar_dense: a sync on CUDA"),
            measure("w[1-d tensor] = 0", lambda: w.__setitem__(i1, 0), note="index_put_: no sync")]


def main(argv: list[str] | None = None) -> list[dict]:
    return run((rows_dispatch_demo, rows_admission, rows_clear_and_copy, rows_extend_metadata, rows_layer_python,
                rows_finish_and_insert, rows_spec_step, rows_hook_wrapper),
               ("ops", "kernels", "triton", "syncs", "cpu_us"), __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
