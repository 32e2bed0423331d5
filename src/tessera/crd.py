"""The ServingDeployment CRD's OpenAPI schema as a validator, defaulter and pruner.

`crds/servingdeployments.serving.tessera.dev.yaml` is the source of truth. Callers:
`tessera validate` (schema errors by field before `api.parse`), the KMock test API server
(`tessera_operator.testing.apiserver`, which answers 422 and applies defaults the way a
real API server does) and the tests that keep the schema and `api.py` in agreement.
Errors are `fields.FieldError`s whose path reads like `spec.gateway.port`. Pure apart
from reading the CRD file.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from tessera import api, fields

CRD_FILE = f"{api.API_GROUP}.yaml"
CRD_NAME = f"servingdeployments.{api.API_GROUP}"


def default_path() -> Path:
    """`crds/<name>.yaml` of the source tree this module runs from (editable installs)."""
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "crds" / f"servingdeployments.{CRD_FILE}"
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"crds/servingdeployments.{CRD_FILE} not found above {Path(__file__).parent}; "
        "pass the CRD file explicitly (--crd)"
    )


def load(path: Path | None = None) -> dict[str, Any]:
    """The CRD manifest (the default one when `path` is None)."""
    doc = yaml.safe_load((path or default_path()).read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
        raise ValueError(f"{path}: not a CustomResourceDefinition")
    return doc


def version_schema(crd: Mapping[str, Any], version: str = api.API_VERSION) -> dict[str, Any]:
    """The `openAPIV3Schema` of one served version."""
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            schema: dict[str, Any] = v["schema"]["openAPIV3Schema"]
            return schema
    raise KeyError(f"version {version} not in {crd['metadata']['name']}")


def _path(parts: Iterator[str | int] | Any) -> str:
    out = ""
    for p in parts:
        out = fields.join(out, p)
    return out


def validate(doc: Any, schema: Mapping[str, Any]) -> list[fields.FieldError]:
    """Every schema violation of `doc`, by field path, sorted by path."""
    validator = jsonschema.Draft7Validator(schema)
    errs = []
    for err in validator.iter_errors(doc):
        message = err.message
        if err.validator == "anyOf" and err.context:
            # "is not valid under any of the given schemas" hides the useful part.
            message = "; or ".join(sorted({c.message for c in err.context}))
        errs.append(fields.FieldError(_path(err.absolute_path), message))
    return sorted(errs, key=lambda e: (e.path, e.message))


def _is_object(schema: Mapping[str, Any]) -> bool:
    return schema.get("type") == "object" and "properties" in schema


def apply_defaults(doc: Any, schema: Mapping[str, Any]) -> Any:
    """A copy of `doc` with the schema's defaults filled in, as the API server does:
    a missing property gets its default only when its parent object exists."""
    out = copy.deepcopy(doc)
    _default(out, schema)
    return out


def _default(value: Any, schema: Mapping[str, Any]) -> None:
    if isinstance(value, dict) and _is_object(schema):
        for key, sub in schema["properties"].items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                _default(value[key], sub)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for item in value:
            _default(item, schema["items"])


def prune(doc: Any, schema: Mapping[str, Any]) -> tuple[Any, list[str]]:
    """A copy of `doc` without fields the schema does not declare, and their paths.

    `metadata` is left alone (the server owns its schema); objects with
    `additionalProperties` or `x-kubernetes-preserve-unknown-fields` keep every key."""
    out = copy.deepcopy(doc)
    dropped: list[str] = []
    _prune(out, schema, "", dropped, root=True)
    return out, dropped


def _prune(
    value: Any, schema: Mapping[str, Any], path: str, dropped: list[str], root: bool
) -> None:
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(value, dict) and _is_object(schema):
        props = schema["properties"]
        for key in list(value):
            if key not in props:
                if not (root and key in ("apiVersion", "kind", "metadata")):
                    dropped.append(fields.join(path, key))
                    del value[key]
            elif not (root and key == "metadata"):
                _prune(value[key], props[key], fields.join(path, key), dropped, root=False)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            _prune(item, schema["items"], fields.join(path, i), dropped, root=False)


def walk(schema: Mapping[str, Any], path: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every (path, sub-schema) below `schema`; list items appear as `path[]`."""
    if _is_object(schema):
        for key, sub in schema["properties"].items():
            sub_path = fields.join(path, key)
            yield sub_path, sub
            yield from walk(sub, sub_path)
    items = schema.get("items")
    if isinstance(items, Mapping):
        yield f"{path}[]", items
        yield from walk(items, f"{path}[]")
