"""ReplaySSMConfig: validation, the SGLANG_REPLAYSSM_CONFIG round trip, and the hand-over from the
command line to a spawned process (the way SGLang starts its schedulers)."""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sglang_replayssm.config import BACKENDS, ENV_VAR, ReplaySSMConfig
from sglang_replayssm.errors import ReplaySSMStartupError


def test_defaults() -> None:
    assert ReplaySSMConfig() == ReplaySSMConfig(backend="default", window=16)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"backend": "fast"}, "ssm backend: expected one of default, replay, got 'fast'"),
        ({"window": 0}, "window L: expected an integer >= 1, got 0"),
        ({"window": -3}, "window L: expected an integer >= 1, got -3"),
        ({"window": True}, "window L: expected an integer >= 1, got bool True"),
        ({"window": "8"}, "window L: expected an integer >= 1, got str '8'"),
        ({"window": 8.0}, "window L: expected an integer >= 1, got float 8.0"),
        ({"verify": "fast"}, "replayssm verify: expected one of auto, replay, snapshot, got 'fast'"),
        ({"backend": "replay", "read_dtype": "int8"},
         "replayssm read dtype: expected one of same, bf16, fp16, fp8, got 'int8'"),
    ],
)
def test_invalid_fields_are_rejected_with_expected_and_actual(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReplaySSMConfig(**fields)


@pytest.mark.parametrize(
    ("fields", "ignored"),
    [
        ({}, {}),
        ({"backend": "replay", "window": 4, "verify": "snapshot", "read_dtype": "fp8"}, {}),
        ({"window": 4}, {"window": 4}),
        ({"verify": "snapshot", "read_dtype": "bf16"}, {"verify": "snapshot", "read_dtype": "bf16"}),
        ({"window": 16, "verify": "auto"}, {}),
    ],
)
def test_ignored_fields_are_the_replay_fields_off_their_defaults(fields: dict, ignored: dict) -> None:
    assert ReplaySSMConfig(**fields).ignored_fields() == ignored


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        ReplaySSMConfig().window = 4  # type: ignore[misc]


@given(backend=st.sampled_from(BACKENDS), window=st.integers(min_value=1, max_value=2**31))
def test_env_round_trip(backend: str, window: int) -> None:
    config = ReplaySSMConfig(backend=backend, window=window)
    environ: dict[str, str] = {}
    config.export(environ)
    assert ReplaySSMConfig.from_env(environ) == config


@pytest.mark.parametrize("environ", [{}, {ENV_VAR: ""}])
def test_unset_env_gives_defaults(environ: dict[str, str]) -> None:
    assert ReplaySSMConfig.from_env(environ) == ReplaySSMConfig()


def test_partial_env_value_keeps_other_defaults() -> None:
    assert ReplaySSMConfig.from_env_value('{"backend": "replay", "window": 4}') == ReplaySSMConfig(backend="replay",
                                                                                                 window=4)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{oops", "expected a JSON object, got '{oops'"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"L": 3}', r"expected keys among \['backend', 'read_dtype', 'verify', 'window'\], got unknown \['L'\]"),
        ('{"window": 0}', "window L: expected an integer >= 1, got 0"),
    ],
)
def test_bad_env_values_name_the_variable(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        ReplaySSMConfig.from_env_value(value)
    assert str(info.value).startswith(f"{ENV_VAR}: ")


def _server_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser


def test_cli_config_reaches_a_spawned_child(stock_sglang: None) -> None:
    """`--ssm-backend replay --replayssm-window 8` is exported before anything else happens; a
    process started with the spawn method (as SGLang starts its schedulers) reads the same config.
    (Resolving ``ServerArgs`` then fails on the fake model path "m"; only the hand-over matters.)"""
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import ServerArgs

    load_plugins()
    args = _server_parser().parse_args(["--model-path", "m", "--ssm-backend", "replay", "--replayssm-window", "8"])
    with pytest.raises(Exception):  # noqa: B017 -- "m" is no model; any SGLang error will do
        ServerArgs.from_cli_args(args)
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        child_config = pool.submit(ReplaySSMConfig.from_env).result(timeout=120)
    assert child_config == ReplaySSMConfig(backend="replay", window=8)


def test_window_below_one_is_a_usage_error(stock_sglang: None, capsys: pytest.CaptureFixture[str]) -> None:
    from sglang.srt.plugins import load_plugins

    load_plugins()
    with pytest.raises(SystemExit) as info:
        _server_parser().parse_args(["--model-path", "m", "--replayssm-window", "0"])
    assert info.value.code == 2
    assert "argument --replayssm-window: expected an integer >= 1, got '0'" in capsys.readouterr().err


def test_env_value_is_the_flags_default(stock_sglang: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.plugins import load_plugins

    from sglang_replayssm.hooks.args import config_from_namespace

    load_plugins()
    monkeypatch.setenv(ENV_VAR, '{"backend": "replay", "window": 4}')
    args = _server_parser().parse_args(["--model-path", "m"])
    assert (args.ssm_backend, args.replayssm_window) == ("replay", 4)
    args = _server_parser().parse_args(["--model-path", "m", "--replayssm-window", "2"])
    assert args.replayssm_window == 2
    monkeypatch.delenv(ENV_VAR)
    args = _server_parser().parse_args(["--model-path", "m", "--replayssm-window", "2"])
    with pytest.raises(ReplaySSMStartupError, match=r"--replayssm-window 2: expected --ssm-backend replay with this "
                       r"flag, got --ssm-backend default \(SGLang's own kernels would ignore it\); add --ssm-backend "
                       "replay or drop --replayssm-window 2"):
        config_from_namespace(args)  # --ssm-backend default would ignore it


def test_verify_flag_reaches_the_config(stock_sglang: None, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from sglang.srt.plugins import load_plugins

    from sglang_replayssm.hooks.args import config_from_namespace

    load_plugins()
    args = _server_parser().parse_args(["--model-path", "m"])
    assert config_from_namespace(args).verify == "auto"
    args = _server_parser().parse_args(
        ["--model-path", "m", "--ssm-backend", "replay", "--replayssm-verify", "snapshot"]
    )
    assert config_from_namespace(args) == ReplaySSMConfig(backend="replay", verify="snapshot")
    args = _server_parser().parse_args(["--model-path", "m", "--replayssm-verify", "snapshot"])
    with pytest.raises(ReplaySSMStartupError, match="--replayssm-verify snapshot: expected --ssm-backend replay"):
        config_from_namespace(args)  # --ssm-backend default would ignore it
    monkeypatch.setenv(ENV_VAR, '{"backend": "replay", "verify": "replay"}')
    assert _server_parser().parse_args(["--model-path", "m"]).replayssm_verify == "replay"
    with pytest.raises(SystemExit):
        _server_parser().parse_args(["--model-path", "m", "--replayssm-verify", "fast"])
    assert "argument --replayssm-verify: invalid choice: 'fast'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{oops", f"sglang-replayssm: {ENV_VAR}: expected a JSON object"),
        ('{"backend": "replay", "window": 0}', f"sglang-replayssm: {ENV_VAR}: replayssm window L: expected an integer >= 1, got 0"),
    ],
)
def test_env_config_is_checked_when_plugins_load(
    stock_sglang: None, monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    """The `sglang.Engine(**kwargs)` route: SGLang's load_plugins() swallows Exception, not this."""
    from sglang.srt.plugins import load_plugins

    monkeypatch.setenv(ENV_VAR, value)
    with pytest.raises(ReplaySSMStartupError, match=message):
        load_plugins()


def test_leftover_env_fields_warn_and_do_not_stop_a_stock_server(
    stock_sglang: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A leftover `SGLANG_REPLAYSSM_CONFIG` without `"backend": "replay"` is ignored by the stock
    backend: register() warns (the process has not read its command line yet) and the flags' defaults,
    being the environment's values, are not refused."""
    from sglang.srt.plugins import load_plugins

    from sglang_replayssm.hooks.args import config_from_namespace

    monkeypatch.setenv(ENV_VAR, '{"window": 8, "read_dtype": "fp8"}')
    with caplog.at_level("WARNING", logger="sglang_replayssm"):
        load_plugins()
    assert f"{ENV_VAR} sets window=8, read_dtype='fp8', which backend 'default' ignores" in caplog.text
    args = _server_parser().parse_args(["--model-path", "m"])
    assert config_from_namespace(args) == ReplaySSMConfig(window=8, read_dtype="fp8")
    args = _server_parser().parse_args(["--model-path", "m", "--replayssm-window", "4"])
    with pytest.raises(ReplaySSMStartupError, match="--replayssm-window 4: expected --ssm-backend replay"):
        config_from_namespace(args)


def test_env_replay_then_default_on_the_command_line_names_the_conflict(
    stock_sglang: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The environment's replay window is the flag's default: `--ssm-backend default` meets the
    backend conflict, not a refusal of a window the user did not give."""
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import ServerArgs

    monkeypatch.setenv(ENV_VAR, '{"backend": "replay", "window": 8}')
    load_plugins()
    args = _server_parser().parse_args(["--model-path", "m", "--ssm-backend", "default"])
    with pytest.raises(ReplaySSMStartupError, match="--ssm-backend default conflicts with the replay hooks"):
        ServerArgs.from_cli_args(args)


def test_default_on_the_command_line_after_replay_from_env_is_refused(
    stock_sglang: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hooks cannot be removed: a process that loaded plug-ins with backend 'replay' from the
    environment must not continue as `--ssm-backend default`."""
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import ServerArgs

    monkeypatch.setenv(ENV_VAR, '{"backend": "replay"}')
    load_plugins()
    args = _server_parser().parse_args(["--model-path", "m", "--ssm-backend", "default"])
    with pytest.raises(ReplaySSMStartupError, match="--ssm-backend default conflicts with the replay hooks"):
        ServerArgs.from_cli_args(args)


def test_read_dtype_maps_to_torch_and_round_trips() -> None:
    import torch

    expected = {"same": None, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}
    for name, dtype in expected.items():
        config = ReplaySSMConfig(backend="replay", read_dtype=name)
        assert config.read_torch_dtype() == dtype
        environ: dict[str, str] = {}
        config.export(environ)
        assert ReplaySSMConfig.from_env(environ) == config
    assert ReplaySSMConfig().read_dtype == "same"


def test_read_dtype_flag_reaches_the_config(stock_sglang: None, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from sglang.srt.plugins import load_plugins

    from sglang_replayssm.hooks.args import config_from_namespace

    load_plugins()
    args = _server_parser().parse_args(["--model-path", "m"])
    assert config_from_namespace(args).read_dtype == "same"
    args = _server_parser().parse_args(
        ["--model-path", "m", "--ssm-backend", "replay", "--replayssm-read-dtype", "fp8"]
    )
    assert config_from_namespace(args) == ReplaySSMConfig(backend="replay", read_dtype="fp8")
    args = _server_parser().parse_args(["--model-path", "m", "--replayssm-read-dtype", "bf16",
                                        "--replayssm-window", "8"])
    with pytest.raises(ReplaySSMStartupError, match="--replayssm-window 8 --replayssm-read-dtype bf16: expected "
                       "--ssm-backend replay with these flags"):
        config_from_namespace(args)
    monkeypatch.setenv(ENV_VAR, '{"backend": "replay", "read_dtype": "fp16"}')
    assert _server_parser().parse_args(["--model-path", "m"]).replayssm_read_dtype == "fp16"
    with pytest.raises(SystemExit):
        _server_parser().parse_args(["--model-path", "m", "--replayssm-read-dtype", "int4"])
    assert "argument --replayssm-read-dtype: invalid choice: 'int4'" in capsys.readouterr().err


def test_verify_help_says_what_auto_does(stock_sglang: None) -> None:
    """`--replayssm-verify auto` times both paths with a start-up probe, caches the decisions (where),
    and logs one line per bucket: the help says so."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    text = " ".join(_server_parser().format_help().split())
    assert "a short start-up probe times both paths" in text
    assert "cached per GPU, model shape, draft length and code version" in text
    assert "$SGLANG_REPLAYSSM_VERIFY_CACHE, default ~/.cache/sglang_replayssm/verify_decisions.json" in text
    assert "One log line per bucket" in text
    assert "The copy must be narrower than the checkpoint" in text
