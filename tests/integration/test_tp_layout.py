"""Tensor parallelism (issue 9, CPU part): per-rank rings from SGLang's own per-rank shapes.

For attention-TP 1, 2 and 4 and the shape-faithful and tiny test configs, SGLang's
``mamba2_cache_params`` (under ``get_parallel().override(attn_tp_size=tp)``) gives each rank's
cache shape; ``sizing.ring_spec`` builds the ring spec from it and ``tp.model_layout`` checks it.
Group-to-head mapping is checked against SGLang's ``mamba_v2_sharded_weight_loader``; one decode
cycle per rank through the torch references is checked against the TP-1 computation.  What is
not run here: two-GPU servers (``--tp-size 2``), see the report of issue 9.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from replayssm_kernels import gdn_replay_decode_ref, mamba2_replay_decode_ref

from sglang_replayssm.metadata import build_eager
from sglang_replayssm.pool import ReplayMambaPool, ReplayPoolSpec
from sglang_replayssm.sizing import CURSOR_BYTES_PER_SLOT, ring_spec
from sglang_replayssm.tp import model_layout, startup_refusal, tp_layout

MODELS = Path(__file__).resolve().parents[1] / "models"
WINDOW = 16
ACT = torch.bfloat16
# name -> (family, whole-model heads, whole-model groups)
CONFIGS = {
    "nemotron_h_nano4b": ("mamba2", 96, 8),
    "nemotron_h_tiny": ("mamba2", 8, 2),
    "qwen3_next_4b": ("gdn", 32, 16),
    "qwen3_5_4b": ("gdn", 32, 16),
    "qwen3_next_tiny": ("gdn", 4, 2),
}


def _config(name: str, **override):
    """SGLang's own config class for a test model's config.json (a fresh object: SGLang's CPU path
    pads GDN heads in place)."""
    from sglang.srt.configs.nemotron_h import NemotronHConfig
    from sglang.srt.configs.qwen3_5 import Qwen3_5TextConfig
    from sglang.srt.configs.qwen3_next import Qwen3NextConfig

    path = MODELS / name / "config.json"
    cls = {"nemotron_h": NemotronHConfig, "qwen3_next": Qwen3NextConfig, "qwen3_5_text": Qwen3_5TextConfig}[
        json.loads(path.read_text())["model_type"]
    ]
    cfg = cls.from_json_file(str(path))
    for key, value in override.items():
        setattr(cfg, key, value)
    return cfg


def _params(cfg, tp: int):
    from sglang.srt.runtime_context import get_parallel

    with get_parallel().override(attn_tp_size=tp):
        return cfg.mamba2_cache_params


def _spec(family: str, params, layout=None, spec_tokens: int = 0):
    shape = params.shape
    return ring_spec(
        family=family, temporal_shape=tuple(shape.temporal), conv_dim=shape.conv[0][0],
        num_k_heads=shape.num_k_heads_per_tp, num_layers=len(params.layers), window=WINDOW, act_dtype=ACT,
        spec_tokens=spec_tokens, layout=layout,
    )


def _valid(name: str) -> list[tuple[str, int]]:
    family, heads, groups = CONFIGS[name]
    return [(name, tp) for tp in (1, 2, 4) if heads % tp == 0 and groups % tp == 0]


VALID = [case for name in CONFIGS for case in _valid(name)]


@pytest.mark.parametrize(("name", "tp"), VALID, ids=[f"{n}-tp{t}" for n, t in VALID])
@pytest.mark.parametrize("spec_tokens", [0, 4])
def test_per_rank_rings_follow_sglangs_shard(name: str, tp: int, spec_tokens: int):
    family, heads, groups = CONFIGS[name]
    cfg = _config(name)
    params = _params(cfg, tp)
    layout = model_layout(family, cfg, tp)
    assert (layout.num_heads, layout.num_groups, layout.replicated) == (heads, groups, False)
    spec = _spec(family, params, layout, spec_tokens)
    full = _spec(family, _params(_config(name), 1), spec_tokens=spec_tokens)
    R = spec.rows
    h, d1, d2 = params.shape.temporal
    assert h == heads // tp  # SGLang's temporal state is sharded by heads
    if family == "mamba2":  # temporal (H, P, N)
        want = {"x": (h, R, d1), "dt": (h, R), "B": (groups // tp, R, d2)}
    else:  # temporal (HV, V, K)
        want = {"u": (h, R, d1), "k": (groups // tp, R, d2), "v": (h, R, d1), "g": (h, R), "beta": (h, R)}
    assert {n: s for n, (s, _) in spec.tensors.items()} == want
    # Nothing replicated: the ranks' ring bytes add up to the TP-1 rings; each rank keeps its own cursors.
    assert tp * spec.bytes_per_slot_layer == full.bytes_per_slot_layer
    assert tp * spec.bytes_per_slot == full.bytes_per_slot + (tp - 1) * CURSOR_BYTES_PER_SLOT
    # Memory budget per rank: SGLang's per-slot state bytes shrink by the same factor as the rings, so
    # the budget hook (hooks/pool.py) gives the rings the same share of each slot as at TP 1.
    per_req_full = _params(_config(name), 1).mamba_cache_per_req
    assert tp * params.mamba_cache_per_req == per_req_full
    ring_full = full.bytes_per_slot - CURSOR_BYTES_PER_SLOT
    assert (spec.bytes_per_slot - CURSOR_BYTES_PER_SLOT) * per_req_full == ring_full * params.mamba_cache_per_req


@pytest.mark.parametrize("tp", [2, 4])
def test_single_group_is_replicated_on_every_rank(tp: int):
    """Mamba-2 with ``G == 1``: SGLang copies the group to every rank, so does the ``B`` ring."""
    cfg = _config("nemotron_h_tiny", n_groups=1)
    params = _params(cfg, tp)
    layout = model_layout("mamba2", cfg, tp)
    assert layout.replicated and layout.groups_per_rank == 1
    assert all(layout.groups(r) == range(0, 1) for r in range(tp))
    spec = _spec("mamba2", params, layout)
    full = _spec("mamba2", _params(_config("nemotron_h_tiny", n_groups=1), 1))
    assert spec.tensors["B"][0] == (1, WINDOW, 16) and spec.tensors["x"][0] == (8 // tp, WINDOW, 16)
    b_bytes = WINDOW * 16 * ACT.itemsize
    assert tp * spec.bytes_per_slot_layer == full.bytes_per_slot_layer + (tp - 1) * b_bytes


@pytest.mark.parametrize(
    ("name", "tp", "reason"),
    [
        ("nemotron_h_nano4b", 3, "3 does not divide the 8 Mamba-2 groups"),  # 96 heads divide
        ("nemotron_h_nano4b", 16, "16 does not divide the 8 Mamba-2 groups"),
        ("nemotron_h_nano4b", 5, "5 does not divide the 96 mamba heads"),
        ("nemotron_h_tiny", 4, "4 does not divide the 2 Mamba-2 groups"),
        ("qwen3_next_4b", 32, "32 does not divide the 16 linear key heads"),  # 32 value heads divide
        ("qwen3_5_4b", 3, "3 does not divide the 32 linear value heads"),
        ("qwen3_next_tiny", 4, "4 does not divide the 2 linear key heads"),
    ],
)
def test_refuses_layouts_sglang_cannot_shard(name: str, tp: int, reason: str):
    family = CONFIGS[name][0]
    with pytest.raises(ValueError, match=reason) as err:
        model_layout(family, _config(name), tp)
    valid = {"nemotron_h_nano4b": [1, 2, 4, 8], "nemotron_h_tiny": [1, 2], "qwen3_next_4b": [1, 2, 4, 8, 16],
             "qwen3_5_4b": [1, 2, 4, 8, 16], "qwen3_next_tiny": [1, 2]}[name]
    assert f"among {valid}" in str(err.value)


@pytest.mark.parametrize(
    ("name", "tp", "dp", "dp_attention", "refused"),
    [
        ("nemotron_h_nano4b", 2, 1, False, False),
        ("nemotron_h_nano4b", 16, 1, False, True),
        ("nemotron_h_nano4b", 16, 2, True, False),  # attention TP 8
        ("nemotron_h_nano4b", 16, 2, False, True),  # dp without DP attention: attention TP 16
        ("qwen3_5_4b", 32, 1, False, True),
        ("qwen3_5_4b", 32, 2, True, False),  # attention TP 16
        ("qwen3_next_tiny", 4, 1, False, True),
    ],
)
def test_startup_refusal_uses_the_attention_tp_size(name, tp, dp, dp_attention, refused):
    """What ``hooks/backends.validate_startup`` would refuse, from SGLang's ``ModelConfig`` and args."""
    from types import SimpleNamespace

    from sglang.srt.configs.model_config import ModelConfig

    args = SimpleNamespace(tp_size=tp, dp_size=dp, enable_dp_attention=dp_attention, attn_cp_size=1)
    message = startup_refusal(CONFIGS[name][0], ModelConfig(model_path=str(MODELS / name)), args)
    if refused:
        assert message is not None and f"attention-TP size {tp} cannot shard" in message
    else:
        assert message is None


