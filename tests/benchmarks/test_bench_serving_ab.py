"""CPU tests of ``benchmarks/bench_serving_ab.py`` (the serving A/B the lead runs on the H200).

- argument parsing and defaults; the server flags parse with SGLang 0.5.17's own ``ServerArgs``
  parser, and every bench_serving flag exists in 0.5.17's ``sglang/benchmark/serving.py``;
- the table from fake bench_serving JSONL output (ratios, targets, skipped / failed runs, probe);
- the greedy comparison;
- ``--dataset generated-shared-prefix``: arguments, server flags (radix cache on, no strategy forced),
  the bench_serving command parsed by 0.5.17's own CLI and its gsp dataset built from it, the hit-rate
  parsers on output recorded from a real CPU smoke run (``--device cpu --dataset
  generated-shared-prefix``, 2026-11-29, ~5 min, too slow for CI), the table and targets, and
  ``main()`` end to end with fake servers and a fake bench_serving (the real one's recorded output);
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
    assert ab.variant_args("replay", 16, replay_args="--replayssm-read-dtype bf16")[-2:] == [
        "--replayssm-read-dtype", "bf16"]
    assert ab.variant_args("stock", 16, replay_args="--replayssm-read-dtype bf16") == ["--ssm-backend", "default"]
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


# ----------------------------------------------------------------------------- generated-shared-prefix

GSP = ["--dataset", "generated-shared-prefix"]

#: bench_serving's result line of the CPU smoke run (stock-c1), trimmed to the keys we read
RECORDED_GSP_LINE = (
    '{"tag": "stock-c1", "backend": "sglang", "dataset_name": "generated-shared-prefix", "request_rate": Infinity, '
    '"max_concurrency": 1, "completed": 4, "output_throughput": 22.406889402576002, '
    '"mean_ttft_ms": 324.83232475078694, "median_ttft_ms": 329.15578150095826, "mean_tpot_ms": 24.911366916664218, '
    '"median_tpot_ms": 25.044443500034202, "median_itl_ms": 24.27446849833359, "server_info": {"big": "blob"}, '
    '"cache_report": {"total_prompt_tokens": 320, "total_cached_tokens": 0, "cache_hit_rate_pct": 0.0, '
    '"device_cached_tokens": null, "host_cached_tokens": null, "storage_cached_tokens": null, '
    '"storage_backend": null}}'
)

#: server_stock.log of the same run around stock-c1 (recorded when bench_serving still sent a warm-up
#: request before its own --flush-cache: a prefill, the flush, two of the four measured requests); CPU
#: no_buffer: a new question after a shared prefix has no mamba state
RECORDED_LOG = """\
[2026-11-29 15:32:58] INFO:     127.0.0.1:34410 - "POST /generate HTTP/1.1" 200 OK
[2026-11-29 15:32:58] Prefill batch, #new-seq: 1, #new-token: 80, #cached-token: 0, full token usage: 0.00, \
mamba usage: 0.12, #running-req: 0, #queue-req: 0, #pending-token: 0, cpu graph: False, input throughput (token/s): 2.07
[2026-11-29 15:32:59] Reset HybridReqToTokenPool
[2026-11-29 15:32:59] Cache flushed successfully!
[2026-11-29 15:32:59] INFO:     127.0.0.1:34418 - "POST /flush_cache HTTP/1.1" 200 OK
[2026-11-29 15:33:00] Prefill batch, #new-seq: 1, #new-token: 80, #cached-token: 0, full token usage: 0.00, \
mamba usage: 0.12, #running-req: 0, #queue-req: 0, #pending-token: 0, cpu graph: False, input throughput (token/s): 48.32
[2026-11-29 15:33:02] Decode batch, #running-req: 1, #full token: 90, full token usage: 0.01, mamba num: 2, \
mamba usage: 0.12, cpu graph: False, gen throughput (token/s): 0.88, #queue-req: 0
[2026-11-29 15:33:02] Prefill batch, #new-seq: 1, #new-token: 80, #cached-token: 0, full token usage: 0.00, \
mamba usage: 0.12, #running-req: 0, #queue-req: 0, #pending-token: 0, cpu graph: False, input throughput (token/s): 119.75
"""


def _prefill(new_seq: int, new: int, cached: int) -> str:
    """A log line in 0.5.17's format (``metrics_reporter.report_prefill_stats``, GPU: ``cuda graph``)."""
    return (f"[2026-11-29 12:00:00] Prefill batch, #new-seq: {new_seq}, #new-token: {new}, #cached-token: {cached}, "
            "full token usage: 0.01, mamba usage: 0.10, #running-req: 3, #queue-req: 0, #pending-token: 0, "
            "cuda graph: False, input throughput (token/s): 12345.67\n")


