"""CPU tests of ``benchmarks/ttft_probe.py`` (the c = 1 cached-prefix TTFT probe the lead runs on the H200).

A real run needs two servers (``--device cpu``: ~5 min on two cores, too slow for CI; run by hand on
2026-11-30, see ``benchmarks/notes/radix_ttft.md``), so these test the parts separately:

- arguments: the GPU server flags are the measured run's (``notes/radix_ttft.md``) plus ``--enable-metrics``
  and parse with SGLang 0.5.17's own parser; the bench_serving command (``--output-details``) parses with
  0.5.17's bench_serving CLI;
- ``/metrics`` parsing and the before/after split on text in 0.5.17's format (lines recorded from a CPU
  server, model path shortened);
- the per-request TTFT comparison and the system prompt of a gsp group;
- the trace summary on a small synthetic chrome trace in the torch profiler's format (user annotations,
  CUDA runtime / driver launches, kernels tied by ``correlation``, a graph launch, host syncs), a CPU-only
  trace and a trace without a prefill; the trace cut;
- the report, and ``main()`` end to end with fake servers, a fake bench_serving and a fake profiler.
"""

from __future__ import annotations

import argparse
import gzip
import json
import pickle
import sys
from pathlib import Path

import pytest

from benchmarks import bench_serving_ab as ab
from benchmarks import ttft_probe as tp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "models"))

import make_model  # noqa: E402

#: the flags of the measured shared-prefix run, as notes/radix_ttft.md lists them for a hand-started pair
NOTE_FLAGS = ("--dtype bfloat16 --attention-backend flashinfer --load-format safetensors --mem-fraction-static 0.7 "
              "--max-running-requests 64 --cuda-graph-max-bs-decode 64 --max-total-tokens 202752 "
              "--max-mamba-cache-size 352 --random-seed 0 --enable-metrics").split()


# ----------------------------------------------------------------------------- arguments