def test_ring_spec_refuses_a_shape_that_is_not_the_layout():
    """SGLang's cache shape at TP 4 for 2 groups (it pads to 4 groups, 1 per rank) is not a
    layout ReplaySSM (or ``MambaMixer2``) can run; at TP 2 the shape must match the layout."""
    params = _params(_config("nemotron_h_tiny"), 4)
    assert _spec("mamba2", params).tensors["B"][0][0] == 1  # shape alone looks fine
    wrong = tp_layout(family="mamba2", num_heads=8, num_groups=2, tp_size=2)
    with pytest.raises(ValueError, match="expected 4 heads and 1 groups on each of 2 ranks.*got 2 heads"):
        _spec("mamba2", params, wrong)
    gdn = tp_layout(family="gdn", num_heads=8, num_groups=2, tp_size=2)
    with pytest.raises(ValueError, match="expected family 'mamba2', got 'gdn'"):
        _spec("mamba2", _params(_config("nemotron_h_tiny"), 2), gdn)


@pytest.mark.parametrize(("groups", "tp"), [(8, 2), (8, 4), (1, 2), (1, 4)])
def test_group_to_head_mapping_matches_sglangs_weight_loader(groups: int, tp: int, monkeypatch):
    """Load a conv1d bias whose entries name their channel through SGLang's
    ``mamba_v2_sharded_weight_loader`` (the GPU path: its CPU branch pads GDN q/k/v instead) and
    check which heads and groups each rank gets; every local head's local group must be the
    whole-model group of that head."""
    from sglang.srt.configs.mamba_utils import extra_groups_for_head_shards
    from sglang.srt.layers.attention.mamba import mamba as sg_mamba

    monkeypatch.setattr(sg_mamba, "is_cpu", lambda: False)
    H, P, N = 96, 80, 128
    inter = H * P
    layout = tp_layout(family="mamba2", num_heads=H, num_groups=groups, tp_size=tp)
    g_ext = groups + extra_groups_for_head_shards(groups, tp)
    spec_x = (inter, 0, False)
    spec_g = (g_ext * N, (g_ext - groups) * N, groups == 1)  # as MambaMixer2 sets it
    full = torch.arange(inter + 2 * groups * N, dtype=torch.float64)
    for rank in range(tp):
        shard = torch.full((inter // tp + 2 * g_ext * N // tp,), -1.0, dtype=torch.float64)
        sg_mamba.mamba_v2_sharded_weight_loader([spec_x, spec_g, spec_g], tp, rank)(shard, full)
        x_ch = shard[: inter // tp].long()
        b_ch = shard[inter // tp : inter // tp + layout.groups_per_rank * N].long() - inter
        c_ch = shard[inter // tp + layout.groups_per_rank * N :].long() - inter - groups * N
        assert torch.equal(x_ch // P, torch.tensor(layout.heads(rank)).repeat_interleave(P))
        want_g = torch.tensor(layout.groups(rank)).repeat_interleave(N)
        assert torch.equal(b_ch // N, want_g) and torch.equal(c_ch // N, want_g)
        for i, head in enumerate(layout.heads(rank)):
            assert layout.groups(rank)[layout.local_group_of_head(i)] == layout.group_of_head(head)


# ------------------------------------------------------------------------------------------------
# One decode cycle per rank == the matching slice of the TP-1 computation
# ------------------------------------------------------------------------------------------------

SIZE = 4
STEPS = 12
SMALL_WINDOW = 4


def _pool(family: str, tp: int, heads: int, groups: int, hd: int, sd: int) -> ReplayMambaPool:
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape

    shape = Mamba2StateShape.create(tp_world_size=tp, intermediate_size=heads * hd, n_groups=groups,
                                    num_heads=heads, head_dim=hd, state_size=sd, conv_kernel=4)
    params = Mamba2CacheParams(shape=shape, layers=[0], dtype=Mamba2StateDType(conv=ACT, temporal=torch.float32))
    pool = ReplayMambaPool(replay=ReplayPoolSpec(family=family, window=SMALL_WINDOW, act_dtype=ACT), size=SIZE,
                           spec_state_size=SIZE, cache_params=params, mamba_layer_ids=[0], device="cpu")
    for ring in pool.rings.values():
        ring.fill_(float("nan"))  # a read of a never-written row poisons the outputs
    return pool


def _slice(indices: range) -> slice:
    return slice(indices.start, indices.stop)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def _step_rows(gen: torch.Generator, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    slots = torch.tensor([1, -1, 3, 2] if step % 3 else [3, 2, -1, 1], dtype=torch.int32)
    force = (torch.rand(4, generator=gen) < 0.15) & (slots >= 0)
    return slots, force


def _cursor_steps(pools: list[ReplayMambaPool], slots, force):
    steps = [build_eager(cursors=p.cursors, slot_idx=slots, num_prefills=0, num_decodes=len(slots),
                         track_mask=force, window=SMALL_WINDOW, rows=p.ring_spec.rows) for p in pools]
    # Every rank's cursor step reads only the batch (the same on every rank): same snapshot, same cursors.
    for s in steps[1:]:
        for f in ("ring_start", "ring_len", "flush"):
            assert torch.equal(getattr(s, f), getattr(steps[0], f)), f
    for p in pools[1:]:
        assert torch.equal(p.cursors, pools[0].cursors)
    return steps


@pytest.mark.parametrize(("groups", "tp"), [(2, 2), (4, 4), (1, 2)], ids=["G2-tp2", "G4-tp4", "G1-tp2-replicated"])
def test_mamba2_rank_decode_equals_tp1_slice(groups: int, tp: int):
    H, P, N = 8, 4, 8
    gen = torch.Generator().manual_seed(9 + groups + tp)
    full = _pool("mamba2", 1, H, groups, P, N)
    layout = tp_layout(family="mamba2", num_heads=H, num_groups=groups, tp_size=tp)
    ranks = [_pool("mamba2", tp, H, groups, P, N) for _ in range(tp)]
    full.mamba_cache.temporal.copy_(torch.randn(full.mamba_cache.temporal.shape, generator=gen) * 0.5)
    hs = [_slice(layout.heads(r)) for r in range(tp)]
    gs = [_slice(layout.groups(r)) for r in range(tp)]
    for r, p in enumerate(ranks):
        p.mamba_cache.temporal.copy_(full.mamba_cache.temporal[:, :, hs[r]])
    A = -torch.empty(H).uniform_(1.0, 8.0, generator=gen)
    dt_bias, D = torch.randn(H, generator=gen) * 0.1, torch.randn(H, generator=gen)
    flushes = 0
    for step in range(STEPS):
        slots, force = _step_rows(gen, step)
        steps = _cursor_steps([full, *ranks], slots, force)
        flushes += int(steps[0].flush.sum())
        x = torch.randn(4, H, P, generator=gen).to(ACT)
        dt = (torch.randn(4, H, generator=gen) * 0.5).to(ACT)
        B = (torch.randn(4, groups, N, generator=gen) / math.sqrt(N)).to(ACT)
        C = torch.randn(4, groups, N, generator=gen).to(ACT)
        outs = []
        for r, (p, st) in enumerate(zip([full, *ranks], steps)):
            h, g = (slice(None), slice(None)) if r == 0 else (hs[r - 1], gs[r - 1])
            out = torch.full_like(x[:, h], float("nan"))
            mamba2_replay_decode_ref(
                p.mamba_cache.temporal[0], p.rings["x"][0], p.rings["dt"][0], p.rings["B"][0],
                x[:, h], dt[:, h], A[h], B[:, g], C[:, g], out, st.slot_idx, st.ring_start, st.ring_len, st.flush,
                D=D[h], dt_bias=dt_bias[h], dt_softplus=True,
            )
            outs.append(out)
        gathered = torch.cat(outs[1:], dim=1)  # the all-gather SGLang's out_proj does (row-parallel)
        pad = slots < 0
        assert gathered[pad].isnan().all() and outs[0][pad].isnan().all()  # padding rows untouched
        rel = _rel(gathered[~pad], outs[0][~pad])
        assert rel == 0.0, f"step {step}: rank outputs vs TP-1 slice {rel:.3e}"
    assert 0 < flushes < STEPS * 3
    for r, p in enumerate(ranks):
        assert torch.equal(p.mamba_cache.temporal, full.mamba_cache.temporal[:, :, hs[r]])
        # never-written rows are NaN in both (nan_to_num makes them comparable)
        for name, idx in (("x", hs[r]), ("dt", hs[r]), ("B", gs[r])):
            assert torch.equal(p.rings[name].nan_to_num(7.0), full.rings[name][:, :, idx].nan_to_num(7.0)), name


def test_gdn_rank_decode_equals_tp1_slice():
    HV, Hk, V, K, tp = 8, 4, 8, 8, 2
    gen = torch.Generator().manual_seed(91)
    full = _pool("gdn", 1, HV, Hk, V, K)
    layout = tp_layout(family="gdn", num_heads=HV, num_groups=Hk, tp_size=tp)
    ranks = [_pool("gdn", tp, HV, Hk, V, K) for _ in range(tp)]
    full.mamba_cache.temporal.copy_(torch.randn(full.mamba_cache.temporal.shape, generator=gen) * 0.1)
    hs = [_slice(layout.heads(r)) for r in range(tp)]
    ks = [_slice(layout.groups(r)) for r in range(tp)]
    for r, p in enumerate(ranks):
        p.mamba_cache.temporal.copy_(full.mamba_cache.temporal[:, :, hs[r]])
    A_log = torch.empty(HV).uniform_(0.0, 1.5, generator=gen)
    dt_bias = torch.randn(HV, generator=gen) * 0.1
    flushes = 0
    for step in range(STEPS):
        slots, force = _step_rows(gen, step)
        steps = _cursor_steps([full, *ranks], slots, force)
        flushes += int(steps[0].flush.sum())
        q = torch.randn(4, Hk, K, generator=gen).to(ACT)
        k = torch.randn(4, Hk, K, generator=gen).to(ACT)
        v = torch.randn(4, HV, V, generator=gen).to(ACT)
        a = torch.randn(4, HV, generator=gen).to(ACT)
        b = torch.randn(4, HV, generator=gen).to(ACT)
        outs = []
        for r, (p, st) in enumerate(zip([full, *ranks], steps)):
            h, kh = (slice(None), slice(None)) if r == 0 else (hs[r - 1], ks[r - 1])
            out = torch.full_like(v[:, h], float("nan"))
            rg = p.rings
            gdn_replay_decode_ref(
                p.mamba_cache.temporal[0], rg["u"][0], rg["k"][0], rg["v"][0], rg["g"][0], rg["beta"][0],
                q[:, kh], k[:, kh], v[:, h], a[:, h], b[:, h], A_log[h], dt_bias[h], out,
                st.slot_idx, st.ring_start, st.ring_len, st.flush, scale=K**-0.5,
            )
            outs.append(out)
        gathered = torch.cat(outs[1:], dim=1)
        pad = slots < 0
        assert gathered[pad].isnan().all() and outs[0][pad].isnan().all()
        rel = _rel(gathered[~pad], outs[0][~pad])
        assert rel == 0.0, f"step {step}: rank outputs vs TP-1 slice {rel:.3e}"
    assert 0 < flushes < STEPS * 3
    for r, p in enumerate(ranks):
        assert torch.equal(p.mamba_cache.temporal, full.mamba_cache.temporal[:, :, hs[r]])
        for name, idx in (("u", hs[r]), ("v", hs[r]), ("g", hs[r]), ("beta", hs[r]), ("k", ks[r])):
            assert torch.equal(p.rings[name].nan_to_num(7.0), full.rings[name][:, :, idx].nan_to_num(7.0)), name
