"""Every hook the plug-in installs into SGLang, one module per concern.

Each module in ``HOOK_MODULES`` exports ``HOOKS: list[HookSpec]``.  ``sglang_replayssm.patching``
collects them, checks each target's fingerprint against ``patches/targets/sglang-<version>.json``,
registers them with SGLang's ``HookRegistry`` and verifies that each took effect.  The manifest
(why, how, removal condition) is ``patches/README.md``; keep it in step with ``HOOKS``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

__all__ = ["HookSpec", "HOOK_MODULES"]


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
    """

    target: str
    hook: Callable[..., Any] | type
    hook_type: str
    when: str = "replay"


# Module names (relative to this package) whose HOOKS are installed, in order.
HOOK_MODULES: tuple[str, ...] = ("args",)
