"""The ServingDeployment a bench creates on the test API server, as a manifest dict.

`manifest(name, model, replicas, kv_bytes, **spec)`: the `tiny-llama` checkpoint at
`model`, an explicit layout of `replicas` (each `{"name", "stages"}`, as the CRD spells
them) with `kvCacheBytes` = `kv_bytes`, in namespace `default`; `spec` adds other spec
fields (`policies`, `slo`, ...). Called by the benches that run the operator
(`bench_overload_operator`, `bench_scaling_operator`, `tessera_operator.bench_reconcile`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

GROUP, VERSION, PLURAL = "serving.tessera.dev", "v1alpha1", "servingdeployments"
MODEL = "tiny-llama"


def manifest(
    name: str, model: Path, replicas: list[dict[str, Any]], kv_bytes: int, **spec: Any
) -> dict[str, Any]:
    """The deployment's manifest (module docstring)."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ServingDeployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "model": {"name": MODEL, "path": str(model)},
            "layout": {"mode": "explicit", "kvCacheBytes": kv_bytes, "replicas": replicas},
            **spec,
        },
    }
