"""CPU tests of the decode benchmark CLI: arguments, results arithmetic, table / JSON / PNG writing
(fake timings), and smoke runs through the torch references and the Triton interpreter.

The smoke runs start the CLI in a subprocess: Triton reads ``TRITON_INTERPRET`` when a kernel is
defined, so it must be set before any kernel module is imported.
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import bench_decode as bd
from benchmarks import bytes_model as bm
from benchmarks.shapes import GDN_TINY, MAMBA2_TINY, NANO_4B, QWEN35_4B

ROOT = Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=None)
def _importable(*names: str) -> bool:
    """True when ``replayssm_kernels`` provides every name (the kernels may still be in progress).

    Probed in a subprocess: importing the kernels here would decorate their Triton functions
    before ``tests/kernels/conftest.py`` turns the interpreter on for the kernel tests.
    """
    code = "import importlib, sys\n"
    code += "m = importlib.import_module('replayssm_kernels')\n"
    code += "ok = True\n"
    for n in names:
        fam = "mamba2" if n.startswith("mamba2") else "gdn"
        code += (
            f"f = getattr(m, {n!r}, None)\n"
            f"if f is None:\n"
            f"    f = getattr(importlib.import_module('replayssm_kernels.{fam}_decode'), {n!r}, None)\n"
            f"ok = ok and f is not None\n"
        )
    code += "sys.exit(0 if ok else 1)\n"
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       timeout=300, check=False)
    return r.returncode == 0


def _require(*names: str) -> None:
    if not _importable(*names):
        pytest.skip(f"replayssm_kernels does not provide {', '.join(names)} yet")


def _run_cli(args: list[str], extra_env: dict | None = None, timeout: int = 600,
             module: str = "benchmarks.bench_decode"):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "tests" / "benchmarks"), env.get("PYTHONPATH", "")]
    )
    env.update(extra_env or {})
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )


# ------------------------------------------------------------------------------------ arguments


def test_parse_defaults_cuda_shapes(tmp_path):
    cfg = bd.parse_args(["--dry-run", "--out", str(tmp_path)])
    assert cfg.families == ["mamba2", "gdn"]
    assert cfg.batches == [1, 8, 32, 64, 128, 256, 512]
    assert (cfg.L, cfg.R) == (16, 16)
    assert cfg.mamba2_shape == NANO_4B and cfg.gdn_shape == QWEN35_4B
    assert cfg.slots == 1024  # 2 x max batch
    assert cfg.repeats == 100 and cfg.passes == 2 and cfg.l2_flush == "read"


def test_parse_cpu_picks_tiny_shapes(tmp_path):
    cfg = bd.parse_args(["--device", "cpu", "--batch", "1,3", "--window", "4",
                         "--family", "gdn", "--out", str(tmp_path)])
    assert cfg.families == ["gdn"]
    assert cfg.batches == [1, 3]
    assert cfg.mamba2_shape == MAMBA2_TINY and cfg.gdn_shape == GDN_TINY
    assert cfg.slots == 8 and not cfg.graph
    assert cfg.repeats == 2


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["--batch", "1,x"], "comma-separated integers"),
        (["--batch", "0"], "positive integers"),
        (["--window", "0"], "--window"),
        (["--window", "8", "--ring-size", "4"], "--ring-size"),
        (["--batch", "16", "--slots", "16"], "--slots"),
        (["--family", "rwkv"], "invalid choice"),
        (["--gdn-decode-launch", "wave_prefetch=16"], "--gdn-decode-launch: expected FIELD=INT"),
        (["--gdn-decode-launch", "block_v=24"], "block_v: expected a power of two, got 24"),
        (["--gdn-decode-launch", "block_v=8,fold_rows=16"], "fold_rows: expected at most"),
        (["--gdn-decode-launch", "tiles=3"], "tiles: expected a power of two, got 3"),
    ],
)
def test_parse_errors(tmp_path, capsys, argv, msg):
    with pytest.raises(SystemExit):
        bd.parse_args(["--dry-run", "--out", str(tmp_path), *argv])
    assert msg in capsys.readouterr().err


def test_gdn_decode_launch_override_reaches_the_kernel(tmp_path, monkeypatch):
    """``--gdn-decode-launch`` wraps ``gdn_replay_decode_fwd`` (which the public function looks up at
    call time) with the given keywords and records them in the run's metadata."""
    import replayssm_kernels.gdn_decode.kernel as gdk

    cfg = bd.parse_args(["--dry-run", "--out", str(tmp_path), "--gdn-decode-launch",
                         "block_v=16,fold_rows=8,nonflush_rows=4,tiles=2"])
    assert cfg.gdn_decode_launch == {"block_v": 16, "fold_rows": 8, "nonflush_rows": 4,
                                     "tiles": 2}
    seen = {}
    monkeypatch.setattr(gdk, "gdn_replay_decode_fwd", lambda *a, **k: seen.update(k))
    monkeypatch.setattr(bd, "load_ours", lambda cfg: (_ for _ in ()).throw(
        RuntimeError("stop after the override")))
    with pytest.raises(RuntimeError, match="stop after the override"):
        bd.main(["--device", "cpu", "--family", "gdn", "--batch", "1", "--out", str(tmp_path),
                 "--gdn-decode-launch", "block_v=8"])
    gdk.gdn_replay_decode_fwd(None, scale=1.0)
    assert seen == {"block_v": 8, "scale": 1.0}


