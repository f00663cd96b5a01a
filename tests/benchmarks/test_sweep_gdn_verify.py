"""CPU tests of the GDN verify launch-config sweep: config validation and the grid, and the CLI's
correctness-only run through the Triton interpreter on the tiny shape.

The CLI run is a subprocess: Triton reads ``TRITON_INTERPRET`` when a kernel is defined, so it
must be set before any kernel module is imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import sweep_gdn_verify as sg

ROOT = Path(__file__).resolve().parents[2]
LC = sg.LaunchConfig


@pytest.mark.parametrize("config, V, R", [
    (LC(48, 16, 1), 128, 20),  # block_v not a power of two
    (LC(32, 12, 1), 128, 20),  # block_r not a power of two
    (LC(32, 16, 3), 128, 20),  # num_warps not a power of two
    (LC(32, 16, 0), 128, 20),
    (LC(32, 16, 64), 128, 20),  # > 1024 threads
    (LC(64, 16, 1), 32, 20),  # block_v > next_pow2(V): the launcher's clamp, a duplicate
    (LC(32, 16, 1), 128, 8),  # block_r > next_pow2(R)
], ids=lambda x: x.name if isinstance(x, LC) else str(x))
def test_invalid_config_rejected(config, V, R):
    with pytest.raises(ValueError):
        sg.validate_config(config, V, R)


@pytest.mark.parametrize("text", ["32x16", "32x16x1x2", "axbxc", "32-16-1", ""])
def test_malformed_config_rejected(text):
    with pytest.raises(ValueError):
        LC.parse(text)


def test_grid():
    configs, invalid = sg.grid(V=128, R=20)  # Qwen3.5-4B, L = 16, T = 4: the whole grid
    assert len(configs) == 36 and not invalid
    assert configs[0].name == sg.DEFAULT and len(set(configs)) == 36
    assert [c.num_warps for c in configs[1:]] == sorted((c.num_warps for c in configs[1:]),
                                                        reverse=True)
    configs, invalid = sg.grid(V=32, R=20)  # the tiny shape: block_v 64 and 128 are duplicates
    assert {c.block_v for c in configs} == {32} and len(invalid) == 24


def test_parse_rejects_invalid_configs(tmp_path):
    with pytest.raises(SystemExit):
        sg.parse_args(["--device", "cpu", "--configs", "64x8x4", "--out", str(tmp_path)])
    sw = sg.parse_args(["--device", "cpu", "--configs", "32x8x2", "--out", str(tmp_path)])
    assert [c.name for c in sw.configs] == [sg.DEFAULT, "32x8x2"]  # the default always first


def test_cpu_run(tmp_path):
    """The CLI on CPU: the correctness check of ``CPU_CONFIGS`` passes, nothing is timed."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "benchmarks.sweep_gdn_verify", "--device", "cpu",
                        "--out", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                       check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    configs = {c["name"]: c for c in res["configs"]}
    assert list(configs) == list(sg.CPU_CONFIGS)
    for c in configs.values():
        chk = c["check"]
        assert chk["ok"], chk["problems"]
        assert chk["errors"]["out"] < 3e-2 and set(chk["errors"]) >= {"out", "state", "ring_u"}
        assert chk["fold_bitwise_vs_default"] is not None and not c["timing"]
    md = (out / "results.md").read_text()
    assert md.count("| PASS |") == len(sg.CPU_CONFIGS) and "FAIL" not in md
    assert "fold bitwise vs default" in r.stdout


def test_table_lines():
    """Timed rows fastest first per batch; untimed configs once, at the end."""
    chk = {"ok": True, "errors": {"out": 1e-5}, "fold_bitwise_vs_default": False}
    res = [{"name": "32x16x1", "check": chk | {"fold_bitwise_vs_default": True},
            "timing": {"64": {"median_us": 700.0, "x_vs_default": 1.0},
                       "256": {"median_us": 2400.0, "x_vs_default": 1.0}}},
           {"name": "64x8x4", "check": chk,
            "timing": {"64": {"median_us": 350.0, "x_vs_default": 2.0}}},
           {"name": "128x4x1", "check": {"ok": False, "errors": {"out": 0.5}}, "timing": {}}]
    lines = sg.table_lines(res, [64, 256])
    assert [x[:4] for x in lines] == [["64x8x4", "64", "350.0", "2.00"],
                                      ["32x16x1", "64", "700.0", "1.00"],
                                      ["32x16x1", "256", "2400.0", "1.00"],
                                      ["128x4x1", "—", "—", "—"]]
    assert [x[-2:] for x in lines] == [["no", "PASS"], ["yes", "PASS"], ["yes", "PASS"],
                                       ["—", "FAIL"]]
    assert "x vs default" in sg.format_text(lines).splitlines()[0]
