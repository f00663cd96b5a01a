"""CPU tests of the verify benchmark CLI: arguments, the verify byte models and cycle, the results
arithmetic, and one smoke run through the Triton interpreter (ours and SGLang's kernels where they
run on a CPU) with ``--refcheck``.

The smoke run starts the CLI in a subprocess without ``TRITON_INTERPRET``: Triton reads it when a
kernel is defined, so ``--device cpu`` must set it before the CLI's first kernel import (its
argument parse).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import bench_verify as bv
from benchmarks import bytes_model as bm
from benchmarks.shapes import NANO_4B, QWEN35_4B

ROOT = Path(__file__).resolve().parents[2]


def test_parse_defaults(tmp_path):
    cfg = bv.parse_args(["--device", "cpu", "--out", str(tmp_path)])
    assert cfg.Ts == [2, 4, 8] and cfg.accepted == {2: 1, 4: 2, 8: 4}
    assert cfg.batches == [1, 8, 32, 64, 128, 256, 512]
    # the served (late) rule: R = min_ring_size(16, 8) + 8 (Mamba-2's ring, the longer of the two);
    # SGLang's built-in ring holds L + 2T
    assert cfg.late_flush and (cfg.L, cfg.R, cfg.builtin_ring) == (16, 32, 32)
    assert not cfg.graph and cfg.repeats == 2
    assert cfg.mamba2_verify_impl == "fma" and cfg.mamba2_verify_launch == {}


def test_parse_launch_overrides(tmp_path):
    cfg = bv.parse_args(["--device", "cpu", "--out", str(tmp_path), "--mamba2-verify-launch",
                         "num_warps=4,maxnreg=0,block_p=8"])
    assert cfg.mamba2_verify_launch == {"num_warps": 4, "maxnreg": None, "block_p": 8}
    cfg = bv.parse_args(["--device", "cpu", "--out", str(tmp_path), "--gdn-verify-launch",
                         "block_v=64,num_stages=3,maxnreg=204,fold_block_v=16,fold_rows=8,fold_tiles=4"])
    assert cfg.gdn_verify_launch == {"block_v": 64, "num_stages": 3, "maxnreg": 204,
                                     "fold_block_v": 16, "fold_rows": 8, "fold_tiles": 4}


def test_gdn_launch_override_reaches_the_kernel(tmp_path, monkeypatch):
    """``--gdn-verify-launch`` wraps ``gdn_replay_verify_fwd`` (which the public function looks up
    at call time) with the given keywords, and records them in the run's metadata."""
    import replayssm_kernels.gdn_verify.kernel as gvk

    seen = {}
    monkeypatch.setattr(gvk, "gdn_replay_verify_fwd", lambda *a, **k: seen.update(k))
    monkeypatch.setattr(bv.bd, "measure_copy_bandwidth", lambda cfg: (_ for _ in ()).throw(
        RuntimeError("stop after the overrides")))
    with pytest.raises(RuntimeError, match="stop after the overrides"):
        bv.main(["--device", "cpu", "--family", "gdn", "--out", str(tmp_path),
                 "--gdn-verify-launch", "block_v=16,num_warps=1"])
    gvk.gdn_replay_verify_fwd(None, scale=1.0)
    assert seen == {"block_v": 16, "num_warps": 1, "scale": 1.0}


@pytest.mark.parametrize("late", [False, True], ids=["early", "late"])
@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_each_T_times_its_own_ring(tmp_path, family, late):
    """With T = 2, 8 in one run the pools hold min_ring_size(L, 8) rows (Mamba-2 under the late
    rule: 8 more), but the T = 2 case hands the kernel the ring a T = 2 server allocates (its
    history block is sized from it), with cursors inside it; the views share the pool's storage."""
    from replayssm_kernels import min_ring_size

    cfg = bv.parse_args(["--device", "cpu", "--family", family, "--T", "2,8", "--batch", "2",
                         "--out", str(tmp_path), "--skip-peers", *([] if late else ["--flush-rule", "early"])])
    extra = late and family == "mamba2"
    seen = []
    cls = bv.Mamba2Verify if family == "mamba2" else bv.GDNVerify
    fam = cls(cfg, {family: lambda *a, **k: seen.append(a)}, {})
    for T in (2, 8):
        (case,) = fam.cases(2, T, [(0, False)], 1)
        case.fn()
        rings = seen[-1][1: 1 + len(fam.ring_names)]
        assert {r.shape[2] for r in rings} == {cfg.ring_rows(T, family)} == {min_ring_size(cfg.L, T) + extra * T}
        assert all(r.data_ptr() == getattr(fam, n).data_ptr()
                   for r, n in zip(rings, fam.ring_names))
        assert int(seen[-1][-3].max()) < cfg.ring_rows(T, family)  # ring_start
    assert cfg.R == cfg.ring_rows(8, family) > cfg.ring_rows(2, family)


