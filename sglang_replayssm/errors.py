"""The one error the plug-in raises to stop a server from starting."""

from __future__ import annotations

__all__ = ["ReplaySSMStartupError"]


class ReplaySSMStartupError(SystemExit):
    """Refusal to start: SGLang would otherwise run without (or with half of) the plug-in.

    It subclasses ``SystemExit``, not ``Exception``, on purpose: SGLang's ``load_plugins()`` logs and
    swallows every ``Exception`` raised by a plug-in and then starts stock, which would turn a failed
    or unverified hook into a silently different server.  ``SystemExit`` passes through it, ends the
    process with exit status 1 and prints the message (and only the message) on stderr.

    Parameters
    ----------
    message : str
        What is wrong and what to do; the prefix ``"sglang-replayssm: "`` is added.
    """

    def __init__(self, message: str) -> None:
        super().__init__(f"sglang-replayssm: {message}")
