"""benchmarks/device/ab_patches.sh: the checkout and patched copies of kernels/ under one command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "device" / "ab_patches.sh"

# A stand-in benchmark: records which replayssm_kernels it imported, the patch's marker, --commit.
PROBE = """
import argparse, json, os, pathlib
import replayssm_kernels
p = argparse.ArgumentParser()
p.add_argument("--out"); p.add_argument("--commit"); p.add_argument("--tag")
a = p.parse_args()
pathlib.Path(a.out).mkdir(parents=True)
src = pathlib.Path(replayssm_kernels.__file__).read_text()
json.dump(dict(file=os.path.realpath(replayssm_kernels.__file__), marked="AB_MARKER" in src,
               commit=a.commit, tag=a.tag), open(os.path.join(a.out, "probe.json"), "w"))
"""


def _patch(tmp_path: Path, old: str, new: str) -> Path:
    """A patch of kernels/__init__.py replacing ``old`` by ``new`` (``git diff --no-index``)."""
    a, b = tmp_path / "a" / "kernels", tmp_path / "b" / "kernels"
    for d in (a, b):
        d.mkdir(parents=True)
    text = (ROOT / "kernels" / "__init__.py").read_text()
    assert old in text
    (a / "__init__.py").write_text(text)
    (b / "__init__.py").write_text(text.replace(old, new, 1))
    r = subprocess.run(["git", "diff", "--no-index", "a/kernels/__init__.py",
                        "b/kernels/__init__.py"], cwd=tmp_path, capture_output=True, text=True)
    patch = tmp_path / "m.patch"
    patch.write_text(r.stdout.replace("a/a/kernels", "a/kernels").replace("b/b/kernels",
                                                                          "b/kernels"))
    return patch


def _run(tmp_path: Path, *variants: str):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out"), *variants, "--",
                           "python3", str(probe), "--tag", "x"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_variants_import_their_patched_copy(tmp_path):
    patch = _patch(tmp_path, '"""', '"""AB_MARKER ')
    r = _run(tmp_path, f"m={patch}")
    assert r.returncode == 0, r.stderr
    base = json.loads((tmp_path / "out" / "base" / "probe.json").read_text())
    m = json.loads((tmp_path / "out" / "m" / "probe.json").read_text())
    assert base["file"] == str((ROOT / "kernels" / "__init__.py").resolve()) and not base["marked"]
    assert m["marked"] and m["file"] != base["file"]
    assert m["commit"] == base["commit"] + "+m" and base["tag"] == m["tag"] == "x"
    # The checkout itself is untouched.
    assert "AB_MARKER" not in (ROOT / "kernels" / "__init__.py").read_text()


@pytest.mark.parametrize("variant", ["nopatch", "m=", "=x.patch"])
def test_bad_variant_refused(tmp_path, variant):
    r = _run(tmp_path, variant)
    assert r.returncode == 2 and "expected NAME=PATCH" in r.stderr
    assert not (tmp_path / "out").exists()


def test_patch_that_does_not_apply_stops_before_running(tmp_path):
    patch = _patch(tmp_path, '"""', '"""AB_MARKER ')
    text = patch.read_text()
    patch.write_text(text.replace("-\"\"\"", "-\"\"\"NOT THERE", 1))
    r = _run(tmp_path, f"m={patch}")
    assert r.returncode == 1 and "does not apply" in r.stderr
    assert not (tmp_path / "out").exists()


#: Untimed kernel experiments waiting for a GPU A/B (benchmarks/notes/*.patch; the ablations under
#: notes/ablations/ are records of a timed run at an older commit and may no longer apply).
PENDING_PATCHES = sorted((ROOT / "benchmarks" / "notes").glob("*.patch"))


@pytest.mark.parametrize("patch", PENDING_PATCHES, ids=[p.name for p in PENDING_PATCHES])
def test_pending_patches_apply(patch):
    """A pending A/B patch still applies to this checkout (ab_patches.sh would stop otherwise)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    r = subprocess.run(["git", "apply", "--check", str(patch)], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
