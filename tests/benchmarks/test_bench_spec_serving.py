"""CPU tests of ``benchmarks/bench_spec_serving.py`` (the speculative serving benchmark the lead runs on two H200s).

- arguments, defaults and refusals; GPU ids under ``CUDA_VISIBLE_DEVICES``; the CUDA-graph buckets;
- the draft's config (the target's vocabulary, heads of 64) and that SGLang 0.5.17 loads it as a
  Llama draft; every server's flags parse with SGLang's own parser plus the plug-in's flags, and the
  bench_serving command with 0.5.17's bench_serving parser;
- the log parsers on lines in the formats SGLang 0.5.17 and the plug-in write (the anchors are checked
  against their sources; the verify plan's lines come from ``heuristic.Decision.log_line`` itself);
- the report (ratios, targets, equal acceptance, skipped and failed runs);
- ``main()`` end to end with fake servers and a fake bench_serving: launch order and GPUs, the stagger
  of stock without spec behind stock spec's pool sizing, the run order, the per-run log slices, the outputs;
  and a server that does not start;
- ``--draft oracle``: its arguments and server flags; ``bench_prompts`` equals what 0.5.17's
  bench_serving sends for the run's command line (its own parser and dataset code, the server's
  encoding); the oracle entries and expected accept lengths; the report; ``main()`` with fakes (oracle
  file, plug-in environment of the spec servers only, no-logprob warm-up, reference check); and on a
  real CPU server (echo tiny model, ``REPLAYSSM_ORACLE``, ``--ssm-backend replay``): the reference check
  passes and a real ``sglang.bench_serving`` run shows the expected accept length, so its prompts were
  the oracle file's.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path

import pytest

from benchmarks import bench_serving_ab as ab
from benchmarks import bench_spec_serving as bs

ROOT = Path(__file__).resolve().parents[2]


def _cfg(name: str) -> dict:
    return json.loads((ROOT / "tests" / "models" / name / "config.json").read_text())


# ----------------------------------------------------------------------------- arguments


def test_defaults():
    a = bs.parse_args(["--commit", "abc"])
    assert a.model == "nemotron_h_nano4b" and a.model_dir == "/tmp/replayssm_bench_models/nemotron_h_nano4b"
    assert a.gpus == [0, 1] and a.concurrency == [256, 512, 1, 64] and a.num_prompts == [256, 512, 32, 64]
    assert (a.input_len, a.output_len, a.draft_tokens, a.window, a.replay_verify) == (512, 128, 4, 16, "auto")
    assert (a.spec_mem_fraction, a.nospec_mem_fraction, a.time_budget) == (0.6, 0.75, 530.0)
    assert (a.dataset, a.device) == ("random-ids", "cuda")  # what bench_serving_ab's helpers read
    g = bs.parse_args(["--family", "gdn", "--gpus", "1,0", "--concurrency", "4,2", "--num-prompts", "8,16"])
    assert g.model == "qwen3_next_4b" and g.gpus == [1, 0] and g.num_prompts == [8, 16]


@pytest.mark.parametrize("argv", [
    ["--gpus", "0"],  # one GPU only with --radix off-equal-memory
    ["--gpus", "0,0"],
    ["--gpus", "0,0", "--radix", "off-equal-memory"],
    ["--gpus", "a,b"],
    ["--gpus", "0,1,2"],
    ["--concurrency", "1,64", "--num-prompts", "4"],
    ["--concurrency", "0"],
    ["--draft-tokens", "1"],
    ["--window", "0"],
    ["--output-len", "0"],
    ["--spec-mem-fraction", "1.2"],
    ["--nospec-mem-fraction", "0"],
    ["--time-budget", "0"],
    ["--replay-verify", "always"],
    ["--family", "llama"],
    ["--draft", "eagle"],
    ["--wrong-rate", "0.3"],
    ["--draft", "oracle", "--wrong-rate", "1.5"],
    ["--draft", "oracle", "--wrong-rate", "-0.1"],
    ["--radix", "off"],
    ["--equal-mamba-gib", "8"],  # only with --radix off-equal-memory
    ["--radix", "off-equal-memory", "--replay-verify", "auto"],
    ["--radix", "off-equal-memory", "--replay-verify", "snapshot"],
    ["--radix", "off-equal-memory", "--equal-mamba-gib", "0"],
    ["--radix", "off-equal-memory", "--equal-mamba-gib", "0.5"],  # not 2 rows of stock spec (0.39 GiB each)
    ["--radix", "off-equal-memory", "--server-args", "--max-running-requests 8"],
    ["--radix", "off-equal-memory", "--server-args", "--mamba-ssm-dtype bfloat16"],
    ["--radix", "off-equal-memory", "--server-args", "--disable-radix-cache"],
    ["--radix", "off-equal-memory", "--replay-args", "--replayssm-verify=auto"],
    ["--radix", "off-equal-memory", "--replay-args", "--replayssm-window 8"],
    ["--concurrency", "1,1", "--num-prompts", "8,8"],  # a repeat would replace the first run's row
])
def test_bad_arguments(argv):
    with pytest.raises(SystemExit):
        bs.parse_args(["--commit", "x", *argv])


def test_gpu_env_ids():
    assert bs.gpu_env_ids([0, 1], None) == ["0", "1"] and bs.gpu_env_ids([1, 0], "") == ["1", "0"]
    assert bs.gpu_env_ids([0, 1], "3, 5") == ["3", "5"] and bs.gpu_env_ids([1, 0], "3,5") == ["5", "3"]
    with pytest.raises(ValueError, match="expected indices < 2"):
        bs.gpu_env_ids([0, 2], "3,5")


def test_graph_buckets():
    assert bs.graph_buckets([256, 512, 1, 64]) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert bs.graph_buckets([3, 100]) == [1, 2, 3, 4, 8, 16, 32, 64, 100]
    assert bs.graph_buckets([1]) == [1]


def test_nospec_order():
    assert bs.nospec_order([256, 512, 1, 64]) == [1, 256, 512, 64]
    assert bs.nospec_order([64, 256]) == [64, 256]


# ----------------------------------------------------------------------------- commands


@pytest.mark.parametrize("target", ["nemotron_h_nano4b", "qwen3_next_4b"])
def test_draft_config_loads_as_llama_draft(target: str, tmp_path: Path):
    """The draft has the target's vocabulary and context and heads of 64, and SGLang loads it as a Llama
    (a NemotronH-architecture draft would be turned into an MTP head: spec_algorithms.md)."""
    import make_model
    from sglang.srt.configs.model_config import ModelConfig

    base = _cfg("llama_tiny")
    cfg = bs.draft_config(_cfg(target), base)
    assert cfg["vocab_size"] == _cfg(target)["vocab_size"] and cfg["head_dim"] == 64
    assert cfg["max_position_embeddings"] == _cfg(target)["max_position_embeddings"]
    assert {k: cfg[k] for k in ("hidden_size", "num_hidden_layers", "architectures")} == {
        k: base[k] for k in ("hidden_size", "num_hidden_layers", "architectures")}
    draft = make_model.materialize("llama_tiny", tmp_path / "draft", config=cfg)
    assert not list(draft.glob("*.safetensors"))  # dummy weights: --speculative-draft-load-format dummy
    mc = ModelConfig(str(draft), is_draft_model=True)
    assert mc.hf_config.architectures == ["LlamaForCausalLM"] and mc.head_dim == 64
    assert mc.vocab_size == cfg["vocab_size"]


def _server_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    from sglang_replayssm.hooks.args import add_flags

    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
    add_flags(None, p)
    return p


def test_server_flags_parse_with_sglang_and_the_plugin():
    a = bs.parse_args(["--commit", "x", "--server-args", "--chunked-prefill-size 4096 --mem-fraction-static 0.5",
                       "--replay-args", "--replayssm-read-dtype same"])
    p = _server_parser()
    ns = {v: p.parse_args(["--model-path", "/m", *bs.common_flags(a), *bs.variant_flags(v, a, "/d")])
          for v in bs.VARIANTS}
    for v, n in ns.items():
        assert n.cuda_graph_bs_decode == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512] and n.disable_overlap_schedule
        assert n.attention_backend == "flashinfer" and n.dtype == "bfloat16" and n.load_format == "safetensors"
        assert n.max_total_tokens == 512 * (512 + 128 + 4 + 64) + 8192
        assert n.chunked_prefill_size == 4096 and n.mem_fraction_static == 0.5  # --server-args override
    for v in bs.SPEC_VARIANTS:
        n = ns[v]
        assert n.speculative_algorithm == "STANDALONE" and n.speculative_draft_model_path == "/d"
        assert n.speculative_draft_load_format == "dummy" and n.speculative_eagle_topk == 1
        assert (n.speculative_num_steps, n.speculative_num_draft_tokens) == (3, 4)
        assert n.mamba_radix_cache_strategy == "no_buffer" and not n.disable_radix_cache
        assert n.max_running_requests == bs.SPEC_MAX_RUNNING_REQUESTS
    assert ns["stock_spec"].ssm_backend == "default" and ns["stock_nospec"].ssm_backend == "default"
    r = ns["replay_spec"]
    assert (r.ssm_backend, r.replayssm_window, r.replayssm_verify, r.replayssm_read_dtype) == (
        "replay", 16, "auto", "same")
    n = ns["stock_nospec"]
    assert n.speculative_algorithm is None and n.disable_radix_cache and n.max_running_requests == 512
    plain = bs.parse_args(["--commit", "x", "--draft-tokens", "8", "--replay-verify", "replay"])
    s = bs.variant_flags("replay_spec", plain, "/d")
    assert s[s.index("--speculative-num-steps") + 1] == "7" and s[s.index("--replayssm-verify") + 1] == "replay"
    assert bs.variant_flags("stock_spec", plain, "/d")[
        bs.variant_flags("stock_spec", plain, "/d").index("--mem-fraction-static") + 1] == "0.6"
    assert "--replayssm-read-dtype" not in bs.variant_flags("stock_spec", a, "/d")
    with pytest.raises(ValueError, match="expected one of"):
        bs.variant_flags("replay_nospec", a, "/d")


def test_bench_cmd_parses_with_bench_serving(monkeypatch):
    """The run command is bench_serving_ab's, from this CLI's arguments: 0.5.17's bench_serving takes it."""
    from sglang.benchmark import serving

    a = bs.parse_args(["--commit", "x"])
    cmd = ab.bench_cmd(a, a.model_dir, 30001, 256, 256, "/o.jsonl", "replay_spec-c256")
    seen = {}
    monkeypatch.setattr(serving, "run_benchmark", lambda ns: seen.setdefault("args", ns))
    monkeypatch.setattr(sys, "argv", ["bench_serving", *cmd[3:]])
    serving.cli_main()
    ns = seen["args"]
    assert ns.dataset_name == "random-ids" and ns.random_output_len == 128 and ns.random_input_len == 512
    assert ns.max_concurrency == 256 and ns.num_prompts == 256 and ns.tag == "replay_spec-c256"