def test_byte_models_per_family(tmp_path):
    cfg = bd.parse_args(["--dry-run", "--out", str(tmp_path)])
    m = bd.byte_models(cfg, "mamba2")
    assert set(m) == {"ours", "ssu"}
    assert m["ours"].cycle_mean() == 4_363_048
    g = bd.byte_models(cfg, "gdn")
    assert set(g) == {"ours", "packed", "builtin"}
    assert g["builtin"].cycle_mean() == 2_461_368
    assert g["packed"].cycle_mean() == 4_219_008
    cfg16 = bd.parse_args(["--dry-run", "--state-dtype", "bf16", "--out", str(tmp_path)])
    assert bd.byte_models(cfg16, "mamba2")["ssu"].S == NANO_4B.H * NANO_4B.P * NANO_4B.N * 2


# ------------------------------------------------------------------- results from fake timings


def _fake_rows(L=4, batch=8, copy_bw=4e12):
    mb = bm.mamba2_replay_bytes(NANO_4B, L)
    ssu = bm.selective_state_update_bytes(NANO_4B)
    # phase w takes 10 + w us; the flush (w = L-1) 100 us; two passes, 3 samples each
    samples = {("phase", w): [[10.0 + w] * 3, [10.0 + w] * 3] for w in range(L - 1)}
    samples[("phase", L - 1)] = [[100.0] * 3, [110.0] * 3]
    mixed = bm.mixed_phases(batch, L)
    samples[("mixed",)] = [[30.0, 31.0, 29.0]]
    rows = bd.summarize_case("ours", "mamba2", batch, mb, L, samples, mixed, "")
    rows += bd.summarize_case("ssu", "mamba2", batch, ssu, L, {("step",): [[60.0, 61.0, 59.0]]},
                              None, "")
    bd.finish_rows(rows, copy_bw)
    return rows, mb, ssu


def test_summarize_and_finish_rows():
    L, batch = 4, 8
    rows, mb, ssu = _fake_rows(L, batch)
    cyc, mixed, step = rows
    assert (cyc.mode, mixed.mode, step.mode) == ("cycle", "mixed", "step")
    flush_med = 105.0  # median of [100]*3 + [110]*3
    want = (10 + 11 + 12 + flush_med) / L
    assert cyc.median_us == pytest.approx(want)
    assert cyc.nonflush_us == pytest.approx(11.0)
    assert cyc.flush_us == pytest.approx(flush_med)
    assert cyc.phase_us == pytest.approx([10, 11, 12, flush_med])
    assert cyc.spread_pct == pytest.approx(10 / flush_med * 100)
    assert cyc.bytes == pytest.approx(batch * mb.cycle_mean())
    assert cyc.tbps == pytest.approx(cyc.bytes / (want * 1e-6) / 1e12)
    assert cyc.pct_copy == pytest.approx(100 * cyc.tbps * 1e12 / 4e12)
    assert cyc.floor_us == pytest.approx(cyc.bytes / 4e12 * 1e6)
    assert cyc.speedup_vs_base == pytest.approx(60.0 / want)
    assert mixed.median_us == 30.0
    assert mixed.bytes == mb.batch_bytes(bm.mixed_phases(batch, L))
    assert mixed.speedup_vs_base == pytest.approx(2.0)
    assert step.bytes == batch * ssu.cycle_mean()
    assert math.isnan(step.speedup_vs_base)
    assert all(math.isnan(r.speedup_vs_builtin) for r in rows)


