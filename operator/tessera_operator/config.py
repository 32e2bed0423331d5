"""Operator configuration: agent discovery, watched namespaces, resync period, gateway template.

Built once at startup by `tessera operator` (`tessera.cli.operator_cmd`, from flags and
`TESSERA_*` environment variables) or by tests and the reconcile bench, validated in
`__post_init__`, and handed to every handler through kopf's memo. Nothing here reads the
environment by itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera.control import agents
from tessera.policies.security import admission
from tessera.rpc import transport

DEFAULT_AGENT_SELECTOR = "app.kubernetes.io/component=agent"

# Gateway-template keys (camelCase, as in the chart's `gateway` values) -> field names.
_TEMPLATE_KEYS = {
    "image": "image",
    "imagePullPolicy": "image_pull_policy",
    "imagePullSecrets": "image_pull_secrets",
    "resources": "resources",
    "podAnnotations": "pod_annotations",
    "podLabels": "pod_labels",
    "priorityClassName": "priority_class_name",
    "nodeSelector": "node_selector",
    "tolerations": "tolerations",
    "affinity": "affinity",
    "serviceAccountName": "service_account_name",
    "automountServiceAccountToken": "automount_service_account_token",
    "podSecurityContext": "pod_security_context",
    "securityContext": "security_context",
    "serviceAnnotations": "service_annotations",
    "tlsSecretName": "tls_secret_name",
    "apiKeysSecretName": "api_keys_secret_name",
    "adminTokenSecretName": "admin_token_secret_name",
    "certificate": "certificate",
    "extraArgs": "extra_args",
}


@dataclass(frozen=True)
class GatewayTemplate:
    """What the operator puts into every gateway Deployment and Service it creates.

    Port, replicas and Service type come from each ServingDeployment's `spec.gateway`."""

    image: str = "tessera-control-plane:0.1.0"
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()
    resources: Mapping[str, Any] = field(default_factory=dict)
    pod_annotations: Mapping[str, str] = field(default_factory=dict)
    pod_labels: Mapping[str, str] = field(default_factory=dict)
    priority_class_name: str = ""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    affinity: Mapping[str, Any] = field(default_factory=dict)
    service_account_name: str = ""
    automount_service_account_token: bool = False
    pod_security_context: Mapping[str, Any] = field(default_factory=dict)
    security_context: Mapping[str, Any] = field(default_factory=dict)
    service_annotations: Mapping[str, str] = field(default_factory=dict)
    # mTLS to the agents: a TLS Secret (ca.crt, tls.crt, tls.key; OU=gateway) that must
    # exist in each ServingDeployment's namespace ("{name}" in it: the deployment's name, for
    # a Secret per deployment); "": plaintext (docs/security.md)
    tls_secret_name: str = ""
    api_keys_secret_name: str = ""  # Secret with key `keys` (gateway/auth.py); "": no keys
    # Secret with key `token`: the operator's token on the gateway's /admin/ (admin_auth.py;
    # the operator reads the same token from --gateway-admin-token-file)
    admin_token_secret_name: str = ""
    # issue 31: {"issuerRef": {"kind", "name"}, "duration", "renewBefore"}: the operator asks
    # cert-manager for a certificate bound to each deployment (gateway_certificate.py), which
    # its gateway mounts instead of `tls_secret_name`; {}: none
    certificate: Mapping[str, Any] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()  # appended to `tessera gateway` (e.g. limits)

    def __post_init__(self) -> None:
        if not self.image:
            raise ValueError("gateway.image: must not be empty")
        if self.certificate:
            ref = self.certificate.get("issuerRef") or {}
            if set(ref) != {"kind", "name"} or ref["kind"] not in ("Issuer", "ClusterIssuer"):
                raise ValueError(
                    "gateway.certificate.issuerRef: {kind: Issuer | ClusterIssuer, name} "
                    f"required, got {ref!r}"
                )
            unknown = sorted(set(self.certificate) - {"issuerRef", "duration", "renewBefore"})
            if unknown:
                raise ValueError(f"gateway.certificate.{unknown[0]}: unknown key")
        if self.image_pull_policy not in ("Always", "IfNotPresent", "Never"):
            raise ValueError(
                f"gateway.imagePullPolicy: {self.image_pull_policy!r} is not Always, "
                "IfNotPresent or Never"
            )

    @classmethod
    def from_mapping(cls, doc: Mapping[str, Any]) -> GatewayTemplate:
        """From the JSON/YAML gateway-config file (keys as in `_TEMPLATE_KEYS`)."""
        unknown = sorted(set(doc) - set(_TEMPLATE_KEYS))
        if unknown:
            raise ValueError(
                f"gateway.{unknown[0]}: unknown key (allowed: {', '.join(_TEMPLATE_KEYS)})"
            )
        kwargs: dict[str, Any] = {}
        for key, name in _TEMPLATE_KEYS.items():
            if doc.get(key) is None:
                continue
            value = doc[key]
            if name == "image_pull_secrets":
                value = tuple(v["name"] if isinstance(v, Mapping) else str(v) for v in value)
            elif name in ("tolerations", "extra_args"):
                value = tuple(value)
            kwargs[name] = value
        return cls(**kwargs)


