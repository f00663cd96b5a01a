"""Version gate, target fingerprints and the check that every hook took effect: each failure must
stop the start (a SystemExit that SGLang's load_plugins() does not swallow) with a message naming
the target and what differs."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from sglang_replayssm.config import ReplaySSMConfig
from sglang_replayssm.errors import ReplaySSMStartupError
from sglang_replayssm.hooks import HookSpec

REPO = Path(__file__).resolve().parents[2]
ADD_CLI_ARGS = "sglang.srt.server_args.ServerArgs.add_cli_args"
FROM_CLI_ARGS = "sglang.srt.server_args.ServerArgs.from_cli_args"

# Run SGLang's real `python -m sglang.launch_server --help` after a change made in the same process.
LAUNCH_AFTER = (
    "import runpy, sys; {change}; sys.argv = ['launch_server', '--help']; "
    "runpy.run_module('sglang.launch_server', run_name='__main__')"
)
CHANGE_VERSION = "import sglang; sglang.__version__ = '0.5.99'"
CHANGE_TARGET = (
    "from sglang.srt.server_args import ServerArgs; stock = ServerArgs.add_cli_args; "
    "ServerArgs.add_cli_args = staticmethod(lambda parser, extra=None: stock(parser))"
)


def _load_plugins() -> None:
    from sglang.srt.plugins import load_plugins

    load_plugins()


def test_pinned_fingerprints_match_the_installed_sglang(stock_sglang: None) -> None:
    import sglang

    from sglang_replayssm import patching

    assert sglang.__version__ in patching.supported_versions()
    pinned = patching.pinned_fingerprints(sglang.__version__)
    targets = set(patching.pinned_targets(patching.all_hooks()))  # hook targets and their callers
    assert set(pinned) == targets, "stale or missing entries: run python -m sglang_replayssm.patching --write-targets"
    for target in sorted(targets):
        assert patching.fingerprint(target) == pinned[target], target


def test_write_targets_reproduces_the_pinned_file(
    stock_sglang: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sglang

    from sglang_replayssm import patching

    assert patching.main(["--write-targets", "--dir", str(tmp_path)]) == 0
    written = Path(capsys.readouterr().out.strip())
    assert written == tmp_path / f"sglang-{sglang.__version__}.json"
    assert written.read_text() == (REPO / "patches" / "targets" / written.name).read_text()


def test_manifest_lists_every_hook_target() -> None:
    from sglang_replayssm import patching

    manifest = (REPO / "patches" / "README.md").read_text()
    listed = set(re.findall(r"^### `([\w.]+)`", manifest, flags=re.MULTILINE))
    assert listed == {spec.target for spec in patching.all_hooks()}
    sections = {m[0]: m[1] for m in re.findall(r"^### `([\w.]+)`\n(.*?)(?=^### |\Z)", manifest,
                                                flags=re.MULTILINE | re.DOTALL)}
    for spec in patching.all_hooks():  # each pinned caller named in its hook's section
        for caller in spec.callers:
            assert f"`{caller}`" in sections[spec.target], (spec.target, caller)


def test_a_changed_caller_is_refused(stock_sglang: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A release that stops calling a hooked function (here: the verify commit) must not start."""
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.speculative import spec_utils

    from sglang_replayssm.config import ENV_VAR

    def commit_mamba_states_after_verify(*args: object, **kwargs: object) -> None:
        return None  # no longer reaches update_mamba_state_after_mtp_verify

    monkeypatch.setattr(spec_utils, "commit_mamba_states_after_verify", commit_mamba_states_after_verify)
    monkeypatch.setenv(ENV_VAR, '{"backend": "replay"}')
    with pytest.raises(ReplaySSMStartupError,
                       match=r"spec_utils\.commit_mamba_states_after_verify: signature expected"):
        _load_plugins()
    assert not any("update_mamba_state_after_mtp_verify" in t for t in HookRegistry._patched)


def test_wrong_version_is_refused(stock_sglang: None, monkeypatch: pytest.MonkeyPatch) -> None:
    import sglang
    from sglang.srt.plugins.hook_registry import HookRegistry

    monkeypatch.setattr(sglang, "__version__", "0.5.99")
    with pytest.raises(ReplaySSMStartupError) as info:
        _load_plugins()
    assert "SGLang 0.5.99 is not supported" in str(info.value)
    assert "supports SGLang 0.5.17" in str(info.value)
    assert not HookRegistry._patched


def test_changed_target_is_refused(stock_sglang: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.server_args import ServerArgs

    stock = ServerArgs.add_cli_args

    def add_cli_args(parser: object, extra: object = None) -> None:
        stock(parser)

    monkeypatch.setattr(ServerArgs, "add_cli_args", staticmethod(add_cli_args))
    with pytest.raises(ReplaySSMStartupError) as info:
        _load_plugins()
    message = str(info.value)
    assert (
        f"  - {ADD_CLI_ARGS}: signature expected \"(parser: 'argparse.ArgumentParser')\", "
        "found \"(parser: 'object', extra: 'object' = None)"
    ) in message
    assert "source_sha256 expected" in message
    assert FROM_CLI_ARGS + ":" not in message  # only the changed target is named
    assert not HookRegistry._patched


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (CHANGE_VERSION, "sglang-replayssm: SGLang 0.5.99 is not supported"),
        (CHANGE_TARGET, f"{ADD_CLI_ARGS}: signature expected"),
    ],
    ids=["wrong-version", "changed-target"],
)
def test_launch_server_refuses_to_start(run_cli: Callable, change: str, message: str) -> None:
    result = run_cli([sys.executable, "-c", LAUNCH_AFTER.format(change=change)])
    assert result.returncode == 1, result.stderr[-3000:]
    assert message in result.stderr
    assert "--ssm-backend" not in result.stdout  # it stopped before printing the help


