"""How `tessera bench overload` shares this machine's few cores (docs/overload.md, "The
gateway starved of CPU"): agents and the test API server at a niceness, every thread of
them, and a replay client with no cap on its connections."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.bench import client
from tessera.cli import local_agents


def _nice_of_threads(pid: int) -> set[int]:
    """The niceness of each thread of `pid` (field 19 of /proc/PID/task/TID/stat)."""
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        out.add(int(stat.rsplit(")", 1)[1].split()[16]))
    return out


pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="Linux /proc")


@pytest.mark.slow
def test_an_agent_started_nice_runs_every_thread_at_that_niceness() -> None:
    agent = local_agents.start_agent("nice-0", "cpu:1x64MiB", 1, nice=7)
    try:
        assert _nice_of_threads(agent.proc.pid) == {7}  # the gRPC and torch threads too
        group = Path(f"/proc/{agent.proc.pid}/autogroup")
        if group.exists():  # its session's scheduling group yields too, not only its threads
            assert group.read_text().split()[-1] == "7", group.read_text()
    finally:
        local_agents.stop_agent(agent)


def test_renice_reaches_every_thread_of_a_running_process() -> None:
    code = "import threading, time; threading.Thread(target=time.sleep, args=(30,)).start(); "
    code += "print('up', flush=True); time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        assert len(os.listdir(f"/proc/{proc.pid}/task")) == 2
        local_agents.renice_threads(proc.pid, 4)
        assert _nice_of_threads(proc.pid) == {4}
    finally:
        proc.kill()
        proc.wait()


def test_the_replay_session_has_no_cap_on_connections() -> None:
    async def limit() -> int:
        async with client.session(5.0) as s:
            return int(s.connector.limit)

    assert asyncio.run(limit()) == 0  # aiohttp's default (100) queued an open-loop replay


def test_the_agents_niceness_is_0_to_19() -> None:
    import argparse

    from tessera.cli import bench_overload

    parser = argparse.ArgumentParser()
    bench_overload.add_arguments(parser)
    assert parser.parse_args([]).agent_nice == 10
    assert parser.parse_args(["--agent-nice", "0"]).agent_nice == 0
    for bad in ("-5", "20", "x"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--agent-nice", bad])