# ----------------------------------------------------------------------------- log parsers

#: lines in the formats of SGLang 0.5.17 (memory_pool.py, kv_cache_configurator.py, model_runner.py,
#: scheduler.py, metrics_reporter.py) and the plug-in (pool.py, hooks/pool.py), prefixed as SGLang logs them
MEMORY_LOG_STOCK_SPEC = """\
[2026-11-30 10:00:01 TP0] Load weight begin. avail mem=139.52 GB
[2026-11-30 10:00:09 TP0] Load weight end. elapsed=7.1 s, type=NemotronHForCausalLM, avail mem=132.01 GB, mem usage=7.51 GB.
[2026-11-30 10:00:09 TP0] max_running_requests is capped to 61 by the mamba state cache (max_mamba_cache_size=184, 3 state slots per request). To raise it: ...
[2026-11-30 10:00:10 TP0] Mamba Cache is allocated. max_mamba_cache_size: 184, conv_state size: 0.21GB, ssm_state size: 14.32GB intermediate_ssm_state_cache size: 19.01GB intermediate_conv_window_cache size: 0.29GB 
[2026-11-30 10:00:10 TP0] KV Cache is allocated. #tokens: 370688, K size: 2.83 GB, V size: 2.83 GB
[2026-11-30 10:00:10 TP0] Memory pool end. avail mem=84.90 GB
[2026-11-30 10:00:12 TP0] Load weight begin. avail mem=80.10 GB
[2026-11-30 10:00:12 TP0] Memory pool end. avail mem=79.00 GB
[2026-11-30 10:02:00 TP0] max_total_num_tokens=370688, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=61, context_len=8192, available_gpu_mem=70.11 GB
"""
MEMORY_LOG_REPLAY_SPEC = """\
[2026-11-30 10:00:01 TP0] Load weight begin. avail mem=139.50 GB
[2026-11-30 10:00:09 TP0] ReplaySSM memory: 7472648 B of ring (+ read copy) per mamba slot (state 83800064 B per slot); max_mamba_cache_size 184 -> 168 (budget re-solved); rings charged 1.182 GB
[2026-11-30 10:00:10 TP0] Mamba Cache is allocated. max_mamba_cache_size: 168, conv_state size: 0.19GB, ssm_state size: 13.07GB 
[2026-11-30 10:00:10 TP0] ReplaySSM speculative state is allocated. device=cuda:0, draft tokens T=4, rows=169, conv windows deduplicated, intermediate_ssm not allocated (--replayssm-verify replay, linear drafts: no per-draft SSM state) intermediate_conv_window_cache size: 0.27GB
[2026-11-30 10:00:10 TP0] ReplaySSM rings are allocated. family=mamba2, window L=16, rows R=20, slots=169, layers=21, x=(21, 169, 96, 20, 80) torch.bfloat16, ring size: 1.176GB (7472648 B per slot), mamba cache total: 14.500GB
[2026-11-30 10:00:10 TP0] Memory pool end. avail mem=86.01 GB
[2026-11-30 10:02:00 TP0] max_total_num_tokens=370688, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=56, context_len=8192, available_gpu_mem=71.20 GB
"""
MEMORY_LOG_NOSPEC = """\
[2026-11-30 10:01:20 TP0] Load weight begin. avail mem=84.70 GB
[2026-11-30 10:01:30 TP0] Mamba Cache is allocated. max_mamba_cache_size: 512, conv_state size: 0.57GB, ssm_state size: 39.38GB 
[2026-11-30 10:01:30 TP0] Memory pool end. avail mem=31.50 GB
[2026-11-30 10:03:30 TP0] max_total_num_tokens=370688, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=512, context_len=8192, available_gpu_mem=25.00 GB
"""


def test_log_anchors_exist_in_the_sources():
    """Every log text the parsers look for is written by SGLang 0.5.17 or the plug-in."""
    import sglang

    import sglang_replayssm

    sg = Path(sglang.__file__).parent / "srt"
    rs = Path(sglang_replayssm.__file__).parent
    anchors = {
        sg / "mem_cache" / "memory_pool.py": ["Mamba Cache is allocated. ", "max_mamba_cache_size: {size}, ",
                                              "conv_state size: ", "ssm_state size: ",
                                              "intermediate_ssm_state_cache size: ",
                                              "intermediate_conv_window_cache size: "],
        sg / "mem_cache" / "kv_cache_configurator.py": [
            f"{bs.POOL_MARK}. ", "avail mem=", '"max_running_requests is capped to %d by the mamba state "',
            '"cache (max_mamba_cache_size=%d, '],
        sg / "model_executor" / "model_runner.py": ["Load weight begin. avail mem="],
        sg / "managers" / "scheduler.py": ["max_total_num_tokens=", "max_running_requests="],
        sg / "managers" / "scheduler_components" / "metrics_reporter.py": [
            'f"Decode batch{iter_msg}, #running-req: {num_running_reqs}, ', "accept len: "],
        rs / "pool.py": ["ReplaySSM rings are allocated. ", "ring size: %.3fGB",
                         '"ReplaySSM speculative state is allocated. ', "intermediate_ssm not allocated",
                         'f"intermediate_ssm_state_cache size: {', "intermediate_conv_window_cache size: %.2fGB",
                         '"ReplaySSM read copy is allocated. read_state=%s %s%s, size: %.3fGB'],
        rs / "hooks" / "pool.py": ["ReplaySSM memory: %d B of ring (+ read copy) per mamba slot ",
                                   "(state %d B per slot); ",
                                   "max_mamba_cache_size %d -> %d "],
    }
    for path, texts in anchors.items():
        src = path.read_text()
        for text in texts:
            assert text in src, f"{path.name} no longer writes {text!r}"


def test_parse_memory_log():
    s = bs.parse_memory_log(MEMORY_LOG_STOCK_SPEC)
    assert s["max_running_requests"] == 61 and s["capped_by_mamba_to"] == 61 and s["mamba_slots"] == 184
    assert (s["avail_before_weights_gb"], s["avail_after_pools_gb"]) == (139.52, 84.90)  # the target's, not the draft's
    assert (s["state_gb"], s["conv_gb"], s["per_draft_gb"], s["per_draft_conv_gb"]) == (14.32, 0.21, 19.01, 0.29)
    assert s["per_draft_gb_per_request"] == round((19.01 + 0.29) / 62, 4)
    assert s["ring_gb"] is None and s["ring_bytes_per_slot"] is None and s["per_draft_ssm_not_allocated"] is None
    r = bs.parse_memory_log(MEMORY_LOG_REPLAY_SPEC)
    assert r["max_running_requests"] == 56 and r["mamba_slots"] == 168 and r["replay_slots_before"] == 184
    assert (r["ring_bytes_per_slot"], r["state_bytes_per_slot"], r["ring_gb"]) == (7472648, 83800064, 1.176)
    assert r["per_draft_ssm_not_allocated"] is True and r["capped_by_mamba_to"] is None
    assert (r["state_gb"], r["conv_gb"], r["per_draft_gb"], r["per_draft_conv_gb"]) == (13.07, 0.19, None, 0.27)
    assert r["per_draft_gb_per_request"] == round(0.27 / 57, 4)
    assert s["max_total_num_tokens"] == 370688 and s["read_copy_gb"] is None
    n = bs.parse_memory_log(MEMORY_LOG_NOSPEC)
    assert n["max_running_requests"] == 512 and n["per_draft_gb"] is None and n["per_draft_gb_per_request"] is None
    assert bs.parse_memory_log("")["max_running_requests"] is None


def _decode_line(running: int, accept: float | None, gen: float = 4000.0) -> str:
    spec = "" if accept is None else f"accept len: {accept:.2f}, accept rate: {(accept - 1) / 3:.2f}, "
    return (f"[2026-11-30 10:05:00 TP0] Decode batch, #running-req: {running}, #full token: 9000, "
            f"full token usage: 0.03, mamba num: {running}, mamba usage: 0.30, {spec}cuda graph: True, "
            f"gen throughput (token/s): {gen:.2f}, #queue-req: 3\n")


def test_parse_decode_log():
    text = ("[t] Prefill batch, #new-seq: 4, #new-token: 2048, #cached-token: 0, token usage: 0.01, "
            "#running-req: 0, #queue-req: 60\n" + _decode_line(10, 1.10) + _decode_line(30, 1.02)
            + _decode_line(61, 1.00) + "[t] Decode batch [77], #running-req: 5, accept len: 2.00, \n")
    d = bs.parse_decode_log(text)
    assert d["decode_lines"] == 4 and d["peak_running"] == 61
    assert d["accept_len"] == round((10 * 1.10 + 30 * 1.02 + 61 * 1.00 + 5 * 2.00) / 106, 4)
    assert d["steady_tok_s"] is None and d["steady_lines"] == 0  # one line at the peak: the first, left out
    nospec = bs.parse_decode_log(_decode_line(512, None) * 3)
    assert nospec == {"decode_lines": 3, "peak_running": 512, "accept_len": None, "steady_tok_s": 4000.0,
                      "steady_lines": 2}
    assert bs.parse_decode_log("") == {"decode_lines": 0, "peak_running": None, "accept_len": None,
                                       "steady_tok_s": None, "steady_lines": 0}


def test_parse_decode_log_steady_throughput():
    # A run as the servers log it: a ramp, the first line at the peak (prefills in its interval), the
    # steady lines, the tail.  The median of the peak's lines but the first.
    gens = [(40, 900.0), (256, 4921.0), (256, 14867.0), (256, 14685.0), (256, 14678.0), (256, 14900.0), (78, 13066.0)]
    d = bs.parse_decode_log("".join(_decode_line(r, 2.7, g) for r, g in gens))
    assert d["peak_running"] == 256 and d["steady_lines"] == 4
    assert d["steady_tok_s"] == round((14685.0 + 14867.0) / 2, 1)


def _decision(bs_: int, path: str, source: str, reason: str, snap_us: float, rep_us: float):
    from sglang_replayssm.heuristic import Decision

    return Decision(batch_size=bs_, num_tokens=4, path=path, reason=reason, source=source,
                    snapshot_bytes=bs_ * 4.2e6, replay_bytes=bs_ * 1.2e6, snapshot_s=snap_us * 1e-6,
                    replay_s=rep_us * 1e-6, snapshot_util=0.12 * bs_ ** 0.5, replay_util=0.05)


