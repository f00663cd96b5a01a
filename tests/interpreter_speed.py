"""The Triton 3.6 interpreter without its integer-overflow sanitizer, in the CPU test processes.

``InterpreterOptions.sanitize_overflow`` (on by default) re-does every integer ``+``, ``-`` and
``*`` of a kernel in int64 and asserts the int32 range. The CPU tests run shapes whose offsets are
a few thousand elements, far from 2^31, so it cannot fire there; it only costs time: one interpreted verify test
(``test_spec_steps_vs_f64[T2-kernel]``, alone on this 2-core VM, 2026-11-30) took 81 s and 77 s with
it, 50 s and 54 s without. The kernels
form their row and slot offsets in int64 (``i_b64``, ``slot ... .to(tl.int64)``), and the GPU tests
run the real shapes. What a kernel computes does not change.

``apply()`` is idempotent and does nothing unless ``TRITON_INTERPRET=1`` and the interpreter has the
option (a later Triton keeps its own behaviour); it returns what it applied.
"""

from __future__ import annotations

import dataclasses
import os

_APPLIED: list[str] = []


def apply() -> list[str]:
    """Turn the in-process interpreter's overflow sanitizer off. Returns the names of the changes
    in effect (``["no-overflow-sanitizer"]`` on Triton 3.6 under the interpreter)."""
    if os.environ.get("TRITON_INTERPRET") != "1" or _APPLIED:
        return list(_APPLIED)
    from triton.runtime import interpreter

    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if dataclasses.is_dataclass(options) and getattr(options, "sanitize_overflow", False):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)
        _APPLIED.append("no-overflow-sanitizer")
    return list(_APPLIED)
