"""Start and stop a real ``sglang.launch_server`` on 127.0.0.1 for CPU end-to-end tests.

Flags SGLang 0.5.17 needs to serve a hybrid model on a CPU (``../shared/design/cpu-serving.md``):
``--device cpu --disable-cuda-graph --mamba-radix-cache-strategy no_buffer --disable-overlap-schedule
--max-mamba-cache-size 16`` and ``SGLANG_MAMBA_CONV_DTYPE=float32``; plus a capped KV pool
(``--max-total-tokens``), since the CPU pool is otherwise sized from host RAM (minutes to allocate).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import requests

__all__ = ["CPU_FLAGS", "PortTaken", "free_port", "launch", "server", "start"]

#: process groups of servers started here and not yet stopped (killed if this process is terminated)
_LIVE: set[int] = set()
_HANDLERS_INSTALLED = False
#: starts of one server whose port was taken before it bound it (``PortTaken``; ``start``)
PORT_TRIES = 3

CPU_FLAGS: tuple[str, ...] = (
    "--device", "cpu",
    "--dtype", "float32",
    "--disable-cuda-graph",
    "--mamba-radix-cache-strategy", "no_buffer",
    "--disable-overlap-schedule",
    "--max-mamba-cache-size", "16",
    "--max-total-tokens", "16384",
    "--skip-server-warmup",
    "--sleep-on-idle",  # an idle scheduler otherwise busy-polls a core (CI has two)
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    env["SGLANG_PLUGINS"] = "replayssm"
    env["SGLANG_MAMBA_CONV_DTYPE"] = "float32"
    env.pop("SGLANG_REPLAYSSM_CONFIG", None)
    env.update(extra or {})
    return env


def launch(model: Path, args: Sequence[str], log: Path, *, port: int, env: dict[str, str] | None = None,
           base_flags: Sequence[str] = CPU_FLAGS):
    """Start a server (new process group); return the ``Popen``."""
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--host", "127.0.0.1",
           "--port", str(port), *base_flags, *args]
    fh = open(log, "w")
    proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=_env(env), start_new_session=True,
                            cwd=str(log.parent))
    _track(proc)
    return proc


def _kill_live(signum: int | None = None, frame=None) -> None:
    """Kill every tracked server's process group; on a signal, then exit with ``128 + signum``.

    A test run stopped by SIGTERM / SIGHUP (a CI timeout, ``kill``) does not unwind its fixtures,
    and a server's scheduler and detokenizer processes would keep both CPUs busy after it.
    """
    for pgid in list(_LIVE):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        _LIVE.discard(pgid)
    if signum is not None:
        os._exit(128 + signum)


def _track(proc: subprocess.Popen) -> None:
    """Remember ``proc``'s process group (it must lead a new session) until ``stop``."""
    global _HANDLERS_INSTALLED
    if not _HANDLERS_INSTALLED and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                signal.signal(sig, _kill_live)
        atexit.register(_kill_live)
        _HANDLERS_INSTALLED = True
    _LIVE.add(proc.pid)


class PortTaken(RuntimeError):
    """The server exited because its HTTP port was bound by another process after ``free_port``
    chose it (a server of a parallel test worker picks its own ports in that window)."""


def wait_ready(proc: subprocess.Popen, port: int, log: Path, timeout: float) -> None:
    """Wait until the server answers ``/health``; ``PortTaken`` if it exited for want of its
    port, ``RuntimeError`` if it exited otherwise, ``TimeoutError`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = log.read_text()
            exc = PortTaken if "address already in use" in text.lower() else RuntimeError
            raise exc(f"server exited with {proc.returncode}:\n{text[-4000:]}")
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(1.0)
    raise TimeoutError(f"server not ready in {timeout}s:\n{log.read_text()[-4000:]}")


def stop(proc: subprocess.Popen) -> None:
    _LIVE.discard(proc.pid)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def start(specs: dict[str, dict], timeout: float, stack: contextlib.ExitStack) -> dict[str, int]:
    """Start one server per entry of ``specs`` (``launch``'s arguments but ``port``, by keyword)
    at once, each stopped by ``stack`` on exit, and wait until all answer; a server that lost its
    port to another process (``PortTaken``) is started again on a new one, at most
    ``PORT_TRIES`` starts each. Returns the ports by name."""
    ports: dict[str, int] = {}
    procs: dict[str, subprocess.Popen] = {}

    def go(name: str) -> None:
        ports[name] = free_port()
        procs[name] = launch(port=ports[name], **specs[name])
        stack.callback(stop, procs[name])

    for name in specs:
        go(name)
    for name in specs:
        for attempt in range(1, PORT_TRIES + 1):
            try:
                wait_ready(procs[name], ports[name], specs[name]["log"], timeout)
                break
            except PortTaken:
                if attempt == PORT_TRIES:
                    raise
                go(name)
    return ports


@contextlib.contextmanager
def server(model: Path, args: Sequence[str], log: Path, *, timeout: float = 240.0,
           env: dict[str, str] | None = None, base_flags: Sequence[str] = CPU_FLAGS) -> Iterator[str]:
    """Context manager: a ready server's base URL (``start``: started again on a new port if
    another process took its port); the process group is killed on exit."""
    with contextlib.ExitStack() as stack:
        spec = dict(model=model, args=args, log=log, env=env, base_flags=base_flags)
        port = start({"server": spec}, timeout, stack)["server"]
        yield f"http://127.0.0.1:{port}"
