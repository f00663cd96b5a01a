"""Shared by every test: which SGLang plug-ins load, the Triton interpreter on CPU, and the skip for
``@pytest.mark.gpu``.  Markers (``gpu``, ``slow``, ``e2e``) are declared in ``pyproject.toml``.
"""

from __future__ import annotations

import os
from pathlib import Path

# Under pytest-xdist, one thread per process for torch's OpenMP pool and numpy's BLAS (the Triton
# interpreter's tl.dot), in the workers and the servers they start: two workers share the CI
# machine's two cores, and two pools of spinning threads each would fight over them. Set before
# torch (and numpy) are imported; `torch.set_num_threads` covers a torch a plug-in imported first.
# One-process runs (`-n 0`, `-p no:xdist` on the H200) keep the machine's threads.
XDIST_WORKER = "PYTEST_XDIST_WORKER" in os.environ
if XDIST_WORKER:
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import pytest  # noqa: E402
import torch  # noqa: E402

if XDIST_WORKER:
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

HAS_CUDA = torch.cuda.is_available()

# Load only this plug-in in test processes and the servers they start: SGLang's own dependency
# smg-grpc-servicer registers entry points in the same group (``smg-servicer``, ``smg-zmq``).
os.environ["SGLANG_PLUGINS"] = "replayssm"
# The tests choose their ReplaySSM configuration themselves; one left in the shell must not leak in.
os.environ.pop("SGLANG_REPLAYSSM_CONFIG", None)
# Without CUDA, Triton kernels run under the Triton interpreter.  TRITON_INTERPRET is read when
# ``@triton.jit`` decorates a kernel, i.e. when its module is first imported.  `pytest` over `tests/`
# imports tests/benchmarks/ (which imports replayssm_kernels) before it loads
# tests/kernels/conftest.py, so the variable must be set here, before anything is collected.
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import interpreter_speed  # noqa: E402  (tests/, on sys.path as the root conftest's folder)
import sharding  # noqa: E402

interpreter_speed.apply()


#: Test folders whose files start SGLang servers (or fake ones: subprocesses on real ports). Under
#: pytest-xdist (``-n 2 --dist loadgroup``, pyproject's ``addopts``) they form one group, so their
#: servers never compete with each other for the CI machine's two cores and 24 GiB. Every other test
#: is scheduled on its own (the interpreter-heavy kernel files spread over both workers), except
#: where a test file names a group itself (``pytest.mark.xdist_group``) for tests that share a cached
#: build or a module fixture.
SERVER_DIRS = ("benchmarks", "e2e", "models")
TESTS = Path(__file__).resolve().parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--shard", default=None, metavar="I/N",
                     help="run the I-th of N disjoint parts of the selected tests, whole files per part "
                          "(tests/sharding.py), e.g. the GPU suite over two device calls")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--shard") is not None:
        try:
            part = sharding.parse_shard(config.getoption("--shard"))
        except ValueError as e:
            raise pytest.UsageError(str(e)) from None
        config.pluginmanager.register(sharding.ShardPlugin(*part), "replayssm-shard")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put the server tests in one pytest-xdist group; skip ``@pytest.mark.gpu`` tests, with a
    reason, when no CUDA device is present."""
    for item in items:
        rel = Path(item.path).resolve().relative_to(TESTS)
        if rel.parts[0] in SERVER_DIRS:
            item.add_marker(pytest.mark.xdist_group("servers"))
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none here (see benchmarks/device/README.md for the H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
