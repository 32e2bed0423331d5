"""Starts and stops local agent processes (`tessera agent`) for `tessera up`, tests and benches.

Each agent is a child process started with `--port 0`; its first stdout line tells the
port it bound. Stopping sends SIGTERM, then SIGKILL after a grace period, so no child is
left behind.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tessera.rpc import transport
    from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

_LISTEN_RE = re.compile(r"listening on (\S+):(\d+)")


def niceness(text: str) -> int:
    """An `--agent-nice` flag's value: 0-19 (below 0 needs privileges a CLI should not ask);
    else an argparse error naming the flag."""
    value = int(text)
    if not 0 <= value <= 19:
        raise argparse.ArgumentTypeError(f"{value}: must be 0-19")
    return value


@dataclass
class AgentProcess:
    agent_id: str
    proc: subprocess.Popen[str]
    address: str = ""
    output: list[str] = field(default_factory=list)
    # the TLS files this process's clients of the agent use: $TESSERA_TLS_DIR, read here
    # (this module hands the environment on), as the agent's own when `env` sets none
    tls: transport.TlsFiles | None = None


def start_agent(
    agent_id: str,
    devices: str = "cpu:1x2GiB",
    threads: int = 1,
    host: str = "127.0.0.1",
    port: int = 0,
    timeout: float = 60.0,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    nice: int = 0,
) -> AgentProcess:
    """Start one agent process and wait until it listens; raise with its output if it dies.

    `env` adds variables to the child's environment (e.g. `TESSERA_TLS_DIR`); `nice` > 0
    runs every thread of the agent at that niceness (agents sharing a few cores with the
    processes that serve their requests: `tessera up --agent-nice`, `tessera bench
    overload`)."""
    cmd = [
        sys.executable,
        "-m",
        "tessera.cli.main",
        "agent",
        "--agent-id",
        agent_id,
        "--host",
        host,
        "--port",
        str(port),
        "--devices",
        devices,
        "--threads",
        str(threads),
        *extra_args,
    ]
    from tessera.rpc import transport

    tls = transport.tls_from_dir(os.environ.get(transport.TLS_DIR_ENV, ""))
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # the agent arranges to die with this process itself (agent_cmd.PARENT_PID_ENV): no
        # preexec_fn, so the child is spawned without running gRPC's fork handlers
        env={
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "TESSERA_PARENT_PID": str(os.getpid()),
            **(env or {}),
        },
        start_new_session=True,
    )
    if nice:
        _renice_session(proc.pid, nice)
    agent = AgentProcess(agent_id, proc, tls=tls)
    ready = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            agent.output.append(line.rstrip())
            del agent.output[:-200]  # keep the tail only
            m = _LISTEN_RE.search(line)
            if m and not agent.address:
                agent.address = f"{m.group(1)}:{m.group(2)}"
                ready.set()
        ready.set()

    threading.Thread(target=reader, daemon=True, name=f"agent-{agent_id}-out").start()
    deadline = time.monotonic() + timeout
    while not ready.wait(0.1):
        if time.monotonic() > deadline:
            stop_agent(agent)
            raise RuntimeError(f"agent {agent_id} did not start within {timeout}s")
    if not agent.address:
        stop_agent(agent)
        raise RuntimeError(f"agent {agent_id} exited: " + "\n".join(agent.output[-20:]))
    return agent


def renice_threads(pid: int, nice: int) -> None:
    """Every thread of process `pid` at niceness `nice` (Linux: one call per thread; where
    there is no /proc, its main thread only): a process that shares its session and group
    with others (the bench's test API server)."""
    tasks = Path(f"/proc/{pid}/task")
    for tid in os.listdir(tasks) if tasks.is_dir() else [str(pid)]:
        os.setpriority(os.PRIO_PROCESS, int(tid), nice)


def _renice_session(pid: int, nice: int) -> None:
    """Run the agent `pid` (a session and process group of its own) at niceness `nice`:
    every thread in its group (threads made later inherit it), and, where the kernel groups
    each session for scheduling (Linux's autogroup, `/proc/PID/autogroup`), that group too;
    without the latter, a thread's niceness only counts against the agent's own threads."""
    os.setpriority(os.PRIO_PGRP, pid, nice)
    with contextlib.suppress(OSError):  # no autogroup (kernel, or not Linux): threads suffice
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")


def stop_agent(agent: AgentProcess, grace: float = 5.0) -> None:
    """SIGTERM, wait `grace` seconds, then SIGKILL the agent's process group."""
    if agent.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(agent.proc.pid, signal.SIGTERM)
        try:
            agent.proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent.proc.pid, signal.SIGKILL)
            agent.proc.wait()


