"""Version gate, target fingerprints and verified hook installation.  Fails closed.

``install(config)`` is the only way the plug-in changes SGLang.  In order, it

1. refuses any SGLang whose version has no fingerprint file ``patches/targets/sglang-<version>.json``
   (shipped inside the package as ``sglang_replayssm._targets``);
2. selects the hooks of ``hooks.HOOK_MODULES`` that this configuration needs (``when="always"``, plus
   ``when="replay"`` for ``--ssm-backend replay``);
3. compares every target that is not hooked yet with its pinned fingerprint (kind, signature and a
   SHA-256 of its source) and refuses to start if any differs: a hook written against other code
   is not run unverified;
4. registers the hooks with SGLang's ``HookRegistry``, calls ``HookRegistry.apply_hooks()`` and
   checks that each hook is now in its target's wrapper chain (or is the target, for a class
   REPLACE).  SGLang itself only logs a hook that failed to apply and a hook registered too late
   is dropped silently; both stop the start here.

Every refusal is a ``ReplaySSMStartupError`` (a ``SystemExit``) whose message names the target and
what differs.  Version-specific knowledge lives only in the fingerprint files: supporting another
SGLang release is adding its file (after reviewing every hook against it) with::

    python -m sglang_replayssm.patching --write-targets

run against that release.  The command writes the fingerprints of the installed SGLang, for every
target of every hook module, into the package's target folder (``patches/targets/`` in a checkout).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.resources
import inspect
import json
import logging
import pkgutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import sglang
from sglang.srt.plugins.hook_registry import HookRegistry, HookType, _wrap_fn

from sglang_replayssm import __version__
from sglang_replayssm.config import ReplaySSMConfig
from sglang_replayssm.errors import ReplaySSMStartupError
from sglang_replayssm.hooks import HOOK_MODULES, HookSpec

__all__ = [
    "all_hooks",
    "check_version",
    "fingerprint",
    "in_effect",
    "install",
    "pinned_fingerprints",
    "pinned_targets",
    "resolve_target",
    "select_hooks",
    "supported_versions",
    "unwrap_hooks",
    "write_targets",
]

logger = logging.getLogger(__name__)

TARGETS_PACKAGE = "sglang_replayssm._targets"
REGENERATE = "python -m sglang_replayssm.patching --write-targets"
FINGERPRINT_KEYS: tuple[str, ...] = ("kind", "signature", "source_sha256")

def _identity(*args: Any, **kwargs: Any) -> Any:
    return args, kwargs


# HookRegistry wraps a hooked function in one of four closures (one per hook type), each with
# ``__wrapped__`` set.  Their code objects identify those wrappers and nothing else.
_WRAPPER_CODES = frozenset(_wrap_fn(_identity, _identity, hook_type).__code__ for hook_type in HookType)


def _targets_dir() -> Path:
    return Path(str(importlib.resources.files(TARGETS_PACKAGE)))


def supported_versions() -> tuple[str, ...]:
    """Return the SGLang versions that have a fingerprint file, sorted.

    Returns
    -------
    tuple of str
        E.g. ``("0.5.17",)`` for ``patches/targets/sglang-0.5.17.json``.
    """
    names = (path.name for path in _targets_dir().glob("sglang-*.json"))
    return tuple(sorted(name.removeprefix("sglang-").removesuffix(".json") for name in names))


def pinned_fingerprints(version: str) -> dict[str, dict[str, str | None]]:
    """Return the pinned fingerprints of one SGLang version, keyed by target dotted path.

    Parameters
    ----------
    version : str
        An entry of ``supported_versions()``.

    Returns
    -------
    dict
        ``{target: {"kind": ..., "signature": ..., "source_sha256": ...}}``.
    """
    return json.loads((_targets_dir() / f"sglang-{version}.json").read_text())["targets"]


def check_version() -> str:
    """Return the installed SGLang version, or refuse to start if it has no fingerprint file.

    Returns
    -------
    str
        ``sglang.__version__``.

    Raises
    ------
    ReplaySSMStartupError
        Naming the installed and the supported versions.
    """
    version = sglang.__version__
    supported = supported_versions()
    if version not in supported:
        versions = ", ".join(supported) or "no version (its fingerprint files are missing)"
        raise ReplaySSMStartupError(
            f"SGLang {version} is not supported: sglang-replayssm {__version__} supports SGLang {versions} "
            "only (patches/targets/sglang-<version>.json). Install a supported SGLang, or leave this "
            "plug-in out by setting SGLANG_PLUGINS to a comma-separated list of plug-in names without "
            "'replayssm'."
        )
    return version


def all_hooks() -> list[HookSpec]:
    """Return the ``HOOKS`` of every module in ``hooks.HOOK_MODULES``, in order."""
    return [spec for name in HOOK_MODULES for spec in importlib.import_module(f"sglang_replayssm.hooks.{name}").HOOKS]


def pinned_targets(specs: Iterable[HookSpec]) -> list[str]:
    """Every path a set of hooks has pinned: each target, then its ``callers``, in order, once each."""
    return list(dict.fromkeys(path for spec in specs for path in (spec.target, *spec.callers)))


def select_hooks(specs: Iterable[HookSpec], config: ReplaySSMConfig) -> list[HookSpec]:
    """Return the hooks a configuration installs.

    Parameters
    ----------
    specs : iterable of HookSpec
    config : ReplaySSMConfig

    Returns
    -------
    list of HookSpec
        ``when="always"`` hooks, plus ``when="replay"`` hooks if ``config.backend == "replay"``.
    """
    return [spec for spec in specs if spec.when == "always" or config.backend == "replay"]


def resolve_target(target: str) -> tuple[Any, str, Any]:
    """Resolve a hook target the way ``HookRegistry`` does.

    Parameters
    ----------
    target : str
        Dotted path ``owner.attr``; ``owner`` is resolved with ``pkgutil.resolve_name`` (importing
        its module).

    Returns
    -------
    owner : object
        Module or class holding the target.
    attr : str
        Attribute name of the target in ``owner``.
    raw : object
        The attribute as stored: for a class ``owner`` its own ``__dict__`` entry (a
        ``classmethod`` / ``staticmethod`` object stays one), else ``getattr(owner, attr)``.
    """
    owner_path, attr = target.rsplit(".", 1)
    owner = pkgutil.resolve_name(owner_path)
    if isinstance(owner, type) and attr in vars(owner):
        return owner, attr, vars(owner)[attr]
    return owner, attr, getattr(owner, attr)


def unwrap_hooks(obj: Any) -> Any:
    """Strip the wrappers ``HookRegistry`` put around a function, leaving SGLang's own object.

    Only ``HookRegistry``'s wrappers are removed; SGLang's own decorators stay.

    Parameters
    ----------
    obj : object
        A function (not a ``classmethod`` / ``staticmethod`` object), or anything else.

    Returns
    -------
    object
        The innermost object that is not a ``HookRegistry`` wrapper.
    """
    while getattr(obj, "__code__", None) in _WRAPPER_CODES:
        obj = obj.__wrapped__
    return obj


def fingerprint(target: str) -> dict[str, str | None]:
    """Fingerprint a target as it is now, ignoring ``HookRegistry`` wrappers.

    Parameters
    ----------
    target : str
        Dotted path, as in ``HookSpec.target``.

    Returns
    -------
    dict
        ``kind`` (``"function"``, ``"classmethod"``, ``"staticmethod"`` or ``"class"``),
        ``signature`` (``str(inspect.signature(...))``, ``None`` where it has none) and
        ``source_sha256`` (of ``inspect.getsource(...)``, ``None`` without a source file).
    """
    _owner, _attr, raw = resolve_target(target)
    if isinstance(raw, (classmethod, staticmethod)):
        kind, obj = type(raw).__name__, raw.__func__
    else:
        kind, obj = ("class" if isinstance(raw, type) else "function"), raw
    obj = unwrap_hooks(obj)
    try:
        # follow_wrapped=False / the code object: a ``functools.wraps`` wrapper that anything but
        # HookRegistry put there (another plug-in, a shim) is a change, not the stock target
        signature: str | None = str(inspect.signature(obj, follow_wrapped=False))
    except (TypeError, ValueError):
        signature = None
    try:
        source_sha256: str | None = hashlib.sha256(_source(obj).encode()).hexdigest()
    except (OSError, TypeError):  # no source file (e.g. defined in `python -c`)
        source_sha256 = None
    return {"kind": kind, "signature": signature, "source_sha256": source_sha256}


def _source(obj: object) -> str:
    """The source a fingerprint hashes: a function's own code (not what ``__wrapped__`` leads to); a
    class's body and the bodies of the SGLang classes it inherits from (a class REPLACE overrides
    and calls into its bases, whose changes must show too)."""
    if isinstance(obj, type):
        bases = [c for c in obj.__mro__ if c.__module__.split(".")[0] == "sglang"]
        return "".join(inspect.getsource(c) for c in (bases or [obj]))
    return inspect.getsource(getattr(obj, "__code__", obj))


def _differences(expected: dict[str, str | None], found: dict[str, str | None]) -> list[str]:
    # a target without source cannot be compared: never counted as unchanged
    return [
        f"{key} expected {expected.get(key)!r}, found {found[key]!r}"
        for key in FINGERPRINT_KEYS
        if expected.get(key) != found[key] or (key == "source_sha256" and found[key] is None)
    ]


def _check_fingerprints(specs: Sequence[HookSpec], version: str) -> None:
    pinned = pinned_fingerprints(version)
    problems = []
    for target in pinned_targets(specs):
        if target not in pinned:
            problems.append(f"{target}: no fingerprint pinned; review the target, then run {REGENERATE}")
            continue
        try:
            found = fingerprint(target)
        except (ImportError, AttributeError, ValueError, TypeError, OSError) as exc:
            problems.append(f"{target}: cannot be resolved ({type(exc).__name__}: {exc})")
            continue
        differences = _differences(pinned[target], found)
        if differences:
            problems.append(f"{target}: {'; '.join(differences)}")
    if problems:
        raise ReplaySSMStartupError(
            f"SGLang {version} differs from the targets pinned in patches/targets/sglang-{version}.json, "
            "so the hooks written against them are not verified; refusing to start.\n"
            + "".join(f"  - {problem}\n" for problem in problems)
            + f"If the change is intended, review each hook against the new source and run {REGENERATE}."
        )


def in_effect(spec: HookSpec) -> bool:
    """Tell whether a hook is installed: SGLang marked its target patched and the hook is reachable.

    Parameters
    ----------
    spec : HookSpec

    Returns
    -------
    bool
        For a class REPLACE, whether the target now *is* ``spec.hook``; otherwise whether
        ``spec.hook`` is held by one of the ``HookRegistry`` wrappers now stored at the target.
    """
    if spec.target not in HookRegistry._patched:
        return False
    _owner, _attr, raw = resolve_target(spec.target)
    if isinstance(spec.hook, type):
        return raw is spec.hook
    obj = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
    while getattr(obj, "__code__", None) in _WRAPPER_CODES:
        if any(cell.cell_contents is spec.hook for cell in obj.__closure__):
            return True
        obj = obj.__wrapped__
    return False


def _describe(spec: HookSpec) -> str:
    name = getattr(spec.hook, "__qualname__", repr(spec.hook))
    return f"{spec.hook_type} hook {spec.hook.__module__}.{name} on {spec.target}"


def _refuse_installed_replay_hooks(specs: Sequence[HookSpec], config: ReplaySSMConfig) -> None:
    # Hooks cannot be taken back out, so a process whose plug-ins loaded with backend "replay"
    # (from SGLANG_REPLAYSSM_CONFIG) must not go on as "default" (an explicit --ssm-backend default).
    if config.backend == "replay":
        return
    installed = [spec.target for spec in specs if spec.when == "replay" and in_effect(spec)]
    if installed:
        raise ReplaySSMStartupError(
            f"--ssm-backend {config.backend} conflicts with the replay hooks this process already installed "
            f"because SGLANG_REPLAYSSM_CONFIG selected backend 'replay' when plug-ins loaded ({', '.join(installed)}). "
            "Unset SGLANG_REPLAYSSM_CONFIG, or pass --ssm-backend replay."
        )


def install(config: ReplaySSMConfig) -> None:
    """Install, verified, the hooks a configuration needs; idempotent.

    Called by ``register()`` (configuration from the environment) in every process that loads
    SGLang plug-ins, and again when the command line is parsed.  Hooks already in effect are left
    alone, so a second call only adds what the configuration newly needs.

    Parameters
    ----------
    config : ReplaySSMConfig

    Raises
    ------
    ReplaySSMStartupError
        On an unsupported SGLang version, a target whose fingerprint differs, a hook SGLang did
        not apply, or ``backend="default"`` in a process that already installed the replay hooks.
    """
    version = check_version()
    hooks = all_hooks()
    _refuse_installed_replay_hooks(hooks, config)
    specs = select_hooks(hooks, config)
    pending = [spec for spec in specs if not in_effect(spec)]
    if not pending:
        return
    _check_fingerprints(pending, version)
    ours = {id(spec.hook) for spec in hooks}
    for spec in pending:
        if spec.target in HookRegistry._patched:
            raise ReplaySSMStartupError(
                f"{_describe(spec)} cannot be installed: the target was already patched, and SGLang's "
                "HookRegistry ignores hooks registered after their target is patched (another plug-in, "
                "or a second round of this one, hooked it first)."
            )
        foreign = [(hook_type, hook, source) for hook_type, hook, source in HookRegistry._hooks.get(spec.target, ())
                   if id(hook) not in ours]
        if foreign:
            names = ", ".join(f"{getattr(t, 'value', t)} {getattr(h, '__module__', '?')}."
                              f"{getattr(h, '__qualname__', repr(h))}"
                              f" ({getattr(src, 'plugin_name', 'unknown source')})" for t, h, src in foreign)
            raise ReplaySSMStartupError(
                f"{_describe(spec)} cannot be installed: another hook is registered on the same target ({names}); "
                "ours would be applied on top of it and the pinned fingerprint would not describe what runs. "
                "Select only this plug-in (SGLANG_PLUGINS=replayssm) or remove the other hook."
            )
    for spec in pending:
        HookRegistry.register(spec.target, spec.hook, HookType(spec.hook_type))
    HookRegistry.apply_hooks()
    for spec in pending:
        if spec.target not in HookRegistry._patched:
            raise ReplaySSMStartupError(
                f"{_describe(spec)} did not take effect: SGLang's HookRegistry failed to apply it "
                f"(see the log line 'Failed to apply hooks to {spec.target}' above)."
            )
        if not in_effect(spec):
            raise ReplaySSMStartupError(
                f"{_describe(spec)} did not take effect: the target is marked patched but the hook is not "
                f"in what is stored there now ({resolve_target(spec.target)[2]!r})."
            )
    logger.info(
        "sglang-replayssm %s: %d hook(s) installed and verified on SGLang %s (%s)",
        __version__,
        len(pending),
        version,
        config,
    )


def write_targets(directory: Path | None = None) -> Path:
    """Write the fingerprints of every hook target of the installed SGLang.

    Parameters
    ----------
    directory : Path, optional
        Defaults to the package's target folder (``patches/targets/`` in an editable checkout).

    Returns
    -------
    Path
        The written ``sglang-<version>.json``.
    """
    version = sglang.__version__
    targets = {target: fingerprint(target) for target in sorted(pinned_targets(all_hooks()))}
    unpinnable = [target for target, found in targets.items() if found["source_sha256"] is None]
    if unpinnable:
        raise ValueError(f"write_targets: no source for {unpinnable} (a .pyc-only install?); a pin without "
                         "source would accept any change: install SGLang with its sources")
    document = {"sglang": version, "generated_by": REGENERATE, "targets": targets}
    path = (directory or _targets_dir()) / f"sglang-{version}.json"
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m sglang_replayssm.patching --write-targets [--dir DIR]``."""
    parser = argparse.ArgumentParser(prog="python -m sglang_replayssm.patching", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--write-targets",
        action="store_true",
        required=True,
        help="write patches/targets/sglang-<installed version>.json from the installed SGLang",
    )
    parser.add_argument("--dir", type=Path, default=None, help="write into DIR instead of the package's target folder")
    args = parser.parse_args(argv)
    print(write_targets(args.dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