def test_parse_heuristic_log_reads_the_plugins_own_lines():
    lines = [
        _decision(1, "snapshot", "measured", "snapshot path not bandwidth-bound (util 0.12 < 0.5)", 17.0, 31.0),
        _decision(64, "replay", "measured (interpolated between measured bs=32 and bs=128)",
                  "snapshot path bandwidth-bound (util 0.96 >= 0.5) and replay 1.28x faster", 453.1, 353.1),
        _decision(512, "snapshot", "byte-model (probe failed: RuntimeError: x; y)", "replay not faster enough "
                  "(1.01x < 1.05x) although the snapshot path is bandwidth-bound (util 2.72)", 4000.0, 3960.0),
        # the int32 guard re-logs a bucket it moves: the later line wins
        _decision(512, "replay", "byte-model (probe failed: RuntimeError: x; y)",
                  "snapshot commit would overflow SGLang 0.5.17's int32 offsets above batch 546", 4000.0, 3960.0),
    ]
    text = "".join(f"[2026-11-30 10:01:00 TP0] {d.log_line()}\n" for d in lines)
    text += "[2026-11-30 10:01:00 TP0] ReplaySSM verify probe bs=64 T=4: interpolated between measured bs=32 and 128\n"
    rows = bs.parse_heuristic_log(text)
    assert [(r["bs"], r["path"]) for r in rows] == [(1, "snapshot"), (64, "replay"), (512, "replay")]
    assert rows[1]["source"] == "measured (interpolated between measured bs=32 and bs=128)"
    assert rows[1]["reason"] == "snapshot path bandwidth-bound (util 0.96 >= 0.5) and replay 1.28x faster"
    assert (rows[1]["snapshot_us"], rows[1]["replay_us"], rows[1]["T"]) == (453.1, 353.1, 4)
    assert rows[2]["source"] == "byte-model (probe failed: RuntimeError: x; y)"
    assert rows[2]["reason"].startswith("snapshot commit would overflow")
    assert rows[0]["snapshot_mb"] == pytest.approx(4.2) and rows[0]["snapshot_util"] == 0.12
    assert bs.parse_heuristic_log("nothing") == []


# ----------------------------------------------------------------------------- report


def _result(tput: float, tpot: float, accept: float | None, run_accept: float | None, peak: int, n: int,
            steady: float | None = None) -> dict:
    return {"completed": n, "output_throughput": tput, "median_tpot_ms": tpot, "median_itl_ms": tpot,
            "accept_length": accept,
            "server_log_decode": {"decode_lines": 9, "peak_running": peak, "accept_len": run_accept,
                                  "steady_tok_s": steady, "steady_lines": 0 if steady is None else 5}}


def _meta() -> dict:
    return {"model": "nemotron_h_nano4b", "family": "mamba2", "commit": "abc", "date": "d", "gpu": "NVIDIA H200",
            "input_len": 512, "output_len": 128, "draft_tokens": 4, "window": 16, "replay_verify": "auto",
            "gpu_of": {"stock_spec": "0", "replay_spec": "1", "stock_nospec": "0"},
            "mem_fraction": {"stock_spec": 0.6, "replay_spec": 0.6, "stock_nospec": 0.75}, "warnings": ["odd"]}


def test_report():
    runs = {
        1: {"num_prompts": 8, "stock_spec": _result(150.0, 6.5, 1.01, 1.01, 1, 8),
            "replay_spec": _result(149.0, 6.6, 1.02, 1.01, 1, 8),
            "stock_nospec": _result(380.0, 2.6, None, None, 1, 8)},
        256: {"num_prompts": 256, "stock_spec": _result(4000.0, 14.0, 1.03, 1.00, 61, 256, steady=5000.0),
              "replay_spec": _result(8000.0, 7.0, 1.05, 1.02, 140, 256, steady=9000.0),
              "stock_nospec": _result(9000.0, 25.0, None, None, 256, 256)},
        512: {"num_prompts": 512, "stock_spec": _result(4000.0, 14.0, 1.0, 1.0, 61, 512),
              "replay_spec": _result(7000.0, 7.0, 1.2, 1.1, 140, 512), "stock_nospec": {"skipped": "time budget"}},
    }
    memory = {"stock_spec": bs.parse_memory_log(MEMORY_LOG_STOCK_SPEC),
              "replay_spec": bs.parse_memory_log(MEMORY_LOG_REPLAY_SPEC),
              "stock_nospec": bs.parse_memory_log(MEMORY_LOG_NOSPEC)}
    decisions = bs.parse_heuristic_log(
        f"[t] {_decision(32, 'snapshot', 'measured', 'r', 200.0, 250.0).log_line()}\n"
        f"[t] {_decision(64, 'replay', 'measured', 'r2', 453.1, 353.1).log_line()}\n")
    report = bs.build_report(runs, memory, decisions, _meta())
    assert report.startswith("### Speculative serving (T=4): nemotron_h_nano4b (mamba2)")
    rows = {}
    for ln in report.splitlines():
        cells = [x.strip() for x in ln.split("|")[1:-1]]
        if len(cells) == 13 and cells[0].isdigit() and cells[1] in bs.VARIANTS:
            rows[int(cells[0]), cells[1]] = cells
    assert len(rows) == 9
    assert rows[256, "replay_spec"][4:6] == ["8000.0", "2.000"] and rows[256, "replay_spec"][8:13] == [
        "1.050", "1.020", "140", "9000.0", "1.800"]
    assert rows[256, "stock_spec"][11:13] == ["5000.0", "1.000"] and rows[512, "replay_spec"][11:13] == ["—", "—"]
    assert rows[1, "stock_nospec"][5] == f"{380 / 150:.3f}" and rows[512, "stock_nospec"][3] == "skipped"
    assert "target c=256: replay spec / stock spec output throughput >= 1.80: 2.000 met; accept len 1.000 vs " \
           "1.020: equal" in report
    assert "target c=512: replay spec / stock spec output throughput >= 1.80: 1.750 MISSED; accept len 1.000 vs " \
           "1.100: NOT equal (|diff| > 0.05)" in report
    assert f"max running requests at equal memory >= 2.50: {56 / 61:.2f} MISSED" in report
    assert f"stock without spec >= 0.98: {149 / 380:.3f} MISSED" in report
    assert "| stock_spec | 0 | 0.6 | 139.52 | 61 | 184 | 14.53 | 19.01 (0.311) | — | 84.90 | 1.00 |" in report
    assert "| replay_spec | 1 | 0.6 | 139.50 | 56 | 168 | 13.26 | — (0.005), SSM states not allocated | 1.176 | 86.01 " \
           "| 0.92 |" in report
    assert "| stock_nospec | 0 | 0.75 | 84.70 | 512 | 512 | 39.95 | — | — | 31.50 | — |" in report
    # the replay server holds 56 requests: bucket 64 is never captured
    assert "| 64 | 4 | replay | measured | 453.1 | 353.1 | 1.28 | 0.96 | no (> limit) | r2 |" in report
    assert "| 32 | 4 | snapshot | measured | 200.0 | 250.0 | 0.80 | " in report and "| yes | r |" in report
    assert "accept length is ~1" in report and "WARNING: odd" in report
    # nothing measured: dashes and "not measured", no crash
    empty = bs.build_report({64: {"num_prompts": 64, "stock_spec": {"error": "bench_serving exit 1"}}}, {}, [],
                            {**_meta(), "warnings": []})
    assert "| 64 | stock_spec | 64 | failed |" in empty and "No `ReplaySSM verify bs=` lines" in empty
    assert empty.count("not measured") == 6 and "WARNING" not in empty


# ----------------------------------------------------------------------------- main() with fakes


class _FakeProc:
    pid = 4242
    returncode = None

    def poll(self):
        return None


def _bench_line(tag: str, c: int, n: int, tput: float) -> dict:
    return {"tag": tag, "backend": "sglang", "dataset_name": "random-ids", "max_concurrency": c, "completed": n,
            "output_throughput": tput, "median_tpot_ms": 5.0, "median_itl_ms": 5.0, "accept_length": 1.01,
            "server_info": {"big": "blob"}}


def _fake_world(monkeypatch, tmp_path: Path, fail: str | None = None, stock_rings: bool = False,
                server_logs: dict | None = None, slow_exit: str | None = None) -> dict:
    """Fake servers (logs in 0.5.17's formats), readiness, warm-up and bench_serving; returns what they saw.

    ``fail``: the server that does not start; ``stock_rings``: stock spec's log shows ReplaySSM rings;
    ``server_logs``: start-up logs instead of the ``MEMORY_LOG_*`` ones; ``slow_exit``: the run (tag) whose
    bench_serving printed its result block, wrote no output file and was killed after it."""
    seen: dict = {"launch": [], "bench": [], "stopped": [], "warmup": []}
    lock = threading.Lock()
    logs: dict[int, Path] = {}
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(bs.signal, "signal", lambda *a: None)  # keep pytest's handlers
    monkeypatch.setattr(ab, "_generate_model", lambda *a, **k: 0.0)
    monkeypatch.setattr(ab, "_gpu_name", lambda: "NVIDIA H200, 143771 MiB")
    monkeypatch.setattr(ab, "_stop_all", lambda procs: seen["stopped"].extend(procs))
    monkeypatch.setattr(ab.srv, "stop", lambda proc: seen["stopped"].append("early"))
    monkeypatch.setattr(ab, "_warmup", lambda urls, n, *a, **k: seen["warmup"].append((sorted(urls), n)))

    def wait_ready(procs, ports, logs_, deadline):
        (name,) = procs
        if name == fail:
            raise RuntimeError(f"{name} server exited with 1:\nboom")
        return {name: 1.0}

    monkeypatch.setattr(ab, "_wait_ready", wait_ready)
    rings = f"[t] {ab.REPLAY_LOG_MARK}. family=mamba2\n"
    plan = "".join(f"[t] {_decision(b, 'replay', 'measured', 'r', 9.0, 3.0).log_line()}\n" for b in (1, 64))
    start_logs = {"stock_spec": MEMORY_LOG_STOCK_SPEC + (rings if stock_rings else ""),
                  "replay_spec": MEMORY_LOG_REPLAY_SPEC + plan + rings, "stock_nospec": MEMORY_LOG_NOSPEC}
    start_logs.update(server_logs or {})

    def launch(model, vargs, log, *, port, env, base_flags):
        name = log.stem.removeprefix("server_")
        spec_pools = (tmp_path / "out" / "server_stock_spec.log").read_text() if seen["launch"] else ""
        seen["launch"].append((name, env["CUDA_VISIBLE_DEVICES"], bs.POOL_MARK in spec_pools, list(vargs)))
        seen.setdefault("workspace", {})[name] = env.get("SGLANG_FLASHINFER_WORKSPACE_SIZE")
        assert env["SGLANG_REPLAYSSM_VERIFY_CACHE"].endswith("verify_decisions.json")
        assert base_flags[base_flags.index("--max-total-tokens") + 1] == str(4 * (64 + 16 + 4 + 64) + 8192)
        logs[port] = log
        log.write_text(start_logs[name])
        return _FakeProc()

    monkeypatch.setattr(ab.srv, "launch", launch)

    def fake_run(cmd, ofile, *, env, cwd, timeout, **k):
        assert cmd[1:3] == ["-m", "sglang.bench_serving"] and Path(ofile).parent == Path(cwd)
        kv = dict(zip(cmd, cmd[1:]))
        c, n = int(kv["--max-concurrency"]), int(kv["--num-prompts"])
        spec = kv["--tag"].startswith(("stock_spec", "replay_spec"))
        with lock:
            seen["bench"].append(kv["--tag"])
        with open(logs[int(kv["--port"])], "a") as fh:  # this run's decode lines
            fh.write(_decode_line(c, 1.0 if spec else None) * 2)
        tput = {"stock_spec": 100.0, "replay_spec": 180.0, "stock_nospec": 300.0}[kv["--tag"].split("-")[0]] * c
        if kv["--tag"] == slow_exit:
            block = _result_block(c, n, tput)
            return ab.BenchRun(rc="killed after its result", text=block, result=ab.parse_bench_stdout(block),
                               source="stdout")
        Path(kv["--output-file"]).write_text(json.dumps(_bench_line(kv["--tag"], c, n, tput)) + "\n")
        return ab.BenchRun(rc=0, text=f"bench {kv['--tag']}\n", result=ab.read_bench_jsonl(ofile),
                           source="output file")

    monkeypatch.setattr(bs, "run_bench_serving", fake_run)
    return seen


