"""The chart's CI checks: helm lint, render, schema validation and the operator's RBAC.

Drives a pinned helm (fetched by `scripts/fetch-helm.sh` into `.tools/`) over
`charts/tessera` with the default values and with `ci/all-on-values.yaml`, for the oldest
Kubernetes the chart supports and the newest kubernetes-validate has schemas for. Every
rendered object (CRDs included) is validated: built-in kinds strictly by kubernetes-validate
(unknown fields fail), custom kinds by `custom_kinds`; a kind with no schema is an error,
never skipped. The operator's ClusterRole is compared both ways with
`tests/operator/rbac_usage.json`, the (verb, group, resource) the operator's tests issued
at the test API server. Callers: `make chart-check` (`python -m tests.chart.chart_check`)
and `tests/chart/test_chart_render.py`. Only `helm` runs as a subprocess; the rest is pure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from tests.chart import custom_kinds, dockerfile_check

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "tessera"
ALL_ON = CHART / "ci" / "all-on-values.yaml"
RBAC_USAGE = ROOT / "tests" / "operator" / "rbac_usage.json"
FETCH_HELM = ROOT / "scripts" / "fetch-helm.sh"
FETCH_HADOLINT = ROOT / "scripts" / "fetch-hadolint.sh"
RELEASE = "tessera"
NAMESPACE = "tessera-system"
# The chart's kubeVersion floor (gRPC probes are GA since 1.27) and the newest schemas shipped.
KUBE_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())
# Renders checked by `make chart-check`: name -> values files.
RENDERS: dict[str, tuple[Path, ...]] = {"default": (), "all-on": (ALL_ON,)}

Obj = dict[str, Any]


class CheckError(Exception):
    """A check failed; the message says which and why."""


@dataclass(frozen=True, order=True)
class Perm:
    """One API permission: a verb on a resource (or subresource) of an API group."""

    verb: str
    group: str  # "" for the core group
    resource: str  # "servingdeployments", "servingdeployments/status", ...

    def __str__(self) -> str:
        return f"{self.verb} {self.group or 'core'}/{self.resource}"


# --- helm ---------------------------------------------------------------------------------


def _tool(env: str, fetcher: Path) -> Path:
    """$ENV if set, else the pinned binary the fetch script caches in .tools/bin."""
    if os.environ.get(env):
        return Path(os.environ[env])
    proc = subprocess.run(["bash", str(fetcher)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise CheckError(f"{fetcher.name} failed:\n{proc.stderr}")
    return Path(proc.stdout.strip().splitlines()[-1])


def helm_binary() -> Path:
    return _tool("HELM", FETCH_HELM)


def hadolint_binary() -> Path:
    return _tool("HADOLINT", FETCH_HADOLINT)


def run_helm(helm: Path, *args: str) -> str:
    proc = subprocess.run([str(helm), *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise CheckError(f"helm {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def lint(helm: Path, values_files: Sequence[Path] = ()) -> str:
    """`helm lint --strict`; raises CheckError on any warning or error."""
    args = ["lint", "--strict", str(CHART)]
    for f in values_files:
        args += ["-f", str(f)]
    return run_helm(helm, *args)


def template(
    helm: Path,
    values_files: Sequence[Path] = (),
    set_values: Sequence[str] = (),
    kube_version: str = KUBE_VERSIONS[0],
    include_crds: bool = True,
) -> list[Obj]:
    """Render the chart and return its objects in document order."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    args += ["--kube-version", kube_version]
    if include_crds:
        args.append("--include-crds")
    for f in values_files:
        args += ["-f", str(f)]
    for s in set_values:
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(run_helm(helm, *args)) if d]


# --- validation ---------------------------------------------------------------------------


