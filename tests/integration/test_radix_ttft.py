"""Launch budgets of what the replay server adds to a cached-prefix prefill (issue 7).

Analysis: ``benchmarks/notes/radix_ttft.md``.  At concurrency 1 the prefill's host time is on the
TTFT path, so each would-be CUDA launch and each host-side op the plug-in adds there counts.  These
tests count aten ops on CPU tensors (the CUDA launches they stand for: every op that is not a view
or an allocation) for the events of one request that hits a cached prefix: the copy-on-write fork,
the extend metadata and the per-layer forward, and check that the cheaper forms keep the invariants
(radix invariant E, the fork's device-side assert, the split-precision refresh of extend rows).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from benchmarks.host_overhead import OpCount
from sglang_replayssm.metadata import build_eager
from tests.integration.test_pool import SIZE, _params, _pool


def _cursors():
    return torch.zeros(SIZE + 1, 2, dtype=torch.int32)


def _extend(cur, slots, prefix, **kw):
    return build_eager(cursors=cur, slot_idx=slots, num_prefills=slots.shape[0], num_decodes=0, track_mask=None,
                       window=4, rows=4, extend_prefix_lens=torch.tensor(prefix, dtype=torch.int32), **kw)


# --------------------------------------------------------------------------------- extend metadata


def test_extend_metadata_of_one_radix_hit_launches_six_kernels():
    """One row with a prefix, lengths on the host as SGLang gives them: index (conversion + clamp),
    check (gather, compare, assert) and reset; was 12 (two conversions and clamps, a device mask)."""
    cur = _cursors()
    slots = torch.tensor([5], dtype=torch.int32)
    with OpCount() as c:
        _extend(cur, slots, [2048], extend_prefix_lens_cpu=[2048])
    assert len(c.launches) <= 6, c.launches
    assert "_assert_async" in c.launches and "index_fill_" in c.launches


def test_extend_metadata_without_a_prefix_launches_only_the_reset():
    cur = _cursors()
    with OpCount() as c:
        _extend(cur, torch.tensor([5, 2], dtype=torch.int32), [0, 0], extend_prefix_lens_cpu=[0, 0])
    assert len(c.launches) <= 3 and "_assert_async" not in c.launches, c.launches


def test_extend_metadata_without_host_lengths_keeps_the_device_check():
    """SGLang's gpu-only path leaves ``extend_prefix_lens_cpu`` unset: the device lengths pick the rows."""
    cur = _cursors()
    with OpCount() as c:
        _extend(cur, torch.tensor([5], dtype=torch.int32), [2048])
    assert "_assert_async" in c.launches and len(c.launches) <= 8, c.launches
    cur[5] = torch.tensor([1, 2], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="radix invariant E"):
        _extend(cur, torch.tensor([5], dtype=torch.int32), [2048])


@pytest.mark.parametrize("host", [True, False])
def test_host_lengths_check_exactly_the_rows_with_a_prefix(host: bool):
    """A pending ring refuses a row with a prefix (all rows / some rows), never a row without one (which
    is reset), nor padding past the given lengths; a refusal resets nothing."""
    slots = torch.tensor([3, 5, -1], dtype=torch.int32)

    def run(cur, prefix):
        kw = {"extend_prefix_lens_cpu": prefix} if host else {}
        return _extend(cur, slots, prefix, **kw)

    cur = _cursors()
    cur[3] = torch.tensor([1, 2], dtype=torch.int32)  # no prefix: reset, not refused
    run(cur, [0, 7])
    assert cur[3].tolist() == [0, 0]
    for prefix in ([0, 7], [4, 7]):
        cur = _cursors()
        cur[5] = torch.tensor([2, 1], dtype=torch.int32)
        with pytest.raises(RuntimeError, match="radix invariant E"):
            run(cur, prefix)
        assert cur[5].tolist() == [2, 1]
    cur = _cursors()
    cur[0] = torch.tensor([3, 3], dtype=torch.int32)  # the null slot, read by the padding row: not checked
    run(cur, [4, 7])
    assert cur[0].tolist() == [0, 0]


# --------------------------------------------------------------------------------- copy-on-write fork


