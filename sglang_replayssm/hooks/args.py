"""The plug-in's server flags, ``--ssm-backend``, ``--replayssm-window``, ``--replayssm-verify`` and
``--replayssm-read-dtype``.

SGLang's ``ServerArgs`` is a dataclass that a plug-in cannot add fields to, and
``ServerArgs.from_cli_args`` keeps only its own fields.  So the flags live beside it:

- an AFTER hook on ``ServerArgs.add_cli_args`` adds them to every SGLang server parser
  (``python -m sglang.launch_server``, ``sglang serve``, SGLang's benchmark parsers);
- an AROUND hook on ``ServerArgs.from_cli_args`` turns them into a ``ReplaySSMConfig``, exports it
  to ``SGLANG_REPLAYSSM_CONFIG`` (inherited by every process SGLang spawns), installs what that
  configuration needs in this process (``patching.install``), then calls SGLang's own
  ``from_cli_args`` with the arguments untouched.

Precedence: an explicit flag, then ``SGLANG_REPLAYSSM_CONFIG`` (the flags' defaults are read from
it), then ``ReplaySSMConfig``'s defaults.  Both hooks are ``when="always"``: the flags exist in every
server, and ``--ssm-backend default`` changes nothing else.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from sglang_replayssm import patching
from sglang_replayssm.config import BACKENDS, FLAGS, READ_DTYPES, VERIFY_MODES, ReplaySSMConfig
from sglang_replayssm.errors import ReplaySSMStartupError
from sglang_replayssm.hooks import HookSpec

__all__ = ["HOOKS", "add_flags", "config_from_namespace", "take_config"]

SERVER_ARGS = "sglang.srt.server_args.ServerArgs"


def _env_config() -> ReplaySSMConfig:
    try:
        return ReplaySSMConfig.from_env()
    except ValueError as exc:
        raise ReplaySSMStartupError(str(exc)) from None


def _window(text: str) -> int:
    try:
        return ReplaySSMConfig(window=int(text)).window
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None


def add_flags(result: None, parser: argparse.ArgumentParser) -> None:
    """AFTER hook on the staticmethod ``ServerArgs.add_cli_args(parser)``: add the flags.

    Parameters
    ----------
    result : None
        What ``add_cli_args`` returned.
    parser : argparse.ArgumentParser
        The server parser, extended in place.
    """
    defaults = _env_config()
    group = parser.add_argument_group(
        "ReplaySSM (sglang-replayssm plug-in)",
        "Decode for hybrid SSM/attention models (Mamba-2, Gated DeltaNet) from a recurrent-state "
        "checkpoint plus a ring of recent inputs, instead of rewriting the state every step.",
    )
    group.add_argument(
        "--ssm-backend",
        choices=BACKENDS,
        default=defaults.backend,
        help="How the SSM layers keep their recurrent state. 'default': SGLang's own kernels, "
        "unchanged. 'replay': ReplaySSM (Mamba-2 and Gated DeltaNet hybrids). "
        "Default: %(default)s.",
    )
    group.add_argument(
        "--replayssm-window",
        type=_window,
        default=defaults.window,
        metavar="L",
        help="ReplaySSM ring window: the state checkpoint is rewritten once every L decode steps "
        "(L >= 1; L = 1 is the conventional update). Needs --ssm-backend replay (given with "
        "--ssm-backend default, it is refused). Default: %(default)s.",
    )
    group.add_argument(
        "--replayssm-verify",
        choices=VERIFY_MODES,
        default=defaults.verify,
        help="Speculative verify path with --ssm-backend replay. 'auto': per CUDA-graph batch bucket, replay "
        "verify where SGLang's snapshot verify is memory-bandwidth-bound and replay is faster, else snapshot. "
        "On a GPU a short start-up probe times both paths on the server's own pool; the decisions are cached "
        "per GPU, model shape, draft length and code version ($SGLANG_REPLAYSSM_VERIFY_CACHE, default "
        "~/.cache/sglang_replayssm/verify_decisions.json), so a restart re-uses them without probing; a CPU "
        "decides from a byte model. One log line per bucket says which path and why. Tree drafts "
        "(--speculative-eagle-topk > 1) always use snapshot. 'replay' / 'snapshot' force one path. Needs "
        "--ssm-backend replay (given with --ssm-backend default, it is refused). Default: %(default)s.",
    )
    group.add_argument(
        "--replayssm-read-dtype",
        choices=READ_DTYPES,
        default=defaults.read_dtype,
        help="Split precision with --ssm-backend replay: keep a read copy of each SSM state checkpoint in "
        "this dtype ('fp8': e4m3 with one scale per state row), refreshed from the checkpoint at every "
        "flush and prefill; decode and speculative verify read the copy, the recurrence keeps the "
        "checkpoint's precision. Costs the copy's bytes per mamba slot. The copy must be narrower than the "
        "checkpoint (--mamba-ssm-dtype; fp8 always is). 'same': no copy. Default: %(default)s.",
    )


def config_from_namespace(args: argparse.Namespace) -> ReplaySSMConfig | None:
    """Return the configuration parsed by the flags, or ``None`` if ``args`` has no such flags.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed by a parser that ``ServerArgs.add_cli_args`` filled, or built by hand.

    Returns
    -------
    ReplaySSMConfig or None
        ``None`` when ``args`` carries neither flag (a parser built before the plug-in was loaded).

    Raises
    ------
    ReplaySSMStartupError
        When only one of the two flags is present, a value is invalid, or a replay-only flag was given
        (a value other than the environment's) with ``--ssm-backend default``.
    """
    present = [hasattr(args, "ssm_backend"), hasattr(args, "replayssm_window")]
    if not any(present):
        return None
    if not all(present):
        raise ReplaySSMStartupError(
            f"expected both ssm_backend and replayssm_window in the parsed arguments, got only "
            f"{'ssm_backend' if present[0] else 'replayssm_window'}"
        )
    env = _env_config()
    try:
        config = ReplaySSMConfig(
            backend=args.ssm_backend,
            window=args.replayssm_window,
            # absent from a namespace built by hand before this flag existed: keep the env/default
            verify=getattr(args, "replayssm_verify", None) or env.verify,
            read_dtype=getattr(args, "replayssm_read_dtype", None) or env.read_dtype,
        )
    except ValueError as exc:
        raise ReplaySSMStartupError(str(exc)) from None
    # A value equal to the environment's is the flag's default (register() warned about it); one that
    # differs was given on the command line, where --ssm-backend default would ignore it silently.
    given = {name: value for name, value in config.ignored_fields().items() if value != getattr(env, name)}
    if given:
        flags = " ".join(f"{FLAGS[name]} {value}" for name, value in given.items())
        raise ReplaySSMStartupError(
            f"{flags}: expected --ssm-backend replay with {'this flag' if len(given) == 1 else 'these flags'}, got "
            f"--ssm-backend {config.backend} (SGLang's own kernels would ignore "
            f"{'it' if len(given) == 1 else 'them'}); add --ssm-backend replay or drop {flags}"
        )
    return config


def take_config(original: Callable[..., Any], cls: type, args: argparse.Namespace) -> Any:
    """AROUND hook on the classmethod ``ServerArgs.from_cli_args(args)``.

    Parameters
    ----------
    original : callable
        SGLang's ``from_cli_args`` function (unbound; called as ``original(cls, args)``).
    cls : type
        ``ServerArgs`` or a subclass.
    args : argparse.Namespace
        Parsed command line, passed on unchanged.

    Returns
    -------
    ServerArgs
        Exactly what SGLang's ``from_cli_args`` returns.

    Raises
    ------
    ReplaySSMStartupError
        When the configuration is refused (see ``patching.install``).
    """
    config = config_from_namespace(args)
    if config is not None:
        config.export()
        patching.install(config)
    return original(cls, args)


HOOKS: list[HookSpec] = [
    HookSpec(target=f"{SERVER_ARGS}.add_cli_args", hook=add_flags, hook_type="after", when="always"),
    HookSpec(target=f"{SERVER_ARGS}.from_cli_args", hook=take_config, hook_type="around", when="always"),
]
