"""The periodic module-scaling loop: observe, decide purely, drive.

Runs in `tessera up` every `--scaling-interval` seconds when `spec.policies.scaling.enabled`
(`for_up`; re-tuned on manifest edits by `cli/up_policies.py`), and in the operator
(`tessera_operator/scaling_tick.py`). Each `tick`: read the gateway's inter-token histogram,
take the window since the last tick (`policies.scaling_signal.window`, `calm_for`); observe
once (one `ScalingDriver` per single-stage replica, re-adopting its leader's runs; pipelined
and tensor-parallel replicas are skipped); decide (`scaling_signal.decide`); then per replica
"up" (`measure_gamma`, `tick_up`, else `tick_down`), "restore" (lift a batch cut) or "evict"
(`evict_all`). A failing replica is reported and the loop goes on. Returns one line per action
(`run` calls it in a thread); each agent operation adds an `op_line` (seconds, pause, bytes)
that `parse_op_line` reads back (operator events, `tessera bench scaling --via operator`).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tessera import model_facts
from tessera.control import agents as agent_client
from tessera.control import scaling_driver as sd
from tessera.policies.scaling import module_scaling as ms
from tessera.policies.scaling import signal as sig
from tessera.policies.scaling import speedup as sp
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc

Report = Callable[[str], None]


def hist_of(histogram: object) -> sig.Hist:
    """A `prometheus_client.Histogram` (no labels) as a cumulative `Hist`."""
    collect: Callable[[], Any] = getattr(histogram, "collect")  # noqa: B009
    return sig.from_samples(s for metric in collect() for s in metric.samples)


OP_LINE = re.compile(
    r"^(?P<rid>\S+): op (?P<op>\w+) layers (?P<start>\d+)-(?P<end>\d+) "
    r"(?P<source>\S*) -> (?P<target>\S*): (?P<seconds>[0-9.e+-]+) s, "
    r"pause (?P<pause_ms>[0-9.e+-]+) ms, (?P<param_bytes>\d+) param bytes, "
    r"(?P<kv_bytes>\d+) kv bytes, (?P<kv_pages>\d+) kv pages, (?P<requests>\d+) requests moved$"
)


def op_line(rid: str, r: pb.ScalingOpReply) -> str:
    """One applied agent operation as a report line (`parse_op_line` reads it back)."""
    return (
        f"{rid}: op {r.op} layers {r.layer_start}-{r.layer_end} {r.source} -> {r.target}: "
        f"{r.seconds:.4f} s, pause {r.pause_s * 1e3:.3f} ms, {r.param_bytes} param bytes, "
        f"{r.kv_bytes} kv bytes, {r.kv_pages} kv pages, {r.requests} requests moved"
    )


def parse_op_line(line: str) -> dict[str, Any] | None:
    """The fields of an `op_line` (numbers as numbers), or None for any other line."""
    m = OP_LINE.match(line)
    if m is None:
        return None
    out: dict[str, Any] = m.groupdict()
    for k in ("start", "end", "param_bytes", "kv_bytes", "kv_pages", "requests"):
        out[k] = int(out[k])
    for k in ("seconds", "pause_ms"):
        out[k] = float(out[k])
    return out


@dataclass(frozen=True)
class AgentAt:
    agent: str
    address: str


class ScalingLoop:
    def __init__(
        self,
        cfg: ms.ScalingConfig,
        tpot_target_s: float,
        agents: Sequence[AgentAt],
        hidden: int,
        itl: Callable[[], sig.Hist],
        min_gaps: int = 8,
        clock: Callable[[], float] = time.monotonic,
        channels: agent_client.Channels | None = None,
        *,
        tls: transport.TlsFiles | None,
    ) -> None:
        self.cfg, self.target_s, self.agents = cfg, tpot_target_s, list(agents)
        self.hidden, self.itl, self.min_gaps, self.clock = hidden, itl, min_gaps, clock
        self.drivers: dict[str, sd.ScalingDriver] = {}
        self.channels = channels if channels is not None else agent_client.Channels(tls)
        self._prev: sig.Hist | None = None
        self._last_t: float | None = None
        self.calm_s = 0.0  # seconds no window violated (`scaling_signal.calm_for`)
        self._reported: dict[str, int] = {}  # replica -> its driver's ops already reported
        self.ticks = 0

    def _op_lines(self) -> list[str]:
        """One `op_line` per agent operation applied since the last call."""
        out = []
        for rid, d in sorted(self.drivers.items()):
            seen = self._reported.get(rid, 0)
            out += [op_line(rid, reply) for _, reply in d.applied[seen:]]
            self._reported[rid] = len(d.applied)
        return out

    def _stub(self, address: str) -> pb_grpc.AgentStub:
        """One kept channel per agent (`agents.Channels`, the operator's per deployment
        ones when given), shared with its drivers."""
        return self.channels.sync_stub(address)

    def _driver(
        self, a: AgentAt, block: pb.BlockInfo, desc: pb.DescribeReply | None = None
    ) -> sd.ScalingDriver:
        d = self.drivers.get(block.replica_id)
        if d is None:
            n = block.layer_end - block.layer_start
            layer = max(1, (block.param_bytes + block.kv_bytes) // max(1, n))
            d = sd.ScalingDriver(
                origin=sd.Peer(a.agent, a.address),
                replica_id=block.replica_id,
                num_layers=n,
                hidden=self.hidden,
                peers=[sd.Peer(p.agent, p.address) for p in self.agents if p != a],
                cfg=self.cfg,
                replica_bytes=layer,
                channels=self.channels,
            )
            d._stub = self._stub  # type: ignore[method-assign]
            if desc is not None:
                d.adopt(desc)  # the runs already on the agents (an earlier loop's)
            self.drivers[block.replica_id] = d
            self._reported[block.replica_id] = 0
        return d

    def reconfigure(self, cfg: ms.ScalingConfig, tpot_target_s: float) -> None:
        """Take a new policy (a manifest edit) from the next tick on, drivers included;
        the layer replicas already placed stay, and later ticks judge them by `cfg`."""
        self.cfg, self.target_s = cfg, tpot_target_s
        for d in self.drivers.values():
            d.cfg = cfg

    def release(self) -> list[str]:
        """The policy was turned off: evict every layer replica the loop's drivers added
        and forget them; one line per replica."""
        out = []
        for rid, d in sorted(self.drivers.items()):
            try:
                out.append(f"module scaling off: {rid}: {d.evict_all()} layer replicas evicted")
            except Exception as exc:  # an agent gone: its replicas went with it
                out.append(f"module scaling off: {rid}: evicting failed: {exc!r}")
        out += self._op_lines()
        self.drivers = {}
        return out

    def evict_found(self, prefix: str) -> list[str]:
        """Evict every layer replica the agents report for replicas whose id starts with
        `prefix` (the policy is off: level-triggered, so runs an earlier loop placed go
        too); one line per replica that had any."""
        out = []
        for a in self.agents:
            desc = self._stub(a.address).Describe(pb.DescribeRequest(), timeout=10.0)
            for b in desc.blocks:
                if not b.replica_id.startswith(prefix) or b.stage_index or b.layer_start:
                    continue
                n = self._driver(a, b, desc).evict_all()
                if n:
                    out.append(f"module scaling off: {b.replica_id}: {n} layer replicas evicted")
        out += self._op_lines()
        self.drivers = {}
        return out

    def tick(self, described: Mapping[str, pb.DescribeReply] | None = None) -> list[str]:
        """One pass (module docstring); the lines say what was done. `described`: the
        agents' `Describe` replies by address, observed already in the caller's pass
        (the operator's shared observation); None: the tick asks each agent itself."""
        now, t = self.itl(), self.clock()
        w = sig.window(self._prev, now, self.target_s)
        elapsed = t - self._last_t if self._last_t is not None else 0.0
        self._prev, self._last_t = now, t
        self.calm_s = sig.calm_for(self.calm_s, w, self.cfg, elapsed)
        self.ticks += 1
        if not self.cfg.enabled:
            return []
        out: list[str] = []
        found = self._observe(out, described)
        capped = any(d.batch_cap is not None for d in self.drivers.values())
        replicated = any(d.replicated for d in self.drivers.values())
        decision = sig.decide(
            w, self.cfg, self.target_s, capped, self.min_gaps, self.calm_s, replicated
        )
        for d, b, kv in found:
            try:
                out += self._act(decision, w, d, b, kv)
            except Exception as exc:  # one replica's failure must not stop the loop
                out.append(f"module scaling of {b.replica_id} failed: {exc!r}")
        return out + self._op_lines()

    def _observe(
        self, out: list[str], described: Mapping[str, pb.DescribeReply] | None = None
    ) -> list[tuple[sd.ScalingDriver, pb.BlockInfo, pb.ReplicaKV | None]]:
        """One `Describe` per agent: each replica the loop drives, its driver having
        adopted the runs its leader reports (level-triggered: a run an earlier loop
        placed, or one that finished after an operator died, is known; one evicted by
        anybody is forgotten). Drivers of replicas no agent reports any more are dropped."""
        found = []
        seen: set[str] = set()
        answered = True
        for a in self.agents:
            if described is not None:
                got = described.get(a.address)
                if got is None:
                    answered = False
                    out.append(f"module scaling on {a.agent} failed: no Describe reply")
                    continue
                desc = got
            else:
                try:
                    desc = self._stub(a.address).Describe(pb.DescribeRequest(), timeout=10.0)
                except Exception as exc:  # one agent's failure must not stop the loop
                    answered = False
                    out.append(f"module scaling on {a.agent} failed: {exc!r}")
                    continue
            for b in desc.blocks:
                if b.stage_index != 0 or b.num_stages > 1 or b.tp_size > 1 or b.layer_start:
                    continue
                seen.add(b.replica_id)
                kv = next((k for k in desc.kv if k.replica_id == b.replica_id), None)
                d = self._driver(a, b)
                d.adopt(desc)
                found.append((d, b, kv))
        if answered:  # replicas a transition removed: forget their drivers (and cuts)
            self.drivers = {r: d for r, d in self.drivers.items() if r in seen}
        return found

    def _act(
        self,
        decision: sig.Decision,
        w: sig.Window,
        d: sd.ScalingDriver,
        b: pb.BlockInfo,
        kv: pb.ReplicaKV | None,
    ) -> list[str]:
        running = kv.running if kv is not None else 0
        rid = b.replica_id
        if decision.kind == "restore":
            return [f"{rid}: batch cut lifted ({decision.reason})"] if d.restore_batch() else []
        if decision.kind == "evict":
            if not d.replicated:
                return []
            return [f"{rid}: evicted {d.evict_all()} layer replicas ({decision.reason})"]
        if decision.kind != "up":
            return []
        d.measure_gamma()
        plan_up = d.tick_up(batch=max(1, running))
        if plan_up.actions:
            return [
                f"{rid}: replicated {len(plan_up.actions)} layers ({decision.reason}), "
                f"modelled speedup {plan_up.speedup_before:.2f} -> "
                f"{plan_up.speedup_after:.2f} (gamma {d.gamma:.2f})"
            ]
        return self._down(decision, w, d, rid, kv)

    def _down(
        self,
        decision: sig.Decision,
        w: sig.Window,
        d: sd.ScalingDriver,
        rid: str,
        kv: pb.ReplicaKV | None,
    ) -> list[str]:
        """Algorithm 2 for a violating replica that Algorithm 1 could not help."""
        running = kv.running if kv is not None else 0
        cap = kv.max_num_seqs if kv is not None and kv.max_num_seqs else running
        batch = max(1, min(running, cap))
        hosted: list[ms.Hosted] = []
        owners: dict[str, tuple[sp.Placement, sp.Workload]] = {}
        for o in self.drivers.values():  # other replicas' layer replicas on this device
            if o is not d:
                mine, owners[o.replica_id] = o.hosted_on(d.origin.name, w.mean_s, batch)
                hosted += mine

        def evict(a: ms.Evict) -> bool:
            owner = self.drivers.get(a.owner)
            return owner is not None and owner.evict_on(a.layer, a.device)

        plan, ops = d.tick_down(
            w.violation_rate, w.mean_s, self.target_s, d.replica_bytes, batch, hosted, owners, evict
        )
        lines = [f"{rid}: scale down ({decision.reason}): {plan.reason}"]
        lines += [
            f"{rid}: migrated layers {o.start}-{o.end} to {o.target}"
            if o.op == "migrate"
            else f"{rid}: evicted another replica's layer {o.start} from {o.holder}"
            for o in ops
        ]
        if plan.batch_size < batch:
            lines.append(f"{rid}: batch cut {batch} -> {plan.batch_size} sequences per step")
        return lines


def for_up(
    spec: object,
    model_path: str,
    agents: Sequence[tuple[str, str]],
    itl_histogram: object,
    tls: transport.TlsFiles | None,
) -> ScalingLoop | None:
    """The loop `tessera up` runs for `spec` (an `api.ServingDeploymentSpec`), or None
    when its scaling policy is off."""
    cfg: ms.ScalingConfig = spec.policies.scaling  # type: ignore[attr-defined]
    if not cfg.enabled:
        return None
    hidden = int(model_facts.read_config(model_path)["hidden_size"])
    target_s = spec.slo.tpot_p99_ms / 1e3  # type: ignore[attr-defined]
    return ScalingLoop(
        cfg, target_s, [AgentAt(a, addr) for a, addr in agents], hidden,
        lambda: hist_of(itl_histogram), tls=tls,
    )  # fmt: skip


async def run(loop: ScalingLoop, stop: asyncio.Event, interval_s: float, report: Report) -> None:
    """`loop.tick()` every `interval_s` (in a thread: its gRPC calls block) until `stop`."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
            return
        except TimeoutError:
            pass
        try:
            for line in await asyncio.to_thread(loop.tick):
                report(line)
        except Exception as exc:  # the loop must survive anything; the next tick retries
            report(f"module scaling tick failed: {exc!r}")
