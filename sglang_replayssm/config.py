"""The one ReplaySSM configuration of a server, and how every process of that server reads it.

The command line (``--ssm-backend``, ``--replayssm-window``, ``--replayssm-verify``,
``--replayssm-read-dtype``; see ``hooks/args.py``) or the user sets
one environment variable, ``SGLANG_REPLAYSSM_CONFIG``, holding this configuration as JSON.  SGLang
spawns its scheduler and TP worker processes with the ``spawn`` start method; they inherit the
environment (the pickled ``ServerArgs`` carries SGLang's own fields only), and the plug-in's
``register()`` reads the variable again in each of them.  So ``ReplaySSMConfig.from_env()`` gives
the same answer in every process of one server.

| variable | value | unset |
|---|---|---|
| ``SGLANG_REPLAYSSM_CONFIG`` | JSON object with any of the keys ``backend``, ``window``, ``verify``, ``read_dtype`` | ``ReplaySSMConfig()`` |

Example: ``SGLANG_REPLAYSSM_CONFIG='{"backend": "replay", "window": 8}'`` (the way to configure an
in-process ``sglang.Engine(**kwargs)``, which has no command line).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, MutableMapping
from typing import Self

__all__ = ["BACKENDS", "ENV_VAR", "FLAGS", "READ_DTYPES", "VERIFY_MODES", "ReplaySSMConfig"]

ENV_VAR = "SGLANG_REPLAYSSM_CONFIG"
BACKENDS: tuple[str, ...] = ("default", "replay")
VERIFY_MODES: tuple[str, ...] = ("auto", "replay", "snapshot")
READ_DTYPES: tuple[str, ...] = ("same", "bf16", "fp16", "fp8")
#: The replay-only fields and their command-line flags.
FLAGS: dict[str, str] = {"window": "--replayssm-window", "verify": "--replayssm-verify",
                         "read_dtype": "--replayssm-read-dtype"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplaySSMConfig:
    """How the hybrid SSM layers of a server keep their recurrent state.

    Attributes
    ----------
    backend : str
        ``"default"``: SGLang's own kernels; the plug-in changes nothing but its two flags.
        ``"replay"``: ReplaySSM, a checkpoint plus a ring of the last ``window`` inputs per state slot.
    window : int
        Ring window ``L >= 1``: decode flushes the ring into the checkpoint every ``L`` steps.
        ``L = 1`` is the conventional update.  Ignored by ``backend="default"`` (``ignored_fields``).
    verify : str
        Speculative verify path: ``"auto"`` (per batch bucket and draft length, ``heuristic.py``),
        ``"replay"`` or ``"snapshot"`` (SGLang's own).  Ignored without speculative decoding.
        Ignored by ``backend="default"``.
    read_dtype : str
        Split precision: ``"same"`` (decode reads the checkpoint itself) or the dtype of a read copy
        kept beside the checkpoint, ``"bf16"``, ``"fp16"`` or ``"fp8"`` (e4m3 with per-row scales),
        which non-flush decode rows read instead (``kernels/README.md``, "Split precision").
        Ignored by ``backend="default"``.

    Raises
    ------
    ValueError
        On an unknown backend, verify mode or read dtype, or a window that is not an integer ``>= 1``
        (fields that ``backend="default"`` ignores are reported by ``ignored_fields``, not refused here).
    """

    backend: str = "default"
    window: int = 16
    verify: str = "auto"
    read_dtype: str = "same"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"ssm backend: expected one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if isinstance(self.window, bool) or not isinstance(self.window, int):
            raise ValueError(
                f"replayssm window L: expected an integer >= 1, got {type(self.window).__name__} {self.window!r}"
            )
        if self.window < 1:
            raise ValueError(f"replayssm window L: expected an integer >= 1, got {self.window}")
        if self.verify not in VERIFY_MODES:
            raise ValueError(
                f"replayssm verify: expected one of {', '.join(VERIFY_MODES)}, got {self.verify!r}"
            )
        if self.read_dtype not in READ_DTYPES:
            raise ValueError(
                f"replayssm read dtype: expected one of {', '.join(READ_DTYPES)}, got {self.read_dtype!r}"
            )

    def ignored_fields(self) -> dict[str, object]:
        """The fields that ``backend="default"`` ignores and that differ from their defaults.

        Empty for ``backend="replay"``.  Not refused here: a leftover ``SGLANG_REPLAYSSM_CONFIG`` must not
        stop a stock server (``register`` warns); a flag given on the command line is refused by
        ``hooks.args.config_from_namespace``.

        Returns
        -------
        dict[str, object]
            Field name -> value, in the order window, verify, read_dtype.
        """
        if self.backend == "replay":
            return {}
        defaults = {field.name: field.default for field in dataclasses.fields(self)}
        return {name: getattr(self, name) for name in FLAGS if getattr(self, name) != defaults[name]}

    def read_torch_dtype(self):
        """The read copy's ``torch.dtype``, or ``None`` for ``read_dtype="same"`` (no copy)."""
        import torch

        return {"same": None, "bf16": torch.bfloat16, "fp16": torch.float16,
                "fp8": torch.float8_e4m3fn}[self.read_dtype]

    def needs_draft_states(self, eagle_topk: int | None) -> bool:
        """Whether SGLang's per-draft SSM snapshots (``intermediate_ssm``) can be read in this server.

        Only SGLang's snapshot verify reads them: tree drafts (``eagle_topk > 1``) and the
        ``auto`` / ``snapshot`` verify modes may take it.  With ``verify="replay"`` and linear chains
        every verify runs the replay kernels, so the buffer is neither budgeted nor kept.

        Parameters
        ----------
        eagle_topk : int or None
            ``--speculative-eagle-topk`` (``None``: no speculative decoding, treated as 1).
        """
        return self.verify != "replay" or (eagle_topk or 1) > 1

    def to_env(self) -> str:
        """Return the JSON value of ``SGLANG_REPLAYSSM_CONFIG`` for this configuration."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_env_value(cls, value: str) -> Self:
        """Parse a ``SGLANG_REPLAYSSM_CONFIG`` value.

        Parameters
        ----------
        value : str
            A JSON object with any of the keys ``backend``, ``window``, ``verify`` and ``read_dtype``; missing
            keys take their
            defaults.

        Returns
        -------
        ReplaySSMConfig

        Raises
        ------
        ValueError
            Naming the variable, when ``value`` is not such an object or a field is invalid.
        """
        try:
            fields = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{ENV_VAR}: expected a JSON object, got {value!r} ({exc})") from None
        if not isinstance(fields, dict):
            raise ValueError(f"{ENV_VAR}: expected a JSON object, got {type(fields).__name__} {value!r}")
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ValueError(f"{ENV_VAR}: expected keys among {sorted(known)}, got unknown {unknown}")
        try:
            return cls(**fields)
        except ValueError as exc:
            raise ValueError(f"{ENV_VAR}: {exc}") from None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Read the configuration of this process's server.

        Parameters
        ----------
        environ : Mapping[str, str], optional
            Defaults to ``os.environ``.  An unset or empty variable gives the defaults.

        Returns
        -------
        ReplaySSMConfig

        Raises
        ------
        ValueError
            When the variable is set to something ``from_env_value`` rejects.
        """
        value = (os.environ if environ is None else environ).get(ENV_VAR, "")
        return cls.from_env_value(value) if value else cls()

    def export(self, environ: MutableMapping[str, str] | None = None) -> None:
        """Set ``SGLANG_REPLAYSSM_CONFIG`` (in ``os.environ`` by default) for processes spawned later."""
        (os.environ if environ is None else environ)[ENV_VAR] = self.to_env()
