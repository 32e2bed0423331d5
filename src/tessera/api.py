"""ServingDeployment manifest types (`serving.tessera.dev/v1alpha1`) and their validation.

The one typed message between users and Tessera: `tessera up -f`, `tessera validate`,
`tessera plan -f` and the operator all parse manifests here, and the CRD schema in
`crds/` describes exactly these fields (a test keeps the two in agreement).
`parse()` checks structure and reports the first bad field by path;
`tessera.api_semantics.check_semantics()` checks a parsed spec against the model and the
agents; `spec.policies` lives in `tessera.api_policies`, `spec.scaling` in
`tessera.api_scaling`.
Pure: no I/O besides what callers pass in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tessera import api_policies, api_scaling, dtypes, fields, variant_spec

# re-exported: `spec.policies` types are part of the manifest API
from tessera.api_policies import SWITCHING_MODES as SWITCHING_MODES
from tessera.api_policies import PoliciesSpec as PoliciesSpec
from tessera.api_policies import SwitchingSpec as SwitchingSpec

API_GROUP = "serving.tessera.dev"
API_VERSION = "v1alpha1"
KIND = "ServingDeployment"
DTYPES = dtypes.CHOICES
LAYOUT_MODES = ("auto", "explicit")
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    path: str = ""  # local path (or path inside the PVC when `pvc` is set)
    pvc: str = ""  # PersistentVolumeClaim holding the checkpoint
    sub_path: str = ""  # sub-path inside the PVC
    dtype: str = dtypes.AUTO  # "auto": the checkpoint's torch_dtype


@dataclass(frozen=True)
class ResourcesSpec:
    node_selector: dict[str, str] = field(default_factory=dict)
    gpus: int = 0  # GPUs to plan with (0: use the agents' devices as discovered)
    gpu_memory: str = ""  # per-GPU memory the deployment may use, e.g. 80Gi
    max_gpus: int = 0  # cap on GPUs (0: no cap beyond `gpus`)


@dataclass(frozen=True)
class RankSpec:
    """Where one tensor-parallel rank of a stage runs."""

    agent: str
    device: str


@dataclass(frozen=True)
class StageSpec:
    agent: str  # where rank 0 runs (the rank the previous stage talks to)
    device: str
    layers: tuple[int, int]  # [start, end)
    tp: int = 1
    # Ranks 1..tp-1; empty: on `agent`, the devices after `device` (cpu:0 -> cpu:1, ...).
    ranks: tuple[RankSpec, ...] = ()

    def placements(self) -> tuple[RankSpec, ...]:
        """Every rank's agent and device, rank 0 first."""
        if self.ranks or self.tp == 1:
            return (RankSpec(self.agent, self.device), *self.ranks)
        kind, _, index = self.device.partition(":")
        first = int(index) if index.isdigit() else 0
        return tuple(RankSpec(self.agent, f"{kind}:{first + k}") for k in range(self.tp))


@dataclass(frozen=True)
class ReplicaSpec:
    name: str
    stages: tuple[StageSpec, ...]


@dataclass(frozen=True)
class LayoutSpec:
    mode: str = "auto"
    replicas: tuple[ReplicaSpec, ...] = ()
    kv_cache_bytes: int = 0  # per stage; 0 = a share of each device's free memory


@dataclass(frozen=True)
class WorkloadClass:
    name: str
    input_tokens: int
    output_tokens: int
    rate: float = 0.0  # expected requests/s


@dataclass(frozen=True)
class SLOSpec:
    ttft_p99_ms: float = 0.0  # 0 = no target
    tpot_p99_ms: float = 0.0


@dataclass(frozen=True)
class GatewaySpec:
    port: int = 8000
    service_type: str = "ClusterIP"
    replicas: int = 1


@dataclass(frozen=True)
class DeploymentSpec:
    model: ModelSpec
    resources: ResourcesSpec = ResourcesSpec()
    layout: LayoutSpec = LayoutSpec()
    workload: tuple[WorkloadClass, ...] = ()
    slo: SLOSpec = SLOSpec()
    policies: PoliciesSpec = field(default_factory=PoliciesSpec)
    gateway: GatewaySpec = GatewaySpec()
    variants: tuple[variant_spec.VariantSpec, ...] = ()  # issue 14: tessera.variant_spec
    scaling: api_scaling.ScalingSpec = field(default_factory=api_scaling.ScalingSpec)  # issue 32


@dataclass(frozen=True)
class ServingDeployment:
    name: str
    spec: DeploymentSpec
    namespace: str = "default"
    generation: int = 0


# -- parsing ----------------------------------------------------------------------------


def _name(value: Any, path: str) -> str:
    import re

    text = fields.string(value, path)
    if len(text) > 63 or not re.match(NAME_PATTERN, text):
        raise fields.FieldError(path, f"{text!r} must be a DNS-1123 label (a-z, 0-9, '-')")
    return text


