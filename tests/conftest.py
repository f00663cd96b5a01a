"""Shared by every test: which SGLang plug-ins load, the Triton interpreter on CPU, and the skip for
``@pytest.mark.gpu``.  Markers (``gpu``, ``slow``, ``e2e``) are declared in ``pyproject.toml``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

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


#: Test folders whose files start SGLang servers (or fake ones: subprocesses on real ports). Under
#: pytest-xdist (``-n 2 --dist loadgroup``, pyproject's ``addopts``) they form one group, so their
#: servers never compete with each other for the CI machine's two cores and 24 GiB; every other file
#: is a group of its own, so its module fixtures are built once.
SERVER_DIRS = ("benchmarks", "e2e", "models")
TESTS = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put each test in its pytest-xdist group; skip ``@pytest.mark.gpu`` tests, with a reason, when
    no CUDA device is present."""
    for item in items:
        rel = Path(item.path).resolve().relative_to(TESTS)
        item.add_marker(pytest.mark.xdist_group("servers" if rel.parts[0] in SERVER_DIRS else rel.as_posix()))
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none here (see benchmarks/device/README.md for the H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