@dataclass(frozen=True)
class OperatorConfig:
    """Everything the operator needs, validated once."""

    agents: tuple[agents.AgentRef, ...] = ()  # static agents; empty: discover agent pods
    agent_selector: str = DEFAULT_AGENT_SELECTOR  # label selector of the agent pods
    agent_namespace: str = ""  # where agent pods run ("": every namespace)
    agent_port: int = 50051  # gRPC port of the agent pods
    # mTLS to the agents: the files `tessera operator` read from $TESSERA_TLS_DIR (None: none)
    tls: transport.TlsFiles | None = None
    namespaces: tuple[str, ...] = ()  # served namespaces; empty: all
    resync_seconds: float = 10.0  # timer period that re-reconciles drift
    model_root: str = "/models"  # where PVC checkpoints are mounted (operator and gateways)
    gateway: GatewayTemplate = field(default_factory=GatewayTemplate)
    # what a spec may ask for (issue 31): checkpoints under these roots only; LoadBalancer
    # Services and hostPath volumes only when allowed (`policies.admission`)
    admission: admission.Limits = field(default_factory=admission.Limits)
    api_server: str = ""  # Kubernetes API URL override (tests); "": in-cluster or kubeconfig
    peering: str = ""  # kopf peering name; "": standalone
    priority: int = 0  # kopf peering priority
    liveness: str = ""  # kopf liveness endpoint, e.g. http://0.0.0.0:8080/healthz
    finalizer_retries: int = 3  # attempts to unload blocks of a deleted deployment
    # transitions: how long a leaving replica may keep its requests (routes document),
    # how long past that the operator waits before freeing it anyway, and how long after
    # a cut-over an idle replica still counts as possibly routed (the gateway's reload)
    drain_deadline_seconds: float = 30.0
    drain_grace_seconds: float = 5.0
    drain_settle_seconds: float = 2.0
    # workload-adaptive switching (switching_loop.py): timer period, arrivals URL override
    # ("{namespace}", "{name}" filled; "": the gateway Service), candidate deployments
    switching_tick_seconds: float = 5.0
    switching_arrivals_url: str = ""
    switching_candidates: Callable[..., Any] | None = None  # switching_loop.CandidatesFn
    # default candidates (no switching_candidates): a measured cost profile
    # (tessera.cost.profile.Profile) for agents whose GPUs have no analytic one (e.g. CPU)
    switching_profile: Any = None
    # the latency model's calibration (tessera.cost.calibration.Calibration, e.g. from
    # `tessera calibrate`): candidates are priced with its correction and the switching
    # threshold comes from its per-layout error (None: the raw model and minGain)
    switching_calibration: Any = None
    # default candidates: planner layouts priced each span (switching_planner.cap)
    switching_max_candidates: int = 32
    # the overload loop (overload_loop.py): timer period; the gateway's admin base URL
    # ("{namespace}", "{name}" filled; "": the gateway Service) and its bearer token
    overload_tick_seconds: float = 0.5
    scaling_tick_seconds: float = 5.0  # the module-scaling loop (scaling_tick.py)
    autoscale_tick_seconds: float = 1.0  # the replica autoscaler (autoscale_tick.py)
    gateway_admin_url: str = ""
    gateway_admin_token: str = ""
    # tests: awaited after each step a loop's driver performs (an operator stopped mid-drop)
    overload_step_hook: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        names = [a.name for a in self.agents]
        if len(set(names)) != len(names):
            raise ValueError(f"agents: duplicate names in {names}")
        if not self.agents and not self.agent_selector:
            raise ValueError("agent_selector: required when no static agents are given")
        if not 0 < self.agent_port < 65536:
            raise ValueError(f"agent_port: {self.agent_port} is not a TCP port")
        if not self.resync_seconds > 0:
            raise ValueError("resync_seconds: must be > 0")
        if not self.scaling_tick_seconds > 0:
            raise ValueError("scaling_tick_seconds: must be > 0")
        if not self.autoscale_tick_seconds > 0:
            raise ValueError("autoscale_tick_seconds: must be > 0")
        if not self.overload_tick_seconds > 0:
            raise ValueError("overload_tick_seconds: must be > 0")
        if not self.switching_tick_seconds > 0:
            raise ValueError("switching_tick_seconds: must be > 0")
        if self.switching_max_candidates < 1:
            raise ValueError("switching_max_candidates: must be >= 1")
        if self.finalizer_retries < 0:
            raise ValueError("finalizer_retries: must be >= 0")
        for name in ("drain_deadline_seconds", "drain_grace_seconds", "drain_settle_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0")
        if self.api_server and not self.api_server.startswith(("http://", "https://")):
            raise ValueError(f"api_server: {self.api_server!r} is not an http(s) URL")
        if any(not ns for ns in self.namespaces):
            raise ValueError("namespaces: empty name")

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces
