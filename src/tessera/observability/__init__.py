"""Observability: traces (`tracing`), control-loop telemetry (`control`), the layout picture
(`layout_svg`) and the Grafana dashboards (`dashboards`). See docs/observability.md."""
