"""`tessera validate -f FILE`: check ServingDeployment manifests before applying them.

Registered by `tessera.cli.main`. Three layers, each reported by field path:
1. the CRD's OpenAPI schema (`tessera.crd`), as the API server would check it, plus fields
   the server would silently prune;
2. `tessera.api.parse` (the rules the schema cannot express);
3. semantics against the model's config.json (`tessera.api_semantics.check_semantics`): the model
   must be readable where the path resolves locally (relative paths from the manifest's
   folder, PVC models under `--model-root`), unless `--no-model-check`.
Exit 0 when every document is valid, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("validate", help="validate ServingDeployment manifests (schema + semantics)")
    p.add_argument("-f", "--file", type=Path, action="append", required=True, help="manifest")
    p.add_argument("--crd", type=Path, default=None, help="CRD file (default: crds/ of the tree)")
    p.add_argument(
        "--model-root",
        default="/models",
        help="where PVC checkpoints are mounted (default /models), e.g. examples/models",
    )
    p.add_argument(
        "--no-model-check", action="store_true", help="skip the checks that need the model"
    )
    p.add_argument(
        "--agent",
        action="append",
        default=[],
        metavar="NAME",
        help="known agent names; stages naming others are errors (default: not checked)",
    )
    p.set_defaults(func=_run)


def check_document(
    doc: Any, base_dir: Path, schema: dict[str, Any], args: argparse.Namespace
) -> tuple[list[str], list[str]]:
    """(errors, notes) of one decoded document."""
    from tessera import api, api_semantics, crd, fields, model_facts
    from tessera.cli import variant_check
    from tessera.control import converge
    from tessera.cost import model_shape

    errors = [str(e) for e in crd.validate(doc, schema)]
    _, dropped = crd.prune(doc, schema)
    errors += [f"{path}: unknown field (the API server would drop it)" for path in dropped]
    if errors:
        return errors, []
    try:
        dep = api.parse(crd.apply_defaults(doc, schema))
    except fields.FieldError as exc:
        return [str(exc)], []
    notes = []
    facts: model_shape.ModelShape | None = None
    model_path = converge.resolve_model_path(dep.spec, base_dir, args.model_root)
    if args.no_model_check:
        notes.append(f"model checks skipped (--no-model-check); model path {model_path}")
    else:
        shape = model_facts.served_shape(model_path, dep.spec.model.dtype)
        if shape is None:
            where = f"spec.model.{'pvc' if dep.spec.model.pvc else 'path'}"
            return [
                f"{where}: model not readable: no config.json in {model_path} "
                "(use --model-root for PVC models, or --no-model-check)"
            ], []
        facts = shape
    agents = list(args.agent) or None
    if facts is not None:
        errors = [str(e) for e in api_semantics.check_semantics(dep.spec, facts, agents)]
        # adapters fit, fine-tunes match; a speculate entry's layers are in both lists
        errors += [e for e in variant_check.check(dep, model_path) if e not in errors]
    if not errors:
        reps = len(dep.spec.layout.replicas)
        what = f"{reps} explicit replicas" if reps else f"layout {dep.spec.layout.mode}"
        notes.insert(0, f"ok: {api.KIND} {dep.namespace}/{dep.name} ({what})")
    return errors, notes


def _run(args: argparse.Namespace) -> int:
    import yaml

    from tessera import api, crd

    try:
        schema = crd.version_schema(crd.load(args.crd))
    except (OSError, ValueError, KeyError) as exc:
        sys.stderr.write(f"tessera validate: {exc}\n")
        return 1
    failed = False
    for path in args.file:
        try:
            docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
        except (OSError, yaml.YAMLError) as exc:
            sys.stdout.write(f"{path}: {exc}\n")
            failed = True
            continue
        for i, doc in enumerate(docs):
            label = f"{path}" if len(docs) == 1 else f"{path}[{i}]"
            if not isinstance(doc, dict) or doc.get("kind") != api.KIND:
                kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
                sys.stdout.write(f"{label}: kind: must be {api.KIND}, got {kind!r}\n")
                failed = True
                continue
            errors, notes = check_document(doc, path.resolve().parent, schema, args)
            for line in errors:
                sys.stdout.write(f"{label}: {line}\n")
            for line in notes:
                sys.stdout.write(f"{label}: {line}\n")
            failed = failed or bool(errors)
    return 1 if failed else 0
