"""``benchmarks/step_profile.py``: kernel classes, the trace summary (busy / idle, overlap), the report, the
``/start_profile`` request and the trace wait; ``bench_spec_serving --profile-steps`` with fake servers."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest

from benchmarks import bench_spec_serving as bs
from benchmarks import step_profile as sp


@pytest.mark.parametrize("name,cls", [
    ("gdn_verify_window_kernel", "ssm replay (ours)"),
    ("gdn_verify_fold_kernel", "ssm replay (ours)"),
    ("_mamba2_replay_verify_fwd_kernel", "ssm replay (ours)"),
    ("mamba2_replay_verify_fma_kernel", "ssm replay (ours)"),
    ("_verify_commit_kernel", "ssm replay (ours)"),
    ("_verify_cursor_step_kernel", "ssm replay (ours)"),
    ("fused_sigmoid_gating_delta_rule_update_kernel", "ssm sglang"),
    ("_selective_scan_update_kernel", "ssm sglang"),
    ("_causal_conv1d_update_kernel", "ssm conv1d"),
    ("fused_gdn_gating_kernel", "ssm sglang"),
    ("void flashinfer::BatchPrefillWithPagedKVCacheKernel<KTraits, Params>(Params)", "attention"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(...)", "norm"),
    ("_layer_norm_fwd_1pass_kernel", "norm"),
    ("void flashinfer::activation::act_and_mul_kernel<...>", "activation / gate"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>", "sampling / logits"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>>", "copy / elementwise"),
    ("some_unknown_kernel", "other"),
])
def test_classify(name: str, cls: str):
    assert sp.classify(name) == cls


def test_short_name():
    assert sp.short_name("void flashinfer::norm::RMSNormKernel<8u, float>(float*, int)") == "flashinfer::norm::RMSNormKernel"
    assert sp.short_name("gdn_verify_window_kernel") == "gdn_verify_window_kernel"
    assert len(sp.short_name("k" * 100, width=20)) == 20


def _kernel(name: str, ts: float, dur: float, cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


EVENTS = [
    _kernel("nvjet_gemm_a", 0.0, 40.0),
    _kernel("gdn_verify_window_kernel", 40.0, 20.0),
    _kernel("nvjet_gemm_a", 50.0, 20.0),  # overlaps the verify (another stream): busy counts it once
    _kernel("Memcpy DtoD", 100.0, 10.0, cat="gpu_memcpy"),
    _kernel("cudaGraphLaunch", 0.0, 3.0, cat="cuda_runtime"),
    _kernel("cudaGraphLaunch", 90.0, 3.0, cat="cuda_runtime"),
    {"ph": "i", "cat": "kernel", "name": "instant", "ts": 5.0},  # not a complete event
]


def test_summarize():
    s = sp.summarize(EVENTS)
    assert s["span_us"] == 110.0
    assert s["busy_us"] == 80.0  # [0, 70] and [100, 110]
    assert s["idle_pct"] == pytest.approx(100 * 30 / 110)
    assert s["kernel_us"] == 90.0
    assert s["graph_launches"] == 2
    assert s["classes"] == {"gemm": 60.0, "ssm replay (ours)": 20.0, "memcpy / memset": 10.0}
    assert [(k["name"], k["count"], k["us"]) for k in s["kernels"]] == [
        ("nvjet_gemm_a", 2, 60.0), ("gdn_verify_window_kernel", 1, 20.0), ("memcpy", 1, 10.0)]


def test_summarize_empty():
    s = sp.summarize([_kernel("cudaGraphLaunch", 0.0, 1.0, cat="cuda_runtime")])
    assert s["kernel_us"] == 0.0 and s["idle_pct"] is None and s["graph_launches"] == 1 and s["kernels"] == []


def test_load_events_gz_and_plain(tmp_path: Path):
    gz = tmp_path / "a.trace.json.gz"
    with gzip.open(gz, "wt") as fh:
        json.dump({"traceEvents": EVENTS}, fh)
    plain = tmp_path / "b.json"
    plain.write_text(json.dumps(EVENTS))
    assert sp.load_events(gz) == EVENTS
    assert sp.load_events(plain) == EVENTS


def test_report_lines():
    a = sp.summarize(EVENTS)
    b = sp.summarize(EVENTS[:1] + EVENTS[3:])
    lines = sp.report_lines({"stock_spec": b, "replay_spec": a})
    text = "\n".join(lines)
    assert lines[0] == "| GPU ms (share of GPU time) | stock_spec | replay_spec |"
    assert "| gemm | 0.0 (80%) | 0.1 (67%) |" in text
    assert "| ssm replay (ours) | — | 0.0 (22%) |" in text
    assert "| GPU idle % of span | 54.5 | 27.3 |" in text
    assert "| CUDA graph launches | 2 | 2 |" in text
    assert "replay_spec: largest kernels" in text
    assert "| `nvjet_gemm_a` | gemm | 0.06 | 2 | 66.7% |" in text
    assert sp.report_lines({}) == [] and sp.report_lines({"x": {}}) == []


def test_start_profile_request(monkeypatch, tmp_path: Path):
    sent = {}

    class Resp:
        status_code = 200
        text = "Start profiling.\n"

    def post(url, json, timeout):
        sent.update(url=url, json=json)
        return Resp()

    monkeypatch.setattr(sp.requests, "post", post)
    sp.start_profile("http://h:1", tmp_path, "replay_spec-c4", 7)
    assert sent == {"url": "http://h:1/start_profile", "json": {
        "output_dir": str(tmp_path), "num_steps": 7, "activities": ["CPU", "GPU"], "profile_id": "replay_spec-c4"}}
    Resp.status_code = 400
    with pytest.raises(RuntimeError, match="400"):
        sp.start_profile("http://h:1", tmp_path, "x", 1)


def test_profile_request_matches_sglangs_profile_req():
    """The request body's keys are fields of SGLang 0.5.17's ``ProfileReq`` and the trace name its own."""
    from sglang.srt.managers.io_struct import ProfileReq

    req = ProfileReq(output_dir="/o", num_steps=3, activities=["CPU", "GPU"], profile_id="p")
    assert (req.output_dir, req.num_steps, req.profile_id) == ("/o", 3, "p")
    import inspect

    from sglang.srt.managers.scheduler_components import profiler_manager

    src = inspect.getsource(profiler_manager)
    assert 'filename_parts = [self.profile_id, f"TP-{self.ps.tp_rank}"]' in src
    assert '+ ".trace.json.gz"' in src
    assert sp.trace_path("/o", "p") == Path("/o/p-TP-0.trace.json.gz")


def test_wait_trace(tmp_path: Path):
    p = tmp_path / "t.json.gz"
    assert sp.wait_trace(p, timeout=0.2, poll=0.05) is None
    p.write_bytes(b"x")
    assert sp.wait_trace(p, timeout=2.0, poll=0.05) == p


# ----------------------------------------------------------------------------- bench_spec_serving --profile-steps


def test_profile_arguments():
    a = bs.parse_args(["--commit", "x"])
    assert (a.profile_steps, a.profile_delay) == (0, 20.0)
    for bad in (["--profile-steps", "-1"], ["--profile-delay", "-2"]):
        with pytest.raises(SystemExit):
            bs.parse_args(["--commit", "x", *bad])


def _profiled_world(monkeypatch, tmp_path: Path) -> dict:
    from test_bench_spec_serving import _fake_world

    seen = _fake_world(monkeypatch, tmp_path)
    seen["profiles"] = []
    inner = bs.run_bench_serving

    def start_profile(url, output_dir, profile_id, num_steps, timeout=30.0):
        seen["profiles"].append((profile_id, num_steps))
        path = sp.trace_path(output_dir, profile_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as fh:
            json.dump({"traceEvents": EVENTS}, fh)

    def run(cmd, ofile, **k):  # a run that lasts until its profile has started (the delay is 0)
        tag = dict(zip(cmd, cmd[1:]))["--tag"]
        end = time.monotonic() + 5.0
        while tag.startswith(bs.SPEC_VARIANTS) and time.monotonic() < end and not any(
                p.rsplit("-", 1)[0] == tag for p, _ in seen["profiles"]):
            time.sleep(0.01)
        return inner(cmd, ofile, **k)

    monkeypatch.setattr(sp, "start_profile", start_profile)
    monkeypatch.setattr(bs, "run_bench_serving", run)
    return seen


def test_main_profiles_the_spec_runs(monkeypatch, tmp_path: Path):
    seen = _profiled_world(monkeypatch, tmp_path)
    out = tmp_path / "out"
    rc = bs.main(["--out", str(out), "--commit", "abc", "--concurrency", "4", "--num-prompts", "8",
                  "--input-len", "64", "--output-len", "16", "--model-dir", str(tmp_path / "m"),
                  "--time-budget", "300", "--profile-steps", "5", "--profile-delay", "0"])
    assert rc == 0
    # not stock without spec; ids unique per run
    assert sorted(p.rsplit("-", 1)[0] for p, _ in seen["profiles"]) == ["replay_spec-c4", "stock_spec-c4"]
    assert len({p for p, _ in seen["profiles"]}) == 2 and all(n == 5 for _, n in seen["profiles"])
    res = json.loads((out / "results.json").read_text())
    prof = res["runs"]["4"]["replay_spec"]["step_profile"]
    assert prof["summary"]["classes"]["ssm replay (ours)"] == 20.0 and prof["trace"].endswith("-TP-0.trace.json.gz")
    assert "step_profile" not in res["runs"]["4"]["stock_nospec"]
    report = (out / "results.md").read_text()
    assert "#### GPU time over 5 profiled forwards, c=4" in report
    assert "| GPU ms (share of GPU time) | stock_spec | replay_spec |" in report
    assert any(w.startswith("--profile-steps 5: the spec runs were profiled") for w in res["meta"]["warnings"])


def test_main_survives_a_bad_or_missing_trace(monkeypatch, tmp_path: Path):
    """A cut trace and a trace that never comes are reported per run; the runs' results stay, and the
    server whose trace did not come is told to stop profiling."""
    seen = _profiled_world(monkeypatch, tmp_path)

    def start_profile(url, output_dir, profile_id, num_steps, timeout=30.0):
        seen["profiles"].append((profile_id, num_steps))
        if profile_id.startswith("replay_spec"):  # cut: not gzip
            path = sp.trace_path(output_dir, profile_id)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"\x1f\x8b cut")

    stops = []
    monkeypatch.setattr(sp, "start_profile", start_profile)
    monkeypatch.setattr(sp, "wait_trace", lambda path, timeout, poll=1.0: path if path.exists() else None)
    monkeypatch.setattr(sp, "stop_profile", lambda url, timeout=60.0: stops.append(url))
    out = tmp_path / "out"
    rc = bs.main(["--out", str(out), "--commit", "abc", "--concurrency", "4", "--num-prompts", "8",
                  "--input-len", "64", "--output-len", "16", "--model-dir", str(tmp_path / "m"),
                  "--time-budget", "300", "--profile-steps", "5", "--profile-delay", "0", "--skip-nospec"])
    assert rc == 0
    runs = json.loads((out / "results.json").read_text())["runs"]["4"]
    assert runs["replay_spec"]["step_profile"]["error"].startswith("trace not readable")
    assert runs["stock_spec"]["step_profile"]["error"].startswith("no trace within 60 s")
    assert len(stops) == 1
    assert runs["replay_spec"]["output_throughput"] == 720.0 and runs["stock_spec"]["output_throughput"] == 400.0


def test_main_reports_a_profile_not_taken(monkeypatch, tmp_path: Path):
    """Runs shorter than --profile-delay: no request is sent and the report says why."""
    from test_bench_spec_serving import _fake_world

    _fake_world(monkeypatch, tmp_path)
    monkeypatch.setattr(sp, "start_profile", lambda *a, **k: pytest.fail("no profile expected"))
    out = tmp_path / "out"
    rc = bs.main(["--out", str(out), "--commit", "abc", "--concurrency", "4", "--num-prompts", "8",
                  "--input-len", "64", "--output-len", "16", "--model-dir", str(tmp_path / "m"),
                  "--time-budget", "300", "--profile-steps", "5", "--profile-delay", "100", "--skip-nospec"])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["runs"]["4"]["replay_spec"]["step_profile"] == {"error": "the run ended before --profile-delay 100 s"}
    assert "Profile not taken: replay_spec: the run ended before --profile-delay 100 s" in (out / "results.md").read_text()
