"""Shared by every test: which SGLang plug-ins load, the Triton interpreter on CPU, and the skip for
``@pytest.mark.gpu``.  Markers (``gpu``, ``slow``, ``e2e``) are declared in ``pyproject.toml``.
"""

from __future__ import annotations

import os

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``@pytest.mark.gpu`` tests, with a reason, when no CUDA device is present."""
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none here (see benchmarks/device/README.md for the H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
