"""Triton-interpreter shims for the CPU smoke run of the benchmark (``--device cpu`` only).

They exist so that the CPU run calls SGLang's kernels exactly as the GPU run does (same argument
names, shapes and layouts), which is what the smoke run is there to check. Never applied on CUDA.

1. fp32 -> bf16 / fp16 / fp8 e4m3 casts: the Triton 3.6 interpreter truncates; the GPU rounds to
   nearest even (e4m3 saturating to ±448, ``cvt.rn.satfinite``). fp16 and fp8 are the read copies
   of ``--read-dtype`` (as ``tests/kernels/conftest.py``'s split-precision shim).
2. ``torch.cpu.device`` does not exist; SGLang's wrappers enter
   ``torch.get_device_module(x.device).device(index)``.
3. SGLang's fla modules alias ``exp = tl.exp`` at module level, a builtin the interpreter refuses
   outside ``@triton.jit``: it becomes a jitted wrapper.
4. ``selective_state_update`` asks the CUDA arch whether to launch with PDL: on CPU, no.
5. (opt-in, ``gpu_sum_order=True``) ``tl.sum`` of more than 4 elements in the GPU's row-sum order
   on SGLang's GDN tile (per lane 4 elements in order, then the butterfly), as
   ``tests/kernels/conftest.py``'s ``interpreter_gpu_sum_order``: our GDN decode spells that tree
   out (``gdn_decode/_tree.py``) while SGLang's packed decode gets it from its layout, so under
   numpy's order the two folds differ in the last bits although they agree on the GPU.
6. ``tl.dot`` of bf16 operands: the Triton 3.6 interpreter multiplies their raw 16-bit patterns
   (it widens only fp8); they are widened to fp32 first (exact), then multiplied with fp32
   accumulation as the tensor cores do (the order of the sums may differ). SGLang's built-in
   GDN ReplaySSM decode rebuilds its state with such a product.
"""

from __future__ import annotations

import contextlib
import os
import sys

__all__ = ["apply"]

_applied = False


def _rtne_casts(orig):
    import numpy as np
    import triton.language as tl

    def convert(input, input_dtype, output_dtype, rounding_mode):  # noqa: A002 (interpreter API)
        if input_dtype == tl.float32 and output_dtype == tl.bfloat16:
            arr = np.ascontiguousarray(input)
            bits = arr.view(np.uint32).astype(np.uint64)
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            nan = np.isnan(arr.view(np.float32))
            rounded = np.where(nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded)
            return rounded.reshape(np.shape(input))
        if input_dtype == tl.float32 and output_dtype == tl.float16:
            f = np.ascontiguousarray(input).view(np.float32)
            return f.astype(np.float16).view(np.uint16).reshape(np.shape(input))
        if input_dtype == tl.float32 and output_dtype == tl.float8e4nv:
            import torch

            f = torch.from_numpy(np.ascontiguousarray(input).view(np.float32).copy())
            f = torch.where(torch.isnan(f), f, f.clamp(-448.0, 448.0))
            return f.to(torch.float8_e4m3fn).view(torch.uint8).numpy().reshape(np.shape(input))
        return orig(input, input_dtype, output_dtype, rounding_mode)

    convert._bench_rtne = True
    return convert


# jitted exp for fla's module-level alias (module level: the interpreter resolves ``tl`` here)
_jit_exp = None


def _make_exp():
    global _jit_exp, tl  # noqa: PLW0603 (the jitted body resolves ``tl`` in this module's globals)
    if _jit_exp is None:
        import triton
        import triton.language as tl

        @triton.jit
        def _exp(x):
            return tl.exp(x)

        _jit_exp = _exp
    return _jit_exp