def test_gdn_speedup_vs_builtin():
    L, b = 2, 4
    ours, bi, pk = (bm.gdn_replay_bytes(QWEN35_4B, L), bm.gdn_builtin_replay_bytes(QWEN35_4B, L),
                    bm.gdn_packed_decode_bytes(QWEN35_4B))
    ph = {("phase", 0): [[10.0]], ("phase", 1): [[30.0]]}
    ph_bi = {("phase", 0): [[15.0]], ("phase", 1): [[45.0]]}
    rows = bd.summarize_case("ours", "gdn", b, ours, L, ph, None, "")
    rows += bd.summarize_case("builtin", "gdn", b, bi, L, ph_bi, None, "")
    rows += bd.summarize_case("packed", "gdn", b, pk, L, {("step",): [[40.0]]}, None, "")
    bd.finish_rows(rows, 4e12)
    o, bb, p = rows
    assert o.speedup_vs_builtin == pytest.approx(1.5)
    assert o.speedup_vs_base == pytest.approx(2.0)
    assert bb.speedup_vs_base == pytest.approx(40 / 30)
    targets = bd.check_targets(rows, batch=b)
    assert {(t["metric"], t["met"]) for t in targets} >= {("speedup_vs_base", True),
                                                         ("speedup_vs_builtin", True)}


def test_table_markdown_json_and_plot(tmp_path):
    rows, _, _ = _fake_rows()
    text = bd.format_text_table(rows)
    assert "replayssm (ours) L4" in text and "sglang selective_state_update" in text
    assert len(text.splitlines()) == 2 + len(rows)
    meta = {"device_name": "fake", "commit": "abc", "date": "today", "argv": ["--x"],
            "copy_bw": 4e12, "l2_flush": "read", "l2_flush_bytes": 2**28, "graph": True,
            "repeats": 3, "passes": 2}
    md = bd.format_markdown(rows, meta)
    assert md.count("\n| mamba2 |") == len(rows)
    assert "abc" in md and "4.00 TB/s" in md and "launch override" not in md
    md = bd.format_markdown(rows, {**meta, "gdn_decode_launch": {"tiles": 2, "block_v": 16}})
    assert "- **launch override** `gdn_decode_launch`: tiles=2, block_v=16\n" in md
    safe = bd._json_safe({"a": float("nan"), "b": [1.0, float("inf")], "c": {"d": 2}})
    assert safe == {"a": None, "b": [1.0, None], "c": {"d": 2}}
    png = tmp_path / "p.png"
    how = bd.write_plot(rows, png, "fake")
    if how.startswith("no plot"):
        pytest.skip(f"neither matplotlib nor Pillow here: {how}")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_refcheck_rows_cover_every_case():
    rng = None  # _refcheck_rows draws its own permutation
    for L in (1, 2, 4, 16):
        slots, lens, flush = bd._refcheck_rows(8, 16, L, rng)
        assert slots[-1] == -1 and len(set(slots[:-1])) == 7 and min(slots[:-1]) >= 1
        assert all(0 <= w <= L - 1 for w in lens)
        assert all(f for w, f in zip(lens[:-1], flush[:-1]) if w == L - 1)
        assert flush[-1] is False  # the padding row never flushes
        if L >= 4:
            assert {(w, f) for w, f in zip(lens[:-1], flush[:-1])} >= {
                (0, False), (L - 2, False), (L - 1, True), (2, True), (0, True)}


# --------------------------------------------------------------------------------- smoke runs


def test_dry_run_end_to_end(tmp_path):
    out = tmp_path / "dry"
    rc = bd.main(["--dry-run", "--batch", "1,256", "--out", str(out), "--commit", "c0ffee"])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())  # strict JSON (no NaN)
    assert res["meta"]["dry_run"] is True and res["meta"]["commit"] == "c0ffee"
    # per batch: mamba2 ours cycle + mixed + ssu; gdn ours cycle + mixed + builtin x2 + packed
    assert len(res["rows"]) == 2 * (3 + 5)
    assert {t["metric"] for t in res["targets_batch256"]} == {
        "speedup_vs_base", "speedup_vs_builtin", "pct_copy"}
    assert "DRY RUN" in (out / "results.md").read_text()
    assert (out / "decode_bench.png").exists()


