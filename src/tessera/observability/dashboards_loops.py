"""The Grafana dashboards of the control loops, written as data: elasticity, control plane.

Every query names only metrics the components export (`tessera_agent.metrics`,
`tessera.observability.control`, `tessera.gateway.metrics`); the loops' actions are
counted by `tessera_control_actions_total` per loop. Listed, rendered and written with
the serving and capacity dashboards by `tessera.observability.dashboards`. Pure: builds
dicts.
"""

from __future__ import annotations

from typing import Any

from tessera.observability import dashboard_model as m


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