def test_main_with_fakes(monkeypatch, tmp_path: Path):
    seen = _fake_world(monkeypatch, tmp_path)
    out = tmp_path / "out"
    rc = bs.main(["--out", str(out), "--commit", "abc", "--concurrency", "4,1", "--num-prompts", "8,8",
                  "--input-len", "64", "--output-len", "16", "--model-dir", str(tmp_path / "m"), "--time-budget", "300"])
    assert rc == 0
    # the spec servers first, one per GPU; stock without spec on the first GPU once stock spec sized its pools
    assert [x[:3] for x in seen["launch"]] == [("stock_spec", "0", False), ("replay_spec", "1", True),
                                               ("stock_nospec", "0", True)]
    assert seen["launch"][1][3][:6] == ["--ssm-backend", "replay", "--replayssm-window", "16",
                                        "--replayssm-verify", "auto"]
    assert seen["warmup"] == [(["replay_spec", "stock_spec"], 4), (["stock_nospec"], 4)]
    assert set(seen["workspace"].values()) == {None}  # SGLang's FlashInfer workspace default with the radix cache on
    # the spec pairs per concurrency in order, then stock without spec with c=1 first
    assert sorted(seen["bench"][:2]) == ["replay_spec-c4", "stock_spec-c4"]
    assert sorted(seen["bench"][2:4]) == ["replay_spec-c1", "stock_spec-c1"]
    assert seen["bench"][4:] == ["stock_nospec-c1", "stock_nospec-c4"]
    assert sorted(seen["stopped"]) == sorted(bs.VARIANTS)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["results.md", "results.json", "bench_raw.jsonl", "bench_stdout.log", "gen.log",
         *(f"server_{v}.log" for v in bs.VARIANTS)])
    res = json.loads((out / "results.json").read_text())
    r4 = res["runs"]["4"]["replay_spec"]
    assert "server_info" not in r4 and r4["completed"] == 8 and r4["output_throughput"] == 720.0
    # only this run's decode lines: 2 at #running-req 4
    assert r4["server_log_decode"] == {"decode_lines": 2, "peak_running": 4, "accept_len": 1.0,
                                       "steady_tok_s": 4000.0, "steady_lines": 1}
    assert res["runs"]["1"]["stock_nospec"]["server_log_decode"]["accept_len"] is None
    assert res["memory"]["stock_spec"]["max_running_requests"] == 61
    assert res["memory"]["replay_spec"]["ring_bytes_per_slot"] == 7472648
    assert [d["bs"] for d in res["verify_plan"]] == [1, 64]
    assert res["meta"]["draft_config"]["vocab_size"] == 131072 and res["meta"]["warnings"] == []
    assert res["meta"]["gpu_of"] == {"stock_spec": "0", "replay_spec": "1", "stock_nospec": "0"}
    assert Path(f"{tmp_path / 'm'}_draft/config.json").exists()
    report = (out / "results.md").read_text()
    assert "| 4 | replay_spec | 8 | 8 | 720.0 | 1.800 |" in report
    assert "target c=1: replay spec / the better of stock spec and stock without spec >= 0.98: 0.600 MISSED" \
        in report
    raw = [json.loads(x) for x in (out / "bench_raw.jsonl").read_text().splitlines()]
    assert sorted(x["spec_variant"] for x in raw) == sorted(list(bs.VARIANTS) * 2)
    assert (out / "bench_stdout.log").read_text().count("=====") == 6


def test_main_goes_on_without_a_server(monkeypatch, tmp_path: Path):
    """A spec server that does not start is stopped and reported; the others still run (and a stock server
    that shows ReplaySSM rings is reported)."""
    seen = _fake_world(monkeypatch, tmp_path, fail="replay_spec", stock_rings=True)
    out = tmp_path / "out"
    rc = bs.main(["--out", str(out), "--commit", "abc", "--concurrency", "4", "--input-len", "64",
                  "--output-len", "16", "--model-dir", str(tmp_path / "m"), "--time-budget", "300"])
    assert rc == 1
    assert seen["bench"] == ["stock_spec-c4", "stock_nospec-c4"] and "early" in seen["stopped"]
    res = json.loads((out / "results.json").read_text())
    assert "replay_spec" not in res["runs"]["4"]
    assert any(w.startswith("replay_spec did not start: RuntimeError") for w in res["meta"]["warnings"])
    assert "stock_spec: its log shows 'ReplaySSM rings are allocated': ReplaySSM is active there" in res["meta"][
        "warnings"]
    assert "not measured" in (out / "results.md").read_text()


# ----------------------------------------------------------------------------- --draft oracle


def test_oracle_arguments_and_flags():
    a = bs.parse_args(["--commit", "x", "--draft", "oracle"])
    assert a.wrong_rate == 0.25 and a.model_dir == "/tmp/replayssm_bench_models/nemotron_h_nano4b_echo"
    assert bs.parse_args(["--commit", "x"]).wrong_rate is None
    assert bs.parse_args(["--commit", "x", "--draft", "oracle", "--wrong-rate", "0"]).wrong_rate == 0.0
    p = _server_parser()
    for v in bs.SPEC_VARIANTS:
        flags = bs.variant_flags(v, a, "/d")
        n = p.parse_args(["--model-path", "/m", *bs.common_flags(a), *flags])
        assert n.speculative_algorithm == "REPLAYSSM_ORACLE" and n.speculative_num_draft_tokens == 4
        assert n.speculative_draft_model_path is None and n.max_running_requests == bs.SPEC_MAX_RUNNING_REQUESTS
    env = bs.oracle_env("/o.json")
    assert env["SGLANG_PLUGINS"] == "replayssm,replayssm_spec_oracle" and env["REPLAYSSM_SPEC_ORACLE"] == "/o.json"
    assert env["PYTHONPATH"].split(":")[0] == str(bs.ORACLE_DIR)
    assert (bs.ORACLE_DIR / "replayssm_spec_oracle-0.0.0.dist-info" / "entry_points.txt").exists()
    assert bs._oracle_module().ALGORITHM == bs.ORACLE_ALGORITHM and bs._oracle_module().ENV == bs.ORACLE_ENV


@pytest.fixture(scope="module")
def tokenizer_131k(tmp_path_factory):
    """The word-level tokenizer of the Nano-4B preset (131072 ids), as the model directory has it."""
    import make_model
    from sglang.benchmark.utils import get_tokenizer

    d = tmp_path_factory.mktemp("tok")
    make_model.build_tokenizer(_cfg("nemotron_h_nano4b")["vocab_size"], d)
    return get_tokenizer(str(d)), d


def test_bench_prompts_are_what_bench_serving_sends(monkeypatch, tokenizer_131k):
    """bench_serving's own parser on the run's command, its seeding and dataset code, and the server's
    encoding of the text give ``bench_prompts``; the text round-trips to the sampled ids."""
    import random

    import numpy as np
    from sglang.benchmark import serving
    from sglang.benchmark.datasets import get_dataset

    tok, tok_dir = tokenizer_131k
    a = bs.parse_args(["--commit", "x", "--draft", "oracle", "--input-len", "96", "--output-len", "16",
                       "--seed", "5"])
    cmd = ab.bench_cmd(a, tok_dir, 30001, 64, 64, "/o.jsonl", "replay_spec-c64")
    seen = {}
    monkeypatch.setattr(serving, "run_benchmark", lambda ns: seen.setdefault("args", ns))
    monkeypatch.setattr(sys, "argv", ["bench_serving", *cmd[3:]])
    serving.cli_main()
    ns = seen["args"]
    random.seed(ns.seed)
    np.random.seed(ns.seed)
    rows = get_dataset(ns, tok, None)
    sent = [tok.encode(r.prompt) for r in rows]
    got = bs.bench_prompts(a, 64, tok)
    assert got == sent and len(got) == 64 and all(len(p) == 96 for p in got)
    # the ids path (--tokenize-prompt) gives the same ids: the text round-trips, specials included
    ns.tokenize_prompt = True
    random.seed(ns.seed)
    np.random.seed(ns.seed)
    assert [list(r.prompt) for r in get_dataset(ns, tok, None)] == got
    assert tok.encode(tok.decode([0, 1, 2, 3, 4, 131071])) == [0, 1, 2, 3, 4, 131071]


def test_bench_prompts_restore_random_states(tokenizer_131k):
    import random

    import numpy as np

    tok, _ = tokenizer_131k
    a = bs.parse_args(["--commit", "x", "--draft", "oracle", "--input-len", "8"])
    random.seed(123)
    np.random.seed(123)
    expect = (random.random(), float(np.random.rand()))
    random.seed(123)
    np.random.seed(123)
    bs.bench_prompts(a, 4, tok)
    assert (random.random(), float(np.random.rand())) == expect