def test_cpu_smoke_references(tmp_path):
    """The whole CLI on CPU with our torch references as 'ours' (no interpreter, no SGLang)."""
    _require("mamba2_replay_decode_ref", "gdn_replay_decode_ref")
    r = _run_cli(["--device", "cpu", "--impl", "ref", "--skip-peers", "--batch", "1,3",
                  "--window", "3", "--repeats", "1", "--warmup", "0", "--passes", "1",
                  "--refcheck", "--out", str(tmp_path)])
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((tmp_path / "results.json").read_text())
    rows = res["rows"]
    assert {(x["family"], x["mode"]) for x in rows} == {
        ("mamba2", "cycle"), ("mamba2", "mixed"), ("gdn", "cycle"), ("gdn", "mixed")}
    for x in rows:
        assert x["median_us"] > 0
        if x["mode"] == "cycle":
            assert len(x["phase_us"]) == 3
    assert res["refcheck"]["mamba2"]["ok"] and res["refcheck"]["gdn"]["ok"]


def test_cpu_smoke_interpreter_with_sglang_peers(tmp_path):
    """Our Triton kernels and SGLang's three kernels, all under the Triton interpreter, called
    exactly as on the GPU; refcheck and the crosscheck against SGLang's conventional kernels."""
    _require("mamba2_replay_decode", "gdn_replay_decode", "mamba2_replay_decode_ref",
             "gdn_replay_decode_ref")
    pytest.importorskip("sglang")
    r = _run_cli(["--device", "cpu", "--batch", "1,2", "--window", "2", "--repeats", "1",
                  "--warmup", "0", "--passes", "1", "--refcheck", "--out", str(tmp_path)],
                 extra_env={"TRITON_INTERPRET": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((tmp_path / "results.json").read_text())
    kernels = {(x["family"], x["kernel"]) for x in res["rows"]}
    assert kernels == {("mamba2", "ours"), ("mamba2", "ssu"), ("gdn", "ours"),
                       ("gdn", "packed"), ("gdn", "builtin")}, res["status"]
    for fam in ("mamba2", "gdn"):
        rc = res["refcheck"][fam]
        assert rc["ok"], rc
        xc = rc["vs_sglang_conventional"]
        assert xc["ok"], xc
    assert all(x["speedup_vs_base"] is not None for x in res["rows"]
               if x["kernel"] in ("ours", "builtin"))


def test_cpu_smoke_launch_override(tmp_path):
    """``--gdn-decode-launch`` on CPU without ``TRITON_INTERPRET`` in the environment: the flag's
    check imports the kernels while parsing, so the interpreter must be on by then (it was not:
    '0 active drivers'); the run is refchecked and timed at the overridden launch, here with the
    rows in flush-first order (``--row-order flush-first``)."""
    _require("gdn_replay_decode")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_decode", "--device", "cpu", "--family", "gdn",
         "--skip-peers", "--batch", "1", "--window", "2", "--repeats", "1", "--warmup", "0",
         "--passes", "1", "--refcheck", "--gdn-decode-launch", "block_v=16,tiles=2",
         "--row-order", "flush-first", "--out", str(tmp_path)],
        cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=600, check=False)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["refcheck"]["gdn"]["ok"] and res["rows"], res["status"]
    assert res["meta"]["gdn_decode_launch"] == {"block_v": 16, "tiles": 2}
    assert res["meta"]["row_order"] == "flush-first"
    md = (tmp_path / "results.md").read_text()
    assert "`gdn_decode_launch`: block_v=16, tiles=2" in md and "`--row-order flush-first`" in md


def test_refcheck_failure_is_not_timed(tmp_path):
    _require("mamba2_replay_decode_ref")
    r = _run_cli(["--device", "cpu", "--kernels-module", "broken_kernels", "--skip-peers",
                  "--batch", "2", "--window", "2", "--repeats", "1", "--warmup", "0",
                  "--passes", "1", "--refcheck", "--out", str(tmp_path)])
    assert r.returncode == 1, r.stdout + r.stderr
    res = json.loads((tmp_path / "results.json").read_text())
    assert not res["refcheck"]["mamba2"]["ok"]
    assert any("out: rel err" in p for p in res["refcheck"]["mamba2"]["problems"])
    assert res["rows"] == []
    assert res["status"]["mamba2/ours"].startswith("not timed: refcheck failed")
    assert "unavailable" in res["status"]["ours/gdn"]
    assert "refcheck mamba2: FAIL" in r.stdout
