"""sglang-replayssm: ReplaySSM decode for hybrid SSM/attention models, as an SGLang plug-in.

SGLang finds ``register`` through the entry point ``replayssm`` in the group
``sglang.srt.plugins`` and calls it in every process that loads plug-ins (the CLI, the Engine, every
scheduler / TP worker).  Importing this package changes nothing.
"""

from __future__ import annotations

import logging

__all__ = ["__version__", "register"]

__version__ = "0.1.0.dev0"

logger = logging.getLogger(__name__)


def register() -> None:
    """Install the plug-in's verified hooks for the configuration in ``SGLANG_REPLAYSSM_CONFIG``.

    Cheap and idempotent: hooks already in effect are skipped.  Every failure stops the process
    (``ReplaySSMStartupError``, a ``SystemExit``), because SGLang's ``load_plugins()`` catches
    ``Exception`` from plug-ins and would otherwise start stock.

    Raises
    ------
    ReplaySSMStartupError
        On an invalid configuration, an unsupported SGLang, a changed target, a hook that did not
        take effect, or any unexpected error while installing.
    """
    from sglang_replayssm.config import ENV_VAR, ReplaySSMConfig
    from sglang_replayssm.errors import ReplaySSMStartupError

    try:
        config = ReplaySSMConfig.from_env()
    except ValueError as exc:
        raise ReplaySSMStartupError(str(exc)) from None
    ignored = config.ignored_fields()
    if ignored:
        logger.warning(
            "sglang-replayssm: %s sets %s, which backend %r ignores (SGLang's own kernels run); add "
            '"backend": "replay" to it or unset it', ENV_VAR,
            ", ".join(f"{name}={value!r}" for name, value in ignored.items()), config.backend,
        )
    try:
        from sglang_replayssm import patching

        patching.install(config)
    except Exception as exc:
        logger.exception("sglang-replayssm: registration failed")
        raise ReplaySSMStartupError(f"registration failed: {type(exc).__name__}: {exc} (traceback logged above)") from exc
