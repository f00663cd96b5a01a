"""``tests/e2e/server.py`` kills the servers it started when its process is terminated by a signal,
and starts a server again on a new port when another process took its port first."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# The child starts from the default dispositions: a test run under ``nohup`` inherits SIGHUP ignored,
# and server.py (rightly) leaves an ignored signal alone.
CHILD = """
import signal, subprocess, sys, time
for s in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_DFL)
sys.path.insert(0, {here!r})
import server
p = subprocess.Popen(["sleep", "300"], start_new_session=True)
server._track(p)
print(p.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a killed child of the (now dead) test process may linger as a zombie until reaped by init
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split()[2] != "Z"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_tracked_servers_die_with_the_test_process(sig):
    here = str(Path(__file__).resolve().parent)
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(here=here)], stdout=subprocess.PIPE, text=True)
    server_pid = int(child.stdout.readline())
    assert _alive(server_pid)
    child.send_signal(sig)
    assert child.wait(timeout=30) == 128 + sig
    deadline = time.monotonic() + 10
    while _alive(server_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(server_pid), "the tracked server outlived the terminated test process"


# A stand-in for ``sglang.launch_server``: the first start finds its port taken (uvicorn's
# message) and exits, later starts answer ``/health`` on their port.
STAND_IN = """
import http.server, sys
port, marker = int(sys.argv[sys.argv.index("--port") + 1]), {marker!r}
try:
    open(marker, "x").close()
except FileExistsError:
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
print(f"ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', {{port}}): "
      "address already in use", flush=True)
sys.exit(3)
"""


def test_server_starts_again_when_its_port_was_taken(tmp_path, monkeypatch):
    """``server`` / ``start`` start a server whose port another process took again on a new
    port (the others of a ``start`` keep theirs); a server that exits for another reason is not
    retried."""
    import server

    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN.format(marker=str(tmp_path / "started-once")))
    starts = []

    def launch(model, args, log, *, port, env=None, base_flags=()):
        starts.append(port)
        fh = open(log, "w")
        proc = subprocess.Popen([sys.executable, str(script), "--port", str(port)], stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
        server._track(proc)
        return proc

    monkeypatch.setattr(server, "launch", launch)
    with server.server(Path("unused"), [], tmp_path / "s.log", timeout=30) as url:
        assert url == f"http://127.0.0.1:{starts[-1]}"
    assert len(starts) == 2

    (tmp_path / "started-once").unlink()  # two at once: whichever starts first loses its port
    starts.clear()
    specs = {n: dict(model=Path("unused"), args=[], log=tmp_path / f"{n}.log") for n in ("a", "b")}
    with contextlib.ExitStack() as stack:
        ports = server.start(specs, 30, stack)
    assert len(starts) == 3 and starts[2] in ports.values()
    assert len(set(ports.values()) & set(starts[:2])) == 1  # the other kept its first port

    script.write_text("import sys; print('some other failure', flush=True); sys.exit(3)")
    starts.clear()
    with pytest.raises(RuntimeError, match="some other failure") as info:
        with server.server(Path("unused"), [], tmp_path / "s.log", timeout=30):
            pass
    assert not isinstance(info.value, server.PortTaken) and len(starts) == 1