@pytest.mark.parametrize("argv", [["--accepted", "3"], ["--T", "2,4", "--accepted", "1,5"],
                                  ["--T", "17"], ["--window", "0"], ["--slots", "4"],
                                  ["--mamba2-verify-launch", "warps=4"],
                                  ["--mamba2-verify-launch", "impl=1"],
                                  ["--mamba2-verify-launch", "maxnreg=x"],
                                  ["--gdn-verify-launch", "block_p=8"],
                                  ["--gdn-verify-launch", "num_warps=0"]])
def test_parse_errors(tmp_path, argv):
    with pytest.raises(SystemExit):
        bv.parse_args(["--device", "cpu", "--out", str(tmp_path), *argv])


def test_late_flush_cycle_and_refcheck_rows(tmp_path):
    """``--flush-rule late`` (the default; GDN): the timed cycle is the late rule's (non-flush histories up to
    ``R - T``, the flush folding more than ``R - T`` records, all within ``R``), and the refcheck
    rows include a flush row whose window wraps over its history."""
    from benchmarks.verify_cases import refcheck_rows

    cfg = bv.parse_args(["--device", "cpu", "--family", "gdn", "--T", "4,8", "--out", str(tmp_path)])
    named = bv.parse_args(["--device", "cpu", "--family", "gdn", "--T", "4,8", "--flush-rule", "late",
                           "--out", str(tmp_path)])
    assert (named.late_flush, named.R, named.builtin_ring) == (cfg.late_flush, cfg.R, cfg.builtin_ring)
    assert cfg.late_flush and cfg.flush_limit(4) == cfg.ring_rows(4, "gdn") == 20
    assert bm.verify_cycle(cfg.flush_limit(4), 4, 2) == [(h, h == 18) for h in range(2, 19, 2)]
    assert bm.verify_cycle(cfg.flush_limit(8), 8, 4) == [(h, h == 20) for h in range(4, 21, 4)]
    rows = refcheck_rows(8, 16, cfg.flush_limit(4), 4)
    assert max(h for _, h, f in rows if not f) == 16
    assert any(f and h + 4 > 20 and h <= 20 for _, h, f in rows)
    early = bv.parse_args(["--device", "cpu", "--family", "gdn", "--flush-rule", "early", "--out", str(tmp_path)])
    assert not early.late_flush and early.flush_limit(4) == 16
    # SGLang's built-in ring holds a flush row's history plus its window: L + 2T when late
    argv = ["--device", "cpu", "--family", "gdn", "--T", "8", "--window", "20", "--out",
            str(tmp_path)]
    assert bv.parse_args(argv + ["--flush-rule", "early"]).builtin_ring == 32 >= 20 + 8
    assert bv.parse_args(argv).builtin_ring == 64 >= 20 + 2 * 8
    # Mamba-2 under the late rule: the same limit, on a ring T rows longer (no window over history)
    m2 = bv.parse_args(["--device", "cpu", "--family", "mamba2", "--T", "4", "--out", str(tmp_path)])
    assert m2.flush_limit(4) == 20 and m2.ring_rows(4, "mamba2") == m2.R == 24
    assert max(h + 4 for _, h, _ in refcheck_rows(8, 16, m2.flush_limit(4), 4)) <= 24


def test_verify_cycle():
    assert bm.verify_cycle(16, 4, 2) == [(h, h == 14) for h in range(2, 15, 2)]
    assert bm.verify_cycle(16, 8, 4) == [(4, False), (8, False), (12, True)]
    assert bm.verify_cycle(16, 2, 1)[-1] == (15, True) and len(bm.verify_cycle(16, 2, 1)) == 15
    assert bm.verify_cycle(4, 8, 8) == [(8, True)]  # T > L: every step flushes, len <= max(L, T)
    for L, T in ((16, 2), (16, 4), (16, 8), (6, 4)):
        for a in range(1, T + 1):
            cyc = bm.verify_cycle(L, T, a)
            assert all(h + T <= L for h, f in cyc if not f) and cyc[-1][1]
            assert all(h + T <= max(L, T) + T for h, _ in cyc)  # fits min_ring_size(L, T)
    with pytest.raises(ValueError):
        bm.verify_cycle(16, 4, 5)