def test_gsp_defaults():
    a = ab.parse_args(GSP)
    assert a.dataset == "generated-shared-prefix" and a.concurrency == [1, 16, 64]
    assert (a.gsp_prompts_per_group, a.gsp_system_prompt_len, a.gsp_question_len, a.gsp_output_len) == (
        16, 2048, 128, 256)
    assert a.gsp_num_groups == [1, 4, 16] and a.num_prompts == [16, 64, 256]
    assert a.max_running_requests == 64 and a.cuda_graph_max_bs == 64
    assert a.max_mamba_cache_size == 5 * 64 + 2 * 16
    assert a.max_total_tokens == 64 * (2048 + 128 + 256 + 64) + 16 * (2048 + 128) + 8192
    cpu = ab.parse_args([*GSP, "--device", "cpu"])
    assert cpu.concurrency == [1, 4] and cpu.gsp_num_groups == [1, 4] and cpu.num_prompts == [4, 16]
    assert cpu.max_mamba_cache_size is None  # the CPU flags carry their own
    o = ab.parse_args([*GSP, "--concurrency", "8,32", "--gsp-num-groups", "3", "--gsp-prompts-per-group", "5",
                       "--gsp-system-prompt-len", "1000", "--gsp-question-len", "50", "--gsp-output-len", "70"])
    assert o.gsp_num_groups == [3, 3] and o.num_prompts == [15, 15] and o.max_mamba_cache_size == 5 * 32 + 6
    assert ab.parse_args([*GSP, "--concurrency", "8,32", "--gsp-num-groups", "2,6"]).num_prompts == [32, 96]
    # random-ids is unchanged
    r = ab.parse_args([])
    assert r.dataset == "random-ids" and r.concurrency == [1, 64, 256] and r.max_mamba_cache_size is None


@pytest.mark.parametrize("argv", [
    [*GSP, "--num-prompts", "8,16,32"],
    [*GSP, "--concurrency", "1,2,3", "--gsp-num-groups", "1,2"],
    [*GSP, "--gsp-prompts-per-group", "0"],
    [*GSP, "--gsp-system-prompt-len", "0"],
    ["--gsp-num-groups", "4"],
    ["--dataset", "sharegpt"],
])
def test_gsp_bad_arguments(argv):
    with pytest.raises(SystemExit):
        ab.parse_args(argv)


def test_gsp_server_flags_parse_with_sglang():
    """Radix cache on for both servers, the mamba pool sized, no radix strategy forced (SGLang's auto)."""
    from sglang.srt.server_args import ServerArgs

    a = ab.parse_args(GSP)
    base = ab.server_base_flags(a)
    assert "--disable-radix-cache" not in base and "--mamba-radix-cache-strategy" not in base
    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
    ns = p.parse_args(["--model-path", "/m", *base])
    assert not ns.disable_radix_cache and ns.mamba_radix_cache_strategy == "auto"
    assert ns.max_mamba_cache_size == 352 and ns.max_running_requests == 64 and ns.max_total_tokens == a.max_total_tokens
    # the CPU smoke mode keeps tests/e2e/server.py's flags (no_buffer, the strategy a CPU runs)
    assert "--disable-radix-cache" not in ab.server_base_flags(ab.parse_args([*GSP, "--device", "cpu"]))


def _bench_serving_args(monkeypatch, cmd: list[str]) -> argparse.Namespace:
    """``cmd`` parsed by bench_serving 0.5.17's own ``cli_main`` (its run stubbed out)."""
    from sglang.benchmark import serving

    seen = {}
    monkeypatch.setattr(serving, "run_benchmark", lambda ns: seen.setdefault("args", ns))
    monkeypatch.setattr(sys, "argv", ["bench_serving", *cmd[3:]])
    serving.cli_main()
    return seen["args"]