def test_oracle_entries_and_expected_accept():
    import make_model

    vocab = 1000
    runs = {4: [[5, 6, 7], [9, 10, 11]], 1: [[5, 6, 7]], 2: [[5, 6, 7], [9, 10, 11]]}
    entries, expected = bs.oracle_entries(runs, 20, vocab, 0.25, 4)
    assert [e["prompt"] for e in entries] == [[5, 6, 7], [9, 10, 11]] and [e["seed"] for e in entries] == [0, 1]
    assert entries[0]["reference"] == make_model.echo_continuation([5, 6, 7], 20, vocab) == list(range(8, 28))
    assert all(e["rate"] == 0.25 for e in entries) and expected[4] == expected[2]
    o = bs._oracle_module()
    steps = o.expected_verify_steps(entries[0]["reference"], 0.25, 0, vocab, 4, 20)
    assert expected[1] == round(19 / steps, 4)
    assert bs.oracle_entries({1: [[5]]}, 128, vocab, 0.0, 4)[1][1] == round(127 / 32, 4)  # 4 per step
    assert bs.geometric_accept_length(0.0, 4) == 4.0 and bs.geometric_accept_length(1.0, 4) == 1.0
    assert abs(bs.geometric_accept_length(0.25, 4) - 2.734375) < 1e-9


def _oracle_meta() -> dict:
    return {**_meta(), "draft": "oracle", "wrong_rate": 0.25, "warnings": [],
            "oracle": {"wrong_rate": 0.25, "entries": 509, "expected_accept_len": {"256": 2.704, "1": 2.69},
                       "geometric_accept_len": 2.7344,
                       "reference_check": {"stock_spec": {"checked": 8, "equal": 8, "errors": 0, "first_diff": None},
                                           "replay_spec": {"checked": 8, "equal": 7, "errors": 0,
                                                           "first_diff": [3, 5, 11, 12]}}}}


def test_report_oracle():
    runs = {256: {"num_prompts": 256, "stock_spec": _result(9000.0, 10.0, 2.6, 2.70, 61, 256),
                  "replay_spec": _result(18000.0, 7.0, 2.65, 2.71, 140, 256)},
            1: {"num_prompts": 8}}
    report = bs.build_report(runs, {}, [], _oracle_meta())
    assert "REPLAYSSM_ORACLE drafter on the echo variant of the model, wrong rate 0.25, 3 steps, topk 1, 4 draft " \
           "tokens" in report
    assert "| 256 | 2.704 | 2.700 | 2.710 | 2.600 | 2.650 |" in report and "| 1 | 2.690 | — | — | — | — |" in report
    assert "geometric accept length 2.734 at T=4" in report
    assert "Reference check stock_spec: 8/8 greedy outputs equal the references (0 errors)." in report
    assert "Reference check replay_spec: 7/8 greedy outputs equal the references (0 errors; first difference " \
           "[entry, position, got, expected] [3, 5, 11, 12])." in report
    assert "target c=256: replay spec / stock spec output throughput >= 1.80: 2.000 met; accept len 2.700 vs " \
           "2.710: equal" in report
    assert "dummy" not in report
    assert "Reference check: not run." in bs.build_report(runs, {}, [], {**_oracle_meta(), "oracle": {}})


def test_main_oracle_with_fakes(monkeypatch, tmp_path: Path):
    import make_model

    seen = _fake_world(monkeypatch, tmp_path)
    model_dir = tmp_path / "m_echo"
    model_dir.mkdir()
    make_model.build_tokenizer(_cfg("nemotron_h_nano4b")["vocab_size"], model_dir)
    monkeypatch.setattr(bs, "_generate_echo_model", lambda *a, **k: seen.setdefault("echo", 1) and 0.0)
    monkeypatch.setattr(bs, "_warmup_ids", lambda urls, n, *a, **k: seen["warmup"].append(("ids", sorted(urls), n)))
    monkeypatch.setattr(ab, "_warmup", lambda *a, **k: pytest.fail("logprob warm-up with the oracle drafter"))
    envs = {}
    launch = ab.srv.launch

    def launch_env(model, vargs, log, *, port, env, base_flags):
        envs[log.stem.removeprefix("server_")] = env
        return launch(model, vargs, log, port=port, env=env, base_flags=base_flags)

    monkeypatch.setattr(ab.srv, "launch", launch_env)
    checked = []

    def check(urls, entries, n, timeout):
        oracle = json.loads(Path(envs["stock_spec"]["REPLAYSSM_SPEC_ORACLE"]).read_text())["entries"]
        checked.append((sorted(urls), [e["prompt"] for e in entries], n))
        assert len(entries) == bs.REFERENCE_CHECK_PROMPTS and entries == oracle[-len(entries):]
        return {v: {"checked": len(entries), "equal": len(entries), "errors": 0, "first_diff": None} for v in urls}

    monkeypatch.setattr(bs, "check_references", check)
    out = tmp_path / "out"
    rc = bs.main(["--out", str(out), "--commit", "abc", "--concurrency", "4,1", "--num-prompts", "8,8",
                  "--input-len", "64", "--output-len", "16", "--model-dir", str(model_dir), "--time-budget", "300",
                  "--draft", "oracle", "--wrong-rate", "0.5"])
    assert rc == 0 and seen["echo"] == 1
    assert not Path(f"{model_dir}_draft").exists()
    spec_flags = {name: vargs for name, *_, vargs in seen["launch"]}
    for v in bs.SPEC_VARIANTS:
        f = spec_flags[v]
        assert f[f.index("--speculative-algorithm") + 1] == "REPLAYSSM_ORACLE"
        assert envs[v]["SGLANG_PLUGINS"] == "replayssm,replayssm_spec_oracle"
    assert "REPLAYSSM_SPEC_ORACLE" not in envs["stock_nospec"] and "SGLANG_PLUGINS" not in envs["stock_nospec"]
    assert seen["warmup"] == [("ids", ["replay_spec", "stock_spec"], 4), ("ids", ["stock_nospec"], 4)]
    oracle_file = Path(envs["replay_spec"]["REPLAYSSM_SPEC_ORACLE"])
    entries = json.loads(oracle_file.read_text())["entries"]
    # c=4 runs 8 prompts, c=1 8 prompts too: one set (same seed and count); then the check's 8 (another seed)
    assert len(entries) == 16 and all(len(e["prompt"]) == 64 and len(e["reference"]) == 16 for e in entries)
    assert not {tuple(e["prompt"]) for e in entries[8:]} & {tuple(e["prompt"]) for e in entries[:8]}
    assert all(e["rate"] == 0.5 for e in entries)
    assert [c[0] for c in checked] == [["replay_spec", "stock_spec"], ["stock_nospec"]] and checked[0][2] == 16
    res = json.loads((out / "results.json").read_text())
    o = res["meta"]["oracle"]
    assert o["entries"] == 16 and set(o["expected_accept_len"]) == {"4", "1"} and o["geometric_accept_len"] == 1.875
    assert set(o["reference_check"]) == set(bs.VARIANTS) and res["meta"]["warnings"] == []
    assert res["meta"]["draft_config"] is None
    report = (out / "results.md").read_text()
    assert "Reference check replay_spec: 8/8" in report and "wrong rate 0.5" in report


@pytest.mark.e2e
def test_oracle_mode_on_a_cpu_server(tmp_path: Path):
    """The whole --draft oracle chain on a real CPU server: echo tiny Nemotron-H, REPLAYSSM_ORACLE with
    ``--ssm-backend replay``, the oracle file from ``bench_prompts``; the reference check passes on 8
    prompts, and a real bench_serving run (``bench_serving_ab.bench_cmd``) shows the expected accept
    length: its prompts were the oracle file's (a prompt not in the file gets drafts of token 0, accept
    length ~1).  About 70 s on 2 cores."""
    import os
    import subprocess

    import make_model
    from sglang.benchmark.utils import get_tokenizer

    sys.path.insert(0, str(ROOT / "tests" / "e2e"))
    import server as srv

    model = make_model.materialize("nemotron_h_tiny", tmp_path / "echo", echo=True)
    vocab = _cfg("nemotron_h_tiny")["vocab_size"]
    c, n, rate = 4, 8, 0.25
    a = bs.parse_args(["--commit", "x", "--draft", "oracle", "--wrong-rate", str(rate), "--input-len", "40",
                       "--output-len", "24", "--concurrency", str(c), "--num-prompts", str(n),
                       "--model-dir", str(model)])
    prompts = bs.bench_prompts(a, n, get_tokenizer(str(model)))
    entries, expected = bs.oracle_entries({c: prompts}, a.output_len, vocab, rate, a.draft_tokens)
    oracle_file = tmp_path / "oracle.json"
    oracle_file.write_text(json.dumps({"entries": entries}))
    flags = ["--ssm-backend", "replay", "--max-mamba-cache-size", "32", *bs._spec_flags("", a.draft_tokens, "oracle")]
    with srv.server(model, flags, tmp_path / "server.log", env=bs.oracle_env(oracle_file)) as url:
        check = bs.check_references({"replay_spec": url}, entries, a.output_len, timeout=300)
        port = int(url.rsplit(":", 1)[1])
        ofile = tmp_path / "run.jsonl"
        cmd = ab.bench_cmd(a, model, port, c, n, ofile, "replay_spec-c4")
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                           env={**os.environ, "SGLANG_PLUGINS": "replayssm"}, cwd=tmp_path)
        assert r.returncode == 0, r.stdout[-3000:]
    k = len(entries)  # distinct prompts (random-ids repeats one now and then)
    assert check["replay_spec"] == {"checked": k, "equal": k, "errors": 0, "first_diff": None}
    res = ab.read_bench_jsonl(ofile)
    assert res["completed"] == n
    # the server's average since it started: the check's requests, bench_serving's warm-up (prompt 0), the run
    by_prompt = {tuple(e["prompt"]): e for e in entries}
    run = [by_prompt[tuple(p)] for p in prompts]
    served = entries + run[:1] + run
    want = bs._oracle_module().expected_accept_length(served, vocab, a.draft_tokens, a.output_len)
    print(f"accept length: server {res['accept_length']}, expected {want:.3f} (run alone {expected[c]})")
    assert abs(res["accept_length"] - want) < 0.1


# ----------------------------------------------------------------------------- bench_serving's exit


