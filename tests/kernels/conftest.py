"""Shared set-up for the kernel tests (Mamba-2 and GDN).

Without a CUDA device the Triton kernels run under the Triton interpreter (``TRITON_INTERPRET=1``).
The variable is read when ``@triton.jit`` decorates a kernel, so it is set here, at conftest import
time, before any test module imports ``replayssm_kernels`` or SGLang.
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()

if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``@pytest.mark.gpu`` tests, with a reason, when no CUDA device is present."""
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the H200; CPU runs the interpreter)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
