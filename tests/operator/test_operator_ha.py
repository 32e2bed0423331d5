"""Two operator replicas with kopf peering: exactly one is active; when it stops, the other
takes over. Against the KMock API server, which also serves kopf's peering CRDs.

Which operator acted is visible in what it wrote: each is given its own gateway image, and
the gateway Deployment of a ServingDeployment carries the image of the operator that
reconciled it (a second active operator would rewrite it with its own).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tessera import crd
from tessera.cli import local_agents
from tessera.policies.security import admission
from tessera_operator import config
from tessera_operator.testing import background
from tests.operator.conftest import GROUP, PLURAL, VERSION, create, custom, wait_for
from tests.operator.test_operator_lifecycle import TWO_REPLICAS, manifest, ready, refs

pytestmark = pytest.mark.slow
Start = Callable[..., list[local_agents.AgentProcess]]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def peering_api(tmp_path: Path) -> Iterator[background.ApiServerThread]:
    files = [crd.default_path()]
    for i, doc in enumerate(yaml.safe_load_all((ROOT / "crds/peerings.kopf.dev.yaml").read_text())):
        files.append(tmp_path / f"peering-{i}.yaml")
        files[-1].write_text(yaml.safe_dump(doc))
    srv = background.ApiServerThread(files).start()
    yield srv
    srv.stop()


def _image(kube: client.ApiClient, name: str) -> str:
    try:
        dep = client.AppsV1Api(kube).read_namespaced_deployment(f"{name}-gateway", "default")
    except client.ApiException:
        return ""
    return str(dep.spec.template.spec.containers[0].image)


def test_two_peered_operators_exactly_one_active(
    agents_factory: Start, tiny_llama: Path, peering_api: background.ApiServerThread
) -> None:
    kube = client.ApiClient(client.Configuration(host=peering_api.url))
    kube.user_agent = "tessera-tests/0"
    custom(kube).create_cluster_custom_object(
        "kopf.dev", "v1", "clusterkopfpeerings",
        {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering",
         "metadata": {"name": "tessera"}},
    )  # fmt: skip
    procs = agents_factory(2)
    operators: list[background.OperatorThread] = []

    def start(image: str, priority: int) -> background.OperatorThread:
        cfg = config.OperatorConfig(
            agents=tuple(refs(procs)),
            api_server=peering_api.url,
            resync_seconds=1.0,
            peering="tessera",
            priority=priority,
            gateway=config.GatewayTemplate(image=image),
            admission=admission.Limits(("/",), allow_host_path=True),
        )
        operators.append(background.OperatorThread(cfg).start())
        return operators[-1]

    try:
        active = start("active:1", 200)
        standby = start("standby:1", 100)

        def peers() -> Any:
            obj = custom(kube).get_cluster_custom_object(
                "kopf.dev", "v1", "clusterkopfpeerings", "tessera"
            )
            return len(obj.get("status") or {}) == 2

        wait_for("both peers in the peering object", peers, timeout=30)
        create(kube, manifest("ha", tiny_llama, TWO_REPLICAS))
        wait_for("Ready", lambda: ready(kube, "ha"), timeout=120)
        # several resync passes (1 s) later, only the active operator has written anything
        time.sleep(4)
        assert _image(kube, "ha") == "active:1"

        active.stop()  # a clean stop leaves the peering; the standby resumes
        custom(kube).patch_namespaced_custom_object(
            GROUP, VERSION, "default", PLURAL, "ha", {"spec": {"gateway": {"replicas": 2}}}
        )
        wait_for("the standby took over", lambda: _image(kube, "ha") == "standby:1", 90)
        wait_for("Ready at generation 2", lambda: ready(kube, "ha", generation=2), 90)
        assert standby.alive
    finally:
        for op in operators:
            if op.alive:
                op.stop()
        kube.close()