def _result_block(c: int, n: int, tput: float, accept: float | None = 2.71) -> str:
    """bench_serving 0.5.17's printed result block, in its own format strings (``benchmark``)."""
    row = "{:<40} {:<10}".format
    rowf = "{:<40} {:<10.2f}".format
    lines = ["\n{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="), row("Backend:", "sglang"),
             row("Traffic request rate:", "inf"), row("Max request concurrency:", c), row("Successful requests:", n),
             rowf("Benchmark duration (s):", 9.87), row("Total input tokens:", 512 * n),
             row("Total input text tokens:", 512 * n), row("Total generated tokens:", 128 * n),
             row("Total generated tokens (retokenized):", 128 * n), rowf("Request throughput (req/s):", 25.93),
             rowf("Input token throughput (tok/s):", 13277.0), rowf("Output token throughput (tok/s):", tput),
             rowf("Peak output token throughput (tok/s):", 9100.0), row("Peak concurrent requests:", c),
             rowf("Total token throughput (tok/s):", 16596.25), rowf("Concurrency:", 250.1)]
    if accept:
        lines.append(rowf("Accept length:", accept))
    lines.append("{s:{c}^{n}}".format(s="End-to-End Latency", n=50, c="-"))
    for name, base in (("E2E Latency", 5000.0), ("TTFT", 1790.0), ("TPOT", 28.8), ("ITL", 24.57)):
        if name == "TTFT":
            lines.append("{s:{c}^{n}}".format(s="Time to First Token", n=50, c="-"))
        for i, stat in enumerate(("Mean", "Median", "P90", "P95", "P99")):
            lines.append(rowf(f"{stat} {name} (ms):", base + i))
    lines += [rowf("Max ITL (ms):", 300.0), "=" * 50]
    return "some progress\n" + "\n".join(lines) + "\n"


def test_parse_bench_stdout():
    text = _result_block(256, 256, 7694.4)
    r = ab.parse_bench_stdout(text)
    assert (r["completed"], r["max_concurrency"], r["output_throughput"], r["accept_length"]) == (
        256, 256, 7694.4, 2.71)
    assert (r["median_tpot_ms"], r["median_itl_ms"], r["mean_ttft_ms"], r["p99_e2e_latency_ms"]) == (
        29.8, 25.57, 1790.0, 5004.0)
    assert r["total_output_tokens"] == 128 * 256 and r["concurrency"] == 250.1 and r["max_concurrent_requests"] == 256
    assert ab.parse_bench_stdout(_result_block(1, 8, 380.0, accept=None))["accept_length"] is None
    assert ab.parse_bench_stdout(text.rsplit("=" * 50, 1)[0]) is None  # cut before its closing line
    assert ab.parse_bench_stdout("Traceback ...\n") is None
    # two blocks (a run appended to the same log): the last one
    assert ab.parse_bench_stdout(text + _result_block(512, 512, 100.0))["completed"] == 512
    assert ab.parse_bench_stdout(_result_block(4, 8, 1.0).replace("Max request concurrency:    ", "X"))[
        "completed"] == 8


def test_bench_stdout_labels_exist_in_bench_serving():
    """Every label parse_bench_stdout reads is printed by 0.5.17's bench_serving, in that format."""
    from sglang.benchmark import serving

    src = Path(serving.__file__).read_text()
    assert 's=" Serving Benchmark Result ", n=50, c="="' in src and 'print("=" * 50)' in src
    assert '"{:<40} {:<10}".format("Successful requests:", metrics.completed)' in src
    for label in ab._RESULT_LABELS:
        assert f'"{label}"' in src, label


def _child(tmp_path: Path, code: str) -> list[str]:
    script = tmp_path / "child.py"
    script.write_text(code)
    return [sys.executable, str(script)]


def test_run_bench_serving_ignores_an_earlier_runs_line(tmp_path: Path):
    """The same tag run twice (bench_serving_ab --concurrency 1,1): the first run's line in the output file is
    not the second run's result; the second run that never prints one runs to the limit and has none."""
    ofile = tmp_path / "run.jsonl"
    ofile.write_text(json.dumps(_bench_line("stock-c1", 1, 16, 181.0)) + "\n")
    code = "import time\nprint('benchmarking...', flush=True)\ntime.sleep(60)\n"
    run = ab.run_bench_serving(_child(tmp_path, code), ofile, env=dict(**__import__("os").environ), cwd=tmp_path,
                               timeout=3.0, exit_grace=0.5, poll=0.1)
    assert (run.rc, run.result, run.source) == ("timeout", None, None)


@pytest.mark.parametrize("case", ["file", "stdout", "exits", "exits_1", "hangs"])
def test_run_bench_serving(tmp_path: Path, case: str):
    """A bench_serving that does not exit once its result is out is killed after the grace and its result taken
    (from the output file, else from the printed block); one that prints nothing is killed at the limit."""
    import time

    ofile = tmp_path / "run.jsonl"
    block = _result_block(256, 256, 7694.4)
    line = json.dumps(_bench_line("stock_nospec-c256", 256, 256, 7694.4))
    code = {
        "file": f"import sys, time\nprint({block!r}, flush=True)\nopen({str(ofile)!r}, 'a').write({line!r} + '\\n')\n"
                "time.sleep(60)\n",
        "stdout": f"import time\nprint({block!r}, flush=True)\ntime.sleep(60)\n",
        "exits": f"print({block!r})\nopen({str(ofile)!r}, 'a').write({line!r} + '\\n')\n",
        "exits_1": f"print({block!r})\nraise SystemExit(1)\n",
        "hangs": "import time\nprint('benchmarking...', flush=True)\ntime.sleep(60)\n",
    }[case]
    t = time.monotonic()
    run = ab.run_bench_serving(_child(tmp_path, code), ofile, env=dict(**__import__("os").environ), cwd=tmp_path,
                               timeout=6.0, exit_grace=0.5, poll=0.1)
    took = time.monotonic() - t
    assert "Serving Benchmark Result" in run.text or case == "hangs"
    if case == "hangs":
        assert (run.rc, run.result, run.source) == ("timeout", None, None) and 5.5 < took < 20
        assert "benchmarking..." in run.text
        return
    assert took < 5.0, took  # no wait for the limit
    want = {"file": ("killed after its result", "output file"), "stdout": ("killed after its result", "stdout"),
            "exits": (0, "output file"), "exits_1": (1, "stdout")}[case]
    assert (run.rc, run.source) == want
    assert run.result["completed"] == 256 and run.result["output_throughput"] == 7694.4
    if run.source == "output file":
        assert run.result["tag"] == "stock_nospec-c256"


def test_main_takes_a_result_after_a_slow_exit(monkeypatch, tmp_path: Path):
    """stock_nospec c=4's bench_serving printed its result and was killed (no output file): the run is recorded
    from its printed block, with a warning, and the report shows it, not "failed"."""
    _fake_world(monkeypatch, tmp_path, slow_exit="stock_nospec-c4")
    out = tmp_path / "out"
    rc = bs.main(["--out", str(out), "--commit", "abc", "--concurrency", "4", "--num-prompts", "8", "--input-len",
                  "64", "--output-len", "16", "--model-dir", str(tmp_path / "m"), "--time-budget", "300"])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    r = res["runs"]["4"]["stock_nospec"]
    assert r["completed"] == 8 and r["output_throughput"] == 1200.0 and "error" not in r
    assert r["bench_exit"] == {"rc": "killed after its result", "result_from": "stdout"}
    assert r["server_log_decode"]["peak_running"] == 4
    assert ("c=4 stock_nospec: bench_serving exit killed after its result, but its result was out: taken from its "
            "stdout (see bench_stdout.log)") in res["meta"]["warnings"]
    assert "| 4 | stock_nospec | 8 | 8 | 1200.0 |" in (out / "results.md").read_text()
    assert "Serving Benchmark Result" in (out / "bench_stdout.log").read_text()


# ----------------------------------------------------------------------------- --radix off-equal-memory

GIB = 1 << 30


def _off(*extra: str) -> argparse.Namespace:
    return bs.parse_args(["--commit", "x", "--radix", "off-equal-memory", *extra])


def test_row_bytes_nano4b():
    """The Nano-4B shapes (21 Mamba-2 layers of 96 x 80 x 128, fp32 state, bf16 conv, 8 groups), T = 4, L = 16."""
    r = bs.mamba_row_bytes(_cfg("nemotron_h_nano4b"), draft_tokens=4, window=16)
    state, conv = 96 * 80 * 128 * 4 * 21, 9728 * 3 * 2 * 21  # conv_dim = 96*80 + 2*8*128, K - 1 = 3
    assert (r["family"], r["layers"], r["state_conv"]) == ("mamba2", 21, state + conv)
    assert r["per_draft_ssm"] == 4 * state
    assert r["per_draft_conv"] == 9728 * (4 + 3 - 1) * 2 * 21  # deduplicated windows [conv_dim, T + K - 2]
    # x + dt + B at R = max(16, 4) + 2·4 = 24 rows (the late rule's Mamba-2 ring), + the cursor pair
    assert r["ring"] == 8967176
    assert r["stock_spec"] == state + conv + 4 * state + r["per_draft_conv"]
    assert r["replay_spec"] == state + conv + r["per_draft_conv"] + 8967176
    assert 4.3 < r["stock_spec"] / r["replay_spec"] < 4.4
    fp8 = bs.mamba_row_bytes(_cfg("nemotron_h_nano4b"), draft_tokens=4, window=16, read_dtype="fp8")
    assert fp8["ring"] - r["ring"] == 96 * 80 * 128 * 21 + 96 * 80 * 4 * 21  # e4m3 copy + fp32 row scales


@pytest.mark.parametrize("name,family", [("nemotron_h_nano4b", "mamba2"), ("nemotron_h_tiny", "mamba2"),
                                         ("qwen3_next_4b", "gdn"), ("qwen3_next_tiny", "gdn")])
@pytest.mark.parametrize("verify", ["replay", "auto"])
def test_row_bytes_are_what_the_pools_allocate(monkeypatch, name: str, family: str, verify: str):
    """SGLang's ``MambaPool`` and the plug-in's ``ReplayMambaPool`` built on the meta device (their CUDA-only
    speculative buffers included; CUDA's deduplicated conv windows) allocate ``(M + 1) x`` the row bytes;
    with ``auto`` the replay pool keeps the per-draft buffer: its row is stock spec's plus the ring (why
    ``--radix off-equal-memory`` refuses it)."""
    import torch
    from sglang.srt.mem_cache import memory_pool as mp

    from sglang_replayssm.pool import ReplayMambaPool, ReplayPoolSpec

    monkeypatch.setenv("SGLANG_MAMBA_CONV_DTYPE", "bfloat16")
    monkeypatch.setenv("SGLANG_REPLAYSSM_CONFIG", json.dumps({"backend": "replay", "verify": verify, "window": 16}))
    zeros = torch.zeros
    monkeypatch.setattr(mp.torch, "zeros", lambda *a, device=None, **k: zeros(*a, device="meta", **k))
    monkeypatch.setattr(mp, "_is_cpu", False)
    monkeypatch.setattr(mp, "_is_npu", False)
    cfg = _cfg(name)
    params, fam = bs._cache_params(cfg)
    rows = bs.mamba_row_bytes(cfg, draft_tokens=4, window=16)
    assert fam == family
    m = 10
    kw = dict(size=m, spec_state_size=m, cache_params=params, mamba_layer_ids=list(params.layers), device="meta",
              speculative_num_draft_tokens=4, speculative_eagle_topk=1)
    stock = mp.MambaPool(**kw)
    replay = ReplayMambaPool(replay=ReplayPoolSpec(family=family, window=16, act_dtype=torch.bfloat16), **kw)
    assert round(stock.mem_usage * GIB) == (m + 1) * rows["stock_spec"]
    assert replay.replay_ring_bytes == (m + 1) * rows["ring"]
    want = rows["replay_spec"] if verify == "replay" else rows["stock_spec"] + rows["ring"]
    assert round(replay.mem_usage * GIB) == (m + 1) * want


