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

import triton  # noqa: E402  (after TRITON_INTERPRET is set)
import triton.language as tl  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``@pytest.mark.gpu`` tests, with a reason, when no CUDA device is present."""
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the H200; CPU runs the interpreter)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# --- Triton-interpreter shims (GDN engineer; opt-in fixtures, used by the GDN tests) ------------


def _rtne_bf16_convert(orig):
    """Wrap the interpreter's float converter so fp32 -> bf16 rounds to nearest even.

    The Triton 3.6 interpreter truncates fp32 -> bf16 casts (``x.to(tl.bfloat16)``); the GPU
    rounds to nearest even (``cvt.rn.bf16.f32``).  Kernels that round β or store bf16 outputs
    would otherwise disagree with torch and with the GPU by one bf16 ulp.
    """
    import numpy as np
    import triton.language as tl

    def convert(input, input_dtype, output_dtype, rounding_mode):
        if input_dtype == tl.float32 and output_dtype == tl.bfloat16:
            bits = np.ascontiguousarray(input).view(np.uint32).astype(np.uint64)
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            nan = np.isnan(np.ascontiguousarray(input).view(np.float32))
            rounded = np.where(nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded)
            return rounded.reshape(np.shape(input))
        return orig(input, input_dtype, output_dtype, rounding_mode)

    convert._rtne_shim = True
    return convert


@pytest.fixture(scope="session")
def interpreter_bf16_rtne():
    """Make the Triton interpreter round fp32 -> bf16 to nearest even, as the GPU does."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        yield
        return
    from triton.runtime import interpreter

    orig = interpreter._convert_float
    if not getattr(orig, "_rtne_shim", False):
        interpreter._convert_float = _rtne_bf16_convert(orig)
    yield
    interpreter._convert_float = orig


@triton.jit
def _fla_exp(x):
    # Stand-in for fla's ``exp = tl.exp`` alias; module level so ``tl`` is in its globals.
    return tl.exp(x)


@pytest.fixture(scope="session")
def sglang_fla_interpret(interpreter_bf16_rtne):
    """Let SGLang's fla Triton kernels run under the interpreter (CPU).

    Two shims: ``torch.cpu.device`` does not exist (fla's ``input_guard`` enters
    ``device_torch_lib.device(index)``), and fla's module-level alias ``exp = tl.exp`` (in
    ``fla/op.py``, imported by name into ``fused_recurrent.py`` and others) is a bare builtin that
    the interpreter refuses outside ``@triton.jit``; it becomes a jitted wrapper.
    """
    if os.environ.get("TRITON_INTERPRET") != "1":
        yield
        return
    import contextlib
    import sys

    added_device = not hasattr(torch.cpu, "device")
    if added_device:
        torch.cpu.device = lambda index=None: contextlib.nullcontext()

    import sglang.kernels.ops.attention.fla.fused_recurrent  # noqa: F401  (loads fla.op too)

    patched = []
    for name, mod in list(sys.modules.items()):
        if name.startswith("sglang.kernels.ops.attention.fla") and getattr(mod, "exp", None) is tl.exp:
            patched.append(mod)
            mod.exp = _fla_exp
    yield
    for mod in patched:
        mod.exp = tl.exp
    if added_device:
        del torch.cpu.device


@pytest.fixture
def interpreter_gpu_sum_order():
    """Interpreter ``tl.sum`` in the GPU's row-sum order (``benchmarks._cpu_shims.gpu_tree_sum``); no-op on
    a GPU."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        yield
        return
    from triton.runtime import interpreter

    orig = interpreter.ReduceOps.sum
    from benchmarks._cpu_shims import gpu_tree_sum

    interpreter.ReduceOps.sum = gpu_tree_sum
    yield
    interpreter.ReduceOps.sum = orig


def _rtne_fp16_fp8_convert(orig):
    """Wrap the interpreter's float converter so fp32 -> fp16 and fp32 -> fp8 e4m3 round to
    nearest even (e4m3 saturating to ±448, as ``cvt.rn.satfinite.e4m3x2.f32`` does); the
    interpreter truncates both. Used by the split-precision tests (read copies)."""
    import numpy as np
    import triton.language as tl

    def convert(input, input_dtype, output_dtype, rounding_mode):
        if input_dtype == tl.float32 and output_dtype == tl.float16:
            f = np.ascontiguousarray(input).view(np.float32)
            return f.astype(np.float16).view(np.uint16).reshape(np.shape(input))
        if input_dtype == tl.float32 and output_dtype == tl.float8e4nv:
            f = torch.from_numpy(np.ascontiguousarray(input).view(np.float32).copy())
            f = torch.where(torch.isnan(f), f, f.clamp(-448.0, 448.0))
            return f.to(torch.float8_e4m3fn).view(torch.uint8).numpy().reshape(np.shape(input))
        return orig(input, input_dtype, output_dtype, rounding_mode)

    convert._rtne_fp16_fp8_shim = True
    return convert


@pytest.fixture(scope="module")
def interpreter_fp16_fp8_rtne(interpreter_bf16_rtne):
    """Make the Triton interpreter round fp32 -> fp16 / fp8 e4m3 to nearest even (module scope;
    the previous converter is restored after the module)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        yield
        return
    from triton.runtime import interpreter

    orig = interpreter._convert_float
    if not getattr(orig, "_rtne_fp16_fp8_shim", False):
        interpreter._convert_float = _rtne_fp16_fp8_convert(orig)
    yield
    interpreter._convert_float = orig


class LaunchSpy:
    """Stands in for a Triton kernel in its launcher's module: records each launch's grid and
    constexpr (upper-case) keywords in ``launches``, then launches the kernel."""

    def __init__(self, kern):
        self.kern, self.launches = kern, []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.launches.append((tuple(grid), {k: v for k, v in kw.items() if k.isupper()}))
            return self.kern[grid](*args, **kw)

        return launch


@pytest.fixture
def launch_spy(monkeypatch):
    """``launch_spy(module, name)``: replace the kernel ``module.name`` by a ``LaunchSpy`` for the
    test and return it."""

    def spy(module, name: str) -> LaunchSpy:
        s = LaunchSpy(getattr(module, name))
        monkeypatch.setattr(module, name, s)
        return s

    return spy
