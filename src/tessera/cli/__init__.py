"""Command-line entry points; the only place that composes core, agent and operator."""