def _pairs(flags: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for i, f in enumerate(flags):
        if f.startswith("--"):
            nxt = flags[i + 1] if i + 1 < len(flags) else None
            out[f] = None if nxt is None or nxt.startswith("--") else nxt
    return out


def test_gpu_flags_are_the_measured_runs_plus_metrics():
    args, ab_args = tp.parse_args(["--commit", "abc"])
    flags = tp.server_flags(ab_args)
    assert _pairs(NOTE_FLAGS).items() <= _pairs(flags).items()
    assert "--disable-radix-cache" not in flags and "--mamba-radix-cache-strategy" not in flags
    assert ab_args.conv_dtype == "bfloat16" and args.model == "nemotron_h_nano4b"
    assert (args.gsp_prompts_per_group, args.gsp_system_prompt_len, args.gsp_question_len, args.gsp_output_len) == (
        16, 2048, 128, 256)
    assert args.time_budget == 560 and args.launch == "together" and tp.variant_order(args.order) == ["stock", "replay"]
    assert tp.variant_order("replay-first") == ["replay", "stock"]
    from sglang.srt.server_args import ServerArgs

    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
    ns = p.parse_args(["--model-path", "/m", *flags])
    assert ns.enable_metrics and ns.max_mamba_cache_size == 352 and ns.max_total_tokens == 202752
    cpu_args, cpu_ab = tp.parse_args(["--device", "cpu"])
    cpu_flags = tp.server_flags(cpu_ab)
    assert cpu_args.model == "nemotron_h_tiny" and cpu_args.gsp_prompts_per_group == 4
    assert "--device" in cpu_flags and cpu_flags[-1] == "--enable-metrics" and "--max-mamba-cache-size" in cpu_flags
    p.parse_args(["--model-path", "/m", *cpu_flags])


@pytest.mark.parametrize("argv", [["--window", "0"], ["--time-budget", "0"], ["--extra-requests", "-1"],
                                  ["--profile-steps", "0"], ["--order", "both"], ["--launch", "later"]])
def test_bad_arguments(argv):
    with pytest.raises(SystemExit):
        tp.parse_args(argv)


def test_bench_cmd_with_output_details_parses_with_bench_serving(monkeypatch):
    from sglang.benchmark import serving

    _, ab_args = tp.parse_args([])
    cmd = ab.bench_cmd(ab_args, "/m", 30001, 1, 16, "/o.jsonl", "stock-c1", num_groups=1) + ["--output-details"]
    seen = {}
    monkeypatch.setattr(serving, "run_benchmark", lambda ns: seen.setdefault("args", ns))
    monkeypatch.setattr(sys, "argv", ["bench_serving", *cmd[3:]])
    serving.cli_main()
    ns = seen["args"]
    assert ns.output_details and ns.cache_report and ns.max_concurrency == 1 and ns.warmup_requests == 0
    assert (ns.gsp_num_groups, ns.gsp_prompts_per_group, ns.gsp_system_prompt_len, ns.gsp_question_len,
            ns.gsp_output_len, ns.seed) == (1, 16, 2048, 128, 256, 1)


# ----------------------------------------------------------------------------- /metrics

_LBL = 'engine_type="unified",model_name="/m",moe_ep_rank="0",pp_rank="0"'
_TTFT_LBL = 'engine_type="unified",is_streaming="{s}",model_name="/m"'


def _metrics_text(ttft: dict[str, tuple[float, float]], stages: dict[str, tuple[float, float]],
                  queue: tuple[float, float]) -> str:
    """/metrics text in SGLang 0.5.17's format (lines as a CPU server printed them, model path shortened)."""
    lines = ["# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.",
             "# TYPE sglang:time_to_first_token_seconds histogram"]
    for s, (total, n) in ttft.items():
        lines += [f'sglang:time_to_first_token_seconds_bucket{{engine_type="unified",is_streaming="{s}",le="0.1",'
                  'model_name="/m"} 0.0',
                  f"sglang:time_to_first_token_seconds_sum{{{_TTFT_LBL.format(s=s)}}} {total}",
                  f"sglang:time_to_first_token_seconds_count{{{_TTFT_LBL.format(s=s)}}} {n}"]
    for stage, (total, n) in stages.items():
        lines += [f'sglang:per_stage_req_latency_seconds_sum{{{_LBL},stage="{stage}",tp_rank="0"}} {total}',
                  f'sglang:per_stage_req_latency_seconds_count{{{_LBL},stage="{stage}",tp_rank="0"}} {n}']
    lines += [f'sglang:queue_time_seconds_sum{{{_LBL},tp_rank="0"}} {queue[0]}',
              f'sglang:queue_time_seconds_count{{{_LBL},tp_rank="0"}} {queue[1]}',
              'sglang:num_running_reqs{engine_type="unified",model_name="/m",tp_rank="0"} 0.0',
              'sglang:prompt_tokens_total{model_name="/m"} 320.0']
    return "\n".join(lines) + "\n"


def test_parse_metrics_reads_sums_and_counts_per_stage():
    text = _metrics_text({"false": (0.362, 2.0), "true": (0.5, 4.0)},
                         {"request_process": (0.00036759, 3.0), "prefill_forward": (0.2644, 3.0)}, (0.0061, 3.0))
    m = tp.parse_metrics(text)
    assert m["sglang:time_to_first_token_seconds_sum"] == pytest.approx(0.862)  # both is_streaming values
    assert m["sglang:time_to_first_token_seconds_count"] == 6.0
    assert m['sglang:per_stage_req_latency_seconds_sum{stage="prefill_forward"}'] == pytest.approx(0.2644)
    assert m['sglang:per_stage_req_latency_seconds_count{stage="request_process"}'] == 3.0
    assert m["sglang:queue_time_seconds_count"] == 3.0
    assert not any("bucket" in k or "num_running" in k or "prompt_tokens" in k for k in m)
    assert len(m) == 8


def test_metrics_split_is_the_delta_over_the_run():
    before = tp.parse_metrics(_metrics_text({"false": (0.3, 2.0)}, {"request_process": (0.001, 3.0)}, (0.006, 3.0)))
    after = tp.parse_metrics(_metrics_text({"false": (0.3, 2.0), "true": (0.9, 16.0)},
                                           {"request_process": (0.0026, 19.0), "prefill_forward": (0.8, 16.0)},
                                           (0.022, 19.0)))
    split = tp.metrics_split(before, after)
    ttft = split["sglang:time_to_first_token_seconds"]
    assert ttft["count"] == 16 and ttft["mean_ms"] == pytest.approx(900 / 16)
    assert split['sglang:per_stage_req_latency_seconds{stage="prefill_forward"}']["mean_ms"] == pytest.approx(50.0)
    assert split['sglang:per_stage_req_latency_seconds{stage="request_process"}']["mean_ms"] == pytest.approx(0.1)
    assert split["sglang:queue_time_seconds"]["mean_ms"] == pytest.approx(1.0)
    assert tp.metrics_split(after, after)["sglang:queue_time_seconds"]["mean_ms"] is None


# ----------------------------------------------------------------------------- per-request TTFTs


def _bench_line(ttfts: list[float], cached: list[int], n_in: int = 2176) -> dict:
    """The keys of a bench_serving 0.5.17 ``--output-details --cache-report`` line that the probe reads."""
    n = len(ttfts)
    return {"dataset_name": "generated-shared-prefix", "completed": n, "mean_ttft_ms": 1e3 * sum(ttfts) / n,
            "median_ttft_ms": 1e3 * sorted(ttfts)[n // 2], "median_tpot_ms": 2.7, "output_throughput": 340.0,
            "cache_report": {"cache_hit_rate_pct": 100.0 * sum(cached) / (n * n_in)},
            "input_lens": [n_in] * n, "output_lens": [256] * n, "ttfts": ttfts, "itls": [[0.0027] * 255] * n,
            "generated_texts": ["w5"] * n, "errors": [""] * n, "cached_tokens": cached, "server_info": {"x": 1}}


def test_request_ttfts_and_their_comparison():
    stock = tp.request_ttfts(_bench_line([0.120, 0.050, 0.051, 0.049], [0, 2048, 2048, 2048]))
    assert stock[0] == {"i": 0, "ttft_ms": pytest.approx(120.0), "cached_tokens": 0, "prompt_tokens": 2176,
                        "error": None}
    shifted = tp.request_ttfts(_bench_line([0.121, 0.0565, 0.0575, 0.0555], [0, 2048, 2048, 2048]))
    cmp_ = tp.compare_ttfts(stock, shifted)
    s = cmp_["summary"]
    assert (s["hits"], s["misses"], s["hit_diffs_positive"]) == (3, 1, 3)
    assert s["hit_diff_median_ms"] == pytest.approx(6.5) and s["hit_diff_max_ms"] == pytest.approx(6.5)
    assert s["hit_stock_median_ms"] == pytest.approx(50.0) and s["miss_diffs_ms"] == [pytest.approx(1.0)]
    assert cmp_["per_request"][1]["cached"] == (2048, 2048) and cmp_["per_request"][0]["hit"] is False
    one_slow = tp.compare_ttfts(stock, tp.request_ttfts(_bench_line([0.12, 0.05, 0.07, 0.049], [0, 2048, 2048, 2048])))
    assert one_slow["summary"]["hit_diff_median_ms"] == pytest.approx(0.0) and one_slow["summary"][
        "hit_diff_max_ms"] == pytest.approx(19.0)
    assert tp.request_ttfts({"completed": 1}) == [] and tp.request_ttfts(None) == []


def test_system_prompt_of_a_group():
    sys_prompt = "w10 w11 w12\n\nw13 w14"  # a system prompt may hold a blank line itself
    prompts = [f"{sys_prompt}\n\nw20 w21", f"{sys_prompt}\n\nw22 w23", f"{sys_prompt}\n\nw20 w30"]
    assert tp.system_prompt_of(prompts) == sys_prompt
    assert tp.system_prompt_of(prompts[:1]) is None and tp.system_prompt_of(["a b", "c d"]) is None


# ----------------------------------------------------------------------------- the trace


def _x(cat: str, name: str, ts: float, dur: float, pid=100, tid=100, corr=None) -> dict:
    e = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": {}}
    if corr is not None:
        e["args"]["correlation"] = corr
    return e


def _kernel(name: str, ts: float, dur: float, corr: int) -> dict:
    return _x("kernel", name, ts, dur, pid=0, tid=7, corr=corr)


def synthetic_trace(with_gpu: bool = True) -> dict:
    """One cached-prefix request under the overlap scheduler, µs from 1,000,000:

    idle recv at 0; the request's recv at 100; run_batch 150-2,150 with the forward 200-2,000: two
    launches (kernels 300-1,300 and 1,400-2,400 on the GPU), an ``.item()`` (memcpy 1,500 + a 300 µs
    sync), a Triton launch (kernel 2,400-2,600); sampling launched at 2,050 (kernel 2,600-2,650);
    the first decode step 2,300-2,500 with its graph launch at 2,350 (kernels 2,700-2,900); then
    process_batch_result 2,600-3,100 with a 50 µs event sync.
    """
    b = 1_000_000.0
    ev = [
        {"name": "process_name", "ph": "M", "pid": 100, "tid": 0, "args": {"name": "python"}},
        _x("user_annotation", "scheduler.recv_requests", b, 5),
        _x("user_annotation", "scheduler.recv_requests", b + 100, 5),
        _x("user_annotation", "scheduler.process_input_requests", b + 110, 20),
        _x("user_annotation", "scheduler.get_next_batch_to_run", b + 130, 15),
        _x("user_annotation", "scheduler.run_batch", b + 150, 2000),
        _x("user_annotation", "step[EXTEND bs=1 toks=128]", b + 200, 1800),
        _x("cpu_op", "aten::copy_", b + 250, 10),
        _x("cuda_runtime", "cudaLaunchKernel", b + 260, 5, corr=1),
        _x("cuda_runtime", "cudaLaunchKernel", b + 600, 5, corr=2),
        _x("cuda_runtime", "cudaMemcpyAsync", b + 1000, 5, corr=3),
        _x("cuda_runtime", "cudaStreamSynchronize", b + 1005, 300, corr=4),
        _x("cuda_driver", "cuLaunchKernelEx", b + 1900, 5, corr=5),
        _x("cuda_runtime", "cudaLaunchKernel", b + 2050, 5, corr=6),
        _x("user_annotation", "scheduler.run_batch", b + 2250, 300),
        _x("user_annotation", "step[DECODE bs=1]", b + 2300, 200),
        _x("cuda_runtime", "cudaGraphLaunch", b + 2350, 10, corr=7),
        _x("user_annotation", "scheduler.process_batch_result", b + 2600, 500),
        _x("cuda_runtime", "cudaEventSynchronize", b + 2610, 50, corr=8),
        _x("user_annotation", "step[DECODE bs=1]", b + 3200, 100),
        _x("user_annotation", "gpu_step_projection", b + 300, 2000, pid=0, tid=7),  # not a host span
    ]
    ev[-1]["cat"] = "gpu_user_annotation"
    if with_gpu:
        ev += [
            _kernel("fused_add_rmsnorm", b + 300, 1000, 1),
            _kernel("_chunk_scan_fwd_kernel", b + 1400, 1000, 2),
            {**_x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", b + 1500, 2, pid=0, tid=7, corr=3)},
            _kernel("_replay_cursor_reset", b + 2400, 200, 5),
            _kernel("sampling_kernel", b + 2600, 50, 6),
            _kernel("graph_node_a", b + 2700, 100, 7),
            _kernel("graph_node_b", b + 2800, 100, 7),
        ]
    return {"schemaVersion": 1, "traceEvents": ev}


def test_summarize_trace_of_a_cached_prefix_request():
    s = tp.summarize_trace(synthetic_trace())
    assert s["extend_step"] == "step[EXTEND bs=1 toks=128]" and s["t0"] == "scheduler.recv_requests"
    assert (s["extend_steps_in_trace"], s["decode_steps_in_trace"], s["has_gpu_events"]) == (1, 2, True)
    expect = {
        "run_batch_start_us": 50, "run_batch_host_us": 2000, "forward_start_us": 100, "forward_host_us": 1800,
        "forward_host_end_us": 1900, "forward_launches": 4, "forward_gpu_ops": 4, "forward_syncs": 1,
        "forward_sync_us": 300, "run_batch_syncs": 1, "run_batch_sync_us": 300,
        "forward_gpu_start_us": 200, "forward_gpu_end_us": 2500, "forward_gpu_span_us": 2300,
        "forward_gpu_busy_us": 2200, "run_batch_gpu_end_us": 2550, "run_batch_gpu_busy_us": 2250,
        "gpu_end_after_host_end_us": 600, "decode_step_start_us": 2200, "decode_graph_launch_us": 2250,
        "decode_gpu_start_us": 2600, "decode_launch_after_prefill_gpu_end_us": -300,
        "gpu_idle_before_decode_us": 50, "process_result_start_us": 2500, "process_result_sync_us": 50,
        "first_token_out_us": 3000, "forward_kernel_names": 4,
    }
    assert {k: s[k] for k in expect} == pytest.approx(expect)
    assert s["forward_kernels"][0] == {"name": "fused_add_rmsnorm", "count": 1, "us": 1000.0}
    assert [k["name"] for k in s["forward_kernels"]] == ["fused_add_rmsnorm", "_chunk_scan_fwd_kernel",
                                                         "_replay_cursor_reset", "Memcpy DtoH (Device -> Pinned)"]
    assert s["forward_syncs_list"] == [{"name": "cudaStreamSynchronize", "us": 300.0, "at_us": pytest.approx(905.0)}]
    # the longest host stretch between two CUDA calls: from the sync's end to the Triton launch (1,305 -> 1,900)
    assert s["forward_host_gaps"][0] == {"us": pytest.approx(595.0), "after": "cudaStreamSynchronize",
                                         "before": "cuLaunchKernelEx"}
    assert s["window_us"] == [1_000_100.0, 1_003_100.0]


def test_summarize_trace_without_gpu_events_or_prefill():
    s = tp.summarize_trace(synthetic_trace(with_gpu=False))
    assert s["has_gpu_events"] is False and s["forward_gpu_span_us"] is None and s["forward_gpu_ops"] is None
    assert s["gpu_idle_before_decode_us"] is None and s["forward_kernels"] == []
    assert s["forward_host_us"] == 1800 and s["first_token_out_us"] == pytest.approx(3000)
    cpu_only = synthetic_trace(with_gpu=False)  # a CPU server: no CUDA calls at all
    cpu_only["traceEvents"] = [e for e in cpu_only["traceEvents"] if e.get("cat") not in tp.LAUNCH_CATS]
    c = tp.summarize_trace(cpu_only)
    assert c["forward_launches"] is None and c["forward_syncs"] is None and c["forward_host_gaps"] == []
    assert c["decode_graph_launch_us"] is None and c["first_token_out_us"] == pytest.approx(3000)
    idle = {"traceEvents": [e for e in cpu_only["traceEvents"] if not e.get("name", "").startswith("step[EXTEND")]}
    err = tp.summarize_trace(idle)
    assert "error" in err and err["annotations"]["scheduler.recv_requests"] == 2


def test_trim_trace_keeps_the_window_and_metadata():
    t = synthetic_trace()
    cut = tp.trim_trace(t, 1_000_100.0, 1_000_200.0)
    names = [e["name"] for e in cut["traceEvents"]]
    assert names[0] == "process_name" and "scheduler.recv_requests" in names and "scheduler.run_batch" in names
    assert "step[DECODE bs=1]" not in names and "graph_node_a" not in names
    assert cut["schemaVersion"] == 1 and len(cut["traceEvents"]) < len(t["traceEvents"])


# ----------------------------------------------------------------------------- report and main()


def _server(ttfts, cached, summary) -> dict:
    line = _bench_line(ttfts, cached)
    before = tp.parse_metrics(_metrics_text({"false": (0.3, 2.0)}, {}, (0.0, 0.0)))
    after = tp.parse_metrics(_metrics_text({"false": (0.3, 2.0), "true": (sum(ttfts), 4.0)},
                                           {"prefill_forward": (sum(ttfts) - 0.004, 4.0),
                                            "request_process": (0.0004, 4.0)}, (0.004, 4.0)))
    return {"bench": tp._slim_bench(line), "ttfts": tp.request_ttfts(line), "metrics_split": tp.metrics_split(
        before, after), "extra_requests": {"ttft_ms": [52.0, 53.0], "median_ttft_ms": 52.5, "cached_tokens": [2048] * 2},
        "profile": {"summary": summary, "request": {"ttft_ms": 60.0, "cached_tokens": 2048}}}


def test_build_report():
    s = tp.summarize_trace(synthetic_trace())
    r = dict(s, forward_host_us=s["forward_host_us"] + 6500.0)
    res = {"meta": {"model": "nemotron_h_nano4b", "family": "mamba2", "window": 16, "commit": "abc", "date": "d",
                    "gpu": "NVIDIA H200", "launch": "together", "order": "stock-first", "gsp_prompts_per_group": 4,
                    "gsp_system_prompt_len": 2048, "gsp_question_len": 128, "gsp_output_len": 256,
                    "server_flags": "--x", "warnings": ["w1"]},
           "servers": {"stock": _server([0.12, 0.05, 0.051, 0.049], [0, 2048, 2048, 2048], s),
                       "replay": _server([0.121, 0.0565, 0.0575, 0.0555], [0, 2048, 2048, 2048], r)}}
    res["ttft_compare"] = tp.compare_ttfts(res["servers"]["stock"]["ttfts"], res["servers"]["replay"]["ttfts"])
    md = tp.build_report(res)
    assert md.startswith("### c = 1 cached-prefix TTFT probe: nemotron_h_nano4b (mamba2)")
    assert "| hit % | 70.6 | 70.6 | |" in md and "| completed | 4 | 4 | |" in md
    assert '| `per_stage_req_latency_seconds{stage="prefill_forward"}` | 4 |' in md
    assert "| 1 | 2048/2048 | 50.00 | 56.50 | +6.50 |" in md
    assert "Hits (3): replay - stock median +6.50 ms" in md and "3/3 positive" in md
    assert "| forward host span | 1.800 | 8.300 | +6.500 |" in md
    assert "| GPU idle between prefill and decode | 0.050 | 0.050 | +0.000 |" in md
    assert "| launches in the forward (count) | 4 | 4 | +0 |" in md
    assert "| `fused_add_rmsnorm` | 1 | 1000.0 | 1 | 1000.0 |" in md
    assert "stock 52.50 ms, replay 52.50 ms" in md and md.rstrip().endswith("WARNING: w1")
    assert tp.build_report({"meta": {"warnings": []}, "servers": {}}).count("|") > 0  # nothing measured: no crash


def test_main_with_fake_servers(monkeypatch, tmp_path: Path):
    """``main()`` on the CPU preset with fake servers, bench_serving and profiler: the order, the bench command,
    the prompt of the profiled request (the run's system prompt + a fresh question), the outputs."""
    from sglang.benchmark.datasets.common import DatasetRow

    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    model = tmp_path / "model"
    model.mkdir()
    make_model.build_tokenizer(300, model)
    monkeypatch.setattr(ab.signal, "signal", lambda *a: None)
    monkeypatch.setattr(ab, "_generate_model", lambda *a, **k: 0.0)
    monkeypatch.setattr(ab, "_wait_ready", lambda procs, *a, **k: {v: 1.0 for v in procs})
    stopped = []
    monkeypatch.setattr(ab, "_stop_all", lambda procs: stopped.append(sorted(procs)))
    monkeypatch.setattr(ab, "_warmup", lambda *a, **k: None)
    prefix_warmups = []
    monkeypatch.setattr(ab, "_warmup_prefix_hit", lambda urls, *a, **k: prefix_warmups.append(sorted(urls)))
    monkeypatch.setattr(ab, "_flush_cache", lambda url, timeout: None)
    logs: dict[int, Path] = {}
    variant_of: dict[int, str] = {}

    class FakeProc:
        pid = 4242

    def launch(model_dir, vargs, log, *, port, env, base_flags):
        assert base_flags[-1] == "--enable-metrics" and Path(model_dir) == model
        logs[port] = log
        variant_of[port] = "replay" if vargs[-1] == "16" else "stock"
        log.write_text("server_args=ServerArgs(mamba_radix_cache_strategy='no_buffer')\n"
                       + (ab.REPLAY_LOG_MARK + "\n" if vargs[-1] == "16" else ""))
        return FakeProc()

    monkeypatch.setattr(ab.srv, "launch", launch)
    scrapes: dict[str, int] = {}

    def scrape(url):
        v = variant_of[int(url.rsplit(":", 1)[1])]
        scrapes[v] = scrapes.get(v, 0) + 1
        n = 4.0 * (scrapes[v] - 1)
        return _metrics_text({"true": (0.05 * n + (0.0065 * n if v == "replay" else 0.0), n)},
                             {"prefill_forward": (0.045 * n, n)}, (0.001 * n, n))

    monkeypatch.setattr(tp, "_scrape", scrape)
    system = "w10 w11 w12 w13"
    benches = []

    def fake_run(cmd, ofile, **k):
        kv = dict(zip(cmd, cmd[1:]))
        benches.append(kv["--tag"])
        assert "--output-details" in cmd and kv["--max-concurrency"] == "1" and kv["--gsp-num-groups"] == "1"
        home = Path(k["env"]["HOME"])
        folder = home / ".cache" / "sglang" / "benchmark"
        folder.mkdir(parents=True, exist_ok=True)
        rows = [DatasetRow(prompt=f"{system}\n\nw{20 + i} w30", prompt_len=6, output_len=16) for i in range(4)]
        with open(folder / "gen_shared_prefix_1_1_4_64_16_16_PreTrainedTokenizerFast.pkl", "wb") as fh:
            pickle.dump(rows, fh)
        extra = 0.0065 if kv["--tag"].startswith("replay") else 0.0
        line = _bench_line([0.1 + extra, 0.05 + extra, 0.05 + extra, 0.05 + extra], [0, 64, 64, 64], n_in=80)
        Path(ofile).write_text(json.dumps(line) + "\n")
        return ab.BenchRun(rc=0, text="bench\n", result=line, source="output file")

    monkeypatch.setattr(ab, "run_bench_serving", fake_run)
    posts = []

    def post(url, path, body, timeout):
        port = int(url.rsplit(":", 1)[1])
        posts.append((variant_of[port], path, body))
        if path == "/start_profile":
            assert body["activities"] == ["CPU"] and body["with_stack"] is False and body["num_steps"] == 4
            folder = Path(body["output_dir"])
            with gzip.open(folder / "1.5-TP-0.trace.json.gz", "wt") as fh:
                json.dump(synthetic_trace(), fh)
            with open(logs[port], "a") as fh:
                fh.write(f"[t] {tp.PROFILED_LOG_MARK}. Traces are saved to: {folder}\n")
        return None

    monkeypatch.setattr(tp, "_post", post)
    texts = []

    def stream(url, text, new_tokens, timeout):
        texts.append((variant_of[int(url.rsplit(":", 1)[1])], text))
        return {"ttft_ms": 50.0, "e2e_ms": 90.0, "cached_tokens": 64, "prompt_tokens": 80, "completion_tokens": 8}

    monkeypatch.setattr(tp, "_stream_generate", stream)
    out = tmp_path / "out"
    rc = tp.main(["--device", "cpu", "--model-dir", str(model), "--out", str(out), "--commit", "abc",
                  "--order", "replay-first", "--time-budget", "300", "--extra-requests", "2"])
    assert rc == 0
    assert benches == ["replay-c1", "stock-c1"] and scrapes == {"replay": 2, "stock": 2}
    assert [p[:2] for p in posts] == [("replay", "/start_profile"), ("stock", "/start_profile")]
    assert len(texts) == 6 and all(t.startswith(system + "\n\n") for _, t in texts)
    questions = [t.split("\n\n")[1] for _, t in texts]
    assert len(set(questions)) == 3 and all(len(q.split()) == 16 for q in questions)  # fresh, question-long
    assert stopped == [["replay", "stock"]]
    assert prefix_warmups == [["replay"], ["stock"]]  # each server, in the measured order
    res = json.loads((out / "results.json").read_text())
    rep = res["servers"]["replay"]
    assert rep["metrics_split"]["sglang:time_to_first_token_seconds"]["mean_ms"] == pytest.approx(56.5)
    assert rep["profile"]["summary"]["forward_host_us"] == 1800 and "itls" not in rep["bench"]
    assert rep["profile"]["prompt"]["source"].startswith("the run's system prompt")
    assert res["ttft_compare"]["summary"]["hit_diff_median_ms"] == pytest.approx(6.5)
    assert res["meta"]["order"] == "replay-first" and res["meta"]["server_flags"].endswith("--enable-metrics")
    md = (out / "results.md").read_text()
    assert "Hits (3): replay - stock median +6.50 ms" in md
    assert sorted(p.name for p in out.iterdir()) == ["bench_stdout.log", "results.json", "results.md",
                                                     "server_replay.log", "server_stock.log",
                                                     "trace_replay.json.gz", "trace_stock.json.gz"]
    with gzip.open(out / "trace_stock.json.gz", "rt") as fh:
        assert tp.summarize_trace(json.load(fh))["forward_host_us"] == 1800
