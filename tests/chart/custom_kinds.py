"""Schemas for the custom-resource kinds the chart renders, which kubernetes-validate lacks.

Two sources: the CRDs the chart itself ships (KopfPeering, ClusterKopfPeering and, in
examples, ServingDeployment) are checked against their own `openAPIV3Schema`; the
Prometheus Operator's ServiceMonitor and PodMonitor (monitoring.coreos.com/v1) and
cert-manager's Certificate, Issuer and ClusterIssuer (cert-manager.io/v1), whose CRDs the
chart does not ship, against the subset of their API the chart uses, written here from
their API references with `additionalProperties: false`, so a misspelt or misplaced field
fails. Called by `chart_check.validate_objects`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import jsonschema

_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
# Prometheus durations: 30s, 1m30s, 2h, ...
_DURATION = {"type": "string", "pattern": "^(0|([0-9]+(ms|s|m|h|d|w|y))+)$"}
_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": _LABELS,
        "matchExpressions": {"type": "array", "items": {"type": "object"}},
    },
}
_NAMESPACE_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "any": {"type": "boolean"},
        "matchNames": {"type": "array", "items": {"type": "string"}},
    },
}
_RELABELING = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "sourceLabels": {"type": "array", "items": {"type": "string"}},
        "targetLabel": {"type": "string"},
        "regex": {"type": "string"},
        "replacement": {"type": "string"},
        "action": {"type": "string"},
        "separator": {"type": "string"},
    },
}
_ENDPOINT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["port"],
    "properties": {
        "port": {"type": "string", "minLength": 1},
        "path": {"type": "string", "pattern": "^/"},
        "scheme": {"type": "string", "enum": ["http", "https"]},
        "interval": _DURATION,
        "scrapeTimeout": _DURATION,
        "relabelings": {"type": "array", "items": _RELABELING},
    },
}
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
        "namespace": {"type": "string"},
        "labels": _LABELS,
        "annotations": _LABELS,
    },
}


def _monitor(endpoints_key: str) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"type": "string"},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["selector", endpoints_key],
                "properties": {
                    "selector": _SELECTOR,
                    "namespaceSelector": _NAMESPACE_SELECTOR,
                    endpoints_key: {"type": "array", "minItems": 1, "items": _ENDPOINT},
                },
            },
        },
    }


# (apiVersion, kind) -> schema of the subset the chart renders.
MONITORING: dict[tuple[str, str], dict[str, Any]] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _monitor("endpoints"),
    ("monitoring.coreos.com/v1", "PodMonitor"): _monitor("podMetricsEndpoints"),
}


_ISSUER_REF = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "kind": {"enum": ["Issuer", "ClusterIssuer"]},
        "group": {"const": "cert-manager.io"},
    },
}
_GO_DURATION = {"type": "string", "pattern": "^([0-9]+(\\.[0-9]+)?(h|m|s))+$"}
_USAGES = [
    "signing", "digital signature", "content commitment", "key encipherment",
    "key agreement", "data encipherment", "cert sign", "crl sign", "encipher only",
    "decipher only", "any", "server auth", "client auth", "code signing", "email protection",
]  # fmt: skip


def _cert_manager(kind: str, spec: dict[str, Any], namespaced: bool) -> dict[str, Any]:
    meta = dict(_METADATA)
    if namespaced:
        meta = {**meta, "required": ["name", "namespace"]}
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "cert-manager.io/v1"},
            "kind": {"const": kind},
            "metadata": meta,
            "spec": spec,
        },
    }


_CERTIFICATE_SPEC = {
    "type": "object",
    "additionalProperties": False,
    "required": ["secretName", "issuerRef"],
    "properties": {
        "secretName": {"type": "string", "minLength": 1},
        "commonName": {"type": "string", "maxLength": 64},
        "isCA": {"type": "boolean"},
        "subject": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "organizationalUnits": {"type": "array", "items": {"type": "string"}},
                "organizations": {"type": "array", "items": {"type": "string"}},
            },
        },
        "dnsNames": {"type": "array", "items": {"type": "string"}},
        "uris": {"type": "array", "items": {"type": "string", "pattern": "^[a-z][a-z0-9+.-]*://"}},
        "duration": _GO_DURATION,
        "renewBefore": _GO_DURATION,
        "privateKey": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                "size": {"type": "integer"},
                "rotationPolicy": {"enum": ["Never", "Always"]},
            },
        },
        "usages": {"type": "array", "items": {"enum": _USAGES}},
        "issuerRef": _ISSUER_REF,
    },
}
_ISSUER_SPEC = {
    "type": "object",
    "additionalProperties": False,
    "minProperties": 1,
    "maxProperties": 1,
    "properties": {
        "selfSigned": {"type": "object", "additionalProperties": False},
        "ca": {
            "type": "object",
            "additionalProperties": False,
            "required": ["secretName"],
            "properties": {"secretName": {"type": "string", "minLength": 1}},
        },
    },
}
# cert-manager.io/v1, from the cert-manager API reference (the subset the chart renders).
CERT_MANAGER: dict[tuple[str, str], dict[str, Any]] = {
    ("cert-manager.io/v1", "Certificate"): _cert_manager("Certificate", _CERTIFICATE_SPEC, True),
    ("cert-manager.io/v1", "Issuer"): _cert_manager("Issuer", _ISSUER_SPEC, True),
    ("cert-manager.io/v1", "ClusterIssuer"): _cert_manager("ClusterIssuer", _ISSUER_SPEC, False),
}


def crd_schemas(crds: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> a JSON schema of the whole object, from each CRD's versions."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for crd in crds:
        spec = crd["spec"]
        for version in spec["versions"]:
            body = dict(version["schema"]["openAPIV3Schema"])
            props = dict(body.get("properties", {}))
            props["metadata"] = _METADATA
            props.setdefault("apiVersion", {"type": "string"})
            props.setdefault("kind", {"type": "string"})
            body["properties"] = props
            body["required"] = sorted({*body.get("required", []), "apiVersion", "kind", "metadata"})
            out[(f"{spec['group']}/{version['name']}", spec["names"]["kind"])] = body
    return out


def errors(obj: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Messages of every schema violation of `obj` ('' path for the root)."""
    validator = jsonschema.Draft7Validator(schema)
    return [
        f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in validator.iter_errors(obj)
    ]