def test_bench_cmds_parse_with_bench_serving(monkeypatch, tmp_path: Path):
    from sglang.benchmark.datasets.generated_shared_prefix import GeneratedSharedPrefixDataset

    r = _bench_serving_args(monkeypatch, ab.bench_cmd(ab.parse_args([]), "/m", 30001, 64, 128, "/o.jsonl", "t"))
    assert r.dataset_name == "random-ids" and not r.flush_cache and not r.cache_report and r.random_input_len == 512
    assert r.warmup_requests == 1

    a = ab.parse_args([*GSP, "--gsp-prompts-per-group", "3", "--gsp-system-prompt-len", "40",
                       "--gsp-question-len", "8", "--gsp-output-len", "5"])
    with pytest.raises(ValueError):
        ab.bench_cmd(a, "/m", 30001, 16, 64, "/o.jsonl", "t")
    cmd = ab.bench_cmd(a, str(tmp_path / "model"), 30001, 16, 6, "/o.jsonl", "replay-c16", num_groups=2)
    ns = _bench_serving_args(monkeypatch, cmd)
    # main() flushes before the run; bench_serving's warm-up would refill the cache (and its flush races)
    assert ns.dataset_name == "generated-shared-prefix" and ns.cache_report and not ns.flush_cache
    assert ns.warmup_requests == 0
    assert (ns.gsp_num_groups, ns.gsp_prompts_per_group, ns.gsp_system_prompt_len, ns.gsp_question_len,
            ns.gsp_output_len, ns.gsp_range_ratio) == (2, 3, 40, 8, 5, 1.0)
    assert ns.max_concurrency == 16 and ns.num_prompts == 6 and ns.seed == 1 and ns.backend == "sglang"
    assert not ns.tokenize_prompt  # the gsp dataset refuses it
    # the dataset bench_serving builds from it: groups x prompts per group requests sharing a system prompt
    ds = GeneratedSharedPrefixDataset.from_args(ns)
    assert (ds.num_groups, ds.prompts_per_group, ds.system_prompt_len, ds.question_len, ds.output_len) == (
        2, 3, 40, 8, 5)
    from transformers import AutoTokenizer

    (tmp_path / "model").mkdir()
    make_model.build_tokenizer(300, tmp_path / "model")
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "model"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # bench_serving caches the prompts under ~/.cache
    rows = ds.load(tok)
    assert len(rows) == 6 and all(r.output_len == 5 for r in rows)
    assert all(40 <= r.prompt_len <= 40 + 8 + 2 for r in rows)
    assert len({r.prompt.split("\n\n")[0] for r in rows}) == 2
    assert list((tmp_path / "home" / ".cache" / "sglang" / "benchmark").glob("gen_shared_prefix_*.pkl"))


def test_gsp_parsers_on_recorded_output(tmp_path: Path):
    f = tmp_path / "stock-c1.jsonl"
    f.write_text(json.dumps(_fake_line(1.0, 1.0, 1.0, 1, 1)) + "\n" + RECORDED_GSP_LINE + "\n")
    res = ab.read_bench_jsonl(f)
    assert res["dataset_name"] == "generated-shared-prefix" and res["completed"] == 4
    assert ab.hit_rate_pct(res) == 0.0 and res["median_ttft_ms"] == pytest.approx(329.156, abs=1e-3)
    assert ab.hit_rate_pct({"output_throughput": 1.0}) is None and ab.hit_rate_pct(None) is None
    assert ab.hit_rate_pct({"cache_report": {"cache_hit_rate_pct": 93.75}}) == 93.75

    log = ab.parse_prefill_log(RECORDED_LOG)  # the warm-up's prefill (before the flush) is not counted
    assert log == {"prefill_batches": 2, "new_seqs": 2, "new_tokens": 160, "cached_tokens": 0, "hit_rate_pct": 0.0,
                   "after_flush": True, "burst_batches": 0, "burst_cached_tokens": 0, "burst_new_tokens": 0,
                   "after_burst_hit_rate_pct": 0.0}
    # a GPU-like run (values made up, format 0.5.17's): the first request of a group misses, the rest hit
    text = (_prefill(1, 2176, 0) + "[x] Cache flushed successfully!\n" + _prefill(2, 4352, 0)
            + _prefill(3, 384, 6144) + "Decode batch, #running-req: 5\n" + _prefill(1, 128, 2048))
    log = ab.parse_prefill_log(text)
    assert (log["prefill_batches"], log["new_seqs"], log["new_tokens"], log["cached_tokens"]) == (3, 6, 4864, 8192)
    assert log["hit_rate_pct"] == round(100 * 8192 / (4864 + 8192), 2) and log["after_flush"]
    # the opening burst: the batches holding the first burst_tokens prompt tokens (the one crossing it included)
    burst = ab.parse_prefill_log(text, burst_tokens=4 * 2176)
    assert (burst["burst_batches"], burst["burst_cached_tokens"], burst["burst_new_tokens"]) == (2, 6144, 4352 + 384)
    assert burst["after_burst_hit_rate_pct"] == round(100 * 2048 / (128 + 2048), 2)  # the last batch alone
    assert burst["cached_tokens"] == log["cached_tokens"]
    assert ab.parse_prefill_log(text, burst_tokens=4352)["burst_batches"] == 1
    assert ab.parse_prefill_log(text, burst_tokens=10 ** 6)["burst_cached_tokens"] == 8192
    assert ab.parse_prefill_log(text, burst_tokens=10 ** 6)["after_burst_hit_rate_pct"] is None  # no batch after
    assert ab.parse_prefill_log(_prefill(1, 100, 300))["after_flush"] is False
    assert ab.parse_prefill_log(_prefill(1, 100, 300))["hit_rate_pct"] == 75.0
    assert ab.parse_prefill_log("no prefill here\n")["hit_rate_pct"] is None


