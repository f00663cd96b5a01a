"""The CPU speculative-decoding shims (``cpu/spec_ops.py``, ``cpu/verify_attention.py``, ``hooks/cpu_spec.py``).

- Each torch op equals SGLang's own op on small inputs: the Triton kernels run under the Triton
  interpreter (``tests/conftest.py``), SGLang's ``move_accept_tokens_to_target_kvcache`` runs as is
  (its Triton kernels interpreted), and hand-written expectations pin the documented semantics.
- The TARGET_VERIFY attention of ``torch_native`` equals causal attention written out per token.
- A CPU KV pool moves rows with SGLang's torch move after the warmup hook; a CPU ``ReplayMambaPool``
  with speculation holds SGLang's speculative buffers on the CPU.
- Every hook hands non-CPU calls to the original.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_replayssm.cpu import spec_ops
from sglang_replayssm.hooks import cpu_spec
from sglang_replayssm.patching import unwrap_hooks

T = 4


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _req_to_token(rows: int = 4, width: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randperm(rows * width, generator=_gen(seed)).view(rows, width).to(torch.int32) + 1


def test_assign_req_to_token_pool_equals_the_triton_kernel():
    from sglang.srt.mem_cache.allocation import assign_req_to_token_pool

    rpi = torch.tensor([2, 0, 3], dtype=torch.int64)
    start, end = torch.tensor([5, 0, 9], dtype=torch.int32), torch.tensor([9, 3, 30], dtype=torch.int32)
    locs = torch.arange(100, 100 + int((end - start).sum()), dtype=torch.int64)
    ours, theirs = _req_to_token(), _req_to_token()
    spec_ops.assign_req_to_token_pool_func(rpi, ours, start, end, locs, 3)
    assign_req_to_token_pool[(3,)](rpi, theirs, start, end, locs, theirs.shape[1], 4)
    assert torch.equal(ours, theirs)
    expected = _req_to_token()
    expected[2, 5:9] = torch.arange(100, 104)
    expected[0, 0:3] = torch.arange(104, 107)
    expected[3, 9:30] = torch.arange(107, 128)
    assert torch.equal(ours, expected)


def _chain_links(bs: int, t: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    index = torch.arange(bs * t).view(bs, t)
    nxt = torch.tensor([*range(1, t), -1]).expand(bs, t).contiguous()
    return index, nxt, torch.full((bs, t), -1)


def _tree_links(bs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Six nodes: root 0 -> {1, 2}; 1 -> {3}; 2 -> {4, 5}."""
    index = torch.arange(bs * 6).view(bs, 6)
    nxt = torch.tensor([1, 3, 4, -1, -1, -1]).expand(bs, 6).contiguous()
    sib = torch.tensor([-1, 2, -1, -1, 5, -1]).expand(bs, 6).contiguous()
    return index, nxt, sib


def _greedy(fn, candidates, links, target, depth) -> tuple[torch.Tensor, ...]:
    bs, t = candidates.shape
    predicts = torch.zeros(bs * t, dtype=torch.int32)
    accept_index = torch.full((bs, depth), -1, dtype=torch.int32)
    accept_num = torch.zeros(bs, dtype=torch.int32)
    fn(predicts=predicts, accept_index=accept_index, accept_token_num=accept_num, candidates=candidates,
       retrieve_index=links[0], retrieve_next_token=links[1], retrieve_next_sibling=links[2], target_predict=target)
    return predicts, accept_index, accept_num


def test_verify_tree_greedy_on_a_chain_accepts_up_to_the_first_mismatch():
    candidates = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23]])
    target = torch.tensor([[11, 12, 99, 7], [5, 6, 7, 8]])
    predicts, accept_index, accept_num = _greedy(spec_ops.verify_tree_greedy_func, candidates, _chain_links(2, T),
                                                 target, T)
    assert accept_num.tolist() == [2, 0]
    assert accept_index.tolist() == [[0, 1, 2, -1], [4, -1, -1, -1]]
    assert predicts.tolist() == [11, 12, 99, 0, 5, 0, 0, 0]  # accepted tokens, then the bonus token


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_verify_tree_greedy_equals_the_triton_kernel(shape: str):
    from sglang.srt.speculative.eagle_utils import verify_tree_greedy_triton

    bs = 5
    links = _chain_links(bs, 6) if shape == "chain" else _tree_links(bs)
    accepted = set()
    for seed in range(6):
        g = _gen(seed)
        candidates = torch.randint(0, 3, (bs, 6), generator=g)  # a small vocabulary: many matches
        target = torch.randint(0, 3, (bs, 6), generator=g)
        for depth in (3, 6):
            ours = _greedy(spec_ops.verify_tree_greedy_func, candidates, links, target, depth)
            theirs = _greedy(verify_tree_greedy_triton, candidates, links, target, depth)
            for x, y in zip(ours, theirs, strict=True):
                assert torch.equal(x, y), (shape, seed, depth)
            accepted.update(ours[2].tolist())
    assert {0, 1, 2} <= accepted  # rejections and acceptances both occurred


