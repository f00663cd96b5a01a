"""benchmarks/device/issue_tables.sh: every step runs with its arguments, a failing or slow step
costs only itself, the tarball holds what finished."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "device" / "issue_tables.sh"

# A stand-in python3: `-m MODULE ARGS... --commit C --out D` writes D/results.md with one "ours" row
# naming the module and arguments; `--family mamba2` fails (exit 3) after writing nothing.
FAKE = """#!/usr/bin/env bash
args="$*"
echo "FAKE $args" >&2
out=""; prev=""
for a in "$@"; do [ "$prev" = --out ] && out=$a; prev=$a; done
case "$args" in *"--family mamba2"*) exit 3 ;; esac
mkdir -p "$out"
echo "| ours | $args |" > "$out/results.md"
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "python3"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    out = tmp_path / "OUT"
    out.mkdir(exist_ok=True)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", OUT=str(out))
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("part,modules", [("decode", "benchmarks.bench_decode"),
                                          ("verify", "benchmarks.bench_verify")])
def test_steps_and_tarball(tmp_path, part, modules):
    r = _run(tmp_path, part, "abc1234")
    assert r.returncode == 1, (r.stdout, r.stderr)  # the mamba2 step failed
    rows = [line for line in r.stdout.splitlines() if line.startswith("| ours")]
    assert len(rows) == 3, r.stdout  # gdn, gdn_bf16, gdn_fp8: the later steps still ran
    for row in rows:
        assert f"-m {modules} --family gdn" in row and "--refcheck" in row, row
        assert "--commit abc1234 --out /tmp/issue_tables/" in row, row
    assert "--read-dtype bf16" in rows[1] and "--skip-peers" not in rows[1]
    assert "--read-dtype fp8" in rows[2] and "--skip-peers" in rows[2]
    # the verify tables time bench_verify's default flush rule, the served (late) one
    assert not any("--flush-rule" in row for row in rows)
    with tarfile.open(tmp_path / "OUT" / f"{part}.tgz") as t:
        names = set(t.getnames())
    for step in ("gdn", "gdn_bf16", "gdn_fp8"):
        assert f"{part}/{step}/results.md" in names, names


def test_late_part(tmp_path):
    """``late``: per family the late rule, then the early one, with an fp8 copy, ours only; then
    each family's late run with SGLang's peers (the stand-in fails the Mamba-2 steps: the later
    steps still run, the status says so)."""
    r = _run(tmp_path, "late", "abc1234")
    assert r.returncode == 1, (r.stdout, r.stderr)
    steps = [line.split(": ")[1] for line in r.stderr.splitlines() if line.startswith("=== issue_tables")]
    assert steps == ["gdn_late_fp8", "gdn_early_fp8", "mamba2_late_fp8", "mamba2_early_fp8", "gdn_peers",
                     "mamba2_peers"]
    rows = [line for line in r.stdout.splitlines() if line.startswith("| ours")]
    assert len(rows) == 3, r.stdout
    assert all("--refcheck" in x and "--family gdn" in x and "--read-dtype fp8" in x for x in rows)
    assert ["--skip-peers" in x for x in rows] == [True, True, False]
    assert ["--flush-rule early" in x for x in rows] == [False, True, False]


def test_targets_part(tmp_path):
    """``targets``: issue 5's rows first (GDN T = 4, 8 and Mamba-2 T = 4 with an fp8 copy), then
    with a bf16 copy (GDN) and none (Mamba-2); all at batch 256, the late rule, SGLang's peers."""
    r = _run(tmp_path, "targets", "abc1234")
    assert r.returncode == 1, (r.stdout, r.stderr)
    steps = [line.split(": ")[1] for line in r.stderr.splitlines() if line.startswith("=== issue_tables")]
    assert steps == ["gdn_fp8", "mamba2_fp8", "gdn_bf16", "mamba2"]
    rows = [line for line in r.stdout.splitlines() if line.startswith("| ours")]
    assert len(rows) == 2, r.stdout
    assert all("--T 4,8 --batch 256" in x and "--flush-rule" not in x and "--refcheck" in x
               and "--skip-peers" not in x for x in rows)
    assert "--read-dtype fp8" in rows[0] and "--read-dtype bf16" in rows[1]


def test_mma_part(tmp_path):
    """``mma``: the Mamba-2 verify with a bf16 then an fp8 copy, batch 256, ours only: the default
    at T = 4, 8 (read_mma by the rule), then each T without it (the stand-in fails every Mamba-2
    step: each runs anyway, the status says so)."""
    r = _run(tmp_path, "mma", "abc1234")
    assert r.returncode == 1, (r.stdout, r.stderr)
    steps = [line.split(": ")[1] for line in r.stderr.splitlines() if line.startswith("=== issue_tables")]
    assert steps == ["mamba2_bf16", "mamba2_bf16_t4_fma", "mamba2_bf16_t8_fma", "mamba2_fp8",
                     "mamba2_fp8_t8_fma", "mamba2_fp8_t4_fma"]
    calls = [line[5:] for line in r.stderr.splitlines() if line.startswith("FAKE ")]
    assert len(calls) == 6
    assert all("-m benchmarks.bench_verify --family mamba2 --batch 256 --refcheck --skip-peers" in c
               and "--commit abc1234" in c for c in calls)
    launch = [c.split("--mamba2-verify-launch ")[1].split()[0] if "launch" in c else None
              for c in calls]
    one = "flush_split=0,flush_kq_dot=0"
    assert launch == [None, f"read_mma=0,kq_dot=0,{one}", f"read_mma=0,{one}", None,
                      f"read_mma=0,{one}", f"read_mma=0,kq_dot=0,{one}"]
    assert ["--read-dtype bf16" in c for c in calls] == [True] * 3 + [False] * 3
    assert ["--T 4,8" in c for c in calls] == [True, False, False, True, False, False]


@pytest.mark.parametrize("args", [(), ("decode",), ("tables", "abc1234")])
def test_usage(tmp_path, args):
    r = _run(tmp_path, *args)
    assert r.returncode == 2
    assert "usage: issue_tables.sh decode|verify|late|targets|mma COMMIT" in r.stderr