def validate_objects(objects: Sequence[Obj], kube_version: str) -> list[str]:
    """Error messages for every object that fails its schema (empty when all pass)."""
    custom = {**custom_kinds.MONITORING, **custom_kinds.CERT_MANAGER}
    custom.update(
        custom_kinds.crd_schemas(o for o in objects if o["kind"] == "CustomResourceDefinition")
    )
    errors = []
    for obj in objects:
        key = (obj["apiVersion"], obj["kind"])
        where = f"{obj['kind']}/{obj['metadata'].get('name', '?')}"
        if key in custom:
            errors += [f"{where}: {e}" for e in custom_kinds.errors(obj, custom[key])]
            continue
        try:
            kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            errors.append(f"{where} (Kubernetes {kube_version}): {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError:
            errors.append(f"{where}: no schema for {key} (add one to custom_kinds)")
    return errors


# --- RBAC ---------------------------------------------------------------------------------


def load_usage(path: Path = RBAC_USAGE) -> set[Perm]:
    """The recorded usage: a JSON list of {"apiGroup", "resource", "verb"} (core group "")."""
    if not path.is_file():
        raise CheckError(f"{path} is missing: the operator tests write it")
    items: list[dict[str, str]] = json.loads(path.read_text())
    return {Perm(i["verb"], i["apiGroup"], i["resource"]) for i in items}


def operator_rules(objects: Sequence[Obj]) -> list[Obj]:
    """Rules of every ClusterRole and Role bound to the operator's ServiceAccount."""
    deployment = _one(objects, "Deployment", "operator")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    roles = {(o["kind"], o["metadata"]["name"]): o for o in objects if o["kind"].endswith("Role")}
    rules: list[Obj] = []
    for binding in (o for o in objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        subjects = binding.get("subjects", [])
        if any(s["kind"] == "ServiceAccount" and s["name"] == account for s in subjects):
            ref = binding["roleRef"]
            rules += roles[(ref["kind"], ref["name"])].get("rules", [])
    return rules


def granted(rules: Iterable[Obj]) -> set[Perm]:
    return {
        Perm(verb, group, resource)
        for rule in rules
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    }


# Calls the operator's code makes that tests/operator does not exercise yet, so that the
# recorded usage lacks them; each with its call site. An entry that shows up in the recorded
# usage is reported as stale: delete it here once the operator tests record it.
UNRECORDED: dict[Perm, str] = {}


# Calls the operator makes only in a mode the chart may leave off, each with how the rendered
# objects turn the mode on: recorded by the tests (which run the mode), needed only when on.
GATEWAY_CERTIFICATES = {
    Perm(verb, "cert-manager.io", "certificates"): "gateway Certificate per ServingDeployment"
    for verb in ("get", "create", "update")
}


def mode_permissions(objects: Sequence[Obj]) -> tuple[dict[Perm, str], set[Perm]]:
    """(permissions the rendered modes need, permissions of modes that are off)."""
    defaults = [o for o in objects if o["kind"] == "ConfigMap" and "gateway.json" in o["data"]]
    template = json.loads(defaults[0]["data"]["gateway.json"]) if defaults else {}
    if template.get("certificate"):
        return dict(GATEWAY_CERTIFICATES), set()
    return {}, set(GATEWAY_CERTIFICATES)


def framework_extras(objects: Sequence[Obj]) -> dict[Perm, str]:
    """Permissions kopf needs only in modes the operator tests may not run, with the reason.

    Derived from the rendered operator arguments: `--peering` (replicas > 1) makes kopf
    list, watch and patch its peering object (cluster-wide, or per namespace with
    `--namespace`). The operator disables kopf's scanning, so CRDs and namespaces are never
    listed.
    """
    args = _one(objects, "Deployment", "operator")["spec"]["template"]["spec"]["containers"][0]
    argv = args.get("args", [])
    extras: dict[Perm, str] = {}
    if "--peering" in argv:
        plural = "kopfpeerings" if "--namespace" in argv else "clusterkopfpeerings"
        for verb in ("list", "watch", "patch"):
            extras[Perm(verb, "kopf.dev", plural)] = "kopf peering (--peering)"
    return extras


def rbac_problems(objects: Sequence[Obj], usage: set[Perm]) -> list[str]:
    """Why the operator's rules are not exactly its usage (empty when they are)."""
    rules = operator_rules(objects)
    problems = []
    for rule in rules:
        fields = [*rule.get("apiGroups", []), *rule.get("resources", []), *rule.get("verbs", [])]
        if "*" in fields or any("*" in f for f in fields):
            problems.append(f"wildcard in rule {rule}")
        if rule.get("nonResourceURLs") or rule.get("resourceNames"):
            problems.append(f"rule {rule} uses nonResourceURLs/resourceNames")
    have = granted(rules)
    on, off = mode_permissions(objects)
    needed = (usage - off) | set(on) | set(UNRECORDED) | set(framework_extras(objects))
    problems += [f"not granted: {p}" for p in sorted(needed - have)]
    problems += [f"granted but never used: {p}" for p in sorted(have - needed)]
    stale = sorted(usage & set(UNRECORDED))
    problems += [f"now recorded, remove from chart_check.UNRECORDED: {p}" for p in stale]
    return problems


# --- helpers ------------------------------------------------------------------------------


def _one(objects: Sequence[Obj], kind: str, component: str) -> Obj:
    found = [
        o
        for o in objects
        if o["kind"] == kind
        and o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
    ]
    if len(found) != 1:
        raise CheckError(f"expected one {kind} of component {component}, found {len(found)}")
    return found[0]


def check_crd_copy() -> None:
    """charts/tessera/crds holds exactly crds/*.yaml, byte for byte."""
    top = {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    if top != chart:
        differ = sorted(n for n in set(top) | set(chart) if top.get(n) != chart.get(n))
        raise CheckError(f"charts/tessera/crds differs from crds/ in {differ}: make chart-crds")


def check_dockerfile(hadolint: Path) -> None:
    problems = dockerfile_check.check()
    proc = subprocess.run(
        [str(hadolint), str(dockerfile_check.DOCKERFILE)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        problems.append(f"hadolint:\n{proc.stdout}{proc.stderr}")
    if problems:
        raise CheckError("Dockerfile:\n  " + "\n  ".join(problems))


def run_all(helm: Path, usage_path: Path = RBAC_USAGE) -> tuple[int, int, int]:
    """Lint, render, validate and RBAC; returns (objects, rules checked, usage entries)."""
    usage = load_usage(usage_path)
    n_objects = n_rules = 0
    for name, files in RENDERS.items():
        lint(helm, files)
        for version in KUBE_VERSIONS:
            objects = template(helm, files, kube_version=version)
            errors = validate_objects(objects, version)
            if errors:
                raise CheckError(f"{name} render, Kubernetes {version}:\n  " + "\n  ".join(errors))
            problems = rbac_problems(objects, usage)
            if problems:
                raise CheckError(f"{name} render, RBAC:\n  " + "\n  ".join(problems))
            n_objects += len(objects)
            n_rules += len(operator_rules(objects))
            print(
                f"chart-check: {name} values, Kubernetes {version}: {len(objects)} objects "
                f"valid; operator RBAC: {len(operator_rules(objects))} rules grant exactly "
                f"{len(usage)} recorded + {len(UNRECORDED)} unrecorded code-path + "
                f"{len(framework_extras(objects))} kopf-peering permissions"
            )
    return n_objects, n_rules, len(usage)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--usage", type=Path, default=RBAC_USAGE, help="recorded RBAC usage")
    args = parser.parse_args(argv)
    try:
        check_crd_copy()
        check_dockerfile(hadolint_binary())
        print("chart-check: crds/ copy identical; Dockerfile clean (hadolint and project rules)")
        n_objects, n_rules, n_usage = run_all(helm_binary(), args.usage)
    except CheckError as exc:
        sys.stderr.write(f"chart-check: FAILED: {exc}\n")
        return 1
    print(
        f"chart-check: OK: helm lint --strict clean; {n_objects} rendered objects validated "
        f"over {len(RENDERS)} value sets x {len(KUBE_VERSIONS)} Kubernetes versions; "
        f"{n_rules} RBAC rules checked against {n_usage} recorded (verb, group, resource)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
