"""The Grafana dashboards, written as data: serving and capacity here, elasticity and
control plane in `dashboards_loops`; every one listed in `ALL`.

Every query names only metrics the components export (`tessera.gateway.metrics`,
`tessera_agent.metrics`, `tessera.observability.control`); `tests/observability` scrapes a
live `tessera up` to hold that true, and lints the JSON. `python -m
tessera.observability.dashboards` rewrites the JSON files the chart ships
(`charts/tessera/dashboards/`, mounted by `templates/dashboards/configmaps.yaml` for
Grafana's sidecar) and the copies in `docs/dashboards/`; a test checks they are current.

Deployments: a gateway serves one ServingDeployment, so gateway series are told apart by
their scrape `job`; replica ids start with `<namespace>.<deployment>.` (`blocks.replica_id`),
which the `replica` filters match. Pure: builds dicts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tessera.observability import dashboard_model as m
from tessera.observability import dashboards_loops

TARGET_LABELS = m.TARGET_LABELS


def serving() -> dict[str, Any]:
    j = 'job=~"$job"'
    panels = [
        m.panel(
            1,
            "Request rate by endpoint and status",
            [
                (
                    f"sum by (job, endpoint, status) "
                    f"(rate(tessera_gateway_requests_total{{{j}}}[1m]))",
                    "{{job}} {{endpoint}} {{status}}",
                )
            ],
            0,
            0,
            "reqps",
        ),
        m.panel(
            2,
            "Errors by code (HTTP status >= 400, and retried gRPC codes)",
            [
                (
                    f"sum by (job, status) "
                    f'(rate(tessera_gateway_requests_total{{{j}, status=~"[45].."}}[5m]))',
                    "HTTP {{status}} {{job}}",
                ),
                (
                    f"sum by (job, code) (rate(tessera_gateway_retries_total{{{j}}}[5m]))",
                    "retried {{code}} {{job}}",
                ),
            ],
            12,
            0,
            "reqps",
        ),
        m.panel(
            3,
            "TTFT percentiles per deployment",
            m.quantiles("tessera_gateway_time_to_first_token_seconds", "job"),
            0,
            8,
            "s",
        ),
        m.panel(
            4,
            "TTFT percentiles per variant",
            m.quantiles("tessera_gateway_variant_time_to_first_token_seconds", "job, variant"),
            12,
            8,
            "s",
        ),
        m.panel(
            5,
            "TPOT percentiles per variant",
            m.quantiles("tessera_gateway_time_per_output_token_seconds", "job, variant"),
            0,
            16,
            "s",
        ),
        m.panel(
            6,
            "Inter-token latency percentiles per deployment",
            m.quantiles("tessera_gateway_inter_token_latency_seconds", "job"),
            12,
            16,
            "s",
        ),
        m.panel(
            7,
            "Queue: in flight at the gateway, waiting and running at the replicas",
            [
                (f"sum by (job) (tessera_gateway_in_flight_requests{{{j}}})", "in flight {{job}}"),
                (
                    f"sum by (replica) (tessera_agent_waiting_sequences{{{m.REPLICA}}})",
                    "waiting {{replica}}",
                ),
                (
                    f"sum by (replica) (tessera_agent_running_sequences{{{m.REPLICA}}})",
                    "running {{replica}}",
                ),
            ],
            0,
            24,
        ),
        m.panel(
            8,
            "Tokens per second",
            [
                (
                    f"sum by (job) (rate(tessera_gateway_generation_tokens_total{{{j}}}[1m]))",
                    "generated {{job}}",
                ),
                (
                    f"sum by (job) (rate(tessera_gateway_prompt_tokens_total{{{j}}}[1m]))",
                    "prompt {{job}}",
                ),
            ],
            12,
            24,
        ),
        m.panel(
            9,
            "Routing: attempts per replica and policy",
            [
                (
                    f"sum by (replica, policy) "
                    f"(rate(tessera_gateway_routed_requests_total{{{j}}}[1m]))",
                    "{{replica}} {{policy}}",
                )
            ],
            0,
            32,
            "reqps",
        ),
        m.panel(
            10,
            "Replicas ready",
            [(f"tessera_gateway_replica_ready{{{j}}}", "{{replica}}")],
            12,
            32,
        ),
    ]
    return m.dashboard("tessera-serving", "Tessera / Serving", panels, True)


def capacity() -> dict[str, Any]:
    panels = [
        m.panel(
            1,
            "KV pages used per replica",
            [
                (f"tessera_agent_kv_pages_used{{{m.REPLICA}}}", "used {{replica}}"),
                (f"tessera_agent_kv_pages_total{{{m.REPLICA}}}", "total {{replica}}"),
            ],
            0,
            0,
        ),
        m.panel(
            2,
            "KV use per replica (share of its pages)",
            [
                (
                    f"tessera_agent_kv_pages_used{{{m.REPLICA}}}"
                    f" / tessera_agent_kv_pages_total{{{m.REPLICA}}}",
                    "{{replica}}",
                )
            ],
            12,
            0,
            "percentunit",
        ),
        m.panel(
            3,
            "Memory used per device",
            [
                (
                    "tessera_agent_device_capacity_bytes - tessera_agent_device_free_bytes",
                    "{{instance}} {{device}}",
                )
            ],
            0,
            8,
            "bytes",
        ),
        m.panel(
            4,
            "Memory per device: capacity and free",
            [
                ("tessera_agent_device_capacity_bytes", "capacity {{instance}} {{device}}"),
                ("tessera_agent_device_free_bytes", "free {{instance}} {{device}}"),
            ],
            12,
            8,
            "bytes",
        ),
        m.panel(
            5,
            "Blocks per agent",
            [("count by (instance) (tessera_agent_block_param_bytes)", "{{instance}}")],
            0,
            16,
        ),
        m.panel(
            6,
            "Block bytes per replica stage (parameters + KV pool)",
            [
                (
                    f"sum by (replica, stage) (tessera_agent_block_param_bytes{{{m.REPLICA}}} + "
                    f"tessera_agent_block_kv_bytes{{{m.REPLICA}}})",
                    "{{replica}} s{{stage}}",
                )
            ],
            12,
            16,
            "bytes",
        ),
        m.panel(
            7,
            "Prefix cache: hit tokens per second, cached pages",
            [
                (
                    f"rate(tessera_agent_prefix_cache_hit_tokens_total{{{m.REPLICA}}}[5m])",
                    "hits {{replica}}",
                ),
                (f"tessera_agent_prefix_cache_pages{{{m.REPLICA}}}", "pages {{replica}}"),
            ],
            0,
            24,
        ),
        m.panel(
            8,
            "Preemptions per second",
            [(f"rate(tessera_agent_preemptions_total{{{m.REPLICA}}}[5m])", "{{replica}}")],
            12,
            24,
        ),
    ]
    return m.dashboard("tessera-capacity", "Tessera / Capacity", panels, True)


ALL = {
    "tessera-serving.json": serving,
    "tessera-capacity.json": capacity,
    "tessera-elasticity.json": dashboards_loops.elasticity,
    "tessera-control-plane.json": dashboards_loops.control_plane,
}


def rendered() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {name: json.dumps(make(), indent=2, sort_keys=True) + "\n" for name, make in ALL.items()}


def write(root: Path) -> list[Path]:
    out = []
    for folder in (root / "charts/tessera/dashboards", root / "docs/dashboards"):
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in rendered().items():
            (folder / name).write_text(text)
            out.append(folder / name)
    return out


if __name__ == "__main__":
    for p in write(Path(sys.argv[1] if len(sys.argv) > 1 else ".")):
        sys.stdout.write(f"wrote {p}\n")
