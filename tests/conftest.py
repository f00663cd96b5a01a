"""Shared by every test: which SGLang plug-ins load, and the skip for ``@pytest.mark.gpu``.

Markers (``gpu``, ``slow``, ``e2e``) are declared in ``pyproject.toml``.
"""

from __future__ import annotations

import os

import pytest

# Load only this plug-in in test processes and the servers they start: SGLang's own dependency
# smg-grpc-servicer registers entry points in the same group (``smg-servicer``, ``smg-zmq``).
os.environ["SGLANG_PLUGINS"] = "replayssm"
# The tests choose their ReplaySSM configuration themselves; one left in the shell must not leak in.
os.environ.pop("SGLANG_REPLAYSSM_CONFIG", None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``@pytest.mark.gpu`` tests, with a reason, when no CUDA device is present."""
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none here (see benchmarks/device/README.md for the H200)")
    for item in gpu_items:
        item.add_marker(skip)
