"""The replica engine a stage-0 block leads: scheduler limits and the downstream link.

Called by `hosting.Hosting.load` for stage 0. Scheduler limits come from the request
when it sets them, else from the agent's `LoadDefaults`. The downstream connection is
opened lazily (and again after a lost stage) to the hosted block's *current* next-stage
address, so a rewire takes effect on the next connect.
"""

from __future__ import annotations

import concurrent.futures
import ipaddress

from tessera.policies.overload import microbatch
from tessera.rpc import transport
from tessera.rpc.v1 import agent_pb2 as pb
from tessera_agent import hosted, load_config, stage_client, stitch_serve
from tessera_agent.engine import replica, scheduler


def scheduler_config(
    h: hosted.Hosted,
    defaults: load_config.LoadDefaults,
    max_num_seqs: int = 0,
    max_batched_tokens: int = 0,
) -> scheduler.SchedulerConfig:
    st = h.stage
    return scheduler.SchedulerConfig(
        max_num_seqs=max_num_seqs or defaults.max_num_seqs,
        max_batched_tokens=max_batched_tokens or defaults.max_batched_tokens,
        max_model_len=st.cfg.max_positions,
        eos_token_ids=st.cfg.eos_token_ids,
        prefix_caching=defaults.prefix_caching,
    )


def make_leader(
    h: hosted.Hosted,
    cfg: scheduler.SchedulerConfig,
    compute: concurrent.futures.Executor,
    microbatches: int = 0,
    split: microbatch.SplitConfig | None = None,
    *,
    tls: transport.TlsFiles | None,
) -> replica.ReplicaEngine:
    """The replica engine; a pipeline keeps `microbatches` steps in flight (0: one per
    stage, at least 2), cut by `split` (`tessera.policies.overload.microbatch`); `tls`:
    the agent's mTLS files for the link to its next stage."""
    connect = connector(h, tls)
    inflight = (microbatches or max(2, h.num_stages)) if connect is not None else None
    return replica.ReplicaEngine(h.stage.runner, compute, cfg, connect, inflight, split)


def dropped_in_flight(h: hosted.Hosted, configured: int) -> int:
    """Microbatches in flight for the pipeline an overload drop made of `h`'s replica
    (`microbatch.in_flight`): CPU stages linked over loopback share this machine's cores."""
    host = h.next_address.rsplit(":", 1)[0].strip("[]")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: not known to be this machine
        loopback = False
    cpu = h.stage.runner.device.type == "cpu"
    return microbatch.in_flight(h.stage.spec.num_stages, configured, cpu and loopback)


def connector(h: hosted.Hosted, tls: transport.TlsFiles | None) -> replica.DownstreamFactory | None:
    """How the leader reaches its next stage (None when the replica is whole); also used
    when an overload shift changes the replica's stages (`overload_shift`)."""
    st = h.stage
    connect = None
    if h.num_stages > 1:
        # a stitched chain's front (issue 35) greets the large model's stage after the stitch
        hello: pb.StageHello = stitch_serve.hello(st.spec, st.stitch)

        async def connect() -> replica.Downstream:
            ds = await stage_client.RemoteDownstream.connect(h.next_address, hello, tls)
            ds.link = h.link_down  # hidden states over the data plane once it is formed
            ds.result_link = h.result_in  # and the sampled tokens back from the last stage
            if st.stitch is not None and h.leader is not None:
                return stitch_serve.Stitched(ds, st.stitch, h.leader.executor)
            return ds

    return connect
