"""The plug-in as SGLang sees it: entry point, load_plugins(), the flags of the real server command
lines, the start-up refusal of an unsupported model family under `--ssm-backend replay`, a stock SGLang under `--ssm-backend default`, and
the README's commands as CI runs them."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from sglang_replayssm.hooks import HookSpec

REPO = Path(__file__).resolve().parents[2]
TINY_MODEL = "tests/models/nemotron_h_tiny"


def _load_plugins() -> None:
    from sglang.srt.plugins import load_plugins

    load_plugins()


def test_entry_point_is_declared() -> None:
    ours = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "replayssm"]
    assert [(ep.value, ep.dist.name) for ep in ours] == [("sglang_replayssm:register", "sglang-replayssm")]


def test_load_plugins_discovers_the_plugin(stock_sglang: None, caplog: pytest.LogCaptureFixture) -> None:
    from sglang_replayssm import patching
    from sglang_replayssm.hooks import args

    caplog.set_level(logging.INFO)
    _load_plugins()
    assert "Executed general plugin: replayssm" in caplog.text
    assert "Executed general plugin: smg" not in caplog.text  # SGLANG_PLUGINS=replayssm
    assert all(patching.in_effect(spec) for spec in args.HOOKS)


def test_register_is_idempotent(stock_sglang: None) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_replayssm import register
    from sglang_replayssm.hooks import args

    register()
    register()
    for spec in args.HOOKS:
        assert [hook for _type, hook, _source in HookRegistry._hooks[spec.target]] == [spec.hook]


def test_launch_server_help_lists_both_flags(run_cli: Callable) -> None:
    result = run_cli([sys.executable, "-m", "sglang.launch_server", "--help"])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--ssm-backend {default,replay}" in result.stdout
    assert "--replayssm-window L" in result.stdout


@pytest.mark.parametrize(
    "command",
    [
        [sys.executable, "-m", "sglang.launch_server"],
        [str(Path(sys.executable).with_name("sglang")), "serve", "--model-type", "llm"],
    ],
    ids=["launch_server", "sglang-serve"],
)
def test_unsupported_family_is_refused_at_startup(run_cli: Callable, command: list[str]) -> None:
    result = run_cli([*command, "--model-path", "tests/models/llama_tiny", "--device", "cpu", "--ssm-backend", "replay"])
    assert result.returncode == 1, result.stderr[-3000:]
    assert "sglang-replayssm: --ssm-backend replay refused: --ssm-backend replay supports" in result.stderr
    assert "LlamaForCausalLM is not one of them" in result.stderr
    assert "Traceback" not in result.stderr


def _after(result: object, *args: object, **kwargs: object) -> None:
    return None


def _parser_view(parser: argparse.ArgumentParser) -> list[tuple]:
    return [
        (tuple(a.option_strings), a.dest, repr(a.default), repr(a.choices), a.nargs, a.required, a.help)
        for a in parser._actions
    ]


def test_default_backend_leaves_sglang_stock(stock_sglang: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--ssm-backend default`: no `when="replay"` hook is installed (a synthetic one is added to be
    sure the check can fail), the parser differs from stock only by the two flags, and
    `from_cli_args` hands SGLang the very same arguments and returns its result."""
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.server_args import ServerArgs

    from sglang_replayssm import patching
    from sglang_replayssm.hooks import args

    real = patching.all_hooks()
    synthetic = HookSpec(target="sglang.srt.server_args.ServerArgs.url", hook=_after, hook_type="after", when="replay")
    monkeypatch.setattr(patching, "all_hooks", lambda: [*real, synthetic])
    replay_targets = {spec.target for spec in patching.all_hooks() if spec.when == "replay"}
    before = {target: patching.resolve_target(target)[2] for target in replay_targets}
    stock_parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(stock_parser)

    _load_plugins()

    for target in replay_targets:
        assert patching.resolve_target(target)[2] is before[target], target
        assert target not in HookRegistry._patched
    hooked_parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(hooked_parser)
    ours = {"ssm_backend", "replayssm_window", "replayssm_verify", "replayssm_read_dtype"}
    assert [view for view in _parser_view(hooked_parser) if view[1] not in ours] == _parser_view(stock_parser)

    namespace = hooked_parser.parse_args(["--model-path", "m"])
    calls = []

    def original(cls: type, passed: argparse.Namespace) -> str:
        calls.append((cls, passed))
        return "server args"

    assert args.take_config(original, ServerArgs, namespace) == "server args"
    assert calls == [(ServerArgs, namespace)] and calls[0][1] is namespace


def test_namespace_without_the_flags_passes_through(stock_sglang: None) -> None:
    from sglang.srt.server_args import ServerArgs

    from sglang_replayssm.config import ENV_VAR
    from sglang_replayssm.hooks import args

    namespace = argparse.Namespace(model_path="m")
    assert args.take_config(lambda cls, passed: passed, ServerArgs, namespace) is namespace
    assert ENV_VAR not in os.environ


def _readme_commands() -> list[str]:
    readme = (REPO / "README.md").read_text()
    section = readme.split("<!-- set-up commands: begin -->")[1].split("<!-- set-up commands: end -->")[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)]


def test_readme_has_exactly_two_one_line_set_up_commands() -> None:
    commands = _readme_commands()
    assert len(commands) == 2, commands
    assert all("\n" not in command for command in commands), commands
    main_job, tests = commands
    assert "--ssm-backend replay" in main_job
    assert "pytest" in tests


def test_ci_runs_the_readme_test_command() -> None:
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert _readme_commands()[1] in ci
