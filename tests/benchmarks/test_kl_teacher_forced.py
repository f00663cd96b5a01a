"""CPU tests of ``benchmarks/kl_teacher_forced.py`` (teacher-forced per-token KL, run on the H200 by the lead).

Fast: argument checks, the server flags against SGLang 0.5.17's own parser, the float64 KL, the
statistics, and the logit processor on fake requests (reference then compare: rows forced, step
index, files, error file), plus its ``to_str`` / ``from_str`` round trip as SGLang does it.

End to end (``e2e``, ~2 min on 2 cores): the CLI in-process with ``--device cpu`` on the tiny
Nemotron-H, 40 tokens (more than two ring cycles at window 16), all five configurations (on a CPU
"stock" is ReplaySSM at window 1).  Measured (2026-11-29, commit d9c2215 + this script), KL per
token in nats, mean / max: replay_fp32 3.4e-13 / 1.2e-12 (fp32 rounding of a different summation
order); replay_bf16_read 2.2e-8 / 1.3e-7; replay_bf16_state 2.2e-8 / 1.5e-7; stock_bf16_state
3.5e-7 / 1.7e-6.  Hence the bound on replay_fp32, ``FP32_MAX_KL = 1e-9``: ~800x above what it
measures, ~100x below what one bf16 rounding of the state gives.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from benchmarks import _kl_processor as klp
from benchmarks import kl_teacher_forced as kt

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "models"))

import make_model  # noqa: E402

TOKENS = 40  # > 2 ring cycles at window 16
FP32_MAX_KL = 1e-9
BF16_STATE = ("stock_bf16_state", "replay_bf16_state")


# ----------------------------------------------------------------------------- arguments and flags


def test_defaults():
    a = kt.parse_args(["--commit", "abc"])
    assert (a.family, a.model, a.tokens, a.device, a.window) == ("mamba2", "nemotron_h_nano4b", 4096, "cuda", 16)
    assert a.configs == list(kt.DEFAULT_CONFIGS) and a.conv_dtype == "bfloat16"
    assert a.max_total_tokens >= a.prompt_len + a.tokens and a.commit == "abc"
    assert kt.parse_args(["--family", "gdn"]).model == "qwen3_5_4b"
    assert kt.parse_args(["--device", "cpu", "--tokens", "40"]).model == "nemotron_h_tiny"


@pytest.mark.parametrize(("argv", "message"), [
    (["--configs", "replay_fp32,nope"], "--configs"),
    (["--configs", "reference"], "--configs"),
    (["--tokens", "0"], "--tokens"),
    (["--prompt-len", "0"], "--prompt-len"),
    (["--prompt-len", "5000"], "--prompt-len"),
    (["--window", "0"], "--window"),
    (["--mem-fraction-static", "1.5"], "--mem-fraction-static"),
    (["--max-total-tokens", "100"], "--max-total-tokens"),
    (["--model", "no_such_model"], "--model"),
    (["--device", "cpu"], "context length 4096"),  # 64 + 4096 tokens on the tiny model
    (["--family", "rwkv"], "--family"),
])
def test_bad_arguments_exit_with_the_flag_named(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        kt.parse_args(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_server_flags_parse_with_sglang():
    from sglang.srt.server_args import ServerArgs

    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
    ns = p.parse_args(["--model-path", "/m", *kt.server_base_flags(kt.parse_args(["--commit", "x"]))])
    assert ns.enable_custom_logit_processor and ns.disable_overlap_schedule and ns.disable_radix_cache
    assert ns.max_running_requests == 2 and ns.max_mamba_cache_size == 8 and ns.dtype == "bfloat16"
    cpu = kt.server_base_flags(kt.parse_args(["--device", "cpu", "--tokens", "40"]))
    ns = p.parse_args(["--model-path", "/m", *cpu])
    assert ns.enable_custom_logit_processor and ns.disable_overlap_schedule and ns.device == "cpu"
    assert cpu.count("--disable-overlap-schedule") == 1


def test_config_args():
    assert kt.config_args("reference", 16) == ["--ssm-backend", "default", "--mamba-ssm-dtype", "float32"]
    assert kt.config_args("reference", 16, "cpu") == ["--ssm-backend", "replay", "--replayssm-window", "1",
                                                     "--mamba-ssm-dtype", "float32"]
    assert kt.config_args("replay_bf16_read", 8) == ["--ssm-backend", "replay", "--replayssm-window", "8",
                                                     "--mamba-ssm-dtype", "float32", "--replayssm-read-dtype", "bf16"]
    assert kt.config_args("stock_bf16_state", 16)[-1] == "bfloat16"
    with pytest.raises(ValueError, match="config"):
        kt.config_args("nope", 16)


# ----------------------------------------------------------------------------- KL and statistics


def test_kl_row_matches_torch_in_float64():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(1000, generator=g) * 3
    run = ref + 1e-2 * torch.randn(1000, generator=g)
    want = torch.nn.functional.kl_div(torch.log_softmax(run.double(), -1), torch.log_softmax(ref.double(), -1),
                                      log_target=True, reduction="sum").item()
    got = klp.kl_row(ref.numpy(), run.numpy())
    assert got == pytest.approx(want, rel=1e-9) and got > 0
    assert klp.kl_row(ref.numpy(), ref.numpy()) == 0.0
    gone = run.numpy().copy()
    gone[3] = -np.inf  # the run rules out a token the reference allows
    assert klp.kl_row(ref.numpy(), gone) == math.inf
    masked = ref.numpy().copy()
    masked[5] = -np.inf  # a token the reference rules out contributes nothing
    assert math.isfinite(klp.kl_row(masked, run.numpy()))


def test_kl_stats():
    kl = np.arange(1, 1025, dtype=np.float64)
    s = kt.kl_stats(kl, segment=512)
    assert s["tokens"] == 1024 and s["written"] == 1024 and s["nonfinite"] == 0
    assert s["mean"] == pytest.approx(512.5) and s["max"] == 1024.0 and s["median"] == pytest.approx(512.5)
    assert s["first_mean"] == pytest.approx(256.5) and s["last_mean"] == pytest.approx(768.5)
    kl[3] = np.nan
    s = kt.kl_stats(kl[:10], segment=512)
    assert s["segment"] == 10 and s["written"] == 9 and s["nonfinite"] == 1
    assert kt.kl_stats(np.full(4, np.nan))["mean"] is None


def test_build_table_rows():
    stats = kt.kl_stats(np.array([1e-3, 2e-3]))
    table = kt.build_table(
        {"replay_fp32": {"stats": stats, "top1_agree": 1.0, "forced_ok": True},
         "stock_bf16_state": {"error": "server did not start: boom"}},
        {"model": "m", "tokens": 2, "config_flags": {"reference": ["--ssm-backend", "default"]}})
    assert "| replay_fp32 |" in table and "0.0015" in table and "| yes |" in table
    assert "server did not start: boom" in table and "- reference: `--ssm-backend default`" in table


# ----------------------------------------------------------------------------- the logit processor


def _params(mode: str, run_dir: Path, ref_dir: Path | None, n: int, vocab: int, step: int) -> dict:
    p = {"kl_mode": mode, "kl_dir": str(run_dir), "kl_tokens": n, "kl_vocab": vocab,
         "__req__": SimpleNamespace(output_ids=[0] * step)}
    if ref_dir is not None:
        p["kl_ref_dir"] = str(ref_dir)
    return p


def test_processor_reference_then_compare(tmp_path: Path):
    n, vocab = 3, 11
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    klp.create_run_files("reference", ref_dir, n, vocab)
    klp.create_run_files("compare", run_dir, n, vocab)
    proc = klp.TeacherForcedKL()
    g = torch.Generator().manual_seed(1)
    ref_rows = [torch.randn(vocab, generator=g) * 2 for _ in range(n)]
    run_rows = [r + 1e-3 * torch.randn(vocab, generator=g) for r in ref_rows]
    run_rows[1][int(ref_rows[1].argmax())] -= 100.0  # the run's own argmax differs at step 1
    for t in range(n):
        # a row of another request without kl_mode (None params) is left as it is
        logits = torch.stack([ref_rows[t].clone(), torch.zeros(vocab)])
        out = proc(logits, [_params("reference", ref_dir, None, n, vocab, t), None])
        forced = int(ref_rows[t].argmax())
        assert int(out[0].argmax()) == forced and torch.isinf(out[0]).sum() == vocab - 1
        assert torch.equal(out[1], torch.zeros(vocab))
    ref = klp.open_run_files("reference", ref_dir, n, vocab, writable=False)
    assert list(ref.tokens) == [int(r.argmax()) for r in ref_rows] and list(ref.hits) == [1] * n
    np.testing.assert_array_equal(ref.logits, torch.stack(ref_rows).numpy())
    for t in range(n):
        out = proc(run_rows[t].clone()[None], [_params("compare", run_dir, ref_dir, n, vocab, t)])
        assert int(out[0].argmax()) == int(ref.tokens[t])  # forced to the reference's token
    run = klp.open_run_files("compare", run_dir, n, vocab, ref_dir, writable=False)
    want = [klp.kl_row(ref_rows[t].numpy(), run_rows[t].numpy()) for t in range(n)]
    np.testing.assert_allclose(run.kl, want, rtol=0, atol=0)
    assert all(k > 0 for k in run.kl) and list(run.hits) == [1] * n
    assert [int(a) == int(b) for a, b in zip(run.argmax, ref.tokens)] == [True, False, True]
    assert klp.read_error(run_dir) is None


def test_processor_records_errors_and_leaves_the_row(tmp_path: Path):
    n, vocab = 2, 5
    klp.create_run_files("reference", tmp_path / "ref", n, vocab)
    logits = torch.arange(vocab, dtype=torch.float32)[None]
    out = klp.TeacherForcedKL()(logits.clone(), [_params("reference", tmp_path / "ref", None, n, vocab, step=n)])
    assert torch.equal(out, logits)
    err = klp.read_error(tmp_path / "ref")
    assert "IndexError" in err and "step 2 >= --tokens 2" in err
    klp.create_run_files("compare", tmp_path / "run", n, vocab)  # the reference never ran: no tokens
    klp.TeacherForcedKL()(logits.clone(), [_params("compare", tmp_path / "run", tmp_path / "ref", n, vocab, 0)])
    assert "the reference has no token at step 0" in klp.read_error(tmp_path / "run")


def test_processor_round_trips_as_sglang_sends_it():
    from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

    s = klp.TeacherForcedKL.to_str()
    assert json.loads(s)["callable"] and isinstance(CustomLogitProcessor.from_str(s), klp.TeacherForcedKL)
    # pickled by reference: the server imports benchmarks._kl_processor (the CLI puts the root on PYTHONPATH)
    assert b"benchmarks._kl_processor" in bytes.fromhex(json.loads(s)["callable"])


# ----------------------------------------------------------------------------- end to end on CPU


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory) -> tuple[int, dict, Path]:
    model = make_model.materialize("nemotron_h_tiny", tmp_path_factory.mktemp("models") / "nemotron_h_tiny")
    out = tmp_path_factory.mktemp("kl_out")
    rc = kt.main(["--device", "cpu", "--tokens", str(TOKENS), "--model-dir", str(model), "--out", str(out),
                  "--commit", "test", "--time-budget", "420",
                  "--configs", ",".join(kt.DEFAULT_CONFIGS)])
    return rc, json.loads((out / "results.json").read_text()), out


def _started(results: dict, name: str) -> dict:
    r = results[name]
    if r.get("error", "").startswith("server did not start"):
        pytest.skip(f"{name} does not run on this CPU: {r['error']}")
    return r


@pytest.mark.e2e
def test_cpu_end_to_end_files_and_forcing(cpu_run):
    rc, res, out = cpu_run
    for name in ("results.json", "results.md", *(f"server_{n}.log" for n in (kt.REFERENCE, *kt.DEFAULT_CONFIGS))):
        assert (out / name).exists(), name
    try:
        import matplotlib  # noqa: F401

        assert (out / "kl_vs_token.png").stat().st_size > 0
    except ImportError:
        pass
    results = res["results"]
    ref = results[kt.REFERENCE]
    assert "error" not in ref, ref
    assert ref["forced_ok"] and ref["steps_seen_once"] and len(ref["tokens"]) == TOKENS
    failed = [n for n in kt.DEFAULT_CONFIGS if "error" in results[n]]
    assert rc == (1 if failed else 0)
    assert all(results[n]["error"].startswith("server did not start") for n in failed), failed
    print("\n" + (out / "results.md").read_text())


@pytest.mark.e2e
@pytest.mark.parametrize("name", kt.DEFAULT_CONFIGS)
def test_cpu_config_forced_and_kl(cpu_run, name):
    _, res, _ = cpu_run
    r = _started(res["results"], name)
    assert "error" not in r, r.get("error")
    # the returned tokens are the forced ones, every step seen once: the step index is right
    assert r["forced_ok"] and r["steps_seen_once"] and r["output_tokens"] == TOKENS
    s = r["stats"]
    assert s["written"] == TOKENS and s["nonfinite"] == 0
    assert r["kl"][0] == 0.0  # the prefill step reads no decode state: identical logits
    if name == "replay_fp32":
        assert s["max"] < FP32_MAX_KL, s


@pytest.mark.e2e
@pytest.mark.parametrize("name", BF16_STATE)
def test_cpu_bf16_state_kl_exceeds_fp32(cpu_run, name):
    _, res, _ = cpu_run
    fp32 = _started(res["results"], "replay_fp32")["stats"]
    bf16 = _started(res["results"], name)["stats"]
    assert bf16["mean"] > 100 * max(fp32["mean"], 1e-15) and bf16["mean"] > FP32_MAX_KL, (bf16, fp32)
