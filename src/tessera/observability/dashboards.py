"""The Grafana dashboards, written as data: serving, capacity, elasticity, control plane.

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


def _actions(loop: str) -> list[tuple[str, str]]:
    return [
        (
            f"sum by (action, outcome) "
            f'(increase(tessera_control_actions_total{{loop="{loop}"}}[5m]))',
            "{{action}} {{outcome}}",
        )
    ]


def elasticity() -> dict[str, Any]:
    panels = [
        m.panel(
            1,
            "Transitions and their steps (per 5 min)",
            _actions("transition"),
            0,
            0,
            kind="timeseries",
        ),
        m.panel(
            2,
            "Transition duration p50 / p99",
            [
                (
                    f"histogram_quantile({q}, sum by (le, action) (rate("
                    'tessera_control_action_duration_seconds_bucket{loop="transition"}[15m])))',
                    f"p{int(q * 100)} {{{{action}}}}",
                )
                for q in (0.5, 0.99)
            ],
            12,
            0,
            "s",
        ),
        m.panel(3, "Overload drops and restores (per 5 min)", _actions("overload"), 0, 8),
        m.panel(4, "Layer runs replicated and evicted (per 5 min)", _actions("scaling"), 12, 8),
        m.panel(5, "Layout switches (per 5 min)", _actions("switching"), 0, 16),
        m.panel(6, "Wakes (per 5 min)", _actions("wake"), 12, 16),
        m.panel(
            7,
            "Cut-over requests on leaving replicas, by outcome",
            [
                (
                    "sum by (outcome) "
                    '(increase(tessera_gateway_cutover_requests_total{job=~"$job"}[5m]))',
                    "{{outcome}}",
                ),
                (
                    'tessera_gateway_leaving_in_flight_requests{job=~"$job"}',
                    "in flight on {{replica}}",
                ),
            ],
            0,
            24,
        ),
        m.panel(
            8,
            "Routes version (plan generation) served",
            [('tessera_gateway_routes_version{job=~"$job"}', "{{job}}")],
            12,
            24,
        ),
    ]
    return m.dashboard("tessera-elasticity", "Tessera / Elasticity", panels, False)


def control_plane() -> dict[str, Any]:
    panels = [
        m.panel(
            1,
            "Reconcile passes per minute, by outcome",
            [
                (
                    "sum by (outcome) "
                    '(rate(tessera_control_actions_total{loop="reconcile"}[5m])) * 60',
                    "{{outcome}}",
                )
            ],
            0,
            0,
        ),
        m.panel(
            2,
            "Reconcile pass latency",
            [
                (
                    f"histogram_quantile({q}, sum by (le) (rate("
                    'tessera_control_action_duration_seconds_bucket{loop="reconcile"}[5m])))',
                    f"p{int(q * 100)}",
                )
                for q in (0.5, 0.9, 0.99)
            ],
            12,
            0,
            "s",
        ),
        m.panel(
            3,
            "Conditions (1 = the status the condition has now)",
            [("tessera_control_condition == 1", "{{deployment}} {{type}}={{status}}")],
            0,
            8,
            kind="table",
        ),
        m.panel(
            4,
            "Reason of each deployment's last pass",
            [("tessera_control_reconcile_reason == 1", "{{deployment}}: {{reason}}")],
            12,
            8,
            kind="table",
        ),
        m.panel(
            5,
            "Seconds since each loop last acted",
            [("time() - tessera_control_last_action_timestamp_seconds", "{{loop}}")],
            0,
            16,
            "s",
        ),
        m.panel(
            6,
            "Control actions that failed (per 5 min)",
            [
                (
                    "sum by (loop, action) "
                    '(increase(tessera_control_actions_total{outcome="error"}[5m]))',
                    "{{loop}} {{action}}",
                )
            ],
            12,
            16,
        ),
    ]
    return m.dashboard("tessera-control-plane", "Tessera / Control plane", panels, False)


ALL = {
    "tessera-serving.json": serving,
    "tessera-capacity.json": capacity,
    "tessera-elasticity.json": elasticity,
    "tessera-control-plane.json": control_plane,
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
