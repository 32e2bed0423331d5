"""What `tessera up` tells its user and writes down: variant states as they change, the
replicas' leaders (the gateway's and the autoscaler's members), the curl example, and the
state file `tessera status` reads. Called by `up_cmd._serve`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def report_variants(outcome: Any, say: Any, seen: dict[str, str]) -> None:
    """Print each variant's state when it changes (issue 14), and forget removed ones."""
    now = {v.name: v for v in outcome.variants}
    for name in sorted(set(seen) - set(now)):
        say(f"variant {name}: removed")
        del seen[name]
    for name, v in now.items():
        line = f"variant {name} ({v.kind}): {v.reason}: {v.message}"
        if v.ready:
            line += f" (on {', '.join(v.loaded_on)})"
        if seen.get(name) != line:
            say(line)
            seen[name] = line


def leaders(outcome: Any) -> list[tuple[str, str]]:
    obs = outcome.observed
    out = []
    for r in outcome.plan.replicas:
        agent = obs.agent(r.stages[0].agent) if obs else None
        if agent is not None and r.replica_id in outcome.ready_replicas:
            out.append((r.replica_id, agent.address))
    return out


def members(outcome: Any) -> dict[str, str]:
    """Every planned replica's leader address (the autoscaler's members)."""
    obs = outcome.observed
    out = {}
    for r in outcome.plan.replicas:
        agent = obs.agent(r.stages[0].agent) if obs else None
        if agent is not None:
            out[r.replica_id] = agent.address
    return out


def curl_example(url: str, model: str) -> str:
    body = json.dumps({"model": model, "prompt": "Once upon a time", "max_tokens": 16})
    return (
        f"\nTry:\n  curl -s {url}/v1/completions -H 'Content-Type: application/json' "
        f"-d '{body}'\n\nPress Ctrl-C to stop.\n"
    )


def write_state(path: Path, dep: Any, refs: list[Any], url: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "deployment": dep.name,
                "namespace": dep.namespace,
                "gateway": url,
                "pid": os.getpid(),
                "agents": [{"name": r.name, "address": r.address} for r in refs],
            },
            indent=2,
        )
        + "\n"
    )