def _model(doc: Any, path: str) -> ModelSpec:
    m = fields.mapping(doc, path)
    fields.known_only(m, ("name", "path", "pvc", "subPath", "dtype"), path)
    spec = ModelSpec(
        name=fields.string(fields.require(m, "name", path), f"{path}.name"),
        path=str(fields.optional(m, "path", "")),
        pvc=str(fields.optional(m, "pvc", "")),
        sub_path=str(fields.optional(m, "subPath", "")),
        dtype=fields.string(
            fields.optional(m, "dtype", dtypes.AUTO), f"{path}.dtype", choices=DTYPES
        ),
    )
    if not spec.path and not spec.pvc:
        raise fields.FieldError(f"{path}.path", "is required (or give pvc and subPath)")
    return spec


def _resources(doc: Any, path: str) -> ResourcesSpec:
    r = fields.mapping(doc, path)
    fields.known_only(r, ("nodeSelector", "gpus", "gpuMemory", "maxGpus"), path)
    sel = fields.mapping(fields.optional(r, "nodeSelector", {}), f"{path}.nodeSelector")
    gpu_memory = str(fields.optional(r, "gpuMemory", ""))
    if gpu_memory:
        fields.byte_quantity(gpu_memory, f"{path}.gpuMemory")
    spec = ResourcesSpec(
        node_selector={str(k): str(v) for k, v in sel.items()},
        gpus=fields.integer(fields.optional(r, "gpus", 0), f"{path}.gpus", minimum=0),
        gpu_memory=gpu_memory,
        max_gpus=fields.integer(fields.optional(r, "maxGpus", 0), f"{path}.maxGpus", minimum=0),
    )
    if spec.max_gpus and spec.max_gpus < spec.gpus:
        raise fields.FieldError(f"{path}.maxGpus", f"must be >= gpus ({spec.gpus})")
    return spec


def _layers(value: Any, path: str) -> tuple[int, int]:
    seq = fields.sequence(value, path)
    if len(seq) != 2:
        raise fields.FieldError(path, "must be [start, end)")
    start = fields.integer(seq[0], f"{path}[0]", minimum=0)
    end = fields.integer(seq[1], f"{path}[1]", minimum=1)
    if end <= start:
        raise fields.FieldError(path, f"end {end} must be greater than start {start}")
    return start, end


def _ranks(doc: Any, tp: int, path: str) -> tuple[RankSpec, ...]:
    items = fields.sequence(doc, path)
    if items and len(items) != tp - 1:
        raise fields.FieldError(
            path, f"lists {len(items)} ranks; a stage with tp={tp} needs {tp - 1} (ranks 1..)"
        )
    out = []
    for k, rdoc in enumerate(items):
        rpath = f"{path}[{k}]"
        r = fields.mapping(rdoc, rpath)
        fields.known_only(r, ("agent", "device"), rpath)
        out.append(
            RankSpec(
                agent=fields.string(fields.require(r, "agent", rpath), f"{rpath}.agent"),
                device=fields.string(fields.optional(r, "device", "cpu:0"), f"{rpath}.device"),
            )
        )
    return tuple(out)


def _layout(doc: Any, path: str) -> LayoutSpec:
    lay = fields.mapping(doc, path)
    fields.known_only(lay, ("mode", "replicas", "kvCacheBytes"), path)
    mode = fields.string(fields.optional(lay, "mode", "auto"), f"{path}.mode", choices=LAYOUT_MODES)
    replicas: list[ReplicaSpec] = []
    for i, rdoc in enumerate(
        fields.sequence(fields.optional(lay, "replicas", []), f"{path}.replicas")
    ):
        rpath = f"{path}.replicas[{i}]"
        r = fields.mapping(rdoc, rpath)
        fields.known_only(r, ("name", "stages"), rpath)
        stages = []
        sdocs = fields.sequence(fields.require(r, "stages", rpath), f"{rpath}.stages")
        if not sdocs:
            raise fields.FieldError(f"{rpath}.stages", "must list at least one stage")
        for j, sdoc in enumerate(sdocs):
            spath = f"{rpath}.stages[{j}]"
            s = fields.mapping(sdoc, spath)
            fields.known_only(s, ("agent", "device", "layers", "tp", "ranks"), spath)
            tp = fields.integer(fields.optional(s, "tp", 1), f"{spath}.tp", minimum=1)
            stages.append(
                StageSpec(
                    agent=fields.string(fields.require(s, "agent", spath), f"{spath}.agent"),
                    device=fields.string(fields.optional(s, "device", "cpu:0"), f"{spath}.device"),
                    layers=_layers(fields.require(s, "layers", spath), f"{spath}.layers"),
                    tp=tp,
                    ranks=_ranks(fields.optional(s, "ranks", []), tp, f"{spath}.ranks"),
                )
            )
        replicas.append(
            ReplicaSpec(_name(fields.optional(r, "name", f"r{i}"), f"{rpath}.name"), tuple(stages))
        )
    if mode == "explicit" and not replicas:
        raise fields.FieldError(f"{path}.replicas", "explicit layout needs at least one replica")
    if mode == "auto" and replicas:
        raise fields.FieldError(f"{path}.replicas", "must be empty when mode is auto")
    names = [r.name for r in replicas]
    for i, n in enumerate(names):
        if n in names[:i]:
            raise fields.FieldError(f"{path}.replicas[{i}].name", f"duplicate replica {n!r}")
    kv = fields.integer(fields.optional(lay, "kvCacheBytes", 0), f"{path}.kvCacheBytes", minimum=0)
    return LayoutSpec(mode, tuple(replicas), kv)