def test_cow_of_one_slot_adds_four_launches_to_stocks_copy_and_no_ring_copy():
    """The fork of a tree slot: SGLang's copy (conv, checkpoint) plus the cursor pair (gather, assert on
    ``len``, write); no ring row is read or written; was five launches (an ``all`` on one element)."""
    from sglang.srt.mem_cache.memory_pool import MambaPool

    kw = dict(size=SIZE, spec_state_size=SIZE, cache_params=_params("mamba2"), mamba_layer_ids=[0, 2, 4],
              device="cpu")
    stock, pool = MambaPool(**kw), _pool()
    src, dst = torch.tensor([2]), torch.tensor([5])
    with OpCount() as s:
        stock.copy_from(src, dst)
    rings = {n: t.clone() for n, t in pool.rings.items()}
    pool.cursors[2] = torch.tensor([3, 0], dtype=torch.int32)
    with OpCount() as r:
        pool.copy_from(src, dst)
    assert len(r.launches) - len(s.launches) <= 4, (s.launches, r.launches)
    assert "all" not in r.launches
    assert all(torch.equal(rings[n], t) for n, t in pool.rings.items())
    assert pool.cursors[5].tolist() == [3, 0]
    pool.cursors[2] = torch.tensor([3, 1], dtype=torch.int32)  # a source with a record is still refused
    with pytest.raises(RuntimeError, match="ring records"):
        pool.copy_from(src, dst)
    pool.cursors[1] = torch.tensor([0, 0], dtype=torch.int32)  # two sources: the reduction is kept
    with pytest.raises(RuntimeError, match="ring records"):
        pool.copy_from(torch.tensor([1, 2]), torch.tensor([4, 5]))


# --------------------------------------------------------------------------------- per-layer forward


def _backend(pool):
    from sglang_replayssm import mamba2

    be = mamba2.ReplayMamba2AttnBackend.__new__(mamba2.ReplayMamba2AttnBackend)
    be.pool, be.window, be.rows = pool, 4, pool.ring_spec.rows
    be._decode = be._verify = lambda *a, **k: pytest.fail("no ring kernel in an extend-only forward")
    be._step = None
    be.req_to_token_pool = SimpleNamespace(mamba_map={0: 0, 2: 1, 4: 2})
    be.forward_metadata = SimpleNamespace(num_decodes=0, num_prefills=1,
                                          mamba_cache_indices=torch.tensor([5], dtype=torch.int32))
    return be


@pytest.fixture
def stock_forward_stub(monkeypatch: pytest.MonkeyPatch):
    """SGLang's ``Mamba2AttnBackend.forward`` replaced by a recorder (it needs a model and a GPU)."""
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import Mamba2AttnBackend

    calls = []

    def stub(self, mixer, hidden_states, output, layer_id, forward_batch, *a, **k):
        calls.append(layer_id)
        return hidden_states

    monkeypatch.setattr(Mamba2AttnBackend, "forward", stub)
    return calls


def test_extend_only_forward_on_a_gpu_does_nothing_per_layer_but_sglangs_forward(
    stock_forward_stub, monkeypatch: pytest.MonkeyPatch
):
    """An extend-only forward off the CPU ("meta" stands for CUDA) needs no ring view, no read-copy or
    rounding keywords: no aten op per layer besides SGLang's (was three ring ``select`` views and two
    keyword dicts per layer, 21 layers per prefill on Nano-4B)."""
    pool = _pool()
    be = _backend(pool)
    for name in ("layer_rings", "layer_read_copy", "layer_rounding"):
        monkeypatch.setattr(pool, name, lambda *a, _n=name, **k: pytest.fail(f"{_n} in an extend-only forward"))
    hidden = torch.empty(4, 8, device="meta")
    fb = SimpleNamespace(mamba_track_mask=None)
    with OpCount() as c:
        outs = [be.forward(None, hidden, None, layer_id, fb) for layer_id in (0, 2, 4)]
    assert c.ops == [] and stock_forward_stub == [0, 2, 4] and all(o is hidden for o in outs)


def test_extend_only_forward_still_refreshes_the_read_copy(stock_forward_stub):
    """Split precision: the extend rows' read copy follows the checkpoint the extend wrote, per layer."""
    from sglang_replayssm.pool import ReplayMambaPool, ReplayPoolSpec

    pool = ReplayMambaPool(
        replay=ReplayPoolSpec(family="mamba2", window=4, act_dtype=torch.bfloat16, read_dtype=torch.bfloat16),
        size=SIZE, spec_state_size=SIZE, cache_params=_params("mamba2"), mamba_layer_ids=[0, 2, 4], device="cpu",
    )
    be = _backend(pool)
    temporal = pool.mamba_cache.temporal
    temporal[:, 5] = torch.randn(temporal[:, 5].shape, generator=torch.Generator().manual_seed(0))
    be.forward(None, torch.empty(4, 8, device="meta"), None, 2, SimpleNamespace(mamba_track_mask=None))
    assert torch.equal(pool.read_state[1, 5], temporal[1, 5].to(torch.bfloat16))
    assert not torch.equal(pool.read_state[0, 5], temporal[0, 5].to(torch.bfloat16))  # other layers: later


def test_check_extend_rows_with_a_bool_mask_checks_only_the_masked_rows():
    from sglang_replayssm.radix import check_extend_rows

    cur = _cursors()
    cur[3] = torch.tensor([1, 2], dtype=torch.int32)
    check_extend_rows(cur, torch.tensor([3, 5], dtype=torch.int32), torch.tensor([False, True]))
    with pytest.raises(RuntimeError, match="radix invariant E"):
        check_extend_rows(cur, torch.tensor([3, 5], dtype=torch.int32), torch.tensor([True, False]))
