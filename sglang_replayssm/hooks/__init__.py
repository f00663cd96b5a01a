"""Every hook the plug-in installs into SGLang, one module per concern.

Each module in ``HOOK_MODULES`` exports ``HOOKS: list[HookSpec]``.  ``sglang_replayssm.patching``
collects them, checks each target's fingerprint against ``patches/targets/sglang-<version>.json``,
registers them with SGLang's ``HookRegistry`` and verifies that each took effect.  The manifest
(why, how, removal condition) is ``patches/README.md``; keep it in step with ``HOOKS``.

Adding a hook module ``<name>.py``: export ``HOOKS``, append ``"<name>"`` to ``HOOK_MODULES``, add
its targets to ``patches/README.md``, then regenerate the fingerprints with
``python -m sglang_replayssm.patching --write-targets`` (review the diff of
``patches/targets/sglang-<version>.json``).  Rules that ``HookRegistry`` imposes:

- all hooks on one target must be installed in the same round: a hook registered after its target
  was patched is ignored by SGLang (``patching`` refuses to start instead), so do not put an
  ``"always"`` and a ``"replay"`` hook on the same target;
- a class can only be replaced (``hook_type="replace"``), by a subclass of the original.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

__all__ = ["HookSpec", "HOOK_MODULES", "HOOK_TYPES", "WHENS"]

HOOK_TYPES: tuple[str, ...] = ("before", "after", "around", "replace")
WHENS: tuple[str, ...] = ("always", "replay")


@dataclasses.dataclass(frozen=True, kw_only=True)
class HookSpec:
    """One hook on one SGLang target.

    Attributes
    ----------
    target : str
        Dotted path resolved by ``pkgutil.resolve_name`` (``module:attr`` or ``module.attr``).
    hook : callable or type
        The hook function, or the replacement class for a class REPLACE.
    hook_type : str
        ``"before"``, ``"after"``, ``"around"`` or ``"replace"`` (SGLang's ``HookType`` names).
    when : str
        ``"always"``: installed in every process that loads plug-ins (e.g. the CLI flags), or
        ``"replay"``: installed only when ``--ssm-backend replay`` is configured, so
        ``--ssm-backend default`` leaves SGLang untouched.
    callers : tuple of str
        Dotted paths of the SGLang functions whose call of ``target`` is what runs the hook (where
        nothing at run time notices a hook that is never reached): pinned and checked like the
        target, so a release that stops calling it does not pass unnoticed.
    """

    target: str
    hook: Callable[..., Any] | type
    hook_type: str
    when: str = "replay"
    callers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.hook_type not in HOOK_TYPES:
            raise ValueError(f"HookSpec {self.target}: hook_type expected one of {HOOK_TYPES}, got {self.hook_type!r}")
        if self.when not in WHENS:
            raise ValueError(f"HookSpec {self.target}: when expected one of {WHENS}, got {self.when!r}")
        if isinstance(self.hook, type) and self.hook_type != "replace":
            raise ValueError(f"HookSpec {self.target}: a class hook needs hook_type 'replace', got {self.hook_type!r}")


# Module names (relative to this package) whose HOOKS are installed, in order.
HOOK_MODULES: tuple[str, ...] = ("args", "pool", "backends", "cpu", "cpu_spec", "radix", "spec")