def _gsp_line(tput: float, mean_ttft: float, median_ttft: float, tpot: float, hit: float | None, n: int) -> dict:
    line = {"dataset_name": "generated-shared-prefix", "completed": n, "output_throughput": tput,
            "mean_ttft_ms": mean_ttft, "median_ttft_ms": median_ttft, "median_tpot_ms": tpot,
            "server_log_cache": {"hit_rate_pct": None if hit is None else hit + 1.0, "cached_tokens": 9000,
                                 "burst_batches": 3, "burst_cached_tokens": 2000,
                                 "after_burst_hit_rate_pct": None if hit is None else hit + 2.0}}
    if hit is not None:
        line["cache_report"] = {"cache_hit_rate_pct": hit}
    return line


def test_gsp_table_and_targets():
    runs = {
        1: {"num_prompts": 16, "gsp_num_groups": 1, "stock": _gsp_line(360.0, 40.0, 30.0, 2.6, 88.0, 16),
            "replay": _gsp_line(350.0, 41.0, 31.0, 2.7, 88.0, 16)},
        16: {"num_prompts": 64, "gsp_num_groups": 4, "stock": _gsp_line(3000.0, 200.0, 100.0, 4.0, 80.0, 64),
             "replay": _gsp_line(3300.0, 215.0, 104.0, 3.5, 78.5, 64)},
        64: {"num_prompts": 256, "gsp_num_groups": 16, "stock": _gsp_line(6000.0, 900.0, 400.0, 8.0, 70.0, 256),
             "replay": {"skipped": "time budget"}},
    }
    meta = {"dataset": "generated-shared-prefix", "model": "nemotron_h_nano4b", "family": "mamba2", "window": 16,
            "commit": "abc", "date": "d", "gpu": "NVIDIA H200", "device": "cuda", "gsp_system_prompt_len": 2048,
            "gsp_question_len": 128, "gsp_output_len": 256, "gsp_prompts_per_group": 16, "server_flags": "--x",
            "warnings": []}
    table = ab.build_table(runs, meta)
    assert table.startswith("### Serving A/B (generated-shared-prefix): nemotron_h_nano4b")
    assert "bench_serving generated-shared-prefix, system prompt 2048, question 128, output 256" in table
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    cells = {int(r.split("|")[1]): [x.strip() for x in r.split("|")[1:-1]] for r in rows}
    assert len(cells) == 3 and len(cells[1]) == 18
    assert cells[16][1] == "64 (4)" and cells[16][4] == "1.100"
    assert cells[16][5:8] == ["200.0", "215.0", "1.075"] and cells[16][8:11] == ["100.0", "104.0", "1.040"]
    assert cells[16][11:14] == ["4.00", "3.50", "0.875"] and cells[16][14:17] == ["80.0", "78.5", "-1.5"]
    assert cells[1][16] == "+0.0" and cells[1][-1] == "16/16" and cells[64][-1] == "256/skipped"
    assert "c=1 89.0/89.0" in table and "c=64 71.0/—" in table  # the server-log cross-check line
    assert ("c=16 2000/2000 in the first 3/3 batches, 7000/7000 after (hit 82.0/80.5%, diff -1.5 pp); "
            "c=64 2000/— in the first 3/— batches, 7000/— after (hit 72.0/—%, diff — pp)") in table
    assert "target c=1: TTFT x <= 1.05: mean 1.025, median 1.033 met" in table
    assert "target c=16: TTFT x <= 1.05: mean 1.075, median 1.040 MISSED" in table
    assert "target c=1: same hit rate (|replay - stock| <= 1.0 pp): 88.0% vs 88.0% (+0.0 pp) met" in table
    assert "target c=16: same hit rate (|replay - stock| <= 1.0 pp): 80.0% vs 78.5% (-1.5 pp) MISSED" in table
    assert "target c=64: TTFT x <= 1.05: mean —, median — not measured" in table
    assert "output throughput x >=" not in table  # random-ids' targets do not apply
    assert "target" not in ab.build_table(runs, {**meta, "device": "cpu", "gpu": None})
    # random-ids tables name their dataset too (and stay as they were otherwise)
    assert ab.build_table({}, {"model": "m"}).startswith("### Serving A/B (random-ids): m")