def test_plan_default_nano4b():
    a = _off()
    assert a.replay_verify == "replay" and a.equal_mamba_gib == bs.EQUAL_MAMBA_GIB == 24.0
    plan = a.equal_memory
    rows = plan["row_bytes"]
    b = 24 * GIB
    assert (plan["stock_spec"]["max_running"], plan["replay_spec"]["max_running"]) == (60, 269)
    for v in bs.SPEC_VARIANTS:
        spent = plan[v]["bytes"]
        assert spent == (plan[v]["max_running"] + 1) * rows[v] and b - rows[v] < spent <= b  # the most that fit
    assert abs(plan["bytes_diff"]) < rows["stock_spec"]  # equal within one request
    assert plan["ratio"] == round(269 / 60, 4) and plan["ratio"] >= bs.MAX_RUNNING_X_MIN
    # start-up: each server allocates its own rows only (no per-draft transient on the replay server)
    assert plan["startup_bytes"] == max(plan[v]["bytes"] for v in bs.SPEC_VARIANTS) <= b
    gdn = _off("--family", "gdn").equal_memory
    assert gdn["row_bytes"]["family"] == "gdn" and gdn["ratio"] > 3


def test_plan_tiny_and_read_copy():
    a = _off("--draft-tokens", "2", "--window", "8")
    a.equal_mamba_gib = 0.01  # 0.01 GiB: refused for Nano-4B at parse time, ~500 tiny requests
    plan = bs.equal_memory_plan(a, _cfg("nemotron_h_tiny"))
    rows = plan["row_bytes"]
    assert rows["layers"] == 3 and rows["per_draft_ssm"] == 2 * 8 * 16 * 16 * 4 * 3
    for v in bs.SPEC_VARIANTS:
        assert 0.01 * GIB - rows[v] < plan[v]["bytes"] <= 0.01 * GIB
    assert abs(plan["bytes_diff"]) < max(rows["stock_spec"], rows["replay_spec"])
    assert plan["replay_spec"]["max_running"] > plan["stock_spec"]["max_running"] and plan["ratio"] > 1
    copy = _off("--replay-args", "--replayssm-read-dtype bf16").equal_memory
    assert copy["row_bytes"]["ring"] == _off().equal_memory["row_bytes"]["ring"] + 96 * 80 * 128 * 2 * 21
    assert copy["replay_spec"]["max_running"] < 269


def test_equal_memory_flags_parse_with_sglang_and_the_plugin():
    a = _off("--server-args", "--chunked-prefill-size 4096")
    p = _server_parser()
    ns = {v: p.parse_args(["--model-path", "/m", *bs.common_flags(a), *bs.variant_flags(v, a, "/d")])
          for v in bs.VARIANTS}
    assert ns["stock_spec"].max_running_requests == 60 and ns["replay_spec"].max_running_requests == 269
    for v in bs.SPEC_VARIANTS:
        assert ns[v].disable_radix_cache and ns[v].mem_fraction_static == 0.6 and ns[v].chunked_prefill_size == 4096
        assert ns[v].mamba_radix_cache_strategy == "auto"  # not given: unused with the radix cache off
        assert ns[v].speculative_num_draft_tokens == 4 and ns[v].speculative_eagle_topk == 1
    assert ns["replay_spec"].replayssm_verify == "replay" and ns["replay_spec"].ssm_backend == "replay"
    assert ns["stock_nospec"].max_running_requests == 512 and ns["stock_nospec"].speculative_algorithm is None
    o = _off("--draft", "oracle", "--equal-mamba-gib", "12")
    assert o.equal_memory["stock_spec"]["max_running"] == 12 * GIB // o.equal_memory["row_bytes"]["stock_spec"] - 1
    f = bs.variant_flags("replay_spec", o, "/d")
    assert f[f.index("--max-running-requests") + 1] == str(o.equal_memory["replay_spec"]["max_running"])
    assert bs.parse_args(["--commit", "x"]).equal_memory is None


def _pool_logs(plan: dict, skew: int = 0) -> dict:
    """Start-up lines as SGLang 0.5.17 and the plug-in format them, for the plan's pools (``skew``: replay
    allocated that many rows more than planned)."""
    rows = plan["row_bytes"]
    g = float(GIB)

    def mamba_line(n, spec):
        return (f"[t] Mamba Cache is allocated. max_mamba_cache_size: {n}, conv_state size: "
                f"{(n + 1) * 9728 * 3 * 2 * 21 / g:.2f}GB, ssm_state size: "
                f"{(n + 1) * 96 * 80 * 128 * 4 * 21 / g:.2f}GB "
                + (f"intermediate_ssm_state_cache size: {(n + 1) * rows['per_draft_ssm'] / g:.2f}GB "
                   f"intermediate_conv_window_cache size: {(n + 1) * rows['per_draft_conv'] / g:.2f}GB " if spec else "")
                + "\n")

    s, r = plan["stock_spec"]["max_running"], plan["replay_spec"]["max_running"] + skew
    summary = "[t] max_total_num_tokens={t}, chunked_prefill_size=8192, max_running_requests={m}, x\n"
    stock = ("[t] Load weight begin. avail mem=139.52 GB\n" + mamba_line(s, spec=True)
             + "[t] Memory pool end. avail mem=100.00 GB\n" + summary.format(t=370688, m=s))
    replay = ("[t] Load weight begin. avail mem=139.50 GB\n"
              f"[t] ReplaySSM memory: {rows['ring']} B of ring (+ read copy) per mamba slot "
              f"(state {rows['state_conv']} B per slot); max_mamba_cache_size {r} -> {r} (explicit size kept); rings charged 1.0 GB\n"
              + mamba_line(r, spec=False)
              + f"[t] ReplaySSM speculative state is allocated. device=cuda:0, draft tokens T=4, rows={r + 1}, conv "
                f"windows deduplicated, intermediate_ssm not allocated (--replayssm-verify replay, linear drafts: no "
                f"per-draft SSM state) intermediate_conv_window_cache size: {(r + 1) * rows['per_draft_conv'] / g:.2f}GB\n"
              f"[t] ReplaySSM rings are allocated. family=mamba2, window L=16, rows R=20, slots={r + 1}, layers=21, "
              f"x=(21, {r + 1}, 96, 20, 80) torch.bfloat16, ring size: {(r + 1) * rows['ring'] / g:.3f}GB "
              f"({rows['ring']} B per slot), mamba cache total: 23.917GB\n"
              "[t] Memory pool end. avail mem=100.00 GB\n" + summary.format(t=370688, m=r))
    return {"stock_spec": stock, "replay_spec": replay}


def test_equal_memory_check_from_the_logs():
    plan = _off().equal_memory
    logs = _pool_logs(plan)
    memory = {v: bs.parse_memory_log(t) for v, t in logs.items()}
    assert memory["replay_spec"]["per_draft_ssm_not_allocated"] and memory["replay_spec"]["per_draft_gb"] is None
    c = bs.equal_memory_check(plan, memory)
    assert c["equal"] is True and c["ratio"] == round(269 / 60, 4)
    for v in bs.SPEC_VARIANTS:
        assert c[v]["gib_matches_plan"] and c[v]["slots_match_plan"] and c[v]["max_running_matches_plan"], c[v]
        assert abs(c[v]["logged_gib"] - plan[v]["gib"]) <= bs.LOGGED_GIB_TOL
    # replay allocated 10 rows more than planned: the logs say so (0.87 GiB more: still within one stock row? no)
    skewed = {v: bs.parse_memory_log(t) for v, t in _pool_logs(plan, skew=10).items()}
    k = bs.equal_memory_check(plan, skewed)
    assert k["equal"] is False and k["replay_spec"]["slots_match_plan"] is False
    assert k["replay_spec"]["gib_matches_plan"] is False and k["stock_spec"]["gib_matches_plan"]
    assert bs.equal_memory_check(plan, {})["equal"] is None and bs.equal_memory_check(None, memory) is None
    report = bs.build_report({}, memory, [], {**_meta(), "radix": "off-equal-memory", "equal_memory": plan,
                                               "warnings": []})
    assert "| stock_spec | 79.92 | 315.00 | 2.34 | 0.00 | 397.26 | 60 | 23.665 | 23.660 | 60 | 60 | 370688 |" \
        in report
    assert "| replay_spec | 79.92 | 0.00 | 2.34 | 8.55 | 90.81 | 269 | 23.944 | 23.945 | 269 | 269 | 370688 |" \
        in report
    assert "(difference -0.285; one stock_spec request is 0.388 GiB): equal." in report
    assert (f"Start-up: at most {plan['startup_gib']:.1f} GiB of mamba state per spec server (each allocates only "
            "its planned rows; the replay pool allocates no per-draft SSM buffer); not checked.") in report
    assert "Max running requests by arithmetic: 269 / 60 = 4.48x (not a measurement); from the logs: 4.48x." in report
    assert "GiB): equal." in report and "radix cache off, equal mamba-state memory" in report
    assert "max running requests at equal memory >= 2.50: 4.48 met (radix cache off, equal memory by the pool " \
           "lines: equal)" in report
    bad = bs.build_report({}, skewed, [], {**_meta(), "radix": "off-equal-memory", "equal_memory": plan,
                                           "warnings": []})
    assert "NOT equal" in bad and "replay_spec: logged mamba GiB, mamba slots, max_running_requests differ from " \
                                  "the plan" in bad


