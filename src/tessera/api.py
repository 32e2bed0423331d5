"""ServingDeployment manifest types (`serving.tessera.dev/v1alpha1`) and their validation.

The one typed message between users and Tessera: `tessera up -f`, `tessera validate`,
`tessera plan -f` and the operator all parse manifests here, and the CRD schema in
`crds/` describes exactly these fields (a test keeps the two in agreement).
`parse()` checks structure and reports the first bad field by path; `check_semantics()`
checks a parsed spec against the model's config and the known agents and returns every
problem, each naming its field, e.g.
`spec.layout.replicas[1].stages[0].layers: end 12 exceeds the model's 8 layers`.
Pure: no I/O besides what callers pass in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tessera import fields, variant_spec
from tessera.policies import module_scaling
from tessera.policies import overload as overload_policy

API_GROUP = "serving.tessera.dev"
API_VERSION = "v1alpha1"
KIND = "ServingDeployment"
DTYPES = ("float32", "bfloat16", "float16")
LAYOUT_MODES = ("auto", "explicit")
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    path: str = ""  # local path (or path inside the PVC when `pvc` is set)
    pvc: str = ""  # PersistentVolumeClaim holding the checkpoint
    sub_path: str = ""  # sub-path inside the PVC
    dtype: str = "float32"


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
class PolicySpec:
    enabled: bool = False


SWITCHING_MODES = ("advisory", "active")


@dataclass(frozen=True)
class SwitchingSpec:
    """`spec.policies.switching`: workload-adaptive switching (docs/switching.md)."""

    enabled: bool = False
    mode: str = "advisory"  # advisory: report only; active: switch
    span_seconds: float = 60.0  # forecast / re-plan period
    min_gain: float = 0.1  # switch only to a deployment modelled >= 1 + minGain times faster


@dataclass(frozen=True)
class PoliciesSpec:
    switching: SwitchingSpec = SwitchingSpec()
    overload: overload_policy.OverloadConfig = field(default_factory=overload_policy.OverloadConfig)
    scaling: module_scaling.ScalingConfig = field(default_factory=module_scaling.ScalingConfig)


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
    policies: PoliciesSpec = PoliciesSpec()
    gateway: GatewaySpec = GatewaySpec()
    variants: tuple[variant_spec.VariantSpec, ...] = ()  # issue 14: tessera.variant_spec


@dataclass(frozen=True)
class ServingDeployment:
    name: str
    spec: DeploymentSpec
    namespace: str = "default"
    generation: int = 0


# -- parsing ----------------------------------------------------------------------------


def _opt(doc: Mapping[str, Any], key: str, default: Any) -> Any:
    value = doc.get(key)
    return default if value is None else value


def _bool(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise fields.FieldError(path, f"must be true or false, got {type(value).__name__}")
    return value


def _unknown(doc: Mapping[str, Any], allowed: Sequence[str], path: str) -> None:
    extra = sorted(set(doc) - set(allowed))
    if extra:
        raise fields.FieldError(
            fields.join(path, extra[0]), f"unknown field (allowed: {', '.join(allowed)})"
        )


def _name(value: Any, path: str) -> str:
    import re

    text = fields.string(value, path)
    if len(text) > 63 or not re.match(NAME_PATTERN, text):
        raise fields.FieldError(path, f"{text!r} must be a DNS-1123 label (a-z, 0-9, '-')")
    return text


def _model(doc: Any, path: str) -> ModelSpec:
    m = fields.mapping(doc, path)
    _unknown(m, ("name", "path", "pvc", "subPath", "dtype"), path)
    spec = ModelSpec(
        name=fields.string(fields.require(m, "name", path), f"{path}.name"),
        path=str(_opt(m, "path", "")),
        pvc=str(_opt(m, "pvc", "")),
        sub_path=str(_opt(m, "subPath", "")),
        dtype=fields.string(_opt(m, "dtype", "float32"), f"{path}.dtype", choices=DTYPES),
    )
    if not spec.path and not spec.pvc:
        raise fields.FieldError(f"{path}.path", "is required (or give pvc and subPath)")
    return spec


def _resources(doc: Any, path: str) -> ResourcesSpec:
    r = fields.mapping(doc, path)
    _unknown(r, ("nodeSelector", "gpus", "gpuMemory", "maxGpus"), path)
    sel = fields.mapping(_opt(r, "nodeSelector", {}), f"{path}.nodeSelector")
    gpu_memory = str(_opt(r, "gpuMemory", ""))
    if gpu_memory:
        fields.byte_quantity(gpu_memory, f"{path}.gpuMemory")
    spec = ResourcesSpec(
        node_selector={str(k): str(v) for k, v in sel.items()},
        gpus=fields.integer(_opt(r, "gpus", 0), f"{path}.gpus", minimum=0),
        gpu_memory=gpu_memory,
        max_gpus=fields.integer(_opt(r, "maxGpus", 0), f"{path}.maxGpus", minimum=0),
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
        _unknown(r, ("agent", "device"), rpath)
        out.append(
            RankSpec(
                agent=fields.string(fields.require(r, "agent", rpath), f"{rpath}.agent"),
                device=fields.string(_opt(r, "device", "cpu:0"), f"{rpath}.device"),
            )
        )
    return tuple(out)


def _layout(doc: Any, path: str) -> LayoutSpec:
    lay = fields.mapping(doc, path)
    _unknown(lay, ("mode", "replicas", "kvCacheBytes"), path)
    mode = fields.string(_opt(lay, "mode", "auto"), f"{path}.mode", choices=LAYOUT_MODES)
    replicas: list[ReplicaSpec] = []
    for i, rdoc in enumerate(fields.sequence(_opt(lay, "replicas", []), f"{path}.replicas")):
        rpath = f"{path}.replicas[{i}]"
        r = fields.mapping(rdoc, rpath)
        _unknown(r, ("name", "stages"), rpath)
        stages = []
        sdocs = fields.sequence(fields.require(r, "stages", rpath), f"{rpath}.stages")
        if not sdocs:
            raise fields.FieldError(f"{rpath}.stages", "must list at least one stage")
        for j, sdoc in enumerate(sdocs):
            spath = f"{rpath}.stages[{j}]"
            s = fields.mapping(sdoc, spath)
            _unknown(s, ("agent", "device", "layers", "tp", "ranks"), spath)
            tp = fields.integer(_opt(s, "tp", 1), f"{spath}.tp", minimum=1)
            stages.append(
                StageSpec(
                    agent=fields.string(fields.require(s, "agent", spath), f"{spath}.agent"),
                    device=fields.string(_opt(s, "device", "cpu:0"), f"{spath}.device"),
                    layers=_layers(fields.require(s, "layers", spath), f"{spath}.layers"),
                    tp=tp,
                    ranks=_ranks(_opt(s, "ranks", []), tp, f"{spath}.ranks"),
                )
            )
        replicas.append(
            ReplicaSpec(_name(_opt(r, "name", f"r{i}"), f"{rpath}.name"), tuple(stages))
        )
    if mode == "explicit" and not replicas:
        raise fields.FieldError(f"{path}.replicas", "explicit layout needs at least one replica")
    if mode == "auto" and replicas:
        raise fields.FieldError(f"{path}.replicas", "must be empty when mode is auto")
    names = [r.name for r in replicas]
    for i, n in enumerate(names):
        if n in names[:i]:
            raise fields.FieldError(f"{path}.replicas[{i}].name", f"duplicate replica {n!r}")
    kv = fields.integer(_opt(lay, "kvCacheBytes", 0), f"{path}.kvCacheBytes", minimum=0)
    return LayoutSpec(mode, tuple(replicas), kv)


def _workload(doc: Any, path: str) -> tuple[WorkloadClass, ...]:
    w = fields.mapping(doc, path)
    _unknown(w, ("classes",), path)
    out = []
    for i, cdoc in enumerate(fields.sequence(_opt(w, "classes", []), f"{path}.classes")):
        cpath = f"{path}.classes[{i}]"
        c = fields.mapping(cdoc, cpath)
        _unknown(c, ("name", "inputTokens", "outputTokens", "rate"), cpath)
        out.append(
            WorkloadClass(
                name=_name(fields.require(c, "name", cpath), f"{cpath}.name"),
                input_tokens=fields.integer(
                    fields.require(c, "inputTokens", cpath), f"{cpath}.inputTokens", minimum=1
                ),
                output_tokens=fields.integer(
                    fields.require(c, "outputTokens", cpath), f"{cpath}.outputTokens", minimum=1
                ),
                rate=fields.number(_opt(c, "rate", 0.0), f"{cpath}.rate", minimum=0.0),
            )
        )
    return tuple(out)


def _slo(doc: Any, path: str) -> SLOSpec:
    s = fields.mapping(doc, path)
    _unknown(s, ("ttftP99Ms", "tpotP99Ms"), path)
    return SLOSpec(
        fields.number(_opt(s, "ttftP99Ms", 0.0), f"{path}.ttftP99Ms", minimum=0.0),
        fields.number(_opt(s, "tpotP99Ms", 0.0), f"{path}.tpotP99Ms", minimum=0.0),
    )


def _policies(doc: Any, path: str) -> PoliciesSpec:
    p = fields.mapping(doc, path)
    _unknown(p, ("switching", "overload", "scaling"), path)
    out: dict[str, Any] = {"switching": _switching(_opt(p, "switching", {}), f"{path}.switching")}
    out["overload"] = _overload(_opt(p, "overload", {}), f"{path}.overload")
    out["scaling"] = _scaling(_opt(p, "scaling", {}), f"{path}.scaling")
    return PoliciesSpec(**out)


def _switching(doc: Any, path: str) -> SwitchingSpec:
    """`spec.policies.switching` (OServe; defaults and meaning in docs/switching.md)."""
    s = fields.mapping(doc, path)
    _unknown(s, ("enabled", "mode", "spanSeconds", "minGain"), path)
    return SwitchingSpec(
        enabled=_bool(_opt(s, "enabled", False), f"{path}.enabled"),
        mode=fields.string(_opt(s, "mode", "advisory"), f"{path}.mode", choices=SWITCHING_MODES),
        span_seconds=fields.number(
            _opt(s, "spanSeconds", 60.0), f"{path}.spanSeconds", minimum=1.0
        ),
        min_gain=fields.number(_opt(s, "minGain", 0.1), f"{path}.minGain", minimum=0.0),
    )


def _overload(doc: Any, path: str) -> overload_policy.OverloadConfig:
    """`spec.policies.overload` (KunServe; defaults and meaning in docs/overload.md)."""
    o = fields.mapping(doc, path)
    _unknown(o, ("enabled", "dropThreshold", "restoreThreshold"), path)
    d = overload_policy.OverloadConfig()
    drop = fields.number(_opt(o, "dropThreshold", d.drop_threshold), f"{path}.dropThreshold")
    restore = fields.number(
        _opt(o, "restoreThreshold", d.restore_threshold), f"{path}.restoreThreshold"
    )
    if not 0.0 < drop <= 1.0:
        raise fields.FieldError(f"{path}.dropThreshold", f"must be in (0, 1], got {drop}")
    if not 0.0 < restore < drop:
        raise fields.FieldError(
            f"{path}.restoreThreshold",
            f"must be > 0 and below dropThreshold ({drop}), got {restore}",
        )
    return overload_policy.OverloadConfig(
        _bool(_opt(o, "enabled", False), f"{path}.enabled"), drop, restore
    )


def _scaling(doc: Any, path: str) -> module_scaling.ScalingConfig:
    """`spec.policies.scaling` (CoCoServe; defaults and meaning in docs/module-scaling.md)."""
    keys = ("enabled", "upIdleFraction", "downViolationRate", "batchStep", "maxMigrations")
    sc = fields.mapping(doc, path)
    _unknown(sc, keys, path)
    d = module_scaling.ScalingConfig()
    fractions = {}
    for key, default in (
        ("upIdleFraction", d.up_idle_fraction),
        ("downViolationRate", d.down_violation_rate),
    ):
        v = fields.number(_opt(sc, key, default), f"{path}.{key}", minimum=0.0)
        if v >= 1.0:
            raise fields.FieldError(f"{path}.{key}", f"must be a fraction in [0, 1), got {v}")
        fractions[key] = v
    return module_scaling.ScalingConfig(
        _bool(_opt(sc, "enabled", False), f"{path}.enabled"),
        fractions["upIdleFraction"],
        fractions["downViolationRate"],
        fields.integer(_opt(sc, "batchStep", d.batch_step), f"{path}.batchStep", minimum=1),
        fields.integer(
            _opt(sc, "maxMigrations", d.max_migrations), f"{path}.maxMigrations", minimum=0
        ),
    )


def _gateway(doc: Any, path: str) -> GatewaySpec:
    g = fields.mapping(doc, path)
    _unknown(g, ("port", "serviceType", "replicas"), path)
    port = fields.integer(_opt(g, "port", 8000), f"{path}.port", minimum=1)
    if port > 65535:
        raise fields.FieldError(f"{path}.port", "must be <= 65535")
    return GatewaySpec(
        port=port,
        service_type=fields.string(
            _opt(g, "serviceType", "ClusterIP"), f"{path}.serviceType", choices=SERVICE_TYPES
        ),
        replicas=fields.integer(_opt(g, "replicas", 1), f"{path}.replicas", minimum=1),
    )


def parse_spec(doc: Any, path: str = "spec") -> DeploymentSpec:
    s = fields.mapping(doc, path)
    _unknown(
        s,
        ("model", "resources", "layout", "workload", "slo", "policies", "gateway", "variants"),
        path,
    )
    model = _model(fields.require(s, "model", path), f"{path}.model")
    return DeploymentSpec(
        model=model,
        resources=_resources(_opt(s, "resources", {}), f"{path}.resources"),
        layout=_layout(_opt(s, "layout", {}), f"{path}.layout"),
        workload=_workload(_opt(s, "workload", {}), f"{path}.workload"),
        slo=_slo(_opt(s, "slo", {}), f"{path}.slo"),
        policies=_policies(_opt(s, "policies", {}), f"{path}.policies"),
        gateway=_gateway(_opt(s, "gateway", {}), f"{path}.gateway"),
        variants=_variants(_opt(s, "variants", []), model.name, f"{path}.variants"),
    )


def _variants(doc: Any, model: str, path: str) -> tuple[variant_spec.VariantSpec, ...]:
    for i, item in enumerate(doc if isinstance(doc, list) else []):
        _unknown(fields.mapping(item, f"{path}[{i}]"), variant_spec.FIELDS, f"{path}[{i}]")
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
        namespace=fields.string(_opt(meta, "namespace", "default"), "metadata.namespace"),
        generation=fields.integer(_opt(meta, "generation", 0), "metadata.generation", minimum=0),
        spec=parse_spec(fields.require(root, "spec", "")),
    )


# -- semantics --------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelFacts:
    """What semantic checks need to know about the checkpoint (from its config.json)."""

    num_layers: int
    num_heads: int
    num_kv_heads: int


def check_semantics(
    spec: DeploymentSpec,
    model: ModelFacts | None,
    agents: Sequence[str] | None = None,
    max_tp: int = 0,
) -> list[fields.FieldError]:
    """Every problem of `spec` against the model and (if known) the agents, by field.

    `max_tp` caps the tensor-parallel degree (0: any degree the heads allow)."""
    errs: list[fields.FieldError] = []
    if model is None:
        errs.append(fields.FieldError("spec.model.path", "model not readable: no config.json"))
        return errs
    for i, rep in enumerate(spec.layout.replicas):
        rpath = f"spec.layout.replicas[{i}]"
        expect = 0
        for j, st in enumerate(rep.stages):
            spath = f"{rpath}.stages[{j}]"
            start, end = st.layers
            if end > model.num_layers:
                errs.append(
                    fields.FieldError(
                        f"{spath}.layers",
                        f"end {end} exceeds the model's {model.num_layers} layers",
                    )
                )
            if start != expect:
                errs.append(
                    fields.FieldError(
                        f"{spath}.layers",
                        f"starts at layer {start} but the previous stage ends at {expect}",
                    )
                )
            expect = end
            if st.tp > 1 and (model.num_heads % st.tp or model.num_kv_heads % st.tp):
                errs.append(
                    fields.FieldError(
                        f"{spath}.tp",
                        f"{st.tp} does not divide the model's {model.num_heads} "
                        f"attention and {model.num_kv_heads} KV heads",
                    )
                )
            if max_tp and st.tp > max_tp:
                errs.append(
                    fields.FieldError(
                        f"{spath}.tp",
                        f"tensor parallelism {st.tp} is not supported by the "
                        f"engine yet (max {max_tp})",
                    )
                )
            if agents is not None and st.agent not in agents:
                errs.append(
                    fields.FieldError(
                        f"{spath}.agent",
                        f"unknown agent {st.agent!r} (known: {', '.join(agents) or 'none'})",
                    )
                )
            for k, rank in enumerate(st.ranks):
                if agents is not None and rank.agent not in agents:
                    errs.append(
                        fields.FieldError(
                            f"{spath}.ranks[{k}].agent",
                            f"unknown agent {rank.agent!r} (known: {', '.join(agents) or 'none'})",
                        )
                    )
            names = [p.agent for p in st.placements()]
            if len(set(names)) != len(names):
                errs.append(
                    fields.FieldError(
                        f"{spath}.ranks",
                        f"the {st.tp} tensor-parallel ranks need {st.tp} different agents "
                        "(an agent holds one rank of a stage); list them in `ranks`",
                    )
                )
        if rep.stages and expect != model.num_layers and expect <= model.num_layers:
            errs.append(
                fields.FieldError(
                    f"{rpath}.stages",
                    f"cover layers up to {expect}, not all {model.num_layers} layers of the model",
                )
            )
    return errs