def test_repeated_concurrency_table():
    """A concurrency run three times: each run's ratios, their median and range, and the gsp targets
    judged on the medians (the main row is the last run's)."""
    def run(order, st, rt, sm, rm, sd, rd, sh, rh):
        return {"order": order, "stock": _gsp_line(st, sm, sd, 8.0, sh, 256),
                "replay": _gsp_line(rt, rm, rd, 8.0, rh, 256)}

    reps = {64: [run(["stock", "replay"], 100.0, 107.0, 800.0, 660.0, 360.0, 310.0, 78.2, 76.7),
                 run(["replay", "stock"], 100.0, 107.0, 1000.0, 870.0, 540.0, 660.0, 76.7, 76.8),
                 run(["stock", "replay"], 100.0, 110.0, 900.0, 900.0, 500.0, 510.0, 77.0, 77.0)],
            1: [run(["stock", "replay"], 10.0, 10.0, 40.0, 41.0, 30.0, 31.0, 88.0, 88.0)]}
    runs = {c: {"num_prompts": 256, "gsp_num_groups": 16, "stock": r[-1]["stock"], "replay": r[-1]["replay"]}
            for c, r in reps.items()}
    meta = {"dataset": "generated-shared-prefix", "model": "qwen3_next_4b", "family": "gdn", "window": 16,
            "device": "cuda", "warnings": []}
    table = ab.build_table(runs, meta, reps)
    assert "| concurrency | run | first | x throughput | x mean TTFT | x median TTFT | hit diff pp |" in table
    assert "| 64 | 1 | stock | 1.070 | 0.825 | 0.861 | -1.5 |" in table
    assert "| 64 | 2 | replay | 1.070 | 0.870 | 1.222 | +0.1 |" in table
    assert ("| 64 | median | | 1.070 (1.070-1.100, 3) | 0.870 (0.825-1.000, 3) | 1.020 (0.861-1.222, 3) "
            "| +0.0 (-1.5-+0.1, 3) |") in table
    assert "| 1 | 1 |" not in table  # run once: no repeat rows
    assert ("target c=64 over 3 runs (medians): TTFT x <= 1.05: mean 0.870, median 1.020 met; same hit rate "
            "(<= 1.0 pp): +0.0 pp over 3 runs met") in table
    assert "target c=64 (last run): TTFT x <= 1.05: mean 1.000, median 1.020 met" in table
    assert "target c=1: TTFT x <= 1.05:" in table  # run once: no label
    rand = ab.build_table({64: {"num_prompts": 8, "stock": {"output_throughput": 1.0}}},
                          {"dataset": "random-ids", "device": "cpu"},
                          {64: [{"order": ["stock", "replay"], "stock": {"output_throughput": 2.0, "median_tpot_ms": 4.0},
                                 "replay": {"output_throughput": 3.0, "median_tpot_ms": 3.0}},
                                {"order": ["replay", "stock"], "stock": {"skipped": "time budget"}, "replay": {}}]})
    assert "| concurrency | run | first | x throughput | x TPOT | x ITL |" in rand
    assert "| 64 | 2 | replay | — | — | — |" in rand
    assert "| 64 | median | | 1.500 (1.500-1.500, 1) | 0.750 (0.750-0.750, 1) | — |" in rand  # run 2 had none
    assert "target" not in rand


