"""``tests/e2e/server.py`` kills the servers it started when its process is terminated by a signal."""

from __future__ import annotations

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
