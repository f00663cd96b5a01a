"""CPU tests of ``benchmarks/bench_serving_ab.py`` (the serving A/B the lead runs on the H200).

- argument parsing and defaults; the server flags parse with SGLang 0.5.17's own ``ServerArgs``
  parser, and every bench_serving flag exists in 0.5.17's ``sglang/benchmark/serving.py``;
- the table from fake bench_serving JSONL output (ratios, targets, skipped / failed runs, probe);
- the greedy comparison;
- the shape-faithful presets: config fields against ``benchmarks/shapes.py`` (the kernel benchmark's
  shapes), full-size tensor shapes and parameter counts on the meta device (nothing allocated), and
  the generator's code path at tiny scale on CPU (sharded safetensors + index + tokenizer).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import bench_serving_ab as ab
from benchmarks.shapes import NANO_4B, QWEN35_4B

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "models"))

import make_model  # noqa: E402


def _cfg(name: str) -> dict:
    return json.loads((ROOT / "tests" / "models" / name / "config.json").read_text())


# ----------------------------------------------------------------------------- arguments


def test_defaults_mamba2():
    a = ab.parse_args(["--out", "/tmp/x", "--commit", "abc123"])
    assert a.family == "mamba2" and a.model == "nemotron_h_nano4b"
    assert a.concurrency == [1, 64, 256] and a.num_prompts == [8, 128, 512]
    assert (a.input_len, a.output_len, a.window) == (512, 256, 16)
    assert a.max_running_requests == 256 and a.cuda_graph_max_bs == 256
    assert a.max_total_tokens >= 256 * (512 + 256)
    assert a.conv_dtype == "bfloat16" and a.commit == "abc123"
    assert a.model_dir == "/tmp/replayssm_bench_models/nemotron_h_nano4b"


def test_gdn_and_overrides():
    a = ab.parse_args(["--family", "gdn", "--concurrency", "2,8", "--num-prompts", "4,16", "--time-budget", "90",
                       "--model", "qwen3_5_4b", "--window", "8"])
    assert a.model == "qwen3_5_4b" and a.concurrency == [2, 8] and a.num_prompts == [4, 16]
    assert a.max_running_requests == 8 and a.time_budget == 90 and a.window == 8
    assert ab.parse_args(["--family", "gdn"]).model == "qwen3_next_4b"
    cpu = ab.parse_args(["--device", "cpu"])
    assert cpu.model == "nemotron_h_tiny" and cpu.concurrency == [1, 4] and cpu.conv_dtype is None


@pytest.mark.parametrize("argv", [
    ["--concurrency", "1,64", "--num-prompts", "4"],
    ["--concurrency", "0"],
    ["--concurrency", "a,b"],
    ["--window", "0"],
    ["--time-budget", "0"],
    ["--family", "llama"],
])
def test_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit):
        ab.parse_args(argv)


def test_server_flags_identical_but_backend():
    a = ab.parse_args(["--server-args", "--chunked-prefill-size 4096"])
    base = ab.server_base_flags(a)
    assert base[base.index("--mem-fraction-static") + 1] == "0.7"
    assert base[base.index("--cuda-graph-max-bs-decode") + 1] == "256"
    assert base[base.index("--max-running-requests") + 1] == "256"
    assert "--disable-radix-cache" in base and "--disable-cuda-graph" not in base
    assert base[-2:] == ["--chunked-prefill-size", "4096"]
    assert ab.variant_args("stock", 16) == ["--ssm-backend", "default"]
    assert ab.variant_args("replay", 16) == ["--ssm-backend", "replay", "--replayssm-window", "16"]
    assert "--disable-radix-cache" not in ab.server_base_flags(ab.parse_args(["--keep-radix-cache"]))
    with pytest.raises(ValueError):
        ab.variant_args("other", 16)


def test_server_flags_parse_with_sglang():
    """The shared flags are valid ``launch_server`` flags of SGLang 0.5.17 (the plug-in's are tested elsewhere)."""
    from sglang.srt.server_args import ServerArgs

    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
    ns = p.parse_args(["--model-path", "/m", *ab.server_base_flags(ab.parse_args([]))])
    assert ns.disable_radix_cache and ns.max_running_requests == 256 and ns.mem_fraction_static == 0.7
    assert ns.load_format == "safetensors" and ns.dtype == "bfloat16"
    p.parse_args(["--model-path", "/m", *ab.server_base_flags(ab.parse_args(["--device", "cpu"]))])


def test_bench_cmd_flags_exist_in_bench_serving():
    import sglang

    src = (Path(sglang.__file__).parent / "benchmark" / "serving.py").read_text()
    a = ab.parse_args([])
    cmd = ab.bench_cmd(a, "/m", 30000, 64, 128, "/tmp/o.jsonl", "stock-c64")
    assert cmd[1:3] == ["-m", "sglang.bench_serving"]
    flags = [c for c in cmd[3:] if c.startswith("--")]
    for f in flags:
        assert f'"{f}"' in src, f"bench_serving 0.5.17 has no {f}"
    kv = dict(zip(cmd[3::1], cmd[4::1]))
    assert kv["--dataset-name"] == "random-ids" and kv["--random-range-ratio"] == "1.0"
    assert kv["--max-concurrency"] == "64" and kv["--num-prompts"] == "128"
    assert kv["--random-input-len"] == "512" and kv["--random-output-len"] == "256"
    assert kv["--output-file"] == "/tmp/o.jsonl"


# ----------------------------------------------------------------------------- results


def _fake_line(tput: float, tpot: float, itl: float, c: int, n: int) -> dict:
    # the keys bench_serving 0.5.17 writes (subset) plus server_info, which we drop
    return {"tag": "x", "backend": "sglang", "dataset_name": "random-ids", "max_concurrency": c,
            "completed": n, "output_throughput": tput, "median_tpot_ms": tpot, "median_itl_ms": itl,
            "mean_tpot_ms": tpot, "server_info": {"big": "blob"}}


def test_table_from_fake_jsonl(tmp_path: Path):
    runs: dict[int, dict] = {}
    fake = {
        1: ((200.0, 5.0, 5.0), (198.0, 5.05, 5.04)),
        64: ((5000.0, 12.0, 11.9), (6000.0, 10.0, 9.9)),
        256: ((10000.0, 25.0, 24.0), (14000.0, 17.8, 17.5)),
    }
    for c, (s, r) in fake.items():
        runs[c] = {"num_prompts": 8 if c == 1 else 2 * c}
        for v, vals in (("stock", s), ("replay", r)):
            f = tmp_path / f"{v}-{c}.jsonl"
            # bench_serving appends: an older line first, the run's line last
            f.write_text(json.dumps(_fake_line(1.0, 1.0, 1.0, c, 1)) + "\n"
                         + json.dumps(_fake_line(*vals, c, runs[c]["num_prompts"])) + "\n\n")
            runs[c][v] = ab.read_bench_jsonl(f)
    assert ab.read_bench_jsonl(tmp_path / "missing.jsonl") is None
    probe = ab.compare_greedy(
        [{"tokens": [1, 2, 3], "logprobs": [-0.1, -0.2, -0.3]}, {"tokens": [4, 5], "logprobs": [-1.0, -1.0]}],
        [{"tokens": [1, 2, 3], "logprobs": [-0.1, -0.25, -0.3]}, {"tokens": [4, 6], "logprobs": [-1.5, -2.0]}],
    )
    meta = {"model": "nemotron_h_nano4b", "family": "mamba2", "window": 16, "commit": "abc", "date": "d",
            "gpu": "NVIDIA H200", "input_len": 512, "output_len": 256, "server_flags": "--x",
            "probe": probe, "probe_new_tokens": 3, "warnings": ["something odd"]}
    table = ab.build_table(runs, meta)
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert len(rows) == 3
    cells = {int(r.split("|")[1]): [x.strip() for x in r.split("|")[1:-1]] for r in rows}
    assert cells[256][2:5] == ["10000.0", "14000.0", "1.400"]
    assert cells[256][7] == f"{17.8 / 25.0:.3f}"
    assert cells[1][4] == "0.990" and cells[64][4] == "1.200"
    assert cells[64][-1] == "128/128"
    assert "target c=256: output throughput x >= 1.30: 1.400 met" in table
    assert "target c=1: output throughput x >= 0.98: 0.990 met" in table
    assert "1/2 token-identical" in table and "earliest divergence at token 1" in table
    assert "WARNING: something odd" in table
    # a skipped / failed run: dashes, no crash, target not measured
    runs[256]["replay"] = {"skipped": "time budget"}
    runs[64]["stock"] = {"error": "bench_serving exit 1"}
    table = ab.build_table(runs, meta)
    assert "target c=256: output throughput x >= 1.30: — not measured" in table
    assert "| 10000.0 | — | — |" in table and "skipped" in table and "failed/128" in table
    # other models carry no target lines
    assert "target" not in ab.build_table(runs, {**meta, "model": "nemotron_h_tiny"})


def test_compare_greedy():
    same = {"tokens": [5, 6, 7], "logprobs": [-0.5, -0.6, -0.7]}
    r = ab.compare_greedy([same, same, {"error": "boom"}], [same, {"tokens": [5, 6], "logprobs": [-0.5, -0.6]},
                                                           same])
    assert r["requests"] == 3 and r["token_identical"] == 1
    assert r["per_request"][1]["first_diff"] == 2 and r["per_request"][2]["error"] == "boom"
    assert r["max_logprob_diff_common_prefix"] == 0.0


# ----------------------------------------------------------------------------- presets


def test_nemotron_nano4b_config_fields():
    c = _cfg("nemotron_h_nano4b")
    pat = c["hybrid_override_pattern"]
    assert (len(pat), pat.count("M"), pat.count("*"), pat.count("-")) == (42, 21, 4, 17)
    assert c["num_hidden_layers"] == len(pat)
    assert (c["mamba_num_heads"], c["mamba_head_dim"], c["ssm_state_size"], c["mamba_n_groups"]) == (
        NANO_4B.H, NANO_4B.P, NANO_4B.N, NANO_4B.G)
    assert pat.count("M") == NANO_4B.layers and c["n_groups"] == c["mamba_n_groups"]
    assert c["conv_kernel"] == c["mamba_d_conv"] == 4 and c["hidden_size"] == 3136
    assert c["architectures"] == ["NemotronHForCausalLM"] and c["torch_dtype"] == "bfloat16"


@pytest.mark.parametrize("name,arch", [("qwen3_next_4b", "Qwen3NextForCausalLM"), ("qwen3_5_4b", "Qwen3_5ForCausalLM")])
def test_qwen_4b_config_fields(name: str, arch: str):
    c = _cfg(name)
    assert c["architectures"] == [arch]
    gdn_layers = c["num_hidden_layers"] - c["num_hidden_layers"] // c["full_attention_interval"]
    assert gdn_layers == QWEN35_4B.layers == 24
    assert (c["linear_num_value_heads"], c["linear_num_key_heads"], c["linear_key_head_dim"],
            c["linear_value_head_dim"]) == (QWEN35_4B.HV, QWEN35_4B.Hk, QWEN35_4B.K, QWEN35_4B.V)
    if name == "qwen3_next_4b":  # MoE only: all experts active + shared = Qwen3.5-4B's dense width
        assert c["num_experts_per_tok"] == c["num_experts"]
        assert c["num_experts"] * c["moe_intermediate_size"] + c["shared_expert_intermediate_size"] == 9216


class _MetaGen:
    """Stands in for ``make_model._Gen``: right shapes, no memory."""

    def normal(self, *shape, std):
        return torch.empty(*shape, device="meta")

    def uniform(self, *shape, lo, hi):
        return torch.empty(*shape, device="meta")

    def linear(self, out_f, in_f, gain=1.0):
        return torch.empty(out_f, in_f, device="meta")

    def norm(self, n):
        return torch.empty(n, device="meta")


@pytest.mark.parametrize("name,lo,hi", [("nemotron_h_nano4b", 3.6e9, 4.4e9), ("qwen3_next_4b", 4.0e9, 5.5e9),
                                        ("qwen3_5_4b", 4.0e9, 5.5e9)])
def test_full_size_shapes_on_meta(name: str, lo: float, hi: float):
    builder, _ = make_model._BUILDERS[name]
    c = _cfg(name)
    w = builder(c, _MetaGen())
    n = sum(t.numel() for t in w.values())
    assert lo < n < hi, f"{name}: {n / 1e9:.2f} B parameters"
    if name == "nemotron_h_nano4b":
        i = c["hybrid_override_pattern"].index("M")
        inner = NANO_4B.H * NANO_4B.P
        assert w[f"backbone.layers.{i}.mixer.in_proj.weight"].shape == (
            2 * inner + 2 * NANO_4B.G * NANO_4B.N + NANO_4B.H, 3136)
        assert w[f"backbone.layers.{i}.mixer.A_log"].shape == (NANO_4B.H,)
        assert sum(k.endswith("mixer.A_log") for k in w) == 21
    else:
        la = "model.layers.0.linear_attn"
        if name == "qwen3_next_4b":  # packed [q | k | v | z] per key head
            assert w[f"{la}.in_proj_qkvz.weight"].shape == (
                QWEN35_4B.qkv_dim + QWEN35_4B.HV * QWEN35_4B.V, c["hidden_size"])
        else:
            assert w[f"{la}.in_proj_qkv.weight"].shape == (QWEN35_4B.qkv_dim, c["hidden_size"])
        assert w[f"{la}.A_log"].shape == (QWEN35_4B.HV,)
        assert sum(k.endswith("linear_attn.A_log") for k in w) == 24


def _shrink(name: str) -> dict:
    c = _cfg(name)
    c.update(vocab_size=300, hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    if name.startswith("nemotron"):
        c.update(intermediate_size=96, mamba_num_heads=8, mamba_head_dim=8, ssm_state_size=16,
                 mamba_n_groups=2, n_groups=2)
    else:
        c.update(intermediate_size=96, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                 linear_value_head_dim=16)
        if "num_experts" in c:
            c.update(moe_intermediate_size=16, shared_expert_intermediate_size=32)
    return c


@pytest.mark.parametrize("name", ["nemotron_h_nano4b", "qwen3_next_4b", "qwen3_5_4b"])
def test_generator_at_tiny_scale(name: str, tmp_path: Path):
    from safetensors import safe_open

    cfg = _shrink(name)
    out = make_model.materialize(name, tmp_path / name, dtype=torch.bfloat16, config=cfg, shard_bytes=200_000)
    assert json.loads((out / "config.json").read_text()) == cfg
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all((out / s).exists() for s in shards)
    expected = make_model._BUILDERS[name][0](cfg, _MetaGen())
    assert set(index["weight_map"]) == set(expected)
    total = 0
    for s in shards:
        with safe_open(str(out / s), "pt") as f:
            for k in f.keys():
                t = f.get_tensor(k)
                assert t.dtype == torch.bfloat16 and tuple(t.shape) == tuple(expected[k].shape), k
                assert torch.isfinite(t.float()).all(), k
                total += t.numel() * 2
    assert total == index["metadata"]["total_size"]
    # deterministic: the same seed gives the same bytes
    again = make_model.materialize(name, tmp_path / "again", dtype=torch.bfloat16, config=cfg, shard_bytes=200_000)
    assert all((out / s).read_bytes() == (again / s).read_bytes() for s in shards)
    # idempotent: a complete directory is left as is
    assert make_model.materialize(name, out, dtype=torch.bfloat16, config=cfg, shard_bytes=200_000) == out
    tok = json.loads((out / "tokenizer.json").read_text())
    assert len(tok["model"]["vocab"]) == cfg["vocab_size"]
    # realistic decay parameters: exp(A * softplus(dt_bias)) within (0.75, 1)
    key = next(k for k in index["weight_map"] if k.endswith("A_log"))
    with safe_open(str(out / index["weight_map"][key]), "pt") as f:
        a_log = f.get_tensor(key).float()
    with safe_open(str(out / index["weight_map"][key.replace("A_log", "dt_bias")]), "pt") as f:
        dt = torch.nn.functional.softplus(f.get_tensor(key.replace("A_log", "dt_bias")).float())
    decay = torch.exp(-torch.exp(a_log) * dt)
    assert 0.6 < decay.min() and decay.max() < 1.0 and not math.isnan(decay.mean())
