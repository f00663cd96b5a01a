"""Issue 6: with ``--replayssm-verify replay`` the memory solve reserves no per-draft SSM states.

SGLang 0.5.17's ``KVCacheConfigurator._handle_max_mamba_cache`` (the real function, run on a CPU with
the tiny Nemotron-H's real ``ModelConfig`` and published ``ServerArgs``) reserves
``intermediate_ssm`` (``T`` snapshots per running request) inside the mamba budget when speculative
decoding is on.  Through ``hooks/pool.around_handle_max_mamba_cache``:

- ``verify="replay"``, linear chains: the budget is solved as without speculation, then re-solved
  with the ring bytes: the same slot count as a server without speculation whose ring has the
  speculative rows;
- ``verify="auto"``: SGLang's reserve is kept (the snapshot fallback may read the buffer), then the
  ring re-solve;
- the configurator's ``spec_algorithm`` is the same object afterwards.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

import make_model  # noqa: E402

# One worker for the file: the module fixture (the materialised model) is built once.
pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.xdist_group("spec-memory")]

BUDGET_GB = 10.0  # what the caller would pass as total_rest_memory
SPEC = {"speculative_algorithm": "STANDALONE", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_model.materialize("nemotron_h_tiny", tmp_path_factory.mktemp("spec_mem") / "nemotron_h_tiny")


@pytest.fixture(autouse=True)
def single_rank():
    from sglang.srt.runtime_context import get_context, get_parallel

    ctx = get_context()
    saved = ctx._server_args, ctx._config_bags
    with get_parallel().override(attn_tp_size=1):
        yield
    ctx._server_args, ctx._config_bags = saved


def _configurator(model: Path, spec: bool):
    """A configurator stub with the attributes ``_handle_max_mamba_cache`` and our hook read."""
    from sglang.srt.configs.hybrid_arch import hybrid_gdn_config, mambaish_config
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.runtime_context import get_context
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    extra = {**SPEC, "speculative_draft_model_path": str(model)} if spec else {}
    # radix cache on (no_buffer): SGLang derives the slot count from the memory budget
    args = ServerArgs(model_path=str(model), device="cpu", mamba_radix_cache_strategy="no_buffer",
                      disable_overlap_schedule=True, **extra)
    get_context().set_server_args(args)
    mc = ModelConfig.from_server_args(args)
    stub = types.SimpleNamespace(
        model_config=mc, server_args=args, mambaish_config=mambaish_config(mc), hybrid_gdn_config=hybrid_gdn_config(mc),
        spec_algorithm=SpeculativeAlgorithm.from_string(args.speculative_algorithm),
        ps=types.SimpleNamespace(pp_size=1, attn_dp_size=1),
        layer_info=types.SimpleNamespace(start_layer=0, end_layer=mc.num_hidden_layers),
    )
    stub._calculate_mamba_ratio = lambda: KVCacheConfigurator._calculate_mamba_ratio(stub)
    return stub


def _slots(model: Path, spec: bool, verify: str | None, monkeypatch) -> tuple[int, object]:
    """Mamba slots SGLang publishes after the solve (``verify=None``: stock, no hook)."""
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.runtime_context import get_schedule

    from sglang_replayssm.config import ReplaySSMConfig
    from sglang_replayssm.hooks.pool import around_handle_max_mamba_cache

    if verify is not None:
        monkeypatch.setenv("SGLANG_REPLAYSSM_CONFIG", ReplaySSMConfig(backend="replay", verify=verify).to_env())
    stub = _configurator(model, spec)
    before = stub.spec_algorithm
    original = KVCacheConfigurator._handle_max_mamba_cache
    if verify is None:
        original(stub, BUDGET_GB)
    else:
        around_handle_max_mamba_cache(original, stub, BUDGET_GB)
    assert stub.spec_algorithm is before
    return get_schedule().max_mamba_cache_size, stub


def _ring_resolve(k: int, stub) -> int:
    from sglang_replayssm.hooks.pool import ring_bytes_per_slot

    per_req = stub.mambaish_config.mamba2_cache_params.mamba_cache_per_req
    return (k + 1) * per_req // (per_req + ring_bytes_per_slot(stub)) - 1


def test_replay_verify_reserves_no_draft_states(model, monkeypatch):
    no_spec, _ = _slots(model, spec=False, verify=None, monkeypatch=monkeypatch)
    stock_spec, _ = _slots(model, spec=True, verify=None, monkeypatch=monkeypatch)
    replay_spec, stub = _slots(model, spec=True, verify="replay", monkeypatch=monkeypatch)
    assert stock_spec < no_spec  # SGLang's reserve for T = 4 snapshots per request
    assert replay_spec == _ring_resolve(no_spec, stub)
    print(f"mamba slots at {BUDGET_GB} GB: stock no spec {no_spec}, stock spec {stock_spec}, replay spec {replay_spec}")


def test_auto_verify_keeps_the_reserve(model, monkeypatch):
    stock_spec, _ = _slots(model, spec=True, verify=None, monkeypatch=monkeypatch)
    auto_spec, stub = _slots(model, spec=True, verify="auto", monkeypatch=monkeypatch)
    assert auto_spec == _ring_resolve(stock_spec, stub)


@pytest.mark.parametrize(("verify", "topk", "needs"), [
    ("replay", 1, False), ("replay", None, False), ("replay", 2, True), ("auto", 1, True), ("snapshot", 1, True),
])
def test_needs_draft_states(verify, topk, needs):
    from sglang_replayssm.config import ReplaySSMConfig

    assert ReplaySSMConfig(backend="replay", verify=verify).needs_draft_states(topk) is needs