def test_startup_fit():
    """Only each server's own planned allocation (at most B) counts at start-up: the replay server no longer
    needs stock spec's row x its own M + 1 for a moment (106 GiB at the default 24 GiB)."""
    plan = _off().equal_memory
    ok = bs.startup_fit(plan, 139 * GIB, 7 * GIB)
    assert ok["fits"] and ok["need_gib"] == pytest.approx(plan["startup_gib"] + 7 + bs.STARTUP_HEADROOM_GIB, abs=2e-3)
    assert ok["need_gib"] <= 24 + 7 + bs.STARTUP_HEADROOM_GIB and ok["max_budget_gib"] == 139 - 7 - 3
    assert bs.startup_fit(plan, 40 * GIB, 7 * GIB)["fits"]  # fitted only stock's share before the fix
    tight = bs.startup_fit(plan, 30 * GIB, 7 * GIB)
    assert tight["fits"] is False and tight["max_budget_gib"] == 20
    # the largest budget it names does fit, and a bit more does not
    a = _off("--equal-mamba-gib", str(tight["max_budget_gib"]))
    assert bs.startup_fit(a.equal_memory, 30 * GIB, 7 * GIB)["fits"]
    odd = bs.startup_fit(plan, int(30.005 * GIB), 7 * GIB)["max_budget_gib"]  # rounded down, never up
    assert odd == 20 and bs.startup_fit(_off("--equal-mamba-gib", str(odd)).equal_memory, int(30.005 * GIB),
                                        7 * GIB)["fits"]
    assert bs.startup_fit(plan, None, 7 * GIB)["fits"] is None


def test_main_equal_memory_with_fakes(monkeypatch, tmp_path: Path):
    monkeypatch.delenv("SGLANG_FLASHINFER_WORKSPACE_SIZE", raising=False)
    plan = _off().equal_memory
    seen = _fake_world(monkeypatch, tmp_path, server_logs=_pool_logs(plan))
    monkeypatch.setattr(bs, "_gpu_free_bytes", lambda gpu: seen.setdefault("free_of", []).append(gpu) or 139 * GIB)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model-00001.safetensors").write_bytes(b"x" * 1000)
    out = tmp_path / "out"
    rc = bs.main(["--out", str(out), "--commit", "abc", "--concurrency", "4", "--input-len", "64",
                  "--output-len", "16", "--model-dir", str(tmp_path / "m"), "--time-budget", "300",
                  "--radix", "off-equal-memory"])
    assert rc == 0 and seen["free_of"] == ["0", "1"]  # both spec servers' GPUs
    flags = {name: vargs for name, *_, vargs in seen["launch"]}
    for v in bs.SPEC_VARIANTS:
        f = flags[v]
        assert "--disable-radix-cache" in f and "--mamba-radix-cache-strategy" not in f
        assert f[f.index("--max-running-requests") + 1] == str(plan[v]["max_running"])
    res = json.loads((out / "results.json").read_text())
    assert res["meta"]["radix"] == "off-equal-memory"
    # FlashInfer's workspace raised on all three servers (the 384 MiB default overflowed at 269 running)
    assert seen["workspace"] == {v: str(2 << 30) for v in bs.VARIANTS} and res["meta"]["flashinfer_workspace"] == \
        str(2 << 30)
    assert res["meta"]["equal_memory"]["replay_spec"]["max_running"] == 269
    assert res["meta"]["equal_memory"]["startup_check"]["fits"] is True
    assert res["equal_memory_check"]["equal"] is True and res["equal_memory_check"]["ratio"] == round(269 / 60, 4)
    assert res["meta"]["warnings"] == []
    report = (out / "results.md").read_text()
    assert "Equal memory from the logs:" in report
    assert "GiB free on the spec GPUs (the smaller reading) before the servers started." in report


def test_main_equal_memory_refuses_a_startup_that_cannot_fit(monkeypatch, tmp_path: Path):
    seen = _fake_world(monkeypatch, tmp_path)
    # 80 GiB was refused while the replay server briefly held stock spec's rows; now the smaller reading decides
    monkeypatch.setattr(bs, "_gpu_free_bytes", lambda gpu: {"0": 80 * GIB, "1": 20 * GIB}[gpu])
    out = tmp_path / "out"
    rc = bs.main(["--out", str(out), "--commit", "abc", "--concurrency", "4", "--input-len", "64",
                  "--output-len", "16", "--model-dir", str(tmp_path / "m"), "--time-budget", "300",
                  "--radix", "off-equal-memory"])
    assert rc == 1 and seen["launch"] == [] and seen["bench"] == []
    res = json.loads((out / "results.json").read_text())
    (w,) = res["meta"]["warnings"]
    assert w.startswith("aborted: RuntimeError: --equal-mamba-gib 24: a spec server's mamba state") and \
        "GiB free on GPUs 0,1 (the smaller reading); expected --equal-mamba-gib <=" in w


def test_one_gpu_budgets_and_flags():
    """One GPU: KV bytes per token from SGLang's config, per-server budgets, the fit and the fraction."""
    from benchmarks import spec_one_gpu as one

    a = _off("--gpus", "0", "--concurrency", "256,1", "--num-prompts", "256,8")
    assert a.one_gpu and a.gpus == [0] and not _off().one_gpu
    cfg = json.loads((ab.ROOT / "tests" / "models" / "nemotron_h_nano4b" / "config.json").read_text())
    kv = bs.kv_bytes_per_token(cfg)
    assert kv == 4 * 2 * 8 * 128 * 2  # 4 attention layers, 8 KV heads of 128, bf16 K and V
    b = one.server_budgets(a, a.equal_memory, kv, 7 * GIB, bs.VARIANTS)
    per = 512 + 128 + 4 + 64
    assert b["stock_spec"]["running"] == 60 and b["replay_spec"]["running"] == 256
    assert b["stock_nospec"]["running"] == 256
    assert b["replay_spec"]["kv_tokens"] == 256 * per + 8192 and b["stock_spec"]["kv_tokens"] == 60 * per + 8192
    assert b["stock_nospec"]["mamba_bytes"] == 257 * a.equal_memory["row_bytes"]["state_conv"]
    assert b["stock_spec"]["need_bytes"] == 7 * GIB + a.equal_memory["stock_spec"]["bytes"] + \
        b["stock_spec"]["kv_bytes"]
    fit = one.one_gpu_fit(b, 139 * GIB)
    assert fit["fits"] and one.one_gpu_fit(b, 60 * GIB)["fits"] is False and one.one_gpu_fit(b, None)["fits"] is None
    flags = one.server_flags(b["stock_spec"], 139 * GIB)
    f = float(flags[1])
    assert flags[0] == "--mem-fraction-static" and flags[2:] == ["--max-total-tokens", str(60 * per + 8192)]
    # SGLang's rest = f x free - weights covers the mamba rows and the KV
    assert f * 139 * GIB - 7 * GIB >= a.equal_memory["stock_spec"]["bytes"] + b["stock_spec"]["kv_bytes"]
    with pytest.raises(ValueError, match="GiB free, got fraction"):
        one.server_flags(b["stock_spec"], 30 * GIB)


def test_main_one_gpu_with_fakes(monkeypatch, tmp_path: Path):
    """One GPU: the servers start one after another on it, each with its own fraction; the runs one at a time."""
    from benchmarks import spec_one_gpu as one

    plan = _off().equal_memory
    seen = _fake_world(monkeypatch, tmp_path, server_logs={**_pool_logs(plan), "stock_nospec": MEMORY_LOG_NOSPEC})
    free = iter([139 * GIB, 139 * GIB, 100 * GIB, 60 * GIB, 60 * GIB])  # less before each launch
    monkeypatch.setattr(bs, "_gpu_free_bytes", lambda gpu: next(free))
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model-00001.safetensors").write_bytes(b"x" * 1000)
    out = tmp_path / "out"
    rc = bs.main(["--out", str(out), "--commit", "abc", "--concurrency", "4,1", "--input-len", "64",
                  "--output-len", "16", "--model-dir", str(tmp_path / "m"), "--time-budget", "300",
                  "--radix", "off-equal-memory", "--gpus", "0"])
    assert rc == 0
    assert [x[:2] for x in seen["launch"]] == [("stock_spec", "0"), ("replay_spec", "0"), ("stock_nospec", "0")]
    fractions = [float(v[v.index("--mem-fraction-static") + 1]) for *_, v in seen["launch"]]
    assert all(v.count("--mem-fraction-static") == 1 and v.count("--max-total-tokens") == 1
               for *_, v in seen["launch"])
    res = json.loads((out / "results.json").read_text())
    budgets = res["meta"]["one_gpu_budgets"]["servers"]
    # each fraction from the free memory read just before its launch
    assert fractions == [float(one.server_flags(budgets[v], int(budgets[v]["free_at_launch_gib"] * GIB))[1])
                         for v in bs.VARIANTS]
    assert [budgets[v]["free_at_launch_gib"] for v in bs.VARIANTS][1:] == [100.0, 60.0]
    # sequential runs, the pair's order alternating with the concurrency
    assert seen["bench"] == ["stock_spec-c4", "replay_spec-c4", "replay_spec-c1", "stock_spec-c1",
                             "stock_nospec-c1", "stock_nospec-c4"]
    assert res["meta"]["one_gpu"] and res["meta"]["gpu_of"] == {v: "0" for v in bs.VARIANTS}
    assert res["meta"]["warnings"] == []
    assert "One GPU (spec_one_gpu.py): every server on it" in (out / "results.md").read_text()


def test_main_one_gpu_skip_nospec_and_refusal(monkeypatch, tmp_path: Path):
    plan = _off().equal_memory
    seen = _fake_world(monkeypatch, tmp_path, server_logs=_pool_logs(plan))
    monkeypatch.setattr(bs, "_gpu_free_bytes", lambda gpu: 139 * GIB)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model-00001.safetensors").write_bytes(b"x" * 1000)
    argv = ["--commit", "abc", "--concurrency", "4", "--input-len", "64", "--output-len", "16",
            "--model-dir", str(tmp_path / "m"), "--time-budget", "300", "--radix", "off-equal-memory", "--gpus", "0"]
    assert bs.main(["--out", str(tmp_path / "out"), *argv, "--skip-nospec"]) == 0
    assert [x[0] for x in seen["launch"]] == ["stock_spec", "replay_spec"]
    assert seen["bench"] == ["stock_spec-c4", "replay_spec-c4"]
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert res["meta"]["warnings"] == ["stock without spec not started (--skip-nospec)"]
    seen["bench"].clear()
    assert bs.main(["--out", str(tmp_path / "o1"), *argv, "--skip-nospec", "--replay-first"]) == 0
    assert seen["bench"] == ["replay_spec-c4", "stock_spec-c4"]
    seen["launch"].clear()
    monkeypatch.setattr(bs, "_gpu_free_bytes", lambda gpu: 50 * GIB)
    assert bs.main(["--out", str(tmp_path / "o2"), *argv]) == 1 and seen["launch"] == []
    (w,) = json.loads((tmp_path / "o2" / "results.json").read_text())["meta"]["warnings"]
    assert w.startswith("aborted: RuntimeError: one GPU: the servers need") and "--skip-nospec" in w
