"""The test harness itself (``tests/conftest.py``): pytest-xdist groups, threads per process, and the
Triton interpreter without its overflow sanitizer (``tests/interpreter_speed.py``)."""

import os

import pytest
import torch
import triton
import triton.language as tl

import interpreter_speed

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _axpy_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, 2.0 * x + y, mask=mask)


@pytest.mark.xdist_group("xdist-check")
@pytest.mark.skipif("PYTEST_XDIST_WORKER" not in os.environ, reason="run without pytest-xdist (-n 0)")
def test_a_named_group_is_in_effect(request: pytest.FixtureRequest) -> None:
    """The groups (``servers``, a file's own ``pytest.mark.xdist_group``) fail silently otherwise:
    pytest-xdist 3.8 under pytest 9 drops them and scatters module fixtures and servers."""
    assert request.node.nodeid.endswith("@xdist-check"), request.node.nodeid


@pytest.mark.skipif("PYTEST_XDIST_WORKER" not in os.environ, reason="run without pytest-xdist (-n 0)")
def test_one_thread_per_test_process() -> None:
    """One OpenMP / BLAS thread per worker (two workers on two cores) unless the shell chose."""
    assert os.environ["OMP_NUM_THREADS"] and os.environ["OPENBLAS_NUM_THREADS"]
    assert torch.get_num_threads() == int(os.environ["OMP_NUM_THREADS"])


@pytest.mark.skipif(not INTERPRET, reason="the Triton interpreter is not in use (TRITON_INTERPRET != 1)")
def test_interpreter_without_overflow_sanitizer() -> None:
    """The sanitizer is off on the pinned Triton (``apply`` fails to find the option on another
    one, and this test says so); kernels still compute what torch does."""
    from triton.runtime import interpreter

    assert interpreter_speed.apply() == ["no-overflow-sanitizer"]
    assert interpreter.interpreter_builder.options.sanitize_overflow is False
    x, y = torch.randn(37), torch.randn(37)
    out = torch.full_like(x, float("nan"))
    _axpy_kernel[(3,)](x, y, out, 37, BLOCK=16)
    torch.testing.assert_close(out, 2.0 * x + y, rtol=0, atol=1e-6)


def test_shard_parts_are_whole_files_balanced_and_stable():
    import sharding

    files = ["a"] * 5 + ["b"] * 3 + ["c"] * 3 + ["d"]
    part = sharding.shard_files(files, 2)
    assert part == {"a": 1, "b": 2, "c": 2, "d": 1}  # largest first, to the lighter part; ties by path
    assert sharding.shard_files(list(reversed(files)), 2) == part
    assert set(sharding.shard_files(files, 5).values()) == {1, 2, 3, 4}  # one file per part, the 5th empty
    assert sharding.parse_shard("2/3") == (2, 3)
    for bad in ("0/2", "3/2", "1", "a/b", "1/2/3"):
        with pytest.raises(ValueError, match="--shard"):
            sharding.parse_shard(bad)


def test_shard_option_splits_the_gpu_selection():
    """``pytest -m gpu --shard I/N``: the parts are disjoint and together the unsharded selection."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent

    def ids(*extra: str) -> set[str]:
        out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-o", "addopts=", "-m", "gpu",
                              "--collect-only", "-q", "tests/kernels/test_gdn_decode.py",
                              "tests/kernels/test_mamba2_decode.py", "tests/kernels/test_commit.py", *extra],
                             cwd=root, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        return {line for line in out.stdout.splitlines() if "::" in line}

    whole, one, two = ids(), ids("--shard", "1/2"), ids("--shard", "2/2")
    assert whole and one and two and not one & two and one | two == whole
    assert len({line.split("::")[0] for line in one} & {line.split("::")[0] for line in two}) == 0
