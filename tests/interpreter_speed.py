"""Two changes that make the Triton 3.6 interpreter cheaper in the CPU test processes, without
changing what a kernel computes.

1. **No integer-overflow sanitizer.** ``InterpreterOptions.sanitize_overflow`` (on by default)
   re-does every integer ``+``, ``-`` and ``*`` of a kernel in int64 and asserts the int32 range:
   about a third of an interpreted verify test's time. The CPU tests run shapes whose offsets are
   a few thousand elements, far from 2^31; the large-offset cases are what the GPU tests at real
   shapes and the int64-stride checks of the launchers are for.
2. **One patch of ``triton.language`` per launch.** The interpreter patches the language modules
   when a kernel starts (and restores them when it ends), and again, with the same result, at every
   call of a ``@triton.jit`` helper inside it (``inspect.getmembers`` over three modules each time):
   a sixth of the time. A helper call inside a running launch that already patched the modules the
   helper sees skips the repeat.

``apply()`` is idempotent and does nothing unless ``TRITON_INTERPRET=1`` and the interpreter has the
attributes it changes (a later Triton keeps its own behaviour); it returns what it applied.
"""

from __future__ import annotations

import dataclasses
import inspect
import os

_APPLIED: list[str] = []


def _lang_ids(fn) -> frozenset[int]:
    import triton.language as tl

    return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))


def apply() -> list[str]:
    """Apply both changes to the in-process interpreter. Returns the names of those in effect."""
    if os.environ.get("TRITON_INTERPRET") != "1" or _APPLIED:
        return list(_APPLIED)
    from triton.runtime import interpreter

    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if dataclasses.is_dataclass(options) and getattr(options, "sanitize_overflow", False):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)
        _APPLIED.append("no-overflow-sanitizer")

    original = getattr(interpreter, "_patch_lang", None)
    if callable(original) and hasattr(interpreter, "_LangPatchScope"):
        running: list[frozenset[int]] = []  # the language modules patched by the running launch

        class _LaunchScope:
            """The launch's own patch scope; restoring it ends the launch."""

            def __init__(self, scope) -> None:
                self._scope = scope

            def restore(self) -> None:
                running.pop()
                self._scope.restore()

        def patch_lang(fn):
            langs = _lang_ids(fn)
            if not running:  # a launch (helpers are only called inside one)
                scope = original(fn)
                running.append(langs)
                return _LaunchScope(scope)
            if langs <= running[-1]:  # a helper: the modules it sees are patched already
                return interpreter._LangPatchScope()
            return original(fn)

        interpreter._patch_lang = patch_lang
        _APPLIED.append("one-language-patch-per-launch")
    return list(_APPLIED)
