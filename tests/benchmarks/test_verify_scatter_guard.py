"""The verify benchmark's guard for SGLang's snapshot-commit scatter at large batches.

At batch 512, T = 8 (Nano-4B) the H200 run died with a CUDA illegal memory access. SGLang 0.5.17's
``_fused_mamba_state_scatter_with_mask_kernel`` forms ``pid_req * src_req_stride`` in int32
(the source is the ``[1, batch, T, H, P, N]`` snapshot buffer), so the offset wraps once
``(batch - 1) · T · H·P·N`` passes 2^31 - 1; the bench now reports that point as not launched
instead of faulting the process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks.shapes import NANO_4B
from benchmarks.verify_cases import INT32_MAX, scatter_offset_overflow

ENTRY = NANO_4B.H * NANO_4B.P * NANO_4B.N  # one slot's state elements


def test_guard_thresholds_nano4b():
    for T in (2, 4, 8):
        last_ok = INT32_MAX // (T * ENTRY) + 1  # largest batch whose last pid_req fits
        assert scatter_offset_overflow(last_ok, T, ENTRY) is None
        assert scatter_offset_overflow(last_ok + 1, T, ENTRY) is not None
    assert scatter_offset_overflow(512, 8, ENTRY) is not None  # the faulting H200 point
    assert scatter_offset_overflow(256, 8, ENTRY) is None  # measured there before
    assert scatter_offset_overflow(512, 4, ENTRY) is None
    assert scatter_offset_overflow(512, 2, ENTRY) is None


_SCRIPT = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sglang.kernels.ops.mamba.mamba_state_scatter_triton import (
    _fused_mamba_state_scatter_with_mask_kernel as K)

E = int(sys.argv[1])
sig = dict(src_ptr="*fp32", dst_ptr="*fp32", dst_indices_raw_ptr="*i32",
           step_indices_raw_ptr="*i32", elem_per_entry="constexpr", src_layer_stride="i64",
           src_req_stride="i32", src_step_stride="i32", dst_layer_stride="i64",
           dst_req_stride="i32", src_req_size="i32", src_step_size="i32", dst_req_size="i32",
           BLOCK_SIZE="constexpr")
k = triton.compile(ASTSource(fn=K, signature=sig, constexprs=dict(elem_per_entry=E,
                   BLOCK_SIZE=1024)), target=GPUTarget("cuda", 90, 32))
json.dump({"ttir": k.asm["ttir"]}, sys.stdout)
"""


def test_sglang_scatter_multiplies_request_offset_in_int32():
    """Compile SGLang's scatter kernel offline for sm_90a with the bench's argument types (a
    src_req_stride below 2^31 is an i32 argument): the request offset is an i32 multiply. If this
    fails, SGLang widened it and the guard can go."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(ENTRY)], env=env,
                          capture_output=True, text=True, timeout=300)
    err = proc.stderr.lower()
    if proc.returncode != 0 and "nvidia" in err and "backend" in err:
        pytest.skip(f"no NVIDIA Triton backend: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ttir = json.loads(proc.stdout)["ttir"]
    muls = [line.split("loc(")[0].strip() for line in ttir.splitlines()
            if "arith.muli" in line and "%pid_req" in line and "%src_req_stride" in line]
    assert muls and all(m.endswith(": i32") for m in muls), muls