class _RecordingKV:
    def __init__(self):
        self.moves: list[tuple[torch.Tensor, torch.Tensor]] = []

    def get_kvcache(self):
        return self

    def move_kv_cache(self, tgt: torch.Tensor, src: torch.Tensor) -> None:
        self.moves.append((tgt.clone(), src.clone()))


def test_move_accept_tokens_equals_sglangs_function():
    from sglang.srt.speculative import spec_utils

    stock = unwrap_hooks(spec_utils.move_accept_tokens_to_target_kvcache)
    req_to_token = _req_to_token()
    batch = SimpleNamespace(
        seq_lens=torch.tensor([5, 9, 2]), req_pool_indices=torch.tensor([2, 0, 1]),
        req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
        out_cache_loc=torch.arange(500, 500 + 3 * T, dtype=torch.int64),
    )
    # Accepted paths (flat verify indices, bonus included); request 1 takes a tree-like path.
    accept_index = torch.tensor([[0, 1, 2, 3], [4, 6, -1, -1], [8, -1, -1, -1]], dtype=torch.int32)
    correct = torch.tensor([3, 1, 0])
    ours, theirs = _RecordingKV(), _RecordingKV()
    spec_ops.move_accept_tokens_to_target_kvcache(batch, accept_index, correct, ours)
    stock(batch, accept_index, correct, theirs)
    (tgt, src), = ours.moves
    (tgt_s, src_s), = theirs.moves
    assert torch.equal(tgt, tgt_s) and torch.equal(src, src_s)
    targets = [*req_to_token[2, 5:9].tolist(), *req_to_token[0, 9:11].tolist(), int(req_to_token[1, 2])]
    assert tgt[:7].tolist() == targets
    assert src[:7].tolist() == [500, 501, 502, 503, 504, 506, 508] and not tgt[7:].any() and not src[7:].any()


def _attention_case(seq_lens: list[int], hq: int = 4, hk: int = 2, d: int = 8):
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.layers.radix_attention import AttentionType
    from sglang.srt.mem_cache.memory_pool import KVWriteLoc, MHATokenToKVPool
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    g = _gen(7)
    pool = MHATokenToKVPool(size=256, page_size=1, dtype=torch.float32, head_num=hk, head_dim=d, layer_num=1,
                            device="cpu", enable_memory_saver=False)
    layer = SimpleNamespace(layer_id=0, qk_head_dim=d, v_head_dim=d, tp_q_head_num=hq, tp_k_head_num=hk,
                            is_cross_attention=False, attn_type=AttentionType.DECODER, scaling=d ** -0.5,
                            sliding_window_size=None, k_scale=None, v_scale=None)
    req_to_token = torch.stack([torch.randperm(250, generator=g)[:40] + 1 for _ in range(3)]).to(torch.int32)
    rpi = torch.tensor([2, 0])
    for row, n in zip(rpi.tolist(), seq_lens, strict=True):  # the cached prefixes
        loc = req_to_token[row, :n].long()
        k, v = torch.randn(n, hk, d, generator=g), torch.randn(n, hk, d, generator=g)
        pool.set_kv_buffer(layer, KVWriteLoc(loc), k, v)
    seq = torch.tensor(seq_lens)
    out_cache_loc = torch.cat([req_to_token[row, n:n + T] for row, n in zip(rpi.tolist(), seq_lens, strict=True)])
    out_cache_loc = out_cache_loc.long()
    batch = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, seq_lens=seq, req_pool_indices=rpi,
                            out_cache_loc=out_cache_loc, encoder_lens=None, extend_prefix_lens=None,
                            extend_seq_lens=None, spec_info=SimpleNamespace(draft_token_num=T))
    backend = TorchNativeAttnBackend(SimpleNamespace(device="cpu", req_to_token_pool=SimpleNamespace(
        req_to_token=req_to_token), token_to_kv_pool=pool))
    q = torch.randn(len(seq_lens) * T, hq * d, generator=g)
    k, v = torch.randn(len(seq_lens) * T, hk, d, generator=g), torch.randn(len(seq_lens) * T, hk, d, generator=g)
    return backend, pool, layer, batch, q, k, v, req_to_token