def test_verify_byte_models():
    z = bm.mamba2_sizes(NANO_4B)
    ours = bm.mamba2_replay_verify_bytes(NANO_4B, 4)
    assert ours.step(3).total == z.S + 3 * z.r + 4 * z.r + 4 * z.I
    assert ours.step(3, flush=True).total == 2 * z.S + 3 * z.r + 4 * z.r + 4 * z.I
    snap = bm.mamba2_snapshot_verify_bytes(NANO_4B, 4)
    assert snap.step(7).total == bm.snapshot_spec_vllm(z.S, z.I, 4)  # (1+T)S + T·I
    com = bm.mamba2_snapshot_commit_bytes(NANO_4B, 4)
    # snapshot verify + its commit = math.md's vLLM-style snapshot + 2S - ... : (3+T)S + T·I
    assert snap.step().total + com.step().total == bm.snapshot_spec_vllm(z.S, z.I, 4) + 2 * z.S
    assert bm.mamba2_snapshot_verify_bytes(NANO_4B, 1).step().total == bm.baseline_ar(z.S, z.I)
    g = bm.gdn_sizes(QWEN35_4B)
    # math.md §11: the fold-every-commit step is 3S + (T + a)·r_raw + T·I, r_raw = 12,544 B
    assert bm.gdn_builtin_fold_step_bytes(QWEN35_4B, 4, 2).step().total == (
        3 * g.S + 6 * 12_544 + 4 * g.I)
    f = bm.gdn_record_fields(QWEN35_4B)
    ours_g = bm.gdn_replay_verify_bytes(QWEN35_4B, 2)
    assert ours_g.step(5).ring_read == 5 * (f["u"] + f["k"] + f["g"])
    assert ours_g.step(5, True).ring_read == 5 * (f["k"] + f["v"] + f["g"] + f["beta"])
    assert ours_g.step(0).ring_write == 2 * sum(f.values())
    # a flush row's S: read by the fold launch, written, read again by the window launch
    assert (ours_g.step(5, True).state_read, ours_g.step(5, True).state_write) == (2 * g.S, g.S)
    assert (ours_g.step(5).state_read, ours_g.step(5).state_write) == (g.S, 0)
    builtin = bm.gdn_builtin_spec_verify_bytes(QWEN35_4B, 4)  # fold launch, then the flush outputs
    assert builtin.step(5, True).state_read == 2 * g.S and builtin.step(5).state_read == g.S
    m2 = bm.mamba2_replay_verify_bytes(NANO_4B, 4)  # one launch: the fold's values stay in registers
    assert m2.step(5, True).state_read == z.S
    rows = [(1, False), (2, True)]
    assert ours_g.batch_bytes(rows) == ours_g.step(1).total + ours_g.step(2, True).total


def _row(kernel, mode, us, T=4, batch=8):
    return bv.Row("mamba2", kernel, kernel, T, 2, batch, mode, us, 1e6)


def test_finish_rows():
    rows = [_row("ours", "cycle", 10.0), _row("ours", "mixed", 20.0),
            _row("snapshot", "step", 40.0), _row("commit", "step", 10.0),
            _row("decode", "step", 5.0), _row("ours", "cycle", 1.0, batch=16)]
    bv.finish_rows(rows, copy_bw=4e12)
    ours, mixed = rows[0], rows[1]
    assert ours.x_snapshot == 4.0 and ours.x_snapshot_step == 5.0 and ours.per_decode == 2.0
    assert mixed.x_snapshot == 2.0 and mixed.per_decode == 4.0
    assert ours.tbps == pytest.approx(0.1) and ours.pct_copy == pytest.approx(2.5)
    assert rows[2].per_decode == 8.0 and rows[4].per_decode != rows[4].per_decode  # NaN for itself
    assert rows[5].x_snapshot != rows[5].x_snapshot  # no snapshot at batch 16
    assert bv.decode_ratio_lines(rows) == [
        "mamba2 T=4 replayssm verify (ours): b8 2.00",  # no decode step timed at b16
        "mamba2 T=4 replayssm verify (ours) mixed: b8 4.00",
        "mamba2 T=4 sglang snapshot verify: b8 8.00"]
    text = bv.format_text(rows)
    assert "x vs snapshot+commit" in text and "5.00" in text


def test_markdown_names_launch_overrides():
    """A launch sweep's results.md says which launch it timed (not only in its command line)."""
    assert "launch override" not in bv.format_markdown([], {})
    md = bv.format_markdown([], {"gdn_verify_launch": {"fold_rows": 8},
                                 "mamba2_verify_launch": {"n_chunks": 4, "maxnreg": None}})
    assert "- **launch override** `mamba2_verify_launch`: n_chunks=4, maxnreg=None\n" in md
    assert "- **launch override** `gdn_verify_launch`: fold_rows=8\n" in md


def test_cpu_smoke(tmp_path):
    """Both families through the CLI on CPU: refcheck passes, ours and SGLang's snapshot verify,
    built-in spec verify and decode steps are timed, outputs are written."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # --device cpu sets it
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_verify", "--device", "cpu", "--batch", "1",
         "--T", "2", "--window", "2", "--repeats", "1", "--warmup", "0", "--passes", "1",
         "--refcheck", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert all(v["ok"] for v in res["refcheck"].values()) and len(res["refcheck"]) == 2
    for fam in ("mamba2", "gdn"):
        snap = res["refcheck"][f"{fam}/T2"]["vs_sglang_snapshot"]
        assert snap["sglang_state_untouched"] and snap["out_rel"] < 1e-2, snap
    timed = {(row["family"], row["kernel"], row["mode"]) for row in res["rows"]}
    want = {("mamba2", "ours", "cycle"), ("mamba2", "ours", "mixed"),
            ("mamba2", "snapshot", "step"), ("mamba2", "decode", "step"),
            ("gdn", "ours", "cycle"), ("gdn", "snapshot", "step"), ("gdn", "builtin", "cycle"),
            ("gdn", "decode", "step")}
    assert want <= timed, timed
    assert (out / "results.md").exists() and (out / "verify_bench.png").stat().st_size > 0
    assert "replayssm verify (ours) T2 a1" in r.stdout