@contextlib.contextmanager
def local_agents(
    n: int,
    devices: str = "cpu:1x2GiB",
    threads: int = 1,
    prefix: str = "agent",
    extra_args: Sequence[str] = (),
) -> Iterator[list[AgentProcess]]:
    """Run `n` agents for the duration of the block."""
    agents: list[AgentProcess] = []
    try:
        for i in range(n):
            agents.append(start_agent(f"{prefix}-{i}", devices, threads, extra_args=extra_args))
        yield agents
    finally:
        for a in agents:
            stop_agent(a)


def load_pipeline(
    agents: list[AgentProcess],
    model_path: str,
    splits: list[tuple[int, int]],
    replica_id: str,
    kv_bytes: int = 32 << 20,
    device: str = "cpu:0",
    data_plane: bool = True,
) -> None:
    """Load one replica whose stage i (layers splits[i]) runs on agents[i].

    Stages are loaded last to first, each pointing at the next agent; with `data_plane`
    (and more than one stage) the stages send hidden states over gloo links that meet on
    the first agent's store, else over the gRPC stream. For tests and benches;
    deployments go through the reconcile core and the actuator instead."""
    from tessera import blocks
    from tessera.policies.transition import actions
    from tessera.rpc import blocks as rpc_blocks
    from tessera.rpc import transport
    from tessera.rpc.v1 import agent_pb2 as pb
    from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

    dp = None
    if data_plane and len(splits) > 1:
        channel = transport.sync_channel(agents[0].address, agents[0].tls)
        try:
            store = pb_grpc.AgentStub(channel).Describe(pb.DescribeRequest()).store_address
        finally:
            channel.close()
        dp = actions.DataPlane(store, f"{replica_id}/{time.monotonic_ns()}")

    for i in reversed(range(len(splits))):
        a, b = splits[i]
        channel = transport.sync_channel(agents[i].address, agents[i].tls)
        try:
            block = blocks.Block(
                model_path,
                a,
                b,
                replica_id=replica_id,
                stage_index=i,
                device=device,
                kv_bytes=kv_bytes,
                num_stages=len(splits),
                next_address=agents[i + 1].address if i + 1 < len(splits) else "",
            )
            pb_grpc.AgentStub(channel).LoadBlock(rpc_blocks.load_request(block, data_plane=dp))
        finally:
            channel.close()


def generate_tokens(
    stub: pb_grpc.AgentStub, replica_id: str, prompt: list[int], max_tokens: int
) -> list[int]:
    """Greedy tokens of one request through an `AgentStub` of the replica's leader (EOS
    ignored, so exactly `max_tokens`). For benches; clients go through the gateway."""
    from tessera.rpc import sampling as rpc_sampling
    from tessera.rpc.v1 import agent_pb2 as pb

    params = rpc_sampling.to_proto(rpc_sampling.Sampling(max_tokens=max_tokens, ignore_eos=True))
    req = pb.GenerateRequest(replica_id=replica_id, prompt_token_ids=prompt, params=params)
    return [t for ch in stub.Generate(req, timeout=300) for t in ch.token_ids]