def test_target_verify_attention_is_causal_attention_over_prefix_and_window():
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    seq_lens, hq, hk, d = [3, 6], 4, 2, 8
    backend, pool, layer, batch, q, k, v, req_to_token = _attention_case(seq_lens, hq, hk, d)
    stock = unwrap_hooks(TorchNativeAttnBackend.forward_extend)
    out = cpu_spec.around_torch_native_extend(stock, backend, q, k, v, layer, batch)
    assert batch.extend_prefix_lens is None and batch.seq_lens.tolist() == seq_lens  # the batch is not modified
    kc, vc = pool.get_key_buffer(0), pool.get_value_buffer(0)
    for b, (row, n) in enumerate(zip(batch.req_pool_indices.tolist(), seq_lens, strict=True)):
        for i in range(T):  # window token i sees the prefix and window tokens 0..i
            keys = req_to_token[row, : n + i + 1].long()
            kk = kc[keys].repeat_interleave(hq // hk, dim=1)  # [n+i+1, hq, d]
            vv = vc[keys].repeat_interleave(hq // hk, dim=1)
            qq = q[b * T + i].view(hq, d)
            w = torch.softmax(torch.einsum("hd,nhd->hn", qq, kk) * d ** -0.5, dim=-1)
            expected = torch.einsum("hn,nhd->hd", w, vv).reshape(-1)
            torch.testing.assert_close(out[b * T + i], expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(kc[batch.out_cache_loc], k)  # the window's KV was written at out_cache_loc


def test_kv_copy_warmup_hook_gives_a_cpu_pool_sglangs_torch_move():
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    pool = MHATokenToKVPool(size=32, page_size=1, dtype=torch.float32, head_num=2, head_dim=4, layer_num=2,
                            device="cpu", enable_memory_saver=False)
    for buf in (*pool.k_buffer, *pool.v_buffer):
        buf.copy_(torch.randn(buf.shape, generator=_gen(3)))
    before = [b.clone() for b in (*pool.k_buffer, *pool.v_buffer)]

    def triton_warmup(self):
        raise AssertionError("the Triton warmup must not run for a CPU pool")

    cpu_spec.around_kv_copy_warmup(triton_warmup, pool)
    assert pool.use_native_move_kv_cache and pool._kv_copy_config is None
    pool.move_kv_cache(torch.tensor([10, 11, 12]), torch.tensor([3, 5, 3]))
    for now, old in zip((*pool.k_buffer, *pool.v_buffer), before, strict=True):
        assert torch.equal(now[10], old[3]) and torch.equal(now[11], old[5]) and torch.equal(now[12], old[3])
        assert torch.equal(now[:10], old[:10]) and torch.equal(now[13:], old[13:])


def test_cpu_replay_pool_holds_sglangs_speculative_buffers_on_the_cpu(monkeypatch):
    from tests.integration.test_pool import SIZE
    from tests.integration.test_spec_verify import _cpu_spec_pool

    pool = _cpu_spec_pool("mamba2", 4, T, monkeypatch, verify="auto")
    state = pool.mamba_cache
    assert state.intermediate_ssm.shape == (3, SIZE + 1, T, *state.temporal.shape[2:])
    for conv, window in zip(state.conv, state.intermediate_conv_window, strict=True):
        assert window.device.type == "cpu" and window.shape == (3, SIZE + 1, T, *conv.shape[2:])
    assert _cpu_spec_pool("mamba2", 4, T, monkeypatch, verify="replay").mamba_cache.intermediate_ssm is None


def test_hooks_route_cpu_calls_to_torch_and_others_to_the_original():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    def original(*args, **kwargs):
        return "original"

    meta = torch.empty(2, 4, device="meta")
    row = meta[0]
    assert cpu_spec.around_assign_req_to_token_pool(original, row, meta, row, row, row, 2) == "original"
    assert cpu_spec.around_verify_tree_greedy(
        original, predicts=meta, accept_index=meta, accept_token_num=meta, candidates=meta, retrieve_index=meta,
        retrieve_next_token=meta, retrieve_next_sibling=meta, target_predict=meta) == "original"
    assert cpu_spec.around_move_accept_tokens(original, SimpleNamespace(seq_lens=row), meta, row, None) == "original"
    assert cpu_spec.around_kv_copy_warmup(original, SimpleNamespace(device="cuda:0")) == "original"
    verify = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY)
    assert cpu_spec.around_torch_native_extend(original, None, meta, meta, meta, None, verify) == "original"
    extend = SimpleNamespace(forward_mode=ForwardMode.EXTEND)
    cpu = torch.zeros(2, 4)
    assert cpu_spec.around_torch_native_extend(original, None, cpu, cpu, cpu, None, extend) == "original"
    # A CPU call goes to torch: the chain case above, through the hook.
    candidates, target = torch.tensor([[10, 11, 12, 13]]), torch.tensor([[11, 5, 0, 0]])
    _, _, accept_num = _greedy(lambda **kw: cpu_spec.around_verify_tree_greedy(original, **kw), candidates,
                               _chain_links(1, T), target, T)
    assert accept_num.tolist() == [1]