def _workload(doc: Any, path: str) -> tuple[WorkloadClass, ...]:
    w = fields.mapping(doc, path)
    fields.known_only(w, ("classes",), path)
    out = []
    for i, cdoc in enumerate(fields.sequence(fields.optional(w, "classes", []), f"{path}.classes")):
        cpath = f"{path}.classes[{i}]"
        c = fields.mapping(cdoc, cpath)
        fields.known_only(c, ("name", "inputTokens", "outputTokens", "rate"), cpath)
        out.append(
            WorkloadClass(
                name=_name(fields.require(c, "name", cpath), f"{cpath}.name"),
                input_tokens=fields.integer(
                    fields.require(c, "inputTokens", cpath), f"{cpath}.inputTokens", minimum=1
                ),
                output_tokens=fields.integer(
                    fields.require(c, "outputTokens", cpath), f"{cpath}.outputTokens", minimum=1
                ),
                rate=fields.number(fields.optional(c, "rate", 0.0), f"{cpath}.rate", minimum=0.0),
            )
        )
    return tuple(out)


def _slo(doc: Any, path: str) -> SLOSpec:
    s = fields.mapping(doc, path)
    fields.known_only(s, ("ttftP99Ms", "tpotP99Ms"), path)
    return SLOSpec(
        fields.number(fields.optional(s, "ttftP99Ms", 0.0), f"{path}.ttftP99Ms", minimum=0.0),
        fields.number(fields.optional(s, "tpotP99Ms", 0.0), f"{path}.tpotP99Ms", minimum=0.0),
    )


def _gateway(doc: Any, path: str) -> GatewaySpec:
    g = fields.mapping(doc, path)
    fields.known_only(g, ("port", "serviceType", "replicas"), path)
    port = fields.integer(fields.optional(g, "port", 8000), f"{path}.port", minimum=1)
    if port > 65535:
        raise fields.FieldError(f"{path}.port", "must be <= 65535")
    return GatewaySpec(
        port=port,
        service_type=fields.string(
            fields.optional(g, "serviceType", "ClusterIP"),
            f"{path}.serviceType",
            choices=SERVICE_TYPES,
        ),
        replicas=fields.integer(fields.optional(g, "replicas", 1), f"{path}.replicas", minimum=1),
    )


def parse_spec(doc: Any, path: str = "spec") -> DeploymentSpec:
    s = fields.mapping(doc, path)
    fields.known_only(
        s,
        (
            "model",
            "resources",
            "layout",
            "workload",
            "slo",
            "policies",
            "gateway",
            "variants",
            "scaling",
        ),
        path,
    )
    model = _model(fields.require(s, "model", path), f"{path}.model")
    return DeploymentSpec(
        model=model,
        resources=_resources(fields.optional(s, "resources", {}), f"{path}.resources"),
        layout=_layout(fields.optional(s, "layout", {}), f"{path}.layout"),
        workload=_workload(fields.optional(s, "workload", {}), f"{path}.workload"),
        slo=_slo(fields.optional(s, "slo", {}), f"{path}.slo"),
        policies=api_policies.parse(fields.optional(s, "policies", {}), f"{path}.policies"),
        gateway=_gateway(fields.optional(s, "gateway", {}), f"{path}.gateway"),
        variants=_variants(fields.optional(s, "variants", []), model.name, f"{path}.variants"),
        scaling=api_scaling.parse(fields.optional(s, "scaling", {}), f"{path}.scaling"),
    )


def _variants(doc: Any, model: str, path: str) -> tuple[variant_spec.VariantSpec, ...]:
    for i, item in enumerate(doc if isinstance(doc, list) else []):
        fields.known_only(fields.mapping(item, f"{path}[{i}]"), variant_spec.FIELDS, f"{path}[{i}]")
    return variant_spec.parse(doc, model, path)


def parse(doc: Any) -> ServingDeployment:
    """Parse a decoded manifest; raise `fields.FieldError` naming the first bad field."""
    root = fields.mapping(doc, "")
    want = f"{API_GROUP}/{API_VERSION}"
    if root.get("apiVersion") != want:
        raise fields.FieldError("apiVersion", f"must be {want}, got {root.get('apiVersion')!r}")
    if root.get("kind") != KIND:
        raise fields.FieldError("kind", f"must be {KIND}, got {root.get('kind')!r}")
    meta = fields.mapping(fields.require(root, "metadata", ""), "metadata")
    return ServingDeployment(
        name=_name(fields.require(meta, "name", "metadata"), "metadata.name"),
        namespace=fields.string(
            fields.optional(meta, "namespace", "default"), "metadata.namespace"
        ),
        generation=fields.integer(
            fields.optional(meta, "generation", 0), "metadata.generation", minimum=0
        ),
        spec=parse_spec(fields.require(root, "spec", "")),
    )
