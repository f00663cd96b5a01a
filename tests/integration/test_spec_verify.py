"""Speculative verify through the ReplaySSM backends on CPU, without a server.

The real backend classes run their CPU paths (verify kernels' torch references, the plug-in's torch
conv) on a real ``ReplayMambaPool`` with SGLang's speculative state (``intermediate_conv_window``);
the commit goes through the hook on ``update_mamba_state_after_mtp_verify``.  The property checked is
the one spec decoding needs: for every accepted token, the verify output equals the output of the
same token decoded one step at a time (no speculation), whatever the acceptance pattern, for several
requests of a batch (plus a padding row), over more than 3 ring cycles, with decode steps mixed in.

Acceptance is controlled exactly: window token ``t < a`` is the true next token's input, tokens
``t >= a`` are random (rejected drafts, whose records must never be read).  Patterns: full
(``a = T``), partial (random ``1..T``) and near-zero (``a = 1``).

SGLang 0.5.17's ``MambaPool`` allocates its speculative buffers on ``device="cuda"`` unconditionally;
``ReplayMambaPool`` allocates them on a CPU pool's own device (``_install_cpu_speculative_state``).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import replayssm_kernels
from sglang_replayssm import gdn, mamba2
from sglang_replayssm.hooks.spec import around_update_after_verify
from sglang_replayssm.metadata import build_eager
from sglang_replayssm.pool import ReplayMambaPool, ReplayPoolSpec
from tests.integration.test_pool import SIZE, _params

LAYERS = {0: 0, 2: 1, 4: 2}
LAYER_ID = 2
SLOTS = (3, 5)
WINDOW = 4
READ_DTYPES = {"same": None, "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
STEPS = 16  # verify steps; with decode steps mixed in, > 3 ring cycles at L = 4 for every pattern


def _cpu_spec_pool(family: str, window: int, spec_tokens: int | None, monkeypatch,
                   verify: str = "replay", read: str = "same") -> ReplayMambaPool:
    with monkeypatch.context() as m:
        m.setenv("SGLANG_REPLAYSSM_CONFIG", f'{{"backend": "replay", "verify": "{verify}"}}')
        return ReplayMambaPool(
            replay=ReplayPoolSpec(family=family, window=window, act_dtype=torch.float32,
                                  read_dtype=READ_DTYPES[read]),
            size=SIZE, spec_state_size=SIZE, cache_params=_params(family), mamba_layer_ids=list(LAYERS),
            device="cpu", speculative_num_draft_tokens=spec_tokens, speculative_eagle_topk=1 if spec_tokens else None,
        )


def _req_pool(pool: ReplayMambaPool) -> SimpleNamespace:
    return SimpleNamespace(
        mamba_pool=pool,
        mamba_map=LAYERS,
        mamba2_layer_cache=lambda layer_id: pool.mamba2_layer_cache(LAYERS[layer_id]),
        get_speculative_mamba2_params_all_layers=pool.get_speculative_mamba2_params_all_layers,
    )


def _init_state(pool: ReplayMambaPool) -> None:
    g = torch.Generator().manual_seed(7)
    pool.mamba_cache.temporal.copy_(0.2 * torch.randn(pool.mamba_cache.temporal.shape, generator=g))
    pool.mamba_cache.conv[0].copy_(torch.randn(pool.mamba_cache.conv[0].shape, generator=g))
    pool.refresh_read(torch.arange(pool.mamba_cache.temporal.shape[1]))  # split precision: no-op without a copy


# ----------------------------------------------------------------------------- families


class _Mamba2:
    """A small ``MambaMixer2`` stand-in (H=8, P=16, N=16, G=2, K=4) driven through the backend."""

    family = "mamba2"

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1)
        H, P, N, G, K, hidden = 8, 16, 16, 2, 4, 24
        conv_dim = H * P + 2 * G * N
        w_in = 0.3 * torch.randn(hidden, H * P + conv_dim + H, generator=g)
        w_out = 0.1 * torch.randn(H * P, hidden, generator=g)
        self.mixer = SimpleNamespace(
            tp_size=1, num_heads=H, head_dim=P, ssm_state_size=N, n_groups=G, intermediate_size=H * P,
            groups_ssm_state_size=G * N, conv_dim=conv_dim,
            in_proj=lambda h: (h @ w_in, None), out_proj=lambda y: (y @ w_out, None),
            conv1d=SimpleNamespace(weight=0.4 * torch.randn(conv_dim, 1, K, generator=g),
                                   bias=0.1 * torch.randn(conv_dim, generator=g)),
            A=-torch.linspace(0.5, 2.0, H), D=torch.linspace(0.1, 1.0, H), dt_bias=torch.full((H,), -1.0),
            norm=SimpleNamespace(forward_native=lambda y, gate: y * F.silu(gate)),
        )
        self.width = hidden

    def backend(self, pool: ReplayMambaPool, triton: bool = False):
        be = mamba2.ReplayMamba2AttnBackend.__new__(mamba2.ReplayMamba2AttnBackend)
        be.pool, be.window, be.rows, be.num_tokens = pool, pool.replay.window, pool.ring_spec.rows, pool.spec_tokens
        be._decode = replayssm_kernels.mamba2_replay_decode_ref
        be._verify = replayssm_kernels.mamba2_replay_verify if triton else replayssm_kernels.mamba2_replay_verify_ref
        be._step = be._last_verify = be._graph_bs = None
        be.req_to_token_pool = _req_pool(pool)
        return be

    def run(self, be, slots: torch.Tensor, x: torch.Tensor, verify_tokens: int) -> torch.Tensor:
        bs = slots.shape[0]
        md = SimpleNamespace(num_prefills=0, num_prefill_tokens=0, num_decodes=bs, mamba_cache_indices=slots,
                             is_target_verify=verify_tokens > 0)
        be.forward_metadata = md
        if verify_tokens:
            be._step = be._snapshot_verify(slots)
        else:
            be._step = build_eager(cursors=be.pool.cursors, slot_idx=slots, num_prefills=0, num_decodes=bs,
                                   track_mask=None, window=be.window, rows=be.rows)
        return be.forward(self.mixer, x, None, LAYER_ID, SimpleNamespace(mamba_track_mask=None))


class _GDN:
    """A small Gated DeltaNet layer stand-in (HV=4, V=8, Hk=2, K=8, conv K=4) driven through the backend."""

    family = "gdn"

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(2)
        HV, V, Hk, K = 4, 8, 2, 8
        self.hv = HV
        self.layer = SimpleNamespace(
            layer_id=LAYER_ID, conv_weights=0.5 * torch.randn(2 * Hk * K + HV * V, 4, generator=g), bias=None,
            activation="silu", q_dim=Hk * K, k_dim=Hk * K, v_dim=HV * V, num_q_heads=Hk, head_q_dim=K,
            num_k_heads=Hk, head_k_dim=K, num_v_heads=HV, head_v_dim=V,
            A_log=torch.log(torch.linspace(0.5, 2.0, HV)), dt_bias=torch.full((HV,), -2.0),
        )
        self.width = 2 * Hk * K + HV * V + 2 * HV

    def backend(self, pool: ReplayMambaPool, triton: bool = False):
        be = gdn.ReplayGDNAttnBackend.__new__(gdn.ReplayGDNAttnBackend)
        be.pool, be.window, be.rows, be.num_tokens = pool, pool.replay.window, pool.ring_spec.rows, pool.spec_tokens
        be._decode = replayssm_kernels.gdn_replay_decode_ref
        be._verify = replayssm_kernels.gdn_replay_verify if triton else replayssm_kernels.gdn_replay_verify_ref
        be._step = be._last_verify = be._graph_bs = None
        be.req_to_token_pool = _req_pool(pool)
        be._track_mamba_state_decode = lambda *a, **k: None
        return be

    def run(self, be, slots: torch.Tensor, x: torch.Tensor, verify_tokens: int) -> torch.Tensor:
        bs = slots.shape[0]
        be.forward_metadata = SimpleNamespace(mamba_cache_indices=slots, has_mamba_track_mask=False)
        qkv, a, b = x[:, : -2 * self.hv], x[:, -2 * self.hv : -self.hv], x[:, -self.hv :]
        if verify_tokens:
            be._step = be._snapshot_verify(slots)
            mode = SimpleNamespace(is_target_verify=lambda: True)
            out = be.forward_extend(self.layer, SimpleNamespace(forward_mode=mode), qkv, a, b)
        else:
            be._step = build_eager(cursors=be.pool.cursors, slot_idx=slots, num_prefills=0, num_decodes=bs,
                                   track_mask=None, window=be.window, rows=be.rows)
            out = be.forward_decode(self.layer, SimpleNamespace(mamba_track_mask=None), qkv, a, b)
        return out.reshape(x.shape[0], -1)


# ----------------------------------------------------------------------------- the property


def _commit(be, accepted: list[int]) -> None:
    hybrid = SimpleNamespace(linear_attn_backend=be)
    last = torch.tensor(accepted, dtype=torch.int64) - 1
    around_update_after_verify(lambda *a, **k: pytest.fail("stock commit called for a ReplaySSM backend"),
                               hybrid, last, None, None, None, None)


def _accepts(pattern: str, T: int, g: torch.Generator) -> list[int]:
    if pattern == "full":
        return [T] * len(SLOTS)
    if pattern == "zero":
        return [1] * len(SLOTS)
    return torch.randint(1, T + 1, (len(SLOTS),), generator=g).tolist()


@pytest.mark.parametrize("fam_cls", [_Mamba2, _GDN], ids=["mamba2", "gdn"])
@pytest.mark.parametrize("T", [2, 3])
@pytest.mark.parametrize("pattern", ["full", "partial", "zero"])
def test_verify_equals_decode(fam_cls, T: int, pattern: str, monkeypatch) -> None:
    _verify_equals_decode(fam_cls, T, pattern, monkeypatch, triton=False)


@pytest.mark.parametrize("fam_cls", [_Mamba2, _GDN], ids=["mamba2", "gdn"])
def test_verify_equals_decode_triton_kernels(fam_cls, monkeypatch) -> None:
    """The same property with the Triton verify kernels (interpreted on CPU) on the tensors the backend
    passes on a GPU (views, strides, stride-0 broadcasts); decode stays on the reference."""
    _verify_equals_decode(fam_cls, 3, "partial", monkeypatch, triton=True)


def _verify_equals_decode(fam_cls, T: int, pattern: str, monkeypatch, *, triton: bool) -> None:
    fam = fam_cls()
    g = torch.Generator().manual_seed(11)  # the stream _spec_run decodes
    n_tokens = STEPS * T + 8
    stream = torch.randn(len(SLOTS), n_tokens, fam.width, generator=g)
    slots = torch.tensor(SLOTS, dtype=torch.int32)

    # Reference: every token decoded one step at a time (L = WINDOW, no speculation).
    ref_pool = _cpu_spec_pool(fam.family, WINDOW, None, monkeypatch)
    _init_state(ref_pool)
    ref_be = fam.backend(ref_pool)
    ref = torch.stack([fam.run(ref_be, slots, stream[:, i], 0) for i in range(n_tokens)], dim=1)

    outs, where, flushes, pool = _spec_run(fam, T, pattern, monkeypatch, triton=triton)
    assert ref_pool.mamba_cache.temporal.shape == pool.mamba_cache.temporal.shape
    checked = 0
    for out, (r, p) in zip(outs, where):
        torch.testing.assert_close(out, ref[r, p : p + out.shape[0]], rtol=2e-5, atol=2e-5)
        checked += out.shape[0]
    assert checked >= STEPS * len(SLOTS) * (0.9 if pattern == "zero" else 1)
    assert flushes >= 3 * len(SLOTS)  # > 3 ring cycles per request (at least 3 folds each)


@pytest.mark.parametrize("fam_cls,read,tol", [(_Mamba2, "bf16", 1e-2), (_GDN, "fp8", 6e-2)],
                         ids=["mamba2-bf16", "gdn-fp8"])
def test_spec_with_a_read_copy_keeps_the_recurrence(fam_cls, read: str, tol: float, monkeypatch) -> None:
    """Split precision with speculative decoding: the same spec run (same tokens, acceptances, decode
    steps) with and without a read copy. The copy never feeds the recurrence: checkpoints, rings and
    cursors end bit-identical (GDN's ``u`` records, computed against S0 for the outputs only, within
    the tolerance); accepted outputs differ by about one rounding of the copy (and do
    differ: non-flush verify and decode rows read it)."""
    runs = {r: _spec_run(fam_cls(), 3, "partial", monkeypatch, triton=False, read=r) for r in ("same", read)}
    (outs0, _, _, pool0), (outs1, _, _, pool1) = runs["same"], runs[read]
    assert torch.equal(pool0.mamba_cache.temporal, pool1.mamba_cache.temporal)
    assert torch.equal(pool0.cursors, pool1.cursors)
    for name in pool0.rings:
        a, b = pool0.rings[name].nan_to_num(7.0), pool1.rings[name].nan_to_num(7.0)
        if name == "u":  # GDN's corrected updates feed outputs only (the fold replays raw k, v, g, beta)
            assert float((a - b).norm() / a.norm()) < tol
        else:
            assert torch.equal(a, b), name
    worst = max(float((a - b).norm() / b.norm()) for a, b in zip(outs1, outs0))
    print(f"\n[spec {fam_cls.family} read copy {read}] accepted outputs vs no copy: max rel {worst:.2e}")
    assert 1e-7 < worst < tol


def _spec_run(fam, T: int, pattern: str, monkeypatch, *, triton: bool, read: str = "same"):
    """Verify windows of ``T`` tokens with controlled acceptance, a decode step every 5th step, on
    the token stream of seed 11. Returns ``(outs, where, flushes, pool)``: the accepted outputs in
    order, ``(row, first position)`` of each, the rows that flushed (verify and decode steps), the
    pool."""
    g = torch.Generator().manual_seed(11)
    n_tokens = STEPS * T + 8
    stream = torch.randn(len(SLOTS), n_tokens, fam.width, generator=g)
    slots = torch.tensor(SLOTS, dtype=torch.int32)
    pool = _cpu_spec_pool(fam.family, WINDOW, T, monkeypatch, read=read)
    assert (pool.read_state is None) == (read == "same")
    # the late rule's rings: Mamba-2 T rows longer (sizing.ring_rows)
    assert pool.ring_spec.rows == replayssm_kernels.min_ring_size(WINDOW, T) + (T if fam.family == "mamba2" else 0)
    assert pool.mamba_cache.intermediate_ssm is None  # --replayssm-verify replay: no per-draft SSM state
    _init_state(pool)
    be = fam.backend(pool, triton=triton)
    pos, outs, where, flushes = [0] * len(SLOTS), [], [], 0
    padded = torch.tensor([*SLOTS, -1], dtype=torch.int32)
    for step in range(STEPS + STEPS // 4):
        if max(pos) + T >= n_tokens:
            break
        if step % 5 == 4:
            out = fam.run(be, slots, stream[torch.arange(len(SLOTS)), pos], 0)
            flushes += int(be._step.flush[: len(SLOTS)].sum())
            outs += [out[r : r + 1] for r in range(len(SLOTS))]
            where += [(r, pos[r]) for r in range(len(SLOTS))]
            pos = [p + 1 for p in pos]
            continue
        acc = _accepts(pattern, T, g)
        window = torch.randn(len(SLOTS) + 1, T, fam.width, generator=g)  # drafts to reject; padding row
        for r in range(len(SLOTS)):
            window[r, : acc[r]] = stream[r, pos[r] : pos[r] + acc[r]]
        out = fam.run(be, padded, window.reshape(-1, fam.width), T).view(len(SLOTS) + 1, T, -1)
        flushes += int(be._step.flush.sum())
        outs += [out[r, : acc[r]] for r in range(len(SLOTS))]
        where += [(r, pos[r]) for r in range(len(SLOTS))]
        _commit(be, acc + [1])
        pos = [p + a for p, a in zip(pos, acc)]
    assert be._last_verify is None  # every verify was committed once
    return outs, where, flushes, pool


def test_graph_buffers_refresh_in_place_and_match_the_eager_snapshot():
    """CUDA-graph verify: the step a captured graph reads is the per-bs buffers, refreshed in place by
    ``fill`` (recorded in the graph) to what the eager snapshot computes; padding rows stay inert."""
    from sglang_replayssm.spec import VerifyGraphBuffers, build_verify_eager

    cursors = torch.tensor([[0, 0], [1, 5], [2, 4], [5, 1]], dtype=torch.int32)
    bufs = VerifyGraphBuffers(max_bs=4, num_tokens=3, device="cpu")
    slots = torch.tensor([1, 3, -1], dtype=torch.int32)
    view = bufs.view(3, slots)
    ptrs = [view.ring_start.data_ptr(), view.ring_len.data_ptr(), view.flush.data_ptr()]
    # the late rule (flush when len + T > max(L, T) + T = 7): len 5 + 3: flush; len 4 + 3: no
    # flush, then len 5: flush; padding never
    for slot3_len, expected in ((4, [True, False, False]), (5, [True, True, False])):  # two replays
        cursors[3, 1] = slot3_len
        bufs.fill(3, cursors=cursors, slots=slots, window=4, rows=7)
        eager = build_verify_eager(cursors=cursors, slot_idx=slots, window=4, rows=7, num_tokens=3)
        for name in ("ring_start", "ring_len", "flush"):
            assert torch.equal(getattr(view, name), getattr(eager, name)), name
        assert [view.ring_start.data_ptr(), view.ring_len.data_ptr(), view.flush.data_ptr()] == ptrs
        assert view.flush.tolist() == expected
        assert view.ring_len.tolist() == [5, slot3_len, 0] and view.ring_start.tolist() == [1, 5, 0]
    assert cursors.tolist() == [[0, 0], [1, 5], [2, 4], [5, 5]]  # the snapshot never moves the cursors
    with pytest.raises(ValueError, match="bs: expected 1..4"):
        bufs.view(5, torch.zeros(5, dtype=torch.int32))
    with pytest.raises(ValueError, match="ring_size|R"):
        bufs.fill(3, cursors=cursors, slots=slots, window=4, rows=6)  # R < max(L, T) + T


@pytest.mark.parametrize("fam_cls", [_Mamba2, _GDN], ids=["mamba2", "gdn"])
def test_verify_flush_rule_is_the_late_one(fam_cls, monkeypatch):
    """The served flush rule (kernels/README.md, "Late rule"): a verify row flushes when
    ``len + T > max(L, T) + T``; GDN's ring holds ``max(L, T) + T`` rows, Mamba-2's ``T`` more; the
    snapshot path flushes every non-empty ring."""
    from sglang_replayssm.spec import build_verify_eager

    fam, T = fam_cls(), 3
    pool = _cpu_spec_pool(fam.family, WINDOW, T, monkeypatch)
    be = fam.backend(pool)
    R0 = WINDOW + T
    assert pool.ring_spec.rows == R0 + (T if fam.family == "mamba2" else 0)
    lens = [WINDOW - T, WINDOW - T + 1, R0 - T, R0 - T + 1]  # L = 4, T = 3: 1, 2, 4, 5
    slots = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    pool.cursors[slots.long()] = torch.tensor([[0, n] for n in lens], dtype=torch.int32)
    step = be._snapshot_verify(slots)
    assert step.flush.tolist() == [False, False, False, True]  # the early rule: [F, T, T, T]
    be._last_verify = None
    snap = build_verify_eager(cursors=pool.cursors, slot_idx=slots, window=WINDOW, rows=pool.ring_spec.rows,
                              num_tokens=T, snapshot=True)
    assert snap.flush.tolist() == [True] * 4


def test_pool_keeps_the_per_draft_buffer_unless_replay_is_forced(monkeypatch):
    for verify, topk_kept in (("auto", True), ("snapshot", True), ("replay", False)):
        pool = _cpu_spec_pool("mamba2", WINDOW, 3, monkeypatch, verify=verify)
        assert (pool.mamba_cache.intermediate_ssm is not None) == topk_kept, verify


def test_snapshot_path_folds_the_ring_then_runs_and_commits_stock(monkeypatch):
    """Snapshot fallback (SSU hook level; SGLang's verify and commit are CUDA-only, stood in for here):
    the checkpoint SGLang's verify reads equals the sequential fold of checkpoint + committed records,
    the stock verify receives the mixer's call unchanged, and after the stock commit the rings are empty."""
    from sglang_replayssm.spec import build_verify_eager

    fam = _Mamba2()
    T = 3
    pool = _cpu_spec_pool("mamba2", WINDOW, T, monkeypatch, verify="auto")
    _init_state(pool)
    be = fam.backend(pool)
    slots = torch.tensor(SLOTS, dtype=torch.int32)
    g = torch.Generator().manual_seed(5)
    # two replay verify steps leave committed records in the rings: slot 3 len 1 -> 3, slot 5 len
    # 2 -> 3 (no flush: the late rule flushes when len + T > max(L, T) + T = 7)
    for acc in ([1, 2], [2, 1]):
        fam.run(be, slots, torch.randn(len(SLOTS) * T, fam.width, generator=g), T)
        _commit(be, acc)
    assert pool.cursors[list(SLOTS), 1].tolist() == [3, 3]
    lc = pool.mamba2_layer_cache(LAYERS[LAYER_ID])
    rings = pool.layer_rings(LAYERS[LAYER_ID])
    H, P, N, G = 8, 16, 16, 2
    A = fam.mixer.A.float()
    expected = {}
    for s in SLOTS:  # the conventional update over the committed records, from the checkpoint
        S = lc.temporal[s].clone()
        start, n = pool.cursors[s].tolist()
        for j in range(n):
            r = (start + j) % pool.ring_spec.rows
            dt = rings["dt"][s, :, r]
            Bj = rings["B"][s, :, r].float().repeat_interleave(H // G, 0)
            xj = rings["x"][s, :, r].float()
            S = S * torch.exp(A * dt)[:, None, None] + (Bj * dt[:, None])[:, None, :] * xj[:, :, None]
        expected[s] = S

    step = build_verify_eager(cursors=pool.cursors, slot_idx=slots, window=WINDOW, rows=pool.ring_spec.rows,
                              num_tokens=T, snapshot=True)
    assert step.snapshot and step.num_tokens == 1 and step.flush.tolist() == [True, True]
    be._last_verify = step
    x = torch.randn(2, T, H, P, generator=g)
    dt = torch.randn(2, T, H, generator=g)[..., None].expand(-1, -1, -1, P)
    Bv, Cv = torch.randn(2, T, G, N, generator=g), torch.randn(2, T, G, N, generator=g)
    out = torch.full((2, T, H, P), float("nan"))
    seen = {}

    def stock_verify(*args, **kwargs):
        seen["state"] = {s: args[0][s].clone() for s in SLOTS}
        seen["args"], seen["kwargs"] = args, kwargs
        return "stock"

    mamba2._ACTIVE = mamba2._LayerContext(rings=rings, step=step, decode=replayssm_kernels.mamba2_replay_verify_ref)
    try:
        r = mamba2.replay_selective_state_update(
            stock_verify, lc.temporal, x, dt, A[:, None, None].expand(-1, P, N), Bv, Cv,
            fam.mixer.D[:, None].expand(-1, P), z=None, dt_bias=fam.mixer.dt_bias[:, None].expand(-1, P),
            dt_softplus=True, state_batch_indices=slots, out=out, disable_state_update=True,
            intermediate_states_buffer=torch.empty(0), cache_steps=T,
        )
    finally:
        mamba2._ACTIVE = None
    assert r == "stock" and seen["args"][1] is x and seen["kwargs"]["out"] is out
    for s in SLOTS:
        torch.testing.assert_close(seen["state"][s], expected[s], rtol=1e-6, atol=1e-6)
    assert torch.isnan(out).all()  # the materialising fold wrote no output of the stock call's rows
    committed = []
    hybrid = SimpleNamespace(linear_attn_backend=be)
    around_update_after_verify(lambda *a: committed.append(a), hybrid, torch.tensor([0, 2]), None, None, None, None)
    assert len(committed) == 1 and pool.cursors[list(SLOTS)].tolist() == [[0, 0], [0, 0]]


def test_snapshot_materialise_flushes_only_rings_with_records():
    """A snapshot-path forward folds (and writes the checkpoint of) only rows whose ring holds
    records; empty rings (the steady state: the stock commit empties them) and padding rows do not
    flush. Eager and graph-buffer snapshots agree."""
    from sglang_replayssm.spec import VerifyGraphBuffers, build_verify_eager

    cursors = torch.tensor([[0, 0], [4, 0], [2, 3], [7, 1]], dtype=torch.int32)
    slots = torch.tensor([1, 2, -1, 3], dtype=torch.int32)
    step = build_verify_eager(cursors=cursors, slot_idx=slots, window=4, rows=8, num_tokens=2, snapshot=True)
    assert step.flush.tolist() == [False, True, False, True] and step.num_tokens == 1
    bufs = VerifyGraphBuffers(4, 2, "cpu")
    bufs.fill(4, cursors=cursors, slots=slots, window=4, rows=8, snapshot=True)
    view = bufs.view(4, slots, snapshot=True)
    assert view.flush.tolist() == step.flush.tolist() and view.ring_len.tolist() == step.ring_len.tolist()
    assert cursors.tolist() == [[0, 0], [4, 0], [2, 3], [7, 1]]  # read only


def test_snapshot_commit_refreshes_the_read_copy(monkeypatch):
    """Split precision on the snapshot path: SGLang's commit writes the accepted state into the
    checkpoint, so the committed rows' read copies are refreshed from it (all layers); other slots'
    copies stay as they were."""
    from replayssm_kernels.mamba2_decode.read_copy import quantize_rows

    from sglang_replayssm.spec import build_verify_eager

    fam = _Mamba2()
    pool = _cpu_spec_pool("mamba2", WINDOW, 3, monkeypatch, verify="auto", read="bf16")
    _init_state(pool)
    be = fam.backend(pool)
    slots = torch.tensor(SLOTS, dtype=torch.int32)
    be._last_verify = build_verify_eager(cursors=pool.cursors, slot_idx=slots, window=WINDOW,
                                         rows=pool.ring_spec.rows, num_tokens=3, snapshot=True)
    temporal = pool.mamba_cache.temporal
    before = pool.read_state.clone()

    def stock_commit():  # stands in for SGLang's scatter of the accepted per-draft states
        temporal[:, list(SLOTS)] += 1.0

    be.commit_after_verify(torch.tensor([0, 2]), stock_commit)
    for s in SLOTS:
        assert torch.equal(pool.read_state[:, s], quantize_rows(temporal[:, s], torch.bfloat16)[0])
        assert not torch.equal(pool.read_state[:, s], before[:, s])
    others = [s for s in range(1, temporal.shape[1]) if s not in SLOTS]
    assert torch.equal(pool.read_state[:, others], before[:, others])


def test_commit_launch_equals_the_reference_and_validates():
    """``commit_verify``'s CUDA path (``_commit_launch``: validation, the Triton launcher on unsliced step tensors, ``a = last_correct_step_indices + 1`` in the kernel; run
    by the interpreter here) against the CPU path (reference on sliced rows), with padding rows beyond
    ``accepted``, flush rows and ring wrap; a bad signature raises before anything is launched."""
    from replayssm_kernels.commit import min_ring_size

    from sglang_replayssm import spec

    g = torch.Generator().manual_seed(4)
    L, T = 6, 3
    R = min_ring_size(L, T) + 1
    # lengths up to the late rule's limit max(L, T) + T = 9 (a row flushes past 6)
    cur = torch.stack([torch.randint(0, R, (10,), generator=g), torch.randint(0, L + T + 1, (10,), generator=g)], 1)
    cur = cur.to(torch.int32)
    cur[4, 1], cur[1, 1] = 8, 2  # one row past the limit (flushes), one within it
    slots = torch.tensor([4, 1, 8, 3, -1, -1], dtype=torch.int32)  # 4 requests + 2 padding rows
    lcsi = torch.randint(0, T, (4,), generator=g)  # int64, as SGLang passes it
    got = []
    for path in ("launch", "reference"):
        cursors = cur.clone()
        step = spec.build_verify_eager(cursors=cursors, slot_idx=slots, window=L, rows=R, num_tokens=T)
        assert step.flush[:4].any() and (~step.flush[:4]).any()
        if path == "launch":
            spec._commit_launch(cursors, step, lcsi, window=L, rows=R, accepted_offset=1)
        else:
            spec.commit_verify(cursors, step, lcsi, window=L, rows=R, accepted_offset=1)
        got.append(cursors)
    assert torch.equal(got[0], got[1])
    untouched = [s for s in range(10) if s not in (4, 1, 8, 3)]
    assert torch.equal(got[0][untouched], cur[untouched])
    step = spec.build_verify_eager(cursors=cur, slot_idx=slots, window=L, rows=R, num_tokens=T)
    with pytest.raises(ValueError, match="accepted"):
        spec._commit_launch(cur.clone(), step, lcsi.float(), window=L, rows=R, accepted_offset=1)
    with pytest.raises(ValueError, match="accepted_offset"):
        spec._commit_launch(cur.clone(), step, lcsi, window=L, rows=R, accepted_offset=2)
