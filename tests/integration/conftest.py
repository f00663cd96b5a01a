"""Fixtures for tests that load the plug-in into SGLang, in this process or in a fresh one.

``stock_sglang`` gives a test an SGLang with no plug-in loaded and puts it back that way afterwards.
It is needed because ``HookRegistry.reset()`` forgets the hooks but leaves the patched functions
in place, and ``load_plugins()`` runs only once per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV_VAR = "SGLANG_REPLAYSSM_CONFIG"


def _unpropagate(patched: object, stock: object) -> None:
    """Undo HookRegistry's rebinding of module-level names (``from X import Y``) to ``patched``.

    A replacement class's own name (``ReplayMamba2AttnBackend`` in the module defining it, or
    imported by that name) is kept: only names that were the stock object's are put back.
    """
    own_name = getattr(patched, "__name__", None)
    keep = own_name if own_name != getattr(stock, "__name__", None) else None
    for module in list(sys.modules.values()):
        if not isinstance(module, types.ModuleType):
            continue
        for name, value in list(vars(module).items()):
            if value is patched and name != keep:
                try:
                    setattr(module, name, stock)
                except (AttributeError, TypeError):  # as HookRegistry: skip read-only modules
                    pass


def _restore_stock() -> None:
    """Put SGLang's own objects back at every hooked target and forget all plug-in state."""
    from sglang.srt import plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_replayssm import patching

    specs = patching.all_hooks()
    replacements = {id(spec.hook) for spec in specs if isinstance(spec.hook, type)}
    for target in sorted({spec.target for spec in specs} | HookRegistry._patched):
        owner, attr, raw = patching.resolve_target(target)
        if isinstance(raw, (classmethod, staticmethod)):
            inner = patching.unwrap_hooks(raw.__func__)
            stock = raw if inner is raw.__func__ else type(raw)(inner)
        elif isinstance(raw, type):
            # A class REPLACE hook subclasses the class it replaces.
            # A replacement may put our own mixins before SGLang's class in its bases: the stock
            # class is the first base that is not ours.
            stock = (
                next(b for b in raw.__mro__[1:] if not b.__module__.startswith("sglang_replayssm"))
                if id(raw) in replacements
                else raw
            )
        else:
            stock = patching.unwrap_hooks(raw)
        if stock is not raw:
            setattr(owner, attr, stock)
            if not isinstance(raw, (classmethod, staticmethod)):
                _unpropagate(raw, stock)
    HookRegistry.reset()
    plugins._plugins_loaded = False


@pytest.fixture
def stock_sglang() -> Iterator[None]:
    """An SGLang without the plug-in (and without ``SGLANG_REPLAYSSM_CONFIG``), restored afterwards."""
    saved = os.environ.pop(ENV_VAR, None)
    _restore_stock()
    try:
        yield
    finally:
        _restore_stock()
        os.environ.pop(ENV_VAR, None)
        if saved is not None:
            os.environ[ENV_VAR] = saved


@pytest.fixture
def run_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run a command in a fresh process from the repository root, with only this plug-in enabled.

    Returns
    -------
    callable
        ``run(argv, env=None, timeout=240)``; ``argv[0]`` is the program (``sys.executable`` for
        Python).  ``env`` entries are added to a copy of this environment without
        ``SGLANG_REPLAYSSM_CONFIG``.
    """

    def run(argv: Sequence[str], env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        full_env = {key: value for key, value in os.environ.items() if key != ENV_VAR}
        full_env.update({"SGLANG_PLUGINS": "replayssm", **(env or {})})
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, env=full_env, cwd=REPO, check=False
        )

    return run