def test_main_gsp_orchestration_with_fakes(monkeypatch, tmp_path: Path):
    """``main()`` for gsp on the CPU preset with fake servers and a fake bench_serving replaying the
    recorded output: the command per run, the log slice per run, the hit rates and the outputs."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(ab.signal, "signal", lambda *a: None)  # keep pytest's handlers
    monkeypatch.setattr(ab, "_generate_model", lambda *a, **k: 0.0)
    monkeypatch.setattr(ab, "_wait_ready", lambda procs, *a, **k: {v: 1.0 for v in procs})
    monkeypatch.setattr(ab, "_stop_all", lambda procs: None)
    logs: dict[int, Path] = {}

    class FakeProc:
        pid = 4242

        def poll(self):
            return None

    def launch(model, vargs, log, *, port, env, base_flags):
        assert "--disable-radix-cache" not in base_flags
        logs[port] = log
        mark = ab.REPLAY_LOG_MARK if vargs[-1] == "16" else ""
        log.write_text(f"server_args=ServerArgs(mamba_radix_cache_strategy='no_buffer')\n{mark}\n"
                       + _prefill(1, 7, 0))  # a start-up prefill: outside every run's slice
        return FakeProc()

    monkeypatch.setattr(ab.srv, "launch", launch)
    flushes = []

    def flush(url, timeout):  # the real one's effect on the log: the mark
        port = int(url.rsplit(":", 1)[1])
        flushes.append(port)
        with open(logs[port], "a") as fh:
            fh.write("[t] Cache flushed successfully!\n")
        return None if len(flushes) < 4 else "HTTP 400: Flush cache failed."

    monkeypatch.setattr(ab, "_flush_cache", flush)
    calls = []
    def fake_run(cmd, ofile, **k):  # run_bench_serving: bench_serving's only caller
        assert cmd[1:3] == ["-m", "sglang.bench_serving"] and Path(kv_of(cmd)["--output-file"]) == ofile
        kv = kv_of(cmd)
        calls.append((kv, k["env"]["HOME"]))
        assert k["env"]["PYTHONUSERBASE"]
        groups, ppg = int(kv["--gsp-num-groups"]), int(kv["--gsp-prompts-per-group"])
        assert flushes[-1] == int(kv["--port"])  # flushed right before
        with open(logs[int(kv["--port"])], "a") as fh:  # one miss + hits per group
            for _ in range(groups):
                fh.write(_prefill(1, 80, 0) + _prefill(ppg - 1, 16 * (ppg - 1), 64 * (ppg - 1)))
        line = json.loads(RECORDED_GSP_LINE)
        line.update(tag=kv["--tag"], completed=groups * ppg, max_concurrency=int(kv["--max-concurrency"]))
        line["cache_report"]["cache_hit_rate_pct"] = 60.0
        Path(kv["--output-file"]).write_text(json.dumps(line) + "\n")
        return ab.BenchRun(rc=0, text=f"bench {kv['--tag']}\n", result=ab.read_bench_jsonl(ofile),
                           source="output file")

    def kv_of(cmd):
        return dict(zip(cmd, cmd[1:]))

    monkeypatch.setattr(ab, "run_bench_serving", fake_run)
    warmups = []
    monkeypatch.setattr(ab, "_warmup", lambda urls, n, length, *a, **k: warmups.append(("load", sorted(urls), length)))
    monkeypatch.setattr(ab, "_warmup_prefix_hit",
                        lambda urls, prefix, question, *a, **k: warmups.append(("hit", sorted(urls), prefix, question)))
    out = tmp_path / "out"
    rc = ab.main(["--device", "cpu", *GSP, "--out", str(out), "--commit", "abc", "--probe-requests", "0",
                  "--time-budget", "300"])
    assert rc == 0
    # the load warm-up, then one radix hit per server (its one-off compile), both before the flushed runs
    assert warmups == [("load", ["replay", "stock"], 64 + 16), ("hit", ["replay", "stock"], 64, 16)]
    assert [c[0]["--tag"] for c in calls] == ["stock-c1", "replay-c1", "replay-c4", "stock-c4"]
    assert all(c[0]["--dataset-name"] == "generated-shared-prefix" and c[0]["--warmup-requests"] == "0"
               for c in calls)
    assert [c[0]["--gsp-num-groups"] for c in calls] == ["1", "1", "4", "4"]
    homes = {c[1] for c in calls}
    assert len(homes) == 1 and Path(homes.pop()).parent == tmp_path / "tmp" / f"replayssm_bench_{ab.os.getpid()}"
    res = json.loads((out / "results.json").read_text())
    assert res["meta"]["dataset"] == "generated-shared-prefix" and res["meta"]["gsp_system_prompt_len"] == 64
    assert res["meta"]["mamba_radix_cache_strategy"] == {"stock": "no_buffer", "replay": "no_buffer"}
    assert res["runs"]["4"]["gsp_num_groups"] == 4 and res["runs"]["4"]["num_prompts"] == 16
    r4 = res["runs"]["4"]["replay"]
    assert "server_info" not in r4 and r4["completed"] == 16 and r4["cache_report"]["cache_hit_rate_pct"] == 60.0
    # only this run's lines after the flush: per group 1 x 80 new + 3 x (16 new + 64 cached)
    assert r4["server_log_cache"] == {"prefill_batches": 8, "new_seqs": 16, "new_tokens": 4 * (80 + 48),
                                      "cached_tokens": 4 * 192, "hit_rate_pct": 60.0, "after_flush": True,
                                      "burst_batches": 2, "burst_cached_tokens": 192, "burst_new_tokens": 128,
                                      "after_burst_hit_rate_pct": 60.0}
    assert res["runs"]["1"]["stock"]["server_log_cache"]["new_seqs"] == 4
    # the fourth flush (stock-c4) failed: reported, the run kept
    assert res["runs"]["4"]["stock"]["flushed_before"] is False and r4["flushed_before"] is True
    assert any("c=4 stock: radix cache not flushed" in w for w in res["meta"]["warnings"])
    table = (out / "results.md").read_text()
    assert table.startswith("### Serving A/B (generated-shared-prefix): nemotron_h_tiny")
    assert "| 4 | 16 (4) |" in table and "| 60.0 | 60.0 | +0.0 |" in table and "target" not in table
    assert "WARNING: c=4 stock: radix cache not flushed" in table
    assert [[r["order"][0], r["gsp_num_groups"]] for c in ("1", "4") for r in res["repeats"][c]] == [
        ["stock", 1], ["replay", 4]]
    assert res["repeats"]["4"][0]["replay"] == r4
    raw = [json.loads(x) for x in (out / "bench_raw.jsonl").read_text().splitlines()]
    assert [x["ab_variant"] for x in raw] == ["stock", "replay", "replay", "stock"]
    assert all(x["dataset_name"] == "generated-shared-prefix" for x in raw)


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


def test_prefix_hit_warmup_sends_a_shared_prefix_pair_in_order(monkeypatch):
    """Each server gets two requests, one after the other, that share the system prompt and differ in the
    question: the second is a radix hit, so the servers' first prefill with initial states (a one-off
    compile) happens before the measured run, not in whichever server runs first."""
    import threading

    sent: dict[str, list[list[int]]] = {}
    lock = threading.Lock()

    def generate(url, ids, n, timeout):
        with lock:
            sent.setdefault(url, []).append(list(ids))
        assert n == 8
        return {"tokens": [1] * n, "logprobs": [0.0] * n}

    monkeypatch.setattr(ab, "_generate", generate)
    ab._warmup_prefix_hit({"stock": "http://s", "replay": "http://r"}, 40, 6, 300, timeout=5.0)
    assert sorted(sent) == ["http://r", "http://s"] and sent["http://r"] == sent["http://s"]
    first, second = sent["http://s"]
    assert len(first) == len(second) == 46 and first[:40] == second[:40] and first[40:] != second[40:]
    assert all(4 <= t < 300 for t in first + second)
