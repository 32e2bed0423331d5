"""A ServingDeployment's gateway certificate, bound to it: a cert-manager Certificate (pure).

Built by `reconciler.py` when the gateway template names an issuer (`certificate`, the
chart's `tls.certManager.perDeployment`); `owned.py` creates or replaces it, and the gateway
Deployment mounts the Secret cert-manager writes (`secret_name`). The certificate carries
the gateway role (OU) and the URI SAN naming the namespace and deployment
(`tessera.policies.security.tenancy.uri`), so agents refuse it on any other deployment's replicas.
Owned by the custom resource, deleted with it (cert-manager leaves the Secret: it is named
after the deployment and reused if the deployment comes back).
"""

from __future__ import annotations

from typing import Any

from tessera import api
from tessera.policies.security import access, tenancy
from tessera_operator import config

API_VERSION = "cert-manager.io/v1"
AGENT_SERVER_NAME = "tessera-agent"  # every certificate's DNS SAN (tessera.rpc.transport)


def secret_name(dep: api.ServingDeployment) -> str:
    return f"{dep.name}-gateway-tls"


def certificate(
    dep: api.ServingDeployment, owner: dict[str, Any], tmpl: config.GatewayTemplate
) -> dict[str, Any] | None:
    """The Certificate to apply, or None when the template issues none."""
    cert = tmpl.certificate
    if not cert:
        return None
    spec: dict[str, Any] = {
        "secretName": secret_name(dep),
        "commonName": f"tessera-gateway-{dep.name}"[:64],
        "subject": {"organizationalUnits": [access.GATEWAY]},
        "dnsNames": [AGENT_SERVER_NAME],
        "uris": [tenancy.uri(dep.namespace, dep.name)],
        "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
        "usages": ["digital signature", "client auth"],
        "issuerRef": {"group": "cert-manager.io", **cert["issuerRef"]},
    }
    for key in ("duration", "renewBefore"):
        if cert.get(key):
            spec[key] = cert[key]
    labels = {
        "app.kubernetes.io/name": "tessera",
        "app.kubernetes.io/component": "gateway",
        "app.kubernetes.io/instance": dep.name,
        "app.kubernetes.io/managed-by": "tessera-operator",
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "Certificate",
        "metadata": {
            "name": secret_name(dep),
            "namespace": dep.namespace,
            "labels": labels,
            "ownerReferences": [owner],
        },
        "spec": spec,
    }
