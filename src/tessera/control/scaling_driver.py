"""A thin driver of module-level scaling for one replica stage: observe, decide, apply.

Observes the agents (`Describe`): a device's idle share is 1 when nothing runs on its agent and
0 otherwise; free memory comes from its booking; gamma (Eq. 4) is measured from runs it made
(`measure_gamma`). Decides with the pure policy (`module_scaling.scale_up` / `scale_down`,
turned into layer-run operations by `run_plan`) and applies them with the origin agent's
`ScalingReplicate` / `ScalingMigrate` / `ScalingEvict`, and Algorithm 2's batch cut with the
leader's `ScalingBatchLimit` (`restore_batch` lifts it). Keeps the placement it applied, which
`adopt` resets to what the agents report. Used by `tessera bench scaling` and the periodic
loop (`scaling_loop.ScalingLoop`, which decides when to call `tick_up` / `tick_down`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import grpc

from tessera.control import agents
from tessera.observability import control
from tessera.policies.scaling import module_scaling as ms
from tessera.policies.scaling import run_plan
from tessera.policies.scaling import speedup as sp
from tessera.rpc.v1 import agent_pb2 as pb
from tessera.rpc.v1 import agent_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class Peer:
    """A device that can hold layer runs: `agent` at `address`, device `device`."""

    agent: str
    address: str
    device: str = "cpu:0"
    capacity: float = 1.0  # relative compute (Eq. 1's C)
    bandwidth: float = float("inf")  # to the origin (Eq. 2's B), in the model's units

    @property
    def name(self) -> str:
        return f"{self.agent}/{self.device}"


@dataclass
class ScalingDriver:
    origin: Peer
    replica_id: str
    num_layers: int
    hidden: int
    peers: Sequence[Peer]
    cfg: ms.ScalingConfig
    replica_bytes: int  # one layer's weights plus its share of KV (the paper's r)
    stage_index: int = 0
    applied: list[tuple[run_plan.RunOp, pb.ScalingOpReply]] = field(default_factory=list)

    gamma: float = 0.0  # measured transfer/compute share of a replicated layer (Eq. 4)
    batch_cap: int | None = None  # sequences per step set by Algorithm 2's phase 3, if any
    channels: agents.Channels = field(kw_only=True, repr=False)  # the process's kept channels

    def __post_init__(self) -> None:
        self.state = sp.Placement.initial(self.origin.name, self.num_layers)
        self._migrated: set[int] = set()  # layers whose origin copy migrated away

    @property
    def replicated(self) -> bool:
        """Some layer of the replica has a replica placed (as the driver last saw it)."""
        return any(self.state.replicas)

    def measure_gamma(self) -> float | None:
        """gamma from the runs' measured speeds: a replica's seconds per token at a run
        minus the origin's (same compute, so the rest is the hidden states' round trip),
        over the origin's (`speedup.gamma_from_times`); kept for the next decisions.
        None while no run has both speeds measured."""
        d = self._stub(self.origin.address).Describe(pb.DescribeRequest(), timeout=10.0)
        found: list[float] = []
        for run in d.scaling_runs:
            speeds = {h.name: h.tokens_per_s for h in run.holders if h.tokens_per_s > 0}
            base = speeds.get(self.origin.name)
            if not base:
                continue
            for name, s in speeds.items():
                if name != self.origin.name:
                    found.append(sp.gamma_from_times(1 / base, max(0.0, 1 / s - 1 / base)))
        if not found:
            return None
        self.gamma = sum(found) / len(found)
        return self.gamma

    def _bandwidth(self, p: Peer) -> float:
        """Eq. 2's B for a peer: its own when given, else the one the measured gamma
        implies (gamma = delta C / (d B), delta = 1)."""
        if p.bandwidth != float("inf") or self.gamma <= 0:
            return p.bandwidth
        return p.capacity / (self.hidden * self.gamma)

    def _stub(self, address: str) -> pb_grpc.AgentStub:
        """One kept channel per agent (`agents.Channels`: each tick reuses it)."""
        return self.channels.sync_stub(address)

    def _pending(self, d: pb.DescribeReply) -> list[tuple[pb.ScalingPending, str]]:
        """This stage's replications in flight that the origin reports (`d`), each with
        its target's device name (a target that is none of the peers is skipped)."""
        out = []
        for p in d.scaling_pending:
            if p.replica_id != self.replica_id or p.stage_index != self.stage_index:
                continue
            peer = next(
                (
                    x
                    for x in self.peers
                    if x.address == p.target_address
                    and (not p.target_device or x.device == p.target_device)
                ),
                None,
            )
            if peer is not None:
                out.append((p, peer.name))
        return out

    def observe(self) -> dict[str, sp.Device]:
        out: dict[str, sp.Device] = {}
        loading: set[str] = set()  # targets of replications in flight: not idle
        for p in (self.origin, *self.peers):
            d = self._stub(p.address).Describe(pb.DescribeRequest(), timeout=10.0)
            if p is self.origin:
                loading = {name for _, name in self._pending(d)}
            busy = any(k.running for k in d.kv) or bool(d.scaling_hosted) or p.name in loading
            free = next((x.free_bytes for x in d.devices if x.id == p.device), 0)
            idle = 0.0 if busy else 1.0
            out[p.name] = sp.Device(p.name, p.capacity, self._bandwidth(p), free, idle)
        return out

    def _op(self, kind: str, op: run_plan.RunOp, **kw: str) -> pb.ScalingOpReply:
        req = pb.ScalingOpRequest(
            replica_id=self.replica_id,
            stage_index=self.stage_index,
            layer_start=op.start,
            layer_end=op.end,
            self_address=self.origin.address,
            **kw,
        )
        with control.action(
            "scaling", kind.removeprefix("Scaling").lower(), replica=self.replica_id
        ):
            reply: pb.ScalingOpReply = getattr(self._stub(self.origin.address), kind)(
                req, timeout=300.0
            )
        self.applied.append((op, reply))
        return reply

    def tick_up(self, batch: int, seq_len: int = 1) -> ms.ScaleUpPlan:
        """Algorithm 1 over the observed devices; each replicated run is applied."""
        if not self.cfg.enabled:
            return ms.ScaleUpPlan(self.state, 1.0, 1.0, ())
        devices = self.observe()
        wl = sp.Workload(self.hidden, max(1, batch), seq_len)
        plan = ms.scale_up(self.state, devices, wl, self.replica_bytes, self.cfg)
        by_name = {p.name: p for p in self.peers}
        for op in run_plan.replicate_ops(plan.actions):
            peer = by_name[op.target]
            self._op("ScalingReplicate", op, target_address=peer.address, target_device=peer.device)
        self.state = plan.state
        return plan

    def adopt(self, d: pb.DescribeReply) -> int:
        """Take the runs the origin reports for this replica as this driver's placement
        (a new loop, e.g. a restarted operator, finds the runs an earlier one placed), and
        its replications in flight (`scaling_pending`: an operator killed in the middle of
        one): level-triggered, so it neither replicates them again nor forgets to evict them.
        Returns the layer replicas adopted."""
        state = sp.Placement.initial(self.origin.name, self.num_layers)
        for run in d.scaling_runs:
            if run.replica_id != self.replica_id or run.stage_index != self.stage_index:
                continue
            for h in run.holders:
                if h.home or h.name == self.origin.name:
                    continue
                for layer in range(run.layer_start, min(run.layer_end, self.num_layers)):
                    if h.name not in state.replicas[layer]:
                        state = state.add(layer, h.name)
        for p, name in self._pending(d):  # in flight: placed, as far as deciding goes
            for layer in range(p.layer_start, min(p.layer_end, self.num_layers)):
                if name not in state.replicas[layer] and name != self.origin.name:
                    state = state.add(layer, name)
        self.state = state
        return sum(len(r) for r in state.replicas)

    def evict_all(self) -> int:
        """Evict every replica the driver added (scale-down's phase 2, all of it)."""
        n = 0
        d = self._stub(self.origin.address).Describe(pb.DescribeRequest(), timeout=10.0)
        for run in d.scaling_runs:
            if run.replica_id != self.replica_id:
                continue
            for h in run.holders:
                if not h.home:
                    op = run_plan.RunOp("evict", run.layer_start, run.layer_end, holder=h.name)
                    try:
                        self._op("ScalingEvict", op, holder=h.name)
                        n += 1
                    except grpc.RpcError:
                        continue  # already gone
        self.state = sp.Placement.initial(self.origin.name, self.num_layers)
        return n

    def tick_down(
        self,
        violation_rate: float,
        step_seconds: float,
        step_budget_s: float,
        layer_bytes: int,
        batch: int,
        hosted: Sequence[ms.Hosted] = (),
        owners: Mapping[str, tuple[sp.Placement, sp.Workload]] | None = None,
        evict: Callable[[ms.Evict], bool] | None = None,
    ) -> tuple[ms.ScaleDownPlan, list[run_plan.RunOp]]:
        """Algorithm 2 for the origin device: migrate its layers (as modules) to idle
        peers, then evict the layer replicas other replicas placed on this device
        (`hosted`, priced with their `owners`' placements; applied by `evict`, which the
        owner's driver carries out with `evict_on`), then reduce the batch (the leader's
        sequences per step, `ScalingBatchLimit`); returns the plan and the run ops applied."""
        devices = self.observe()
        per_layer = step_seconds / self.num_layers
        held = [i for i in range(self.num_layers) if i not in self._migrated]
        inp = ms.ScaleDownInput(
            source=self.origin.name,
            violation_rate=violation_rate,
            step_seconds=step_seconds,
            step_budget_s=step_budget_s,
            modules=tuple(ms.Module(f"layer.{i}", layer_bytes, per_layer) for i in held),
            hosted=tuple(hosted),
            owners=dict(owners or {}),
            batch_size=batch,
        )
        plan = ms.scale_down(inp, devices, self.cfg)
        layers = {f"layer.{i}": (i, i + 1) for i in range(self.num_layers)}
        ops = run_plan.scale_down_ops(plan, layers)
        by_name = {p.name: p for p in self.peers}
        applied: list[run_plan.RunOp] = []
        # consecutive single-layer migrations to one target travel as one run
        moves = [o for o in ops if o.op == "migrate"]
        for target in dict.fromkeys(o.target for o in moves):
            mine = [i for o in moves if o.target == target for i in range(o.start, o.end)]
            for s, e in run_plan.runs_of(mine):
                op = run_plan.RunOp("migrate", s, e, target=target, holder=self.origin.name)
                peer = by_name[target]
                self._op(
                    "ScalingMigrate", op, target_address=peer.address, target_device=peer.device
                )
                self._migrated.update(range(s, e))
                applied.append(op)
        for a in plan.actions:
            if isinstance(a, ms.Evict) and evict is not None and evict(a):
                applied.append(run_plan.RunOp("evict", a.layer, a.layer + 1, holder=a.device))
        if plan.batch_size < batch:
            self.set_batch(plan.batch_size)
        return plan, applied

    def hosted_on(
        self, device: str, step_seconds: float, batch: int
    ) -> tuple[list[ms.Hosted], tuple[sp.Placement, sp.Workload]]:
        """This replica's layer replicas on `device` (another replica's origin, which
        Algorithm 2 may evict) with a per-layer share of `step_seconds`, and this
        replica's placement and workload (to price what an eviction loses)."""
        per_layer = step_seconds / max(1, self.num_layers)
        mine = [
            ms.Hosted(self.replica_id, i, per_layer)
            for i, devs in enumerate(self.state.replicas)
            if device in devs
        ]
        return mine, (self.state, sp.Workload(self.hidden, max(1, batch), 1))

    def evict_on(self, layer: int, device: str) -> bool:
        """Evict the replicated run of this replica that holds `layer` on `device` (the
        whole run: runs are equal or disjoint); False when none is there any more."""
        if not 0 <= layer < self.num_layers or device not in self.state.replicas[layer]:
            return False
        d = self._stub(self.origin.address).Describe(pb.DescribeRequest(), timeout=10.0)
        for run in d.scaling_runs:
            if run.replica_id != self.replica_id or not run.layer_start <= layer < run.layer_end:
                continue
            if any(h.name == device and not h.home for h in run.holders):
                op = run_plan.RunOp("evict", run.layer_start, run.layer_end, holder=device)
                self._op("ScalingEvict", op, holder=device)
                for i in range(run.layer_start, run.layer_end):
                    if device in self.state.replicas[i]:
                        self.state = self.state.remove(i, device)
                return True
        return False

    def set_batch(self, max_num_seqs: int) -> pb.ScalingBatchLimitReply:
        """Cap the origin replica's sequences per step (0 = its loaded limit)."""
        req = pb.ScalingBatchLimitRequest(replica_id=self.replica_id, max_num_seqs=max_num_seqs)
        reply: pb.ScalingBatchLimitReply = self._stub(self.origin.address).ScalingBatchLimit(
            req, timeout=30.0
        )
        self.batch_cap = max_num_seqs or None
        return reply

    def restore_batch(self) -> bool:
        """Lift a batch cut this driver made; False when there was none."""
        if self.batch_cap is None:
            return False
        self.set_batch(0)
        return True