def gpu_tree_sum(self, input):  # noqa: A002 (interpreter API)
    """The interpreter's ``tl.sum``, reducing in the order of a GPU row sum on SGLang's tile.

    On the GPU a ``[.., BK]`` row on the ``[1,4]`` x ``[.., BK/4]``-lane layout (and a 1-D
    ``[BK]`` norm, ``[4]`` x ``[32]``) is reduced as: each lane its 4 consecutive elements in order,
    then the BK/4 lane partials by butterfly (xor BK/8, .., 2, 1).  The interpreter's own ``tl.sum``
    is numpy's order, so SGLang's packed decode (and the verify kernel's fold, on the same tile)
    and the decode kernel's tree-form fold (``gdn_decode/_tree.py``, which spells the GPU's tree
    out) would differ in the last bits there although they agree on the GPU.  With this order
    SGLang's kernel under the interpreter computes the GPU's tree (without FMA contraction, which
    the interpreter does not do for either kernel), and the two must agree bit for bit.  Axes of 4
    or fewer elements are summed in order (one lane's chain; the tree-form fold's levels).
    """
    import numpy as np

    data = input.handle.data
    axis = self.axis
    x = data.reshape(-1) if axis is None else np.moveaxis(data, axis, -1)
    n = x.shape[-1]
    if n <= 4:
        acc = x[..., 0]
        for i in range(1, n):
            acc = acc + x[..., i]
    else:
        x = x.reshape(*x.shape[:-1], n // 4, 4)
        acc = ((x[..., 0] + x[..., 1]) + x[..., 2]) + x[..., 3]
        lanes = np.arange(n // 4)
        step = n // 8
        while step >= 1:
            acc = acc + acc[..., lanes ^ step]
            step //= 2
        acc = acc[..., 0]
    acc = np.asarray(acc, dtype=data.dtype)
    if self.keep_dims:
        acc = np.expand_dims(acc, tuple(range(data.ndim)) if axis is None else axis)
    elif axis is None:
        acc = acc.item()
    return self.to_tensor(acc, input.dtype)


def _bf16_dot(orig):
    import numpy as np
    import triton.language as tl

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype == tl.bfloat16 or b.dtype == tl.bfloat16:
            from triton.runtime.interpreter import TensorHandle

            def widen(h):
                if h.dtype != tl.bfloat16:
                    return h
                bits = np.ascontiguousarray(h.data).astype(np.uint32) << 16
                return TensorHandle(bits.view(np.float32), tl.float32)

            a, b = widen(a), widen(b)
        return orig(self, a, b, d, input_precision, max_num_imprecise_acc)

    create_dot._bench_bf16 = True
    return create_dot


def apply(sglang: bool = True, gpu_sum_order: bool = False) -> list[str]:
    """Apply the shims (idempotent; only under ``TRITON_INTERPRET=1``). Returns what was done.

    ``sglang=False`` skips the SGLang ones (and SGLang's slow import) when no peer is run.
    ``gpu_sum_order``: shim 5 (``tl.sum`` in the GPU's row-sum order).
    """
    global _applied  # noqa: PLW0603
    done: list[str] = []
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return done
    if gpu_sum_order:
        from triton.runtime import interpreter

        if interpreter.ReduceOps.sum is not gpu_tree_sum:
            interpreter.ReduceOps.sum = gpu_tree_sum
            done.append("tl.sum in the GPU's row-sum order")
    if _applied:
        return done
    import torch

    try:
        from triton.runtime import interpreter

        if not getattr(interpreter._convert_float, "_bench_rtne", False):
            interpreter._convert_float = _rtne_casts(interpreter._convert_float)
            done.append("bf16/fp16/fp8 rtne")
        builder = interpreter.InterpreterBuilder
        if not getattr(builder.create_dot, "_bench_bf16", False):
            builder.create_dot = _bf16_dot(builder.create_dot)
            done.append("bf16 tl.dot widened to fp32")
    except Exception:  # noqa: BLE001 (another Triton: leave the interpreter as it is)
        pass
    if not hasattr(torch.cpu, "device"):
        torch.cpu.device = lambda index=None: contextlib.nullcontext()
        done.append("torch.cpu.device")
    if not sglang:
        _applied = True
        return done
    try:
        import triton.language as tl

        import sglang.kernels.ops.attention.fla.fused_recurrent  # noqa: F401
        import sglang.kernels.ops.attention.fla.fused_recurrent_linear_replayssm  # noqa: F401
        import sglang.kernels.ops.mamba.triton_ops.mamba_ssm as ssm

        exp = _make_exp()
        for name, mod in list(sys.modules.items()):
            if name.startswith("sglang.kernels.ops") and getattr(mod, "exp", None) is tl.exp:
                mod.exp = exp
                done.append(f"{name}.exp")
        ssm.is_arch_support_pdl = lambda: False
        done.append("mamba_ssm.is_arch_support_pdl")
    except Exception:  # noqa: BLE001 (no SGLang here: the peers are reported unavailable)
        pass
    _applied = True
    return done