def test_hook_that_fails_to_apply_is_refused(stock_sglang: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry

    apply_target = HookRegistry._apply_target.__func__

    def failing(cls: type, target: str, hooks: list) -> None:
        if target == FROM_CLI_ARGS:
            raise RuntimeError("simulated")
        apply_target(cls, target, hooks)

    monkeypatch.setattr(HookRegistry, "_apply_target", classmethod(failing))
    with pytest.raises(ReplaySSMStartupError, match=f"around hook .*take_config on {FROM_CLI_ARGS} did not take effect"):
        _load_plugins()


def test_hook_registered_after_its_target_was_patched_is_refused(stock_sglang: None) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(ADD_CLI_ARGS, lambda result, parser: None, HookType.AFTER)  # another plug-in
    HookRegistry.apply_hooks()
    with pytest.raises(ReplaySSMStartupError, match=f"add_flags on {ADD_CLI_ARGS} cannot be installed: the target was already patched"):
        _load_plugins()


def test_hook_registered_by_another_plugin_on_our_target_is_refused(stock_sglang: None) -> None:
    """Registered, not yet applied: ours would wrap it, and the pin would not describe what runs."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    def foreign(parser: object) -> None:  # another plug-in's REPLACE
        return None

    HookRegistry.register(ADD_CLI_ARGS, foreign, HookType.REPLACE)
    with pytest.raises(ReplaySSMStartupError,
                       match=r"add_flags on .*add_cli_args cannot be installed: another hook is registered on "
                             r"the same target \(replace .*foreign"):
        _load_plugins()
    assert ADD_CLI_ARGS not in HookRegistry._patched


def test_a_foreign_functools_wraps_wrapper_is_a_change(stock_sglang: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrapper that is not HookRegistry's shows in the fingerprint, though ``__wrapped__`` leads to the
    stock function (``inspect`` would follow it)."""
    import functools

    from sglang.srt.server_args import ServerArgs

    from sglang_replayssm import patching

    stock = ServerArgs.__dict__["add_cli_args"].__func__

    @functools.wraps(stock)
    def shim(*args: object, **kwargs: object) -> None:
        return None

    monkeypatch.setattr(ServerArgs, "add_cli_args", staticmethod(shim))
    found, pinned = patching.fingerprint(ADD_CLI_ARGS), patching.pinned_fingerprints("0.5.17")[ADD_CLI_ARGS]
    assert found["signature"] == "(*args, **kwargs)"  # the wrapper's own, not the stock one
    assert found["source_sha256"] != pinned["source_sha256"]
    with pytest.raises(ReplaySSMStartupError, match=f"{ADD_CLI_ARGS}: signature expected"):
        _load_plugins()


def test_class_fingerprints_cover_sglang_base_classes() -> None:
    """A class REPLACE overrides and calls into its SGLang bases: their source is in the hash."""
    import inspect

    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend

    from sglang_replayssm import patching

    bases = [c for c in GDNAttnBackend.__mro__ if c.__module__.startswith("sglang.")]
    assert len(bases) >= 2  # GDNAttnBackend and the mamba backend base it inherits from
    assert patching._source(GDNAttnBackend) == "".join(inspect.getsource(c) for c in bases)
    assert "def init_forward_metadata_out_graph" not in inspect.getsource(GDNAttnBackend)
    assert "def init_forward_metadata_out_graph" in patching._source(GDNAttnBackend)


def test_a_target_without_source_is_never_unchanged(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from sglang_replayssm import patching

    pinned = {"kind": "function", "signature": "()", "source_sha256": None}
    assert patching._differences(pinned, dict(pinned)) == ["source_sha256 expected None, found None"]
    monkeypatch.setattr(patching, "fingerprint", lambda target: dict(pinned))
    with pytest.raises(ValueError, match=r"no source for \[.*\].*install SGLang with its sources"):
        patching.write_targets(tmp_path)


def test_installed_hooks_are_in_effect_and_unwrap_to_stock(stock_sglang: None) -> None:
    from sglang.srt.server_args import ServerArgs

    from sglang_replayssm import patching
    from sglang_replayssm.hooks import args

    stock = ServerArgs.__dict__["add_cli_args"].__func__
    assert not any(patching.in_effect(spec) for spec in args.HOOKS)
    _load_plugins()
    assert all(patching.in_effect(spec) for spec in args.HOOKS)
    hooked = ServerArgs.__dict__["add_cli_args"].__func__
    assert hooked is not stock and patching.unwrap_hooks(hooked) is stock


def _after(result: object, *args: object, **kwargs: object) -> None:
    return None


def test_select_hooks_by_backend() -> None:
    from sglang_replayssm import patching

    always = HookSpec(target="m.a", hook=_after, hook_type="after", when="always")
    replay = HookSpec(target="m.b", hook=_after, hook_type="after", when="replay")
    assert patching.select_hooks([always, replay], ReplaySSMConfig()) == [always]
    assert patching.select_hooks([always, replay], ReplaySSMConfig(backend="replay")) == [always, replay]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"hook": _after, "hook_type": "later"}, "hook_type expected one of"),
        ({"hook": _after, "hook_type": "after", "when": "sometimes"}, "when expected one of"),
        ({"hook": ReplaySSMConfig, "hook_type": "around"}, "a class hook needs hook_type 'replace'"),
    ],
)
def test_hook_spec_is_validated(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HookSpec(target="m.a", **fields)


def test_pinned_file_is_valid_json_with_provenance() -> None:
    document = json.loads((REPO / "patches" / "targets" / "sglang-0.5.17.json").read_text())
    assert document["sglang"] == "0.5.17"
    assert document["generated_by"] == "python -m sglang_replayssm.patching --write-targets"
