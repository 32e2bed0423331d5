"""An agent started by `local_agents` dies with the process that started it, even when that
process is SIGKILLed (PR_SET_PDEATHSIG, armed by the agent after exec: no preexec_fn, whose
full fork runs gRPC's fork handlers in the child)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow

_PARENT = r"""
import grpc, sys  # gRPC initialised in the parent, as in a test or `tessera up`
grpc.insecure_channel("127.0.0.1:1")
from tessera.cli import local_agents
a = local_agents.start_agent("orphan-check", "cpu:1x64MiB")
print(a.proc.pid, flush=True)
sys.stdin.read()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is not alive
        return f.read().split(") ", 1)[1][0] != "Z"


def test_a_killed_parent_takes_its_agent_with_it() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    agent_pid = int(parent.stdout.readline())
    assert _alive(agent_pid)
    parent.send_signal(signal.SIGKILL)
    parent.wait(10)
    deadline = time.monotonic() + 20
    while _alive(agent_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = _alive(agent_pid)
    if alive:
        os.kill(agent_pid, signal.SIGKILL)
    assert not alive, "the agent outlived the process that started it"
